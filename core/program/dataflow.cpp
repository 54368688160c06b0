// The dataflow type (dataflow.hpp) and the swapping kinds' derivation: each op's pass, layer and microbatch decoded
// from its pseudo task, the samples it works on, and what it reads, writes and frees, as the executor runs it.
#include "core/program/dataflow.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program.hpp"

namespace harmony::core {

const char* pass_name(Pass p) {
  constexpr const char* n[] = {"fwd", "bwd", "update"};
  return n[static_cast<int>(p)];
}

const char* flow_kind_name(FlowKind k) {
  constexpr const char* n[] = {
      "Act",   "Stash",      "dX",   "W",      "W shard", "dW",         "dW shard",       "host stash", "host dX",
      "saved", "host saved", "RecX", "RecAct", "host Y",  "host Y msg", "host stash msg", "opt state"};
  return n[static_cast<int>(k)];
}

bool on_host(FlowKind k) {
  return k == FlowKind::HostStash || k == FlowKind::HostGrad || k == FlowKind::HostSaved || k == FlowKind::HostY ||
         k == FlowKind::HostYMsg || k == FlowKind::HostStashMsg;
}

int Dataflow::intern(const FlowTensor& t) {
  const auto [it, fresh] = ids_.emplace(t, static_cast<int>(tensors.size()));
  if (fresh) tensors.push_back(t);
  return it->second;
}

int Dataflow::find(const FlowTensor& t) const {
  const auto it = ids_.find(t);
  return it == ids_.end() ? -1 : it->second;
}

bool Dataflow::covers(const Program& p) const { return ops.size() == p.ops.size(); }

namespace {

using K = FlowKind;
using Keys = std::vector<FlowTensor>;

bool names_saved(const TensorRefs& refs) {
  return std::any_of(refs.begin(), refs.end(), [](const TensorRef& r) { return r.kind == TensorKind::Saved; });
}

// The swapping derivation's state: the Program, its shape, and per op what the reads and writes depend on.
class SwappingFlow {
 public:
  explicit SwappingFlow(const Program& p) : p_(p), R_(p.graph.num_layers), N_(p.num_devices()) {
    sharded_ = std::any_of(p_.ops.begin(), p_.ops.end(),
                           [](const Op& op) { return op.kind == OpKind::AG || op.kind == OpKind::RS; });
    device_update_ = updates_on_device_over_host_state(p_);
    const bool pp = !p_.graph.plan.kind->data_parallel;  // pp-swap: every stage sees all samples
    offset_.assign(static_cast<std::size_t>(N_), 0);
    for (int r = 0, off = 0; r < N_; ++r) {
      offset_[static_cast<std::size_t>(r)] = pp ? 0 : off;
      for (int u : p_.graph.ubatch_fwd.at(static_cast<std::size_t>(r))) off += u;
    }
  }

  Dataflow derive();

 private:
  struct Facts {            // per op, beyond its OpFlow
    bool saved = false;     // FWD: keeps its saved activations (keep); sX: moves saved activations, not an input
    bool fresh_dw = false;  // BWD: starts the weight gradient at zero (the op allocates it)
    K bwd_input = K::Act;   // REC, BWD: Stash if the input was brought back, else Act
  };
  const Op& at(int o) const { return p_.ops[static_cast<std::size_t>(o)]; }
  std::string label(int o) const { return p_.op_label(o); }
  void decode(int o, OpFlow& f) const;  // pass, layer, samples; the shape checks
  int first_sample(int device, int microbatch, const char* what, int o) const;
  Keys writes_of(int o) const;
  Keys reads_of(int o) const;
  std::optional<FlowTensor> freed(int o, const TensorRef& r) const;

  const Program& p_;
  int R_ = 0, N_ = 0;
  bool sharded_ = false;  // zero-infinity with N > 1: WB brings a shard, AG gathers, RS reduce-scatters
  // host-stream: the Updates run on the GPUs over state kept in host memory. The update pass's WB brings a layer's
  // AdamW state (Opt) and, for a layer whose weights stream (a WB of the forward or backward brings them: `streamed_`),
  // its weights and host gradient; the Update reads W, DW and Opt and writes W and Opt; the update pass's dWB takes W
  // and Opt home. A layer whose weights stay on the GPU has no writer of W but its Update (carried across steps).
  bool device_update_ = false;
  std::set<std::pair<int, int>> streamed_;  // (device, layer) with a WB outside the update pass
  bool streamed(int d, int l) const { return streamed_.count({d, l}) != 0; }
  std::vector<int> offset_;  // per device: its first sample
  Dataflow df_;
  std::vector<Facts> facts_;
};

int SwappingFlow::first_sample(int device, int microbatch, const char* what, int o) const {
  const auto& list = p_.graph.ubatch_fwd.at(static_cast<std::size_t>(device));
  if (microbatch < 0 || microbatch >= static_cast<int>(list.size()))
    throw ScheduleError(
        fmt::format("dataflow: op {} {} microbatch {}, not in GPU {}'s list", label(o), what, microbatch, device));
  int s0 = offset_[static_cast<std::size_t>(device)];
  for (int i = 0; i < microbatch; ++i) s0 += list[static_cast<std::size_t>(i)];
  return s0;
}

void SwappingFlow::decode(int o, OpFlow& f) const {
  const Op& op = at(o);
  const int rel = op.task - op.device * 3 * R_;
  if (rel < 0 || rel >= 3 * R_)
    throw ScheduleError(fmt::format("dataflow: op {}: task {} is not a swapping kind's pseudo task of GPU {}", label(o),
                                    op.task, op.device));
  f.pass = rel < R_ ? Pass::Fwd : rel < 2 * R_ ? Pass::Bwd : Pass::Update;
  const int layer = rel < R_ ? rel : rel < 2 * R_ ? 2 * R_ - 1 - rel : 3 * R_ - 1 - rel;
  f.layers = LayerRange{layer, layer};
  if (op.ubs > 0) {
    const auto& list = p_.graph.ubatch_fwd.at(static_cast<std::size_t>(op.device));
    f.s0 = first_sample(op.device, op.ui, "runs", o);
    if (list[static_cast<std::size_t>(op.ui)] != op.ubs)
      throw ScheduleError(fmt::format("dataflow: op {}: microbatch {} of size {} is not in GPU {}'s list", label(o),
                                      op.ui, op.ubs, op.device));
    f.n = op.ubs;
  }
  if (op.kind != OpKind::DEL && op.layers.first != op.layers.last)
    throw ScheduleError(fmt::format("dataflow: op {} spans layers {}..{}; a swapping kind's ops are per layer",
                                    label(o), op.layers.first, op.layers.last));
  if (op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY)
    throw ScheduleError(
        fmt::format("dataflow: op {}: {} is not a swapping kind's op", label(o), op_kind_name(op.kind)));
}

Dataflow SwappingFlow::derive() {
  const std::size_t n = p_.ops.size();
  df_.ops.resize(n);
  facts_.resize(n);
  std::vector<Keys> writes(n);
  std::set<FlowTensor> produced;
  for (std::size_t o = 0; o < n; ++o) {
    const Op& op = p_.ops[o];
    decode(static_cast<int>(o), df_.ops[o]);
    if (op.kind == OpKind::WB && df_.ops[o].pass != Pass::Update) streamed_.emplace(op.device, op.layers.first);
    if (op.kind == OpKind::FWD) facts_[o].saved = names_saved(op.allocs);
    if (op.kind == OpKind::sX) facts_[o].saved = names_saved(op.stream == Stream::SwapOut ? op.frees : op.allocs);
  }
  for (std::size_t o = 0; o < n; ++o) {  // after streamed_ is known
    writes[o] = writes_of(static_cast<int>(o));
    produced.insert(writes[o].begin(), writes[o].end());
  }
  for (std::size_t o = 0; o < n; ++o) {
    const Op& op = p_.ops[o];
    const OpFlow& f = df_.ops[o];
    if (op.kind == OpKind::BWD)
      facts_[o].fresh_dw = std::any_of(op.allocs.begin(), op.allocs.end(),
                                       [](const TensorRef& r) { return r.kind == TensorKind::WeightGrad; });
    if (op.kind == OpKind::BWD || op.kind == OpKind::REC)
      facts_[o].bwd_input =
          produced.count(FlowTensor{op.device, K::Stash, f.layers.first, f.s0, f.n}) > 0 ? K::Stash : K::Act;
  }
  for (std::size_t o = 0; o < n; ++o) {
    OpFlow& f = df_.ops[o];
    for (const FlowTensor& t : reads_of(static_cast<int>(o))) f.reads.push_back(df_.intern(t));
    for (const FlowTensor& t : writes[o]) f.writes.push_back(df_.intern(t));
    for (const TensorRef& r : p_.ops[o].frees)
      if (const std::optional<FlowTensor> t = freed(static_cast<int>(o), r)) f.frees.push_back(df_.intern(*t));
  }
  return std::move(df_);
}

Keys SwappingFlow::writes_of(int o) const {
  const Op& op = at(o);
  const OpFlow& f = df_.ops[static_cast<std::size_t>(o)];
  const bool saved = facts_[static_cast<std::size_t>(o)].saved;
  const int d = op.device, l = op.layers.first, s0 = f.s0, n = f.n;
  switch (op.kind) {
    case OpKind::X:  // the data (forward: the input; backward: re-read as the stash), or a stage input
      if (op.peer >= 0) return {FlowTensor{d, K::Act, l, s0, n}};
      if (l != 0 || op.stream != Stream::SwapIn)
        throw ScheduleError(fmt::format("dataflow: op {}: an X of layer {} that is neither data nor P2P", label(o), l));
      return {FlowTensor{d, f.pass == Pass::Bwd ? K::Stash : K::Act, 0, s0, n}};
    case OpKind::sX:
      if (saved) return {FlowTensor{d, op.stream == Stream::SwapOut ? K::HostSaved : K::Saved, l, s0, n}};
      if (op.stream == Stream::SwapOut) return {FlowTensor{d, K::HostStash, l, s0, n}};
      return {FlowTensor{d, f.pass == Pass::Bwd ? K::Stash : K::Act, l, s0, n}};
    case OpKind::dY:
      return {FlowTensor{d, K::Grad, op.layers.last + 1, s0, n}};
    case OpKind::dX:
      return op.peer >= 0 ? Keys{} : Keys{FlowTensor{d, K::HostGrad, l, s0, n}};
    case OpKind::Y:
      if (op.peer < 0) throw ScheduleError(fmt::format("dataflow: op {}: a Y without a P2P receiver", label(o)));
      return {};
    case OpKind::FWD: {
      Keys w;
      if (l + 1 < R_) w.push_back(FlowTensor{d, K::Act, l + 1, s0, n});
      if (saved) w.push_back(FlowTensor{d, K::Saved, l, s0, n});
      return w;
    }
    case OpKind::REC:
      return {FlowTensor{d, K::Saved, l, s0, n}};
    case OpKind::BWD: {
      Keys w{FlowTensor{d, K::DW, l, 0, 0}};
      if (l > 0) w.push_back(FlowTensor{d, K::Grad, l, s0, n});
      return w;
    }
    case OpKind::WB:
      if (device_update_ && f.pass == Pass::Update) {
        if (!streamed(d, l)) return {FlowTensor{d, K::Opt, l, 0, 0}};
        return {FlowTensor{d, K::Opt, l, 0, 0}, FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, K::DW, l, 0, 0}};
      }
      return {FlowTensor{d, sharded_ ? K::WShard : K::W, l, 0, 0}};
    case OpKind::Update:
      if (device_update_ && !host_update(op)) return {FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, K::Opt, l, 0, 0}};
      return {};
    case OpKind::AG:
      return {FlowTensor{d, K::W, l, 0, 0}};
    case OpKind::ARD:
      return {FlowTensor{d, K::DW, l, 0, 0}};
    case OpKind::RS:
      return {FlowTensor{d, K::DWShard, l, 0, 0}};
    default:  // dWB, Update, DEL: host gradients, host weights, nothing
      return {};
  }
}

Keys SwappingFlow::reads_of(int o) const {
  const Op& op = at(o);
  const OpFlow& f = df_.ops[static_cast<std::size_t>(o)];
  const Facts& x = facts_[static_cast<std::size_t>(o)];
  const int d = op.device, l = op.layers.first, s0 = f.s0, n = f.n;
  switch (op.kind) {
    case OpKind::sX:
      if (x.saved) return {FlowTensor{d, op.stream == Stream::SwapOut ? K::Saved : K::HostSaved, l, s0, n}};
      if (op.stream == Stream::SwapOut) return {FlowTensor{d, K::Act, l, s0, n}};
      return {FlowTensor{d, K::HostStash, l, s0, n}};
    case OpKind::dY:
      return op.peer >= 0 ? Keys{} : Keys{FlowTensor{d, K::HostGrad, op.layers.last + 1, s0, n}};
    case OpKind::dX:
      return {FlowTensor{d, K::Grad, l, s0, n}};
    case OpKind::Y:
      return {FlowTensor{d, K::Act, op.layers.last + 1, s0, n}};
    case OpKind::FWD:
      return {FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, K::Act, l, s0, n}};
    case OpKind::REC:
      return {FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, x.bwd_input, l, s0, n}};
    case OpKind::BWD: {
      Keys r{FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, x.bwd_input, l, s0, n}, FlowTensor{d, K::Saved, l, s0, n}};
      if (l + 1 < R_) r.push_back(FlowTensor{d, K::Grad, l + 1, s0, n});
      if (!x.fresh_dw) r.push_back(FlowTensor{d, K::DW, l, 0, 0});
      return r;
    }
    case OpKind::AG:
      return {FlowTensor{d, K::WShard, l, 0, 0}};
    case OpKind::ARD:
    case OpKind::RS:
      return {FlowTensor{d, K::DW, l, 0, 0}};
    case OpKind::dWB:
      if (device_update_ && f.pass == Pass::Update)
        return {FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, K::Opt, l, 0, 0}};
      return {FlowTensor{d, sharded_ ? K::DWShard : K::DW, l, 0, 0}};
    case OpKind::Update:
      if (device_update_ && !host_update(op))
        return {FlowTensor{d, K::W, l, 0, 0}, FlowTensor{d, K::DW, l, 0, 0}, FlowTensor{d, K::Opt, l, 0, 0}};
      return {};
    default:
      return {};
  }
}

// The tensor a Program free (TensorRef) of op o names: its kind and microbatch mapped to a FlowTensor. A weight or
// gradient free names the shard where the op reads the shard (AG; dWB under zero-infinity).
std::optional<FlowTensor> SwappingFlow::freed(int o, const TensorRef& r) const {
  const Op& op = at(o);
  const int d = op.device, l = r.layers.first;
  const auto mb = [&](K k) {
    const int s0 = first_sample(d, r.microbatch, "frees a tensor of", o);
    return FlowTensor{d, k, l, s0,
                      p_.graph.ubatch_fwd[static_cast<std::size_t>(d)][static_cast<std::size_t>(r.microbatch)]};
  };
  switch (r.kind) {
    case TensorKind::Activation:
      return mb(K::Act);
    case TensorKind::Stash:
      return mb(K::Stash);
    case TensorKind::ActGrad:
      return mb(K::Grad);
    case TensorKind::Saved:
      return mb(K::Saved);
    case TensorKind::Weights:
      return FlowTensor{d, op.kind == OpKind::AG ? K::WShard : K::W, l, 0, 0};
    case TensorKind::WeightGrad:
      return FlowTensor{d, op.kind == OpKind::dWB && sharded_ ? K::DWShard : K::DW, l, 0, 0};
    case TensorKind::OptState:  // a device update's AdamW state (host-stream); the other kinds' is not a tensor here
      if (device_update_) return FlowTensor{d, K::Opt, l, 0, 0};
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace

Dataflow swapping_dataflow(const Program& p) { return SwappingFlow(p).derive(); }

}  // namespace harmony::core
