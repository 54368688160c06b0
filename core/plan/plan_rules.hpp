// The one place that decides whether a plan kind can run a minibatch of D samples on N GPUs with microbatch u:
// every such rule returns a PlanProblem (message, hint, the values that would pass) instead of throwing, so the
// config loader can locate it at the offending key and everyone else (validation, search, compare, harmony-run)
// reports the same text. docs/design.md, "Plan rules".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/plan/plan_kind.hpp"

namespace harmony::core {

// The quantity a problem is about: where the config loader points (plan.gpus, plan.minibatch, the microbatch key).
enum class PlanField { Gpus, Minibatch, Microbatch };

struct PlanProblem {
  PlanField field = PlanField::Microbatch;
  std::string message;            // one sentence naming the values, the kind and the rule
  std::string hint;               // what to change
  std::vector<int> valid_values;  // values of `field` that pass, where a short list exists (else empty)
};

// How a microbatch that does not divide a GPU's share is treated. Baselines always need equal microbatches.
enum class UnequalMicrobatches {
  Refused,  // the runtime needs D % u == 0 per share (harmony-run, the baselines)
  Offered,  // refused, and the hint offers options.unequal_microbatches (harmony-sim's Harmony modes)
  Allowed,  // options.unequal_microbatches: true: any u up to the largest share (Harmony modes only)
};

// gpus >= 1 and minibatch >= 1 (every kind).
std::optional<PlanProblem> size_problem(int gpus, int minibatch);

// How the minibatch splits over the GPUs: harmony-dp needs a sample per GPU (D >= N; shares per
// core::minibatch_shares); the data-parallel baselines split evenly (N divides D); harmony-pp and pp-swap run all D
// samples through every stage (no rule); a one-GPU kind (PlanKindSpec::one_gpu: host-stream) needs N = 1. Includes
// size_problem.
std::optional<PlanProblem> split_problem(PlanKind kind, int gpus, int minibatch);

// Kinds with one stage per GPU (pp-swap) need a layer per stage: N <= R.
std::optional<PlanProblem> stage_problem(PlanKind kind, int gpus, int num_layers);

// u >= 1 (every kind; the part of microbatch_problem that needs no minibatch).
std::optional<PlanProblem> positive_microbatch_problem(int u, std::string_view what = "microbatch");

// Microbatch u (named `what` in the message: "plan.u_fwd", "microbatch", ...) on each GPU's share of the minibatch:
// u >= 1; harmony-pp and pp-swap: u divides D; data-parallel kinds: u divides every GPU's share
// (core::minibatch_shares); one-microbatch kinds (core::is_one_microbatch, lohan): u = D/N. With
// UnequalMicrobatches::Allowed a Harmony mode only needs u <= its largest share. Includes split_problem.
std::optional<PlanProblem> microbatch_problem(PlanKind kind, int gpus, int minibatch, int u,
                                              std::string_view what = "microbatch",
                                              UnequalMicrobatches unequal = UnequalMicrobatches::Refused);

// microbatch_problem(...) is empty, without building the message (the search's and harmony-run's filters).
bool microbatch_fits(PlanKind kind, int gpus, int minibatch, int u,
                     UnequalMicrobatches unequal = UnequalMicrobatches::Refused);

// Every problem of (kind, N, D) and the microbatch sizes given (each named by its `what`), in that order; empty when
// the plan passes every rule. The split problem alone when the split fails (the microbatch rules assume a split).
std::vector<PlanProblem> plan_problems(PlanKind kind, int gpus, int minibatch,
                                       const std::vector<std::pair<std::string, int>>& microbatches,
                                       UnequalMicrobatches unequal = UnequalMicrobatches::Refused);

// The divisors of value >= 1, ascending: 12 -> 1 2 3 4 6 12.
std::vector<int> divisors(int value);

}  // namespace harmony::core
