// One-call evaluation of a plan on an engine: validate, compose the task graph, lower to a Program and run
// it once (sim/engine.hpp). Used by `harmony-sim simulate`, the search, tests and benchmarks.
#pragma once

#include <memory>

#include "core/base/cost_model_kind.hpp"
#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/lower.hpp"
#include "sim/engine.hpp"
#include "sim/simulator.hpp"

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
