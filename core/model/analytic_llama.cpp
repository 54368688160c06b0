// The analytic models of today's decoders: the Llama family (Llama 2 and 3, Mistral, Qwen2: RMSNorm, rotary
// positions, grouped-query attention, SwiGLU, optional biases and a sliding window) and GPT-NeoX (Pythia: LayerNorm,
// partial rotary positions, parallel attention and GELU MLP), each layer a graph on analytic_graph.hpp's Builder in
// the four kernel styles, and their named shapes. docs/validation.md ("The Llama family and GPT-NeoX") has the
// formulas.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/model/analytic_graph.hpp"

namespace harmony::core::analytic_detail {
namespace {

// ------------------------------------------------------------------------------------------------
// Ops the GPT and BERT graphs do not need. Sizes are explicit (elements per sample): several act on a view (the
// rotated part of a head, q inside a packed qkv) whose size is not its tensor's.

// An elementwise op on `elems` per sample of x writing a new tensor of `out_bpe` bytes per element: `save` 0
// nothing, 1 its input, 2 its output; one backward kernel per entry of `bwd_passes`, each moving that many times
// the output's bytes.
int elementwise(Builder& b, const char* name, int x, double elems, double out_bpe, int save,
                const std::vector<double>& bwd_passes) {
  Op op;
  op.name = name;
  op.inputs = {x};
  op.output = b.tensor(elems, out_bpe, b.t(x).needs_grad);
  if (save == 1) op.saved = {x};
  if (save == 2) op.saved = {op.output};
  const double in = elems * b.t(x).bpe, out = elems * out_bpe;
  op.fwd.push_back(Builder::mem(in + out));
  for (double p : bwd_passes) op.bwd.push_back(Builder::mem(p * out));
  b.add_grad(op, x);
  return b.push(std::move(op));
}

// x.to(dtype): a copy into `bpe` bytes per element (none when x already has them); its backward casts dY back.
int cast(Builder& b, const char* name, int x, double bpe) {
  if (b.t(x).bpe == bpe) return x;
  const double elems = b.t(x).per_sample;
  Op op;
  op.name = name;
  op.inputs = {x};
  op.output = b.tensor(elems, bpe, b.t(x).needs_grad);
  const double bytes = elems * (b.t(x).bpe + bpe);
  op.fwd.push_back(Builder::mem(bytes));
  if (b.t(x).needs_grad) op.bwd.push_back(Builder::mem(bytes));
  b.add_grad(op, x);
  return b.push(std::move(op));
}

// y = x * c (or x + c with `add`) over `elems` per sample of x, c a constant broadcast tensor (cos, sin, the causal
// mask: fixed size, no gradient). A product saves only c (dX = dY c); a sum saves nothing and passes dY through.
int with_const(Builder& b, const char* name, int x, double elems, int c, bool add) {
  Op op;
  op.name = name;
  op.inputs = {x, c};
  op.output = b.tensor(elems, b.t(x).bpe, b.t(x).needs_grad);
  const double n = elems * b.t(x).bpe;
  op.fwd.push_back(Builder::mem(2 * n, b.fixed_bytes(c)));
  if (add) {
    b.add_grad(op, x, true);
  } else {
    op.saved = {c};
    if (b.t(x).needs_grad) op.bwd.push_back(Builder::mem(2 * n, b.fixed_bytes(c)));
    b.add_grad(op, x);
  }
  return b.push(std::move(op));
}

// A fixed-size tensor written by one kernel per call (rotary cos and sin, the causal mask): no input, no gradient.
int constant(Builder& b, const char* name, double elems) {
  Op op;
  op.name = name;
  op.output = b.tensor(0, b.bpe(), false, elems);
  op.fwd.push_back(Builder::mem(0, elems * b.bpe()));
  return b.push(std::move(op));
}

// weight * x over the last dimension h (RMSNorm's gain): saves x; backward dX = dY w and dw = sum(dY x).
int gain(Builder& b, const char* name, int x, double h) {
  Op op;
  op.name = name;
  op.inputs = {x};
  op.output = b.act(b.t(x).per_sample);
  op.saved = {x};
  b.params += static_cast<std::int64_t>(h);
  ++b.param_tensors;
  op.weight_grad_bytes = h * b.param_bpe();
  const double n = b.ps_bytes(x);
  op.fwd.push_back(Builder::mem(2 * n, h * b.param_bpe()));
  op.bwd.push_back(Builder::mem(2 * n, h * b.param_bpe()));  // dX
  op.bwd.push_back(Builder::mem(2 * n, h * b.param_bpe()));  // dw: reads dY and x
  b.add_grad(op, x);
  return b.push(std::move(op));
}

// RMSNorm over h with `rows` rows per sample. Eager is Hugging Face's LlamaRMSNorm op by op: x.to(fp32),
// pow(2), mean, + eps, rsqrt, x * rsqrt, .to(dtype), weight * x (8 kernels; the casts vanish in fp32), keeping
// the FP32 input copy, the row rsqrt and the normalised x for the backward (sdpa the same). Fused is one kernel that
// saves x and the row rsqrt (FP32); its backward two (dX, then dweight), as the fused LayerNorm.
int rmsnorm(Builder& b, const AnalyticSpec& s, const char* name, int x, double rows, double h) {
  if (!eager_ops(s)) {
    b.params += static_cast<std::int64_t>(h);
    ++b.param_tensors;
    Op op;
    op.name = name;
    op.inputs = {x};
    op.output = b.act(b.t(x).per_sample);
    const int rstd = b.tensor(rows, 4, false);
    op.extras = {rstd};
    op.saved = {x, rstd};
    op.weight_grad_bytes = h * b.param_bpe();
    const double n = b.ps_bytes(x);
    op.fwd = {Builder::mem(2 * n + b.ps_bytes(rstd))};
    op.bwd = {Builder::mem(3 * n + b.ps_bytes(rstd)), Builder::mem(2 * n)};
    b.add_grad(op, x);
    return b.push(std::move(op));
  }
  const double n = rows * h;
  const int x32 = cast(b, "rms.to_fp32", x, 4);
  const int sq = elementwise(b, "rms.pow2", x32, n, 4, 1, {2, 2, 3});  // grad * 2 * x.pow(1): three kernels
  Op mean;
  mean.name = "rms.mean";
  mean.inputs = {sq};
  mean.output = b.tensor(rows, 4, true);
  mean.fwd.push_back(Builder::mem(4 * (n + rows)));
  mean.bwd.push_back(Builder::mem(4 * (n + rows)));  // dX = dY expanded / h
  b.add_grad(mean, sq);
  const int var = b.push(std::move(mean));
  const int eps = b.add_scalar("rms.+eps", var);
  const int rstd = elementwise(b, "rms.rsqrt", eps, rows, 4, 2, {3});
  const int y32 = b.mul("rms.x*rstd", x32, rstd);
  return gain(b, name, cast(b, "rms.to_dtype", y32, b.bpe()), h);
}

// Rotary position embeddings on `heads` heads of size d, `rd` of them rotated, of x (T x heads x d per sample,
// possibly a view into a packed qkv); `cs` holds cos and sin. Eager is Hugging Face's apply_rotary_pos_emb on the
// rotated part: rotate_half (the negated second half, then a cat), x * cos, rotate_half(x) * sin, their sum (5
// kernels; the backward's 4 are the two products', the negation's and the halves' scatter into dX), then (rd < d,
// GPT-NeoX) a cat with the part that passes (sdpa the same). Fused is one kernel that reads x, cos and sin and
// writes the result (apex / Megatron fused RoPE); its backward one. Neither saves more than cos and sin.
int rope(Builder& b, const AnalyticSpec& s, const char* name, int x, double T, double heads, double d, double rd,
         int cs) {
  const double full = T * heads * d, rot = T * heads * rd;
  if (!eager_ops(s)) {
    Op op;
    op.name = name;
    op.inputs = {x, cs};
    op.output = b.act(full);
    const double n = full * b.bpe();
    op.fwd.push_back(Builder::mem(2 * n, b.fixed_bytes(cs)));
    op.bwd.push_back(Builder::mem(2 * n, b.fixed_bytes(cs)));
    b.add_grad(op, x);
    return b.push(std::move(op));
  }
  const int neg = elementwise(b, "rope.neg", x, rot / 2, b.bpe(), 0, {2});
  Op cat;
  cat.name = "rope.cat";
  cat.inputs = {neg, x};
  cat.output = b.act(rot);
  cat.fwd.push_back(Builder::mem(2 * rot * b.bpe()));
  cat.bwd.push_back(Builder::mem(2 * rot * b.bpe()));  // the halves' gradients scattered into a full dX
  b.add_grad(cat, neg);
  b.add_grad(cat, x);
  const int rotated = b.push(std::move(cat));
  const int a = with_const(b, "rope.x*cos", x, rot, cs, false);
  const int c = with_const(b, "rope.rot*sin", rotated, rot, cs, false);
  const int y = b.add("rope.sum", a, c);
  if (rd >= d) return y;
  Op pass;  // torch.cat((x_rot, x_pass), -1)
  pass.name = "rope.cat_pass";
  pass.inputs = {y, x};
  pass.output = b.act(full);
  pass.fwd.push_back(Builder::mem(2 * full * b.bpe()));
  pass.bwd.push_back(Builder::mem(2 * full * b.bpe()));
  b.add_grad(pass, y);
  b.add_grad(pass, x);
  return b.push(std::move(pass));
}

// Grouped-query attention's repeat_kv: k or v (T x kv heads x d) expanded to all heads into a new tensor; the
// backward sums each group's gradients.
int repeat_kv(Builder& b, const char* name, int x, double T, double kvh, double nh, double d) {
  Op op;
  op.name = name;
  op.inputs = {x};
  op.output = b.act(T * nh * d);
  const double bytes = T * (nh + kvh) * d * b.bpe();
  op.fwd.push_back(Builder::mem(bytes));
  op.bwd.push_back(Builder::mem(bytes));
  b.add_grad(op, x);
  return b.push(std::move(op));
}

// FlashAttention-2 (Dao 2023) with grouped-query attention and an optional sliding window: softmax(q k^T / sqrt(d)
// + mask) v over nh query heads sharing kvh key/value heads, each query against Tk keys (T, or the window), in one
// kernel that never writes the scores. As analytic_graph's flash_attention (v1) otherwise: forward 2 GEMMs (2 nh T
// Tk d each), backward 5; reads q, k, v, writes o and the log-sum-exp; saves q, k, v, o and the log-sum-exp. The
// causal (or banded) tiles it skips are counted, as the fused style's bmms count them. `name`: flash_attention, or
// sdpa_attention (PyTorch's scaled_dot_product_attention on its flash or memory-efficient backend: the same costs).
int flash_attention(Builder& b, const char* name, const std::vector<int>& qkv, double nh, double kvh, double T,
                    double Tk, double d) {
  Op op;
  op.name = name;
  op.inputs = qkv;
  op.output = b.act(T * nh * d);
  const int lse = b.tensor(T * nh, 4, false);
  op.extras = {lse};
  op.saved = qkv;
  op.saved.push_back(op.output);
  op.saved.push_back(lse);
  const double q = T * nh * d * b.bpe(), kv = 2 * T * kvh * d * b.bpe();
  op.fwd.push_back(Builder::gemm({2 * nh, T, Tk, d}, 0, 2 * q + kv + b.ps_bytes(lse), 0));
  op.bwd.push_back(Builder::gemm({5 * nh, T, Tk, d}, 0, 5 * q + 2 * kv + b.ps_bytes(lse), 0));
  for (int in : qkv) b.add_grad(op, in);
  return b.push(std::move(op));
}

// Fused SwiGLU: silu(gate) * up in one kernel that saves its input — the packed [gate, up] projection (2 f per row),
// or the two projections' outputs (separate projections: Liger's silu-mul takes them apart); the backward one kernel
// reading them and dY, writing d gate and d up. The same bytes either way.
int swiglu_fused(Builder& b, const std::vector<int>& in, double T, double f) {
  Op op;
  op.name = "swiglu";
  op.inputs = in;
  op.output = b.act(T * f);
  op.saved = in;
  const double n = T * f * b.bpe();
  op.fwd.push_back(Builder::mem(3 * n));
  op.bwd.push_back(Builder::mem(5 * n));
  for (const int x : in) b.add_grad(op, x);
  return b.push(std::move(op));
}

// ------------------------------------------------------------------------------------------------
// The decoder block of both families

struct Shape {
  double T = 0, h = 0, nh = 0, kvh = 0, d = 0, f = 0, rd = 0, Tk = 0;
  bool llama = true;
};

Shape shape_of(const AnalyticSpec& s) {
  Shape x;
  x.llama = s.family == ModelFamily::Llama;
  x.T = s.seq_len;
  x.h = s.hidden;
  x.nh = s.heads;
  x.kvh = s.kv_heads > 0 ? s.kv_heads : s.heads;
  x.d = s.head_dim > 0 ? s.head_dim : x.h / x.nh;
  x.f = s.ffn > 0 ? s.ffn : 4.0 * x.h;
  x.rd = s.rope ? (s.rope_dims > 0 ? s.rope_dims : x.d) : 0;
  x.Tk = s.sliding_window > 0 ? std::min<double>(s.sliding_window, x.T) : x.T;
  return x;
}

int norm(Builder& b, const AnalyticSpec& s, const char* name, int x, const Shape& z) {
  return z.llama ? rmsnorm(b, s, name, x, z.T, z.h) : b.layernorm(name, x, z.h);
}

// Attention from the normalised input `a` to the output projection's result. Eager: q, k, v projections (GPT-NeoX:
// one packed query_key_value), RoPE, q made contiguous, k and v repeated to all heads (copied to contiguous without
// GQA), scores = q k^T (every key: a sliding window is only in the mask), * 1/sqrt(d), + the causal mask, softmax in
// FP32 (casts around it in fp16/bf16), p v, heads merged, o_proj. Fused: one packed qkv GEMM, fused RoPE, k and v
// repeated, scores, one scale-mask-softmax kernel, p v, heads merged, o_proj. Flash: packed qkv, fused RoPE, one
// FlashAttention-2 kernel over the kv heads (the window's keys only), o_proj on its [T, heads, d] output. Sdpa: eager
// up to the scores (q made contiguous; k and v repeated to all heads by repeat_kv, as transformers' SDPA path does
// whenever it passes a mask or runs on torch < 2.5, and up to 4.47 always; else copied contiguous), then one SDPA
// kernel over all heads and every key (a sliding window is a T x T mask the kernel reads), heads merged, o_proj.
int attention(Builder& b, const AnalyticSpec& s, int a, const Shape& z) {
  const bool eager = eager_ops(s);
  const bool flash = s.kernels == KernelStyle::Flash;
  const bool sdpa = s.kernels == KernelStyle::Sdpa;
  const bool qkv_bias = s.attn_bias != AttnBias::None, o_bias = s.attn_bias == AttnBias::All;
  const double q_n = z.nh * z.d, kv_n = z.kvh * z.d;
  int q = -1, k = -1, v = -1;
  if (z.llama && !packed_projections(s)) {
    q = b.linear("q_proj", a, z.T, z.h, q_n, qkv_bias);
    k = b.linear("k_proj", a, z.T, z.h, kv_n, qkv_bias);
    v = b.linear("v_proj", a, z.T, z.h, kv_n, qkv_bias);
  } else {
    q = k = v = b.linear(z.llama ? "qkv_proj" : "query_key_value", a, z.T, z.h, q_n + 2 * kv_n, qkv_bias);
  }
  if (s.qk_norm) {  // Qwen3: RMSNorm over each head's d values (one weight of d, shared by the heads), before RoPE
    q = rmsnorm(b, s, "q_norm", q, z.T * z.nh, z.d);
    k = rmsnorm(b, s, "k_norm", k, z.T * z.kvh, z.d);
  }
  if (z.rd > 0) {
    const int cs = constant(b, "rope.cos_sin", 2 * z.T * z.rd);
    q = rope(b, s, "rope.q", q, z.T, z.nh, z.d, z.rd, cs);
    k = rope(b, s, "rope.k", k, z.T, z.kvh, z.d, z.rd, cs);
  }
  int ctx = -1;
  if (flash) {
    std::vector<int> in = {q};
    for (int t : {k, v}) {
      if (std::find(in.begin(), in.end(), t) == in.end()) in.push_back(t);
    }
    ctx = flash_attention(b, "flash_attention", in, z.nh, z.kvh, z.T, z.Tk, z.d);
  } else {
    if (eager) q = b.copy("q.contiguous", q, z.T * q_n);
    const bool gqa = z.kvh < z.nh;
    if (gqa) {
      k = repeat_kv(b, "repeat_kv.k", k, z.T, z.kvh, z.nh, z.d);
      v = repeat_kv(b, "repeat_kv.v", v, z.T, z.kvh, z.nh, z.d);
    } else if (eager) {
      k = b.copy("k.contiguous", k, z.T * kv_n);
      v = b.copy("v.contiguous", v, z.T * kv_n);
    }
    if (sdpa) {
      // a sliding window is a T x T mask (the memory-efficient backend), read by the kernel and saved for its backward
      const int mask = s.sliding_window > 0 ? constant(b, "window_mask", z.T * z.T) : -1;
      ctx = flash_attention(b, "sdpa_attention", {q, k, v}, z.nh, z.nh, z.T, z.T, z.d);
      if (mask >= 0) {
        Op& core = b.graph.ops.back();
        core.inputs.push_back(mask);
        core.saved.push_back(mask);
        core.fwd[0].fixed_bytes += b.fixed_bytes(mask);
        core.bwd[0].fixed_bytes += b.fixed_bytes(mask);
      }
    } else {
      const int sc = b.bmm("q@k", q, k, z.nh, z.T, z.T, z.d);
      int p = -1;
      if (eager) {
        const int mask = constant(b, "causal_mask", z.T * z.T);
        const int w = with_const(b, "scores+mask", b.scale("scores*scaling", sc), z.nh * z.T * z.T, mask, true);
        const int w32 = cast(b, "scores.to_fp32", w, 4);
        p = cast(b, "probs.to_dtype", elementwise(b, "softmax", w32, z.nh * z.T * z.T, 4, 2, {3}), b.bpe());
      } else {
        p = b.softmax("scale_mask_softmax", sc);
      }
      ctx = b.bmm("p@v", p, v, z.nh, z.T, z.d, z.T);
    }
    ctx = b.copy("merge_heads", ctx, z.T * q_n);
  }
  return b.linear(z.llama ? "o_proj" : "dense", ctx, z.T, q_n, z.h, o_bias);
}

// The MLP from the normalised input `a`. Llama: down(silu(gate(a)) * up(a)); eager as Hugging Face's LlamaMLP (two
// GEMMs, SiLU, the product), fused and flash one packed [gate, up] GEMM and one SwiGLU kernel. GPT-NeoX:
// dense_4h_to_h(act(dense_h_to_4h(a))).
int mlp(Builder& b, const AnalyticSpec& s, int a, const Shape& z) {
  if (!z.llama) {
    const int up = b.linear("dense_h_to_4h", a, z.T, z.h, z.f, s.mlp_bias);
    const int g = s.act == MlpActivation::GeluNew ? gelu(b, s, up, true) : b.unary("gelu", up, 1, {3});
    return b.linear("dense_4h_to_h", g, z.T, z.f, z.h, s.mlp_bias);
  }
  int m = -1;
  if (!packed_projections(s)) {
    const int gate = b.linear("gate_proj", a, z.T, z.h, z.f, s.mlp_bias);
    const int up = b.linear("up_proj", a, z.T, z.h, z.f, s.mlp_bias);
    m = eager_ops(s) ? b.mul("act*up", b.unary("silu", gate, 1, {3}), up) : swiglu_fused(b, {gate, up}, z.T, z.f);
  } else {
    m = swiglu_fused(b, {b.linear("gate_up_proj", a, z.T, z.h, 2 * z.f, s.mlp_bias)}, z.T, z.f);
  }
  return b.linear("down_proj", m, z.T, z.f, z.h, s.mlp_bias);
}

// One block: x + attn(norm_1 x), then + mlp(norm_2 .); GPT-NeoX with parallel_residual: (mlp(norm_2 x) + attn(norm_1
// x)) + x. No dropout (their configs have none: attention_dropout and hidden_dropout 0).
LayerDef block(const AnalyticSpec& s, int index) {
  Builder b(s);
  const Shape z = shape_of(s);
  const int x = b.input(z.T * z.h, b.bpe(), true);
  const int o = attention(b, s, norm(b, s, "input_layernorm", x, z), z);
  int y = -1;
  if (!z.llama && s.parallel_residual) {
    const int m = mlp(b, s, norm(b, s, "post_attention_layernorm", x, z), z);
    y = b.add("residual", b.add("mlp+attn", m, o), x);
  } else {
    const int x1 = b.add("residual_1", x, o);
    y = b.add("residual_2", x1, mlp(b, s, norm(b, s, "post_attention_layernorm", x1, z), z));
  }
  return finish(b, fmt::format("block{}", index), "block", {y});
}

// The layers of a Llama-family or GPT-NeoX model: embedding (the token lookup: no position table), blocks, final
// norm, LM head (tied or its own), criterion. The eager criterion is Hugging Face's: the logits cast to FP32, the
// shifted copy, cross-entropy in FP32; fused and flash take the cross-entropy of the logits as they are, as GPT's.
std::vector<LayerDef> decoder_layers(const AnalyticSpec& s) {
  const Shape z = shape_of(s);
  const double V = s.vocab;
  std::vector<LayerDef> out;
  {
    Builder b(s);
    const int ids = b.input(z.T, kIdBytes, false);
    out.push_back(
        finish(b, "embedding", "embedding", {b.embedding(z.llama ? "embed_tokens" : "embed_in", ids, z.T, V, z.h)}));
  }
  out.push_back(block(s, 0));
  for (int i = 1; i < s.layers; ++i) out.push_back(copy_of(out, 1, fmt::format("block{}", i)));
  {
    Builder b(s);
    const int x = b.input(z.T * z.h, b.bpe(), true);
    out.push_back(finish(b, "final_norm", "final_norm", {norm(b, s, z.llama ? "norm" : "final_layer_norm", x, z)}));
  }
  {
    Builder b(s);
    const int x = b.input(z.T * z.h, b.bpe(), true);
    const char* name = z.llama ? "lm_head" : "embed_out";
    const int y = s.tied_head ? b.tied_linear(name, x, z.T, z.h, V) : b.linear(name, x, z.T, z.h, V, false);
    LayerDef d = finish(b, "lm_head", "lm_head", {y});
    if (s.tied_head) d.resident_params = static_cast<std::int64_t>(V * z.h);
    chunk_logits(d, (z.T - 1) * V, s.loss_chunks);
    out.push_back(std::move(d));
  }
  AnalyticSpec fp32 = s;  // the eager criterion computes in FP32
  fp32.dtype = DType::Fp32;
  const bool eager = eager_ops(s);
  Builder b(eager ? fp32 : s);
  const int logits = b.input(z.T * V, dtype_bytes(s.dtype), true);
  int x = logits;
  double rows = z.T;
  if (eager) {
    rows = z.T - 1;
    x = b.slice_copy("shift_logits", cast(b, "logits.float", logits, 4), rows * V);
  }
  LayerDef d = finish(b, "criterion", "criterion", {b.cross_entropy(x, rows, V)});
  d.is_criterion = true;
  chunk_logits(d, (z.T - 1) * V, s.loss_chunks);
  out.push_back(std::move(d));
  return out;
}

AnalyticSpec llama_shape(const char* name, int layers, int hidden, int heads, int kv_heads, int ffn, int seq,
                         int vocab) {
  AnalyticSpec s;
  s.family = ModelFamily::Llama;
  s.name = name;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.ffn = ffn;
  s.seq_len = seq;
  s.vocab = vocab;
  s.tied_head = false;
  return s;
}

}  // namespace

std::vector<LayerDef> llama_layers(const AnalyticSpec& s) { return decoder_layers(s); }
std::vector<LayerDef> neox_layers(const AnalyticSpec& s) { return decoder_layers(s); }

// The shapes of the models' Hugging Face config.json files (num_hidden_layers, hidden_size, num_attention_heads,
// num_key_value_heads, intermediate_size, vocab_size; untied heads, no biases but Qwen2's q, k, v):
//   llama2-7b   https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
//   llama2-13b  https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
//   llama2-70b  https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json
//   llama3-8b   https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
//   llama3-70b  https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
//   mistral-7b  https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (sliding_window 4096)
//   qwen2-7b    https://huggingface.co/Qwen/Qwen2-7B/blob/main/config.json
//   qwen3-8b    https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (head_dim 128, q_norm and k_norm)
// seq_len is the context each was trained at: Llama 2 and 3 their max_position_embeddings (4096, 8192); Mistral
// 7B 8192 ("trained with 8k context length", the transformers 4.34 Mistral page; its config's 32768 is the
// rotary range), Qwen2-7B 32768 (the context of its last pretraining stage; 131072 in its config with YaRN), Qwen3-8B
// 32768 (its model card's native context; 40960 in its config).
// tests/core/test_analytic_llama.cpp checks each parameter count against the checkpoint's published one.
std::vector<std::pair<std::string, AnalyticSpec>> llama_presets() {
  std::vector<std::pair<std::string, AnalyticSpec>> p = {
      {"llama2-7b", llama_shape("llama2-7b", 32, 4096, 32, 32, 11008, 4096, 32000)},
      {"llama2-13b", llama_shape("llama2-13b", 40, 5120, 40, 40, 13824, 4096, 32000)},
      {"llama2-70b", llama_shape("llama2-70b", 80, 8192, 64, 8, 28672, 4096, 32000)},
      {"llama3-8b", llama_shape("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256)},
      {"llama3-70b", llama_shape("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256)},
      {"mistral-7b", llama_shape("mistral-7b", 32, 4096, 32, 8, 14336, 8192, 32000)},
      {"qwen2-7b", llama_shape("qwen2-7b", 28, 3584, 28, 4, 18944, 32768, 152064)},
      {"qwen3-8b", llama_shape("qwen3-8b", 36, 4096, 32, 8, 12288, 32768, 151936)},
  };
  p[5].second.sliding_window = 4096;
  p[6].second.attn_bias = AttnBias::Qkv;
  p[7].second.head_dim = 128;  // its config states it (= 4096 / 32 here; Qwen3-0.6B's 128 is not 1024 / 16)
  p[7].second.qk_norm = true;
  return p;
}

std::string llama_spec_problem(const AnalyticSpec& s) {
  const bool llama = s.family == ModelFamily::Llama;
  const int d = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  if (llama && s.ffn < 1) return "ffn (the SwiGLU MLP's intermediate size) is required for family llama";
  if (s.kv_heads < 0 || s.kv_heads > s.heads)
    return fmt::format("kv_heads {} is outside 1..heads ({})", s.kv_heads, s.heads);
  if (s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    return fmt::format("kv_heads ({}) must divide heads ({})", s.kv_heads, s.heads);
  if (s.sliding_window < 0) return fmt::format("sliding_window {} is negative", s.sliding_window);
  if (s.rope_dims < 0 || s.rope_dims > d || s.rope_dims % 2 != 0)
    return fmt::format("rope_dims {} is not an even number in 0..the head size ({})", s.rope_dims, d);
  if (s.rope && s.rope_dims == 0 && d % 2 != 0)
    return fmt::format("rotary embeddings need an even head size, not {}", d);
  if (llama) {
    if (s.rope_dims != 0) return "rope_dims is for family neox (Llama rotates whole heads)";
    return {};
  }
  if (s.kv_heads != 0 && s.kv_heads != s.heads)
    return "kv_heads is for family llama (GPT-NeoX has one k and v per head)";
  if (s.attn_bias == AttnBias::Qkv) return "attn_bias qkv is for family llama (GPT-NeoX: all or none)";
  if (s.sliding_window != 0) return "sliding_window is for family llama";
  return {};
}

}  // namespace harmony::core::analytic_detail
