// Candidate enumeration (the paper's searcher.search, optionally widened to more pack counts) and the
// parallel, deterministic ranking.
#include "core/search/search.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"
#include "core/plan/packing.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core {

namespace {

// Orders (u_fwd, packs_fwd, u_bwd, packs_bwd) keys; LayerRange has only ==.
struct PlanKeyLess {
  static bool less(const Packs& a, const Packs& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                        [](const LayerRange& x, const LayerRange& y) {
                                          return std::pair(x.first, x.last) < std::pair(y.first, y.last);
                                        });
  }
  bool operator()(const std::tuple<int, Packs, int, Packs>& a, const std::tuple<int, Packs, int, Packs>& b) const {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    if (std::get<2>(a) != std::get<2>(b)) return std::get<2>(a) < std::get<2>(b);
    if (less(std::get<1>(a), std::get<1>(b))) return true;
    if (less(std::get<1>(b), std::get<1>(a))) return false;
    return less(std::get<3>(a), std::get<3>(b));
  }
};

}  // namespace

SearchSpace search_space_for(PlanKind kind, int gpus, int minibatch, Bytes capacity_bytes, const SearchSpec& spec,
                             bool unequal_microbatches) {
  SearchSpace space;
  space.kind = kind;
  space.gpus = gpus;
  space.minibatch = minibatch;
  space.capacity_bytes = capacity_bytes;
  space.unequal_microbatches = unequal_microbatches;
  space.spec = spec;
  space.knobs.gpu_capacity_bytes = capacity_bytes;
  if (kind.has_knob(Knob::Swap)) space.knobs.swap = spec.swap;
  if (kind.has_knob(Knob::Zero3)) space.knobs.zero3 = spec.zero3;
  return space;
}

std::vector<int> candidate_ubatch_sizes(const Model& model, Phase phase, const SearchSpace& space) {
  const bool dp = space.kind->data_parallel;
  const int dlim = dp ? space.minibatch / space.gpus : space.minibatch;
  // The profiled range and the paper's cap (D, or D/N rounded down) bound the sizes; the plan rules decide which
  // of them the kind can run (core/plan/plan_rules: dividing every GPU's share, or any with unequal microbatches).
  const UnequalMicrobatches unequal =
      space.unequal_microbatches ? UnequalMicrobatches::Allowed : UnequalMicrobatches::Refused;
  auto ok = [&](int u) {
    if (!model.ubatch_in_range(phase, u) || u > dlim) return false;
    return microbatch_fits(space.kind, space.gpus, space.minibatch, u, unequal);
  };
  std::vector<int> out;
  const auto& given = phase == Phase::Fwd ? space.spec.u_fwd : space.spec.u_bwd;
  if (!given.empty()) {
    for (int u : given) {
      if (ok(u)) out.push_back(u);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  const int hi = std::min(model.ubatch_max(phase), dlim);
  for (int u = model.ubatch_min(phase); u <= hi; u += std::max(1, space.spec.ubatch_step)) {
    if (ok(u)) out.push_back(u);
  }
  return out;
}

const char* pack_counts_name(PackCounts p) { return p == PackCounts::Wide ? "wide" : "minimum"; }

int max_pack_count(const Model& model, const SearchSpace& space) {
  const int layers = model.num_layers();
  if (space.spec.packs_per_gpu <= 0) return layers;
  return static_cast<int>(std::min<long long>(layers, static_cast<long long>(space.spec.packs_per_gpu) * space.gpus));
}

namespace {

// A method's packings: the paper's one (Minimum), or every count up to `max_packs` (Wide).
std::vector<Packs> packings(const Model& model, Phase phase, const std::string& method, int u, int layers,
                            const SearchSpace& space, int max_packs, const Packs* reuse) {
  if (space.spec.pack_counts == PackCounts::Wide)
    return find_packs_upto(model, phase, method, u, layers, space.capacity_bytes, max_packs, reuse);
  std::vector<Packs> out;
  if (auto p = find_packs(model, phase, method, u, layers, space.capacity_bytes, reuse)) out.push_back(std::move(*p));
  return out;
}

// Forward packings over `layers` for backward packs whose forward part has `reuse_count` packs: the method's own
// (Minimum), plus with Wide its packing with the most packs up to reuse_count (the count `reuse` gives), so a
// widened backward packing is paired with a forward of as many packs without crossing every count with every other.
std::vector<Packs> forward_packings(const Model& model, const std::string& method, int u, int layers,
                                    const SearchSpace& space, int reuse_count, const Packs* reuse) {
  if (space.spec.pack_counts != PackCounts::Wide)
    return packings(model, Phase::Fwd, method, u, layers, space, 0, reuse);
  std::vector<Packs> all =
      find_packs_upto(model, Phase::Fwd, method, u, layers, space.capacity_bytes, reuse_count, reuse);
  if (all.size() > 2) all.erase(all.begin() + 1, all.end() - 1);
  return all;
}

}  // namespace

std::vector<Candidate> enumerate_candidates(const Model& model, const SearchSpace& space) {
  if (!space.kind->packs)
    throw ScheduleError(fmt::format(
        "enumerate_candidates: {} plans have no packs; its PlanKindSpec::enumerate lists them", space.kind.name()));
  const int R = model.num_layers();
  const auto ub_bwd = candidate_ubatch_sizes(model, Phase::Bwd, space);
  const auto ub_fwd = candidate_ubatch_sizes(model, Phase::Fwd, space);
  const bool wide = space.spec.pack_counts == PackCounts::Wide;
  const int max_packs = max_pack_count(model, space);
  std::vector<Candidate> out;
  // Wide: identical candidates (same sizes and packs from different methods or counts) are searched once.
  std::set<std::tuple<int, Packs, int, Packs>, PlanKeyLess> seen;
  Plan base;
  base.kind = space.kind;
  base.gpus = space.gpus;
  base.minibatch = space.minibatch;
  base.knobs = space.knobs;
  auto add = [&](int u_fwd, Packs packs_fwd, std::string method_fwd, int u_bwd, const Packs& packs_bwd,
                 const std::string& method_bwd) {
    if (wide && !seen.insert({u_fwd, packs_fwd, u_bwd, packs_bwd}).second) return;
    Candidate c{base, std::move(method_fwd), method_bwd};
    c.plan.u_fwd = u_fwd;
    c.plan.u_bwd = u_bwd;
    c.plan.packs_fwd = std::move(packs_fwd);
    c.plan.packs_bwd = packs_bwd;
    out.push_back(std::move(c));
  };
  for (int u_bwd : ub_bwd) {
    for (const auto& mb : space.spec.packing_bwd) {
      for (const Packs& pb : packings(model, Phase::Bwd, mb, u_bwd, R, space, max_packs, nullptr)) {
        if (pb.size() == 1) {
          add(u_bwd, {}, "", u_bwd, pb, mb);
          continue;
        }
        const int r_fwd = pb.back().first;
        const Packs reuse(pb.begin(), pb.end() - 1);
        for (int u_fwd : ub_fwd) {
          if (u_fwd < u_bwd && !space.spec.smaller_ufwd) continue;
          for (const auto& mf : space.spec.packing_fwd) {
            for (Packs& pf : forward_packings(model, mf, u_fwd, r_fwd, space, static_cast<int>(reuse.size()), &reuse))
              add(u_fwd, std::move(pf), mf, u_bwd, pb, mb);
          }
        }
      }
    }
  }
  return out;
}

namespace {

// The top_k best ranking keys found so far (a max-heap of at most k), shared by the search's threads.
// The top_k best keys as a pruning threshold that does not depend on the thread count or on timing: the positions of
// the search order are cut into rounds (1, 1, 2, 2, 4, 4, then kRound each: small first, so a short search prunes
// early), and a candidate of round r is offered the k-th best key of rounds 0 .. r-2 once they are complete (one
// round of lag, so a thread rarely waits for a straggler). One thread or sixteen, the same candidates are declined
// and cut off at the same thresholds, so every count the search reports (num_pruned, num_infeasible, ...) is the
// same bit for bit, not only the ranking.
class RoundedBest {
 public:
  static constexpr std::size_t kRound = 8;
  RoundedBest(std::size_t k, std::size_t n) : k_(k) {
    for (std::size_t start = 0, j = 0; start < n; ++j) {
      round_start_.push_back(start);
      start += std::min<std::size_t>(kRound, std::size_t{1} << (j / 2));
    }
    round_start_.push_back(n);
    done_.assign(round_start_.size() - 1, 0);
    pending_.resize(done_.size());
    snapshot_.assign(round_start_.size(), kInf);
  }

  // The threshold for the candidate at position `pos` of the search order; blocks until the rounds it reads are in.
  double threshold(std::size_t pos) {
    const std::size_t r = round_of(pos);
    const std::size_t need = r > 0 ? r - 1 : 0;  // rounds 0 .. r-2 complete
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return complete_ >= need; });
    return snapshot_[need];
  }
  // The candidate at `pos` is done; `key` when it ranks (feasible, run to its end). Called once per position, also
  // when its evaluation threw, so no thread waits on it forever.
  void finish(std::size_t pos, std::optional<double> key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t r = round_of(pos);
    if (key) pending_[r].push_back(*key);
    ++done_[r];
    bool advanced = false;
    // a round's keys enter the heap only when the rounds before it are complete: the snapshot of rounds 0 .. j-1 holds
    // their keys and no key of a later round that happened to finish first
    while (complete_ < done_.size() && done_[complete_] == round_start_[complete_ + 1] - round_start_[complete_]) {
      for (const double k : pending_[complete_]) add(k);
      pending_[complete_].clear();
      ++complete_;
      snapshot_[complete_] = k_ > 0 && heap_.size() == k_ ? heap_.front() : kInf;
      advanced = true;
    }
    if (advanced) cv_.notify_all();
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  std::size_t round_of(std::size_t pos) const {
    return static_cast<std::size_t>(std::upper_bound(round_start_.begin(), round_start_.end(), pos) -
                                    round_start_.begin()) -
           1;
  }
  void add(double key) {
    if (heap_.size() < k_) {
      heap_.push_back(key);
      std::push_heap(heap_.begin(), heap_.end());
    } else if (k_ > 0 && key < heap_.front()) {
      std::pop_heap(heap_.begin(), heap_.end());
      heap_.back() = key;
      std::push_heap(heap_.begin(), heap_.end());
    }
  }
  std::size_t k_;
  std::vector<std::size_t> round_start_;      // round j holds positions round_start_[j] .. round_start_[j+1]-1
  std::vector<std::size_t> done_;             // finished positions per round
  std::vector<std::vector<double>> pending_;  // per round, the keys of its finished positions not yet in heap_
  std::vector<double> snapshot_;              // snapshot_[j]: the k-th best key once rounds 0 .. j-1 are complete
  std::size_t complete_ = 0;                  // rounds 0 .. complete_-1 are complete
  std::vector<double> heap_;                  // max-heap of the k best keys so far
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace

double compute_estimate_s(const Model& model, const Candidate& candidate, const SearchSpace& space) {
  const Plan& c = candidate.plan;
  const bool dp = space.kind->data_parallel;
  const int gpus = std::max(1, space.gpus);
  const int share = dp ? std::max(1, space.minibatch / gpus) : space.minibatch;
  auto passes = [&](int u) {
    const int n = (share + u - 1) / std::max(1, u);  // microbatches of u per GPU share, rounded up
    return static_cast<double>(n);
  };
  double s = 0.0;
  const int r_fwd = c.packs_fwd.empty() ? 0 : c.packs_bwd.back().first;
  for (int l = 0; l < r_fwd; ++l) s += model.time_s(Phase::Fwd, c.u_fwd, l) * passes(c.u_fwd);
  for (int l = 0; l < model.num_layers(); ++l) s += model.time_s(Phase::Bwd, c.u_bwd, l) * passes(c.u_bwd);
  return dp ? s : s / gpus;  // a pipeline spreads the layers over its GPUs
}

namespace {

// The search's threads for n candidates: spec.threads (0: hardware concurrency), at most one per few candidates.
unsigned search_threads(const SearchSpace& space, std::size_t n) {
  const unsigned threads =
      space.spec.threads > 0 ? static_cast<unsigned>(space.spec.threads) : std::thread::hardware_concurrency();
  // A thread costs tens of microseconds to start; a candidate takes about that on the smallest profiles (bert_large's
  // 24 layers: ~40 us) and milliseconds on deep ones, so a thread pays for itself from a handful of candidates.
  constexpr std::size_t kMinCandidatesPerThread = 4;
  return std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(n / kMinCandidatesPerThread)));
}

// The paper's fit rule ranks a single pack's time / 1000.
double fit_scale(const SearchSpace& space, const Candidate& c) {
  return space.spec.fit_rule && c.plan.packs_bwd.size() == 1 ? 1000.0 : 1.0;
}

// A report that names why its plan does not fit.
bool names_miss(const RunReport& r) { return !r.feasible && !r.infeasible_reason.empty(); }

// The search's result from the evaluated candidates' reports (evaluated[i]: candidate i was; the others were
// declined): the counts, the first miss in enumeration order, and the feasible plans ranked by time (the fit rule's
// scale applied), the top_k first.
SearchResult rank_reports(const std::vector<Candidate>& candidates, const SearchSpace& space,
                          std::vector<RunReport>& reports, const std::vector<char>& evaluated,
                          const std::vector<double>& bound) {
  const double inf = std::numeric_limits<double>::infinity();
  SearchResult res;
  const std::size_t n = candidates.size();
  res.num_candidates = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (!evaluated[i]) {
      ++res.num_pruned;
      continue;
    }
    // a candidate with an infinite bound cannot be feasible whatever its packs: its GPU miss says nothing of packing
    if (exceeds_gpu_memory(reports[i]) && (bound.empty() || bound[i] != inf)) ++res.num_gpu_memory_misses;
    if (names_miss(reports[i]) && res.first_miss == static_cast<std::size_t>(-1)) {
      res.first_miss = i;
      res.first_miss_reason = reports[i].infeasible_reason;
    }
    if (reports[i].deadlock) {
      ++res.num_deadlocked;
      continue;
    }
    if (!reports[i].feasible) {
      ++res.num_infeasible;
      continue;
    }
    res.ranked.push_back(
        RankedResult{i, reports[i].iteration_time_s / fit_scale(space, candidates[i]), std::move(reports[i])});
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(),
                   [](const RankedResult& a, const RankedResult& b) { return a.rank_time_s < b.rank_time_s; });
  if (space.spec.top_k >= 0 && res.ranked.size() > static_cast<std::size_t>(space.spec.top_k)) {
    res.ranked.resize(static_cast<std::size_t>(space.spec.top_k));
  }
  return res;
}

// `bound` (per candidate; empty: none): a candidate whose bound exceeds the cutoff, or is infinite (it cannot be
// feasible), is declined unevaluated.
SearchResult search_impl(const std::vector<Candidate>& candidates, const SearchSpace& space,
                         const std::vector<std::size_t>& order, bool prune, const BoundedEvaluator& evaluate,
                         const SearchProgressFn& progress, const std::vector<double>& bound = {}) {
  const std::size_t n = candidates.size();
  std::vector<RunReport> reports(n);
  const unsigned threads = search_threads(space, n);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<char> evaluated(n, 0);
  auto evaluate_one = [&](std::size_t i, double cutoff_s) {
    std::optional<RunReport> r = evaluate(candidates[i].plan, cutoff_s);
    if (!r) return false;
    reports[i] = std::move(*r);
    reports[i].method_fwd = candidates[i].method_fwd;
    reports[i].method_bwd = candidates[i].method_bwd;
    evaluated[i] = 1;
    return true;
  };
  // Every evaluation is offered the cutoff, even where a long run of them finished: the native engine's in-flight
  // checks (tails, the links' owed work) stop a run as soon as its chain or a link shows it cannot make it, which
  // pays for the bound's price (an earlier rule stopped offering after 64 finished runs in a row; on the 12,096-point
  // sweep offering always is 18% faster, Harmony-DP's near-ties 50 s -> 42 s: docs/history/benchmarks-journal.md,
  // "Stop 30").
  RoundedBest best(prune ? static_cast<std::size_t>(space.spec.top_k) : 0, n);
  SearchProgressTicker ticker(progress, n);
  parallel_for(n, threads, [&](std::size_t k) {
    const std::size_t i = order[k];
    std::optional<double> key;
    struct Done {  // the position is finished however this call ends (an evaluation may throw)
      RoundedBest& best;
      std::size_t k;
      std::optional<double>& key;
      bool prune;
      ~Done() {
        if (prune) best.finish(k, key);
      }
    } done{best, k, key, prune};
    const double threshold_s = prune ? best.threshold(k) * fit_scale(space, candidates[i]) : inf;
    // cannot enter the top_k (an infinite bound: cannot be feasible, cutoff or not): never evaluated here
    if (!bound.empty() && (bound[i] > threshold_s || bound[i] == inf)) {
      ticker.tick();
      return;
    }
    if (evaluate_one(i, threshold_s) && prune && !reports[i].deadlock && reports[i].feasible)
      key = reports[i].iteration_time_s / fit_scale(space, candidates[i]);
    ticker.tick();
  });
  ticker.finish();
  // The first miss in enumeration order: a candidate declined for an infinite bound before every evaluated miss is
  // evaluated after all, so its reason is the one the full search names (one run, however many were declined).
  const auto unfit = static_cast<std::size_t>(std::find(bound.begin(), bound.end(), inf) - bound.begin());
  if (unfit < bound.size()) {
    bool earlier_miss = false;
    for (std::size_t i = 0; i < unfit && !earlier_miss; ++i) earlier_miss = evaluated[i] && names_miss(reports[i]);
    if (!earlier_miss) evaluate_one(unfit, inf);
  }
  return rank_reports(candidates, space, reports, evaluated, bound);
}

}  // namespace

SearchResult run_search(const std::vector<Candidate>& candidates, const SearchSpace& space, const Evaluator& evaluate,
                        const SearchProgressFn& progress) {
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  return search_impl(
      candidates, space, order, false,
      [&](const Plan& p, double /*cutoff_s*/) { return std::optional<RunReport>(evaluate(p)); }, progress);
}

SearchResult run_search_bounded(const std::vector<Candidate>& candidates, const SearchSpace& space, const Model& model,
                                const BoundedEvaluator& evaluate, const SearchProgressFn& progress,
                                const PlanBound& bound) {
  const std::size_t n = candidates.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  const bool prune = space.spec.top_k >= 1 && n > static_cast<std::size_t>(space.spec.top_k);
  if (!prune) return search_impl(candidates, space, order, prune, evaluate, progress);
  std::vector<double> bounds;
  std::vector<double> estimates;
  if (bound) {
    bounds.resize(n);
    parallel_for(n, search_threads(space, n), [&](std::size_t i) { bounds[i] = bound(candidates[i].plan); });
  } else {
    estimates.resize(n);
    for (std::size_t i = 0; i < n; ++i) estimates[i] = compute_estimate_s(model, candidates[i], space);
  }
  const std::vector<double>& key = bound ? bounds : estimates;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  return search_impl(candidates, space, order, prune, evaluate, progress, bounds);
}

GrownSearch search_growing_bound(const Model& model, const SearchSpace& space, const SearchOnce& search) {
  GrownSearch g;
  g.space = space;
  g.configured_max_packs = max_pack_count(model, space);
  g.max_packs = g.configured_max_packs;
  g.candidates = space.kind->enumerate(model, g.space);
  g.result = search(g.candidates, g.space);
  const int layers = model.num_layers();
  while (g.result.ranked.empty() && g.result.num_gpu_memory_misses > 0 && space.kind->packs &&
         g.space.spec.pack_counts == PackCounts::Wide && g.max_packs < layers) {
    // packs_per_gpu > 0 here (0 is the layer count already); once its product reaches the layer count it is the
    // layer count (0), so the doubling cannot overflow
    const long long doubled = 2LL * g.space.spec.packs_per_gpu;
    g.space.spec.packs_per_gpu = doubled * g.space.gpus >= layers ? 0 : static_cast<int>(doubled);
    g.max_packs = max_pack_count(model, g.space);
    g.candidates = space.kind->enumerate(model, g.space);
    g.result = search(g.candidates, g.space);
    ++g.searches;
  }
  return g;
}

}  // namespace harmony::core
