// The native cost model: max-min fair flow sharing on hand-built Programs (each expected time derived
// in the test), latency, copy engines, CPU cores, P2P rendezvous, memory overflow and host-memory
// infeasibility, determinism; the 42 bert_large oracles against the reference model; a Harmony-PP plan
// on a paper-1080ti-like topology (feasible at 10 GiB, infeasible at 4 GiB); ledger and trace counters.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/analytic.hpp"
#include "core/model/profile.hpp"
#include "core/output/host_memory.hpp"
#include "core/output/report.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/study/calibrate.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using core::Bytes;
using core::OpKind;
using core::Stream;
using core::TimePs;
using harmony::test::source_dir;

namespace {

std::size_t z(int i) { return static_cast<std::size_t>(i); }

// Ops appended to (device, stream) queues in call order.
struct Builder {
  core::Program p;
  explicit Builder(int gpus) { p.graph.plan.gpus = gpus; }
  int add(int device, Stream s, OpKind k, Bytes bytes = 0, std::vector<int> deps = {}) {
    core::Op o;
    o.device = device;
    o.stream = s;
    o.kind = k;
    o.bytes = bytes;
    o.task = static_cast<int>(p.ops.size());
    o.ubs = 1;
    o.deps.assign(deps.begin(), deps.end());
    int q = -1;
    for (std::size_t i = 0; i < p.queues.size(); ++i) {
      if (p.queues[i].device == device && p.queues[i].stream == s) q = static_cast<int>(i);
    }
    if (q < 0) {
      q = static_cast<int>(p.queues.size());
      p.queues.push_back({device, s, {}});
    }
    o.queue = q;
    o.queue_pos = static_cast<int>(p.queues[z(q)].ops.size());
    const int id = static_cast<int>(p.ops.size());
    p.queues[z(q)].ops.push_back(id);
    p.ops.push_back(o);
    return id;
  }
  // a P2P send on `from` and its receive on `to`, rendezvous peers
  std::pair<int, int> p2p(int from, int to, Bytes bytes) {
    const int s = add(from, Stream::P2POut, OpKind::Y, bytes);
    const int r = add(to, Stream::P2PIn, OpKind::X, bytes);
    p.ops[z(s)].peer = r;
    p.ops[z(r)].peer = s;
    return {s, r};
  }
};

// A two-layer model (or `layers` layers, the last the criterion): forward 1 ms per layer, backward 3 ms, CPU update
// 0.25 s per layer.
core::Model tiny_model(int layers = 2) {
  core::Model m;
  m.name = "tiny";
  m.ubatch_fwd = {1};
  m.ubatch_bwd = {1};
  for (int l = 0; l < layers; ++l) {
    core::Layer L;
    L.name = fmt::format("l{}", l);
    L.is_criterion = l == layers - 1;
    L.weight_bytes = 1000;
    L.buffer_bytes = 10;
    L.optimizer_state_bytes = 2000;
    L.update_time_cpu_s = 0.25;
    L.input_bytes_per_sample = 100;
    L.fwd_time_s = {0.001};
    L.bwd_time_s = {0.003};
    L.fwd_peak_bytes = {500};
    L.bwd_peak_bytes = {800};
    m.layers.push_back(L);
  }
  return m;
}

// `gpus` GPUs behind one switch: uplink `uplink` B/s per direction, GPU links `link` B/s.
core::MachineSpec one_switch(int gpus, double uplink, double link) {
  core::MachineSpec m;
  m.name = "test";
  m.gpus = gpus;
  m.topology.switches = {{"sw0", 0, uplink}};
  for (int g = 0; g < gpus; ++g) m.topology.gpus.push_back(core::GpuSpec{0, link, 1, 1});
  m.topology.cpu_cores = 8;
  return m;
}

// The paper's testbed as configs/machines/paper-1080ti.yaml describes it, built in code: 8 x GTX 1080 Ti,
// two per PCIe switch, two switches per socket, GPU links and switch uplinks at bw_swap (11.5 GiB/s per
// direction), one copy engine per direction, P2P over PCIe, QPI 19.2 GB/s, 10 us per transfer, 750 GiB
// of host memory (700 GiB pinnable), host memcpy 10 GB/s, 36 cores, 40 ms to free a pack.
core::MachineSpec paper_1080ti_like(Bytes gpu_memory = 10 * core::kGiB) {
  core::MachineSpec m;
  m.name = "paper-1080ti-like";
  m.gpu_name = "GTX 1080 Ti";
  m.gpus = 8;
  m.gpu_memory_bytes = gpu_memory;
  auto& t = m.topology;
  const double pcie = 11.5 * static_cast<double>(core::kGiB);
  t.switches = {{"plx0", 0, pcie}, {"plx1", 0, pcie}, {"plx2", 1, pcie}, {"plx3", 1, pcie}};
  for (int g = 0; g < 8; ++g) t.gpus.push_back(core::GpuSpec{g / 2, pcie, 1, 1});
  t.sockets = 2;
  t.inter_socket_bytes_per_s = 19.2e9;
  t.p2p = core::P2PMode::Pcie;
  t.transfer_latency_s = 10e-6;
  t.host_memory_bytes = 750 * core::kGiB;
  t.pinned_limit_bytes = 700 * core::kGiB;
  t.host_memcpy_bytes_per_s = 10e9;
  t.cpu_cores = 36;
  t.free_time_s = 0.040;
  return m;
}

sim::NativeOptions quiet() {
  sim::NativeOptions o;
  o.latency = false;
  return o;
}

constexpr TimePs kMs = 1'000'000'000;  // picoseconds per millisecond

}  // namespace

TEST_CASE("two transfers on one link each get half the bandwidth and finish together") {
  // GPU0 and GPU1 swap in B bytes each at t = 0. Both paths cross the switch uplink (W = 1e9 B/s);
  // the GPU links (4e9 B/s) are not bottlenecks. Max-min: each flow gets W/2 = 5e8 B/s, so both end
  // at B / (W/2) = 2B/W = 2 * 1e6 / 1e9 s = 2 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int x0 = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const int x1 = b.add(1, Stream::SwapIn, OpKind::WB, B);
  const auto r = sim::run_native(b.p, tiny_model(), one_switch(2, 1e9, 4e9), quiet());
  CHECK(r.timeline.begin_ps[z(x0)] == 0);
  CHECK(r.timeline.end_ps[z(x0)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(x1)] == 2 * kMs);
  // the uplink was busy for the whole 2 ms and carried both transfers
  const auto& g = r.graph;
  CHECK(r.link_stats[z(g.switch_down[0])].busy_ps == 2 * kMs);
  CHECK(r.link_stats[z(g.switch_down[0])].bytes == 2 * B);
  CHECK(r.class_bytes[static_cast<int>(sim::TransferClass::PcieH2D)] == 2 * B);
  // without contention each flow gets the whole bottleneck: B / W = 1 ms
  auto o = quiet();
  o.contention = false;
  const auto alone = sim::run_native(b.p, tiny_model(), one_switch(2, 1e9, 4e9), o);
  CHECK(alone.timeline.end_ps[z(x0)] == 1 * kMs);
  CHECK(alone.timeline.end_ps[z(x1)] == 1 * kMs);
}

TEST_CASE("a transfer that finishes frees its bandwidth for the other") {
  // Flows of B and 3B start together on the uplink (W = 1e9 B/s). Until the first ends both get W/2:
  // the first ends at B / (W/2) = 2B/W = 2 ms, when the second has moved B and has 2B left. Alone it
  // gets W and needs 2B/W = 2 ms more: it ends at 2B/W + 2B/W = 4B/W = 4 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int small = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const int large = b.add(1, Stream::SwapIn, OpKind::WB, 3 * B);
  const auto r = sim::run_native(b.p, tiny_model(), one_switch(2, 1e9, 4e9), quiet());
  CHECK(r.timeline.end_ps[z(small)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(large)] == 4 * kMs);
}

TEST_CASE("a flow through two links runs at the slower one; directions are independent") {
  // GPU0's swap-in crosses the uplink (1e9 B/s) and GPU0's link (4e8 B/s): B / 4e8 = 2.5 ms.
  // Its swap-out at the same time uses the up direction of both links and does not slow it down.
  const Bytes B = 1'000'000;
  Builder b(1);
  const int in = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const int out = b.add(0, Stream::SwapOut, OpKind::dWB, B);
  const auto r = sim::run_native(b.p, tiny_model(), one_switch(1, 1e9, 4e8), quiet());
  CHECK(r.timeline.end_ps[z(in)] == 2'500'000'000);
  CHECK(r.timeline.end_ps[z(out)] == 2'500'000'000);
  CHECK(r.class_bytes[static_cast<int>(sim::TransferClass::PcieD2H)] == B);
  CHECK(r.tensor_bytes[static_cast<int>(core::TensorKind::Weights)] == B);
  CHECK(r.tensor_bytes[static_cast<int>(core::TensorKind::WeightGrad)] == B);
}

TEST_CASE("max-min fairness with three flows on two shared links (progressive filling)") {
  // Three GPUs on one switch. Links (units of 1e8 B/s): uplink down U = 10, GPU0 link down L0 = 6,
  // the other links 40 (never bottlenecks).
  //   A: swap-in on GPU0        path {U, L0}
  //   B: swap-in on GPU1        path {U, L1}
  //   C: P2P GPU2 -> GPU0       path {GPU2 up, L0}
  // Progressive filling: fair shares U: 10/2 = 5 (A, B), L0: 6/2 = 3 (A, C). The smallest is L0's 3:
  // A = C = 3 and both freeze. U has 10 - 3 = 7 left for B alone: B = 7.
  // Volumes A = 3e5, B = 1.7e6, C = 9e5 bytes:
  //   t1 = 3e5 / 3e8 = 1 ms: A ends; B moved 7e5 (1e6 left), C moved 3e5 (6e5 left).
  //   Refill: L0 has C alone: 6; U has B alone: 10 (L1 = 40): C = 6e8, B = 1e9 B/s.
  //   C ends at 1 ms + 6e5 / 6e8 = 2 ms, B at 1 ms + 1e6 / 1e9 = 2 ms.
  Builder b(3);
  const int A = b.add(0, Stream::SwapIn, OpKind::WB, 300'000);
  const int B = b.add(1, Stream::SwapIn, OpKind::WB, 1'700'000);
  const auto [cs, cr] = b.p2p(2, 0, 900'000);
  auto m = one_switch(3, 10e8, 40e8);
  m.topology.gpus[0].link_bytes_per_s = 6e8;
  sim::NativeOptions o = quiet();
  o.record_counters = true;
  const auto r = sim::run_native(b.p, tiny_model(), m, o);
  CHECK(r.timeline.end_ps[z(A)] == 1 * kMs);
  CHECK(r.timeline.end_ps[z(B)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(cs)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(cr)] == 2 * kMs);
  // the bandwidth counters saw the rates of the first phase: L0 full (3 + 3), U full (3 + 7)
  bool l0_full = false;
  bool u_full = false;
  for (const auto& s : r.bandwidth_samples) {
    if (s.time_ps != 0) continue;
    if (s.link == r.graph.gpu_down[0] && s.rate == doctest::Approx(6e8)) l0_full = true;
    if (s.link == r.graph.switch_down[0] && s.rate == doctest::Approx(10e8)) u_full = true;
  }
  CHECK(l0_full);
  CHECK(u_full);
  CHECK(r.class_bytes[static_cast<int>(sim::TransferClass::P2PPcie)] == 900'000);
}

TEST_CASE("transfer latency is a fixed delay before the bytes flow") {
  // B / W = 1e6 / 1e9 s = 1 ms, plus a 10 us latency: 1.01 ms. A P2P pair pays it once.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int x = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const auto [s, rv] = b.p2p(0, 1, B);
  auto m = one_switch(2, 4e9, 1e9);
  m.topology.transfer_latency_s = 10e-6;
  const auto r = sim::run_native(b.p, tiny_model(), m, sim::NativeOptions{});
  CHECK(r.timeline.end_ps[z(x)] == 1 * kMs + 10'000'000);
  CHECK(r.timeline.end_ps[z(s)] == 1 * kMs + 10'000'000);
  CHECK(r.timeline.end_ps[z(rv)] == r.timeline.end_ps[z(s)]);
  const auto off = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(off.timeline.end_ps[z(x)] == 1 * kMs);
}

TEST_CASE("copy engines are FIFO per direction") {
  // GPU0 swaps out B and sends B to GPU1 at t = 0; both need GPU0's device->host copy engine and its
  // up link (W = 1e9 B/s, the bottleneck). One engine: the swap-out (first in line) runs alone,
  // [0, B/W) = [0, 1 ms), then the send [1 ms, 2 ms). Two engines: both run at once at W/2 and end at 2 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int out = b.add(0, Stream::SwapOut, OpKind::Y, B);
  const auto [s, rv] = b.p2p(0, 1, B);
  auto m = one_switch(2, 4e9, 1e9);
  const auto one = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(one.timeline.begin_ps[z(out)] == 0);
  CHECK(one.timeline.end_ps[z(out)] == 1 * kMs);
  CHECK(one.timeline.begin_ps[z(s)] == 1 * kMs);
  CHECK(one.timeline.begin_ps[z(rv)] == 1 * kMs);
  CHECK(one.timeline.end_ps[z(s)] == 2 * kMs);
  CHECK(one.ready_ps[z(s)] == 0);
  m.topology.gpus[0].copy_engines_d2h = 2;
  const auto two = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(two.timeline.begin_ps[z(s)] == 0);
  CHECK(two.timeline.end_ps[z(out)] == 2 * kMs);
  CHECK(two.timeline.end_ps[z(s)] == 2 * kMs);
  // native durations: end - ready per op, and run_timeline reproduces the native end times
  const auto d = sim::native_durations(b.p, sim::run_native(b.p, tiny_model(), one_switch(2, 4e9, 1e9), quiet()));
  CHECK(d[z(s)] == 2 * kMs);  // waited 1 ms for the engine, moved for 1 ms
  const auto t = sim::run_timeline(b.p, d);
  CHECK(t.end_ps == one.timeline.end_ps);
}

TEST_CASE("the native bound schedules each shared link's work from its releases (Jackson), not just its sum") {
  // GPUs 0 and 1 each run a FWD of layers 0-1 (2 x 1 ms), then swap in B bytes over the shared uplink (W = 1e9 B/s:
  // B/W = 1 ms alone). Both swaps are ready at 2 ms and share the uplink at W/2: both end at 2 + 2B/W = 4 ms.
  // The chain prices each swap alone: 2 + 1 = 3 ms; the uplink's work alone is 2B/W = 2 ms. Released at 2 ms,
  // the uplink's two 1 ms jobs end no earlier than 2 + 2 = 4 ms in any schedule: the bound is the run's time.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int f0 = b.add(0, Stream::Compute, OpKind::FWD);
  const int f1 = b.add(1, Stream::Compute, OpKind::FWD);
  for (auto& op : b.p.ops) op.layers = {0, 1};
  const int x0 = b.add(0, Stream::SwapIn, OpKind::WB, B, {f0});
  const int x1 = b.add(1, Stream::SwapIn, OpKind::WB, B, {f1});
  b.p.devices = {0, 1};  // the GPUs whose ends the iteration (and so the bound) counts
  const auto m = one_switch(2, 1e9, 4e9);
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(r.timeline.end_ps[z(x0)] == 4 * kMs);
  CHECK(r.timeline.end_ps[z(x1)] == 4 * kMs);
  const TimePs bound = sim::native_lower_bound_ps(b.p, tiny_model(), m, quiet());
  CHECK(bound <= 4 * kMs);
  CHECK(bound > 4 * kMs - 1000);  // the bound's relative margin (1e-9) only
  // a cutoff between the chain's 3 ms and the run's 4 ms: declined before it runs
  CHECK_FALSE(sim::run_native_within(b.p, tiny_model(), m, quiet(), 3 * kMs + kMs / 2).has_value());
  // without contention each swap gets the whole uplink: 3 ms, and the bound is the chain's
  auto alone = quiet();
  alone.contention = false;
  CHECK(sim::run_native(b.p, tiny_model(), m, alone).timeline.end_ps[z(x0)] == 3 * kMs);
  CHECK(sim::native_lower_bound_ps(b.p, tiny_model(), m, alone) > 3 * kMs - 1000);
  CHECK(sim::native_lower_bound_ps(b.p, tiny_model(), m, alone) <= 3 * kMs);
}

TEST_CASE("a bounded run stops when a link owes more work than the cutoff leaves (contention seen as it happens)") {
  // Both GPUs swap in B at t = 0 over the shared uplink (W = 1e9 B/s down and up, GPU links 4e9), then swap out 2B
  // over the uplink's up direction. The swap-ins share the down direction: both end at 2B/W = 2 ms; the swap-outs
  // then share the up direction: 2 + 4B/W = 6 ms. The bound cannot see that the swap-ins end late together: it
  // lets one end at 1 ms, so the up direction's jobs are released at 1 ms and it is 1 + 4 = 5 ms. With a cutoff at
  // 5.5 ms the run starts, and at 2 ms the up direction still owes 4 ms of work: 2 + 4 > 5.5, stopped there (the
  // swap-outs' tails, 2 ms each from 2 ms, do not see it). At its own time (6 ms) it runs to the end.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int a0 = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const int a1 = b.add(1, Stream::SwapIn, OpKind::WB, B);
  const int b0 = b.add(0, Stream::SwapOut, OpKind::dWB, 2 * B, {a0});
  const int b1 = b.add(1, Stream::SwapOut, OpKind::dWB, 2 * B, {a1});
  b.p.devices = {0, 1};
  const auto m = one_switch(2, 1e9, 4e9);
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(r.timeline.end_ps[z(a0)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(b0)] == 6 * kMs);
  CHECK(r.timeline.end_ps[z(b1)] == 6 * kMs);
  const TimePs bound = sim::native_lower_bound_ps(b.p, tiny_model(), m, quiet());
  CHECK(bound <= 5 * kMs);
  CHECK(bound > 5 * kMs - 1000);
  CHECK_FALSE(sim::run_native_within(b.p, tiny_model(), m, quiet(), 5 * kMs + kMs / 2).has_value());
  const auto own = sim::run_native_within(b.p, tiny_model(), m, quiet(), 6 * kMs);
  REQUIRE(own.has_value());
  CHECK(own->timeline.end_ps == r.timeline.end_ps);
}

TEST_CASE("replicas' updates of one range step one host master once: the lowest device's (core::update_owners)") {
  // Harmony-DP's and dp-swap's replicas each have an Update of the same all-reduced layers; harmony-run's executor
  // runs AdamW for the lowest device's alone (the masters are one host copy). Four such Updates of layers 0-1
  // (0.5 s of the whole machine): the owner alone on every core, 0.5 s; the others run nothing and end at once.
  // Before session 23 the native model shared the cores among all four: 2 s each, four times the executor's work.
  // The reference settings keep the paper's rule: every replica's update at its profiled time, 0.5 s each.
  Builder b(4);
  std::vector<int> ups;
  for (int g = 3; g >= 0; --g) {  // the owner (device 0) last in op order
    ups.push_back(b.add(g, Stream::Cpu, OpKind::Update));
    b.p.ops[z(ups.back())].layers = {0, 1};
  }
  auto m = one_switch(4, 1e9, 1e9);
  m.topology.cpu_cores = 8;
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  for (int u : ups) {
    CAPTURE(u);
    CHECK(r.timeline.end_ps[z(u)] == (b.p.ops[z(u)].device == 0 ? 500 * kMs : 0));
  }
  CHECK(*std::max_element(r.timeline.end_ps.begin(), r.timeline.end_ps.end()) == 500 * kMs);
  // the search's bounds agree: neither counts the idle replicas' work
  CHECK(sim::native_lower_bound_ps(b.p, tiny_model(), m, quiet()) <= 500 * kMs);
  CHECK(sim::run_native_within(b.p, tiny_model(), m, quiet(), 500 * kMs).has_value());
  auto ref = quiet();
  ref.reference_bandwidths = true;
  const auto paper = sim::run_native(b.p, tiny_model(), m, ref);
  for (int u : ups) CHECK(paper.timeline.end_ps[z(u)] == 500 * kMs);
}

TEST_CASE("CPU updates share the whole machine: cpu_adam is every core's rate (processor sharing)") {
  // Four updates (one per GPU process, each of its own 2 layers) x 0.25 s = 0.5 s of the whole machine (C cores:
  // 0.5 C core-seconds), all ready at t = 0. They share the C cores: C/4 each, ending at 0.5 C / (C/4) = 2 s for
  // any C (the old model capped each at one core and let 8 cores run all four at once in 0.5 s: four
  // machines' worth). A second update in the same process waits for the first (stream FIFO), then runs
  // alone on every core: 0.5 s, 2 s to 2.5 s.
  Builder b(4);
  std::vector<int> ups;
  for (int g = 0; g < 4; ++g) {
    ups.push_back(b.add(g, Stream::Cpu, OpKind::Update));
    b.p.ops[z(ups.back())].layers = {2 * g, 2 * g + 1};
  }
  const int later = b.add(0, Stream::Cpu, OpKind::Update);
  b.p.ops[z(later)].layers = {8, 9};
  auto m = one_switch(4, 1e9, 1e9);
  for (int cores : {2, 8}) {
    CAPTURE(cores);
    m.topology.cpu_cores = cores;
    const auto r = sim::run_native(b.p, tiny_model(10), m, quiet());
    for (int u : ups) CHECK(r.timeline.end_ps[z(u)] == 2000 * kMs);
    CHECK(r.timeline.begin_ps[z(later)] == 2000 * kMs);
    CHECK(r.timeline.end_ps[z(later)] == 2500 * kMs);
  }
  // three updates: 1/3 of the machine each, 0.5 / (1/3) = 1.5 s (within a picosecond of rounding)
  Builder c(3);
  for (int g = 0; g < 3; ++g) c.add(g, Stream::Cpu, OpKind::Update);
  for (int g = 0; g < 3; ++g) c.p.ops[z(g)].layers = {2 * g, 2 * g + 1};
  m.topology.cpu_cores = 2;
  const auto r3 = sim::run_native(c.p, tiny_model(6), m, quiet());
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::llabs(r3.timeline.end_ps[i] - 1500 * kMs) <= 1);
  // one update alone takes its time on any number of cores
  Builder one(1);
  one.add(0, Stream::Cpu, OpKind::Update);
  one.p.ops[0].layers = {0, 1};
  m.topology.cpu_cores = 36;
  CHECK(sim::run_native(one.p, tiny_model(), m, quiet()).timeline.end_ps[0] == 500 * kMs);
}

TEST_CASE("compute and DEL durations: the profile, and the free time") {
  // FWD of layers 0-1 at u = 1: 2 x 1 ms; BWD: sum(bwd) - sum(fwd) = 6 - 2 = 4 ms; DEL: free_time_s.
  Builder b(1);
  const int f = b.add(0, Stream::Compute, OpKind::FWD);
  const int w = b.add(0, Stream::Compute, OpKind::BWD);
  const int d = b.add(0, Stream::Compute, OpKind::DEL);
  for (auto& op : b.p.ops) op.layers = {0, 1};
  auto m = one_switch(1, 1e9, 1e9);
  m.topology.free_time_s = 0.005;
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(r.timeline.end_ps[z(f)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(w)] == 6 * kMs);
  CHECK(r.timeline.end_ps[z(d)] == 11 * kMs);
  auto ref = quiet();
  ref.reference_bandwidths = true;  // DEL takes machine.time_del_s (40 ms)
  CHECK(sim::run_native(b.p, tiny_model(), m, ref).timeline.end_ps[z(d)] == 46 * kMs);
}

TEST_CASE("shared compute: two logical devices on one unit take 2x (processor sharing)") {
  // Each device runs a FWD of layers 0-1: 2 ms alone. On a pool of units = 1 with units_per_op = 1, both
  // run at once at 1/2 unit each: 2 x 1 unit-ms / (1/2 unit) = 4 ms, ending together. On units = 2 each
  // gets a whole unit: 2 ms, today's behaviour. A third op queued behind device 0's FWD then runs alone.
  Builder b(2);
  const int f0 = b.add(0, Stream::Compute, OpKind::FWD);
  const int f1 = b.add(1, Stream::Compute, OpKind::FWD);
  const int g0 = b.add(0, Stream::Compute, OpKind::FWD);
  for (auto& op : b.p.ops) op.layers = {0, 1};
  auto m = one_switch(2, 1e9, 1e9);
  const auto alone = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(alone.timeline.end_ps[z(f0)] == 2 * kMs);
  CHECK(alone.timeline.end_ps[z(f1)] == 2 * kMs);
  CHECK(alone.timeline.end_ps[z(g0)] == 4 * kMs);
  m.compute.units = 1;
  const auto shared = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(shared.timeline.end_ps[z(f0)] == 4 * kMs);
  CHECK(shared.timeline.end_ps[z(f1)] == 4 * kMs);
  CHECK(shared.timeline.end_ps[z(g0)] == 6 * kMs);  // alone on the unit: 2 ms after 4 ms
  CHECK(shared.graph.links.back().kind == sim::LinkKind::ComputeUnits);
  m.compute.units = 2;
  const auto two = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(two.timeline.end_ps == alone.timeline.end_ps);
  // time_scale multiplies the profile: 1.5 x 2 ms = 3 ms per FWD; three ops on a pool of 2 units whose ops
  // use 2 units each: f0 and f1 at 1 unit each, 2 x 3 unit-ms / 1 unit = 6 ms; then g0 alone at 2 units: 3 ms
  m.compute.units_per_op = 2;
  m.compute.time_scale = 1.5;
  const auto wide = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(wide.timeline.end_ps[z(f0)] == 6 * kMs);
  CHECK(wide.timeline.end_ps[z(g0)] == 9 * kMs);
  // the reference settings ignore the native model's compute keys: the profile's 2 ms, each device alone
  auto ref = quiet();
  ref.reference_bandwidths = true;
  CHECK(sim::run_native(b.p, tiny_model(), m, ref).timeline.end_ps == alone.timeline.end_ps);
}

TEST_CASE("host cores: copies, updates and dispatch share the compute pool (the CPU device)") {
  // Two devices on a pool of 2 units that are the host's cores. FWD on each device (layers 0-1: 2 unit-ms) and
  // a swap-in of 1e6 B on device 0 at 1e9 B/s (a thread copying: 1 unit-ms), all ready at t = 0. Three threads
  // on two cores: 2/3 unit each; the copy ends at 1.5 ms, both FWDs have 1 unit-ms left and then run at one
  // unit each: 2.5 ms. Without host_cores the copy runs on its link beside the pool: 1 ms, FWDs 2 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int f0 = b.add(0, Stream::Compute, OpKind::FWD);
  const int f1 = b.add(1, Stream::Compute, OpKind::FWD);
  b.p.ops[z(f0)].layers = b.p.ops[z(f1)].layers = {0, 1};
  const int in = b.add(0, Stream::SwapIn, OpKind::WB, B);
  auto m = one_switch(2, 1e9, 1e9);
  m.compute.units = 2;
  const auto beside = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(beside.timeline.end_ps[z(in)] == 1 * kMs);
  CHECK(beside.timeline.end_ps[z(f0)] == 2 * kMs);
  m.compute.host_cores = true;
  const auto host = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(std::llabs(host.timeline.end_ps[z(in)] - 1500 * kMs / 1000) <= 1);
  CHECK(std::llabs(host.timeline.end_ps[z(f0)] - 2500 * kMs / 1000) <= 1);
  CHECK(std::llabs(host.timeline.end_ps[z(f1)] - 2500 * kMs / 1000) <= 1);
  // the copy still counts its bytes in the ledger and on no PCIe link (the threads have none between them)
  CHECK(host.class_bytes[static_cast<int>(sim::TransferClass::PcieH2D)] == B);

  // An update (2 layers x 0.25 s: 0.5 s of every core, 1 unit-s, at most 2 units) beside device 1's FWD: max-min
  // fair, one unit each until the FWD ends at 2 ms, then both units: 2 ms + (1 - 0.002) / 2 s = 501 ms.
  Builder u(2);
  const int up = u.add(0, Stream::Cpu, OpKind::Update);
  u.p.ops[z(up)].layers = {0, 1};
  const int g1 = u.add(1, Stream::Compute, OpKind::FWD);
  u.p.ops[z(g1)].layers = {0, 1};
  const auto ru = sim::run_native(u.p, tiny_model(), m, quiet());
  CHECK(ru.timeline.end_ps[z(g1)] == 2 * kMs);
  CHECK(std::llabs(ru.timeline.end_ps[z(up)] - 501 * kMs) <= 1);

  // Dispatch is a thread's work on the pool, not a private delay: 1 ms per compute op, one unit, two devices'
  // FWDs. Host cores: both dispatches share the unit (2 ms), then both FWDs (4 ms): 6 ms. Without: the
  // dispatch is a delay of 1 ms each, then the FWDs share the unit: 1 + 4 = 5 ms.
  Builder d(2);
  const int d0 = d.add(0, Stream::Compute, OpKind::FWD);
  const int d1 = d.add(1, Stream::Compute, OpKind::FWD);
  d.p.ops[z(d0)].layers = d.p.ops[z(d1)].layers = {0, 1};
  auto one = one_switch(2, 1e9, 1e9);
  one.compute.units = 1;
  one.dispatch.compute_s = 1e-3;
  CHECK(sim::run_native(d.p, tiny_model(), one, quiet()).timeline.end_ps[z(d1)] == 5 * kMs);
  one.compute.host_cores = true;
  const auto rd = sim::run_native(d.p, tiny_model(), one, quiet());
  CHECK(std::llabs(rd.timeline.end_ps[z(d0)] - 6 * kMs) <= 1);
  CHECK(std::llabs(rd.timeline.end_ps[z(d1)] - 6 * kMs) <= 1);
  // A drive's read before a swap-in is the drive's DMA, not a thread: it keeps its bandwidth (1e6 B at 1e9 B/s =
  // 1 ms) beside two FWDs on a one-core pool; the copy after it is a thread sharing that core with them.
  Builder n(2);
  const int n0 = n.add(0, Stream::Compute, OpKind::FWD);
  const int n1 = n.add(1, Stream::Compute, OpKind::FWD);
  n.p.ops[z(n0)].layers = n.p.ops[z(n1)].layers = {0, 1};
  const int nin = n.add(0, Stream::SwapIn, OpKind::WB, B);
  n.p.cost.edit(nin).nvme_read_bytes = B;
  auto drives = one_switch(2, 1e9, 1e9);
  drives.topology.nvme = core::NvmeSpec{1e9, 1e9, 0, 0};
  drives.compute.units = 1;
  drives.compute.host_cores = true;
  const auto rn = sim::run_native(n.p, tiny_model(), drives, quiet());
  // 0-1 ms: the read alone on the drive, the FWDs at 1/2 unit (0.5 unit-ms done each); then three threads on one
  // unit: the copy's 1 unit-ms at 1/3 ends at 4 ms (FWDs 1.5 unit-ms done), the FWDs' last 0.5 at 1/2: 5 ms
  CHECK(std::llabs(rn.timeline.end_ps[z(nin)] - 4 * kMs) <= 1);
  CHECK(std::llabs(rn.timeline.end_ps[z(n0)] - 5 * kMs) <= 1);
  // the reference settings ignore it all
  auto ref = quiet();
  ref.reference_bandwidths = true;
  CHECK(sim::run_native(b.p, tiny_model(), m, ref).timeline.end_ps ==
        sim::run_native(b.p, tiny_model(), one_switch(2, 1e9, 1e9), ref).timeline.end_ps);
}

TEST_CASE("compute.wake: on the host's cores an op starts that long after it could, a wait that takes no core") {
  // One unit (a core), wake 1 ms. Device 0: FWD a (2 unit-ms), then FWD b after it. Device 1: FWD c (2 unit-ms), ready
  // at 0. a and c begin at 1 ms (both waits at once: a wait is no work on the pool), share the unit: end at 5 ms; b
  // begins at 6 ms and runs alone: 8 ms. Without the wake: a and c end at 4 ms, b at 6 ms.
  Builder w(2);
  const int a = w.add(0, Stream::Compute, OpKind::FWD);
  const int bq = w.add(0, Stream::Compute, OpKind::FWD);
  const int c = w.add(1, Stream::Compute, OpKind::FWD);
  for (auto& op : w.p.ops) op.layers = {0, 1};
  w.p.ops[z(bq)].deps = {a};
  auto m = one_switch(2, 1e9, 1e9);
  m.compute.units = 1;
  m.compute.host_cores = true;
  const auto plain = sim::run_native(w.p, tiny_model(), m, quiet());
  CHECK(std::llabs(plain.timeline.end_ps[z(a)] - 4 * kMs) <= 1);
  CHECK(std::llabs(plain.timeline.end_ps[z(bq)] - 6 * kMs) <= 1);
  m.compute.wake_s = 1e-3;
  const auto waited = sim::run_native(w.p, tiny_model(), m, quiet());
  CHECK(waited.timeline.begin_ps[z(a)] == 1 * kMs);  // the op begins when its thread runs it, as the trace stamps it
  CHECK(waited.timeline.begin_ps[z(c)] == 1 * kMs);
  CHECK(std::llabs(waited.timeline.end_ps[z(a)] - 5 * kMs) <= 1);
  CHECK(std::llabs(waited.timeline.end_ps[z(c)] - 5 * kMs) <= 1);
  CHECK(std::llabs(waited.timeline.begin_ps[z(bq)] - 6 * kMs) <= 1);
  CHECK(std::llabs(waited.timeline.end_ps[z(bq)] - 8 * kMs) <= 1);
  // not the host's cores (a GPU server's ops are not host threads), or the reference settings: no wait
  auto gpus = m;
  gpus.compute.host_cores = false;
  CHECK(sim::run_native(w.p, tiny_model(), gpus, quiet()).timeline.begin_ps[z(a)] == 0);
  auto ref = quiet();
  ref.reference_bandwidths = true;
  CHECK(sim::run_native(w.p, tiny_model(), m, ref).timeline.begin_ps[z(a)] == 0);
}

TEST_CASE("calibrate measures compute.wake on the host's cores: the runs' mean gap from ready to begin") {
  // Device 0: FWD a, then b after it, then c after b. Run one measures a over [0, 2) ms, b over [2.5, 4.5), c over [5,
  // 7): gaps 0.5 and 0.5 ms; run two b at 2.1 ms and c right after it: 0.1 and 0 ms. The mean of the four: 0.275 ms.
  Builder w(1);
  const int a = w.add(0, Stream::Compute, OpKind::FWD);
  const int bq = w.add(0, Stream::Compute, OpKind::FWD);
  const int c = w.add(0, Stream::Compute, OpKind::FWD);
  for (auto& op : w.p.ops) op.layers = {0, 1};
  w.p.ops[z(bq)].deps = {a};
  w.p.ops[z(c)].deps = {bq};
  auto m = one_switch(1, 1e9, 1e9);
  m.compute.units = 1;
  m.compute.host_cores = true;
  const core::Model model = tiny_model();
  sim::CalibrationRun r1{"one", &w.p, &model, m, {}, 0.0};
  r1.measured.begin_s = {0, 2.5e-3, 5e-3};
  r1.measured.dur_s = {2e-3, 2e-3, 2e-3};
  r1.measured.span_s = 7e-3;
  r1.measured_step_s = 7e-3;
  sim::CalibrationRun r2 = r1;
  r2.name = "two";
  r2.measured.begin_s = {0, 2.1e-3, 4.1e-3};
  r2.measured.span_s = 6.1e-3;
  r2.measured_step_s = 6.1e-3;
  const sim::Calibration fit = sim::calibrate({r1, r2});
  CHECK(fit.compute.host_cores);
  CHECK(fit.compute.wake_s == doctest::Approx((0.5e-3 + 0.5e-3 + 0.1e-3 + 0.0) / 4));
  // the calibrated machine file says it
  CHECK(sim::calibrated_machine_text("gpus: 1\n", fit, {}).find("wake: 275.0us") != std::string::npos);
}

TEST_CASE("calibrate's host slowdowns: each op's measured want / fair rate, time-averaged (hand-derived)") {
  // Two units. A and B compute over [0, 4) ms, C compute over [2, 4): alone-or-fitting until 2 ms (factor 1),
  // then three single-unit wants on two units, 2/3 each (factor 1.5): A and B average (2 x 1 + 2 x 1.5) / 4 =
  // 1.25, C 1.5. An update (wants both units) over [4, 6) alone: 1; beside a swap-out over [6, 8): wants 2 + 1
  // on 2 units, water-filling gives the swap its 1 and the update the other 1: update 2/1 = 2, swap 1. A DEL
  // wants nothing: 1.
  Builder b(2);
  const int a = b.add(0, Stream::Compute, OpKind::FWD);
  const int bb = b.add(1, Stream::Compute, OpKind::FWD);
  const int c = b.add(0, Stream::Compute, OpKind::BWD);
  const int u = b.add(0, Stream::Cpu, OpKind::Update);
  const int u2 = b.add(1, Stream::Cpu, OpKind::Update);
  const int y = b.add(0, Stream::SwapOut, OpKind::Y, 1000);
  const int d = b.add(0, Stream::Compute, OpKind::DEL);
  sim::MeasuredOps m;
  m.begin_s = {0, 0, 2e-3, 4e-3, 6e-3, 6e-3, 0};
  m.dur_s = {4e-3, 4e-3, 2e-3, 2e-3, 2e-3, 2e-3, 8e-3};
  const auto k = sim::host_slowdowns(b.p, m, 2.0);
  CHECK(k[z(a)] == doctest::Approx(1.25));
  CHECK(k[z(bb)] == doctest::Approx(1.25));
  CHECK(k[z(c)] == doctest::Approx(1.5));
  CHECK(k[z(u)] == doctest::Approx(1.0));
  CHECK(k[z(u2)] == doctest::Approx(2.0));
  CHECK(k[z(y)] == doctest::Approx(1.0));
  CHECK(k[z(d)] == 1.0);
  // one unit: A, B at 1/2 until 2 ms, then A, B, C at 1/3: A (2 x 2 + 2 x 3) / 4 = 2.5, C 3
  const auto one = sim::host_slowdowns(b.p, m, 1.0);
  CHECK(one[z(a)] == doctest::Approx(2.5));
  CHECK(one[z(c)] == doctest::Approx(3.0));
}

TEST_CASE("serial: one op (a P2P pair: one transfer) at a time, as harmony-run's serial executor") {
  // Two devices' FWDs (2 ms each) and a P2P copy of 1e6 B at 1e9 B/s (1 ms) from device 0 after its FWD. Concurrent:
  // the FWDs overlap, the copy follows device 0's: 3 ms. Serial: FWD, FWD, copy in the order they became ready:
  // 2 + 2 + 1 = 5 ms, nothing overlapping.
  Builder b(2);
  const int f0 = b.add(0, Stream::Compute, OpKind::FWD);
  const int f1 = b.add(1, Stream::Compute, OpKind::FWD);
  b.p.ops[z(f0)].layers = b.p.ops[z(f1)].layers = {0, 1};
  const auto [s, rv] = b.p2p(0, 1, 1'000'000);
  b.p.ops[z(s)].deps = {f0};
  const auto m = one_switch(2, 1e9, 1e9);
  const auto together = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(together.timeline.end_ps[z(f1)] == 2 * kMs);
  CHECK(together.timeline.end_ps[z(rv)] == 3 * kMs);
  auto o = quiet();
  o.serial = true;
  const auto one = sim::run_native(b.p, tiny_model(), m, o);
  CHECK(one.timeline.begin_ps[z(f1)] == 2 * kMs);
  CHECK(one.timeline.begin_ps[z(s)] == 4 * kMs);
  CHECK(one.timeline.begin_ps[z(rv)] == 4 * kMs);
  CHECK(one.timeline.end_ps[z(rv)] == 5 * kMs);
  CHECK(!one.timeline.deadlock);
}

TEST_CASE("dispatch overheads: x per op on the critical path, by class") {
  // Device 0: FWD (2 ms), a swap-out of 1e6 B at 1e9 B/s (1 ms), an update (0.5 s); a P2P send of 1e6 B to
  // device 1 after the swap-out. Overheads: compute 100 us, copy 10 us, p2p 20 us, update 1 ms, each paid
  // once per op before its work: FWD ends at 2.1 ms, the swap-out (after it) at 2.1 + 0.01 + 1 = 3.11 ms,
  // the send at 3.11 + 0.02 + 1 = 4.13 ms, the update (ready at t = 0) at 1 + 500 = 501 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int f = b.add(0, Stream::Compute, OpKind::FWD);
  b.p.ops[z(f)].layers = {0, 1};
  const int out = b.add(0, Stream::SwapOut, OpKind::Y, B, {f});
  const auto [s, rv] = b.p2p(0, 1, B);
  b.p.ops[z(s)].deps = {out};
  const int up = b.add(0, Stream::Cpu, OpKind::Update);
  b.p.ops[z(up)].layers = {0, 1};
  auto m = one_switch(2, 4e9, 1e9);
  const auto base = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(base.timeline.end_ps[z(f)] == 2 * kMs);
  CHECK(base.timeline.end_ps[z(out)] == 3 * kMs);
  CHECK(base.timeline.end_ps[z(s)] == 4 * kMs);
  CHECK(base.timeline.end_ps[z(up)] == 500 * kMs);
  m.dispatch = {100e-6, 10e-6, 20e-6, 1e-3};
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(r.timeline.end_ps[z(f)] == 2 * kMs + 100'000'000);
  CHECK(r.timeline.end_ps[z(out)] == 3 * kMs + 110'000'000);
  CHECK(r.timeline.end_ps[z(s)] == 4 * kMs + 130'000'000);
  CHECK(r.timeline.end_ps[z(rv)] == r.timeline.end_ps[z(s)]);
  CHECK(r.timeline.end_ps[z(up)] == 501 * kMs);
  // a chain of n compute ops on one device: n x (t + x)
  Builder c(1);
  for (int i = 0; i < 5; ++i) c.add(0, Stream::Compute, OpKind::FWD);
  for (auto& op : c.p.ops) op.layers = {0, 0};
  auto m1 = one_switch(1, 1e9, 1e9);
  m1.dispatch.compute_s = 250e-6;
  CHECK(sim::run_native(c.p, tiny_model(), m1, quiet()).timeline.end_ps[4] == 5 * (kMs + 250'000'000));
}

TEST_CASE("compute and dispatch keys in a machine file: read with units, range-checked, located") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("harmony-native-keys-{}", ::getpid())).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  const auto ok = core::load_machine_file(
      write("ok.yaml",
            "gpus: 4\ngpu_memory: 1MiB\ncompute: {units: 2, units_per_op: 1, time_scale: 1.25, "
            "update_time_scale: 0.5}\ndispatch: {compute: 40us, copy: 20us, p2p: 0.03ms, update: 1ms}\n"));
  CHECK(ok.compute.units == 2);
  CHECK(ok.compute.time_scale == 1.25);
  CHECK(ok.compute.update_time_scale == 0.5);
  CHECK(ok.dispatch.compute_s == doctest::Approx(40e-6));
  CHECK(ok.dispatch.p2p_s == doctest::Approx(30e-6));
  CHECK(ok.dispatch.update_s == doctest::Approx(1e-3));
  const auto dflt = core::load_machine_file(write("plain.yaml", "gpus: 2\ngpu_memory: 1MiB\n"));
  CHECK(!dflt.compute.shared());
  CHECK(dflt.dispatch.compute_s == 0);
  auto error = [&](const std::string& name, const std::string& text) {
    try {
      core::load_machine_file(write(name, text));
    } catch (const core::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error("a.yaml", "gpus: 2\ngpu_memory: 1MiB\ndispatch: {compute: 40}\n").find("a.yaml:3:") != std::string::npos);
  CHECK(error("b.yaml", "gpus: 2\ngpu_memory: 1MiB\ndispatch: {compute: 2s}\n").find("too long") != std::string::npos);
  CHECK(error("c.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {units: -1}\n").find("c.yaml:3:") != std::string::npos);
  CHECK(error("d.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {units: 1, units_per_op: 2}\n").find("units_per_op") !=
        std::string::npos);
  CHECK(error("e.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {threads: 1}\n").find("threads") != std::string::npos);
  CHECK(error("f.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {time_scale: 0}\n").find("out of range") !=
        std::string::npos);
  // host_cores: a boolean, and only with the cores' number
  CHECK(!ok.compute.host_cores);
  CHECK(core::load_machine_file(write("h.yaml", "gpus: 4\ngpu_memory: 1MiB\ncompute: {units: 2, host_cores: true}\n"))
            .compute.host_cores);
  const std::string no_units = error("g.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {host_cores: true}\n");
  CHECK(no_units.find("g.yaml:3:") != std::string::npos);
  CHECK(no_units.find("units") != std::string::npos);
  CHECK(error("i.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {units: 2, host_cores: 2}\n").find("true or false") !=
        std::string::npos);
  // wake: a duration, only with host_cores, at most 1 s
  CHECK(core::load_machine_file(write("w.yaml",
                                      "gpus: 4\ngpu_memory: 1MiB\ncompute: {units: 2, host_cores: true, wake: "
                                      "300us}\n"))
            .compute.wake_s == doctest::Approx(300e-6));
  const std::string no_host = error("x.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {units: 2, wake: 300us}\n");
  CHECK(no_host.find("x.yaml:3:") != std::string::npos);
  CHECK(no_host.find("host_cores") != std::string::npos);
  CHECK(error("y.yaml", "gpus: 2\ngpu_memory: 1MiB\ncompute: {units: 2, host_cores: true, wake: 2s}\n")
            .find("too long") != std::string::npos);
  std::filesystem::remove_all(dir, ec);
}

TEST_CASE("a measured profile whose backward is timed below its forward gives a BWD of 0, not a hang") {
  // Measurement noise (harmony-run profile on a loaded CPU) can make bwd < fwd; the BWD used to get a negative
  // duration, an event in the past, and the event loop spun forever.
  Builder b(1);
  const int f = b.add(0, Stream::Compute, OpKind::FWD);
  const int w = b.add(0, Stream::Compute, OpKind::BWD);
  for (auto& op : b.p.ops) op.layers = {0, 1};
  core::Model m = tiny_model();
  for (auto& l : m.layers)
    for (auto& t : l.bwd_time_s) t = 0.0001;  // below the 1 ms forward
  const auto r = sim::run_native(b.p, m, one_switch(1, 1e9, 1e9), quiet());
  CHECK(r.timeline.end_ps[z(f)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(w)] == 2 * kMs);
}

TEST_CASE("a P2P send and its receive start together, when both are ready, as one flow") {
  // The receive on GPU1 depends on a 2 ms FWD on GPU1; the send is ready at 0. The pair begins at 2 ms and moves B at
  // the GPU link's W = 1e9 B/s: ends at 3 ms.
  const Bytes B = 1'000'000;
  Builder b(2);
  const int f = b.add(1, Stream::Compute, OpKind::FWD);
  b.p.ops[z(f)].layers = {0, 1};
  const auto [s, rv] = b.p2p(0, 1, B);
  b.p.ops[z(rv)].deps = {f};
  const auto r = sim::run_native(b.p, tiny_model(), one_switch(2, 4e9, 1e9), quiet());
  CHECK(r.ready_ps[z(s)] == 0);
  CHECK(r.timeline.begin_ps[z(s)] == 2 * kMs);
  CHECK(r.timeline.begin_ps[z(rv)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(s)] == 3 * kMs);
  CHECK(r.timeline.end_ps[z(rv)] == 3 * kMs);
  // counted once in the ledger
  CHECK(r.class_bytes[static_cast<int>(sim::TransferClass::P2PPcie)] == B);
  CHECK(r.tensor_bytes[static_cast<int>(core::TensorKind::Activation)] == B);
}

TEST_CASE("P2P paths: NVLink first, then the PCIe tree (switches, sockets), else staged through the host") {
  core::MachineSpec m = paper_1080ti_like();
  m.topology.nvlinks = {{0, 1, 20e9}};
  const auto g = sim::build_link_graph(m);
  sim::TransferClass cls = sim::TransferClass::None;
  CHECK(g.p2p_path(0, 1, &cls) == std::vector<int>{g.nvlink.at({0, 1})});
  CHECK(cls == sim::TransferClass::NvLink);
  CHECK(g.p2p_path(1, 0, &cls) == std::vector<int>{g.nvlink.at({1, 0})});         // both directions
  CHECK(g.p2p_path(2, 3, &cls) == std::vector<int>{g.gpu_up[2], g.gpu_down[3]});  // same switch
  CHECK(cls == sim::TransferClass::P2PPcie);
  CHECK(g.p2p_path(1, 2, &cls) == std::vector<int>{g.gpu_up[1], g.switch_up[0], g.switch_down[1], g.gpu_down[2]});
  CHECK(g.p2p_path(2, 5, &cls) ==
        std::vector<int>{g.gpu_up[2], g.switch_up[1], g.inter_socket[0 * 2 + 1], g.switch_down[2], g.gpu_down[5]});
  m.topology.p2p = core::P2PMode::Host;
  const auto h = sim::build_link_graph(m);
  CHECK(h.p2p_path(2, 3, &cls) ==
        std::vector<int>{h.gpu_up[2], h.switch_up[1], h.host_memcpy, h.switch_down[1], h.gpu_down[3]});
  CHECK(cls == sim::TransferClass::HostStaging);
  CHECK(h.p2p_path(2, 5, &cls) == std::vector<int>{h.gpu_up[2], h.switch_up[1], h.host_memcpy,
                                                   h.inter_socket[0 * 2 + 1], h.switch_down[2], h.gpu_down[5]});
  CHECK(h.h2d_path(5) == std::vector<int>{h.switch_down[2], h.gpu_down[5]});
  CHECK(h.d2h_path(5) == std::vector<int>{h.gpu_up[5], h.switch_up[2]});
}

TEST_CASE("memory overflow is detected at the op that overflows, with the excess") {
  // Capacity 1000 bytes on GPU0, compute ops in a row (1 or 2 ms each):
  //   a: alloc 600                 -> 600
  //   c: alloc 300, frees 600      -> 900 while running, 300 after
  //   d: alloc 500 + workspace 300 -> 1100 > 1000: overflow by 100 here
  //   e: alloc 2000                -> overflows too, but d was first
  Builder b(1);
  const int a = b.add(0, Stream::Compute, OpKind::FWD);
  const int c = b.add(0, Stream::Compute, OpKind::FWD);
  const int d = b.add(0, Stream::Compute, OpKind::FWD);
  const int e = b.add(0, Stream::Compute, OpKind::FWD);
  auto T = [](Bytes bytes) { return core::TensorRef{core::TensorKind::Activation, {0, 0}, 0, bytes}; };
  b.p.ops[z(a)].allocs = {T(600)};
  b.p.ops[z(c)].allocs = {T(300)};
  b.p.ops[z(c)].frees = {T(600)};
  b.p.ops[z(d)].allocs = {T(500)};
  b.p.ops[z(d)].workspace_bytes = 300;
  b.p.ops[z(e)].allocs = {T(2000)};
  auto m = one_switch(1, 1e9, 1e9);
  m.gpu_memory_bytes = 1000;
  const auto r = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK_FALSE(r.feasible);
  CHECK(r.overflow.op == d);
  CHECK(r.overflow.device == 0);
  CHECK(r.overflow.bytes_over == 100);
  CHECK(r.overflow.time_ps == 2 * kMs);
  CHECK(r.overflow_count == 2);
  CHECK(r.peak_bytes[0] == 800 + 2000);  // after d: 800 (its workspace freed), then e
  CHECK(r.memory_anomalies == 0);
  CHECK(r.infeasible_reason.find(b.p.op_id(d)) != std::string::npos);
  CHECK(r.infeasible_reason.find("by 100 bytes") != std::string::npos);
  const auto rep = sim::native_report(b.p, r);
  CHECK(rep.memory_overflow.gpu == 0);
  CHECK(rep.memory_overflow.op_id == b.p.op_id(d));
  CHECK(rep.memory_overflow.bytes_over == 100);
  CHECK_FALSE(rep.feasible);
  // capacities off: tracked, not checked
  auto o = quiet();
  o.capacities = false;
  const auto off = sim::run_native(b.p, tiny_model(), m, o);
  CHECK(off.feasible);
  CHECK(off.overflow.op < 0);
  CHECK(off.peak_bytes[0] == 2800);
  // a free larger than what is in use is clamped at 0 and counted
  b.p.ops[z(e)].frees = {T(1'000'000)};
  const auto clamp = sim::run_native(b.p, tiny_model(), m, o);
  CHECK(clamp.memory_anomalies == 1);
}

TEST_CASE("host memory: the account and infeasibility") {
  // Model: W = 2 x 1000, B = 2 x 10, optimizer state 2 x 2000. Program: a stash out of 100 bytes and a
  // swap-in of 300. Account: master 2020 + optimizer 4000 + gradients 2000 + stash 100 = 8120 bytes; swaps
  // copy straight from and into the pinned tensors, so no staging buffer. Pinned: 8120 - 4000 = 4120.
  Builder b(1);
  b.add(0, Stream::SwapIn, OpKind::WB, 300);
  b.add(0, Stream::SwapOut, OpKind::sX, 100);
  auto m = one_switch(1, 1e9, 1e9);
  const auto fits = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(fits.host.master_weights_bytes == 2020);
  CHECK(fits.host.optimizer_state_bytes == 4000);
  CHECK(fits.host.gradient_bytes == 2000);
  CHECK(fits.host.stash_bytes == 100);
  CHECK(fits.host.staging_bytes == 0);
  CHECK(fits.host.total_bytes() == 8120);
  CHECK(fits.feasible);
  m.topology.host_memory_bytes = 8119;
  const auto tight = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK_FALSE(tight.feasible);
  CHECK(tight.infeasible_reason.find("host memory exceeded") != std::string::npos);
  CHECK(tight.infeasible_reason.find("by 1 bytes") != std::string::npos);
  m.topology.host_memory_bytes = 0;
  m.topology.pinned_limit_bytes = 4120;
  CHECK(sim::run_native(b.p, tiny_model(), m, quiet()).feasible);
  m.topology.pinned_limit_bytes = 4119;
  const auto pinned = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK_FALSE(pinned.feasible);
  CHECK(pinned.infeasible_reason.find("pinned host memory exceeded") != std::string::npos);
  CHECK(pinned.infeasible_reason.find("by 1 bytes") != std::string::npos);
  auto o = quiet();
  o.capacities = false;
  CHECK(sim::run_native(b.p, tiny_model(), m, o).feasible);
}

TEST_CASE("host memory: the floor every plan needs, and the engine's verdict on it") {
  // tiny_model: master 2 x 1010 + optimizer 2 x 2000 + gradients 2 x 1000 = 8020 bytes whatever the plan (the
  // account of the test above adds its 100-byte stash: 8120); page-locked 8020 - 4000 = 4020. With the masters and
  // optimizer state on the drives the host keeps the gradients alone.
  const core::PlanKind pp = core::plan_kind("harmony-pp");
  const auto floor = sim::host_floor(tiny_model(), pp, false);
  CHECK(floor.total_bytes() == 8020);
  CHECK(floor.pinned_bytes() == 4020);
  const auto nvme = sim::host_floor(tiny_model(), pp, true);
  CHECK(nvme.total_bytes() == 2000);
  CHECK(nvme.nvme_bytes == 6020);
  auto m = one_switch(1, 1e9, 1e9);
  m.topology.host_memory_bytes = 8020;
  CHECK_FALSE(sim::NativeEngine(tiny_model(), m).host_floor_exceeded(pp, false));
  m.topology.host_memory_bytes = 8019;
  CHECK(sim::NativeEngine(tiny_model(), m).host_floor_exceeded(pp, false));
  CHECK_FALSE(sim::NativeEngine(tiny_model(), m).host_floor_exceeded(pp, true));
  sim::NativeOptions off;
  off.capacities = false;
  CHECK_FALSE(sim::NativeEngine(tiny_model(), m, off).host_floor_exceeded(pp, false));
  m.topology.host_memory_bytes = 0;
  m.topology.pinned_limit_bytes = 4019;
  CHECK(sim::NativeEngine(tiny_model(), m).host_floor_exceeded(pp, false));
  // every program's account is at least the floor: a run over it says so
  Builder b(1);
  b.add(0, Stream::SwapIn, OpKind::WB, 300);
  const auto run = sim::run_native(b.p, tiny_model(), m, quiet());
  CHECK(run.host.total_bytes() == 8020);
  CHECK_FALSE(run.feasible);
  CHECK(run.infeasible_reason.find("pinned host memory exceeded") != std::string::npos);
}

TEST_CASE("host memory: the floor is the kind's, empty for a kind with resident state") {
  // The floor of every kind that keeps its state on the host is the model's host state (8020 bytes, the test above);
  // resident keeps its weights, gradients and AdamW state on the GPUs, so it has no floor and no host memory
  // rules out all its plans, on the host or on the drives.
  for (const core::PlanKind kind : core::plan_kinds()) {
    CAPTURE(kind.name());
    for (const bool nvme : {false, true}) {
      CAPTURE(nvme);
      const auto floor = sim::host_floor(tiny_model(), kind, nvme);
      const auto state = sim::host_state(tiny_model(), nvme);
      CHECK(floor.total_bytes() == (kind->resident_state ? 0 : state.total_bytes()));
      CHECK(floor.nvme_bytes == (kind->resident_state ? 0 : state.nvme_bytes));
    }
  }
  CHECK(sim::host_floor(tiny_model(), core::plan_kind("resident"), false).total_bytes() == 0);
  CHECK(sim::host_floor(tiny_model(), core::plan_kind("harmony-pp"), false).total_bytes() == 8020);
  CHECK(sim::host_floor(tiny_model(), core::plan_kind("dp-swap"), false).total_bytes() == 8020);
  CHECK(sim::host_floor(tiny_model(), core::plan_kind("dp-swap"), true).total_bytes() == 2000);
  auto m = one_switch(1, 1e9, 1e9);
  m.topology.host_memory_bytes = 1;
  m.topology.pinned_limit_bytes = 1;
  const core::Model model = tiny_model();  // the engine keeps it by reference
  const sim::NativeEngine engine(model, m);
  CHECK_FALSE(engine.host_floor_exceeded(core::plan_kind("resident"), false));
  CHECK_FALSE(engine.host_floor_exceeded(core::plan_kind("resident"), true));
  CHECK(engine.host_floor_exceeded(core::plan_kind("harmony-pp"), false));
  CHECK(engine.host_floor_exceeded(core::plan_kind("dp-swap"), false));
  CHECK(engine.host_floor_exceeded(core::plan_kind("dp-swap"), true));
}

TEST_CASE("host memory: the account does not depend on how the swaps are split into ops, but for a bounce's size") {
  // A Harmony pack swaps its layers' weights in as one WB op and their gradients out as one dWB op; a
  // baseline swaps the same bytes layer by layer. The host keeps the same tensors either way, so the account
  // (and the verdict) must be the same. (It once charged 2 x the largest swap op per GPU and direction as
  // "staging", which made a 100B GPT's Harmony plans on 8 x H100 overflow 2 TiB of host memory while the
  // baselines, moving more bytes in smaller ops, fitted.)
  // Two replicas, their gradients all-reduced: the lowest writes the sum into the one host gradient, the other lands
  // its copy in its bounce buffer, as large as its largest dWB (a pack's, or a layer's: the one part that follows the
  // split).
  Builder pack(2);
  Builder layers(2);
  const auto on = [](Builder& b, int op, int first, int last) {
    b.p.ops[z(op)].layers = core::LayerRange{first, last};
  };
  for (int g = 0; g < 2; ++g) {
    on(pack, pack.add(g, Stream::SwapIn, OpKind::WB, 2020), 0, 1);
    on(pack, pack.add(g, Stream::Compute, OpKind::ARD), 0, 1);
    on(pack, pack.add(g, Stream::SwapOut, OpKind::dWB, 2000), 0, 1);
    for (int l = 0; l < 2; ++l) {
      on(layers, layers.add(g, Stream::SwapIn, OpKind::WB, 1010), l, l);
      on(layers, layers.add(g, Stream::Compute, OpKind::ARD), l, l);
      on(layers, layers.add(g, Stream::SwapOut, OpKind::dWB, 1000), l, l);
    }
  }
  auto m = one_switch(2, 1e9, 1e9);
  const auto a = sim::run_native(pack.p, tiny_model(), m, quiet());
  const auto c = sim::run_native(layers.p, tiny_model(), m, quiet());
  CHECK(a.host.total_bytes() - a.host.staging_bytes == c.host.total_bytes() - c.host.staging_bytes);
  CHECK(a.host.total_bytes() - a.host.staging_bytes == 2020 + 4000 + 2000);
  CHECK(a.host.staging_bytes == 2000);
  CHECK(c.host.staging_bytes == 1000);
  m.topology.host_memory_bytes = a.host.total_bytes();
  CHECK(sim::run_native(pack.p, tiny_model(), m, quiet()).feasible);
  CHECK(sim::run_native(layers.p, tiny_model(), m, quiet()).feasible);
  // GPU-to-GPU copies staged through the host (p2p: host) keep a double buffer of the largest send per GPU
  Builder staged(2);
  staged.p2p(0, 1, 300);
  staged.p2p(0, 1, 500);
  staged.p2p(1, 0, 200);
  CHECK(sim::host_account(staged.p, tiny_model(), true).staging_bytes == 2 * 500 + 2 * 200);
  CHECK(sim::host_account(staged.p, tiny_model(), false).staging_bytes == 0);
}

TEST_CASE("host memory: a dWB that adds to a host gradient lands in a bounce buffer, per GPU its largest") {
  // The first dWB of a layer's gradient copies straight into it; a later microbatch's, or another GPU's without an
  // all-reduce (l2l's parameter server), adds through a pinned buffer. An all-reduced gradient (ARD) is written by the
  // lowest replica, the other replicas' copies land in their bounce buffers, whatever the kind; the ranks of a sharded
  // one (RS) write their own shards: no bounce.
  const auto build = [](std::optional<OpKind> collective) {
    Builder b(2);
    const auto on = [&](int op, int l) { b.p.ops[z(op)].layers = core::LayerRange{l, l}; };
    on(b.add(0, Stream::SwapOut, OpKind::dWB, 100), 0);
    on(b.add(0, Stream::SwapOut, OpKind::dWB, 100), 0);  // layer 0's second microbatch on GPU 0: adds
    on(b.add(0, Stream::SwapOut, OpKind::dWB, 300), 1);  // layer 1, first: copies
    on(b.add(1, Stream::SwapOut, OpKind::dWB, 252), 1);  // layer 1 again, on GPU 1 (63 fp32 elements)
    if (collective)
      for (int g = 0; g < 2; ++g) on(b.add(g, Stream::Compute, *collective), 1);
    return b;
  };
  CHECK(sim::accumulate_bounce_bytes(build(std::nullopt).p, false) == 100 + 252);
  CHECK(sim::accumulate_bounce_bytes(build(OpKind::ARD).p, false) == 100 + 252);
  CHECK(sim::accumulate_bounce_bytes(build(OpKind::RS).p, false) == 100);
  // fp32 sums of 2-byte gradients in mixed precision; the copy lands chunk by chunk, at most chunk_bytes of the
  // gradient's whole elements (the executor's staging chunk), widened
  CHECK(sim::accumulate_bounce_bytes(build(std::nullopt).p, true) == 200 + 504);
  CHECK(sim::accumulate_bounce_bytes(build(std::nullopt).p, false, 130) == 100 + 128);
  CHECK(sim::accumulate_bounce_bytes(build(std::nullopt).p, true, 131) == 200 + 2 * 130);
  const Builder adds = build(std::nullopt);
  const auto h = sim::host_account(adds.p, tiny_model());
  CHECK(h.staging_bytes == 352);
  CHECK(h.total_bytes() == 2020 + 4000 + 2000 + 352);
}

// Issue 36: in mixed precision the account holds what harmony-run's executor holds: fp32 masters and gradients, the
// moments (the optimizer state less the fp32 masters its 12 B a parameter include), fp32 bounces, and per queue that
// moves weights or gradients two bf16 staging buffers of its largest such transfer (core::staging_ring_bytes).
TEST_CASE("host memory: mixed precision counts fp32 masters, gradients and bounces, the moments, the staging rings") {
  core::Model bf16 = tiny_model();
  bf16.dtype = "bf16";
  for (core::Layer& L : bf16.layers) {
    L.param_count = 500;  // 1000 bytes of bf16 weights
    L.optimizer_state_bytes = 12 * 500;
  }
  CHECK(sim::mixed_precision(bf16));
  CHECK_FALSE(sim::mixed_precision(tiny_model()));
  const sim::HostAccount state = sim::host_state(bf16, false);
  CHECK(state.master_weights_bytes == 2 * (2 * 1000 + 10));
  CHECK(state.gradient_bytes == 2 * 2 * 1000);
  CHECK(state.optimizer_state_bytes == 2 * 8 * 500);
  // the state's total is the one the bf16 profile's figures sum to, the pinned part the fp32 copies
  CHECK(state.total_bytes() == 2 * (1000 + 10 + 12 * 500 + 1000));
  CHECK(state.pinned_bytes() == 2 * (2 * 1000 + 10 + 2 * 1000));
  // offload: nvme: the masters, the moments and the FP32 gradient live on the drives (ZeRO-Infinity swaps the FP32
  // gradient out at the boundary); the host keeps the 2-byte gradient buffer. Before, the whole FP32 gradient stayed
  // in host memory, and the published LoHan 175B rows on a 768 GB host stopped fitting.
  const sim::HostAccount drives = sim::host_state(bf16, true);
  CHECK(drives.master_weights_bytes == 0);
  CHECK(drives.optimizer_state_bytes == 0);
  CHECK(drives.gradient_bytes == 2 * 1000);
  CHECK(drives.nvme_bytes == state.master_weights_bytes + state.optimizer_state_bytes + state.gradient_bytes);
  CHECK(drives.total_bytes() + drives.nvme_bytes == state.total_bytes() + 2 * 1000);  // the drives' copy and the buffer
  // the bounce buffers of the previous case (100 on GPU 0, 250 on GPU 1) in fp32, and the rings: GPU 0's swap-out
  // queue's largest dWB 300, GPU 1's 250, two buffers each
  Builder b(2);
  const auto on = [&](int op, int l) { b.p.ops[z(op)].layers = core::LayerRange{l, l}; };
  on(b.add(0, Stream::SwapOut, OpKind::dWB, 100), 0);
  on(b.add(0, Stream::SwapOut, OpKind::dWB, 100), 0);
  on(b.add(0, Stream::SwapOut, OpKind::dWB, 300), 1);
  on(b.add(1, Stream::SwapOut, OpKind::dWB, 250), 1);
  CHECK(core::staging_ring_bytes(b.p, false) == 2 * 300 + 2 * 250);
  CHECK(core::staging_ring_bytes(b.p, false, 200) == 2 * 200 + 2 * 200);  // chunked: a buffer holds one chunk
  const sim::HostAccount h = sim::host_account(b.p, bf16);
  CHECK(h.staging_bytes == 2 * 350 + 2 * 300 + 2 * 250);
  // pure 2-byte training (model.analytic.master_weights: false): no FP32 copy anywhere; the host holds the bf16
  // weights, the bf16 gradient and the two bf16 moments (4 bytes a parameter), 8 bytes a parameter where mixed
  // precision holds 4 + 4 + 8 (+ the bf16 copy the executor keeps beside)
  core::Model pure = bf16;
  pure.fp32_optimizer = false;
  for (core::Layer& L : pure.layers) L.optimizer_state_bytes = 4 * 500;
  CHECK_FALSE(sim::mixed_precision(pure));
  const sim::HostAccount pure_state = sim::host_state(pure, false);
  CHECK(pure_state.master_weights_bytes == 2 * (1000 + 10));
  CHECK(pure_state.gradient_bytes == 2 * 1000);
  CHECK(pure_state.optimizer_state_bytes == 2 * 4 * 500);
  CHECK(pure_state.total_bytes() == 2 * (1000 + 10 + 1000 + 2000));
  CHECK(h.total_bytes() == state.total_bytes() + h.staging_bytes);
  // a collective stages only when the replicas sum on the host
  on(b.add(1, Stream::Compute, OpKind::ARD, 400), 1);
  CHECK(core::staging_ring_bytes(b.p, false) == 2 * 300 + 2 * 250);
  CHECK(core::staging_ring_bytes(b.p, true) == 2 * 300 + 2 * 250 + 2 * 400);
}

TEST_CASE("a 100B GPT fits Harmony-PP on 8 x H100 (native); when the host is too small, the reason says why") {
  // The gpt-100b of configs/sweeps/gpt_1b_100b.yaml: 80 blocks of 4.69 GiB of FP32 weights; master weights,
  // gradient buffers and Adam state take 1,513 GiB of the preset's 2 TiB of host memory. Before the host
  // account stopped charging swap "staging" by the size of the largest swap op, every Harmony candidate
  // overflowed the host here while every baseline fitted (docs/native-model.md, "Memory").
  core::AnalyticSpec spec;
  spec.family = core::ModelFamily::Gpt;
  spec.name = "gpt-100b";
  spec.layers = 80;
  spec.hidden = 10240;
  spec.heads = 80;
  spec.seq_len = 2048;
  spec.vocab = 50257;
  core::MachineSpec m = core::machine_preset("h100-sxm-8x");
  const core::Model model = core::analytic_model(spec, m.gpu_rates, m.cpu_adam);
  core::SearchSpec search;
  search.packing_fwd = {"balanced_time", "reuse"};
  search.packing_bwd = {"balanced_time"};
  const auto pp =
      sim::best_plan_of_kind(core::plan_kind("harmony-pp"), model, m, 8, 32, core::CostModelKind::Native, search, {});
  CHECK(pp.feasible);
  CHECK(pp.best.host_memory.staging_bytes == 0);  // NVLink P2P, swaps straight from pinned tensors
  CHECK(pp.best.host_memory.total_bytes() < m.topology.host_memory_bytes);
  // 1.5 TiB cannot hold the 1,513 GiB of weights, gradients and optimizer state plus any stash
  m.topology.host_memory_bytes = 1536 * core::kGiB;
  m.topology.pinned_limit_bytes = 1440 * core::kGiB;
  const auto tight =
      sim::best_plan_of_kind(core::plan_kind("harmony-pp"), model, m, 8, 32, core::CostModelKind::Native, search, {});
  CHECK_FALSE(tight.feasible);
  CHECK(tight.reason.find("exceed a capacity or deadlock; first: u ") != std::string::npos);
  CHECK(tight.reason.find("host memory exceeded") != std::string::npos);
  const auto l2l =
      sim::best_plan_of_kind(core::plan_kind("l2l"), model, m, 8, 32, core::CostModelKind::Native, search, {});
  CHECK_FALSE(l2l.feasible);
  CHECK(l2l.reason.find("first: u 1: host memory exceeded") != std::string::npos);
  // 1 TiB holds not even the weights, gradients and optimizer state (host_floor): no plan of any kind can fit, so
  // only the first plan in enumeration order runs, for the reason; the rest are declined (pruned) unrun
  m.topology.host_memory_bytes = 1024 * core::kGiB;
  for (const auto kind : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp"), core::plan_kind("l2l")}) {
    CAPTURE(core::plan_kind_name(kind));
    const auto unfit = sim::best_plan_of_kind(kind, model, m, 8, 32, core::CostModelKind::Native, search, {});
    CHECK_FALSE(unfit.feasible);
    REQUIRE(unfit.candidates > 1);
    CHECK(unfit.pruned == unfit.candidates - 1);
    CHECK(unfit.reason.find("host memory exceeded") != std::string::npos);
  }
  // the baseline's reason is its first plan's, as when every plan ran
  core::SearchSpace space;
  space.kind = core::plan_kind("l2l");
  space.gpus = 8;
  space.minibatch = 32;
  space.capacity_bytes = m.search_capacity_bytes();
  const auto plans = core::enumerate_plans(model, space);
  const auto first = sim::evaluate_plan(model, m, plans.front().plan, {}, core::CostModelKind::Native).report;
  const auto l2l_unfit =
      sim::best_plan_of_kind(core::plan_kind("l2l"), model, m, 8, 32, core::CostModelKind::Native, search, {});
  CHECK(l2l_unfit.reason == fmt::format("all {} plans exceed a capacity or deadlock; first: u {}: {}",
                                        l2l_unfit.candidates, plans.front().plan.u_bwd, first.infeasible_reason));
}

TEST_CASE("a P2P op without a peer and a plan wider than the machine are errors") {
  Builder b(2);
  b.add(0, Stream::P2POut, OpKind::Y, 10);
  CHECK_THROWS_AS(sim::run_native(b.p, tiny_model(), one_switch(2, 1e9, 1e9)), core::ScheduleError);
  Builder w(3);
  w.add(2, Stream::SwapIn, OpKind::WB, 10);
  CHECK_THROWS_AS(sim::run_native(w.p, tiny_model(), one_switch(2, 1e9, 1e9)), core::ScheduleError);
}

TEST_CASE(
    "the native model reproduces the reference on all 42 bert_large oracles (contention, latency and "
    "capacities off, the paper's constants)") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  std::ifstream in(source_dir() + "/tests/data/reference/oracles_bert_large.json");
  REQUIRE(in.good());
  const auto oracles = nlohmann::json::parse(in);
  REQUIRE(oracles.size() == 42);
  const core::MachineSpec machine;  // the paper's constants
  sim::NativeOptions paper;
  paper.contention = false;
  paper.latency = false;
  paper.capacities = false;
  paper.reference_bandwidths = true;
  double worst = 0.0;
  double worst_contended = 0.0;
  double sum_contended = 0.0;
  std::string worst_name;
  for (const auto& o : oracles) {
    core::Plan plan;
    plan.kind = o["mode"] == "vPP" ? core::plan_kind("harmony-pp") : core::plan_kind("harmony-dp");
    plan.gpus = o["N"];
    plan.minibatch = o["D"];
    plan.u_fwd = o["u_fwd"];
    plan.u_bwd = o["u_bwd"];
    core::manual_packs(model.num_layers(), o["packsize"], plan.packs_fwd, plan.packs_bwd);
    CAPTURE(o.dump());
    core::LowerOptions opt;
    opt.prefetch = o["prefetch_offload"];
    const auto program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, opt);
    const double ref = o["global_endtime"].get<double>();
    const auto r = sim::simulate_native(program, model, machine, paper);
    REQUIRE_FALSE(r.deadlock);
    const double rel = std::abs(r.iteration_time_s - ref) / ref;
    CHECK(rel <= 0.05);
    worst = std::max(worst, rel);
    // per-GPU end times too
    REQUIRE(r.per_gpu.size() == o["per_rank_endtime"].size());
    for (std::size_t k = 0; k < r.per_gpu.size(); ++k)
      CHECK(r.per_gpu[k].end_time_s == doctest::Approx(o["per_rank_endtime"][k].get<double>()).epsilon(0.05));
    // the real model on the paper's testbed (every replica lowered): reported, not asserted
    opt.dp_first_gpu_only = false;
    const auto all = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, opt);
    const auto c = sim::simulate_native(all, model, paper_1080ti_like());
    REQUIRE_FALSE(c.deadlock);
    CHECK(c.memory_anomalies == 0);
    const double relc = (c.iteration_time_s - ref) / ref;
    if (std::abs(relc) > worst_contended) {
      worst_contended = std::abs(relc);
      worst_name = fmt::format("{} N{} D{} u{}/{} P{}{}", o["mode"].get<std::string>(), o["N"].get<int>(),
                               o["D"].get<int>(), o["u_fwd"].get<int>(), o["u_bwd"].get<int>(),
                               o["packsize"].get<int>(), o["prefetch_offload"].get<bool>() ? " prefetch" : "");
    }
    sum_contended += relc;
  }
  MESSAGE(fmt::format("native (paper constants, no contention) vs reference: worst relative difference {:.2e}", worst));
  MESSAGE(
      fmt::format("native (contention, paper-1080ti-like topology) vs reference: mean {:+.1f}%, worst |{:.1f}%| ({})",
                  100.0 * sum_contended / 42.0, 100.0 * worst_contended, worst_name));
  CHECK(worst < 1e-9);  // in practice it is exact up to picosecond rounding
}

TEST_CASE("a Harmony-PP bert_large plan on a paper-1080ti-like server: feasible at 10 GiB, not at 4 GiB") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  core::Plan plan;
  plan.kind = core::plan_kind("harmony-pp");
  plan.gpus = 4;
  plan.minibatch = 32;
  plan.u_fwd = 16;
  plan.u_bwd = 8;
  core::manual_packs(model.num_layers(), 7, plan.packs_fwd, plan.packs_bwd);
  core::LowerOptions lo;
  lo.prefetch = true;
  const auto program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, lo);
  sim::NativeResult res;
  const auto r = sim::simulate_native(program, model, paper_1080ti_like(10 * core::kGiB), {}, &res);
  REQUIRE_FALSE(r.deadlock);
  CHECK(r.native);
  CHECK(r.feasible);
  CHECK(r.infeasible_reason.empty());
  CHECK(r.memory_overflow.gpu == -1);
  CHECK(r.memory_anomalies == 0);
  CHECK(r.peak_memory_bytes > 4 * core::kGiB);
  CHECK(r.peak_memory_bytes <= 10 * core::kGiB);
  CHECK(r.iteration_time_s > 0);
  // the ledger agrees with the report's byte counts, per link class and per tensor class
  CHECK(r.ledger.pcie_h2d_bytes == r.swap_in_bytes);
  CHECK(r.ledger.pcie_d2h_bytes == r.swap_out_bytes);
  CHECK(r.ledger.p2p_pcie_bytes == r.p2p_bytes);  // every P2P copy goes through the PCIe tree
  CHECK(r.ledger.cpu_msg_bytes == r.msg_bytes);
  CHECK(r.ledger.nvlink_bytes == 0);
  CHECK(r.ledger.host_staging_bytes == 0);
  const Bytes per_tensor = r.ledger.weights_bytes + r.ledger.weight_grad_bytes + r.ledger.optimizer_state_bytes +
                           r.ledger.activation_bytes + r.ledger.stash_bytes + r.ledger.act_grad_bytes;
  CHECK(per_tensor == r.swap_in_bytes + r.swap_out_bytes + r.p2p_bytes + r.msg_bytes);
  CHECK(r.ledger.weights_bytes == model.weight_bytes(0, 27) + model.buffer_bytes(0, 27) + model.weight_bytes(0, 20) +
                                      model.buffer_bytes(0, 20));  // BWD + FWD packs
  CHECK(r.ledger.stash_bytes > 0);
  CHECK(r.ledger.links.size() == res.graph.links.size());
  CHECK(r.host_memory.total_bytes() > r.host_memory.master_weights_bytes);
  CHECK(r.host_memory.capacity_bytes == 750 * core::kGiB);
  CHECK(r.host_memory.pinned_limit_bytes == 700 * core::kGiB);
  const auto j = core::report_to_json(r);
  CHECK(j["feasible"] == true);
  CHECK(j["swap_ledger"]["per_link_class"]["pcie_h2d_bytes"] == r.swap_in_bytes);
  CHECK(j["swap_ledger"]["per_tensor_class"]["stash_bytes"] == r.ledger.stash_bytes);
  // issue 33: the plan result's host_memory is core::HostBreakdown's JSON plus the total and the limits
  nlohmann::json host = core::host_breakdown_json(r.host_memory, core::kPinnedStagingKey);
  host["total_bytes"] = r.host_memory.total_bytes();
  host["host_capacity_bytes"] = 750 * core::kGiB;
  host["pinned_limit_bytes"] = 700 * core::kGiB;
  CHECK(j["host_memory"] == host);

  const auto small = sim::simulate_native(program, model, paper_1080ti_like(4 * core::kGiB));
  CHECK_FALSE(small.feasible);
  REQUIRE(small.memory_overflow.gpu >= 0);
  CHECK(small.memory_overflow.bytes_over > 0);
  CHECK_FALSE(small.memory_overflow.op_id.empty());
  CHECK(small.infeasible_reason.find(small.memory_overflow.op_id) != std::string::npos);
  CHECK(small.infeasible_reason.find(small.memory_overflow.op_label) != std::string::npos);
  MESSAGE("4 GiB: " << small.infeasible_reason);
  const auto js = core::report_to_json(small);
  CHECK(js["feasible"] == false);
  CHECK(js["memory_overflow"]["op_id"] == small.memory_overflow.op_id);
}

// issue 33: one type for the six host categories (the account, a plan result's host_memory, the executor's meter)
TEST_CASE("core::HostBreakdown: categories by name and by HostCategory, the total, the pinned part, the JSON keys") {
  core::HostBreakdown b{1, 20, 300, 4000, 50000, 600000};
  Bytes sum = 0;
  for (core::HostCategory c : core::kHostCategories) sum += b.at(c);
  CHECK(sum == 654321);
  CHECK(b.total_bytes() == 654321);
  CHECK(b.pinned_bytes() == 654321 - 20);
  b.at(core::HostCategory::Staging) += 7;
  CHECK(b.staging_bytes == 600007);
  CHECK(b.at(core::HostCategory::MasterWeights) == 1);
  CHECK(b.at(core::HostCategory::Activations) == 50000);
  const nlohmann::json sim = core::host_breakdown_json(b, core::kPinnedStagingKey);
  const nlohmann::json run = core::host_breakdown_json(b, core::kStagingKey);
  CHECK(sim.size() == 6);
  CHECK(sim["pinned_staging_bytes"] == 600007);
  CHECK(run["staging_bytes"] == 600007);
  CHECK(run["optimizer_state_bytes"] == 20);
  CHECK(sim["gradient_bytes"] == 300);
  CHECK(sim["stash_bytes"] == 4000);
}

TEST_CASE("the native model is deterministic, and the trace gets memory and bandwidth counters") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  core::Plan plan;
  plan.kind = core::plan_kind("harmony-dp");
  plan.gpus = 4;
  plan.minibatch = 32;
  plan.u_fwd = 4;
  plan.u_bwd = 4;
  core::manual_packs(model.num_layers(), 4, plan.packs_fwd, plan.packs_bwd);
  core::LowerOptions lo;
  lo.prefetch = true;
  lo.dp_first_gpu_only = false;
  const auto program = core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, lo);
  sim::NativeOptions o;
  o.record_counters = true;
  const auto a = sim::run_native(program, model, paper_1080ti_like(), o);
  const auto b = sim::run_native(program, model, paper_1080ti_like(), o);
  REQUIRE_FALSE(a.timeline.deadlock);
  CHECK(a.timeline.begin_ps == b.timeline.begin_ps);
  CHECK(a.timeline.end_ps == b.timeline.end_ps);
  REQUIRE(a.bandwidth_samples.size() == b.bandwidth_samples.size());
  for (std::size_t i = 0; i < a.bandwidth_samples.size(); ++i) {
    CHECK(a.bandwidth_samples[i].time_ps == b.bandwidth_samples[i].time_ps);
    CHECK(a.bandwidth_samples[i].rate == b.bandwidth_samples[i].rate);
  }
  CHECK(a.memory_anomalies == 0);
  // ARD all-reduces run GPU to GPU (ring), weights come over PCIe
  CHECK(a.class_bytes[static_cast<int>(sim::TransferClass::P2PPcie)] > 0);
  CHECK(a.tensor_bytes[static_cast<int>(core::TensorKind::WeightGrad)] > 0);
  // a P2P send and its receive begin together
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    if (program.ops[i].peer >= 0) CHECK(a.timeline.begin_ps[i] == a.timeline.begin_ps[z(program.ops[i].peer)]);
  }
  nlohmann::json events = nlohmann::json::array();
  sim::append_native_counters(events, a);
  std::size_t mem = 0;
  std::size_t bw = 0;
  for (const auto& e : events) {
    if (e["ph"] != "C") continue;
    if (e["name"] == "memory") {
      ++mem;
      CHECK(e["pid"].get<int>() < 4);
      CHECK(e["args"]["MiB"].get<double>() >= 0);
    } else {
      ++bw;
      CHECK(e["pid"] == sim::kLinkCounterPid);
    }
  }
  CHECK(mem == a.memory_samples.size());
  CHECK(bw == a.bandwidth_samples.size());
  CHECK(mem > 0);
  CHECK(bw > 0);
  // NativeEngine through the Engine seam: one run, same end times, peaks as memory
  const sim::NativeEngine engine(model, paper_1080ti_like());
  const sim::EngineResult run = engine.run(program);
  const sim::Timeline& t = run.timeline;
  const auto& rep = run.report;
  const auto direct = sim::run_native(program, model, paper_1080ti_like());
  CHECK(t.end_ps == direct.timeline.end_ps);
  CHECK(rep.cost_model == "native");
  CHECK(rep.peak_memory_bytes == *std::max_element(direct.peak_bytes.begin(), direct.peak_bytes.end()));
}

TEST_CASE("a grid of Harmony plans runs natively: no deadlock, balanced memory, ledger = report bytes") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  const auto machine = paper_1080ti_like();
  int plans = 0;
  for (auto mode : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")}) {
    for (int n : {1, 2, 3, 4}) {
      for (int d : {6, 8}) {
        for (int uf = 1; uf <= d; ++uf) {
          for (int ub = 1; ub <= d; ++ub) {
            for (int pack : {1, 5, 13, 28}) {
              for (bool pf : {false, true}) {
                core::Plan p;
                p.kind = mode;
                p.gpus = n;
                p.minibatch = d;
                p.u_fwd = uf;
                p.u_bwd = ub;
                core::manual_packs(28, pack, p.packs_fwd, p.packs_bwd);
                core::LowerOptions o;
                o.prefetch = pf;
                // every replica where the GPUs get equal shares of the minibatch (see the report for the
                // uneven case), GPU 0 only otherwise
                o.dp_first_gpu_only = d % n != 0;
                const auto program = core::lower_harmony(core::compose_task_graph(p, 28), model, o);
                const auto r = sim::simulate_native(program, model, machine);
                CAPTURE(core::plan_kind_name(mode));
                CAPTURE(n);
                CAPTURE(d);
                CAPTURE(uf);
                CAPTURE(ub);
                CAPTURE(pack);
                CAPTURE(pf);
                REQUIRE_FALSE(r.deadlock);
                REQUIRE(r.memory_anomalies == 0);
                REQUIRE(r.ledger.pcie_h2d_bytes == r.swap_in_bytes);
                REQUIRE(r.ledger.pcie_d2h_bytes == r.swap_out_bytes);
                REQUIRE(r.ledger.cpu_msg_bytes == r.msg_bytes);
                ++plans;
              }
            }
          }
        }
      }
    }
  }
  CHECK(plans == 2 * 4 * (36 + 64) * 4 * 2);
}

TEST_CASE("fits: every cost model flags a peak over the GPU; reference keeps its time, native makes it infeasible") {
  const core::Model model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  core::Plan plan;
  plan.kind = core::plan_kind("harmony-pp");
  plan.gpus = 2;
  plan.minibatch = 16;
  plan.u_fwd = 8;
  plan.u_bwd = 8;
  core::manual_packs(model.num_layers(), 7, plan.packs_fwd, plan.packs_bwd);
  core::MachineSpec big = core::machine_preset("paper-1080ti");
  core::MachineSpec small = big;
  small.gpu_memory_bytes = core::kGiB;
  for (const core::CostModelKind cm : {core::CostModelKind::Reference, core::CostModelKind::Native}) {
    INFO(core::cost_model_name(cm));
    const auto ok = sim::evaluate_plan(model, big, plan, core::LowerOptions{}, cm).report;
    const auto over = sim::evaluate_plan(model, small, plan, core::LowerOptions{}, cm).report;
    CHECK(ok.fits);
    CHECK(ok.excess_bytes == 0);
    CHECK_FALSE(over.fits);
    CHECK(over.gpu_capacity_bytes == core::kGiB);
    CHECK(over.excess_bytes == over.peak_memory_bytes - core::kGiB);
    CHECK(core::report_to_json(over)["fits"] == false);
    if (cm == core::CostModelKind::Reference) {
      CHECK(over.feasible);  // flagged, not demoted: the paper's time
      CHECK(over.iteration_time_s == ok.iteration_time_s);
    } else {
      CHECK_FALSE(over.feasible);  // never ranked above a plan that fits
    }
  }
  // baselines report their peak under every cost model, from the Program's allocations
  for (const core::CostModelKind cm : {core::CostModelKind::Reference, core::CostModelKind::Native}) {
    core::Plan b;
    b.kind = core::plan_kind("dp-swap");
    b.gpus = 2;
    b.minibatch = 16;
    b.u_fwd = b.u_bwd = 8;
    const auto r = sim::evaluate_plan(model, big, b, {}, cm).report;
    INFO(core::cost_model_name(cm));
    CHECK(r.peak_memory_bytes > 0);
    for (const auto& g : r.per_gpu) CHECK(g.peak_memory_bytes > 0);
  }
}

// The resident kind's Update runs AdamW on the GPU: both cost models price it by its HBM traffic (28 bytes per
// parameter, the Program's op.bytes) at gpu_rates.memory x vector_efficiency; a machine without that rate is refused
// by name; on a machine whose devices are host cores it is the host's AdamW (the profile's update time).
TEST_CASE("a resident Update is priced by its device memory traffic") {
  core::Model m = tiny_model();
  for (auto& L : m.layers) L.param_count = 250;  // 1000 weight bytes = 250 fp32 parameters
  core::Plan p;
  p.kind = core::plan_kind("resident");
  p.gpus = 2;
  p.minibatch = 2;
  p.u_fwd = p.u_bwd = 1;
  const core::Program prog = core::lower_plan(p, m);
  core::MachineSpec mach = one_switch(2, 1e9, 4e9);
  mach.gpu_rates.memory_bytes_per_s = 1e9;
  mach.gpu_rates.vector_efficiency = 0.5;
  const auto r = sim::run_native(prog, m, mach, quiet());
  const sim::ReferenceCostModel ref(m, mach);
  int updates = 0;
  for (std::size_t o = 0; o < prog.ops.size(); ++o) {
    const core::Op& op = prog.ops[o];
    if (op.kind != core::OpKind::Update) continue;
    ++updates;
    CHECK(op.stream == core::Stream::Compute);
    CHECK(op.bytes == 28 * 250);
    CHECK(sim::gpu_update(op, mach));
    const double want_s = 28.0 * 250 / (1e9 * 0.5);  // 14 us
    CHECK(sim::device_update_s(op, mach) == doctest::Approx(want_s));
    CHECK(ref.duration_s(prog, op) == doctest::Approx(want_s));
    CHECK(core::ps_to_seconds(r.timeline.end_ps[o] - r.timeline.begin_ps[o]) >= want_s * 0.999);
    CHECK(core::ps_to_seconds(r.timeline.end_ps[o] - r.timeline.begin_ps[o]) < 0.25);  // not the host's 0.25 s
  }
  CHECK(updates == 4);
  // nothing of the model on the host
  CHECK(r.host.total_bytes() == 0);

  core::MachineSpec no_rate = one_switch(2, 1e9, 4e9);
  CHECK_THROWS_WITH_AS(sim::run_native(prog, m, no_rate, quiet()), doctest::Contains("gives no gpu_rates.memory"),
                       core::ScheduleError);
  core::MachineSpec cpu = no_rate;
  cpu.compute.host_cores = true;
  for (const core::Op& op : prog.ops)
    if (op.kind == core::OpKind::Update) CHECK_FALSE(sim::gpu_update(op, cpu));
}

TEST_CASE("host_paths: each host transfer no faster than its measured path; bf16 weights through the staging") {
  // One GPU, uplink 1e9 B/s, GPU link 4e9 B/s: a swap alone runs at 1e9, B = 1e6 bytes in 1 ms.
  const Bytes B = 1'000'000;
  Builder b(1);
  const int wb = b.add(0, Stream::SwapIn, OpKind::WB, B);
  const int sx = b.add(0, Stream::SwapIn, OpKind::sX, B, {wb});
  const int dwb = b.add(0, Stream::SwapOut, OpKind::dWB, B);
  auto m = one_switch(1, 1e9, 4e9);
  const auto fp32 = tiny_model();  // no parameter counts: FP32 weights, no staging
  auto bf16 = tiny_model();
  for (auto& L : bf16.layers) L.param_count = L.weight_bytes / 2;  // 2 bytes a parameter: bf16 device weights
  REQUIRE(bf16.narrow_weights(0));
  // not measured: the links alone price it
  auto r = sim::run_native(b.p, bf16, m, quiet());
  CHECK(r.timeline.end_ps[z(wb)] == 1 * kMs);
  CHECK(r.timeline.end_ps[z(sx)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(dwb)] == 1 * kMs);
  // measured: pinned copies at 5e8 (2 ms for B), the bf16 staging at 2.5e8 up (4 ms) and 4e8 down (2.5 ms)
  m.host_paths.pinned_h2d_bytes_per_s = 5e8;
  m.host_paths.pinned_d2h_bytes_per_s = 5e8;
  m.host_paths.bf16_stage_up_bytes_per_s = 2.5e8;
  m.host_paths.bf16_stage_down_bytes_per_s = 4e8;
  r = sim::run_native(b.p, bf16, m, quiet());
  CHECK(r.timeline.end_ps[z(wb)] == 4 * kMs);            // staged up
  CHECK(r.timeline.end_ps[z(sx)] == 4 * kMs + 2 * kMs);  // a stash is a pinned copy
  CHECK(r.timeline.end_ps[z(dwb)] == 2'500'000'000);     // staged down
  r = sim::run_native(b.p, fp32, m, quiet());            // FP32 weights: pinned copies, no staging
  CHECK(r.timeline.end_ps[z(wb)] == 2 * kMs);
  CHECK(r.timeline.end_ps[z(dwb)] == 2 * kMs);
  // a path faster than the links changes nothing: the links bind
  m.host_paths = {};
  m.host_paths.pinned_h2d_bytes_per_s = 5e9;
  CHECK(sim::run_native(b.p, fp32, m, quiet()).timeline.end_ps[z(wb)] == 1 * kMs);
  // the reference bandwidths (the paper's constants) ignore the machine's measured paths
  auto o = quiet();
  o.reference_bandwidths = true;
  o.contention = false;
  m.host_paths.pinned_h2d_bytes_per_s = 1e3;
  const auto ref = sim::run_native(b.p, fp32, m, o);
  m.host_paths = {};
  CHECK(ref.timeline.end_ps[z(wb)] == sim::run_native(b.p, fp32, m, o).timeline.end_ps[z(wb)]);
}
