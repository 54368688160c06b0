// What Harmony's two kinds (harmony_pp.cpp, harmony_dp.cpp) share: the functions their PlanKindSpecs point at. A
// Harmony plan is layer packs at two microbatch sizes, composed into a task graph (core/program/task_graph.hpp) and
// lowered by the paper's event rules (core/program/lower_harmony.cpp); its candidates are the paper's search space
// (core::enumerate_candidates).
#pragma once

#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/lower.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

// validate_packs (sizes, the kind's split rule, packs covering the model) and each microbatch size in the profiled
// range (u_fwd only when there are forward packs: a single-pack plan runs its forward at u_bwd).
void validate_harmony_plan(const Plan& plan, const Model& model);
// validate_harmony_plan, compose_task_graph, lower_harmony.
Program lower_harmony_plan(const Plan& plan, const Model& model, const LowerOptions& options);
// core::enumerate_candidates.
std::vector<Candidate> enumerate_harmony_plans(const Model& model, const SearchSpace& space);
// core::plan_title: "harmony-pp N4 D32 u 2/4 fwd [[0-6]] bwd [[0-6], [7-13]]".
std::string describe_harmony_plan(const Plan& plan, const Model& model);

}  // namespace harmony::core
