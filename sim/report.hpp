// `harmony-sim report` (docs/report.md): one self-contained HTML page (no network, no script needed to read it)
// for a sweep's output folder or for one config: the ranked table, the best plan re-simulated with its SVG
// timeline, device memory over time per GPU, the swap ledger and the bottleneck report. Library code: bad input
// is core::ConfigError; nothing is printed. The page is a pure function of its inputs (no clock, no paths).
#pragma once

#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"
#include "sim/bottleneck.hpp"
#include "sim/native_engine.hpp"

namespace harmony::sim {

// The native engine's settings that price a Program like `cost_model` does ("native": the defaults;
// "reference": no contention, no latency, the paper's bandwidths — which reproduce the reference's times).
NativeOptions native_options_for(const std::string& cost_model);

// What the ranked table is ordered by.
enum class RankBy { Throughput, IterationTime, TimeToTrain, Cost };
// "throughput" (default, descending), "iteration_time", "time_to_train", "cost" (ascending); false if unknown.
bool parse_rank_by(const std::string& text, RankBy* out);

struct ReportOptions {
  std::size_t top = 50;  // rows of the ranked table (every row when 0)
  RankBy rank_by = RankBy::Throughput;
  std::vector<std::string> where;      // sweep rows kept: "key=value" with key a results column (text compare)
  std::string sweep_file;              // sweep input: the sweep file, when not where sweep.json says
  std::vector<std::string> overrides;  // config input: --set key=value
};

// The best plan, re-simulated with the native engine recording memory and link samples.
struct BestPlan {
  std::string title;  // "harmony-pp N4 D32 u 2/4 fwd ... bwd ..."
  std::string where;  // the config or sweep point it comes from, in words
  core::Program program;
  NativeResult native;
  core::RunReport report;  // native_report of `native`
  Bottleneck bottleneck;
  double capacity_bytes_per_gpu = 0;
};

// Everything the page shows; built by report_from_sweep / report_from_config, rendered by render_report_html.
struct ReportData {
  std::string title;
  std::vector<std::pair<std::string, std::string>> facts;  // the header's key-value lines
  std::vector<std::string> columns;                        // the ranked table
  std::vector<std::vector<std::string>> rows;
  std::vector<int> numeric_columns;                   // right-aligned
  std::string ranked_note;                            // under the table: what was ranked, what was left out
  std::vector<std::vector<std::string>> status_rows;  // per plan kind: ok / does_not_fit / invalid counts
  bool has_best = false;
  BestPlan best;
};

// A sweep output folder (sweep.json + results.jsonl of `harmony-sim sweep` or `merge`). The sweep file is
// needed to re-simulate the best point; it must have the fingerprint sweep.json records.
ReportData report_from_sweep(const std::string& dir, const ReportOptions& options);
// One config: the best plan of every plan kind (as `harmony-sim compare`), ranked.
ReportData report_from_config(const std::string& config_path, const ReportOptions& options);

std::string render_report_html(const ReportData& data);

// HTML text escaping (&, <, >, ", ').
std::string html_escape(std::string_view text);

}  // namespace harmony::sim
