// Tests of the swapping kinds (core/kinds/*.cpp, core/kinds/swapping.hpp): closed-form swap volumes of every baseline
// on a small synthetic model, Harmony's weight traffic against dp-swap's on bert_large, enumeration rules, GPipe's
// balanced split, and a grid of bert_large plans that validate, balance their memory ledger and run without deadlock
// under the reference cost model. Links sim/ for the timeline.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/kinds/swapping.hpp"
#include "core/model/profile.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/engine/simulator.hpp"
#include "sim/study/compare.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using core::Bytes;
using core::OpKind;
using core::plan_kind;
using core::PlanKind;
using core::Stream;
using core::SwapChoice;
using harmony::test::source_dir;

namespace {

const core::Model& bert_large() {
  static const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  return model;
}

// The synthetic model: R = 4 layers (the last is the weightless criterion), measured at u = 1, 2, 4.
// W and B are multiples of 4 so that ZeRO shards for N = 1, 2, 4 are exact; X_l(u) = u x_l exactly.
constexpr Bytes kW[] = {4096, 8192, 12288, 0};
constexpr Bytes kB[] = {1024, 0, 2048, 0};
constexpr Bytes kX[] = {100, 1000, 2000, 3000};  // input bytes per sample
constexpr int kR = 4;
constexpr Bytes kGW = 4096 + 1024 + 8192 + 12288 + 2048;  // sum of W + B

const core::Model& synthetic() {
  static const core::Model model = [] {
    core::Model m;
    m.name = "synthetic4";
    m.source = "test_baselines";
    m.ubatch_fwd = {1, 2, 4};
    m.ubatch_bwd = {1, 2, 4};
    for (int l = 0; l < kR; ++l) {
      core::Layer L;
      L.name = "L" + std::to_string(l);
      L.is_criterion = l == kR - 1;
      L.weight_bytes = kW[l];
      L.buffer_bytes = kB[l];
      L.param_count = kW[l] / 4;
      L.update_time_cpu_s = kW[l] > 0 ? 0.002 * (l + 1) : 0.0;
      L.input_bytes_per_sample = kX[l];
      for (int u : m.ubatch_fwd) {
        L.fwd_time_s.push_back(0.001 * (l + 1) * u);
        L.fwd_peak_bytes.push_back(kW[l] + kB[l] + 4 * kX[l] * u + 512);
      }
      for (int u : m.ubatch_bwd) {
        L.bwd_time_s.push_back(0.003 * (l + 1) * u);
        L.bwd_peak_bytes.push_back(2 * kW[l] + kB[l] + 6 * kX[l] * u + 1024);
      }
      m.layers.push_back(L);
    }
    m.validate();
    return m;
  }();
  return model;
}

Bytes X(int u, int l) { return l < kR ? u * kX[l] : 0; }

// Bytes moved by ops of `kind` on `stream`, summed over every GPU.
Bytes moved(const core::Program& p, OpKind kind, Stream stream) {
  Bytes s = 0;
  for (const auto& o : p.ops) {
    if (o.kind == kind && o.stream == stream) s += o.bytes;
  }
  return s;
}
int count(const core::Program& p, OpKind kind) {
  return static_cast<int>(
      std::count_if(p.ops.begin(), p.ops.end(), [kind](const core::Op& o) { return o.kind == kind; }));
}

// Runs the program on the reference cost model; fails the test on a deadlock.
sim::Timeline run(const core::Program& p, const core::Model& model) {
  sim::ReferenceCostModel cost(model, core::MachineSpec{});
  auto t = sim::run_timeline(p, cost.durations(p));
  INFO(sim::deadlock_report(p, t));
  REQUIRE_FALSE(t.deadlock);
  return t;
}

// Every allocation is freed once, on the same device, with the same tensor identity and size; but a kind's persistent
// state (OptState: zero3-opt-offload's parameter shards), which lives across steps and is never freed.
void check_ledger(const core::Program& p) {
  std::map<std::tuple<int, int, int, int, int, Bytes>, int> live;
  for (const auto& o : p.ops) {
    for (const auto& t : o.allocs)
      ++live[{o.device, static_cast<int>(t.kind), t.layers.first, t.layers.last, t.microbatch, t.bytes}];
    for (const auto& t : o.frees)
      --live[{o.device, static_cast<int>(t.kind), t.layers.first, t.layers.last, t.microbatch, t.bytes}];
  }
  for (const auto& [key, n] : live) {
    if (static_cast<core::TensorKind>(std::get<1>(key)) == core::TensorKind::OptState) {
      CHECK(n == 1);  // allocated once, kept
      continue;
    }
    CAPTURE(std::get<0>(key));
    CAPTURE(core::tensor_kind_name(static_cast<core::TensorKind>(std::get<1>(key))));
    CAPTURE(std::get<2>(key));
    CAPTURE(std::get<4>(key));
    CHECK(n == 0);
  }
}

// Peak of the memory ledger over the simulated timeline: allocations at their op's begin, frees at its
// end, compute workspaces while the op runs.
Bytes ledger_peak(const core::Program& p, const sim::Timeline& t, int device) {
  std::vector<std::pair<core::TimePs, Bytes>> ev;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const auto& o = p.ops[i];
    if (o.device != device) continue;
    for (const auto& a : o.allocs) ev.emplace_back(t.begin_ps[i], a.bytes);
    for (const auto& f : o.frees) ev.emplace_back(t.end_ps[i], -f.bytes);
    if (o.workspace_bytes > 0) {
      ev.emplace_back(t.begin_ps[i], o.workspace_bytes);
      ev.emplace_back(t.end_ps[i], -o.workspace_bytes);
    }
  }
  std::sort(ev.begin(), ev.end());  // at equal times frees (negative) come first
  Bytes cur = 0;
  Bytes peak = 0;
  for (const auto& e : ev) {
    cur += e.second;
    peak = std::max(peak, cur);
  }
  return peak;
}

// The kinds without packs (the swapping kinds), in listing order.
std::vector<PlanKind> swapping_kinds() {
  std::vector<PlanKind> out;
  for (const PlanKind& k : core::plan_kinds())
    if (core::is_swapping_kind(k)) out.push_back(k);  // zero-offload is a baseline that never swaps
  return out;
}

// What the tests ask of a swapping kind's enumeration (core::SearchSpace's fields for it).
struct SwapSearch {
  std::vector<int> ubatch_sizes;
  int ubatch_step = 1;
  bool drop_infeasible = true;
  std::vector<core::ActivationPolicy> activation_policies = {core::ActivationPolicy::Checkpoint};
  std::vector<core::OffloadTier> offloads = {core::OffloadTier::Cpu};
};

// The plans core::enumerate_plans lists for `kind` on N GPUs, minibatch D.
std::vector<core::Plan> swapping_plans(PlanKind kind, const core::Model& model, int n, int d, Bytes capacity,
                                       const SwapSearch& o = {}) {
  core::SearchSpace space;
  space.kind = kind;
  space.gpus = n;
  space.minibatch = d;
  space.capacity_bytes = capacity;
  space.spec.u_bwd = o.ubatch_sizes;
  space.spec.ubatch_step = o.ubatch_step;
  space.drop_infeasible = o.drop_infeasible;
  space.activation_policies = o.activation_policies;
  space.offloads = o.offloads;
  std::vector<core::Plan> out;
  for (const core::Candidate& c : core::enumerate_plans(model, space)) out.push_back(c.plan);
  return out;
}

core::Plan make_plan(PlanKind kind, int n, int d, int u, SwapChoice w, SwapChoice a) {
  core::Plan p;
  p.kind = kind;
  p.gpus = n;
  p.minibatch = d;
  p.u_fwd = p.u_bwd = u;
  p.knobs.weights = w;
  p.knobs.activations = a;
  return p;
}

}  // namespace

TEST_CASE("the swapping kinds' properties (their PlanKindSpecs)") {
  CHECK(swapping_kinds().size() == 7);
  CHECK(core::closest_match("zero_infinity", core::plan_kind_names()) == "zero-infinity");
  for (const PlanKind& k : core::plan_kinds()) {
    CAPTURE(k.name());
    // data-parallel: all but pp-swap and harmony-pp (each GPU takes D/N)
    CHECK(k->data_parallel == (k != plan_kind("pp-swap") && k != plan_kind("harmony-pp")));
    // NVMe tiers: Harmony's two modes, the two ZeRO-3 offload kinds and lohan; one microbatch: lohan only
    CHECK(k->offload_tiers == (k == plan_kind("harmony-pp") || k == plan_kind("harmony-dp") ||
                               k == plan_kind("zero-infinity") || k == plan_kind("zero3-opt-offload") ||
                               k == plan_kind("lohan")));
    CHECK(k->one_microbatch == (k == plan_kind("lohan")));
  }
}

// Closed forms. N GPUs, minibatch D = 16, u = 2, GW = sum of W + B = 27648, X_l = u x_l.
// dp-swap, m = D/(N u) microbatches per GPU:
//   weights and stash swapped: WB = N m 2 GW (every layer in for every forward and backward),
//     dWB = N m GW, ARD = N m GW (N > 1), sX out = sX in = N m (X_1 + X_2) (layers 1..R-2),
//     X in = 2 N m X_0 (the data read again for the backward)
//   nothing swapped: WB = dWB = N GW, ARD = N GW (N > 1), no sX, X in = N m X_0
TEST_CASE("dp-swap swap bytes equal the closed form") {
  const auto& model = synthetic();
  const int D = 16;
  const int u = 2;
  for (int N : {1, 2, 4}) {
    const Bytes m = D / N / u;
    CAPTURE(N);
    {
      const auto p =
          core::lower_plan(make_plan(plan_kind("dp-swap"), N, D, u, SwapChoice::Swap, SwapChoice::Swap), model);
      CHECK(moved(p, OpKind::WB, Stream::SwapIn) == N * m * 2 * kGW);
      CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == N * m * kGW);
      CHECK(moved(p, OpKind::ARD, Stream::Compute) == (N > 1 ? N * m * kGW : 0));
      CHECK(moved(p, OpKind::sX, Stream::SwapOut) == N * m * (X(u, 1) + X(u, 2)));
      CHECK(moved(p, OpKind::sX, Stream::SwapIn) == N * m * (X(u, 1) + X(u, 2)));
      CHECK(moved(p, OpKind::X, Stream::SwapIn) == 2 * N * m * X(u, 0));
      CHECK(count(p, OpKind::FWD) == N * m * kR);
      CHECK(count(p, OpKind::BWD) == N * m * kR);
      CHECK(count(p, OpKind::Update) == N * 3);  // every replica updates its 3 weighted layers
      CHECK(count(p, OpKind::DEL) == 0);
      check_ledger(p);
      run(p, model);
    }
    {
      const auto p =
          core::lower_plan(make_plan(plan_kind("dp-swap"), N, D, u, SwapChoice::Keep, SwapChoice::Keep), model);
      CHECK(moved(p, OpKind::WB, Stream::SwapIn) == N * kGW);
      CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == N * kGW);
      CHECK(moved(p, OpKind::ARD, Stream::Compute) == (N > 1 ? N * kGW : 0));
      CHECK(moved(p, OpKind::sX, Stream::SwapOut) == 0);
      CHECK(moved(p, OpKind::X, Stream::SwapIn) == N * m * X(u, 0));
      CHECK(count(p, OpKind::DEL) == N);
      check_ledger(p);
      run(p, model);
    }
  }
}

// pp-swap, m = D/u microbatches through every stage, stages given, everything swapped:
//   WB = 2 m GW, dWB = m GW, sX out = sX in = m (X_1 + X_2 + X_3) (GPipe stashes every layer's input
//   until the backward phase, the criterion's too), X in = 2 m X_0,
//   P2P: Y = dX = m sum over stage boundaries of X_{first layer of the next stage}.
//   Nothing swapped: WB = dWB = GW, X in = m X_0, no sX.
TEST_CASE("pp-swap swap bytes equal the closed form") {
  const auto& model = synthetic();
  const int D = 16;
  const int u = 2;
  const Bytes m = D / u;
  const std::vector<std::vector<core::LayerRange>> splits = {
      {{0, 3}}, {{0, 1}, {2, 3}}, {{0, 0}, {1, 1}, {2, 2}, {3, 3}}};
  for (const auto& stages : splits) {
    const int N = static_cast<int>(stages.size());
    CAPTURE(N);
    Bytes boundary = 0;
    for (std::size_t s = 1; s < stages.size(); ++s) boundary += X(u, stages[s].first);
    auto plan = make_plan(plan_kind("pp-swap"), N, D, u, SwapChoice::Swap, SwapChoice::Swap);
    plan.stages = stages;
    auto p = core::lower_plan(plan, model);
    CHECK(moved(p, OpKind::WB, Stream::SwapIn) == 2 * m * kGW);
    CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == m * kGW);
    CHECK(moved(p, OpKind::sX, Stream::SwapOut) == m * (X(u, 1) + X(u, 2) + X(u, 3)));
    CHECK(moved(p, OpKind::sX, Stream::SwapIn) == m * (X(u, 1) + X(u, 2) + X(u, 3)));
    CHECK(moved(p, OpKind::X, Stream::SwapIn) == 2 * m * X(u, 0));
    CHECK(moved(p, OpKind::Y, Stream::P2POut) == m * boundary);
    CHECK(moved(p, OpKind::dX, Stream::P2POut) == m * boundary);
    CHECK(moved(p, OpKind::X, Stream::P2PIn) == m * boundary);
    CHECK(moved(p, OpKind::dY, Stream::P2PIn) == m * boundary);
    CHECK(count(p, OpKind::Update) == 3);
    CHECK(p.devices.size() == stages.size());
    check_ledger(p);
    run(p, model);

    plan.knobs.weights = SwapChoice::Keep;
    plan.knobs.activations = SwapChoice::Keep;
    p = core::lower_plan(plan, model);
    CHECK(moved(p, OpKind::WB, Stream::SwapIn) == kGW);
    CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == kGW);
    CHECK(moved(p, OpKind::sX, Stream::SwapOut) == 0);
    CHECK(moved(p, OpKind::X, Stream::SwapIn) == m * X(u, 0));
    CHECK(moved(p, OpKind::Y, Stream::P2POut) == m * boundary);
    check_ledger(p);
    run(p, model);
  }
}

// zero-infinity, m = D/(N u) per GPU; N divides every layer's W and B so shards are exact:
//   WB = N m 2 (GW / N) = 2 m GW (each GPU fetches its shard for every forward and backward),
//   AG = N m 2 GW (N > 1; each GPU's all-gather yields the full layer), RS = N m GW (N > 1),
//   dWB = N m (GW / N) = m GW (gradient shards to the host every microbatch),
//   stash swapped: sX out = sX in = N m (X_1 + X_2), X in = 2 N m X_0.
//   Updates: one per weighted layer in total (3), on the CPU of rank l mod N.
TEST_CASE("zero-infinity swap bytes equal the closed form") {
  const auto& model = synthetic();
  const int D = 16;
  const int u = 2;
  for (int N : {1, 2, 4}) {
    CAPTURE(N);
    const Bytes m = D / N / u;
    const auto p =
        core::lower_plan(make_plan(plan_kind("zero-infinity"), N, D, u, SwapChoice::Auto, SwapChoice::Swap), model);
    CHECK(moved(p, OpKind::WB, Stream::SwapIn) == 2 * m * kGW);
    CHECK(moved(p, OpKind::AG, Stream::P2PIn) == (N > 1 ? N * m * 2 * kGW : 0));
    CHECK(moved(p, OpKind::RS, Stream::P2POut) == (N > 1 ? N * m * kGW : 0));
    CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == m * kGW);
    CHECK(moved(p, OpKind::sX, Stream::SwapOut) == N * m * (X(u, 1) + X(u, 2)));
    CHECK(moved(p, OpKind::sX, Stream::SwapIn) == N * m * (X(u, 1) + X(u, 2)));
    CHECK(moved(p, OpKind::X, Stream::SwapIn) == 2 * N * m * X(u, 0));
    CHECK(count(p, OpKind::Update) == 3);
    for (const auto& o : p.ops) {
      if (o.kind == OpKind::Update) CHECK(o.device == o.layers.first % N);
    }
    check_ledger(p);
    run(p, model);
  }
}

// zero3-opt-offload, m = D/(N u) per GPU: zero-infinity's gradient path with the parameter shards kept on the GPUs:
//   WB = N (GW / N) = GW (each GPU's updated shard up once, after its layer's Update, never before a gather),
//   AG = N m 2 GW (N > 1), RS = N m GW (N > 1), dWB = m GW; each GPU allocates its shards (GW / N; the whole layers
//   when N = 1) as OptState once and never frees them; with N = 1 no AG and no gathered weights to free.
TEST_CASE(
    "zero3-opt-offload: resident parameter shards, zero-infinity's gradient path, the shards up after the update") {
  const auto& model = synthetic();
  const int D = 16;
  const int u = 2;
  const PlanKind kind = plan_kind("zero3-opt-offload");
  for (int N : {1, 2, 4}) {
    CAPTURE(N);
    const Bytes m = D / N / u;
    const auto plan = make_plan(kind, N, D, u, SwapChoice::Auto, SwapChoice::Swap);
    const auto p = core::lower_plan(plan, model);
    CHECK(moved(p, OpKind::WB, Stream::SwapIn) == kGW);
    CHECK(moved(p, OpKind::AG, Stream::P2PIn) == (N > 1 ? N * m * 2 * kGW : 0));
    CHECK(moved(p, OpKind::RS, Stream::P2POut) == (N > 1 ? N * m * kGW : 0));
    CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == m * kGW);
    CHECK(count(p, OpKind::Update) == 3);
    CHECK(count(p, OpKind::WB) == 3 * N);
    std::vector<Bytes> state(static_cast<std::size_t>(N), 0);
    for (const auto& o : p.ops) {
      if (o.kind == OpKind::WB) {  // after its layer's update, on every GPU
        bool after_update = false;
        for (const int d : o.deps) after_update |= p.ops[static_cast<std::size_t>(d)].kind == OpKind::Update;
        CHECK(after_update);
      }
      for (const auto& t : o.allocs)
        if (t.kind == core::TensorKind::OptState) state[static_cast<std::size_t>(o.device)] += t.bytes;
      for (const auto& t : o.frees) CHECK(t.kind != core::TensorKind::OptState);
    }
    for (int g = 0; g < N; ++g) CHECK(state[static_cast<std::size_t>(g)] == kGW / N);
    // the decision's estimate counts the shards: above zero-infinity's by exactly GW / N
    auto zi = plan;
    zi.kind = plan_kind("zero-infinity");
    CHECK(core::decide_swaps(plan, model).front().estimate_bytes ==
          core::decide_swaps(zi, model).front().estimate_bytes + kGW / N);
    run(p, model);
  }
}

// l2l, m = D/(N u) per GPU, S = X_1 + X_2 + X_3 (every layer's input but the data):
//   WB = 2 N GW (each layer once per pass), dWB = N GW, X in = 2 N m X_0, sX out = N m S (the stash),
//   boundary kept on the GPU: sX in = N m S, no dX/dY;
//   boundary through the host:  sX in = 2 N m S (forward input and stash), dX out = dY in = N m S.
//   Updates: once per weighted layer, all on the parameter server (GPU 0's CPU).
TEST_CASE("l2l swap bytes equal the closed form") {
  const auto& model = synthetic();
  const int D = 16;
  const int u = 2;
  const Bytes S = X(u, 1) + X(u, 2) + X(u, 3);
  for (int N : {1, 2, 4}) {
    for (SwapChoice a : {SwapChoice::Keep, SwapChoice::Swap}) {
      CAPTURE(N);
      const bool sa = a == SwapChoice::Swap;
      CAPTURE(sa);
      const Bytes m = D / N / u;
      const auto p = core::lower_plan(make_plan(plan_kind("l2l"), N, D, u, SwapChoice::Auto, a), model);
      CHECK(moved(p, OpKind::WB, Stream::SwapIn) == 2 * N * kGW);
      CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == N * kGW);
      CHECK(moved(p, OpKind::X, Stream::SwapIn) == 2 * N * m * X(u, 0));
      CHECK(moved(p, OpKind::sX, Stream::SwapOut) == N * m * S);
      CHECK(moved(p, OpKind::sX, Stream::SwapIn) == (sa ? 2 : 1) * N * m * S);
      CHECK(moved(p, OpKind::dX, Stream::SwapOut) == (sa ? N * m * S : 0));
      CHECK(moved(p, OpKind::dY, Stream::SwapIn) == (sa ? N * m * S : 0));
      CHECK(count(p, OpKind::Update) == 3);
      for (const auto& o : p.ops) {
        if (o.kind == OpKind::Update) CHECK(o.device == 0);
      }
      check_ledger(p);
      run(p, model);
    }
  }
}

// lohan, N GPUs, u = D/N = 2 (one microbatch per GPU), weights always streamed, the stash always on the host:
//   WB = 2 N GW, dWB = N GW, ARD = N GW (N > 1), sX out = sX in = N (X_1 + X_2), X in = 2 N X_0;
//   one Update per weighted layer (3, whatever N: the replicas share one optimizer pass, on rank 0's CPU queue;
//   issue 35), each depending on nothing but its own layer's dWB on that rank, so the reference timeline starts
//   Update(2) before the backward of layer 0 ends (the optimizer overlaps the backward).
//   offload: nvme: every WB reads its W+B from the drives (2 N GW), every Update reads the layer's state and
//   masters and writes them back once per iteration (the synthetic model is FP32: no narrow copy).
TEST_CASE("lohan swap bytes equal the closed form, and each update overlaps the rest of the backward") {
  const auto& model = synthetic();
  const int u = 2;
  for (int N : {1, 2, 4}) {
    CAPTURE(N);
    const int D = N * u;
    auto plan = make_plan(plan_kind("lohan"), N, D, u, SwapChoice::Auto, SwapChoice::Auto);
    const auto p = core::lower_plan(plan, model);
    CHECK(moved(p, OpKind::WB, Stream::SwapIn) == 2 * N * kGW);
    CHECK(moved(p, OpKind::dWB, Stream::SwapOut) == N * kGW);
    CHECK(moved(p, OpKind::ARD, Stream::Compute) == (N > 1 ? N * kGW : 0));
    CHECK(moved(p, OpKind::sX, Stream::SwapOut) == N * (X(u, 1) + X(u, 2)));
    CHECK(moved(p, OpKind::sX, Stream::SwapIn) == N * (X(u, 1) + X(u, 2)));
    CHECK(moved(p, OpKind::X, Stream::SwapIn) == 2 * N * X(u, 0));
    CHECK(count(p, OpKind::REC) == N * kR);  // checkpoint: every layer recomputed
    CHECK(count(p, OpKind::Update) == 3);    // the host optimizer work per iteration does not grow with N
    CHECK_FALSE(p.cost.offload_nvme);
    for (std::size_t i = 0; i < p.ops.size(); ++i) {
      const auto& o = p.ops[i];
      if (o.kind != OpKind::Update) continue;
      REQUIRE(o.deps.size() == 1);
      const auto& d = p.ops[static_cast<std::size_t>(o.deps[0])];
      CHECK(d.kind == OpKind::dWB);
      CHECK(d.layers.first == o.layers.first);
      CHECK(d.device == o.device);
      CHECK(o.device == 0);
      CHECK(p.cost.op(static_cast<int>(i)).nvme_read_bytes == 0);
    }
    check_ledger(p);
    const auto t = run(p, model);
    core::TimePs upd2_begin_ps = -1, bwd0_end_ps = -1;
    for (std::size_t i = 0; i < p.ops.size(); ++i) {
      const auto& o = p.ops[i];
      if (o.device != 0) continue;
      if (o.kind == OpKind::Update && o.layers.first == 2) upd2_begin_ps = t.begin_ps[i];
      if (o.kind == OpKind::BWD && o.layers.first == 0) bwd0_end_ps = t.end_ps[i];
    }
    CHECK(upd2_begin_ps >= 0);
    CHECK(upd2_begin_ps < bwd0_end_ps);

    plan.knobs.offload = core::OffloadTier::Nvme;
    const auto q = core::lower_plan(plan, model);
    CHECK(q.cost.offload_nvme);
    Bytes read = 0, write = 0, state = 0;
    for (int l = 0; l < kR; ++l) state += model.optimizer_state_bytes(l, l) + model.master_bytes(l, l);
    for (std::size_t i = 0; i < q.ops.size(); ++i) {
      const core::NativeOpCosts& c = q.cost.op(static_cast<int>(i));
      read += c.nvme_read_bytes;
      write += c.nvme_write_bytes;
      if (q.ops[i].kind == OpKind::WB) CHECK(c.nvme_read_bytes == q.ops[i].bytes);
    }
    CHECK(read == 2 * N * kGW + state);  // the parameters per replica, the optimizer state once
    CHECK(write == state);
    check_ledger(q);
  }
}

TEST_CASE("automatic swap decisions follow the capacity") {
  const auto& model = synthetic();
  auto plan = make_plan(plan_kind("dp-swap"), 1, 16, 2, SwapChoice::Auto, SwapChoice::Auto);
  plan.knobs.gpu_capacity_bytes = core::kGiB;
  auto d = core::decide_swaps(plan, model);
  REQUIRE(d.size() == 1);
  CHECK_FALSE(d[0].weights);
  CHECK_FALSE(d[0].activations);
  CHECK(d[0].fits);
  plan.knobs.gpu_capacity_bytes = 1;
  d = core::decide_swaps(plan, model);
  CHECK(d[0].weights);
  CHECK(d[0].activations);
  CHECK_FALSE(d[0].fits);
  // zero-infinity and l2l always stream the weights
  for (PlanKind k : {plan_kind("zero-infinity"), plan_kind("l2l")}) {
    auto p = make_plan(k, 1, 16, 2, SwapChoice::Keep, SwapChoice::Auto);
    p.knobs.gpu_capacity_bytes = core::kGiB;
    d = core::decide_swaps(p, model);
    CHECK(d[0].weights);
    CHECK_FALSE(d[0].activations);
  }
  // bert_large, u = 64: as the capacity shrinks, the stash goes first, then the weights
  auto bp = make_plan(plan_kind("dp-swap"), 1, 64, 64, SwapChoice::Auto, SwapChoice::Auto);
  std::vector<std::pair<bool, bool>> regimes;
  bool prev_w = false;
  bool prev_a = false;
  for (Bytes cap = 16 * core::kGiB; cap > 0; cap -= 64 * core::kMiB) {
    bp.knobs.gpu_capacity_bytes = cap;
    const auto bd = core::decide_swaps(bp, bert_large())[0];
    CHECK((bd.weights || !prev_w));  // monotone in the capacity
    if (!bd.weights) CHECK((bd.activations || !prev_a));
    if (regimes.empty() || regimes.back() != std::pair{bd.weights, bd.activations})
      regimes.emplace_back(bd.weights, bd.activations);
    prev_w = bd.weights;
    prev_a = bd.activations;
  }
  CHECK(regimes.size() >= 3);
  CHECK(regimes.front() == std::pair{false, false});
  CHECK(regimes[1] == std::pair{false, true});
  CHECK(regimes[2].first);
  // pp-swap decides per stage
  auto pp = make_plan(plan_kind("pp-swap"), 2, 16, 2, SwapChoice::Auto, SwapChoice::Auto);
  CHECK(core::decide_swaps(pp, model).size() == 2);
}

TEST_CASE("Harmony moves weights once per pack per pass, dp-swap once per microbatch (bert_large)") {
  const auto& model = bert_large();
  Bytes gw_total = model.weight_bytes(0, model.num_layers() - 1) + model.buffer_bytes(0, model.num_layers() - 1);
  const int N = 2;
  const int D = 32;
  for (int u : {2, 4, 8}) {
    CAPTURE(u);
    const Bytes m = D / N / u;
    core::Plan hp;
    hp.kind = core::plan_kind("harmony-dp");
    hp.gpus = N;
    hp.minibatch = D;
    hp.u_fwd = u;
    hp.u_bwd = u;
    core::manual_packs(model.num_layers(), 7, hp.packs_fwd, hp.packs_bwd);
    core::LowerOptions lo;
    lo.dp_first_gpu_only = false;
    const auto harmony = core::lower_harmony(core::compose_task_graph(hp, model.num_layers()), model, lo);
    // Harmony: every GPU swaps each FWD pack and each BWD pack in once, whatever m is
    Bytes packs = 0;
    for (const auto& r : hp.packs_fwd)
      packs += model.weight_bytes(r.first, r.last) + model.buffer_bytes(r.first, r.last);
    for (const auto& r : hp.packs_bwd)
      packs += model.weight_bytes(r.first, r.last) + model.buffer_bytes(r.first, r.last);
    const Bytes harmony_wb = moved(harmony, OpKind::WB, Stream::SwapIn);
    CHECK(harmony_wb == N * packs);
    CHECK(harmony_wb <= 2 * N * gw_total);
    // dp-swap that cannot keep the weights: every layer for every forward and backward of every microbatch
    auto bp = make_plan(plan_kind("dp-swap"), N, D, u, SwapChoice::Auto, SwapChoice::Auto);
    bp.knobs.gpu_capacity_bytes = 2 * core::kGiB;  // bert_large's W + grads (2.7 GB) do not fit
    REQUIRE(core::decide_swaps(bp, model)[0].weights);
    const auto base = core::lower_plan(bp, model);
    const Bytes base_wb = moved(base, OpKind::WB, Stream::SwapIn);
    CHECK(base_wb == N * m * 2 * gw_total);
    CHECK(base_wb >= m * harmony_wb);
    // and with the weights resident, dp-swap moves them once per iteration like a single-pack plan
    bp.knobs.gpu_capacity_bytes = 10 * core::kGiB;
    bp.u_fwd = bp.u_bwd = 2;
    REQUIRE_FALSE(core::decide_swaps(bp, model)[0].weights);
    CHECK(moved(core::lower_plan(bp, model), OpKind::WB, Stream::SwapIn) == N * gw_total);
  }
}

TEST_CASE("every baseline validates and runs without deadlock on bert_large, N = 1, 2, 4") {
  const auto& model = bert_large();
  int programs = 0;
  for (PlanKind kind : swapping_kinds()) {
    for (int N : {1, 2, 4}) {
      for (int u : {1, 2, 4}) {
        for (auto [w, a] :
             {std::pair{SwapChoice::Auto, SwapChoice::Auto}, std::pair{SwapChoice::Swap, SwapChoice::Swap},
              std::pair{SwapChoice::Keep, SwapChoice::Swap}, std::pair{SwapChoice::Swap, SwapChoice::Keep}}) {
          const int D = kind->one_microbatch ? u * N : 8 * N;  // lohan: the share is its microbatch
          CAPTURE(core::plan_kind_name(kind));
          CAPTURE(N);
          CAPTURE(u);
          CAPTURE(static_cast<int>(w));
          CAPTURE(static_cast<int>(a));
          const auto plan = make_plan(kind, N, D, u, w, a);
          const auto p = core::lower_plan(plan, model);
          REQUIRE_NOTHROW(core::validate_program(p));
          CHECK(p.cost.bandwidth_sharers == N);
          CHECK_FALSE(p.cost.pp_rules);
          CHECK_FALSE(p.cost.prefetch);
          CHECK(p.graph.rank_tasks.size() == static_cast<std::size_t>(N));
          CHECK(p.graph.plan.kind == kind);  // a baseline's Program carries its own kind
          CHECK(p.graph.plan.u_fwd == u);
          CHECK(p.graph.plan.u_bwd == u);
          CHECK(p.devices.size() == static_cast<std::size_t>(N));
          for (std::size_t q = 1; q < p.queues.size(); ++q) CHECK(p.queues[q - 1].device <= p.queues[q].device);
          check_ledger(p);
          std::set<std::string> ids;
          for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) ids.insert(p.op_id(i));
          CHECK(ids.size() == p.ops.size());  // every op has its own reference-style id
          const auto t = run(p, model);
          sim::ReferenceCostModel cost(model, core::MachineSpec{});
          const auto report = sim::make_report(p, t, core::CostModelKind::Reference, cost.memory_per_gpu(p));
          CHECK(report.iteration_time_s > 0.0);
          CHECK(report.per_gpu.size() == static_cast<std::size_t>(N));
          ++programs;
        }
      }
    }
  }
  CHECK(programs == 7 * 3 * 3 * 4);
}

TEST_CASE("streaming keeps the simulated memory ledger within the decision's estimate (bert_large)") {
  const auto& model = bert_large();
  for (PlanKind kind : swapping_kinds()) {
    for (int N : {1, 2}) {
      CAPTURE(core::plan_kind_name(kind));
      CAPTURE(N);
      auto plan = make_plan(kind, N, (kind->one_microbatch ? 4 : 16) * N, 4, SwapChoice::Swap, SwapChoice::Swap);
      const auto decisions = core::decide_swaps(plan, model);
      const auto p = core::lower_plan(plan, model);
      const auto t = run(p, model);
      for (int g = 0; g < N; ++g) {
        const Bytes est = decisions[kind == plan_kind("pp-swap") ? static_cast<std::size_t>(g) : 0].estimate_bytes;
        const Bytes peak = ledger_peak(p, t, g);
        CAPTURE(g);
        CHECK(peak > 0);
        CHECK(peak <= est);
        // far below the resident weights and gradients
        CHECK(peak < 2 * model.weight_bytes(0, model.num_layers() - 1) / (kind == plan_kind("pp-swap") ? N : 1));
      }
    }
  }
}

TEST_CASE("enumerate_plans of a swapping kind respects the profiled range and divisibility") {
  const auto& model = bert_large();  // forward sizes 1..243, backward 1..78
  const core::Bytes cap = 10 * core::kGiB;
  SwapSearch all;
  all.drop_infeasible = false;
  for (PlanKind kind : swapping_kinds()) {
    for (int N : {1, 2, 4}) {
      for (int D : {24, 96, 512}) {
        CAPTURE(core::plan_kind_name(kind));
        CAPTURE(N);
        CAPTURE(D);
        const auto plans = swapping_plans(kind, model, N, D, cap, all);
        const int share = kind == plan_kind("pp-swap") ? D : D / N;
        std::vector<int> want;
        for (int u = 1; u <= std::min(78, share); ++u) {
          if (share % u == 0 && (kind != plan_kind("lohan") || u == share)) want.push_back(u);
        }
        std::vector<int> got;
        for (const auto& p : plans) {
          got.push_back(p.u_bwd);
          CHECK(p.kind == kind);
          CHECK(p.gpus == N);
          CHECK(p.minibatch == D);
          CHECK(p.knobs.gpu_capacity_bytes == cap);
          CHECK(model.ubatch_in_range(core::Phase::Fwd, p.u_bwd));
          CHECK(model.ubatch_in_range(core::Phase::Bwd, p.u_bwd));
          CHECK_NOTHROW(core::validate_plan(p, model));
          if (kind == plan_kind("pp-swap")) {
            REQUIRE(p.stages.size() == static_cast<std::size_t>(N));
            int next = 0;
            for (const auto& s : p.stages) {
              CHECK(s.first == next);
              CHECK(s.last >= s.first);
              next = s.last + 1;
            }
            CHECK(next == model.num_layers());
          }
        }
        CHECK(got == want);
        // the default drops plans that do not fit; a subset, same order
        const auto fit = swapping_plans(kind, model, N, D, cap);
        CHECK(fit.size() <= plans.size());
        for (const auto& p : fit) {
          for (const auto& dd : core::decide_swaps(p, model)) CHECK(dd.fits);
        }
      }
    }
  }
  // N must divide D for the data-parallel kinds; pp-swap needs a layer per GPU
  CHECK(swapping_plans(plan_kind("dp-swap"), model, 3, 16, cap, all).empty());
  CHECK(swapping_plans(plan_kind("pp-swap"), model, 3, 16, cap, all).size() == 5);  // 1 2 4 8 16
  CHECK(swapping_plans(plan_kind("pp-swap"), model, 29, 16, cap, all).empty());
  // explicit sizes and a step are filtered by the same rules
  SwapSearch some = all;
  some.ubatch_sizes = {3, 4, 100, 8, 4};
  CHECK(swapping_plans(plan_kind("dp-swap"), model, 2, 32, cap, some).size() == 2);  // 4 8
  some.ubatch_sizes.clear();
  some.ubatch_step = 4;  // 1 5 9 13 ... dividing 36: 1 9
  CHECK(swapping_plans(plan_kind("l2l"), model, 1, 36, cap, some).size() == 2);
}

TEST_CASE("validate_baseline_plan rejects bad plans") {
  const auto& model = synthetic();
  auto p = make_plan(plan_kind("dp-swap"), 2, 16, 2, SwapChoice::Auto, SwapChoice::Auto);
  CHECK_NOTHROW(core::validate_plan(p, model));
  p.u_fwd = p.u_bwd = 3;  // not profiled
  CHECK_THROWS_AS(core::validate_plan(p, model), core::ScheduleError);
  p.u_fwd = p.u_bwd = 4;
  p.minibatch = 12;  // share 6 not divisible by 4
  CHECK_THROWS_AS(core::validate_plan(p, model), core::ScheduleError);
  p.minibatch = 15;  // N does not divide D
  CHECK_THROWS_AS(core::lower_plan(p, model), core::ScheduleError);
  auto pp = make_plan(plan_kind("pp-swap"), 2, 16, 2, SwapChoice::Auto, SwapChoice::Auto);
  pp.stages = {{0, 1}, {3, 3}};
  CHECK_THROWS_AS(core::lower_plan(pp, model), core::ScheduleError);
  pp.stages = {{0, 3}};
  CHECK_THROWS_AS(core::lower_plan(pp, model), core::ScheduleError);
  pp.stages = {};
  pp.gpus = 5;
  CHECK_THROWS_AS(core::lower_plan(pp, model), core::ScheduleError);
  // a plan is lowered by its own kind's function: an l2l plan cannot meet dp-swap's lowering
  auto h = make_plan(plan_kind("l2l"), 1, 16, 2, SwapChoice::Auto, SwapChoice::Auto);
  CHECK(core::lower_plan(h, model).graph.plan.kind == plan_kind("l2l"));
  // lohan runs each GPU's share as its one microbatch
  auto lo = make_plan(plan_kind("lohan"), 2, 8, 4, SwapChoice::Auto, SwapChoice::Auto);
  CHECK_NOTHROW(core::validate_plan(lo, model));
  lo.u_fwd = lo.u_bwd = 2;  // share 4 in two microbatches: no gradient accumulation in LoHan
  CHECK_THROWS_WITH_AS(core::validate_plan(lo, model), doctest::Contains("one microbatch"), core::ScheduleError);
  auto as_lohan = p;  // a dp-swap plan's sizes (share 8 in microbatches of 2) under lohan's rule
  as_lohan.kind = plan_kind("lohan");
  CHECK_THROWS_AS(core::lower_plan(as_lohan, model), core::ScheduleError);
}

TEST_CASE("balanced_stages minimizes the largest stage (brute force on a 7-layer model)") {
  core::Model m;
  m.name = "times7";
  m.ubatch_fwd = {1};
  m.ubatch_bwd = {1};
  const std::vector<double> t = {0.5, 3.0, 1.0, 1.0, 2.5, 0.25, 4.0};
  for (std::size_t l = 0; l < t.size(); ++l) {
    core::Layer L;
    L.is_criterion = l + 1 == t.size();
    L.fwd_time_s = {t[l] / 3};
    L.bwd_time_s = {t[l]};
    L.fwd_peak_bytes = {1};
    L.bwd_peak_bytes = {1};
    m.layers.push_back(L);
  }
  m.validate();
  const int R = static_cast<int>(t.size());
  auto cost = [&](const std::vector<core::LayerRange>& st) {
    double worst = 0;
    for (const auto& s : st) {
      double c = 0;
      for (int l = s.first; l <= s.last; ++l) c += t[static_cast<std::size_t>(l)];
      worst = std::max(worst, c);
    }
    return worst;
  };
  for (int n = 1; n <= R; ++n) {
    CAPTURE(n);
    const auto st = core::balanced_stages(m, 1, n);
    REQUIRE(st.size() == static_cast<std::size_t>(n));
    // brute force over all boundary sets (bitmask of cuts between layers)
    double best = 1e9;
    for (int mask = 0; mask < (1 << (R - 1)); ++mask) {
      if (std::popcount(static_cast<unsigned>(mask)) != n - 1) continue;
      std::vector<core::LayerRange> s;
      int first = 0;
      for (int c = 0; c < R - 1; ++c) {
        if (mask & (1 << c)) {
          s.push_back({first, c});
          first = c + 1;
        }
      }
      s.push_back({first, R - 1});
      best = std::min(best, cost(s));
    }
    CHECK(cost(st) == doctest::Approx(best));
  }
  CHECK_THROWS_AS(core::balanced_stages(m, 1, 0), core::ScheduleError);
  CHECK_THROWS_AS(core::balanced_stages(m, 1, R + 1), core::ScheduleError);
}

TEST_CASE("run_search ranks a swapping kind's plans deterministically for any thread count") {
  const auto& model = bert_large();
  const core::MachineSpec machine;
  auto evaluate = [&](const core::Plan& p) {
    sim::ReferenceCostModel cost(model, machine);
    return sim::simulate(core::lower_plan(p, model), cost);
  };
  for (PlanKind kind : swapping_kinds()) {
    CAPTURE(core::plan_kind_name(kind));
    SwapSearch o;
    o.ubatch_sizes = {1, 2, 4, 8};
    const auto plans = swapping_plans(kind, model, 2, 16, 10 * core::kGiB, o);
    REQUIRE_FALSE(plans.empty());
    std::vector<core::Candidate> cands;
    for (const core::Plan& p : plans) cands.push_back(core::Candidate{p, "", ""});
    core::SearchSpace space;
    space.kind = kind;
    space.spec.top_k = -1;
    auto run = [&](int threads, int top_k) {
      space.spec.threads = threads;
      space.spec.top_k = top_k;
      return core::run_search(cands, space, evaluate);
    };
    const auto one = run(1, -1);
    const auto many = run(4, -1);
    CHECK(one.num_candidates == plans.size());
    CHECK(one.num_deadlocked == 0);
    REQUIRE(one.ranked.size() == many.ranked.size());
    for (std::size_t i = 0; i < one.ranked.size(); ++i) {
      CHECK(one.ranked[i].candidate == many.ranked[i].candidate);
      CHECK(one.ranked[i].report.iteration_time_s == many.ranked[i].report.iteration_time_s);
      if (i > 0) CHECK(one.ranked[i - 1].report.iteration_time_s <= one.ranked[i].report.iteration_time_s);
    }
    CHECK(run(2, 1).ranked.size() == 1);
  }
}

// ---- activation policies (docs/baselines.md "Activation policies") ----

// Sum of the reference durations of the compute ops (FWD, REC, BWD) of a program, in seconds.
double compute_s(const core::Program& p, const core::Model& model) {
  sim::ReferenceCostModel cost(model, core::MachineSpec{});
  const auto d = cost.durations(p);
  double s = 0;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const OpKind k = p.ops[i].kind;
    if (k == OpKind::FWD || k == OpKind::REC || k == OpKind::BWD) s += core::ps_to_seconds(d[i]);
  }
  return s;
}

core::TimePs makespan(const sim::Timeline& t) { return *std::max_element(t.end_ps.begin(), t.end_ps.end()); }

core::Plan with_policy(core::Plan p, core::ActivationPolicy a) {
  p.knobs.activation_policy = a;
  return p;
}

// Synthetic model at u = 2: peak_bwd(l) = 2 W + B + 6 X_l + 1024, so the saved activations are
// 6 X_l + 1024 - X_l (input) - X_{l+1} (dY) - X_l (dX, l > 0):
//   l = 0: 5 * 200 + 1024 - 2000 = 24; l = 1: 4 * 2000 + 1024 - 4000 = 5024;
//   l = 2: 4 * 4000 + 1024 - 6000 = 11024; l = 3 (criterion, no dY): 4 * 6000 + 1024 = 25024.
constexpr Bytes kSaved2[] = {24, 5024, 11024, 25024};

TEST_CASE("saved activation bytes are the backward peak less the layer's own tensors (hand derivation)") {
  for (int l = 0; l < kR; ++l) {
    CAPTURE(l);
    CHECK(core::saved_activation_bytes(synthetic(), 2, l) == kSaved2[l]);
  }
  CHECK(core::saved_activation_bytes(synthetic(), 4, 0) == 0);  // 5 * 400 + 1024 < 4000: clamped at zero
}

// A model that records its saved activations (harmony-run's description and profiler do): they are used as given,
// and a BWD's workspace is then what its peak holds beyond them (the backward's scratch), where it is nothing when
// they are derived from that peak. Failed before session 19 (the recorded size did not exist, the derivation
// subtracted weights harmony-run's peaks left out).
TEST_CASE("recorded saved activations replace the derivation; a BWD's workspace is the peak beyond them") {
  core::Model recorded = synthetic();
  constexpr Bytes kRecorded[] = {10, 20, 30, 40};  // per layer, times u
  for (int l = 0; l < kR; ++l) {
    for (int u : recorded.ubatch_bwd)
      recorded.layers[static_cast<std::size_t>(l)].saved_bytes.push_back(kRecorded[l] * u);
  }
  recorded.validate();
  for (int l = 0; l < kR; ++l) {
    CAPTURE(l);
    CHECK(core::saved_activation_bytes(recorded, 2, l) == 2 * kRecorded[l]);
    CHECK(core::saved_activation_bytes(recorded, 3, l) == 3 * kRecorded[l]);  // interpolated as the peaks are
  }
  const int u = 2;
  const auto plan = with_policy(make_plan(plan_kind("dp-swap"), 1, 4, u, SwapChoice::Keep, SwapChoice::Keep),
                                core::ActivationPolicy::Keep);
  const auto own_bwd = [&](int l) { return 2 * kW[l] + kB[l] + X(u, l) + X(u, l + 1) + (l != 0 ? X(u, l) : 0); };
  const auto own_fwd = [&](int l) { return kW[l] + kB[l] + X(u, l) + X(u, l + 1); };
  for (const core::Model* m : {&synthetic(), static_cast<const core::Model*>(&recorded)}) {
    const auto p = core::lower_plan(plan, *m);
    int bwds = 0;
    for (const auto& o : p.ops) {
      if (o.kind != OpKind::BWD && o.kind != OpKind::FWD) continue;
      const int l = o.layers.first;
      CAPTURE(l);
      const Bytes saved = core::saved_activation_bytes(*m, u, l);
      if (o.kind == OpKind::BWD) {
        ++bwds;
        // the derivation leaves nothing; the recorded size leaves the peak's remainder
        CHECK(o.workspace_bytes == (m == &recorded ? m->peak_bytes(core::Phase::Bwd, u, l) - own_bwd(l) - saved : 0));
      } else {
        CHECK(o.workspace_bytes == std::max<Bytes>(0, m->peak_bytes(core::Phase::Fwd, u, l) - own_fwd(l) - saved));
      }
    }
    CHECK(bwds == 2 * kR);
    check_ledger(p);
  }
  // misaligned with the backward sizes: the model is refused
  core::Model bad = recorded;
  bad.layers[1].saved_bytes.pop_back();
  CHECK_THROWS_AS(bad.validate(), core::ScheduleError);
}

// The decision's estimate counts each layer's weights (resident) and input (stash) once: the largest layer peak is
// taken beyond them, as every other kind's estimate does (it counted them twice before session 19, and swapped
// weights that fit). dp-swap, N 1, u 2, checkpoint: resident = sum (W + B) + sum W, stash = sum X_l(2) (one
// microbatch alive), peak beyond = max_l (2 W + B + 12 X_l + 1024 - W - B - 2 X_l) = layer 2's W + 10 X + 1024.
TEST_CASE("a swap decision counts a layer's weights and input once") {
  const auto& model = synthetic();
  auto plan = make_plan(plan_kind("dp-swap"), 1, 4, 2, SwapChoice::Auto, SwapChoice::Auto);
  const Bytes resident = kGW + (4096 + 8192 + 12288);
  const Bytes stash = 2 * (100 + 1000 + 2000 + 3000);
  const Bytes beyond = 12288 + 10 * 2000 + 1024;
  plan.knobs.gpu_capacity_bytes = resident + stash + beyond;
  auto d = core::decide_swaps(plan, model).front();
  CHECK_FALSE(d.weights);
  CHECK_FALSE(d.activations);
  CHECK(d.estimate_bytes == resident + stash + beyond);
  CHECK(d.fits);
  // the simulated ledger of that plan stays within the estimate
  const auto p = core::lower_plan(plan, model);
  CHECK(ledger_peak(p, run(p, model), 0) <= d.estimate_bytes);
  plan.knobs.gpu_capacity_bytes -= 1;
  d = core::decide_swaps(plan, model).front();
  CHECK(d.weights);
}

TEST_CASE("the default activation policy is checkpoint, and the names round-trip") {
  CHECK(core::Plan{}.knobs.activation_policy == core::ActivationPolicy::Checkpoint);
  for (const std::string& name : core::activation_policy_names()) {
    const auto p = core::parse_activation_policy(name);
    REQUIRE(p);
    CHECK(core::activation_policy_name(*p) == name);
  }
  CHECK_FALSE(core::parse_activation_policy("recompute"));
}

// Per microbatch and layer, checkpoint costs fwd (FWD) + fwd (REC) + bwd - fwd (BWD) = fwd + bwd, keep
// fwd + bwd - fwd = bwd. Synthetic: fwd = 0.001 (l+1) u, bwd = 0.003 (l+1) u, sum over l of (l+1) = 10, so
// per GPU (m = D/(N u) microbatches; pp-swap: the stages split the layers) checkpoint = 0.04 u m s, keep 0.03 u m s.
TEST_CASE("checkpoint recomputes every layer (REC), keep does not: compute time by hand") {
  const int u = 2;
  for (PlanKind kind : swapping_kinds()) {
    for (int N : {1, 2}) {
      const int D = kind->one_microbatch ? u * N : 8;  // lohan: the share is its one microbatch
      CAPTURE(core::plan_kind_name(kind));
      CAPTURE(N);
      const auto base = make_plan(kind, N, D, u, SwapChoice::Auto, SwapChoice::Auto);
      const auto ck = core::lower_plan(with_policy(base, core::ActivationPolicy::Checkpoint), synthetic());
      const auto kp = core::lower_plan(with_policy(base, core::ActivationPolicy::Keep), synthetic());
      CHECK(count(ck, OpKind::REC) == count(ck, OpKind::BWD));
      CHECK(count(kp, OpKind::REC) == 0);
      CHECK(count(kp, OpKind::BWD) == count(ck, OpKind::BWD));
      const int m = kind == plan_kind("pp-swap") ? D / u : D / N / u;
      const int replicas = kind == plan_kind("pp-swap") ? 1 : N;  // pp-swap: each layer on one stage
      CHECK(compute_s(ck, synthetic()) == doctest::Approx(replicas * 0.04 * u * m).epsilon(1e-9));
      CHECK(compute_s(kp, synthetic()) == doctest::Approx(replicas * 0.03 * u * m).epsilon(1e-9));
      check_ledger(ck);
      check_ledger(kp);
      // the same plan, everything else equal: recomputing takes longer
      CHECK(makespan(run(ck, synthetic())) > makespan(run(kp, synthetic())));
    }
  }
}

// dp-swap, N = 1, D = 4, u = 2 (m = 2), nothing swapped: checkpoint holds each layer's input only; keep also
// holds every layer's saved activations from its forward to its backward, so the decision's estimate grows
// by sum_l kSaved2 and the simulated ledger peaks higher. With the stash swapped, keep's saved activations
// of layers 0..R-2 travel with it (the criterion's backward follows its forward): sX grows by
// m (kSaved2[0] + kSaved2[1] + kSaved2[2]) each way.
TEST_CASE("keep holds or swaps the saved activations: memory and swap bytes by hand") {
  const auto& model = synthetic();
  const int u = 2;
  const Bytes m = 2;
  const auto kept = make_plan(plan_kind("dp-swap"), 1, 4, u, SwapChoice::Keep, SwapChoice::Keep);
  const auto dk = core::decide_swaps(with_policy(kept, core::ActivationPolicy::Keep), model).front();
  const auto dc = core::decide_swaps(with_policy(kept, core::ActivationPolicy::Checkpoint), model).front();
  CHECK(dk.estimate_bytes - dc.estimate_bytes == kSaved2[0] + kSaved2[1] + kSaved2[2] + kSaved2[3]);
  {
    const auto pk = core::lower_plan(with_policy(kept, core::ActivationPolicy::Keep), model);
    const auto pc = core::lower_plan(with_policy(kept, core::ActivationPolicy::Checkpoint), model);
    CHECK(ledger_peak(pk, run(pk, model), 0) > ledger_peak(pc, run(pc, model), 0));
    CHECK(moved(pk, OpKind::sX, Stream::SwapOut) == 0);
  }
  const auto swapped = make_plan(plan_kind("dp-swap"), 1, 4, u, SwapChoice::Keep, SwapChoice::Swap);
  const auto pk = core::lower_plan(with_policy(swapped, core::ActivationPolicy::Keep), model);
  const auto pc = core::lower_plan(with_policy(swapped, core::ActivationPolicy::Checkpoint), model);
  const Bytes stash = m * (X(u, 1) + X(u, 2));
  const Bytes saved = m * (kSaved2[0] + kSaved2[1] + kSaved2[2]);
  CHECK(moved(pc, OpKind::sX, Stream::SwapOut) == stash);
  CHECK(moved(pk, OpKind::sX, Stream::SwapOut) == stash + saved);
  CHECK(moved(pk, OpKind::sX, Stream::SwapIn) == stash + saved);
  check_ledger(pk);
  // l2l (its stash lives on the host): every layer's saved activations go out and back, the criterion's too
  const auto l2l = make_plan(plan_kind("l2l"), 1, 4, u, SwapChoice::Auto, SwapChoice::Keep);
  const auto lk = core::lower_plan(with_policy(l2l, core::ActivationPolicy::Keep), model);
  const auto lc = core::lower_plan(with_policy(l2l, core::ActivationPolicy::Checkpoint), model);
  const Bytes all_saved = m * (kSaved2[0] + kSaved2[1] + kSaved2[2] + kSaved2[3]);
  CHECK(moved(lk, OpKind::sX, Stream::SwapOut) - moved(lc, OpKind::sX, Stream::SwapOut) == all_saved);
  CHECK(moved(lk, OpKind::sX, Stream::SwapIn) - moved(lc, OpKind::sX, Stream::SwapIn) == all_saved);
  check_ledger(lk);
  run(lk, model);
}

TEST_CASE("compare searches both activation policies for every baseline and reports the winner (bert_large)") {
  const auto& model = bert_large();
  core::MachineSpec machine;
  core::SearchSpec search;
  search.u_bwd = {4, 8};
  for (PlanKind kind : swapping_kinds()) {
    CAPTURE(core::plan_kind_name(kind));
    search.u_bwd = kind->one_microbatch ? std::vector<int>{16} : std::vector<int>{4, 8};  // lohan: D/N
    const auto kr = sim::best_plan_of_kind(kind, model, machine, 2, 32, core::CostModelKind::Reference, search, {});
    REQUIRE(kr.feasible);
    REQUIRE(kr.plan);
    // both policies' plans were candidates
    SwapSearch one;
    one.ubatch_sizes = search.u_bwd;
    const auto capacity = static_cast<Bytes>(static_cast<double>(machine.gpu_memory_bytes) * machine.memory_cap_scale);
    auto both = one;
    both.activation_policies = {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep};
    CHECK(kr.candidates == swapping_plans(kind, model, 2, 32, capacity, both).size());
    if (core::swap_rules(kind).keep_activations && kr.policy_best_time_s.size() == 1) {
      // fsdp-offload never sends activations home: its keep plans do not fit this GPU beside the streamed layers
      CHECK(kr.policy_best_time_s.count("checkpoint") == 1);
      continue;
    }
    CHECK(kr.candidates > swapping_plans(kind, model, 2, 32, capacity, one).size());
    REQUIRE(kr.policy_best_time_s.size() == 2);
    const double ck = kr.policy_best_time_s.at("checkpoint");
    const double kp = kr.policy_best_time_s.at("keep");
    // the winner is the faster policy, and the report says which
    const std::string winner = kp < ck ? "keep" : "checkpoint";
    CHECK(core::activation_policy_name(kr.best.plan.knobs.activation_policy) == winner);
    CHECK(core::activation_policy_name(kr.plan->knobs.activation_policy) == winner);
    CHECK(kr.best.iteration_time_s == std::min(ck, kp));
  }
  // Harmony recomputes by design and says so
  const auto pp = sim::best_plan_of_kind(plan_kind("harmony-pp"), model, machine, 2, 32, core::CostModelKind::Reference,
                                         search, {});
  REQUIRE(pp.feasible);
  CHECK(pp.best.plan.knobs.activation_policy == core::ActivationPolicy::Checkpoint);
  CHECK(pp.policy_best_time_s.empty());
}

TEST_CASE("harmony-run plan.offload and plan.zero3: zero-infinity's knobs, defaults and located errors") {
  const std::string head =
      "model:\n"
      "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
      "  seq_len: 32\n"
      "machine:\n"
      "  gpus: 2\n"
      "  gpu_memory: 10GiB\n"
      "  topology:\n"
      "    switches: [{name: rc, socket: 0, uplink: 12GB/s}]\n"
      "    gpus: [{switch: rc, link: 12GB/s}, {switch: rc, link: 12GB/s}]\n";
  const std::string nvme = "    nvme: {read: 6GB/s, write: 5GB/s, capacity: 2TB, latency: 80us}\n";
  const std::string plan = "plan: {mode: zero-infinity, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2";
  const std::string tail = "}\ntrain: {steps: 5}\n";
  const auto load = [](const std::string& text) { return core::load_train_config_text(text, "run.yaml"); };
  const auto error = [&](const std::string& text) {
    try {
      load(text);
    } catch (const core::ConfigError& e) {
      CHECK(e.loc().file == "run.yaml");
      CHECK_FALSE(e.hint().empty());
      return std::string(e.what());
    }
    FAIL("expected a core::ConfigError");
    return std::string();
  };
  // defaults: cpu, 200 us per module, buckets of 5e7 elements, 20 us and 45 us per parameter tensor
  const core::TrainConfig d = load(head + plan + tail);
  CHECK(d.plan.knobs.offload == core::OffloadTier::Cpu);
  CHECK(d.plan.knobs.zero3.module_latency_s == doctest::Approx(200e-6));
  CHECK(d.plan.knobs.zero3.bucket_elements == doctest::Approx(5e7));
  CHECK(d.plan.knobs.zero3.tensor_latency_s == doctest::Approx(20e-6));
  CHECK(d.plan.knobs.zero3.grad_tensor_latency_s == doctest::Approx(45e-6));
  const core::TrainConfig c = load(head + nvme + plan +
                                   ", offload: nvme, zero3: {module_latency: 50us, bucket: 1e6, tensor_latency: 3us, "
                                   "grad_tensor_latency: 0us}" +
                                   tail);
  CHECK(c.plan.knobs.offload == core::OffloadTier::Nvme);
  CHECK(c.plan.knobs.zero3.module_latency_s == doctest::Approx(50e-6));
  CHECK(c.plan.knobs.zero3.bucket_elements == doctest::Approx(1e6));
  CHECK(c.plan.knobs.zero3.tensor_latency_s == doctest::Approx(3e-6));
  CHECK(c.plan.knobs.zero3.grad_tensor_latency_s == 0);
  CHECK_FALSE(c.plan.knobs.zero3.pipeline_read);  // DeepSpeed's default: the optimizer swap in series
  CHECK_FALSE(c.plan.knobs.zero3.pipeline_write);
  const core::TrainConfig pl =
      load(head + nvme + plan + ", offload: nvme, zero3: {pipeline_read: true, pipeline_write: true}" + tail);
  CHECK(pl.plan.knobs.zero3.pipeline_read);
  CHECK(pl.plan.knobs.zero3.pipeline_write);
  CHECK(pl.search.zero3.pipeline_read);  // --plan auto searches under the plan's knobs
  // the pipelined swap moves the NVMe tier: refused on the host tier, at the value, before the tier is known to be
  // wrong for it; and a boolean
  const std::string on_cpu = error(head + plan + ", zero3: {pipeline_write: true}" + tail);
  CHECK(
      on_cpu.find("plan.zero3.pipeline_write swaps the optimizer state with the NVMe tier, but plan.offload is cpu") !=
      std::string::npos);
  CHECK(error(head + nvme + plan + ", offload: nvme, zero3: {pipeline_read: 2}" + tail).find("pipeline_read") !=
        std::string::npos);
  // errors: nvme without drives, an unknown tier, an unknown zero3 key, another kind
  CHECK(error(head + plan + ", offload: nvme" + tail).find("needs a machine with an NVMe tier") != std::string::npos);
  CHECK(error(head + nvme + plan + ", offload: nvm" + tail).find("unknown plan.offload 'nvm'") != std::string::npos);
  CHECK(error(head + plan + ", zero3: {latency: 1us}" + tail).find("latency") != std::string::npos);
  CHECK(error(head + "plan: {mode: dp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, offload: cpu" + tail)
            .find("zero-infinity, zero3-opt-offload or lohan only") != std::string::npos);
  CHECK(error(head + "plan: {mode: lohan, gpus: 2, minibatch: 8, u_fwd: 4, u_bwd: 4, zero3: {bucket: 1e6}" + tail)
            .find("plan.zero3 applies to plan.mode: zero-infinity, zero3-opt-offload or zero3 only") !=
        std::string::npos);
  // zero3 (DeepSpeed ZeRO-3 on the GPUs) takes the hook costs, not the optimizer swap (it has none) nor an offload tier
  const std::string z3 = "plan: {mode: zero3, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2";
  CHECK(load(head + z3 + ", zero3: {module_latency: 70us, tensor_latency: 4us}" + tail)
            .plan.knobs.zero3.module_latency_s == doctest::Approx(70e-6));
  const std::string z3_pipe = error(head + nvme + z3 + ", zero3: {pipeline_read: true}" + tail);
  CHECK(z3_pipe.find("run.yaml:") != std::string::npos);
  CHECK(z3_pipe.find("plan.zero3.pipeline_read swaps the optimizer state with the NVMe tier, but zero3 keeps it on the "
                     "GPUs") != std::string::npos);
  CHECK(error(head + z3 + ", offload: cpu" + tail).find("plan.offload applies to plan.mode") != std::string::npos);
  const auto lo =
      load(head + nvme + "plan: {mode: lohan, gpus: 2, minibatch: 8, u_fwd: 4, u_bwd: 4, offload: nvme" + tail);
  CHECK(lo.plan.knobs.offload == core::OffloadTier::Nvme);
}

// Swap timing (docs/baselines.md "Swap timing"): on demand, the same tensors move in the same bytes, but no host
// transfer runs ahead of the op that reads it nor trails the op that evicted it, so on one GPU no host copy ever
// overlaps compute and the iteration is never faster than the scheduled swapper's.
TEST_CASE("on-demand swap moves the same bytes, never beside compute, and is never faster (dp-swap, pp-swap)") {
  const auto& model = synthetic();
  const int u = 2;
  for (const char* name : {"dp-swap", "pp-swap"}) {
    for (int N : {1, 2}) {
      for (const SwapChoice c : {SwapChoice::Swap, SwapChoice::Keep}) {
        for (const auto policy : {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}) {
          CAPTURE(name);
          CAPTURE(N);
          CAPTURE(static_cast<int>(c));
          CAPTURE(core::activation_policy_name(policy));
          const auto sched_plan = with_policy(make_plan(plan_kind(name), N, 16, u, c, c), policy);
          auto od_plan = sched_plan;
          od_plan.knobs.swap = core::SwapTiming::OnDemand;
          const auto sched = core::lower_plan(sched_plan, model);
          const auto od = core::lower_plan(od_plan, model);
          REQUIRE(od.ops.size() == sched.ops.size());
          for (const OpKind k : {OpKind::WB, OpKind::dWB, OpKind::sX, OpKind::X, OpKind::ARD, OpKind::Y, OpKind::dX})
            for (const Stream s : {Stream::SwapIn, Stream::SwapOut, Stream::Compute, Stream::P2POut})
              CHECK(moved(od, k, s) == moved(sched, k, s));
          check_ledger(od);
          const auto t_sched = run(sched, model);
          const auto t_od = run(od, model);
          CHECK(makespan(t_od) >= makespan(t_sched));
          if (c == SwapChoice::Swap) CHECK(makespan(t_od) > makespan(t_sched));  // every layer's weights in the way
          // No host copy of a device overlaps that device's compute (pp-swap's P2P sends may: they are not swaps).
          for (std::size_t i = 0; i < od.ops.size(); ++i) {
            const auto& a = od.ops[i];
            if (a.stream != Stream::SwapIn && a.stream != Stream::SwapOut) continue;
            for (std::size_t j = 0; j < od.ops.size(); ++j) {
              const auto& b = od.ops[j];
              if (b.stream != Stream::Compute || b.device != a.device) continue;
              const bool apart = t_od.end_ps[i] <= t_od.begin_ps[j] || t_od.end_ps[j] <= t_od.begin_ps[i];
              if (!apart) {
                CAPTURE(core::op_kind_name(a.kind));
                CAPTURE(core::op_kind_name(b.kind));
                CHECK(apart);
              }
            }
          }
          // and the scheduled swapper does overlap them when it streams the weights (the prefetch it is credited with)
          if (c == SwapChoice::Swap) {
            bool overlap = false;
            for (std::size_t i = 0; i < sched.ops.size() && !overlap; ++i) {
              if (sched.ops[i].kind != OpKind::WB) continue;
              for (std::size_t j = 0; j < sched.ops.size() && !overlap; ++j)
                overlap = sched.ops[j].stream == Stream::Compute && sched.ops[j].device == sched.ops[i].device &&
                          t_sched.begin_ps[i] < t_sched.end_ps[j] && t_sched.begin_ps[j] < t_sched.end_ps[i];
            }
            CHECK(overlap);
          }
        }
      }
    }
  }
  // the timing is dp-swap's and pp-swap's knob only: another kind's plan with it is refused
  auto zi = make_plan(plan_kind("zero-infinity"), 1, 16, u, SwapChoice::Auto, SwapChoice::Auto);
  zi.knobs.swap = core::SwapTiming::OnDemand;
  CHECK_THROWS_WITH_AS(core::validate_plan(zi, model), doctest::Contains("on-demand swap applies to dp-swap, pp-swap"),
                       core::ScheduleError);
  // and the names round-trip
  for (const std::string& n : core::swap_timing_names())
    CHECK(core::swap_timing_name(*core::parse_swap_timing(n)) == n);
  CHECK_FALSE(core::parse_swap_timing("ondemand"));
}
