// Candidate enumeration over each swapping baseline's knobs (u; pp-swap's split follows u) and the
// deterministic parallel ranking of the candidates by a caller-supplied evaluator.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/output/report.hpp"
#include "core/program/baselines/baselines.hpp"
#include "core/search/progress.hpp"

namespace harmony::core {

struct BaselineSearchOptions {
  std::vector<int> ubatch_sizes;  // explicit candidates (filtered by the same rules); empty = all valid
  int ubatch_step = 1;            // stride through the profiled range when ubatch_sizes is empty
  bool drop_infeasible = true;    // leave out plans whose decisions do not fit gpu_capacity_bytes
  // the activation policies to enumerate (each policy's plans in turn); `harmony-sim compare` passes both
  std::vector<ActivationPolicy> activation_policies = {ActivationPolicy::Checkpoint};
  // Kinds with offload tiers (zero-infinity, lohan): the tiers to enumerate (each tier's plans in turn, inside each
  // policy); ignored by the other kinds. The ZeRO-3 overheads every plan gets (zero-infinity's lowering reads them).
  // `harmony-sim compare` searches cpu, then nvme when no cpu plan fits host memory and the machine has an NVMe tier.
  std::vector<OffloadTier> offloads = {OffloadTier::Cpu};
  Zero3Overheads zero3;
};

// Candidate plans of one baseline, per activation policy (in options' order) ascending u: u in the profiled forward and
// backward range, u <= the per-GPU share (D/N for data-parallel kinds, D for pp-swap) and dividing it (lohan: equal
// to it); pp-swap gets
// balanced_stages(u, N). Empty when N does not divide D (data-parallel kinds) or N > R (pp-swap).
// Throws ScheduleError for a Harmony kind (use core::enumerate_candidates) or N, D < 1.
std::vector<BaselinePlan> enumerate_baseline_plans(PlanKind kind, const Model& model, int gpus, int minibatch,
                                                   Bytes capacity_bytes, const BaselineSearchOptions& options = {});

struct BaselineRanked {
  std::size_t plan = 0;  // index into the candidate list
  RunReport report;
};
struct BaselineSearchResult {
  std::size_t num_candidates = 0;
  std::size_t num_deadlocked = 0;
  std::vector<BaselineRanked> ranked;  // best first by iteration time (ties: enumeration order)
};
using BaselineEvaluator = std::function<RunReport(const BaselinePlan&)>;
// Evaluates every plan on `threads` threads (0 = hardware concurrency), drops deadlocks, ranks by
// iteration time with a stable sort and keeps top_k (-1 = all). Deterministic for any thread count.
// `progress` (optional) hears how many plans are done, at most every ~0.1 s and once at the end.
BaselineSearchResult run_baseline_search(const std::vector<BaselinePlan>& plans, const BaselineEvaluator& evaluate,
                                         int threads = 0, int top_k = -1, const SearchProgressFn& progress = {});

}  // namespace harmony::core
