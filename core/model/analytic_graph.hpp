// The analytic models' internals, shared by the family files (analytic.cpp: GPT, BERT, ResNet, the costs and the
// presets; analytic_llama.cpp: the Llama family and GPT-NeoX): a layer as a graph of tensors and ops, the Builder
// that writes one, and the helpers the families share. Nothing outside core/model includes it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/model/analytic.hpp"

namespace harmony::core::analytic_detail {

// ------------------------------------------------------------------------------------------------
// A layer as a graph. Sizes are `fixed + per_sample * u` elements; everything below is per layer call.

struct Tensor {
  double fixed = 0;       // elements independent of the microbatch (position ids, the causal-mask temporaries)
  double per_sample = 0;  // elements per sample
  double bpe = 4;         // bytes per element
  bool needs_grad = false;
  double bytes(double u) const { return (fixed + per_sample * u) * bpe; }
};

// One kernel. A GEMM costs max(compute, memory) (roofline); anything else is memory-bound.
struct Kernel {
  bool gemm = false;
  std::array<double, 4> dims{};  // batch, m, n, k of a GEMM
  int scaled = 1;                // the GEMM dimension that grows with u (index into dims)
  double fixed_bytes = 0;        // bytes read + written, fixed part
  double per_sample_bytes = 0;   // bytes read + written per sample
  double flops(double u) const {
    std::array<double, 4> d = dims;
    d[static_cast<std::size_t>(scaled)] *= u;
    return 2.0 * d[0] * d[1] * d[2] * d[3];
  }
};

struct GradInput {
  int tensor = -1;
  bool passthrough = false;  // receives the output's gradient unchanged (add, a residual)
};

struct Op {
  const char* name = "";
  std::vector<int> inputs;
  int output = -1;  // == inputs[0] for an in-place op
  bool inplace = false;
  std::vector<int> extras;  // other tensors it allocates (dropout masks, pooling indices)
  std::vector<int> saved;   // tensors autograd keeps for its backward
  std::vector<GradInput> grads;
  double weight_grad_bytes = 0;  // parameter gradients its backward allocates
  std::vector<Kernel> fwd, bwd;
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<int> inputs;   // held by the caller for the whole call
  std::vector<int> outputs;  // returned (and their gradients given) by the caller
};

// What a layer is besides its graph.
struct LayerDef {
  std::string name;
  std::string kind;
  Graph graph;
  std::int64_t owned_params = 0;     // parameters it owns (its optimizer state, its update)
  int param_tensors = 0;             // the parameter tensors those are (Layer::param_tensors)
  int gathered_modules = 0;          // the modules ZeRO-3 gathers (Layer::gathered_modules)
  std::int64_t resident_params = 0;  // parameters on the GPU while it runs (a tied head's are the embedding's)
  double buffer_bytes = 0;
  bool is_criterion = false;
  int copy_of = -1;  // the index of an earlier layer with the same graph: its costs are reused, not recomputed
};

// Layer `name`, the same as layer `index` of the list.
inline LayerDef copy_of(const std::vector<LayerDef>& layers, std::size_t index, std::string name) {
  LayerDef d;
  d.name = std::move(name);
  d.kind = layers[index].kind;
  d.copy_of = static_cast<int>(index);
  return d;
}

constexpr double kIdBytes = 8;    // int64 token ids, labels, pooling indices
constexpr double kMaskBytes = 1;  // bool dropout masks

inline double dtype_bytes(DType d) { return d == DType::Fp32 ? 4.0 : 2.0; }
// Bytes per element of the parameters (and their gradients) on the GPU: dtype's, or FP32 under torch.autocast.
inline double param_bytes(const AnalyticSpec& s) { return s.autocast ? 4.0 : dtype_bytes(s.dtype); }

// Whether the ops outside the attention core run op by op as PyTorch eager runs the Hugging Face code: the eager
// style, and sdpa (which differs from it only in the attention core).
inline bool eager_ops(const AnalyticSpec& s) {
  return s.kernels == KernelStyle::Eager || s.kernels == KernelStyle::Sdpa;
}

// llama: q/k/v and gate/up as one packed GEMM each (AnalyticSpec::projections; Auto: the fused kernel styles').
inline bool packed_projections(const AnalyticSpec& s) {
  return s.projections == Projections::Auto ? !eager_ops(s) : s.projections == Projections::Packed;
}

// Builds one layer's graph; `bpe` is the activation and weight element size.
class Builder {
 public:
  explicit Builder(const AnalyticSpec& spec)
      : bpe_(dtype_bytes(spec.dtype)),
        pbpe_(param_bytes(spec)),
        autocast_(spec.autocast),
        op_casts_(spec.autocast && (spec.family == ModelFamily::Gpt || spec.family == ModelFamily::Bert ||
                                    spec.family == ModelFamily::Resnet)),
        spec_(spec) {}

  Graph graph;
  std::int64_t params = 0;   // parameters of the ops built (weights + biases + norms)
  int param_tensors = 0;     // the nn.Parameter tensors they are (a Linear's weight and bias are two)
  int gathered_modules = 0;  // the nn.Modules of those ZeRO-3 fetches and releases (Layer::gathered_modules)
  double buffer_bytes = 0;

  int input(double per_sample, double bpe, bool needs_grad) {
    const int t = tensor(per_sample, bpe, needs_grad);
    graph.inputs.push_back(t);
    return t;
  }
  int act(double per_sample) { return tensor(per_sample, bpe_, true); }
  int tensor(double per_sample, double bpe, bool needs_grad, double fixed = 0) {
    graph.tensors.push_back(Tensor{fixed, per_sample, bpe, needs_grad});
    return static_cast<int>(graph.tensors.size()) - 1;
  }
  const Tensor& t(int id) const { return graph.tensors[static_cast<std::size_t>(id)]; }
  double bpe() const { return bpe_; }
  double param_bpe() const { return pbpe_; }  // parameters and their gradients (FP32 under autocast)
  // The element size of the hidden state between transformer layers: dtype's, or FP32 where autocast's op rules apply
  // (gpt, bert: the FP32 embedding and LayerNorm outputs, and the residual adds that promote to them).
  double stream_bpe() const { return op_casts_ && spec_.family != ModelFamily::Resnet ? 4.0 : bpe_; }

  // x in `bpe` bytes an element: itself, or (autocast's op rules) a copy made by a cast kernel reading x and writing
  // the copy, whose backward casts the gradient back. autocast casts the inputs of its lower-precision ops (GEMMs)
  // to dtype and those of its FP32 ops (layer_norm, log_softmax in cross_entropy, pow, the losses; softmax: below) to
  // FP32; every other op
  // runs in its widest input's type (PyTorch's autocast op reference). Applies to gpt, bert and resnet; llama and
  // neox keep mixed precision's activations (their explicit casts are written per op).
  int autocast_to(int x, double bpe) {
    if (!op_casts_ || t(x).bpe == bpe) return x;
    Op op;
    op.name = "autocast.to";
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, bpe, t(x).needs_grad, t(x).fixed);
    const double ps = t(x).per_sample * (t(x).bpe + bpe), fx = t(x).fixed * (t(x).bpe + bpe);
    op.fwd.push_back(mem(ps, fx));
    if (t(x).needs_grad) op.bwd.push_back(mem(ps, fx));
    add_grad(op, x);
    return push(std::move(op));
  }
  int lower(int x) { return autocast_to(x, bpe_); }  // a GEMM's input
  int upper(int x) { return autocast_to(x, 4); }     // an input of an op on autocast's FP32 list

  // torch.autocast's cast of an FP32 weight (and bias) of `w_elems` elements to the compute dtype, before `op`'s
  // GEMM (nothing without autocast). Forward: one kernel reading the FP32 copy and writing the 2-byte one, which the
  // GEMM saves for its backward (autocast's cast cache lives only inside one forward region: every forward and every
  // recompute casts again). Backward: the GEMM's 2-byte weight gradient cast to FP32 (ToCopyBackward) before it
  // accumulates into the FP32 .grad. PyTorch: aten/src/ATen/autocast_mode.cpp, cached_cast.
  void weight_cast(Op& op, double w_elems) {
    if (!autocast_) return;
    const int copy = tensor(0, bpe_, false, w_elems);
    op.extras.push_back(copy);
    op.saved.push_back(copy);
    op.fwd.push_back(mem(0, w_elems * (pbpe_ + bpe_)));
    op.bwd.push_back(mem(0, w_elems * (bpe_ + pbpe_)));
  }

  // A memory-bound kernel reading and writing `per_sample_bytes` per sample, plus `fixed_bytes`.
  static Kernel mem(double per_sample_bytes, double fixed_bytes = 0) {
    Kernel k;
    k.per_sample_bytes = per_sample_bytes;
    k.fixed_bytes = fixed_bytes;
    return k;
  }
  // A GEMM of dims (batch, m, n, k), `scaled` the dimension that grows with u, reading and writing `bytes`.
  static Kernel gemm(std::array<double, 4> dims, int scaled, double per_sample_bytes, double fixed_bytes) {
    Kernel k;
    k.gemm = true;
    k.dims = dims;
    k.scaled = scaled;
    k.per_sample_bytes = per_sample_bytes;
    k.fixed_bytes = fixed_bytes;
    return k;
  }
  double ps_bytes(int id) const { return t(id).per_sample * t(id).bpe; }
  double fixed_bytes(int id) const { return t(id).fixed * t(id).bpe; }

  void add_grad(Op& op, int id, bool passthrough = false) const {
    if (t(id).needs_grad) op.grads.push_back(GradInput{id, passthrough});
  }
  // Python keeps `t` alive (a variable not yet reassigned) until the op that made `until` has run.
  void hold(int t, int until) {
    for (std::size_t i = graph.ops.size(); i-- > 0;) {
      if (graph.ops[i].output == until) {
        graph.ops[i].inputs.push_back(t);
        return;
      }
    }
  }
  int push(Op op) {
    const int out = op.output;
    graph.ops.push_back(std::move(op));
    return out;
  }

  // y = x W (+ b): x is rows x k per sample, W is k x n.
  int linear(const char* name, int x, double rows, double k, double n, bool bias) {
    x = lower(x);
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = act(rows * n);
    op.saved = {x};
    const double w_elems = k * n + (bias ? n : 0.0);
    params += static_cast<std::int64_t>(w_elems);
    param_tensors += bias ? 2 : 1;
    if (k * n > Layer::kZero3PersistenceElements) ++gathered_modules;
    op.weight_grad_bytes = w_elems * pbpe_;
    const double a = rows * k * bpe_, c = rows * n * bpe_, w = w_elems * bpe_;
    weight_cast(op, w_elems);
    op.fwd.push_back(gemm({1, rows, n, k}, 1, a + c, w));
    if (t(x).needs_grad) op.bwd.push_back(gemm({1, rows, k, n}, 1, a + c, w));  // dX = dY W^T
    op.bwd.push_back(gemm({1, k, n, rows}, 3, a + c, w));                       // dW = X^T dY
    if (bias) op.bwd.push_back(mem(c, n * bpe_));                               // db = sum dY
    add_grad(op, x);
    return push(std::move(op));
  }
  // A tied projection: like linear without a bias, its weight resident but owned by the embedding.
  int tied_linear(const char* name, int x, double rows, double k, double n) {
    const std::int64_t before = params;
    const int y = linear(name, x, rows, k, n, false);
    params = before;
    return y;
  }

  // C = A B per (batch) matrix: m x k times k x n; `batch` per sample.
  int bmm(const char* name, int a, int b, double batch, double m, double n, double k) {
    a = lower(a);
    b = lower(b);
    Op op;
    op.name = name;
    op.inputs = {a, b};
    op.output = act(batch * m * n);
    op.saved = {a, b};
    const double bytes = batch * (m * k + k * n + m * n) * bpe_;
    op.fwd.push_back(gemm({batch, m, n, k}, 0, bytes, 0));
    op.bwd.push_back(gemm({batch, m, k, n}, 0, bytes, 0));  // dA = dC B^T
    op.bwd.push_back(gemm({batch, k, n, m}, 0, bytes, 0));  // dB = A^T dC
    add_grad(op, a);
    add_grad(op, b);
    return push(std::move(op));
  }

  // FlashAttention (v1, Dao et al. 2022): softmax(q k^T / sqrt(d) + mask) v, with dropout on the
  // probabilities, over `heads` heads of T x d per sample, in one kernel that tiles over T and never writes
  // the T x T scores. `qkv` lists the distinct tensors holding q, k and v (GPT's packed c_attn output, or
  // BERT's three projections); h = heads x d.
  // Forward: the FLOPs of the two GEMMs it replaces, S = Q K^T and O = P V, each 2 heads T^2 d per sample
  // (one kernel of batch 2 x heads); traffic: reads q, k, v, writes o (4 T h elements) and the softmax's
  // log-sum-exp L (T x heads, FP32). Saved for the backward: q, k, v, o and L; no dropout mask (the
  // backward regenerates it from the RNG seed and offset) and no probabilities.
  // Backward: recomputes S = Q K^T (and P from S and L), then dV = P^T dO, dP = dO V^T, dQ = dS K and
  // dK = dS^T Q: 5 GEMMs of the same dims, 2.5 x the forward's FLOPs; traffic: reads q, k, v, o, dO and
  // L, writes dq, dk, dv (8 T h elements). The causal tiles FlashAttention skips are counted, as the fused
  // style's bmms count them: the FLOPs of causal attention are an upper bound.
  int flash_attention(const char* name, std::vector<int> qkv, double heads, double T, double d) {
    for (int& x : qkv) x = lower(x);
    Op op;
    op.name = name;
    op.inputs = qkv;
    op.output = act(T * heads * d);
    const int lse = tensor(T * heads, 4, false);
    op.extras = {lse};
    op.saved = qkv;
    op.saved.push_back(op.output);
    op.saved.push_back(lse);
    const double x = T * heads * d * bpe_;  // one of q, k, v, o per sample
    op.fwd.push_back(gemm({2 * heads, T, T, d}, 0, 4 * x + ps_bytes(lse), 0));
    op.bwd.push_back(gemm({5 * heads, T, T, d}, 0, 8 * x + ps_bytes(lse), 0));
    for (int in : qkv) add_grad(op, in);
    return push(std::move(op));
  }

  // A copy of `elems` per sample of x into a new contiguous tensor (permute + contiguous, matmul's reshape).
  int copy(const char* name, int x, double elems) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(elems, t(x).bpe, true);
    op.fwd.push_back(mem(2 * elems * t(x).bpe));
    op.bwd.push_back(mem(2 * elems * t(x).bpe));
    add_grad(op, x);
    return push(std::move(op));
  }

  // A contiguous copy of a slice of x: the backward zero-fills all of dX, then copies dY into the slice.
  int slice_copy(const char* name, int x, double elems) {
    const int y = copy(name, x, elems);
    Op& op = graph.ops.back();
    op.bwd = {mem(ps_bytes(x)), mem(2 * elems * t(x).bpe)};
    return y;
  }

  // y = c * x (or x / c): no saved tensor; backward scales dY.
  int scale(const char* name, int x) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, t(x).needs_grad, t(x).fixed);
    op.fwd.push_back(mem(2 * ps_bytes(x), 2 * fixed_bytes(x)));
    if (t(x).needs_grad) op.bwd.push_back(mem(2 * ps_bytes(x), 2 * fixed_bytes(x)));
    add_grad(op, x);
    return push(std::move(op));
  }

  // y = x + c: backward passes dY through.
  int add_scalar(const char* name, int x) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, t(x).needs_grad, t(x).fixed);
    op.fwd.push_back(mem(2 * ps_bytes(x), 2 * fixed_bytes(x)));
    add_grad(op, x, true);
    return push(std::move(op));
  }

  // y = a + b (or a - b), b possibly broadcast: backward passes dY through to both.
  int add(const char* name, int a, int b) {
    Op op;
    op.name = name;
    op.inputs = {a, b};
    const bool grad = t(a).needs_grad || t(b).needs_grad;
    op.output = tensor(std::max(t(a).per_sample, t(b).per_sample), std::max(t(a).bpe, t(b).bpe), grad,
                       std::max(t(a).fixed, t(b).fixed));
    op.fwd.push_back(
        mem(ps_bytes(a) + ps_bytes(b) + ps_bytes(op.output), fixed_bytes(a) + fixed_bytes(b) + fixed_bytes(op.output)));
    add_grad(op, a, true);
    add_grad(op, b, true);
    return push(std::move(op));
  }

  // y = a * b, b possibly broadcast: saves both; backward: one kernel per input that needs a gradient.
  int mul(const char* name, int a, int b) {
    Op op;
    op.name = name;
    op.inputs = {a, b};
    const bool grad = t(a).needs_grad || t(b).needs_grad;
    op.output = tensor(std::max(t(a).per_sample, t(b).per_sample), std::max(t(a).bpe, t(b).bpe), grad,
                       std::max(t(a).fixed, t(b).fixed));
    op.saved = {a, b};
    const double ps = ps_bytes(a) + ps_bytes(b) + ps_bytes(op.output);
    const double fx = fixed_bytes(a) + fixed_bytes(b) + fixed_bytes(op.output);
    op.fwd.push_back(mem(ps, fx));
    for (int in : {a, b}) {
      if (t(in).needs_grad) op.bwd.push_back(mem(ps, fx));
    }
    add_grad(op, a);
    add_grad(op, b);
    return push(std::move(op));
  }

  // A unary op: 1 forward kernel; `save` 0 nothing, 1 its input, 2 its output; backward kernels each moving
  // `bwd_passes` x n bytes (n = the tensor's bytes).
  int unary(const char* name, int x, int save, const std::vector<double>& bwd_passes) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, true);
    if (save == 1) op.saved = {x};
    if (save == 2) op.saved = {op.output};
    const double n = ps_bytes(x);
    op.fwd.push_back(mem(2 * n));
    for (double p : bwd_passes) op.bwd.push_back(mem(p * n));
    add_grad(op, x);
    return push(std::move(op));
  }

  // LayerNorm over the last dimension `h`: saves its input (and per-row statistics, ignored). Eager is
  // PyTorch 1.x's kernels: row moments, then normalise; backward: per-row sums, dX, then dgamma/dbeta.
  // Fused is one pass forward, two backward (Apex style). Sdpa runs eager's kernels.
  int layernorm(const char* name, int x, double h) {
    x = upper(x);
    params += static_cast<std::int64_t>(2 * h);
    param_tensors += 2;  // weight, bias
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, true);
    op.saved = {x};
    op.weight_grad_bytes = 2 * h * pbpe_;
    const double n = ps_bytes(x);
    if (eager_ops(spec_)) {
      op.fwd = {mem(n), mem(2 * n)};                  // moments (read X); normalise (read X, write Y)
      op.bwd = {mem(2 * n), mem(3 * n), mem(2 * n)};  // row sums of dY, dY*X; dX; dgamma, dbeta
    } else {
      op.fwd = {mem(2 * n)};
      op.bwd = {mem(3 * n), mem(2 * n)};
    }
    add_grad(op, x);
    return push(std::move(op));
  }

  // Softmax over the last dimension: saves its output; backward reads Y and dY, writes dX.
  // Under autocast's op rules softmax runs with dtype FP32 (autocast's fp32_set_opt_dtype: no separate cast): it reads
  // x in its own type and writes an FP32 output; the backward reads dY and Y in FP32 and writes dX in x's type.
  int softmax(const char* name, int x) {
    if (!op_casts_ || t(x).bpe == 4) return unary(name, x, 2, {3});
    const int y = unary(name, x, 2, {});
    Op& op = graph.ops.back();
    graph.tensors[static_cast<std::size_t>(y)].bpe = 4;
    op.fwd = {mem(ps_bytes(x) + ps_bytes(y))};
    op.bwd = {mem(2 * ps_bytes(y) + ps_bytes(x))};
    return y;
  }

  // Dropout (training mode): writes its output and a bool mask, which the backward reads.
  int dropout(const char* name, int x) {
    if (!spec_.dropout) return x;
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, true);
    const int mask = tensor(t(x).per_sample, kMaskBytes, false);
    op.extras = {mask};
    op.saved = {mask};
    const double n = ps_bytes(x) * 2 + ps_bytes(mask);
    op.fwd.push_back(mem(n));
    op.bwd.push_back(mem(n));
    add_grad(op, x);
    return push(std::move(op));
  }

  // Fused dropout(y) + residual: one kernel; the residual's gradient passes through.
  int dropout_add(const char* name, int y, int residual) {
    if (!spec_.dropout) return add(name, y, residual);
    Op op;
    op.name = name;
    op.inputs = {y, residual};
    op.output = tensor(t(y).per_sample, std::max(t(y).bpe, t(residual).bpe), true);  // the wider (autocast)
    const int mask = tensor(t(y).per_sample, kMaskBytes, false);
    op.extras = {mask};
    op.saved = {mask};
    const double out = ps_bytes(op.output);
    op.fwd.push_back(mem(ps_bytes(y) + ps_bytes(residual) + out + ps_bytes(mask)));
    op.bwd.push_back(mem(out + ps_bytes(y) + ps_bytes(mask)));
    add_grad(op, y);
    add_grad(op, residual, true);
    return push(std::move(op));
  }

  // Row lookup in a vocab x h table: saves the ids; the backward zero-fills the dense weight gradient,
  // sorts the ids and accumulates rows.
  int embedding(const char* name, int ids, double rows, double vocab, double h) {
    Op op;
    op.name = name;
    op.inputs = {ids};
    op.output = tensor(rows * h, stream_bpe(), true);  // autocast: a lookup in the FP32 table, not on its lists
    op.saved = {ids};
    params += static_cast<std::int64_t>(vocab * h);
    param_tensors += 1;
    if (vocab * h > Layer::kZero3PersistenceElements) ++gathered_modules;
    op.weight_grad_bytes = vocab * h * pbpe_;
    const double out = ps_bytes(op.output);
    op.fwd.push_back(mem(2 * out + ps_bytes(ids), fixed_bytes(ids)));
    op.bwd.push_back(mem(0, vocab * h * pbpe_));                     // zero the dense gradient
    op.bwd.push_back(mem(2 * ps_bytes(ids), 2 * fixed_bytes(ids)));  // sort the ids
    op.bwd.push_back(mem(3 * out));                                  // accumulate rows
    return push(std::move(op));
  }

  // Cross-entropy over `classes` for `rows` per sample: log-softmax (reads its input three times: max, sum
  // and output) and the NLL gather; the backward zero-fills and scatters dLogP, then log-softmax backward.
  int cross_entropy(int logits, double rows, double classes) {
    logits = upper(logits);
    const double n = rows * classes * t(logits).bpe;
    Op ls;
    ls.name = "log_softmax";
    ls.inputs = {logits};
    ls.output = tensor(rows * classes, t(logits).bpe, true);
    ls.saved = {ls.output};
    ls.fwd.push_back(mem(4 * n));  // max, sum of exp, then write: three reads and a write
    ls.bwd.push_back(mem(4 * n));  // dX = dY - exp(Y) sum(dY): reads dY twice and Y, writes dX
    add_grad(ls, logits);
    const int logp = push(std::move(ls));
    Op nll;
    nll.name = "nll_loss";
    nll.inputs = {logp};
    nll.output = tensor(0, 4, true, 1);
    const int labels = tensor(rows, kIdBytes, false);
    nll.extras = {labels};
    nll.saved = {labels};
    nll.fwd.push_back(mem(rows * (kIdBytes + t(logp).bpe)));
    nll.bwd.push_back(mem(n));                                // zero-fill dLogP
    nll.bwd.push_back(mem(rows * (kIdBytes + t(logp).bpe)));  // scatter -1/N
    add_grad(nll, logp);
    return push(std::move(nll));
  }

  // Mean squared error between x and `target`, a tensor of x's shape the caller gives (no gradient): the
  // forward reads both and writes a scalar; the backward reads both again and writes dX = 2 (x - target) / n.
  int mse_loss(int x, int target) {
    x = upper(x);
    target = upper(target);
    Op op;
    op.name = "mse_loss";
    op.inputs = {x, target};
    op.output = tensor(0, 4, true, 1);
    op.saved = {x, target};
    op.fwd.push_back(mem(ps_bytes(x) + ps_bytes(target), 4));
    op.bwd.push_back(mem(2 * ps_bytes(x) + ps_bytes(target), 4));
    add_grad(op, x);
    return push(std::move(op));
  }

  // Convolution as an implicit GEMM: M = output pixels, N = cout, K = cin x k x k; no bias.
  int conv(const char* name, int x, double cin, double cout, double k, double out_hw) {
    x = lower(x);
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = act(cout * out_hw);
    op.saved = {x};
    const double w_elems = cout * cin * k * k;
    params += static_cast<std::int64_t>(w_elems);
    param_tensors += 1;
    if (w_elems > Layer::kZero3PersistenceElements) ++gathered_modules;
    op.weight_grad_bytes = w_elems * pbpe_;
    const double io = ps_bytes(x) + cout * out_hw * bpe_, w = w_elems * bpe_;
    weight_cast(op, w_elems);
    op.fwd.push_back(gemm({1, out_hw, cout, cin * k * k}, 1, io, w));
    if (t(x).needs_grad) op.bwd.push_back(gemm({1, out_hw, cin * k * k, cout}, 1, io, w));  // dgrad
    op.bwd.push_back(gemm({1, cout, cin * k * k, out_hw}, 3, io, w));                       // wgrad
    add_grad(op, x);
    return push(std::move(op));
  }

  // BatchNorm (training): statistics, then normalise; running mean and variance are buffers.
  int batchnorm(const char* name, int x, double channels) {
    params += static_cast<std::int64_t>(2 * channels);
    param_tensors += 2;                    // weight, bias
    buffer_bytes += 2 * channels * 4 + 8;  // running_mean, running_var (FP32), num_batches_tracked
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(t(x).per_sample, t(x).bpe, true);
    op.saved = {x};
    op.weight_grad_bytes = 2 * channels * pbpe_;
    const double n = ps_bytes(x);
    op.fwd.push_back(mem(n));      // statistics
    op.fwd.push_back(mem(2 * n));  // normalise
    op.bwd.push_back(mem(2 * n));  // reduce dY, dY * x-hat
    op.bwd.push_back(mem(3 * n));  // dX
    add_grad(op, x);
    return push(std::move(op));
  }

  // In-place ReLU: no new tensor; saves its output; backward reads Y and dY into a new dX.
  int relu_(const char* name, int x) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = x;
    op.inplace = true;
    op.saved = {x};
    op.fwd.push_back(mem(2 * ps_bytes(x)));
    op.bwd.push_back(mem(3 * ps_bytes(x)));
    add_grad(op, x);
    return push(std::move(op));
  }

  // 3x3 stride-2 max pooling with int64 indices (saved with the input).
  int maxpool(const char* name, int x, double channels, double out_hw) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(channels * out_hw, t(x).bpe, true);
    const int idx = tensor(channels * out_hw, kIdBytes, false);
    op.extras = {idx};
    op.saved = {x, idx};
    op.fwd.push_back(mem(ps_bytes(x) + ps_bytes(op.output) + ps_bytes(idx)));
    op.bwd.push_back(mem(ps_bytes(x)));                              // zero dX
    op.bwd.push_back(mem(ps_bytes(op.output) * 2 + ps_bytes(idx)));  // scatter dY
    add_grad(op, x);
    return push(std::move(op));
  }

  // Global average pooling to `channels` per sample.
  int avgpool(const char* name, int x, double channels) {
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = tensor(channels, t(x).bpe, true);
    op.fwd.push_back(mem(ps_bytes(x)));
    op.bwd.push_back(mem(ps_bytes(x)));
    add_grad(op, x);
    return push(std::move(op));
  }

 private:
  double bpe_;
  double pbpe_;
  bool autocast_;
  bool op_casts_;  // autocast's op rules on the activations (gpt, bert, resnet)
  const AnalyticSpec& spec_;
};

// The layer `b` built: its graph with `outputs` (the backward of ops that feed no output dropped), parameters, buffers.
LayerDef finish(Builder& b, std::string name, std::string kind, std::vector<int> outputs);

// loss_chunks (AnalyticSpec): the LM head and its loss over `chunks` chunks of the tokens. Every tensor of layer `d`
// the size of the logits (at least `logit_elements` a sample: the logits, their shifted or FP32 copies, the
// log-probabilities) holds one chunk at a time: its memory (and, as the criterion's input, the bytes a plan keeps or
// moves for it) divided by `chunks`. The kernels keep their FLOPs and bytes: every chunk is computed.
void chunk_logits(LayerDef& d, double logit_elements, int chunks);

// GELU: eager and sdpa run the Python formula op by op (`tanh_form`: GPT-2's gelu_new; else BERT's erf form); fused
// and flash one kernel.
int gelu(Builder& b, const AnalyticSpec& s, int x, bool tanh_form);

// ---- analytic_llama.cpp: the Llama family (Llama, Mistral, Qwen2) and GPT-NeoX

std::vector<LayerDef> llama_layers(const AnalyticSpec& s);
std::vector<LayerDef> neox_layers(const AnalyticSpec& s);
// Their named shapes (llama2-7b, ...), appended to analytic_preset's list.
std::vector<std::pair<std::string, AnalyticSpec>> llama_presets();
// Why a llama or neox spec cannot be built, or "" (the checks beyond the transformer ones all families share).
std::string llama_spec_problem(const AnalyticSpec& s);

}  // namespace harmony::core::analytic_detail
