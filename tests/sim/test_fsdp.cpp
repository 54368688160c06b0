// The fsdp, zero2 and zero3 kinds (core/kinds/fsdp.cpp, zero2.cpp, zero3.cpp) lowered and priced: their Programs'
// collectives, shards, GPU updates and stage-3 hook work counted against closed forms, one GPU priced as resident, and
// the memory and time they trade against resident on several.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/kinds/kinds.hpp"
#include "core/program/lower.hpp"
#include "core/program/program.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony {
namespace {

using core::Bytes;
using core::OpKind;
using core::Stream;

// Two layers of `w` weight bytes (w / 4 fp32 parameters), 10 buffer bytes, 2 w bytes of optimizer state.
core::Model tiny_model(Bytes w = 1000) {
  core::Model m;
  m.name = "tiny";
  m.ubatch_fwd = {1, 2};
  m.ubatch_bwd = {1, 2};
  for (int l = 0; l < 2; ++l) {
    core::Layer L;
    L.name = fmt::format("l{}", l);
    L.is_criterion = l == 1;
    L.weight_bytes = w;
    L.buffer_bytes = 10;
    L.param_count = w / 4;
    L.optimizer_state_bytes = 2 * w;
    L.update_time_cpu_s = 0.25;
    L.input_bytes_per_sample = 100;
    L.fwd_time_s = {0.001, 0.002};
    L.bwd_time_s = {0.003, 0.006};
    L.fwd_peak_bytes = {500, 1000};
    L.bwd_peak_bytes = {800, 1600};
    m.layers.push_back(L);
  }
  return m;
}

core::Plan plan_of(const char* kind, int gpus, int minibatch, int u) {
  core::Plan p;
  p.kind = core::plan_kind(kind);
  p.gpus = gpus;
  p.minibatch = minibatch;
  p.u_fwd = p.u_bwd = u;
  return p;
}

// `gpus` GPUs behind one switch, 1 GB/s uplink, 4 GB/s GPU links, HBM at 1 GB/s (AdamW's traffic priced: 28 bytes per
// parameter, 7 us for a 250-parameter layer).
core::MachineSpec one_switch(int gpus) {
  core::MachineSpec m;
  m.name = "test";
  m.gpus = gpus;
  m.topology.switches = {{"sw0", 0, 1e9}};
  for (int g = 0; g < gpus; ++g) m.topology.gpus.push_back(core::GpuSpec{0, 4e9, 1, 1});
  m.topology.cpu_cores = 8;
  m.gpu_rates.memory_bytes_per_s = 1e9;
  m.gpu_rates.vector_efficiency = 1.0;
  return m;
}

sim::NativeOptions quiet() {
  sim::NativeOptions o;
  o.latency = false;
  return o;
}

core::TimePs iteration_ps(const sim::NativeResult& r) {
  return r.timeline.end_ps.empty() ? 0 : *std::max_element(r.timeline.end_ps.begin(), r.timeline.end_ps.end());
}

// tiny_model's layers as T = 3 parameter tensors in M = 2 gathered modules (zero3's hook counts).
core::Model hooked_model() {
  core::Model m = tiny_model();
  for (auto& L : m.layers) {
    L.param_tensors = 3;
    L.gathered_modules = 2;
  }
  return m;
}

// zero3 on `gpus` GPUs, minibatch D in microbatches of 2, with module_latency 1 ms and tensor_latency 0.1 ms.
core::Plan zero3_plan(int gpus, int minibatch) {
  core::Plan z = plan_of("zero3", gpus, minibatch, 2);
  z.knobs.zero3.module_latency_s = 1e-3;
  z.knobs.zero3.tensor_latency_s = 1e-4;
  return z;
}

}  // namespace

TEST_CASE("fsdp: every microbatch gathers each layer twice and reduce-scatters it once; AdamW on the shard") {
  const core::Model m = tiny_model();
  const int N = 2, D = 8, u = 2, mb = D / N / u;  // two microbatches per GPU
  const core::Program prog = core::lower_plan(plan_of("fsdp", N, D, u), m);
  CHECK_NOTHROW(core::validate_program(prog));
  std::map<std::pair<int, OpKind>, int> count;
  for (const core::Op& op : prog.ops) {
    ++count[{op.device, op.kind}];
    if (op.kind == OpKind::AG) {
      CHECK(op.stream == Stream::P2PIn);
      CHECK(op.bytes == 1010);  // the full W+B gathered
    }
    if (op.kind == OpKind::RS) CHECK(op.stream == Stream::P2POut);
    if (op.kind == OpKind::Update) {
      CHECK(op.stream == Stream::Compute);  // on the GPU
      CHECK_FALSE(core::host_update(op));
      CHECK(op.bytes == 28 * 125);  // 28 bytes per parameter of the rank's 125-parameter shard
    }
    // nothing moves between host and GPU but the data
    CHECK(op.kind != OpKind::WB);
    CHECK(op.kind != OpKind::dWB);
    CHECK(op.kind != OpKind::ARD);
    if (op.kind == OpKind::FWD && op.ui == 0) {
      // the persistent shard: ceil(1010/2) + ceil(1000/2) + ceil(2000/2)
      const auto it = std::find_if(op.allocs.begin(), op.allocs.end(),
                                   [](const core::TensorRef& t) { return t.kind == core::TensorKind::OptState; });
      REQUIRE(it != op.allocs.end());
      CHECK(it->bytes == 505 + 500 + 1000);
    }
  }
  for (int g = 0; g < N; ++g) {
    CAPTURE(g);
    CHECK(count[{g, OpKind::AG}] == 2 * mb * 2);
    CHECK(count[{g, OpKind::RS}] == mb * 2);
    CHECK(count[{g, OpKind::Update}] == 2);
    CHECK(count[{g, OpKind::X}] == mb);
  }
}

TEST_CASE("pure 2-byte training: AdamW on the GPU moves 14 bytes a parameter, not 28 (fsdp and resident)") {
  core::Model m = tiny_model();  // 250 parameters a layer
  m.fp32_optimizer = false;      // model.analytic.master_weights: false
  for (core::Layer& L : m.layers) {
    L.weight_bytes = 2 * L.param_count;
    L.optimizer_state_bytes = 4 * L.param_count;  // two bf16 moments
  }
  int updates = 0;
  for (const core::Op& op : core::lower_plan(plan_of("fsdp", 2, 8, 2), m).ops) {
    if (op.kind != OpKind::Update) continue;
    CHECK(op.bytes == 14 * 125);  // the rank's 125-parameter shard
    ++updates;
  }
  for (const core::Op& op : core::lower_plan(plan_of("resident", 1, 4, 2), m).ops) {
    if (op.kind != OpKind::Update) continue;
    CHECK(op.bytes == 14 * 250);
    ++updates;
  }
  CHECK(updates == 2 * 2 + 2);
  m.fp32_optimizer = true;  // the same 2-byte weights in mixed precision: FP32 masters and moments, 28 bytes
  for (const core::Op& op : core::lower_plan(plan_of("resident", 1, 4, 2), m).ops)
    if (op.kind == OpKind::Update) CHECK(op.bytes == 28 * 250);
}

TEST_CASE("torch's foreach AdamW on the GPU: the Update moves the model's bytes a parameter (resident, fsdp, zero2)") {
  core::Model m = tiny_model();  // 250 fp32 parameters a layer
  m.device_adamw_bytes_per_param = 80;
  for (const char* kind : {"resident", "fsdp", "zero2", "zero3"}) {
    CAPTURE(kind);
    const int gpus = std::string(kind) == "resident" ? 1 : 2;
    int updates = 0;
    for (const core::Op& op : core::lower_plan(plan_of(kind, gpus, 4, 2), m).ops) {
      if (op.kind != OpKind::Update) continue;
      CHECK(op.bytes == 80 * ((250 + gpus - 1) / gpus));  // the rank's ceil(250 / N) parameters
      ++updates;
    }
    CHECK(updates == 2 * gpus);
  }
}

TEST_CASE("fsdp on one GPU is resident: no collectives, the same time and peak memory") {
  const core::Model m = tiny_model();
  const core::Program f = core::lower_plan(plan_of("fsdp", 1, 4, 2), m);
  const core::Program r = core::lower_plan(plan_of("resident", 1, 4, 2), m);
  for (const core::Op& op : f.ops) CHECK((op.kind != OpKind::AG && op.kind != OpKind::RS));
  const auto mach = one_switch(1);
  const auto rf = sim::run_native(f, m, mach, quiet());
  const auto rr = sim::run_native(r, m, mach, quiet());
  CHECK(iteration_ps(rf) == iteration_ps(rr));
  CHECK(rf.peak_bytes == rr.peak_bytes);
  CHECK(rf.host.total_bytes() == 0);
}

TEST_CASE("fsdp on four GPUs: a quarter of the state per GPU, paid for in collectives") {
  const auto mach = one_switch(4);
  const core::Model m = tiny_model();
  const core::Program f = core::lower_plan(plan_of("fsdp", 4, 8, 1), m);
  const core::Program r = core::lower_plan(plan_of("resident", 4, 8, 1), m);
  const auto rf = sim::run_native(f, m, mach, quiet());
  const auto rr = sim::run_native(r, m, mach, quiet());
  REQUIRE(rf.feasible);
  REQUIRE(rr.feasible);
  // per GPU: resident holds 2 x (1010 + 1000 + 2000) = 8020 bytes of state, fsdp 2 x (253 + 250 + 500) = 2006 plus at
  // most a few gathered layers and one full gradient
  for (int g = 0; g < 4; ++g) {
    CAPTURE(g);
    CHECK(rf.peak_bytes[static_cast<std::size_t>(g)] < rr.peak_bytes[static_cast<std::size_t>(g)]);
  }
  // the collectives: resident all-reduces each layer once; fsdp gathers it 2 x 2 times and reduce-scatters it twice
  Bytes f_coll = 0, r_coll = 0;
  for (const core::Op& op : f.ops)
    if (op.kind == OpKind::AG || op.kind == OpKind::RS) f_coll += op.bytes;
  for (const core::Op& op : r.ops)
    if (op.kind == OpKind::ARD) r_coll += op.bytes;
  CHECK(f_coll == 4 * (2 * 2 * 2 + 2 * 2) * 1010);
  CHECK(r_coll == 4 * 2 * 1010);
  CHECK(rf.host.total_bytes() == 0);
  // Small layers: the gathers hide under the 1-3 ms of compute on their own streams, and each rank's AdamW covers a
  // quarter of the parameters (1.8 us a layer where resident's takes 7 us on the compute stream after an all-reduce
  // there): fsdp's iteration is no longer than resident's.
  CHECK(iteration_ps(rf) <= iteration_ps(rr));
  // 100 MB layers: each gather moves 75 MB of the 100 MB over a 4 GB/s link (19 ms, more than the compute), twelve of
  // them per GPU and iteration against resident's two all-reduces: fsdp is the slower.
  const core::Model big = tiny_model(100'000'000);
  auto fast_hbm = mach;
  fast_hbm.gpu_rates.memory_bytes_per_s = 1e12;
  const auto bf = sim::run_native(core::lower_plan(plan_of("fsdp", 4, 8, 1), big), big, fast_hbm, quiet());
  const auto br = sim::run_native(core::lower_plan(plan_of("resident", 4, 8, 1), big), big, fast_hbm, quiet());
  REQUIRE(bf.feasible);
  REQUIRE(br.feasible);
  CHECK(iteration_ps(bf) > iteration_ps(br));
  // 12 gathers and reduce-scatters of (3/4) x 100 MB at 4 GB/s: at least 225 ms on each GPU's links
  CHECK(core::ps_to_seconds(iteration_ps(bf)) >= 0.225 * 0.999);
}

TEST_CASE("zero2: whole weights, partitioned gradients and AdamW state; reduce-scatter, then all-gather once") {
  const core::Model m = tiny_model();
  // one GPU: resident's Program, time and peak
  {
    const auto mach = one_switch(1);
    const core::Program z = core::lower_plan(plan_of("zero2", 1, 4, 2), m);
    const core::Program r = core::lower_plan(plan_of("resident", 1, 4, 2), m);
    for (const core::Op& op : z.ops) CHECK((op.kind != OpKind::AG && op.kind != OpKind::RS));
    const auto rz = sim::run_native(z, m, mach, quiet());
    const auto rr = sim::run_native(r, m, mach, quiet());
    CHECK(iteration_ps(rz) == iteration_ps(rr));
    CHECK(rz.peak_bytes == rr.peak_bytes);
  }
  // four GPUs, two microbatches each: per GPU a reduce-scatter of each layer every microbatch and one all-gather of
  // each layer after its update; AdamW over a quarter of the parameters (63 of 250: 28 x 63 bytes)
  const auto mach = one_switch(4);
  const core::Program z = core::lower_plan(plan_of("zero2", 4, 8, 1), m);
  std::map<OpKind, int> count;
  Bytes rs = 0, ag = 0;
  for (const core::Op& op : z.ops) {
    ++count[op.kind];
    if (op.kind == OpKind::RS) rs += op.bytes;
    if (op.kind == OpKind::AG) ag += op.bytes;
    if (op.kind == OpKind::Update) {
      CHECK(op.bytes == 28 * 63);
      CHECK(op.stream == Stream::Compute);
    }
  }
  CHECK(count[OpKind::RS] == 4 * 2 * 2);
  CHECK(count[OpKind::AG] == 4 * 2);
  CHECK(count[OpKind::ARD] == 0);
  CHECK(rs == 4 * 2 * 2 * 1010);
  CHECK(ag == 4 * 2 * 1010);
  // memory: below resident's (whole gradient and state on every GPU), at least its own state: 2 x (1010 whole W+B +
  // 250 of gradient + 500 of AdamW state) = 3520 (fsdp's partitions are smaller, but with two 1 kB layers its three
  // gathered layers outweigh them)
  const auto rz = sim::run_native(z, m, mach, quiet());
  const auto rr = sim::run_native(core::lower_plan(plan_of("resident", 4, 8, 1), m), m, mach, quiet());
  REQUIRE(rz.feasible);
  for (int g = 0; g < 4; ++g) {
    CAPTURE(g);
    const auto G = static_cast<std::size_t>(g);
    CHECK(rz.peak_bytes[G] < rr.peak_bytes[G]);
    CHECK(rz.peak_bytes[G] >= 3520);
  }
  CHECK(rz.host.total_bytes() == 0);
  // the search's estimate fits where resident's does not: a capacity between the two
  auto space = core::search_space_for(core::plan_kind("zero2"), 4, 8, 7000, core::SearchSpec{});
  CHECK_FALSE(core::enumerate_plans(m, space).empty());
  space = core::search_space_for(core::plan_kind("resident"), 4, 8, 7000, core::SearchSpec{});
  CHECK(core::enumerate_plans(m, space).empty());
}

TEST_CASE("zero2 is a baseline harmony-sim prices and harmony-run trains") {
  const core::PlanKind k = core::plan_kind("zero2");
  CHECK(k->role == core::KindRole::Baseline);
  CHECK(k->resident_state);
  CHECK(k->trains);
  CHECK(k->data_parallel);
}

TEST_CASE("fsdp is a baseline harmony-sim prices and harmony-run trains") {
  const core::PlanKind k = core::plan_kind("fsdp");
  CHECK(k->role == core::KindRole::Baseline);
  CHECK(k->resident_state);
  CHECK(k->trains);
  CHECK(k->data_parallel);
}

TEST_CASE("zero3: fsdp's Program with stage 3's hook work on every FWD and BWD, per gathered module and tensor") {
  // Layers of T = 3 parameter tensors in M = 2 gathered modules; module_latency 1 ms, tensor_latency 0.1 ms: each FWD
  // carries M x 1 + T x 0.1 = 2.3 ms, each BWD M x 1 + 2 T x 0.1 = 2.6 ms (the gradient's path without the optimizer
  // offloaded is another tensor_latency per tensor; grad_tensor_latency is the offload kinds').
  core::Model m = hooked_model();
  core::Plan z = zero3_plan(2, 8);
  z.knobs.zero3.grad_tensor_latency_s = 5.0;  // not read by zero3
  const core::Program pz = core::lower_plan(z, m);
  const core::Program pf = core::lower_plan(plan_of("fsdp", 2, 8, 2), m);
  REQUIRE(pz.ops.size() == pf.ops.size());
  int fwd = 0, bwd = 0;
  for (std::size_t i = 0; i < pz.ops.size(); ++i) {
    CAPTURE(i);
    const core::Op& a = pz.ops[i];
    const core::Op& b = pf.ops[i];
    CHECK(a.kind == b.kind);  // the same ops, bytes and order: only the host work differs
    CHECK(a.bytes == b.bytes);
    CHECK(a.device == b.device);
    CHECK(pf.cost.op(static_cast<int>(i)).overhead_s == 0.0);
    const double o = pz.cost.op(static_cast<int>(i)).overhead_s;
    if (a.kind == OpKind::FWD) {
      CHECK(o == doctest::Approx(2.3e-3).epsilon(1e-12));
      ++fwd;
    } else if (a.kind == OpKind::BWD) {
      CHECK(o == doctest::Approx(2.6e-3).epsilon(1e-12));
      ++bwd;
    } else {
      CHECK(o == 0.0);
    }
  }
  CHECK(fwd == 2 * 2 * 2);  // 2 GPUs x 2 microbatches x 2 layers
  CHECK(bwd == 2 * 2 * 2);
  // zero latencies: fsdp's time and memory exactly
  const auto mach = one_switch(2);
  core::Plan z0 = plan_of("zero3", 2, 8, 2);
  z0.knobs.zero3.module_latency_s = z0.knobs.zero3.tensor_latency_s = 0;
  const auto r0 = sim::run_native(core::lower_plan(z0, m), m, mach, quiet());
  const auto rf = sim::run_native(pf, m, mach, quiet());
  CHECK(iteration_ps(r0) == iteration_ps(rf));
  CHECK(r0.peak_bytes == rf.peak_bytes);
  // a profile's layer (no module count) is one gathered module
  for (auto& L : m.layers) L.gathered_modules = -1;
  const core::Program unknown = core::lower_plan(z, m);
  for (std::size_t i = 0; i < unknown.ops.size(); ++i)
    if (unknown.ops[i].kind == OpKind::FWD)
      CHECK(unknown.cost.op(static_cast<int>(i)).overhead_s == doctest::Approx(1.3e-3).epsilon(1e-12));
}

TEST_CASE("zero3 on one GPU: resident's Program and collectives-free, slower by exactly its hooks") {
  // One GPU, two microbatches of 2 (D = 4): the compute stream runs FWD0 FWD1 BWD1 BWD0 twice, each op after its
  // host work, so the iteration is resident's plus 2 microbatches x 2 layers x (2.3 + 2.6) ms = 19.6 ms.
  const core::Model m = hooked_model();
  const core::Plan z = zero3_plan(1, 4);
  const core::Program pz = core::lower_plan(z, m);
  for (const core::Op& op : pz.ops) CHECK((op.kind != OpKind::AG && op.kind != OpKind::RS));
  const auto mach = one_switch(1);
  const auto rz = sim::run_native(pz, m, mach, quiet());
  const auto rr = sim::run_native(core::lower_plan(plan_of("resident", 1, 4, 2), m), m, mach, quiet());
  CHECK(core::ps_to_seconds(iteration_ps(rz) - iteration_ps(rr)) == doctest::Approx(19.6e-3).epsilon(1e-9));
  CHECK(rz.peak_bytes == rr.peak_bytes);
  CHECK(rz.host.total_bytes() == 0);
}

TEST_CASE("zero3 refuses hook costs no config could give") {
  const core::Model m = tiny_model();
  core::Plan z = plan_of("zero3", 2, 8, 2);
  z.knobs.zero3.tensor_latency_s = -1e-6;
  CHECK_THROWS_AS(core::lower_plan(z, m), core::ScheduleError);
  z.knobs.zero3.tensor_latency_s = 0;
  z.knobs.zero3.bucket_elements = 0.5;
  CHECK_THROWS_AS(core::lower_plan(z, m), core::ScheduleError);
}

TEST_CASE("zero3 is a baseline harmony-sim prices and harmony-run trains (as fsdp's Program), with plan.zero3") {
  const core::PlanKind k = core::plan_kind("zero3");
  CHECK(k->role == core::KindRole::Baseline);
  CHECK(k->resident_state);
  CHECK(k->trains);
  CHECK(k->data_parallel);
  CHECK(k.has_knob(core::Knob::Zero3));
  CHECK_FALSE(k.has_knob(core::Knob::Offload));
}

}  // namespace harmony
