// The microbatch-size checks, candidate sizes and candidates shared by the kinds with one microbatch size
// (microbatch_sizes.hpp).
#include "core/kinds/microbatch_sizes.hpp"

#include <algorithm>

#include "core/base/error.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/program_builder.hpp"

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

Bytes device_state_bytes(const Model& model, int layer, int shards) {
  const auto part = [&](Bytes b) { return shard_bytes(b, shards); };
  const int l = layer;
  return part(model.weight_bytes(l, l) + model.buffer_bytes(l, l)) + part(model.weight_bytes(l, l)) +
         part(model.optimizer_state_bytes(l, l));
}

Bytes microbatch_working_bytes(const Plan& plan, const Model& model) {
  const int u = plan.u_bwd;
  const bool keep = plan.knobs.activation_policy == ActivationPolicy::Keep;
  Bytes stash = 0, peak = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    stash += model.input_bytes(u, l) + (keep ? saved_activation_bytes(model, u, l) : 0);
    peak = std::max(peak, model.peak_beyond_own_bytes(u, l));
  }
  return stash + std::max<Bytes>(0, peak);
}

Bytes device_state_estimate_bytes(const Plan& plan, const Model& model, bool sharded) {
  const int shards = sharded ? plan.gpus : 1;
  Bytes state = 0, gathered = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    state += device_state_bytes(model, l, shards);
    gathered = std::max(gathered, model.weight_bytes(l, l) + model.buffer_bytes(l, l));
  }
  return state + microbatch_working_bytes(plan, model) + (shards > 1 ? 3 * gathered : 0);
}

}  // namespace harmony::core
