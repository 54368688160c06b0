// The baseline interpreter's static analysis (baseline_interpreter.hpp), run when the executor is built: the
// Program's dataflow (core/program/dataflow.hpp: each op's pass, layer, samples, reads and writes) resolved to the
// version each read sees (FlowVersions), the groups, the executor's Update edges, and the checks of the Program's frees
// and updates (a missing dependency is refused before any step).
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "backend/executor/baseline_interpreter.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::backend::detail::baseline_impl {

using core::OpKind;

void BaselineInterpreter::analyse() {
  const std::size_t n = p.ops.size();
  if (!p.dataflow.covers(p))
    throw BackendError(
        fmt::format("executor: the {} Program carries no dataflow for its {} ops (lower it with "
                    "core::lower_plan)",
                    p.graph.plan.kind.name(), n));
  sharded_ = std::any_of(p.ops.begin(), p.ops.end(),
                         [](const core::Op& op) { return op.kind == OpKind::AG || op.kind == OpKind::RS; });
  groups = detail::op_groups(p);
  build_update_edges();
  const Ancestry anc(p, extra);
  // Which version each read sees (flow_versions.hpp); a resident kind's W and DW are the DeviceState's, ordered by
  // check_resident_updates.
  const bool resident = resident_;
  analyse_versions(
      anc, [resident](const Key& k) { return !(resident && in_state(k.kind)); },
      [this](const Key& k) { return tname(k); });
  versions.check_frees(anc);
  if (resident_) {
    check_resident_updates(anc);
  } else {
    check_updates(anc);
  }
  // The checks ran on the Program's own order and the tie: the edges that order the writes into the host gradients
  // (build_update_edges) would hide a missing dependency. They join now, and may not close a cycle.
  bool more = false;
  for (std::size_t o = 0; o < n; ++o) {
    more = more || !host_edges_[o].empty();
    extra[o].insert(extra[o].end(), host_edges_[o].begin(), host_edges_[o].end());
  }
  if (more) (void)Ancestry(p, extra);  // throws ScheduleViolation on a cycle
}

std::vector<int> BaselineInterpreter::grad_sources(int l, int dev) const {
  std::vector<int> r;
  for (int o : dwb_[static_cast<std::size_t>(l)])
    if (!replicated_[static_cast<std::size_t>(l)] || at(o).device == dev) r.push_back(o);
  return r;
}

void BaselineInterpreter::build_update_edges() {
  dwb_.assign(static_cast<std::size_t>(R_), {});
  wb_.assign(static_cast<std::size_t>(R_), {});
  replicated_.assign(static_cast<std::size_t>(R_), 0);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    const auto l = static_cast<std::size_t>(op.layers.first);
    if (op.kind == OpKind::dWB) dwb_[l].push_back(static_cast<int>(o));
    if (op.kind == OpKind::WB) wb_[l].push_back(static_cast<int>(o));
    if (op.kind == OpKind::ARD) replicated_[l] = 1;
  }
  extra.assign(p.ops.size(), {});
  // One host gradient per layer (build_update_edges): which dWBs write it, and the edges that order them.
  writes_host_.assign(p.ops.size(), 0);
  host_edges_.assign(p.ops.size(), {});
  std::vector<std::vector<int>> writers(static_cast<std::size_t>(R_));  // per layer, in (device, queue) order
  for (int l = 0; l < R_; ++l) {
    std::vector<int>& list = dwb_[static_cast<std::size_t>(l)];
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return std::pair{at(a).device, at(a).queue_pos} < std::pair{at(b).device, at(b).queue_pos};
    });
    for (int o : list) {
      // a replicated gradient: the lowest replica's dWBs alone (the others bring the same sum)
      const bool writes = replicated_[static_cast<std::size_t>(l)] == 0 || at(o).device == at(list.front()).device;
      writes_host_[static_cast<std::size_t>(o)] = writes ? 1 : 0;
      if (writes) writers[static_cast<std::size_t>(l)].push_back(o);
    }
    const auto& w = writers[static_cast<std::size_t>(l)];
    for (std::size_t i = 1; i < w.size(); ++i)  // a sharded gradient's ranks write disjoint shards
      if (!sharded_ || at(w[i]).device == at(w[i - 1]).device)
        host_edges_[static_cast<std::size_t>(w[i])].push_back(w[i - 1]);
  }
  // A replicated gradient's Update (the Program orders it after its own replica's dWBs: check_updates) also waits for
  // the other replicas' writes into the host gradient. The tie: layer 0's update also uses the head's lm_head
  // gradient (HostState::update). core::Model knows no tied weights, so the lowering need not order the head's
  // gradient transfers before Update(0) (pp-swap with the head on another stage does not); the executor waits for
  // them.
  const int head = m.head_layer();
  const auto others = [&](int l, int device) {
    std::vector<int> r;
    if (replicated_[static_cast<std::size_t>(l)] == 0) return r;
    for (int o : writers[static_cast<std::size_t>(l)])
      if (at(o).device != device) r.push_back(o);
    return r;
  };
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::Update || resident_) continue;
    std::vector<int> more = others(op.layers.first, op.device);
    if (op.layers.first == 0 && head != 0) {
      extra[o] = grad_sources(head, op.device);
      for (int g : others(head, op.device)) more.push_back(g);
    }
    host_edges_[o] = std::move(more);
  }
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::Update || op.layers.first != 0 || head == 0 || !resident_) continue;
    for (std::size_t x = 0; x < p.ops.size(); ++x) {  // resident: the head's gradient complete on this device
      const core::Op& xo = p.ops[x];
      if (xo.device == op.device && xo.layers.first == head && (xo.kind == OpKind::BWD || xo.kind == OpKind::ARD))
        extra[o].push_back(static_cast<int>(x));
    }
  }
}

void BaselineInterpreter::check_resident_updates(const Ancestry& anc) const {
  const int head = m.head_layer();
  std::map<std::pair<int, int>, int> upd;  // (device, layer) -> its Update
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind == OpKind::WB || op.kind == OpKind::dWB || op.kind == OpKind::AG || op.kind == OpKind::RS)
      throw BackendError(
          fmt::format("executor: op {}: a resident Program keeps its weights and gradients on the "
                      "devices and moves none",
                      label(static_cast<int>(o))));
    if (op.kind != OpKind::Update) continue;
    if (core::host_update(op))
      throw BackendError(fmt::format("executor: op {}: a resident Program updates on the device, not the CPU",
                                     label(static_cast<int>(o))));
    if (!upd.emplace(std::pair{op.device, op.layers.first}, static_cast<int>(o)).second)
      throw BackendError(fmt::format("executor: op {} updates layer {} of GPU {} a second time",
                                     label(static_cast<int>(o)), op.layers.first, op.device));
  }
  for (int d = 0; d < N_; ++d)
    for (int l = 0; l < R_; ++l)
      if (floats(l) > 0 && upd.count({d, l}) == 0)
        throw BackendError(fmt::format("executor: the Program never updates layer {} on GPU {}", l, d));
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::FWD && op.kind != OpKind::REC && op.kind != OpKind::BWD && op.kind != OpKind::ARD) continue;
    const int l = op.layers.first;
    std::vector<int> layers{l};
    if (l == head && head != 0) layers.push_back(0);
    for (int t : layers) {
      const auto it = upd.find({op.device, t});
      if (it == upd.end() || anc.before(static_cast<int>(o), it->second)) continue;
      throw ScheduleViolation(
          fmt::format("executor: op {} updates layer {} without waiting for op {}, which {} it", label(it->second), t,
                      label(static_cast<int>(o)),
                      t == l ? "reads its weights or adds to its gradient" : "adds to the tied lm_head gradient of"));
    }
  }
}

void BaselineInterpreter::check_updates(const Ancestry& anc) const {
  const int head = m.head_layer();
  std::vector<char> seen(static_cast<std::size_t>(R_), 0);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::Update) continue;
    const int u = static_cast<int>(o);
    const int l = op.layers.first;
    seen[static_cast<std::size_t>(l)] = 1;
    std::vector<int> touched{l};
    if (l == 0 && head != 0) touched.push_back(head);
    for (int t : touched) {
      const auto src = grad_sources(t, op.device);
      if (src.empty())
        throw ScheduleViolation(
            fmt::format("executor: op {} updates layer {}, but no dWB brings its gradient to the host", label(u), t));
      for (int g : src)
        if (!anc.before(g, u))
          throw ScheduleViolation(fmt::format(
              "executor: op {} updates layer {} before {} reaches the host: it does not depend on op {}", label(u), l,
              t == l ? std::string("its gradient") : fmt::format("layer {}'s gradient (the tied lm_head)", t),
              label(g)));
      for (int w : wb_[static_cast<std::size_t>(t)])
        if (!anc.before(w, u))
          throw ScheduleViolation(fmt::format(
              "executor: op {} overwrites the host weights of layer {} that op {} reads, on which it does not depend",
              label(u), t, label(w)));
    }
  }
  for (int l = 0; l < R_; ++l)
    if (seen[static_cast<std::size_t>(l)] == 0 && floats(l) > 0)
      throw BackendError(fmt::format("executor: the Program never updates layer {}", l));
}

}  // namespace harmony::backend::detail::baseline_impl
