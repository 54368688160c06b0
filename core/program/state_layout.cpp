// core::state_layout: a Program's state between steps from its ops (AG, RS, WB) and their passes.
#include "core/program/state_layout.hpp"

#include <cstddef>

namespace harmony::core {

StateLayout state_layout(const Program& p) {
  StateLayout s;
  s.resident = p.graph.plan.kind->resident_state;
  const bool flows = p.dataflow.covers(p);
  bool gathers_in_update = false;
  std::optional<FlowKind> written_up;
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const Op& op = p.ops[o];
    s.sharded = s.sharded || op.kind == OpKind::AG || op.kind == OpKind::RS;
    if (!flows) continue;
    const OpFlow& f = p.dataflow.ops[o];
    if (f.pass != Pass::Update) continue;
    gathers_in_update = gathers_in_update || op.kind == OpKind::AG;
    if (op.kind == OpKind::WB && !f.writes.empty() && !written_up) written_up = p.dataflow.tensor(f.writes[0]).kind;
  }
  s.sharded = s.resident && s.sharded;
  s.whole_weights = s.sharded && gathers_in_update;
  if (s.resident || !written_up) return s;
  s.carried = written_up;
  s.carried_layers.resize(static_cast<std::size_t>(p.num_devices()));
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    if (p.ops[o].kind == OpKind::WB && p.dataflow.ops[o].pass == Pass::Update)
      s.carried_layers.at(static_cast<std::size_t>(p.ops[o].device)).push_back(p.ops[o].layers.first);
  return s;
}

}  // namespace harmony::core
