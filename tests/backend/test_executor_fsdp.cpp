// Tests of the fsdp kind's Programs (core/kinds/fsdp.cpp; zero3's are the same, zero2's gather after the update)
// through the executor on CPU devices: over N > 1 GPUs each keeps one ShardState (1/N of every layer's weights,
// gradient and AdamW state), all-gathers a layer before its forward and backward, reduce-scatters its gradient into the
// shard and steps AdamW on the shard on the device; it trains like resident on the same plan (bit for bit with one
// microbatch per GPU, fp32 and bf16, host or device sums; within the reduction-order bounds with several), holds only
// its shards between steps, and stops and resumes through the HostState exactly. On one GPU it is resident.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/executor/flow_shard.hpp"
#include "backend/model/device_state.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

core::Program lower_kind(const char* kind, const Gpt2& model, int gpus, int u, DType dtype) {
  core::Plan plan;
  plan.kind = core::plan_kind(kind);
  plan.gpus = gpus;
  plan.minibatch = kB;
  plan.u_fwd = plan.u_bwd = u;
  plan.knobs.activation_policy = core::ActivationPolicy::Checkpoint;
  return core::lower_plan(plan, describe_gpt2(model, kT, {1, 2, 3, 4}, {.dtype = dtype}));
}

struct RunOptions {
  DType dtype = DType::F32;
  bool concurrent = true;
  bool device_sums = false;
  int sync_after = kSteps;  // the state synced back to the HostState after this many steps (and at the end)
  bool resume = false;      // the executor rebuilt from the synced state there: a stop and restart
  // non-empty: what each device holds between steps, at least (and at most with the rounding)
  std::vector<Bytes> state_bytes = {};
};

// kSteps of a Program with resident state: losses, then the HostState's weights and moments after sync_state().
Result train(const core::Program& prog, Setup& s, const RunOptions& o) {
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  const ExecutorOptions opts{.seq_len = kT,
                             .adamw = kAdamW,
                             .concurrent = o.concurrent,
                             .dtype = o.dtype,
                             .communicator = o.device_sums ? s.comm.get() : nullptr};
  auto ex = std::make_unique<Executor>(prog, s.ptrs, *s.state, opts);
  Result r;
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < kSteps; ++k) {
    if (k == o.sync_after) {
      ex->sync_state();
      if (o.resume) {
        ex.reset();
        ex = std::make_unique<Executor>(prog, s.ptrs, *s.state, opts);
      }
    }
    tokens.batch(k, kB, kT, in, tgt);
    r.losses.push_back(ex->step(in, tgt).loss);
    for (std::size_t d = 0; d < o.state_bytes.size(); ++d) {  // only the state is left (each buffer rounded up)
      CAPTURE(d);
      CHECK(s.ptrs[d]->memory().in_use >= o.state_bytes[d]);
      CHECK(s.ptrs[d]->memory().in_use <= o.state_bytes[d] + 256 * 6 * (s.model->num_layers() + 1));
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

// Per element |ours - theirs| <= 1e-6 + 1e-4 |theirs| (the replica-sum bound of test_executor_baselines.cpp).
bool within_sum_bound(const std::vector<float>& ours, const std::vector<float>& theirs) {
  if (ours.size() != theirs.size()) return false;
  for (std::size_t i = 0; i < ours.size(); ++i)
    if (!(std::abs(ours[i] - theirs[i]) <= 1e-6 + 1e-4 * std::abs(theirs[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("the fsdp Program all-gathers, reduce-scatters and updates every shard on the GPUs") {
  Setup s(2);
  const core::Program prog = lower_kind("fsdp", *s.model, 2, 1, DType::F32);
  REQUIRE(core::plan_kind("fsdp")->trains);
  int ags = 0, rss = 0, updates = 0;
  for (const core::Op& op : prog.ops) {
    CHECK(op.kind != core::OpKind::WB);
    CHECK(op.kind != core::OpKind::dWB);
    CHECK(op.kind != core::OpKind::ARD);
    ags += op.kind == core::OpKind::AG;
    rss += op.kind == core::OpKind::RS;
    if (op.kind == core::OpKind::Update) {
      ++updates;
      CHECK_FALSE(core::host_update(op));
    }
  }
  const int L = s.model->num_layers(), m = kB / 2;  // two microbatches of one sample per GPU
  CHECK(ags == 2 * 2 * m * L);                      // per GPU, microbatch and layer: forward and backward
  CHECK(rss == 2 * m * L);
  CHECK(updates == 2 * L);
  // a shard is 1/N of the state (each layer padded to N equal parts), well under resident's whole copy
  for (int r = 0; r < 2; ++r)
    CHECK(detail::ShardState::total_bytes(*s.model, DType::F32, r, 2) <
          DeviceState::total_bytes(*s.model, DType::F32) * 6 / 10);
}

// Tolerances. fsdp reduces each microbatch's gradient (RS: the ranks' gradients summed in rank order, on the host or
// by the CPU communicator, which also adds in rank order) into the shard, where resident accumulates every
// microbatch's gradient on its GPU first and all-reduces once. With one microbatch per GPU both sum the same numbers
// in the same order, and AdamW is elementwise (the shard's update is the whole tensor's, restricted), so losses,
// weights and moments are the same bits in fp32 and bf16. With several microbatches per GPU the adds are in another
// order: fp32, the replica-sum bound; bf16, whose shard gradient is rounded to bf16 after each add, the bf16
// baselines' bounds (step-1 loss within 2e-4, weights within 2 kSteps lr). Step 0's loss is bit-exact everywhere.
TEST_CASE("fsdp trains like resident on the same plan") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const int gpus : {2, 4}) {
      for (const int u : {1, 2}) {
        if ((kB / gpus) % u != 0) continue;
        for (const bool device_sums : {false, true}) {
          for (const bool concurrent : {true, false}) {
            CAPTURE(dtype_name(dtype));
            CAPTURE(gpus);
            CAPTURE(u);
            CAPTURE(device_sums);
            CAPTURE(concurrent);
            Setup a(gpus), b(gpus);
            RunOptions o{.dtype = dtype, .concurrent = concurrent, .device_sums = device_sums};
            for (int r = 0; r < gpus; ++r)
              o.state_bytes.push_back(detail::ShardState::total_bytes(*a.model, dtype, r, gpus));
            const Result ours = train(lower_kind("fsdp", *a.model, gpus, u, dtype), a, o);
            const Result theirs = train(lower_kind("resident", *b.model, gpus, u, dtype), b,
                                        {.dtype = dtype, .device_sums = device_sums});
            if (u == kB / gpus) {  // one microbatch per GPU
              check_same_bits(ours, theirs);
              continue;
            }
            CHECK(ours.losses[0] == theirs.losses[0]);
            if (dtype == DType::BF16) {
              CHECK(std::abs(ours.losses[1] - theirs.losses[1]) <= 2e-4 * std::abs(theirs.losses[1]));
              for (std::size_t l = 0; l < theirs.weights.size(); ++l) {
                CHECK(max_abs_diff(ours.weights[l], theirs.weights[l]) <= 2 * kSteps * kAdamW.lr);
              }
              continue;
            }
            CHECK(std::abs(ours.losses[1] - theirs.losses[1]) <= 1e-6 * std::abs(theirs.losses[1]));
            for (std::size_t l = 0; l < theirs.weights.size(); ++l) {
              CAPTURE(l);
              CHECK(within_sum_bound(ours.weights[l], theirs.weights[l]));
            }
            for (std::size_t i = 0; i < theirs.moments.size(); ++i) {
              CAPTURE(i);
              CHECK(within_sum_bound(ours.moments[i], theirs.moments[i]));
            }
          }
        }
      }
    }
  }
}

// zero3 lowers fsdp's Program with stage 3's hook time added to its ops' costs (core/kinds/zero3.cpp): the executor
// runs the same ops over the same dataflow, so it trains fsdp's numbers bit for bit, sharded or on one GPU, with
// several microbatches per GPU, fp32 and bf16, host or device sums.
TEST_CASE("zero3 trains fsdp's numbers bit for bit") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const int gpus : {1, 2}) {
      for (const bool device_sums : {false, true}) {
        if (gpus == 1 && device_sums) continue;
        CAPTURE(dtype_name(dtype));
        CAPTURE(gpus);
        CAPTURE(device_sums);
        Setup a(gpus), b(gpus);
        const core::Program z = lower_kind("zero3", *a.model, gpus, 1, dtype);
        const core::Program f = lower_kind("fsdp", *b.model, gpus, 1, dtype);
        REQUIRE(z.ops.size() == f.ops.size());
        RunOptions o{.dtype = dtype, .device_sums = device_sums};
        for (int r = 0; gpus > 1 && r < gpus; ++r)
          o.state_bytes.push_back(detail::ShardState::total_bytes(*a.model, dtype, r, gpus));
        const Result ours = train(z, a, o);
        o.state_bytes.clear();
        check_same_bits(ours, train(f, b, o));
      }
    }
  }
}

// zero2 (core/kinds/zero2.cpp) keeps the whole working weights on every GPU and 1/N of the gradient, master and
// moments (ShardState with whole weights), reduce-scatters each microbatch's gradient into the partition as fsdp does,
// updates the partition and all-gathers the updated slices into every GPU's whole copy. Its gradients, sums and AdamW
// are fsdp's (the same RS order, the same shard update), so it trains fsdp's numbers bit for bit at any microbatch
// count, fp32 and bf16, host or device sums; between steps each device holds its whole weights and its partition.
TEST_CASE("zero2 trains fsdp's numbers bit for bit, holding the whole weights and 1/N of the rest") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const int gpus : {2, 4}) {
      for (const int u : {1, 2}) {
        if ((kB / gpus) % u != 0) continue;
        for (const bool device_sums : {false, true}) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(gpus);
          CAPTURE(u);
          CAPTURE(device_sums);
          Setup a(gpus), b(gpus);
          RunOptions o{.dtype = dtype, .device_sums = device_sums};
          for (int r = 0; r < gpus; ++r) {
            o.state_bytes.push_back(
                detail::ShardState::total_bytes(*a.model, dtype, r, gpus, detail::ShardState::Weights::Whole));
            CHECK(o.state_bytes.back() > detail::ShardState::total_bytes(*a.model, dtype, r, gpus));
          }
          const Result ours = train(lower_kind("zero2", *a.model, gpus, u, dtype), a, o);
          o.state_bytes.clear();
          check_same_bits(ours, train(lower_kind("fsdp", *b.model, gpus, u, dtype), b, o));
        }
      }
    }
  }
}

TEST_CASE("a zero2 run stopped and resumed, or on jittered devices, trains the same bits") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dtype));
    Setup a(2), b(2), c(2, 16 * kMiB, /*jitter_us=*/200, /*jitter_seed=*/11);
    const core::Program prog = lower_kind("zero2", *a.model, 2, 1, dtype);
    const Result straight = train(prog, a, {.dtype = dtype});
    check_same_bits(straight, train(prog, b, {.dtype = dtype, .sync_after = 1, .resume = true}));
    check_same_bits(straight, train(prog, c, {.dtype = dtype}));
  }
}

// The whole-weights order is checked when the executor is built: a gather that does not wait for its update (it
// would copy the old weights to the other GPUs) is refused before any step.
TEST_CASE("a zero2 Program whose all-gather does not wait for its update is refused") {
  Setup s(2);
  core::Program prog = lower_kind("zero2", *s.model, 2, 1, DType::F32);
  int victim = -1;
  for (const core::OpQueue& q : prog.queues)
    if (q.device == 0 && !q.ops.empty() && prog.ops[static_cast<std::size_t>(q.ops[0])].kind == core::OpKind::AG)
      victim = q.ops[0];
  REQUIRE(victim >= 0);
  prog.ops[static_cast<std::size_t>(victim)].deps.clear();
  const std::string want = "executor: op " + prog.op_label(victim);
  CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                       doctest::Contains(want.c_str()), ScheduleViolation);
}

TEST_CASE("fsdp on one GPU is resident, bit for bit") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dtype));
    Setup a(1), b(1);
    const Result ours = train(lower_kind("fsdp", *a.model, 1, 2, dtype), a,
                              {.dtype = dtype, .state_bytes = {DeviceState::total_bytes(*a.model, dtype)}});
    const Result theirs = train(lower_kind("resident", *b.model, 1, 2, dtype), b, {.dtype = dtype});
    check_same_bits(ours, theirs);
  }
}

TEST_CASE("an fsdp run stopped and resumed through the HostState continues bit for bit") {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dtype));
    Setup a(2), b(2);
    const core::Program prog = lower_kind("fsdp", *a.model, 2, 1, dtype);
    const Result straight = train(prog, a, {.dtype = dtype});
    const Result resumed = train(prog, b, {.dtype = dtype, .sync_after = 1, .resume = true});
    check_same_bits(straight, resumed);
  }
}

// Devices whose streams sleep at random before each piece of work, freed memory poisoned: a missing order between
// the all-gather's copies, the reduce-scatter's writes into the shard (and the tie's) and the update shows as other
// bits.
TEST_CASE("fsdp's streams are ordered: jittered devices train to the same bits") {
  for (const bool device_sums : {false, true}) {
    CAPTURE(device_sums);
    Setup a(2), b(2, 16 * kMiB, /*jitter_us=*/200, /*jitter_seed=*/7);
    const core::Program prog = lower_kind("fsdp", *a.model, 2, 1, DType::F32);
    const Result calm = train(prog, a, {.device_sums = device_sums});
    const Result jittered = train(prog, b, {.device_sums = device_sums});
    check_same_bits(calm, jittered);
  }
}

// A non-finite gradient is reported as resident reports it (update_layers' rule: the highest layer's first such
// parameter, how many): the ranks' flags ORed, a parameter split over two shards counted once.
TEST_CASE("fsdp reports a non-finite gradient as resident does") {
  for (const int gpus : {2, 4}) {
    CAPTURE(gpus);
    Setup a(gpus), b(gpus);
    const int l = 2;  // a NaN in one block's weights: every gradient from the loss down is NaN
    a.state->weights(l)[5] = std::nanf("");
    b.state->weights(l)[5] = std::nanf("");
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    std::vector<std::int32_t> in, tgt;
    tokens.batch(0, kB, kT, in, tgt);
    const core::Program pf = lower_kind("fsdp", *a.model, gpus, 1, DType::F32);  // the executors keep a reference
    const core::Program pr = lower_kind("resident", *b.model, gpus, 1, DType::F32);
    Executor fsdp(pf, a.ptrs, *a.state, {.seq_len = kT, .adamw = kAdamW});
    Executor resident(pr, b.ptrs, *b.state, {.seq_len = kT, .adamw = kAdamW});
    const auto ours = fsdp.step(in, tgt).nonfinite_gradient;
    const auto theirs = resident.step(in, tgt).nonfinite_gradient;
    REQUIRE(ours.has_value());
    REQUIRE(theirs.has_value());
    CHECK(ours->layer == theirs->layer);
    CHECK(ours->param == theirs->param);
    CHECK(ours->params == theirs->params);
    CHECK(ours->params > 1);
  }
}
