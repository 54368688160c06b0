// Output files: atomic replacement through a temp file, all-or-nothing appends, up-front writability checks,
// stdout's final check, the reasons for a failed write (see atomic_file.hpp).
#include "core/base/atomic_file.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <utility>

#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "core/base/units.hpp"

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

// What to do after a failed write of PATH, by the OS's reason: a caller's HINT when given.
std::string write_hint(int err, const std::string& path, const std::string& hint) {
  if (!hint.empty()) return hint;
  return std::string(err == EFBIG ? "raise the file size limit (ulimit -f)" : "free space") +
         " or choose another path; " + path + " was left as it was";
}

std::string refuse_hint(const std::string& what) {
  return "give " + what +
         " a file name in a writable folder (an existing regular file is replaced; devices, FIFOs "
         "and folders are never written)";
}

// The checks AtomicFile and AppendFile make before creating anything: PATH's target (output_target), refused
// unless it is a regular file or absent; its lstat in *ST (st_mode 0 when absent).
std::string checked_target(const std::string& path, const std::string& what, struct stat* st) {
  std::string target = output_target(path);
  st->st_mode = 0;
  if (const auto why = node_problem(target, st))
    throw FileError(
        path,
        "cannot write " + what + (target == path ? "" : " (the symbolic link's target " + target + ")") + ": " + *why,
        refuse_hint(what));
  return target;
}

}  // namespace

std::string write_error_reason(int err) {
  std::string why = std::strerror(err);
  struct rlimit lim {};
  if (err == EFBIG && ::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const auto bytes = static_cast<Bytes>(lim.rlim_cur);
    why += " (the file size limit, ulimit -f, is " +
           (bytes < 1024 ? std::to_string(bytes) + " bytes"
                         : format_bytes(bytes) + " = " + std::to_string(bytes) + " bytes") +
           ")";
  }
  return why;
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

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
  struct stat st {};
  target_ = checked_target(path_, what_, &st);
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
  throw FileError(path_, doing + " (" + what_ + "): " + write_error_reason(err), write_hint(err, path_, hint_));
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

AppendFile::AppendFile(std::string path, std::string what, std::string hint)
    : path_(std::move(path)), what_(std::move(what)), hint_(std::move(hint)) {
  struct stat st {};
  const std::string target = checked_target(path_, what_, &st);
  fd_ = ::open(target.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) fail("cannot open", errno);
  if (::fstat(fd_, &st) != 0) fail("cannot open (fstat)", errno);
  size_bytes_ = static_cast<std::uint64_t>(st.st_size);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::fail(const std::string& doing, int err) {
  throw FileError(path_, doing + " (" + what_ + "): " + write_error_reason(err), write_hint(err, path_, hint_));
}

void AppendFile::append(std::string_view bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      // A part of the record may be in the file (a write cut short at the limit): cut it off.
      if (::ftruncate(fd_, static_cast<off_t>(size_bytes_)) != 0)
        throw FileError(path_,
                        "cannot write (" + what_ + "): " + write_error_reason(err) +
                            ", and cutting off the partial record failed: " + std::strerror(errno),
                        write_hint(err, path_, hint_));
      fail("cannot write", err);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  size_bytes_ += bytes.size();
}

void AppendFile::truncate(std::uint64_t size_bytes) {
  if (::ftruncate(fd_, static_cast<off_t>(size_bytes)) != 0) fail("cannot truncate", errno);
  size_bytes_ = size_bytes;
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
  return write_error_reason(err != 0 ? err : EIO);
}

int run_checking_stdout(const std::function<int()>& run, std::string_view tool, std::ostream& err) {
  static char stdout_buffer[std::size_t{1} << 20];  // glibc ignores the size unless given the buffer
  if (isatty(STDOUT_FILENO) == 0) std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
  const int rc = run();
  const std::optional<std::string> problem = stdout_write_problem();
  if (!problem) return rc;
  err << tool << ": error: writing stdout: " << *problem << "\n";
  return rc != 0 ? rc : 1;
}

}  // namespace harmony::core
