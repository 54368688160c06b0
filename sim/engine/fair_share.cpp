// The native engine's fair-share solver: max-min fair rates by weighted progressive filling over the links the
// running flows use (sim/engine/fair_share_test.cpp checks hand-computed allocations).
#include "sim/engine/fair_share.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace harmony::sim {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

double coef_of(const FairFlow& f, std::size_t i) { return f.coef.empty() ? 1.0 : f.coef[i]; }

// A flow's rate with nothing else running: its cap, or each link's capacity over its coefficient, the smallest.
double alone_rate(std::span<const double> capacity, const FairFlow& x) {
  double r = x.cap > 0 ? x.cap : kInf;
  for (std::size_t i = 0; i < x.path.size(); ++i) {
    r = std::min(r, capacity[static_cast<std::size_t>(x.path[i])] / coef_of(x, i));
  }
  return r;
}
}  // namespace

const std::vector<double>& FairShareSolver::rates(std::span<const double> capacity, std::span<const FairFlow> flows,
                                                  bool contention) {
  const std::size_t nf = flows.size();
  std::vector<double>& rate = rate_;
  rate.assign(nf, -1.0);
  if (!contention) {
    for (std::size_t f = 0; f < nf; ++f) rate[f] = alone_rate(capacity, flows[f]);
    return rate;
  }
  // weighted progressive filling: a flow at rate r uses coef x r of each link on its path; weight[l] is the
  // sum of the coefficients of the unfrozen flows on l, count[l] their number. Only the links some flow uses
  // (`used`) are visited: a machine has many links (every NVLink pair) and a step uses few.
  std::vector<double>& residual = residual_;
  std::vector<int>& count = count_;
  std::vector<double>& weight = weight_;
  std::vector<std::size_t>& used = used_;
  if (count.size() != capacity.size()) {
    residual.assign(capacity.size(), 0.0);
    count.assign(capacity.size(), 0);
    weight.assign(capacity.size(), 0.0);
    used.clear();
  }
  for (const std::size_t l : used) {  // what the last call left
    count[l] = 0;
    weight[l] = 0.0;
  }
  used.clear();
  for (const FairFlow& x : flows) {
    for (std::size_t i = 0; i < x.path.size(); ++i) {
      const auto l = static_cast<std::size_t>(x.path[i]);
      if (!std::isfinite(capacity[l])) continue;
      if (count[l]++ == 0) {
        used.push_back(l);
        residual[l] = capacity[l];
      }
      weight[l] += coef_of(x, i);
    }
  }
  std::size_t unfrozen = nf;
  std::vector<char>& bottleneck = bottleneck_;
  bottleneck.assign(capacity.size(), 0);
  while (unfrozen > 0) {
    double best = kInf;
    for (const std::size_t l : used) {
      if (count[l] > 0) best = std::min(best, std::max(0.0, residual[l]) / weight[l]);
    }
    for (std::size_t f = 0; f < nf; ++f) {
      if (rate[f] < 0 && flows[f].cap > 0) best = std::min(best, flows[f].cap);
    }
    if (!std::isfinite(best)) {
      for (auto& r : rate) {
        if (r < 0) r = kInf;
      }
      break;
    }
    for (const std::size_t l : used) bottleneck[l] = count[l] > 0 && std::max(0.0, residual[l]) / weight[l] <= best;
    std::vector<std::size_t>& frozen = frozen_;
    frozen.clear();
    for (std::size_t f = 0; f < nf; ++f) {
      if (rate[f] >= 0) continue;
      const FairFlow& x = flows[f];
      bool freeze = x.cap > 0 && x.cap <= best;
      for (int l : x.path) freeze = freeze || bottleneck[static_cast<std::size_t>(l)];
      if (freeze) frozen.push_back(f);
    }
    for (std::size_t f : frozen) {
      rate[f] = best;
      --unfrozen;
      const FairFlow& x = flows[f];
      for (std::size_t i = 0; i < x.path.size(); ++i) {
        const auto l = static_cast<std::size_t>(x.path[i]);
        if (!std::isfinite(capacity[l])) continue;
        residual[l] -= best * coef_of(x, i);
        weight[l] -= coef_of(x, i);
        if (--count[l] == 0) weight[l] = 0;
      }
    }
  }
  return rate;
}

}  // namespace harmony::sim
