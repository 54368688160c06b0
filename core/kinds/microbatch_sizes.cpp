// The microbatch-size checks, candidate sizes and candidates shared by the kinds with one microbatch size
// (microbatch_sizes.hpp).
#include "core/kinds/microbatch_sizes.hpp"

#include <algorithm>

#include "core/base/error.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core {

void validate_microbatch_size(const Plan& p, const Model& m) {
  if (const auto problem = size_problem(p.gpus, p.minibatch)) throw ScheduleError(problem->message);
  if (const auto problem = positive_microbatch_problem(p.u_bwd)) throw ScheduleError(problem->message);
  for (Phase ph : {Phase::Fwd, Phase::Bwd}) {
    if (!m.ubatch_in_range(ph, p.u_bwd)) (void)m.time_s(ph, p.u_bwd, 0);  // throws the range error
  }
}

std::vector<int> candidate_microbatch_sizes(const Model& model, const SearchSpace& space) {
  const PlanKind kind = space.kind;
  const int gpus = space.gpus;
  const int minibatch = space.minibatch;
  if (const auto problem = size_problem(gpus, minibatch)) throw ScheduleError(problem->message);
  if (split_problem(kind, gpus, minibatch) || stage_problem(kind, gpus, model.num_layers())) return {};
  const int share = kind->data_parallel ? minibatch / gpus : minibatch;
  const int lo = std::max(model.ubatch_min(Phase::Fwd), model.ubatch_min(Phase::Bwd));
  const int hi = std::min({model.ubatch_max(Phase::Fwd), model.ubatch_max(Phase::Bwd), share});
  std::vector<int> sizes = space.spec.u_bwd;
  if (sizes.empty())
    for (int u = lo; u <= hi; u += std::max(1, space.spec.ubatch_step)) sizes.push_back(u);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::erase_if(sizes, [&](int u) { return u < lo || u > hi || !microbatch_fits(kind, gpus, minibatch, u); });
  return sizes;
}

Candidate microbatch_candidate(const SearchSpace& space, ActivationPolicy policy, int u) {
  Candidate c;
  Plan& p = c.plan;
  p.kind = space.kind;
  p.gpus = space.gpus;
  p.minibatch = space.minibatch;
  p.u_fwd = p.u_bwd = u;
  p.knobs = space.knobs;
  p.knobs.activation_policy = policy;
  p.knobs.gpu_capacity_bytes = space.capacity_bytes;
  return c;
}

void validate_microbatch_plan(const Plan& p, const Model& m) {
  validate_microbatch_size(p, m);
  if (const auto problem = microbatch_problem(p.kind, p.gpus, p.minibatch, p.u_bwd))
    throw ScheduleError(problem->message);
}

std::vector<Candidate> enumerate_microbatch_plans(const Model& model, const SearchSpace& space,
                                                  Bytes (*estimate_bytes)(const Plan&, const Model&)) {
  const std::vector<int> sizes = candidate_microbatch_sizes(model, space);
  std::vector<Candidate> out;
  for (ActivationPolicy policy : space.activation_policies) {
    for (int u : sizes) {
      Candidate c = microbatch_candidate(space, policy, u);
      if (space.drop_infeasible && estimate_bytes(c.plan, model) > space.capacity_bytes) continue;
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace harmony::core
