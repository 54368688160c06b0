// The configuration search of every plan kind: the search space (SearchSpace), a candidate (a Plan with the packing
// methods that made it), Harmony's enumeration (the paper's searcher.py: candidate microbatch sizes, packing methods
// per direction; search.pack_counts: wide widens the balanced methods beyond the paper's memory-minimum pack count)
// and the ranking of any kind's candidates, evaluated by a caller-supplied cost function on all cores with a
// deterministic order (time, then enumeration order). The single-pack "/1000" rule is opt-in. A kind's enumeration
// is its PlanKindSpec::enumerate (core/kinds/kinds.hpp: enumerate_plans).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan.hpp"
#include "core/search/progress.hpp"

namespace harmony::core {

// Which pack counts the balanced packing methods offer (docs/config.md, search.pack_counts).
enum class PackCounts {
  Minimum,  // the paper's: each method's smallest feasible pack count (the S loop from ceil(Σm / C))
  Wide,     // also every further feasible count up to max_packs(); identical candidates are searched once
};

const char* pack_counts_name(PackCounts p);  // "minimum" / "wide"

// The search space of the config's `search:` section (docs/config.md).
struct SearchSpec {
  std::vector<std::string> packing_fwd{"greedy_reverse_addx", "balanced_addx", "reuse", "balanced_time"};
  std::vector<std::string> packing_bwd{"greedy_reverse_addx", "balanced_addx", "balanced_time"};
  int top_k = 5;              // -1 keeps every candidate
  int ubatch_step = 1;        // stride of candidate microbatch sizes
  bool smaller_ufwd = false;  // allow u_fwd < u_bwd
  bool fit_rule = false;      // the paper's quirk: a single-pack plan's time / 1000 for ranking
  std::vector<int> u_fwd;     // explicit candidate lists (empty = all valid sizes)
  std::vector<int> u_bwd;
  int threads = 0;  // 0 = all hardware threads
  PackCounts pack_counts = PackCounts::Minimum;
  int packs_per_gpu = 4;  // Wide: counts up to packs_per_gpu x GPUs (0 = up to the layer count)
  // zero-infinity's offload tier in compare and sweeps: Auto = host memory, and the machine's NVMe tier only
  // when host memory binds; Cpu / Nvme = that tier only (DeepSpeed's offload_param/offload_optimizer device).
  enum class Offload { Auto, Cpu, Nvme };
  Offload offload = Offload::Auto;
  // dp-swap's and pp-swap's swap timing in compare, sweeps and harmony-run's --plan auto (the kinds with the swap
  // knob; docs/baselines.md "Swap timing"): the baselines at their best (scheduled) or as virtualized memory.
  SwapTiming swap = SwapTiming::Scheduled;
  // zero-infinity's and zero3-opt-offload's ZeRO-3 knobs in compare, sweeps and --plan auto (search.zero3, as
  // plan.zero3: the hook costs, the bucket, DeepSpeed's pipelined optimizer swap under the NVMe tier).
  Zero3Overheads zero3;
};

// One plan a search evaluates, with the packing methods that produced its packs ("" for kinds without packs, and
// method_fwd for a single-pack plan, which has no forward tasks).
struct Candidate {
  Plan plan;
  std::string method_fwd;
  std::string method_bwd;
};

struct SearchSpace {
  PlanKind kind;  // the kind whose candidates are enumerated (default: the registry's first, harmony-pp)
  int gpus = 1;
  int minibatch = 1;
  Bytes capacity_bytes = 10 * kGiB;  // per-GPU memory the packers and swap decisions fit against (cap x scale)
  bool unequal_microbatches = false;
  SearchSpec spec;
  // Kinds with knobs: every candidate's knobs start as these (ZeRO-3's overheads, forced swap choices, ...), then
  // take each activation policy of `activation_policies` (kinds with the activations knob) and each tier of
  // `offloads` (kinds with the offload knob) in turn. Kinds without knobs ignore all three.
  KindKnobs knobs;
  std::vector<ActivationPolicy> activation_policies = {ActivationPolicy::Checkpoint};
  std::vector<OffloadTier> offloads = {OffloadTier::Cpu};
  // Swapping kinds: leave out plans whose swap decisions' memory estimate does not fit capacity_bytes.
  bool drop_infeasible = true;
};

// The search space of `kind` on `gpus` GPUs at `minibatch`, fitting `capacity_bytes` per GPU, with the config's
// `search:` section and options.unequal_microbatches: the one every search builds (compare, the memory answer,
// search, harmony-run's --plan auto). The kind's registry entry decides what spec sets: spec.swap is the candidates'
// swap timing for a kind with the swap knob only (the others keep scheduled); knobs.gpu_capacity_bytes is the
// capacity. activation_policies, offloads and drop_infeasible keep their defaults: each caller's own choice.
SearchSpace search_space_for(PlanKind kind, int gpus, int minibatch, Bytes capacity_bytes, const SearchSpec& spec,
                             bool unequal_microbatches = false);

// Candidate microbatch sizes for one direction (§7.1): profiled range, capped at D (PP) or D/N (DP),
// stepped, and (unless unequal sizes are allowed) dividing every GPU's share of the minibatch.
std::vector<int> candidate_ubatch_sizes(const Model& model, Phase phase, const SearchSpace& space);

// The largest pack count a Wide search offers beyond each method's minimum: min(layers, packs_per_gpu x gpus), or
// the layer count when packs_per_gpu is 0. A method's own (minimum) packing is kept even when it has more packs.
int max_pack_count(const Model& model, const SearchSpace& space);

// Harmony's candidates (a kind with packs) in the paper's enumeration order. Identical packs from different methods
// are kept (Minimum). With Wide, each balanced method contributes its packings for every pack count up to
// max_pack_count, in increasing count right after its paper packing, and a candidate identical to an earlier one is
// left out. Throws ScheduleError for a kind without packs (use core::enumerate_plans).
std::vector<Candidate> enumerate_candidates(const Model& model, const SearchSpace& space);

// The plan of a candidate (c.plan).
inline const Plan& candidate_plan(const Candidate& c, const SearchSpace& /*space*/) { return c.plan; }

struct RankedResult {
  std::size_t candidate = 0;  // index into the candidate list
  double rank_time_s = 0.0;   // the ranking key (iteration time, / 1000 for single packs with fit_rule)
  RunReport report;
};

struct SearchResult {
  std::size_t num_candidates = 0;
  std::size_t num_deadlocked = 0;    // of the evaluated candidates
  std::size_t num_infeasible = 0;    // of the evaluated candidates: exceeded a capacity (native cost model)
  std::size_t num_pruned = 0;        // not evaluated: their bound exceeded the top_k-th best time already found
  std::vector<RankedResult> ranked;  // best first, at most top_k (all when top_k = -1)
  // The evaluated candidate of lowest index whose report is infeasible with a reason (npos: none), and that
  // reason: when nothing is feasible only candidates that cannot be feasible are pruned, and the first of those is
  // evaluated when it comes first (run_search_bounded), so this is the first miss in enumeration order.
  std::size_t first_miss = static_cast<std::size_t>(-1);
  std::string first_miss_reason;
  // Of the evaluated candidates that could be feasible (not declined for an infinite bound): how many exceeded a
  // GPU's memory (exceeds_gpu_memory). More, smaller packs can cure only this miss (search_growing_bound).
  std::size_t num_gpu_memory_misses = 0;
};

// The report's plan did not fit a GPU's memory: its peak is over the capacity, or an allocation overflowed it (the
// native engine stops the run there).
inline bool exceeds_gpu_memory(const RunReport& r) { return !r.fits || r.memory_overflow_ops > 0; }

using Evaluator = std::function<RunReport(const Plan&)>;
// An evaluator that may decline: nullopt when it can tell, more cheaply than evaluating, that the plan's iteration
// would take longer than `cutoff_s` (sim::Engine::run_within). It must never decline a plan that would not.
using BoundedEvaluator = std::function<std::optional<RunReport>(const Plan&, double cutoff_s)>;

// Evaluates every candidate with `evaluate` on `threads` threads (0 = hardware concurrency).
// Deadlocked candidates are counted and left out of the ranking. Deterministic for any thread count.
// `progress` (optional) hears how many candidates are done, at most every ~0.1 s and once at the end.
SearchResult run_search(const std::vector<Candidate>& candidates, const SearchSpace& space, const Evaluator& evaluate,
                        const SearchProgressFn& progress = {});

// A time a plan's iteration cannot beat, far cheaper to find than evaluating it (sim::task_bound_for: the task graph's
// compute chain, before lowering); +infinity for a plan that cannot be feasible.
using PlanBound = std::function<double(const Plan&)>;

// The same ranking with branch and bound (top_k >= 1): candidates in increasing `bound` when one is given (its
// values found first, on the search's threads), else in increasing compute_estimate_s (then enumeration order); a
// candidate whose bound exceeds the cutoff of the top_k-th best time found so far is declined unevaluated, the rest
// are offered that cutoff (infinite until top_k are found). A declined candidate is slower than top_k evaluated ones,
// so `ranked` is what run_search gives (same reports, same order, ties by enumeration order) and only the counts
// cover fewer candidates (num_pruned says how many fewer). A candidate with an infinite bound is declined even while
// the cutoff is infinite, except the first in enumeration order when no evaluated miss precedes it: it is evaluated
// at the end, so first_miss and its reason are the full search's however many were declined. Which candidates are
// pruned is deterministic with one thread; `ranked` and first_miss for any thread count.
SearchResult run_search_bounded(const std::vector<Candidate>& candidates, const SearchSpace& space, const Model& model,
                                const BoundedEvaluator& evaluate, const SearchProgressFn& progress = {},
                                const PlanBound& bound = {});

// Wide's bound grows when nothing under it fits (issue 35). The packers test each pack alone against the capacity;
// what must fit beside it (with prefetch, the next pack's weights arriving while this one runs) only the cost model
// knows, so a 1-GPU search bounded at packs_per_gpu x 1 = 4 packs can find nothing though more, smaller packs fit.
// search_growing_bound runs `search` on the candidates of `space` (its kind's enumeration, PlanKindSpec::enumerate);
// when it ranks nothing, some evaluated candidate exceeded a GPU's memory, the kind has packs, pack_counts is Wide
// and the bound is below the layer count, it
// doubles packs_per_gpu (so the bound: min(layers, packs_per_gpu x gpus)) and searches again, until a plan ranks or
// the layer count was searched. A search that ranks a plan, or misses for another reason (host memory, deadlock),
// is returned as it is, so every search that found a plan before finds the same one. The result is the last
// search's, byte for byte what a config with that packs_per_gpu gives. Deterministic: the bounds tried depend on
// the inputs only. A kind without packs has no bound: one search of its candidates.
struct GrownSearch {
  SearchSpace space;                  // the last search's (spec.packs_per_gpu as grown)
  std::vector<Candidate> candidates;  // the last search's (result's indices point here)
  SearchResult result;                // the last search's
  int configured_max_packs = 0;       // max_pack_count of the given space
  int max_packs = 0;                  // max_pack_count of the last search (> configured_max_packs: the bound grew)
  int searches = 1;                   // searches run, the last included
  bool grew() const { return max_packs > configured_max_packs; }
};
using SearchOnce = std::function<SearchResult(const std::vector<Candidate>& candidates, const SearchSpace& space)>;
GrownSearch search_growing_bound(const Model& model, const SearchSpace& space, const SearchOnce& search);

// A rough per-GPU compute time of a candidate's iteration from the profile (forward packs at u_fwd, recompute and
// backward of every layer at u_bwd, over each GPU's share of the minibatch): the order run_search_bounded tries
// candidates in, so that a good plan sets a tight cutoff early. Not a bound.
double compute_estimate_s(const Model& model, const Candidate& candidate, const SearchSpace& space);

}  // namespace harmony::core
