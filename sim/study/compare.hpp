// `harmony-sim compare`: for one model, machine and minibatch, the best plan of every plan kind
// (Harmony-PP, Harmony-DP and each swapping baseline), each searched over its own knobs with the
// same cost model, or the reason it does not fit.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan.hpp"
#include "core/search/progress.hpp"

namespace harmony::sim {

struct KindResult {
  core::PlanKind kind;
  bool feasible = false;
  bool applicable = true;          // false: the kind cannot run this N and D at all (reason says why)
  std::string reason;              // why no plan of this kind fits (when !feasible)
  std::size_t candidates = 0;      // plans searched (evaluated or pruned)
  std::size_t deadlocked = 0;      // of the evaluated, how many deadlocked
  std::size_t pruned = 0;          // not simulated: the engine's bound showed they cannot win
  core::RunReport best;            // valid when feasible
  std::optional<core::Plan> plan;  // the best plan as searched (when feasible): evaluate_plan of it reruns best
  // kinds with the activations knob: the best feasible time under each activation policy searched ("checkpoint",
  // "keep"); the winner is best.plan.knobs.activation_policy. A policy with no feasible plan is absent.
  std::map<std::string, double> policy_best_time_s;
  // zero-infinity: the offload tier of the best plan ("cpu", or "nvme" when no cpu plan fits host memory and
  // the machine has an NVMe tier); Harmony kinds: "nvme" when their masters and optimizer state went to the
  // drives (the same rule: search.offload, or auto when host memory binds), else ""; "" for the other kinds.
  std::string offload;
  // kinds with packs, search.pack_counts wide: the pack-count bound the search grew to because nothing under the
  // configured one fit the GPU memory (core::search_growing_bound); 0 when it did not grow
  int max_packs_grown = 0;
  double speedup_over_best_baseline = 0.0;
  // the ceiling's time over this kind's (the ceiling itself: 1); 0 when the ceiling or this kind has no plan
  double fraction_of_ceiling = 0.0;
};

struct CompareResult {
  std::vector<KindResult> kinds;  // in core::plan_kinds() (listing) order
  double best_baseline_time_s = 0.0;
  // The fastest feasible plan of a ceiling kind (resident: the in-memory trainer); +infinity when none fits.
  double ceiling_time_s = 0.0;
};

// The best plan of one kind, searched on the calling thread (search.threads is ignored) over the kind's candidates
// (core::enumerate_plans): kinds with packs through core::run_search_bounded (top 1, no fit rule, the task graph's
// bound), the others through core::run_search over the given activation policies (by default both, checkpoint and
// keep; the winner is best.plan.knobs.activation_policy; ignored by kinds without the activations knob). `progress`
// (optional) hears the search's candidates done / total (core/search/progress.hpp).
KindResult best_plan_of_kind(core::PlanKind kind, const core::Model& model, const core::MachineSpec& machine, int gpus,
                             int minibatch, core::CostModelKind cost_model, const core::SearchSpec& search,
                             const core::Options& options,
                             const std::vector<core::ActivationPolicy>& policies = {core::ActivationPolicy::Checkpoint,
                                                                                    core::ActivationPolicy::Keep},
                             const core::SearchProgressFn& progress = {});

// Progress of compare_plan_kinds over all kinds: candidates done of those enumerated so far (a kind's candidates
// count once its search starts), and kinds finished.
struct CompareProgress {
  std::size_t kinds_done = 0;
  std::size_t kinds_started = 0;  // until every kind has started, candidates_total is still growing
  std::size_t kinds = 0;
  std::size_t candidates_done = 0;
  std::size_t candidates_total = 0;
};
using CompareProgressFn = std::function<void(const CompareProgress&)>;

// Searches every registered plan kind. `search` and `options` shape the searches (packing methods, microbatch
// lists, stride); kinds without packs use the same microbatch stride and u_bwd list.
CompareResult compare_plan_kinds(const core::Model& model, const core::MachineSpec& machine, int gpus, int minibatch,
                                 core::CostModelKind cost_model, const core::SearchSpec& search,
                                 const core::Options& options, const CompareProgressFn& progress = {});

// compare's lines on the ceiling (the kinds of role Ceiling: resident, the in-memory trainer): its time and how close
// each Harmony kind's best plan comes to it when it fits; when it does not, why, and that this is the case Harmony is
// for. Empty when no ceiling kind was compared.
std::vector<std::string> ceiling_lines(const CompareResult& result);

}  // namespace harmony::sim
