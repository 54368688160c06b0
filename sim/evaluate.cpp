// evaluate_plan: plan -> task graph -> Program -> simulated RunReport, with the named cost model.
#include "sim/evaluate.hpp"

#include "core/base/error.hpp"
#include "sim/cost_native.hpp"
#include "sim/cost_reference.hpp"

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
  if (cost_model == "native") {
    NativeResult res;
    core::RunReport r = simulate_native(program, model, machine, NativeOptions{}, &res);
    if (timeline_out) *timeline_out = std::move(res.timeline);
    return r;
  }
  ReferenceCostModel cost(model, machine);
  return simulate(program, cost, timeline_out);
}

}  // namespace harmony::sim
