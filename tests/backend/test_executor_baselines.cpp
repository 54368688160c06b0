// Tests of the executor on the baselines' Programs (core::lower_plan): dp-swap, pp-swap, zero-infinity (and
// zero3-opt-offload, its parameter shards carried on the GPUs across steps) and l2l
// on 1, 2 and 4 GPUs, every microbatch size that divides the share, weights and activations kept or swapped, train
// the tiny GPT-2 to the PlainTrainer's weights (bit for bit where the summation order is the same), and Programs
// with a dependency removed are refused with ScheduleViolation before any op runs. Also the host memory the
// executor meters (one host gradient per layer).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/device_state.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"
#include "core/kinds/kinds.hpp"
#include "core/output/trace.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;
using harmony::core::plan_kind;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

int count_ops(const core::Program& p, core::OpKind kind) {
  return static_cast<int>(std::count_if(p.ops.begin(), p.ops.end(), [&](const core::Op& o) { return o.kind == kind; }));
}

const char* choice_name(core::SwapChoice c) { return c == core::SwapChoice::Swap ? "swap" : "keep"; }

// Removes from the first op of kind `victim` its dependency on an op of kind `on` (on `stream`); returns the op.
core::Plan keep_policy(core::Plan p) {
  p.knobs.activation_policy = core::ActivationPolicy::Keep;
  return p;
}

// Removes the first (`last`: the last) dependency of the first `victim` op on an `on` op of `stream`.
int remove_dep(core::Program& prog, core::OpKind victim, core::OpKind on, core::Stream stream, bool last = false) {
  for (std::size_t o = 0; o < prog.ops.size(); ++o) {
    core::Op& op = prog.ops[o];
    if (op.kind != victim) continue;
    auto match = [&](int d) {
      const core::Op& x = prog.ops[static_cast<std::size_t>(d)];
      return x.kind == on && x.stream == stream;
    };
    auto it = std::find_if(op.deps.begin(), op.deps.end(), match);
    if (last) {
      const auto rit = std::find_if(op.deps.rbegin(), op.deps.rend(), match);
      it = rit == op.deps.rend() ? op.deps.end() : std::prev(rit.base());
    }
    if (it != op.deps.end()) {
      op.deps.erase(it);
      return static_cast<int>(o);
    }
  }
  return -1;
}

}  // namespace

// Tolerances. Bit-exact where every layer's gradient is accumulated in one device buffer over all B samples in
// sample order and reaches the host once: the forward is per row and the kernels accumulate weight gradients row
// by row (docs/backend.md), so the microbatch size and the layer-by-layer order do not matter. That is dp-swap on
// one GPU with the weights kept, pp-swap with the weights kept (each layer lives on one stage, which runs the
// microbatches in order), l2l on one GPU, and any kind with a single microbatch on a single gradient owner
// (m = 1, N = 1 for the data-parallel kinds). Everywhere else the gradient is a sum of partial sums — the replicas'
// (ARD, RS, l2l's parameter server; in rank order) or the microbatches' (streamed weights: one dWB per
// microbatch, added on the host) — a different float summation order: per weight |ours - plain| <= 1e-6 +
// 1e-4·|plain| after 2 AdamW steps, the Harmony-DP bound of test_executor.cpp (a wrong average, a lost microbatch
// or replica moves weights by ~lr = 3e-3). Losses: step 0 is bit-exact everywhere (the forward does not depend on
// the schedule), step 1 within 1e-6 relative.
// zero-offload (core/kinds/zero_offload.cpp): the parameters uploaded once per step (a shard and an all-gather with
// N > 1), every microbatch's gradient reduce-scattered (N > 1) and its shard sent to the host, where the microbatches
// add up (DeepSpeed's stage 2 with cpu_offload moves every micro-step's gradient through host memory), CPU Adam on
// rank l mod N. Bit-exact with one microbatch on one GPU (one device buffer over all B samples in sample order);
// with several microbatches the host's sum of their gradients, with replicas the rank-order sum of the
// reduce-scatter, within the bounds above.
TEST_CASE("zero-offload Programs train like the PlainTrainer") {
  const Result& ref = reference();
  const core::PlanKind kind = core::plan_kind("zero-offload");
  int checked = 0, exact = 0;
  for (int gpus : {1, 2, 4}) {
    for (int u : {1, 2, 4}) {
      if ((kB / gpus) % u != 0) continue;
      for (core::ActivationPolicy policy : {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}) {
        CAPTURE(gpus);
        CAPTURE(u);
        const std::string policy_name = core::activation_policy_name(policy);
        CAPTURE(policy_name);
        Setup s(gpus);
        core::Plan plan = swapping_plan(kind, gpus, u, core::SwapChoice::Auto, core::SwapChoice::Auto);
        plan.knobs.activation_policy = policy;
        const core::Program prog = lower_swapping_plan(*s.model, plan);
        const int R = s.model->num_layers();
        // the parameters go up once a step, the gradients down every microbatch
        const int m = kB / gpus / u;
        CHECK(count_ops(prog, core::OpKind::WB) == gpus * R);
        CHECK(count_ops(prog, core::OpKind::dWB) == gpus * R * m);
        CHECK(count_ops(prog, core::OpKind::AG) == (gpus > 1 ? gpus * R : 0));
        CHECK(count_ops(prog, core::OpKind::RS) == (gpus > 1 ? gpus * R * m : 0));
        CHECK(count_ops(prog, core::OpKind::sX) == 0);  // activations never leave the GPU
        const Result r = run(prog, s);
        ++checked;
        CHECK(r.losses[0] == ref.losses[0]);
        CHECK(std::abs(r.losses[1] - ref.losses[1]) <= 1e-6 * std::abs(ref.losses[1]));
        bool all_same = true;
        for (std::size_t l = 0; l < ref.weights.size(); ++l) {
          CAPTURE(l);
          all_same = all_same && same_bits(r.weights[l], ref.weights[l]);
          for (std::size_t i = 0; i < ref.weights[l].size(); ++i) {
            const double x = r.weights[l][i], y = ref.weights[l][i];
            if (!(std::abs(x - y) <= 1e-6 + 1e-4 * std::abs(y))) {
              CHECK(x == doctest::Approx(y));
              break;
            }
          }
        }
        if (gpus == 1 && m == 1) CHECK(all_same);
        exact += all_same ? 1 : 0;
      }
    }
  }
  CHECK(checked == 12);  // N = 1: u 1, 2, 4; N = 2: u 1, 2; N = 4: u 1; both policies
  MESSAGE(fmt::format("zero-offload: {} configurations, {} bit-exact", checked, exact));
}

TEST_CASE("baseline Programs train like the PlainTrainer") {
  const Result& ref = reference();
  using core::PlanKind;
  using core::SwapChoice;
  struct Worst {
    double abs = 0, bound = 0, loss = 0;  // weight |ours - plain|, its fraction of the bound; step-1 loss, relative
    int cases = 0, exact = 0;
  };
  std::map<std::string, Worst> worst;
  std::map<std::string, Bytes> peak;  // "kind N u weights activations" -> the largest device peak
  int checked = 0;
  for (PlanKind kind : swapping_kinds()) {
    const bool dp = kind != plan_kind("pp-swap");
    const bool weights_choice = kind == plan_kind("dp-swap") || kind == plan_kind("pp-swap");
    for (int gpus : {1, 2, 4}) {
      const int share = dp ? kB / gpus : kB;
      for (int u : {1, 2, 4}) {
        if (share % u != 0 || (kind->one_microbatch && u != share)) continue;  // lohan: u = D/N
        for (SwapChoice w : {SwapChoice::Keep, SwapChoice::Swap}) {
          if (!weights_choice && w == SwapChoice::Swap) continue;  // zero-infinity and l2l always stream
          for (SwapChoice a : {SwapChoice::Keep, SwapChoice::Swap}) {
            for (core::ActivationPolicy policy : {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}) {
              const std::string name = core::plan_kind_name(kind);
              const std::string policy_name = core::activation_policy_name(policy);
              CAPTURE(policy_name);
              CAPTURE(name);
              CAPTURE(gpus);
              CAPTURE(u);
              const std::string weights = choice_name(w), activations = choice_name(a);
              CAPTURE(weights);
              CAPTURE(activations);
              Setup s(gpus);
              core::Plan plan = swapping_plan(kind, gpus, u, w, a);
              plan.knobs.activation_policy = policy;
              const core::Program prog = lower_swapping_plan(*s.model, plan);
              // checkpoint recomputes every backward's forward (REC); keep recomputes nothing
              const bool ckpt = policy == core::ActivationPolicy::Checkpoint;
              CHECK(count_ops(prog, core::OpKind::REC) == (ckpt ? count_ops(prog, core::OpKind::BWD) : 0));
              // the forced decisions are real: streamed weights swap in per microbatch, swapped stashes move
              const int m = share / u;
              const int R = s.model->num_layers();
              const int replicas = kind == plan_kind("pp-swap") ? 1 : gpus;  // pp-swap: each layer on one stage
              int wb =
                  kind == plan_kind("l2l") ? 2 * R * gpus : replicas * 2 * m * R;  // per layer, pass (and microbatch)
              if (weights_choice && w == SwapChoice::Keep) wb = replicas * R;      // once
              if (kind == plan_kind("zero3-opt-offload")) wb = gpus * R;  // each GPU's shard up after the update
              CHECK(count_ops(prog, core::OpKind::WB) == wb);
              if (kind == plan_kind("l2l")) {
                CHECK((count_ops(prog, core::OpKind::dY) > 0) == (a == SwapChoice::Swap));
              } else if (kind == plan_kind("lohan")) {
                CHECK(count_ops(prog, core::OpKind::sX) > 0);  // its checkpoints always go to the host
              } else if (kind == plan_kind("fsdp-offload")) {
                CHECK(count_ops(prog, core::OpKind::sX) == 0);  // FSDP keeps its activations on the GPU
              } else {
                CHECK((count_ops(prog, core::OpKind::sX) > 0) == (a == SwapChoice::Swap));
              }
              const Result r = run(prog, s);
              ++checked;
              Bytes pk = 0;
              for (auto* d : s.ptrs) pk = std::max(pk, d->memory().peak);
              peak[fmt::format("{} {} {} {} {} {}", name, gpus, u, weights, activations, policy_name)] = pk;
              const bool owner1 = !dp || gpus == 1;
              const bool exact =
                  owner1 && (m == 1 || (kind == plan_kind("dp-swap") && w == SwapChoice::Keep) ||
                             (kind == plan_kind("pp-swap") && w == SwapChoice::Keep) || kind == plan_kind("l2l"));
              CHECK(r.losses[0] == ref.losses[0]);
              CHECK(std::abs(r.losses[1] - ref.losses[1]) <= 1e-6 * std::abs(ref.losses[1]));
              if (exact) CHECK(r.losses[1] == ref.losses[1]);
              Worst& wst = worst[name];
              ++wst.cases;
              wst.loss = std::max(wst.loss, std::abs(r.losses[1] - ref.losses[1]) / std::abs(ref.losses[1]));
              bool all_same = true;
              for (std::size_t l = 0; l < ref.weights.size(); ++l) {
                CAPTURE(l);
                all_same = all_same && same_bits(r.weights[l], ref.weights[l]);
                if (exact) CHECK(same_bits(r.weights[l], ref.weights[l]));
                for (std::size_t i = 0; i < ref.weights[l].size(); ++i) {
                  const double x = r.weights[l][i], y = ref.weights[l][i];
                  const double d = std::abs(x - y);
                  wst.abs = std::max(wst.abs, d);
                  wst.bound = std::max(wst.bound, d / (1e-6 + 1e-4 * std::abs(y)));
                  if (!(d <= 1e-6 + 1e-4 * std::abs(y))) {
                    CHECK(x == doctest::Approx(y));
                    break;
                  }
                }
              }
              if (all_same) ++wst.exact;
            }
          }
        }
      }
    }
  }
  // the grid above, under both policies: 48 dp-swap, 72 pp-swap, 24 zero-infinity, 24 zero3-opt-offload, 24
  // fsdp-offload, 24 l2l, 12 lohan (u = D/N only)
  CHECK(checked == 228);
  for (const auto& [name, wst] : worst)
    MESSAGE(
        fmt::format("{}: {} configurations, {} bit-exact; worst weight difference {:.3g} ({:.2g} of the bound), "
                    "worst step-1 loss difference {:.3g} relative",
                    name, wst.cases, wst.exact, wst.abs, wst.bound, wst.loss));
  // Swapping is real: streaming the weights and swapping the stash lowers the device peak (one GPU, u = 1).
  for (const char* kind : {"dp-swap", "pp-swap"}) {
    const Bytes keep = peak.at(fmt::format("{} 1 1 keep keep checkpoint", kind));
    const Bytes swap = peak.at(fmt::format("{} 1 1 swap swap checkpoint", kind));
    const std::string name = kind;
    CAPTURE(name);
    CHECK(swap < keep);
    MESSAGE(
        fmt::format("{} on one GPU, u = 1: device peak {} bytes with everything kept, {} swapped", kind, keep, swap));
    // The keep policy really holds every layer's forward activations until the backward; swapping moves them.
    const Bytes held = peak.at(fmt::format("{} 1 1 keep keep keep", kind));
    const Bytes held_swapped = peak.at(fmt::format("{} 1 1 keep swap keep", kind));
    CHECK(held > keep);
    CHECK(held_swapped < held);
    MESSAGE(
        fmt::format("{} on one GPU, u = 1, weights kept: device peak {} bytes under keep, {} with its saved "
                    "activations swapped, {} under checkpoint",
                    kind, held, held_swapped, keep));
  }
}

TEST_CASE("a baseline step records a time for every op and writes a trace") {
  Setup s(2);
  const core::Program prog = lower_swapping_plan(
      *s.model, swapping_plan(core::plan_kind("zero-infinity"), 2, 1, core::SwapChoice::Auto, core::SwapChoice::Swap));
  std::vector<StepResult> steps;
  run(prog, s, &steps);
  const StepResult& sr = steps.back();
  REQUIRE(sr.begin.size() == prog.ops.size());
  for (std::size_t o = 0; o < prog.ops.size(); ++o) {
    CHECK(sr.begin[o] >= 0);
    CHECK(sr.end[o] >= sr.begin[o]);
  }
  std::ostringstream out;
  core::write_chrome_trace(out, prog, sr.begin, sr.end, {.source = "harmony-run (cpu)", .title = "test"});
  CHECK(out.str().find("traceEvents") != std::string::npos);
}

// Not by luck: which version of a tensor an op reads is decided from the Program's dependencies when the executor
// is built (the latest producer among the op's ancestors), so a read whose producer is not an ancestor is refused
// before any op runs, whatever order the ops would have run in.
TEST_CASE("a baseline Program missing a dependency is rejected") {
  using core::OpKind;
  using core::PlanKind;
  using core::Stream;
  using core::SwapChoice;
  struct Case {
    const char* what;
    core::Plan plan;
    OpKind victim, on;
    Stream stream;
    const char* message;    // after "executor: op <victim> "
    bool last_dep = false;  // remove the victim's last such dependency (an earlier one of its queue implies it)
  };
  const std::vector<Case> cases{
      {"dp-swap REC without its stash swap-in",
       swapping_plan(plan_kind("dp-swap"), 1, 2, SwapChoice::Swap, SwapChoice::Swap), OpKind::REC, OpKind::sX,
       Stream::SwapIn, "reads"},
      {"dp-swap (keep) BWD without its saved swap-in",
       keep_policy(swapping_plan(plan_kind("dp-swap"), 1, 2, SwapChoice::Swap, SwapChoice::Swap)), OpKind::BWD,
       OpKind::sX, Stream::SwapIn, "reads", true},
      {"l2l (keep) BWD without its saved swap-in",
       keep_policy(swapping_plan(plan_kind("l2l"), 2, 1, SwapChoice::Auto, SwapChoice::Keep)), OpKind::BWD, OpKind::sX,
       Stream::SwapIn, "reads", true},
      {"zero-infinity REC without its all-gather",
       swapping_plan(plan_kind("zero-infinity"), 2, 1, SwapChoice::Auto, SwapChoice::Keep), OpKind::REC, OpKind::AG,
       Stream::P2PIn, "reads"},
      {"pp-swap BWD without its P2P dY", swapping_plan(plan_kind("pp-swap"), 2, 1, SwapChoice::Keep, SwapChoice::Keep),
       OpKind::BWD, OpKind::dY, Stream::P2PIn, "reads"},
      {"pp-swap FWD without its P2P X", swapping_plan(plan_kind("pp-swap"), 4, 2, SwapChoice::Swap, SwapChoice::Swap),
       OpKind::FWD, OpKind::X, Stream::P2PIn, "reads"},
      {"zero-infinity FWD without its all-gather",
       swapping_plan(plan_kind("zero-infinity"), 2, 1, SwapChoice::Auto, SwapChoice::Keep), OpKind::FWD, OpKind::AG,
       Stream::P2PIn, "reads"},
      {"zero3-opt-offload carried WB without its Update",
       swapping_plan(plan_kind("zero3-opt-offload"), 2, 1, SwapChoice::Auto, SwapChoice::Keep), OpKind::WB,
       OpKind::Update, Stream::Cpu, "sends layer"},
      {"zero-infinity dWB without its reduce-scatter",
       swapping_plan(plan_kind("zero-infinity"), 4, 1, SwapChoice::Auto, SwapChoice::Swap), OpKind::dWB, OpKind::RS,
       Stream::P2POut, "reads"},
      {"l2l BWD without its host dY", swapping_plan(plan_kind("l2l"), 2, 1, SwapChoice::Auto, SwapChoice::Swap),
       OpKind::BWD, OpKind::dY, Stream::SwapIn, "reads"},
      {"dp-swap dWB without its all-reduce",
       swapping_plan(plan_kind("dp-swap"), 2, 1, SwapChoice::Keep, SwapChoice::Keep), OpKind::dWB, OpKind::ARD,
       Stream::Compute, "reads"},
      {"dp-swap Update without its dWB", swapping_plan(plan_kind("dp-swap"), 1, 1, SwapChoice::Swap, SwapChoice::Keep),
       OpKind::Update, OpKind::dWB, Stream::SwapOut, "updates layer"},
      {"l2l Update without a GPU's dWB", swapping_plan(plan_kind("l2l"), 4, 1, SwapChoice::Auto, SwapChoice::Keep),
       OpKind::Update, OpKind::dWB, Stream::SwapOut, "updates layer"},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    Setup s(c.plan.gpus);
    core::Program prog = lower_swapping_plan(*s.model, c.plan);
    const int victim = remove_dep(prog, c.victim, c.on, c.stream, c.last_dep);
    REQUIRE(victim >= 0);
    core::validate_program(prog);  // still structurally valid: only the data check can see it
    const std::string want = "executor: op " + prog.op_label(victim) + " (" + prog.op_id(victim) + ") " + c.message;
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains(want.c_str()), ScheduleViolation);
  }
}

// The executor refuses a Program whose task graph contradicts its kind's packs (a baseline kind with Harmony tasks, a
// Harmony kind without): one interpreter runs both shapes from the dataflow, and a malformed Program is not guessed at.
TEST_CASE("a Program whose kind and task graph disagree is refused") {
  {
    Setup s(2);
    core::Program prog = lower_swapping_plan(
        *s.model, swapping_plan(core::plan_kind("dp-swap"), 2, 2, core::SwapChoice::Auto, core::SwapChoice::Auto));
    prog.graph.plan.kind = core::plan_kind("harmony-dp");
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains("a harmony-dp Program without Harmony tasks"), BackendError);
  }
  {
    Setup s(2);
    core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 2, 2, 1, false);
    prog.graph.plan.kind = core::plan_kind("lohan");
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains("a lohan Program with Harmony tasks"), BackendError);
  }
}

// The interpreters run the Program's dataflow (core/program/dataflow.hpp), which the lowering fills: a Program without
// one (lowered with LowerOptions::dataflow off, as sim's evaluations lower) is refused, naming the fix.
TEST_CASE("a Program without its dataflow is refused") {
  {
    Setup s(2);
    core::Program prog = lower_swapping_plan(
        *s.model, swapping_plan(core::plan_kind("dp-swap"), 2, 2, core::SwapChoice::Auto, core::SwapChoice::Auto));
    REQUIRE(prog.dataflow.covers(prog));
    prog.dataflow = {};
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains("the dp-swap Program carries no dataflow"), BackendError);
  }
  {
    Setup s(2);
    core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 2, 2, 1, false);
    REQUIRE(prog.dataflow.covers(prog));
    prog.dataflow = {};
    CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW}),
                         doctest::Contains("the harmony-pp Program carries no dataflow"), BackendError);
  }
}

// bf16 mixed precision on the baselines' Programs. Bit-exact against the bf16 PlainTrainer over microbatches of u
// where each layer's dW is accumulated on one device, microbatch after microbatch in sample order, and reaches the
// host once (bf16 rounds dW after each microbatch, as the trainer does): dp-swap on one GPU with the weights kept,
// pp-swap with the weights kept, l2l on one GPU. Replicated or sharded gradients (dp-swap, zero-infinity on 2 GPUs)
// are partial sums added in fp32 and rounded once: the bounds of the Harmony-DP bf16 case (test_executor.cpp).
TEST_CASE("bf16: baseline Programs train like the bf16 PlainTrainer") {
  struct Case {
    core::PlanKind kind;
    int gpus, u;
    core::SwapChoice w;
    bool exact;
  };
  const std::vector<Case> cases = {
      {core::plan_kind("dp-swap"), 1, 1, core::SwapChoice::Keep, true},
      {core::plan_kind("pp-swap"), 2, 2, core::SwapChoice::Keep, true},
      {core::plan_kind("l2l"), 1, 2, core::SwapChoice::Swap, true},
      {core::plan_kind("dp-swap"), 2, 1, core::SwapChoice::Swap, false},
      {core::plan_kind("zero-infinity"), 2, 1, core::SwapChoice::Swap, false},
  };
  for (const Case& c : cases) {
    const std::string kind = core::plan_kind_name(c.kind);
    CAPTURE(kind);
    CAPTURE(c.gpus);
    CAPTURE(c.u);
    const Result ref = plain_run(DType::BF16, c.u);
    Setup s(c.gpus);
    const core::Program prog =
        lower_swapping_plan(*s.model, swapping_plan(c.kind, c.gpus, c.u, c.w, core::SwapChoice::Swap), DType::BF16);
    const Result r = run(prog, s, nullptr, true, DType::BF16);
    if (c.gpus == 2) {
      // The staging in chunks of 500 elements (weights, host sums and gradients split, a queue's two buffers in
      // turn) gives the same bits as whole transfers.
      Setup s2(c.gpus);
      const Result chunked = run(prog, s2, nullptr, true, DType::BF16, 1, nullptr, nullptr, 1000);
      CHECK(chunked.losses == r.losses);
      for (std::size_t l = 0; l < r.weights.size(); ++l) CHECK(same_bits(chunked.weights[l], r.weights[l]));
    }
    for (int k = 0; k < kSteps; ++k) {
      if (c.exact) {
        CHECK(r.losses[k] == ref.losses[k]);
      } else {
        CHECK(std::abs(r.losses[k] - ref.losses[k]) <= 2e-4 * std::abs(ref.losses[k]));
      }
    }
    for (std::size_t l = 0; l < ref.weights.size(); ++l) {
      CAPTURE(l);
      if (c.exact) {
        CHECK(same_bits(r.weights[l], ref.weights[l]));
      } else {
        CHECK(max_abs_diff(r.weights[l], ref.weights[l]) <= 2 * kSteps * kAdamW.lr);
      }
    }
  }
}

// Issue 36: the executor meters its host memory (Executor::host_memory), and a layer has one host gradient however
// many replicas or microbatches bring it: a dWB that adds, or a replica's that is not the writer's, lands in its
// queue's bounce buffer (as large as the queue's largest such dWB) — the buffers sim::accumulate_bounce_bytes counts.
TEST_CASE("host memory: the HostState once, one host gradient per layer, a bounce buffer per queue that needs one") {
  struct Case {
    const char* kind;
    core::SwapChoice weights;
    int bounces;  // GPUs with a bounce buffer
  };
  // dp-swap, weights swapped: a dWB per microbatch on both replicas; replica 0 copies its first and adds its second,
  // replica 1's land in its bounce. dp-swap, weights kept: one dWB per layer and replica; replica 0 copies, replica 1's
  // land in its bounce. Harmony-DP, one-layer packs: the same, whatever the kind (issue 33: its replicas used to write
  // the same sum one after another, each copying, and kept no bounce). l2l: one dWB per layer and GPU; GPU 0 copies,
  // GPU 1 adds.
  for (const Case& c : {Case{"dp-swap", core::SwapChoice::Swap, 2}, Case{"dp-swap", core::SwapChoice::Keep, 1},
                        Case{"harmony-dp", core::SwapChoice::Keep, 1}, Case{"l2l", core::SwapChoice::Keep, 1}}) {
    CAPTURE(std::string(c.kind));
    Setup s(2);
    const core::Program prog =
        plan_kind(c.kind)->packs
            ? lower_harmony_plan(*s.model, plan_kind(c.kind), 2, 1, 1, 1, false)
            : lower_swapping_plan(*s.model, swapping_plan(plan_kind(c.kind), 2, 1, c.weights, core::SwapChoice::Keep));
    // replica sums on the devices, as harmony-run's (the host path's sum is a transient of its own)
    Executor ex(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .communicator = s.comm.get()});
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    std::vector<std::int32_t> in, tgt;
    for (int k = 0; k < kSteps; ++k) {
      tokens.batch(k, kB, kT, in, tgt);
      (void)ex.step(in, tgt);
    }
    Bytes all = 0, owned = 0, largest = 0;
    for (int l = 0; l < s.model->num_layers(); ++l) {
      all += s.model->param_floats(l) * Bytes{4};
      owned += DeviceState::owned_floats(*s.model, l) * Bytes{4};
      largest = std::max(largest, s.model->param_floats(l) * Bytes{4});
    }
    const ExecutorHostMemory h = ex.host_memory();
    CHECK(h.peak.master_weights_bytes == all);
    CHECK(owned < all);                                // the tiny GPT-2 ties its lm_head to wte
    CHECK(h.peak.optimizer_state_bytes == 2 * owned);  // no moments for the tied lm_head (updated through wte)
    CHECK(h.peak.gradient_bytes == all);               // not one per replica
    CHECK(h.peak.staging_bytes == c.bounces * largest);
    CHECK(h.in_use_bytes <= h.peak_bytes());
  }
}

// The bounce buffers land their copies chunk by chunk, at most staging_chunk_bytes of fp32 each: Harmony-DP's replicas
// of a 100B model's packs would otherwise keep one whole-pack fp32 buffer per GPU (121 GB on 8 GPUs). The same bits
// as one whole-gradient chunk, in fp32 and bf16, for a kind whose bounce adds (dp-swap, weights swapped: a replica's
// second microbatch) and one whose bounce drops (Harmony-DP's second replica); the metered staging is the chunk.
TEST_CASE("host memory: the bounce buffer is at most one staging chunk, and chunking changes no bit") {
  constexpr Bytes kSmall = 4096;  // smaller than every layer's gradient but the LayerNorms'
  for (const char* kind : {"dp-swap", "harmony-dp"}) {
    for (const DType dt : {DType::F32, DType::BF16}) {
      CAPTURE(std::string(kind));
      CAPTURE(static_cast<int>(dt));
      const auto program = [&](Setup& s) {
        return plan_kind(kind)->packs
                   ? lower_harmony_plan(*s.model, plan_kind(kind), 2, 1, 1, 1, false)
                   : lower_swapping_plan(*s.model, swapping_plan(plan_kind(kind), 2, 1, core::SwapChoice::Swap,
                                                                 core::SwapChoice::Keep));
      };
      Setup whole(2), chunked(2);
      const core::Program pa = program(whole), pb = program(chunked);
      const Result a = run(pa, whole, nullptr, true, dt, 1, whole.comm.get());
      const Result b = run(pb, chunked, nullptr, true, dt, 1, chunked.comm.get(), nullptr, kSmall);
      CHECK(a.losses == b.losses);
      CHECK(a.weights == b.weights);
      CHECK(a.moments == b.moments);
      Setup s(2);
      const core::Program prog = program(s);  // the executor keeps a reference
      Executor ex(
          prog, s.ptrs, *s.state,
          {.seq_len = kT, .adamw = kAdamW, .dtype = dt, .staging_chunk_bytes = kSmall, .communicator = s.comm.get()});
      const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
      std::vector<std::int32_t> in, tgt;
      tokens.batch(0, kB, kT, in, tgt);
      (void)ex.step(in, tgt);
      // one bounce per GPU that needs one (dp-swap: both, harmony-dp: the second replica), each one chunk; bf16 adds
      // its staging rings (two chunks per queue that moves weights or gradients)
      // (bf16: one chunk of bf16 elements, widened: twice the chunk)
      const int bounces = std::string(kind) == "dp-swap" ? 2 : 1;
      const Bytes staging = ex.host_memory().peak.staging_bytes;
      if (dt == DType::F32) {
        CHECK(staging == bounces * kSmall);
      } else {
        CHECK(staging == bounces * 2 * kSmall + core::staging_ring_bytes(prog, false, kSmall));
      }
    }
  }
}
