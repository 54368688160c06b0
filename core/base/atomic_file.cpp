// Output files: atomic replacement through a temp file, up-front writability checks, stdout's final check
// (see atomic_file.hpp).
#include "core/base/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <utility>

#include "core/base/error.hpp"
#include "core/base/input_file.hpp"

namespace harmony::core {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxLinks = 40;

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Why an existing node at TARGET cannot be replaced by a file (nullopt: it is a regular file or absent).
std::optional<std::string> node_problem(const std::string& target, struct stat* out) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return std::string(std::strerror(errno));
  }
  if (out != nullptr) *out = st;
  if (S_ISREG(st.st_mode)) return std::nullopt;
  if (S_ISDIR(st.st_mode)) return std::string(std::strerror(EISDIR));
  return std::string("not a regular file (") + special_file_kind(st.st_mode) + ")";
}

std::string refuse_hint(const std::string& what) {
  return "give " + what +
         " a file name in a writable folder (an existing regular file is replaced; devices, FIFOs "
         "and folders are never written)";
}

}  // namespace

std::string output_target(const std::string& path) {
  std::string cur = path;
  for (int i = 0; i < kMaxLinks; ++i) {
    struct stat st {};
    if (::lstat(cur.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(cur.c_str(), link.data(), link.size());
    if (n < 0) throw FileError(path, std::string("cannot read the symbolic link: ") + std::strerror(errno));
    link.resize(static_cast<std::size_t>(n));
    const fs::path next(link);
    cur = next.is_absolute() ? next.string() : (fs::path(folder_of(cur)) / next).lexically_normal().string();
  }
  throw FileError(path, std::string("cannot follow the symbolic link: ") + std::strerror(ELOOP),
                  "point the link at a file");
}

// 0 when DIR is a writable folder, else the errno saying why not.
static int folder_problem(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return errno;
  return 0;
}

void check_output_file(const std::string& path, const std::string& what) {
  const std::string target = output_target(path);
  const std::string via = target == path ? std::string() : " (the symbolic link's target " + target + ")";
  if (const auto why = node_problem(target, nullptr))
    throw FileError(path, "cannot write " + what + via + ": " + *why, refuse_hint(what));
  const std::string dir = folder_of(target);
  if (const int err = folder_problem(dir); err != 0)
    throw FileError(path, "cannot write " + what + via + ": folder " + dir + ": " + std::strerror(err),
                    "create the folder, or choose a writable one; nothing was run");
}

void check_output_dir(const std::string& dir, const std::string& what) {
  const std::string hint = "name a writable folder (it is created when missing); nothing was run";
  const fs::path full = fs::absolute(dir).lexically_normal();
  fs::path p = full;
  for (;;) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {  // the nearest existing ancestor (or DIR itself)
      if (const int err = folder_problem(p.string()); err != 0)
        throw FileError(
            dir,
            "cannot use " + what + (p == full ? std::string() : " (at " + p.string() + ")") + ": " + std::strerror(err),
            hint);
      return;
    }
    const int err = errno;
    if (err != ENOENT || p.parent_path() == p)
      throw FileError(dir, "cannot use " + what + ": " + std::strerror(err), hint);
    p = p.parent_path();
  }
}

AtomicFile::AtomicFile(std::string path, std::string what, std::string hint)
    : path_(std::move(path)), what_(std::move(what)), hint_(std::move(hint)) {
  if (hint_.empty()) hint_ = "free space or choose another path; " + path_ + " was left as it was";
  target_ = output_target(path_);
  struct stat st {};
  st.st_mode = 0;
  if (const auto why = node_problem(target_, &st))
    throw FileError(path_,
                    "cannot write " + what_ +
                        (target_ == path_ ? "" : " (the symbolic link's target " + target_ + ")") + ": " + *why,
                    refuse_hint(what_));
  temp_ = target_ + ".tmp";
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) fail("cannot create the temporary file " + temp_, errno);
  created_ = true;
  if (S_ISREG(st.st_mode)) (void)::fchmod(fd_, st.st_mode & 07777);  // keep the replaced file's permissions
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (created_ && !committed_) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& doing, int err) {
  throw FileError(path_, doing + " (" + what_ + "): " + std::strerror(err), hint_);
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("cannot write (fsync)", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("cannot write (close)", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("cannot rename " + temp_ + " over it", errno);
  committed_ = true;
  const std::string dir = folder_of(target_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = dfd < 0 ? errno : 0;
  if (err == 0 && ::fsync(dfd) != 0) err = errno;
  if (dfd >= 0) ::close(dfd);
  if (err != 0 && err != EINVAL)  // EINVAL: a file system without directory fsync
    throw FileError(path_, "written, but syncing its folder " + dir + " failed: " + std::strerror(err),
                    "the file may not survive a crash; check the disk and write it again");
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what,
                       const std::string& hint) {
  AtomicFile f(path, what, hint);
  f.write(bytes);
  f.commit();
}

std::optional<std::string> stdout_write_problem() {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;  // first: errno is the reason only on the first failure
  const int err = flush_failed ? errno : 0;
  std::cout.flush();
  if (!flush_failed && !std::ferror(stdout) && !std::cout.fail()) return std::nullopt;
  return std::string(std::strerror(err != 0 ? err : EIO));
}

}  // namespace harmony::core
