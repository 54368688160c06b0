// Builds the paper's task graph from a plan: task order and placement (§5.3 of SEMANTICS.md),
// channels between tasks (§5.4), the JIT weight pin and the last-forward message patch.
#include "core/program/task_graph.hpp"

#include <algorithm>
#include <vector>

#include "core/base/error.hpp"

namespace harmony::core {

const char* task_type_name(TaskType t) {
  switch (t) {
    case TaskType::Fwd:
      return "FWD";
    case TaskType::Bwd:
      return "BWD";
    case TaskType::Upd:
      return "UPD";
  }
  return "?";
}

const char* medium_name(Medium m) {
  switch (m) {
    case Medium::None:
      return "-";
    case Medium::Data:
      return "DAT";
    case Medium::SharedCpu:
      return "SHM";
    case Medium::LocalCpu:
      return "LOC";
    case Medium::P2P:
      return "P2P";
    case Medium::Msg:
      return "MSG";
    case Medium::Swap:
      return "SWP";
    case Medium::Pin:
      return "PIN";
  }
  return "?";
}

int TaskGraph::non_empty_ranks() const {
  int n = 0;
  for (const auto& r : rank_tasks) n += r.empty() ? 0 : 1;
  return n;
}

int TaskGraph::num_subpacks(const Task& t) const {
  if (t.type != TaskType::Fwd) return 1;
  // boundaries = stash layers (+ first layer if not stashed) + [last + 1]
  const bool first_stashed = !t.stashes.empty() && t.stashes.front().layer == t.layers.first;
  return static_cast<int>(t.stashes.size()) + (first_stashed ? 0 : 1);
}

int TaskGraph::subpack_of_stash(const Task& fwd, int layer) const {
  const bool first_stashed = !fwd.stashes.empty() && fwd.stashes.front().layer == fwd.layers.first;
  for (std::size_t k = 0; k < fwd.stashes.size(); ++k) {
    if (fwd.stashes[k].layer == layer) return static_cast<int>(k) + (first_stashed ? 0 : 1);
  }
  throw InternalError("no stash at layer " + std::to_string(layer) + " in task " + std::to_string(fwd.idx));
}

namespace {

// Appends one GPU's task list (FWD packs ascending, then BWD/UPD pairs for packs descending).
// `rank_of(kind, k)` places the k-th FWD or j-th BWD task.
template <typename RankOf>
void build_list(TaskGraph& g, int offset, const std::vector<int>& ub_fwd, const std::vector<int>& ub_bwd,
                RankOf rank_of) {
  const Plan& p = g.plan;
  const int nfwd = static_cast<int>(p.packs_fwd.size());
  const int nbwd = static_cast<int>(p.packs_bwd.size());
  const int R = g.num_layers;
  for (int k = 0; k < nfwd; ++k) {
    Task t;
    t.idx = offset + k;
    t.type = TaskType::Fwd;
    t.layers = p.packs_fwd[static_cast<std::size_t>(k)];
    t.rank = rank_of(TaskType::Fwd, k);
    t.ubatch_sizes = ub_fwd;
    t.has_data = t.layers.first == 0;
    t.is_last_fwd = k == nfwd - 1;
    g.tasks.push_back(t);
  }
  for (int j = 0; j < nbwd; ++j) {
    Task b;
    b.idx = offset + nfwd + 2 * j;
    b.type = TaskType::Bwd;
    b.layers = p.packs_bwd[static_cast<std::size_t>(nbwd - 1 - j)];
    b.rank = rank_of(TaskType::Bwd, j);
    b.ubatch_sizes = ub_bwd;
    b.has_data = b.layers.first == 0;
    b.has_criterion = b.layers.last == R - 1;
    g.tasks.push_back(b);
    Task u;
    u.idx = b.idx + 1;
    u.type = TaskType::Upd;
    u.layers = b.layers;
    u.rank = b.rank;
    u.updates_task = b.idx;
    g.tasks.push_back(u);
  }
}

Channel p2p_or_swap(const Task& self, const Task& peer) {
  return Channel{peer.rank != self.rank ? Medium::P2P : Medium::Swap, peer.idx};
}

// Channels of one task list starting at `offset` with `count` tasks (§5.4). Linear in tasks and layers: the
// backward packs that start inside a forward pack are found by a sorted index, and the forward pack holding a
// backward pack's first layer by a per-layer owner (the last such forward task, as a scan in task order finds).
void connect(TaskGraph& g, int offset, int count) {
  auto at = [&](int idx) -> Task& { return g.tasks[static_cast<std::size_t>(idx)]; };
  const int end = offset + count;
  std::vector<Stash> starts;  // (first layer, task) of the non-criterion backward tasks, by layer then task
  int max_layer = -1;
  for (int idx = offset; idx < end; ++idx) {
    const Task& t = at(idx);
    if (t.type == TaskType::Bwd && !t.has_criterion) starts.push_back(Stash{t.layers.first, t.idx});
    if (t.type == TaskType::Fwd) max_layer = std::max(max_layer, t.layers.last);
  }
  std::stable_sort(starts.begin(), starts.end(), [](const Stash& a, const Stash& b) { return a.layer < b.layer; });
  std::vector<int> fwd_owner(static_cast<std::size_t>(max_layer + 1), -1);  // layer -> last FWD task holding it
  for (int idx = offset; idx < end; ++idx) {
    const Task& t = at(idx);
    if (t.type != TaskType::Fwd) continue;
    for (int l = std::max(0, t.layers.first); l <= t.layers.last; ++l) fwd_owner[static_cast<std::size_t>(l)] = t.idx;
  }
  for (int idx = offset; idx < end; ++idx) {
    Task& t = at(idx);
    if (t.type == TaskType::Fwd) {
      t.in_x = t.has_data ? Channel{Medium::Data, -1} : p2p_or_swap(t, at(idx - 1));
      t.out_y = p2p_or_swap(t, at(idx + 1));
      // stash X at every layer of this pack where a BWD pack starts
      auto it = std::lower_bound(starts.begin(), starts.end(), t.layers.first,
                                 [](const Stash& s, int layer) { return s.layer < layer; });
      for (; it != starts.end() && it->layer <= t.layers.last; ++it) t.stashes.push_back(*it);
    } else if (t.type == TaskType::Bwd) {
      if (t.has_criterion) {
        t.in_x = t.has_data ? Channel{Medium::Data, -1} : p2p_or_swap(t, at(idx - 1));
      } else {
        // stashed X from the FWD task holding that layer
        const int l = t.layers.first;
        if (l >= 0 && l <= max_layer && fwd_owner[static_cast<std::size_t>(l)] >= 0)
          t.in_x = Channel{Medium::Msg, fwd_owner[static_cast<std::size_t>(l)]};
        t.in_dy = p2p_or_swap(t, at(idx - 2));
      }
      if (!t.has_data) t.out_dx = p2p_or_swap(t, at(idx + 2));
    }
  }
}

}  // namespace

TaskGraph compose_task_graph(const Plan& plan, int num_layers) {
  TaskGraph g;
  g.plan = plan;
  g.num_layers = num_layers;
  const int N = plan.gpus;
  const int D = plan.minibatch;
  const int nfwd = static_cast<int>(plan.packs_fwd.size());
  const int per_list = nfwd + 2 * static_cast<int>(plan.packs_bwd.size());
  g.rank_tasks.assign(static_cast<std::size_t>(N), {});
  if (!plan.kind->data_parallel) {  // packs round-robin over the GPUs (vPP); else replicas (vDP)
    const auto uf = split_minibatch(D, plan.u_fwd);
    const auto ub = split_minibatch(D, plan.u_bwd);
    g.ubatch_fwd.assign(static_cast<std::size_t>(N), uf);
    g.ubatch_bwd.assign(static_cast<std::size_t>(N), ub);
    build_list(g, 0, uf, ub, [&](TaskType type, int k) { return type == TaskType::Fwd ? k % N : (nfwd + k) % N; });
    connect(g, 0, per_list);
    // JIT pin: each GPU's last FWD and first BWD share the layers they both hold.
    for (int r = 0; r < N; ++r) {
      int last_fwd = -1;
      int first_bwd = -1;
      for (const Task& t : g.tasks) {
        if (t.rank != r) continue;
        if (t.type == TaskType::Fwd) last_fwd = t.idx;
        if (t.type == TaskType::Bwd && first_bwd < 0) first_bwd = t.idx;
      }
      if (last_fwd >= 0 && first_bwd >= 0) {
        Task& f = g.tasks[static_cast<std::size_t>(last_fwd)];
        Task& b = g.tasks[static_cast<std::size_t>(first_bwd)];
        if (std::max(f.layers.first, b.layers.first) <= std::min(f.layers.last, b.layers.last)) {
          f.w_pinned_to = b.idx;
          b.w_pinned_from = f.idx;
        }
      }
    }
    g.last_fwd_msg = N > 1 && plan.u_fwd != plan.u_bwd;
    if (g.last_fwd_msg && nfwd > 0) {
      Task& lf = g.tasks[static_cast<std::size_t>(nfwd - 1)];
      Task& crit = g.tasks[static_cast<std::size_t>(nfwd)];
      lf.out_y.medium = Medium::Msg;
      crit.in_x.medium = Medium::Msg;
    }
  } else {
    for (int n = 0; n < N; ++n) {
      const int dd = D / N + (n < D % N ? 1 : 0);
      const auto uf = split_minibatch(dd, plan.u_fwd);
      const auto ub = split_minibatch(dd, plan.u_bwd);
      g.ubatch_fwd.push_back(uf);
      g.ubatch_bwd.push_back(ub);
      const int offset = static_cast<int>(g.tasks.size());
      build_list(g, offset, uf, ub, [n](TaskType, int) { return n; });
      connect(g, offset, per_list);
    }
  }
  for (const Task& t : g.tasks) g.rank_tasks[static_cast<std::size_t>(t.rank)].push_back(t.idx);
  for (const Task& t : g.tasks) {
    if (t.type == TaskType::Bwd && t.has_criterion && t.idx < per_list) g.loss_rank = t.rank;
  }
  return g;
}

UbatchConverter make_ubatch_converter(const std::vector<int>& fwd, const std::vector<int>& bwd, int u_bwd) {
  UbatchConverter c;
  c.fwd_of_bwd.assign(bwd.size(), -1);
  std::size_t next = 0;
  int residual = 0;
  for (std::size_t i = 0; i < fwd.size(); ++i) {
    c.bwd_idx.emplace_back();
    c.bwd_sizes.emplace_back();
    int total = residual + fwd[i];
    residual = 0;
    while (total > 0) {
      const int chunk = std::min(total, u_bwd);
      total -= chunk;
      if (next < bwd.size() && chunk == bwd[next]) {
        c.bwd_idx.back().push_back(static_cast<int>(next));
        c.bwd_sizes.back().push_back(chunk);
        c.fwd_of_bwd[next] = static_cast<int>(i);
        ++next;
      } else {
        residual = chunk;
      }
    }
  }
  return c;
}

}  // namespace harmony::core
