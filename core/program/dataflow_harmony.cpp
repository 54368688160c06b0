// The dataflow of a Harmony Program (dataflow.hpp: harmony_dataflow): each op's pass, pack and samples taken from its
// task, and what it reads and writes as the executor runs it — activations, stashes, input gradients, the recompute's
// inputs and activations, the task's weights and gradients, and the host channels (swaps and CPU messages).
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/plan/plan_kind.hpp"
#include "core/program/dataflow.hpp"
#include "core/program/program.hpp"

namespace harmony::core {
namespace {

using K = FlowKind;

class HarmonyFlow {
 public:
  explicit HarmonyFlow(const Program& p) : p_(p), g_(p.graph) {
    const bool dp = g_.plan.kind->data_parallel;
    for (int r = 0, off = 0; r < p_.num_devices(); ++r) {
      rank_offset_.push_back(dp ? off : 0);
      for (int u : g_.ubatch_bwd.at(static_cast<std::size_t>(r))) off += u;
    }
    find_same_rank_msgs();
  }

  Dataflow derive();

 private:
  const Task& task(const Op& op) const { return g_.tasks.at(static_cast<std::size_t>(op.task)); }
  std::pair<int, int> samples(const Op& op) const;
  // A message channel every message into which stays on its rank needs no copy: it is the channel it copies from.
  void find_same_rank_msgs();
  K resolve(K c, int l) const { return same_rank_msgs_.count({c, l}) != 0 ? msg_source(c) : c; }
  static K msg_source(K to) { return to == K::HostStashMsg ? K::HostStash : K::HostY; }
  void flow_of(const Op& op, OpFlow& f);
  void flow_of_transfer(const Op& op, OpFlow& f);

  const Program& p_;
  const TaskGraph& g_;
  std::vector<int> rank_offset_;  // first sample of each rank's share
  std::set<std::pair<K, int>> same_rank_msgs_;
  Dataflow df_;
};

std::pair<int, int> HarmonyFlow::samples(const Op& op) const {
  const Task& t = task(op);
  const bool msg = op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY;
  const std::vector<int>& list = msg ? g_.ubatch_bwd.at(static_cast<std::size_t>(t.rank)) : t.ubatch_sizes;
  int s = rank_offset_.at(static_cast<std::size_t>(t.rank));
  for (int i = 0; i < op.ui; ++i) s += list.at(static_cast<std::size_t>(i));
  return {s, list.at(static_cast<std::size_t>(op.ui))};
}

void HarmonyFlow::find_same_rank_msgs() {
  std::map<std::pair<K, int>, bool> same;  // per message channel: every message into it stays on its rank
  for (const Op& op : p_.ops) {
    if (op.kind != OpKind::MSGsX && op.kind != OpKind::MSGY) continue;
    const Task& t = task(op);
    int to_task = -1;
    if (op.kind == OpKind::MSGY) {
      to_task = t.out_y.peer_task;
    } else {
      for (const Stash& st : t.stashes)
        if (st.layer == op.layers.first) to_task = st.bwd_task;
    }
    const bool here = to_task >= 0 && g_.tasks.at(static_cast<std::size_t>(to_task)).rank == t.rank;
    const std::pair<K, int> key = op.kind == OpKind::MSGsX ? std::pair{K::HostStashMsg, op.layers.first}
                                                           : std::pair{K::HostYMsg, op.layers.last + 1};
    auto [it, fresh] = same.emplace(key, here);
    if (!fresh) it->second = it->second && here;
  }
  for (const auto& [key, here] : same)
    if (here) same_rank_msgs_.insert(key);
}

// The ops that move activations and gradients: inputs, stashes, messages, swaps and P2P pairs (a pair's sender
// reads, its receiver writes on its own device).
void HarmonyFlow::flow_of_transfer(const Op& op, OpFlow& f) {
  const Task& t = task(op);
  const int d = op.device, lf = op.layers.first, ll = op.layers.last, s0 = f.s0, n = f.n;
  const auto dev = [&](K k, int l) { return df_.intern(FlowTensor{d, k, l, s0, n, -1}); };
  const auto host = [&](K k, int l) { return df_.intern(FlowTensor{-1, resolve(k, l), l, s0, n, -1}); };
  switch (op.kind) {
    case OpKind::X:  // the tokens (a task with layer 0), a host channel's, or a P2P receive
      if (!t.has_data && op.peer < 0 && t.in_x.medium == Medium::Msg) f.reads.push_back(host(K::HostYMsg, lf));
      if (!t.has_data && op.peer < 0 && t.in_x.medium == Medium::Swap) f.reads.push_back(host(K::HostY, lf));
      f.writes.push_back(dev(K::Act, lf));
      return;
    case OpKind::sX:  // a forward task's stash out, a backward task's in
      if (t.type == TaskType::Fwd) {
        f.reads.push_back(dev(K::Act, lf));
        f.writes.push_back(host(K::HostStash, lf));
      } else {
        f.reads.push_back(host(K::HostStashMsg, lf));
        f.writes.push_back(dev(K::Stash, lf));
      }
      return;
    case OpKind::MSGsX:
      f.reads.push_back(host(K::HostStash, lf));
      f.writes.push_back(host(K::HostStashMsg, lf));
      return;
    case OpKind::MSGY:
      f.reads.push_back(host(K::HostY, ll + 1));
      f.writes.push_back(host(K::HostYMsg, ll + 1));
      return;
    case OpKind::Y:
      f.reads.push_back(dev(K::Act, ll + 1));
      if (op.peer < 0) f.writes.push_back(host(K::HostY, ll + 1));
      return;
    case OpKind::dX:
      f.reads.push_back(dev(K::Grad, lf));
      if (op.peer < 0) f.writes.push_back(host(K::HostGrad, lf));
      return;
    default:  // dY
      if (op.peer < 0) f.reads.push_back(host(K::HostGrad, ll + 1));
      f.writes.push_back(dev(K::Grad, ll + 1));
      return;
  }
}

void HarmonyFlow::flow_of(const Op& op, OpFlow& f) {
  const Task& t = task(op);
  const int d = op.device, lf = op.layers.first, ll = op.layers.last, s0 = f.s0, n = f.n;
  const auto task_tensor = [&](K k) { return df_.intern(FlowTensor{d, k, t.layers.first, 0, 0, op.task}); };
  const auto dev = [&](K k, int l) { return df_.intern(FlowTensor{d, k, l, s0, n, -1}); };
  switch (op.kind) {
    case OpKind::WB:
      f.writes.push_back(task_tensor(K::W));
      return;
    case OpKind::FWD:
      f.reads.push_back(task_tensor(K::W));
      f.reads.push_back(dev(K::Act, lf));
      f.writes.push_back(dev(K::Act, ll + 1));
      return;
    case OpKind::REC:  // keeps every layer's activations and every input but the first for the BWD
      f.reads.push_back(task_tensor(K::W));
      f.reads.push_back(dev(t.has_criterion ? K::Act : K::Stash, lf));
      for (int l = lf; l <= ll; ++l) {
        f.writes.push_back(dev(K::RecAct, l));
        if (l < ll) f.writes.push_back(dev(K::RecX, l + 1));
      }
      return;
    case OpKind::BWD:  // the first microbatch starts the gradient, the others add to it
      f.reads.push_back(task_tensor(K::W));
      f.reads.push_back(dev(t.has_criterion ? K::Act : K::Stash, lf));
      if (op.ui > 0) f.reads.push_back(task_tensor(K::DW));
      if (!t.has_criterion) f.reads.push_back(dev(K::Grad, ll + 1));
      for (int l = lf; l <= ll; ++l) {
        if (l > lf) f.reads.push_back(dev(K::RecX, l));
        f.reads.push_back(dev(K::RecAct, l));
      }
      f.writes.push_back(task_tensor(K::DW));
      if (lf > 0) f.writes.push_back(dev(K::Grad, lf));
      return;
    case OpKind::ARD:
      f.reads.push_back(task_tensor(K::DW));
      f.writes.push_back(task_tensor(K::DW));
      return;
    case OpKind::dWB:  // into the host gradients (HostState), which the dataflow does not track
      f.reads.push_back(task_tensor(K::DW));
      return;
    case OpKind::DEL:
      f.frees.push_back(task_tensor(K::W));
      f.frees.push_back(task_tensor(K::DW));
      return;
    case OpKind::Update:
      return;
    default:
      flow_of_transfer(op, f);
  }
}

Dataflow HarmonyFlow::derive() {
  df_.ops.resize(p_.ops.size());
  for (std::size_t o = 0; o < p_.ops.size(); ++o) {
    const Op& op = p_.ops[o];
    const Task& t = task(op);
    OpFlow& f = df_.ops[o];
    f.pass = t.type == TaskType::Fwd ? Pass::Fwd : t.type == TaskType::Bwd ? Pass::Bwd : Pass::Update;
    f.layers = t.layers;
    const bool per_pack = op.kind == OpKind::WB || op.kind == OpKind::dWB || op.kind == OpKind::ARD ||
                          op.kind == OpKind::DEL || op.kind == OpKind::Update;
    if (!per_pack) std::tie(f.s0, f.n) = samples(op);
    flow_of(op, f);
  }
  return std::move(df_);
}

}  // namespace

Dataflow harmony_dataflow(const Program& p) { return HarmonyFlow(p).derive(); }

}  // namespace harmony::core
