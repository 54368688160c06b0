// The sweep runner (sim/app/sweep.hpp): writes a shard's rows in point order from a pool of workers into
// results.csv / results.jsonl beside sweep.json, resumes a killed run (keeping the valid rows of an earlier one,
// recomputing stale ones), and reports progress through a callback.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/parallel.hpp"
#include "core/output/report.hpp"
#include "sim/app/sweep_internal.hpp"

namespace harmony::sim {

using namespace sweep_detail;  // NOLINT(google-build-using-namespace): the sweep's own internal pieces

namespace {

std::string csv_header(const Sweep& s) {
  std::string h;
  const auto cols = sweep_columns(s);
  for (std::size_t i = 0; i < cols.size(); ++i) h += (i ? "," : "") + csv_field(cols[i]);
  return h + "\n";
}

nlohmann::ordered_json sweep_meta(const Sweep& s, const std::string& file_as_given, const Shard& shard) {
  nlohmann::ordered_json j;
  j["schema_version"] = core::kOutputSchemaVersion;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["sweep_file"] = file_as_given;
  // Lets `report` find the sweep file from any working folder (docs/report.md).
  j["sweep_file_absolute"] = fs::absolute(s.file).lexically_normal().generic_string();
  j["base"] = s.base;
  j["fingerprint"] = s.fingerprint;
  j["points"] = s.num_points();
  j["order"] =
      "point p = grid combination p / K (odometer order, the last grid key fastest) with plan kind p % K, K = "
      "len(kinds); shard I/N holds the points with p % N == I";
  nlohmann::ordered_json set = nlohmann::ordered_json::object();
  for (const auto& x : s.set) set[x.key] = x.value;
  j["set"] = std::move(set);
  nlohmann::ordered_json grid = nlohmann::ordered_json::array();
  for (const auto& a : s.grid) {
    nlohmann::ordered_json axis;
    axis["key"] = a.key;
    axis["values"] = a.values;
    grid.push_back(std::move(axis));
  }
  j["grid"] = std::move(grid);
  nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
  for (auto k : s.kinds) kinds.push_back(core::plan_kind_name(k));
  j["kinds"] = std::move(kinds);
  if (s.budget.samples > 0) {
    nlohmann::ordered_json b;
    b["samples"] = s.budget.samples;
    if (s.budget.tokens > 0) {
      b["tokens"] = s.budget.tokens;
      b["seq_len"] = s.budget.seq_len;
    }
    b["bill"] = s.budget.bill_gpus ? "gpus" : "machine";
    j["budget"] = std::move(b);
  } else {
    j["budget"] = nullptr;
  }
  j["columns"] = sweep_columns(s);
  j["shard"] = shard_json(shard);
  return j;
}

// A row of an earlier run, as read back for a resume.
struct OldRow {
  bool good = false;  // both files hold a valid row of this point (else it is computed again)
  std::string csv;    // the line with its '\n'
  std::string json;   // the line with its '\n'
  std::string inputs;
  std::string status;
  std::string reason;
};

// The rows of an earlier run by position k in the shard (rows[k], k < rows.size()), and the byte offsets to truncate
// each file to for keeping the first k of them in place (csv_ends[k], jsonl_ends[k], k <= intact).
struct Resumable {
  std::vector<OldRow> rows;
  std::vector<std::uint64_t> csv_ends;    // 0 when the file has no (valid) header
  std::vector<std::uint64_t> jsonl_ends;  // jsonl_ends[0] = 0
  std::size_t intact = 0;                 // rows 0..intact-1 are good and in place in both files
  std::size_t broken = 0;                 // lines dropped by --repair (not a row of this shard, broken, repeated)
  std::vector<std::string> broken_lines;  // the first few of them, as FILE:LINE
};

// The fields of one results.csv line (RFC 4180: a quoted field doubles its quotes); 0 when its quoting is broken.
std::size_t csv_field_count(std::string_view line) {
  std::size_t fields = 1;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') continue;
      if (i + 1 < line.size() && line[i + 1] == '"') {
        ++i;
      } else {
        quoted = false;
        if (i + 1 < line.size() && line[i + 1] != ',') return 0;
      }
    } else if (c == '"') {
      if (i > 0 && line[i - 1] != ',') return 0;
      quoted = true;
    } else if (c == ',') {
      ++fields;
    }
  }
  return quoted ? 0 : fields;
}

constexpr const char* kRepairHint =
    "rerun the same command with --repair: it keeps the good rows and computes only the broken ones again (or use a "
    "new --out folder)";

// What is wrong with JSON line `line` as the row of point p (empty: nothing), and the row's fields.
std::string json_row_problem(std::string_view line, std::size_t p, const std::string& id, OldRow* row) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("point") || !j.contains("id") || j.at("point").get<std::size_t>() != p ||
        j.at("id").get<std::string>() != id)
      return "wrong point";
    row->inputs = j.contains("inputs") && j.at("inputs").is_string() ? j.at("inputs").get<std::string>() : "";
    row->status = j.value("status", "");
    row->reason = j.contains("reason") && j.at("reason").is_string() ? j.at("reason").get<std::string>() : "";
    return {};
  } catch (const std::exception&) {
    return "not JSON";
  }
}

// The point of a JSON line, when it is a valid row of this shard (its id matches); nullopt otherwise.
std::optional<std::size_t> json_row_point(std::string_view line, const Sweep& sweep, const Shard& shard) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("point") || !j.at("point").is_number_unsigned()) return std::nullopt;
    const auto p = j.at("point").get<std::size_t>();
    if (p >= sweep.num_points() || !shard.contains(p) || !j.contains("id") || !j.at("id").is_string() ||
        j.at("id").get<std::string>() != sweep_point(sweep, p).id)
      return std::nullopt;
    return p;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The point of a CSV line, when it is a valid row of this shard (its id matches, every column there).
std::optional<std::size_t> csv_row_point(std::string_view line, const Sweep& sweep, const Shard& shard,
                                         std::size_t columns) {
  const auto comma = line.find(',');
  if (comma == std::string_view::npos || comma == 0 || csv_field_count(line) != columns) return std::nullopt;
  std::size_t p = 0;
  for (const char c : line.substr(0, comma)) {
    if (c < '0' || c > '9' || p > sweep.num_points()) return std::nullopt;
    p = p * 10 + static_cast<std::size_t>(c - '0');
  }
  if (p >= sweep.num_points() || !shard.contains(p)) return std::nullopt;
  if (!starts_with(line, fmt::format("{},{},", p, sweep_point(sweep, p).id))) return std::nullopt;
  return p;
}

// --repair: every valid row of this shard found anywhere in the files is kept (the first copy of a point), the
// rest dropped; a point needs its row in both files to be kept. Rows in place (line k = point k of the shard, from
// the top) stay in the files; the others are written again in order.
Resumable repair_rows(const Sweep& sweep, const Shard& shard, const fs::path& csv_path, const fs::path& jsonl_path,
                      const Lines& cl, const Lines& jl, const std::string& header) {
  const std::size_t total = shard.size(sweep.num_points());
  const std::size_t columns = sweep_columns(sweep).size();
  Resumable out;
  const bool header_ok = !cl.lines.empty() && std::string(cl.lines[0]) + "\n" == header;
  constexpr std::size_t kNone = ~std::size_t{0};
  std::vector<std::size_t> csv_line(total, kNone);  // per position: its line in each file
  std::vector<std::size_t> json_line(total, kNone);
  auto drop = [&](const fs::path& file, std::size_t line_no) {
    ++out.broken;
    if (out.broken_lines.size() < 5) out.broken_lines.push_back(fmt::format("{}:{}", file.string(), line_no));
  };
  // without the header, the first line is read as a row (a damaged header is then a broken line like any other)
  for (std::size_t i = header_ok ? 1 : 0; i < cl.lines.size(); ++i) {
    const auto p = csv_row_point(cl.lines[i], sweep, shard, columns);
    if (!p || csv_line[(*p - shard.index) / shard.count] != kNone) {
      drop(csv_path, i + 1);
      continue;
    }
    csv_line[(*p - shard.index) / shard.count] = i;
  }
  for (std::size_t i = 0; i < jl.lines.size(); ++i) {
    const auto p = json_row_point(jl.lines[i], sweep, shard);
    if (!p || json_line[(*p - shard.index) / shard.count] != kNone) {
      drop(jsonl_path, i + 1);
      continue;
    }
    json_line[(*p - shard.index) / shard.count] = i;
  }
  std::size_t last = 0;  // positions after the last row found in both files are simply missing
  for (std::size_t k = 0; k < total; ++k)
    if (csv_line[k] != kNone && json_line[k] != kNone) last = k + 1;
  out.rows.resize(last);
  bool in_place = header_ok;
  out.csv_ends.push_back(header_ok ? cl.ends[0] : 0);
  out.jsonl_ends.push_back(0);
  for (std::size_t k = 0; k < last; ++k) {
    OldRow& row = out.rows[k];
    if (csv_line[k] != kNone && json_line[k] != kNone) {
      const std::size_t p = shard.point(k);
      row.good = json_row_problem(jl.lines[json_line[k]], p, sweep_point(sweep, p).id, &row).empty();
      row.csv = std::string(cl.lines[csv_line[k]]) + "\n";
      row.json = std::string(jl.lines[json_line[k]]) + "\n";
    }
    in_place = in_place && row.good && csv_line[k] == k + 1 && json_line[k] == k;
    if (in_place) {
      out.csv_ends.push_back(cl.ends[k + 1]);
      out.jsonl_ends.push_back(jl.ends[k]);
      out.intact = k + 1;
    }
  }
  return out;
}

Resumable resumable_rows(const Sweep& sweep, const Shard& shard, const fs::path& csv_path, const fs::path& jsonl_path,
                         bool repair) {
  const std::size_t total = shard.size(sweep.num_points());
  Resumable out;
  const std::string header = csv_header(sweep);
  std::string csv = fs::exists(csv_path) ? slurp(csv_path) : std::string();
  std::string jsonl = fs::exists(jsonl_path) ? slurp(jsonl_path) : std::string();
  const Lines cl = complete_lines(csv);
  const Lines jl = complete_lines(jsonl);
  if (repair) return repair_rows(sweep, shard, csv_path, jsonl_path, cl, jl, header);
  const std::size_t columns = sweep_columns(sweep).size();
  std::size_t csv_rows = 0;
  if (!cl.lines.empty()) {
    if (std::string(cl.lines[0]) + "\n" != header)
      fail(file_loc(csv_path, 1), "its header is not this sweep's columns", kRepairHint);
    csv_rows = cl.lines.size() - 1;
  }
  const std::size_t n = std::min({csv_rows, jl.lines.size(), total});
  out.csv_ends.push_back(cl.lines.empty() ? 0 : cl.ends[0]);
  out.jsonl_ends.push_back(0);
  // Rows beyond n in the longer file are complete but unmatched in the other: recomputed (same bytes).
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t p = shard.point(k);
    const std::string id = sweep_point(sweep, p).id;
    OldRow row;
    if (const std::string problem = json_row_problem(jl.lines[k], p, id, &row); !problem.empty())
      fail(file_loc(jsonl_path, static_cast<int>(k + 1)),
           problem == "not JSON" ? fmt::format("row {} is not a JSON row (cut short or edited by hand)", k + 1)
                                 : fmt::format("row {} is not point {} (id {}) of this sweep", k + 1, p, id),
           kRepairHint);
    if (!starts_with(cl.lines[k + 1], fmt::format("{},{},", p, id)) || csv_field_count(cl.lines[k + 1]) != columns)
      fail(file_loc(csv_path, static_cast<int>(k + 2)),
           fmt::format("row {} is not point {} (id {}) of this sweep with its {} columns", k + 1, p, id, columns),
           kRepairHint);
    row.good = true;
    row.csv = std::string(cl.lines[k + 1]) + "\n";
    row.json = std::string(jl.lines[k]) + "\n";
    out.rows.push_back(std::move(row));
    out.csv_ends.push_back(cl.ends[k + 1]);
    out.jsonl_ends.push_back(jl.ends[k]);
  }
  // after the rows, so that a broken row before the excess is named first
  if (csv_rows > total || jl.lines.size() > total)
    fail(file_loc(csv_rows > total ? csv_path : jsonl_path),
         fmt::format("it has more rows than the {} points of this shard", total), kRepairHint);
  out.intact = n;
  return out;
}

// Counts a row into the summary's statuses and invalid reasons.
void count_row(SweepSummary& summary, const std::string& status, const std::string& reason) {
  ++summary.by_status[status];
  if (status == "invalid" && summary.invalid_reasons.size() < 5 &&
      std::find(summary.invalid_reasons.begin(), summary.invalid_reasons.end(), reason) ==
          summary.invalid_reasons.end())
    summary.invalid_reasons.push_back(reason);
}

using Clock = std::chrono::steady_clock;

// Seconds on the steady clock since t0.
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The progress callback's cadence.
std::chrono::duration<double> progress_interval(const SweepRunOptions& options) {
  return std::chrono::duration<double>(std::max(0.01, options.progress_interval_s));
}

// What one run_sweep call works from, as its helpers read it.
struct RunInputs {
  const Sweep& sweep;
  const SweepRunOptions& options;
  const SweepProgressFn& progress;
  Shard shard;
  std::size_t total;     // points of the shard
  unsigned threads;      // workers
  Clock::time_point t0;  // when the run started
  bool stop_requested() const { return options.stop != nullptr && options.stop->load(); }
};

// A sweep of more than kLargeGridPoints points runs only with --allow-large-grid.
void check_grid_size(const Sweep& sweep, const SweepRunOptions& options) {
  if (sweep.num_points() > kLargeGridPoints && !options.allow_large_grid)
    fail(core::SourceLoc{sweep.file, 0, 0},
         fmt::format("the sweep has {} points, more than {} (grid combinations x {} plan kinds)", sweep.num_points(),
                     kLargeGridPoints, sweep.kinds.size()),
         "pass --allow-large-grid to run it anyway (points stream: memory does not grow with the grid), or shrink "
         "the grid or split it into several sweep files (docs/sweeps.md)");
}

// The output folder, created when missing.
fs::path make_out_folder(const std::string& out_dir) {
  fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail(file_loc(dir), fmt::format("cannot create the output folder: {}", ec ? ec.message() : "not a folder"),
         "pick a writable --out folder");
  return dir;
}

// An existing sweep.json must be this sweep's to resume: the same format version, fingerprint and shard.
void check_resumable_meta(const fs::path& meta_path, const nlohmann::ordered_json& meta, const Shard& shard) {
  const auto old = read_meta(meta_path);
  if (const auto v = old.value("version", 0); v != kFormatVersion)
    fail(file_loc(meta_path),
         fmt::format("this folder holds results in sweep format {}, written by {} harmony-sim; this one writes format "
                     "{} (output schema {}, docs/output-schema.md) and cannot resume the older rows",
                     v, v < kFormatVersion ? "an older" : "a newer", kFormatVersion, core::kOutputSchemaVersion),
         "rerun the sweep into a new --out folder (or delete this one): every point is computed again");
  if (old.at("fingerprint") != meta.at("fingerprint"))
    fail(file_loc(meta_path),
         fmt::format("this folder holds the results of a different sweep (fingerprint {}, this sweep {}): the "
                     "sweep file or its base config changed since it was started, or harmony-sim's output format",
                     old.at("fingerprint").dump(), meta.at("fingerprint").dump()),
         kFreshHint);
  const Shard was = meta_shard(old, meta_path);
  if (was.index != shard.index || was.count != shard.count)
    fail(file_loc(meta_path),
         fmt::format("this folder holds shard {}/{} of the sweep, not {}/{}", was.index, was.count, shard.index,
                     shard.count),
         "resume a shard with the same --shard I/N, or use a new --out folder");
}

// sweep.json: checked when the folder has one (a resume), else written (a folder holding results without it is
// refused).
void check_or_write_meta(const fs::path& dir, const nlohmann::ordered_json& meta, const Shard& shard) {
  const fs::path meta_path = dir / kMetaFile;
  if (fs::exists(meta_path)) {
    check_resumable_meta(meta_path, meta, shard);
  } else {
    if (fs::exists(dir / kCsvFile) || fs::exists(dir / kJsonlFile))
      fail(file_loc(dir), "the folder holds results but no sweep.json", kFreshHint);
    write_atomically(meta_path, dump_meta(meta));
  }
}

unsigned worker_threads(const SweepRunOptions& options) {
  const unsigned threads =
      options.threads > 0 ? static_cast<unsigned>(options.threads) : std::thread::hardware_concurrency();
  return std::max(1u, threads);
}

// Re-hashes the input files of the earlier run's good rows on the workers (fresh[k] = 1: row k's inputs are
// unchanged) while this thread reports progress (a resume of a million rows takes a while). Returns how many were
// checked: fewer than `good` when stopped.
std::size_t check_old_rows(const RunInputs& in, const Resumable& old, std::size_t good, ModelCache* cache,
                           std::vector<char>* fresh) {
  const std::size_t found = old.rows.size();
  std::atomic<std::size_t> checked{0};
  std::atomic<bool> check_finished{false};
  std::exception_ptr check_error;
  std::thread checker([&] {
    try {
      core::parallel_for(found, std::min<unsigned>(in.threads, static_cast<unsigned>(std::max<std::size_t>(found, 1))),
                         [&](std::size_t k) {
                           if (in.stop_requested()) return;
                           if (!old.rows[k].good) return;
                           (*fresh)[k] =
                               sweep_point_inputs(in.sweep, in.shard.point(k), cache) == old.rows[k].inputs ? 1 : 0;
                           ++checked;
                         });
    } catch (...) {
      check_error = std::current_exception();
    }
    check_finished = true;
  });
  const auto interval = progress_interval(in.options);
  while (!check_finished.load()) {
    std::this_thread::sleep_for(std::min(interval, std::chrono::duration<double>(0.05)));
    if (in.progress && !check_finished.load()) {
      SweepProgress pr;
      pr.total = in.total;
      pr.elapsed_s = seconds_since(in.t0);
      pr.checking = true;
      pr.checked = checked.load();
      pr.to_check = good;
      in.progress(pr);
    }
  }
  checker.join();
  if (check_error) std::rethrow_exception(check_error);
  return checked.load();
}

// The summary of a run stopped while it checked the earlier rows: nothing was changed on disk.
SweepSummary stopped_while_checking(SweepSummary summary, const Resumable& old, std::size_t good,
                                    Clock::time_point t0) {
  summary.resumed = good;
  for (const auto& row : old.rows)
    if (row.good) count_row(summary, row.status, row.reason);
  summary.interrupted = true;
  summary.wall_s = seconds_since(t0);
  return summary;
}

// The rows kept where they are: up to the first one to compute, and only rows in place (--repair may find rows
// out of order or after a dropped line: those are written again, in order).
std::size_t kept_prefix(const Resumable& old, const std::vector<char>& fresh) {
  return std::min(old.intact, static_cast<std::size_t>(std::find(fresh.begin(), fresh.end(), 0) - fresh.begin()));
}

// Cuts a results file, when there is one, to its first `size` bytes.
void truncate_results(const fs::path& p, std::uint64_t size) {
  if (!fs::exists(p)) return;
  std::error_code ec;
  fs::resize_file(p, size, ec);
  if (ec) fail(file_loc(p), fmt::format("cannot truncate the file: {}", ec.message()), "check its permissions");
}

// The points after the kept prefix, in order, through a window of slots: a worker takes the next point only when it
// is fewer than `nslots` ahead of the last row written, so memory stays bounded for any grid. `mutex` guards the
// members below it, but `abort`.
struct RowWindow {
  RowWindow(const RunInputs& in_, Resumable& old_, const std::vector<char>& fresh_, std::size_t prefix_,
            ModelCache* cache_)
      : in(in_),
        old(old_),
        fresh(fresh_),
        cache(cache_),
        prefix(prefix_),
        found(old_.rows.size()),
        todo(in_.total - prefix_),
        slots(std::min(std::max<std::size_t>(64, std::size_t{8} * in_.threads), std::max<std::size_t>(todo, 1))),
        nslots(slots.size()) {}

  const RunInputs& in;
  Resumable& old;  // the workers move the kept rows out
  const std::vector<char>& fresh;
  ModelCache* cache;
  const std::size_t prefix;  // rows kept in place in the files
  const std::size_t found;   // rows of the earlier run
  const std::size_t todo;    // points after the prefix

  std::vector<std::optional<SweepRow>> slots;
  const std::size_t nslots;
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t completed = 0;  // evaluated by this run (not kept rows)
  std::size_t next = 0;
  std::size_t written = 0;
  std::atomic<bool> abort{false};
  std::exception_ptr error;
  std::size_t running = 0;

  bool stopped() const { return abort.load() || in.stop_requested(); }

  // The row at position k of the shard: the earlier run's when it is kept (moved out of `old`), else evaluated.
  SweepRow row_at(std::size_t k, bool* evaluated) {
    SweepRow row;
    if (k < found && fresh[k]) {
      row.point = in.shard.point(k);
      row.csv = std::move(old.rows[k].csv);
      row.json = std::move(old.rows[k].json);
      row.status = old.rows[k].status;
      row.reason = old.rows[k].reason;
      row.inputs = old.rows[k].inputs;
      *evaluated = false;
    } else {
      row = evaluate_sweep_point(in.sweep, in.shard.point(k), cache);
    }
    return row;
  }

  // One worker: takes the next point while the window has room and puts its row in its slot; the first error
  // stops every worker.
  void work() {
    for (;;) {
      std::size_t j = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stopped() || next >= todo || next < written + nslots; });
        if (stopped() || next >= todo) break;
        j = next++;
      }
      try {
        bool evaluated = true;
        SweepRow row = row_at(prefix + j, &evaluated);  // prefix + j: position in the shard
        const std::lock_guard<std::mutex> lock(mutex);
        slots[j % nslots] = std::move(row);
        if (evaluated) ++completed;
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        abort = true;
      }
      cv.notify_all();
    }
    const std::lock_guard<std::mutex> lock(mutex);
    --running;
    cv.notify_all();
  }
};

// The window's workers, started (none when there is nothing to compute).
std::vector<std::thread> start_workers(RowWindow& w) {
  const unsigned pool_size = std::min<unsigned>(
      w.in.threads, static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>(w.todo, 1), 1u << 16)));
  std::vector<std::thread> pool;
  // The count is set before the first worker starts and the loop reads its own copy: a worker that finishes early
  // decrements `running` under the mutex while this thread is still starting the others.
  const unsigned workers = w.todo > 0 ? pool_size : 0;
  w.running = workers;
  for (unsigned t = 0; t < workers; ++t) pool.emplace_back([&w] { w.work(); });
  return pool;
}

// The writer (the calling thread): empties the window's slots in order into both results files, counts each row
// into the summary, and reports progress after every batch written and at least every progress interval.
class RowWriter {
 public:
  RowWriter(RowWindow& w, std::vector<std::thread>& pool, core::AppendFile& csv, core::AppendFile& jsonl,
            SweepSummary& summary)
      : w_(w), pool_(pool), csv_(csv), jsonl_(jsonl), summary_(summary), kept_(w.prefix) {}

  // Writes until every point is written, or the workers stopped (an error, `stop`) and the next slot is empty.
  void run() {
    report(false);
    auto last_report = Clock::now();
    const auto interval = progress_interval(w_.in.options);
    std::unique_lock<std::mutex> lock(w_.mutex);
    while (w_.written < w_.todo) {
      w_.cv.wait_for(lock, interval, [&] { return w_.slots[w_.written % w_.nslots].has_value() || w_.running == 0; });
      const std::vector<SweepRow> ready = take_ready();
      const bool done_running = w_.running == 0;
      lock.unlock();
      for (std::size_t i = 0; i < ready.size(); ++i) {
        append_row(ready[i]);
        count_written(ready[i], w_.prefix + w_.written + i);
      }
      lock.lock();
      w_.written += ready.size();
      w_.cv.notify_all();  // workers waiting for the window
      if (!ready.empty() || Clock::now() - last_report >= interval) {
        lock.unlock();
        report(false);
        last_report = Clock::now();
        lock.lock();
      }
      if (done_running && ready.empty() && (w_.written >= w_.todo || !w_.slots[w_.written % w_.nslots].has_value()))
        break;
    }
    lock.unlock();
  }

  void report(bool finished) {  // with the mutex not held
    if (!w_.in.progress) return;
    SweepProgress pr;
    pr.total = summary_.total;
    pr.resumed = kept_;
    pr.computed = computed_;
    pr.done = kept_ + computed_;
    pr.elapsed_s = seconds_since(w_.in.t0);
    std::size_t rate_base = 0;
    {
      const std::lock_guard<std::mutex> lock(w_.mutex);
      rate_base = std::max(w_.completed, computed_);
    }
    pr.points_per_s = pr.elapsed_s > 0 ? static_cast<double>(rate_base) / pr.elapsed_s : 0.0;
    pr.eta_s = pr.points_per_s > 0 ? static_cast<double>(summary_.total - pr.done) / pr.points_per_s : -1.0;
    pr.finished = finished;
    w_.in.progress(pr);
  }

  std::size_t kept() const { return kept_; }
  std::size_t computed() const { return computed_; }

 private:
  // The rows in the slots from the next one to write on, in order, taken out of the window (mutex held).
  std::vector<SweepRow> take_ready() {
    std::vector<SweepRow> ready;
    while (w_.written + ready.size() < w_.todo && ready.size() < w_.nslots &&
           w_.slots[(w_.written + ready.size()) % w_.nslots].has_value()) {
      auto& slot = w_.slots[(w_.written + ready.size()) % w_.nslots];
      ready.push_back(std::move(*slot));
      slot.reset();
    }
    return ready;
  }

  // Appends a row to both files whole or to neither; a failed write stops the workers and is rethrown.
  void append_row(const SweepRow& row) {
    try {
      const std::uint64_t csv_before = csv_.size_bytes();
      csv_.append(row.csv);
      try {
        jsonl_.append(row.json);
      } catch (const core::FileError&) {
        csv_.truncate(csv_before);  // the row in neither file
        throw;
      }
    } catch (const core::FileError&) {
      w_.abort = true;
      w_.cv.notify_all();
      for (auto& t : pool_) t.join();
      throw;
    }
  }

  // Counts a written row, at position k of the shard, as kept or computed (and stale when it replaced a good row).
  void count_written(const SweepRow& row, std::size_t k) {
    count_row(summary_, row.status, row.reason);
    if (k < w_.found && w_.fresh[k]) {
      ++kept_;
    } else {
      ++computed_;
      if (k < w_.found && w_.old.rows[k].good) ++summary_.stale;
    }
  }

  RowWindow& w_;
  std::vector<std::thread>& pool_;
  core::AppendFile& csv_;
  core::AppendFile& jsonl_;
  SweepSummary& summary_;
  std::size_t kept_;  // rows of the earlier run in the files
  std::size_t computed_ = 0;
};

}  // namespace

SweepSummary run_sweep(const Sweep& sweep, const SweepRunOptions& options, const SweepProgressFn& progress) {
  const auto t0 = Clock::now();
  const Shard shard = options.shard;
  check_grid_size(sweep, options);
  const fs::path dir = make_out_folder(options.out_dir);
  const FolderLock folder_lock(dir);
  const fs::path csv_path = dir / kCsvFile;
  const fs::path jsonl_path = dir / kJsonlFile;
  check_or_write_meta(
      dir, sweep_meta(sweep, options.sweep_file_as_given.empty() ? sweep.file : options.sweep_file_as_given, shard),
      shard);

  SweepSummary summary;
  summary.total = shard.size(sweep.num_points());
  const RunInputs in{sweep, options, progress, shard, summary.total, worker_threads(options), t0};
  ModelCache cache;

  // Rows of an earlier run: kept when the files their point reads are unchanged, else recomputed. The files are
  // cut after the last row before the first stale one; later kept rows are written again from memory.
  Resumable old = resumable_rows(sweep, shard, csv_path, jsonl_path, options.repair);
  std::vector<char> fresh(old.rows.size(), 0);
  std::size_t good = 0;  // rows of the earlier run to check (the others are missing or broken: computed)
  for (const auto& row : old.rows) good += row.good ? 1 : 0;
  summary.repaired = old.broken;
  summary.repaired_lines = old.broken_lines;
  const std::size_t checked = check_old_rows(in, old, good, &cache, &fresh);
  if (in.stop_requested() && checked < good) return stopped_while_checking(std::move(summary), old, good, t0);
  const std::size_t prefix = kept_prefix(old, fresh);
  for (std::size_t k = 0; k < prefix; ++k) count_row(summary, old.rows[k].status, old.rows[k].reason);
  truncate_results(csv_path, old.csv_ends[prefix]);
  truncate_results(jsonl_path, old.jsonl_ends[prefix]);
  // Each row goes to both files whole or not at all (core::AppendFile): a failed write (a full disk, the file size
  // limit) leaves the rows before it, complete, for the rerun to resume from.
  const std::string rows_hint =
      "free space or raise the file size limit (ulimit -f), then rerun the same command: the rows written so far "
      "are kept";
  core::AppendFile csv(csv_path.string(), "the results", rows_hint);
  core::AppendFile jsonl(jsonl_path.string(), "the results", rows_hint);
  if (old.csv_ends[prefix] == 0) csv.append(csv_header(sweep));

  RowWindow window(in, old, fresh, prefix, &cache);
  std::vector<std::thread> pool = start_workers(window);
  RowWriter writer(window, pool, csv, jsonl, summary);
  writer.run();
  window.abort = window.abort.load() || window.written < window.todo;  // interrupted: let the workers stop
  window.cv.notify_all();
  for (auto& t : pool) t.join();
  if (window.error) std::rethrow_exception(window.error);
  summary.resumed = writer.kept();
  summary.computed = writer.computed();
  summary.interrupted = window.written < window.todo;
  summary.wall_s = seconds_since(t0);
  writer.report(true);
  return summary;
}

}  // namespace harmony::sim
