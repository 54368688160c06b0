// FlowInterpreter's carried parameters (flow_interpreter.hpp): for a kind without resident state whose Program sends
// the updated weights up in the update pass for the next step (zero3-opt-offload: each GPU's parameter shard, or over
// one GPU the whole layer), the per-device buffers that hold them across steps, their fill and refresh from the host
// masters, and the order the Program must keep around them.
#include <algorithm>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

using core::OpKind;

namespace {

// The elements of layer l a device carries: its rank's shard (WShard; at least one) or the whole layer.
std::int64_t carried_floats(const Gpt2& model, core::FlowKind kind, int l, int ranks) {
  return kind == core::FlowKind::WShard ? std::max<std::int64_t>(1, ShardState::shard_floats(model, l, ranks))
                                        : model.param_floats(l);
}

}  // namespace

void* FlowInterpreter::carried_at(int d, int l) {
  Buffer& b = carried_w.at(static_cast<std::size_t>(d)).at(static_cast<std::size_t>(l));
  if (b.data() == nullptr)
    throw core::InternalError(fmt::format("executor: GPU {} carries no weights of layer {}", d, l));
  return b.data();
}

void FlowInterpreter::make_carried() {
  carried_w.resize(static_cast<std::size_t>(p.num_devices()));
  for (auto& per_device : carried_w) per_device.resize(static_cast<std::size_t>(m.num_layers()));
  std::vector<int> filled;
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    // each carried buffer is filled through its layer's update-pass WB (its queue's staging)
    if (op.kind != OpKind::WB || flow(static_cast<int>(o)).pass != core::Pass::Update) continue;
    const int d = op.device, l = op.layers.first;
    if (!carries(d, l)) continue;
    const std::int64_t n = carried_floats(m, *layout.carried, l, p.num_devices());
    carried_w[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)] =
        alloc_or_wait(D(d), n * es, fmt::format("carried W L{} on {}", l, D(d).name()));
    filled.push_back(static_cast<int>(o));
  }
  // filled in the Program's order: layer 0's refresh of the tied lm_head then follows the head's own fill
  std::sort(filled.begin(), filled.end(), [&](int a, int b) { return at(a).layers.first > at(b).layers.first; });
  {
    const std::lock_guard lock(mutex());  // the bf16 staging rounds with the interpreter's lock released
    for (const int o : filled) carried_up(o);
  }
  qr.synchronize();
}

void FlowInterpreter::carried_up(int o) {
  const int d = at(o).device, l = at(o).layers.first;
  const bool shard = *layout.carried == core::FlowKind::WShard;
  // the part of layer `layer`'s block device d carries: its shard, or all of it
  const auto part = [&](int layer) {
    return shard ? std::pair{shard_first(layer, d), shard_len(layer, d)}
                 : std::pair{std::int64_t{0}, m.param_floats(layer)};
  };
  if (const auto [first, n] = part(l); n > 0) {
    const std::vector<std::span<const float>> src{
        st.weights(l).subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(n))};
    weights_up(o, carried_at(d, l), src);
  }
  const int head = m.head_layer();
  if (l != 0 || !m.tied() || !carries(d, head)) return;
  // the tied lm_head (the head's last parameter, wte's twin), which layer 0's host update rewrote
  const ParamSpec& twin = m.params(head).back();
  const auto [first, n] = part(head);
  const std::int64_t lo = std::max(first, twin.offset), hi = std::min(first + n, twin.offset + twin.numel);
  if (hi <= lo) return;
  const std::vector<std::span<const float>> src{
      st.weights(head).subspan(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi - lo))};
  weights_up(o, static_cast<std::byte*>(carried_at(d, head)) + (lo - first) * es, src);
}

void FlowInterpreter::check_carried(const Ancestry& anc) const {
  const int head = m.head_layer();
  const bool shard = *layout.carried == core::FlowKind::WShard;
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(m.num_layers()));  // per layer: carried readers
  std::vector<std::vector<int>> updates(static_cast<std::size_t>(m.num_layers()));  // per layer: its Updates
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    const bool reads =
        shard ? op.kind == OpKind::AG : op.kind == OpKind::FWD || op.kind == OpKind::REC || op.kind == OpKind::BWD;
    for (int l = op.layers.first; l <= op.layers.last; ++l) {
      if (reads) readers[static_cast<std::size_t>(l)].push_back(static_cast<int>(o));
      if (op.kind == OpKind::Update) updates[static_cast<std::size_t>(l)].push_back(static_cast<int>(o));
    }
  }
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::WB || p.dataflow.ops[o].pass != core::Pass::Update) continue;
    const int w = static_cast<int>(o), l = op.layers.first;
    // only a WB that writes the carried weights (host-stream's Update rewrites its own: check_streamed_updates)
    const auto& writes = p.dataflow.ops[o].writes;
    if (std::none_of(writes.begin(), writes.end(), [&](int id) {
          const core::FlowTensor& t = p.dataflow.tensor(id);
          return t.kind == *layout.carried && carries(t.device, t.layer);
        }))
      continue;
    for (const int u : updates[static_cast<std::size_t>(l)])
      if (!anc.before(u, w))
        throw ScheduleViolation(
            fmt::format("executor: op {} sends layer {}'s weights up without waiting for op {}, which updates them",
                        label(w), l, label(u)));
    std::vector<int> layers{l};
    if (l == 0 && m.tied() && head != 0) layers.push_back(head);  // it refreshes the head's lm_head too
    for (const int t : layers)
      for (const int r : readers[static_cast<std::size_t>(t)])
        if ((shard || at(r).device == op.device) && !anc.before(r, w))
          throw ScheduleViolation(fmt::format(
              "executor: op {} overwrites GPU {}'s carried weights of layer {} while op {} may still read them",
              label(w), op.device, t, label(r)));
  }
}

}  // namespace harmony::backend::detail

namespace harmony::backend {

Bytes held_between_steps(const core::Program& program, const Gpt2& model, DType dtype, int device) {
  const core::StateLayout s = core::state_layout(program);
  const int ranks = program.num_devices();
  if (s.sharded) {
    const auto weights = s.whole_weights ? detail::ShardState::Weights::Whole : detail::ShardState::Weights::Shard;
    return detail::ShardState::total_bytes(model, dtype, device, ranks, weights);
  }
  if (s.resident) return DeviceState::total_bytes(model, dtype);
  Bytes held = 0;
  if (s.carried)
    for (const int l : s.carried_layers.at(static_cast<std::size_t>(device)))
      held += detail::carried_floats(model, *s.carried, l, ranks) * static_cast<Bytes>(dtype_bytes(dtype));
  return held;
}

}  // namespace harmony::backend
