// Tests of zero3-opt-offload's Programs (core/kinds/zero_infinity.cpp) through the executor on CPU devices: each GPU
// keeps its parameter shard (over one GPU, the whole layer) across steps, filled from the host masters when the
// executor is built and sent up again after every CPU Adam (backend/executor/flow_carried.cpp). Its gradients and
// updates are zero-infinity's, whose WBs bring the same shards from the same masters before every use, so it trains
// zero-infinity's bits; it holds exactly its shards between steps; a stop and restart, or jittered streams, change no
// bit; and a Program that sends a shard up before its update is refused.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

core::Program lower_kind(const char* kind, const Gpt2& model, int gpus, int u, core::ActivationPolicy policy,
                         DType dtype) {
  core::Plan plan = swapping_plan(core::plan_kind(kind), gpus, u, core::SwapChoice::Auto, core::SwapChoice::Auto);
  plan.knobs.activation_policy = policy;
  return lower_swapping_plan(model, plan, dtype);
}

}  // namespace

TEST_CASE("zero3-opt-offload trains zero-infinity's numbers bit for bit") {
  REQUIRE(core::plan_kind("zero3-opt-offload")->trains);
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const int gpus : {1, 2, 4}) {
      for (const int u : {1, 2}) {
        if ((kB / gpus) % u != 0) continue;
        for (const auto policy : {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(gpus);
          CAPTURE(u);
          CAPTURE(core::activation_policy_name(policy));
          Setup a(gpus), b(gpus);
          const core::Program ours = lower_kind("zero3-opt-offload", *a.model, gpus, u, policy, dtype);
          const core::Program theirs = lower_kind("zero-infinity", *b.model, gpus, u, policy, dtype);
          // no WB before a use: each GPU's shard goes up once a step, after its layer's update
          int wb = 0;
          for (const core::Op& op : ours.ops) wb += op.kind == core::OpKind::WB;
          CHECK(wb == gpus * a.model->num_layers());
          // run() checks that each device holds, between steps, what it held when the executor was built: its shards
          check_same_bits(run(ours, a, nullptr, true, dtype), run(theirs, b, nullptr, true, dtype));
        }
      }
    }
  }
}

// The carried shards are rebuilt from the HostState's masters, which every step's CPU Adam leaves current: an executor
// built after one step continues as the first would have.
TEST_CASE("a zero3-opt-offload run stopped and restarted, or on jittered devices, trains the same bits") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dtype));
    Setup a(2), b(2), c(2, 16 * kMiB, /*jitter_us=*/200, /*jitter_seed=*/5);
    const auto policy = core::ActivationPolicy::Checkpoint;
    const core::Program prog = lower_kind("zero3-opt-offload", *a.model, 2, 1, policy, dtype);
    const Result straight = run(prog, a, nullptr, true, dtype);
    check_same_bits(straight, run(prog, c, nullptr, true, dtype));
    check_restarted(prog, b, straight, dtype);  // a new executor every step: a stop and restart
  }
}
