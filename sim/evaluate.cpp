// evaluate_plan: plan -> task graph -> Program -> simulated RunReport, with the named cost model.
#include "sim/evaluate.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "sim/cost_native.hpp"
#include "sim/cost_reference.hpp"
#include "sim/native_engine.hpp"

namespace harmony::sim {

bool is_cost_model(const std::string& name) { return name == "reference" || name == "native"; }

Evaluation evaluate_plan(const core::Model& model, const core::MachineSpec& machine, const core::Plan& plan,
                         const core::LowerOptions& options, const std::string& cost_model) {
  if (!is_cost_model(cost_model)) throw core::ScheduleError("unknown cost model '" + cost_model + "'");
  core::validate_plan(plan, model.num_layers());
  for (core::Phase ph : {core::Phase::Fwd, core::Phase::Bwd}) {
    const int u = ph == core::Phase::Fwd ? plan.u_fwd : plan.u_bwd;
    // a single-pack plan runs its forward inside the backward task at u_bwd: u_fwd is unused
    if (ph == core::Phase::Fwd && plan.packs_fwd.empty()) continue;
    if (!model.ubatch_in_range(ph, u)) (void)model.time_s(ph, u, 0);  // throws the range error
  }
  Evaluation e;
  if (cost_model == "native") {
    core::LowerOptions all = options;
    all.dp_first_gpu_only = false;  // every replica: they share the host links and run the all-reduce ring
    e.program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, all);
    e.report = simulate_program(e.program, model, machine, cost_model, &e.timeline);
    return e;
  }
  e.program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, options);
  e.report = simulate_program(e.program, model, machine, cost_model, &e.timeline);
  return e;
}

core::RunReport simulate_program(const core::Program& program, const core::Model& model,
                                 const core::MachineSpec& machine, const std::string& cost_model,
                                 Timeline* timeline_out) {
  if (!is_cost_model(cost_model)) throw core::ScheduleError("unknown cost model '" + cost_model + "'");
  core::RunReport r;
  if (cost_model == "native") {
    NativeResult res;
    r = simulate_native(program, model, machine, NativeOptions{}, &res);
    if (timeline_out) *timeline_out = std::move(res.timeline);
    r.gpu_capacity_bytes = machine.gpu_memory_bytes;
  } else {
    ReferenceCostModel cost(model, machine);
    r = simulate(program, cost, timeline_out);
    if (r.peak_memory_bytes == 0 && !program.ops.empty()) {
      // The reference model prices memory per Harmony pack only; a baseline's peak comes from replaying the
      // Program's allocations and frees with the engine's reference settings (no contention, no latency).
      NativeOptions o;
      o.contention = false;
      o.latency = false;
      o.reference_bandwidths = true;
      const NativeResult replay = run_native(program, model, machine, o);
      for (auto& g : r.per_gpu) {
        const auto i = static_cast<std::size_t>(g.gpu);
        if (g.gpu >= 0 && i < replay.peak_bytes.size()) g.peak_memory_bytes = replay.peak_bytes[i];
      }
      for (const core::Bytes b : replay.peak_bytes) r.peak_memory_bytes = std::max(r.peak_memory_bytes, b);
    }
    r.gpu_capacity_bytes = machine.search_capacity_bytes();
  }
  // Flag, do not demote: under `reference` a plan over the capacity keeps its time and rank (the paper's).
  r.fits = r.gpu_capacity_bytes <= 0 || r.peak_memory_bytes <= r.gpu_capacity_bytes;
  r.excess_bytes = r.fits ? 0 : r.peak_memory_bytes - r.gpu_capacity_bytes;
  if (cost_model == "native" && !r.fits && r.feasible) {
    r.feasible = false;  // never ranked above a plan that fits
    r.infeasible_reason = fmt::format("peak {} bytes exceeds the GPU memory {} bytes by {} bytes", r.peak_memory_bytes,
                                      r.gpu_capacity_bytes, r.excess_bytes);
  }
  return r;
}

}  // namespace harmony::sim
