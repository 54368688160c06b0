// The probe's drive measurement: a test file in the given folder written and read sequentially in 4 MiB blocks by
// 4 threads (each its own quarter of the file), with O_DIRECT where the file system takes it (else buffered, with
// fdatasync after writing and the file's pages dropped before reading), random 4 KiB reads for the latency
// (O_DIRECT only), and the file removed afterwards, whatever happens.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/probe/probe_internal.hpp"
#include "core/base/error.hpp"
#include "core/base/parallel.hpp"

namespace harmony::backend {
namespace {

using core::Bytes;
using core::FileError;
using namespace probe_detail;

constexpr std::size_t kBlock = std::size_t{4} << 20;
constexpr std::size_t kAlign = 4096;
constexpr unsigned kIoThreads = 4;

// statfs f_type values (linux/magic.h)
constexpr long kTmpfsMagic = 0x01021994;
constexpr long kRamfsMagic = 0x858458f6;

std::string filesystem_name(long type) {
  switch (type) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x2FC12FC1:
      return "zfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0xF2F52010:
      return "f2fs";
    case kTmpfsMagic:
      return "tmpfs";
    case kRamfsMagic:
      return "ramfs";
    default:
      return fmt::format("0x{:x}", static_cast<unsigned long>(type));
  }
}

// The test file's path while it exists, for the signal handler (unlink is async-signal-safe).
char g_test_file[4096] = {};
volatile sig_atomic_t g_test_file_set = 0;
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// A stop signal while the test file exists: the file removed, then the signal's default action (the process ends
// as it would have without the probe's handler).
extern "C" void remove_test_file_and_stop(int sig) {
  if (g_test_file_set != 0) unlink(g_test_file);
  signal(sig, SIG_DFL);
  raise(sig);
}

// The test file: created exclusively, removed (and closed) when this goes away, or by a stop signal while it
// exists (handlers installed for the stop signals the process does not ignore, the previous ones restored after).
struct TestFile {
  std::string path;
  int fd = -1;
  struct sigaction previous[std::size(kStopSignals)] = {};
  bool installed[std::size(kStopSignals)] = {};
  TestFile() = default;
  TestFile(const TestFile&) = delete;
  TestFile& operator=(const TestFile&) = delete;
  // Before the file is created: its path recorded and the handlers in place.
  void guard(const std::string& name) {
    if (name.size() >= sizeof g_test_file) return;  // too long to record: removed by the destructor only
    std::memcpy(g_test_file, name.c_str(), name.size() + 1);
    g_test_file_set = 1;
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
      struct sigaction old {};
      if (sigaction(kStopSignals[i], nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;  // nohup: ignored
      struct sigaction sa {};
      sa.sa_handler = remove_test_file_and_stop;
      sigemptyset(&sa.sa_mask);
      installed[i] = sigaction(kStopSignals[i], &sa, &previous[i]) == 0;
    }
  }
  ~TestFile() {
    if (fd >= 0) close(fd);
    if (!path.empty()) unlink(path.c_str());
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
      if (installed[i]) sigaction(kStopSignals[i], &previous[i], nullptr);
    }
    g_test_file_set = 0;
  }
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }  // NOLINT(*-no-malloc): pairs with std::aligned_alloc
};

[[noreturn]] void io_failure(const std::string& path, const std::string& what, int err) {
  throw FileError(path, fmt::format("the NVMe probe could not {}: {}", what, std::strerror(err)),
                  "give --path a folder on the drive to measure, with room for the test file");
}

// One pass over the file: each of kIoThreads threads reads or writes its own contiguous quarter, block by block.
void pass(int fd, const std::string& path, Bytes file_bytes, bool write, std::vector<char*> bufs) {
  const auto total = static_cast<std::size_t>(file_bytes);
  const std::size_t per = (total / kIoThreads + kBlock - 1) / kBlock * kBlock;
  core::parallel_for(kIoThreads, kIoThreads, [&](std::size_t t) {
    const std::size_t lo = std::min(total, t * per), hi = std::min(total, lo + per);
    for (std::size_t off = lo; off < hi; off += kBlock) {
      const std::size_t n = std::min(kBlock, hi - off);
      const auto done =
          write ? pwrite(fd, bufs[t], n, static_cast<off_t>(off)) : pread(fd, bufs[t], n, static_cast<off_t>(off));
      if (done != static_cast<ssize_t>(n))
        io_failure(path, write ? "write the test file" : "read the test file", done < 0 ? errno : EIO);
    }
  });
  if (write && fdatasync(fd) != 0) io_failure(path, "flush the test file (fdatasync)", errno);
}

}  // namespace

void check_nvme_path(const std::string& path, Bytes file) {
  const char* hint = "give --path an existing, writable folder on the drive to measure (not tmpfs), e.g. /mnt/nvme0";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw FileError(path, fmt::format("the NVMe probe's folder cannot be used: {}", std::strerror(errno)), hint);
  if (!S_ISDIR(st.st_mode))
    throw FileError(path, "the NVMe probe's path is not a folder",
                    "give --path the folder to write its test file in (the file is removed afterwards)");
  struct statfs fs {};
  if (statfs(path.c_str(), &fs) == 0 && (fs.f_type == kTmpfsMagic || fs.f_type == kRamfsMagic))
    throw FileError(path,
                    fmt::format("the NVMe probe's folder is on {}: host memory, not a drive",
                                filesystem_name(static_cast<long>(fs.f_type))),
                    hint);
  if (access(path.c_str(), W_OK) != 0)
    throw FileError(path, fmt::format("the NVMe probe cannot write in this folder: {}", std::strerror(errno)), hint);
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) != 0)
    throw FileError(path, fmt::format("the NVMe probe cannot read the free space: {}", std::strerror(errno)), hint);
  const auto free_bytes = static_cast<Bytes>(vfs.f_bavail) * static_cast<Bytes>(vfs.f_frsize);
  if (free_bytes < 2 * file)
    throw FileError(path,
                    fmt::format("the NVMe probe needs twice its test file free ({}), the folder's drive has {}",
                                core::format_bytes(2 * file), core::format_bytes(free_bytes)),
                    "free some space, or give --path a folder on another drive");
}

NvmeProbe measure_nvme(const std::string& path, const ProbeSizes& s) {
  NvmeProbe p;
  p.path = path;
  p.file_bytes = s.nvme_file_bytes;
  struct statfs fs {};
  if (statfs(path.c_str(), &fs) == 0) p.filesystem = filesystem_name(static_cast<long>(fs.f_type));
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0)
    p.free_bytes = static_cast<Bytes>(vfs.f_bavail) * static_cast<Bytes>(vfs.f_frsize);

  TestFile file;
  const std::string name = fmt::format("{}/harmony-probe-{}.tmp", path, getpid());
  file.guard(name);
  file.fd = open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  p.direct_io = file.fd >= 0;
  if (file.fd < 0 && errno == EINVAL) file.fd = open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (file.fd < 0) {
    const int err = errno;
    g_test_file_set = 0;  // not ours (EEXIST): never removed
    io_failure(name, "create its test file", err);
  }
  file.path = name;

  std::vector<std::unique_ptr<char, AlignedFree>> owned;
  std::vector<char*> bufs;
  std::mt19937_64 rng(7);
  for (unsigned t = 0; t < kIoThreads; ++t) {
    owned.emplace_back(static_cast<char*>(std::aligned_alloc(kAlign, kBlock)));  // NOLINT(*-no-malloc)
    if (!owned.back()) throw std::bad_alloc();
    // random bytes: a drive or file system that compresses or deduplicates cannot shortcut them
    auto* words = reinterpret_cast<std::uint64_t*>(owned.back().get());  // NOLINT(*-reinterpret-cast)
    for (std::size_t i = 0; i < kBlock / 8; ++i) words[i] = rng();
    bufs.push_back(owned.back().get());
  }
  p.write = time_runs(p.file_bytes, s.nvme_repeats, [&] { pass(file.fd, name, p.file_bytes, true, bufs); });
  p.read = time_runs(p.file_bytes, s.nvme_repeats, [&] {
    if (!p.direct_io) posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED);  // read the drive, not the page cache
    pass(file.fd, name, p.file_bytes, false, bufs);
  });
  if (p.direct_io) {
    std::vector<double> t;
    const auto blocks = static_cast<std::uint64_t>(p.file_bytes) / kAlign;
    for (int i = 0; i < s.nvme_latency_reads; ++i) {
      const auto off = static_cast<off_t>((rng() % blocks) * kAlign);
      const auto t0 = Clock::now();
      if (pread(file.fd, bufs[0], kAlign, off) != static_cast<ssize_t>(kAlign))
        io_failure(name, "read the test file", errno);
      t.push_back(seconds_since(t0));
    }
    std::sort(t.begin(), t.end());
    p.latency_s = t[t.size() / 2];
  }
  return p;
}

}  // namespace harmony::backend
