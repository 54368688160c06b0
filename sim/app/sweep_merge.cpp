// Merging sweep shards (sim/app/sweep.hpp, docs/sweeps.md#shards): checks that the folders are the shards of one
// sweep, complete and untouched, then interleaves their rows into one results folder, holding shared locks on
// the shards and an exclusive one on the output.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/app/sweep_internal.hpp"

namespace harmony::sim {

using namespace sweep_detail;  // NOLINT(google-build-using-namespace): the sweep's own internal pieces

namespace {

// The point index a JSON Lines row names, or nullopt when the line is not a row object.
std::optional<std::pair<std::size_t, std::string>> row_key(std::string_view line) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("point") || !j.contains("id")) return std::nullopt;
    return std::make_pair(j.at("point").get<std::size_t>(), j.at("id").get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

constexpr const char* kMergeAgainHint =
    "rerun that shard's `harmony-sim sweep ... --shard I/N --out DIR` (it resumes; add --repair if it reports a "
    "broken row), then merge";

// One shard folder as merge reads it.
struct ShardInput {
  fs::path dir;
  Shard shard;
  std::string fingerprint;
  std::size_t points = 0;
  std::string identity;  // sweep.json without its shard and sweep file: equal for the shards of one sweep
  std::string meta_text;
  std::string csv, jsonl;
  Lines csv_lines, jsonl_lines;
};

// A shard folder's sweep.json (its rows are read later, by read_shard_rows).
std::unique_ptr<ShardInput> read_shard_meta(const std::string& d) {
  auto in = std::make_unique<ShardInput>();
  in->dir = d;
  const fs::path meta_path = in->dir / kMetaFile;
  if (!fs::exists(meta_path))
    fail(file_loc(in->dir), "not a sweep output folder (no sweep.json)", "give the --out folders of the shards");
  auto meta = read_meta(meta_path);
  in->shard = meta_shard(meta, meta_path);
  in->fingerprint = meta.at("fingerprint").dump();
  in->points = meta.at("points").get<std::size_t>();
  in->meta_text = meta.dump();
  meta.erase("shard");
  meta.erase("sweep_file");
  meta.erase("sweep_file_absolute");
  in->identity = meta.dump();
  return in;
}

// The shards by their index I of I/N: every one of one sweep and one split, each given once, none missing.
std::vector<const ShardInput*> shards_by_index(const std::vector<ShardInput*>& ins) {
  const ShardInput& first = *ins.front();
  const std::size_t count = first.shard.count;
  std::vector<const ShardInput*> by_index(count, nullptr);
  for (const ShardInput* in_ptr : ins) {
    const ShardInput& in = *in_ptr;
    const fs::path meta_path = in.dir / kMetaFile;
    if (in.fingerprint != first.fingerprint || in.identity != first.identity)
      fail(file_loc(meta_path),
           fmt::format("a different sweep from {} (fingerprint {} vs {})", (first.dir / kMetaFile).generic_string(),
                       in.fingerprint, first.fingerprint),
           "merge only the shards of one sweep file");
    if (in.shard.count != count)
      fail(file_loc(meta_path),
           fmt::format("shard {}/{} does not split the sweep like {} ({} shards)", in.shard.index, in.shard.count,
                       first.dir.generic_string(), count),
           "merge the shards of one --shard I/N split");
    if (by_index[in.shard.index])
      fail(file_loc(meta_path),
           fmt::format("shard {}/{} is given twice (also {})", in.shard.index, count,
                       by_index[in.shard.index]->dir.generic_string()),
           "give each shard's folder once");
    by_index[in.shard.index] = &in;
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < count; ++i) {
    if (!by_index[i]) missing.push_back(fmt::format("{}/{}", i, count));
  }
  if (!missing.empty())
    fail(core::SourceLoc{"merge", 0, 0}, fmt::format("missing shard(s) {}", join(missing, ", ")),
         "give the --out folder of every shard 0/N .. N-1/N");
  return by_index;
}

// Reads every shard's rows, which must be complete (all its points, no partial line) under the same CSV header;
// returns that header.
std::string read_shard_rows(const std::vector<ShardInput*>& ins, std::size_t points, std::size_t count) {
  std::string header;
  for (ShardInput* in_ptr : ins) {
    ShardInput& in = *in_ptr;
    in.csv = slurp(in.dir / kCsvFile);
    in.jsonl = slurp(in.dir / kJsonlFile);
    in.csv_lines = complete_lines(in.csv);
    in.jsonl_lines = complete_lines(in.jsonl);
    const std::size_t want = in.shard.size(points);
    const std::size_t csv_rows = in.csv_lines.lines.empty() ? 0 : in.csv_lines.lines.size() - 1;
    if (in.jsonl_lines.lines.size() != want || csv_rows != want || in.csv_lines.ends.empty() ||
        in.csv_lines.ends.back() != in.csv.size() || (want > 0 && in.jsonl_lines.ends.back() != in.jsonl.size()))
      fail(file_loc(in.dir),
           fmt::format("shard {}/{} is incomplete: {} of its {} points", in.shard.index, count,
                       std::min(in.jsonl_lines.lines.size(), csv_rows), want),
           kMergeAgainHint);
    const std::string h(in.csv_lines.lines[0]);
    if (header.empty()) header = h;
    if (h != header) fail(file_loc(in.dir / kCsvFile, 1), "its columns differ from the other shards'", kMergeAgainHint);
  }
  return header;
}

// The merge's output folder, created when missing.
fs::path make_merge_folder(const std::string& out_dir) {
  fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    fail(file_loc(out), "cannot create the output folder", "pick a writable folder for the merged results");
  return out;
}

// The merge writes into a folder without results only.
void refuse_results(const fs::path& out) {
  for (const char* f : {kMetaFile, kCsvFile, kJsonlFile}) {
    if (fs::exists(out / f))
      fail(file_loc(out / f), "the merge output folder already holds results", "merge into a new, empty folder");
  }
}

// The shards' rows interleaved in point order (point p is row p / N of shard p % N) into *csv and *jsonl.
void interleave_rows(const std::vector<const ShardInput*>& by_index, std::size_t points, std::string* csv,
                     std::string* jsonl) {
  const std::size_t count = by_index.size();
  for (std::size_t p = 0; p < points; ++p) {
    const ShardInput& in = *by_index[p % count];
    const std::size_t k = p / count;
    const auto key = row_key(in.jsonl_lines.lines[k]);
    if (!key || key->first != p || !starts_with(in.csv_lines.lines[k + 1], fmt::format("{},{},", p, key->second)))
      fail(file_loc(in.dir / kJsonlFile, static_cast<int>(k + 1)), fmt::format("row {} is not point {}", k + 1, p),
           kMergeAgainHint);
    *csv += in.csv_lines.lines[k + 1];
    *csv += '\n';
    *jsonl += in.jsonl_lines.lines[k];
    *jsonl += '\n';
  }
}

}  // namespace

MergeSummary merge_sweeps(const std::string& out_dir, const std::vector<std::string>& shard_dirs) {
  if (shard_dirs.empty())
    fail(core::SourceLoc{"merge", 0, 0}, "no shard folders given", "harmony-sim merge OUT SHARD_DIR...");
  // Held by pointer: the lines are views into the strings beside them, which must not move.
  std::vector<std::unique_ptr<ShardInput>> held;
  std::vector<ShardInput*> ins;
  held.reserve(shard_dirs.size());
  ins.reserve(shard_dirs.size());
  std::vector<std::unique_ptr<FolderLock>> locks;  // shared on every shard: no sweep writes into one meanwhile
  for (const auto& d : shard_dirs) {
    if (fs::is_directory(d)) locks.push_back(std::make_unique<FolderLock>(fs::path(d), LockMode::Read));
    auto in = read_shard_meta(d);
    ins.push_back(in.get());
    held.push_back(std::move(in));
  }
  const ShardInput& first = *ins.front();
  const std::size_t count = first.shard.count;
  const std::size_t points = first.points;
  const std::vector<const ShardInput*> by_index = shards_by_index(ins);
  const std::string header = read_shard_rows(ins, points, count);

  const fs::path out = make_merge_folder(out_dir);
  refuse_results(out);  // before locking: a shard folder given as the output is named as such
  // exclusive on the output: a concurrent merge (or sweep) into it is refused naming the holder; checked again
  // under the lock for one that finished in between
  const FolderLock out_lock(out);
  refuse_results(out);
  std::string csv = header + "\n";
  std::string jsonl;
  interleave_rows(by_index, points, &csv, &jsonl);
  auto meta = nlohmann::ordered_json::parse(first.meta_text);
  meta["shard"] = shard_json(Shard{});
  write_atomically(out / kCsvFile, csv);
  write_atomically(out / kJsonlFile, jsonl);
  write_atomically(out / kMetaFile, dump_meta(meta));
  return MergeSummary{points, count};
}

}  // namespace harmony::sim
