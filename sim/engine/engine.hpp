// The seam between a lowered Program and what runs it: an Engine runs a Program once and yields its timeline,
// per-GPU peak memory and RunReport. `reference` (sim/cost_reference.hpp) reproduces the paper's simulator;
// `native` (sim/cost_native.hpp) runs the native engine. A new cost model is one more Engine.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/base/cost_model_kind.hpp"
#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"
#include "sim/engine/simulator.hpp"

namespace harmony::sim {

struct NativeResult;

struct EngineResult {
  Timeline timeline;
  std::vector<core::Bytes> peak_bytes;  // per GPU id (0 for GPUs not simulated)
  // With gpu_capacity_bytes, fits and excess_bytes set (native: a plan over the capacity is infeasible).
  core::RunReport report;
  // The native engine's whole result (memory and bandwidth samples, link stats) when the engine was made with
  // counters on; its timeline is EngineResult::timeline. Null otherwise.
  std::shared_ptr<const NativeResult> native;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual core::CostModelKind kind() const = 0;
  // Throws core::ScheduleError for a Program the engine cannot run; a deadlock is in report.deadlock.
  virtual EngineResult run(const core::Program& program) const = 0;
  // run(program), or nullopt when the engine can tell without running it that report.iteration_time_s would exceed
  // `cutoff_s` (a search skips a candidate that cannot beat the times it already has: core::run_search). An engine
  // with no such bound runs the Program.
  virtual std::optional<EngineResult> run_within(const core::Program& program, double /*cutoff_s*/) const {
    return run(program);
  }
  // A time (seconds) the iteration of the Program lowered from `graph` onto `ranks` (core::lowered_ranks) cannot
  // beat, known before lowering (sim::task_bound_for): a search declines a candidate over its cutoff without
  // lowering it. 0 for an engine with no such bound.
  virtual double task_bound_s(const core::TaskGraph& /*graph*/, const std::vector<int>& /*ranks*/) const { return 0.0; }
  // True when no Program of `kind` on the engine's model can be feasible on its machine whatever its plan, with the
  // masters and optimizer state in host memory or (`offload_nvme`) on the drives: the native engine's host floor
  // (host_floor: the masters, optimizer state and gradients alone; none for a kind with resident state) over the host
  // or pinned memory. false for an engine without such a rule.
  virtual bool host_floor_exceeded(core::PlanKind /*kind*/, bool /*offload_nvme*/) const { return false; }
};

// The engine of `kind` on `model` (kept by reference: it must outlive the engine) and `machine`, with its
// default settings; `record_counters` (native only): keep the samples a Chrome trace's counter tracks need.
std::unique_ptr<Engine> make_engine(core::CostModelKind kind, const core::Model& model,
                                    const core::MachineSpec& machine, bool record_counters = false);

// Sets report.gpu_capacity_bytes (`capacity_bytes`), fits and excess_bytes; with `demote`, a plan over the
// capacity becomes infeasible (never ranked above a plan that fits).
void apply_capacity(core::RunReport& report, core::Bytes capacity_bytes, bool demote);

}  // namespace harmony::sim
