// op_groups (detail.hpp): the groups the executor runs — core::op_groups' P2P pairs and collectives — with the
// executor's own check on top: every collective has one member per GPU, in device order.
#include <fmt/format.h>

#include "backend/executor/detail.hpp"

namespace harmony::backend::detail {

std::vector<std::vector<int>> op_groups(const core::Program& p) {
  std::vector<std::vector<int>> groups = core::op_groups(p);
  const int n = p.num_devices();
  for (std::size_t o = 0; o < groups.size(); ++o) {
    const core::OpKind k = p.ops[o].kind;
    if (p.ops[o].peer >= 0 || (k != core::OpKind::ARD && k != core::OpKind::AG && k != core::OpKind::RS)) continue;
    const std::vector<int>& members = groups[o];
    bool ok = static_cast<int>(members.size()) == n;
    for (std::size_t i = 0; ok && i < members.size(); ++i)
      ok = p.ops[static_cast<std::size_t>(members[i])].device == static_cast<int>(i);
    if (!ok)
      throw BackendError(fmt::format("executor: collective {} has {} members for {} GPUs (one per GPU expected)",
                                     op_name(p, members.front()), members.size(), n));
  }
  return groups;
}

}  // namespace harmony::backend::detail
