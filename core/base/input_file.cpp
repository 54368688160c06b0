// Input files: open without blocking, refuse directories, FIFOs and devices, read whole (see input_file.hpp).
#include "core/base/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/base/error.hpp"

namespace harmony::core {

const char* special_file_kind(unsigned mode) {
  const auto m = static_cast<mode_t>(mode);
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file";
}

int open_input_file(const std::string& path, std::string* problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *problem = std::strerror(errno);
    return -1;
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    why = std::strerror(EISDIR);
  } else if (!S_ISREG(st.st_mode)) {
    why = std::string("not a regular file (") + special_file_kind(st.st_mode) + ")";
  } else {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) why = std::strerror(errno);
  }
  if (!why.empty()) {
    ::close(fd);
    *problem = why;
    return -1;
  }
  return fd;
}

std::optional<std::string> input_file_problem(const std::string& path) {
  std::string problem;
  const int fd = open_input_file(path, &problem);
  if (fd < 0) return problem;
  ::close(fd);
  return std::nullopt;
}

std::optional<std::string> try_read_input_file(const std::string& path, std::string* problem) {
  const int fd = open_input_file(path, problem);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *problem = std::strerror(errno);
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string read_input_file(const std::string& path, const std::string& what, const std::string& hint) {
  std::string problem;
  auto text = try_read_input_file(path, &problem);
  if (!text) throw FileError(path, "cannot read " + what + ": " + problem, hint);
  return std::move(*text);
}

}  // namespace harmony::core
