// ProgramGraph construction (two counting passes per direction, no per-op vectors) and Kahn's topological order.
#include "core/program/program_graph.hpp"

#include <algorithm>

#include "core/base/index.hpp"

namespace harmony::core {

ProgramGraph::ProgramGraph(const Program& p, const std::vector<std::vector<int>>& extra) {
  const std::size_t n = p.ops.size();
  pred_begin_.assign(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& o = p.ops[i];
    std::size_t k = o.deps.size() + (o.queue_pos > 0 ? 1 : 0);
    if (i < extra.size()) k += extra[i].size();
    pred_begin_[i + 1] = pred_begin_[i] + static_cast<int>(k);
  }
  preds_.resize(ix(pred_begin_[n]));
  for (std::size_t i = 0; i < n; ++i) {
    const Op& o = p.ops[i];
    int* out = preds_.data() + pred_begin_[i];
    out = std::copy(o.deps.begin(), o.deps.end(), out);
    if (o.queue_pos > 0) *out++ = queue_predecessor(p, static_cast<int>(i));
    if (i < extra.size()) std::copy(extra[i].begin(), extra[i].end(), out);
  }
  // successors: op i is appended to each of its predecessors' rows, in ascending i and predecessor order
  succ_begin_.assign(n + 1, 0);
  for (int d : preds_) ++succ_begin_[ix(d) + 1];
  for (std::size_t i = 0; i < n; ++i) succ_begin_[i + 1] += succ_begin_[i];
  succs_.resize(preds_.size());
  std::vector<int> fill(succ_begin_.begin(), succ_begin_.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    for (int k = pred_begin_[i]; k < pred_begin_[i + 1]; ++k)
      succs_[ix(fill[ix(preds_[ix(k)])]++)] = static_cast<int>(i);
  }
}

std::vector<int> ProgramGraph::topological_order() const {
  const std::size_t n = size();
  std::vector<int> indeg(n), order;
  order.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = predecessor_count(static_cast<int>(i));
    if (indeg[i] == 0) order.push_back(static_cast<int>(i));
  }
  for (std::size_t head = 0; head < order.size(); ++head) {
    for (int s : successors(order[head]))
      if (--indeg[ix(s)] == 0) order.push_back(s);
  }
  return order;
}

}  // namespace harmony::core
