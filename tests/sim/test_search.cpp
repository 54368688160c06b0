// The search against the paper's scheduler outputs on bert_large (README of the reference data):
// the three published Top1 configurations, the candidate count, the opt-in "/1000" fit rule, and
// determinism of the ranking across thread counts.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "core/model/profile.hpp"
#include "core/search/search.hpp"
#include "sim/evaluate.hpp"

using namespace harmony;

namespace {
std::string root() {
  const char* r = std::getenv("HARMONY_SOURCE_DIR");
  return r ? r : ".";
}
const core::Model& bert() {
  static const core::Model m = core::load_profile(root() + "/configs/profiles/bert_large.json");
  return m;
}

core::SearchResult search(core::Mode mode, std::vector<std::string> fwd, std::vector<std::string> bwd,
                          bool fit_rule = false, int threads = 0, int top_k = 5) {
  core::SearchSpace s;
  s.mode = mode;
  s.gpus = 2;
  s.minibatch = 32;
  s.capacity_bytes = 10 * core::kGiB;
  s.spec.packing_fwd = std::move(fwd);
  s.spec.packing_bwd = std::move(bwd);
  s.spec.fit_rule = fit_rule;
  s.spec.threads = threads;
  s.spec.top_k = top_k;
  const core::MachineSpec machine;
  const auto cands = core::enumerate_candidates(bert(), s);
  return core::run_search(cands, s, [&](const core::Plan& p) {
    return sim::evaluate_plan(bert(), machine, p, core::LowerOptions{}).report;
  });
}

const std::vector<std::string> kDefaultFwd{"greedy_reverse_addx", "balanced_addx", "reuse", "balanced_time"};
const std::vector<std::string> kDefaultBwd{"greedy_reverse_addx", "balanced_addx", "balanced_time"};

double mb(core::Bytes b) { return static_cast<double>(b) / 1024.0 / 1024.0; }
}  // namespace

TEST_CASE("D32 N2 harmony-pp, default methods: Top1 4.399 s, u 8/8, 121 candidates") {
  const auto r = search(core::Mode::HarmonyPP, kDefaultFwd, kDefaultBwd);
  CHECK(r.num_candidates == 121);  // the paper's scheduler evaluates 121 candidates here
  REQUIRE(!r.ranked.empty());
  const auto& top = r.ranked.front().report;
  CHECK(top.iteration_time_s == doctest::Approx(4.399).epsilon(0.0005 / 4.399));
  CHECK(top.plan.u_fwd == 8);
  CHECK(top.plan.u_bwd == 8);
  CHECK(top.plan.packs_fwd == core::Packs{{0, 14}});
  CHECK(top.plan.packs_bwd == core::Packs{{0, 4}, {5, 14}, {15, 27}});
  CHECK(std::lround(mb(top.peak_memory_bytes)) == 10185);
  REQUIRE(top.per_gpu.size() == 2);
  CHECK(std::lround(mb(top.per_gpu[0].peak_memory_bytes)) == 10161);
  CHECK(std::lround(mb(top.per_gpu[1].peak_memory_bytes)) == 10185);
}

TEST_CASE("D32 N2 harmony-dp, default methods: Top1 4.608 s, u 16/4") {
  const auto r = search(core::Mode::HarmonyDP, kDefaultFwd, kDefaultBwd);
  REQUIRE(!r.ranked.empty());
  const auto& top = r.ranked.front().report;
  CHECK(top.iteration_time_s == doctest::Approx(4.608).epsilon(0.0005 / 4.608));
  CHECK(top.plan.u_fwd == 16);
  CHECK(top.plan.u_bwd == 4);
  CHECK(top.plan.packs_fwd == core::Packs{{0, 5}});
  CHECK(top.plan.packs_bwd == core::Packs{{0, 5}, {6, 27}});
  CHECK(std::lround(mb(top.peak_memory_bytes)) == 10242);
}

TEST_CASE("D32 N2 harmony-pp, balanced_time reuse / balanced_time: Top1 4.829 s, u 8/4") {
  const auto r = search(core::Mode::HarmonyPP, {"balanced_time", "reuse"}, {"balanced_time"});
  REQUIRE(!r.ranked.empty());
  const auto& top = r.ranked.front().report;
  CHECK(top.iteration_time_s == doctest::Approx(4.829).epsilon(0.0005 / 4.829));
  CHECK(top.plan.u_fwd == 8);
  CHECK(top.plan.u_bwd == 4);
  CHECK(top.plan.packs_fwd == core::Packs{{0, 11}});
  CHECK(top.plan.packs_bwd == core::Packs{{0, 11}, {12, 27}});
  CHECK(std::lround(mb(top.peak_memory_bytes)) == 7025);
}

TEST_CASE("the paper's fit rule (opt-in) makes the single-pack plan Top1: u 2, 10.114 s, 7474 MB") {
  const auto r = search(core::Mode::HarmonyPP, kDefaultFwd, kDefaultBwd, /*fit_rule=*/true);
  REQUIRE(!r.ranked.empty());
  const auto& top = r.ranked.front();
  CHECK(top.report.plan.packs_bwd.size() == 1);
  CHECK(top.report.plan.u_bwd == 2);
  CHECK(top.report.iteration_time_s == doctest::Approx(10.114).epsilon(0.0005 / 10.114));
  CHECK(top.rank_time_s == doctest::Approx(top.report.iteration_time_s / 1000.0));
  CHECK(std::lround(mb(top.report.peak_memory_bytes)) == 7474);
}

TEST_CASE("ranking is identical with 1 and 2 threads and keeps every candidate with top_k = -1") {
  const auto a = search(core::Mode::HarmonyPP, kDefaultFwd, kDefaultBwd, false, 1, -1);
  const auto b = search(core::Mode::HarmonyPP, kDefaultFwd, kDefaultBwd, false, 2, -1);
  REQUIRE(a.ranked.size() == b.ranked.size());
  CHECK(a.ranked.size() + a.num_deadlocked == a.num_candidates);
  for (std::size_t i = 0; i < a.ranked.size(); ++i) {
    CHECK(a.ranked[i].candidate == b.ranked[i].candidate);
    CHECK(a.ranked[i].report.iteration_time_s == b.ranked[i].report.iteration_time_s);
  }
  for (std::size_t i = 1; i < a.ranked.size(); ++i) CHECK(a.ranked[i - 1].rank_time_s <= a.ranked[i].rank_time_s);
}

TEST_CASE("run_search reports progress: throttled, monotonic, ending at done = total; same ranking") {
  core::SearchSpace s;
  s.mode = core::Mode::HarmonyPP;
  s.gpus = 2;
  s.minibatch = 32;
  s.capacity_bytes = 10 * core::kGiB;
  s.spec.threads = 4;
  const core::MachineSpec machine;
  const auto cands = core::enumerate_candidates(bert(), s);
  REQUIRE(cands.size() > 10);
  std::vector<core::SearchProgress> calls;  // the ticker makes one call at a time
  auto evaluate = [&](const core::Plan& p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // ~0.1 s of work in all: some calls before the end
    return sim::evaluate_plan(bert(), machine, p, core::LowerOptions{}).report;
  };
  const auto with = core::run_search(cands, s, evaluate, [&](const core::SearchProgress& p) { calls.push_back(p); });
  REQUIRE(!calls.empty());
  CHECK(calls.size() < cands.size());  // throttled, not one call per candidate
  CHECK(calls.back().done == cands.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].total == cands.size());
    if (i > 0) CHECK(calls[i - 1].done <= calls[i].done);
  }
  const auto without = core::run_search(cands, s, evaluate);
  REQUIRE(with.ranked.size() == without.ranked.size());
  for (std::size_t i = 0; i < with.ranked.size(); ++i) CHECK(with.ranked[i].candidate == without.ranked[i].candidate);
}
