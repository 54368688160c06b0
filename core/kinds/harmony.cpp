// Harmony's shared kind functions (harmony.hpp).
#include "core/kinds/harmony.hpp"

#include "core/program/task_graph.hpp"

namespace harmony::core {

void validate_harmony_plan(const Plan& plan, const Model& model) {
  validate_packs(plan, model.num_layers());
  for (Phase ph : {Phase::Fwd, Phase::Bwd}) {
    const int u = ph == Phase::Fwd ? plan.u_fwd : plan.u_bwd;
    // a single-pack plan runs its forward inside the backward task at u_bwd: u_fwd is unused
    if (ph == Phase::Fwd && plan.packs_fwd.empty()) continue;
    if (!model.ubatch_in_range(ph, u)) (void)model.time_s(ph, u, 0);  // throws the range error
  }
}

Program lower_harmony_plan(const Plan& plan, const Model& model, const LowerOptions& options) {
  validate_harmony_plan(plan, model);
  return lower_harmony(compose_task_graph(plan, model.num_layers()), model, options);
}

std::vector<Candidate> enumerate_harmony_plans(const Model& model, const SearchSpace& space) {
  return enumerate_candidates(model, space);
}

std::string describe_harmony_plan(const Plan& plan, const Model& /*model*/) { return plan_title(plan); }

}  // namespace harmony::core
