// The native engine's fair-share solver (sim/engine/fair_share.hpp) on its own: max-min fair allocations computed by
// hand in each case (one link split, a flow bottlenecked elsewhere, three flows over two links, rate caps,
// coefficients, unlimited links, no contention) and the solver's buffers reused across calls of different shapes.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "sim/engine/fair_share.hpp"

using harmony::sim::FairFlow;
using harmony::sim::FairShareSolver;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A flow over `path` (coefficients `coef`, empty: 1 each) with rate cap `cap` (<= 0: none). The vectors must outlive
// the solve: FairFlow holds spans.
FairFlow flow(const std::vector<int>& path, double cap = 0, const std::vector<double>& coef = {}) {
  return FairFlow{path, coef, cap};
}

std::vector<double> solve(const std::vector<double>& capacity, const std::vector<FairFlow>& flows,
                          bool contention = true) {
  FairShareSolver solver;
  return solver.rates(capacity, flows, contention);
}

}  // namespace

TEST_CASE("two flows on one link split it evenly") {
  const std::vector<int> l0{0};
  const auto r = solve({10.0}, {flow(l0), flow(l0)});
  REQUIRE(r.size() == 2);
  CHECK(r[0] == doctest::Approx(5.0));
  CHECK(r[1] == doctest::Approx(5.0));
}

TEST_CASE("a flow bottlenecked elsewhere leaves the rest of the shared link to the other") {
  // link 0: 10 shared by both; link 1: 2, flow 0 only. Flow 0 is held to 2 by link 1, so flow 1 gets 10 - 2 = 8
  // (an even split of link 0 would give it 5; a proportional one 5 too).
  const std::vector<int> both{0, 1};
  const std::vector<int> l0{0};
  const auto r = solve({10.0, 2.0}, {flow(both), flow(l0)});
  CHECK(r[0] == doctest::Approx(2.0));
  CHECK(r[1] == doctest::Approx(8.0));
}

TEST_CASE("three flows over two links: progressive filling") {
  // flow 0 crosses links 0 (6) and 1 (10); flow 1 uses link 0, flow 2 link 1. Raising all together, link 0 fills
  // first at 3 each (6 / 2, against 10 / 2 = 5 on link 1): flows 0 and 1 freeze at 3; link 1 has 10 - 3 = 7 left,
  // all flow 2's.
  const std::vector<int> l01{0, 1};
  const std::vector<int> l0{0};
  const std::vector<int> l1{1};
  const auto r = solve({6.0, 10.0}, {flow(l01), flow(l0), flow(l1)});
  CHECK(r[0] == doctest::Approx(3.0));
  CHECK(r[1] == doctest::Approx(3.0));
  CHECK(r[2] == doctest::Approx(7.0));
}

TEST_CASE("a flow's own cap freezes it and the others share what it leaves") {
  // link 0: 10; flow 0 capped at 1; flows 1 and 2 uncapped: 1, then (10 - 1) / 2 = 4.5 each
  const std::vector<int> l0{0};
  const auto r = solve({10.0}, {flow(l0, 1.0), flow(l0), flow(l0)});
  CHECK(r[0] == doctest::Approx(1.0));
  CHECK(r[1] == doctest::Approx(4.5));
  CHECK(r[2] == doctest::Approx(4.5));
}

TEST_CASE("coefficients: a flow using a link twice per unit of rate") {
  // link 0: 12; flow 0 uses 2 per unit, flow 1 uses 1: one rate r for both with 2r + r = 12, so r = 4 (flow 0 uses 8
  // of the link, flow 1 uses 4)
  const std::vector<int> l0{0};
  const std::vector<double> two{2.0};
  const auto r = solve({12.0}, {flow(l0, 0, two), flow(l0)});
  CHECK(r[0] == doctest::Approx(4.0));
  CHECK(r[1] == doctest::Approx(4.0));
  // once flow 1 is held to 2 elsewhere (link 1), flow 0 takes the rest: (12 - 2) / 2 = 5
  const std::vector<int> l01{0, 1};
  const auto s = solve({12.0, 2.0}, {flow(l0, 0, two), flow(l01)});
  CHECK(s[0] == doctest::Approx(5.0));
  CHECK(s[1] == doctest::Approx(2.0));
}

TEST_CASE("unlimited links are never a bottleneck") {
  // link 0 unlimited, link 1: 4. Flow 0 only on the unlimited link and uncapped: infinite; flow 1 capped at 3 there:
  // 3; flow 2 crosses both: link 1 is all its own, 4.
  const std::vector<int> l0{0};
  const std::vector<int> l01{0, 1};
  const auto r = solve({kInf, 4.0}, {flow(l0), flow(l0, 3.0), flow(l01)});
  CHECK(r[0] == kInf);
  CHECK(r[1] == doctest::Approx(3.0));
  CHECK(r[2] == doctest::Approx(4.0));
}

TEST_CASE("without contention every flow runs alone") {
  // each flow gets its path's bottleneck over its coefficient, capped by its own limit, whatever else runs
  const std::vector<int> l0{0};
  const std::vector<int> l01{0, 1};
  const std::vector<double> two_one{2.0, 1.0};
  const auto r = solve({10.0, 4.0}, {flow(l0), flow(l0), flow(l01), flow(l01, 0, two_one), flow(l0, 3.0)}, false);
  CHECK(r[0] == doctest::Approx(10.0));
  CHECK(r[1] == doctest::Approx(10.0));
  CHECK(r[2] == doctest::Approx(4.0));
  CHECK(r[3] == doctest::Approx(4.0));  // min(10 / 2, 4 / 1)
  CHECK(r[4] == doctest::Approx(3.0));
}

TEST_CASE("one solver, calls of different shapes: nothing left over from the last call") {
  FairShareSolver solver;
  const std::vector<int> l01{0, 1};
  const std::vector<int> l0{0};
  const std::vector<int> l1{1};
  const std::vector<int> l2{2};
  {
    const std::vector<FairFlow> flows{flow(l01), flow(l0), flow(l1)};
    const auto& r = solver.rates(std::vector<double>{6.0, 10.0}, flows, true);
    CHECK(r[2] == doctest::Approx(7.0));
  }
  {
    // link 1 alone now, with one flow: all 10 of it (a count or weight left from the call above would halve it)
    const std::vector<FairFlow> flows{flow(l1)};
    const auto& r = solver.rates(std::vector<double>{6.0, 10.0}, flows, true);
    REQUIRE(r.size() == 1);
    CHECK(r[0] == doctest::Approx(10.0));
  }
  {
    // more links than before: two flows on the new link 2 split it
    const std::vector<FairFlow> flows{flow(l2), flow(l2), flow(l0)};
    const auto& r = solver.rates(std::vector<double>{6.0, 10.0, 8.0}, flows, true);
    CHECK(r[0] == doctest::Approx(4.0));
    CHECK(r[1] == doctest::Approx(4.0));
    CHECK(r[2] == doctest::Approx(6.0));
  }
}

TEST_CASE("max-min fairness: no link is over capacity and every flow has a saturated link it gets the most of") {
  // four flows over three links; the allocation by hand: link 1 (3) shared by flows 1 and 2 fills first at 1.5;
  // link 0 (8) then has 8 - 1.5 = 6.5 for flows 0 and 3: 3.25 each (link 2, 20, carries flows 0 and 3: 6.5 < 20).
  const std::vector<int> f0{0, 2};
  const std::vector<int> f1{0, 1};
  const std::vector<int> f2{1};
  const std::vector<int> f3{0, 2};
  const std::vector<double> capacity{8.0, 3.0, 20.0};
  const std::vector<FairFlow> flows{flow(f0), flow(f1), flow(f2), flow(f3)};
  const auto r = solve(capacity, flows);
  CHECK(r[0] == doctest::Approx(3.25));
  CHECK(r[1] == doctest::Approx(1.5));
  CHECK(r[2] == doctest::Approx(1.5));
  CHECK(r[3] == doctest::Approx(3.25));
  std::vector<double> load(capacity.size(), 0.0);
  for (std::size_t f = 0; f < flows.size(); ++f) {
    for (const int l : flows[f].path) load[static_cast<std::size_t>(l)] += r[f];
  }
  for (std::size_t l = 0; l < capacity.size(); ++l) CHECK(load[l] <= capacity[l] * (1 + 1e-12));
}
