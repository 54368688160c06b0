// The pieces the sweep's files share (sim/app/sweep_file.cpp, sweep_rows.cpp, sweep_folder.cpp, sweep_run.cpp,
// sweep_merge.cpp): the model cache, the results folder's names and format, located errors, file reading and
// writing, the folder lock. Internal to sim/'s sweep: nothing outside those files includes it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/file_lock.hpp"
#include "core/base/input_file.hpp"
#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/plan/plan_kind.hpp"
#include "sim/app/file_loc.hpp"
#include "sim/app/sweep.hpp"

namespace harmony::sim {

// ------------------------------------------------------------------------------------------------
// The model cache: one Model per distinct model source, loaded by the first worker that needs it.

class ModelCache {
 public:
  // `key` names the model's source: the profile's path, or (analytic models, which depend on the machine's
  // rates) the point's model and machine overrides.
  std::shared_ptr<const core::Model> get(const std::string& key, const core::RunConfig& cfg) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = models_.find(key); it != models_.end()) return it->second;
    }
    auto model = std::make_shared<const core::Model>(core::load_model(cfg.model, cfg.machine));
    const std::lock_guard<std::mutex> lock(mutex_);
    return models_.emplace(key, std::move(model)).first->second;  // a racing loader's copy wins: same bits
  }

  // The FNV-1a digest and size of a file's bytes, read once per run; "missing" when it cannot be read.
  std::string file_digest(const std::string& path) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = digests_.find(path); it != digests_.end()) return it->second;
    }
    std::string digest = "missing";
    std::string problem;  // a file that cannot be read (or a directory, FIFO, device) digests as "missing"
    if (const auto text = core::try_read_input_file(path, &problem))
      digest = fnv1a_hex(*text) + " " + std::to_string(text->size());
    const std::lock_guard<std::mutex> lock(mutex_);
    return digests_.emplace(path, std::move(digest)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const core::Model>> models_;
  std::map<std::string, std::string> digests_;
};

namespace sweep_detail {

namespace fs = std::filesystem;

inline constexpr const char* kFormat = "harmony-sweep-results";
// 2: the `inputs` column; 3: output schema 1 (docs/output-schema.md): plan_kind, cost_model, packing_fwd/bwd,
// num_candidates, gpu_capacity_bytes, fits, excess_bytes, packs as JSON arrays, schema_version in every row.
inline constexpr int kFormatVersion = kSweepFormatVersion;
inline constexpr const char* kMetaFile = "sweep.json";
inline constexpr const char* kCsvFile = "results.csv";
inline constexpr const char* kJsonlFile = "results.jsonl";
inline constexpr const char* kLockFile = "sweep.lock";
inline constexpr const char* kFreshHint = "use a new --out folder, or delete this one to start the sweep over";

[[noreturn]] inline void fail(const core::SourceLoc& loc, const std::string& message, const std::string& hint = {}) {
  throw core::ConfigError(loc, message, hint);
}

inline std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

inline bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The plan.mode a point's id hashes (sweep_point): a kind with packs its own name; a kind without packs
// "harmony-pp", as the ids were first made (plan.mode then named Harmony's kinds only), so that a resumed sweep's
// ids and the results' id column are the same as before. The point's config sets plan.mode to the kind itself.
inline const char* id_mode_for(core::PlanKind k) { return k->packs ? k.name() : "harmony-pp"; }

// One line: newlines and runs of spaces in messages (deadlock reports) become "; " and " " (sweep_rows.cpp).
std::string one_line(const std::string& s);

// The one input check (core/base/input_file): a directory, FIFO or unreadable file is refused with the reason,
// located where the sweep names it (sweep_folder.cpp, as the rest below).
std::string read_file(const std::string& path, const core::SourceLoc& where, const std::string& what);

std::string slurp(const fs::path& p);
void write_atomically(const fs::path& p, const std::string& text);

// The complete ('\n'-terminated) lines of a text, with the byte offset after each; a partial last line (a
// write cut short by a kill) is left out.
struct Lines {
  std::vector<std::string_view> lines;
  std::vector<std::uint64_t> ends;
};
Lines complete_lines(const std::string& text);

nlohmann::ordered_json shard_json(const Shard& sh);
std::string dump_meta(const nlohmann::ordered_json& j);
// sweep.json of a results folder; throws when it is not one.
nlohmann::ordered_json read_meta(const fs::path& p);
Shard meta_shard(const nlohmann::ordered_json& meta, const fs::path& p);

// A flock on DIR/sweep.lock for the life of a run: exclusive for a writer (a sweep, a merge's output folder),
// shared for a reader (merge reading a shard, so a sweep cannot write into it meanwhile, and two merges may read
// it at once). A writer records its pid and host in the file, so a second run names it; the file stays
// (unlocked) afterwards: deleting it would let two runs lock different files. A reader opens the file read-only
// and skips a folder that has none (no locking sweep ever wrote there; read-only copies merge as before).
enum class LockMode { Write, Read };

// The flock and the holder's record are core::FileLock's; this class words a sweep's refusals.
class FolderLock {
 public:
  explicit FolderLock(const fs::path& dir, LockMode mode = LockMode::Write);

 private:
  core::FileLock lock_;
};

}  // namespace sweep_detail
}  // namespace harmony::sim
