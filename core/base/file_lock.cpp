// FileLock (file_lock.hpp): flock(LOCK_NB) on a lock file, the holder's "pid N on host H" line written by an
// exclusive holder and read back by a refused one.
#include "core/base/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace harmony::core {

namespace {

// The first line of the holder's record, trimmed.
std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find_first_of("\r\n"));
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.pop_back();
  return line;
}

}  // namespace

FileLock::~FileLock() { release(); }

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void FileLock::release() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
  fd_ = -1;
}

std::optional<FileLock::Failure> FileLock::lock(const std::filesystem::path& path, Mode mode) {
  release();
  const bool exclusive = mode == Mode::Exclusive;
  const auto error = [](Failure::Kind kind, int err) {
    Failure f;
    f.kind = kind;
    f.error = err;
    return f;
  };
  const int fd = ::open(path.c_str(), exclusive ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return error(!exclusive && err == ENOENT ? Failure::Kind::Absent : Failure::Kind::OpenFailed, err);
  }
  if (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return error(Failure::Kind::LockFailed, err);
    }
    Failure busy;
    busy.kind = Failure::Kind::Busy;
    // The holder writes its name just after locking: give it a moment when the file is still empty.
    for (int attempt = 0; attempt < 50 && busy.holder.empty(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      char buf[256];
      const ssize_t got = ::pread(fd, buf, sizeof buf - 1, 0);
      if (got > 0) busy.holder = first_line(std::string(buf, static_cast<std::size_t>(got)));
    }
    ::close(fd);
    return busy;
  }
  fd_ = fd;
  if (!exclusive) return std::nullopt;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  const std::string text = fmt::format("pid {} on host {}\n", static_cast<long>(::getpid()), host);
  int err = ::ftruncate(fd_, 0) != 0 ? errno : 0;
  for (std::size_t done = 0; err == 0 && done < text.size();) {  // a short write: the next one says why
    const ssize_t n = ::pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno != EINTR) err = errno;
    if (n == 0) err = EIO;
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (err != 0) {
    release();
    return error(Failure::Kind::WriteFailed, err);
  }
  return std::nullopt;
}

}  // namespace harmony::core
