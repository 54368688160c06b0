// The bottleneck report: the per-GPU breakdown adds up to the iteration, the critical path spans it, and the
// binding resource is the one whose doubling helps most — compute for a fast link, the host link for a slow
// one, memory for a plan that does not fit.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/model/profile.hpp"
#include "core/program/lower.hpp"
#include "sim/study/bottleneck.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using harmony::test::source_dir;

namespace {

struct Case {
  core::Model model;
  core::Program program;
  explicit Case(int gpus = 2) : model(core::load_profile(source_dir() + "/configs/profiles/bert_large.json")) {
    core::Plan plan;
    plan.kind = core::plan_kind("harmony-pp");
    plan.gpus = gpus;
    plan.minibatch = 32;
    plan.u_fwd = 16;
    plan.u_bwd = 8;
    core::manual_packs(model.num_layers(), 7, plan.packs_fwd, plan.packs_bwd);
    program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, {.prefetch = true});
  }
};

sim::Bottleneck analyse(const Case& c, const core::MachineSpec& m) {
  const sim::NativeResult r = sim::run_native(c.program, c.model, m);
  return sim::analyze_bottleneck(c.program, c.model, m, r);
}

}  // namespace

TEST_CASE("the per-GPU breakdown adds up to the iteration and the critical path spans it") {
  const Case c;
  const sim::Bottleneck b = analyse(c, core::machine_preset("paper-1080ti"));
  REQUIRE(b.iteration_time_s > 0);
  REQUIRE(b.per_gpu.size() == 2);
  for (const auto& g : b.per_gpu) {
    CAPTURE(g.gpu);
    CHECK(g.compute_s > 0);
    CHECK(g.compute_s + g.wait_swap_s + g.wait_peer_s + g.wait_cpu_s + g.idle_s ==
          doctest::Approx(b.iteration_time_s).epsilon(1e-9));
  }
  double span = 0;
  for (const auto& s : b.critical_path) span += s.wait_s + s.run_s;
  CHECK(span == doctest::Approx(b.iteration_time_s).epsilon(1e-9));
  CHECK(b.path_compute_s + b.path_transfer_s + b.path_cpu_s + b.path_other_s + b.path_wait_s ==
        doctest::Approx(b.iteration_time_s).epsilon(1e-9));
  CHECK(b.what_if.size() == 5);  // feasible: no memory variant
  for (std::size_t i = 1; i < b.what_if.size(); ++i) CHECK(b.what_if[i - 1].speedup >= b.what_if[i].speedup);
  const auto j = sim::bottleneck_json(c.program, b);
  CHECK(j["binding"] == b.binding);
  CHECK(j["per_gpu"].size() == 2);
  CHECK(j["critical_path"]["ops"].size() == b.critical_path.size());
  CHECK(sim::bottleneck_text(c.program, b).find("bottleneck: ") == 0);
}

TEST_CASE("compute binds on fast links; the host link binds when it is slow") {
  const Case c;
  core::MachineSpec fast = core::machine_preset("paper-1080ti");
  fast.bw_swap_bytes_per_s *= 100;
  fast.bw_p2p_bytes_per_s *= 100;
  for (auto& g : fast.topology.gpus) g.link_bytes_per_s *= 100;
  for (auto& s : fast.topology.switches) s.uplink_bytes_per_s *= 100;
  const sim::Bottleneck f = analyse(c, fast);
  CHECK(f.binding == "compute");
  CHECK(f.what_if.front().speedup > 1.5);  // compute-bound: halving compute nearly halves the iteration

  core::MachineSpec slow = core::machine_preset("paper-1080ti");
  slow.bw_swap_bytes_per_s /= 50;
  for (auto& g : slow.topology.gpus) g.link_bytes_per_s /= 50;
  for (auto& s : slow.topology.switches) s.uplink_bytes_per_s /= 50;
  const sim::Bottleneck s = analyse(c, slow);
  CHECK(s.binding == "host links");
  double swap_wait = 0;
  for (const auto& g : s.per_gpu) swap_wait += g.wait_swap_s;
  CHECK(swap_wait > 0.5 * s.iteration_time_s);  // the GPUs mostly wait for swaps
}

TEST_CASE("a plan that does not fit: memory binds, and the doubled-memory variant is reported") {
  const Case c;
  core::MachineSpec small = core::machine_preset("paper-1080ti");
  small.gpu_memory_bytes = 4 * core::kGiB;
  const sim::Bottleneck b = analyse(c, small);
  CHECK_FALSE(b.feasible);
  CHECK(b.binding == "memory");
  bool found = false;
  for (const auto& w : b.what_if) found = found || w.resource == "memory";
  CHECK(found);
}

TEST_CASE("simulate_bottleneck (base run beside the what-ifs) is analyze_bottleneck of run_native") {
  const Case c;
  core::MachineSpec small = core::machine_preset("paper-1080ti");
  small.gpu_memory_bytes = 4 * core::kGiB;
  for (const core::MachineSpec& m :
       {core::machine_preset("paper-1080ti"), core::machine_preset("h100-sxm-8x"), small}) {
    CAPTURE(m.gpu_memory_bytes);
    const sim::Bottleneck a = analyse(c, m);
    const sim::Bottleneck b = sim::simulate_bottleneck(c.program, c.model, m);
    CHECK(sim::bottleneck_json(c.program, a) == sim::bottleneck_json(c.program, b));
    CHECK(b.what_if.size() == (b.feasible ? 5U : 6U));
  }
}
