// GPT-2's layers: parameter tables (HF names, shapes, offsets in each layer's block), activation and
// scratch layouts, and the forward/backward of the embedding, block and head layers written once against
// the Ops interface, instantiated for the device (float) and the host (float, double).
#include "backend/model/gpt2.hpp"

#include <type_traits>

#include <fmt/format.h>

namespace harmony::backend {

std::string_view arch_name(Arch arch) { return arch == Arch::Llama ? "llama" : "gpt2"; }

void Gpt2Config::validate() const {
  const char* who = arch == Arch::Llama ? "Llama config" : "GPT-2 config";
  auto positive = [who](int v, const char* name) {
    if (v <= 0) throw BackendError(fmt::format("{}: {} must be positive, got {}", who, name, v));
  };
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_seq_len");
  if (n_layer < 0) throw BackendError(fmt::format("{}: n_layer must be >= 0, got {}", who, n_layer));
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  if (n_embd % n_head != 0)
    throw BackendError(fmt::format("{}: n_embd {} is not a multiple of n_head {}", who, n_embd, n_head));
  if (!(ln_eps > 0)) throw BackendError(fmt::format("{}: ln_eps must be positive", who));
  if (arch == Arch::Gpt2) {
    if (n_kv_head != 0 || intermediate_size != 0 || !tie_embeddings || qkv_bias || sliding_window != 0)
      throw BackendError(
          "GPT-2 config: n_kv_head, intermediate_size, untied embeddings, qkv_bias and sliding_window are Llama-only");
    return;
  }
  if (n_kv_head < 0 || n_head % kv_heads() != 0)
    throw BackendError(fmt::format("{}: n_kv_head {} does not divide n_head {}", who, n_kv_head, n_head));
  if ((n_embd / n_head) % 2 != 0)
    throw BackendError(
        fmt::format("{}: the head width n_embd / n_head = {} must be even (rotary embeddings)", who, n_embd / n_head));
  positive(intermediate_size, "intermediate_size");
  if (!(rope_theta > 0)) throw BackendError(fmt::format("{}: rope_theta must be positive", who));
  if (sliding_window < 0) throw BackendError(fmt::format("{}: sliding_window must be >= 0", who));
}

namespace {

// Offsets of one block's tensors (floats) in HF order.
struct BlockLayout {
  std::int64_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b, total;
  explicit BlockLayout(std::int64_t C) {
    std::int64_t o = 0;
    auto take = [&o](std::int64_t n) {
      const std::int64_t at = o;
      o += n;
      return at;
    };
    ln1_w = take(C);
    ln1_b = take(C);
    attn_w = take(C * 3 * C);
    attn_b = take(3 * C);
    proj_w = take(C * C);
    proj_b = take(C);
    ln2_w = take(C);
    ln2_b = take(C);
    fc_w = take(C * 4 * C);
    fc_b = take(4 * C);
    fcp_w = take(4 * C * C);
    fcp_b = take(C);
    total = o;
  }
};

// Saved activations of a block (elements of S), N = B*T rows; the statistics (Stat) take K = stat_elems elements
// each, aligned to K (gpt2.hpp).
struct BlockActs {
  std::int64_t ln1, ln1_mean, ln1_rstd, qkv, att, atty, res1, ln2, ln2_mean, ln2_rstd, fch, fchg, total;
  BlockActs(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H, std::int64_t K) {
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
    ln1 = take(N * C);          // (B, T, C) ln_1(x)
    ln1_mean = take_stats(N);   // (B, T) Stat
    ln1_rstd = take_stats(N);   // (B, T) Stat
    qkv = take(N * 3 * C);      // (B, T, 3C)
    att = take(B * H * T * T);  // (B, H, T, T) attention probabilities
    atty = take(N * C);         // (B, T, C) attention output before c_proj
    res1 = take(N * C);         // (B, T, C) x + attn
    ln2 = take(N * C);          // (B, T, C) ln_2(res1)
    ln2_mean = take_stats(N);   // (B, T) Stat
    ln2_rstd = take_stats(N);   // (B, T) Stat
    fch = take(N * 4 * C);      // (B, T, 4C) c_fc output
    fchg = take(N * 4 * C);     // (B, T, 4C) gelu(fch)
    total = o;
  }
};

// The head's (elements of S; statistics as BlockActs').
struct HeadActs {
  std::int64_t lnf, mean, rstd, probs, total;
  HeadActs(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t K) {
    lnf = 0;                         // (B, T, C) ln_f(x)
    mean = (N * C + K - 1) / K * K;  // (B, T) Stat
    rstd = mean + N * K;             // (B, T) Stat
    probs = rstd + N * K;            // (B, T, V) softmax(logits); the backward turns it into dlogits
    total = probs + N * V;
  }
};

}  // namespace

bool Gpt2Config::same_model(const Gpt2Config& o) const {
  Gpt2Config a = *this;
  Gpt2Config b = o;
  a.n_kv_head = a.kv_heads();
  b.n_kv_head = b.kv_heads();
  return a == b;
}

Gpt2::Gpt2(const Gpt2Config& config) : config_(config) {
  config_.validate();
  const std::int64_t V = config_.vocab_size, P = config_.max_seq_len, C = config_.n_embd;
  auto add = [](std::vector<ParamSpec>& list, std::string name, std::vector<std::int64_t> shape,
                std::string tied = {}) {
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const std::int64_t offset = list.empty() ? 0 : list.back().offset + list.back().numel;
    list.push_back({std::move(name), std::move(shape), offset, numel, std::move(tied)});
  };
  params_.resize(static_cast<std::size_t>(num_layers()));
  if (is_llama()) {
    add_llama_params();
    for (const auto& l : params_) param_floats_.push_back(l.back().offset + l.back().numel);
    return;
  }
  add(params_[0], "wte.weight", {V, C});
  add(params_[0], "wpe.weight", {P, C});
  for (int i = 0; i < config_.n_layer; ++i) {
    auto& l = params_[static_cast<std::size_t>(i) + 1];
    const std::string h = fmt::format("h.{}.", i);
    add(l, h + "ln_1.weight", {C});
    add(l, h + "ln_1.bias", {C});
    add(l, h + "attn.c_attn.weight", {C, 3 * C});
    add(l, h + "attn.c_attn.bias", {3 * C});
    add(l, h + "attn.c_proj.weight", {C, C});
    add(l, h + "attn.c_proj.bias", {C});
    add(l, h + "ln_2.weight", {C});
    add(l, h + "ln_2.bias", {C});
    add(l, h + "mlp.c_fc.weight", {C, 4 * C});
    add(l, h + "mlp.c_fc.bias", {4 * C});
    add(l, h + "mlp.c_proj.weight", {4 * C, C});
    add(l, h + "mlp.c_proj.bias", {C});
  }
  auto& head = params_.back();
  add(head, "ln_f.weight", {C});
  add(head, "ln_f.bias", {C});
  add(head, "lm_head.weight", {V, C}, "wte.weight");
  for (const auto& l : params_) param_floats_.push_back(l.back().offset + l.back().numel);
  if (config_.n_layer > 0 && BlockLayout(C).total != param_floats_[1])
    throw core::InternalError("block parameter layout mismatch");
}

void Gpt2::check(int layer) const {
  if (layer < 0 || layer >= num_layers())
    throw BackendError(fmt::format("{}: layer {} outside 0..{}", arch_name(config_.arch), layer, num_layers() - 1));
}

LayerKind Gpt2::kind(int layer) const {
  check(layer);
  if (layer == 0) return LayerKind::Embedding;
  if (layer == head_layer()) return LayerKind::Head;
  return LayerKind::Block;
}

std::string Gpt2::layer_name(int layer) const {
  switch (kind(layer)) {
    case LayerKind::Embedding:
      return "embedding";
    case LayerKind::Head:
      return "head";
    case LayerKind::Block:
      break;
  }
  return fmt::format("{}.{}", is_llama() ? "layers" : "h", layer - 1);
}

const std::vector<ParamSpec>& Gpt2::params(int layer) const {
  check(layer);
  return params_[static_cast<std::size_t>(layer)];
}

const ParamSpec& Gpt2::param(int layer, std::string_view name) const {
  for (const auto& p : params(layer)) {
    if (p.name == name) return p;
  }
  throw BackendError(fmt::format("{}: layer {} has no parameter '{}'", arch_name(config_.arch), layer, name));
}

std::int64_t Gpt2::param_floats(int layer) const {
  check(layer);
  return param_floats_[static_cast<std::size_t>(layer)];
}

std::int64_t Gpt2::param_count() const {
  std::int64_t n = 0;
  for (const auto& l : params_) {
    for (const auto& p : l) {
      if (p.tied_to.empty()) n += p.numel;
    }
  }
  return n;
}

std::int64_t Gpt2::act_floats(int layer, int B, int T, DType dtype) const {
  const std::int64_t K = stat_elems(dtype);
  if (is_llama()) return llama_act_floats(layer, B, T, K);
  switch (kind(layer)) {
    case LayerKind::Embedding:
      return 0;
    case LayerKind::Block:
      return BlockActs(B, T, config_.n_embd, config_.n_head, K).total;
    case LayerKind::Head:
      return HeadActs(std::int64_t(B) * T, config_.n_embd, config_.vocab_size, K).total;
  }
  return 0;
}

std::int64_t Gpt2::scratch_floats(int layer, int B, int T) const {
  if (is_llama()) return llama_scratch_floats(layer, B, T);
  const std::int64_t NC = std::int64_t(B) * T * config_.n_embd;
  switch (kind(layer)) {
    case LayerKind::Embedding:
      return 0;
    case LayerKind::Block:
      return 6 * NC;  // dres1 (N,C) | dtmp (N,C) | dbig (N,4C)
    case LayerKind::Head:
      return NC;  // dlnf (N,C)
  }
  return 0;
}

Bytes Gpt2::input_bytes(int layer, int B, int T, DType dtype) const {
  const Bytes N = Bytes(B) * T;
  return kind(layer) == LayerKind::Embedding ? N * Bytes(sizeof(std::int32_t))
                                             : N * config_.n_embd * dtype_bytes(dtype);
}

Bytes Gpt2::output_bytes(int layer, int B, int T, DType dtype) const {
  const Bytes N = Bytes(B) * T;
  return kind(layer) == LayerKind::Head ? N * Bytes(sizeof(float)) : N * config_.n_embd * dtype_bytes(dtype);
}

template <class S>
void Gpt2::check_args(int layer, const LayerArgs<S>& a, bool backward) const {
  const LayerKind k = kind(layer);
  const std::string where = fmt::format("{} layer {} ({}) {}", arch_name(config_.arch), layer, layer_name(layer),
                                        backward ? "backward" : "forward");
  if (a.B <= 0) throw BackendError(fmt::format("{}: microbatch size B = {} must be positive", where, a.B));
  if (a.T <= 0 || a.T > config_.max_seq_len)
    throw BackendError(fmt::format("{}: sequence length T = {} outside 1..{}", where, a.T, config_.max_seq_len));
  if (config_.sliding_window > 0 && a.T > config_.sliding_window)
    throw BackendError(
        fmt::format("{}: sequence length T = {} exceeds sliding_window {}, which is not modelled (every "
                    "token attends to every earlier one)",
                    where, a.T, config_.sliding_window));
  auto need = [&](const void* p, const char* what) {
    if (p == nullptr) throw BackendError(fmt::format("{}: {} is null", where, what));
  };
  need(a.w, "w");
  if (k == LayerKind::Embedding) need(a.tokens, "tokens");
  if (k != LayerKind::Embedding) {
    need(a.x, "x");
    need(a.act, "act");
  }
  if (k == LayerKind::Head) need(a.targets, "targets");
  if (!backward) {
    need(a.y, "y");
    return;
  }
  need(a.dw, "dw");
  if (k != LayerKind::Head) need(a.dy, "dy");
  if (k != LayerKind::Embedding) {
    need(a.dx, "dx");
    need(a.scratch, "scratch");
  }
}

template <class Ops>
void Gpt2::forward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const {
  using S = typename Ops::Scalar;
  using R = typename Ops::Real;
  using Stat = typename Ops::Stat;
  constexpr std::int64_t K = stat_elems<Ops>();
  check_args(layer, a, false);
  if (is_llama()) return llama_forward(ops, layer, a);
  const int B = a.B, T = a.T, C = config_.n_embd, H = config_.n_head, V = config_.vocab_size;
  const int N = B * T;
  const R eps = R(config_.ln_eps);
  const S* w = a.w;
  switch (kind(layer)) {
    case LayerKind::Embedding:
      ops.embedding_fwd(a.y, a.tokens, w, w + std::int64_t(V) * C, B, T, C, V);
      return;
    case LayerKind::Block: {
      const BlockLayout p(C);
      const BlockActs s(B, T, C, H, K);
      S* act = a.act;
      const std::int64_t NC = std::int64_t(N) * C;
      ops.layernorm_fwd(act + s.ln1, stats_at<Stat>(act, s.ln1_mean), stats_at<Stat>(act, s.ln1_rstd), a.x, w + p.ln1_w,
                        w + p.ln1_b, N, C, eps);
      ops.matmul_fwd(act + s.qkv, act + s.ln1, w + p.attn_w, w + p.attn_b, N, C, 3 * C, WeightLayout::InOut);
      ops.attention_fwd(act + s.atty, act + s.att, act + s.qkv, B, T, C, H);
      ops.matmul_fwd(a.y, act + s.atty, w + p.proj_w, w + p.proj_b, N, C, C, WeightLayout::InOut);
      ops.add_layernorm_fwd(act + s.res1, act + s.ln2, stats_at<Stat>(act, s.ln2_mean), stats_at<Stat>(act, s.ln2_rstd),
                            a.x, a.y, w + p.ln2_w, w + p.ln2_b, N, C, eps);
      ops.matmul_gelu_fwd(act + s.fchg, act + s.fch, act + s.ln2, w + p.fc_w, w + p.fc_b, N, C, 4 * C,
                          WeightLayout::InOut);
      ops.matmul_fwd(a.y, act + s.fchg, w + p.fcp_w, w + p.fcp_b, N, 4 * C, C, WeightLayout::InOut);
      ops.add(a.y, act + s.res1, a.y, NC);
      return;
    }
    case LayerKind::Head: {
      const HeadActs s(N, C, V, K);
      const auto& ps = params_.back();
      S* act = a.act;
      ops.layernorm_fwd(act + s.lnf, stats_at<Stat>(act, s.mean), stats_at<Stat>(act, s.rstd), a.x, w + ps[0].offset,
                        w + ps[1].offset, N, C, eps);
      ops.matmul_fwd(act + s.probs, act + s.lnf, w + ps[2].offset, static_cast<const S*>(nullptr), N, C, V,
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
void Gpt2::backward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const {
  using S = typename Ops::Scalar;
  using Stat = typename Ops::Stat;
  constexpr std::int64_t K = stat_elems<Ops>();
  check_args(layer, a, true);
  if (is_llama()) return llama_backward(ops, layer, a);
  const int B = a.B, T = a.T, C = config_.n_embd, H = config_.n_head, V = config_.vocab_size;
  const int N = B * T;
  const S* w = a.w;
  S* dw = a.dw;
  switch (kind(layer)) {
    case LayerKind::Embedding:
      ops.embedding_bwd(dw, dw + std::int64_t(V) * C, a.dy, a.tokens, B, T, C, V);
      return;
    case LayerKind::Block: {
      const BlockLayout p(C);
      const BlockActs s(B, T, C, H, K);
      const S* act = a.act;
      const std::int64_t NC = std::int64_t(N) * C;
      S* dres1 = a.scratch;      // (B, T, C) gradient of res1
      S* dtmp = a.scratch + NC;  // (B, T, C): dln2, then datty, then dln1
      S* dbig = dtmp + NC;       // (B, T, 4C): dfchg, dfch, then dqkv (B, T, 3C)
      // y = res1 + c_proj(gelu(c_fc(ln_2(res1))))
      ops.copy(dres1, a.dy, NC);
      // dfch = gelu'(fch) * dfchg; c_fc's bias gradient there too when the device fuses it (else c_fc's matmul_bwd)
      const bool fc_bias_summed = ops.matmul_gelu_bwd(dbig, dw + p.fcp_w, dw + p.fcp_b, dw + p.fc_b, a.dy, act + s.fchg,
                                                      w + p.fcp_w, act + s.fch, N, 4 * C, C, WeightLayout::InOut);
      ops.matmul_bwd(dtmp, dw + p.fc_w, fc_bias_summed ? nullptr : dw + p.fc_b, dbig, act + s.ln2, w + p.fc_w, N, C,
                     4 * C, WeightLayout::InOut);
      ops.layernorm_bwd(dres1, dw + p.ln2_w, dw + p.ln2_b, dtmp, act + s.res1, w + p.ln2_w,
                        stats_at<Stat>(act, s.ln2_mean), stats_at<Stat>(act, s.ln2_rstd), N, C);
      // res1 = x + c_proj(attention(c_attn(ln_1(x))))
      ops.matmul_bwd(dtmp, dw + p.proj_w, dw + p.proj_b, dres1, act + s.atty, w + p.proj_w, N, C, C,
                     WeightLayout::InOut);
      ops.attention_bwd(dbig, dtmp, act + s.qkv, act + s.att, B, T, C, H);
      ops.matmul_bwd(dtmp, dw + p.attn_w, dw + p.attn_b, dbig, act + s.ln1, w + p.attn_w, N, C, 3 * C,
                     WeightLayout::InOut);
      ops.copy(a.dx, dres1, NC);
      ops.layernorm_bwd(a.dx, dw + p.ln1_w, dw + p.ln1_b, dtmp, a.x, w + p.ln1_w, stats_at<Stat>(act, s.ln1_mean),
                        stats_at<Stat>(act, s.ln1_rstd), N, C);
      return;
    }
    case LayerKind::Head: {
      const HeadActs s(N, C, V, K);
      const auto& ps = params_.back();
      S* act = a.act;
      S* dlnf = a.scratch;  // (B, T, C)
      ops.crossentropy_bwd(act + s.probs, act + s.probs, a.targets, a.loss_scale, N, V);
      ops.matmul_bwd(dlnf, dw + ps[2].offset, static_cast<S*>(nullptr), act + s.probs, act + s.lnf, w + ps[2].offset, N,
                     C, V, WeightLayout::OutIn);
      ops.zero(a.dx, std::int64_t(N) * C);
      ops.layernorm_bwd(a.dx, dw + ps[0].offset, dw + ps[1].offset, dlnf, a.x, w + ps[0].offset,
                        stats_at<Stat>(act, s.mean), stats_at<Stat>(act, s.rstd), N, C);
      return;
    }
  }
}

template void Gpt2::forward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
template void Gpt2::backward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
template void Gpt2::forward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
template void Gpt2::backward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
template void Gpt2::forward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
template void Gpt2::backward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
template void Gpt2::forward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;
template void Gpt2::backward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;

}  // namespace harmony::backend
