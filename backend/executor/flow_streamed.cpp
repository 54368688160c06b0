// FlowInterpreter's device updates over host state (flow_interpreter.hpp; host-stream): the update pass's WB brings a
// layer's AdamW state (and a streamed layer's weights and summed gradient) from the HostState to its GPU, the Update
// runs AdamW there (Kernels<S>::adamw, as a resident kind's), the update pass's dWB takes the updated masters and
// moments home; and the order the Program must keep around them, checked when the executor is built.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

using core::OpKind;

FlowInterpreter::OptBlock FlowInterpreter::opt_block(int d, int l) const {
  OptBlock b;
  const Bytes floats = m.param_floats(l) * kF;
  b.m = 0;
  b.v = floats;
  b.master = 2 * floats;
  b.flags = b.master + (dt == DType::BF16 ? floats : 0);
  b.tie = b.flags + static_cast<Bytes>(m.params(l).size()) * 4;
  const bool tie = l == 0 && m.tied() && m.head_layer() != 0 && !carries(d, m.head_layer());
  b.total = b.tie + (tie ? m.params(m.head_layer()).back().numel * es : 0);
  b.tie_numel = tie ? m.params(m.head_layer()).back().numel : 0;
  return b;
}

int FlowInterpreter::written_or_throw(int o, core::FlowKind k) const {
  const int id = written(o, k, at(o).layers.first);
  if (id < 0) throw core::InternalError(fmt::format("executor: op {} writes no {}", label(o), core::flow_kind_name(k)));
  return id;
}

void FlowInterpreter::stream_state_in(int o) {
  const int d = at(o).device, l = at(o).layers.first;
  const OptBlock b = opt_block(d, l);
  const auto owned = static_cast<std::size_t>(DeviceState::owned_floats(m, l));
  auto* opt_state = static_cast<std::byte*>(make(o, written_or_throw(o, core::FlowKind::Opt), b.total).data());
  Device& dev = D(d);
  // only what no copy below writes is zeroed: the flags, and the head's tied part of the moments (zero, as on the
  // host; no update reads it and the dWB takes the owned part home)
  dev.fill_zero(S(o), opt_state + b.flags, b.tie - b.flags);
  if (const Bytes tail = (m.param_floats(l) - static_cast<std::int64_t>(owned)) * kF; tail > 0) {
    dev.fill_zero(S(o), opt_state + b.m + Bytes(owned) * kF, tail);
    dev.fill_zero(S(o), opt_state + b.v + Bytes(owned) * kF, tail);
  }
  dev.copy_h2d(S(o), opt_state + b.m, st.exp_avg(l).data(), Bytes(owned) * kF);
  dev.copy_h2d(S(o), opt_state + b.v, st.exp_avg_sq(l).data(), Bytes(owned) * kF);
  if (dt == DType::BF16) dev.copy_h2d(S(o), opt_state + b.master, st.weights(l).data(), Bytes(owned) * kF);
  if (b.tie_numel > 0) {  // the head's lm_head gradient, which layer 0's update adds to wte's
    const ParamSpec& twin = m.params(m.head_layer()).back();
    const std::vector<std::span<const float>> src{
        st.grads(m.head_layer()).subspan(static_cast<std::size_t>(twin.offset), static_cast<std::size_t>(twin.numel))};
    weights_up(o, opt_state + b.tie, src);
  }
  if (carries(d, l)) return;  // its weights never left the GPU, and its gradient is there
  // a streamed layer: its masters and summed host gradient, without the head's tied lm_head (which no update of the
  // head reads, and which layer 0's dWB rewrites on the host)
  const Bytes bytes = m.param_floats(l) * es;
  const std::vector<std::span<const float>> w{st.weights(l).first(owned)};
  weights_up(o, make(o, written_or_throw(o, core::FlowKind::W), bytes).data(), w);
  const std::vector<std::span<const float>> g{std::as_const(st).grads(l).first(owned)};
  weights_up(o, make(o, written_or_throw(o, core::FlowKind::DW), bytes).data(), g);
}

void FlowInterpreter::device_update(int o) {
  if (dt == DType::BF16) {
    device_update_as<Bf16>(o);
  } else {
    device_update_as<float>(o);
  }
}

template <class E>
void FlowInterpreter::device_update_as(int o) {
  const int d = at(o).device, l = at(o).layers.first, head = m.head_layer();
  const OptBlock b = opt_block(d, l);
  const int w_id = read_of(o, core::FlowKind::W, l), opt_id = read_of(o, core::FlowKind::Opt, l);
  E* w = carries(d, l) ? static_cast<E*>(carried_at(d, l))
                       : static_cast<E*>(update(o, w_id, m.param_floats(l) * es).data());
  auto* opt_state = static_cast<std::byte*>(update(o, opt_id, b.total).data());
  const E* g = static_cast<const E*>(store.get(o, read_of(o, core::FlowKind::DW, l)).data());
  Kernels<E>& k = kernels_of<E>(D(d), "host-stream update");
  const std::int64_t step = st.steps(l) + 1;
  st.set_steps(l, step);
  const auto& ps = m.params(l);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const ParamSpec& p_i = ps[i];
    if (!p_i.tied_to.empty()) continue;  // lm_head: updated through layer 0's wte
    AdamWTensors<E> t;
    auto* master = reinterpret_cast<float*>(opt_state + b.master);
    if constexpr (std::is_same_v<E, Bf16>) {
      t.param = master + p_i.offset;
      t.working = w + p_i.offset;
    } else {
      t.param = w + p_i.offset;
    }
    t.grad = g + p_i.offset;
    t.exp_avg = reinterpret_cast<float*>(opt_state + b.m) + p_i.offset;
    t.exp_avg_sq = reinterpret_cast<float*>(opt_state + b.v) + p_i.offset;
    t.nonfinite = reinterpret_cast<std::int32_t*>(opt_state + b.flags) + i;
    if (l == 0 && m.tied() && p_i.name == m.embedding_name()) {  // the tie: both gradients, the head's copy too
      const ParamSpec& twin = m.params(head).back();
      if (carries(d, head)) {
        FlowData* hg_data = store.peek(tie_grad.at(static_cast<std::size_t>(o)));
        if (hg_data == nullptr)
          throw core::InternalError(fmt::format("executor: op {}: the head's gradient is gone", label(o)));
        hg_data->users.push_back(o);
        t.grad2 = static_cast<const E*>(hg_data->data()) + twin.offset;
        t.twin = static_cast<E*>(carried_at(d, head)) + twin.offset;
      } else {
        t.grad2 = reinterpret_cast<const E*>(opt_state + b.tie);  // brought by the update pass's WB
      }
    }
    k.adamw(S(o), opt.adamw, step, t, p_i.numel);
  }
}

template void FlowInterpreter::device_update_as<float>(int o);
template void FlowInterpreter::device_update_as<Bf16>(int o);

void FlowInterpreter::stream_state_out(int o) {
  const int d = at(o).device, l = at(o).layers.first;
  const OptBlock b = opt_block(d, l);
  const auto owned = static_cast<std::size_t>(DeviceState::owned_floats(m, l));
  const auto* opt_state = static_cast<const std::byte*>(store.get(o, read_of(o, core::FlowKind::Opt, l)).data());
  Device& dev = D(d);
  if (dt == DType::BF16) {
    dev.copy_d2h(S(o), st.weights(l).data(), opt_state + b.master, Bytes(owned) * kF);
  } else {
    const void* w = carries(d, l) ? carried_at(d, l) : store.get(o, read_of(o, core::FlowKind::W, l)).data();
    dev.copy_d2h(S(o), st.weights(l).data(), w, Bytes(owned) * kF);
  }
  dev.copy_d2h(S(o), st.exp_avg(l).data(), opt_state + b.m, Bytes(owned) * kF);
  dev.copy_d2h(S(o), st.exp_avg_sq(l).data(), opt_state + b.v, Bytes(owned) * kF);
  std::vector<std::int32_t> flags(m.params(l).size());
  dev.copy_d2h(S(o), flags.data(), opt_state + b.flags, Bytes(flags.size()) * 4);
  sync(o);                                 // the host reads the flags, and layer 0's masters for the tie
  std::optional<NonFiniteGradient> found;  // update_layers' rule: the layer's first such parameter, and how many
  for (std::size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == 0) continue;
    if (!found) found = NonFiniteGradient{l, m.params(l)[i].name, 0};
    ++found->params;
  }
  note_nonfinite(found);
  // the head's lm_head master is wte's again, as update_layers leaves it: a copy of the embedding (150 MB for GPT-2's)
  // made with the interpreter's lock released, as no other op touches either until the next step (the head's update
  // pass WB reads its block less lm_head; check_streamed_updates orders the WBs that read all of it before this op)
  if (l == 0 && m.tied()) unlocked([&] { st.sync_tied(); });
}

void FlowInterpreter::check_streamed_updates(const Ancestry& anc) {
  const std::map<std::pair<int, int>, int> upd = device_updates();
  const int head = m.head_layer();
  const bool tied = m.tied() && head != 0;
  std::map<std::pair<int, int>, int> in, out;  // (device, layer) -> the update pass's WB, dWB
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind == OpKind::Update && core::host_update(op))
      throw BackendError(fmt::format("executor: op {}: a Program that updates on the GPUs updates every layer there",
                                     label(static_cast<int>(o))));
    if (flow(static_cast<int>(o)).pass != core::Pass::Update) continue;
    if (op.kind == OpKind::WB) in[{op.device, op.layers.first}] = static_cast<int>(o);
    if (op.kind == OpKind::dWB) out[{op.device, op.layers.first}] = static_cast<int>(o);
  }
  const auto must_precede = [&](int a, int b, const std::string& why) {
    if (!anc.before(a, b))
      throw ScheduleViolation(
          fmt::format("executor: op {} {} op {}, on which it does not depend", label(b), why, label(a)));
  };
  tie_grad.assign(p.ops.size(), FlowVersion{});
  for (const auto& [key, u] : upd) {
    const auto [d, l] = key;
    const auto i = in.find(key), x = out.find(key);
    if (i == in.end() || x == out.end())
      throw BackendError(
          fmt::format("executor: op {} updates layer {} on GPU {} without an update pass WB and dWB "
                      "around it (its state comes from the host and goes back)",
                      label(u), l, d));
    for (std::size_t o = 0; o < p.ops.size(); ++o) {
      const core::Op& op = p.ops[o];
      const int r = static_cast<int>(o);
      if (op.device != d || flow(r).pass == core::Pass::Update) continue;
      const bool compute = op.kind == OpKind::FWD || op.kind == OpKind::REC || op.kind == OpKind::BWD;
      // the update rewrites a carried layer's weights in place (layer 0's also the head's tied lm_head)
      const bool rewrites = carries(d, l) && (op.layers.first == l || (tied && l == 0 && op.layers.first == head));
      if (compute && rewrites) must_precede(r, u, fmt::format("rewrites layer {}'s weights that", op.layers.first));
      // the dWB takes the masters home over what a WB of the forward or backward reads
      if (op.kind == OpKind::WB && (op.layers.first == l || (tied && l == 0 && op.layers.first == head)))
        must_precede(r, x->second, fmt::format("overwrites the host weights of layer {} that", op.layers.first));
    }
    // a streamed layer's WB brings the host gradient every writer has completed (layer 0's also the head's, tied)
    std::vector<int> ranges;
    if (!carries(d, l)) ranges.push_back(l);
    if (tied && l == 0 && !carries(d, head)) ranges.push_back(head);
    for (const int t : ranges)
      if (const auto it = hg.writers.find({t, t}); it != hg.writers.end())
        for (const int w : it->second)
          must_precede(w, i->second, fmt::format("brings layer {}'s host gradient before", t));
    if (!(tied && l == 0 && carries(d, head))) continue;
    // the tie's gradient on the GPU: the head's, as its last backward left it, read by the head's own update after
    const int id = p.dataflow.find(core::FlowTensor{d, core::FlowKind::DW, head, 0, 0});
    const auto hu = upd.find({d, head});
    if (id < 0 || hu == upd.end())
      throw BackendError(fmt::format("executor: op {}: no gradient of the head for the tied embedding", label(u)));
    const FlowVersion v{id, versions.reaching(anc, u, id)};
    const auto& reads = versions.reads(hu->second);
    if (!anc.before(u, hu->second) || std::find(reads.begin(), reads.end(), v) == reads.end())
      throw ScheduleViolation(
          fmt::format("executor: op {} adds the head's lm_head gradient that op {} reads, which "
                      "must update the head after it",
                      label(u), label(hu->second)));
    tie_grad[static_cast<std::size_t>(u)] = v;
  }
}

}  // namespace harmony::backend::detail
