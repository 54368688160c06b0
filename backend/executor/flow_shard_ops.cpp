// FlowInterpreter's sharded resident state (flow_interpreter.hpp; the fsdp kind over N > 1 GPUs): one ShardState per
// rank, the all-gather's sources and the reduce-scatter's destinations in it (the tied lm_head through wte's shards),
// the device update of a rank's shard, and the checks of the Program's Updates against its AGs and RSs.
#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

using core::OpKind;

void FlowInterpreter::make_shards() {
  const auto weights = layout.whole_weights ? ShardState::Weights::Whole : ShardState::Weights::Shard;
  for (int d = 0; d < p.num_devices(); ++d) {
    shards.push_back(std::make_unique<ShardState>(D(d), state_stream(d), m, dt, d, p.num_devices(), weights));
    shards.back()->upload(state_stream(d), st);
  }
}

std::int64_t FlowInterpreter::gathered_len(int l, int r) const {
  if (shards.empty() || !m.tied() || l != m.head_layer()) return shard_len(l, r);
  const std::int64_t twin = m.params(l).back().offset;  // the tied lm_head, last in the head's block
  return std::clamp<std::int64_t>(twin - shard_first(l, r), 0, shard_len(l, r));
}

void FlowInterpreter::gather_twin(int a, int r, const std::vector<int>& g, const std::vector<FlowData*>& full) {
  const ShardState& sh = *shards[static_cast<std::size_t>(r)];
  if (sh.tie_len() == 0) return;
  const std::int64_t wte = m.params(0).front().offset, twin = m.params(m.head_layer()).back().offset;
  const auto* src = static_cast<const std::byte*>(sh.weights(0)) + (sh.tie_first() - sh.first(0)) * es;
  const std::int64_t at_head = twin + (sh.tie_first() - wte);
  for (std::size_t q = 0; q < g.size(); ++q) {
    D(r).copy_d2d(S(a), full[q]->buf.as<std::byte>() + at_head * es, src, sh.tie_len() * es, &D(at(g[q]).device));
    full[q]->users.push_back(a);
  }
}

void FlowInterpreter::gather_whole(int a, int l, int r, const std::vector<int>& g) {
  const ShardState& sh = *shards[static_cast<std::size_t>(r)];
  const auto at_of = [&](int q, int layer, std::int64_t element) {
    return static_cast<std::byte*>(shards[static_cast<std::size_t>(at(q).device)]->whole_weights(layer)) + element * es;
  };
  if (const std::int64_t n = gathered_len(l, r); n > 0) {
    for (const int q : g) {
      if (at(q).device == r) continue;  // the update wrote the rank's own slice in place
      D(r).copy_d2d(S(a), at_of(q, l, sh.first(l)), sh.weights(l), n * es, &D(at(q).device));
    }
  }
  if (l != 0 || !m.tied() || sh.tie_len() == 0) return;
  // the head's lm_head, wte's twin: element j of lm_head is wte's element j
  const int head = m.head_layer();
  const std::int64_t wte = m.params(0).front().offset, twin = m.params(head).back().offset;
  const std::byte* src = at_of(a, 0, sh.tie_first());
  for (const int q : g)
    D(r).copy_d2d(S(a), at_of(q, head, twin + (sh.tie_first() - wte)), src, sh.tie_len() * es, &D(at(q).device));
}

void FlowInterpreter::shard_put(int a, int d, void* dst, std::int64_t from, std::int64_t n, bool fresh,
                                const void* full, const std::shared_ptr<std::vector<float>>& sum) {
  if (n == 0) return;
  const auto add = [&](const void* src) {
    if (dt == DType::BF16) {
      kernels_of<Bf16>(D(d), "fsdp")
          .add(S(a), static_cast<Bf16*>(dst), static_cast<const Bf16*>(dst), static_cast<const Bf16*>(src), n);
    } else {
      D(d).kernels().add(S(a), static_cast<float*>(dst), static_cast<const float*>(dst), static_cast<const float*>(src),
                         n);
    }
  };
  if (full != nullptr) {
    const auto* src = static_cast<const std::byte*>(full) + from * es;
    if (fresh) {
      D(d).copy_d2d(S(a), dst, src, n * es);
    } else {
      add(src);
    }
    return;
  }
  if (fresh) {
    grads_up(a, d, dst, sum, from, n);
    return;
  }
  Buffer part = alloc_or_wait(D(d), n * es, fmt::format("fsdp reduced dW on {}", D(d).name()));
  grads_up(a, d, part.data(), sum, from, n);
  add(part.data());
  release_after(a, part);
}

void FlowInterpreter::reduced_into_shard(int a, int l, int d, const void* full,
                                         const std::shared_ptr<std::vector<float>>& sum) {
  ShardState& sh = *shards[static_cast<std::size_t>(d)];
  shard_put(a, d, sh.grads(l), sh.first(l), sh.len(l), sh.take_fresh(l), full, sum);
  if (!m.tied() || l != m.head_layer() || sh.tie_len() == 0) return;
  // the head's lm_head gradient over the part of wte this rank updates (element j of lm_head is wte's element j)
  const std::int64_t wte = m.params(0).front().offset, twin = m.params(l).back().offset;
  shard_put(a, d, sh.tie_grads(), twin + (sh.tie_first() - wte), sh.tie_len(), sh.take_fresh(-1), full, sum);
}

void FlowInterpreter::check_shard_updates(const Ancestry& anc) const {
  const int head = m.head_layer();
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind == OpKind::WB || op.kind == OpKind::dWB || op.kind == OpKind::ARD)
      throw BackendError(fmt::format(
          "executor: op {}: a sharded resident Program keeps its shards on the devices, moves none to or from the "
          "host and reduce-scatters its gradients",
          label(static_cast<int>(o))));
    if ((op.kind == OpKind::AG || op.kind == OpKind::RS) && op.layers.first != op.layers.last)
      throw BackendError(
          fmt::format("executor: op {}: a sharded resident Program gathers and reduces one layer at a "
                      "time",
                      label(static_cast<int>(o))));
    if (op.kind == OpKind::Update && (core::host_update(op) || op.layers.first != op.layers.last))
      throw BackendError(
          fmt::format("executor: op {}: a sharded resident Program updates one layer's shard on the "
                      "device",
                      label(static_cast<int>(o))));
  }
  if (layout.whole_weights) {
    check_whole_gathers(anc);
    return;
  }
  const std::map<std::pair<int, int>, int> upd = device_updates();
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::AG && op.kind != OpKind::RS) continue;
    const int l = op.layers.first;
    std::vector<int> layers{l};
    if (m.tied() && l == head && head != 0) layers.push_back(0);  // the tie: wte's shard and its gradient
    for (const int t : layers) {
      const auto it = upd.find({op.device, t});
      if (it == upd.end() || anc.before(static_cast<int>(o), it->second)) continue;
      throw ScheduleViolation(
          fmt::format("executor: op {} updates layer {}'s shard without waiting for op {}, which {}", label(it->second),
                      t, label(static_cast<int>(o)), op.kind == OpKind::AG ? "reads it" : "writes its gradient"));
    }
  }
}

void FlowInterpreter::check_whole_gathers(const Ancestry& anc) const {
  const int head = m.head_layer();
  const std::map<std::pair<int, int>, int> upd = device_updates();
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(m.num_layers()));  // per layer: the ops reading W
  std::vector<std::vector<int>> gathers(static_cast<std::size_t>(m.num_layers()));  // per layer: its AGs
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    const int l = op.layers.first;
    if (op.kind == OpKind::FWD || op.kind == OpKind::REC || op.kind == OpKind::BWD)
      readers[static_cast<std::size_t>(l)].push_back(static_cast<int>(o));
    if (op.kind == OpKind::AG) gathers[static_cast<std::size_t>(l)].push_back(static_cast<int>(o));
    if (op.kind == OpKind::RS) {  // the Update reads the gradient the reduce-scatter writes (the tie's: layer 0's)
      for (const int t : {l, m.tied() && l == head ? 0 : l}) {
        const auto it = upd.find({op.device, t});
        if (it != upd.end() && !anc.before(static_cast<int>(o), it->second))
          throw ScheduleViolation(
              fmt::format("executor: op {} updates layer {}'s shard without waiting for op {}, "
                          "which writes its gradient",
                          label(it->second), t, label(static_cast<int>(o))));
      }
    }
  }
  for (int l = 0; l < m.num_layers(); ++l) {
    for (const int a : gathers[static_cast<std::size_t>(l)]) {
      const auto it = upd.find({at(a).device, l});
      if (it != upd.end() && !anc.before(it->second, a))
        throw ScheduleViolation(
            fmt::format("executor: op {} gathers layer {}'s whole weights before op {} updates them", label(a), l,
                        label(it->second)));
      std::vector<int> layers{l};
      if (l == 0 && m.tied()) layers.push_back(head);  // it writes the head's lm_head too
      for (const int t : layers)
        for (const int r : readers[static_cast<std::size_t>(t)])
          if (!anc.before(r, a))
            throw ScheduleViolation(
                fmt::format("executor: op {} overwrites layer {}'s weights while op {} may still "
                            "read them",
                            label(a), t, label(r)));
    }
  }
}

}  // namespace harmony::backend::detail
