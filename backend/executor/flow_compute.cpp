// FlowInterpreter's compute ops for every kind (flow_interpreter.hpp): the forward and recompute (FWD, REC) over an
// op's layers, driven by its dataflow — its input, the pack its weights cover, what it writes (the next input, the
// saved or recomputed activations, the recompute's inputs) — and the step's losses from the head's forward.
#include <utility>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

int FlowInterpreter::written(int o, core::FlowKind k, int layer) const {
  for (const int id : flow(o).writes)
    if (p.dataflow.tensor(id).kind == k && p.dataflow.tensor(id).layer == layer) return id;
  return -1;
}

bool FlowInterpreter::copies_losses(int o) const {
  // The FWDs that run the head compute the step's losses; in a Program without one (Harmony: the criterion's task
  // recomputes its forward in the backward), its RECs do.
  if (at(o).kind == core::OpKind::FWD) return true;
  for (const core::Op& op : p.ops)
    if (op.kind == core::OpKind::FWD && op.layers.first <= m.head_layer() && m.head_layer() <= op.layers.last)
      return false;
  return true;
}

void FlowInterpreter::forward(int o) {
  if (dt == DType::BF16) {
    forward_as<Bf16>(o);
  } else {
    forward_as<float>(o);
  }
}

template <class E>
void FlowInterpreter::forward_as(int o) {
  const core::Op& op = at(o);
  const core::OpFlow& f = flow(o);
  const int d = op.device, a = op.layers.first, b = op.layers.last, s0 = f.s0, n = f.n;
  // the weights of the op's pack (its dataflow's first read, or a resident kind's state) and its input (the second:
  // the activation, or a REC's stash)
  const void* state = state_weights(o);
  const E* w = static_cast<const E*>(state != nullptr ? state : store.get(o, f.reads[0]).data());
  const void* x = store.get(o, f.reads[1]).data();
  BasicDeviceOps<E> ops(D(d), S(o));
  Buffer targets, tmp_act, prev;
  for (int l = a; l <= b; ++l) {
    const bool head = m.kind(l) == LayerKind::Head;
    LayerArgs<E> args;
    args.B = n;
    args.T = T;
    args.w = w + w_offset(f.layers, l);
    if (l == 0) {
      args.tokens = static_cast<const std::int32_t*>(x);
    } else {
      args.x = static_cast<const E*>(x);
    }
    if (head) {
      release_after(o, targets);
      targets = alloc_or_wait(D(d), Bytes(n) * T * 4, "targets");
      D(d).copy_h2d(S(o), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
      args.targets = targets.as<std::int32_t>();
    }
    // the output: the next layer's input where the op writes it, else a temporary (a REC's, the head's losses)
    Buffer y;
    const int out = l == b ? written(o, core::FlowKind::Act, b + 1) : -1;
    if (out >= 0) {
      args.y = make(o, out, m.output_bytes(l, n, T, dt)).buf.as<E>();
    } else {
      y = alloc_or_wait(D(d), m.output_bytes(l, n, T, dt), head ? "losses" : "y");
      args.y = y.as<E>();
    }
    // the activations the backward reads where the op keeps them (a REC's, a FWD's under keep), else a temporary
    int keep = written(o, core::FlowKind::Saved, l);
    if (keep < 0) keep = written(o, core::FlowKind::RecAct, l);
    if (keep >= 0) {
      args.act = make(o, keep, m.act_floats(l, n, T, dt) * es).buf.as<E>();
    } else {
      Buffer next_act = alloc_or_wait(D(d), m.act_floats(l, n, T, dt) * es, "act");
      release_after(o, tmp_act);  // the previous layer's, after its kernels
      tmp_act = std::move(next_act);
      args.act = tmp_act.as<E>();
    }
    m.forward(ops, l, args);
    if (head && copies_losses(o)) {  // read by end_step, after every stream has run
      D(d).copy_d2h(S(o), losses.data() + static_cast<std::size_t>(s0) * T, args.y, Bytes(n) * T * kF);
      for (int s = s0; s < s0 + n; ++s) ++loss_written[static_cast<std::size_t>(s)];
    }
    if (l < b) {  // the next layer's input: kept for the backward where the op writes it (a REC's)
      const int next = written(o, core::FlowKind::RecX, l + 1);
      if (next >= 0) {
        FlowData& nx = make(o, next, m.output_bytes(l, n, T, dt));
        D(d).copy_d2d(S(o), nx.data(), y.data(), m.output_bytes(l, n, T, dt));
        x = nx.data();
      } else {
        release_after(o, prev);
        prev = std::move(y);
        x = prev.data();
      }
    }
    release_after(o, y);
  }
  // No host wait: the temporaries are freed after the kernels that use them, in stream order.
  for (Buffer* t : {&targets, &tmp_act, &prev}) release_after(o, *t);
}

double FlowInterpreter::mean_loss() const {
  for (int s = 0; s < B; ++s)
    if (loss_written[static_cast<std::size_t>(s)] != 1)
      throw BackendError(fmt::format("executor: the Program's head forwards computed the loss of sample {} {} times", s,
                                     static_cast<int>(loss_written[static_cast<std::size_t>(s)])));
  double total = 0.0;
  for (const float x : losses) total += x;
  return total / static_cast<double>(losses.size());
}

}  // namespace harmony::backend::detail
