// Baseline candidates over each kind's knobs and their deterministic parallel ranking.
#include "core/search/baseline_search.hpp"

#include <algorithm>
#include <thread>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core {

std::vector<BaselinePlan> enumerate_baseline_plans(PlanKind kind, const Model& model, int gpus, int minibatch,
                                                   Bytes capacity_bytes, const BaselineSearchOptions& options) {
  require_baseline(kind, "enumerate_baseline_plans");
  if (const auto problem = size_problem(gpus, minibatch)) throw ScheduleError(problem->message);
  std::vector<BaselinePlan> out;
  if (split_problem(kind, gpus, minibatch) || stage_problem(kind, gpus, model.num_layers())) return out;
  const int share = is_data_parallel(kind) ? minibatch / gpus : minibatch;
  const int lo = std::max(model.ubatch_min(Phase::Fwd), model.ubatch_min(Phase::Bwd));
  const int hi = std::min({model.ubatch_max(Phase::Fwd), model.ubatch_max(Phase::Bwd), share});
  std::vector<int> sizes;
  if (!options.ubatch_sizes.empty()) {
    sizes = options.ubatch_sizes;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  } else {
    for (int u = lo; u <= hi; u += std::max(1, options.ubatch_step)) sizes.push_back(u);
  }
  const std::vector<OffloadTier> tiers =
      has_offload_tiers(kind) ? options.offloads : std::vector<OffloadTier>{OffloadTier::Cpu};
  for (ActivationPolicy policy : options.activation_policies) {
    for (OffloadTier tier : tiers) {
      for (int u : sizes) {
        if (u < lo || u > hi || !microbatch_fits(kind, gpus, minibatch, u)) continue;
        BaselinePlan p;
        p.activation_policy = policy;
        p.offload = tier;
        p.zero3 = options.zero3;
        p.kind = kind;
        p.gpus = gpus;
        p.minibatch = minibatch;
        p.ubatch = u;
        p.gpu_capacity_bytes = capacity_bytes;
        if (kind == PlanKind::PpSwap) p.stages = balanced_stages(model, u, gpus);
        if (options.drop_infeasible) {
          const auto ds = decide_swaps(p, model);
          if (!std::all_of(ds.begin(), ds.end(), [](const SwapDecision& d) { return d.fits; })) continue;
        }
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

BaselineSearchResult run_baseline_search(const std::vector<BaselinePlan>& plans, const BaselineEvaluator& evaluate,
                                         int threads, int top_k, const SearchProgressFn& progress) {
  BaselineSearchResult res;
  res.num_candidates = plans.size();
  std::vector<RunReport> reports(plans.size());
  unsigned n = threads > 0 ? static_cast<unsigned>(threads) : std::thread::hardware_concurrency();
  n = std::max(1u, std::min<unsigned>(n, static_cast<unsigned>(std::max<std::size_t>(1, plans.size()))));
  SearchProgressTicker ticker(progress, plans.size());
  parallel_for(plans.size(), n, [&](std::size_t i) {
    reports[i] = evaluate(plans[i]);
    ticker.tick();
  });
  ticker.finish();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (reports[i].deadlock) {
      ++res.num_deadlocked;
      continue;
    }
    res.ranked.push_back(BaselineRanked{i, std::move(reports[i])});
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(), [](const BaselineRanked& a, const BaselineRanked& b) {
    return a.report.iteration_time_s < b.report.iteration_time_s;
  });
  if (top_k >= 0 && res.ranked.size() > static_cast<std::size_t>(top_k))
    res.ranked.resize(static_cast<std::size_t>(top_k));
  return res;
}

}  // namespace harmony::core
