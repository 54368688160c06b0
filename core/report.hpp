// RunReport: what an executor (simulator or real run) reports for one iteration of a Program:
// times, per-GPU figures and the bytes moved, plus JSON and table renderings for the CLI.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/plan.hpp"
#include "core/units.hpp"

namespace harmony::core {

struct GpuReport {
  int gpu = 0;
  double end_time_s = 0.0;
  double compute_time_s = 0.0;  // FWD + REC + BWD
  Bytes peak_memory_bytes = 0;  // the cost model's memory figure (reference: per-task estimate)
  double end_idle = 0.0;        // (iteration - end) / iteration
};

struct RunReport {
  Plan plan;
  std::string method_fwd;  // packing methods that produced the packs (search), else ""
  std::string method_bwd;
  std::string cost_model;
  bool deadlock = false;
  std::string deadlock_report;
  double iteration_time_s = 0.0;
  double throughput_samples_per_s = 0.0;
  std::vector<GpuReport> per_gpu;  // the simulated GPUs (Harmony-DP under the reference: GPU 0 only)
  double max_end_idle = 0.0;
  double avg_end_idle = 0.0;
  double compute_to_global = 0.0;  // mean over GPUs of compute / iteration time
  double compute_to_rank = 0.0;    // mean over GPUs of compute / that GPU's end time
  Bytes peak_memory_bytes = 0;     // max over GPUs
  Bytes swap_in_bytes = 0;         // host -> GPU (weights, inputs, stashes, gradients in)
  Bytes swap_out_bytes = 0;        // GPU -> host
  Bytes p2p_bytes = 0;             // GPU -> GPU (counted once per transfer)
  Bytes msg_bytes = 0;             // CPU -> CPU messages between processes
  std::size_t num_ops = 0;
  std::size_t num_streams = 0;
};

nlohmann::json report_to_json(const RunReport& r);
// The reference's one-line summary: "=== title : 4.399 sec (idle max/avg: 4%/2%) (compute2global/...) ==="
std::string summary_line(const RunReport& r, const std::string& title);

}  // namespace harmony::core
