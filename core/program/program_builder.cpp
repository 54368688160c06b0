// The swapping kinds' op-building kit (program_builder.hpp): detail::ProgramBuilder, saved activations and GPipe's
// balanced stage split.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/program/program_builder.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::core {

namespace {

// The layer's backward peak less what the Program allocates for it apart: weights, weight gradient, buffers, input,
// dY (the next layer's input) and dX.
Bytes backward_peak_beyond_own(const Model& model, int u, int l) {
  const Bytes w = model.weight_bytes(l, l);
  const Bytes x = model.input_bytes(u, l);
  const Bytes own = w + model.buffer_bytes(l, l) + w + x + model.input_bytes(u, l + 1) + (l != 0 ? x : 0);
  return model.peak_bytes(Phase::Bwd, u, l) - own;
}

}  // namespace

Bytes saved_activation_bytes(const Model& model, int u, int l) {
  if (const Bytes recorded = model.recorded_saved_bytes(u, l); recorded >= 0) return recorded;
  return std::max<Bytes>(0, backward_peak_beyond_own(model, u, l));
}

// ---- GPipe's balanced split ----

std::vector<LayerRange> balanced_stages(const Model& model, int u, int stages) {
  const int R = model.num_layers();
  if (stages < 1 || stages > R)
    throw ScheduleError(fmt::format("cannot split {} layers into {} non-empty stages", R, stages));
  std::vector<double> prefix(static_cast<std::size_t>(R) + 1, 0.0);
  for (int l = 0; l < R; ++l)
    prefix[static_cast<std::size_t>(l) + 1] = prefix[static_cast<std::size_t>(l)] + model.time_s(Phase::Bwd, u, l);
  auto sum = [&](int i, int j) { return prefix[static_cast<std::size_t>(j)] - prefix[static_cast<std::size_t>(i)]; };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][j]: smallest max stage time splitting layers [0, j) into k stages; cut[k][j]: start of the last.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1,
                                        std::vector<double>(static_cast<std::size_t>(R) + 1, inf));
  std::vector<std::vector<int>> cut(static_cast<std::size_t>(stages) + 1,
                                    std::vector<int>(static_cast<std::size_t>(R) + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int j = k; j <= R; ++j) {
      for (int i = k - 1; i < j; ++i) {
        const double prev = best[static_cast<std::size_t>(k) - 1][static_cast<std::size_t>(i)];
        if (prev == inf) continue;
        const double v = std::max(prev, sum(i, j));
        if (v < best[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)]) {
          best[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)] = v;
          cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)] = i;
        }
      }
    }
  }
  std::vector<LayerRange> out(static_cast<std::size_t>(stages));
  int j = R;
  for (int k = stages; k >= 1; --k) {
    const int i = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)];
    out[static_cast<std::size_t>(k) - 1] = LayerRange{i, j - 1};
    j = i;
  }
  return out;
}

// ---- the shared op-building kit ----

namespace detail {

ProgramBuilder::ProgramBuilder(const Model& model, const Plan& plan)
    : model_(model), policy_(plan.knobs.activation_policy), on_demand_(plan.knobs.swap == SwapTiming::OnDemand) {
  const int R = model.num_layers();
  const int N = plan.gpus;
  Plan& gp = prog_.graph.plan;
  gp = plan;
  gp.u_fwd = plan.u_bwd;
  if (plan.kind->stage_per_gpu && !plan.stages.empty()) {
    gp.packs_bwd = plan.stages;
  } else {
    gp.packs_bwd = {LayerRange{0, R - 1}};
  }
  gp.packs_fwd.assign(gp.packs_bwd.begin(), gp.packs_bwd.end() - 1);
  prog_.graph.num_layers = R;
  prog_.graph.rank_tasks.assign(static_cast<std::size_t>(N), {});
  const int share = plan.kind->data_parallel ? plan.minibatch / N : plan.minibatch;
  const auto lists = split_minibatch(share, plan.u_bwd);
  prog_.graph.ubatch_fwd.assign(static_cast<std::size_t>(N), lists);
  prog_.graph.ubatch_bwd.assign(static_cast<std::size_t>(N), lists);
  prog_.cost.prefetch = false;
  prog_.cost.pp_rules = false;
  prog_.cost.bandwidth_sharers = N;
  steps_.assign(static_cast<std::size_t>(N), {});
  waiters_.assign(static_cast<std::size_t>(N), {});
}

int ProgramBuilder::op(int device, Stream stream, OpKind kind, int task, int ui, LayerRange layers, int ubs,
                       Bytes bytes) {
  Op o;
  o.task = task;
  o.ui = ui;
  o.device = device;
  o.stream = stream;
  o.kind = kind;
  o.layers = layers;
  o.ubs = ubs;
  o.bytes = bytes;
  prog_.ops.push_back(std::move(o));
  return static_cast<int>(prog_.ops.size()) - 1;
}

int ProgramBuilder::weight_op(int device, Stream stream, OpKind kind, int task, int ui, LayerRange layers, Bytes w,
                              Bytes b) {
  const int id = op(device, stream, kind, task, ui, layers, 0, w + b);
  prog_.ops[static_cast<std::size_t>(id)].bytes_w = w;
  prog_.ops[static_cast<std::size_t>(id)].bytes_b = b;
  return id;
}

int ProgramBuilder::fetch_weights(int device, int l, int task, int ui, int k, Bytes w, Bytes b, bool windowed) {
  const LayerRange L{l, l};
  const int W = weight_op(device, Stream::SwapIn, OpKind::WB, task, ui, L, w, b);
  alloc(W, TensorKind::Weights, L, -1, w + b);
  if (windowed || on_demand_) window(W, device, k);  // on demand, even resident weights move only when first read
  return W;
}

int ProgramBuilder::gradient_out(int device, int l, int ui, int bwd, int k, std::uint64_t key, Bytes host_sum) {
  const LayerRange L{l, l};
  int src = bwd;
  int src_step = k;
  if (prog_.graph.plan.gpus > 1) {
    src_step = next_step(device);
    src = compute(device, OpKind::ARD, bwd_task(device, l), ui, L, 0, wbytes(l), bbytes(l));
    dep(src, bwd);
    collective(key, src, bwd);
  }
  const int O = weight_op(device, Stream::SwapOut, OpKind::dWB, bwd_task(device, l), ui, L, wbytes(l), bbytes(l));
  dep(O, src);
  if (host_sum > 0) set_host_sum(O, host_sum);
  free(O, TensorKind::WeightGrad, L, -1, wbytes(l));
  output_of(O, device, src_step);
  return O;
}

void ProgramBuilder::nvme_update_io(int update, int l, Bytes extra_read) {
  const Bytes state = model_.optimizer_state_bytes(l, l) + model_.master_bytes(l, l);
  set_io(update, 1, state + extra_read, state + (model_.narrow_weights(l) ? wbytes(l) + bbytes(l) : 0));
}

// FWD: the profiled forward peak less the layer's weights, input and output (under keep also less the saved
// activations the FWD allocates: its temporaries are what it saves). BWD: the backward peak less the weights,
// gradient, input, dY, dX and the saved activations (REC or FWD allocates them): the backward's own scratch. Where
// the saved activations are derived from that peak (a paper profile) nothing is left; where the model records them
// (harmony-run's description, the analytic models), the scratch and gradients its backward allocates.
Bytes ProgramBuilder::workspace(Phase ph, int u, int l) const {
  if (ph == Phase::Bwd) return std::max<Bytes>(0, backward_peak_beyond_own(model_, u, l) - sbytes(u, l));
  const Bytes own = wbytes(l) + bbytes(l) + xbytes(u, l) + xbytes(u, l + 1) + (keep() ? sbytes(u, l) : 0);
  return std::max<Bytes>(0, model_.peak_bytes(ph, u, l) - own);
}

int ProgramBuilder::compute(int device, OpKind kind, int task, int ui, LayerRange layers, int ubs, Bytes w, Bytes b) {
  const int id = kind == OpKind::ARD ? weight_op(device, Stream::Compute, kind, task, ui, layers, w, b)
                                     : op(device, Stream::Compute, kind, task, ui, layers, ubs, 0);
  if (kind == OpKind::FWD || kind == OpKind::BWD) {
    prog_.ops[static_cast<std::size_t>(id)].workspace_bytes =
        workspace(kind == OpKind::FWD ? Phase::Fwd : Phase::Bwd, ubs, layers.first);
  }
  auto& steps = steps_[static_cast<std::size_t>(device)];
  const int k = static_cast<int>(steps.size());
  steps.push_back(id);
  auto& waits = waiters_[static_cast<std::size_t>(device)];
  if (auto it = waits.find(k); it != waits.end()) {
    for (int o : it->second) dep(id, o);
  }
  return id;
}

int ProgramBuilder::next_step(int device) const {
  return static_cast<int>(steps_[static_cast<std::size_t>(device)].size());
}

void ProgramBuilder::dep(int op, int on) {
  auto& deps = prog_.ops[static_cast<std::size_t>(op)].deps;
  if (on != op && std::find(deps.begin(), deps.end(), on) == deps.end()) deps.push_back(on);
}

void ProgramBuilder::alloc_saved(int op, int l, int mb, int u) {
  prog_.ops[static_cast<std::size_t>(op)].allocs.push_back(
      TensorRef{TensorKind::Saved, LayerRange{l, l}, mb, sbytes(u, l)});
}

void ProgramBuilder::free_saved(int op, int l, int mb, int u) {
  prog_.ops[static_cast<std::size_t>(op)].frees.push_back(
      TensorRef{TensorKind::Saved, LayerRange{l, l}, mb, sbytes(u, l)});
}

int ProgramBuilder::swap_out_saved(int device, int l, int i, int u, int fwd, int k_fwd) {
  const int O = op(device, Stream::SwapOut, OpKind::sX, fwd_task(device, l), i, LayerRange{l, l}, u, sbytes(u, l));
  dep(O, fwd);
  free_saved(O, l, i, u);
  output_of(O, device, k_fwd);
  saved_[slot(device, l, i)] = O;
  return O;
}

int ProgramBuilder::swap_in_saved(int device, int l, int i, int u, int k_bwd) {
  const int S = op(device, Stream::SwapIn, OpKind::sX, bwd_task(device, l), i, LayerRange{l, l}, u, sbytes(u, l));
  alloc_saved(S, l, i, u);
  dep(S, saved_of(device, l, i));
  window(S, device, k_bwd);
  return S;
}

int ProgramBuilder::recompute(int device, int l, int i, int u, const std::vector<int>& ins) {
  if (keep()) return -1;
  // Not a step of its own: REC and BWD of a layer share the step's inputs and outputs.
  const int Rc = op(device, Stream::Compute, OpKind::REC, bwd_task(device, l), i, LayerRange{l, l}, u, 0);
  for (int in : ins) {
    if (at(in).kind != OpKind::dY) dep(Rc, in);  // what it reads: weights, input, not the output gradient
  }
  const auto& waits = waiters_[static_cast<std::size_t>(device)];
  if (auto it = waits.find(next_step(device)); it != waits.end()) {
    for (int o : it->second) dep(Rc, o);
  }
  alloc_saved(Rc, l, i, u);
  return Rc;
}

int ProgramBuilder::backward_layer(int device, int l, int i, int u, int k, bool stash_activations,
                                   std::vector<int> ins) {
  const int R = num_layers();
  const LayerRange L{l, l};
  bool stashed = false;
  if (stash_activations && l == 0) {
    const int X = input_in(device, Stream::SwapIn, OpKind::X, bwd_task(device, 0), 0, i, u, k, TensorKind::Stash);
    ins.push_back(X);
    stashed = true;
  } else if (stash_activations && l < R - 1) {
    const int S = input_in(device, Stream::SwapIn, OpKind::sX, bwd_task(device, l), l, i, u, k, TensorKind::Stash,
                           stash_of(device, l, i));
    ins.push_back(S);
    stashed = true;
  }
  if (keep() && saved_of(device, l, i) >= 0) ins.push_back(swap_in_saved(device, l, i, u, k));
  const int Rc = recompute(device, l, i, u, ins);
  if (Rc >= 0) ins.push_back(Rc);
  const int Bw = compute(device, OpKind::BWD, bwd_task(device, l), i, L, u);
  for (int in : ins) dep(Bw, in);
  if (l > 0) alloc(Bw, TensorKind::ActGrad, L, i, xbytes(u, l));
  if (l < R - 1) free(Bw, TensorKind::ActGrad, LayerRange{l + 1, l + 1}, i, xbytes(u, l + 1));
  free(Bw, stashed ? TensorKind::Stash : TensorKind::Activation, L, i, xbytes(u, l));
  free_saved(Bw, l, i, u);
  return Bw;
}

int ProgramBuilder::forward_layer(int device, int l, int i, int u, int k, bool stash_activations,
                                  const std::vector<int>& ins, bool free_weights) {
  const int R = num_layers();
  const LayerRange L{l, l};
  const int F = compute(device, OpKind::FWD, fwd_task(device, l), i, L, u);
  for (int in : ins) dep(F, in);
  alloc(F, TensorKind::Activation, LayerRange{l + 1, l + 1}, i, xbytes(u, l + 1));
  if (keep()) alloc_saved(F, l, i, u);
  if (free_weights) free(F, TensorKind::Weights, L, -1, wbytes(l) + bbytes(l));
  if (stash_activations && l == 0) {
    free(F, TensorKind::Activation, L, i, xbytes(u, 0));  // the data stays on the host
  } else if (stash_activations && l < R - 1) {
    const int O = op(device, Stream::SwapOut, OpKind::sX, fwd_task(device, l), i, L, u, xbytes(u, l));
    dep(O, F);
    free(O, TensorKind::Activation, L, i, xbytes(u, l));
    output_of(O, device, k);
    record_stash(device, l, i, O);
  }
  if (keep() && stash_activations && l < R - 1) swap_out_saved(device, l, i, u, F, k);
  return F;
}

int ProgramBuilder::input_in(int device, Stream stream, OpKind kind, int task, int l, int i, int u, int k,
                             TensorKind as, int after) {
  const LayerRange L{l, l};
  const int in = op(device, stream, kind, task, i, L, u, xbytes(u, l));
  alloc(in, as, L, i, xbytes(u, l));
  if (after >= 0) dep(in, after);
  window(in, device, k);
  return in;
}

int ProgramBuilder::lead_steps(int op) const {
  const Stream s = at(op).stream;
  return on_demand_ && (s == Stream::SwapIn || s == Stream::SwapOut) ? 1 : 2;
}

void ProgramBuilder::window(int op, int device, int consumer_step) {
  const int before = consumer_step - lead_steps(op);
  if (before < 0) return;
  const auto& steps = steps_[static_cast<std::size_t>(device)];
  if (before >= static_cast<int>(steps.size()))
    throw InternalError("a baseline input is windowed to a step not yet created");
  dep(op, steps[static_cast<std::size_t>(before)]);
}

void ProgramBuilder::output_of(int op, int device, int producer_step) {
  const int consumer_step = producer_step + lead_steps(op);
  waiters_[static_cast<std::size_t>(device)][consumer_step].push_back(op);
  const auto& steps = steps_[static_cast<std::size_t>(device)];
  if (consumer_step < static_cast<int>(steps.size())) dep(steps[static_cast<std::size_t>(consumer_step)], op);
}

void ProgramBuilder::peer(int a, int b) { peers_.emplace_back(a, b); }

void ProgramBuilder::collective(std::uint64_t key, int op, int ready) { collectives_[key].emplace_back(op, ready); }

void ProgramBuilder::set_io(int op, int io_count, Bytes nvme_read, Bytes nvme_write) {
  NativeOpCosts& o = prog_.cost.edit(op);
  o.io_count = io_count;
  o.nvme_read_bytes = nvme_read;
  o.nvme_write_bytes = nvme_write;
}

int ProgramBuilder::forward_resident(int device, int l, int i, int u) {
  const int k = next_step(device);
  std::vector<int> ins;
  if (l == 0)
    ins.push_back(input_in(device, Stream::SwapIn, OpKind::X, fwd_task(device, 0), 0, i, u, k, TensorKind::Activation));
  return forward_layer(device, l, i, u, k, /*stash_activations=*/false, ins, /*free_weights=*/false);
}

int ProgramBuilder::gather_resident(int device, int l, int task, int ui, int k, std::uint64_t key) {
  const LayerRange L{l, l};
  const int A = weight_op(device, Stream::P2PIn, OpKind::AG, task, ui, L, wbytes(l), bbytes(l));
  window(A, device, k);
  if (const int ready = k - 2; ready >= 0) collective(key, A, step_op(device, ready));
  alloc(A, TensorKind::Weights, L, -1, wbytes(l) + bbytes(l));
  return A;
}

void ProgramBuilder::set_io_overlap(int op, Bytes read, Bytes write) {
  NativeOpCosts& o = prog_.cost.edit(op);
  if (read < 0 || write < 0 || read > o.nvme_read_bytes || write > o.nvme_write_bytes)
    throw InternalError(fmt::format("op {}: overlapped NVMe bytes {} / {} beyond its own {} / {}", op, read, write,
                                    o.nvme_read_bytes, o.nvme_write_bytes));
  o.nvme_read_overlap_bytes = read;
  o.nvme_write_overlap_bytes = write;
}

void ProgramBuilder::alloc(int op, TensorKind kind, LayerRange layers, int mb, Bytes bytes) {
  if (bytes > 0) prog_.ops[static_cast<std::size_t>(op)].allocs.push_back(TensorRef{kind, layers, mb, bytes});
}

void ProgramBuilder::free(int op, TensorKind kind, LayerRange layers, int mb, Bytes bytes) {
  if (bytes > 0) prog_.ops[static_cast<std::size_t>(op)].frees.push_back(TensorRef{kind, layers, mb, bytes});
}

Program ProgramBuilder::finish() {
  auto& ops = prog_.ops;
  // queues: devices ascending, then streams in order of first use on that device
  int max_dev = -1;
  for (const Op& o : ops) max_dev = std::max(max_dev, o.device);
  for (int d = 0; d <= max_dev; ++d) {
    std::array<int, kNumStreams> q{};
    q.fill(-1);
    bool any = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      Op& o = ops[i];
      if (o.device != d) continue;
      any = true;
      int& qi = q[static_cast<std::size_t>(o.stream)];
      if (qi < 0) {
        qi = static_cast<int>(prog_.queues.size());
        prog_.queues.push_back(OpQueue{d, o.stream, {}});
      }
      auto& qops = prog_.queues[static_cast<std::size_t>(qi)].ops;
      o.queue = qi;
      o.queue_pos = static_cast<int>(qops.size());
      qops.push_back(static_cast<int>(i));
    }
    if (any) prog_.devices.push_back(d);
  }
  for (const auto& group : collectives_) {
    for (const auto& member : group.second) {
      for (const auto& other : group.second) dep(member.first, other.second);
    }
  }
  // rendezvous: both sides get both sides' deps and the op before the other side in its queue
  // (the deps of the paired ops as they were before any pair was merged)
  std::unordered_map<int, OpDeps> snapshot;
  snapshot.reserve(2 * peers_.size());
  for (const auto& [a, b] : peers_) {
    snapshot.emplace(a, ops[static_cast<std::size_t>(a)].deps);
    snapshot.emplace(b, ops[static_cast<std::size_t>(b)].deps);
  }
  for (const auto& [a, b] : peers_) {
    ops[static_cast<std::size_t>(a)].peer = b;
    ops[static_cast<std::size_t>(b)].peer = a;
    for (int d : snapshot.at(b)) dep(a, d);
    for (int d : snapshot.at(a)) dep(b, d);
    if (const int pb = queue_predecessor(prog_, b); pb >= 0) dep(a, pb);
    if (const int pa = queue_predecessor(prog_, a); pa >= 0) dep(b, pa);
  }
  for (Op& o : ops) std::sort(o.deps.begin(), o.deps.end());
  return std::move(prog_);
}

}  // namespace detail

}  // namespace harmony::core
