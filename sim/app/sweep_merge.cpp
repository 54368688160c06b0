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

}  // namespace

// NOLINTNEXTLINE(readability-function-size): 130 lines, over the 80 the house holds; to split
MergeSummary merge_sweeps(const std::string& out_dir, const std::vector<std::string>& shard_dirs) {
  const std::string again =
      "rerun that shard's `harmony-sim sweep ... --shard I/N --out DIR` (it resumes; add --repair if it reports a "
      "broken "
      "row), then merge";
  if (shard_dirs.empty())
    fail(core::SourceLoc{"merge", 0, 0}, "no shard folders given", "harmony-sim merge OUT SHARD_DIR...");
  struct In {
    fs::path dir;
    Shard shard;
    std::string fingerprint;
    std::size_t points = 0;
    std::string identity;  // sweep.json without its shard and sweep file: equal for the shards of one sweep
    std::string meta_text;
    std::string csv, jsonl;
    Lines csv_lines, jsonl_lines;
  };
  // Held by pointer: the lines are views into the strings beside them, which must not move.
  std::vector<std::unique_ptr<In>> held;
  std::vector<In*> ins;
  held.reserve(shard_dirs.size());
  ins.reserve(shard_dirs.size());
  std::vector<std::unique_ptr<FolderLock>> locks;  // shared on every shard: no sweep writes into one meanwhile
  for (const auto& d : shard_dirs) {
    if (fs::is_directory(d)) locks.push_back(std::make_unique<FolderLock>(fs::path(d), LockMode::Read));
    auto in = std::make_unique<In>();
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
    ins.push_back(in.get());
    held.push_back(std::move(in));
  }
  const In& first = *ins.front();
  const std::size_t count = first.shard.count;
  const std::size_t points = first.points;
  std::vector<const In*> by_index(count, nullptr);
  for (const In* in_ptr : ins) {
    const In& in = *in_ptr;
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

  std::string header;
  for (In* in_ptr : ins) {
    In& in = *in_ptr;
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
           again);
    const std::string h(in.csv_lines.lines[0]);
    if (header.empty()) header = h;
    if (h != header) fail(file_loc(in.dir / kCsvFile, 1), "its columns differ from the other shards'", again);
  }

  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    fail(file_loc(out), "cannot create the output folder", "pick a writable folder for the merged results");
  const auto refuse_results = [&] {
    for (const char* f : {kMetaFile, kCsvFile, kJsonlFile}) {
      if (fs::exists(out / f))
        fail(file_loc(out / f), "the merge output folder already holds results", "merge into a new, empty folder");
    }
  };
  refuse_results();  // before locking: a shard folder given as the output is named as such
  // exclusive on the output: a concurrent merge (or sweep) into it is refused naming the holder; checked again
  // under the lock for one that finished in between
  const FolderLock out_lock(out);
  refuse_results();
  std::string csv = header + "\n";
  std::string jsonl;
  for (std::size_t p = 0; p < points; ++p) {
    const In& in = *by_index[p % count];
    const std::size_t k = p / count;
    const auto key = row_key(in.jsonl_lines.lines[k]);
    if (!key || key->first != p || !starts_with(in.csv_lines.lines[k + 1], fmt::format("{},{},", p, key->second)))
      fail(file_loc(in.dir / kJsonlFile, static_cast<int>(k + 1)), fmt::format("row {} is not point {}", k + 1, p),
           again);
    csv += in.csv_lines.lines[k + 1];
    csv += '\n';
    jsonl += in.jsonl_lines.lines[k];
    jsonl += '\n';
  }
  auto meta = nlohmann::ordered_json::parse(first.meta_text);
  meta["shard"] = shard_json(Shard{});
  write_atomically(out / kCsvFile, csv);
  write_atomically(out / kJsonlFile, jsonl);
  write_atomically(out / kMetaFile, dump_meta(meta));
  return MergeSummary{points, count};
}

}  // namespace harmony::sim
