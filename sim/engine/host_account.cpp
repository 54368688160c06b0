// The native engine's static host-memory account: host_state (a model's training state), host_floor, host_account
// (a Program's stashes, activations and pinned staging on top), the dWB bounce buffers, and the verdicts against the
// machine's host, pinned and NVMe limits.
#include "sim/engine/host_account.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/plan/plan_kind.hpp"
#include "core/program/host_gradients.hpp"
#include "sim/engine/size_index.hpp"

namespace harmony::sim {

using core::Bytes;
using core::Op;
using core::OpKind;
using core::Program;
using core::Stream;

using engine_detail::z;

bool mixed_precision(const core::Model& m) {
  if (!m.fp32_optimizer) return false;  // pure 2-byte training: the host holds the 2-byte weights and state as they are
  if (m.dtype == "bf16") return true;
  for (int l = 0; l < m.num_layers(); ++l) {
    if (m.narrow_weights(l)) return true;
  }
  return false;
}

HostAccount host_state(const core::Model& m, bool offload_nvme) {
  HostAccount h;
  const bool mixed = mixed_precision(m);
  for (int l = 0; l < m.num_layers(); ++l) {
    const core::Layer& L = m.layers[z(l)];
    if (mixed) {
      // fp32 masters and gradients of every 2-byte device weight (the executor keeps them so: its HostState); the
      // optimizer state's own figure includes the masters (4 bytes a parameter), which count as masters here
      h.master_weights_bytes += 2 * L.weight_bytes + L.buffer_bytes;
      h.optimizer_state_bytes += std::max<Bytes>(0, L.optimizer_state_bytes - 4 * L.param_count);
      h.gradient_bytes += 2 * L.weight_bytes;
    } else {
      h.master_weights_bytes += L.weight_bytes + L.buffer_bytes;
      h.optimizer_state_bytes += L.optimizer_state_bytes;
      h.gradient_bytes += L.weight_bytes;
    }
  }
  if (offload_nvme) {
    // the masters and the optimizer state live on the drives; so does a mixed-precision model's FP32 gradient (ZeRO-
    // Infinity swaps it out at the boundary, the lowering's nvme_write): the host keeps the 2-byte gradient buffer
    h.nvme_bytes = h.master_weights_bytes + h.optimizer_state_bytes;
    h.master_weights_bytes = 0;
    h.optimizer_state_bytes = 0;
    if (mixed) {
      h.nvme_bytes += h.gradient_bytes;
      h.gradient_bytes /= 2;
    }
  }
  return h;
}

HostAccount host_floor(const core::Model& m, core::PlanKind kind, bool offload_nvme) {
  // a kind with resident state keeps its weights, gradients and optimizer state on the GPUs
  return kind->resident_state ? HostAccount{} : host_state(m, offload_nvme);
}

bool host_memory_exceeded(Bytes total_bytes, Bytes host_memory_bytes) {
  return host_memory_bytes > 0 && total_bytes > host_memory_bytes;
}

bool pinned_memory_exceeded(Bytes total_bytes, Bytes optimizer_state_bytes, Bytes pinned_limit_bytes) {
  return pinned_limit_bytes > 0 && total_bytes - optimizer_state_bytes > pinned_limit_bytes;
}

bool host_limits_exceeded(const HostAccount& h, Bytes host_memory_bytes, Bytes pinned_limit_bytes) {
  return host_memory_exceeded(h.total_bytes(), host_memory_bytes) ||
         pinned_memory_exceeded(h.total_bytes(), h.optimizer_state_bytes, pinned_limit_bytes);
}

std::vector<std::string> host_limit_reasons(const HostAccount& h, const core::Topology& topo) {
  std::vector<std::string> reasons;
  if (host_memory_exceeded(h.total_bytes(), topo.host_memory_bytes)) {
    reasons.push_back(fmt::format(
        "host memory exceeded: needs {} (master weights {}, optimizer state {}, gradients {}, stashes "
        "{}, activations {}, pinned staging {}) > capacity {} by {} bytes",
        core::format_bytes(h.total_bytes()), core::format_bytes(h.master_weights_bytes),
        core::format_bytes(h.optimizer_state_bytes), core::format_bytes(h.gradient_bytes),
        core::format_bytes(h.stash_bytes), core::format_bytes(h.activation_bytes), core::format_bytes(h.staging_bytes),
        core::format_bytes(topo.host_memory_bytes), h.total_bytes() - topo.host_memory_bytes));
  }
  if (h.nvme_bytes > 0 && !topo.nvme.present()) {
    reasons.emplace_back(
        "the plan keeps parameters and optimizer state on NVMe (plan.offload: nvme), but the machine has no "
        "NVMe tier (topology.nvme)");
  } else if (topo.nvme.capacity_bytes > 0 && h.nvme_bytes > topo.nvme.capacity_bytes) {
    reasons.push_back(
        fmt::format("NVMe capacity exceeded: master weights and optimizer state need {} > capacity {} by {} bytes",
                    core::format_bytes(h.nvme_bytes), core::format_bytes(topo.nvme.capacity_bytes),
                    h.nvme_bytes - topo.nvme.capacity_bytes));
  }
  if (pinned_memory_exceeded(h.total_bytes(), h.optimizer_state_bytes, topo.pinned_limit_bytes)) {
    const Bytes pinned = h.pinned_bytes();
    reasons.push_back(fmt::format(
        "pinned host memory exceeded: the tensors swaps copy from and into (master weights {}, "
        "gradients {}, stashes {}, activations {}, P2P staging {}) need {} > limit {} by {} bytes",
        core::format_bytes(h.master_weights_bytes), core::format_bytes(h.gradient_bytes),
        core::format_bytes(h.stash_bytes), core::format_bytes(h.activation_bytes), core::format_bytes(h.staging_bytes),
        core::format_bytes(pinned), core::format_bytes(topo.pinned_limit_bytes), pinned - topo.pinned_limit_bytes));
  }
  return reasons;
}

Bytes accumulate_bounce_bytes(const Program& p, bool mixed, Bytes chunk_bytes) {
  // Which dWBs copy straight into a layer's host gradient and which land in their process's bounce buffer (to be added,
  // or dropped: another replica's copy of an all-reduced sum) is core::host_gradients, the rule harmony-run's executor
  // runs (docs/backend.md). A bounce is as large as its process's largest such dWB's chunk, widened to fp32.
  const core::HostGradients hg = core::host_gradients(p);
  const Bytes elem = mixed ? 2 : 4;
  std::vector<Bytes> largest(z(std::max(p.num_devices(), 1)), 0);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::GradWrite w = hg.write[o];
    if (w != core::GradWrite::Add && w != core::GradWrite::Drop) continue;
    const Op& op = p.ops[o];
    const Bytes landed = 4 * core::bounce_chunk_elements((op.bytes + elem - 1) / elem, elem, chunk_bytes);
    if (z(op.device) < largest.size()) largest[z(op.device)] = std::max(largest[z(op.device)], landed);
  }
  Bytes total = 0;
  for (Bytes b : largest) total += b;
  return total;
}

Bytes live_stash_peak_bytes(const Program& p) {
  // A stash (sX out) lives on the host from its swap-out to the last swap-in on the same device that reads it back
  // (an sX in depending on it; l2l reads a boundary activation twice, in the next layer's forward and in the
  // backward); one read by another device's op, or by none, lives to the end of the iteration. Each device's ops run
  // in Program order, so the peak of one device's live stashes is taken in that order: one microbatch's stash for the
  // kinds that finish a microbatch's backward before the next one's forward (dp-swap, pp-swap's stages, host-stream),
  // every microbatch's for those that run a layer or pack over all microbatches first (Harmony, l2l).
  const std::size_t nd = z(std::max(p.num_devices(), 1));
  std::vector<int> last_read(p.ops.size(), -1);  // per sX out: the index of the last same-device sX in reading it
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const Op& o = p.ops[i];
    if (o.kind != OpKind::sX || o.stream != Stream::SwapIn) continue;
    for (const int d : o.deps) {
      const Op& out = p.ops[z(d)];
      if (out.kind == OpKind::sX && out.stream == Stream::SwapOut && out.device == o.device)
        last_read[z(d)] = std::max(last_read[z(d)], static_cast<int>(i));
    }
  }
  std::vector<Bytes> released(p.ops.size(), 0);  // per op: the stash bytes freed after it
  for (std::size_t i = 0; i < p.ops.size(); ++i)
    if (last_read[i] >= 0) released[z(last_read[i])] += p.ops[i].bytes;
  std::vector<Bytes> live(nd, 0), peak(nd, 0);
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const Op& o = p.ops[i];
    const std::size_t d = z(o.device);
    if (d >= nd) continue;
    if (o.kind == OpKind::sX && o.stream == Stream::SwapOut) live[d] += o.bytes;
    peak[d] = std::max(peak[d], live[d]);
    live[d] -= released[i];
  }
  Bytes total = 0;
  for (const Bytes b : peak) total += b;
  return total;
}

HostAccount host_account(const Program& p, const core::Model& m, bool p2p_staged) {
  HostAccount h = host_floor(m, p.graph.plan.kind, p.cost.offload_nvme);
  // Swaps are DMA copies straight from and into the host tensors (the time model prices them at the PCIe
  // rate with no host copy), so those tensors are the pinned memory and need no staging buffer: a staging
  // buffer sized by the largest swap op would grow with how a plan groups layers into one op (a Harmony
  // pack is one WB op, a baseline swaps layer by layer) rather than with the bytes it keeps on the host.
  // Only GPU-to-GPU copies staged through the host (p2p: host) have a buffer of their own.
  const std::size_t nd = z(std::max(p.num_devices(), 1));
  std::vector<Bytes> max_p2p(nd, 0);
  for (const Op& o : p.ops) {
    const std::size_t d = z(o.device);
    if (d >= nd) continue;
    switch (o.stream) {
      case Stream::SwapOut:
        if (o.kind == OpKind::Y || o.kind == OpKind::dX) h.activation_bytes += o.bytes;
        break;
      case Stream::P2POut:
        max_p2p[d] = std::max(max_p2p[d], o.bytes);
        break;
      case Stream::Cpu:
        if (o.kind == OpKind::MSGsX || o.kind == OpKind::MSGY) h.activation_bytes += o.bytes;
        break;
      default:
        break;
    }
  }
  h.stash_bytes = live_stash_peak_bytes(p);
  if (p2p_staged) {
    for (std::size_t d = 0; d < nd; ++d) h.staging_bytes += 2 * max_p2p[d];
  }
  // mixed precision: the bounces hold fp32 sums of 2-byte gradients, and the masters go up and the gradients come
  // back through the staging rings (core::staging_ring_bytes)
  const bool mixed = mixed_precision(m);
  h.staging_bytes += accumulate_bounce_bytes(p, mixed);
  if (mixed && !p.graph.plan.kind->resident_state) h.staging_bytes += core::staging_ring_bytes(p, false);
  if (p.cost.offload_nvme) {
    // each process double-buffers its largest NVMe I/O (a layer's parameter shard or bucket, or a layer's optimizer
    // state and masters: an op's read split over its io_count I/Os) in pinned memory
    std::vector<Bytes> max_read(nd, 0);
    for (std::size_t i = 0; i < p.ops.size(); ++i) {
      const Op& o = p.ops[i];
      const core::NativeOpCosts& c = p.cost.op(static_cast<int>(i));
      const Bytes per_io = (c.nvme_read_bytes + std::max(1, c.io_count) - 1) / std::max(1, c.io_count);
      if (z(o.device) < nd) max_read[z(o.device)] = std::max(max_read[z(o.device)], per_io);
    }
    for (std::size_t d = 0; d < nd; ++d) h.staging_bytes += 2 * max_read[d];
  }
  return h;
}

}  // namespace harmony::sim
