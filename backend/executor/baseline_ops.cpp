// The baseline interpreter's ops (baseline_interpreter.hpp): weights, inputs, stashes and saved activations moved
// between host and device, the per-layer forward, recompute and backward, gradients to the host and the host AdamW
// update (or the device's, for a resident kind).
#include <algorithm>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "backend/executor/baseline_interpreter.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::backend::detail::baseline_impl {

using core::OpKind;

void BaselineInterpreter::run_op(int o) {
  const core::Op& op = at(o);
  switch (op.kind) {
    case OpKind::WB:
      run_wb(o);
      break;
    case OpKind::FWD:
    case OpKind::REC:
      forward(o);
      break;
    case OpKind::BWD:
      backward(o);
      break;
    case OpKind::dWB:
      grad_to_host(o);
      break;
    case OpKind::Update:
      if (resident_) {
        state_update(o);
      } else {
        host_update(o);
      }
      break;
    default:
      throw BackendError(fmt::format("executor: op {}: kind {} not supported in a baseline Program", label(o),
                                     core::op_kind_name(op.kind)));
  }
  // No host wait: run() records the op's event after its work; what follows waits for that.
}

void BaselineInterpreter::grad_to_host(int o) {
  const core::Op& op = at(o);
  const int d = op.device, l = op.layers.first;
  const std::int64_t first = sharded_ ? shard_first(l, d) : 0;
  const std::int64_t len = sharded_ ? shard_len(l, d) : floats(l);
  const Tensor& g = get(o, Key{d, sharded_ ? TK::DWShard : TK::DW, l, 0, 0});
  float* dst = st.grads(l).data() + first;
  brought_[static_cast<std::size_t>(o)] = 1;
  // A replicated gradient's replicas each write the same sum (the previous replica's is complete: the edges order
  // them), a sharded one's ranks their own shards; the first dWB of each copies, the later ones add
  // (build_update_edges). A replica that does not write lands its copy in the bounce buffer alone.
  const bool writes = writes_host_[static_cast<std::size_t>(o)] != 0;
  const int who = replicated_[static_cast<std::size_t>(l)] != 0 || sharded_ ? d : -1;
  if (writes && written_.insert({l, who}).second) {
    grads_down(o, d, dst, g.buf.data(), len);
    return;
  }
  Bounce& b = bounce_[qr.queue(o)];  // the queue runs one op at a time: its bounce buffer is free
  if (static_cast<std::int64_t>(b.floats.size()) < len) {
    b.metered.reset();
    b.floats.assign(static_cast<std::size_t>(len), 0.0f);
    b.metered = MeteredBytes(host_meter, HostUse::Staging, len * kF);
  }
  grads_down(o, d, b.floats.data(), g.buf.data(), len);
  if (!writes) return;
  for (std::int64_t i = 0; i < len; ++i) dst[i] += b.floats[static_cast<std::size_t>(i)];
}

void BaselineInterpreter::gather_grad(int o, int l, int dev) {
  for (const int g : grad_sources(l, dev))
    if (brought_[static_cast<std::size_t>(g)] == 0)
      throw BackendError(
          fmt::format("executor: op {}: op {} has not brought layer {}'s gradient to the host", label(o), label(g), l));
}

void BaselineInterpreter::host_update(int o) {
  const core::Op& op = at(o);
  const int l = op.layers.first;
  auto gather = [&](int layer) {
    if (gathered_[static_cast<std::size_t>(layer)] != 0) return;
    gather_grad(o, layer, op.device);
    gathered_[static_cast<std::size_t>(layer)] = 1;
  };
  gather(l);
  if (l == 0 && m.head_layer() != 0) gather(m.head_layer());
  if (updated_[static_cast<std::size_t>(l)] != 0) return;
  updated_[static_cast<std::size_t>(l)] = 1;
  unlocked([&] { note_nonfinite(update_layers(st, opt.adamw, l, l, qr.adamw(o))); });
}

}  // namespace harmony::backend::detail::baseline_impl
