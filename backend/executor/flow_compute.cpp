// FlowInterpreter's compute ops for every kind (flow_interpreter.hpp): the forward, recompute and backward (FWD,
// REC, BWD) over an op's layers, driven by its dataflow — its input, the pack its weights cover, what it reads and
// writes (activations, saved or recomputed activations, the recompute's inputs, gradients) — and the step's losses.
#include <algorithm>
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
  if (f.reads.size() < 2)
    throw core::InternalError(fmt::format("executor: op {} reads no weights and input", label(o)));
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

int FlowInterpreter::read_of(int o, core::FlowKind k, int layer) const {
  for (const int id : flow(o).reads)
    if (p.dataflow.tensor(id).kind == k && p.dataflow.tensor(id).layer == layer) return id;
  return -1;
}

void* FlowInterpreter::backward_dw(int o) {
  if (void* state = state_grads(o)) return state;  // zeroed when the step begins
  int id = -1;
  for (const int w : flow(o).writes)
    if (p.dataflow.tensor(w).kind == core::FlowKind::DW) id = w;
  if (id < 0) throw core::InternalError(fmt::format("executor: op {} writes no weight gradient", label(o)));
  const Bytes bytes = w_offset(flow(o).layers, flow(o).layers.last + 1) * es;
  // the first BWD of a step starts the gradient (the dataflow: it reads none), the later ones add to it
  const auto& reads = flow(o).reads;
  if (std::find(reads.begin(), reads.end(), id) != reads.end()) return update(o, id, bytes).data();
  FlowData& g = make(o, id, bytes);
  D(at(o).device).fill_zero(S(o), g.data(), bytes);
  return g.data();
}

void FlowInterpreter::backward(int o) {
  if (dt == DType::BF16) {
    backward_as<Bf16>(o);
  } else {
    backward_as<float>(o);
  }
}

template <class E>
void FlowInterpreter::backward_as(int o) {
  const core::Op& op = at(o);
  const core::OpFlow& f = flow(o);
  if (f.reads.size() < 2)
    throw core::InternalError(fmt::format("executor: op {} reads no weights and input", label(o)));
  const int d = op.device, lf = op.layers.first, ll = op.layers.last, s0 = f.s0, n = f.n;
  const void* state = state_weights(o);
  const E* w = static_cast<const E*>(state != nullptr ? state : store.get(o, f.reads[0]).data());
  const void* x0 = store.get(o, f.reads[1]).data();  // the stash brought back, or the activation kept or received
  E* dw = static_cast<E*>(backward_dw(o));
  const int dy_id = read_of(o, core::FlowKind::Grad, ll + 1);  // none where the op runs the head
  const E* dy = dy_id >= 0 ? store.get(o, dy_id).buf.as<E>() : nullptr;
  std::int64_t scratch = 1;
  for (int l = lf; l <= ll; ++l) scratch = std::max(scratch, m.scratch_floats(l, n, T));
  Buffer scr = alloc_or_wait(D(d), scratch * es, "scratch"), targets, g_a, g_b;
  // the input gradients passed between the op's layers, in two buffers used in turn: none for one layer (its dX is
  // the Grad tensor it writes), one for two layers
  const Bytes gb = Bytes(n) * T * m.config().n_embd * es;
  if (ll - lf >= 1) g_a = alloc_or_wait(D(d), gb, "dx a");
  if (ll - lf >= 2) g_b = alloc_or_wait(D(d), gb, "dx b");
  if (lf <= m.head_layer() && m.head_layer() <= ll) {
    targets = alloc_or_wait(D(d), Bytes(n) * T * 4, "targets");
    D(d).copy_h2d(S(o), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
  }
  BasicDeviceOps<E> ops(D(d), S(o));
  E* spare = g_a.as<E>();
  E* other = g_b.as<E>();
  for (int l = ll; l >= lf; --l) {
    LayerArgs<E> a;
    a.B = n;
    a.T = T;
    a.w = w + w_offset(f.layers, l);
    a.dw = dw + w_offset(f.layers, l);
    const void* x = l == lf ? x0 : store.get(o, read_of(o, core::FlowKind::RecX, l)).data();
    if (l == 0) {
      a.tokens = static_cast<const std::int32_t*>(x);
    } else {
      a.x = static_cast<const E*>(x);
    }
    a.targets = targets.as<std::int32_t>();
    int act = read_of(o, core::FlowKind::Saved, l);  // the forward's activations: kept, or recomputed
    if (act < 0) act = read_of(o, core::FlowKind::RecAct, l);
    a.act = store.get(o, act).buf.as<E>();
    a.dy = dy;
    a.scratch = scr.as<E>();
    a.loss_scale = 1.0f / static_cast<float>(static_cast<std::size_t>(B) * static_cast<std::size_t>(T));
    E* dx = nullptr;
    if (l > 0) dx = l == lf ? make(o, written(o, core::FlowKind::Grad, lf), gb).buf.as<E>() : spare;
    a.dx = dx;
    m.backward(ops, l, a);
    dy = dx;
    std::swap(spare, other);
  }
  for (Buffer* b : {&scr, &targets, &g_a, &g_b}) release_after(o, *b);  // after the kernels, in stream order
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
