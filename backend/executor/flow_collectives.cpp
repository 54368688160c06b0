// FlowInterpreter's sharded collectives for every kind (flow_interpreter.hpp): the all-gather of a layer's weights
// from its ranks' shards (AG) and the reduce-scatter of its gradient into them (RS), each member's tensors as its
// dataflow names them (or a sharded resident kind's ShardStates hold them), on the devices or through the host.
#include <algorithm>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

void FlowInterpreter::run_ag(const std::vector<int>& g) {
  const int l = at(g.front()).layers.first;
  if (layout
          .whole_weights) {  // into the ShardStates' whole copies, which the next step reads (nothing made in `store`)
    for (const int a : g) gather_whole(a, l, at(a).device, g);
    return;
  }
  std::vector<FlowData*> full;  // every member's copy of the layer (what it writes)
  full.reserve(g.size());
  for (const int a : g) full.push_back(&make(a, flow(a).writes[0], m.param_floats(l) * es));
  // Each rank's stream copies its shard (what it reads) into every rank's copy; every member's stream then waits for
  // the others (record_group), so what reads a full copy follows all the copies into it.
  // A sharded resident kind's shards are its ShardStates'.
  for (const int a : g) {
    const int r = at(a).device;
    if (!shards.empty() && m.tied() && l == m.head_layer()) gather_twin(a, r, g, full);
    if (gathered_len(l, r) == 0) continue;
    const void* src = !shards.empty() ? shards[static_cast<std::size_t>(r)]->weights(l)
                      : carries(r, l) ? carried_at(r, l)
                                      : store.get(a, flow(a).reads[0]).data();
    for (std::size_t q = 0; q < g.size(); ++q) {
      const int dq = at(g[q]).device;
      D(r).copy_d2d(S(a), full[q]->buf.as<std::byte>() + shard_first(l, r) * es, src, gathered_len(l, r) * es, &D(dq));
      full[q]->users.push_back(a);
    }
  }
}

void FlowInterpreter::run_rs(const std::vector<int>& g) {
  const int l = at(g.front()).layers.first;
  const std::int64_t count = m.param_floats(l);
  const Bytes shard_bytes = std::max<std::int64_t>(1, shard_floats(l)) * es;
  const auto last_reader = [&](int a) { return store.last_reader(a, dw_id(a)); };
  if (qr.device_sums(g) && std::all_of(g.begin(), g.end(), last_reader)) {
    std::vector<void*> bufs;
    std::vector<FlowData*> outs;  // each member's shard (zero-infinity; a ShardState's is written in place)
    bufs.reserve(g.size());
    outs.reserve(g.size());
    for (const int a : g) {
      FlowData& full = store.get(a, dw_id(a));
      store.writable(a, dw_id(a));  // true (the last reader): its stream waits
      bufs.push_back(full.data());
      if (shards.empty()) outs.push_back(&make(a, flow(a).writes[0], shard_bytes));
    }
    qr.all_reduce(g, bufs, count, dt);
    for (std::size_t r = 0; r < g.size(); ++r) {
      const int a = g[r], d = at(a).device;
      if (!shards.empty()) {
        reduced_into_shard(a, l, d, bufs[r], nullptr);
      } else if (shard_len(l, d) > 0) {
        D(d).copy_d2d(S(a), outs[r]->data(), static_cast<std::byte*>(bufs[r]) + shard_first(l, d) * es,
                      shard_len(l, d) * es);
      }
    }
    return;
  }
  const auto sum = summed_dw(g, count);
  for (const int a : g) {
    const int d = at(a).device;
    if (!shards.empty()) {
      reduced_into_shard(a, l, d, nullptr, sum);
      continue;
    }
    FlowData& t = make(a, flow(a).writes[0], shard_bytes);
    if (shard_len(l, d) > 0) grads_up(a, d, t.data(), sum, shard_first(l, d), shard_len(l, d));
  }
}

}  // namespace harmony::backend::detail
