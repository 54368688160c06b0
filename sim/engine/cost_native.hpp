// The `native` cost model: NativeEngine (the Engine seam over run_native: one run yields timeline, peaks and
// report), native_report and simulate_native (the RunReport with feasibility, the first memory overflow, the
// host account and the swap ledger) and the Chrome-trace counter tracks (per-GPU memory, per-link bandwidth).
#pragma once

#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sim/engine/engine.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim {

// The native engine behind the Engine seam: run_native once, native_report, the capacity machine.gpu_memory_bytes
// (a plan over it is infeasible). With options.record_counters, EngineResult::native keeps the engine's result.
class NativeEngine final : public Engine {
 public:
  NativeEngine(const core::Model& model, const core::MachineSpec& machine, NativeOptions options = {})
      : model_(model), machine_(machine), options_(options) {}
  core::CostModelKind kind() const override { return core::CostModelKind::Native; }
  EngineResult run(const core::Program& program) const override;
  // run_native_within: nullopt when native_lower_bound_ps exceeds the cutoff, or the run passes it unfinished
  std::optional<EngineResult> run_within(const core::Program& program, double cutoff_s) const override;
  // native_task_bound_ps
  double task_bound_s(const core::TaskGraph& graph, const std::vector<int>& ranks) const override;
  // host_floor of the kind over machine.topology's host or pinned memory, with options.capacities (a machine without
  // a topology has no host limits)
  bool host_floor_exceeded(core::PlanKind kind, bool offload_nvme) const override;
  const NativeOptions& options() const { return options_; }

 private:
  EngineResult result_of(const core::Program& program, NativeResult res) const;  // the report of one run
  const core::Model& model_;
  core::MachineSpec machine_;
  NativeOptions options_;
};

// Per op, its end minus its ready time (a transfer's wait for a copy engine counts; 0 for an op that never
// ended): run_timeline with these durations reproduces the native end times exactly.
std::vector<core::TimePs> native_durations(const core::Program& program, const NativeResult& result);

// make_report's fields from the native timeline and memory peaks, plus the native ones (feasible,
// infeasible_reason, memory_overflow, host_memory, ledger).
core::RunReport native_report(const core::Program& program, const NativeResult& result);

// run_native + native_report. `result_out` (optional) receives the engine's result (timeline, samples).
core::RunReport simulate_native(const core::Program& program, const core::Model& model,
                                const core::MachineSpec& machine, const NativeOptions& options = {},
                                NativeResult* result_out = nullptr);

// pid of the "links" process that holds the per-link bandwidth counters in the Chrome trace.
inline constexpr int kLinkCounterPid = 1000;

// Appends Chrome-trace counter events ("ph": "C", ts in microseconds) to `trace_events` (a JSON array):
// "memory" on pid = GPU (args {"MiB": in use}), and on pid kLinkCounterPid (named "links") one counter per
// link named like the link (args {"GiB/s": in use}, {"cores": in use} for the CPU), plus the process-name
// metadata of that pid. Needs a result run with NativeOptions::record_counters (else appends only metadata).
void append_native_counters(nlohmann::json& trace_events, const NativeResult& result);

}  // namespace harmony::sim
