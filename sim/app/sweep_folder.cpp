// The results folder's shared plumbing (sweep_internal.hpp): reading and writing its files, sweep.json's
// shard, the folder lock that keeps two writers (or a writer and a merge) apart.
#include <cstring>

#include <fmt/format.h>

#include "core/base/atomic_file.hpp"
#include "core/base/input_file.hpp"
#include "sim/app/sweep_internal.hpp"

namespace harmony::sim::sweep_detail {

// The one input check (core/base/input_file): a directory, FIFO or unreadable file is refused with the reason,
// located where the sweep names it.
std::string read_file(const std::string& path, const core::SourceLoc& where, const std::string& what) {
  std::string problem;
  auto text = core::try_read_input_file(path, &problem);
  if (!text)
    fail(where, fmt::format("cannot read {} '{}': {}", what, path, problem),
         "check the path (relative to the sweep file's folder)");
  return std::move(*text);
}

// One line: newlines and runs of spaces in messages (deadlock reports) become "; " and " ".
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      if (!out.empty() && out.back() != ';') out += "; ";
      continue;
    }
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

std::string slurp(const fs::path& p) { return read_file(p.string(), file_loc(p), "the file"); }

void write_atomically(const fs::path& p, const std::string& text) {
  core::write_file_atomic(p.string(), text, "the file", "check the folder is writable and the disk has space");
}

Lines complete_lines(const std::string& text) {
  Lines l;
  std::size_t start = 0;
  for (std::size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    l.lines.push_back(std::string_view(text).substr(start, nl - start));
    l.ends.push_back(nl + 1);
    start = nl + 1;
  }
  return l;
}

nlohmann::ordered_json shard_json(const Shard& sh) {
  nlohmann::ordered_json j;
  j["index"] = sh.index;
  j["count"] = sh.count;
  return j;
}

std::string dump_meta(const nlohmann::ordered_json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

nlohmann::ordered_json read_meta(const fs::path& p) {
  const std::string text = slurp(p);
  try {
    auto j = nlohmann::ordered_json::parse(text);
    if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("fingerprint") || !j.contains("points") ||
        !j.contains("shard"))
      fail(file_loc(p), "not a harmony-sim sweep description", kFreshHint);
    return j;
  } catch (const nlohmann::json::exception& e) {
    fail(file_loc(p), fmt::format("malformed sweep description: {}", e.what()), kFreshHint);
  }
}

Shard meta_shard(const nlohmann::ordered_json& meta, const fs::path& p) {
  try {
    Shard sh;
    sh.index = meta.at("shard").at("index").get<std::size_t>();
    sh.count = meta.at("shard").at("count").get<std::size_t>();
    if (sh.count < 1 || sh.index >= sh.count) throw std::out_of_range("shard");
    return sh;
  } catch (const std::exception&) {
    fail(file_loc(p), "its `shard` is not {index: I, count: N} with I < N", kFreshHint);
  }
}

FolderLock::FolderLock(const fs::path& dir, LockMode mode) {
  const fs::path path = dir / kLockFile;
  const bool write = mode == LockMode::Write;
  const auto failure = lock_.lock(path, write ? core::FileLock::Mode::Exclusive : core::FileLock::Mode::Shared);
  if (!failure) return;
  using Kind = core::FileLock::Failure::Kind;
  if (failure->kind == Kind::Absent) return;  // a reader of a folder no locking sweep ever wrote into
  const std::string& holder = failure->holder;
  if (failure->kind == Kind::Busy && !write)
    fail(file_loc(dir),
         fmt::format("a sweep is writing into this shard folder ({})",
                     holder.empty() ? "holder not recorded yet" : holder),
         "wait for it to finish (or stop it: Ctrl-C keeps its rows, and a rerun resumes), then merge");
  if (failure->kind == Kind::Busy)
    fail(file_loc(dir),
         fmt::format("another sweep is writing into this folder, or a merge is using it ({})",
                     holder.empty() ? "holder not recorded yet" : "last locked by " + holder),
         fmt::format("wait for it to finish or stop it (Ctrl-C keeps its rows), or use another --out folder; "
                     "{} names the last writer",
                     path.generic_string()));
  if (failure->kind == Kind::LockFailed)
    fail(file_loc(path), fmt::format("cannot lock the folder: {}", std::strerror(failure->error)),
         "use a --out folder on a local file system");
  if (failure->kind == Kind::WriteFailed)
    fail(file_loc(path), fmt::format("cannot write the lock file: {}", core::write_error_reason(failure->error)),
         "check the folder is writable, the disk has space and the file size limit (ulimit -f) allows the file");
  fail(file_loc(path),
       fmt::format("cannot {} the lock file: {}", write ? "create" : "open", std::strerror(failure->error)),
       write ? "pick a writable --out folder" : "check the folder's permissions");
}

}  // namespace harmony::sim::sweep_detail
