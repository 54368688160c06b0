// Design-space sweeps (`harmony-sim sweep` / `merge`, docs/sweeps.md): the sweep file (a base config, a grid
// of config overrides, plan kinds, a training budget), its expansion into numbered points, evaluation of each
// point (the best plan of its kind, sim/study/compare.hpp), CSV + JSON Lines rows written in point order, resume,
// shards and their merge. Library code: progress goes through a callback, bad input is core::ConfigError.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/error.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::sim {

// One grid dimension: a dotted config key and its values, each the canonical flow-YAML text of the value
// as written ("4", "10GiB", "[balanced_time, reuse]", "{preset: h100-sxm-8x, price_per_hour: 98.32}").
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
  core::SourceLoc loc;  // the key in the sweep file
};

// A fixed override applied to every point before the grid's (`set:`).
struct SweepSetting {
  std::string key;
  std::string value;
  core::SourceLoc loc;
};

// The training budget time-to-train and cost are computed for (`budget:`); samples = 0: none.
struct SweepBudget {
  std::int64_t samples = 0;  // samples to train on (tokens / seq_len, rounded up, for a token budget)
  std::int64_t tokens = 0;   // as given (0: the budget was given in samples)
  std::int64_t seq_len = 0;  // tokens per sample, with `tokens`
  bool bill_gpus = false;    // cost = price x hours x (gpus used / machine.gpus) instead of the whole machine
};

struct Sweep {
  std::string file;       // the sweep file
  std::string base;       // `base:` as written
  std::string base_path;  // resolved against the sweep file's folder
  std::string base_text;  // the base config's bytes, read once by the loader
  std::vector<SweepSetting> set;
  std::vector<SweepAxis> grid;        // in file order: the first key varies slowest
  std::vector<core::PlanKind> kinds;  // the innermost dimension, in the order given
  SweepBudget budget;
  std::string fingerprint;  // 16 hex digits over the sweep's content and the base config's bytes (not the files
                            // the points read: each row's `inputs` digest covers those)

  std::size_t num_combos() const;  // product of the grid's value counts (1 for an empty grid)
  std::size_t num_points() const { return num_combos() * kinds.size(); }
};

// Reads and validates a sweep file: strict keys, file:line:column errors with hints, and every grid and
// `set:` key checked against the base config (an unknown config key is reported at the sweep file's key).
Sweep load_sweep(const std::string& path);
// Same, from text; `name` resolves `base:` and appears in messages.
Sweep load_sweep_text(const std::string& text, const std::string& name);

// Point p of the sweep: combination p / K of the grid (odometer order, the last grid key fastest) and plan
// kind p % K, K = kinds.size().
struct SweepPoint {
  std::size_t index = 0;
  core::PlanKind kind;
  std::vector<std::size_t> value_index;  // per grid axis
  std::vector<std::string> overrides;    // `set:`, then the grid's, then plan.mode: "key=value"
  std::string id;                        // 16 hex digits: a hash of the kind and the overrides
};
SweepPoint sweep_point(const Sweep& sweep, std::size_t index);

// Grids of more points than this need SweepRunOptions::allow_large_grid (`--allow-large-grid`): the points are
// enumerated one by one and rows stream to the files, so memory does not grow with the grid, but such a run is
// usually a mistake (a forgotten axis, a long list pasted twice) and takes days.
constexpr std::size_t kLargeGridPoints = 1'000'000;
// The results format of a sweep folder (sweep.json's "version"); see kFormatVersion in sweep_internal.hpp.
constexpr int kSweepFormatVersion = 4;  // 4: activation_policy and offload columns

// `--shard I/N`: the points p with p % N == I.
struct Shard {
  std::size_t index = 0;
  std::size_t count = 1;
  bool contains(std::size_t point) const { return point % count == index; }
  std::size_t size(std::size_t total) const { return total > index ? (total - index + count - 1) / count : 0; }
  std::size_t point(std::size_t k) const { return index + k * count; }  // the k-th point of the shard
};
// "I/N" with 0 <= I < N; throws ConfigError naming `where` (e.g. "--shard").
Shard parse_shard(std::string_view text, const std::string& where);

// The columns of results.csv (and keys of each results.jsonl object), in order.
std::vector<std::string> sweep_columns(const Sweep& sweep);

// One evaluated point: the same cells rendered as a CSV row and as a JSON object, each one line ending in '\n'.
struct SweepRow {
  std::size_t point = 0;
  std::string status;  // ok, does_not_fit, deadlock, invalid
  std::string reason;
  std::string inputs;  // the `inputs` column: sweep_point_inputs()
  std::string csv;
  std::string json;
};

class ModelCache;  // models loaded once per run, shared by the workers

// Evaluates one point (loads its config and model, searches the best plan of its kind). Never throws for
// bad points: config errors, plans that cannot be built, kinds that do not apply are rows with status
// `invalid` and a reason; only internal errors propagate.
SweepRow evaluate_sweep_point(const Sweep& sweep, std::size_t index, ModelCache* cache = nullptr);

// The `inputs` digest of point `index` (16 hex digits): the bytes of every file its config reads besides the
// base config (machine files and the files they name, the model's profile; core::RunConfig::inputs), or, when
// its config cannot be built, the error. A resumed run recomputes the rows whose digest changed.
std::string sweep_point_inputs(const Sweep& sweep, std::size_t index, ModelCache* cache = nullptr);

struct SweepProgress {
  std::size_t total = 0;     // points of this shard
  std::size_t done = 0;      // rows in the files (resumed + computed)
  std::size_t resumed = 0;   // rows of an earlier run kept so far (their inputs unchanged)
  std::size_t computed = 0;  // rows computed by this run so far
  double elapsed_s = 0.0;
  double points_per_s = 0.0;  // computed / elapsed
  double eta_s = -1.0;        // -1: unknown
  bool finished = false;
  // Before computing, a resume re-hashes the input files of the earlier run's rows: while it does, `checking`
  // is set and checked / to_check count those rows (done and the rates are not yet meaningful).
  bool checking = false;
  std::size_t checked = 0;
  std::size_t to_check = 0;
};
using SweepProgressFn = std::function<void(const SweepProgress&)>;

struct SweepRunOptions {
  std::string out_dir;
  std::string sweep_file_as_given;  // recorded in sweep.json; defaults to Sweep::file
  Shard shard;
  int threads = 0;                          // 0: all hardware threads
  double progress_interval_s = 0.25;        // the callback's cadence (and after every written row)
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT): finish the points in flight, return
  bool allow_large_grid = false;            // run sweeps of more than kLargeGridPoints points
  // `--repair`: rows of an earlier run that are broken (not JSON, a wrong point or id, a CSV line with the wrong
  // number of fields, a repeated or foreign row, a bad CSV header) are dropped and their points computed again;
  // every valid row is kept. Without it such a folder is refused, naming the line and --repair.
  bool repair = false;
};

struct SweepSummary {
  std::size_t total = 0;     // points of this shard
  std::size_t resumed = 0;   // rows of an earlier run kept: skipped as already done
  std::size_t computed = 0;  // rows computed by this run (stale ones included)
  std::size_t stale = 0;     // rows of an earlier run recomputed because a file they read changed
  std::size_t repaired = 0;  // --repair: broken lines dropped from the files (their points computed again)
  std::vector<std::string> repaired_lines;                 // the first 5 of them, as FILE:LINE
  std::size_t done() const { return resumed + computed; }  // rows in the files now
  bool interrupted = false;                                // stopped by `stop` before the last point
  std::map<std::string, std::size_t> by_status;            // over all rows in the files (kept and computed)
  std::vector<std::string> invalid_reasons;                // distinct reasons of invalid rows (first 5)
  double wall_s = 0.0;
};

// Runs (or resumes) a sweep into out_dir: sweep.json, results.csv, results.jsonl. A folder written by a
// different sweep or shard is refused (ConfigError naming its sweep.json); rows from an earlier run are
// validated and kept unless their `inputs` digest changed (those are recomputed), a truncated last row is
// dropped and recomputed; the files end up byte-identical to an uninterrupted run's, for any thread count.
// The run holds an exclusive lock on out_dir/sweep.lock (flock; the file names the holder's pid and host): a
// second run on the same folder is refused with a ConfigError naming the holder. Grids above kLargeGridPoints
// are refused unless options.allow_large_grid. Memory does not grow with the grid (only with an earlier run's
// rows, which are read back).
SweepSummary run_sweep(const Sweep& sweep, const SweepRunOptions& options, const SweepProgressFn& progress = {});

struct MergeSummary {
  std::size_t points = 0;
  std::size_t shards = 0;
};
// Joins the output folders of shards 0/N .. N-1/N of one sweep into out_dir, byte-identical to the unsharded
// run. Refuses folders of different sweeps, missing or repeated shards, incomplete shards, and an out_dir
// that already holds results.
MergeSummary merge_sweeps(const std::string& out_dir, const std::vector<std::string>& shard_dirs);

// Helpers shared with the tests.
std::string fnv1a_hex(std::string_view data);  // 16 lower-case hex digits of FNV-1a 64
std::string csv_field(std::string_view text);  // RFC 4180 quoting when needed

}  // namespace harmony::sim
