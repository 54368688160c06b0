// ProgramGraph: a Program's happens-before edges, built once and shared by both simulators, the executor and
// validation. An op's predecessors are its deps, then the op before it in its queue, then any extra edges a
// consumer adds (the executor's); successors are the same edges reversed. Both lists are CSR arrays in a fixed
// order (op index, then that order), so every engine that walks them schedules the same way bit for bit.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/program/program.hpp"

namespace harmony::core {

// The op before `op` in its queue, or -1 when `op` heads it.
inline int queue_predecessor(const Program& p, int op) {
  const Op& o = p.ops[static_cast<std::size_t>(op)];
  return o.queue_pos > 0 ? p.queues[static_cast<std::size_t>(o.queue)].ops[static_cast<std::size_t>(o.queue_pos - 1)]
                         : -1;
}

class ProgramGraph {
 public:
  ProgramGraph() = default;
  // `extra[b]`: further ops b must wait for (an op index past extra's end has none). Edges must name ops of `p`
  // (validate_program checks a Program's own; an out-of-range edge is undefined here).
  explicit ProgramGraph(const Program& p, const std::vector<std::vector<int>>& extra = {});

  std::size_t size() const { return pred_begin_.empty() ? 0 : pred_begin_.size() - 1; }
  std::span<const int> predecessors(int op) const { return row(pred_begin_, preds_, op); }
  std::span<const int> successors(int op) const { return row(succ_begin_, succs_, op); }
  int predecessor_count(int op) const { return static_cast<int>(predecessors(op).size()); }

  // Every op after all its predecessors (Kahn's algorithm, first-in first-out from the roots in index order).
  // Shorter than size() exactly when the edges form a cycle: the ops on or behind the cycle are missing.
  std::vector<int> topological_order() const;

 private:
  static std::span<const int> row(const std::vector<int>& begin, const std::vector<int>& v, int op) {
    const auto i = static_cast<std::size_t>(op);
    return {v.data() + begin[i], static_cast<std::size_t>(begin[i + 1] - begin[i])};
  }
  std::vector<int> pred_begin_, preds_;  // CSR: preds_[pred_begin_[op] .. pred_begin_[op + 1])
  std::vector<int> succ_begin_, succs_;
};

}  // namespace harmony::core
