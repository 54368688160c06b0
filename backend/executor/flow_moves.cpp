// FlowInterpreter's moves for every kind (flow_interpreter.hpp): the ops that copy one tensor into another between
// host and device or host and host (X, sX, Y, dX, dY, MSGsX, MSGY when not a P2P pair), driven by what the op's
// dataflow says it reads and writes; the step's tokens for an input that reads nothing.
#include <cstring>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

bool FlowInterpreter::is_move(core::OpKind k) {
  using core::OpKind;
  return k == OpKind::X || k == OpKind::sX || k == OpKind::Y || k == OpKind::dX || k == OpKind::dY ||
         k == OpKind::MSGsX || k == OpKind::MSGY;
}

Bytes FlowInterpreter::tensor_bytes(int id) const {
  const core::FlowTensor& t = p.dataflow.tensor(id);
  if (t.kind == core::FlowKind::Saved || t.kind == core::FlowKind::HostSaved)
    return m.act_floats(t.layer, t.n, T, dt) * es;  // a forward's activations
  return Bytes(t.n) * per_sample(t.layer);          // a layer's input (or its gradient) over the samples
}

void FlowInterpreter::run_move(int o) {
  const core::OpFlow& f = flow(o);
  if (f.writes.empty()) throw core::InternalError(fmt::format("executor: op {} moves nothing", label(o)));
  const int to = f.writes[0];
  if (f.reads.empty()) {  // the input of layer 0: the step's token ids
    if (p.dataflow.tensor(to).layer != 0)
      throw BackendError(fmt::format("executor: op {}: unsupported input medium", label(o)));
    tokens_in(o, to, f.s0, f.n);
    return;
  }
  const int from = f.reads[0];
  const bool src_host = core::on_host(p.dataflow.tensor(from).kind);
  const bool dst_host = core::on_host(p.dataflow.tensor(to).kind);
  const Bytes b = tensor_bytes(to);
  Device& d = D(at(o).device);
  const void* src = src_host ? host_src(o, from) : store.get(o, from).data();
  void* dst = dst_host ? host_dst(o, to, b) : make(o, to, b).data();
  if (src_host && dst_host) {
    if (dst != src) std::memcpy(dst, src, static_cast<std::size_t>(b));  // a message within one host: nothing to copy
  } else if (src_host) {
    d.copy_h2d(S(o), dst, src, b);
  } else if (dst_host) {
    d.copy_d2h(S(o), dst, src, b);
  } else {
    throw BackendError(fmt::format("executor: op {} moves a device tensor to a device without a P2P peer", label(o)));
  }
}

}  // namespace harmony::backend::detail
