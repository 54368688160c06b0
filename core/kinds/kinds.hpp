// The plan kinds as their callers use them: every function here asks the plan's (or the search space's) kind, whose
// module is one file in core/kinds/ (harmony_pp.cpp, harmony_dp.cpp, dp_swap.cpp, pp_swap.cpp, zero_infinity.cpp,
// l2l.cpp, lohan.cpp) registered in core/plan/plan_kind.hpp's registry. Nothing outside a kind's file asks which kind
// a plan is: shared code reads the kind's properties (PlanKindSpec).
#pragma once

#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

// Throws ScheduleError unless the kind can run `plan` on `model` (PlanKindSpec::validate).
inline void validate_plan(const Plan& plan, const Model& model) { plan.kind->validate(plan, model); }

// The Program of a plan (validated first; PlanKindSpec::lower). `options` shape Harmony's lowering (prefetch, the
// lowered GPUs, NVMe offload); the swapping kinds read their knobs instead. With options.dataflow (the default) every
// kind's Program carries its dataflow: lower_harmony fills a Harmony Program's from its task graph, and a Program its
// lowering left without one (a swapping kind's, built op by op) gets swapping_dataflow's.
inline Program lower_plan(const Plan& plan, const Model& model, const LowerOptions& options = {}) {
  Program p = plan.kind->lower(plan, model, options);
  if (options.dataflow && !p.dataflow.covers(p)) p.dataflow = swapping_dataflow(p);
  return p;
}

// The candidates of space.kind, in its enumeration order (PlanKindSpec::enumerate): what a search ranks
// (core::run_search, core::run_search_bounded).
inline std::vector<Candidate> enumerate_plans(const Model& model, const SearchSpace& space) {
  return space.kind->enumerate(model, space);
}

// A one-line title of the plan as it runs on `model` (PlanKindSpec::describe): harmony-run's plan line.
inline std::string describe_plan(const Plan& plan, const Model& model) { return plan.kind->describe(plan, model); }

}  // namespace harmony::core
