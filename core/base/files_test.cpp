// Tests of core/base/atomic_file.cpp and core/base/input_file.cpp: regular files replaced (permissions kept),
// symlinks written through, folders/FIFOs refused with the OS's reason and nothing created, a failed write
// (file size limit) keeps the previous file and removes the temp and names the limit; appends all or nothing;
// the up-front output checks; the input gate.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

template <class F>
std::string file_error_of(F&& f) {
  try {
    f();
  } catch (const FileError& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("write_file_atomic creates and replaces a regular file, keeping its permission bits") {
  TempDir d;
  write_file_atomic(d / "a.txt", "one", "the file");
  CHECK(slurp(d / "a.txt") == "one");
  ::chmod((d / "a.txt").c_str(), 0600);
  write_file_atomic(d / "a.txt", "two", "the file");
  CHECK(slurp(d / "a.txt") == "two");
  struct stat st {};
  REQUIRE(::stat((d / "a.txt").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(d.names() == std::set<std::string>{"a.txt"});
}

TEST_CASE("a symlink is written through: the link stays, its target is replaced") {
  TempDir d;
  fs::create_directories(d / "real");
  put(d / "real/t.txt", "old");
  fs::create_symlink("real/t.txt", d / "link.txt");  // relative to the link's folder
  write_file_atomic(d / "link.txt", "new", "the file");
  CHECK(fs::is_symlink(d / "link.txt"));
  CHECK(slurp(d / "real/t.txt") == "new");
  CHECK(output_target(d / "link.txt") == d / "real/t.txt");
  fs::create_symlink(d / "real/missing.txt", d / "dangling.txt");
  write_file_atomic(d / "dangling.txt", "made", "the file");
  CHECK(slurp(d / "real/missing.txt") == "made");
  CHECK(d.names() == std::set<std::string>{"real", "link.txt", "dangling.txt"});
  fs::create_symlink(d / "loop1", d / "loop2");
  fs::create_symlink(d / "loop2", d / "loop1");
  CHECK(has(file_error_of([&] { write_file_atomic(d / "loop1", "x", "the file"); }), "symbolic links"));
}

TEST_CASE("folders and FIFOs are refused before anything is created") {
  TempDir d;
  fs::create_directories(d / "dir");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(has(file_error_of([&] { write_file_atomic(d / "dir", "x", "the trace"); }), "Is a directory"));
  CHECK(has(file_error_of([&] { write_file_atomic(d / "fifo", "x", "the trace"); }), "not a regular file (a FIFO)"));
  CHECK(has(file_error_of([&] { check_output_file(d / "fifo", "the trace"); }), "not a regular file (a FIFO)"));
  CHECK(has(file_error_of([&] { check_output_file(d / "dir", "the trace"); }), "the trace: Is a directory"));
  CHECK(has(file_error_of([&] { check_output_file(d / "no/t.json", "the trace"); }), "No such file or directory"));
  CHECK(file_error_of([&] { check_output_file(d / "new.json", "the trace"); }) == "(no error)");
  CHECK(fs::is_fifo(d / "fifo"));
  CHECK(d.names() == std::set<std::string>{"dir", "fifo"});
}

TEST_CASE("check_output_dir: a writable folder, or one that can be created; never a file") {
  TempDir d;
  put(d / "file", "x");
  CHECK(file_error_of([&] { check_output_dir(d / "a/b/c", "the checkpoint directory"); }) == "(no error)");
  CHECK(!fs::exists(d / "a"));  // checked, not created
  CHECK(has(file_error_of([&] { check_output_dir(d / "file", "the checkpoint directory"); }), "Not a directory"));
  CHECK(has(file_error_of([&] { check_output_dir(d / "file/sub", "the checkpoint directory"); }), "Not a directory"));
}

// RLIMIT_FSIZE = LIMIT_BYTES (soft) with SIGXFSZ ignored (core::ignore_file_size_signal, as the mains do) for
// the scope: write() past the limit fails with EFBIG.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t limit_bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    handler_ = std::signal(SIGXFSZ, SIG_DFL);
    ignore_file_size_signal();
    struct rlimit small = old_;
    small.rlim_cur = limit_bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit old_ {};
  void (*handler_)(int) = nullptr;
};

TEST_CASE("write_error_reason: the OS's words; EFBIG with the file size limit") {
  CHECK(write_error_reason(ENOSPC) == "No space left on device");
  {
    const FileSizeLimit limit(4096);
    CHECK(write_error_reason(EFBIG) == "File too large (the file size limit, ulimit -f, is 4.00 KiB = 4096 bytes)");
  }
  {
    const FileSizeLimit limit(100);
    CHECK(write_error_reason(EFBIG) == "File too large (the file size limit, ulimit -f, is 100 bytes)");
  }
  struct rlimit now {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &now) == 0);
  if (now.rlim_cur == RLIM_INFINITY) CHECK(write_error_reason(EFBIG) == "File too large");
}

TEST_CASE("a failed write keeps the previous file and removes the temp file") {
  TempDir d;
  put(d / "out.bin", "previous");
  std::string e;
  {
    const FileSizeLimit limit(16);
    e = file_error_of([&] { write_file_atomic(d / "out.bin", std::string(1000, 'x'), "the file"); });
  }
  CHECK(has(e, d / "out.bin"));
  CHECK(has(e, "File too large (the file size limit, ulimit -f, is 16 bytes)"));
  CHECK(has(e, "hint: raise the file size limit"));
  CHECK(slurp(d / "out.bin") == "previous");
  CHECK(d.names() == std::set<std::string>{"out.bin"});
  {
    AtomicFile f(d / "out.bin", "the file");  // never committed: the temp goes with it
    f.write("half");
    CHECK(fs::exists(f.temp_path()));
  }
  CHECK(slurp(d / "out.bin") == "previous");
  CHECK(d.names() == std::set<std::string>{"out.bin"});
}

TEST_CASE("AppendFile: each record whole or not at all; truncate cuts back to an earlier size") {
  TempDir d;
  put(d / "rows.txt", "header\n");
  {
    AppendFile f(d / "rows.txt", "the rows");
    CHECK(f.size_bytes() == 7);
    f.append("one\n");
    const std::uint64_t before = f.size_bytes();
    f.append("two\n");
    f.truncate(before);  // "two" belonged with a record of another file that failed
    CHECK(f.size_bytes() == 11);
    f.append("three\n");
  }
  CHECK(slurp(d / "rows.txt") == "header\none\nthree\n");
  std::string e;
  {
    AppendFile f(d / "rows.txt", "the rows");
    const FileSizeLimit limit(24);  // room for 7 of the record's 10 bytes: write() takes them, then EFBIG
    e = file_error_of([&] { f.append("four-four\n"); });
    CHECK(f.size_bytes() == 17);
  }
  CHECK(has(e, d / "rows.txt"));
  CHECK(has(e, "cannot write (the rows): File too large (the file size limit, ulimit -f, is 24 bytes)"));
  CHECK(slurp(d / "rows.txt") == "header\none\nthree\n");  // the partial record cut off
  // The node rules of AtomicFile: a symlink written through, folders and FIFOs refused before anything is made.
  fs::create_symlink("rows.txt", d / "link.txt");
  AppendFile(d / "link.txt", "the rows").append("five\n");
  CHECK(fs::is_symlink(d / "link.txt"));
  CHECK(slurp(d / "rows.txt") == "header\none\nthree\nfive\n");
  fs::create_directories(d / "dir");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(has(file_error_of([&] { AppendFile(d / "dir", "the rows"); }), "Is a directory"));
  CHECK(has(file_error_of([&] { AppendFile(d / "fifo", "the rows"); }), "not a regular file (a FIFO)"));
  CHECK(d.names() == std::set<std::string>{"rows.txt", "link.txt", "dir", "fifo"});
}

TEST_CASE("the input gate: regular files only, with the OS's reason, never blocking on a FIFO") {
  TempDir d;
  put(d / "in.txt", "hello");
  fs::create_directories(d / "dir");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(read_input_file(d / "in.txt", "the input") == "hello");
  CHECK(!input_file_problem(d / "in.txt"));
  CHECK(input_file_problem(d / "dir") == std::optional<std::string>("Is a directory"));
  CHECK(input_file_problem(d / "fifo") == std::optional<std::string>("not a regular file (a FIFO)"));
  CHECK(input_file_problem(d / "missing") == std::optional<std::string>("No such file or directory"));
  const std::string e = file_error_of([&] { read_input_file(d / "dir", "the config"); });
  CHECK(has(e, d / "dir"));
  CHECK(has(e, "cannot read the config: Is a directory"));
  if (::geteuid() != 0) {  // root reads anything
    ::chmod((d / "in.txt").c_str(), 0);
    CHECK(input_file_problem(d / "in.txt") == std::optional<std::string>("Permission denied"));
  }
}
