// The plan rules (core/plan/plan_rules): per kind, which (gpus, minibatch, microbatch) combinations pass, the
// problem each failing one gets (field, message, hint, valid values), and that the search's filter
// (microbatch_fits) agrees with the errors (microbatch_problem) on every combination of a small grid.
#include <doctest/doctest.h>

#include <string>

#include "core/plan/plan.hpp"
#include "core/plan/plan_rules.hpp"

using namespace harmony::core;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("sizes: gpus and minibatch at least 1, u at least 1") {
  CHECK_FALSE(size_problem(1, 1));
  const auto g = size_problem(0, 8);
  REQUIRE(g);
  CHECK(g->field == PlanField::Gpus);
  CHECK(g->message == "gpus = 0 must be at least 1");
  const auto d = size_problem(2, 0);
  REQUIRE(d);
  CHECK(d->field == PlanField::Minibatch);
  const auto u = microbatch_problem(plan_kind("harmony-pp"), 1, 8, 0, "plan.u_fwd");
  REQUIRE(u);
  CHECK(u->message == "plan.u_fwd = 0 must be at least 1");
  CHECK_FALSE(positive_microbatch_problem(1));
}

TEST_CASE("split: harmony-dp needs a sample per GPU, the data-parallel baselines an even split") {
  CHECK_FALSE(split_problem(plan_kind("harmony-dp"), 3, 32));  // shares 11 11 10: unequal is fine for Harmony
  const auto dp = split_problem(plan_kind("harmony-dp"), 4, 2);
  REQUIRE(dp);
  CHECK(dp->field == PlanField::Minibatch);
  CHECK(contains(dp->message, "no samples"));
  CHECK(contains(dp->hint, "at least 4"));
  for (PlanKind k : {plan_kind("dp-swap"), plan_kind("zero-infinity"), plan_kind("l2l"), plan_kind("lohan")}) {
    const auto p = split_problem(k, 3, 32);
    REQUIRE(p);
    CHECK(p->field == PlanField::Gpus);
    CHECK(p->message ==
          std::string(plan_kind_name(k)) + " splits the minibatch evenly: 3 GPUs do not divide minibatch 32");
    CHECK(p->valid_values == std::vector<int>{1, 2, 4, 8, 16, 32});
    CHECK_FALSE(split_problem(k, 4, 32));
  }
  // every stage sees every sample: no split rule
  CHECK_FALSE(split_problem(plan_kind("harmony-pp"), 3, 32));
  CHECK_FALSE(split_problem(plan_kind("pp-swap"), 3, 2));
}

TEST_CASE("stages: pp-swap needs a layer per GPU; the others have no such rule") {
  const auto p = stage_problem(plan_kind("pp-swap"), 5, 4);
  REQUIRE(p);
  CHECK(p->field == PlanField::Gpus);
  CHECK(p->message == "pp-swap needs a layer per stage: 5 GPUs for 4 layers");
  CHECK_FALSE(stage_problem(plan_kind("pp-swap"), 4, 4));
  CHECK_FALSE(stage_problem(plan_kind("harmony-pp"), 5, 4));
  CHECK_FALSE(stage_problem(plan_kind("dp-swap"), 5, 4));
}

TEST_CASE("microbatch: harmony-pp and pp-swap divide D, data-parallel kinds every share, lohan is the share") {
  const auto pp = microbatch_problem(plan_kind("harmony-pp"), 2, 32, 7, "plan.u_fwd", UnequalMicrobatches::Offered);
  REQUIRE(pp);
  CHECK(pp->message ==
        "plan.u_fwd = 7 does not divide minibatch 32: harmony-pp needs D % u == 0 so that all microbatches are equal");
  CHECK(pp->valid_values == std::vector<int>{1, 2, 4, 8, 16, 32});
  CHECK(contains(pp->hint, "sizes that divide: 1, 2, 4, 8, 16, 32"));
  CHECK(contains(pp->hint, "unequal_microbatches"));
  // refused (the runtime's rule, and always for baselines): no escape offered
  const auto run = microbatch_problem(plan_kind("harmony-pp"), 2, 32, 7, "plan.u_fwd", UnequalMicrobatches::Refused);
  REQUIRE(run);
  CHECK_FALSE(contains(run->hint, "unequal_microbatches"));
  const auto pps = microbatch_problem(plan_kind("pp-swap"), 2, 32, 7, "microbatch", UnequalMicrobatches::Offered);
  REQUIRE(pps);
  CHECK(contains(pps->message, "pp-swap needs D % u == 0"));
  CHECK_FALSE(contains(pps->hint, "unequal_microbatches"));

  const auto dp = microbatch_problem(plan_kind("harmony-dp"), 2, 36, 4);
  REQUIRE(dp);
  CHECK(contains(dp->message, "does not divide every GPU's share of minibatch 36: harmony-dp over 2 GPUs gives 18"));
  CHECK(dp->valid_values == std::vector<int>{1, 2, 3, 6, 9, 18});
  const auto uneven = microbatch_problem(plan_kind("harmony-dp"), 3, 32, 2, "u", UnequalMicrobatches::Offered);
  REQUIRE(uneven);
  CHECK(contains(uneven->message, "11 or 10"));
  CHECK(contains(uneven->hint, "multiple of gpus (3)"));
  CHECK(uneven->valid_values == std::vector<int>{1});
  const auto swap = microbatch_problem(plan_kind("dp-swap"), 2, 12, 4);
  REQUIRE(swap);
  CHECK(contains(swap->message, "dp-swap over 2 GPUs gives 6 samples per GPU"));
  CHECK(swap->valid_values == std::vector<int>{1, 2, 3, 6});

  CHECK_FALSE(microbatch_problem(plan_kind("lohan"), 2, 8, 4));
  const auto lo = microbatch_problem(plan_kind("lohan"), 2, 8, 2, "plan.u_bwd");
  REQUIRE(lo);
  CHECK(contains(lo->message, "plan.u_bwd = 2 is not the per-GPU share 4"));
  CHECK(contains(lo->message, "one microbatch"));
  CHECK(lo->valid_values == std::vector<int>{4});
  // a failed split is the microbatch rule's problem too
  const auto split = microbatch_problem(plan_kind("dp-swap"), 3, 32, 2);
  REQUIRE(split);
  CHECK(split->field == PlanField::Gpus);
}

TEST_CASE("unequal microbatches: Harmony modes only, up to the largest share") {
  CHECK_FALSE(microbatch_problem(plan_kind("harmony-pp"), 2, 32, 7, "u", UnequalMicrobatches::Allowed));
  CHECK_FALSE(microbatch_problem(plan_kind("harmony-dp"), 3, 32, 11, "u", UnequalMicrobatches::Allowed));
  const auto big = microbatch_problem(plan_kind("harmony-dp"), 3, 32, 12, "u", UnequalMicrobatches::Allowed);
  REQUIRE(big);
  CHECK(contains(big->message, "larger than a GPU's share (11)"));
  const auto pp = microbatch_problem(plan_kind("harmony-pp"), 2, 32, 64, "u", UnequalMicrobatches::Allowed);
  REQUIRE(pp);
  CHECK(contains(pp->message, "larger than minibatch 32"));
  // baselines never run unequal microbatches
  CHECK(microbatch_problem(plan_kind("dp-swap"), 2, 32, 5, "u", UnequalMicrobatches::Allowed));
}

TEST_CASE("microbatch_fits agrees with microbatch_problem, and with the shares, on a grid") {
  for (PlanKind k : {plan_kind("harmony-pp"), plan_kind("harmony-dp"), plan_kind("dp-swap"), plan_kind("pp-swap"),
                     plan_kind("zero-infinity"), plan_kind("l2l"), plan_kind("lohan")})
    for (UnequalMicrobatches m :
         {UnequalMicrobatches::Refused, UnequalMicrobatches::Offered, UnequalMicrobatches::Allowed})
      for (int n = 1; n <= 5; ++n)
        for (int d = 1; d <= 24; ++d)
          for (int u = 0; u <= 26; ++u) {
            const bool fits = microbatch_fits(k, n, d, u, m);
            CHECK(fits == !microbatch_problem(k, n, d, u, "u", m).has_value());
            // the rule restated: the split, then equal microbatches (or unequal for Harmony when allowed)
            bool expect = u >= 1;
            if (k->data_parallel && d < n) expect = false;
            if (k->even_split && d % n) expect = false;
            if (expect) {
              const auto shares = minibatch_shares(k, d, n);
              const bool unequal = k->unequal_microbatches && m == UnequalMicrobatches::Allowed;
              for (int s : shares) {
                if (unequal) continue;
                if (k->one_microbatch ? s != u : s % u != 0) expect = false;
              }
              if (unequal && u > shares.front()) expect = false;  // the first share is the largest
            }
            CHECK(fits == expect);
          }
}

TEST_CASE("plan_problems: the split alone, else one problem per microbatch that breaks a rule") {
  CHECK(plan_problems(plan_kind("harmony-pp"), 2, 32, {{"u_fwd", 8}, {"u_bwd", 4}}).empty());
  const auto two = plan_problems(plan_kind("harmony-pp"), 2, 32, {{"u_fwd", 7}, {"u_bwd", 5}});
  REQUIRE(two.size() == 2);
  CHECK(contains(two[1].message, "u_bwd = 5"));
  const auto split = plan_problems(plan_kind("l2l"), 3, 32, {{"u", 7}});
  REQUIRE(split.size() == 1);
  CHECK(split[0].field == PlanField::Gpus);
}
