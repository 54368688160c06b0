// Tests of host-stream's Programs (core/kinds/host_stream.cpp) through the executor on a CPU device: the layers that
// fit keep their weights on the GPU across steps (updated in place), the rest stream per use; every layer's AdamW runs
// on the GPU over moments brought from host memory and taken back (backend/executor/flow_streamed.cpp). Its gradients
// are dp-swap's: where every layer's gradient stays on the GPU (all kept) or every layer's is summed on the host (all
// streamed), or at one microbatch, it trains dp-swap's bits; with some of each, within the plain trainer's bound. A
// stop and restart, or jittered streams, change no bit; a Program that brings a gradient before it is summed is
// refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/program/state_layout.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

// host-stream at microbatch u under `policy`, its layout decided against `capacity`.
core::Program lower_host_stream(const Gpt2& model, int u, Bytes capacity, core::ActivationPolicy policy,
                                DType dtype = DType::F32) {
  core::Plan plan = swapping_plan(core::plan_kind("host-stream"), 1, u, core::SwapChoice::Auto, core::SwapChoice::Auto);
  plan.knobs.activation_policy = policy;
  plan.knobs.gpu_capacity_bytes = capacity;
  return lower_swapping_plan(model, plan, dtype);
}

// The layers whose weights stream (a WB outside the update pass brings them).
int streamed_layers(const core::Program& p) {
  std::set<int> layers;
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    if (p.ops[o].kind == core::OpKind::WB && p.dataflow.ops[o].pass != core::Pass::Update)
      layers.insert(p.ops[o].layers.first);
  return static_cast<int>(layers.size());
}

// The layouts the tests run: every layer kept (the default capacity), every layer streamed (none fits), and the
// largest capacity under which some stream and some stay (found by scanning).
struct Layout {
  const char* name;
  Bytes capacity;
};
std::vector<Layout> layouts(const Gpt2& model, int u) {
  Bytes mixed = 0;
  for (Bytes c = 32 * core::kKiB; c <= 8 * kMiB; c += 32 * core::kKiB) {
    const int n = streamed_layers(lower_host_stream(model, u, c, core::ActivationPolicy::Checkpoint));
    if (n > 0 && n < model.num_layers()) mixed = c;
  }
  REQUIRE(mixed > 0);
  return {{"kept", core::KindKnobs{}.gpu_capacity_bytes}, {"mixed", mixed}, {"streamed", 0}};
}

}  // namespace

TEST_CASE("host-stream trains dp-swap's numbers: bit for bit where the gradients are summed in one place") {
  REQUIRE(core::plan_kind("host-stream")->trains);
  const Result& ref = reference();
  Setup probe(1);
  for (const int u : {1, 2, 4}) {
    for (const Layout& lay : layouts(*probe.model, u)) {
      for (const auto policy : {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}) {
        CAPTURE(u);
        CAPTURE(std::string(lay.name));
        CAPTURE(core::activation_policy_name(policy));
        Setup a(1), b(1);
        const core::Program ours = lower_host_stream(*a.model, u, lay.capacity, policy);
        const int streamed = streamed_layers(ours);
        const int R = a.model->num_layers();
        CHECK((streamed == 0) == (std::string(lay.name) == "kept"));
        CHECK((streamed == R) == (std::string(lay.name) == "streamed"));
        // the kept layers are carried across steps; run() checks each step ends holding exactly them
        const core::StateLayout s = core::state_layout(ours);
        CHECK(s.device_update);
        CHECK(static_cast<int>(s.carried_layers.empty() ? 0 : s.carried_layers[0].size()) == R - streamed);
        // dp-swap with the weights kept sums every gradient on the GPU, with them swapped on the host
        const auto w = streamed == R ? core::SwapChoice::Swap : core::SwapChoice::Keep;
        core::Plan dp = swapping_plan(core::plan_kind("dp-swap"), 1, u, w, core::SwapChoice::Auto);
        dp.knobs.activation_policy = policy;
        const Result r = run(ours, a);
        const bool one_place = streamed == 0 || streamed == R || u == kB;
        if (one_place) {
          check_same_bits(r, run(lower_swapping_plan(*b.model, dp), b));
        } else {  // some gradients summed on the GPU, some on the host: the plain trainer's bound
          for (std::size_t l = 0; l < ref.weights.size(); ++l)
            for (std::size_t i = 0; i < ref.weights[l].size(); ++i)
              CHECK(std::abs(double(r.weights[l][i]) - double(ref.weights[l][i])) <=
                    1e-6 + 1e-4 * std::abs(double(ref.weights[l][i])));
        }
        CHECK(r.losses[0] == ref.losses[0]);
        CHECK(std::abs(r.losses[1] - ref.losses[1]) <= 1e-6 * std::abs(ref.losses[1]));
      }
    }
  }
}

TEST_CASE("host-stream in bf16 trains dp-swap's numbers at one microbatch") {
  Setup probe(1);
  for (const Layout& lay : layouts(*probe.model, kB)) {
    CAPTURE(std::string(lay.name));
    Setup a(1), b(1);
    const auto policy = core::ActivationPolicy::Checkpoint;
    const core::Program ours = lower_host_stream(*a.model, kB, lay.capacity, policy, DType::BF16);
    const bool all_streamed = streamed_layers(ours) == a.model->num_layers();
    core::Plan dp =
        swapping_plan(core::plan_kind("dp-swap"), 1, kB, all_streamed ? core::SwapChoice::Swap : core::SwapChoice::Keep,
                      core::SwapChoice::Auto);
    dp.knobs.activation_policy = policy;
    check_same_bits(run(ours, a, nullptr, true, DType::BF16),
                    run(lower_swapping_plan(*b.model, dp, DType::BF16), b, nullptr, true, DType::BF16));
  }
}

// The kept layers are filled from the HostState's masters, which every step's update pass leaves current: an executor
// built after one step continues as the first would have; jittered streams change no bit.
TEST_CASE("a host-stream run stopped and restarted, or on jittered devices, trains the same bits") {
  Setup probe(1);
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const Layout& lay : layouts(*probe.model, 2)) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(std::string(lay.name));
      Setup a(1), b(1), c(1, 16 * kMiB, /*jitter_us=*/200, /*jitter_seed=*/7);
      const core::Program prog =
          lower_host_stream(*a.model, 2, lay.capacity, core::ActivationPolicy::Checkpoint, dtype);
      const Result straight = run(prog, a, nullptr, true, dtype);
      check_same_bits(straight, run(prog, c, nullptr, true, dtype));
      check_restarted(prog, b, straight, dtype);  // a new executor every step: a stop and restart
    }
  }
}

// The update pass's WB of a streamed layer brings the gradient its dWBs summed on the host: without its dependency on
// the last of them (layer 0's: nothing else orders it after the backward), the executor refuses the Program, naming
// the two unordered writers of the gradient the device update reads (the version analysis sees it before
// check_streamed_updates' own order checks would).
TEST_CASE("host-stream: a Program that brings a gradient before it is summed is refused") {
  Setup s(1);
  core::Program prog = lower_host_stream(*s.model, 2, 0, core::ActivationPolicy::Checkpoint);
  int victim = -1;
  for (std::size_t o = 0; o < prog.ops.size() && victim < 0; ++o) {
    core::Op& op = prog.ops[o];
    if (op.kind != core::OpKind::WB || prog.dataflow.ops[o].pass != core::Pass::Update || op.layers.first != 0)
      continue;
    const auto it = std::find_if(op.deps.begin(), op.deps.end(), [&](int d) {
      return prog.ops[static_cast<std::size_t>(d)].kind == core::OpKind::dWB;
    });
    if (it == op.deps.end()) continue;
    op.deps.erase(it);
    victim = static_cast<int>(o);
  }
  REQUIRE(victim >= 0);
  core::validate_program(prog);
  CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                       doctest::Contains("reads cpu:0 dW of layer 0, produced by both"), ScheduleViolation);
}
