// The native model's offload tier and host work (issue 13), each priced on a hand-built Program or a two-layer
// model whose cost is derived in the test: NVMe reads in series with the H2D copy (bandwidth, per-I/O latency,
// buckets), host memory bandwidth shared byte for byte by DMA and the CPU optimizer, host gradient sums, dtype
// conversions at the update, ZeRO-3's per-module and per-parameter-tensor costs, zero-infinity's and Harmony's
// offload: nvme and compare's fallback.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/kinds/kinds.hpp"
#include "core/kinds/swapping.hpp"
#include "core/model/analytic.hpp"
#include "core/program/lower.hpp"
#include "core/program/task_graph.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/compare.hpp"

using namespace harmony;
using core::Bytes;
using core::OpKind;
using core::Stream;
using core::TimePs;

namespace {

std::size_t z(int i) { return static_cast<std::size_t>(i); }
constexpr TimePs kUs = 1'000'000;  // picoseconds per microsecond
constexpr TimePs kMs = 1000 * kUs;

// Ops appended to (device, stream) queues in call order.
struct Builder {
  core::Program p;
  Builder() { p.graph.plan.gpus = 1; }
  int add(Stream s, OpKind k, Bytes bytes = 0, int layer = 0) {
    core::Op o;
    o.stream = s;
    o.kind = k;
    o.bytes = bytes;
    o.layers = {layer, layer};
    o.task = static_cast<int>(p.ops.size());
    o.ubs = 1;
    int q = -1;
    for (std::size_t i = 0; i < p.queues.size(); ++i) {
      if (p.queues[i].stream == s) q = static_cast<int>(i);
    }
    if (q < 0) {
      q = static_cast<int>(p.queues.size());
      p.queues.push_back({0, s, {}});
    }
    o.queue = q;
    o.queue_pos = static_cast<int>(p.queues[z(q)].ops.size());
    const int id = static_cast<int>(p.ops.size());
    p.queues[z(q)].ops.push_back(id);
    p.ops.push_back(o);
    return id;
  }
  core::Op& op(int id) { return p.ops[z(id)]; }
  core::NativeOpCosts& cost(int id) { return p.cost.edit(id); }
};

// Two layers: forward 1 ms, backward (recompute + backward) 3 ms, update `update_s`; weights `w` bytes for
// `params` parameters (4 bytes each: fp32; 2: bf16), optimizer state 8 bytes per parameter (Adam).
core::Model two_layers(double update_s = 1e-3, Bytes w = 4000, std::int64_t params = 1000, int layers = 2) {
  core::Model m;
  m.name = "two";
  m.ubatch_fwd = {1};
  m.ubatch_bwd = {1};
  for (int l = 0; l < layers; ++l) {
    core::Layer L;
    L.name = fmt::format("l{}", l);
    L.is_criterion = l == layers - 1;
    L.weight_bytes = w;
    L.param_count = params;
    L.optimizer_state_bytes = 8 * params;
    L.update_time_cpu_s = update_s;
    L.input_bytes_per_sample = 100;
    L.fwd_time_s = {0.001};
    L.bwd_time_s = {0.003};
    L.fwd_peak_bytes = {500};
    L.bwd_peak_bytes = {800};
    m.layers.push_back(L);
  }
  return m;
}

// A plan of `kind` on `gpus` GPUs of 1 GiB, one sample per microbatch over a minibatch of `minibatch`.
core::Plan plan_of(const char* kind, int gpus, int minibatch) {
  core::Plan p;
  p.kind = core::plan_kind(kind);
  p.gpus = gpus;
  p.minibatch = minibatch;
  p.u_fwd = p.u_bwd = 1;
  p.knobs.gpu_capacity_bytes = core::kGiB;
  return p;
}

// One GPU behind a switch: uplink 1e9 B/s, GPU link 4e9 B/s, host memcpy 2e9 B/s, 8 cores, no latency.
core::MachineSpec box() {
  core::MachineSpec m;
  m.name = "box";
  m.gpus = 1;
  m.topology.switches = {{"sw0", 0, 1e9}};
  m.topology.gpus = {core::GpuSpec{0, 4e9, 1, 1}};
  m.topology.host_memcpy_bytes_per_s = 2e9;
  m.topology.cpu_cores = 8;
  return m;
}

// The one-GPU box with links and host copies so fast (1e12 B/s) that the compute stream is the critical path.
core::MachineSpec fast_box() {
  auto m = box();
  m.topology.switches[0].uplink_bytes_per_s = 1e12;
  m.topology.gpus[0].link_bytes_per_s = 1e12;
  m.topology.host_memcpy_bytes_per_s = 1e12;
  return m;
}

TimePs makespan(const sim::NativeResult& r) {
  TimePs t = 0;
  for (const TimePs e : r.timeline.end_ps) t = std::max(t, e);
  return t;
}

core::MachineSpec with_nvme(core::MachineSpec m, double read, double write, double latency_s, Bytes capacity = 0) {
  m.topology.nvme = core::NvmeSpec{read, write, capacity, latency_s};
  return m;
}

}  // namespace

TEST_CASE("an NVMe read runs before the H2D copy, paying the drive latency once per I/O") {
  // WB of B = 1e6 bytes, all read from NVMe first: latency 100 us + B / 5e8 = 2 ms on the drives, then
  // B / 1e9 = 1 ms over the uplink (the bottleneck of the H2D path): 3.1 ms. In 4 buckets (io_count 4):
  // 4 x 100 us of latency: 3.4 ms. The NVMe link carries B, the uplink B.
  const Bytes B = 1'000'000;
  for (const auto& [ios, expect] : std::vector<std::pair<int, TimePs>>{{1, 3100 * kUs}, {4, 3400 * kUs}}) {
    Builder b;
    const int wb = b.add(Stream::SwapIn, OpKind::WB, B);
    b.cost(wb).nvme_read_bytes = B;
    b.cost(wb).io_count = ios;
    const auto r = sim::run_native(b.p, two_layers(), with_nvme(box(), 5e8, 4e8, 100e-6));
    CHECK(r.timeline.end_ps[z(wb)] == expect);
    CHECK(r.link_stats[z(r.graph.nvme_read)].bytes == B);
    CHECK(r.link_stats[z(r.graph.switch_down[0])].bytes == B);
  }
  // without an NVMe tier the op cannot run
  Builder b;
  b.cost(b.add(Stream::SwapIn, OpKind::WB, B)).nvme_read_bytes = B;
  CHECK_THROWS_AS(sim::run_native(b.p, two_layers(), box()), core::ScheduleError);
}

TEST_CASE("an update with NVMe state reads it, steps, and writes it back in turn") {
  // Update of layer 0 (1 ms of CPU work) reading S = 1e6 bytes at 5e8 B/s (2 ms) and writing 2e6 bytes at
  // 4e8 B/s (5 ms), no latency: 2 + 1 + 5 = 8 ms.
  Builder b;
  const int u = b.add(Stream::Cpu, OpKind::Update);
  b.cost(u).nvme_read_bytes = 1'000'000;
  b.cost(u).nvme_write_bytes = 2'000'000;
  const auto r = sim::run_native(b.p, two_layers(), with_nvme(box(), 5e8, 4e8, 0));
  CHECK(r.timeline.end_ps[z(u)] == 8 * kMs);
  CHECK(r.link_stats[z(r.graph.nvme_write)].bytes == 2'000'000);
}

// |a - b| <= 1 ps: a fused flow's end is a rate's quotient, rounded up to the picosecond
bool within_1ps(TimePs a, TimePs b) { return (a > b ? a - b : b - a) <= 1; }

TEST_CASE("a pipelined update overlaps its NVMe read and write with its CPU work") {
  // The update above (1 ms of CPU work, 1e6 bytes read at 5e8 B/s: 2 ms, 2e6 written at 4e8 B/s: 5 ms) with DeepSpeed's
  // pipelined optimizer swap: both overlapped, max(1, 2, 5) = 5 ms; the read alone, max(1, 2) + 5 = 7 ms; the write
  // alone, 2 + max(1, 5) = 7 ms. The drives move the same bytes each way.
  const auto run = [](Bytes read_overlap, Bytes write_overlap) {
    Builder b;
    const int u = b.add(Stream::Cpu, OpKind::Update);
    b.cost(u).nvme_read_bytes = 1'000'000;
    b.cost(u).nvme_write_bytes = 2'000'000;
    b.cost(u).nvme_read_overlap_bytes = read_overlap;
    b.cost(u).nvme_write_overlap_bytes = write_overlap;
    const auto r = sim::run_native(b.p, two_layers(), with_nvme(box(), 5e8, 4e8, 0));
    CHECK(r.link_stats[z(r.graph.nvme_read)].bytes == 1'000'000);
    CHECK(r.link_stats[z(r.graph.nvme_write)].bytes == 2'000'000);
    return r.timeline.end_ps[z(u)];
  };
  CHECK(run(0, 0) == 8 * kMs);
  CHECK(within_1ps(run(1'000'000, 2'000'000), 5 * kMs));
  CHECK(within_1ps(run(1'000'000, 0), 7 * kMs));
  CHECK(within_1ps(run(0, 2'000'000), 7 * kMs));
  // Half the write overlapped (as DeepSpeed's parameter write stays after the step): max(1, 2, 2.5) + 2.5 = 5 ms; and
  // with the read in series too: 2 + max(1, 2.5) + 2.5 = 7 ms.
  CHECK(within_1ps(run(1'000'000, 1'000'000), 5 * kMs));
  CHECK(within_1ps(run(0, 1'000'000), 7 * kMs));
}

TEST_CASE("a pipelined update's I/O overlaps its host passes too, and the CPU side binds when it is longer") {
  // 1 ms of CPU work, then host passes of 4e6 bytes (2e6 copied at the memcpy rate 2e9: 1 ms): 2 ms of host work in
  // series. Overlapped with 1.5e6 bytes read at 5e8 (3 ms) and 4e5 written at 4e8 (1 ms): max(2, 3, 1) = 3 ms, not
  // 6 in series. With 1e5 bytes read (0.2 ms) the host work binds: 2 ms, not 3.2.
  const auto run = [](Bytes read) {
    Builder b;
    const int u = b.add(Stream::Cpu, OpKind::Update);
    b.cost(u).host_pass_bytes = 4'000'000;
    b.cost(u).nvme_read_bytes = b.cost(u).nvme_read_overlap_bytes = read;
    b.cost(u).nvme_write_bytes = b.cost(u).nvme_write_overlap_bytes = 400'000;
    return sim::run_native(b.p, two_layers(), with_nvme(box(), 5e8, 4e8, 0)).timeline.end_ps[z(u)];
  };
  CHECK(within_1ps(run(1'500'000), 3 * kMs));
  CHECK(within_1ps(run(100'000), 2 * kMs));
}

TEST_CASE("host memory bandwidth: the optimizer's DRAM traffic bounds it and it shares DRAM with DMA") {
  // Layer 0: 1000 fp32 parameters, Adam: the update touches 3 x 4000 (masters read and written, gradient
  // read) + 2 x 8000 (moments read and written) = 28000 bytes (28 per parameter) in w = 1 ms of CPU time,
  // i.e. it needs 2.8e7 B/s of DRAM. With 1.4e7 B/s of DRAM it is memory-bound: 28000 / 1.4e7 = 2 ms.
  const auto model = two_layers();
  {
    Builder b;
    const int u = b.add(Stream::Cpu, OpKind::Update);
    auto m = box();
    CHECK(sim::run_native(b.p, model, m).timeline.end_ps[z(u)] == 1 * kMs);  // no key: CPU time only
    m.topology.host_memory_bytes_per_s = 1.4e7;
    CHECK(sim::run_native(b.p, model, m).timeline.end_ps[z(u)] == 2 * kMs);
  }
  // With 4e7 B/s of DRAM and a swap-in of 40000 bytes at the same time (PCIe 1e9: not a bottleneck), max-min
  // in bytes gives each 2e7 B/s (below the update's CPU limit 2.8e7): the update ends at 28000 / 2e7 = 1.4 ms,
  // the swap has 40000 - 28000 = 12000 left and then gets 4e7: 12000 / 4e7 = 0.3 ms more, ending at 1.7 ms.
  Builder b;
  const int u = b.add(Stream::Cpu, OpKind::Update);
  const int wb = b.add(Stream::SwapIn, OpKind::WB, 40'000);
  auto m = box();
  m.topology.host_memory_bytes_per_s = 4e7;
  const auto r = sim::run_native(b.p, model, m);
  CHECK(r.timeline.end_ps[z(u)] == 1400 * kUs);
  CHECK(r.timeline.end_ps[z(wb)] == 1700 * kUs);
  CHECK(r.link_stats[z(r.graph.host_memory)].bytes == 68'000);
}

TEST_CASE("cpu_optimizer: torch: the native model's host update of an analytic block takes 5x its rate's time") {
  // A gpt2-small block's update on the CPU stream (no host memory bandwidth: CPU time only) ends at the layer's
  // update_time_cpu_s: per_layer + params x 4 / rate. torch's rate is cpu_adam.bandwidth / kTorchCpuAdamSlowdown.
  core::CpuAdam adam;
  adam.bytes_per_s = 8e9;
  adam.per_layer_s = 100e-6;
  core::AnalyticSpec s = *core::analytic_preset("gpt2-small");
  s.ubatch_sizes = {1};
  core::GpuRates gpu;
  gpu.matrix_fp32_flops_per_s = 10e12;
  gpu.memory_bytes_per_s = 500e9;
  const core::Model ds = core::analytic_model(s, gpu, adam);
  s.cpu_optimizer = core::CpuOptimizerImpl::Torch;
  const core::Model torch = core::analytic_model(s, gpu, adam);
  const auto update_s = [&](const core::Model& model) {
    Builder b;
    const int u = b.add(Stream::Cpu, OpKind::Update, 0, 1);
    return static_cast<double>(sim::run_native(b.p, model, box()).timeline.end_ps[z(u)]) * 1e-12;
  };
  const double params = static_cast<double>(ds.layers[1].param_count);
  CHECK(update_s(ds) == doctest::Approx(100e-6 + params * 4 / 8e9));
  CHECK(update_s(torch) - 100e-6 == doctest::Approx((update_s(ds) - 100e-6) * core::kTorchCpuAdamSlowdown));
}

TEST_CASE("host gradient sums cost host memcpy time after the D2H copy") {
  // dWB of B = 1e6 bytes (1 ms over the 1e9 uplink), then the CPU adds S = 1e6 bytes into the host
  // accumulator at the host memcpy rate 2e9: 0.5 ms more, 1.5 ms in all.
  const Bytes B = 1'000'000;
  Builder b;
  const int o = b.add(Stream::SwapOut, OpKind::dWB, B);
  b.cost(o).host_sum_bytes = B;
  const auto r = sim::run_native(b.p, two_layers(), box());
  CHECK(r.timeline.end_ps[z(o)] == 1500 * kUs);
  CHECK(r.link_stats[z(r.graph.host_memcpy)].bytes == B);
  CHECK(r.class_bytes[static_cast<int>(sim::TransferClass::PcieD2H)] == B);
}

TEST_CASE("ZeRO-3's gradient round trip and FP32 copy, and the step's host passes, are priced in order") {
  // dWB of B = 1e6 bytes over the 1e9 uplink (1 ms), plus its FP32 copy E = 2e6 bytes on the same transfer (2 ms),
  // then the buffer back to the GPU, R = 1e6 bytes over the uplink's other direction (1 ms): 4 ms. An Update of
  // 1 ms of CPU time with P = 4e6 bytes of host passes (2e6 copied at the memcpy rate 2e9: 1 ms): 2 ms.
  const Bytes B = 1'000'000;
  Builder b;
  const int o = b.add(Stream::SwapOut, OpKind::dWB, B);
  b.cost(o).return_bytes = B;
  b.cost(o).extra_out_bytes = 2 * B;
  const int u = b.add(Stream::Cpu, OpKind::Update);
  b.cost(u).host_pass_bytes = 4 * B;
  const auto r = sim::run_native(b.p, two_layers(), box());
  CHECK(r.timeline.end_ps[z(o)] == 4 * kMs);
  CHECK(r.timeline.end_ps[z(u)] == 2 * kMs);
  CHECK(r.link_stats[z(r.graph.host_memcpy)].bytes == 2 * B);
}

TEST_CASE("host passes run on the CPU optimizer's cores at the DRAM rate cpu_adam implies, after the step") {
  // cpu_adam 1e9 B/s of FP32 parameters: a DeepSpeed-style Adam moves 7 B of DRAM per such byte, so the passes run
  // at 7e9 B/s of DRAM traffic on the whole CPU: 14e6 bytes (read and written) take 2 ms, after the update's 1 ms:
  // 3 ms. Without a cpu_adam rate (the test above) they are one thread's copy over the host memcpy link.
  Builder b;
  const int u = b.add(Stream::Cpu, OpKind::Update);
  b.cost(u).host_pass_bytes = 14'000'000;
  auto m = box();
  m.cpu_adam.bytes_per_s = 1e9;
  auto r = sim::run_native(b.p, two_layers(), m);
  CHECK(within_1ps(r.timeline.end_ps[z(u)], 3 * kMs));
  CHECK(r.link_stats[z(r.graph.host_memcpy)].bytes == 0);
  // compute.update_time_scale slows them as it slows the update: x2, 6 ms
  m.compute.update_time_scale = 2.0;
  CHECK(within_1ps(sim::run_native(b.p, two_layers(), m).timeline.end_ps[z(u)], 6 * kMs));
  // with host memory bandwidth 3.5e9 B/s the passes' 14e6 bytes are DRAM-bound: 4 ms after the update's 1 ms
  m.compute.update_time_scale = 1.0;
  m.topology.host_memory_bytes_per_s = 3.5e9;
  r = sim::run_native(b.p, two_layers(), m);
  CHECK(within_1ps(r.timeline.end_ps[z(u)], 5 * kMs));
}

TEST_CASE("an update with its own host passes converts nothing inside the step (ZeRO-3: no double count)") {
  // 1e6 bf16 parameters, 2 ms of CPU time, DRAM at 1e10 B/s: the fused-cast update moves 36 bytes per parameter
  // (3.6 ms, the test below). With ZeRO-3's passes (host_pass_bytes 14e6) the step moves only 28 (2.8 ms), then the
  // passes copy 7e6 bytes at the memcpy rate 2e9 (3.5 ms; their 14e6 bytes of DRAM take 1.4 ms): 6.3 ms, not 7.1.
  Builder b;
  const int u = b.add(Stream::Cpu, OpKind::Update);
  b.cost(u).host_pass_bytes = 14'000'000;
  auto m = box();
  m.topology.host_memory_bytes_per_s = 1e10;
  CHECK(sim::run_native(b.p, two_layers(2e-3, 2'000'000, 1'000'000), m).timeline.end_ps[z(u)] == 6300 * kUs);
}

TEST_CASE("zero-infinity: gradients go down and back per microbatch, FP32 at the boundary; the step passes twice") {
  // DeepSpeed stage3.py (38327e07) partition_grads: each microbatch's 2-byte shard into the pinned host buffer and
  // back to the GPU (summed there, no host sum); the last also sends the FP32 gradient. bf16 layers of 1000
  // parameters (W = 2000): every dWB returns 2000 bytes, the second microbatch's sends 4000 more. Each Update passes
  // over 2 x 4000 (unscale) + 4000 + 2000 (the bf16 copy of the masters) = 14000 bytes; fp32 weights: 16000.
  for (const auto& [w, pass] : std::vector<std::pair<Bytes, Bytes>>{{2000, 14000}, {4000, 16000}}) {
    auto model = two_layers(1e-3, w, 1000);
    if (w == 2000) {
      for (auto& L : model.layers) L.optimizer_state_bytes = 12000;
    }
    core::Plan p = plan_of("zero-infinity", 1, 2);
    int dwbs = 0;
    int updates = 0;
    const core::Program prog = core::lower_plan(p, model);
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const core::Op& o = prog.ops[i];
      const core::NativeOpCosts& c = prog.cost.op(static_cast<int>(i));
      if (o.kind == OpKind::dWB) {
        ++dwbs;
        CHECK(o.bytes == w);
        CHECK(c.return_bytes == w);
        CHECK(c.extra_out_bytes == (o.ui == 1 ? 4000 : 0));
        CHECK(c.host_sum_bytes == 0);
      }
      if (o.kind == OpKind::Update) {
        ++updates;
        CHECK(c.host_pass_bytes == pass);
      }
    }
    CHECK(dwbs == 4);
    CHECK(updates == 2);
    // what crosses the host link is what the native model prices: the reported swap totals and the ledger count the
    // returns (4 x w, host -> GPU) and the FP32 copies (2 x 4000, GPU -> host) beside the ops' own bytes (the
    // reference model, which does not price them, reports the ops' own bytes)
    Bytes in = 0, out = 0;
    for (const core::Op& o : prog.ops) {
      if (o.stream == core::Stream::SwapIn) in += o.bytes;
      if (o.stream == core::Stream::SwapOut) out += o.bytes;
    }
    const core::RunReport r = sim::simulate_native(prog, model, box());
    CHECK(r.swap_in_bytes == in + 4 * w);
    CHECK(r.swap_out_bytes == out + 2 * 4000);
    CHECK(r.ledger.pcie_h2d_bytes == r.swap_in_bytes);
    CHECK(r.ledger.pcie_d2h_bytes == r.swap_out_bytes);
    CHECK(r.ledger.weight_grad_bytes == 4 * w + 4 * w + 2 * 4000);  // the dWBs, their returns, the FP32 copies
  }
}

TEST_CASE("zero-offload: every microbatch's gradient goes down, the running sum comes back up, FP32 at the boundary") {
  // DeepSpeed stage_1_and_2.py (38327e07) copy_grads_in_partition with cpu_offload: every micro-step's backward sends
  // the gradient partition down; the running sum lives on the host in the GPU dtype and is summed on the GPU
  // (async_accumulate_grad_in_cpu_via_gpu: a later micro-step brings it up first); the boundary sends FP32 instead.
  // bf16 layers of 1000 parameters (W = 2000, FP32 4000): microbatch 0 sends 2000 bytes, 1 and 2 bring 2000 back and
  // send 2000, the last (3) brings 2000 back and sends 2000 + 2000 more as FP32. One microbatch: the FP32 copy alone.
  auto model = two_layers(1e-3, 2000, 1000);
  for (auto& L : model.layers) L.optimizer_state_bytes = 12000;
  for (const int m : {1, 4}) {
    CAPTURE(m);
    const core::Program prog = core::lower_plan(plan_of("zero-offload", 1, m), model);
    int dwbs = 0;
    Bytes returned = 0, extra = 0;
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const core::Op& o = prog.ops[i];
      if (o.kind != OpKind::dWB) continue;
      const core::NativeOpCosts& c = prog.cost.op(static_cast<int>(i));
      ++dwbs;
      CHECK(o.bytes == 2000);
      CHECK(c.return_bytes == (o.ui > 0 ? 2000 : 0));
      CHECK(c.extra_out_bytes == (o.ui == m - 1 ? 2000 : 0));
      CHECK(c.host_sum_bytes == 0);  // summed on the GPU, not on the host
      returned += c.return_bytes;
      extra += c.extra_out_bytes;
    }
    CHECK(dwbs == 2 * m);
    CHECK(returned == 2 * (m - 1) * 2000);
    CHECK(extra == 2 * 2000);
    const core::RunReport r = sim::simulate_native(prog, model, box());
    CHECK(r.ledger.weight_grad_bytes == 2 * m * 2000 + returned + extra);
  }
}

TEST_CASE("fsdp-offload: zero-infinity's data path without DeepSpeed's stage-3 work") {
  // PyTorch FSDP with CPUOffload(offload_params=True): one flat parameter per unit, so one transfer per WB, AG and dWB;
  // the gradient shard goes to the host and stays (no return, no FP32 copy at the boundary), later microbatches add
  // on the CPU; the optimizer steps the CPU shard in place (no host pass); no hook, module or per-tensor latency.
  // bf16 layers of 1000 parameters with FP32 masters (W = 2000, FP32 4000): the shard crosses in FP32 both ways.
  auto model = two_layers(1e-3, 2000, 1000);
  for (auto& L : model.layers) {
    L.optimizer_state_bytes = 12000;
    L.param_tensors = 7;
  }
  const core::Program prog = core::lower_plan(plan_of("fsdp-offload", 1, 2), model);
  int wbs = 0, dwbs = 0;
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    const core::Op& o = prog.ops[i];
    const core::NativeOpCosts& c = prog.cost.op(static_cast<int>(i));
    CHECK(c.overhead_s == 0);
    if (o.kind == OpKind::WB) {
      ++wbs;
      CHECK(c.io_count == 1);
      CHECK(o.bytes + c.extra_out_bytes == 4000);
    }
    if (o.kind == OpKind::dWB) {
      ++dwbs;
      CHECK(c.io_count <= 1);
      CHECK(c.return_bytes == 0);
      CHECK(o.bytes + c.extra_out_bytes == 4000);
      CHECK(c.host_sum_bytes == (o.ui > 0 ? 4000 : 0));
    }
    if (o.kind == OpKind::Update) CHECK(c.host_pass_bytes == 0);
    CHECK(o.kind != OpKind::sX);
  }
  CHECK(wbs == 2 * 2 * 2);  // every layer, pass and microbatch
  CHECK(dwbs == 2 * 2);
  // activations stay on the GPU even where a plan asks to swap them (FSDP has no activation offload)
  core::Plan forced = plan_of("fsdp-offload", 1, 2);
  forced.knobs.activations = core::SwapChoice::Swap;
  CHECK_FALSE(core::decide_swaps(forced, model).front().activations);
  for (const core::Op& o : core::lower_plan(forced, model).ops) CHECK(o.kind != OpKind::sX);
  // zero-infinity on the same plan pays the stage-3 work on top: slower on the same box
  const auto time_of = [&](const char* kind) {
    return sim::simulate_native(core::lower_plan(plan_of(kind, 1, 2), model), model, box()).iteration_time_s;
  };
  CHECK(time_of("fsdp-offload") < time_of("zero-infinity"));
}

TEST_CASE("bf16 weights: the conversion is DRAM traffic of the update, not a pass of its own") {
  // 1e6 parameters, w = 2 ms of CPU time. Without a host memory bandwidth bf16 and fp32 updates both take the
  // CPU time, 2 ms (the conversion is fused into the multi-threaded step). With one, the fp32 update moves
  // 28 bytes per parameter (2.8e7 bytes) and bf16's 8 more for the conversion (3.6e7); at 1e10 B/s of DRAM
  // both are memory-bound (2.8e7 / 1e10 = 2.8 ms > 2 ms of CPU time): 2.8 ms and 3.6 ms.
  for (const auto& [w, expect] :
       std::vector<std::pair<Bytes, TimePs>>{{2'000'000, 3600 * kUs}, {4'000'000, 2800 * kUs}}) {
    Builder b;
    const int u = b.add(Stream::Cpu, OpKind::Update);
    auto m = box();
    CHECK(sim::run_native(b.p, two_layers(2e-3, w, 1'000'000), m).timeline.end_ps[z(u)] == 2 * kMs);
    m.topology.host_memory_bytes_per_s = 1e10;
    CHECK(sim::run_native(b.p, two_layers(2e-3, w, 1'000'000), m).timeline.end_ps[z(u)] == expect);
  }
}

TEST_CASE("zero-infinity: ZeRO-3's module latency adds to every FWD and BWD on the critical path") {
  // One GPU, one microbatch, fast links (1e12 B/s): the compute stream FWD0 FWD1 BWD1 BWD0 is the critical
  // path, so a module latency L on each of the 4 compute ops delays the iteration by exactly 4 L.
  const auto model = two_layers();
  auto m = fast_box();
  core::Plan p = plan_of("zero-infinity", 1, 1);
  p.knobs.zero3.module_latency_s = 0;
  const auto t0 = sim::simulate_native(core::lower_plan(p, model), model, m).iteration_time_s;
  p.knobs.zero3.module_latency_s = 1e-3;
  const auto prog = core::lower_plan(p, model);
  int charged = 0;
  for (const auto& c : prog.cost.op_costs) charged += c.overhead_s > 0 ? 1 : 0;
  CHECK(charged == 4);
  const auto t1 = sim::simulate_native(prog, model, m).iteration_time_s;
  CHECK(t1 - t0 == doctest::Approx(4e-3).epsilon(1e-9));
  // buckets: 1000 elements per layer in buckets of 300: ceil(1000 / 300) = 4 I/Os per fetch
  p.knobs.zero3.bucket_elements = 300;
  const core::Program bucketed = core::lower_plan(p, model);
  for (std::size_t i = 0; i < bucketed.ops.size(); ++i) {
    if (bucketed.ops[i].kind == OpKind::WB) CHECK(bucketed.cost.op(static_cast<int>(i)).io_count == 4);
  }
}

TEST_CASE("zero-infinity: ZeRO-3's per-parameter-tensor costs, paid at batch 1 and gone at one tensor a layer") {
  // One GPU, one microbatch, fast links (1e12 B/s), no transfer latency: the compute stream FWD0 FWD1 BWD1 BWD0 is
  // the critical path. With module_latency 0, tensor_latency a = 1 ms and grad_tensor_latency g = 2 ms, a layer of
  // T parameter tensors adds T a before each FWD and T (a + g) before each BWD: 2 layers x T x (a + a + g) = 8 T ms.
  // From T = 1 to T = 12 the iteration grows by 8 x 11 = 88 ms; a profile without a count prices T = 2.
  auto m = fast_box();
  core::Plan p = plan_of("zero-infinity", 1, 1);
  p.knobs.zero3.module_latency_s = 0;
  p.knobs.zero3.tensor_latency_s = 1e-3;
  p.knobs.zero3.grad_tensor_latency_s = 2e-3;
  auto time_with = [&](int tensors) {
    auto model = two_layers();
    for (auto& L : model.layers) L.param_tensors = tensors;
    return sim::simulate_native(core::lower_plan(p, model), model, m).iteration_time_s;
  };
  const double t1 = time_with(1);
  const double t12 = time_with(12);
  CHECK(t12 - t1 == doctest::Approx(88e-3).epsilon(1e-9));
  CHECK(time_with(0) - t1 == doctest::Approx(8e-3).epsilon(1e-9));  // unknown: the default of 2
  p.knobs.zero3.tensor_latency_s = 0;
  p.knobs.zero3.grad_tensor_latency_s = 0;
  CHECK(time_with(12) == doctest::Approx(time_with(1)).epsilon(1e-12));  // no per-tensor cost, no difference
  // each tensor's partition goes up and its gradient down as a transfer of its own: 12 I/Os, each paying
  // topology.latency (a bucket of 300 elements would make 4; the larger count wins)
  auto model = two_layers();
  for (auto& L : model.layers) L.param_tensors = 12;
  int checked = 0;
  const core::Program prog = core::lower_plan(p, model);
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    if (prog.ops[i].kind != OpKind::WB && prog.ops[i].kind != OpKind::dWB) continue;
    CHECK(prog.cost.op(static_cast<int>(i)).io_count == 12);
    ++checked;
  }
  CHECK(checked == 6);  // 2 layers x (WB forward, WB backward, dWB)
  m.topology.transfer_latency_s = 1e-3;
  const double lat12 = sim::simulate_native(core::lower_plan(p, model), model, m).iteration_time_s;
  for (auto& L : model.layers) L.param_tensors = 1;
  const double lat1 = sim::simulate_native(core::lower_plan(p, model), model, m).iteration_time_s;
  CHECK(lat12 > lat1 + 11e-3);  // at least layer 0's forward fetch, 11 more latencies, is on the critical path
}

TEST_CASE("zero-infinity: module_latency is paid per gathered module, not per layer") {
  // One GPU, one microbatch, fast links, no transfer latency: FWD0 FWD1 BWD1 BWD0 is the critical path. With
  // module_latency 1 ms and no per-tensor costs, a layer of M gathered modules adds M ms before each FWD and each BWD:
  // from M = 1 to M = 4 the iteration grows by 2 layers x 2 passes x 3 ms = 12 ms. DeepSpeed hooks every submodule
  // (parameter_offload.py); until session 14 the model paid the latency once per layer whatever its modules.
  auto m = fast_box();
  core::Plan p = plan_of("zero-infinity", 1, 1);
  p.knobs.zero3.module_latency_s = 1e-3;
  p.knobs.zero3.tensor_latency_s = 0;
  p.knobs.zero3.grad_tensor_latency_s = 0;
  auto time_with = [&](int modules) {
    auto model = two_layers();
    for (auto& L : model.layers) L.gathered_modules = modules;
    return sim::simulate_native(core::lower_plan(p, model), model, m).iteration_time_s;
  };
  CHECK(time_with(4) - time_with(1) == doctest::Approx(12e-3).epsilon(1e-9));
  CHECK(time_with(-1) == doctest::Approx(time_with(1)).epsilon(1e-12));       // unknown: one module a layer
  CHECK(time_with(1) - time_with(0) == doctest::Approx(4e-3).epsilon(1e-9));  // none gathered: no module latency
}

TEST_CASE("zero-infinity offload: nvme moves masters and state to the drives and reads them per fetch and step") {
  // Two fp32 layers of 1000 parameters: W = 4000, optimizer state 8000, masters 4000 bytes per layer. Two
  // microbatches on one GPU: every WB reads its 4000 bytes from NVMe (2 passes x 2 microbatches x 2 layers =
  // 8 reads, 32000 bytes); each Update reads state + masters (12000) and the FP32 gradient the last microbatch's dWB
  // swapped out (4000) and writes state + masters back; no dWB sums on the host (DeepSpeed adds on the GPU).
  const auto model = two_layers();
  core::Plan p = plan_of("zero-infinity", 1, 2);
  p.knobs.offload = core::OffloadTier::Nvme;
  const auto prog = core::lower_plan(p, model);
  CHECK(prog.cost.offload_nvme);
  Bytes wb_reads = 0;
  Bytes sums = 0;
  Bytes grad_writes = 0;
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    const core::Op& o = prog.ops[i];
    const core::NativeOpCosts& c = prog.cost.op(static_cast<int>(i));
    if (o.kind == OpKind::WB) wb_reads += c.nvme_read_bytes;
    if (o.kind == OpKind::dWB) sums += c.host_sum_bytes;
    if (o.kind == OpKind::dWB) grad_writes += c.nvme_write_bytes;
    if (o.kind == OpKind::Update) {
      CHECK(c.nvme_read_bytes == 16000);
      CHECK(c.nvme_write_bytes == 12000);
    }
  }
  CHECK(wb_reads == 32000);
  CHECK(sums == 0);
  CHECK(grad_writes == 2 * 4000);  // the last microbatch's FP32 gradients, one layer each
  // the host keeps no masters or state; the drives hold 2 x (4000 + 8000); pinned buffers: 2 x 16000 (the state's
  // read buffers plus the gradient's, DeepSpeed's swap_in_optimizer_state: one more buffer when it has gradients),
  // and the bounce the second microbatch's dWB lands in before it is added to the first's
  // (sim::accumulate_bounce_bytes): 4000
  const auto m = with_nvme(box(), 1e9, 1e9, 0, 24000);
  const auto r = sim::run_native(prog, model, m);
  CHECK(r.feasible);
  CHECK(r.host.nvme_bytes == 24000);
  CHECK(r.host.master_weights_bytes == 0);
  CHECK(r.host.optimizer_state_bytes == 0);
  CHECK(r.host.staging_bytes == 32000 + 4000);
  const auto small = sim::run_native(prog, model, with_nvme(box(), 1e9, 1e9, 0, 23999));
  CHECK_FALSE(small.feasible);
  CHECK(small.infeasible_reason.find("NVMe capacity exceeded") != std::string::npos);
}

TEST_CASE("offload: nvme with 2-byte weights: the masters are in the optimizer state, read and written once") {
  // bf16 layers of 1000 parameters: W = 2000, optimizer state 12000 (m, v and the fp32 masters, as analytic
  // models and bf16 profiles record it). Update reads the 12000 and writes them back with the new 2000-byte
  // device copy: 12000 / 14000 (before, the masters were added again: 16000 / 18000), and reads the 4000-byte FP32
  // gradient the backward swapped out: 16000 / 14000.
  auto model = two_layers(1e-3, 2000, 1000);
  for (auto& L : model.layers) L.optimizer_state_bytes = 12000;
  CHECK(model.master_bytes(0, 1) == 0);
  CHECK(two_layers().master_bytes(0, 1) == 8000);  // fp32: the weights are the masters
  // 4 bytes a parameter whatever the device dtype; without a parameter count, the (fp32) weight bytes
  CHECK(model.optimizer_param_bytes(0) == 4000);
  CHECK(two_layers(1e-3, 4002, 0).optimizer_param_bytes(1) == 4002);
  core::Plan p = plan_of("zero-infinity", 1, 1);
  p.knobs.offload = core::OffloadTier::Nvme;
  int updates = 0;
  const core::Program prog = core::lower_plan(p, model);
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    if (prog.ops[i].kind != OpKind::Update) continue;
    ++updates;
    CHECK(prog.cost.op(static_cast<int>(i)).nvme_read_bytes == 16000);
    CHECK(prog.cost.op(static_cast<int>(i)).nvme_write_bytes == 14000);
  }
  CHECK(updates == 2);
}

TEST_CASE("zero3-opt-offload with nvme: the state in and out, the FP32 gradient in, no device copy written") {
  // as above, but the parameters stay on the GPUs: DeepSpeed writes the GPU-dtype copy to NVMe only under
  // offload_param: nvme (stage3.py 957-976), so the update writes the 12000 of state alone
  auto model = two_layers(1e-3, 2000, 1000);
  for (auto& L : model.layers) L.optimizer_state_bytes = 12000;
  core::Plan p = plan_of("zero3-opt-offload", 1, 1);
  p.knobs.offload = core::OffloadTier::Nvme;
  int updates = 0;
  const core::Program prog = core::lower_plan(p, model);
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    const auto& c = prog.cost.op(static_cast<int>(i));
    if (prog.ops[i].kind == OpKind::WB) CHECK(c.nvme_read_bytes == 0);  // the updated shard up from host memory
    if (prog.ops[i].kind != OpKind::Update) continue;
    ++updates;
    CHECK(c.nvme_read_bytes == 16000);
    CHECK(c.nvme_write_bytes == 12000);
  }
  CHECK(updates == 2);
}

TEST_CASE("plan.zero3.pipeline_read / pipeline_write: the optimizer swapper's I/O overlaps the step, no more") {
  // zero3-opt-offload: the whole read (state, masters, FP32 gradient: 16000) and the state's write (12000) overlap.
  // zero-infinity on 2-byte weights: the read (16000: state 12000 with the masters, FP32 gradient 4000) overlaps, and
  // of the write (14000) the state's 12000; the GPU-dtype parameters (2000) are the parameter swapper's, after it.
  auto model = two_layers(1e-3, 2000, 1000);
  for (auto& L : model.layers) L.optimizer_state_bytes = 12000;
  for (const char* kind : {"zero3-opt-offload", "zero-infinity"}) {
    CAPTURE(kind);
    core::Plan p = plan_of(kind, 1, 1);
    p.knobs.offload = core::OffloadTier::Nvme;
    p.knobs.zero3.pipeline_read = true;
    p.knobs.zero3.pipeline_write = true;
    const core::Program prog = core::lower_plan(p, model);
    p.knobs.zero3.pipeline_write = false;
    const core::Program read_only = core::lower_plan(p, model);
    p.knobs.offload = core::OffloadTier::Cpu;  // no NVMe tier: nothing to overlap
    p.knobs.zero3.pipeline_write = true;
    const core::Program cpu = core::lower_plan(p, model);
    int updates = 0;
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const auto& c = prog.cost.op(static_cast<int>(i));
      const auto& r = read_only.cost.op(static_cast<int>(i));
      CHECK(cpu.cost.op(static_cast<int>(i)).nvme_read_overlap_bytes == 0);
      CHECK(cpu.cost.op(static_cast<int>(i)).nvme_write_overlap_bytes == 0);
      if (prog.ops[i].kind != OpKind::Update) {
        CHECK(c.nvme_read_overlap_bytes + c.nvme_write_overlap_bytes == 0);
        continue;
      }
      ++updates;
      CHECK(c.nvme_read_overlap_bytes == 16000);
      CHECK(c.nvme_write_overlap_bytes == 12000);
      CHECK(c.nvme_write_bytes == (std::string(kind) == "zero-infinity" ? 14000 : 12000));
      CHECK(r.nvme_read_overlap_bytes == 16000);
      CHECK(r.nvme_write_overlap_bytes == 0);
    }
    CHECK(updates == 2);
    // priced: the pipelined step is shorter, and the drives move the same bytes
    const auto m = with_nvme(box(), 1e6, 1e6, 0);
    const auto serial_p = [&] {
      core::Plan q = plan_of(kind, 1, 1);
      q.knobs.offload = core::OffloadTier::Nvme;
      return core::lower_plan(q, model);
    }();
    const auto a = sim::run_native(serial_p, model, m);
    const auto b2 = sim::run_native(prog, model, m);
    CHECK(makespan(b2) < makespan(a));
    CHECK(b2.link_stats[z(b2.graph.nvme_read)].bytes == a.link_stats[z(a.graph.nvme_read)].bytes);
    CHECK(b2.link_stats[z(b2.graph.nvme_write)].bytes == a.link_stats[z(a.graph.nvme_write)].bytes);
  }
}

// Harmony-PP on one GPU, two fp32 layers (W = 4000, state 8000 each), minibatch 2 at u = 1, backward packs
// [[0], [1]] and forward pack [[0]].
core::Program harmony_two_packs(const core::Model& model, bool nvme) {
  core::Plan plan;
  plan.kind = core::plan_kind("harmony-pp");
  plan.gpus = 1;
  plan.minibatch = 2;
  plan.u_fwd = 1;
  plan.u_bwd = 1;
  plan.packs_fwd = {{0, 0}};
  plan.packs_bwd = {{0, 0}, {1, 1}};
  core::LowerOptions lo;
  lo.offload_nvme = nvme;
  return core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), model, lo);
}

TEST_CASE("Harmony offload: nvme: each pack's WB reads its weights from the drives, each Update its state") {
  // WBs: forward pack [0], backward packs [1] and [0]: 3 x 4000 = 12000 bytes read from NVMe, once per pack
  // per pass (not per microbatch: the pack's weights stay on the GPU over both microbatches). Updates: one per
  // backward pack, state 8000 + masters 4000 = 12000 read and written back.
  const auto model = two_layers();
  const auto prog = harmony_two_packs(model, true);
  CHECK(prog.cost.offload_nvme);
  Bytes wb_reads = 0;
  int wbs = 0, updates = 0;
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    const core::Op& o = prog.ops[i];
    const core::NativeOpCosts& c = prog.cost.op(static_cast<int>(i));
    if (o.kind == OpKind::WB) {
      ++wbs;
      wb_reads += c.nvme_read_bytes;
    }
    if (o.kind == OpKind::Update) {
      ++updates;
      CHECK(c.nvme_read_bytes == 12000);
      CHECK(c.nvme_write_bytes == 12000);
    }
  }
  CHECK(wbs == 3);
  CHECK(wb_reads == 12000);
  CHECK(updates == 2);
  const auto cpu = harmony_two_packs(model, false);
  for (const auto& c : cpu.cost.op_costs) CHECK(c.nvme_read_bytes + c.nvme_write_bytes == 0);
  // The host keeps gradients and buffers only; the drives hold masters 8000 + state 16000. With slow drives
  // (1e6 B/s, no latency) the step pays at least the reads of the first WB (4 ms) and both updates' reads and
  // writes (4 x 12 ms) on top of the CPU-tier step.
  const auto m = with_nvme(box(), 1e6, 1e6, 0, 24000);
  const auto r = sim::run_native(prog, model, m);
  REQUIRE(r.feasible);
  CHECK(r.host.nvme_bytes == 24000);
  CHECK(r.host.master_weights_bytes == 0);
  CHECK(r.host.optimizer_state_bytes == 0);
  const auto base = sim::run_native(cpu, model, m);
  REQUIRE(base.feasible);
  CHECK(makespan(r) >= makespan(base) + 4 * kMs + 4 * 12 * kMs);
  CHECK_FALSE(sim::run_native(prog, model, with_nvme(box(), 1e6, 1e6, 0, 23999)).feasible);
}

TEST_CASE("compare: Harmony moves to offload nvme only when host memory binds, or when search.offload says so") {
  // Eight fp32 layers: on the CPU tier the host holds masters 32000 + state 64000 + gradients 32000 and more;
  // with 100000 bytes no Harmony plan fits there, every miss is host memory, and on the drives they fit.
  const auto model = two_layers(1e-3, 4000, 1000, 8);
  auto m = with_nvme(box(), 1e9, 1e9, 0);
  m.gpu_memory_bytes = core::kGiB;
  m.topology.host_memory_bytes = 100000;
  core::SearchSpec search;
  const auto kr = sim::best_plan_of_kind(core::plan_kind("harmony-pp"), model, m, 1, 2, core::CostModelKind::Native,
                                         search, core::Options{});
  INFO(kr.reason);
  REQUIRE(kr.feasible);
  CHECK(kr.offload == "nvme");
  CHECK(kr.best.host_memory.master_weights_bytes == 0);  // on the drives
  CHECK(kr.best.host_memory.optimizer_state_bytes == 0);
  // room on the host: the CPU tier, as before
  m.topology.host_memory_bytes = 1'000'000;
  const auto cpu = sim::best_plan_of_kind(core::plan_kind("harmony-pp"), model, m, 1, 2, core::CostModelKind::Native,
                                          search, core::Options{});
  REQUIRE(cpu.feasible);
  CHECK(cpu.offload.empty());
  // search.offload: nvme pins the drives; cpu never falls back
  search.offload = core::SearchSpec::Offload::Nvme;
  const auto nv = sim::best_plan_of_kind(core::plan_kind("harmony-dp"), model, m, 1, 2, core::CostModelKind::Native,
                                         search, core::Options{});
  REQUIRE(nv.feasible);
  CHECK(nv.offload == "nvme");
  search.offload = core::SearchSpec::Offload::Cpu;
  m.topology.host_memory_bytes = 100000;
  const auto no = sim::best_plan_of_kind(core::plan_kind("harmony-pp"), model, m, 1, 2, core::CostModelKind::Native,
                                         search, core::Options{});
  CHECK_FALSE(no.feasible);
  CHECK(no.offload.empty());
}

TEST_CASE("compare: zero-infinity falls back to offload nvme when host memory is the binding limit") {
  // Eight fp32 layers of 1000 parameters; host memory for cpu offload: masters 32000 + state 64000 +
  // gradients 32000 = 128000 bytes. With 100000 bytes of host memory no cpu plan fits; with nvme the host
  // keeps the gradients (32000) and two 16000-byte buffers (state and masters 12000, the FP32 gradient 4000) = 64000.
  const auto model = two_layers(1e-3, 4000, 1000, 8);
  auto m = with_nvme(box(), 1e9, 1e9, 0);
  m.gpu_memory_bytes = core::kGiB;
  m.topology.host_memory_bytes = 100000;
  core::SearchSpec search;
  const auto kr = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, m, 1, 1, core::CostModelKind::Native,
                                         search, core::Options{});
  REQUIRE(kr.feasible);
  CHECK(kr.offload == "nvme");
  CHECK(kr.plan->knobs.offload == core::OffloadTier::Nvme);
  CHECK(kr.best.host_memory.total_bytes() == 64000);
  // with enough host memory it stays on the CPU tier
  m.topology.host_memory_bytes = 200000;
  const auto cpu = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, m, 1, 1, core::CostModelKind::Native,
                                          search, core::Options{});
  REQUIRE(cpu.feasible);
  CHECK(cpu.offload == "cpu");
}

TEST_CASE("compare: search.offload pins zero-infinity's tier (cpu never falls back, nvme even when host fits)") {
  const auto model = two_layers(1e-3, 4000, 1000, 8);
  auto m = with_nvme(box(), 1e9, 1e9, 0);
  m.gpu_memory_bytes = core::kGiB;
  m.topology.host_memory_bytes = 200000;  // the cpu tier fits (128000 bytes, the case above)
  core::SearchSpec search;
  search.offload = core::SearchSpec::Offload::Nvme;
  const auto nv = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, m, 1, 1, core::CostModelKind::Native,
                                         search, core::Options{});
  REQUIRE(nv.feasible);
  CHECK(nv.offload == "nvme");
  CHECK(nv.best.host_memory.total_bytes() == 64000);
  // the reference model has no NVMe tier, nor does a machine without topology.nvme: not applicable, said why
  const auto ref = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, m, 1, 1,
                                          core::CostModelKind::Reference, search, core::Options{});
  CHECK_FALSE(ref.feasible);
  CHECK(ref.reason.find("native cost model") != std::string::npos);
  auto plain = box();
  plain.gpu_memory_bytes = core::kGiB;
  const auto none = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, plain, 1, 1,
                                           core::CostModelKind::Native, search, core::Options{});
  CHECK_FALSE(none.feasible);
  CHECK(none.reason.find("no topology.nvme") != std::string::npos);
  // cpu: with 100000 bytes of host memory no cpu plan fits, and there is no fallback to the drives
  search.offload = core::SearchSpec::Offload::Cpu;
  m.topology.host_memory_bytes = 100000;
  const auto cpu = sim::best_plan_of_kind(core::plan_kind("zero-infinity"), model, m, 1, 1, core::CostModelKind::Native,
                                          search, core::Options{});
  CHECK_FALSE(cpu.feasible);
  CHECK(cpu.offload != "nvme");
}

// Host work across processes (issue 35, gap 1): N data-parallel processes on one host share its cores, and the
// systems do not multiply the optimizer work by N. Two fp32 layers whose CPU update (0.1 s with every core) dwarfs
// their compute (1 ms forward, 3 ms backward); one microbatch of 1 sample per GPU, minibatch N.
namespace {
core::MachineSpec box_of(int gpus) {
  core::MachineSpec m = box();
  m.gpus = gpus;
  m.topology.gpus.assign(static_cast<std::size_t>(gpus), core::GpuSpec{0, 4e9, 1, 1});
  return m;
}

TimePs host_bound_step(const char* kind, int gpus, const core::Model& model) {
  core::Plan p = plan_of(kind, gpus, gpus);
  const auto prog = core::lower_plan(p, model);
  const auto r = sim::run_native(prog, model, box_of(gpus));
  REQUIRE(r.feasible);
  return makespan(r);
}
}  // namespace

TEST_CASE("lohan: the replicas share one optimizer pass, so the host-bound step does not grow with N") {
  // LoHan's N processes step every parameter once per iteration (one pass, as on one GPU; core/kinds/lohan.cpp):
  // 2 updates of 0.1 s, whatever N. Before issue 35 every replica ran both, 2N updates sharing the 8 cores: a
  // 4-GPU step took about 4x the one-GPU step.
  const auto model = two_layers(0.1);
  const TimePs one = host_bound_step("lohan", 1, model);
  CHECK(one >= 200 * kMs);  // the two updates, one after the other on the one queue
  for (int n : {2, 4}) {
    CAPTURE(n);
    const TimePs t = host_bound_step("lohan", n, model);
    CHECK(t >= 200 * kMs);
    CHECK(t < one + 20 * kMs);  // the GPU side (4 ms per layer) and the all-reduces, not another pass
  }
}

TEST_CASE("zero-infinity: N processes' partitioned CPU Adam shares the host's cores, never beating one process") {
  // DeepSpeed ZeRO-3 Offload: each rank steps its 1/N partition with its own CPU Adam threads on the same cores
  // (stage3.py _optimizer_step over fp32_partitioned_groups_flat): the N steps together are the one-process total,
  // 0.2 s, however the work is divided (here whole layers on rank l mod N, processor-shared on the 8 cores).
  const auto model = two_layers(0.1);
  const TimePs one = host_bound_step("zero-infinity", 1, model);
  CHECK(one >= 200 * kMs);
  for (int n : {2, 4}) {
    CAPTURE(n);
    const TimePs t = host_bound_step("zero-infinity", n, model);
    CHECK(t >= 200 * kMs);      // N processes on one host's cores: no faster than one doing all the work
    CHECK(t < one + 20 * kMs);  // and no slower: the optimizer work is divided, not repeated
  }
}
