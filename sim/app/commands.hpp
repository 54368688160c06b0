// harmony-sim's commands (sim/app/main.cpp parses the command line and calls one): the options each reads, the
// document head every JSON output opens with, and the helpers the commands share (sim/app/commands.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/program/lower.hpp"
#include "sim/app/report.hpp"
#include "sim/study/bottleneck.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::sim::app {

constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 70;        // EX_SOFTWARE: a bug in harmony (core::InternalError), never bad input
constexpr double kProgressDelayS = 2.0;  // search and compare show progress once they run longer than this

struct Cli {
  std::string config;
  std::vector<std::string> sets;
  std::string format = "table";
  std::string trace;
  bool quiet = false;                // search, compare: no progress on stderr
  std::string deepspeed;             // compare: a DeepSpeed config priced beside Harmony's best plan
  std::string memory_plan = "best";  // memory: each kind's most promising plan (best) or the config's (config)
};

struct ReportCli {
  std::string results;
  std::string out;
  std::string rank_by = "throughput";
  std::string format = "table";  // table (a line per model) or json (docs/output-schema.md)
  sim::ReportOptions options;
};

struct CalibrateCli {
  std::string machine;
  std::vector<std::string> runs;  // CONFIG,TRACE[,RUN_JSON]
  std::string out;
  std::string format = "table";
  bool check = false;  // no fit: the machine's predictions against the measurements
};

double mib(core::Bytes b);
// The fields every harmony-sim document of a config opens with (docs/output-schema.md).
nlohmann::json document_head(const char* command, const core::RunConfig& cfg, const core::Model& model);
core::LowerOptions lower_options(const core::RunConfig& cfg);
// The bottleneck report of a plan, re-simulated with the native engine (with the reference cost model: the
// engine's reference settings, which reproduce it) — docs/bottleneck.md.
sim::Bottleneck bottleneck_of(const core::Program& program, const core::Model& model, const core::RunConfig& cfg);
// The Chrome trace of `e`; with the native engine's result (an engine made with counters on: the same run),
// its counter tracks: per-GPU memory in use and per-link bandwidth in use.
void write_trace(const std::string& path, const sim::Evaluation& e, const std::string& title);

int cmd_simulate(const Cli& cli);            // sim/app/cmd_plan.cpp
int cmd_search(const Cli& cli);              // sim/app/cmd_plan.cpp
int cmd_compare(const Cli& cli);             // sim/app/cmd_compare.cpp
int cmd_memory(const Cli& cli);              // sim/app/cmd_compare.cpp
int cmd_presets(const Cli& cli);             // sim/app/cmd_compare.cpp
int cmd_kinds(const Cli& cli);               // sim/app/cmd_kinds.cpp
int cmd_report(ReportCli& cli);              // sim/app/cmd_report.cpp
int cmd_calibrate(const CalibrateCli& cli);  // sim/app/cmd_calibrate.cpp

}  // namespace harmony::sim::app
