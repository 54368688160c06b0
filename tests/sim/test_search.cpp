// The search against the paper's scheduler outputs on bert_large (README of the reference data):
// the three published Top1 configurations, the candidate count, the opt-in "/1000" fit rule, and
// determinism of the ranking across thread counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <tuple>

#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/analytic.hpp"
#include "core/model/profile.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using harmony::test::source_dir;

namespace {
const core::Model& bert() {
  static const core::Model m = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  return m;
}

core::SearchResult search(core::PlanKind mode, std::vector<std::string> fwd, std::vector<std::string> bwd,
                          bool fit_rule = false, int threads = 0, int top_k = 5) {
  core::SearchSpace s;
  s.kind = mode;
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
  const auto r = search(core::plan_kind("harmony-pp"), kDefaultFwd, kDefaultBwd);
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
  const auto r = search(core::plan_kind("harmony-dp"), kDefaultFwd, kDefaultBwd);
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
  const auto r = search(core::plan_kind("harmony-pp"), {"balanced_time", "reuse"}, {"balanced_time"});
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
  const auto r = search(core::plan_kind("harmony-pp"), kDefaultFwd, kDefaultBwd, /*fit_rule=*/true);
  REQUIRE(!r.ranked.empty());
  const auto& top = r.ranked.front();
  CHECK(top.report.plan.packs_bwd.size() == 1);
  CHECK(top.report.plan.u_bwd == 2);
  CHECK(top.report.iteration_time_s == doctest::Approx(10.114).epsilon(0.0005 / 10.114));
  CHECK(top.rank_time_s == doctest::Approx(top.report.iteration_time_s / 1000.0));
  CHECK(std::lround(mb(top.report.peak_memory_bytes)) == 7474);
}

TEST_CASE("the reference engine's task bound: below every run, and a bounded search ranks as the paper's") {
  // the paper's searches above (both kinds, its fit rule, prefetch on and off), top_k 1 and 5
  const core::MachineSpec machine;
  const auto engine = sim::make_engine(core::CostModelKind::Reference, bert(), machine);
  std::size_t declined = 0, checked = 0;
  for (const auto kind : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")}) {
    for (const bool prefetch : {false, true}) {
      for (const bool fit_rule : {false, true}) {
        CAPTURE(core::plan_kind_name(kind));
        CAPTURE(prefetch);
        CAPTURE(fit_rule);
        core::SearchSpace s;
        s.kind = kind;
        s.gpus = 2;
        s.minibatch = 32;
        s.capacity_bytes = 10 * core::kGiB;
        s.spec.packing_fwd = kDefaultFwd;
        s.spec.packing_bwd = kDefaultBwd;
        s.spec.fit_rule = fit_rule;
        s.spec.threads = 1;
        s.spec.top_k = -1;
        core::LowerOptions lower;
        lower.prefetch = prefetch;
        const auto cands = core::enumerate_candidates(bert(), s);
        const auto all = core::run_search(cands, s, [&](const core::Plan& p) {
          const auto r = sim::evaluate_plan(*engine, bert(), p, lower).report;
          if (!r.deadlock) {
            CHECK(sim::task_bound_for(*engine, bert(), p, lower) <= r.iteration_time_s);
            ++checked;
          }
          return r;
        });
        for (const int top_k : {1, 5}) {
          s.spec.top_k = top_k;
          const auto b = core::run_search_bounded(
              cands, s, bert(),
              [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
                auto e = sim::evaluate_plan_within(*engine, bert(), p, lower, cutoff_s);
                if (!e) return std::nullopt;
                return std::move(e->report);
              },
              {}, [&](const core::Plan& p) { return sim::task_bound_for(*engine, bert(), p, lower); });
          REQUIRE(b.ranked.size() == std::min<std::size_t>(all.ranked.size(), static_cast<std::size_t>(top_k)));
          for (std::size_t i = 0; i < b.ranked.size(); ++i) {
            CHECK(b.ranked[i].candidate == all.ranked[i].candidate);
            CHECK(b.ranked[i].rank_time_s == all.ranked[i].rank_time_s);
          }
          declined += b.num_pruned;
        }
      }
    }
  }
  CHECK(checked > 200);
  CHECK(declined > 0);
}

TEST_CASE("ranking is identical with 1 and 2 threads and keeps every candidate with top_k = -1") {
  const auto a = search(core::plan_kind("harmony-pp"), kDefaultFwd, kDefaultBwd, false, 1, -1);
  const auto b = search(core::plan_kind("harmony-pp"), kDefaultFwd, kDefaultBwd, false, 2, -1);
  REQUIRE(a.ranked.size() == b.ranked.size());
  CHECK(a.ranked.size() + a.num_deadlocked == a.num_candidates);
  for (std::size_t i = 0; i < a.ranked.size(); ++i) {
    CHECK(a.ranked[i].candidate == b.ranked[i].candidate);
    CHECK(a.ranked[i].report.iteration_time_s == b.ranked[i].report.iteration_time_s);
  }
  for (std::size_t i = 1; i < a.ranked.size(); ++i) CHECK(a.ranked[i - 1].rank_time_s <= a.ranked[i].rank_time_s);
}

TEST_CASE("enumerate_candidates takes kinds with packs only") {
  core::SearchSpace s;
  s.gpus = 2;
  s.minibatch = 32;
  for (core::PlanKind k : core::plan_kinds()) {
    if (k->packs) continue;
    s.kind = k;
    CHECK_THROWS_WITH_AS(core::enumerate_candidates(bert(), s), doctest::Contains("PlanKindSpec::enumerate"),
                         core::ScheduleError);
  }
}

TEST_CASE("run_search reports progress: throttled, monotonic, ending at done = total; same ranking") {
  core::SearchSpace s;
  s.kind = core::plan_kind("harmony-pp");
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

// ---------------------------------------------------------------------------------------------
// search.pack_counts: wide — pack counts beyond the paper's memory minimum.

namespace {

// Two layers, measured at u = 1 only: forward 1 ms each; forward-with-grad + backward 3 ms for layer 0 and 5 ms for
// layer 1 (a BWD op after its forward or recompute costs the difference); no weights, no update time, 1 byte of input
// per sample. Both layers fit one 1 MiB GPU together, so the paper's minimum is one pack. (Layer 1 is the slower one
// so that balanced_time's two-pack split cuts between them: numpy's searchsorted puts an exact half before layer 0.)
core::Model two_layers() {
  core::Model m;
  m.name = "two-layers";
  m.source = "test_search";
  m.ubatch_fwd = {1};
  m.ubatch_bwd = {1};
  for (int l = 0; l < 2; ++l) {
    core::Layer L;
    L.name = "L" + std::to_string(l);
    L.is_criterion = l == 1;
    L.input_bytes_per_sample = 1;
    L.fwd_time_s = {0.001};
    L.bwd_time_s = {l == 0 ? 0.003 : 0.005};
    L.fwd_peak_bytes = {100};
    L.bwd_peak_bytes = {200};
    m.layers.push_back(L);
  }
  m.validate();
  return m;
}

// Two GPUs behind one switch, links so fast (1e15 B/s) and latency-free that moving a byte costs ~1 fs, which the
// picosecond clock rounds away; frees cost 0.
core::MachineSpec fast_pair() {
  core::MachineSpec m;
  m.name = "fast-pair";
  m.gpus = 2;
  m.gpu_memory_bytes = core::kMiB;
  m.topology.switches = {{"sw0", 0, 1e15}};
  for (int g = 0; g < 2; ++g) m.topology.gpus.push_back(core::GpuSpec{0, 1e15, 1, 1});
  m.topology.transfer_latency_s = 0;
  m.topology.free_time_s = 0;
  m.topology.cpu_cores = 2;
  return m;
}

core::SearchSpace pair_space(core::PackCounts counts) {
  core::SearchSpace s;
  s.kind = core::plan_kind("harmony-pp");
  s.gpus = 2;
  s.minibatch = 4;
  s.capacity_bytes = core::kMiB;
  s.spec.packing_fwd = {"balanced_time", "reuse"};
  s.spec.packing_bwd = {"balanced_time"};
  s.spec.pack_counts = counts;
  s.spec.top_k = -1;
  return s;
}

core::SearchResult native_search(const core::Model& model, const core::MachineSpec& machine,
                                 const core::SearchSpace& space) {
  core::LowerOptions lower;
  lower.prefetch = true;
  return core::run_search(core::enumerate_candidates(model, space), space, [&](const core::Plan& p) {
    return sim::evaluate_plan(model, machine, p, lower, core::CostModelKind::Native).report;
  });
}

}  // namespace

TEST_CASE("wide pack counts: two layers on two GPUs, one pack per GPU beats the memory minimum (hand derivation)") {
  const core::Model model = two_layers();
  const core::MachineSpec machine = fast_pair();
  // D = 4, u = 1: four microbatches.
  // Minimum: Σm = (200 - 1) x 2 bytes fit 1 MiB, so S = 1: one pack [0-1] on GPU 0 runs each microbatch's forward and
  // backward, 3 + 5 = 8 ms: 4 x 8 ms = 32 ms; GPU 1 idles.
  const auto minimum = native_search(model, machine, pair_space(core::PackCounts::Minimum));
  REQUIRE(minimum.ranked.size() == 1);
  const auto& one = minimum.ranked.front().report;
  CHECK(one.plan.packs_bwd == core::Packs{{0, 1}});
  CHECK(one.iteration_time_s == doctest::Approx(0.032).epsilon(1e-9));

  // Wide (bound min(2 layers, 4 x 2 GPUs) = 2): balanced_time also offers S = 2 (time prefix [3, 8] ms, target 4 ms:
  // cut after layer 0), bwd [0] [1], fwd [0] (reuse and balanced_time give the same forward, searched once): 2
  // candidates.
  // GPU 0 runs the forward of layer 0: microbatch i (1..4) is done at i ms and goes to GPU 1 at once.
  // GPU 1 runs pack [1] (the last: forward 1 ms + backward 4 ms = 5 ms per microbatch) once it is free and microbatch
  //   i has arrived: 1-6, 6-11, 11-16, 16-21 ms; each gradient goes back to GPU 0 at once.
  // GPU 0, done with its forward at 4 ms, runs pack [0]'s backward: for microbatch i the recompute (1 ms) needs only
  //   the stashed input, the backward (3 - 1 = 2 ms) also the gradient: REC 4-5, BWD 6-8 (gradient at 6), REC 8-9,
  //   BWD 11-13, REC 13-14, BWD 16-18, REC 18-19, BWD 21-23 ms.
  // The iteration takes 23 ms (no updates, frees or transfers cost anything): 32/23 = 1.39x the minimum's speed.
  const auto wide = native_search(model, machine, pair_space(core::PackCounts::Wide));
  CHECK(wide.num_candidates == 2);
  REQUIRE(!wide.ranked.empty());
  const auto& best = wide.ranked.front().report;
  CHECK(best.plan.packs_bwd == core::Packs{{0, 0}, {1, 1}});
  CHECK(best.plan.packs_fwd == core::Packs{{0, 0}});
  CHECK(best.iteration_time_s == doctest::Approx(0.023).epsilon(1e-9));
  CHECK(best.plan.packs_bwd.size() > one.plan.packs_bwd.size());
  // the minimum's plan is still among the candidates, ranked second
  REQUIRE(wide.ranked.size() == 2);
  CHECK(wide.ranked[1].report.iteration_time_s == doctest::Approx(0.032).epsilon(1e-9));
}

TEST_CASE("wide pack counts: the paper's candidates come first and Minimum is the paper's search, untouched") {
  // bert_large, D32 N2, default methods. Minimum is the published search (121 candidates, Top1 4.399 s, checked
  // above); Wide keeps every distinct Minimum candidate and adds more, and the bound is min(layers, 4 x GPUs).
  core::SearchSpace s;
  s.kind = core::plan_kind("harmony-pp");
  s.gpus = 2;
  s.minibatch = 32;
  s.capacity_bytes = 10 * core::kGiB;
  s.spec.packing_fwd = kDefaultFwd;
  s.spec.packing_bwd = kDefaultBwd;
  const auto minimum = core::enumerate_candidates(bert(), s);
  CHECK(minimum.size() == 121);
  CHECK(s.spec.pack_counts == core::PackCounts::Minimum);  // the library default is the paper's
  s.spec.pack_counts = core::PackCounts::Wide;
  CHECK(core::max_pack_count(bert(), s) == 8);
  s.spec.packs_per_gpu = 0;
  CHECK(core::max_pack_count(bert(), s) == 28);
  s.spec.packs_per_gpu = 100;
  CHECK(core::max_pack_count(bert(), s) == 28);
  s.spec.packs_per_gpu = 4;
  const auto wide = core::enumerate_candidates(bert(), s);
  CHECK(wide.size() > minimum.size());
  auto same = [](const core::Candidate& ca, const core::Candidate& cb) {
    const core::Plan &a = ca.plan, &b = cb.plan;
    return a.u_fwd == b.u_fwd && a.u_bwd == b.u_bwd && a.packs_fwd == b.packs_fwd && a.packs_bwd == b.packs_bwd;
  };
  for (const auto& c : minimum)
    CHECK(std::any_of(wide.begin(), wide.end(), [&](const core::Candidate& w) { return same(w, c); }));
  std::size_t max_added = 0;
  for (const auto& c : wide) {
    CHECK(std::count_if(wide.begin(), wide.end(), [&](const core::Candidate& w) { return same(w, c); }) == 1);
    // beyond the paper's own backward packings (which may have more: 13 at u = 32), none has more than 8 packs
    if (std::none_of(minimum.begin(), minimum.end(), [&](const core::Candidate& m) {
          return m.plan.u_bwd == c.plan.u_bwd && m.plan.packs_bwd == c.plan.packs_bwd;
        }))
      max_added = std::max(max_added, c.plan.packs_bwd.size());
  }
  CHECK(max_added == 8);
}

namespace {
// One search space of `kind` on `gpus` GPUs, minibatch `minibatch`, wide pack counts, one thread.
core::SearchSpace wide_space(core::PlanKind kind, int gpus, int minibatch, const core::MachineSpec& m, int top_k) {
  core::SearchSpace s;
  s.kind = kind;
  s.gpus = gpus;
  s.minibatch = minibatch;
  s.capacity_bytes = m.search_capacity_bytes();
  s.spec.pack_counts = core::PackCounts::Wide;
  s.spec.threads = 1;
  s.spec.top_k = top_k;
  return s;
}
}  // namespace

TEST_CASE("branch and bound: the native bound never exceeds a run, and the bounded search ranks as the full one") {
  struct Case {
    const char* machine;
    const char* model;  // an analytic preset, or "" for bert_large's profile
    core::PlanKind kind;
    int gpus;
    int minibatch;
    core::Bytes memory = 0;  // the machine's GPU memory instead of the preset's (0: the preset's)
  };
  // GPU servers with PCIe trees, NVLink and host memory bandwidth; the CPU device's calibrated machine (host cores
  // shared by compute, copies, updates and dispatch); pipelines and replicas
  const std::vector<Case> cases{
      {"h100-sxm-8x", "gpt3-1.3b", core::plan_kind("harmony-pp"), 4, 8},
      {"h100-sxm-8x", "gpt3-1.3b", core::plan_kind("harmony-dp"), 2, 8},
      {"rtx4090-4x", "gpt3-1.3b", core::plan_kind("harmony-pp"), 2, 8},
      {"paper-1080ti", "", core::plan_kind("harmony-pp"), 2, 8},
      {"paper-1080ti", "", core::plan_kind("harmony-dp"), 2, 8},
      {"cpu-4x-calibrated", "", core::plan_kind("harmony-pp"), 2, 8, 10 * core::kGiB},
  };
  std::size_t pruned = 0, checked = 0, abandoned = 0;
  double pipeline_task = 0, pipeline_chain = 0;  // the bounds summed over the pipelines' candidates
  for (const auto& c : cases) {
    const std::string machine = c.machine;
    const std::string kind = core::plan_kind_name(c.kind);
    CAPTURE(machine);
    CAPTURE(kind);
    core::MachineSpec m = core::machine_preset(c.machine);
    if (c.memory > 0) m.gpu_memory_bytes = c.memory;
    const core::Model model =
        *c.model ? core::analytic_model(*core::analytic_preset(c.model), m.gpu_rates, m.cpu_adam) : bert();
    const auto engine = sim::make_engine(core::CostModelKind::Native, model, m);
    const core::LowerOptions lower;
    const auto space_all = wide_space(c.kind, c.gpus, c.minibatch, m, -1);
    const auto cands = core::enumerate_candidates(model, space_all);
    REQUIRE(cands.size() > 3);
    // every candidate: the bound is at most the run's iteration time
    for (const auto& cand : cands) {
      const core::Plan p = core::candidate_plan(cand, space_all);
      const core::Program program = sim::lower_plan_for(*engine, model, p, lower);
      const core::TimePs bound = sim::native_lower_bound_ps(program, model, m);
      // the task graph's bound, before lowering: the compute chain through queues and P2P channels
      const core::TimePs task_bound = sim::native_task_bound_ps(
          program.graph, core::lowered_ranks(program.graph, {.dp_first_gpu_only = false}), model, m);
      CHECK(sim::task_bound_for(*engine, model, p, lower) == core::ps_to_seconds(task_bound));
      const auto r = engine->run(program).report;
      if (r.deadlock) continue;
      CHECK(core::ps_to_seconds(bound) <= r.iteration_time_s);
      CHECK(bound > 0);
      CHECK(task_bound > 0);
      CHECK(task_bound <= bound);  // its edges and prices are a subset of the chain bound's
      if (c.kind == core::plan_kind("harmony-pp")) {
        pipeline_task += static_cast<double>(task_bound);
        pipeline_chain += static_cast<double>(bound);
      }
      // a run whose cutoff is its own iteration time is never abandoned, neither by the bound before it starts nor
      // by an op's tail while it runs (both are sound), and gives the full run's timeline; between the bound and
      // the iteration time a run is either abandoned or complete
      const auto whole = sim::run_native(program, model, m);
      const auto own = static_cast<core::TimePs>(std::floor(r.iteration_time_s * 1e12));
      const auto at_own = sim::run_native_within(program, model, m, {}, own);
      REQUIRE(at_own.has_value());
      CHECK(at_own->timeline.end_ps == whole.timeline.end_ps);
      const auto between = sim::run_native_within(program, model, m, {}, bound + (own - bound) / 2);
      if (between) {
        CHECK(between->timeline.end_ps == whole.timeline.end_ps);
      } else {
        ++abandoned;
      }
      CHECK_FALSE(sim::run_native_within(program, model, m, {}, bound / 2).has_value());  // declined before it runs
      ++checked;
    }
    auto full = [&](const core::Plan& p) { return sim::evaluate_plan(*engine, model, p, lower).report; };
    auto bounded = [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
      auto e = sim::evaluate_plan_within(*engine, model, p, lower, cutoff_s);
      if (!e) return std::nullopt;
      return std::move(e->report);
    };
    // every candidate ranked (top_k = -1): a top_k search's ranking is its first top_k
    const auto a = core::run_search(cands, space_all, full);
    CHECK(a.num_pruned == 0);
    const core::PlanBound task_bound = [&](const core::Plan& p) {
      return sim::task_bound_for(*engine, model, p, lower);
    };
    for (auto [top_k, threads, with_task_bound] :
         {std::tuple{1, 1, true}, std::tuple{3, 1, true}, std::tuple{1, 2, true}, std::tuple{1, 1, false}}) {
      CAPTURE(top_k);
      CAPTURE(threads);
      CAPTURE(with_task_bound);
      auto space = wide_space(c.kind, c.gpus, c.minibatch, m, top_k);
      space.spec.threads = threads;
      const auto b =
          core::run_search_bounded(cands, space, model, bounded, {}, with_task_bound ? task_bound : core::PlanBound{});
      REQUIRE(b.ranked.size() == std::min<std::size_t>(a.ranked.size(), static_cast<std::size_t>(top_k)));
      for (std::size_t i = 0; i < b.ranked.size(); ++i) {
        CHECK(a.ranked[i].candidate == b.ranked[i].candidate);
        CHECK(a.ranked[i].report.iteration_time_s == b.ranked[i].report.iteration_time_s);
      }
      CHECK(b.num_candidates == cands.size());
      CHECK(b.num_pruned + b.num_deadlocked + b.num_infeasible <= cands.size());
      pruned += b.num_pruned;
    }
  }
  CHECK(checked > 100);
  CHECK(pruned > 0);  // the bound does skip candidates (most of them on the pipelines here)
  MESSAGE(abandoned, " of ", checked, " runs abandoned in flight at a cutoff halfway from the bound to the time");
  CHECK(abandoned > 0);  // the tails do stop runs that cannot make the cutoff
  // the P2P edges carry the pipelines' fill and drain: 0.84 of the chain bound here, 0.70 from the queues alone
  CHECK(pipeline_task / pipeline_chain > 0.78);
}

TEST_CASE("the native task bound sees the CPU updates each pack waits for (Jackson on the shared pool), once a range") {
  // Harmony-DP on 2 and 4 GPUs of an H100 server, its CPU update made 20x slower so that it binds: the replicas'
  // Updates of a pack step one host master (core::update_owners: the lowest replica's, as harmony-run's executor
  // runs them; the others cost nothing), each pass alone taking the whole machine its profiled time. Before
  // lowering, the bound knows the updates cannot start before their BWD ends and cannot overlap: it is at least
  // one pass's work, and never above a run. The run pays one pass, not one per replica (before session 23 it paid
  // N, and so did the bound). The compute chain alone (the bound before session 17) falls short of it.
  core::MachineSpec m = core::machine_preset("h100-sxm-8x");
  m.compute.update_time_scale *= 20;
  const core::Model model = core::analytic_model(*core::analytic_preset("gpt3-1.3b"), m.gpu_rates, m.cpu_adam);
  double all_layers_s = 0;
  for (const auto& L : model.layers) all_layers_s += L.update_time_cpu_s;
  REQUIRE(all_layers_s > 0);
  const double pass_s = all_layers_s * m.compute.update_time_scale;
  const auto engine = sim::make_engine(core::CostModelKind::Native, model, m);
  for (const int gpus : {2, 4}) {
    CAPTURE(gpus);
    const auto space = wide_space(core::plan_kind("harmony-dp"), gpus, 8 * gpus, m, -1);
    const auto cands = core::enumerate_candidates(model, space);
    REQUIRE(!cands.empty());
    for (std::size_t i = 0; i < cands.size(); i += std::max<std::size_t>(1, cands.size() / 8)) {
      const core::Plan p = core::candidate_plan(cands[i], space);
      const double task_s = sim::task_bound_for(*engine, model, p, {});
      const double run_s = sim::evaluate_plan(*engine, model, p, {}).report.iteration_time_s;
      CHECK(task_s >= pass_s * (1 - 1e-6));
      CHECK(task_s <= run_s);
      CHECK(run_s < 1.5 * pass_s);  // one pass and the compute before the first update, not gpus passes
      // without contention nothing is shared: the compute chain alone
      const core::Program program = sim::lower_plan_for(*engine, model, p, {});
      sim::NativeOptions alone;
      alone.contention = false;
      const double chain_s = core::ps_to_seconds(sim::native_task_bound_ps(
          program.graph, core::lowered_ranks(program.graph, {.dp_first_gpu_only = false}), model, m, alone));
      CHECK(task_s > chain_s * (1 + 1e-3));
    }
  }
}

TEST_CASE("the bounded search's first miss is the full search's when nothing fits") {
  // a capacity no plan meets: nothing is feasible, so nothing is pruned and every candidate is evaluated
  core::MachineSpec m = core::machine_preset("paper-1080ti");
  m.gpu_memory_bytes = 600 * core::kMiB;
  auto space = wide_space(core::plan_kind("harmony-pp"), 2, 8, m, 1);
  space.capacity_bytes = 10 * core::kGiB;  // the packers think it fits; the native engine finds it does not
  const auto engine = sim::make_engine(core::CostModelKind::Native, bert(), m);
  const auto cands = core::enumerate_candidates(bert(), space);
  REQUIRE(!cands.empty());
  const auto a = core::run_search(cands, space, [&](const core::Plan& p) {
    return sim::evaluate_plan(*engine, bert(), p, core::LowerOptions{}).report;
  });
  const auto b = core::run_search_bounded(
      cands, space, bert(), [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
        auto e = sim::evaluate_plan_within(*engine, bert(), p, core::LowerOptions{}, cutoff_s);
        if (!e) return std::nullopt;
        return std::move(e->report);
      });
  CHECK(a.ranked.empty());
  CHECK(b.ranked.empty());
  CHECK(b.num_pruned == 0);
  REQUIRE(a.first_miss < cands.size());
  CHECK(b.first_miss == a.first_miss);
  CHECK(b.first_miss_reason == a.first_miss_reason);
  CHECK(b.num_infeasible == a.num_infeasible);
}

TEST_CASE("a host floor over the machine's memory: the bounded search runs only the candidate that names the miss") {
  // The masters, optimizer state and gradients alone exceed the host memory: no candidate can be feasible. The full
  // search runs every candidate; the bounded one declines all but the first in enumeration order (its task bound is
  // infinite), which it runs for the same first miss and reason, on one thread or two.
  core::MachineSpec m = core::machine_preset("paper-1080ti");
  const core::PlanKind pp = core::plan_kind("harmony-pp");
  m.topology.host_memory_bytes = sim::host_floor(bert(), pp, false).total_bytes() - 1;
  const auto engine = sim::make_engine(core::CostModelKind::Native, bert(), m);
  CHECK(engine->host_floor_exceeded(pp, false));
  auto space = wide_space(pp, 2, 8, m, 1);
  const auto cands = core::enumerate_candidates(bert(), space);
  REQUIRE(cands.size() > 2);
  const auto a = core::run_search(cands, space, [&](const core::Plan& p) {
    return sim::evaluate_plan(*engine, bert(), p, core::LowerOptions{}).report;
  });
  REQUIRE(a.ranked.empty());
  REQUIRE(a.first_miss == 0);
  CHECK(a.first_miss_reason.find("host memory exceeded") != std::string::npos);
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    space.spec.threads = threads;
    std::atomic<int> runs{0};
    const auto b = core::run_search_bounded(
        cands, space, bert(),
        [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
          ++runs;
          auto e = sim::evaluate_plan_within(*engine, bert(), p, core::LowerOptions{}, cutoff_s);
          if (!e) return std::nullopt;
          return std::move(e->report);
        },
        {}, [&](const core::Plan& p) { return sim::task_bound_for(*engine, bert(), p, {}); });
    CHECK(b.ranked.empty());
    CHECK(runs == 1);
    CHECK(b.num_pruned == cands.size() - 1);
    CHECK(b.first_miss == a.first_miss);
    CHECK(b.first_miss_reason == a.first_miss_reason);
  }
  // with the drives holding the masters and optimizer state the floor is the gradients alone: bounds are finite
  CHECK_FALSE(engine->host_floor_exceeded(pp, true));
  core::LowerOptions drives;
  drives.offload_nvme = true;
  CHECK(std::isfinite(sim::task_bound_for(*engine, bert(), core::candidate_plan(cands[0], space), drives)));
}

TEST_CASE("a bounded search reports the same counts with 1, 2, 3 and 4 threads") {
  // Same inputs, same outputs: the pruning threshold a candidate is offered depends on its position in the search
  // order only (its round, RoundedBest), not on which thread finished first, so the declined, cut-off,
  // infeasible and ranked candidates are the same whatever the thread count. Before, num_pruned varied from run to
  // run with threads > 1 (a candidate saw whatever best time the other threads had found by then).
  struct Case {
    const char* machine;
    core::PlanKind kind;
    int gpus;
  };
  for (const Case& c :
       {Case{"h100-sxm-8x", core::plan_kind("harmony-pp"), 4}, Case{"h100-sxm-8x", core::plan_kind("harmony-dp"), 2}}) {
    const std::string kind = core::plan_kind_name(c.kind);
    CAPTURE(kind);
    const core::MachineSpec m = core::machine_preset(c.machine);
    const core::Model model = core::analytic_model(*core::analytic_preset("gpt3-1.3b"), m.gpu_rates, m.cpu_adam);
    const auto engine = sim::make_engine(core::CostModelKind::Native, model, m);
    auto space = wide_space(c.kind, c.gpus, 8, m, 1);
    const auto cands = core::enumerate_candidates(model, space);
    REQUIRE(cands.size() > 3 * 8);  // several rounds
    auto bounded = [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
      auto e = sim::evaluate_plan_within(*engine, model, p, core::LowerOptions{}, cutoff_s);
      if (!e) return std::nullopt;
      return std::move(e->report);
    };
    const core::PlanBound task_bound = [&](const core::Plan& p) {
      return sim::task_bound_for(*engine, model, p, core::LowerOptions{});
    };
    std::optional<core::SearchResult> first;
    for (const int threads : {1, 2, 3, 4, 2, 4}) {
      CAPTURE(threads);
      space.spec.threads = threads;
      const auto b = core::run_search_bounded(cands, space, model, bounded, {}, task_bound);
      REQUIRE_FALSE(b.ranked.empty());
      if (!first) {
        CHECK(b.num_pruned > 0);
        first = b;
        continue;
      }
      CHECK(b.num_pruned == first->num_pruned);
      CHECK(b.num_infeasible == first->num_infeasible);
      CHECK(b.num_deadlocked == first->num_deadlocked);
      REQUIRE(b.ranked.size() == first->ranked.size());
      for (std::size_t i = 0; i < b.ranked.size(); ++i) {
        CHECK(b.ranked[i].candidate == first->ranked[i].candidate);
        CHECK(b.ranked[i].report.iteration_time_s == first->ranked[i].report.iteration_time_s);
      }
    }
  }
}

TEST_CASE("search_growing_bound: Wide's bound doubles while nothing under it fits a GPU, and only then") {
  // bert_large (28 layers) on 2 GPUs, default bound min(28, 4 x 2) = 8. The search is a stand-in that ranks nothing
  // and reports a GPU memory miss until the bound reaches `fits_from` packs, and records each bound it was given.
  core::SearchSpace s;
  s.kind = core::plan_kind("harmony-pp");
  s.gpus = 2;
  s.minibatch = 32;
  s.capacity_bytes = 10 * core::kGiB;
  s.spec.pack_counts = core::PackCounts::Wide;
  std::vector<int> bounds;
  auto stand_in = [&](int fits_from, std::size_t gpu_misses) {
    return [&, fits_from, gpu_misses](const std::vector<core::Candidate>& c, const core::SearchSpace& sp) {
      bounds.push_back(core::max_pack_count(bert(), sp));
      CHECK(c.size() == core::enumerate_candidates(bert(), sp).size());  // the candidates of the bound searched
      core::SearchResult r;
      r.num_candidates = c.size();
      if (bounds.back() >= fits_from) {
        r.ranked.push_back(core::RankedResult{0, 1.0, {}});
      } else {
        r.num_gpu_memory_misses = gpu_misses;
      }
      return r;
    };
  };
  // fits from 16 packs: 8, then 16 (packs_per_gpu 8), which ranks a plan
  auto g = core::search_growing_bound(bert(), s, stand_in(16, 1));
  CHECK(bounds == std::vector<int>{8, 16});
  CHECK(g.grew());
  CHECK(g.configured_max_packs == 8);
  CHECK(g.max_packs == 16);
  CHECK(g.searches == 2);
  CHECK(g.space.spec.packs_per_gpu == 8);
  CHECK(g.result.ranked.size() == 1);
  CHECK(g.candidates.size() == core::enumerate_candidates(bert(), g.space).size());
  // nothing fits at all: 8, 16, then every count (16 x 2 = 32 >= 28 layers: packs_per_gpu 0), and it stops there
  bounds.clear();
  g = core::search_growing_bound(bert(), s, stand_in(1000, 1));
  CHECK(bounds == std::vector<int>{8, 16, 28});
  CHECK(g.max_packs == 28);
  CHECK(g.space.spec.packs_per_gpu == 0);
  CHECK(g.result.ranked.empty());
  // a plan under the configured bound: one search, as before
  bounds.clear();
  g = core::search_growing_bound(bert(), s, stand_in(0, 1));
  CHECK(bounds == std::vector<int>{8});
  CHECK_FALSE(g.grew());
  CHECK(g.max_packs == g.configured_max_packs);
  // nothing fits, but no candidate exceeded a GPU's memory (host memory, deadlocks): more packs cannot help
  bounds.clear();
  g = core::search_growing_bound(bert(), s, stand_in(1000, 0));
  CHECK(bounds == std::vector<int>{8});
  // the bound is the layer count already, or the paper's Minimum search: nothing to grow
  bounds.clear();
  s.spec.packs_per_gpu = 0;
  g = core::search_growing_bound(bert(), s, stand_in(1000, 1));
  CHECK(bounds == std::vector<int>{28});
  bounds.clear();
  s.spec.packs_per_gpu = 4;
  s.spec.pack_counts = core::PackCounts::Minimum;
  g = core::search_growing_bound(bert(), s, stand_in(1000, 1));
  CHECK(bounds.size() == 1);
  CHECK(g.searches == 1);
  // a kind without packs has no bound: one search of its own enumeration, however many GPU misses under Wide
  s.kind = core::plan_kind("dp-swap");
  s.spec.pack_counts = core::PackCounts::Wide;
  std::size_t searched = 0;
  g = core::search_growing_bound(bert(), s, [&](const std::vector<core::Candidate>& c, const core::SearchSpace&) {
    searched = c.size();
    core::SearchResult r;
    r.num_gpu_memory_misses = 1;
    return r;
  });
  CHECK(g.searches == 1);
  CHECK_FALSE(g.grew());
  CHECK(searched > 0);
  CHECK(g.candidates.size() == core::enumerate_plans(bert(), s).size());
}

TEST_CASE("search_space_for: every field reaches the space, and one call serves kinds with and without packs") {
  core::SearchSpec spec;
  spec.packing_fwd = {"balanced_time"};
  spec.packing_bwd = {"balanced_time"};
  spec.top_k = 3;
  spec.ubatch_step = 2;
  spec.smaller_ufwd = true;
  spec.fit_rule = true;
  spec.u_fwd = {4, 8};
  spec.u_bwd = {4, 8};
  spec.threads = 1;
  spec.pack_counts = core::PackCounts::Wide;
  spec.packs_per_gpu = 2;
  spec.offload = core::SearchSpec::Offload::Nvme;
  spec.swap = core::SwapTiming::OnDemand;
  for (core::PlanKind kind : core::plan_kinds()) {
    CAPTURE(kind.name());
    const auto s = core::search_space_for(kind, 2, 32, 7 * core::kGiB, spec, true);
    CHECK(s.kind == kind);
    CHECK(s.gpus == 2);
    CHECK(s.minibatch == 32);
    CHECK(s.capacity_bytes == 7 * core::kGiB);
    CHECK(s.knobs.gpu_capacity_bytes == 7 * core::kGiB);
    CHECK(s.unequal_microbatches);
    CHECK(s.spec.packing_fwd == spec.packing_fwd);
    CHECK(s.spec.packing_bwd == spec.packing_bwd);
    CHECK(s.spec.top_k == 3);
    CHECK(s.spec.ubatch_step == 2);
    CHECK(s.spec.smaller_ufwd);
    CHECK(s.spec.fit_rule);
    CHECK(s.spec.u_fwd == spec.u_fwd);
    CHECK(s.spec.u_bwd == spec.u_bwd);
    CHECK(s.spec.threads == 1);
    CHECK(s.spec.pack_counts == core::PackCounts::Wide);
    CHECK(s.spec.packs_per_gpu == 2);
    CHECK(s.spec.offload == core::SearchSpec::Offload::Nvme);
    CHECK(s.spec.swap == core::SwapTiming::OnDemand);
    // the swap timing is a knob of dp-swap and pp-swap only: resident, ... keep theirs (scheduled)
    CHECK(s.knobs.swap == (kind.has_knob(core::Knob::Swap) ? core::SwapTiming::OnDemand : core::SwapTiming::Scheduled));
    CHECK(s.drop_infeasible);
    CHECK(s.activation_policies == std::vector<core::ActivationPolicy>{core::ActivationPolicy::Checkpoint});
  }
  CHECK_FALSE(core::search_space_for(core::plan_kind("harmony-pp"), 2, 32, core::kGiB, spec).unequal_microbatches);
  // bert_large on 2 GPUs at D32: a kind with packs and one without both list candidates from the same call
  for (const char* name : {"harmony-pp", "dp-swap"}) {
    CAPTURE(name);
    const auto s = core::search_space_for(core::plan_kind(name), 2, 32, 9 * core::kGiB, core::SearchSpec{});
    const auto cands = core::enumerate_plans(bert(), s);
    REQUIRE(!cands.empty());
    CHECK(cands.front().plan.kind == core::plan_kind(name));
    CHECK(cands.front().plan.knobs.gpu_capacity_bytes == 9 * core::kGiB);
  }
}

TEST_CASE("num_gpu_memory_misses counts the evaluated candidates over a GPU's memory") {
  // bert_large at D8 N2, native engine, the packers packing against 10 GiB on GPUs of 1 GiB: candidates overflow.
  // The full search evaluates every candidate, so its count is the number of candidates whose own run overflows.
  core::MachineSpec m = core::machine_preset("paper-1080ti");
  m.gpu_memory_bytes = core::kGiB;
  auto space = wide_space(core::plan_kind("harmony-pp"), 2, 8, m, -1);
  space.capacity_bytes = 10 * core::kGiB;  // the packers believe 10 GiB: their packs overflow the real 1 GiB
  const auto cands = core::enumerate_candidates(bert(), space);
  REQUIRE(!cands.empty());
  core::LowerOptions lower;
  lower.prefetch = true;
  const auto r = core::run_search(cands, space, [&](const core::Plan& p) {
    return sim::evaluate_plan(bert(), m, p, lower, core::CostModelKind::Native).report;
  });
  std::size_t over = 0;
  for (const auto& c : cands)
    over += core::exceeds_gpu_memory(sim::evaluate_plan(bert(), m, c.plan, lower, core::CostModelKind::Native).report);
  CHECK(over > 0);
  CHECK(r.num_gpu_memory_misses == over);
}
