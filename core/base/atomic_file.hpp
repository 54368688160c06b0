// Output files: the one atomic writer every tool's file outputs go through (temp file beside the target, fsync,
// rename; regular files replaced, symlinks written through, devices/FIFOs/folders refused), the all-or-nothing
// appender of record files, the up-front checks that an output path can be written before any work is done, the
// final check that stdout took every byte, and the reasons a write failed (a full disk, the file size limit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

namespace harmony::core {

// The file a write to PATH lands on: PATH itself, or the end of its chain of symbolic links (a relative link
// resolved against the link's folder; the end may not exist yet). FileError on a loop of links.
std::string output_target(const std::string& path);

// Checks, before any work, that AtomicFile can write PATH: its target (output_target) is a regular file or
// absent, and the target's folder exists and is writable. FileError naming PATH, `what` ("the trace") and the
// OS's reason ("No such file or directory", "Permission denied", "Read-only file system", "Is a directory",
// "not a regular file (a character device)"), with a hint.
void check_output_file(const std::string& path, const std::string& what);

// Checks, before any work, that DIR is a writable folder or can be created as one: DIR, or its nearest existing
// ancestor, is a folder and writable. FileError naming DIR and the OS's reason ("Not a directory", ...).
void check_output_dir(const std::string& dir, const std::string& what);

// The OS's reason for a failed write: strerror(ERR); for EFBIG also the limit the process hit, "File too large
// (the file size limit, ulimit -f, is 4 KiB = 4096 bytes)" (getrlimit RLIMIT_FSIZE; plain "File too large" when
// unlimited: the file system's own maximum).
std::string write_error_reason(int err);

// Makes a write past the file size limit (RLIMIT_FSIZE, `ulimit -f`) fail with EFBIG, which every writer here
// reports like a full disk (the file named, the previous one kept, no temp file left), instead of SIGXFSZ killing
// the process mid-write (exit 153, nothing said, TARGET.tmp left). Each main calls it before any work.
void ignore_file_size_signal();

// Writes PATH atomically: the bytes go to TARGET.tmp beside the target (output_target), which on commit() is
// fsynced, closed, renamed over the target and its folder fsynced, so PATH holds the old or the new content,
// never a mix. A regular target is replaced (keeping its permission bits); a symlink's target is replaced, the
// link kept; a folder, device, FIFO or socket is refused before anything is created. Every failure is a
// FileError naming PATH and the OS's reason; the temp file is removed when commit() was not reached or failed.
class AtomicFile {
 public:
  AtomicFile(std::string path, std::string what, std::string hint = {});
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  void commit();
  const std::string& path() const { return path_; }
  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& doing, int err);
  std::string path_, what_, hint_, target_, temp_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

// Appends records to PATH (created when missing; the node rules of AtomicFile: a regular file or nothing, a symlink
// written through, anything else refused). Each append() is all or nothing: a failed write (a full disk, the file
// size limit) cuts the file back to its size before the record and throws FileError naming PATH and the reason,
// so no partial record remains. truncate() cuts it back to an earlier size() (a record whose partner in another
// file could not be written). Not synced: records are for files a rerun can repair (a sweep's results).
class AppendFile {
 public:
  AppendFile(std::string path, std::string what, std::string hint = {});
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();
  void append(std::string_view bytes);
  void truncate(std::uint64_t size_bytes);
  std::uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& doing, int err);
  std::string path_, what_, hint_;
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
};

// AtomicFile(path, what, hint) with `bytes` written and committed.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what,
                       const std::string& hint = {});

// Flushes stdout (C stdio, which std::cout shares) and returns the OS's reason when a write to it failed
// ("No space left on device", write_error_reason's "File too large (...)"), or nullopt when every byte went out.
std::optional<std::string> stdout_write_problem();

// A tool's whole command line (each main's): `run()` with stdout buffered whole (up to 1 MiB) when it is a file or
// pipe, so that a failed write is seen by the final flush with its reason, not lost inside an earlier implicit flush;
// then stdout_write_problem(): a failed write is named on `err` ("TOOL: error: writing stdout: REASON") and exits 1
// unless run() failed already (`--format json > /dev/full` must not exit 0). Returns the exit code.
int run_checking_stdout(const std::function<int()>& run, std::string_view tool, std::ostream& err);

}  // namespace harmony::core
