// Tests of core::FileLock (core/base/file_lock): an exclusive holder records "pid N on host H"; a second lock on the
// same file (flock locks belong to the open file, so a second open in one process contends like another process)
// is Busy and reads that record; a shared lock of a missing file is Absent, of a held one Busy; a released or
// destroyed lock can be taken again; a lock file that cannot be created is OpenFailed with errno; moves transfer it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "core/base/file_lock.hpp"

using harmony::core::FileLock;
namespace fs = std::filesystem;
using Kind = FileLock::Failure::Kind;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() / ("harmony_file_lock_" + std::to_string(::getpid()));
  Dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("an exclusive lock records its holder; a second one is refused naming it") {
  Dir d;
  const fs::path file = d.path / "x.lock";
  FileLock a;
  REQUIRE_FALSE(a.lock(file, FileLock::Mode::Exclusive).has_value());
  CHECK(a.held());
  const std::string record = slurp(file);
  CHECK(record.starts_with("pid " + std::to_string(::getpid()) + " on host "));
  FileLock b;
  const auto busy = b.lock(file, FileLock::Mode::Exclusive);
  REQUIRE(busy.has_value());
  CHECK(busy->kind == Kind::Busy);
  CHECK(busy->holder + "\n" == record);
  CHECK_FALSE(b.held());
  const auto shared = FileLock().lock(file, FileLock::Mode::Shared);
  REQUIRE(shared.has_value());
  CHECK(shared->kind == Kind::Busy);
  a.release();
  CHECK_FALSE(b.lock(file, FileLock::Mode::Exclusive).has_value());
  CHECK(fs::exists(file));  // the file stays: deleting it would let two processes lock two files
}

TEST_CASE("shared locks: absent file, several readers, a writer refused") {
  Dir d;
  const fs::path file = d.path / "s.lock";
  const auto absent = FileLock().lock(file, FileLock::Mode::Shared);
  REQUIRE(absent.has_value());
  CHECK(absent->kind == Kind::Absent);
  {
    FileLock w;
    REQUIRE_FALSE(w.lock(file, FileLock::Mode::Exclusive).has_value());
  }  // destroyed: released
  FileLock r1, r2;
  CHECK_FALSE(r1.lock(file, FileLock::Mode::Shared).has_value());
  CHECK_FALSE(r2.lock(file, FileLock::Mode::Shared).has_value());
  const auto writer = FileLock().lock(file, FileLock::Mode::Exclusive);
  REQUIRE(writer.has_value());
  CHECK(writer->kind == Kind::Busy);
}

TEST_CASE("a lock file that cannot be created; moves transfer the lock") {
  Dir d;
  const auto failed = FileLock().lock(d.path / "missing" / "x.lock", FileLock::Mode::Exclusive);
  REQUIRE(failed.has_value());
  CHECK(failed->kind == Kind::OpenFailed);
  CHECK(failed->error == ENOENT);
  const fs::path file = d.path / "m.lock";
  FileLock a;
  REQUIRE_FALSE(a.lock(file, FileLock::Mode::Exclusive).has_value());
  FileLock b = std::move(a);
  CHECK(b.held());
  CHECK_FALSE(a.held());  // NOLINT(bugprone-use-after-move): a moved-from lock holds nothing
  CHECK(FileLock().lock(file, FileLock::Mode::Exclusive).has_value());
  b = FileLock();
  CHECK_FALSE(FileLock().lock(file, FileLock::Mode::Exclusive).has_value());
}
