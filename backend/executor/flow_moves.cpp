// FlowInterpreter's moves for every kind (flow_interpreter.hpp): the ops that copy one tensor into another between
// host and device or host and host (X, sX, Y, dX, dY, MSGsX, MSGY when not a P2P pair), driven by what the op's
// dataflow says it reads and writes; the step's tokens for an input that reads nothing.
#include <cstring>
#include <set>

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

const char* FlowInterpreter::channel_name(core::FlowKind k) {
  switch (k) {
    case core::FlowKind::HostY:
      return "host Y";
    case core::FlowKind::HostYMsg:
      return "host Y msg";
    case core::FlowKind::HostStash:
      return "host stash";
    case core::FlowKind::HostStashMsg:
      return "host stash msg";
    case core::FlowKind::HostGrad:
      return "host dX";
    default:
      return core::flow_kind_name(k);
  }
}

std::set<FlowInterpreter::Channel> FlowInterpreter::channels() const {
  std::set<Channel> r;
  const auto add = [&](int id) {
    if (ranged(p.dataflow.tensor(id))) r.insert(channel_of(p.dataflow.tensor(id)));
  };
  for (const core::OpFlow& f : p.dataflow.ops) {
    for (const int id : f.reads) add(id);
    for (const int id : f.writes) add(id);
  }
  return r;
}

Bytes FlowInterpreter::host_bytes() const {
  Bytes total = 0;
  for (const Channel& c : channels()) total += channel_bytes(c);
  return total;
}

void FlowInterpreter::allocate_host() {
  for (const Channel& c : channels()) {
    ChannelMemory& h = channel_mem[c];
    const core::FlowKind k = std::get<1>(c);
    h.data = D(0).alloc_host(channel_bytes(c), fmt::format("{} {}", channel_name(k), std::get<2>(c)));
    h.metered = MeteredBytes(host_meter, k == core::FlowKind::HostStash ? HostUse::Stash : HostUse::Activations,
                             channel_bytes(c));
  }
}

std::byte* FlowInterpreter::channel_at(const core::FlowTensor& t, int s0) {
  const Channel c = channel_of(t);
  ChannelMemory& h = channel_mem[c];
  if (h.data.bytes() == 0) {  // a channel allocate_host did not foresee
    h.data = D(0).alloc_host(channel_bytes(c), fmt::format("{} {}", channel_name(t.kind), t.layer));
    h.metered = MeteredBytes(host_meter, t.kind == core::FlowKind::HostStash ? HostUse::Stash : HostUse::Activations,
                             channel_bytes(c));
  }
  return h.data.as<std::byte>() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(t.layer));
}

const void* FlowInterpreter::host_src(int o, int id) {
  const core::FlowTensor& t = p.dataflow.tensor(id);
  if (!ranged(t)) return store.get(o, id).data();
  // The runs of samples o reads, each from the version that wrote it; all views of one channel, so the read's samples
  // lie one after another in its buffer.
  const void* first = nullptr;
  for (const FlowVersions::SampleRun& r : versions.sample_reads(o)) {
    if (r.tensor != id) continue;
    const core::FlowTensor& w = p.dataflow.tensor(r.source);
    const std::byte* at = static_cast<const std::byte*>(store.get_run(o, r).data()) +
                          static_cast<std::size_t>(r.s0 - w.s0) * static_cast<std::size_t>(per_sample(t.layer));
    if (first == nullptr) first = at;
  }
  if (first == nullptr)
    throw core::InternalError(
        fmt::format("executor: op {} reads {}, whose samples were not resolved", label(o), versions.name(id)));
  return first;
}

void* FlowInterpreter::host_dst(int o, int id, Bytes bytes) {
  const core::FlowTensor& t = p.dataflow.tensor(id);
  if (!ranged(t)) return make(o, id, bytes).data();
  FlowData view;
  view.view = channel_at(t, t.s0);
  return store.put(o, id, std::move(view)).data();
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
