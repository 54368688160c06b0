// Plan helpers: the paper's manual packing, plan validation and minibatch splitting.
#include "core/plan/plan.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core {

void manual_packs(int num_layers, int pack_size, Packs& packs_fwd, Packs& packs_bwd) {
  if (pack_size < 1) throw ScheduleError(fmt::format("pack size {} is not positive", pack_size));
  packs_bwd.clear();
  // splits = range(R-1, -1, -P) reversed: packs end at R-1, R-1-P, ...; the first takes the remainder.
  for (int last = num_layers - 1; last >= 0; last -= pack_size) {
    packs_bwd.insert(packs_bwd.begin(), LayerRange{std::max(0, last - pack_size + 1), last});
  }
  packs_fwd.assign(packs_bwd.begin(), packs_bwd.end() - 1);
}

static void check_cover(const Packs& packs, int first, int end, const char* what) {
  int next = first;
  for (std::size_t i = 0; i < packs.size(); ++i) {
    const LayerRange& p = packs[i];
    if (p.first > p.last)
      throw ScheduleError(
          fmt::format("{} pack {} [{}, {}] is empty or reversed: write [first, last] with first <= last", what, i,
                      p.first, p.last));
    if (p.first != next) {
      throw ScheduleError(fmt::format("{} pack {} [{}, {}] {} layer {}: packs must be contiguous and ascending", what,
                                      i, p.first, p.last, p.first > next ? "skips to after" : "overlaps at",
                                      p.first > next ? next : p.first));
    }
    next = p.last + 1;
  }
  if (next != end)
    throw ScheduleError(
        fmt::format("{} packs cover layers {}..{} but must cover {}..{}", what, first, next - 1, first, end - 1));
}

void validate_packs(const Plan& plan, int num_layers) {
  if (!plan.kind->packs)
    throw ScheduleError(fmt::format("{} plans have no layer packs (its microbatch is plan.u_bwd)", plan.kind.name()));
  // The size and split rules (core/plan/plan_rules); whether u divides the shares depends on
  // options.unequal_microbatches, which the plan does not carry: only u >= 1 here.
  if (const auto p = split_problem(plan.kind, plan.gpus, plan.minibatch)) throw ScheduleError(p->message);
  for (const auto& [what, u] : {std::pair{"u_fwd", plan.u_fwd}, std::pair{"u_bwd", plan.u_bwd}})
    if (const auto p = positive_microbatch_problem(u, what)) throw ScheduleError(p->message);
  if (plan.packs_bwd.empty()) throw ScheduleError("no backward packs");
  check_cover(plan.packs_bwd, 0, num_layers, "backward");
  check_cover(plan.packs_fwd, 0, plan.packs_bwd.back().first, "forward");
}

std::string packs_to_string(const Packs& packs) {
  std::string s = "[";
  for (std::size_t i = 0; i < packs.size(); ++i) {
    if (i) s += ", ";
    s += packs[i].first == packs[i].last ? fmt::format("[{}]", packs[i].first)
                                         : fmt::format("[{}-{}]", packs[i].first, packs[i].last);
  }
  return s + "]";
}

std::string plan_title(const Plan& p) {
  if (!p.kind->packs)
    return fmt::format("{} N{} D{} u {} ({}{})", p.kind.name(), p.gpus, p.minibatch, p.u_bwd,
                       activation_policy_name(p.knobs.activation_policy),
                       p.knobs.swap == SwapTiming::OnDemand ? ", on-demand swap" : "");
  return fmt::format("{} N{} D{} u {}/{} {}", p.kind.name(), p.gpus, p.minibatch, p.u_fwd, p.u_bwd, plan_layout(p));
}

std::string plan_layout(const Plan& p) {
  if (!p.kind->packs) return fmt::format("u {}", p.u_bwd);
  return fmt::format("fwd {} bwd {}", packs_to_string(p.packs_fwd), packs_to_string(p.packs_bwd));
}

std::string microbatch_label(const Plan& p) {
  return p.kind->packs ? fmt::format("u {}/{}", p.u_fwd, p.u_bwd) : fmt::format("u {}", p.u_bwd);
}

std::vector<int> minibatch_shares(PlanKind kind, int minibatch, int gpus) {
  if (!kind->data_parallel) return {minibatch};
  std::vector<int> shares;
  shares.reserve(static_cast<std::size_t>(std::max(0, gpus)));
  for (int n = 0; n < gpus; ++n) shares.push_back(minibatch / gpus + (n < minibatch % gpus ? 1 : 0));
  return shares;
}

std::vector<int> split_minibatch(int samples, int ubatch) {
  std::vector<int> v(static_cast<std::size_t>(samples / ubatch), ubatch);
  if (samples % ubatch) v.push_back(samples % ubatch);
  return v;
}

}  // namespace harmony::core
