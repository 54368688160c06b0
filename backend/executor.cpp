// The executor: the ready-queue loop over a Program's queues on the host thread (an op runs when it heads its
// queue and its deps have ended; P2P pairs and collectives run together), the happens-before relation the read
// checks use, and the interpreter of Harmony Programs (synchronous device work, a tensor store per device and
// per host channel with the producing op). Baseline Programs are interpreted in executor_baseline.cpp.
#include "backend/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "backend/executor_detail.hpp"
#include "core/task_graph.hpp"

namespace harmony::backend {

namespace detail {

Ancestry::Ancestry(const core::Program& p, const std::vector<std::vector<int>>& extra) {
  const std::size_t n = p.ops.size();
  words_ = (n + 63) / 64;
  bits_.assign(n * words_, 0);
  // predecessors: deps, the op before in its queue, extra edges; Kahn's algorithm in op order
  std::vector<std::vector<int>> preds(n), succs(n);
  for (std::size_t o = 0; o < n; ++o) {
    const core::Op& op = p.ops[o];
    auto add = [&](int d) {
      preds[o].push_back(d);
      succs[static_cast<std::size_t>(d)].push_back(static_cast<int>(o));
    };
    for (int d : op.deps) add(d);
    if (op.queue_pos > 0)
      add(p.queues[static_cast<std::size_t>(op.queue)].ops[static_cast<std::size_t>(op.queue_pos - 1)]);
    if (o < extra.size())
      for (int d : extra[o]) add(d);
  }
  std::vector<std::size_t> indeg(n);
  std::deque<std::size_t> ready;
  for (std::size_t o = 0; o < n; ++o) {
    indeg[o] = preds[o].size();
    if (indeg[o] == 0) ready.push_back(o);
  }
  std::size_t seen = 0;
  while (!ready.empty()) {
    const std::size_t o = ready.front();
    ready.pop_front();
    ++seen;
    std::uint64_t* row = &bits_[o * words_];
    for (int d : preds[o]) {
      const auto du = static_cast<std::size_t>(d);
      const std::uint64_t* drow = &bits_[du * words_];
      for (std::size_t w = 0; w < words_; ++w) row[w] |= drow[w];
      row[du / 64] |= std::uint64_t{1} << (du % 64);
    }
    for (int s : succs[o])
      if (--indeg[static_cast<std::size_t>(s)] == 0) ready.push_back(static_cast<std::size_t>(s));
  }
  if (seen != n)
    throw ScheduleViolation(
        "executor: the Program's dependencies and queue order (with the executor's added edges) "
        "form a cycle");
}

std::string op_name(const core::Program& p, int op) { return p.op_label(op) + " (" + p.op_id(op) + ")"; }

StepResult run_step(const core::Program& p, Interpreter& it) {
  const std::size_t nops = p.ops.size();
  const auto& extra = it.extra_deps();
  StepResult res;
  res.begin.assign(nops, -1);
  res.end.assign(nops, -1);
  std::vector<char> done(nops, 0);
  std::vector<std::size_t> head(p.queues.size(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] {
    return static_cast<core::TimePs>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count() *
        core::kPsPerNs);
  };
  auto ready = [&](int o) {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    if (head[static_cast<std::size_t>(op.queue)] != static_cast<std::size_t>(op.queue_pos)) return false;
    for (int dp : op.deps)
      if (done[static_cast<std::size_t>(dp)] == 0) return false;
    if (static_cast<std::size_t>(o) < extra.size())
      for (int dp : extra[static_cast<std::size_t>(o)])
        if (done[static_cast<std::size_t>(dp)] == 0) return false;
    return true;
  };
  std::size_t left = nops;
  while (left > 0) {
    bool progress = false;
    for (std::size_t q = 0; q < p.queues.size(); ++q) {
      if (head[q] >= p.queues[q].ops.size()) continue;
      const int o = p.queues[q].ops[head[q]];
      if (!ready(o)) continue;
      const std::vector<int> group = it.group(o);
      if (!std::all_of(group.begin(), group.end(), ready)) continue;
      const core::TimePs b = now();
      it.run(group);
      const core::TimePs e = now();
      for (int g : group) {
        res.begin[static_cast<std::size_t>(g)] = b;
        res.end[static_cast<std::size_t>(g)] = e;
        done[static_cast<std::size_t>(g)] = 1;
        ++head[static_cast<std::size_t>(p.ops[static_cast<std::size_t>(g)].queue)];
      }
      for (int g : group) it.finished(g);
      left -= group.size();
      progress = true;
    }
    if (!progress) {
      std::string stuck;
      for (std::size_t q = 0; q < p.queues.size(); ++q)
        if (head[q] < p.queues[q].ops.size()) stuck += "\n  " + op_name(p, p.queues[q].ops[head[q]]);
      throw ScheduleViolation("executor: no op can start; queue heads:" + stuck);
    }
  }
  return res;
}

}  // namespace detail

namespace {
using core::OpKind;
constexpr Bytes kF = sizeof(float);

// Device tensors: activation at the input of layer l (Act), stash (Stash), gradient of the input of layer l
// (Grad), recompute inputs/acts per layer (RecX, RecAct), a task's weights (W) and weight gradients (DW).
enum class DK : std::uint8_t { Act, Stash, Grad, RecX, RecAct, W, DW };
const char* dk_name(DK k) {
  constexpr const char* n[] = {"Act", "Stash", "dX", "RecX", "RecAct", "W", "dW"};
  return n[static_cast<int>(k)];
}
// Host channels (per boundary layer, the whole minibatch, per-sample producer).
enum class HC : std::uint8_t { YSwap, YMsg, Stash, StashMsg, DXSwap };
const char* hc_name(HC k) {
  constexpr const char* n[] = {"host Y", "host Y msg", "host stash", "host stash msg", "host dX"};
  return n[static_cast<int>(k)];
}

struct DevTensor {
  Buffer buf;
  int producer = -1;
  int owner_task = -1;
};
struct HostChan {
  std::vector<std::byte> data;
  std::vector<int> producer;  // per sample
};
using DevKey = std::tuple<DK, int, int, int>;  // kind, layer (or task), first sample, samples

class HarmonyInterpreter final : public detail::Interpreter {
 public:
  const core::Program& p;
  std::vector<Device*> devs;
  HostState& st;
  ExecutorOptions opt;
  const Gpt2& m;
  int B = 0, T = 0;
  std::vector<std::unique_ptr<Stream>> streams;
  detail::Ancestry anc;
  std::vector<std::vector<int>> no_extra;
  std::vector<int> rank_offset;  // first sample of each rank's share
  std::vector<std::map<DevKey, DevTensor>> dev;
  std::map<std::pair<HC, int>, HostChan> host;
  std::vector<float> losses;
  std::span<const std::int32_t> in, tgt;

  HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o)
      : p(prog), devs(std::move(d)), st(s), opt(o), m(s.model()), anc(prog, {}) {
    B = p.graph.plan.minibatch;
    T = opt.seq_len;
    if (p.graph.plan.mode == core::Mode::HarmonyDP && static_cast<int>(p.devices.size()) != p.num_devices())
      throw BackendError("executor: Harmony-DP Program lowered for GPU 0 only (set dp_first_gpu_only = false)");
    for (auto* dv : devs) streams.push_back(dv->create_stream("executor"));
    dev.resize(devs.size());
    const bool dp = p.graph.plan.mode == core::Mode::HarmonyDP;
    int off = 0;
    for (int r = 0; r < p.num_devices(); ++r) {
      rank_offset.push_back(dp ? off : 0);
      for (int u : p.graph.ubatch_bwd[static_cast<std::size_t>(r)]) off += u;
    }
    for (std::size_t o = 0; o < p.ops.size(); ++o)
      for (const auto& k : reads_of(static_cast<int>(o))) ++readers_total[k];
  }

  bool happens_before(int a, int b) const { return anc.before(a, b); }
  std::string label(int op) const { return detail::op_name(p, op); }

  // Samples [first, first + n) of an op's microbatch.
  std::pair<int, int> samples(int o) const {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const bool msg = op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY;
    const std::vector<int>& list = msg ? p.graph.ubatch_bwd[static_cast<std::size_t>(t.rank)] : t.ubatch_sizes;
    int s = rank_offset[static_cast<std::size_t>(t.rank)];
    for (int i = 0; i < op.ui; ++i) s += list[static_cast<std::size_t>(i)];
    return {s, list[static_cast<std::size_t>(op.ui)]};
  }
  Bytes per_sample(int l) const { return m.input_bytes(l, 1, T); }

  // ---- device tensors ----
  std::string dname(int d, const DevKey& k) const {
    return fmt::format("{} {} {} samples [{}, {})", devs[static_cast<std::size_t>(d)]->name(), dk_name(std::get<0>(k)),
                       std::get<1>(k), std::get<2>(k), std::get<2>(k) + std::get<3>(k));
  }
  DevTensor& read(int o, int d, const DevKey& k) {
    auto it = dev[static_cast<std::size_t>(d)].find(k);
    if (it == dev[static_cast<std::size_t>(d)].end())
      throw ScheduleViolation(
          fmt::format("executor: op {} reads {}, which no op has produced yet", label(o), dname(d, k)));
    if (!happens_before(it->second.producer, o))
      throw ScheduleViolation(fmt::format("executor: op {} reads {}, produced by op {}, on which it does not depend",
                                          label(o), dname(d, k), label(it->second.producer)));
    return it->second;
  }
  DevTensor& make(int o, int d, const DevKey& k, Bytes bytes) {
    auto& map = dev[static_cast<std::size_t>(d)];
    map.erase(k);
    DevTensor t;
    t.buf = devs[static_cast<std::size_t>(d)]->alloc(bytes, dname(d, k));
    t.producer = o;
    t.owner_task = p.ops[static_cast<std::size_t>(o)].task;
    return map[k] = std::move(t);
  }

  // ---- host channels ----
  HostChan& chan(HC c, int l) {
    HostChan& h = host[{c, l}];
    if (h.data.empty()) {
      h.data.resize(static_cast<std::size_t>(B) * static_cast<std::size_t>(per_sample(l)));
      h.producer.assign(static_cast<std::size_t>(B), -1);
    }
    return h;
  }
  std::byte* host_read(int o, HC c, int l, int s0, int n) {
    HostChan& h = chan(c, l);
    for (int s = s0; s < s0 + n; ++s) {
      const int pr = h.producer[static_cast<std::size_t>(s)];
      if (pr < 0)
        throw ScheduleViolation(fmt::format("executor: op {} reads {} {} sample {}, which no op has produced yet",
                                            label(o), hc_name(c), l, s));
      if (!happens_before(pr, o))
        throw ScheduleViolation(
            fmt::format("executor: op {} reads {} {} sample {}, produced by op {}, on which it does not depend",
                        label(o), hc_name(c), l, s, label(pr)));
    }
    return h.data.data() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(l));
  }
  std::byte* host_write(int o, HC c, int l, int s0, int n) {
    HostChan& h = chan(c, l);
    for (int s = s0; s < s0 + n; ++s) h.producer[static_cast<std::size_t>(s)] = o;
    return h.data.data() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(l));
  }

  Device& D(int d) { return *devs[static_cast<std::size_t>(d)]; }
  Stream& S(int d) { return *streams[static_cast<std::size_t>(d)]; }
  void sync(int d) { S(d).synchronize(); }

  std::int64_t w_offset(const core::LayerRange& r, int l) const {
    std::int64_t o = 0;
    for (int k = r.first; k < l; ++k) o += m.param_floats(k);
    return o;
  }
  std::int64_t w_floats(const core::LayerRange& r) const { return w_offset(r, r.last + 1); }

  // Forward of layers [a, b] of the task's weights over n samples from x; keeps every input and act when
  // `keep` (REC), else writes the result to out. Returns nothing; losses of the head go to `losses`.
  void forward_range(int o, int d, const core::LayerRange& wr, const DevTensor& W, int a, int b, int s0, int n,
                     const void* x0, const DevKey* out_key, bool keep) {
    DeviceOps ops(D(d), S(d));
    const void* x = x0;
    Buffer tmp_y, tmp_act, prev, targets;
    for (int l = a; l <= b; ++l) {
      LayerArgs<float> args;
      args.B = n;
      args.T = T;
      args.w = W.buf.as<float>() + w_offset(wr, l);
      if (l == 0) {
        args.tokens = static_cast<const std::int32_t*>(x);
      } else {
        args.x = static_cast<const float*>(x);
      }
      if (m.kind(l) == LayerKind::Head) {
        targets = D(d).alloc(Bytes(n) * T * 4, "targets");
        D(d).copy_h2d(S(d), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
        args.targets = targets.as<std::int32_t>();
      }
      Buffer y;
      DevTensor* yt = nullptr;
      if (l == b && !keep) {
        yt = &make(o, d, *out_key, m.output_bytes(l, n, T));
        args.y = yt->buf.as<float>();
      } else {
        y = D(d).alloc(m.output_bytes(l, n, T), "y");
        args.y = y.as<float>();
      }
      float* act = nullptr;
      if (keep) {
        act = make(o, d, DevKey{DK::RecAct, l, s0, n}, m.act_floats(l, n, T) * kF).buf.as<float>();
      } else {
        tmp_act = D(d).alloc(m.act_floats(l, n, T) * kF, "act");
        act = tmp_act.as<float>();
      }
      args.act = act;
      m.forward(ops, l, args);
      if (m.kind(l) == LayerKind::Head) {
        D(d).copy_d2h(S(d), losses.data() + static_cast<std::size_t>(s0) * T, args.y, Bytes(n) * T * kF);
      }
      sync(d);
      if (l < b) {
        if (keep) {
          DevTensor& nx = make(o, d, DevKey{DK::RecX, l + 1, s0, n}, m.output_bytes(l, n, T));
          D(d).copy_d2d(S(d), nx.buf.data(), y.data(), m.output_bytes(l, n, T));
          sync(d);
          x = nx.buf.data();
        } else {
          prev = std::move(y);
          x = prev.data();
        }
      }
    }
  }

  void run_op(int o) {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const int d = op.device;
    const int lf = op.layers.first, ll = op.layers.last;
    switch (op.kind) {
      case OpKind::WB: {
        DevTensor& w = make(o, d, DevKey{DK::W, op.task, 0, 0}, w_floats(op.layers) * kF);
        for (int l = lf; l <= ll; ++l)
          D(d).copy_h2d(S(d), w.buf.as<float>() + w_offset(op.layers, l), st.weights(l).data(), m.param_floats(l) * kF);
        sync(d);
        return;
      }
      case OpKind::X: {
        const auto [s0, n] = samples(o);
        const Bytes b = Bytes(n) * per_sample(lf);
        if (t.has_data) {
          DevTensor& x = make(o, d, DevKey{DK::Act, 0, s0, n}, b);
          D(d).copy_h2d(S(d), x.buf.data(), in.data() + static_cast<std::size_t>(s0) * T, b);
        } else if (t.in_x.medium == core::Medium::Msg || t.in_x.medium == core::Medium::Swap) {
          const HC c = t.in_x.medium == core::Medium::Msg ? HC::YMsg : HC::YSwap;
          const std::byte* src = host_read(o, c, lf, s0, n);
          DevTensor& x = make(o, d, DevKey{DK::Act, lf, s0, n}, b);
          D(d).copy_h2d(S(d), x.buf.data(), src, b);
        } else {
          throw BackendError(fmt::format("executor: op {}: unsupported input medium", label(o)));
        }
        sync(d);
        return;
      }
      case OpKind::sX: {
        const auto [s0, n] = samples(o);
        const Bytes b = Bytes(n) * per_sample(lf);
        if (t.type == core::TaskType::Fwd) {  // stash out
          const DevTensor& x = read(o, d, DevKey{DK::Act, lf, s0, n});
          D(d).copy_d2h(S(d), host_write(o, HC::Stash, lf, s0, n), x.buf.data(), b);
        } else {  // stash in
          const std::byte* src = host_read(o, HC::StashMsg, lf, s0, n);
          DevTensor& x = make(o, d, DevKey{DK::Stash, lf, s0, n}, b);
          D(d).copy_h2d(S(d), x.buf.data(), src, b);
        }
        sync(d);
        return;
      }
      case OpKind::MSGsX:
      case OpKind::MSGY: {
        const auto [s0, n] = samples(o);
        const int l = op.kind == OpKind::MSGsX ? lf : ll + 1;
        const HC from = op.kind == OpKind::MSGsX ? HC::Stash : HC::YSwap;
        const HC to = op.kind == OpKind::MSGsX ? HC::StashMsg : HC::YMsg;
        const std::byte* src = host_read(o, from, l, s0, n);
        std::memcpy(host_write(o, to, l, s0, n), src, static_cast<std::size_t>(Bytes(n) * per_sample(l)));
        return;
      }
      case OpKind::Y: {  // swap out (P2P runs as a pair)
        const auto [s0, n] = samples(o);
        const DevTensor& y = read(o, d, DevKey{DK::Act, ll + 1, s0, n});
        D(d).copy_d2h(S(d), host_write(o, HC::YSwap, ll + 1, s0, n), y.buf.data(), Bytes(n) * per_sample(ll + 1));
        sync(d);
        return;
      }
      case OpKind::dX: {
        const auto [s0, n] = samples(o);
        const DevTensor& g = read(o, d, DevKey{DK::Grad, lf, s0, n});
        D(d).copy_d2h(S(d), host_write(o, HC::DXSwap, lf, s0, n), g.buf.data(), Bytes(n) * per_sample(lf));
        sync(d);
        return;
      }
      case OpKind::dY: {
        const auto [s0, n] = samples(o);
        const std::byte* src = host_read(o, HC::DXSwap, ll + 1, s0, n);
        DevTensor& g = make(o, d, DevKey{DK::Grad, ll + 1, s0, n}, Bytes(n) * per_sample(ll + 1));
        D(d).copy_h2d(S(d), g.buf.data(), src, Bytes(n) * per_sample(ll + 1));
        sync(d);
        return;
      }
      case OpKind::FWD: {
        const auto [s0, n] = samples(o);
        const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
        const DevTensor& x = read(o, d, DevKey{DK::Act, lf, s0, n});
        const DevKey out{DK::Act, ll + 1, s0, n};
        forward_range(o, d, t.layers, W, lf, ll, s0, n, x.buf.data(), &out, false);
        return;
      }
      case OpKind::REC: {
        const auto [s0, n] = samples(o);
        const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
        const DevTensor& x = read(o, d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n});
        forward_range(o, d, t.layers, W, lf, ll, s0, n, x.buf.data(), nullptr, true);
        return;
      }
      case OpKind::BWD: {
        const auto [s0, n] = samples(o);
        const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
        const DevTensor& x0 = read(o, d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n});
        const DevKey dwk{DK::DW, op.task, 0, 0};
        if (dev[static_cast<std::size_t>(d)].count(dwk) == 0) {
          DevTensor& g = make(o, d, dwk, w_floats(t.layers) * kF);
          D(d).fill_zero(S(d), g.buf.data(), g.buf.bytes());
        } else {
          read(o, d, dwk).producer = o;
        }
        float* dw = dev[static_cast<std::size_t>(d)][dwk].buf.as<float>();
        const float* dy = t.has_criterion ? nullptr : read(o, d, DevKey{DK::Grad, ll + 1, s0, n}).buf.as<float>();
        std::int64_t scratch = 0;
        for (int l = lf; l <= ll; ++l) scratch = std::max(scratch, m.scratch_floats(l, n, T));
        Buffer scr = D(d).alloc(scratch * kF, "scratch"), targets, g_a, g_b;
        const Bytes gb = Bytes(n) * T * m.config().n_embd * kF;
        g_a = D(d).alloc(gb, "dx a");
        g_b = D(d).alloc(gb, "dx b");
        if (t.has_criterion) {
          targets = D(d).alloc(Bytes(n) * T * 4, "targets");
          D(d).copy_h2d(S(d), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
        }
        DeviceOps ops(D(d), S(d));
        float* spare = g_a.as<float>();
        float* other = g_b.as<float>();
        for (int l = ll; l >= lf; --l) {
          LayerArgs<float> a;
          a.B = n;
          a.T = T;
          a.w = W.buf.as<float>() + w_offset(t.layers, l);
          a.dw = dw + w_offset(t.layers, l);
          const void* x = l == lf ? x0.buf.data() : read(o, d, DevKey{DK::RecX, l, s0, n}).buf.data();
          if (l == 0) {
            a.tokens = static_cast<const std::int32_t*>(x);
          } else {
            a.x = static_cast<const float*>(x);
          }
          a.targets = targets.as<std::int32_t>();
          a.act = read(o, d, DevKey{DK::RecAct, l, s0, n}).buf.as<float>();
          a.dy = dy;
          a.scratch = scr.as<float>();
          a.loss_scale = 1.0f / static_cast<float>(static_cast<std::size_t>(B) * static_cast<std::size_t>(T));
          float* dx = nullptr;
          if (l > 0) dx = l == lf ? make(o, d, DevKey{DK::Grad, lf, s0, n}, gb).buf.as<float>() : spare;
          a.dx = dx;
          m.backward(ops, l, a);
          sync(d);
          dy = dx;
          std::swap(spare, other);
        }
        return;
      }
      case OpKind::ARD:
        return;  // run as a group (run_ard)
      case OpKind::dWB: {
        const DevTensor& g = read(o, d, DevKey{DK::DW, op.task, 0, 0});
        for (int l = lf; l <= ll; ++l)
          D(d).copy_d2h(S(d), st.grads(l).data(), g.buf.as<float>() + w_offset(op.layers, l), m.param_floats(l) * kF);
        sync(d);
        for (int l = lf; l <= ll; ++l) grad_producer[l] = o;
        return;
      }
      case OpKind::Update: {
        for (int l = lf; l <= ll; ++l) {
          if (grad_producer[l] < 0 || !happens_before(grad_producer[l], o))
            throw ScheduleViolation(
                fmt::format("executor: op {} updates layer {} before its gradients reach the host", label(o), l));
        }
        // Harmony-DP: every replica's Update sees the same all-reduced gradients; the shared master copy is
        // updated once per pack.
        if (updated.insert({lf, ll}).second) st.update(opt.adamw, lf, ll);
        return;
      }
      case OpKind::DEL: {
        auto& map = dev[static_cast<std::size_t>(d)];
        for (auto it = map.begin(); it != map.end();) {
          const DK k = std::get<0>(it->first);
          if (it->second.owner_task == op.task && (k == DK::W || k == DK::DW)) {
            it = map.erase(it);
          } else {
            ++it;
          }
        }
        return;
      }
      default:
        throw BackendError(
            fmt::format("executor: op {}: kind {} not supported", label(o), core::op_kind_name(op.kind)));
    }
  }

  // P2P pair: the send side's device tensor is copied into the receive side's device.
  void run_pair(int send, int recv) {
    const core::Op& so = p.ops[static_cast<std::size_t>(send)];
    const core::Op& ro = p.ops[static_cast<std::size_t>(recv)];
    const auto [s0, n] = samples(send);
    const auto [r0, rn] = samples(recv);
    const bool fwd = so.kind == OpKind::Y;
    const int l = fwd ? so.layers.last + 1 : so.layers.first;
    if (r0 != s0 || rn != n)
      throw ScheduleViolation(fmt::format("executor: P2P {} -> {} moves different samples", label(send), label(recv)));
    const DevTensor& src = read(send, so.device, DevKey{fwd ? DK::Act : DK::Grad, l, s0, n});
    DevTensor& dst = make(recv, ro.device, DevKey{fwd ? DK::Act : DK::Grad, l, s0, n}, Bytes(n) * per_sample(l));
    D(so.device).copy_d2d(S(so.device), dst.buf.data(), src.buf.data(), Bytes(n) * per_sample(l), &D(ro.device));
    sync(so.device);
  }

  // ARD group: the replicas' dW summed in rank order (as Communicator::all_reduce_sum), written back to all.
  void run_ard(const std::vector<int>& group) {
    const core::Op& o0 = p.ops[static_cast<std::size_t>(group.front())];
    const std::int64_t count = w_floats(o0.layers);
    std::vector<float> sum(static_cast<std::size_t>(count)), part(static_cast<std::size_t>(count));
    for (std::size_t r = 0; r < group.size(); ++r) {
      const core::Op& op = p.ops[static_cast<std::size_t>(group[r])];
      const DevTensor& g = read(group[r], op.device, DevKey{DK::DW, op.task, 0, 0});
      D(op.device).copy_d2h(S(op.device), part.data(), g.buf.data(), count * kF);
      sync(op.device);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? part[i] : sum[i] + part[i];
    }
    for (int a : group) {
      const core::Op& op = p.ops[static_cast<std::size_t>(a)];
      DevTensor& g = dev[static_cast<std::size_t>(op.device)][DevKey{DK::DW, op.task, 0, 0}];
      D(op.device).copy_h2d(S(op.device), g.buf.data(), sum.data(), count * kF);
      sync(op.device);
      g.producer = a;
    }
  }

  std::vector<int> grad_producer;
  std::set<std::pair<int, int>> updated;

  // The device tensors op o reads, as run_op/run_pair/run_ard read them (the RecX/RecAct of BWD included).
  // A tensor is freed once its last reader has run: memory follows the Program's data flow, so a device holds
  // what the Program's allocs/frees say it holds (docs/backend.md, "Executor memory").
  std::vector<std::pair<int, DevKey>> reads_of(int o) const {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const int d = op.device;
    const int lf = op.layers.first, ll = op.layers.last;
    std::vector<std::pair<int, DevKey>> r;
    auto mb = [&] { return samples(o); };
    switch (op.kind) {
      case OpKind::sX:
        if (t.type == core::TaskType::Fwd) r.push_back({d, DevKey{DK::Act, lf, mb().first, mb().second}});
        break;
      case OpKind::Y:
        r.push_back({d, DevKey{DK::Act, ll + 1, mb().first, mb().second}});
        break;
      case OpKind::dX:
        r.push_back({d, DevKey{DK::Grad, lf, mb().first, mb().second}});
        break;
      case OpKind::FWD:
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{DK::Act, lf, mb().first, mb().second}});
        break;
      case OpKind::REC:
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, mb().first, mb().second}});
        break;
      case OpKind::BWD: {
        const auto [s0, n] = mb();
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n}});
        if (op.ui > 0) r.push_back({d, DevKey{DK::DW, op.task, 0, 0}});
        if (!t.has_criterion) r.push_back({d, DevKey{DK::Grad, ll + 1, s0, n}});
        for (int l = lf; l <= ll; ++l) {
          if (l > lf) r.push_back({d, DevKey{DK::RecX, l, s0, n}});
          r.push_back({d, DevKey{DK::RecAct, l, s0, n}});
        }
        break;
      }
      case OpKind::ARD:
      case OpKind::dWB:
        r.push_back({d, DevKey{DK::DW, op.task, 0, 0}});
        break;
      default:
        break;
    }
    return r;
  }
  std::map<std::pair<int, DevKey>, int> readers_total;  // per (device, tensor): ops that read it
  std::map<std::pair<int, DevKey>, int> readers_left;

  // After op o ran: drop the tensors whose last reader it was, and those it produced that nobody reads.
  void release(int o) {
    for (const auto& k : reads_of(o)) {
      auto it = readers_left.find(k);
      if (it != readers_left.end() && --it->second == 0) dev[static_cast<std::size_t>(k.first)].erase(k.second);
    }
    for (int d = 0; d < static_cast<int>(dev.size()); ++d) {
      auto& map = dev[static_cast<std::size_t>(d)];
      for (auto it = map.begin(); it != map.end();) {
        if (it->second.producer == o && readers_total.count({d, it->first}) == 0) {
          it = map.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  const std::vector<std::vector<int>>& extra_deps() const override { return no_extra; }

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override {
    in = inputs;
    tgt = targets;
    losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
    host.clear();
    for (auto& mp : dev) mp.clear();
    grad_producer.assign(static_cast<std::size_t>(m.num_layers()), -1);
    updated.clear();
    readers_left = readers_total;
  }

  // A P2P pair runs as one copy (send first); the replicas' ARD ops of a pack run together, in device order.
  std::vector<int> group(int o) const override {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    if (op.peer >= 0) {
      const bool send = op.kind == OpKind::Y || op.kind == OpKind::dX;
      return send ? std::vector<int>{o, op.peer} : std::vector<int>{op.peer, o};
    }
    if (op.kind != OpKind::ARD) return {o};
    std::vector<int> g;
    for (std::size_t a = 0; a < p.ops.size(); ++a) {
      const core::Op& x = p.ops[a];
      if (x.kind == OpKind::ARD && x.layers == op.layers) g.push_back(static_cast<int>(a));
    }
    std::sort(g.begin(), g.end(), [&](int x, int y) {
      return p.ops[static_cast<std::size_t>(x)].device < p.ops[static_cast<std::size_t>(y)].device;
    });
    return g;
  }

  void run(const std::vector<int>& g) override {
    const core::Op& op = p.ops[static_cast<std::size_t>(g.front())];
    if (op.peer >= 0) {
      run_pair(g[0], g[1]);
    } else if (op.kind == OpKind::ARD) {
      run_ard(g);
    } else {
      run_op(g.front());
    }
  }

  void finished(int o) override { release(o); }

  double end_step() override {
    for (auto& mp : dev) mp.clear();
    host.clear();
    double total = 0.0;
    for (const float x : losses) total += x;
    return total / static_cast<double>(losses.size());
  }

  void synchronize() override {
    for (auto& s : streams) s->synchronize();
  }
};

}  // namespace

namespace detail {
std::unique_ptr<Interpreter> make_harmony_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                      HostState& state, const ExecutorOptions& options) {
  return std::make_unique<HarmonyInterpreter>(program, std::move(devices), state, options);
}
}  // namespace detail

struct Executor::Impl {
  const core::Program& p;
  int B = 0;
  int T = 0;
  std::unique_ptr<detail::Interpreter> interpreter;
};

namespace {
// Baseline Programs (core::lower_baseline) carry no Harmony tasks: their ops have pseudo task ids.
bool is_baseline_program(const core::Program& p) {
  return p.graph.tasks.empty() &&
         std::all_of(p.graph.rank_tasks.begin(), p.graph.rank_tasks.end(), [](const auto& r) { return r.empty(); });
}
}  // namespace

Executor::Executor(const core::Program& program, std::vector<Device*> devices, HostState& state,
                   const ExecutorOptions& options) {
  const Gpt2& m = state.model();
  if (static_cast<int>(devices.size()) != program.num_devices())
    throw BackendError(
        fmt::format("executor: {} devices for a Program of {} GPUs", devices.size(), program.num_devices()));
  if (program.graph.num_layers != m.num_layers())
    throw BackendError(
        fmt::format("executor: Program has {} layers, the model {}", program.graph.num_layers, m.num_layers()));
  if (options.seq_len < 1 || options.seq_len > m.config().max_seq_len)
    throw BackendError(
        fmt::format("executor: sequence length {} outside 1..{}", options.seq_len, m.config().max_seq_len));
  core::validate_program(program);
  auto interpreter = is_baseline_program(program)
                         ? detail::make_baseline_interpreter(program, std::move(devices), state, options)
                         : detail::make_harmony_interpreter(program, std::move(devices), state, options);
  impl_ = new Impl{program, program.graph.plan.minibatch, options.seq_len, std::move(interpreter)};
}

Executor::~Executor() {
  try {
    impl_->interpreter->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  delete impl_;
}

StepResult Executor::step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  const auto bt = static_cast<std::size_t>(impl_->B) * static_cast<std::size_t>(impl_->T);
  if (inputs.size() != bt || targets.size() != bt)
    throw BackendError(
        fmt::format("executor: expected {} inputs and targets, got {} and {}", bt, inputs.size(), targets.size()));
  detail::Interpreter& it = *impl_->interpreter;
  it.begin_step(inputs, targets);
  StepResult res = detail::run_step(impl_->p, it);
  res.loss = it.end_step();
  return res;
}

}  // namespace harmony::backend
