// The executor's interpreter of the swapping kinds' Programs (ExecutorDialect::Swapping: dp-swap, pp-swap,
// zero-infinity, l2l, lohan): per-layer ops with pseudo task ids and no Harmony tasks. Tensors are versioned by the op
// that produced them; which version an op reads (the latest producer among its ancestors) and every host gradient and
// weight an Update touches are checked when the executor is built, so a missing dependency is refused before any step.
// Ops of different queues run on their own streams and worker threads (detail.hpp's lock discipline). A kind with
// resident state (PlanKindSpec::resident_state: resident) keeps its weights, gradients and AdamW state in one
// DeviceState per device across steps instead: its FWD/BWD read them there, its ARD sums them in place, and its
// Update runs AdamW on the device; sync_host_state() copies them back into the HostState.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/device_state.hpp"
#include "backend/rank_sum.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::backend::detail {

namespace {
using core::OpKind;

// Tensor kinds. Device: a layer's input activation (Act; layer 0: the token ids), a stashed input brought back
// for the backward (Stash), the gradient of a layer's input (Grad), a layer's weights (W) or this rank's shard
// of them (WShard, zero-infinity), its weight gradient (DW) or this rank's reduced shard (DWShard), the saved
// activations of a layer's forward its backward reads (Saved: written by the REC of the checkpoint policy, or
// kept by the FWD under keep). Host memory of the device's process: a swapped-out stash (HostStash), a
// swapped-out input gradient (HostGrad, l2l), swapped-out saved activations (HostSaved, keep).
enum class TK : std::uint8_t { Act, Stash, Grad, W, WShard, DW, DWShard, HostStash, HostGrad, Saved, HostSaved };
const char* tk_name(TK k) {
  constexpr const char* n[] = {"Act",      "Stash",      "dX",      "W",     "W shard",   "dW",
                               "dW shard", "host stash", "host dX", "saved", "host saved"};
  return n[static_cast<int>(k)];
}
bool on_host(TK k) { return k == TK::HostStash || k == TK::HostGrad || k == TK::HostSaved; }
bool names_saved(const core::TensorRefs& refs) {
  return std::any_of(refs.begin(), refs.end(),
                     [](const core::TensorRef& r) { return r.kind == core::TensorKind::Saved; });
}

struct Key {
  int dev = 0;  // the device (host tensors: the host memory of that device's process)
  TK kind = TK::Act;
  int layer = 0;
  int s0 = 0;  // first sample; 0 for per-layer tensors
  int n = 0;   // samples; 0 for per-layer tensors
  auto operator<=>(const Key&) const = default;
};
struct Version {  // a tensor as produced by one op
  Key key;
  int producer = -1;
  auto operator<=>(const Version&) const = default;
};
struct Tensor {
  Buffer buf;                  // device tensors
  std::vector<std::byte> mem;  // host tensors
  std::vector<int> users;      // the ops whose work used it this step: freed after their events (retire)
  void* data() { return buf ? buf.data() : static_cast<void*>(mem.data()); }
};

enum class Pass : std::uint8_t { Fwd, Bwd, Upd };

struct OpInfo {
  Pass pass = Pass::Fwd;
  int layer = 0;                           // the pseudo task's layer
  int s0 = 0, n = 0;                       // the op's microbatch (ubs > 0)
  std::vector<std::pair<Key, int>> reads;  // tensor and the version it reads (the producer)
  std::vector<Key> writes;                 // tensors it produces
  bool fresh_dw = false;                   // BWD: starts the weight gradient at zero (the op allocates it)
  TK bwd_input = TK::Act;                  // REC, BWD: Stash if the input was brought back, else Act
  bool saved = false;      // FWD: keeps its saved activations (keep); sX: moves saved activations, not an input
  std::vector<int> group;  // ops run together (P2P pair, collective), in run order
};

// The host's gradient of one layer in one process: the sum of the gradients (or shards) its dWB ops brought.
struct HostSum {
  std::vector<float> sum;
  std::vector<std::uint8_t> has;  // per element: some dWB wrote it
};

class BaselineInterpreter final : public Interpreter {
 public:
  BaselineInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o)
      : p_(prog), devs_(std::move(d)), st_(s), opt_(o), m_(s.model()), qr_(prog, devs_, o) {
    B_ = p_.graph.plan.minibatch;
    T_ = opt_.seq_len;
    R_ = m_.num_layers();
    N_ = p_.num_devices();
    pp_ = !p_.graph.plan.kind->data_parallel;  // pp-swap
    dt_ = opt_.dtype;
    es_ = dtype_bytes(dt_);
    staging_chunk_bytes = opt_.staging_chunk_bytes;
    if (dt_ == DType::BF16)
      for (Device* dev : devs_) require_bf16(*dev, "executor");
    resident_ = p_.graph.plan.kind->resident_state;
    analyse();
    if (resident_) make_states();
  }

  const std::vector<std::vector<int>>& extra_deps() const override { return extra_; }

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override {
    in_ = inputs;
    tgt_ = targets;
    losses_.assign(static_cast<std::size_t>(B_) * static_cast<std::size_t>(T_), 0.0f);
    loss_written_.assign(static_cast<std::size_t>(B_), 0);
    store_.clear();
    left_ = readers_;
    acc_.clear();
    updated_.assign(static_cast<std::size_t>(R_), 0);
    gathered_.assign(static_cast<std::size_t>(R_), 0);
    qr_.begin_step();
    // resident: every BWD adds into the device gradient, which starts each step at zero (on the stream that runs
    // the device's BWD, ARD and Update ops, after the previous step's Updates)
    for (std::size_t d = 0; d < states_.size(); ++d) states_[d]->zero_grads(state_stream(static_cast<int>(d)));
  }

  std::vector<int> group(int o) const override { return info_[static_cast<std::size_t>(o)].group; }

  // Event ordering (QueueResources, as the Harmony interpreter): the host issues a group once its queues are at
  // most kRunAhead ops ahead of their devices; an Update waits on the host for its preds' events, the other ops
  // make their streams wait for them; each member's event is recorded after the group's work.
  void run(const std::vector<int>& g) override {
    const std::shared_ptr<void> range = qr_.range(g.front());  // NVTX on CUDA, named like the trace's op
    const core::Op& op = at(g.front());
    const bool host = core::host_update(op);
    qr_.await_preds(g, extra_, host, [&](auto&& fn) { unlocked(fn); });
    qr_.issue(g, times, host, [&] {
      if (op.peer >= 0) {
        run_pair(g[0], g[1]);
        return;
      }
      switch (op.kind) {
        case OpKind::ARD:
          run_ard(g);
          break;
        case OpKind::AG:
          run_ag(g);
          break;
        case OpKind::RS:
          run_rs(g);
          break;
        default:
          run_op(g.front());
      }
    });
  }

  void finished(int o) override {
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    for (const auto& [k, producer] : oi.reads) {
      const Version v{k, producer};
      auto it = left_.find(v);
      if (it != left_.end() && --it->second == 0) drop(v);
    }
    for (const Key& k : oi.writes)
      if (readers_.count(Version{k, o}) == 0) drop(Version{k, o});
  }

  void abandon_step() override { store_.clear(); }

  double end_step() override {
    qr_.synchronize();  // the losses' copies, every stream-ordered free
    store_.clear();
    for (int s = 0; s < B_; ++s)
      if (loss_written_[static_cast<std::size_t>(s)] != 1)
        throw BackendError(fmt::format("executor: the Program's head forwards computed the loss of sample {} {} times",
                                       s, static_cast<int>(loss_written_[static_cast<std::size_t>(s)])));
    double total = 0.0;
    for (const float x : losses_) total += x;
    // resident: the replicas' updates saw the same all-reduced gradients, so their findings agree: device 0's
    // speaks for the step (every device's flags are cleared)
    for (std::size_t d = 0; d < states_.size(); ++d) {
      const auto found = states_[d]->take_nonfinite(state_stream(static_cast<int>(d)));
      if (d == 0) note_nonfinite(found);
    }
    return total / static_cast<double>(losses_.size());
  }

  void synchronize() override { qr_.synchronize(); }

  void sync_host_state() override {
    if (states_.empty()) return;
    qr_.synchronize();
    states_.front()->download(state_stream(0), st_);
  }

 private:
  bool frees_pending(const Device& device) override { return qr_.frees_pending(device); }
  // Erases a tensor; its memory (device or host) is freed once the work of every op that used it has run.
  void drop(const Version& v) {
    auto it = store_.find(v);
    if (it == store_.end()) return;
    const std::vector<int> users = std::move(it->second.users);
    qr_.retire(v.key.dev, users, std::make_shared<Tensor>(std::move(it->second)));
    store_.erase(it);
  }
  // A temporary of op o's work, freed when o's stream has run past it.
  void release_after(int o, Buffer& b) { qr_.release_after(o, std::move(b)); }
  // Host memory an async copy of op o reads: kept until o's stream has run past the copy.
  void keep_until_done(int o, std::shared_ptr<void> held) { qr_.release_after(S(o), at(o).device, std::move(held)); }
  const core::Op& at(int o) const { return p_.ops[static_cast<std::size_t>(o)]; }
  std::string label(int o) const { return op_name(p_, o); }
  Device& D(int d) { return *devs_[static_cast<std::size_t>(d)]; }
  Stream& S(int o) { return qr_.stream(o); }  // the stream of op o's queue
  // Waits for op o's stream with the interpreter's lock released, so other queues' ops proceed meanwhile: only
  // where the host reads what o's work brought down (grads_down).
  void sync(int o) { wait_unlocked(S(o)); }
  Bytes per_sample(int l) const { return m_.input_bytes(l, 1, T_, dt_); }
  Bytes saved_bytes(int l, int n) const { return m_.act_floats(l, n, T_) * es_; }  // the forward's act of layer l
  // Copies `count` gradient elements of device memory to fp32 host memory (bf16: staged down and widened
  // exactly, Interpreter::stage_down), then returns: the host reads the result.
  void grads_down(int o, int d, float* dst, const void* src, std::int64_t count) {
    if (count == 0) return;
    if (dt_ == DType::F32) {
      D(d).copy_d2h(S(o), dst, src, count * kF);
      sync(o);
      return;
    }
    const std::span<float> to(dst, static_cast<std::size_t>(count));
    stage_down(qr_.queue(o), D(d), S(o), std::span<const std::span<float>>(&to, 1), src);
  }
  // Copies `count` fp32 host gradient elements from (*sum)[first...] to device memory (bf16: rounded once, staged
  // up), asynchronously: an fp32 copy reads the sum, which lives until o's stream has run it.
  void grads_up(int o, int d, void* dst, const std::shared_ptr<std::vector<float>>& sum, std::int64_t first,
                std::int64_t count) {
    const float* src = sum->data() + first;
    if (dt_ == DType::F32) {
      D(d).copy_h2d(S(o), dst, src, count * kF);
      keep_until_done(o, sum);
      return;
    }
    const std::span<const float> from(src, static_cast<std::size_t>(count));
    stage_up(qr_.queue(o), D(d), S(o), dst, std::span<const std::span<const float>>(&from, 1));
  }
  std::int64_t floats(int l) const { return m_.param_floats(l); }
  // zero-infinity: rank r's shard of a layer is floats [r S, min(F, (r+1) S)), S = ceil(F / N) (ZeRO pads the
  // partitions to equal sizes; the Program's shard bytes ceil(bytes / N) round the same sizes in bytes).
  std::int64_t shard_floats(int l) const { return (floats(l) + N_ - 1) / N_; }
  std::int64_t shard_first(int l, int r) const { return std::min(floats(l), r * shard_floats(l)); }
  std::int64_t shard_len(int l, int r) const {
    return std::min(floats(l), (r + 1) * shard_floats(l)) - shard_first(l, r);
  }

  std::string tname(const Key& k) const {
    const std::string dev = devs_[static_cast<std::size_t>(k.dev)]->name();
    const std::string where = on_host(k.kind) ? "the host of " + dev : dev;
    if (k.n == 0) return fmt::format("{} {} of layer {}", where, tk_name(k.kind), k.layer);
    return fmt::format("{} {} of layer {} samples [{}, {})", where, tk_name(k.kind), k.layer, k.s0, k.s0 + k.n);
  }

  // ---------------------------------------------------------------------------------------------------------
  // Static analysis: what every op reads and writes, which version each read sees, the groups, the checks.

  void analyse() {
    const std::size_t n = p_.ops.size();
    info_.resize(n);
    sharded_ = std::any_of(p_.ops.begin(), p_.ops.end(),
                           [](const core::Op& op) { return op.kind == OpKind::AG || op.kind == OpKind::RS; });
    offset_.assign(static_cast<std::size_t>(N_), 0);
    for (int r = 0, off = 0; r < N_; ++r) {
      offset_[static_cast<std::size_t>(r)] = pp_ ? 0 : off;
      for (int u : p_.graph.ubatch_fwd.at(static_cast<std::size_t>(r))) off += u;
    }
    for (std::size_t o = 0; o < n; ++o) {
      const core::Op& op = p_.ops[o];
      OpInfo& oi = info_[o];
      const int rel = op.task - op.device * 3 * R_;
      if (rel < 0 || rel >= 3 * R_)
        throw BackendError(fmt::format("executor: op {}: task {} is not a baseline pseudo task of GPU {}",
                                       label(static_cast<int>(o)), op.task, op.device));
      oi.pass = rel < R_ ? Pass::Fwd : rel < 2 * R_ ? Pass::Bwd : Pass::Upd;
      oi.layer = rel < R_ ? rel : rel < 2 * R_ ? 2 * R_ - 1 - rel : 3 * R_ - 1 - rel;
      if (op.ubs > 0) {
        const auto& list = p_.graph.ubatch_fwd.at(static_cast<std::size_t>(op.device));
        if (op.ui < 0 || op.ui >= static_cast<int>(list.size()) || list[static_cast<std::size_t>(op.ui)] != op.ubs)
          throw BackendError(fmt::format("executor: op {}: microbatch {} of size {} is not in GPU {}'s list",
                                         label(static_cast<int>(o)), op.ui, op.ubs, op.device));
        oi.s0 = offset_[static_cast<std::size_t>(op.device)];
        for (int i = 0; i < op.ui; ++i) oi.s0 += list[static_cast<std::size_t>(i)];
        oi.n = op.ubs;
      }
      const bool per_layer = op.kind != OpKind::DEL;
      if (per_layer && op.layers.first != op.layers.last)
        throw BackendError(fmt::format("executor: op {} spans layers {}..{}; baseline ops are per layer",
                                       label(static_cast<int>(o)), op.layers.first, op.layers.last));
      if (op.kind == OpKind::FWD) oi.saved = names_saved(op.allocs);
      if (op.kind == OpKind::sX) oi.saved = names_saved(op.stream == core::Stream::SwapOut ? op.frees : op.allocs);
      if (op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY)
        throw BackendError(fmt::format("executor: op {}: {} is not a baseline op", label(static_cast<int>(o)),
                                       core::op_kind_name(op.kind)));
      oi.writes = writes_of(static_cast<int>(o));
      if (resident_) std::erase_if(oi.writes, [](const Key& k) { return in_state(k.kind); });
    }
    for (std::size_t o = 0; o < n; ++o)
      for (const Key& k : info_[o].writes) producers_[k].push_back(static_cast<int>(o));
    for (std::size_t o = 0; o < n; ++o) {
      OpInfo& oi = info_[o];
      const core::Op& op = p_.ops[o];
      if (op.kind == OpKind::BWD)
        oi.fresh_dw = std::any_of(op.allocs.begin(), op.allocs.end(),
                                  [](const core::TensorRef& r) { return r.kind == core::TensorKind::WeightGrad; });
      if (op.kind == OpKind::BWD || op.kind == OpKind::REC)
        oi.bwd_input = producers_.count(Key{op.device, TK::Stash, oi.layer, oi.s0, oi.n}) > 0 ? TK::Stash : TK::Act;
    }
    build_groups();
    build_update_edges();
    const Ancestry anc(p_, extra_);
    for (std::size_t o = 0; o < n; ++o) {
      for (const Key& k : reads_of(static_cast<int>(o))) {
        if (resident_ && in_state(k.kind)) continue;  // the DeviceState's, ordered by check_resident_updates
        const int v = reaching(anc, static_cast<int>(o), k);
        info_[o].reads.emplace_back(k, v);
        ++readers_[Version{k, v}];
      }
    }
    check_frees(anc);
    if (resident_) {
      check_resident_updates(anc);
    } else {
      check_updates(anc);
    }
  }

  // The device tensor a Program free (TensorRef) of op o names: its kind and microbatch mapped to a Key. A
  // weight or gradient free names the shard where the op reads the shard (AG; dWB under zero-infinity).
  std::optional<Key> freed_key(int o, const core::TensorRef& r) const {
    const core::Op& op = at(o);
    const int d = op.device, l = r.layers.first;
    auto mb = [&](TK k) {
      const auto& list = p_.graph.ubatch_fwd.at(static_cast<std::size_t>(d));
      if (r.microbatch < 0 || r.microbatch >= static_cast<int>(list.size()))
        throw BackendError(fmt::format("executor: op {} frees a tensor of microbatch {}, not in GPU {}'s list",
                                       label(o), r.microbatch, d));
      int s0 = offset_[static_cast<std::size_t>(d)];
      for (int i = 0; i < r.microbatch; ++i) s0 += list[static_cast<std::size_t>(i)];
      return Key{d, k, l, s0, list[static_cast<std::size_t>(r.microbatch)]};
    };
    switch (r.kind) {
      case core::TensorKind::Activation:
        return mb(TK::Act);
      case core::TensorKind::Stash:
        return mb(TK::Stash);
      case core::TensorKind::ActGrad:
        return mb(TK::Grad);
      case core::TensorKind::Saved:
        return mb(TK::Saved);
      case core::TensorKind::Weights:
        return Key{d, op.kind == OpKind::AG ? TK::WShard : TK::W, l, 0, 0};
      case core::TensorKind::WeightGrad:
        return Key{d, op.kind == OpKind::dWB && sharded_ ? TK::DWShard : TK::DW, l, 0, 0};
      default:
        return std::nullopt;
    }
  }

  // The Program's frees are honoured: every read of a version happens before each op that frees that version
  // (or is that op: an op frees at its end). The version a free names is the one the freeing op would read.
  void check_frees(const Ancestry& anc) const {
    std::map<Version, std::vector<int>> killers;
    for (std::size_t f = 0; f < p_.ops.size(); ++f) {
      const int fo = static_cast<int>(f);
      for (const core::TensorRef& r : p_.ops[f].frees) {
        const std::optional<Key> k = freed_key(fo, r);
        if (!k) continue;
        const auto& w = info_[f].writes;
        int v = std::find(w.begin(), w.end(), *k) != w.end() ? fo : -1;
        if (v < 0) {
          try {
            v = reaching(anc, fo, *k);
          } catch (const ScheduleViolation& e) {
            throw ScheduleViolation(fmt::format("executor: op {} frees {}: {}", label(fo), tname(*k), e.what()));
          }
        }
        killers[Version{*k, v}].push_back(fo);
      }
    }
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const int ro = static_cast<int>(o);
      for (const auto& [k, v] : info_[o].reads) {
        const auto it = killers.find(Version{k, v});
        if (it == killers.end()) continue;
        for (int f : it->second) {
          if (f == ro || anc.before(ro, f)) continue;
          if (anc.before(f, ro))
            throw ScheduleViolation(fmt::format("executor: op {} reads {} (of op {}), which op {} frees before it",
                                                label(ro), tname(k), label(v), label(f)));
          throw ScheduleViolation(
              fmt::format("executor: op {} reads {} (of op {}), which op {} may free first: "
                          "neither depends on the other",
                          label(ro), tname(k), label(v), label(f)));
        }
      }
    }
  }

  // What op o produces (its own side of a pair or collective).
  std::vector<Key> writes_of(int o) const {
    const core::Op& op = at(o);
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    const int d = op.device, l = op.layers.first, s0 = oi.s0, n = oi.n;
    switch (op.kind) {
      case OpKind::X:  // the data (forward: the input; backward: re-read as the stash), or a stage input
        if (op.peer >= 0) return {Key{d, TK::Act, l, s0, n}};
        if (l != 0 || op.stream != core::Stream::SwapIn)
          throw BackendError(
              fmt::format("executor: op {}: an X of layer {} that is neither data nor P2P", label(o), l));
        return {Key{d, oi.pass == Pass::Bwd ? TK::Stash : TK::Act, 0, s0, n}};
      case OpKind::sX:
        if (oi.saved) return {Key{d, op.stream == core::Stream::SwapOut ? TK::HostSaved : TK::Saved, l, s0, n}};
        if (op.stream == core::Stream::SwapOut) return {Key{d, TK::HostStash, l, s0, n}};
        return {Key{d, oi.pass == Pass::Bwd ? TK::Stash : TK::Act, l, s0, n}};
      case OpKind::dY:
        return {Key{d, TK::Grad, op.layers.last + 1, s0, n}};
      case OpKind::dX:
        return op.peer >= 0 ? std::vector<Key>{} : std::vector<Key>{Key{d, TK::HostGrad, l, s0, n}};
      case OpKind::Y:
        if (op.peer < 0) throw BackendError(fmt::format("executor: op {}: a Y without a P2P receiver", label(o)));
        return {};
      case OpKind::FWD: {
        std::vector<Key> w;
        if (l + 1 < R_) w.push_back(Key{d, TK::Act, l + 1, s0, n});
        if (oi.saved) w.push_back(Key{d, TK::Saved, l, s0, n});
        return w;
      }
      case OpKind::REC:
        return {Key{d, TK::Saved, l, s0, n}};
      case OpKind::BWD: {
        std::vector<Key> w{Key{d, TK::DW, l, 0, 0}};
        if (l > 0) w.push_back(Key{d, TK::Grad, l, s0, n});
        return w;
      }
      case OpKind::WB:
        return {Key{d, sharded_ ? TK::WShard : TK::W, l, 0, 0}};
      case OpKind::AG:
        return {Key{d, TK::W, l, 0, 0}};
      case OpKind::ARD:
        return {Key{d, TK::DW, l, 0, 0}};
      case OpKind::RS:
        return {Key{d, TK::DWShard, l, 0, 0}};
      default:  // dWB, Update, DEL: host gradients, host weights, nothing
        return {};
    }
  }

  // What op o reads (its own side of a pair or collective).
  std::vector<Key> reads_of(int o) const {
    const core::Op& op = at(o);
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    const int d = op.device, l = op.layers.first, s0 = oi.s0, n = oi.n;
    switch (op.kind) {
      case OpKind::sX:
        if (oi.saved) return {Key{d, op.stream == core::Stream::SwapOut ? TK::Saved : TK::HostSaved, l, s0, n}};
        if (op.stream == core::Stream::SwapOut) return {Key{d, TK::Act, l, s0, n}};
        return {Key{d, TK::HostStash, l, s0, n}};
      case OpKind::dY:
        return op.peer >= 0 ? std::vector<Key>{} : std::vector<Key>{Key{d, TK::HostGrad, op.layers.last + 1, s0, n}};
      case OpKind::dX:
        return {Key{d, TK::Grad, l, s0, n}};
      case OpKind::Y:
        return {Key{d, TK::Act, op.layers.last + 1, s0, n}};
      case OpKind::FWD:
        return {Key{d, TK::W, l, 0, 0}, Key{d, TK::Act, l, s0, n}};
      case OpKind::REC:
        return {Key{d, TK::W, l, 0, 0}, Key{d, oi.bwd_input, l, s0, n}};
      case OpKind::BWD: {
        std::vector<Key> r{Key{d, TK::W, l, 0, 0}, Key{d, oi.bwd_input, l, s0, n}, Key{d, TK::Saved, l, s0, n}};
        if (l + 1 < R_) r.push_back(Key{d, TK::Grad, l + 1, s0, n});
        if (!oi.fresh_dw) r.push_back(Key{d, TK::DW, l, 0, 0});
        return r;
      }
      case OpKind::AG:
        return {Key{d, TK::WShard, l, 0, 0}};
      case OpKind::ARD:
      case OpKind::RS:
        return {Key{d, TK::DW, l, 0, 0}};
      case OpKind::dWB:
        return {Key{d, sharded_ ? TK::DWShard : TK::DW, l, 0, 0}};
      default:
        return {};
    }
  }

  // The version of k that op o reads: the latest of its producers among o's ancestors. They must exist and be
  // ordered (two unordered producers would race for the same tensor).
  int reaching(const Ancestry& anc, int o, const Key& k) const {
    const auto it = producers_.find(k);
    int best = -1;
    if (it != producers_.end()) {
      for (int c : it->second) {
        if (c == o || !anc.before(c, o)) continue;
        if (best < 0 || anc.before(best, c)) {
          best = c;
        } else if (!anc.before(c, best)) {
          throw ScheduleViolation(
              fmt::format("executor: op {} reads {}, produced by both op {} and op {}, which are "
                          "not ordered",
                          label(o), tname(k), label(best), label(c)));
        }
      }
    }
    if (best >= 0) {  // every ancestor producer must come before the chosen one
      for (int c : it->second)
        if (c != o && anc.before(c, o) && !anc.before(c, best))
          throw ScheduleViolation(
              fmt::format("executor: op {} reads {}, produced by both op {} and op {}, which are "
                          "not ordered",
                          label(o), tname(k), label(best), label(c)));
      return best;
    }
    if (it == producers_.end())
      throw ScheduleViolation(fmt::format("executor: op {} reads {}, which no op produces", label(o), tname(k)));
    std::string names;
    for (int c : it->second) {
      if (c == o) continue;
      names += (names.empty() ? "" : ", ") + label(c);
    }
    throw ScheduleViolation(fmt::format("executor: op {} reads {}, produced by op {}, on which it does not depend",
                                        label(o), tname(k), names.empty() ? std::string("(itself)") : names));
  }

  // P2P pairs (send first) and collectives: ARD per (layer, microbatch), AG per (pass, layer, microbatch), RS per
  // (layer, microbatch), one op per GPU, in device order.
  void build_groups() {
    std::map<std::tuple<int, int, int, int>, std::vector<int>> coll;
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
      const int oo = static_cast<int>(o);
      OpInfo& oi = info_[o];
      if (op.peer >= 0) {
        const bool send = op.kind == OpKind::Y || op.kind == OpKind::dX;
        oi.group = send ? std::vector<int>{oo, op.peer} : std::vector<int>{op.peer, oo};
      } else if (op.kind == OpKind::ARD || op.kind == OpKind::AG || op.kind == OpKind::RS) {
        coll[{static_cast<int>(op.kind), op.kind == OpKind::AG ? static_cast<int>(oi.pass) : 0, op.layers.first, op.ui}]
            .push_back(oo);
      } else {
        oi.group = {oo};
      }
    }
    for (auto& [key, members] : coll) {
      std::sort(members.begin(), members.end(), [&](int a, int b) { return at(a).device < at(b).device; });
      bool ok = static_cast<int>(members.size()) == N_;
      for (std::size_t i = 0; ok && i < members.size(); ++i) ok = at(members[i]).device == static_cast<int>(i);
      if (!ok)
        throw BackendError(fmt::format("executor: collective {} has {} members for {} GPUs (one per GPU expected)",
                                       label(members.front()), members.size(), N_));
      for (int a : members) info_[static_cast<std::size_t>(a)].group = members;
    }
  }

  // Which dWB ops bring the gradient an Update(l) on device `dev` uses: its own replica's when the gradient was
  // all-reduced on the GPUs (ARD: every replica's process holds the sum), else every GPU's (l2l's parameter
  // server adds the N gradients; zero-infinity's ranks bring disjoint shards).
  std::vector<int> grad_sources(int l, int dev) const {
    std::vector<int> r;
    for (int o : dwb_[static_cast<std::size_t>(l)])
      if (!replicated_[static_cast<std::size_t>(l)] || at(o).device == dev) r.push_back(o);
    return r;
  }

  void build_update_edges() {
    dwb_.assign(static_cast<std::size_t>(R_), {});
    wb_.assign(static_cast<std::size_t>(R_), {});
    replicated_.assign(static_cast<std::size_t>(R_), 0);
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
      const auto l = static_cast<std::size_t>(op.layers.first);
      if (op.kind == OpKind::dWB) dwb_[l].push_back(static_cast<int>(o));
      if (op.kind == OpKind::WB) wb_[l].push_back(static_cast<int>(o));
      if (op.kind == OpKind::ARD) replicated_[l] = 1;
    }
    // The tie: layer 0's update also uses the head's lm_head gradient (HostState::update). core::Model knows no
    // tied weights, so the lowering need not order the head's gradient transfers before Update(0) (pp-swap with
    // the head on another stage does not); the executor waits for them.
    extra_.assign(p_.ops.size(), {});
    const int head = m_.head_layer();
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
      if (op.kind != OpKind::Update || op.layers.first != 0 || head == 0) continue;
      if (!resident_) {
        extra_[o] = grad_sources(head, op.device);
        continue;
      }
      for (std::size_t x = 0; x < p_.ops.size(); ++x) {  // resident: the head's gradient complete on this device
        const core::Op& xo = p_.ops[x];
        if (xo.device == op.device && xo.layers.first == head && (xo.kind == OpKind::BWD || xo.kind == OpKind::ARD))
          extra_[o].push_back(static_cast<int>(x));
      }
    }
  }

  // ---------------------------------------------------------------------------------------------------------
  // Resident state (PlanKindSpec::resident_state).

  // W and DW of a resident kind live in the DeviceState, not in the store (no versions, no producers).
  static bool in_state(TK k) { return k == TK::W || k == TK::DW; }

  // The stream a device's state work runs on: its compute queue's (every FWD, BWD, ARD and Update of a resident
  // Program is there), so zeroing the gradients, accumulating, summing and updating follow each other in stream order.
  Stream& state_stream(int d) { return S(state_op_[static_cast<std::size_t>(d)]); }

  // One DeviceState per device, filled from the HostState (bf16: masters exact, working copies rounded).
  void make_states() {
    state_op_.assign(static_cast<std::size_t>(N_), -1);
    for (const core::OpQueue& q : p_.queues)
      if (q.stream == core::Stream::Compute && !q.ops.empty()) state_op_[static_cast<std::size_t>(q.device)] = q.ops[0];
    for (int d = 0; d < N_; ++d) {
      if (state_op_[static_cast<std::size_t>(d)] < 0)
        throw BackendError(fmt::format("executor: the resident Program has no compute ops on GPU {}", d));
      states_.push_back(std::make_unique<DeviceState>(D(d), state_stream(d), m_, dt_));
      states_.back()->upload(state_stream(d), st_);
    }
  }

  // A resident Program moves no weights or gradients to or from the host, and on every device updates each layer with
  // parameters exactly once, on the device (not on the CPU), after every op of that device that reads the layer's
  // weights or adds to its gradient (layer 0's also after the head's: the tied lm_head gradient joins wte's update).
  void check_resident_updates(const Ancestry& anc) const {
    const int head = m_.head_layer();
    std::map<std::pair<int, int>, int> upd;  // (device, layer) -> its Update
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
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
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
      if (op.kind != OpKind::FWD && op.kind != OpKind::REC && op.kind != OpKind::BWD && op.kind != OpKind::ARD)
        continue;
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

  // Every Update(l) comes after the dWB ops its gradient needs (grad_sources), and after every WB that reads the
  // host weights it overwrites (layer l; layer 0 also rewrites the head's tied lm_head). Every layer is updated.
  void check_updates(const Ancestry& anc) const {
    const int head = m_.head_layer();
    std::vector<char> seen(static_cast<std::size_t>(R_), 0);
    for (std::size_t o = 0; o < p_.ops.size(); ++o) {
      const core::Op& op = p_.ops[o];
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

  // ---------------------------------------------------------------------------------------------------------
  // Tensors at run time.

  Tensor& get(int o, const Key& k) {
    for (const auto& [key, producer] : info_[static_cast<std::size_t>(o)].reads) {
      if (!(key == k)) continue;
      auto it = store_.find(Version{k, producer});
      if (it == store_.end())
        throw core::InternalError(
            fmt::format("executor: op {} reads {} of op {}, which is gone", label(o), tname(k), label(producer)));
      it->second.users.push_back(o);
      return it->second;
    }
    throw core::InternalError(fmt::format("executor: op {} reads {}, which it does not declare", label(o), tname(k)));
  }
  Tensor& put(int o, const Key& k, Bytes bytes) {
    const auto& w = info_[static_cast<std::size_t>(o)].writes;
    if (std::find(w.begin(), w.end(), k) == w.end())
      throw core::InternalError(
          fmt::format("executor: op {} writes {}, which it does not declare", label(o), tname(k)));
    Tensor t;
    if (on_host(k.kind)) {
      t.mem.resize(static_cast<std::size_t>(bytes));
    } else {
      t.buf = alloc_or_wait(D(k.dev), bytes, tname(k));
    }
    t.users.push_back(o);
    return store_[Version{k, o}] = std::move(t);
  }
  // The version of k op o reads (its producer).
  int read_version(int o, const Key& k) const {
    int producer = -1;
    for (const auto& [key, v] : info_[static_cast<std::size_t>(o)].reads)
      if (key == k) producer = v;
    return producer;
  }
  // Whether o, which reads version v (tensor t), may overwrite it in place: o is its last reader. Then o's stream
  // waits for the version's other users (readers on other streams whose work may still be queued; o is the last to
  // run on the host, not necessarily on the devices).
  bool writable_in_place(int o, const Version& v, const Tensor& t) {
    if (left_.at(v) != 1) return false;
    for (const int u : t.users)
      if (&S(u) != &S(o)) S(o).wait(qr_.event(u));
    return true;
  }
  // Op o reads k and writes its next version: in place when o is the last reader of the old one, else a copy.
  Tensor& update(int o, const Key& k, Bytes bytes) {
    Tensor& old = get(o, k);
    const Version ov{k, read_version(o, k)};
    if (writable_in_place(o, ov, old)) {
      auto node = store_.extract(ov);
      node.key() = Version{k, o};
      return store_.insert(std::move(node)).position->second;
    }
    const void* src = old.data();
    Tensor& t = put(o, k, bytes);
    D(k.dev).copy_d2d(S(o), t.data(), src, bytes);
    return t;
  }

  // ---------------------------------------------------------------------------------------------------------
  // Ops.

  void run_op(int o) {
    const core::Op& op = at(o);
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    const int d = op.device, l = op.layers.first, s0 = oi.s0, n = oi.n;
    switch (op.kind) {
      case OpKind::WB: {
        const std::int64_t first = sharded_ ? shard_first(l, d) : 0, len = sharded_ ? shard_len(l, d) : floats(l);
        Tensor& w = sharded_ ? put(o, Key{d, TK::WShard, l, 0, 0}, std::max<std::int64_t>(1, shard_floats(l)) * es_)
                             : put(o, Key{d, TK::W, l, 0, 0}, floats(l) * es_);
        if (len == 0) break;
        if (dt_ == DType::BF16) {  // the masters rounded to nearest even, staged up
          const std::span<const float> from =
              st_.weights(l).subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(len));
          stage_up(qr_.queue(o), D(d), S(o), w.data(), std::span<const std::span<const float>>(&from, 1));
        } else {  // read when the copy runs: the Updates that overwrite the masters wait for this op (host_wait)
          D(d).copy_h2d(S(o), w.data(), st_.weights(l).data() + first, len * kF);
        }
        break;
      }
      case OpKind::X: {
        const Key k = info_[static_cast<std::size_t>(o)].writes.front();
        Tensor& x = put(o, k, Bytes(n) * per_sample(0));
        D(d).copy_h2d(S(o), x.data(), in_.data() + static_cast<std::size_t>(s0) * T_, Bytes(n) * per_sample(0));
        break;
      }
      case OpKind::sX: {
        if (info_[static_cast<std::size_t>(o)].saved) {
          const Bytes b = saved_bytes(l, n);
          const bool out = op.stream == core::Stream::SwapOut;
          const void* src = get(o, Key{d, out ? TK::Saved : TK::HostSaved, l, s0, n}).data();
          void* dst = put(o, Key{d, out ? TK::HostSaved : TK::Saved, l, s0, n}, b).data();
          if (out) {
            D(d).copy_d2h(S(o), dst, src, b);
          } else {
            D(d).copy_h2d(S(o), dst, src, b);
          }
          break;
        }
        const Bytes b = Bytes(n) * per_sample(l);
        if (op.stream == core::Stream::SwapOut) {
          const Tensor& x = get(o, Key{d, TK::Act, l, s0, n});
          D(d).copy_d2h(S(o), put(o, Key{d, TK::HostStash, l, s0, n}, b).data(), x.buf.data(), b);
        } else {
          const void* src = get(o, Key{d, TK::HostStash, l, s0, n}).data();
          D(d).copy_h2d(S(o), put(o, info_[static_cast<std::size_t>(o)].writes.front(), b).data(), src, b);
        }
        break;
      }
      case OpKind::dX: {  // to the host (l2l); a P2P dX runs as a pair
        const Bytes b = Bytes(n) * per_sample(l);
        const Tensor& g = get(o, Key{d, TK::Grad, l, s0, n});
        D(d).copy_d2h(S(o), put(o, Key{d, TK::HostGrad, l, s0, n}, b).data(), g.buf.data(), b);
        break;
      }
      case OpKind::dY: {  // from the host (l2l); a P2P dY runs as a pair
        const int g = op.layers.last + 1;
        const Bytes b = Bytes(n) * per_sample(g);
        const void* src = get(o, Key{d, TK::HostGrad, g, s0, n}).data();
        D(d).copy_h2d(S(o), put(o, Key{d, TK::Grad, g, s0, n}, b).data(), src, b);
        break;
      }
      case OpKind::FWD:
        forward(o, false);
        break;
      case OpKind::REC:
        forward(o, true);
        break;
      case OpKind::BWD:
        backward(o);
        break;
      case OpKind::dWB:
        grad_to_host(o);
        break;
      case OpKind::Update:
        if (resident_) {
          states_[static_cast<std::size_t>(d)]->update(S(o), opt_.adamw, l, l);
        } else {
          host_update(o);
        }
        break;
      case OpKind::DEL:  // every tensor was released after its last reader
        break;
      default:
        throw BackendError(fmt::format("executor: op {}: kind {} not supported in a baseline Program", label(o),
                                       core::op_kind_name(op.kind)));
    }
    // No host wait: run() records the op's event after its work; what follows waits for that.
  }

  // FWD(l) over the op's microbatch: the input Act(l) -> Act(l + 1), the head writing the per-token losses; the
  // forward's activations are kept as Saved(l) when the FWD keeps them (keep), else dropped. REC(l), the
  // checkpoint policy's recompute: the same forward from the backward's input (Stash or Act), writing Saved(l)
  // only (its output and the head's losses are not used).
  void forward(int o, bool recompute) {
    if (dt_ == DType::BF16) {
      forward_as<Bf16>(o, recompute);
    } else {
      forward_as<float>(o, recompute);
    }
  }
  template <class E>
  void forward_as(int o, bool recompute) {
    const core::Op& op = at(o);
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    const int d = op.device, l = op.layers.first, s0 = oi.s0, n = oi.n;
    const bool head = m_.kind(l) == LayerKind::Head;
    LayerArgs<E> a;
    a.B = n;
    a.T = T_;
    a.w = resident_ ? states_[static_cast<std::size_t>(d)]->weights<E>(l) : get(o, Key{d, TK::W, l, 0, 0}).buf.as<E>();
    const void* x = get(o, Key{d, recompute ? oi.bwd_input : TK::Act, l, s0, n}).buf.data();
    if (l == 0) {
      a.tokens = static_cast<const std::int32_t*>(x);
    } else {
      a.x = static_cast<const E*>(x);
    }
    Buffer targets, y, act;
    if (head) {
      targets = alloc_or_wait(D(d), Bytes(n) * T_ * 4, "targets");
      D(d).copy_h2d(S(o), targets.data(), tgt_.data() + static_cast<std::size_t>(s0) * T_, Bytes(n) * T_ * 4);
      a.targets = targets.as<std::int32_t>();
    }
    if (head || recompute) {
      y = alloc_or_wait(D(d), m_.output_bytes(l, n, T_, dt_), head ? "losses" : "y");
      a.y = y.as<E>();
    } else {
      a.y = put(o, Key{d, TK::Act, l + 1, s0, n}, m_.output_bytes(l, n, T_, dt_)).buf.as<E>();
    }
    if (recompute || oi.saved) {
      a.act = put(o, Key{d, TK::Saved, l, s0, n}, saved_bytes(l, n)).buf.as<E>();
    } else {
      act = alloc_or_wait(D(d), saved_bytes(l, n), "act");
      a.act = act.as<E>();
    }
    BasicDeviceOps<E> ops(D(d), S(o));
    m_.forward(ops, l, a);
    if (head && !recompute) {  // read by end_step, after every stream has run
      D(d).copy_d2h(S(o), losses_.data() + static_cast<std::size_t>(s0) * T_, a.y, Bytes(n) * T_ * kF);
      for (int s = s0; s < s0 + n; ++s) ++loss_written_[static_cast<std::size_t>(s)];
    }
    for (Buffer* b : {&targets, &y, &act}) release_after(o, *b);  // after the kernels, in stream order
  }

  // BWD(l): the backward from the layer's input and the forward's activations (Saved(l), of the REC or the FWD):
  // dW accumulated (from zero where the op allocates the gradient), dX = Grad(l) written (l > 0).
  void backward(int o) {
    if (dt_ == DType::BF16) {
      backward_as<Bf16>(o);
    } else {
      backward_as<float>(o);
    }
  }
  template <class E>
  void backward_as(int o) {
    const core::Op& op = at(o);
    const OpInfo& oi = info_[static_cast<std::size_t>(o)];
    const int d = op.device, l = op.layers.first, s0 = oi.s0, n = oi.n;
    const bool head = m_.kind(l) == LayerKind::Head;
    LayerArgs<E> a;
    a.B = n;
    a.T = T_;
    a.w = resident_ ? states_[static_cast<std::size_t>(d)]->weights<E>(l) : get(o, Key{d, TK::W, l, 0, 0}).buf.as<E>();
    const void* x = get(o, Key{d, oi.bwd_input, l, s0, n}).buf.data();
    if (l == 0) {
      a.tokens = static_cast<const std::int32_t*>(x);
    } else {
      a.x = static_cast<const E*>(x);
    }
    const E* dy = l + 1 < R_ ? get(o, Key{d, TK::Grad, l + 1, s0, n}).buf.as<E>() : nullptr;
    const Key dwk{d, TK::DW, l, 0, 0};
    E* dw = nullptr;
    if (resident_) {
      dw = states_[static_cast<std::size_t>(d)]->grads<E>(l);  // zeroed by begin_step
    } else if (oi.fresh_dw) {
      Tensor& g = put(o, dwk, floats(l) * es_);
      D(d).fill_zero(S(o), g.data(), floats(l) * es_);
      dw = g.buf.as<E>();
    } else {
      dw = update(o, dwk, floats(l) * es_).buf.as<E>();
    }
    E* dx = l > 0 ? put(o, Key{d, TK::Grad, l, s0, n}, Bytes(n) * per_sample(l)).buf.as<E>() : nullptr;
    Buffer targets, scratch;
    if (head) {
      targets = alloc_or_wait(D(d), Bytes(n) * T_ * 4, "targets");
      D(d).copy_h2d(S(o), targets.data(), tgt_.data() + static_cast<std::size_t>(s0) * T_, Bytes(n) * T_ * 4);
      a.targets = targets.as<std::int32_t>();
    }
    scratch = alloc_or_wait(D(d), std::max<std::int64_t>(1, m_.scratch_floats(l, n, T_)) * es_, "scratch");
    BasicDeviceOps<E> ops(D(d), S(o));
    a.act = get(o, Key{d, TK::Saved, l, s0, n}).buf.as<E>();
    a.y = nullptr;
    a.dw = dw;
    a.dy = dy;
    a.dx = dx;
    a.scratch = scratch.as<E>();
    a.loss_scale = 1.0f / static_cast<float>(static_cast<std::size_t>(B_) * static_cast<std::size_t>(T_));
    m_.backward(ops, l, a);
    for (Buffer* b : {&targets, &scratch}) release_after(o, *b);  // after the kernels, in stream order
  }

  // dWB: the gradient (zero-infinity: this rank's shard) to the host, added to this process's sum of the layer.
  void grad_to_host(int o) {
    const core::Op& op = at(o);
    const int d = op.device, l = op.layers.first;
    const std::int64_t first = sharded_ ? shard_first(l, d) : 0;
    const std::int64_t len = sharded_ ? shard_len(l, d) : floats(l);
    const Tensor& g = get(o, Key{d, sharded_ ? TK::DWShard : TK::DW, l, 0, 0});
    std::vector<float> part(static_cast<std::size_t>(len));
    grads_down(o, d, part.data(), g.buf.data(), len);
    HostSum& h = acc_[{d, l}];
    if (h.sum.empty()) {
      h.sum.assign(static_cast<std::size_t>(floats(l)), 0.0f);
      h.has.assign(static_cast<std::size_t>(floats(l)), 0);
    }
    for (std::int64_t i = 0; i < len; ++i) {
      const auto e = static_cast<std::size_t>(first + i);
      h.sum[e] = h.has[e] != 0 ? h.sum[e] + part[static_cast<std::size_t>(i)] : part[static_cast<std::size_t>(i)];
      h.has[e] = 1;
    }
  }

  // The host gradient of layer l an Update on `dev` uses (grad_sources): its own process's sum, or every
  // process's added in device order.
  void gather_grad(int o, int l, int dev) {
    std::span<float> g = st_.grads(l);
    std::vector<std::uint8_t> has(g.size(), 0);
    for (int d = 0; d < N_; ++d) {
      if (replicated_[static_cast<std::size_t>(l)] != 0 && d != dev) continue;
      auto it = acc_.find({d, l});
      if (it == acc_.end()) continue;
      for (std::size_t e = 0; e < g.size(); ++e) {
        if (it->second.has[e] == 0) continue;
        g[e] = has[e] != 0 ? g[e] + it->second.sum[e] : it->second.sum[e];
        has[e] = 1;
      }
    }
    const auto miss = std::find(has.begin(), has.end(), 0);
    if (miss != has.end())
      throw BackendError(fmt::format("executor: op {}: no dWB brought element {} of layer {}'s gradient to the host",
                                     label(o), miss - has.begin(), l));
  }

  // Update(l): AdamW on the host master copy (docs/backend.md: the tie's two gradients summed by layer 0). The
  // replicas' Updates of one layer (dp-swap) see the same all-reduced gradient: the shared master is updated once.
  //
  // Each layer's host gradient is gathered once per step (every Update that gathers it sees the same dWBs done:
  // the replicas' sums are equal, the other sources the same), so an Update running unlocked reads it while no
  // other op writes it: the AdamW of different layers (and the tie's lm_head) overlaps safely.
  void host_update(int o) {
    const core::Op& op = at(o);
    const int l = op.layers.first;
    auto gather = [&](int layer) {
      if (gathered_[static_cast<std::size_t>(layer)] != 0) return;
      gather_grad(o, layer, op.device);
      gathered_[static_cast<std::size_t>(layer)] = 1;
    };
    gather(l);
    if (l == 0 && m_.head_layer() != 0) gather(m_.head_layer());
    if (updated_[static_cast<std::size_t>(l)] != 0) return;
    updated_[static_cast<std::size_t>(l)] = 1;
    unlocked([&] { note_nonfinite(update_layers(st_, opt_.adamw, l, l, qr_.adamw(o))); });
  }

  // P2P (pp-swap): the sender's activation (Y) or input gradient (dX) copied into the receiver's device.
  void run_pair(int send, int recv) {
    const core::Op& so = at(send);
    const core::Op& ro = at(recv);
    const OpInfo& si = info_[static_cast<std::size_t>(send)];
    const OpInfo& ri = info_[static_cast<std::size_t>(recv)];
    const bool fwd = so.kind == OpKind::Y;
    const int l = fwd ? so.layers.last + 1 : so.layers.first;
    const Key src_key{so.device, fwd ? TK::Act : TK::Grad, l, si.s0, si.n};
    const Key dst_key{ro.device, fwd ? TK::Act : TK::Grad, l, ri.s0, ri.n};
    if (ri.writes.empty() || !(ri.writes.front() == dst_key))
      throw ScheduleViolation(fmt::format("executor: P2P {} -> {} moves {} into {}", label(send), label(recv),
                                          tname(src_key),
                                          ri.writes.empty() ? std::string("nothing") : tname(ri.writes.front())));
    const Bytes b = Bytes(si.n) * per_sample(l);
    const void* src = get(send, src_key).buf.data();
    Tensor& dst = put(recv, dst_key, b);
    D(so.device).copy_d2d(S(send), dst.data(), src, b, &D(ro.device));
    dst.users.push_back(send);  // written by the sender's stream; the receiver's stream waits for it (record_group)
  }

  // The group's dW of layer l brought down (widened from bf16 when stored so) and summed in fp32 in rank order,
  // as Communicator::all_reduce_sum adds: what ARD writes back to every replica and RS shards.
  std::shared_ptr<std::vector<float>> summed_dw(const std::vector<int>& g, int l, std::int64_t count) {
    auto sum = std::make_shared<std::vector<float>>(static_cast<std::size_t>(count));
    std::vector<float> part(static_cast<std::size_t>(count));
    for (std::size_t r = 0; r < g.size(); ++r) {
      const int d = at(g[r]).device;
      const void* src = resident_ ? state_grads(d, l) : get(g[r], Key{d, TK::DW, l, 0, 0}).buf.data();
      grads_down(g[r], d, part.data(), src, count);
      add_in_rank_order(*sum, part, r);
    }
    return sum;
  }

  // ARD (dp-swap): the replicas' dW summed in rank order (as Communicator::all_reduce_sum), written to all. With
  // ExecutorOptions::communicator, on the devices: each member's next dW version all-reduced in place on its stream.
  void run_ard(const std::vector<int>& g) {
    const int l = at(g.front()).layers.first;
    const std::int64_t count = floats(l);
    if (resident_) {  // in place in every device's state (its stream orders the BWDs before and the Update after)
      std::vector<void*> bufs;
      bufs.reserve(g.size());
      for (const int a : g) bufs.push_back(state_grads(at(a).device, l));
      if (qr_.device_sums(g)) {
        qr_.all_reduce(g, bufs, count, dt_);
        return;
      }
      const auto sum = summed_dw(g, l, count);
      for (std::size_t r = 0; r < g.size(); ++r) grads_up(g[r], at(g[r]).device, bufs[r], sum, 0, count);
      return;
    }
    if (qr_.device_sums(g)) {
      std::vector<void*> bufs;
      bufs.reserve(g.size());
      for (const int a : g) bufs.push_back(update(a, Key{at(a).device, TK::DW, l, 0, 0}, count * es_).data());
      qr_.all_reduce(g, bufs, count, dt_);
      return;
    }
    // The host path (no communicator; build_groups makes every collective span the devices in rank order).
    const auto sum = summed_dw(g, l, count);
    for (int a : g) {
      const int d = at(a).device;
      Tensor& t = update(a, Key{d, TK::DW, l, 0, 0}, count * es_);
      grads_up(a, d, t.data(), sum, 0, count);
    }
  }

  // AG (zero-infinity): every rank's shard copied into every rank's full copy of the layer.
  void run_ag(const std::vector<int>& g) {
    const int l = at(g.front()).layers.first;
    std::vector<Tensor*> full;
    full.reserve(g.size());
    for (int a : g) full.push_back(&put(a, Key{at(a).device, TK::W, l, 0, 0}, floats(l) * es_));
    // Each rank's stream copies its shard into every rank's copy; every member's stream then waits for the others
    // (record_group), so what reads a full copy follows all the copies into it.
    for (int a : g) {
      const int r = at(a).device;
      if (shard_len(l, r) == 0) continue;
      const void* src = get(a, Key{r, TK::WShard, l, 0, 0}).buf.data();
      for (std::size_t q = 0; q < g.size(); ++q) {
        const int dq = at(g[q]).device;
        D(r).copy_d2d(S(a), full[q]->buf.as<std::byte>() + shard_first(l, r) * es_, src, shard_len(l, r) * es_, &D(dq));
        full[q]->users.push_back(a);
      }
    }
  }

  // RS (zero-infinity): the ranks' full dW summed in rank order; rank q keeps shard q of the sum. With
  // ExecutorOptions::communicator, on the devices: the full dW all-reduced in place on every rank, then each rank's
  // stream copies its shard of the sum into its dW shard (exact, but it moves N times a reduce-scatter's bytes).
  // In place needs the RS to be the last reader of every member's dW (every RS zero-infinity's lowering makes);
  // otherwise (a later BWD would accumulate into the sum) the host path.
  void run_rs(const std::vector<int>& g) {
    const int l = at(g.front()).layers.first;
    const std::int64_t count = floats(l);
    const auto dw_key = [&](int a) { return Key{at(a).device, TK::DW, l, 0, 0}; };
    const auto last_reader = [&](int a) { return left_.at(Version{dw_key(a), read_version(a, dw_key(a))}) == 1; };
    if (qr_.device_sums(g) && std::all_of(g.begin(), g.end(), last_reader)) {
      std::vector<void*> bufs;
      std::vector<Tensor*> shards;
      bufs.reserve(g.size());
      shards.reserve(g.size());
      for (const int a : g) {
        Tensor& full = get(a, dw_key(a));
        writable_in_place(a, Version{dw_key(a), read_version(a, dw_key(a))}, full);  // true: its stream waits
        bufs.push_back(full.data());
        shards.push_back(
            &put(a, Key{at(a).device, TK::DWShard, l, 0, 0}, std::max<std::int64_t>(1, shard_floats(l)) * es_));
      }
      qr_.all_reduce(g, bufs, count, dt_);
      for (std::size_t r = 0; r < g.size(); ++r) {
        const int a = g[r], d = at(a).device;
        if (shard_len(l, d) > 0)
          D(d).copy_d2d(S(a), shards[r]->data(), static_cast<std::byte*>(bufs[r]) + shard_first(l, d) * es_,
                        shard_len(l, d) * es_);
      }
      return;
    }
    const auto sum = summed_dw(g, l, count);
    for (int a : g) {
      const int d = at(a).device;
      Tensor& t = put(a, Key{d, TK::DWShard, l, 0, 0}, std::max<std::int64_t>(1, shard_floats(l)) * es_);
      if (shard_len(l, d) > 0) grads_up(a, d, t.data(), sum, shard_first(l, d), shard_len(l, d));
    }
  }

  void* state_grads(int d, int l) const {
    auto& st = *states_[static_cast<std::size_t>(d)];
    return dt_ == DType::BF16 ? static_cast<void*>(st.grads<Bf16>(l)) : static_cast<void*>(st.grads<float>(l));
  }

  const core::Program& p_;
  std::vector<Device*> devs_;
  HostState& st_;
  ExecutorOptions opt_;
  const Gpt2& m_;
  int B_ = 0, T_ = 0, R_ = 0, N_ = 0;
  bool pp_ = false;        // pp-swap: every stage sees all samples; else rank r owns samples [r D/N, (r+1) D/N)
  bool sharded_ = false;   // zero-infinity with N > 1: WB brings a shard, AG gathers, RS reduce-scatters
  DType dt_ = DType::F32;  // device storage (bf16: weights rounded on the way up, gradients widened back)
  Bytes es_ = 4;           // bytes per device element
  QueueResources qr_;
  std::vector<int> offset_;  // per device: its first sample
  std::vector<OpInfo> info_;
  std::map<Key, std::vector<int>> producers_;
  std::map<Version, int> readers_;  // per version: ops that read it
  std::vector<std::vector<int>> extra_;
  std::vector<std::vector<int>> dwb_, wb_;            // per layer
  std::vector<char> replicated_;                      // per layer: the gradient is all-reduced on the GPUs (ARD)
  bool resident_ = false;                             // PlanKindSpec::resident_state: W, DW and AdamW state in states_
  std::vector<int> state_op_;                         // per device: an op of its compute queue (state_stream)
  std::vector<std::unique_ptr<DeviceState>> states_;  // per device (resident); after qr_, whose streams they use
  // per step
  std::span<const std::int32_t> in_, tgt_;
  std::vector<float> losses_;
  std::vector<std::uint8_t> loss_written_;  // per sample
  std::map<Version, Tensor> store_;
  std::map<Version, int> left_;
  std::map<std::pair<int, int>, HostSum> acc_;  // (device, layer)
  std::vector<char> updated_;
  std::vector<char> gathered_;  // per layer: HostState::grads holds this step's gradient (gather_grad ran)
};

}  // namespace

std::unique_ptr<Interpreter> make_baseline_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                       HostState& state, const ExecutorOptions& options) {
  return std::make_unique<BaselineInterpreter>(program, std::move(devices), state, options);
}

}  // namespace harmony::backend::detail
