// `harmony-sim report` (docs/report.md): one self-contained HTML page (no network, no script needed to read it)
// for a sweep's output folder or for one config: per (model, machine) the best plan kind, throughput and cost
// charts, per model a ranked table and its best plan re-simulated (SVG timeline, memory, swap ledger,
// bottleneck, Chrome trace). Library code: bad input is core::ConfigError; nothing is printed or written.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/bottleneck.hpp"

namespace harmony::sim {

// The native engine's settings that price a Program like `cost_model` does ("native": the defaults;
// "reference": no contention, no latency, the paper's bandwidths — which reproduce the reference's times).
NativeOptions native_options_for(core::CostModelKind cost_model);

// What the ranked table is ordered by.
enum class RankBy { Throughput, IterationTime, TimeToTrain, Cost };
// "throughput" (default, descending), "iteration_time", "time_to_train", "cost" (ascending); false if unknown.
bool parse_rank_by(const std::string& text, RankBy* out);

struct ReportOptions {
  std::size_t top = 50;  // rows of each model's ranked table (every row when 0)
  RankBy rank_by = RankBy::Throughput;
  std::vector<std::string> where;      // sweep rows kept: "key=value" with key a results column (text compare)
  std::string model;                   // sweep: only this model's section (its name); empty: one per model
  std::string sweep_file;              // sweep input: the sweep file, when not where sweep.json says
  std::vector<std::string> overrides;  // config input: --set key=value
};

// The best plan, re-simulated with the native engine recording memory and link samples.
struct BestPlan {
  std::string title;  // "harmony-pp N4 D32 u 2/4 fwd ... bwd ..."
  std::string where;  // the config or sweep point it comes from, in words
  core::Program program;
  std::shared_ptr<const NativeResult> native;  // the engine's result with its samples (EngineResult::native)
  core::RunReport report;                      // the engine's report of that run
  Bottleneck bottleneck;
  double capacity_bytes_per_gpu = 0;
};

// Throughput vs GPUs of one (model, machine): per plan kind the best samples/s at each GPU count.
struct ThroughputSeries {
  std::string kind;
  std::vector<std::pair<std::int64_t, double>> points;  // (GPUs, samples/s), GPUs ascending
};
struct ThroughputChart {
  std::string machine;  // its label
  std::vector<ThroughputSeries> series;
};

// One feasible sweep row on the cost vs time-to-train plane.
struct CostPoint {
  std::string kind;
  std::string machine;
  std::int64_t gpus = 0;
  std::size_t point = 0;
  double time_to_train_s = 0;
  double cost = 0;
  bool pareto = false;  // no other row is both as fast and as cheap, and better in one
};

// One model's part of the page: its ranked table, charts and best plan.
struct ModelSection {
  std::string name;  // the model's name (with its grid values when two models share a name)
  std::vector<std::pair<std::string, std::string>> facts;
  std::vector<std::string> columns;  // the ranked table
  std::vector<std::vector<std::string>> rows;
  std::vector<int> numeric_columns;  // right-aligned
  std::string ranked_note;           // under the table: what was ranked, what was left out
  std::vector<ThroughputChart> throughput;
  std::vector<CostPoint> cost_points;  // empty: see cost_note
  std::string cost_note;
  bool has_best = false;
  BestPlan best;
  std::string best_note;   // why there is no best plan, when there is none
  std::string trace_file;  // the best plan's Chrome trace, a file name beside the page (report_traces)
};

// Per (model, machine) of a sweep: the best plan kind by the ranking metric, the best baseline, the best
// Harmony kind. Values are the metric (samples/s, seconds or cost); NaN when no row of that group fits.
struct BestKindRow {
  std::string model;
  std::string machine;
  std::string best_kind;
  std::int64_t best_gpus = 0;
  double best_value = 0;
  std::string baseline_name;  // the best baseline row's kind
  std::int64_t baseline_gpus = 0;
  double baseline_value = 0;
  std::string harmony_kind;
  std::int64_t harmony_gpus = 0;
  double harmony_value = 0;
};

// Everything the page shows; built by report_from_sweep / report_from_config, rendered by render_report_html.
struct ReportData {
  std::string title;
  bool from_sweep = false;
  std::vector<std::pair<std::string, std::string>> facts;  // the header's key-value lines
  RankBy rank_by = RankBy::Throughput;
  std::vector<BestKindRow> best_kinds;  // sweep only
  std::vector<ModelSection> models;
  std::vector<std::vector<std::string>> status_rows;  // per plan kind: ok / does_not_fit / invalid counts
  std::vector<std::string> warnings;                  // for stderr: what the page could not show and why
};

// A sweep output folder (sweep.json + results.jsonl of `harmony-sim sweep` or `merge`). The sweep file is
// needed to re-simulate the best point; it must have the fingerprint sweep.json records.
ReportData report_from_sweep(const std::string& dir, const ReportOptions& options);
// One config: the best plan of every plan kind (as `harmony-sim compare`), ranked.
ReportData report_from_config(const std::string& config_path, const ReportOptions& options);

// Names each model's trace file beside `html_path` ("report.html" -> "report.<model>.trace.json") and returns
// (path, Chrome trace JSON text) per best plan, as `harmony-sim simulate --trace` writes it. Write them before
// the page, which links them by file name.
std::vector<std::pair<std::string, std::string>> report_traces(ReportData& data, const std::string& html_path);

std::string render_report_html(const ReportData& data);

// HTML text escaping (&, <, >, ", ').
std::string html_escape(std::string_view text);

}  // namespace harmony::sim
