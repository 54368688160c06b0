// The decoder models harmony-run trains, as the chain of layers the core schedules: layer 0 = token embeddings
// (+ GPT-2's position table), layers 1..L = transformer blocks, layer L+1 = final norm + LM head + mean cross-entropy
// (the criterion, last). Two families (Gpt2Config::arch): GPT-2 (LayerNorm, learned positions, GELU MLP, head tied
// to wte) and Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, tied or untied head). Each
// layer owns one flat weight block (HF tensors back to back in HF layout) and runs forward / backward over one
// microbatch through an Ops (ops.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device.hpp"
#include "backend/model/ops.hpp"

namespace harmony::backend {

enum class Arch : std::uint8_t { Gpt2, Llama };
std::string_view arch_name(Arch arch);  // "gpt2", "llama"

struct Gpt2Config {
  int vocab_size = 0;    // V
  int max_seq_len = 0;   // GPT-2: rows of wpe (HF n_positions); Llama: max_position_embeddings; T may not exceed it
  int n_layer = 0;       // L transformer blocks
  int n_head = 0;        // H
  int n_embd = 0;        // C, a multiple of H
  float ln_eps = 1e-5f;  // GPT-2: layer_norm_epsilon; Llama: rms_norm_eps
  Arch arch = Arch::Gpt2;
  // Llama only (validate() refuses them set for GPT-2):
  int n_kv_head = 0;          // key/value heads (grouped-query attention), dividing n_head; 0: n_head
  int intermediate_size = 0;  // the SwiGLU MLP's width (required, > 0)
  float rope_theta = 10000.0f;
  bool tie_embeddings = true;  // lm_head tied to model.embed_tokens (GPT-2: always)
  bool qkv_bias = false;       // q_proj, k_proj and v_proj carry biases (Qwen2); o_proj and the MLP never do
  // Mistral's sliding window (0: none). Attention is plain causal, which is the window's when T <= sliding_window:
  // a longer T is refused (check_args), never computed as something else.
  int sliding_window = 0;
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // The same model: every field equal, n_kv_head compared as kv_heads() (0 and n_head name one shape).
  bool same_model(const Gpt2Config& o) const;
  void validate() const;  // throws BackendError naming the bad field
  bool operator==(const Gpt2Config&) const = default;
};

enum class LayerKind : std::uint8_t { Embedding, Block, Head };

struct ParamSpec {
  std::string name;                 // HF name: "wte.weight", "h.3.attn.c_attn.weight", "ln_f.bias", ...
  std::vector<std::int64_t> shape;  // HF shape; Conv1D weights are [in, out]
  std::int64_t offset = 0;          // first float within the layer's weight block
  std::int64_t numel = 0;
  std::string tied_to;  // the head's "lm_head.weight" is tied to layer 0's "wte.weight"; else empty
};

// The type of a layer's real-valued scalars (eps, the loss scale, the head's per-token losses) for storage S:
// S itself, except fp32 for bf16 storage.
template <class S>
struct RealOf {
  using type = S;
};
template <>
struct RealOf<Bf16> {
  using type = float;
};
template <class S>
using real_t = typename RealOf<S>::type;

// The normalizations' saved row statistics (LayerNorm's mean and rstd, RMSNorm's rstd) are Ops::Stat values (fp32 on
// a device for either S, as torch keeps them under bf16 autocast) kept inside a layer's act buffer of S elements:
// each statistic takes stat_elems S elements (1 in fp32 and on the host, 2 in bf16), and each statistics tensor
// starts at an offset that is a multiple of stat_elems, so that it is aligned for Stat in a buffer aligned for it.
template <class Ops>
constexpr std::int64_t stat_elems() {
  using S = typename Ops::Scalar;
  using Stat = typename Ops::Stat;
  static_assert(sizeof(Stat) % sizeof(S) == 0, "a statistic takes whole S elements");
  return static_cast<std::int64_t>(sizeof(Stat) / sizeof(S));
}
// The layout's stat_elems for a device buffer of `dtype` (the host's double layout: F32, one element each).
constexpr std::int64_t stat_elems(DType dtype) { return dtype == DType::BF16 ? 2 : 1; }
// The statistics tensor at S-element offset `at` of an act buffer.
template <class Stat, class S>
Stat* stats_at(S* act, std::int64_t at) {
  return reinterpret_cast<Stat*>(act + at);
}
template <class Stat, class S>
const Stat* stats_at(const S* act, std::int64_t at) {
  return reinterpret_cast<const Stat*>(act + at);
}

// Arguments of one layer over one microbatch of B sequences of T tokens (N = B*T rows). Pointers are memory
// the Ops can address (device memory for DeviceOps). Which fields a layer reads depends on its kind:
//   forward   Embedding: tokens -> y        Block: x -> y, act        Head: x, targets -> y (losses), act
//   backward  Embedding: tokens, dy -> dw   Block: x, act, dy -> dx, dw   Head: x, act, targets -> dx, dw
// `act` is written by the forward and read by the backward over the same x (a recompute in Harmony); the
// backward may overwrite it. dw is accumulated (+=); dx is written.
template <class S>
struct LayerArgs {
  int B = 0;
  int T = 0;
  const S* w = nullptr;                   // param_floats(layer): the layer's weights
  const std::int32_t* tokens = nullptr;   // (B, T) input ids, Embedding
  const std::int32_t* targets = nullptr;  // (B, T) next-token ids, Head
  const S* x = nullptr;                   // (B, T, C) input, Block and Head
  S* y = nullptr;                         // (B, T, C) output; Head: (B, T) per-token cross-entropy as real_t<S>
  S* act = nullptr;                       // act_floats(layer, B, T, the dtype of S)
  S* dw = nullptr;                        // param_floats(layer): weight gradients, accumulated
  const S* dy = nullptr;                  // (B, T, C) gradient of y, Embedding and Block
  S* dx = nullptr;                        // (B, T, C) gradient of x, Block and Head
  S* scratch = nullptr;                   // scratch_floats(layer, B, T), backward only
  real_t<S> loss_scale = real_t<S>(1);    // Head: d(loss)/d(per-token loss), 1/(tokens in the minibatch)
};

class Gpt2 {
 public:
  explicit Gpt2(const Gpt2Config& config);

  const Gpt2Config& config() const { return config_; }
  bool is_llama() const { return config_.arch == Arch::Llama; }
  // Layer 0's token embedding ("wte.weight", "model.embed_tokens.weight"), and whether the head's "lm_head.weight" is
  // tied to it (then the head's copy has tied_to set, no optimizer state, and gets the embedding's update).
  const std::string& embedding_name() const { return params_.front().front().name; }
  bool tied() const { return !params_.back().back().tied_to.empty(); }
  int num_layers() const { return config_.n_layer + 2; }
  int head_layer() const { return config_.n_layer + 1; }
  LayerKind kind(int layer) const;
  std::string layer_name(int layer) const;  // "embedding", "h.3" (Llama: "layers.3"), "head"
  const std::vector<ParamSpec>& params(int layer) const;
  const ParamSpec& param(int layer, std::string_view name) const;  // throws BackendError if absent
  std::int64_t param_floats(int layer) const;
  std::int64_t param_count() const;  // unique parameters (the tied wte counted once)

  // Sizes per microbatch, for the executor's allocations. The *_floats counts are elements (of the device
  // dtype: 4 bytes in fp32, 2 in bf16). act_floats includes the norms' fp32 statistics (stat_elems(dtype) elements
  // each); F32 is also the host's double layout.
  std::int64_t act_floats(int layer, int B, int T, DType dtype = DType::F32) const;
  std::int64_t scratch_floats(int layer, int B, int T) const;
  // layer 0: (B, T) int32 ids; else (B, T, C) elements of `dtype`.
  Bytes input_bytes(int layer, int B, int T, DType dtype = DType::F32) const;
  // head: (B, T) fp32 losses (in every dtype); else (B, T, C) elements of `dtype`.
  Bytes output_bytes(int layer, int B, int T, DType dtype = DType::F32) const;

  template <class Ops>
  void forward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const;
  template <class Ops>
  void backward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const;

 private:
  void check(int layer) const;
  template <class S>
  void check_args(int layer, const LayerArgs<S>& a, bool backward) const;
  // The Llama family (backend/model/llama.cpp): its parameter tables, sizes and layers.
  void add_llama_params();
  std::int64_t llama_act_floats(int layer, int B, int T, std::int64_t stat_elems) const;
  std::int64_t llama_scratch_floats(int layer, int B, int T) const;
  template <class Ops>
  void llama_forward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const;
  template <class Ops>
  void llama_backward(Ops& ops, int layer, const LayerArgs<typename Ops::Scalar>& a) const;

  Gpt2Config config_;
  std::vector<std::vector<ParamSpec>> params_;  // per layer
  std::vector<std::int64_t> param_floats_;
};

extern template void Gpt2::forward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
extern template void Gpt2::backward<DeviceOps>(DeviceOps&, int, const LayerArgs<float>&) const;
extern template void Gpt2::forward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
extern template void Gpt2::backward<DeviceOpsBf16>(DeviceOpsBf16&, int, const LayerArgs<Bf16>&) const;
extern template void Gpt2::forward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
extern template void Gpt2::backward<HostOps<float>>(HostOps<float>&, int, const LayerArgs<float>&) const;
extern template void Gpt2::forward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;
extern template void Gpt2::backward<HostOps<double>>(HostOps<double>&, int, const LayerArgs<double>&) const;

}  // namespace harmony::backend
