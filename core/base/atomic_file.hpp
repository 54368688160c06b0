// Output files: the one atomic writer every tool's file outputs go through (temp file beside the target, fsync,
// rename; regular files replaced, symlinks written through, devices/FIFOs/folders refused), the up-front checks
// that an output path can be written before any work is done, and the final check that stdout took every byte.
#pragma once

#include <cstddef>
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

// AtomicFile(path, what, hint) with `bytes` written and committed.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what,
                       const std::string& hint = {});

// Flushes stdout (C stdio, which std::cout shares) and returns the OS's reason when a write to it failed
// ("No space left on device"), or nullopt when every byte went out.
std::optional<std::string> stdout_write_problem();

}  // namespace harmony::core
