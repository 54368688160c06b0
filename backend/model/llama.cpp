// The Llama family's layers in Gpt2 (gpt2.hpp): HF parameter tables (model.embed_tokens, model.layers.N.self_attn.
// q_proj/k_proj/v_proj/o_proj, mlp.gate_proj/up_proj/down_proj, the RMSNorms, model.norm, lm_head), activation and
// scratch layouts, and the forward/backward of the embedding, block and head written once against the Ops interface.
// The block: RMSNorm, one GEMM over q|k|v (adjacent nn.Linear weights, Qwen2's adjacent biases), rotary q/k with the
// key/value heads repeated (grouped-query attention), causal attention, o_proj, RMSNorm, one GEMM over gate|up, SwiGLU,
// down_proj.
#include <algorithm>
#include <type_traits>

#include <fmt/format.h>

#include "backend/model/gpt2.hpp"

namespace harmony::backend {

namespace {

// Offsets of one block's tensors (elements) in HF order; qkv_b = -1 without the q/k/v biases (Qwen2's).
struct LlamaLayout {
  std::int64_t ln1, qkv, qkv_b, o, ln2, gate_up, down, total;
  LlamaLayout(std::int64_t C, std::int64_t KV, std::int64_t I, bool bias) {
    ln1 = 0;
    qkv = ln1 + C;  // q_proj [C, C], k_proj [KV, C], v_proj [KV, C]: one [C + 2 KV, C] OutIn matrix
    qkv_b = bias ? qkv + (C + 2 * KV) * C : -1;  // q_proj.bias [C], k_proj.bias [KV], v_proj.bias [KV]: one vector
    o = qkv + (C + 2 * KV) * C + (bias ? C + 2 * KV : 0);
    ln2 = o + C * C;
    gate_up = ln2 + C;           // gate_proj [I, C], up_proj [I, C]: one [2I, C] OutIn matrix
    down = gate_up + 2 * I * C;  // [C, I]
    total = down + C * I;
  }
};

// Saved activations of a block (elements of S), N = B*T rows; the rstd (Stat) take K = stat_elems elements each,
// aligned to K (gpt2.hpp).
struct LlamaActs {
  std::int64_t ln1, ln1_rstd, packed, qkv, att, atty, res1, ln2, ln2_rstd, gu, h, total;
  LlamaActs(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H, std::int64_t KV, std::int64_t I,
            std::int64_t K) {
    const std::int64_t N = B * T;
    std::int64_t o = 0;
    auto take = [&o](std::int64_t n) {
      const std::int64_t at = o;
      o += n;
      return at;
    };
    auto take_stats = [&o, &take, K](std::int64_t n) {
      o = (o + K - 1) / K * K;
      return take(n * K);
    };
    ln1 = take(N * C);                // (B, T, C) input_layernorm(x)
    ln1_rstd = take_stats(N);         // (B, T) Stat
    packed = take(N * (C + 2 * KV));  // (B, T, C + 2KV) [q | k | v] as projected
    qkv = take(N * 3 * C);            // (B, T, 3C) rotated q, k and the repeated k, v: attention's input
    att = take(B * H * T * T);        // (B, H, T, T) attention probabilities
    atty = take(N * C);               // (B, T, C) attention output before o_proj
    res1 = take(N * C);               // (B, T, C) x + attn
    ln2 = take(N * C);                // (B, T, C) post_attention_layernorm(res1)
    ln2_rstd = take_stats(N);         // (B, T) Stat
    gu = take(N * 2 * I);             // (B, T, 2I) [gate | up]
    h = take(N * I);                  // (B, T, I) silu(gate) * up
    total = o;
  }
};

// The head's saved activations: norm(x) (N, C), its rstd (N, Stat: K elements each, aligned to K), softmax(logits)
// (N, V).
struct LlamaHeadActs {
  std::int64_t norm, rstd, probs, total;
  LlamaHeadActs(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t K)
      : norm(0), rstd((N * C + K - 1) / K * K), probs(rstd + N * K), total(probs + N * V) {}
};

}  // namespace

void Gpt2::add_llama_params() {
  const Gpt2Config& c = config_;
  const std::int64_t V = c.vocab_size, C = c.n_embd, I = c.intermediate_size;
  const std::int64_t KV = std::int64_t(c.kv_heads()) * (C / c.n_head);
  auto add = [](std::vector<ParamSpec>& list, std::string name, std::vector<std::int64_t> shape,
                std::string tied = {}) {
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const std::int64_t offset = list.empty() ? 0 : list.back().offset + list.back().numel;
    list.push_back({std::move(name), std::move(shape), offset, numel, std::move(tied)});
  };
  add(params_[0], "model.embed_tokens.weight", {V, C});
  for (int i = 0; i < c.n_layer; ++i) {
    auto& l = params_[static_cast<std::size_t>(i) + 1];
    const std::string h = fmt::format("model.layers.{}.", i);
    add(l, h + "input_layernorm.weight", {C});
    add(l, h + "self_attn.q_proj.weight", {C, C});
    add(l, h + "self_attn.k_proj.weight", {KV, C});
    add(l, h + "self_attn.v_proj.weight", {KV, C});
    if (c.qkv_bias) {
      add(l, h + "self_attn.q_proj.bias", {C});
      add(l, h + "self_attn.k_proj.bias", {KV});
      add(l, h + "self_attn.v_proj.bias", {KV});
    }
    add(l, h + "self_attn.o_proj.weight", {C, C});
    add(l, h + "post_attention_layernorm.weight", {C});
    add(l, h + "mlp.gate_proj.weight", {I, C});
    add(l, h + "mlp.up_proj.weight", {I, C});
    add(l, h + "mlp.down_proj.weight", {C, I});
    if (LlamaLayout(C, KV, I, c.qkv_bias).total != l.back().offset + l.back().numel)
      throw core::InternalError("llama block parameter layout mismatch");
  }
  auto& head = params_.back();
  add(head, "model.norm.weight", {C});
  add(head, "lm_head.weight", {V, C}, c.tie_embeddings ? "model.embed_tokens.weight" : "");
}

std::int64_t Gpt2::llama_act_floats(int layer, int B, int T, std::int64_t stat_elems) const {
  const Gpt2Config& c = config_;
  const std::int64_t C = c.n_embd, KV = std::int64_t(c.kv_heads()) * (C / c.n_head);
  switch (kind(layer)) {
    case LayerKind::Embedding:
      return 0;
    case LayerKind::Block:
      return LlamaActs(B, T, C, c.n_head, KV, c.intermediate_size, stat_elems).total;
    case LayerKind::Head:
      return LlamaHeadActs(std::int64_t(B) * T, C, c.vocab_size, stat_elems).total;
  }
  return 0;
}

std::int64_t Gpt2::llama_scratch_floats(int layer, int B, int T) const {
  const Gpt2Config& c = config_;
  const std::int64_t N = std::int64_t(B) * T, C = c.n_embd, I = c.intermediate_size;
  const std::int64_t KV = std::int64_t(c.kv_heads()) * (C / c.n_head);
  switch (kind(layer)) {
    case LayerKind::Embedding:
      return 0;
    case LayerKind::Block:  // dres1 (N,C) | dtmp (N,C) | dbig: dh (N,I) + dgu (N,2I), then dqkv (N,3C) + dpacked
      return 2 * N * C + N * std::max(3 * I, 3 * C + C + 2 * KV);
    case LayerKind::Head:
      return N * C;  // dnorm (N,C)
  }
  return 0;
}

template <class Ops>
void Gpt2::llama_forward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const {
  using S = typename Ops::Scalar;
  using R = typename Ops::Real;
  using Stat = typename Ops::Stat;
  constexpr std::int64_t K = stat_elems<Ops>();
  const Gpt2Config& c = config_;
  const int B = a.B, T = a.T, C = c.n_embd, H = c.n_head, Hkv = c.kv_heads(), V = c.vocab_size;
  const int I = c.intermediate_size, D = C / H, KV = Hkv * D, N = B * T;
  const R eps = R(c.ln_eps), theta = R(c.rope_theta);
  const S* w = a.w;
  switch (kind(layer)) {
    case LayerKind::Embedding:
      ops.embedding_fwd(a.y, a.tokens, w, static_cast<const S*>(nullptr), B, T, C, V);
      return;
    case LayerKind::Block: {
      const LlamaLayout p(C, KV, I, c.qkv_bias);
      const LlamaActs s(B, T, C, H, KV, I, K);
      S* act = a.act;
      const std::int64_t NC = std::int64_t(N) * C;
      const S* none = nullptr;
      ops.rmsnorm_fwd(act + s.ln1, stats_at<Stat>(act, s.ln1_rstd), a.x, w + p.ln1, N, C, eps);
      const S* qkv_b = c.qkv_bias ? w + p.qkv_b : none;
      ops.matmul_fwd(act + s.packed, act + s.ln1, w + p.qkv, qkv_b, N, C, C + 2 * KV, WeightLayout::OutIn);
      ops.rope_qkv_fwd(act + s.qkv, act + s.packed, B, T, H, Hkv, D, theta);
      ops.attention_fwd(act + s.atty, act + s.att, act + s.qkv, B, T, C, H);
      ops.matmul_fwd(a.y, act + s.atty, w + p.o, none, N, C, C, WeightLayout::OutIn);
      ops.add(act + s.res1, a.x, a.y, NC);
      ops.rmsnorm_fwd(act + s.ln2, stats_at<Stat>(act, s.ln2_rstd), act + s.res1, w + p.ln2, N, C, eps);
      ops.matmul_fwd(act + s.gu, act + s.ln2, w + p.gate_up, none, N, C, 2 * I, WeightLayout::OutIn);
      ops.swiglu_fwd(act + s.h, act + s.gu, N, I);
      ops.matmul_fwd(a.y, act + s.h, w + p.down, none, N, I, C, WeightLayout::OutIn);
      ops.add(a.y, act + s.res1, a.y, NC);
      return;
    }
    case LayerKind::Head: {
      const LlamaHeadActs s(N, C, V, K);
      const auto& ps = params_.back();
      S* act = a.act;
      ops.rmsnorm_fwd(act + s.norm, stats_at<Stat>(act, s.rstd), a.x, w + ps[0].offset, N, C, eps);
      ops.matmul_fwd(act + s.probs, act + s.norm, w + ps[1].offset, static_cast<const S*>(nullptr), N, C, V,
                     WeightLayout::OutIn);
      R* losses = nullptr;  // the head's y holds real_t<S> losses whatever S (fp32 in bf16 storage)
      if constexpr (std::is_same_v<S, R>) {
        losses = a.y;
      } else {
        losses = reinterpret_cast<R*>(a.y);
      }
      ops.crossentropy_fwd(losses, act + s.probs, act + s.probs, a.targets, N, V);
      return;
    }
  }
}

template <class Ops>
void Gpt2::llama_backward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const {
  using S = typename Ops::Scalar;
  using R = typename Ops::Real;
  using Stat = typename Ops::Stat;
  constexpr std::int64_t K = stat_elems<Ops>();
  const Gpt2Config& c = config_;
  const int B = a.B, T = a.T, C = c.n_embd, H = c.n_head, Hkv = c.kv_heads(), V = c.vocab_size;
  const int I = c.intermediate_size, D = C / H, KV = Hkv * D, N = B * T;
  const R theta = R(c.rope_theta);
  const S* w = a.w;
  S* dw = a.dw;
  switch (kind(layer)) {
    case LayerKind::Embedding:
      ops.embedding_bwd(dw, static_cast<S*>(nullptr), a.dy, a.tokens, B, T, C, V);
      return;
    case LayerKind::Block: {
      const LlamaLayout p(C, KV, I, c.qkv_bias);
      const LlamaActs s(B, T, C, H, KV, I, K);
      const S* act = a.act;
      const std::int64_t NC = std::int64_t(N) * C;
      S* none = nullptr;
      S* dres1 = a.scratch;      // (B, T, C) gradient of res1
      S* dtmp = a.scratch + NC;  // (B, T, C): dln2, then datty, then dln1
      S* dbig = dtmp + NC;       // dh (N,I) | dgu (N,2I); then dqkv (N,3C) | dpacked (N,C+2KV)
      S* dh = dbig;
      S* dgu = dbig + std::int64_t(N) * I;
      S* dqkv = dbig;
      S* dpacked = dbig + 3 * NC;
      // y = res1 + down(swiglu(gate_up(norm2(res1))))
      ops.copy(dres1, a.dy, NC);
      ops.matmul_bwd(dh, dw + p.down, none, a.dy, act + s.h, w + p.down, N, I, C, WeightLayout::OutIn);
      ops.swiglu_bwd(dgu, act + s.gu, dh, N, I);
      ops.matmul_bwd(dtmp, dw + p.gate_up, none, dgu, act + s.ln2, w + p.gate_up, N, C, 2 * I, WeightLayout::OutIn);
      ops.rmsnorm_bwd(dres1, dw + p.ln2, dtmp, act + s.res1, w + p.ln2, stats_at<Stat>(act, s.ln2_rstd), N, C);
      // res1 = x + o_proj(attention(rope(qkv_proj(norm1(x)))))
      ops.matmul_bwd(dtmp, dw + p.o, none, dres1, act + s.atty, w + p.o, N, C, C, WeightLayout::OutIn);
      ops.attention_bwd(dqkv, dtmp, act + s.qkv, act + s.att, B, T, C, H);
      ops.rope_qkv_bwd(dpacked, dqkv, B, T, H, Hkv, D, theta);
      S* dqkv_b = c.qkv_bias ? dw + p.qkv_b : none;
      ops.matmul_bwd(dtmp, dw + p.qkv, dqkv_b, dpacked, act + s.ln1, w + p.qkv, N, C, C + 2 * KV, WeightLayout::OutIn);
      ops.copy(a.dx, dres1, NC);
      ops.rmsnorm_bwd(a.dx, dw + p.ln1, dtmp, a.x, w + p.ln1, stats_at<Stat>(act, s.ln1_rstd), N, C);
      return;
    }
    case LayerKind::Head: {
      const LlamaHeadActs s(N, C, V, K);
      const auto& ps = params_.back();
      S* act = a.act;
      S* dnorm = a.scratch;  // (B, T, C)
      ops.crossentropy_bwd(act + s.probs, act + s.probs, a.targets, a.loss_scale, N, V);
      ops.matmul_bwd(dnorm, dw + ps[1].offset, static_cast<S*>(nullptr), act + s.probs, act + s.norm, w + ps[1].offset,
                     N, C, V, WeightLayout::OutIn);
      ops.zero(a.dx, std::int64_t(N) * C);
      ops.rmsnorm_bwd(a.dx, dw + ps[0].offset, dnorm, a.x, w + ps[0].offset, stats_at<Stat>(act, s.rstd), N, C);
      return;
    }
  }
}

template void Gpt2::llama_forward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
template void Gpt2::llama_backward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
template void Gpt2::llama_forward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
template void Gpt2::llama_backward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
template void Gpt2::llama_forward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
template void Gpt2::llama_backward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
template void Gpt2::llama_forward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;
template void Gpt2::llama_backward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;

}  // namespace harmony::backend
