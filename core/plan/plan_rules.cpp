// The plan rules (plan_rules.hpp): one verdict function per rule, the messages built from it, so that the search's
// filters (microbatch_fits) and the errors (microbatch_problem) can never disagree.
#include "core/plan/plan_rules.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "core/base/strings.hpp"
#include "core/plan/plan.hpp"

namespace harmony::core {

namespace {

constexpr const char* kUnequalEscape =
    "or set options.unequal_microbatches: true (the paper's --inequal_ubatchsize; the runtime does not support it)";

// Kinds that may run unequal microbatches (Harmony's) do when asked; the others never do.
bool unequal_allowed(PlanKind kind, UnequalMicrobatches unequal) {
  return kind->unequal_microbatches && unequal == UnequalMicrobatches::Allowed;
}

enum class Verdict { Ok, Split, NotPositive, TooLarge, NotDividing, NotTheShare };

bool split_fails(PlanKind kind, int gpus, int minibatch) {
  if (gpus < 1 || minibatch < 1) return true;
  if (kind->one_gpu && gpus != 1) return true;
  if (kind->data_parallel && minibatch < gpus) return true;
  return kind->even_split && minibatch % gpus != 0;
}

Verdict judge(PlanKind kind, int gpus, int minibatch, int u, UnequalMicrobatches unequal) {
  if (split_fails(kind, gpus, minibatch)) return Verdict::Split;
  if (u < 1) return Verdict::NotPositive;
  const std::vector<int> shares = minibatch_shares(kind, minibatch, gpus);
  const int largest = *std::max_element(shares.begin(), shares.end());
  if (unequal_allowed(kind, unequal)) return u > largest ? Verdict::TooLarge : Verdict::Ok;
  if (kind->one_microbatch)
    return std::all_of(shares.begin(), shares.end(), [u](int s) { return s == u; }) ? Verdict::Ok
                                                                                    : Verdict::NotTheShare;
  return std::all_of(shares.begin(), shares.end(), [u](int s) { return s % u == 0; }) ? Verdict::Ok
                                                                                      : Verdict::NotDividing;
}

}  // namespace

std::vector<int> divisors(int value) {
  std::vector<int> low, high;
  for (int d = 1; static_cast<long long>(d) * d <= value; ++d) {
    if (value % d) continue;
    low.push_back(d);
    if (d != value / d) high.push_back(value / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::optional<PlanProblem> size_problem(int gpus, int minibatch) {
  if (gpus < 1)
    return PlanProblem{PlanField::Gpus, fmt::format("gpus = {} must be at least 1", gpus), "use at least one GPU", {}};
  if (minibatch < 1)
    return PlanProblem{PlanField::Minibatch,
                       fmt::format("minibatch = {} must be at least 1", minibatch),
                       "use a minibatch of at least one sample",
                       {}};
  return std::nullopt;
}

std::optional<PlanProblem> split_problem(PlanKind kind, int gpus, int minibatch) {
  if (auto p = size_problem(gpus, minibatch)) return p;
  const char* name = plan_kind_name(kind);
  if (kind->one_gpu && gpus != 1)
    return PlanProblem{PlanField::Gpus,
                       fmt::format("{} runs on one GPU: plan.gpus is {}", name, gpus),
                       "use plan.gpus: 1, or a kind that runs on several GPUs (`harmony-sim kinds`)",
                       {1}};
  if (kind->data_parallel && minibatch < gpus)
    return PlanProblem{
        PlanField::Minibatch,
        fmt::format("minibatch {} gives GPUs no samples: {} over {} GPUs needs a minibatch of at least {} "
                    "(one sample per GPU)",
                    minibatch, name, gpus, gpus),
        fmt::format("use a minibatch of at least {}, or fewer GPUs", gpus),
        {}};
  if (kind->even_split && minibatch % gpus != 0) {
    const std::vector<int> counts = divisors(minibatch);
    return PlanProblem{
        PlanField::Gpus,
        fmt::format("{} splits the minibatch evenly: {} GPUs do not divide minibatch {}", name, gpus, minibatch),
        fmt::format("use a number of GPUs that divides {} ({}), or a minibatch that is a multiple of {}", minibatch,
                    join_ints(counts), gpus),
        counts};
  }
  return std::nullopt;
}

std::optional<PlanProblem> stage_problem(PlanKind kind, int gpus, int num_layers) {
  if (!kind->stage_per_gpu || gpus <= num_layers) return std::nullopt;
  return PlanProblem{
      PlanField::Gpus,
      fmt::format("{} needs a layer per stage: {} GPUs for {} layers", plan_kind_name(kind), gpus, num_layers),
      fmt::format("use at most {} GPUs (one stage of at least one layer each)", num_layers),
      {}};
}

std::optional<PlanProblem> positive_microbatch_problem(int u, std::string_view what) {
  if (u >= 1) return std::nullopt;
  return PlanProblem{PlanField::Microbatch,
                     fmt::format("{} = {} must be at least 1", what, u),
                     "use a microbatch size of at least 1",
                     {}};
}

bool microbatch_fits(PlanKind kind, int gpus, int minibatch, int u, UnequalMicrobatches unequal) {
  return judge(kind, gpus, minibatch, u, unequal) == Verdict::Ok;
}

std::optional<PlanProblem> microbatch_problem(PlanKind kind, int gpus, int minibatch, int u, std::string_view what,
                                              UnequalMicrobatches unequal) {
  const Verdict v = judge(kind, gpus, minibatch, u, unequal);
  if (v == Verdict::Ok) return std::nullopt;
  if (v == Verdict::Split) return split_problem(kind, gpus, minibatch);
  if (v == Verdict::NotPositive) return positive_microbatch_problem(u, what);
  const char* name = plan_kind_name(kind);
  const bool dp = kind->data_parallel;
  const std::vector<int> shares = minibatch_shares(kind, minibatch, gpus);
  const int largest = *std::max_element(shares.begin(), shares.end());
  if (v == Verdict::TooLarge)
    return PlanProblem{PlanField::Microbatch,
                       dp ? fmt::format("{} = {} is larger than a GPU's share ({}) of minibatch {} in {} over {} GPUs",
                                        what, u, largest, minibatch, name, gpus)
                          : fmt::format("{} = {} is larger than minibatch {}", what, u, minibatch),
                       fmt::format("use a microbatch size of at most {}", largest),
                       {}};
  if (v == Verdict::NotTheShare)
    return PlanProblem{
        PlanField::Microbatch,
        fmt::format("{} = {} is not the per-GPU share {}: {} runs each GPU's share as one microbatch (no "
                    "gradient accumulation)",
                    what, u, shares.front(), name),
        fmt::format("use {} = {} (minibatch / gpus)", what, shares.front()),
        {shares.front()}};
  // NotDividing
  const int common = std::accumulate(shares.begin(), shares.end(), 0, [](int a, int b) { return std::gcd(a, b); });
  std::vector<int> fit = divisors(common);
  const bool escape = kind->unequal_microbatches && unequal == UnequalMicrobatches::Offered;
  const std::string fits = fmt::format("sizes that divide: {}", join_ints(fit));
  const std::string tail = escape ? fmt::format("; {}", kUnequalEscape) : std::string();
  if (!dp)
    return PlanProblem{PlanField::Microbatch,
                       fmt::format("{} = {} does not divide minibatch {}: {} needs D % u == 0 so that all microbatches "
                                   "are equal",
                                   what, u, minibatch, name),
                       fits + tail, std::move(fit)};
  const bool even = minibatch % gpus == 0;
  return PlanProblem{
      PlanField::Microbatch,
      fmt::format("{} = {} does not divide every GPU's share of minibatch {}: {} over {} GPUs gives {} samples per "
                  "GPU, and each share must be a multiple of u",
                  what, u, minibatch, name, gpus,
                  even ? std::to_string(shares.front()) : fmt::format("{} or {}", shares.front(), shares.back())),
      even ? fits + tail
           : fmt::format("only u = 1 divides shares of {} and {}: make minibatch a multiple of gpus ({}){}",
                         shares.front(), shares.back(), gpus, escape ? fmt::format(", {}", kUnequalEscape) : ""),
      std::move(fit)};
}

std::vector<PlanProblem> plan_problems(PlanKind kind, int gpus, int minibatch,
                                       const std::vector<std::pair<std::string, int>>& microbatches,
                                       UnequalMicrobatches unequal) {
  if (auto p = split_problem(kind, gpus, minibatch)) return {std::move(*p)};
  std::vector<PlanProblem> out;
  for (const auto& [what, u] : microbatches)
    if (auto p = microbatch_problem(kind, gpus, minibatch, u, what, unequal)) out.push_back(std::move(*p));
  return out;
}

}  // namespace harmony::core
