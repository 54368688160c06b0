// core::state_layout: a Program's state between steps from its ops (AG, RS, Update) and its dataflow's passes.
#include "core/program/state_layout.hpp"

#include <algorithm>
#include <cstddef>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/base/error.hpp"

namespace harmony::core {

namespace {

// The device tensors written only in the update pass and read outside it (fwd, bwd): (device, layer) per kind.
void find_carried(const Program& p, StateLayout& s) {
  std::vector<char> written_outside(p.dataflow.tensors.size(), 0), written_in(p.dataflow.tensors.size(), 0),
      read_outside(p.dataflow.tensors.size(), 0);
  for (const OpFlow& f : p.dataflow.ops) {
    const bool update = f.pass == Pass::Update;
    for (const int id : f.writes) (update ? written_in : written_outside)[static_cast<std::size_t>(id)] = 1;
    if (!update)
      for (const int id : f.reads) read_outside[static_cast<std::size_t>(id)] = 1;
  }
  std::set<std::pair<int, int>> found;
  for (std::size_t id = 0; id < p.dataflow.tensors.size(); ++id) {
    const FlowTensor& t = p.dataflow.tensors[id];
    if (on_host(t.kind) || t.device < 0 || !written_in[id] || written_outside[id] || !read_outside[id]) continue;
    if (s.carried && *s.carried != t.kind)
      throw ScheduleError(fmt::format("state layout: a Program carries {} and {} across steps; one kind only",
                                      flow_kind_name(*s.carried), flow_kind_name(t.kind)));
    s.carried = t.kind;
    found.emplace(t.device, t.layer);
  }
  if (!s.carried) return;
  s.carried_layers.resize(static_cast<std::size_t>(p.num_devices()));
  for (const auto& [d, l] : found) s.carried_layers.at(static_cast<std::size_t>(d)).push_back(l);
}

}  // namespace

StateLayout state_layout(const Program& p) {
  StateLayout s;
  s.resident = p.graph.plan.kind->resident_state;
  s.sharded = s.resident && std::any_of(p.ops.begin(), p.ops.end(),
                                        [](const Op& op) { return op.kind == OpKind::AG || op.kind == OpKind::RS; });
  s.device_update = updates_on_device_over_host_state(p);
  if (!p.dataflow.covers(p)) return s;
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    s.whole_weights =
        s.whole_weights || (s.sharded && p.ops[o].kind == OpKind::AG && p.dataflow.ops[o].pass == Pass::Update);
  if (!s.resident) find_carried(p, s);
  return s;
}

}  // namespace harmony::core
