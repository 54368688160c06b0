// FlowInterpreter's gradients out and Updates for every kind (flow_interpreter.hpp): the analysis run when the
// executor is built (the host gradients' writers, the Updates' owners and edges, the checks of the Program's frees and
// Updates), the dWB into the host gradient (one policy: plan_updates) and the Update (host AdamW by the range's owner,
// or a resident kind's on the device).
#include <algorithm>
#include <map>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "backend/bf16.hpp"
#include "backend/executor/flow_interpreter.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::backend::detail {

using core::OpKind;

namespace {
std::pair<int, int> range_of(const core::Op& op) { return {op.layers.first, op.layers.last}; }
}  // namespace

void FlowInterpreter::analyse() {
  if (!p.dataflow.covers(p))
    throw BackendError(
        fmt::format("executor: the {} Program carries no dataflow for its {} ops (lower it with "
                    "core::lower_plan)",
                    p.graph.plan.kind.name(), p.ops.size()));
  groups = detail::op_groups(p);
  plan_updates();
  const Ancestry anc(p, extra);
  analyse_versions(anc);
  versions.check_frees(anc);
  if (layout.sharded) {
    check_shard_updates(anc);
  } else if (layout.resident) {
    check_resident_updates(anc);
  } else {
    // A collective group runs once every member's preds have run (run): its members follow each other's preds, which
    // is how another replica's WB comes before an Update of the all-reduced gradient.
    std::vector<std::vector<int>> with_groups = extra;
    for (std::size_t o = 0; o < p.ops.size(); ++o)
      for (const int x : groups[o])
        if (x != static_cast<int>(o))
          for (const int pred : qr.preds(x, extra)) with_groups[o].push_back(pred);
    const Ancestry with(p, with_groups);
    if (layout.device_update) {
      check_streamed_updates(with);
    } else {
      check_updates(with);
    }
    if (layout.carried) check_carried(with);
  }
  // The checks ran on the Program's own order and the tie: the edges that order the writes into the host gradients
  // would hide a missing dependency. They join now, and may not close a cycle.
  bool more = false;
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    more = more || !write_edges[o].empty();
    extra[o].insert(extra[o].end(), write_edges[o].begin(), write_edges[o].end());
  }
  if (more) (void)Ancestry(p, extra);  // throws ScheduleViolation on a cycle
}

void FlowInterpreter::plan_updates() {
  const std::size_t n = p.ops.size();
  extra.assign(n, {});
  write_edges.assign(n, {});
  owner = core::update_owners(p);  // the rule harmony-sim's native engine prices the Updates by
  hg = core::host_gradients(p);
  for (const auto& [range, w] : hg.writers) {  // each writer after the previous one (a sharded range's ranks: disjoint)
    const bool per_rank = hg.sharded.count(range) != 0;
    for (std::size_t i = 1; i < w.size(); ++i)
      if (!per_rank || at(w[i]).device == at(w[i - 1]).device)
        write_edges[static_cast<std::size_t>(w[i])].push_back(w[i - 1]);
  }
  const int head = m.head_layer();
  for (std::size_t u = 0; u < n; ++u) {
    const core::Op& up = p.ops[u];
    if (up.kind != OpKind::Update || up.layers.first != 0 || head == 0) continue;
    if (layout.resident) {  // the head's gradient complete on this device
      for (std::size_t x = 0; x < n; ++x) {
        const core::Op& xo = p.ops[x];
        if (xo.device == up.device && xo.layers.first == head && (xo.kind == OpKind::BWD || xo.kind == OpKind::ARD))
          extra[u].push_back(static_cast<int>(x));
      }
      continue;
    }
    for (const int g : update_sources(static_cast<int>(u)))  // the tie (the range's own: the Program orders them)
      if (at(g).layers.first != up.layers.first) extra[u].push_back(g);
  }
  for (std::size_t u = 0; u < n; ++u) {  // the owner also waits for every writer of what it reads
    if (owner[u] == 0 || layout.resident) continue;
    for (const auto& [range, list] : hg.writers) {
      const bool own = range == range_of(p.ops[u]);
      const bool tie = head != 0 && p.ops[u].layers.first == 0 && range.first <= head && head <= range.second;
      if (own || tie) write_edges[u].insert(write_edges[u].end(), list.begin(), list.end());
    }
  }
}

std::vector<int> FlowInterpreter::update_sources(int u) const {
  const core::Op& up = at(u);
  const int head = m.head_layer();
  std::vector<int> r;
  for (const auto& [range, list] : hg.dwbs) {
    const bool own = range == range_of(up);
    const bool tie = head != 0 && up.layers.first == 0 && range.first <= head && head <= range.second;
    if (!own && !tie) continue;
    for (const int o : list)
      if (hg.replicated.count(range) == 0 || at(o).device == up.device) r.push_back(o);
  }
  return r;
}

void FlowInterpreter::check_updates(const Ancestry& anc) const {
  const int head = m.head_layer();
  std::vector<char> seen(static_cast<std::size_t>(m.num_layers()), 0);
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::Update) continue;
    const int u = static_cast<int>(o);
    for (int l = op.layers.first; l <= op.layers.last; ++l) seen[static_cast<std::size_t>(l)] = 1;
    const std::vector<int> src = update_sources(u);
    if (src.empty())
      throw ScheduleViolation(fmt::format(
          "executor: op {} updates layer {}, but no dWB brings its gradient to the host", label(u), op.layers.first));
    for (const int g : src)
      if (!anc.before(g, u))
        throw ScheduleViolation(
            fmt::format("executor: op {} updates layer {} before {} reaches the host: it does not depend on op {}",
                        label(u), op.layers.first,
                        at(g).layers.first == op.layers.first
                            ? std::string("its gradient")
                            : fmt::format("layer {}'s gradient (the tied lm_head)", at(g).layers.first),
                        label(g)));
    for (std::size_t w = 0; w < p.ops.size(); ++w) {
      const core::Op& wb = p.ops[w];
      // an update pass's WB reads the masters the Update wrote (check_carried orders it after)
      if (wb.kind != OpKind::WB || p.dataflow.ops[w].pass == core::Pass::Update) continue;
      const bool reads = wb.layers.first <= op.layers.last && op.layers.first <= wb.layers.last;
      const bool tied = head != 0 && op.layers.first == 0 && wb.layers.first <= head && head <= wb.layers.last;
      if ((reads || tied) && !anc.before(static_cast<int>(w), u))
        throw ScheduleViolation(fmt::format(
            "executor: op {} overwrites the host weights of layer {} that op {} reads, on which it does not depend",
            label(u), reads ? std::max(op.layers.first, wb.layers.first) : head, label(static_cast<int>(w))));
    }
  }
  for (int l = 0; l < m.num_layers(); ++l)
    if (seen[static_cast<std::size_t>(l)] == 0 && m.param_floats(l) > 0)
      throw BackendError(fmt::format("executor: the Program never updates layer {}", l));
}

std::map<std::pair<int, int>, int> FlowInterpreter::device_updates() const {
  std::map<std::pair<int, int>, int> upd;  // (device, layer) -> its Update
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind != OpKind::Update) continue;
    if (!upd.emplace(std::pair{op.device, op.layers.first}, static_cast<int>(o)).second)
      throw BackendError(fmt::format("executor: op {} updates layer {} of GPU {} a second time",
                                     label(static_cast<int>(o)), op.layers.first, op.device));
  }
  for (int d = 0; d < p.num_devices(); ++d)
    for (int l = 0; l < m.num_layers(); ++l)
      if (m.param_floats(l) > 0 && upd.count({d, l}) == 0)
        throw BackendError(fmt::format("executor: the Program never updates layer {} on GPU {}", l, d));
  return upd;
}

void FlowInterpreter::check_resident_updates(const Ancestry& anc) const {
  const int head = m.head_layer();
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const core::Op& op = p.ops[o];
    if (op.kind == OpKind::WB || op.kind == OpKind::dWB || op.kind == OpKind::AG || op.kind == OpKind::RS)
      throw BackendError(
          fmt::format("executor: op {}: a resident Program keeps its weights and gradients on the "
                      "devices and moves none",
                      label(static_cast<int>(o))));
    if (op.kind == OpKind::Update && core::host_update(op))
      throw BackendError(fmt::format("executor: op {}: a resident Program updates on the device, not the CPU",
                                     label(static_cast<int>(o))));
  }
  const std::map<std::pair<int, int>, int> upd = device_updates();
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

int FlowInterpreter::grad_read(int o) const {
  for (const int id : flow(o).reads) {
    const core::FlowKind k = p.dataflow.tensor(id).kind;
    if (k == core::FlowKind::DW || k == core::FlowKind::DWShard) return id;
  }
  throw core::InternalError(fmt::format("executor: op {} reads no weight gradient", label(o)));
}

void FlowInterpreter::run_dwb(int o) {
  if (layout.device_update && flow(o).pass == core::Pass::Update) {
    stream_state_out(o);
    return;
  }
  const core::Op& op = at(o);
  const int d = op.device, id = grad_read(o);
  const bool shard = p.dataflow.tensor(id).kind == core::FlowKind::DWShard;
  std::vector<std::span<float>> dst;  // its part of the host gradient, layer after layer
  std::int64_t total = 0;
  for (int l = op.layers.first; l <= op.layers.last; ++l) {
    const std::int64_t first = shard ? shard_first(l, d) : 0;
    const std::int64_t len = shard ? shard_len(l, d) : m.param_floats(l);
    dst.push_back(st.grads(l).subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(len)));
    total += len;
  }
  const void* src = store.get(o, id).data();
  brought[static_cast<std::size_t>(o)] = 1;
  const auto down = [&](std::span<const std::span<float>> to) {
    if (dt == DType::BF16) {  // staged down, widened exactly on the host
      stage_down(qr.queue(o), D(d), S(o), to, src);
      return;
    }
    std::int64_t off = 0;
    for (const std::span<float> s : to) {
      D(d).copy_d2h(S(o), s.data(), static_cast<const float*>(src) + off, Bytes(s.size()) * kF);
      off += static_cast<std::int64_t>(s.size());
    }
  };
  const core::GradWrite how = hg.write[static_cast<std::size_t>(o)];
  const bool writes_host = how != core::GradWrite::Drop;
  if (how == core::GradWrite::Copy) {
    down(dst);  // no wait: what reads the host gradient next waits for this op's event
    return;
  }
  // The rest lands in the queue's bounce buffer chunk by chunk, widened to fp32: as many elements as one
  // staging_chunk_bytes of the gradient's own type holds (the staging rings' chunk in bf16): a writer adds each chunk
  // into its part of the host gradient, a replica that does not write drops it.
  const std::int64_t chunk = core::bounce_chunk_elements(total, dt == DType::BF16 ? Bytes{2} : kF, staging_chunk_bytes);
  Bounce& b = bounce[qr.queue(o)];  // the queue runs one op at a time: its bounce buffer is free
  if (static_cast<std::int64_t>(b.floats.size()) < chunk) {
    b.metered.reset();
    b.floats.assign(static_cast<std::size_t>(chunk), 0.0f);
    b.metered = MeteredBytes(host_meter, HostUse::Staging, chunk * kF);
  }
  std::size_t k = 0, off = 0;  // where the next chunk adds: dst[k] from element off
  for (std::int64_t c0 = 0; c0 < total; c0 += chunk) {
    const std::int64_t n = std::min(chunk, total - c0);
    const std::span<float> landed(b.floats.data(), static_cast<std::size_t>(n));
    if (dt == DType::BF16) {  // staged down chunk by chunk, widened exactly on the host
      stage_down(qr.queue(o), D(d), S(o), std::span<const std::span<float>>(&landed, 1),
                 static_cast<const Bf16*>(src) + c0);
    } else {
      D(d).copy_d2h(S(o), landed.data(), static_cast<const float*>(src) + c0, Bytes(n) * kF);
      sync(o);  // the bounce buffer is the next chunk's, and the queue's next dWB's
    }
    if (!writes_host) continue;  // another replica's copy of the sum the writer brings
    for (std::size_t i = 0; i < landed.size();) {
      if (off == dst[k].size()) {
        ++k;
        off = 0;
        continue;
      }
      const std::size_t take = std::min(landed.size() - i, dst[k].size() - off);
      for (std::size_t j = 0; j < take; ++j) dst[k][off + j] += landed[i + j];
      i += take;
      off += take;
    }
  }
}

void FlowInterpreter::run_update(int o) {
  if (layout.resident) {
    state_update(o);
    return;
  }
  if (layout.device_update) {
    device_update(o);
    return;
  }
  if (owner[static_cast<std::size_t>(o)] == 0) return;  // the range's owner updates the shared masters
  for (const int g : update_sources(o))
    if (brought[static_cast<std::size_t>(g)] == 0)
      throw BackendError(fmt::format("executor: op {}: op {} has not brought layer {}'s gradient to the host", label(o),
                                     label(g), at(g).layers.first));
  // AdamW runs unlocked: what it touches (the range's host weights, gradients and moments; for layer 0 also the
  // head's lm_head gradient and weight) no other op touches until the next step (the edges of plan_updates).
  const core::Op& op = at(o);
  unlocked([&] { note_nonfinite(update_layers(st, opt.adamw, op.layers.first, op.layers.last, qr.adamw(o))); });
}

void FlowInterpreter::run_op(int o) {
  const core::Op& op = at(o);
  switch (op.kind) {
    case OpKind::WB:
      return run_wb(o);
    case OpKind::FWD:
    case OpKind::REC:
      return forward(o);
    case OpKind::BWD:
      return backward(o);
    case OpKind::dWB:
      return run_dwb(o);
    case OpKind::Update:
      return run_update(o);
    default:
      throw BackendError(fmt::format("executor: op {}: kind {} not supported", label(o), core::op_kind_name(op.kind)));
  }
}

}  // namespace harmony::backend::detail
