// op_groups (detail.hpp): the ops every interpreter runs together — P2P pairs and the collectives across GPUs —
// found once per Program from its ops alone.
#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"

namespace harmony::backend::detail {

std::vector<std::vector<int>> op_groups(const core::Program& p) {
  using core::OpKind;
  std::vector<std::vector<int>> groups(p.ops.size());
  std::map<std::tuple<int, int, int, int, int>, std::vector<int>> coll;
  const auto at = [&](int o) -> const core::Op& { return p.ops[static_cast<std::size_t>(o)]; };
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    const int oo = static_cast<int>(o);
    if (op.peer >= 0) {
      const bool send = op.kind == OpKind::Y || op.kind == OpKind::dX;
      groups[o] = send ? std::vector<int>{oo, op.peer} : std::vector<int>{op.peer, oo};
    } else if (op.kind == OpKind::ARD || op.kind == OpKind::AG || op.kind == OpKind::RS) {
      // an AG gathers a layer once per pass (the dataflow's)
      const int pass = op.kind == OpKind::AG ? static_cast<int>(p.dataflow.ops.at(o).pass) : 0;
      coll[{static_cast<int>(op.kind), pass, op.layers.first, op.layers.last, op.ui}].push_back(oo);
    } else {
      groups[o] = {oo};
    }
  }
  const int n = p.num_devices();
  for (auto& [key, members] : coll) {
    std::sort(members.begin(), members.end(), [&](int a, int b) { return at(a).device < at(b).device; });
    bool ok = static_cast<int>(members.size()) == n;
    for (std::size_t i = 0; ok && i < members.size(); ++i) ok = at(members[i]).device == static_cast<int>(i);
    if (!ok)
      throw BackendError(fmt::format("executor: collective {} has {} members for {} GPUs (one per GPU expected)",
                                     op_name(p, members.front()), members.size(), n));
    for (const int a : members) groups[static_cast<std::size_t>(a)] = members;
  }
  return groups;
}

}  // namespace harmony::backend::detail
