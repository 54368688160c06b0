// The native engine's fair-share solver: the max-min fair rates of fluid flows over shared links, by weighted
// progressive filling (each flow uses coef x its rate of every link on its path, and may have a rate cap of its
// own). Knows nothing of ops or activities: the engine hands it each running flow's path, coefficients and cap.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace harmony::sim {

// One running flow as the solver sees it.
struct FairFlow {
  std::span<const int> path;     // the links it crosses (indices into the capacities)
  std::span<const double> coef;  // per path link, what one unit of its rate uses of it; empty: 1 each
  double cap = 0;                // its own rate limit; <= 0: none
};

// Max-min fair rates, with working buffers reused from call to call (the engine solves at every rate change).
class FairShareSolver {
 public:
  // Per flow (indexed like `flows`), its rate. `capacity`: per link, what it carries per second; an infinite one
  // is not shared (never a bottleneck). With `contention`, progressive filling: raise every unfrozen flow's rate
  // together until a link is full or a flow reaches its cap, freeze the flows that hit it, repeat with what is
  // left; a flow nothing bounds gets an infinite rate. Without, each flow runs alone: the smallest of its cap and
  // each link's capacity over its coefficient. The reference stays valid until the next call.
  const std::vector<double>& rates(std::span<const double> capacity, std::span<const FairFlow> flows, bool contention);

 private:
  std::vector<double> rate_, residual_, weight_;
  std::vector<int> count_;
  std::vector<char> bottleneck_;
  std::vector<std::size_t> frozen_, used_;
};

}  // namespace harmony::sim
