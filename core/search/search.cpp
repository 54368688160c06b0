// Candidate enumeration (the paper's searcher.search) and the parallel, deterministic ranking.
#include "core/search/search.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "core/plan/packing.hpp"

namespace harmony::core {

std::vector<int> candidate_ubatch_sizes(const Model& model, Phase phase, const SearchSpace& space) {
  const int dlim = space.mode == Mode::HarmonyPP ? space.minibatch : space.minibatch / space.gpus;
  std::vector<int> shares;  // every GPU's share of the minibatch
  if (space.mode == Mode::HarmonyPP) {
    shares.push_back(space.minibatch);
  } else {
    for (int n = 0; n < space.gpus; ++n)
      shares.push_back(space.minibatch / space.gpus + (n < space.minibatch % space.gpus ? 1 : 0));
  }
  auto ok = [&](int u) {
    if (!model.ubatch_in_range(phase, u) || u > dlim) return false;
    if (space.unequal_microbatches) return true;
    return std::all_of(shares.begin(), shares.end(), [u](int dd) { return dd % u == 0; });
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

std::vector<Candidate> enumerate_candidates(const Model& model, const SearchSpace& space) {
  const int R = model.num_layers();
  const auto ub_bwd = candidate_ubatch_sizes(model, Phase::Bwd, space);
  const auto ub_fwd = candidate_ubatch_sizes(model, Phase::Fwd, space);
  std::vector<Candidate> out;
  for (int u_bwd : ub_bwd) {
    for (const auto& mb : space.spec.packing_bwd) {
      auto pb = find_packs(model, Phase::Bwd, mb, u_bwd, R, space.capacity_bytes);
      if (!pb) continue;
      if (pb->size() == 1) {
        out.push_back(Candidate{u_bwd, {}, "", u_bwd, *pb, mb});
        continue;
      }
      const int r_fwd = pb->back().first;
      const Packs reuse(pb->begin(), pb->end() - 1);
      for (int u_fwd : ub_fwd) {
        if (u_fwd < u_bwd && !space.spec.smaller_ufwd) continue;
        for (const auto& mf : space.spec.packing_fwd) {
          auto pf = find_packs(model, Phase::Fwd, mf, u_fwd, r_fwd, space.capacity_bytes, &reuse);
          if (!pf) continue;
          out.push_back(Candidate{u_fwd, *pf, mf, u_bwd, *pb, mb});
        }
      }
    }
  }
  return out;
}

Plan candidate_plan(const Candidate& c, const SearchSpace& space) {
  Plan p;
  p.mode = space.mode;
  p.gpus = space.gpus;
  p.minibatch = space.minibatch;
  p.u_fwd = c.u_fwd;
  p.u_bwd = c.u_bwd;
  p.packs_fwd = c.packs_fwd;
  p.packs_bwd = c.packs_bwd;
  return p;
}

SearchResult run_search(const std::vector<Candidate>& candidates, const SearchSpace& space, const Evaluator& evaluate,
                        const SearchProgressFn& progress) {
  SearchResult res;
  res.num_candidates = candidates.size();
  std::vector<RunReport> reports(candidates.size());
  unsigned threads =
      space.spec.threads > 0 ? static_cast<unsigned>(space.spec.threads) : std::thread::hardware_concurrency();
  // Starting threads costs more than a few dozen candidates take to simulate.
  constexpr std::size_t kMinCandidatesPerThread = 32;
  threads =
      std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(candidates.size() / kMinCandidatesPerThread)));
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  SearchProgressTicker ticker(progress, candidates.size());
  auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= candidates.size() || failed.load()) return;
      try {
        reports[i] = evaluate(candidate_plan(candidates[i], space));
        reports[i].method_fwd = candidates[i].method_fwd;
        reports[i].method_bwd = candidates[i].method_bwd;
        ticker.tick();
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
        return;
      }
    }
  };
  if (threads <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  ticker.finish();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (reports[i].deadlock) {
      ++res.num_deadlocked;
      continue;
    }
    if (!reports[i].feasible) {
      ++res.num_infeasible;
      continue;
    }
    double key = reports[i].iteration_time_s;
    if (space.spec.fit_rule && candidates[i].packs_bwd.size() == 1) key /= 1000.0;
    res.ranked.push_back(RankedResult{i, key, std::move(reports[i])});
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(),
                   [](const RankedResult& a, const RankedResult& b) { return a.rank_time_s < b.rank_time_s; });
  if (space.spec.top_k >= 0 && res.ranked.size() > static_cast<std::size_t>(space.spec.top_k)) {
    res.ranked.resize(static_cast<std::size_t>(space.spec.top_k));
  }
  return res;
}

}  // namespace harmony::core
