// One-call evaluation of a plan of any kind on an engine: validate and lower it to a Program (its kind's
// PlanKindSpec::lower) and run it once (sim/engine/engine.hpp). Used by `harmony-sim simulate`, the search, compare,
// tests and benchmarks.
#pragma once

#include <memory>
#include <optional>

#include "core/base/cost_model_kind.hpp"
#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/lower.hpp"
#include "sim/engine/engine.hpp"
#include "sim/engine/simulator.hpp"

namespace harmony::sim {

struct Evaluation {
  core::Program program;
  Timeline timeline;
  core::RunReport report;
  std::shared_ptr<const NativeResult> native;  // EngineResult::native: set by a native engine with counters on
};

// Throws core::ScheduleError for an invalid plan; a deadlock is reported in report.deadlock. The native engine
// lowers every replica (they share the host links and run the all-reduce ring); the reference, options as given.
Evaluation evaluate_plan(const Engine& engine, const core::Model& model, const core::Plan& plan,
                         const core::LowerOptions& options);
// The Program evaluate_plan runs for `plan` on `engine` (validated, composed and lowered the same way).
core::Program lower_plan_for(const Engine& engine, const core::Model& model, const core::Plan& plan,
                             const core::LowerOptions& options);
// A time the iteration of `plan` lowered as evaluate_plan lowers it cannot beat on `engine`, from its task graph
// alone (Engine::task_bound_s; 0 for an engine without one): core::run_search_bounded's PlanBound, which declines a
// candidate it shows cannot win before it is lowered; +infinity when the engine's host floor shows no plan can fit
// (Engine::host_floor_exceeded: the search then runs only the candidate that names its first miss). Throws as
// lower_plan_for does for an invalid plan.
double task_bound_for(const Engine& engine, const core::Model& model, const core::Plan& plan,
                      const core::LowerOptions& options);
// evaluate_plan, or nullopt when the engine shows without running it that the iteration would exceed `cutoff_s`
// (Engine::run_within).
std::optional<Evaluation> evaluate_plan_within(const Engine& engine, const core::Model& model, const core::Plan& plan,
                                               const core::LowerOptions& options, double cutoff_s);
// The same on make_engine(cost_model, model, machine).
Evaluation evaluate_plan(const core::Model& model, const core::MachineSpec& machine, const core::Plan& plan,
                         const core::LowerOptions& options,
                         core::CostModelKind cost_model = core::CostModelKind::Reference);

// Runs an already lowered Program once on `engine`, keeping the Program.
Evaluation evaluate_program(const Engine& engine, core::Program program);

// Runs an already lowered Program once on make_engine(cost_model, model, machine): its report.
core::RunReport simulate_program(const core::Program& program, const core::Model& model,
                                 const core::MachineSpec& machine, core::CostModelKind cost_model,
                                 Timeline* timeline_out = nullptr);

}  // namespace harmony::sim
