// host_gradients, bounce_chunk_elements and update_owners (host_gradients.hpp): one pass over a Program's dWBs, ARDs
// and RSs, and one rule over its Updates (or its task graph's UPD tasks).
#include "core/program/host_gradients.hpp"

#include <algorithm>
#include <map>
#include <optional>

namespace harmony::core {

HostGradients host_gradients(const Program& p) {
  HostGradients h;
  h.write.assign(p.ops.size(), GradWrite::None);
  const auto span_of = [&](int o) {
    return LayerSpan{p.ops[static_cast<std::size_t>(o)].layers.first, p.ops[static_cast<std::size_t>(o)].layers.last};
  };
  // A device update over host state (not a resident kind, an Update on a GPU: host-stream): a dWB that follows an
  // Update (depends on it) takes the updated weights and state home, no gradient; one that keeps the gradient it reads
  // on the device (a later backward adds to it and the device Update reads it) sends a round trip nobody reads.
  const bool device_update = updates_on_device_over_host_state(p);
  const auto names = [](const TensorRefs& refs, TensorKind k) {
    return std::any_of(refs.begin(), refs.end(), [&](const TensorRef& r) { return r.kind == k; });
  };
  std::vector<char> round_trip(p.ops.size(), 0);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const OpKind k = p.ops[o].kind;
    const int i = static_cast<int>(o);
    if (k == OpKind::dWB && device_update) {
      const auto& deps = p.ops[o].deps;
      if (std::any_of(deps.begin(), deps.end(),
                      [&](int d) { return p.ops[static_cast<std::size_t>(d)].kind == OpKind::Update; }))
        continue;
      round_trip[o] = names(p.ops[o].frees, TensorKind::WeightGrad) ? 0 : 1;
    }
    if (k == OpKind::dWB) h.dwbs[span_of(i)].push_back(i);
    if (k == OpKind::ARD) h.replicated.insert(span_of(i));
    if (k == OpKind::RS) h.sharded.insert(span_of(i));
  }
  const auto dev = [&](int o) { return p.ops[static_cast<std::size_t>(o)].device; };
  for (auto& [range, list] : h.dwbs) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return std::pair{dev(a), p.ops[static_cast<std::size_t>(a)].queue_pos} <
             std::pair{dev(b), p.ops[static_cast<std::size_t>(b)].queue_pos};
    });
    const bool all_reduced = h.replicated.count(range) != 0;
    const bool per_rank = h.sharded.count(range) != 0;
    std::vector<int>& w = h.writers[range];
    std::set<int> written;  // per rank for a sharded range, else -1 for the whole range
    for (const int o : list) {
      if ((all_reduced && dev(o) != dev(list.front())) || round_trip[static_cast<std::size_t>(o)] != 0) {
        h.write[static_cast<std::size_t>(o)] = GradWrite::Drop;
        continue;
      }
      w.push_back(o);
      const bool first = written.insert(per_rank ? dev(o) : -1).second;
      h.write[static_cast<std::size_t>(o)] = first ? GradWrite::Copy : GradWrite::Add;
    }
  }
  return h;
}

std::int64_t bounce_chunk_elements(std::int64_t gradient_elements, Bytes element_bytes, Bytes chunk_bytes) {
  const std::int64_t cap = std::max<std::int64_t>(1, static_cast<std::int64_t>(chunk_bytes / element_bytes));
  return std::min(gradient_elements, cap);
}

namespace {

// The owner rule over `n` items: `range_of(i)` gives item i's layer range and device, or nullopt for an item that
// updates nothing; per range, the item of the lowest device (the first in index order among equals) gets a 1.
template <class RangeOf>
std::vector<char> lowest_per_range(std::size_t n, RangeOf range_of) {
  std::vector<char> owner(n, 0);
  std::map<LayerSpan, std::pair<int, std::size_t>> lowest;  // per range: (device, item)
  for (std::size_t i = 0; i < n; ++i) {
    const std::optional<std::pair<LayerSpan, int>> r = range_of(i);
    if (!r) continue;
    const auto [it, fresh] = lowest.emplace(r->first, std::pair{r->second, i});
    if (!fresh && r->second < it->second.first) it->second = {r->second, i};
  }
  for (const auto& [range, lo] : lowest) owner[lo.second] = 1;
  return owner;
}

}  // namespace

std::vector<char> update_owners(const Program& p) {
  return lowest_per_range(p.ops.size(), [&](std::size_t o) -> std::optional<std::pair<LayerSpan, int>> {
    const Op& op = p.ops[o];
    if (op.kind != OpKind::Update) return std::nullopt;
    return std::pair{LayerSpan{op.layers.first, op.layers.last}, op.device};
  });
}

std::vector<char> update_task_owners(const TaskGraph& graph, const std::vector<int>& ranks) {
  std::vector<char> lowered(graph.rank_tasks.size(), 0);
  for (const int r : ranks) lowered[static_cast<std::size_t>(r)] = 1;
  return lowest_per_range(graph.tasks.size(), [&](std::size_t i) -> std::optional<std::pair<LayerSpan, int>> {
    const Task& t = graph.tasks[i];
    if (t.type != TaskType::Upd || t.updates_task < 0 || lowered[static_cast<std::size_t>(t.rank)] == 0)
      return std::nullopt;
    return std::pair{LayerSpan{t.layers.first, t.layers.last}, t.rank};
  });
}

}  // namespace harmony::core
