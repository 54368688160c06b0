// The Harmony interpreter's ops (harmony_interpreter.hpp): a run_* step per op kind it still runs itself (inputs and
// stashes in and out through its host channels, host messages, gradients down, the host AdamW update); weights up,
// the compute ops, deletes, the P2P pair and the all-reduce are FlowInterpreter's.
#include <algorithm>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "backend/bf16_convert.hpp"
#include "backend/executor/harmony_interpreter.hpp"

namespace harmony::backend::detail::harmony_impl {

using core::OpKind;

void HarmonyInterpreter::run_op(int o) {
  const core::Op& op = p.ops[static_cast<std::size_t>(o)];
  switch (op.kind) {
    case OpKind::WB:
      return run_wb(o);
    case OpKind::X:
      return run_x(o, op);
    case OpKind::sX:
      return run_sx(o, op);
    case OpKind::MSGsX:
    case OpKind::MSGY:
      return run_msg(o, op);
    case OpKind::Y:
    case OpKind::dX:
    case OpKind::dY:
      return run_swap(o, op);
    case OpKind::FWD:
    case OpKind::REC:
      return forward(o);
    case OpKind::BWD:
      return backward(o);
    case OpKind::dWB:
      return run_dwb(o, op);
    case OpKind::Update:
      return run_update(o, op);
    default:
      throw BackendError(fmt::format("executor: op {}: kind {} not supported", label(o), core::op_kind_name(op.kind)));
  }
}

void HarmonyInterpreter::run_x(int o, const core::Op& op) {
  const int d = op.device, lf = op.layers.first;
  const auto [s0, n] = samples(o);
  const Bytes b = Bytes(n) * per_sample(lf);
  if (flow(o).layers.first == 0) {  // the task with layer 0: the tokens
    tokens_in(o, tid(o, core::FlowKind::Act, 0, s0, n), s0, n);
  } else if (const core::FlowTensor* h = host_in(o)) {  // a CPU message's or a swap's channel
    const std::byte* src = host_read(o, host_chan(h->kind), lf, s0, n);
    FlowData& x = make(o, tid(o, core::FlowKind::Act, lf, s0, n), b);
    D(d).copy_h2d(S(o), x.buf.data(), src, b);
  } else {
    throw BackendError(fmt::format("executor: op {}: unsupported input medium", label(o)));
  }
}

void HarmonyInterpreter::run_sx(int o, const core::Op& op) {
  const int d = op.device, lf = op.layers.first;
  const auto [s0, n] = samples(o);
  const Bytes b = Bytes(n) * per_sample(lf);
  if (flow(o).pass == core::Pass::Fwd) {  // stash out
    const FlowData& x = store.get(o, tid(o, core::FlowKind::Act, lf, s0, n));
    D(d).copy_d2h(S(o), host_write(o, host_chan(host_out(o)->kind), lf, s0, n), x.buf.data(), b);
  } else {  // stash in (the message's channel, or the stash's where the message stayed on its rank)
    const std::byte* src = host_read(o, host_chan(host_in(o)->kind), lf, s0, n);
    FlowData& x = make(o, tid(o, core::FlowKind::Stash, lf, s0, n), b);
    D(d).copy_h2d(S(o), x.buf.data(), src, b);
  }
}

void HarmonyInterpreter::run_msg(int o, const core::Op& op) {
  const auto [s0, n] = samples(o);
  const int l = op.kind == OpKind::MSGsX ? op.layers.first : op.layers.last + 1;
  const HC from = host_chan(host_in(o)->kind);
  const HC to = host_chan(host_out(o)->kind);
  const std::byte* src = host_read(o, from, l, s0, n);
  std::byte* dst = host_write(o, to, l, s0, n);  // within one rank the same channel (the dataflow's): nothing to copy
  if (dst != src) std::memcpy(dst, src, static_cast<std::size_t>(Bytes(n) * per_sample(l)));
}

void HarmonyInterpreter::run_swap(int o, const core::Op& op) {
  const int d = op.device;
  const int lf = op.layers.first, ll = op.layers.last;
  const auto [s0, n] = samples(o);
  switch (op.kind) {
    case OpKind::Y: {  // swap out (P2P runs as a pair)
      const FlowData& y = store.get(o, tid(o, core::FlowKind::Act, ll + 1, s0, n));
      D(d).copy_d2h(S(o), host_write(o, HC::YSwap, ll + 1, s0, n), y.buf.data(), Bytes(n) * per_sample(ll + 1));
      return;
    }
    case OpKind::dX: {
      const FlowData& g = store.get(o, tid(o, core::FlowKind::Grad, lf, s0, n));
      D(d).copy_d2h(S(o), host_write(o, HC::DXSwap, lf, s0, n), g.buf.data(), Bytes(n) * per_sample(lf));
      return;
    }
    default: {  // dY
      const std::byte* src = host_read(o, HC::DXSwap, ll + 1, s0, n);
      FlowData& g = make(o, tid(o, core::FlowKind::Grad, ll + 1, s0, n), Bytes(n) * per_sample(ll + 1));
      D(d).copy_h2d(S(o), g.buf.data(), src, Bytes(n) * per_sample(ll + 1));
      return;
    }
  }
}

void HarmonyInterpreter::run_dwb(int o, const core::Op& op) {
  const int d = op.device;
  const int lf = op.layers.first, ll = op.layers.last;
  const FlowData& g = store.get(o, task_tid(o, core::FlowKind::DW));
  // Into the host gradient, also for a replica that does not own the pack's Update (Harmony-DP: the same all-reduced
  // values, after the previous replica's dWB: tie_edges)
  if (dt == DType::BF16) {  // the pack's bf16 gradients staged down, widened exactly on the host
    std::vector<std::span<float>> dst;
    for (int l = lf; l <= ll; ++l) dst.push_back(st.grads(l));
    stage_down(qr.queue(o), D(d), S(o), dst, g.buf.data());
  } else {
    for (int l = lf; l <= ll; ++l)
      D(d).copy_d2h(S(o), st.grads(l).data(), g.buf.as<float>() + w_offset(op.layers, l), m.param_floats(l) * kF);
    // no wait: the Update that reads the host gradients waits for this op's event (host_wait)
  }
  for (int l = lf; l <= ll; ++l) grad_producer[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)] = o;
}

void HarmonyInterpreter::run_update(int o, const core::Op& op) {
  const int d = op.device;
  const int lf = op.layers.first, ll = op.layers.last;
  for (int l = lf; l <= ll; ++l) {
    const int g = grad_producer[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)];
    if (g < 0 || !happens_before(g, o))
      throw ScheduleViolation(
          fmt::format("executor: op {} updates layer {} before its gradients reach the host", label(o), l));
  }
  // Harmony-DP: every replica's Update sees the same all-reduced gradients; the shared master copy is
  // updated once per pack, by the owner. AdamW runs unlocked: what it touches (the pack's host weights,
  // gradients and moments; for layer 0 also the head's lm_head gradient and weight) no other op touches
  // until the next step — the deps order the pack's WBs and dWBs before it, tie_edges the head's dWB.
  if (owns_update(op)) unlocked([&] { note_nonfinite(update_layers(st, opt.adamw, lf, ll, qr.adamw(o))); });
}

}  // namespace harmony::backend::detail::harmony_impl
