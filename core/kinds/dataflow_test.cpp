// Tests of the Program's dataflow (core/program/dataflow.hpp) as the lowerings fill it (the swapping kinds' and
// Harmony's): on small hand-checkable Programs (a 4-layer synthetic model, 1 or 2 GPUs), which op writes which tensor
// and which ops read it, each op's pass, layers and samples, the interning, and the refusal of an op a swapping
// Program cannot hold. And core::state_layout over every kind that keeps state between steps, and the Update owners
// of a Harmony Program as its task graph gives them.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/base/error.hpp"
#include "core/kinds/kinds.hpp"
#include "core/program/dataflow.hpp"
#include "core/program/host_gradients.hpp"
#include "core/program/lower.hpp"
#include "core/program/program.hpp"
#include "core/program/state_layout.hpp"
#include "core/program/task_graph.hpp"

using namespace harmony;
using core::FlowKind;
using core::FlowTensor;
using core::OpKind;
using core::Pass;
using core::Stream;
using core::SwapChoice;

namespace {

// R = 4 layers (the last the criterion), profiled at u = 1, 2.
const core::Model& model4() {
  static const core::Model model = [] {
    core::Model m;
    m.name = "dataflow4";
    m.source = "test_dataflow";
    m.ubatch_fwd = {1, 2};
    m.ubatch_bwd = {1, 2};
    for (int l = 0; l < 4; ++l) {
      core::Layer L;
      L.name = "L" + std::to_string(l);
      L.is_criterion = l == 3;
      L.weight_bytes = 4096;  // every layer has parameters, as GPT-2's (its head: the final norm and lm_head)
      L.param_count = L.weight_bytes / 4;
      L.update_time_cpu_s = 0.001;
      L.input_bytes_per_sample = 1000;
      for (int u : m.ubatch_fwd) {
        L.fwd_time_s.push_back(0.001 * u);
        L.fwd_peak_bytes.push_back(L.weight_bytes + 4000 * u + 512);
        L.bwd_time_s.push_back(0.003 * u);
        L.bwd_peak_bytes.push_back(2 * L.weight_bytes + 6000 * u + 1024);
      }
      m.layers.push_back(L);
    }
    m.validate();
    return m;
  }();
  return model;
}

core::Program lower(const char* kind, int gpus, int minibatch, int u, SwapChoice w, SwapChoice a,
                    core::ActivationPolicy policy = core::ActivationPolicy::Checkpoint) {
  core::Plan p;
  p.kind = core::plan_kind(kind);
  p.gpus = gpus;
  p.minibatch = minibatch;
  p.u_fwd = p.u_bwd = u;
  p.knobs.weights = w;
  p.knobs.activations = a;
  p.knobs.activation_policy = policy;
  return core::lower_plan(p, model4());
}

// A Harmony plan over the 4 layers with packs of pack_size, lowered on every GPU (as harmony-run lowers it).
core::Program lower_harmony(const char* kind, int gpus, int minibatch, int u_fwd, int u_bwd, int pack_size) {
  core::Plan p;
  p.kind = core::plan_kind(kind);
  p.gpus = gpus;
  p.minibatch = minibatch;
  p.u_fwd = u_fwd;
  p.u_bwd = u_bwd;
  core::manual_packs(4, pack_size, p.packs_fwd, p.packs_bwd);
  core::validate_packs(p, 4);
  return core::lower_harmony(core::compose_task_graph(p, 4), model4(), {.dp_first_gpu_only = false});
}

// The one op of `kind` on `device` for `layer` in `pass` over samples starting at s0 (any for per-layer ops).
int find_op(const core::Program& p, OpKind kind, int device, int layer, Pass pass, int s0 = -1) {
  std::vector<int> hits;
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    const core::OpFlow& f = p.dataflow.ops[o];
    if (op.kind == kind && op.device == device && f.layers.first == layer && f.pass == pass && (s0 < 0 || f.s0 == s0))
      hits.push_back(static_cast<int>(o));
  }
  INFO(std::string(core::op_kind_name(kind)), " on GPU ", device, " layer ", layer, " pass ",
       std::string(core::pass_name(pass)), " s0 ", s0);
  REQUIRE(hits.size() == 1);
  return hits.front();
}

std::vector<FlowTensor> tensors(const core::Program& p, const core::TensorIds& ids) {
  std::vector<FlowTensor> r;
  for (int id : ids) r.push_back(p.dataflow.tensor(id));
  return r;
}
std::vector<FlowTensor> reads(const core::Program& p, int o) {
  return tensors(p, p.dataflow.ops[static_cast<std::size_t>(o)].reads);
}
std::vector<FlowTensor> writes(const core::Program& p, int o) {
  return tensors(p, p.dataflow.ops[static_cast<std::size_t>(o)].writes);
}
// The ops that write / read tensor t.
std::vector<int> writers(const core::Program& p, const FlowTensor& t) {
  std::vector<int> r;
  const int id = p.dataflow.find(t);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const auto& w = p.dataflow.ops[o].writes;
    if (id >= 0 && std::find(w.begin(), w.end(), id) != w.end()) r.push_back(static_cast<int>(o));
  }
  return r;
}
std::vector<int> readers(const core::Program& p, const FlowTensor& t) {
  std::vector<int> r;
  const int id = p.dataflow.find(t);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const auto& w = p.dataflow.ops[o].reads;
    if (id >= 0 && std::find(w.begin(), w.end(), id) != w.end()) r.push_back(static_cast<int>(o));
  }
  return r;
}

// Whether some op writes every sample of t (per-layer tensors: t itself). Host channels hold samples: a message
// that re-sizes microbatches reads a part of what a swap wrote.
bool written(const core::Program& p, const FlowTensor& t) {
  if (t.n == 0) return !writers(p, t).empty();
  for (int s = t.s0; s < t.s0 + t.n; ++s) {
    bool any = false;
    for (const FlowTensor& w : p.dataflow.tensors)
      any = any || (w.device == t.device && w.kind == t.kind && w.layer == t.layer && w.owner == t.owner && w.s0 <= s &&
                    s < w.s0 + w.n && !writers(p, w).empty());
    if (!any) return false;
  }
  return true;
}

// Every op has a flow; tensors are interned once; every tensor read is written by some op (the data X and the host
// channels included: nothing is read from nowhere).
void check_closed(const core::Program& p) {
  REQUIRE(p.dataflow.covers(p));
  const std::set<FlowTensor> unique(p.dataflow.tensors.begin(), p.dataflow.tensors.end());
  CHECK(unique.size() == p.dataflow.tensors.size());
  for (std::size_t id = 0; id < p.dataflow.tensors.size(); ++id)
    CHECK(p.dataflow.find(p.dataflow.tensors[id]) == static_cast<int>(id));
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    for (const FlowTensor& t : reads(p, static_cast<int>(o))) {
      INFO(p.op_label(static_cast<int>(o)), " reads ", std::string(core::flow_kind_name(t.kind)), " L", t.layer, " s",
           t.s0);
      CHECK(written(p, t));
    }
}

FlowTensor act(int d, int l, int s0, int n) { return {d, FlowKind::Act, l, s0, n, -1}; }
FlowTensor grad(int d, int l, int s0, int n) { return {d, FlowKind::Grad, l, s0, n, -1}; }
FlowTensor weights(int d, int l) { return {d, FlowKind::W, l, 0, 0, -1}; }
FlowTensor dw(int d, int l) { return {d, FlowKind::DW, l, 0, 0, -1}; }

[[maybe_unused]] void dump(const core::Program& p) {
  const auto name = [&](int id) {
    const FlowTensor& t = p.dataflow.tensor(id);
    return std::string(core::flow_kind_name(t.kind)) + "@" + std::to_string(t.device) + " L" + std::to_string(t.layer) +
           " [" + std::to_string(t.s0) + "+" + std::to_string(t.n) + "]" +
           (t.owner >= 0 ? " t" + std::to_string(t.owner) : "");
  };
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::OpFlow& f = p.dataflow.ops[o];
    std::string line = p.op_label(static_cast<int>(o)) + " " + core::pass_name(f.pass) + " reads:";
    for (int id : f.reads) line += " {" + name(id) + "}";
    line += " writes:";
    for (int id : f.writes) line += " {" + name(id) + "}";
    MESSAGE(line);
  }
}

}  // namespace

TEST_CASE("dp-swap on one GPU: the chain of activations, gradients and weights") {
  // D = 2, u = 1: microbatch 0 is sample 0, microbatch 1 sample 1. Weights swapped per layer, activations stashed.
  const core::Program p = lower("dp-swap", 1, 2, 1, SwapChoice::Swap, SwapChoice::Swap);
  check_closed(p);
  // the forward of layer 1 over sample 1: reads W(1) and Act(1) of sample 1, writes Act(2) of sample 1
  const int f1 = find_op(p, OpKind::FWD, 0, 1, Pass::Fwd, 1);
  const core::OpFlow& ff = p.dataflow.ops[static_cast<std::size_t>(f1)];
  CHECK(ff.s0 == 1);
  CHECK(ff.n == 1);
  CHECK(reads(p, f1) == std::vector<FlowTensor>{weights(0, 1), act(0, 1, 1, 1)});
  CHECK(writes(p, f1) == std::vector<FlowTensor>{act(0, 2, 1, 1)});
  // Act(1) of sample 1 comes from the forward of layer 0 over that sample
  CHECK(writers(p, act(0, 1, 1, 1)) == std::vector<int>{find_op(p, OpKind::FWD, 0, 0, Pass::Fwd, 1)});
  // the data: layer 0's input is written by the forward's X (and read back by the backward's X as the stash)
  CHECK(writers(p, act(0, 0, 0, 1)) == std::vector<int>{find_op(p, OpKind::X, 0, 0, Pass::Fwd, 0)});
  CHECK(writers(p, FlowTensor{0, FlowKind::Stash, 0, 0, 1}) ==
        std::vector<int>{find_op(p, OpKind::X, 0, 0, Pass::Bwd, 0)});
  // the backward of layer 2 over sample 0: reads the criterion's input gradient (of the BWD of layer 3), writes
  // its own input gradient and the weight gradient; the first microbatch starts dW, the second adds to it
  const int b2 = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 0);
  CHECK(writers(p, grad(0, 3, 0, 1)) == std::vector<int>{find_op(p, OpKind::BWD, 0, 3, Pass::Bwd, 0)});
  const auto rb2 = reads(p, b2);
  CHECK(std::count(rb2.begin(), rb2.end(), grad(0, 3, 0, 1)) == 1);
  CHECK(std::count(rb2.begin(), rb2.end(), weights(0, 2)) == 1);
  CHECK(std::count(rb2.begin(), rb2.end(), FlowTensor{0, FlowKind::Saved, 2, 0, 1}) == 1);
  CHECK(writes(p, b2) == std::vector<FlowTensor>{dw(0, 2), grad(0, 2, 0, 1)});
  // weights swapped per microbatch: each microbatch's BWD starts the gradient (reads none) and its own dWB takes it
  const auto w2 = writers(p, dw(0, 2));
  REQUIRE(w2.size() == 2);
  for (int b : w2) {
    const auto r = reads(p, b);
    CHECK(std::count(r.begin(), r.end(), dw(0, 2)) == 0);
  }
  const auto rd2 = readers(p, dw(0, 2));
  REQUIRE(rd2.size() == 2);
  for (int r : rd2) CHECK(p.ops[static_cast<std::size_t>(r)].kind == OpKind::dWB);
  // the layer 0 backward writes no input gradient; the Update is its own pass's and touches host state only
  CHECK(writes(p, find_op(p, OpKind::BWD, 0, 0, Pass::Bwd, 0)) == std::vector<FlowTensor>{dw(0, 0)});
  const int u0 = find_op(p, OpKind::Update, 0, 0, Pass::Update);
  CHECK(reads(p, u0).empty());
  CHECK(writes(p, u0).empty());
}

TEST_CASE("dp-swap with its weights kept: the second microbatch's backward adds to the first's gradient") {
  const core::Program p = lower("dp-swap", 1, 2, 1, SwapChoice::Keep, SwapChoice::Swap);
  check_closed(p);
  const int b0 = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 0);
  const int b1 = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 1);
  const auto r0 = reads(p, b0), r1 = reads(p, b1);
  const int first = std::count(r0.begin(), r0.end(), dw(0, 2)) == 0 ? b0 : b1;
  const int second = first == b0 ? b1 : b0;
  const auto rf = reads(p, first), rs = reads(p, second);
  CHECK(std::count(rf.begin(), rf.end(), dw(0, 2)) == 0);  // starts the gradient
  CHECK(std::count(rs.begin(), rs.end(), dw(0, 2)) == 1);  // accumulates into it
  CHECK(writers(p, dw(0, 2)) == std::vector<int>{std::min(first, second), std::max(first, second)});
  // one dWB takes the sum
  CHECK(readers(p, dw(0, 2)) == std::vector<int>{second, find_op(p, OpKind::dWB, 0, 2, Pass::Bwd)});
}

TEST_CASE("dp-swap on two GPUs: each GPU's samples, the all-reduce") {
  // D = 4, u = 1: GPU 0 runs samples 0, 1 and GPU 1 samples 2, 3
  const core::Program p = lower("dp-swap", 2, 4, 1, SwapChoice::Swap, SwapChoice::Swap);
  check_closed(p);
  const int x = find_op(p, OpKind::X, 1, 0, Pass::Fwd, 3);
  CHECK(writes(p, x) == std::vector<FlowTensor>{act(1, 0, 3, 1)});
  CHECK(p.dataflow.ops[static_cast<std::size_t>(x)].n == 1);
  for (int d = 0; d < 2; ++d) {
    std::vector<int> ards;
    for (std::size_t o = 0; o < p.ops.size(); ++o)
      if (p.ops[o].kind == OpKind::ARD && p.ops[o].device == d && p.ops[o].layers.first == 1)
        ards.push_back(static_cast<int>(o));
    REQUIRE(ards.size() == 2);  // weights streamed per microbatch: one all-reduce per microbatch's gradient
    for (int a : ards) {
      CHECK(reads(p, a) == std::vector<FlowTensor>{dw(d, 1)});
      CHECK(writes(p, a) == std::vector<FlowTensor>{dw(d, 1)});
    }
  }
}

TEST_CASE("pp-swap: a stage boundary is a P2P pair between the stages' activations") {
  // two stages of two layers; every stage sees all samples (pp: sample offsets start at 0 on every GPU)
  const core::Program p = lower("pp-swap", 2, 2, 1, SwapChoice::Keep, SwapChoice::Keep);
  check_closed(p);
  const int boundary = p.graph.plan.packs_bwd.back().first;
  const int recv = find_op(p, OpKind::X, 1, boundary, Pass::Fwd, 1);
  const int send = p.ops[static_cast<std::size_t>(recv)].peer;
  REQUIRE(send >= 0);
  CHECK(p.ops[static_cast<std::size_t>(send)].kind == OpKind::Y);
  CHECK(reads(p, send) == std::vector<FlowTensor>{act(0, boundary, 1, 1)});
  CHECK(writes(p, recv) == std::vector<FlowTensor>{act(1, boundary, 1, 1)});
  // and back: GPU 1's dX of the boundary layer sends to GPU 0's dY, which writes Grad(boundary) there
  const int dy = find_op(p, OpKind::dY, 0, boundary - 1, Pass::Bwd, 1);
  CHECK(writes(p, dy) == std::vector<FlowTensor>{grad(0, boundary, 1, 1)});
  CHECK(readers(p, grad(0, boundary, 1, 1)) ==
        std::vector<int>{find_op(p, OpKind::BWD, 0, boundary - 1, Pass::Bwd, 1)});
}

TEST_CASE("zero-infinity on two GPUs: shards gathered and reduce-scattered") {
  const core::Program p = lower("zero-infinity", 2, 2, 1, SwapChoice::Auto, SwapChoice::Swap);
  check_closed(p);
  const int ag = find_op(p, OpKind::AG, 1, 1, Pass::Fwd);
  CHECK(reads(p, ag) == std::vector<FlowTensor>{FlowTensor{1, FlowKind::WShard, 1, 0, 0}});
  CHECK(writes(p, ag) == std::vector<FlowTensor>{weights(1, 1)});
  CHECK(!writers(p, FlowTensor{1, FlowKind::WShard, 1, 0, 0}).empty());
  for (int w : writers(p, FlowTensor{1, FlowKind::WShard, 1, 0, 0}))
    CHECK(p.ops[static_cast<std::size_t>(w)].kind == OpKind::WB);
  const int rs = find_op(p, OpKind::RS, 1, 1, Pass::Bwd);
  CHECK(reads(p, rs) == std::vector<FlowTensor>{dw(1, 1)});
  CHECK(writes(p, rs) == std::vector<FlowTensor>{FlowTensor{1, FlowKind::DWShard, 1, 0, 0}});
  CHECK(reads(p, find_op(p, OpKind::dWB, 1, 1, Pass::Bwd)) ==
        std::vector<FlowTensor>{FlowTensor{1, FlowKind::DWShard, 1, 0, 0}});
  // the AG's free names the shard it read; the dWB's the reduced shard
  const auto& agf = p.dataflow.ops[static_cast<std::size_t>(ag)].frees;
  for (int id : agf) CHECK(p.dataflow.tensor(id).kind != FlowKind::W);
}

TEST_CASE("keep: the forward keeps its saved activations for the backward") {
  const core::Program p = lower("dp-swap", 1, 1, 1, SwapChoice::Keep, SwapChoice::Keep, core::ActivationPolicy::Keep);
  check_closed(p);
  const FlowTensor saved{0, FlowKind::Saved, 1, 0, 1};
  CHECK(writers(p, saved) == std::vector<int>{find_op(p, OpKind::FWD, 0, 1, Pass::Fwd, 0)});
  CHECK(readers(p, saved) == std::vector<int>{find_op(p, OpKind::BWD, 0, 1, Pass::Bwd, 0)});
  // the BWD frees them: its frees name the same tensor
  const auto& fr = p.dataflow.ops[static_cast<std::size_t>(find_op(p, OpKind::BWD, 0, 1, Pass::Bwd, 0))].frees;
  CHECK(std::count(fr.begin(), fr.end(), p.dataflow.find(saved)) == 1);
  // no REC under keep
  CHECK(std::none_of(p.ops.begin(), p.ops.end(), [](const core::Op& o) { return o.kind == OpKind::REC; }));
}

TEST_CASE("an op a swapping Program cannot hold is refused, naming it") {
  core::Program p = lower("dp-swap", 1, 2, 1, SwapChoice::Swap, SwapChoice::Swap);
  const int f = find_op(p, OpKind::FWD, 0, 1, Pass::Fwd, 0);
  p.ops[static_cast<std::size_t>(f)].layers.last = 2;
  CHECK_THROWS_WITH_AS(core::swapping_dataflow(p), doctest::Contains("spans layers 1..2"), core::ScheduleError);
  p.ops[static_cast<std::size_t>(f)].layers.last = 1;
  p.ops[static_cast<std::size_t>(f)].task = 1000;
  CHECK_THROWS_WITH_AS(core::swapping_dataflow(p), doctest::Contains("is not a swapping kind's pseudo task"),
                       core::ScheduleError);
}

namespace {
FlowTensor host(FlowKind k, int l, int s0, int n) { return {-1, k, l, s0, n, -1}; }
FlowTensor dev(int d, FlowKind k, int l, int s0, int n) { return {d, k, l, s0, n, -1}; }
}  // namespace

TEST_CASE("harmony-pp on two GPUs: P2P pairs, stashes through the host, each task's own weights") {
  // D = 2, u = 1, packs of one layer: forward tasks [0] (GPU 0), [1] (GPU 1), [2] (GPU 0); backward tasks [3] (GPU
  // 1, the criterion's), [2] (GPU 0), [1] (GPU 1), [0] (GPU 0)
  const core::Program p = lower_harmony("harmony-pp", 2, 2, 1, 1, 1);
  check_closed(p);
  // the boundary after layer 0: GPU 0's Y sends Act(1) of sample 1, GPU 1's X receives it
  const int y = find_op(p, OpKind::Y, 0, 0, Pass::Fwd, 1);
  CHECK(reads(p, y) == std::vector<FlowTensor>{act(0, 1, 1, 1)});
  CHECK(writes(p, y).empty());
  const int x = p.ops[static_cast<std::size_t>(y)].peer;
  REQUIRE(x >= 0);
  CHECK(writes(p, x) == std::vector<FlowTensor>{act(1, 1, 1, 1)});
  // the stash of layer 2: out to the host by the forward task, a message that stays on GPU 0 (no copy: it reads and
  // writes the stash's channel), in for the backward task, which reads it
  const FlowTensor hs = host(FlowKind::HostStash, 2, 0, 1);
  CHECK(writers(p, hs) ==
        std::vector<int>{find_op(p, OpKind::sX, 0, 2, Pass::Fwd, 0), find_op(p, OpKind::MSGsX, 0, 2, Pass::Fwd, 0)});
  const int in = find_op(p, OpKind::sX, 0, 2, Pass::Bwd, 0);
  CHECK(reads(p, in) == std::vector<FlowTensor>{hs});
  CHECK(writes(p, in) == std::vector<FlowTensor>{dev(0, FlowKind::Stash, 2, 0, 1)});
  const int b2 = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 0);
  CHECK(readers(p, dev(0, FlowKind::Stash, 2, 0, 1)) ==
        std::vector<int>{find_op(p, OpKind::REC, 0, 2, Pass::Bwd, 0), b2});
  // layer 2's forward and backward tasks fetch their own weights (W's owner: the task), each by its own WB
  const FlowTensor wf = reads(p, find_op(p, OpKind::FWD, 0, 2, Pass::Fwd, 0)).front();
  const FlowTensor wb = reads(p, b2).front();
  CHECK(wf.kind == FlowKind::W);
  CHECK(wb.kind == FlowKind::W);
  CHECK(wf.owner != wb.owner);
  CHECK(writers(p, wf) == std::vector<int>{find_op(p, OpKind::WB, 0, 2, Pass::Fwd)});
  CHECK(writers(p, wb) == std::vector<int>{find_op(p, OpKind::WB, 0, 2, Pass::Bwd)});
  // the backward reads the output gradient its dY received and writes its input gradient; microbatch 0 starts the
  // task's gradient, microbatch 1 adds to it, the dWB takes it
  const FlowTensor dwt{0, FlowKind::DW, 2, 0, 0, wb.owner};
  CHECK(writes(p, b2) == std::vector<FlowTensor>{dwt, grad(0, 2, 0, 1)});
  CHECK(writers(p, grad(0, 3, 0, 1)) == std::vector<int>{find_op(p, OpKind::dY, 0, 2, Pass::Bwd, 0)});
  const int b2b = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 1);
  CHECK(readers(p, dwt) == std::vector<int>{b2b, find_op(p, OpKind::dWB, 0, 2, Pass::Bwd)});
  // the criterion's task recomputes from the activation it received (no stash, no output gradient)
  const int b3 = find_op(p, OpKind::BWD, 1, 3, Pass::Bwd, 1);
  const auto r3 = reads(p, b3);
  REQUIRE(r3.size() >= 2);
  CHECK(r3[1] == act(1, 3, 1, 1));
  CHECK(std::none_of(r3.begin(), r3.end(), [](const FlowTensor& t) { return t.kind == FlowKind::Grad; }));
}

TEST_CASE("harmony-pp on one GPU, packs of two: swaps through the host and the recompute's tensors") {
  // forward task [0-1], backward tasks [2-3] (the criterion's) and [0-1]
  const core::Program p = lower_harmony("harmony-pp", 1, 2, 1, 1, 2);
  check_closed(p);
  const int y = find_op(p, OpKind::Y, 0, 0, Pass::Fwd, 1);
  CHECK(writes(p, y) == std::vector<FlowTensor>{host(FlowKind::HostY, 2, 1, 1)});
  CHECK(readers(p, host(FlowKind::HostY, 2, 1, 1)) == std::vector<int>{find_op(p, OpKind::X, 0, 2, Pass::Bwd, 1)});
  // REC keeps each layer's activations and the inner input; the BWD reads them
  const int rec = find_op(p, OpKind::REC, 0, 2, Pass::Bwd, 0);
  CHECK(writes(p, rec) == std::vector<FlowTensor>{dev(0, FlowKind::RecAct, 2, 0, 1), dev(0, FlowKind::RecX, 3, 0, 1),
                                                  dev(0, FlowKind::RecAct, 3, 0, 1)});
  const int bwd = find_op(p, OpKind::BWD, 0, 2, Pass::Bwd, 0);
  for (const FlowTensor& t : writes(p, rec)) CHECK(readers(p, t) == std::vector<int>{bwd});
  // the input gradient of layer 2 goes through the host to the other task's dY
  const int dx = find_op(p, OpKind::dX, 0, 2, Pass::Bwd, 0);
  CHECK(writes(p, dx) == std::vector<FlowTensor>{host(FlowKind::HostGrad, 2, 0, 1)});
  const int dy = find_op(p, OpKind::dY, 0, 0, Pass::Bwd, 0);
  CHECK(reads(p, dy) == std::vector<FlowTensor>{host(FlowKind::HostGrad, 2, 0, 1)});
  CHECK(writes(p, dy) == std::vector<FlowTensor>{grad(0, 2, 0, 1)});
  CHECK(p.dataflow.ops[static_cast<std::size_t>(bwd)].layers == core::LayerRange{2, 3});
}

TEST_CASE("harmony-pp with a message across GPUs: re-sized microbatches through the message channel") {
  // u_fwd 2, u_bwd 1 on two GPUs: the last forward task's Y (GPU 0) reaches the criterion's task (GPU 1) by CPU
  // messages, one per backward microbatch, each a part of the swapped-out Y
  const core::Program p = lower_harmony("harmony-pp", 2, 2, 2, 1, 1);
  check_closed(p);
  const int msg = find_op(p, OpKind::MSGY, 0, 2, Pass::Fwd, 1);
  CHECK(reads(p, msg) == std::vector<FlowTensor>{host(FlowKind::HostY, 3, 1, 1)});
  CHECK(writes(p, msg) == std::vector<FlowTensor>{host(FlowKind::HostYMsg, 3, 1, 1)});
  CHECK(writes(p, find_op(p, OpKind::Y, 0, 2, Pass::Fwd, 0)) ==
        std::vector<FlowTensor>{host(FlowKind::HostY, 3, 0, 2)});
  CHECK(readers(p, host(FlowKind::HostYMsg, 3, 1, 1)) == std::vector<int>{find_op(p, OpKind::X, 1, 3, Pass::Bwd, 1)});
}

TEST_CASE("harmony-dp on two GPUs: each rank's samples, the all-reduce of each task's gradient") {
  const core::Program p = lower_harmony("harmony-dp", 2, 4, 1, 1, 1);
  check_closed(p);
  // GPU 1 runs samples 2 and 3
  CHECK(writes(p, find_op(p, OpKind::X, 1, 0, Pass::Fwd, 3)) == std::vector<FlowTensor>{act(1, 0, 3, 1)});
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    if (p.ops[o].kind != OpKind::ARD) continue;
    const auto r = reads(p, static_cast<int>(o));
    REQUIRE(r.size() == 1);
    CHECK(r[0].kind == FlowKind::DW);
    CHECK(r[0].owner == p.ops[o].task);
    CHECK(writes(p, static_cast<int>(o)) == r);
  }
}

TEST_CASE("update_task_owners names the UPD tasks whose lowered Updates update_owners names") {
  for (const char* kind : {"harmony-dp", "harmony-pp"}) {
    CAPTURE(kind);
    const core::Program p = lower_harmony(kind, 2, 4, 1, 1, 1);
    const std::vector<char> ops = core::update_owners(p);
    const std::vector<char> tasks = core::update_task_owners(p.graph, {0, 1});
    std::set<std::pair<int, int>> ranges;
    int owned = 0;
    for (std::size_t o = 0; o < p.ops.size(); ++o) {
      if (p.ops[o].kind != OpKind::Update) continue;
      ranges.insert({p.ops[o].layers.first, p.ops[o].layers.last});
      CHECK(ops[o] == tasks[static_cast<std::size_t>(p.ops[o].task)]);
      owned += ops[o];
    }
    CHECK(owned == static_cast<int>(ranges.size()));  // one per range: 2 replicas each under harmony-dp
    CHECK(std::count(tasks.begin(), tasks.end(), 1) == owned);
  }
  // a rank left out of the lowering owns nothing, and its ranges fall to the lowest lowered rank
  const core::Program dp = lower_harmony("harmony-dp", 2, 4, 1, 1, 1);
  const std::vector<char> only1 = core::update_task_owners(dp.graph, {1});
  for (std::size_t t = 0; t < dp.graph.tasks.size(); ++t) {
    const core::Task& task = dp.graph.tasks[t];
    const bool upd = task.type == core::TaskType::Upd && task.updates_task >= 0;
    CHECK(only1[t] == (upd && task.rank == 1 ? 1 : 0));
  }
}

TEST_CASE("LowerOptions::dataflow off leaves the dataflow out (the engines read none)") {
  core::Plan p;
  p.kind = core::plan_kind("dp-swap");
  p.gpus = 1;
  p.minibatch = 2;
  p.u_fwd = p.u_bwd = 1;
  core::LowerOptions off;
  off.dataflow = false;
  const core::Program with = core::lower_plan(p, model4());
  const core::Program without = core::lower_plan(p, model4(), off);
  CHECK(with.dataflow.covers(with));
  CHECK(without.dataflow.ops.empty());
  CHECK(without.ops.size() == with.ops.size());
  core::Plan h;
  h.kind = core::plan_kind("harmony-pp");
  h.gpus = 1;
  h.minibatch = 2;
  core::manual_packs(4, 2, h.packs_fwd, h.packs_bwd);
  const core::Program hp = core::lower_harmony(core::compose_task_graph(h, 4), model4(), off);
  CHECK(hp.dataflow.ops.empty());
  CHECK_FALSE(hp.ops.empty());
}

// host-stream (one GPU, D 2 in microbatches of 1): every layer kept on the GPU (the default capacity) or every layer
// streamed (none fits). The update pass brings Opt (and a streamed layer's W and summed DW), the device Update reads W,
// DW and Opt and writes W and Opt, the update pass's dWB takes W and Opt home; a kept layer's W is written only by its
// update (carried across steps), and its first microbatch's dWB is a round trip the host gradient never sees.
core::Program lower_host_stream(core::Bytes capacity) {
  core::Plan p;
  p.kind = core::plan_kind("host-stream");
  p.gpus = 1;
  p.minibatch = 2;
  p.u_fwd = p.u_bwd = 1;
  p.knobs.gpu_capacity_bytes = capacity;
  return core::lower_plan(p, model4());
}

TEST_CASE("host-stream: a device update over state brought from the host and taken back") {
  const FlowTensor opt0{0, FlowKind::Opt, 0, 0, 0, -1};
  for (const bool kept : {true, false}) {
    CAPTURE(kept);
    const core::Program p = lower_host_stream(kept ? core::KindKnobs{}.gpu_capacity_bytes : 0);
    check_closed(p);
    const core::HostGradients hg = core::host_gradients(p);
    for (int l = 0; l < 4; ++l) {
      CAPTURE(l);
      const FlowTensor opt{0, FlowKind::Opt, l, 0, 0, -1};
      const int in = find_op(p, OpKind::WB, 0, l, Pass::Update), up = find_op(p, OpKind::Update, 0, l, Pass::Update),
                out = find_op(p, OpKind::dWB, 0, l, Pass::Update);
      CHECK(writes(p, in) ==
            (kept ? std::vector<FlowTensor>{opt} : std::vector<FlowTensor>{opt, weights(0, l), dw(0, l)}));
      CHECK(reads(p, up) == std::vector<FlowTensor>{weights(0, l), dw(0, l), opt});
      CHECK(writes(p, up) == std::vector<FlowTensor>{weights(0, l), opt});
      CHECK(reads(p, out) == std::vector<FlowTensor>{weights(0, l), opt});
      CHECK(hg.write[static_cast<std::size_t>(out)] == core::GradWrite::None);  // moves state, not a gradient
      if (kept) CHECK(writers(p, weights(0, l)) == std::vector<int>{up});
      // the first microbatch's gradient: a round trip while kept (the second stays for the update), else copied
      std::vector<core::GradWrite> bwd;  // the backward's dWBs of the layer, by microbatch
      for (std::size_t o = 0; o < p.ops.size(); ++o)
        if (p.ops[o].kind == OpKind::dWB && p.dataflow.ops[o].pass == Pass::Bwd && p.ops[o].layers.first == l)
          bwd.push_back(hg.write[o]);
      CHECK(bwd ==
            (kept ? std::vector{core::GradWrite::Drop} : std::vector{core::GradWrite::Copy, core::GradWrite::Add}));
    }
    CHECK(writers(p, opt0).size() == 2);  // its WB, its update
    const core::StateLayout s = core::state_layout(p);
    CHECK(s.device_update);
    CHECK_FALSE(s.resident);
    if (kept) {
      CHECK(s.carried == FlowKind::W);
      CHECK(s.carried_layers == std::vector<std::vector<int>>{{0, 1, 2, 3}});
    } else {
      CHECK_FALSE(s.carried);
    }
  }
}

// core::state_layout: what each kind's Program keeps between steps, read from its ops and passes alone.
core::Program lower_every_gpu(const char* kind, int gpus, core::LowerOptions options = {}) {
  core::Plan p;
  p.kind = core::plan_kind(kind);
  p.gpus = gpus;
  p.minibatch = 2 * gpus;
  p.u_fwd = p.u_bwd = p.kind->one_microbatch ? 2 : 1;
  options.dp_first_gpu_only = false;
  return core::lower_plan(p, model4(), options);
}

TEST_CASE("state_layout: resident, sharded, whole weights and carried weights from the Program's ops") {
  for (const char* kind : {"resident", "fsdp", "zero2", "zero3"}) {
    CAPTURE(kind);
    const core::StateLayout one = core::state_layout(lower_every_gpu(kind, 1));
    CHECK(one.resident);
    CHECK_FALSE(one.carried);
    const core::StateLayout two = core::state_layout(lower_every_gpu(kind, 2));
    CHECK(two.resident);
    CHECK(two.sharded == (std::string(kind) != "resident"));
    CHECK(two.whole_weights == (std::string(kind) == "zero2"));  // zero2 all-gathers in the update pass
    CHECK_FALSE(two.carried);
    CHECK(two.carried_layers.empty());
  }
  for (const char* kind : {"dp-swap", "zero-infinity", "zero-offload", "l2l"}) {
    CAPTURE(kind);
    const core::StateLayout s = core::state_layout(lower_every_gpu(kind, 2));
    CHECK_FALSE(s.resident);
    CHECK_FALSE(s.sharded);
    CHECK_FALSE(s.carried);
    CHECK_FALSE(s.device_update);
  }
  // zero3-opt-offload sends each GPU's updated shard up for the next step's all-gathers (over one GPU: the whole layer)
  const core::StateLayout two = core::state_layout(lower_every_gpu("zero3-opt-offload", 2));
  CHECK_FALSE(two.resident);
  CHECK(two.carried == FlowKind::WShard);
  REQUIRE(two.carried_layers.size() == 2);
  for (const auto& layers : two.carried_layers)
    CHECK(std::set<int>(layers.begin(), layers.end()) == std::set{0, 1, 2, 3});
  const core::StateLayout one = core::state_layout(lower_every_gpu("zero3-opt-offload", 1));
  CHECK(one.carried == FlowKind::W);
  // without a dataflow only what the ops alone say
  core::LowerOptions off;
  off.dataflow = false;
  CHECK_FALSE(core::state_layout(lower_every_gpu("zero3-opt-offload", 2, off)).carried);
  CHECK_FALSE(core::state_layout(lower_every_gpu("zero2", 2, off)).whole_weights);
  CHECK(core::state_layout(lower_every_gpu("zero2", 2, off)).sharded);
}
