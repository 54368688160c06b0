// The host-stream kind (core/kinds/host_stream.cpp) lowered and priced: which layers stay on the GPU, the bytes its
// Program moves per iteration against the closed forms of docs/baselines.md#host-stream, its one-GPU rule, and the
// host's live stash (sim/engine/host_account.cpp), which a kind that finishes a microbatch before the next holds once.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/kinds/kinds.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/program/program.hpp"
#include "sim/engine/host_account.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony {
namespace {

using core::Bytes;
using core::OpKind;
using core::Stream;

// Four layers of w weight bytes (w / 2 pure bf16 parameters), 10 buffer bytes, 2 w bytes of AdamW moments (bf16 m and
// v), 100 input bytes a sample; the last is the criterion.
core::Model four_layers(Bytes w = 1000) {
  core::Model m;
  m.name = "four";
  m.ubatch_fwd = {1, 2};
  m.ubatch_bwd = {1, 2};
  m.fp32_optimizer = false;
  for (int l = 0; l < 4; ++l) {
    core::Layer L;
    L.name = fmt::format("l{}", l);
    L.is_criterion = l == 3;
    L.weight_bytes = w;
    L.buffer_bytes = 10;
    L.param_count = w / 2;
    L.optimizer_state_bytes = 2 * w;
    L.update_time_cpu_s = 0.25;
    L.input_bytes_per_sample = 100;
    L.fwd_time_s = {0.001, 0.002};
    L.bwd_time_s = {0.003, 0.006};
    L.fwd_peak_bytes = {1400, 1600};
    L.bwd_peak_bytes = {1600, 1800};
    m.layers.push_back(L);
  }
  return m;
}

core::Plan host_stream(int minibatch, int u, Bytes capacity, int gpus = 1) {
  core::Plan p;
  p.kind = core::plan_kind("host-stream");
  p.gpus = gpus;
  p.minibatch = minibatch;
  p.u_fwd = p.u_bwd = u;
  p.knobs.gpu_capacity_bytes = capacity;
  return p;
}

// What a Program moves between host and GPU: per direction, each transfer's bytes plus the extra it carries, and the
// gradients' trips back (return_bytes).
struct Moved {
  Bytes h2d = 0, d2h = 0, returned = 0;
  std::map<OpKind, int> count;
};
Moved moved(const core::Program& p) {
  Moved mv;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const core::Op& o = p.ops[i];
    ++mv.count[o.kind];
    const core::NativeOpCosts& c = p.cost.op(static_cast<int>(i));
    if (o.stream == Stream::SwapIn) mv.h2d += o.bytes + c.extra_out_bytes;
    if (o.stream == Stream::SwapOut) mv.d2h += o.bytes + c.extra_out_bytes;
    mv.returned += c.return_bytes;
  }
  return mv;
}

core::MachineSpec one_gpu() {
  core::MachineSpec m;
  m.name = "test";
  m.gpus = 1;
  m.topology.switches = {{"sw0", 0, 1e9}};
  m.topology.gpus.push_back(core::GpuSpec{0, 1e9, 1, 1});
  m.topology.cpu_cores = 8;
  m.gpu_rates.memory_bytes_per_s = 1e9;
  m.gpu_rates.vector_efficiency = 1.0;
  return m;
}

}  // namespace

TEST_CASE("host-stream with room for everything: no layer streams; the update still streams the moments") {
  const core::Model m = four_layers();
  const int D = 8, u = 2, mb = D / u;  // four microbatches
  const core::Program prog = core::lower_plan(host_stream(D, u, Bytes{1} << 40), m);
  CHECK_NOTHROW(core::validate_program(prog));
  Moved mv = moved(prog);
  // WB: only the updates' inputs, each carrying its layer's 2 w of moments (pure bf16: no masters)
  CHECK(mv.count[OpKind::WB] == 4);
  CHECK(mv.count[OpKind::sX] == 0);  // every activation stays
  // dWB: every layer's gradient after each microbatch but the last (and back), then the update's output
  CHECK(mv.count[OpKind::dWB] == 4 * (mb - 1) + 4);
  CHECK(mv.returned == 4 * (mb - 1) * 1000);
  CHECK(mv.count[OpKind::Update] == 4);
  for (const core::Op& o : prog.ops)
    if (o.kind == OpKind::Update) {
      CHECK(o.stream == Stream::Compute);  // AdamW on the GPU
      CHECK(o.bytes == 14 * 500);          // a fused pure-bf16 AdamW: 14 bytes a parameter
    }
  // in: the data and the moments; out: the gradients, the updated W+B and the moments
  const Bytes data = mb * u * 100;
  CHECK(mv.h2d == data + 4 * 2000);
  CHECK(mv.d2h == 4 * (mb - 1) * 1000 + 4 * (1010 + 2000));
}

TEST_CASE("host-stream with room for nothing resident: every layer streams per microbatch, as the closed form says") {
  const core::Model m = four_layers();
  const int D = 8, u = 2, mb = D / u;
  // too small for a resident layer (W+B, gradient and its inputs beside the streaming working set), large enough to
  // stream; the estimate says which
  const core::Plan p = host_stream(D, u, 4000);
  const core::Program prog = core::lower_plan(p, m);
  CHECK_NOTHROW(core::validate_program(prog));
  Moved mv = moved(prog);
  // WB: each layer in for every microbatch's forward and backward, and for its update (with gradient and moments)
  CHECK(mv.count[OpKind::WB] == 4 * (2 * mb + 1));
  CHECK(mv.count[OpKind::dWB] == 4 * mb + 4);
  CHECK(mv.returned == 4 * (mb - 1) * 1000);
  const Bytes data = mb * u * 100;
  CHECK(mv.h2d >= data + 4 * (2 * mb * 1010 + 1010 + 1000 + 2000));
  // the inputs of layers 1-2 go home when their activations do not stay (the criterion's and the data stay)
  for (const core::Op& o : prog.ops)
    if (o.kind == OpKind::sX) CHECK(o.bytes == u * 100);
  CHECK(mv.d2h - mv.count[OpKind::sX] / 2 * u * 100 == 4 * mb * 1000 + 4 * (1010 + 2000));
  // a larger capacity keeps layers resident and moves less
  const core::Program roomy = core::lower_plan(host_stream(D, u, 20000), m);
  CHECK(moved(roomy).h2d < mv.h2d);
  CHECK(moved(roomy).count[OpKind::WB] < mv.count[OpKind::WB]);
}

TEST_CASE("host-stream prices the link it streams over: the host link bounds the iteration from below") {
  const core::Model m = four_layers(1'000'000);
  const core::Program prog = core::lower_plan(host_stream(8, 2, 4'000'000), m);
  sim::NativeOptions o;
  o.latency = false;
  const sim::NativeResult r = sim::run_native(prog, m, one_gpu(), o);
  const core::TimePs end = *std::max_element(r.timeline.end_ps.begin(), r.timeline.end_ps.end());
  // 1 GB/s both ways through one switch: the iteration lasts at least the larger direction's bytes
  Moved mv = moved(prog);
  CHECK(core::ps_to_seconds(end) >= static_cast<double>(std::max(mv.h2d + mv.returned, mv.d2h)) / 1e9 * 0.999);
  // and the same plan with twice the link is faster
  core::MachineSpec fast = one_gpu();
  fast.topology.switches[0].uplink_bytes_per_s = 2e9;
  fast.topology.gpus[0].link_bytes_per_s = 2e9;
  const sim::NativeResult r2 = sim::run_native(prog, m, fast, o);
  CHECK(*std::max_element(r2.timeline.end_ps.begin(), r2.timeline.end_ps.end()) < end);
}

TEST_CASE("host-stream runs on one GPU: the rule refuses several, and the search offers none") {
  const core::Model m = four_layers();
  CHECK_THROWS_WITH_AS(core::lower_plan(host_stream(8, 2, Bytes{1} << 40, 2), m),
                       doctest::Contains("host-stream runs on one GPU: plan.gpus is 2"), core::ScheduleError);
  const auto problem = core::split_problem(core::plan_kind("host-stream"), 2, 8);
  REQUIRE(problem.has_value());
  CHECK(problem->hint.find("plan.gpus: 1") != std::string::npos);
  CHECK_FALSE(core::split_problem(core::plan_kind("host-stream"), 1, 8).has_value());
  CHECK_FALSE(core::split_problem(core::plan_kind("dp-swap"), 2, 8).has_value());  // only the one-GPU kinds
  core::SearchSpace space;
  space.kind = core::plan_kind("host-stream");
  space.gpus = 2;
  space.minibatch = 8;
  space.capacity_bytes = Bytes{1} << 40;
  CHECK(core::enumerate_plans(m, space).empty());
  space.gpus = 1;
  CHECK(core::enumerate_plans(m, space).size() == 2);  // u = 1 and 2
  space.capacity_bytes = 100;                          // nothing fits: dropped
  CHECK(core::enumerate_plans(m, space).empty());
}

TEST_CASE("the host holds one microbatch's stash for kinds that finish a microbatch first, every one for Harmony") {
  const core::Model m = four_layers();
  const int D = 8, u = 2, mb = D / u;
  // dp-swap with its stash swapped: each microbatch's stash comes back in its own backward
  core::Plan dp;
  dp.kind = core::plan_kind("dp-swap");
  dp.gpus = 2;
  dp.minibatch = 2 * D;
  dp.u_fwd = dp.u_bwd = u;
  dp.knobs.activations = core::SwapChoice::Swap;
  dp.knobs.gpu_capacity_bytes = Bytes{1} << 40;
  const core::Program prog = core::lower_plan(dp, m);
  Bytes stashed = 0;
  for (const core::Op& o : prog.ops)
    if (o.kind == OpKind::sX && o.stream == Stream::SwapOut) stashed += o.bytes;
  REQUIRE(stashed > 0);
  // two GPUs, each holding one of its mb microbatches' stashes at a time (the sum over the iteration is mb times it)
  CHECK(sim::live_stash_peak_bytes(prog) == stashed / mb);
  CHECK(sim::host_account(prog, m).stash_bytes == stashed / mb);
}

}  // namespace harmony
