// The 42 fixed configurations the paper's own simulator ran on bert_large
// (tests/data/reference/oracles_bert_large.json): iteration time and per-GPU end times within 1e-6
// relative, the memory estimate exact to the byte, idle and compute ratios within 1e-6.
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/model/profile.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using harmony::test::source_dir;

TEST_CASE("all 42 reference oracles reproduce") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  std::ifstream in(source_dir() + "/tests/data/reference/oracles_bert_large.json");
  REQUIRE(in.good());
  const auto oracles = nlohmann::json::parse(in);
  REQUIRE(oracles.size() == 42);
  const core::MachineSpec machine;  // the paper's constants are the defaults
  int n = 0;
  for (const auto& o : oracles) {
    core::Plan plan;
    plan.kind = o["mode"] == "vPP" ? core::plan_kind("harmony-pp") : core::plan_kind("harmony-dp");
    plan.gpus = o["N"];
    plan.minibatch = o["D"];
    plan.u_fwd = o["u_fwd"];
    plan.u_bwd = o["u_bwd"];
    core::manual_packs(model.num_layers(), o["packsize"], plan.packs_fwd, plan.packs_bwd);
    CAPTURE(o.dump());
    // the oracle lists pack sizes: the manual packing must give the same shapes
    REQUIRE(plan.packs_fwd.size() == o["pack_fwd_sizes"].size());
    REQUIRE(plan.packs_bwd.size() == o["pack_bwd_sizes"].size());
    for (std::size_t k = 0; k < plan.packs_bwd.size(); ++k)
      CHECK(plan.packs_bwd[k].size() == o["pack_bwd_sizes"][k].get<int>());
    core::LowerOptions opt;
    opt.prefetch = o["prefetch_offload"];
    const auto e = sim::evaluate_plan(model, machine, plan, opt);
    const auto& r = e.report;
    CHECK(e.program.graph.last_fwd_msg == o["last_fwd_msg"].get<bool>());
    CHECK(r.iteration_time_s == doctest::Approx(o["global_endtime"].get<double>()).epsilon(1e-6));
    REQUIRE(r.per_gpu.size() == o["per_rank_endtime"].size());
    for (std::size_t k = 0; k < r.per_gpu.size(); ++k) {
      CHECK(r.per_gpu[k].end_time_s == doctest::Approx(o["per_rank_endtime"][k].get<double>()).epsilon(1e-6));
      CHECK(static_cast<double>(r.per_gpu[k].peak_memory_bytes) == o["per_rank_memory"][k].get<double>());
    }
    CHECK(static_cast<double>(r.peak_memory_bytes) == o["global_memory"].get<double>());
    CHECK(r.max_end_idle == doctest::Approx(o["max_endidle"].get<double>()).epsilon(1e-6));
    CHECK(r.avg_end_idle == doctest::Approx(o["avg_endidle"].get<double>()).epsilon(1e-6));
    CHECK(r.compute_to_global == doctest::Approx(o["avg_compute_to_globaltime"].get<double>()).epsilon(1e-6));
    CHECK(r.compute_to_rank == doctest::Approx(o["avg_compute_to_ranktime"].get<double>()).epsilon(1e-6));
    ++n;
  }
  CHECK(n == 42);
}
