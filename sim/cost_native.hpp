// The `native` cost model: the CostModel seam over the native engine, the one-call simulate_native
// (timeline + RunReport with feasibility, the first memory overflow, the host account and the swap
// ledger) and the Chrome-trace counter tracks (per-GPU memory, per-link bandwidth in use).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "sim/cost_model.hpp"
#include "sim/native_engine.hpp"

namespace harmony::sim {

class NativeCostModel final : public CostModel {
 public:
  NativeCostModel(const core::Model& model, const core::MachineSpec& machine, NativeOptions options = {})
      : model_(model), machine_(machine), options_(options) {}
  std::string name() const override { return "native"; }
  // Per op, its end minus its ready time (a transfer's wait for a copy engine counts): run_timeline
  // with these durations reproduces the native end times exactly. Each call runs the engine.
  std::vector<core::TimePs> durations(const core::Program& program) const override;
  // Peak device memory per GPU from the memory timeline (allocations, workspaces, frees).
  std::vector<core::Bytes> memory_per_gpu(const core::Program& program) const override;
  NativeResult run(const core::Program& program) const { return run_native(program, model_, machine_, options_); }
  const NativeOptions& options() const { return options_; }

 private:
  const core::Model& model_;
  core::MachineSpec machine_;
  NativeOptions options_;
};

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
