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
