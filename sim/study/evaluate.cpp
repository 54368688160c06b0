// evaluate_plan: plan -> its kind's lowering (core/kinds/) -> Program -> one engine run (timeline, peaks, report).
#include "sim/study/evaluate.hpp"

#include <limits>

#include "core/base/error.hpp"
#include "core/kinds/kinds.hpp"
#include "core/program/task_graph.hpp"

namespace harmony::sim {

namespace {

core::LowerOptions engine_lower_options(const Engine& engine, const core::LowerOptions& options) {
  core::LowerOptions lower = options;
  // every replica: they share the host links and run the all-reduce ring
  if (engine.kind() == core::CostModelKind::Native) lower.dp_first_gpu_only = false;
  lower.dataflow = false;  // an engine reads none (the executor does)
  return lower;
}

}  // namespace

core::Program lower_plan_for(const Engine& engine, const core::Model& model, const core::Plan& plan,
                             const core::LowerOptions& options) {
  return core::lower_plan(plan, model, engine_lower_options(engine, options));
}

double task_bound_for(const Engine& engine, const core::Model& model, const core::Plan& plan,
                      const core::LowerOptions& options) {
  core::validate_plan(plan, model);
  if (!plan.kind->packs) return 0.0;  // no task graph: no bound
  const core::TaskGraph graph = core::compose_task_graph(plan, model.num_layers());
  const core::LowerOptions lower = engine_lower_options(engine, options);
  if (engine.host_floor_exceeded(plan.kind, lower.offload_nvme)) return std::numeric_limits<double>::infinity();
  return engine.task_bound_s(graph, core::lowered_ranks(graph, lower));
}

Evaluation evaluate_plan(const Engine& engine, const core::Model& model, const core::Plan& plan,
                         const core::LowerOptions& options) {
  return evaluate_program(engine, lower_plan_for(engine, model, plan, options));
}

namespace {

// The Program and what the engine's run of it brought.
Evaluation assemble(core::Program program, EngineResult r) {
  Evaluation e;
  e.program = std::move(program);
  e.timeline = std::move(r.timeline);
  e.report = std::move(r.report);
  e.native = std::move(r.native);
  return e;
}

}  // namespace

std::optional<Evaluation> evaluate_plan_within(const Engine& engine, const core::Model& model, const core::Plan& plan,
                                               const core::LowerOptions& options, double cutoff_s) {
  core::Program program = lower_plan_for(engine, model, plan, options);
  std::optional<EngineResult> r = engine.run_within(program, cutoff_s);
  if (!r) return std::nullopt;
  return assemble(std::move(program), std::move(*r));
}

Evaluation evaluate_program(const Engine& engine, core::Program program) {
  EngineResult r = engine.run(program);
  return assemble(std::move(program), std::move(r));
}

Evaluation evaluate_plan(const core::Model& model, const core::MachineSpec& machine, const core::Plan& plan,
                         const core::LowerOptions& options, core::CostModelKind cost_model) {
  return evaluate_plan(*make_engine(cost_model, model, machine), model, plan, options);
}

core::RunReport simulate_program(const core::Program& program, const core::Model& model,
                                 const core::MachineSpec& machine, core::CostModelKind cost_model,
                                 Timeline* timeline_out) {
  EngineResult r = make_engine(cost_model, model, machine)->run(program);
  if (timeline_out) *timeline_out = std::move(r.timeline);
  return std::move(r.report);
}

}  // namespace harmony::sim
