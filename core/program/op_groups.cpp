// op_groups (program.hpp): the ops a Program's executors run together — P2P pairs, send first, and the collectives
// across GPUs, the k-th of each device per (kind, layers, microbatch) together — found from the ops alone (no
// dataflow: harmony-sim's lowering leaves it off). harmony-run's executor and harmony-sim's serial replay share it.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/program/program.hpp"

namespace harmony::core {

std::vector<std::vector<int>> op_groups(const Program& p) {
  const auto z = [](int i) { return static_cast<std::size_t>(i); };
  std::vector<std::vector<int>> groups(p.ops.size());
  using Key = std::tuple<int, int, int, int>;            // (kind, first layer, last layer, microbatch)
  std::map<std::pair<Key, int>, int> occurrence;         // ((key), device) -> collectives seen so far
  std::map<std::pair<Key, int>, std::vector<int>> coll;  // ((key), k) -> the k-th of each device
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const Op& op = p.ops[o];
    const int oo = static_cast<int>(o);
    if (op.peer >= 0) {
      const bool send = op.kind == OpKind::Y || op.kind == OpKind::dX;
      groups[o] = send ? std::vector<int>{oo, op.peer} : std::vector<int>{op.peer, oo};
    } else if (op.kind == OpKind::ARD || op.kind == OpKind::AG || op.kind == OpKind::RS) {
      const Key key{static_cast<int>(op.kind), op.layers.first, op.layers.last, op.ui};
      const int k = occurrence[{key, op.device}]++;
      coll[{key, k}].push_back(oo);
    } else {
      groups[o] = {oo};
    }
  }
  for (auto& [key, members] : coll) {
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return p.ops[z(a)].device < p.ops[z(b)].device; });
    for (const int a : members) groups[z(a)] = members;
  }
  return groups;
}

}  // namespace harmony::core
