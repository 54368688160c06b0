// `harmony-sim sweep SWEEP.yaml --out DIR [--shard I/N] [--threads N]` and `harmony-sim merge OUT DIR...`:
// options, Ctrl-C (finish the points in flight, keep the files, exit 130; rerun to resume), progress through
// sim/progress_cli.hpp's printer (a live bar on a terminal, a line every 10 s otherwise) and the summary.
#include "sim/sweep_cli.hpp"

#include <atomic>
#include <csignal>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/output/report.hpp"
#include "sim/progress_cli.hpp"
#include "sim/sweep.hpp"

namespace harmony::sim {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_sigint(int /*sig*/) { g_stop = true; }

}  // namespace

SweepCommands::SweepCommands(CLI::App& app) {
  sweep_ = app.add_subcommand("sweep", "evaluate a grid of configs x plan kinds into CSV and JSON Lines (resumable)");
  sweep_->add_option("sweep", sweep_file_, "sweep file (see docs/sweeps.md)")->required();
  sweep_->add_option("--out", out_, "output folder: sweep.json, results.csv, results.jsonl")->required();
  sweep_->add_option("--shard", shard_, "evaluate only the points p with p % N == I (I/N, default 0/1)");
  sweep_->add_option("--threads", threads_, "worker threads (default 0 = all cores)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  sweep_->add_flag("--quiet", quiet_, "no progress on stderr");
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

int SweepCommands::run() {
  if (*merge_) {
    const auto m = merge_sweeps(merge_out_, merge_in_);
    if (format_ == "json") {
      const nlohmann::ordered_json j = {{"schema_version", core::kOutputSchemaVersion},
                                        {"command", "merge"},
                                        {"out_dir", merge_out_},
                                        {"shards", m.shards},
                                        {"points", m.points}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("merged {} shards, {} points into {}\n", m.shards, m.points, merge_out_);
    return 0;
  }
  const Shard shard = parse_shard(shard_, "--shard " + shard_);
  const Sweep sweep = load_sweep(sweep_file_);
  SweepRunOptions o;
  o.out_dir = out_;
  o.shard = shard;
  o.threads = threads_;
  o.stop = &g_stop;
  o.allow_large_grid = allow_large_grid_;
  g_stop = false;
  auto* previous = std::signal(SIGINT, on_sigint);
  ProgressPrinter printer("sweep", "points", quiet_);
  ProgressPrinter checking("sweep", "rows", quiet_, 1.0);  // a resume's check of the earlier rows, when slow
  SweepSummary s;
  try {
    s = run_sweep(sweep, o, [&](const SweepProgress& p) {
      if (p.checking) {
        checking.update(p.checked, p.to_check, false, "rows of the earlier run: re-hashing the files they read");
        return;
      }
      printer.update(p.done, p.total, p.points_per_s, p.eta_s, p.finished);
    });
  } catch (...) {
    std::signal(SIGINT, previous);
    throw;
  }
  std::signal(SIGINT, previous);
  if (format_ == "json") {
    // Totals over the files (this run's rows and the earlier run's kept ones), then what this run did.
    nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
    for (const auto& [status, n] : s.by_status) by_status[status] = n;
    const nlohmann::ordered_json j = {{"schema_version", core::kOutputSchemaVersion},
                                      {"command", "sweep"},
                                      {"sweep_file", sweep_file_},
                                      {"out_dir", out_},
                                      {"shard", {{"index", shard.index}, {"count", shard.count}}},
                                      {"points", s.total},
                                      {"done", s.done()},
                                      {"computed", s.computed},
                                      {"resumed", s.resumed},
                                      {"recomputed", s.stale},
                                      {"by_status", std::move(by_status)},
                                      {"invalid_reasons", s.invalid_reasons},
                                      {"interrupted", s.interrupted},
                                      {"results_csv", out_ + "/results.csv"},
                                      {"results_jsonl", out_ + "/results.jsonl"},
                                      {"wall_time_s", s.wall_s}};
    fmt::print("{}\n", j.dump(2));
    if (s.interrupted)
      fmt::print(stderr, "sweep: interrupted after {} of {} points; rerun the same command to resume\n",
                 s.resumed + s.computed, s.total);
    return s.interrupted ? 130 : 0;
  }
  std::string statuses;
  for (const auto& [status, n] : s.by_status)
    statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", status, n);
  // Totals over the files (this run's rows and the earlier run's kept ones), then what this run did.
  fmt::print(
      "sweep: {} points{}, {} done ({} computed in {:.1f} s, {:.1f} points/s{}; {} from an earlier run, skipped as "
      "already done){}\n",
      s.total, shard.count > 1 ? fmt::format(" in shard {}/{}", shard.index, shard.count) : std::string(), s.done(),
      s.computed, s.wall_s, s.wall_s > 0 ? static_cast<double>(s.computed) / s.wall_s : 0.0,
      s.stale > 0 ? fmt::format(", {} of them recomputed because a file they read changed", s.stale) : std::string(),
      s.resumed, statuses.empty() ? std::string() : "; " + statuses);
  for (const auto& r : s.invalid_reasons) fmt::print("  invalid: {}\n", r);
  if (s.interrupted) {
    fmt::print(stderr, "sweep: interrupted after {} of {} points; rerun the same command to resume\n",
               s.resumed + s.computed, s.total);
    return 130;
  }
  fmt::print("results: {}/results.csv, {}/results.jsonl\n", out_, out_);
  return 0;
}

}  // namespace harmony::sim
