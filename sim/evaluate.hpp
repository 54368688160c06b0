// One-call evaluation of a plan with a cost model: validate, compose the task graph, lower to a
// Program and simulate. Used by `harmony-sim simulate`, the search, tests and benchmarks.
#pragma once

#include <string>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/lower.hpp"
#include "sim/simulator.hpp"

namespace harmony::sim {

struct Evaluation {
  core::Program program;
  Timeline timeline;
  core::RunReport report;
};

// Throws core::ScheduleError for an invalid plan; a deadlock is reported in report.deadlock.
Evaluation evaluate_plan(const core::Model& model, const core::MachineSpec& machine, const core::Plan& plan,
                         const core::LowerOptions& options, const std::string& cost_model = "reference");

// Prices and runs an already lowered Program with the named cost model.
core::RunReport simulate_program(const core::Program& program, const core::Model& model,
                                 const core::MachineSpec& machine, const std::string& cost_model,
                                 Timeline* timeline_out = nullptr);

// Cost model names `evaluate_plan` accepts.
bool is_cost_model(const std::string& name);

}  // namespace harmony::sim
