// An advisory lock on a file (flock) that keeps two processes from writing one folder: harmony-sim's sweep
// folders (DIR/sweep.lock) and harmony-run's checkpoint folders (DIR/harmony-run.lock). An exclusive holder
// records "pid N on host H" in the file so the refused process can name it. Reports, never throws or prints:
// each tool words its own refusal.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace harmony::core {

class FileLock {
 public:
  enum class Mode { Exclusive, Shared };

  // Why lock() took no lock.
  struct Failure {
    enum class Kind {
      Busy,         // another process holds it (exclusively, or shared when asking for Exclusive)
      Absent,       // Shared, and the file does not exist (nobody ever locked it exclusively)
      OpenFailed,   // the file cannot be created (Exclusive) or opened (Shared): `error`
      LockFailed,   // flock failed other than by contention (e.g. a file system without locks): `error`
      WriteFailed,  // the holder's record cannot be written: `error`
    };
    Kind kind = Kind::OpenFailed;
    std::string holder;  // Busy: the holder's line ("pid 12 on host h"); empty when not recorded (yet)
    int error = 0;       // errno of the failed call
  };

  FileLock() = default;
  ~FileLock();
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // Takes a non-blocking flock on `path` (created when Exclusive, opened read-only when Shared) and holds it until
  // destruction; an exclusive holder then writes "pid N on host H\n" into the file. When the lock is busy, the
  // holder's line is read back (waiting up to ~1 s for a holder that has just locked and not written it yet).
  // Returns nullopt when locked. The file stays afterwards: deleting it would let two processes lock two files.
  std::optional<Failure> lock(const std::filesystem::path& path, Mode mode);
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  int fd_ = -1;
};

}  // namespace harmony::core
