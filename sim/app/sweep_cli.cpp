// `harmony-sim sweep SWEEP.yaml --out DIR [--shard I/N] [--threads N] [--repair]` and `harmony-sim merge OUT
// DIR...`: options, SIGINT/SIGTERM/SIGHUP (finish the points in flight, keep the files, say what was saved, exit
// 128 + the signal; rerun to resume), progress through sim/app/progress_cli.hpp's printer (a live bar on a terminal, a
// line every 10 s otherwise) and the summary.
#include "sim/app/sweep_cli.hpp"

#include <signal.h>

#include <atomic>
#include <csignal>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/output/report.hpp"
#include "sim/app/progress_cli.hpp"
#include "sim/app/sweep.hpp"

namespace harmony::sim {

namespace {

// SIGINT, SIGTERM and SIGHUP: the sweep finishes the points in flight and stops (exit 128 + the signal: 130, 143,
// 129), as harmony-run does. The first one puts all three back to their default action, so a second one ends the
// process at once (the files stay a prefix of the final ones: a cut last line is dropped on resume).
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
bool g_handled[std::size(kStopSignals)] = {};  // per stop signal: the handler is installed (it was not ignored)

extern "C" void on_stop_signal(int signo) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    if (g_handled[i]) sigaction(kStopSignals[i], &dfl, nullptr);  // async-signal-safe
  // Two signals can reach two threads' handlers at once: the one that is not first re-raises with the default
  // action, which ends the process when its handler returns.
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, signo)) raise(signo);
  g_stop = true;
}

const char* signal_name(int signo) {
  return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
}

// The stop handlers for the life of a run; the previous actions are put back after it.
class StopSignals {
 public:
  StopSignals() {
    g_stop = false;
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (const int s : kStopSignals) sigaddset(&sa.sa_mask, s);  // one handler at a time
    sa.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
      sigaction(kStopSignals[i], nullptr, &previous_[i]);
      // a signal ignored when the sweep started stays ignored (`nohup` ignores SIGHUP; a shell's background job
      // SIGINT): the caller asked for the run to go on through it
      g_handled[i] = previous_[i].sa_handler != SIG_IGN;
      if (g_handled[i]) sigaction(kStopSignals[i], &sa, nullptr);
    }
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_[std::size(kStopSignals)]{};
};

}  // namespace

SweepCommands::SweepCommands(CLI::App& app) {
  sweep_ = app.add_subcommand("sweep", "evaluate a grid of configs x plan kinds into CSV and JSON Lines (resumable)");
  sweep_->add_option("sweep", sweep_file_, "sweep file (see docs/sweeps.md)")->required();
  sweep_->add_option("--out", out_, "output folder: sweep.json, results.csv, results.jsonl")->required();
  sweep_->add_option("--shard", shard_, "evaluate only the points p with p % N == I (I/N, default 0/1)");
  sweep_->add_option("--threads", threads_, "worker threads (default 0 = all cores)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  sweep_->add_flag("--quiet", quiet_, "no progress on stderr");
  sweep_->add_flag("--repair", repair_,
                   "drop the broken rows of an earlier run (not JSON, wrong point, cut CSV line) and compute them "
                   "again, keeping the good ones");
  sweep_->add_flag("--allow-large-grid", allow_large_grid_,
                   fmt::format("run a sweep of more than {} points", kLargeGridPoints));
  sweep_->add_option("--format", format_, "the summary: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  merge_ = app.add_subcommand("merge", "join the output folders of a sharded sweep into one");
  merge_->add_option("out", merge_out_, "folder for the merged sweep.json, results.csv, results.jsonl")->required();
  merge_->add_option("shards", merge_in_, "the shards' --out folders")->required();
  merge_->add_option("--format", format_, "the summary: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
}

bool SweepCommands::selected() const { return *sweep_ || *merge_; }

namespace {

std::string join_lines(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& x : items) out += (out.empty() ? "" : ", ") + x;
  return out;
}

int run_merge(const std::string& out_dir, const std::vector<std::string>& shard_dirs, const std::string& format) {
  const auto m = merge_sweeps(out_dir, shard_dirs);
  if (format == "json") {
    const nlohmann::ordered_json j = {{"schema_version", core::kOutputSchemaVersion},
                                      {"command", "merge"},
                                      {"out_dir", out_dir},
                                      {"shards", m.shards},
                                      {"points", m.points}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("merged {} shards, {} points into {}\n", m.shards, m.points, out_dir);
  return 0;
}

// Runs the sweep with its progress on stderr and the stop signals handled; *signo: the signal that stopped it (0:
// none).
SweepSummary run_with_progress(const Sweep& sweep, const SweepRunOptions& o, bool quiet, int* signo) {
  ProgressPrinter printer("sweep", "points", quiet);
  ProgressPrinter checking("sweep", "rows", quiet, 1.0);  // a resume's check of the earlier rows, when slow
  const StopSignals handlers;
  SweepSummary s = run_sweep(sweep, o, [&](const SweepProgress& p) {
    if (p.checking) {
      checking.update(p.checked, p.to_check, false, "rows of the earlier run: re-hashing the files they read");
      return;
    }
    printer.update(p.done, p.total, p.points_per_s, p.eta_s, p.finished);
  });
  *signo = g_signal.load();
  return s;
}

// A finished (or stopped) sweep as its summary tells it.
struct SweepOutcome {
  const SweepSummary& s;
  const Shard& shard;
  const std::string& sweep_file;
  const std::string& out;
  int signo;             // the signal that stopped it, 0: none
  std::string stopped;   // what an interrupted run saved and how to go on (stderr, after the summary); empty: none
  std::string repaired;  // the broken lines --repair dropped; empty: none
  int stopped_rc;        // the exit code of an interrupted run
};

int print_sweep_json(const SweepOutcome& r) {
  const SweepSummary& s = r.s;
  // Totals over the files (this run's rows and the earlier run's kept ones), then what this run did.
  nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
  for (const auto& [status, n] : s.by_status) by_status[status] = n;
  const nlohmann::ordered_json j = {
      {"schema_version", core::kOutputSchemaVersion},
      {"command", "sweep"},
      {"sweep_file", r.sweep_file},
      {"out_dir", r.out},
      {"shard", {{"index", r.shard.index}, {"count", r.shard.count}}},
      {"points", s.total},
      {"done", s.done()},
      {"computed", s.computed},
      {"resumed", s.resumed},
      {"recomputed", s.stale},
      {"repaired", s.repaired},
      {"by_status", std::move(by_status)},
      {"invalid_reasons", s.invalid_reasons},
      {"interrupted", s.interrupted},
      {"signal", s.interrupted ? nlohmann::ordered_json(signal_name(r.signo)) : nlohmann::ordered_json(nullptr)},
      {"results_csv", r.out + "/results.csv"},
      {"results_jsonl", r.out + "/results.jsonl"},
      {"wall_time_s", s.wall_s}};
  fmt::print("{}\n", j.dump(2));
  if (!r.repaired.empty()) fmt::print(stderr, "sweep: repaired: {}\n", r.repaired);
  if (s.interrupted) fmt::print(stderr, "{}", r.stopped);
  return s.interrupted ? r.stopped_rc : 0;
}

int print_sweep_table(const SweepOutcome& r) {
  const SweepSummary& s = r.s;
  std::string statuses;
  for (const auto& [status, n] : s.by_status)
    statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", status, n);
  // Totals over the files (this run's rows and the earlier run's kept ones), then what this run did.
  fmt::print(
      "sweep: {} points{}, {} done ({} computed in {:.1f} s, {:.1f} points/s{}; {} from an earlier run, skipped as "
      "already done){}\n",
      s.total, r.shard.count > 1 ? fmt::format(" in shard {}/{}", r.shard.index, r.shard.count) : std::string(),
      s.done(), s.computed, s.wall_s, s.wall_s > 0 ? static_cast<double>(s.computed) / s.wall_s : 0.0,
      s.stale > 0 ? fmt::format(", {} of them recomputed because a file they read changed", s.stale) : std::string(),
      s.resumed, statuses.empty() ? std::string() : "; " + statuses);
  for (const auto& reason : s.invalid_reasons) fmt::print("  invalid: {}\n", reason);
  if (!r.repaired.empty()) fmt::print("repaired: {}\n", r.repaired);
  if (s.interrupted) {
    fmt::print(stderr, "{}", r.stopped);
    return r.stopped_rc;
  }
  fmt::print("results: {}/results.csv, {}/results.jsonl\n", r.out, r.out);
  return 0;
}

}  // namespace

int SweepCommands::run() {
  if (*merge_) return run_merge(merge_out_, merge_in_, format_);
  const Shard shard = parse_shard(shard_, "--shard " + shard_);
  const Sweep sweep = load_sweep(sweep_file_);
  SweepRunOptions o;
  o.out_dir = out_;
  o.shard = shard;
  o.threads = threads_;
  o.stop = &g_stop;
  o.allow_large_grid = allow_large_grid_;
  o.repair = repair_;
  int signo = 0;
  const SweepSummary s = run_with_progress(sweep, o, quiet_, &signo);
  const std::string stopped =
      s.interrupted ? fmt::format(
                          "sweep: interrupted by {} after {} of {} points: the {} rows are saved in {}/results.csv and "
                          "{}/results.jsonl; rerun the same command to resume\n",
                          signal_name(signo), s.done(), s.total, s.done(), out_, out_)
                    : std::string();
  const std::string repaired = s.repaired > 0
                                   ? fmt::format("{} broken line{} dropped ({}{}); their points were computed again",
                                                 s.repaired, s.repaired == 1 ? "" : "s", join_lines(s.repaired_lines),
                                                 s.repaired > s.repaired_lines.size() ? ", ..." : "")
                                   : std::string();
  const SweepOutcome outcome{s,     shard,   sweep_file_, out_,
                             signo, stopped, repaired,    128 + (signo != 0 ? signo : SIGINT)};
  return format_ == "json" ? print_sweep_json(outcome) : print_sweep_table(outcome);
}

}  // namespace harmony::sim
