// Lowers a Harmony-PP / Harmony-DP task graph to a Program, event for event as the paper's
// simulator builds them (SEMANTICS.md §6.3): creation order, stream FIFOs, dependencies by id,
// the prefetch/offload switch and the P2P rendezvous resolution (Event.solve_peer).
// Lowering runs once per search candidate, so its bookkeeping is flat: open-addressing key tables and one
// list of (op, dependency key) pairs, no node-based maps and no per-op vectors of its own.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/base/error.hpp"
#include "core/base/flat_table.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::core {
namespace {

struct Key {
  int task;
  int ui;
  int spi;  // -1: the task's last sub-pack
  Stream stream;
  OpKind kind;
};

std::uint64_t pack_key(int task, int ui, int spi, Stream s, OpKind k) {
  return (static_cast<std::uint64_t>(task) << 40) | (static_cast<std::uint64_t>(ui & 0xFFFFF) << 20) |
         (static_cast<std::uint64_t>(spi & 0xFFF) << 8) | (static_cast<std::uint64_t>(s) << 4) |
         static_cast<std::uint64_t>(k);
}

// Lowered with the Harmony-PP event rules (Program::cost.pp_rules).
bool pp_rules_of(const Plan& p) { return !p.kind->data_parallel && p.gpus > 1; }

// The Program under construction as a table of ops: creation keyed by (task, microbatch, sub-pack, stream, kind),
// dependencies by key (resolved at once when the op exists, else once every op does), stream queues, the P2P
// rendezvous. It knows nothing of the paper's building blocks; the Lowerer below speaks through it.
class OpTable {
 protected:
  void reserve_ops(std::size_t estimate) {
    prog_.ops.reserve(estimate);
    peer_key_.reserve(estimate);
    has_peer_.reserve(estimate);
    index_.reserve(estimate);
  }

  int make(const Task& t, int ui, int spi, Stream s, OpKind k, LayerRange layers, int ubs, Bytes bytes) {
    const int id = static_cast<int>(prog_.ops.size());
    const std::uint64_t kk = pack_key(t.idx, ui, spi, s, k);
    if (!index_.insert(kk, id)) {
      throw InternalError("duplicate op " + std::to_string(t.idx) + "." + std::to_string(ui) + "." +
                          std::to_string(spi) + "." + stream_name(s) + "." + op_kind_name(k));
    }
    Op& op = prog_.ops.emplace_back();  // built in place: an Op is three vectors and a dozen fields
    op.task = t.idx;
    op.ui = ui;
    op.spi = spi;
    op.device = t.rank;
    op.stream = s;
    op.kind = k;
    op.layers = layers;
    op.ubs = ubs;
    op.bytes = bytes;
    peer_key_.push_back(0);
    has_peer_.push_back(false);
    return id;
  }

  // A dependency on the op with key k, appended to `op`'s list in the order added (a repeat of one already listed
  // adds nothing): resolved now when that op exists (it was created moments ago, so its table slot is still in
  // cache), else a placeholder that resolve() fills once every op exists.
  void dep(int op, std::uint64_t k) {
    if (const int* id = index_.find(k)) {
      dep_op(op, *id);
      return;
    }
    OpDeps& deps = prog_.ops[static_cast<std::size_t>(op)].deps;
    pending_.push_back(PendingDep{op, static_cast<int>(deps.size()), k});
    if (deps.empty()) deps.reserve(4);
    deps.push_back(-1);
  }
  void dep_op(int op, int other) {
    if (other < 0) throw InternalError("op " + std::to_string(op) + " depends on an op that was never created");
    OpDeps& deps = prog_.ops[static_cast<std::size_t>(op)].deps;
    if (deps.empty()) deps.reserve(4);  // most ops have at most four: one allocation
    if (std::find(deps.begin(), deps.end(), other) == deps.end()) deps.push_back(other);
  }
  void peer(int op, std::uint64_t k) {
    peer_key_[static_cast<std::size_t>(op)] = k;
    has_peer_[static_cast<std::size_t>(op)] = true;
  }

  void enqueue(int op) {
    Op& o = prog_.ops[static_cast<std::size_t>(op)];
    int& q = queue_of_[static_cast<std::size_t>(o.stream)];
    if (q < 0) {
      q = static_cast<int>(prog_.queues.size());
      prog_.queues.push_back(OpQueue{o.device, o.stream, {}});
    }
    o.queue = q;
    o.queue_pos = static_cast<int>(prog_.queues[static_cast<std::size_t>(q)].ops.size());
    prog_.queues[static_cast<std::size_t>(q)].ops.push_back(op);
  }

  void alloc(int op, TensorKind k, LayerRange layers, int mb, Bytes b) {
    prog_.ops[static_cast<std::size_t>(op)].allocs.push_back(TensorRef{k, layers, mb, b});
  }
  void free_(int op, TensorKind k, LayerRange layers, int mb, Bytes b) {
    prog_.ops[static_cast<std::size_t>(op)].frees.push_back(TensorRef{k, layers, mb, b});
  }

  // Dependencies by id -> op indices, then the reference's solve_peer, in creation order.
  void resolve() {
    auto& ops = prog_.ops;
    auto find = [&](std::uint64_t k, int from) {
      const int* id = index_.find(k);
      if (id == nullptr) {
        const Op& o = ops[static_cast<std::size_t>(from)];
        throw InternalError("op t" + std::to_string(o.task) + " " + op_kind_name(o.kind) +
                            " depends on an op that was never created");
      }
      return *id;
    };
    // Fill the placeholders; a list that had one keeps the first of any repeats, as adding them in turn would.
    std::vector<int> touched;
    for (const PendingDep& pd : pending_) {
      ops[static_cast<std::size_t>(pd.op)].deps[static_cast<std::size_t>(pd.pos)] = find(pd.key, pd.op);
      if (touched.empty() || touched.back() != pd.op) touched.push_back(pd.op);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (const int op : touched) {
      OpDeps& deps = ops[static_cast<std::size_t>(op)].deps;
      std::size_t kept = 0;
      for (std::size_t j = 0; j < deps.size(); ++j) {
        if (std::find(deps.begin(), deps.begin() + static_cast<std::ptrdiff_t>(kept), deps[j]) ==
            deps.begin() + static_cast<std::ptrdiff_t>(kept))
          deps[kept++] = deps[j];
      }
      deps.resize(kept);
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (has_peer_[i]) ops[i].peer = find(peer_key_[i], static_cast<int>(i));
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].peer < 0) continue;
      const Op& p = ops[static_cast<std::size_t>(ops[i].peer)];
      OpDeps& merged = ops[i].deps;
      merged.reserve(merged.size() + p.deps.size() + 1);
      merged.insert(merged.end(), p.deps.begin(), p.deps.end());
      if (const int pred = queue_predecessor(prog_, ops[i].peer); pred >= 0) merged.push_back(pred);
      std::sort(merged.begin(), merged.end());
      merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
    }
  }

  Program prog_;          // built here; the Lowerer's graph reference points into it, so it comes first
  FlatTable<int> index_;  // op key -> op id
  struct PendingDep {
    int op;             // the op that waits ...
    int pos;            // ... (the placeholder's index in its deps) ...
    std::uint64_t key;  // ... for the op with this key, not created yet when the dependency was added
  };
  std::vector<PendingDep> pending_;
  std::vector<std::uint64_t> peer_key_;
  std::vector<bool> has_peer_;
  std::array<int, kNumStreams> queue_of_{};
};

// Transient workspace bytes of a compute op, memoized per (phase, microbatch size, layers).
class WorkspaceMemo {
 public:
  explicit WorkspaceMemo(const Model& m) : m_(m) {}

  // Transient memory of a compute op beyond the tensors the Program allocates explicitly: the
  // profiled peaks of its layers (minus inner inputs, as the reference's memory_of_pack) less the
  // weights, input, output (and for BWD the gradients) that have their own allocations. A BWD runs its
  // layers' backwards one after another, so each layer's transient part (dY, dX, scratch: the profile's
  // bwd_transient_memory) counts once, the largest of them, not summed over the pack.
  // Memoized: every microbatch of a pack at the same size asks again.
  Bytes operator()(Phase ph, int u, LayerRange l) {
    constexpr int kBits = 20;
    const bool memo = u >= 0 && u < (1 << kBits) && l.first >= 0 && l.last < (1 << kBits) && l.first <= l.last;
    const std::uint64_t mk = (static_cast<std::uint64_t>(ph == Phase::Bwd) << (3 * kBits)) |
                             (static_cast<std::uint64_t>(u) << (2 * kBits)) |
                             (static_cast<std::uint64_t>(l.first) << kBits) | static_cast<std::uint64_t>(l.last);
    if (memo) {
      if (const Bytes* b = memo_.find(mk)) return *b;
    }
    const Bytes w = workspace_of(ph, u, l);
    if (memo) memo_.insert(mk, w);
    return w;
  }

 private:
  Bytes workspace_of(Phase ph, int u, LayerRange l) const {
    Bytes peak = 0, transient_max = 0;
    for (int k = l.first; k <= l.last; ++k) {
      peak += m_.peak_bytes(ph, u, k);
      if (k > l.first) peak -= m_.input_bytes(u, k);
      if (ph == Phase::Bwd) {
        const Bytes t = m_.bwd_transient_bytes(u, k);
        peak -= t;
        transient_max = std::max(transient_max, t);
      }
    }
    peak += transient_max;
    Bytes own = m_.weight_bytes(l.first, l.last) + m_.buffer_bytes(l.first, l.last) + m_.input_bytes(u, l.first) +
                m_.input_bytes(u, l.last + 1);
    if (ph == Phase::Bwd) own += m_.weight_bytes(l.first, l.last) + (l.first != 0 ? m_.input_bytes(u, l.first) : 0);
    return std::max<Bytes>(0, peak - own);
  }

  const Model& m_;
  FlatTable<Bytes> memo_;  // (phase, u, layers) -> workspace bytes
};

class Lowerer : private OpTable {
 public:
  // The Program keeps the task graph it was lowered from (`g`, moved in when the caller gives it away); the
  // lowering reads it there.
  Lowerer(TaskGraph g, const Model& m, const LowerOptions& o)
      : g_(prog_.graph),
        m_(m),
        pf_(o.prefetch),
        buffers_(std::max(2, o.prefetch_buffers)),
        nvme_(o.offload_nvme),
        workspace_(m) {
    prog_.graph = std::move(g);
    prog_.cost.prefetch = pf_;
    prog_.cost.offload_nvme = nvme_;
    const Plan& p = g_.plan;
    prog_.cost.pp_rules = pp_rules_of(p);
    prog_.cost.bandwidth_sharers = std::max(1, g_.non_empty_ranks());
    prog_.devices = lowered_ranks(g_, o);
    if (p.u_fwd != p.u_bwd) {
      // rank 0's lists (every rank has the same lists in Harmony-PP)
      conv_ = make_ubatch_converter(g_.ubatch_fwd[0], g_.ubatch_bwd[0], p.u_bwd);
      has_conv_ = true;
    }
  }

  Program run() {
    std::size_t estimate = 0;  // ops per task: a handful per microbatch (+ stash traffic) and per pack
    for (int r : prog_.devices) {
      for (int idx : g_.rank_tasks[static_cast<std::size_t>(r)]) {
        const Task& t = task(idx);
        estimate += t.ubatch_sizes.size() * (6 + 3 * t.stashes.size()) + 4;
      }
    }
    reserve_ops(estimate);
    for (int r : prog_.devices) lower_rank(r);
    resolve();
    return std::move(prog_);
  }

 private:
  const Task& task(int idx) const { return g_.tasks[static_cast<std::size_t>(idx)]; }
  int last_spi(const Task& t) const { return g_.num_subpacks(t) - 1; }
  OpKind compute_kind(const Task& t) const { return t.type == TaskType::Fwd ? OpKind::FWD : OpKind::BWD; }
  int nu(const Task& t) const { return static_cast<int>(t.ubatch_sizes.size()); }

  std::uint64_t key(const Task& t, int ui, int spi, Stream s, OpKind k) const {
    return pack_key(t.idx, ui, spi < 0 ? last_spi(t) : spi, s, k);
  }

  Bytes xbytes(int u, int layer) const { return m_.input_bytes(u, layer); }

  void set_workspace(int op, Phase ph) {
    Op& o = prog_.ops[static_cast<std::size_t>(op)];
    o.workspace_bytes = workspace_(ph, o.ubs, o.layers);
  }

  // ---- the reference's building blocks (SEMANTICS.md §6.3) ----

  int in_wb(const Task& vt, bool delay) {
    const Bytes w = m_.weight_bytes(vt.layers.first, vt.layers.last);
    const Bytes b = m_.buffer_bytes(vt.layers.first, vt.layers.last);
    int W = make(vt, 0, 0, Stream::SwapIn, OpKind::WB, vt.layers, 0, w + b);
    Op& wb = prog_.ops[static_cast<std::size_t>(W)];
    wb.bytes_w = w;
    wb.bytes_b = b;
    if (nvme_) {
      NativeOpCosts& c = prog_.cost.edit(W);
      c.nvme_read_bytes = w + b;  // the pack's weights from the drives, then over PCIe, one I/O per layer
      c.io_count = vt.layers.size();
    }
    alloc(W, TensorKind::Weights, vt.layers, -1, w + b);
    if (L_ == nullptr) {
      enqueue(W);
    } else if (pf_) {
      dep(W, key(*L_, nu(*L_) - 1, -1, Stream::Compute, compute_kind(*L_)));
      if (!delay) enqueue(W);
    } else {
      dep(W, key(*L_, 0, 0, Stream::Compute, OpKind::DEL));
      enqueue(W);
    }
    return W;
  }

  void dbuf(int ev) {
    if (nu(*L_) >= 2) {
      dep(ev, key(*L_, nu(*L_) - 2, -1, Stream::Compute, compute_kind(*L_)));
    } else if (L2_ != nullptr) {
      dep(ev, key(*L2_, 0, 0, Stream::Compute, OpKind::DEL));
    }
  }

  // Common prefetch / serialization rules of X and sX (ubatch i of task vt).
  void input_order(const Task& vt, int ev, int i, int w_for_enqueue, int prev) {
    if (pf_) {
      if (i == 0) {
        if (L_ == nullptr) {
          enqueue(ev);
        } else {
          dbuf(ev);
          enqueue(ev);
          if (w_for_enqueue >= 0) enqueue(w_for_enqueue);
        }
      } else if (i < buffers_) {
        if (L_ != nullptr) dep(ev, key(*L_, 0, 0, Stream::Compute, OpKind::DEL));
        enqueue(ev);
      } else {
        dep(ev, key(vt, i - buffers_, -1, Stream::Compute, compute_kind(vt)));
        enqueue(ev);
      }
    } else {
      if (prev >= 0) {
        dep_op(ev, prev);
      } else {
        dep(ev, key(vt, i - 1, -1, Stream::Compute, compute_kind(vt)));
      }
      enqueue(ev);
    }
  }

  int in_x(const Task& vt, int i, int w_for_enqueue, int prev) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    const LayerRange l1{vt.layers.first, vt.layers.first};
    const Bytes b = xbytes(u, vt.layers.first);
    int X = -1;
    if (vt.has_data) {
      X = make(vt, i, 0, Stream::SwapIn, OpKind::X, l1, u, b);
    } else if (vt.in_x.medium == Medium::P2P) {
      X = make(vt, i, 0, Stream::P2PIn, OpKind::X, l1, u, b);
      const Task& src = task(vt.in_x.peer_task);
      peer(X, key(src, i, -1, Stream::P2POut, OpKind::Y));
    } else if (vt.in_x.medium == Medium::Msg) {
      X = make(vt, i, 0, Stream::SwapIn, OpKind::X, l1, u, b);
      const Task& src = task(vt.in_x.peer_task);
      dep(X, key(src, i, -1, Stream::Cpu, OpKind::MSGY));
    } else if (vt.in_x.medium == Medium::Swap) {
      X = make(vt, i, 0, Stream::SwapIn, OpKind::X, l1, u, b);
      dep(X, key(*L_, has_conv_ && vt.type == TaskType::Bwd ? conv_.fwd_of_bwd[static_cast<std::size_t>(i)] : i, -1,
                 Stream::SwapOut, OpKind::Y));
    } else {
      throw InternalError("task " + std::to_string(vt.idx) + " has no input channel");
    }
    alloc(X, TensorKind::Activation, l1, i, b);
    input_order(vt, X, i, w_for_enqueue, prev);
    return X;
  }

  int in_sx(const Task& vt, int i, int prev) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    const LayerRange l1{vt.layers.first, vt.layers.first};
    const Bytes b = xbytes(u, vt.layers.first);
    int S = make(vt, i, 0, Stream::SwapIn, OpKind::sX, l1, u, b);
    const Task& src = task(vt.in_x.peer_task);
    dep(S, key(src, i, g_.subpack_of_stash(src, vt.layers.first), Stream::Cpu, OpKind::MSGsX));
    alloc(S, TensorKind::Stash, l1, i, b);
    input_order(vt, S, i, -1, prev);
    return S;
  }

  // Sub-pack s of a FWD task: the sub-packs start at the pack's first layer and at every stash layer.
  LayerRange subpack_layers(const Task& vt, int s) const {
    // bounds: [first unless a stash starts there] + stash layers + [last + 1]
    const std::size_t lead = vt.stashes.empty() || vt.stashes.front().layer != vt.layers.first ? 1 : 0;
    const auto bound = [&](std::size_t j) {
      if (j < lead) return vt.layers.first;
      if (j - lead < vt.stashes.size()) return vt.stashes[j - lead].layer;
      return vt.layers.last + 1;
    };
    return LayerRange{bound(static_cast<std::size_t>(s)), bound(static_cast<std::size_t>(s) + 1) - 1};
  }

  int compute_fwd(const Task& vt, int i, int W, int X) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    int F = make(vt, i, 0, Stream::Compute, OpKind::FWD, subpack_layers(vt, 0), u, 0);
    set_workspace(F, Phase::Fwd);
    if (i == 0) dep_op(F, W);
    dep_op(F, X);
    enqueue(F);
    int s = 0;
    for (const Stash& st : vt.stashes) {
      if (st.layer == vt.layers.first) {
        s = 0;
      } else {
        ++s;
        F = make(vt, i, s, Stream::Compute, OpKind::FWD, subpack_layers(vt, s), u, 0);
        set_workspace(F, Phase::Fwd);
        enqueue(F);
      }
      if (!pf_) dep(F, key(vt, i, s, Stream::SwapOut, OpKind::sX));
    }
    // the last sub-pack produces Y and consumes this microbatch's input
    const Bytes yb = xbytes(u, vt.layers.last + 1);
    alloc(F, TensorKind::Activation, LayerRange{vt.layers.last + 1, vt.layers.last + 1}, i, yb);
    free_(F, TensorKind::Activation, LayerRange{vt.layers.first, vt.layers.first}, i, xbytes(u, vt.layers.first));
    return F;
  }

  // (BWD microbatch index, size) pairs fed by FWD microbatch i.
  std::vector<std::pair<int, int>> bwd_targets(int i, int u) const {
    std::vector<std::pair<int, int>> v;
    if (!has_conv_) {
      v.emplace_back(i, u);
    } else {
      const auto& idx = conv_.bwd_idx[static_cast<std::size_t>(i)];
      const auto& sz = conv_.bwd_sizes[static_cast<std::size_t>(i)];
      for (std::size_t k = 0; k < idx.size(); ++k) v.emplace_back(idx[k], sz[k]);
    }
    return v;
  }

  void out_sx(const Task& vt, int i, int X) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    int s = 0;
    for (const Stash& st : vt.stashes) {
      const LayerRange l1{st.layer, st.layer};
      int O = -1;
      if (st.layer == vt.layers.first) {
        s = 0;
        O = make(vt, i, 0, Stream::SwapOut, OpKind::sX, l1, u, xbytes(u, st.layer));
        dep_op(O, X);
        if (pf_) {
          if (i == 0) {
            if (L_ != nullptr) dep(O, key(*L_, 0, 0, Stream::Compute, OpKind::DEL));
          } else {
            dep(O, key(vt, i - 1, -1, Stream::Compute, OpKind::FWD));
          }
        }
      } else {
        ++s;
        O = make(vt, i, s, Stream::SwapOut, OpKind::sX, l1, u, xbytes(u, st.layer));
        dep(O, key(vt, i, s - 1, Stream::Compute, OpKind::FWD));
      }
      enqueue(O);
      const bool same_rank = task(st.bwd_task).rank == vt.rank;
      for (auto [ib, ub] : bwd_targets(i, u)) {
        int M = make(vt, ib, s, Stream::Cpu, OpKind::MSGsX, l1, ub, same_rank ? 0 : xbytes(ub, st.layer));
        dep_op(M, O);
        enqueue(M);
      }
    }
  }

  int out_y(const Task& vt, int i, int F) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    const LayerRange ll{vt.layers.last, vt.layers.last};
    const Bytes b = xbytes(u, vt.layers.last + 1);
    const int fspi = prog_.ops[static_cast<std::size_t>(F)].spi;
    const Task& dst = task(vt.out_y.peer_task);
    int Y = -1;
    if (vt.out_y.medium == Medium::P2P) {
      Y = make(vt, i, fspi, Stream::P2POut, OpKind::Y, ll, u, b);
      peer(Y, key(dst, i, 0, Stream::P2PIn, OpKind::X));
      dep_op(Y, F);
      enqueue(Y);
    } else {
      Y = make(vt, i, fspi, Stream::SwapOut, OpKind::Y, ll, u, b);
      dep_op(Y, F);
      enqueue(Y);
      if (vt.out_y.medium == Medium::Msg) {
        const bool same_rank = dst.rank == vt.rank;
        for (auto [ib, ub] : bwd_targets(i, u)) {
          int M = make(vt, ib, fspi, Stream::Cpu, OpKind::MSGY, ll, ub, same_rank ? 0 : xbytes(ub, vt.layers.last + 1));
          dep_op(M, Y);
          enqueue(M);
        }
      }
    }
    free_(Y, TensorKind::Activation, LayerRange{vt.layers.last + 1, vt.layers.last + 1}, i, b);
    return Y;
  }

  int in_dy(const Task& vt, int i, int W, bool after_rec) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    const LayerRange ll{vt.layers.last, vt.layers.last};
    const Bytes b = xbytes(u, vt.layers.last + 1);
    int G = -1;
    if (vt.in_dy.medium == Medium::P2P) {
      G = make(vt, i, 0, Stream::P2PIn, OpKind::dY, ll, u, b);
      peer(G, key(task(vt.in_dy.peer_task), i, 0, Stream::P2POut, OpKind::dX));
    } else {
      G = make(vt, i, 0, Stream::SwapIn, OpKind::dY, ll, u, b);
      dep(G, key(*L_, i, 0, Stream::SwapOut, OpKind::dX));
    }
    alloc(G, TensorKind::ActGrad, LayerRange{vt.layers.last + 1, vt.layers.last + 1}, i, b);
    if (pf_) {
      if (i == 0) {
        if (L_ == nullptr) {
          enqueue(G);
        } else {
          if (after_rec || (L_->type == TaskType::Bwd && !L_->has_criterion)) {
            dep(G, key(*L_, nu(*L_) - 1, 0, Stream::Compute, OpKind::REC));
          } else {
            dbuf(G);
          }
          enqueue(G);
          enqueue(W);
        }
      } else {
        dep(G, key(vt, i - 1, 0, Stream::Compute, OpKind::REC));
        enqueue(G);
      }
    } else {
      dep(G, key(vt, i, 0, Stream::Compute, OpKind::REC));
      enqueue(G);
    }
    return G;
  }

  int compute_bwd(const Task& vt, int i, int W, int Xin, int G) {
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    int Rc = make(vt, i, 0, Stream::Compute, OpKind::REC, vt.layers, u, 0);
    set_workspace(Rc, Phase::Fwd);
    if (i == 0) dep_op(Rc, W);
    dep_op(Rc, Xin);
    enqueue(Rc);
    int Bw = make(vt, i, 0, Stream::Compute, OpKind::BWD, vt.layers, u, 0);
    set_workspace(Bw, Phase::Bwd);
    if (G >= 0) dep_op(Bw, G);
    enqueue(Bw);
    const Bytes w = m_.weight_bytes(vt.layers.first, vt.layers.last);
    if (i == 0) alloc(Bw, TensorKind::WeightGrad, vt.layers, -1, w);
    if (!vt.has_data)
      alloc(Bw, TensorKind::ActGrad, LayerRange{vt.layers.first, vt.layers.first}, i, xbytes(u, vt.layers.first));
    const LayerRange l1{vt.layers.first, vt.layers.first};
    free_(Bw, vt.has_criterion ? TensorKind::Activation : TensorKind::Stash, l1, i, xbytes(u, vt.layers.first));
    if (G >= 0)
      free_(Bw, TensorKind::ActGrad, LayerRange{vt.layers.last + 1, vt.layers.last + 1}, i,
            xbytes(u, vt.layers.last + 1));
    return Bw;
  }

  int out_dx(const Task& vt, int i, int Bw) {
    if (vt.has_data) return -1;
    const int u = vt.ubatch_sizes[static_cast<std::size_t>(i)];
    const LayerRange l1{vt.layers.first, vt.layers.first};
    const Bytes b = xbytes(u, vt.layers.first);
    int O = -1;
    if (vt.out_dx.medium == Medium::P2P) {
      O = make(vt, i, 0, Stream::P2POut, OpKind::dX, l1, u, b);
      peer(O, key(task(vt.out_dx.peer_task), i, 0, Stream::P2PIn, OpKind::dY));
    } else {
      O = make(vt, i, 0, Stream::SwapOut, OpKind::dX, l1, u, b);
    }
    dep_op(O, Bw);
    enqueue(O);
    free_(O, TensorKind::ActGrad, l1, i, b);
    return O;
  }

  int compute_ard(const Task& vt, int dx_last) {
    if (prog_.cost.pp_rules || prog_.cost.bandwidth_sharers <= 1) return -1;
    const Bytes w = m_.weight_bytes(vt.layers.first, vt.layers.last);
    const Bytes b = m_.buffer_bytes(vt.layers.first, vt.layers.last);
    int A = make(vt, 0, 0, Stream::Compute, OpKind::ARD, vt.layers, 0, w + b);
    prog_.ops[static_cast<std::size_t>(A)].bytes_w = w;
    prog_.ops[static_cast<std::size_t>(A)].bytes_b = b;
    enqueue(A);
    if (!pf_ && dx_last >= 0) dep_op(A, dx_last);
    return A;
  }

  int out_dwb(const Task& vt, int bw_last, int A, int dx_last) {
    const Bytes w = m_.weight_bytes(vt.layers.first, vt.layers.last);
    const Bytes b = m_.buffer_bytes(vt.layers.first, vt.layers.last);
    int O = make(vt, 0, 0, Stream::SwapOut, OpKind::dWB, vt.layers, 0, w + b);
    prog_.ops[static_cast<std::size_t>(O)].bytes_w = w;
    prog_.ops[static_cast<std::size_t>(O)].bytes_b = b;
    dep_op(O, bw_last);
    if (A >= 0) {
      dep_op(O, A);
    } else if (!pf_ && dx_last >= 0) {
      dep_op(O, dx_last);
    }
    enqueue(O);
    return O;
  }

  void compute_del(const Task& vt, int dwb, int y_last) {
    int D = make(vt, 0, 0, Stream::Compute, OpKind::DEL, vt.layers, 0, 0);
    if (dwb >= 0) {
      dep_op(D, dwb);
    } else if (!pf_ && y_last >= 0) {
      dep_op(D, y_last);
    }
    enqueue(D);
    const Bytes wb =
        m_.weight_bytes(vt.layers.first, vt.layers.last) + m_.buffer_bytes(vt.layers.first, vt.layers.last);
    free_(D, TensorKind::Weights, vt.layers, -1, wb);
    if (vt.type == TaskType::Bwd) {
      free_(D, TensorKind::WeightGrad, vt.layers, -1, m_.weight_bytes(vt.layers.first, vt.layers.last));
    }
  }

  void cpu_update(const Task& vt) {
    int U = make(vt, 0, 0, Stream::Cpu, OpKind::Update, vt.layers, 0, 0);
    if (nvme_) {
      NativeOpCosts& u = prog_.cost.edit(U);
      const int f = vt.layers.first, l = vt.layers.last;
      const Bytes state = m_.optimizer_state_bytes(f, l) + m_.master_bytes(f, l);
      Bytes narrow = 0;  // 2-byte device weights converted by the update: written for the next fetch
      for (int x = f; x <= l; ++x) narrow += m_.narrow_weights(x) ? m_.weight_bytes(x, x) + m_.buffer_bytes(x, x) : 0;
      u.nvme_read_bytes = state;
      u.nvme_write_bytes = state + narrow;
      u.io_count = vt.layers.size();  // streamed layer by layer through the pinned buffers
    }
    dep(U, key(*L_, 0, 0, Stream::SwapOut, OpKind::dWB));
    enqueue(U);
  }

  void lower_task(const Task& vt) {
    const bool pp = prog_.cost.pp_rules;
    const int n = nu(vt);
    if (vt.type == TaskType::Upd) {
      cpu_update(vt);
      return;
    }
    if (vt.type == TaskType::Fwd) {
      const int W = in_wb(vt, /*delay=*/!pp);
      int prev_f = -1;
      int prev_y = -1;
      for (int i = 0; i < n; ++i) {
        const int prev = i == 0 ? W : (pp ? prev_f : prev_y);
        const int X = in_x(vt, i, pp ? -1 : W, prev);
        const int F = compute_fwd(vt, i, W, X);
        out_sx(vt, i, X);
        prev_y = out_y(vt, i, F);
        prev_f = F;
      }
      compute_del(vt, -1, pp ? -1 : prev_y);
    } else {
      const bool crit = vt.has_criterion;
      const int W = in_wb(vt, /*delay=*/!pp || !crit);
      int prev_bw = -1;
      int prev_dx = -1;
      for (int i = 0; i < n; ++i) {
        const int prev = i == 0 ? W : (pp ? prev_bw : prev_dx);
        int Xin = -1;
        int G = -1;
        if (crit) {
          Xin = in_x(vt, i, pp ? -1 : W, prev);
        } else {
          Xin = in_sx(vt, i, prev);
          G = in_dy(vt, i, W, /*after_rec=*/!pp);
        }
        prev_bw = compute_bwd(vt, i, W, Xin, G);
        prev_dx = out_dx(vt, i, prev_bw);
      }
      const int A = pp ? -1 : compute_ard(vt, prev_dx);
      const int dwb = out_dwb(vt, prev_bw, A, pp ? -1 : prev_dx);
      compute_del(vt, dwb, -1);
    }
    L2_ = L_;
    L_ = &vt;
  }

  void lower_rank(int r) {
    if (has_conv_) {  // Harmony-DP with D % N != 0: each GPU has its own microbatch lists
      conv_ = make_ubatch_converter(g_.ubatch_fwd[static_cast<std::size_t>(r)],
                                    g_.ubatch_bwd[static_cast<std::size_t>(r)], g_.plan.u_bwd);
    }
    queue_of_.fill(-1);
    L_ = nullptr;
    L2_ = nullptr;
    for (int idx : g_.rank_tasks[static_cast<std::size_t>(r)]) lower_task(task(idx));
  }

  const TaskGraph& g_;
  const Model& m_;
  bool pf_;
  int buffers_;
  bool nvme_;
  UbatchConverter conv_;
  bool has_conv_ = false;
  WorkspaceMemo workspace_;
  const Task* L_ = nullptr;
  const Task* L2_ = nullptr;
};

}  // namespace

std::vector<int> lowered_ranks(const TaskGraph& graph, const LowerOptions& options) {
  std::vector<int> ranks;
  for (int r = 0; r < graph.plan.gpus; ++r) {
    if (graph.rank_tasks[static_cast<std::size_t>(r)].empty()) continue;
    if (!pp_rules_of(graph.plan) && options.dp_first_gpu_only && r > 0) continue;
    ranks.push_back(r);
  }
  return ranks;
}

TimePs compute_chain_bound_ps(const TaskGraph& graph, const std::vector<int>& ranks,
                              const std::function<double(const Op& op)>& price_ps) {
  const ComputeChain c = compute_chain(graph, ranks, price_ps);
  return c.bound_ps(c.end_ps);
}

TimePs ComputeChain::bound_ps(double t_ps) const {
  // each op's time is rounded to the picosecond (half of one at most) and the engines add them in another order: a
  // picosecond per op and a relative margin far above the floating-point error
  return std::max<TimePs>(0, static_cast<TimePs>(std::floor(t_ps * (1.0 - 1e-9) - ops)) - 2);
}

ComputeChain compute_chain(const TaskGraph& graph, const std::vector<int>& ranks,
                           const std::function<double(const Op& op)>& price_ps) {
  const auto z = [](int i) { return static_cast<std::size_t>(i); };
  ComputeChain chain;
  chain.task_end_ps.assign(graph.tasks.size(), 0.0);
  std::vector<char> lowered(graph.rank_tasks.size(), 0);
  for (const int r : ranks) lowered[z(r)] = 1;
  std::vector<double> queue_free(graph.rank_tasks.size(), 0.0);  // when each GPU's compute queue frees
  // per task and microbatch, the end of its FWD (last sub-pack) or BWD op, once the task was priced
  std::vector<std::vector<double>> done(graph.tasks.size());
  // a P2P receiver's op starts no earlier than its sender's op of the same microbatch ends (a sender priced later,
  // or any other medium, adds nothing: the bound only drops an edge)
  auto sent = [&](const Channel& c, std::size_t i) {
    if (c.medium != Medium::P2P || c.peer_task < 0) return 0.0;
    const std::vector<double>& d = done[z(c.peer_task)];
    return i < d.size() ? d[i] : 0.0;
  };
  double ops = 0.0;
  Op op;  // the compute op priced
  auto price = [&](const Task& t, OpKind kind, int u) {
    op.kind = kind;
    op.device = t.rank;
    op.layers = t.layers;
    op.ubs = u;
    return price_ps(op);
  };
  // tasks in index order: every GPU's compute queue runs its tasks in that order, and a channel's sender task comes
  // before its receiver
  for (const Task& t : graph.tasks) {
    if (t.type == TaskType::Upd || !lowered[z(t.rank)]) continue;
    double& free = queue_free[z(t.rank)];
    std::vector<double>& d = done[z(t.idx)];
    d.resize(t.ubatch_sizes.size());
    int u = -1;
    double first_ps = 0.0;   // FWD: the sub-packs together; BWD: the recompute
    double second_ps = 0.0;  // BWD: the backward
    for (std::size_t i = 0; i < t.ubatch_sizes.size(); ++i) {
      if (t.ubatch_sizes[i] != u) {  // a run of equal sizes is priced once
        u = t.ubatch_sizes[i];
        first_ps = price(t, t.type == TaskType::Fwd ? OpKind::FWD : OpKind::REC, u);
        second_ps = t.type == TaskType::Fwd ? 0.0 : price(t, OpKind::BWD, u);
      }
      if (t.type == TaskType::Fwd) {
        free = std::max(free, sent(t.in_x, i)) + first_ps;  // its first sub-pack waits for X
        ops += graph.num_subpacks(t);
      } else {
        free = std::max(free, t.has_criterion ? sent(t.in_x, i) : 0.0) + first_ps;    // REC waits for X
        free = std::max(free, t.has_criterion ? 0.0 : sent(t.in_dy, i)) + second_ps;  // BWD waits for dY
        ops += 2;
      }
      d[i] = free;
    }
    if (!d.empty()) chain.task_end_ps[z(t.idx)] = d.back();
  }
  for (const int r : ranks) chain.end_ps = std::max(chain.end_ps, queue_free[z(r)]);
  chain.ops = ops;
  return chain;
}

Program lower_harmony(const TaskGraph& graph, const Model& model, const LowerOptions& options) {
  Program p = Lowerer(graph, model, options).run();
  if (options.dataflow) p.dataflow = harmony_dataflow(p);
  return p;
}

Program lower_harmony(TaskGraph&& graph, const Model& model, const LowerOptions& options) {
  Program p = Lowerer(std::move(graph), model, options).run();
  if (options.dataflow) p.dataflow = harmony_dataflow(p);
  return p;
}

}  // namespace harmony::core
