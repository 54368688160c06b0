// Tests of the resident kind's Programs (core/kinds/resident.cpp) through the executor on CPU devices: weights,
// gradients and AdamW state live in one DeviceState per device across steps, the Update runs on the device, and the
// run trains the tiny GPT-2 to the PlainTrainer's weights and moments (bit for bit on one GPU, fp32 and bf16; within
// the replica-sum bound on two and four); sync_state() hands the state back so a run can stop and resume exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/model/device_state.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

core::Program lower_resident(const Gpt2& model, int gpus, int u, DType dtype,
                             core::ActivationPolicy policy = core::ActivationPolicy::Checkpoint) {
  core::Plan plan;
  plan.kind = core::plan_kind("resident");
  plan.gpus = gpus;
  plan.minibatch = kB;
  plan.u_fwd = plan.u_bwd = u;
  plan.knobs.activation_policy = policy;
  const core::Model desc = describe_gpt2(model, kT, {1, 2, 3, 4}, {.dtype = dtype});
  return core::lower_plan(plan, desc);
}

// kSteps of a resident Program, the state synced back after `sync_after` steps (and at the end), the executor
// rebuilt from the synced state when `resume`: a stop and restart in the middle of the run.
Result run_resident(const core::Program& prog, Setup& s, DType dtype, bool concurrent, Communicator* comm,
                    int sync_after = kSteps, bool resume = false) {
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  const ExecutorOptions opts{
      .seq_len = kT, .adamw = kAdamW, .concurrent = concurrent, .dtype = dtype, .communicator = comm};
  auto ex = std::make_unique<Executor>(prog, s.ptrs, *s.state, opts);
  Result r;
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < kSteps; ++k) {
    if (k == sync_after) {
      ex->sync_state();
      if (resume) {
        ex.reset();
        ex = std::make_unique<Executor>(prog, s.ptrs, *s.state, opts);
      }
    }
    tokens.batch(k, kB, kT, in, tgt);
    r.losses.push_back(ex->step(in, tgt).loss);
    // only the resident state is left on the devices between steps
    for (auto* d : s.ptrs) {
      CHECK(d->memory().in_use >= DeviceState::total_bytes(*s.model, dtype));
      CHECK(d->memory().in_use <= DeviceState::total_bytes(*s.model, dtype) + 256 * 8 * (s.model->num_layers() + 1));
    }
  }
  ex->sync_state();
  for (int l = 0; l < s.model->num_layers(); ++l) {
    r.weights.emplace_back(s.state->weights(l).begin(), s.state->weights(l).end());
    r.moments.emplace_back(s.state->exp_avg(l).begin(), s.state->exp_avg(l).end());
    r.moments.emplace_back(s.state->exp_avg_sq(l).begin(), s.state->exp_avg_sq(l).end());
  }
  return r;
}

// Per element |ours - plain| <= 1e-6 + 1e-4 |plain| (the replica-sum bound of test_executor_baselines.cpp).
bool within_sum_bound(const std::vector<float>& ours, const std::vector<float>& plain) {
  if (ours.size() != plain.size()) return false;
  for (std::size_t i = 0; i < ours.size(); ++i)
    if (!(std::abs(ours[i] - plain[i]) <= 1e-6 + 1e-4 * std::abs(plain[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("the resident Program keeps its state on the GPUs and updates there") {
  Setup s(2);
  const core::Program prog = lower_resident(*s.model, 2, 1, DType::F32);
  int updates = 0, ards = 0;
  Bytes update_bytes = 0;
  for (const core::Op& op : prog.ops) {
    CHECK(op.kind != core::OpKind::WB);
    CHECK(op.kind != core::OpKind::dWB);
    if (op.kind == core::OpKind::ARD) ++ards;
    if (op.kind != core::OpKind::Update) continue;
    ++updates;
    CHECK(op.stream == core::Stream::Compute);
    CHECK_FALSE(core::host_update(op));
    update_bytes += op.bytes;
    for (const core::TensorRef& f : op.frees) CHECK(f.kind != core::TensorKind::Weights);
  }
  CHECK(updates == 2 * s.model->num_layers());  // every layer of the tiny GPT-2 has parameters, on both replicas
  CHECK(ards == 2 * s.model->num_layers());     // one all-reduce per layer per replica, after the last microbatch
  // the HBM traffic of one AdamW step per replica: 28 bytes per parameter with optimizer state (the tied lm_head has
  // none: it is wte's)
  std::int64_t owned = 0;
  for (int l = 0; l < s.model->num_layers(); ++l) owned += DeviceState::owned_floats(*s.model, l);
  CHECK(update_bytes == 2 * 28 * owned);
}

// Tolerances: one GPU accumulates every microbatch's gradient into one device buffer in sample order, as the
// PlainTrainer does, and Kernels<S>::adamw is adamw_update's float operations in its order (the device conformance
// test), so weights, moments and losses are the same bits in fp32 and bf16. Two and four replicas sum partial sums
// (a different float order): fp32, the replica-sum bound (step-1 loss within 1e-6); bf16, whose partial sums are
// rounded to bf16 before they are added, the bf16 baselines' bounds (step-1 loss within 2e-4, weights within
// 2 kSteps lr). Step 0's loss is bit-exact everywhere.
TEST_CASE("resident Programs train like the PlainTrainer") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const int gpus : {1, 2, 4}) {
      for (const int u : {1, 2, 4}) {
        if (kB % gpus != 0 || (kB / gpus) % u != 0) continue;
        for (const bool concurrent : {true, false}) {
          for (const bool device_sums : {false, true}) {
            if (device_sums && gpus == 1) continue;
            CAPTURE(dtype_name(dtype));
            CAPTURE(gpus);
            CAPTURE(u);
            CAPTURE(concurrent);
            CAPTURE(device_sums);
            Setup s(gpus);
            const Result ours = run_resident(lower_resident(*s.model, gpus, u, dtype), s, dtype, concurrent,
                                             device_sums ? s.comm.get() : nullptr);
            const bool bf16 = dtype == DType::BF16;
            const Result plain = plain_run(dtype, gpus == 1 || bf16 ? u : 0);
            REQUIRE(ours.weights.size() == plain.weights.size());
            CHECK(ours.losses[0] == plain.losses[0]);
            if (gpus > 1 && bf16) {  // the bf16 baselines' replica bounds (test_executor_baselines.cpp)
              CHECK(std::abs(ours.losses[1] - plain.losses[1]) <= 2e-4 * std::abs(plain.losses[1]));
              for (std::size_t l = 0; l < plain.weights.size(); ++l) {
                CHECK(max_abs_diff(ours.weights[l], plain.weights[l]) <= 2 * kSteps * kAdamW.lr);
              }
              continue;
            }
            CHECK(std::abs(ours.losses[1] - plain.losses[1]) <= 1e-6 * std::abs(plain.losses[1]));
            for (std::size_t l = 0; l < plain.weights.size(); ++l) {
              CAPTURE(l);
              if (gpus == 1) {
                CHECK(same_bits(ours.weights[l], plain.weights[l]));
              } else {
                CHECK(within_sum_bound(ours.weights[l], plain.weights[l]));
              }
            }
            for (std::size_t i = 0; i < plain.moments.size(); ++i) {
              CAPTURE(i);
              if (gpus == 1) {
                CHECK(same_bits(ours.moments[i], plain.moments[i]));
              } else {
                CHECK(within_sum_bound(ours.moments[i], plain.moments[i]));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a resident run stopped and resumed through the HostState continues bit for bit") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dtype));
    Setup a(1), b(1);
    const core::Program prog = lower_resident(*a.model, 1, 2, dtype, core::ActivationPolicy::Keep);
    const Result straight = run_resident(prog, a, dtype, true, nullptr);
    const Result resumed = run_resident(prog, b, dtype, true, nullptr, /*sync_after=*/1, /*resume=*/true);
    CHECK(straight.losses == resumed.losses);
    for (std::size_t l = 0; l < straight.weights.size(); ++l) CHECK(same_bits(straight.weights[l], resumed.weights[l]));
    for (std::size_t i = 0; i < straight.moments.size(); ++i) CHECK(same_bits(straight.moments[i], resumed.moments[i]));
  }
}

TEST_CASE("a resident Program that does not fit a device, or updates on the host, is refused") {
  const Setup probe(1);
  Setup tiny(1, DeviceState::total_bytes(*probe.model, DType::F32) / 2);
  const core::Program prog = lower_resident(*tiny.model, 1, 1, DType::F32);
  CHECK_THROWS_AS(Executor(prog, tiny.ptrs, *tiny.state, {.seq_len = kT, .adamw = kAdamW}), OutOfMemory);

  Setup s(1);
  core::Program host = lower_resident(*s.model, 1, 1, DType::F32);
  for (core::Op& op : host.ops)
    if (op.kind == core::OpKind::Update) {
      op.stream = core::Stream::Cpu;  // the queue still says Compute: refused either way, before any step
      break;
    }
  CHECK_THROWS(Executor(host, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}));
}

TEST_CASE("a Program of a kind harmony-sim prices and the executor does not run is refused before any step") {
  // Every registered kind trains today; the refusal stays for the next one that does not (PlanKindSpec::trains). A
  // copy of resident's spec with trains = false stands in for it.
  Setup s(2);
  core::Plan plan;
  plan.kind = core::plan_kind("resident");
  plan.gpus = 2;
  plan.minibatch = kB;
  plan.u_fwd = plan.u_bwd = 1;
  core::Program prog = core::lower_plan(plan, describe_gpt2(*s.model, kT, {1, 2, 3, 4}));
  static core::PlanKindSpec priced_only = plan.kind.spec();
  priced_only.name = "priced-only";
  priced_only.trains = false;
  prog.graph.plan.kind = core::PlanKind(priced_only);
  CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                       doctest::Contains("plan kind priced-only is priced by harmony-sim only"), BackendError);
}

TEST_CASE("a resident or fsdp Program whose device updates a layer twice, or never, is refused") {
  // FlowInterpreter::device_updates, shared by both kinds' checks: an Update relabelled from layer 1 to layer 2 on
  // GPU 1 updates layer 2 there twice (and layer 1 never).
  for (const char* kind : {"resident", "fsdp"}) {
    CAPTURE(kind);
    Setup s(2);
    core::Plan plan;
    plan.kind = core::plan_kind(kind);
    plan.gpus = 2;
    plan.minibatch = kB;
    plan.u_fwd = plan.u_bwd = 1;
    core::Program prog = core::lower_plan(plan, describe_gpt2(*s.model, kT, {1, 2, 3, 4}));
    bool relabelled = false;
    for (core::Op& op : prog.ops)
      if (op.kind == core::OpKind::Update && op.device == 1 && op.layers.first == 1) {
        op.layers = core::LayerRange{2, 2};
        relabelled = true;
      }
    REQUIRE(relabelled);
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains("updates layer 2 of GPU 1 a second time"), BackendError);
  }
}
