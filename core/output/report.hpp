// RunReport: what an executor (simulator or real run) reports for one iteration of a Program:
// times, per-GPU figures and the bytes moved, plus JSON and table renderings for the CLI.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/base/units.hpp"
#include "core/output/host_memory.hpp"
#include "core/plan/plan.hpp"

namespace harmony::core {

struct GpuReport {
  int gpu = 0;
  double end_time_s = 0.0;
  double compute_time_s = 0.0;  // FWD + REC + BWD
  Bytes peak_memory_bytes = 0;  // the cost model's memory figure (reference: per-task estimate)
  double end_idle = 0.0;        // (iteration - end) / iteration
};

// Native cost model: one physical link (one direction) and what crossed it in the iteration.
struct LinkUsage {
  std::string name;                   // "GPU0 PCIe H2D", "switch0 uplink down", "NVLink 0->1", "host memcpy"
  std::string kind;                   // "gpu_down", "gpu_up", "switch_down", "switch_up", "inter_socket", ...
  double capacity_bytes_per_s = 0.0;  // 0: unlimited (cores for "cpu_cores")
  Bytes bytes = 0;
  double busy_s = 0.0;  // time with at least one flow on it
};

// Native cost model: bytes moved in one iteration per class of link and per class of tensor.
struct SwapLedger {
  Bytes pcie_h2d_bytes = 0;      // host -> GPU swaps
  Bytes pcie_d2h_bytes = 0;      // GPU -> host swaps
  Bytes p2p_pcie_bytes = 0;      // GPU -> GPU through the PCIe tree
  Bytes nvlink_bytes = 0;        // GPU -> GPU over NVLink
  Bytes host_staging_bytes = 0;  // GPU -> GPU staged through pinned host memory
  Bytes cpu_msg_bytes = 0;       // CPU messages between processes (payload)
  Bytes weights_bytes = 0;
  Bytes weight_grad_bytes = 0;
  Bytes optimizer_state_bytes = 0;
  Bytes activation_bytes = 0;
  Bytes stash_bytes = 0;
  Bytes act_grad_bytes = 0;
  std::vector<LinkUsage> links;
};

// Native cost model: the first op whose allocation exceeded its GPU's memory.
struct MemoryOverflowReport {
  int gpu = -1;  // -1: no overflow
  std::string op_id;
  std::string op_label;
  Bytes bytes_over = 0;
  Bytes capacity_bytes = 0;
  double time_s = 0.0;
};

// Native cost model: host memory one iteration needs (static upper bound), by category, and the machine's limits.
struct HostMemoryReport : HostBreakdown {
  Bytes capacity_bytes = 0;      // 0: unlimited
  Bytes pinned_limit_bytes = 0;  // 0: unlimited
};

struct RunReport {
  // The plan run (the Program's: its kind, sizes, packs or stages and knobs, among them what the backward's
  // activations come from, knobs.activation_policy: checkpoint, Harmony's always, or keep).
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
  Bytes collective_bytes = 0;      // all-reduce / all-gather / reduce-scatter payloads (per GPU, summed)
  Bytes msg_bytes = 0;             // CPU -> CPU messages between processes
  std::size_t num_ops = 0;
  std::size_t num_streams = 0;
  // Every cost model: whether peak_memory_bytes fits the GPU memory (the scheduler's cap, gpu_memory x
  // memory_cap_scale, under `reference`; gpu_memory under `native`). `reference` only flags a plan that does
  // not fit (its timings and ranking stay the paper's); under `native` such a plan is also infeasible.
  Bytes gpu_capacity_bytes = 0;  // 0: not known (the report was not made by sim::simulate_program)
  bool fits = true;
  Bytes excess_bytes = 0;  // peak_memory_bytes - gpu_capacity_bytes when !fits, else 0
  // native cost model (left at defaults by `reference`)
  bool native = false;            // the fields below are filled
  bool feasible = true;           // false: a GPU or host capacity is exceeded; the search skips the plan
  std::string infeasible_reason;  // which op on which device overflowed by how much, or the host account
  MemoryOverflowReport memory_overflow;
  std::size_t memory_overflow_ops = 0;  // ops whose allocation exceeded their GPU's capacity
  std::size_t memory_anomalies = 0;     // frees larger than the memory in use (0 for a balanced Program)
  HostMemoryReport host_memory;
  SwapLedger ledger;
};

// The version of every JSON document and row both tools write (docs/output-schema.md, schemas/): bumped when a
// field is renamed, removed or changes type or unit.
inline constexpr int kOutputSchemaVersion = 1;

// A plan's result as one JSON object (docs/output-schema.md, "plan result"): every field present, unknown or
// not-applicable values null (native-only figures under `reference`, times of a deadlocked plan).
nlohmann::json report_to_json(const RunReport& r);
// Packs as [[first, last], ...] (layer indices, inclusive).
nlohmann::json packs_to_json(const Packs& packs);
// The one-line title of the plan a report describes: core::plan_title of its plan.
std::string report_title(const RunReport& r);

// The reference's one-line summary: "=== title : 4.399 sec (idle max/avg: 4%/2%) (compute2global/...) ==="
std::string summary_line(const RunReport& r, const std::string& title);

}  // namespace harmony::core
