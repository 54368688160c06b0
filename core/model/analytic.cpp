// Analytic models: each layer is a small graph of tensors and ops (GEMMs, elementwise and reduction kernels) written
// once per family; from it come FLOPs, bytes moved, kernel counts, times at the GPU's rates and, from its memory walk
// (analytic_memory.cpp), peaks and saved activations. docs/validation.md ("Analytic models against measured
// profiles") documents the formulas and calibration.
#include "core/model/analytic.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/model/analytic_graph.hpp"
#include "core/model/analytic_memory.hpp"

namespace harmony::core {
namespace analytic_detail {
namespace {

// Autograd runs the backward only of ops on a path to an output that receives a gradient (not, e.g., GPT-2's
// `present`): drop the backward of the others.
void prune_backward(Graph& g) {
  std::vector<char> wants(g.tensors.size(), 0);
  for (int t : g.outputs) wants[static_cast<std::size_t>(t)] = g.tensors[static_cast<std::size_t>(t)].needs_grad;
  for (std::size_t i = g.ops.size(); i-- > 0;) {
    Op& op = g.ops[i];
    if (!wants[static_cast<std::size_t>(op.output)]) {
      op.bwd.clear();
      op.grads.clear();
      op.saved.clear();
      op.weight_grad_bytes = 0;
      continue;
    }
    for (const GradInput& gi : op.grads) wants[static_cast<std::size_t>(gi.tensor)] = 1;
  }
}

}  // namespace

LayerDef finish(Builder& b, std::string name, std::string kind, std::vector<int> outputs) {
  LayerDef d;
  d.name = std::move(name);
  d.kind = std::move(kind);
  b.graph.outputs = std::move(outputs);
  d.graph = std::move(b.graph);
  prune_backward(d.graph);
  d.owned_params = b.params;
  d.param_tensors = b.param_tensors;
  d.gathered_modules = b.gathered_modules;
  d.resident_params = b.params;
  d.buffer_bytes = b.buffer_bytes;
  return d;
}

void chunk_logits(LayerDef& d, double logit_elements, int chunks) {
  if (chunks <= 1) return;
  for (Tensor& t : d.graph.tensors) {
    if (t.per_sample >= logit_elements) t.per_sample /= chunks;
  }
}

// GELU: eager (and sdpa) runs the Python formula op by op; fused (and flash) is one kernel.
int gelu(Builder& b, const AnalyticSpec& s, int x, bool tanh_form) {
  if (!eager_ops(s)) return b.unary("gelu", x, 1, {3});
  if (tanh_form) {
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (Hugging Face gelu_new)
    const int half = b.scale("gelu.0.5x", x);
    // grad * 3 * x.pow(2): three kernels; pow is on autocast's FP32 list, and what follows promotes to it
    const int cube = b.unary("gelu.pow3", b.upper(x), 1, {2, 2, 3});
    const int c1 = b.scale("gelu.0.044715", cube);
    const int c2 = b.add("gelu.add", x, c1);
    const int c3 = b.scale("gelu.sqrt2/pi", c2);
    const int th = b.unary("gelu.tanh", c3, 2, {3});
    const int one = b.add_scalar("gelu.1+", th);
    return b.mul("gelu.mul", half, one);
  }
  // x * 0.5 * (1 + erf(x / sqrt(2)))  (pytorch-pretrained-BERT)
  const int half = b.scale("gelu.x*0.5", x);
  const int div = b.scale("gelu.x/sqrt2", x);
  const int erf = b.unary("gelu.erf", div, 1, {2, 2, 3});  // grad * 2/sqrt(pi) * exp(-x^2)
  const int one = b.add_scalar("gelu.1+", erf);
  return b.mul("gelu.mul", half, one);
}

// Which part of a transformer block one layer is: the whole block, or (GPT, layers_per_block: 2) its
// attention half (ln_1 .. the first residual add) or its MLP half (ln_2 .. the second residual add), as
}  // namespace analytic_detail

namespace {

using namespace analytic_detail;  // NOLINT(google-build-using-namespace): the families' shared internals

// ------------------------------------------------------------------------------------------------
// Families: GPT, BERT, ResNet (the Llama family and GPT-NeoX are in analytic_llama.cpp)

// LoHan/Fuyou's gpt_model.py checkpoints func1 and func2.
enum class BlockPart { Whole, Attn, Mlp };

// GPT's attention core: ln_1, c_attn and the attention (eager: Hugging Face's explicit scores, causal mask and
// softmax; fused: one masked softmax; flash: one kernel; sdpa: eager's copies, then one kernel on them); returns the
// context. Eager (and sdpa) also keeps `present`.
int gpt_attention(Builder& b, const AnalyticSpec& s, int x, int& present) {
  const bool eager = eager_ops(s);
  const bool flash = s.kernels == KernelStyle::Flash;  // fused, with the attention core one FlashAttention kernel
  const bool sdpa = s.kernels == KernelStyle::Sdpa;    // eager, with the attention core one SDPA kernel
  const double T = s.seq_len, h = s.hidden, nh = s.heads, d = h / nh;
  const int a = b.layernorm("ln_1", x, h);
  const int qkv = b.linear("c_attn", a, T, h, 3 * h, true);
  int q = qkv, k = qkv, v = qkv;
  if (eager) {  // split_heads views; matmul makes them contiguous
    // Hugging Face GPT-2 (transformers 2.x) also stacks key and value into `present`, kept to the block's end
    present = b.copy("present", qkv, 2 * T * h);
    q = b.copy("q.contiguous", qkv, T * h);
    k = b.copy("k.contiguous", qkv, T * h);
    v = b.copy("v.contiguous", qkv, T * h);
  }
  if (flash) return b.flash_attention("flash_attention", {qkv}, nh, T, d);  // q, k, v: views of the packed qkv
  // is_causal: no mask tensor and no registered mask buffer counted
  if (sdpa) return b.flash_attention("sdpa_attention", {q, k, v}, nh, T, d);
  const int sc = b.bmm("q@k", q, k, nh, T, T, d);
  int p = -1;
  if (eager) {
    // w = w / sqrt(d); w = w * b - 1e4 * (1 - b), b the registered causal-mask buffer (T x T); the old `w`
    // lives until the whole expression is assigned
    b.buffer_bytes += T * T * b.bpe();
    const int causal = b.tensor(0, b.bpe(), false, T * T);
    const int w1 = b.scale("scores/sqrt(d)", sc);
    const int w2 = b.mul("scores*mask", w1, causal);
    const int one_minus = b.add_scalar("1-mask", causal);
    const int big = b.scale("1e4*(1-mask)", one_minus);
    const int w3 = b.add("scores-1e4(1-mask)", w2, big);
    b.hold(w1, w3);
    p = b.softmax("softmax", w3);
  } else {
    p = b.softmax("scale_mask_softmax", sc);
  }
  p = b.dropout("attn_dropout", p);
  return b.bmm("p@v", p, v, nh, T, d, T);
}

// BERT's attention core: query, key, value and the attention with the additive mask; returns the context.
int bert_attention(Builder& b, const AnalyticSpec& s, int x, int mask) {
  const bool eager = eager_ops(s);
  const bool flash = s.kernels == KernelStyle::Flash;  // fused, with the attention core one FlashAttention kernel
  const bool sdpa = s.kernels == KernelStyle::Sdpa;    // eager, with the attention core one SDPA kernel
  const double T = s.seq_len, h = s.hidden, nh = s.heads, d = h / nh;
  int q = b.linear("query", x, T, h, h, true);
  int k = b.linear("key", x, T, h, h, true);
  int v = b.linear("value", x, T, h, h, true);
  if (eager) {
    q = b.copy("q.contiguous", q, T * h);
    k = b.copy("k.contiguous", k, T * h);
    v = b.copy("v.contiguous", v, T * h);
  }
  if (flash) return b.flash_attention("flash_attention", {q, k, v}, nh, T, d);  // the mask's read is negligible
  if (sdpa) return b.flash_attention("sdpa_attention", {q, k, v}, nh, T, d);    // the mask's read is negligible
  const int sc = b.bmm("q@k", q, k, nh, T, T, d);
  int p = -1;
  if (eager) {
    const int w1 = b.scale("scores/sqrt(d)", sc);
    const int w2 = b.add("scores+mask", w1, mask);
    p = b.softmax("softmax", w2);
  } else {
    p = b.softmax("scale_mask_softmax", sc);  // the mask's read (T per sample) is negligible
  }
  p = b.dropout("attn_dropout", p);
  return b.bmm("p@v", p, v, nh, T, d, T);
}

// The attention half's end: merge_heads, the output projection and the first residual add (BERT: then its
// LayerNorm); returns the block's hidden state after the attention half.
int attention_output(Builder& b, const AnalyticSpec& s, int ctx, int resid) {
  const bool gpt = s.family == ModelFamily::Gpt;
  const bool eager = eager_ops(s);
  const double T = s.seq_len, h = s.hidden;
  const int merged = b.copy("merge_heads", ctx, T * h);
  const int o = b.linear(gpt ? "c_proj" : "attn.dense", merged, T, h, h, true);
  if (gpt)
    return eager ? b.add("residual_1", resid, b.dropout("resid_dropout", o)) : b.dropout_add("dropout_add_1", o, resid);
  const int r =
      eager ? b.add("residual_1", b.dropout("attn.dropout", o), resid) : b.dropout_add("dropout_add_1", o, resid);
  return b.layernorm("attn.LayerNorm", r, h);
}

// The MLP half from the hidden state x1 (GPT: ln_2 first) to the second residual add (BERT: then its LayerNorm);
// returns the block's output. GPT's eager `present` lives to here.
int mlp_half(Builder& b, const AnalyticSpec& s, int x1, int present) {
  const bool gpt = s.family == ModelFamily::Gpt;
  const bool eager = eager_ops(s);
  const double T = s.seq_len, h = s.hidden, f = s.ffn > 0 ? s.ffn : 4.0 * h;
  const int m_in = gpt ? b.layernorm("ln_2", x1, h) : x1;
  const int f1 = b.linear(gpt ? "c_fc" : "intermediate.dense", m_in, T, h, f, true);
  const int g = gelu(b, s, f1, gpt);
  const int f2 = b.linear(gpt ? "mlp.c_proj" : "output.dense", g, T, f, h, true);
  if (gpt) {
    const int y =
        eager ? b.add("residual_2", x1, b.dropout("mlp_dropout", f2)) : b.dropout_add("dropout_add_2", f2, x1);
    if (present >= 0) b.hold(present, y);
    return y;
  }
  const int r =
      eager ? b.add("residual_2", b.dropout("output.dropout", f2), x1) : b.dropout_add("dropout_add_2", f2, x1);
  return b.layernorm("output.LayerNorm", r, h);
}

// One transformer block (or a GPT block's half). Inputs: hidden (s x h), and for BERT the additive attention
// mask; outputs: hidden (and the mask, passed on, when `pass_mask`).
LayerDef transformer_block(const AnalyticSpec& s, int index, bool pass_mask, BlockPart part = BlockPart::Whole) {
  Builder b(s);
  const bool gpt = s.family == ModelFamily::Gpt;
  const double T = s.seq_len, h = s.hidden;
  const int x = b.input(T * h, b.stream_bpe(), true);
  const int mask = gpt ? -1 : b.input(T, b.stream_bpe(), false);  // HF casts it to the parameters' type
  int present = -1;
  int x1 = x;  // with the MLP half alone, the block's hidden state after the attention half: this layer's input
  if (part != BlockPart::Mlp) {
    const int ctx = gpt ? gpt_attention(b, s, x, present) : bert_attention(b, s, x, mask);
    x1 = attention_output(b, s, ctx, /*resid=*/x);
  }
  if (part == BlockPart::Attn) {
    if (present >= 0) b.hold(present, x1);  // `present` lives to the end of func1, the half's end
    return finish(b, fmt::format("block{}.attn", index), "block_attn", {x1});
  }
  const int y = mlp_half(b, s, x1, present);
  std::vector<int> outs = {y};
  if (pass_mask) outs.push_back(mask);
  if (part == BlockPart::Mlp) return finish(b, fmt::format("block{}.mlp", index), "block_mlp", outs);
  return finish(b, fmt::format("block{}", index), "block", outs);
}

std::vector<LayerDef> gpt_layers(const AnalyticSpec& s) {
  const double T = s.seq_len, h = s.hidden, V = s.vocab;
  std::vector<LayerDef> out;
  {
    Builder b(s);
    const int ids = b.input(T, kIdBytes, false);
    const int pos = b.tensor(0, kIdBytes, false, T);  // arange(T), expanded to the microbatch
    const int wte = b.embedding("wte", ids, T, V, h);
    const int wpe = b.embedding("wpe", pos, T, s.positions > 0 ? s.positions : T, h);
    const int e = b.add("wte+wpe", wte, wpe);
    out.push_back(finish(b, "embedding", "embedding", {b.dropout("embd_dropout", e)}));
  }
  // every block is the same graph: built once, copied
  if (s.layers_per_block == 2) {  // two layers a block: templates at 1 (attention half) and 2 (MLP half)
    out.push_back(transformer_block(s, 0, false, BlockPart::Attn));
    out.push_back(transformer_block(s, 0, false, BlockPart::Mlp));
    for (int i = 1; i < s.layers; ++i) {
      out.push_back(copy_of(out, 1, fmt::format("block{}.attn", i)));
      out.push_back(copy_of(out, 2, fmt::format("block{}.mlp", i)));
    }
  } else {
    out.push_back(transformer_block(s, 0, false));
    for (int i = 1; i < s.layers; ++i) out.push_back(copy_of(out, 1, fmt::format("block{}", i)));
  }
  {
    Builder b(s);
    const int x = b.input(T * h, b.stream_bpe(), true);
    out.push_back(finish(b, "final_norm", "final_norm", {b.layernorm("ln_f", x, h)}));
  }
  if (s.gpt_head == GptHead::None) {
    // No LM head (LoHan/Fuyou's benchmark GPT): MSE between the final hidden states and a random target of
    // their shape; nothing here scales with the vocabulary, whose table stays the embedding's.
    Builder b(s);
    const int x = b.input(T * h, b.stream_bpe(), true);
    const int target = b.input(T * h, b.bpe(), false);
    LayerDef d = finish(b, "criterion", "criterion", {b.mse_loss(x, target)});
    d.is_criterion = true;
    out.push_back(std::move(d));
    return out;
  }
  {
    Builder b(s);
    const int x = b.input(T * h, b.stream_bpe(), true);
    const int y = s.tied_head ? b.tied_linear("lm_head", x, T, h, V) : b.linear("lm_head", x, T, h, V, false);
    LayerDef d = finish(b, "lm_head", "lm_head", {y});
    if (s.tied_head) d.resident_params = static_cast<std::int64_t>(V * h);
    chunk_logits(d, (T - 1) * V, s.loss_chunks);
    out.push_back(std::move(d));
  }
  {
    Builder b(s);
    const int logits = b.input(T * V, b.bpe(), true);
    int x = logits;
    double rows = T;
    if (eager_ops(s)) {  // logits[..., :-1, :].contiguous()
      rows = T - 1;
      x = b.slice_copy("shift_logits", logits, rows * V);
    }
    LayerDef d = finish(b, "criterion", "criterion", {b.cross_entropy(x, rows, V)});
    d.is_criterion = true;
    chunk_logits(d, (T - 1) * V, s.loss_chunks);
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<LayerDef> bert_layers(const AnalyticSpec& s) {
  const double T = s.seq_len, h = s.hidden, V = s.vocab;
  std::vector<LayerDef> out;
  {
    Builder b(s);
    const int ids = b.input(T, kIdBytes, false);
    const int types = b.input(T, kIdBytes, false);
    const int mask = b.input(T, b.stream_bpe(), false);
    const int pos = b.tensor(0, kIdBytes, false, T);
    const int we = b.embedding("word_embeddings", ids, T, V, h);
    const int pe = b.embedding("position_embeddings", pos, T, T, h);
    const int te = b.embedding("token_type_embeddings", types, T, 2, h);
    const int e1 = b.add("words+positions", we, pe);
    const int e2 = b.add("+token_types", e1, te);
    const int n = b.layernorm("LayerNorm", e2, h);
    const int y = b.dropout("dropout", n);
    for (int held : {we, pe, te}) b.hold(held, y);  // Python variables until the function returns
    out.push_back(finish(b, "embedding", "embedding", {y, mask}));
  }
  // every block is the same graph (the last one passes no mask on, which changes no cost of its own)
  out.push_back(transformer_block(s, 0, true));
  for (int i = 1; i < s.layers; ++i) out.push_back(copy_of(out, 1, fmt::format("block{}", i)));
  if (s.bert_head == BertHead::Classifier) {
    {
      Builder b(s);
      const int x = b.input(T * h, b.stream_bpe(), true);
      const int first = b.slice_copy("first_token", x, h);
      const int d = b.linear("pooler.dense", first, 1, h, h, true);
      out.push_back(finish(b, "pooler", "pooler", {b.unary("tanh", d, 2, {3})}));
    }
    {
      Builder b(s);
      const int x = b.input(h, b.bpe(), true);
      out.push_back(finish(b, "classifier", "classifier", {b.linear("classifier", x, 1, h, s.labels, true)}));
    }
    Builder b(s);
    const int logits = b.input(s.labels, b.bpe(), true);
    LayerDef d = finish(b, "criterion", "criterion", {b.cross_entropy(logits, 1, s.labels)});
    d.is_criterion = true;
    out.push_back(std::move(d));
    return out;
  }
  {
    Builder b(s);
    const int x = b.input(T * h, b.stream_bpe(), true);
    const int t = b.linear("transform.dense", x, T, h, h, true);
    const int g = gelu(b, s, t, false);
    const int n = b.layernorm("transform.LayerNorm", g, h);
    const std::int64_t owned = b.params;
    int y = s.tied_head ? b.tied_linear("decoder", n, T, h, V) : b.linear("decoder", n, T, h, V, false);
    // the decoder's bias (V) is the head's own parameter
    y = b.add("decoder.bias", y, b.tensor(0, b.bpe(), false, V));
    b.params += static_cast<std::int64_t>(V);
    ++b.param_tensors;
    if (V > Layer::kZero3PersistenceElements) ++b.gathered_modules;
    LayerDef d = finish(b, "mlm_head", "mlm_head", {y});
    if (s.tied_head) d.resident_params = owned + static_cast<std::int64_t>(V) + static_cast<std::int64_t>(V * h);
    out.push_back(std::move(d));
  }
  Builder b(s);
  const int logits = b.input(T * V, b.bpe(), true);
  LayerDef d = finish(b, "criterion", "criterion", {b.cross_entropy(logits, T, V)});
  d.is_criterion = true;
  out.push_back(std::move(d));
  return out;
}

std::array<int, 4> resnet_blocks(int depth) {
  if (depth == 50) return {3, 4, 6, 3};
  if (depth == 101) return {3, 4, 23, 3};
  return {3, 8, 36, 3};  // 152
}

std::vector<LayerDef> resnet_layers(const AnalyticSpec& s) {
  std::vector<LayerDef> out;
  double hw = s.image_size;  // spatial side
  {
    Builder b(s);
    const int img = b.input(3 * hw * hw, s.autocast ? 4.0 : b.bpe(), false);  // autocast: FP32 data
    hw = std::floor((hw + 2 * 3 - 7) / 2 + 1);
    const int c = b.conv("conv1", img, 3, 64, 7, hw * hw);
    const int n = b.batchnorm("bn1", c, 64);
    const int r = b.relu_("relu", n);
    hw = std::floor((hw + 2 * 1 - 3) / 2 + 1);
    out.push_back(finish(b, "stem", "stem", {b.maxpool("maxpool", r, 64, hw * hw)}));
  }
  const std::array<int, 4> blocks = resnet_blocks(s.layers);
  double cin = 64;
  int index = 0;
  for (int stage = 0; stage < 4; ++stage) {
    const double mid = 64.0 * std::pow(2.0, stage);
    for (int i = 0; i < blocks[static_cast<std::size_t>(stage)]; ++i) {
      const double stride = (i == 0 && stage > 0) ? 2 : 1;
      const double in_hw = hw;
      const double out_hw = std::floor((in_hw - 1) / stride + 1);
      if (i >= 2) {  // the same graph as the stage's second block
        out.push_back(copy_of(out, out.size() - static_cast<std::size_t>(i - 1), fmt::format("block{}", index++)));
        continue;
      }
      Builder b(s);
      const int x = b.input(cin * in_hw * in_hw, b.bpe(), true);
      int y = b.relu_("relu1", b.batchnorm("bn1", b.conv("conv1", x, cin, mid, 1, in_hw * in_hw), mid));
      y = b.relu_("relu2", b.batchnorm("bn2", b.conv("conv2", y, mid, mid, 3, out_hw * out_hw), mid));
      y = b.batchnorm("bn3", b.conv("conv3", y, mid, 4 * mid, 1, out_hw * out_hw), 4 * mid);
      int identity = x;
      if (i == 0)
        identity = b.batchnorm("downsample.bn", b.conv("downsample", x, cin, 4 * mid, 1, out_hw * out_hw), 4 * mid);
      const int sum = b.add("residual", y, identity);
      out.push_back(finish(b, fmt::format("block{}", index++), "bottleneck", {b.relu_("relu3", sum)}));
      cin = 4 * mid;
      hw = out_hw;
    }
  }
  {
    Builder b(s);
    const int x = b.input(cin * hw * hw, b.bpe(), true);
    const int p = b.avgpool("avgpool", x, cin);
    out.push_back(finish(b, "head", "head", {b.linear("fc", p, 1, cin, s.classes, true)}));
  }
  Builder b(s);
  const int logits = b.input(s.classes, b.bpe(), true);
  LayerDef d = finish(b, "criterion", "criterion", {b.cross_entropy(logits, 1, s.classes)});
  d.is_criterion = true;
  out.push_back(std::move(d));
  return out;
}

std::vector<LayerDef> build_layers(const AnalyticSpec& s) {
  switch (s.family) {
    case ModelFamily::Gpt:
      return gpt_layers(s);
    case ModelFamily::Bert:
      return bert_layers(s);
    case ModelFamily::Resnet:
      return resnet_layers(s);
    case ModelFamily::Llama:
      return llama_layers(s);
    case ModelFamily::Neox:
      return neox_layers(s);
  }
  return {};
}

// ------------------------------------------------------------------------------------------------
// Costs

struct Rates {
  double peak_flops = 0, gemm_max = 0, gemm_half = 0, mem_bw = 0, vec_eff = 0, floor_s = 0;
  double fwd_overhead_s = 0, bwd_overhead_s = 0;  // a layer's fixed call costs (GpuRates; none for an engine)
};

double kernel_time_s(const Kernel& k, double u, const Rates& r) {
  const double bytes = k.fixed_bytes + k.per_sample_bytes * u;
  double t = bytes / (r.mem_bw * r.vec_eff);
  if (k.gemm) {
    const double flops = k.flops(u);
    const double eff = r.gemm_max * flops / (flops + r.gemm_half);
    t = std::max(t, flops / (r.peak_flops * eff));
  }
  return std::max(t, r.floor_s);
}

struct LayerCosts {
  std::vector<double> fwd_s, bwd_s;
  std::vector<Bytes> fwd_peak, bwd_peak, bwd_transient, saved;
};

LayerCosts layer_costs(const LayerDef& d, const std::vector<int>& sizes, const Rates& r, double resident_bytes) {
  LayerCosts c;
  for (int ui : sizes) {
    const auto u = static_cast<double>(ui);
    double fwd = r.fwd_overhead_s;
    double bwd = r.bwd_overhead_s;
    for (const Op& op : d.graph.ops) {
      for (const Kernel& k : op.fwd) fwd += kernel_time_s(k, u, r);
      for (const Kernel& k : op.bwd) bwd += kernel_time_s(k, u, r);
    }
    c.fwd_s.push_back(fwd);
    c.bwd_s.push_back(fwd + bwd);  // the profile's backward includes the recomputed forward
    const double f = peak_nograd(d.graph, u);
    const BackwardPeak b = peak_backward(d.graph, u);
    c.fwd_peak.push_back(static_cast<Bytes>(std::llround(resident_bytes + f)));
    c.bwd_peak.push_back(static_cast<Bytes>(std::llround(resident_bytes + b.peak)));
    c.bwd_transient.push_back(static_cast<Bytes>(std::llround(b.transient)));
    c.saved.push_back(static_cast<Bytes>(std::llround(b.saved)));
  }
  return c;
}

// The paper testbed's PyTorch Adam step, fitted to the bundled GPT-2 Medium profile (docs/validation.md).
constexpr double kDefaultAdamBytesPerS = 3.6e9;
constexpr double kDefaultAdamLayerS = 340e-6;

// Whether the optimizer steps FP32 parameters and state (FP32, or 2-byte weights with FP32 masters).
bool fp32_optimizer(const AnalyticSpec& s) { return s.dtype == DType::Fp32 || s.master_weights; }

// Optimizer state bytes per parameter (CPU side) and the step's cost relative to Adam's (memory traffic:
// Adam reads and writes the parameter and two moments and reads the gradient, 7 x 4 bytes). Mixed precision adds
// the FP32 master; pure 2-byte training keeps the moments in the weights' 2 bytes and no master.
double state_bytes_per_param(const AnalyticSpec& s) {
  // (autocast: the FP32 parameters on the GPU are the masters; the state holds the moments only)
  const double master = s.dtype == DType::Fp32 || !s.master_weights || s.autocast ? 0.0 : 4.0;
  const double moment = fp32_optimizer(s) ? 4.0 : 2.0;
  switch (s.optimizer) {
    case OptimizerKind::Adam:
      return 2 * moment + master;
    case OptimizerKind::Momentum:
      return moment + master;
    case OptimizerKind::Sgd:
      return master;
  }
  return 0;
}
double step_cost_vs_adam(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::Adam:
      return 1.0;
    case OptimizerKind::Momentum:
      return 5.0 / 7.0;
    case OptimizerKind::Sgd:
      return 3.0 / 7.0;
  }
  return 1.0;
}

std::string family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::Gpt:
      return "gpt";
    case ModelFamily::Bert:
      return "bert";
    case ModelFamily::Resnet:
      return "resnet";
    case ModelFamily::Llama:
      return "llama";
    case ModelFamily::Neox:
      return "neox";
  }
  return "?";
}

std::string derived_name(const AnalyticSpec& s) {
  if (s.family == ModelFamily::Resnet) return fmt::format("resnet{}", s.layers);
  return fmt::format("{}_L{}_h{}_s{}", family_name(s.family), s.layers, s.hidden, s.seq_len);
}

// ------------------------------------------------------------------------------------------------
// Units

std::optional<double> parse_scaled(std::string_view text, std::string_view unit) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  if (text.empty() || !((text.front() >= '0' && text.front() <= '9') || text.front() == '.')) return std::nullopt;
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || !std::isfinite(value)) return std::nullopt;
  std::string_view rest(ptr, static_cast<std::size_t>(text.data() + text.size() - ptr));
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  double scale = 1;
  if (!rest.empty()) {
    static constexpr std::pair<char, double> kPrefixes[] = {
        {'k', 1e3}, {'M', 1e6}, {'G', 1e9}, {'T', 1e12}, {'P', 1e15}};
    for (const auto& [p, sc] : kPrefixes) {
      if (rest.front() == p) {
        scale = sc;
        rest.remove_prefix(1);
        break;
      }
    }
    if (rest != unit) return std::nullopt;
  }
  const double v = value * scale;
  if (!(v > 0) || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

std::optional<double> parse_flops_per_s(std::string_view text) { return parse_scaled(text, "FLOP/s"); }
std::optional<double> parse_flop_count(std::string_view text) { return parse_scaled(text, "FLOP"); }

namespace {

AnalyticSpec shape(ModelFamily f, int layers, int hidden, int heads, int seq, int vocab, const char* name) {
  AnalyticSpec s;
  s.family = f;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.seq_len = seq;
  s.vocab = vocab;
  s.name = name;
  return s;
}

// Shapes: GPT-2 (Radford et al. 2019, Hugging Face configs), GPT-3 (Brown et al. 2020, Table 2.1; 1.3B with
// 16 heads of 128 and 13B with d_model 5120, as the table's own numbers do not divide), BERT (Devlin et al.
// 2019), ResNet (He et al. 2016; torchvision v1.5).
std::vector<std::pair<std::string, AnalyticSpec>> presets() {
  constexpr int kGpt2Vocab = 50257, kBertVocab = 30522;
  std::vector<std::pair<std::string, AnalyticSpec>> p = {
      {"gpt2-small", shape(ModelFamily::Gpt, 12, 768, 12, 1024, kGpt2Vocab, "gpt2-small")},
      {"gpt2-medium", shape(ModelFamily::Gpt, 24, 1024, 16, 1024, kGpt2Vocab, "gpt2-medium")},
      {"gpt2-large", shape(ModelFamily::Gpt, 36, 1280, 20, 1024, kGpt2Vocab, "gpt2-large")},
      {"gpt2-xl", shape(ModelFamily::Gpt, 48, 1600, 25, 1024, kGpt2Vocab, "gpt2-xl")},
      {"gpt3-1.3b", shape(ModelFamily::Gpt, 24, 2048, 16, 2048, kGpt2Vocab, "gpt3-1.3b")},
      {"gpt3-2.7b", shape(ModelFamily::Gpt, 32, 2560, 32, 2048, kGpt2Vocab, "gpt3-2.7b")},
      {"gpt3-6.7b", shape(ModelFamily::Gpt, 32, 4096, 32, 2048, kGpt2Vocab, "gpt3-6.7b")},
      {"gpt3-13b", shape(ModelFamily::Gpt, 40, 5120, 40, 2048, kGpt2Vocab, "gpt3-13b")},
      {"gpt3-175b", shape(ModelFamily::Gpt, 96, 12288, 96, 2048, kGpt2Vocab, "gpt3-175b")},
      {"bert-base", shape(ModelFamily::Bert, 12, 768, 12, 512, kBertVocab, "bert-base")},
      {"bert-large", shape(ModelFamily::Bert, 24, 1024, 16, 512, kBertVocab, "bert-large")},
  };
  for (int depth : {50, 101, 152}) {
    AnalyticSpec r;
    r.family = ModelFamily::Resnet;
    r.layers = depth;
    r.name = fmt::format("resnet{}", depth);
    p.emplace_back(r.name, r);
  }
  for (auto& l : llama_presets()) p.push_back(std::move(l));
  return p;
}

}  // namespace

std::optional<AnalyticSpec> analytic_preset(std::string_view name) {
  for (auto& [n, s] : presets()) {
    if (n == name) return s;
  }
  return std::nullopt;
}

std::vector<std::string> analytic_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.first);
  return names;
}

std::string analytic_spec_problem(const AnalyticSpec& s) {
  constexpr int kMaxDim = 1 << 20;
  if (s.ubatch_sizes.empty()) return "ubatch_sizes is empty";
  for (std::size_t i = 0; i < s.ubatch_sizes.size(); ++i) {
    if (s.ubatch_sizes[i] < 1) return fmt::format("ubatch_sizes[{}] = {} is not positive", i, s.ubatch_sizes[i]);
    if (i > 0 && s.ubatch_sizes[i] <= s.ubatch_sizes[i - 1])
      return fmt::format("ubatch_sizes must be strictly ascending ({} follows {})", s.ubatch_sizes[i],
                         s.ubatch_sizes[i - 1]);
  }
  if (s.layers_per_block != 1 && s.layers_per_block != 2)
    return fmt::format("layers_per_block must be 1 or 2, got {}", s.layers_per_block);
  if (s.loss_chunks < 1) return fmt::format("loss_chunks must be at least 1, got {}", s.loss_chunks);
  if (s.loss_chunks > 1 && (s.family == ModelFamily::Bert || s.family == ModelFamily::Resnet ||
                            (s.family == ModelFamily::Gpt && s.gpt_head == GptHead::None)))
    return "loss_chunks applies to a language model's LM head and loss (gpt with head lm, llama, neox)";
  if (s.layers_per_block == 2 && s.family != ModelFamily::Gpt)
    return "layers_per_block 2 (a block's attention and MLP halves) is for the gpt family only";
  const bool decoder = s.family == ModelFamily::Llama || s.family == ModelFamily::Neox;
  if (s.family != ModelFamily::Llama && (s.head_dim != 0 || s.qk_norm))
    return "head_dim and qk_norm are for family llama";
  if (!decoder && (s.kv_heads != 0 || s.attn_bias != AttnBias::None || s.mlp_bias || s.sliding_window != 0 || !s.rope ||
                   s.rope_dims != 0 || !s.parallel_residual || s.act != MlpActivation::Gelu))
    return "kv_heads, attn_bias, mlp_bias, sliding_window, rope, rope_dims, parallel_residual and act are for the "
           "llama and neox families";
  if (s.positions != 0 && s.family != ModelFamily::Gpt)
    return "positions (the position table's rows) is for family gpt";
  if (decoder && s.gpt_head != GptHead::Lm) return "head none is for family gpt (llama and neox have their LM head)";
  if (s.family == ModelFamily::Resnet) {
    if (s.layers != 50 && s.layers != 101 && s.layers != 152)
      return fmt::format("resnet depth (layers) must be 50, 101 or 152, got {}", s.layers);
    if (s.image_size < 32 || s.image_size > 8192) return fmt::format("image_size {} is outside 32..8192", s.image_size);
    if (s.classes < 1 || s.classes > kMaxDim) return fmt::format("classes {} is outside 1..{}", s.classes, kMaxDim);
    return {};
  }
  if (s.layers < 1 || s.layers > 10000) return fmt::format("layers {} is outside 1..10000", s.layers);
  if (s.hidden < 1 || s.hidden > kMaxDim) return fmt::format("hidden {} is outside 1..{}", s.hidden, kMaxDim);
  if (s.heads < 1 || s.heads > s.hidden) return fmt::format("heads {} is outside 1..hidden ({})", s.heads, s.hidden);
  if (s.head_dim == 0 && s.hidden % s.heads != 0)
    return fmt::format("heads ({}) must divide hidden ({}), or head_dim given", s.heads, s.hidden);
  if (s.head_dim < 0 || s.head_dim > kMaxDim) return fmt::format("head_dim {} is outside 1..{}", s.head_dim, kMaxDim);
  if (s.ffn < 0 || s.ffn > 4 * kMaxDim) return fmt::format("ffn {} is out of range", s.ffn);
  if (s.seq_len < 2 || s.seq_len > kMaxDim) return fmt::format("seq_len {} is outside 2..{}", s.seq_len, kMaxDim);
  if (s.vocab < 2 || s.vocab > 16 * kMaxDim) return fmt::format("vocab {} is outside 2..{}", s.vocab, 16 * kMaxDim);
  if (s.family == ModelFamily::Bert && s.bert_head == BertHead::Classifier && (s.labels < 1 || s.labels > kMaxDim))
    return fmt::format("labels {} is outside 1..{}", s.labels, kMaxDim);
  if (s.positions != 0 && (s.positions < s.seq_len || s.positions > kMaxDim))
    return fmt::format("positions {} is outside seq_len ({})..{}: the position table needs a row per token",
                       s.positions, s.seq_len, kMaxDim);
  if (decoder) return llama_spec_problem(s);
  return {};
}

std::vector<AnalyticLayerInfo> analytic_layer_info(const AnalyticSpec& spec) {
  if (const std::string p = analytic_spec_problem(spec); !p.empty()) throw ScheduleError("analytic model: " + p);
  const std::vector<LayerDef> layers = build_layers(spec);
  std::vector<AnalyticLayerInfo> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerDef& d = layers[i].copy_of >= 0 ? layers[static_cast<std::size_t>(layers[i].copy_of)] : layers[i];
    AnalyticLayerInfo info;
    info.kind = layers[i].kind;
    info.param_count = d.owned_params;
    std::vector<char> counted(d.graph.tensors.size(), 0);
    for (const Op& op : d.graph.ops) {
      for (int t : op.saved) {
        if (counted[static_cast<std::size_t>(t)]) continue;
        counted[static_cast<std::size_t>(t)] = 1;
        const Tensor& x = d.graph.tensors[static_cast<std::size_t>(t)];
        info.saved_bytes_per_sample += x.per_sample * x.bpe;
      }
    }
    for (const Op& op : d.graph.ops) {
      for (const Kernel& k : op.fwd) {
        if (k.gemm) info.fwd_flops_per_sample += k.flops(1.0);
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

namespace {

// The CPU step's rate, in bytes of its parameters per second. A mixed-precision model's step takes its gradients in and
// hands its weights out in the 2-byte type: the rate measured with those casts fused (cpu_adam.bandwidth_bf16 / _fp16,
// `harmony-run probe`) where the machine gives one. A pure 2-byte step casts nothing: the plain rate over its 2-byte
// tensors (half the FP32 step's bytes). PyTorch's own optimizer on CPU tensors (cpu_optimizer: torch): FSDP casts on
// the GPU, so its step has no fused casts to price; its rate, or the plain rate over the published gap
// (kTorchCpuAdamSlowdown). Under autocast the gradients and weights cross in FP32: nothing to cast, the plain rate.
double cpu_step_bytes_per_s(const AnalyticSpec& spec, const CpuAdam& cpu) {
  const double plain_bps = cpu.bytes_per_s > 0 ? cpu.bytes_per_s : kDefaultAdamBytesPerS;
  if (spec.cpu_optimizer == CpuOptimizerImpl::Torch)
    return cpu.torch_bytes_per_s > 0 ? cpu.torch_bytes_per_s : plain_bps / kTorchCpuAdamSlowdown;
  const double cast_bps = !fp32_optimizer(spec) || spec.autocast ? 0.0
                          : spec.dtype == DType::Bf16            ? cpu.bf16_bytes_per_s
                          : spec.dtype == DType::Fp16            ? cpu.fp16_bytes_per_s
                                                                 : 0.0;
  return cast_bps > 0 ? cast_bps : plain_bps;
}

// torch.optim.AdamW's foreach step on the GPU (gpu_optimizer: foreach; 0 for the fused default), in HBM bytes per
// parameter, counted from torch/optim/adam.py _multi_tensor_adam with decoupled weight decay, each _foreach_ op reading
// and writing whole tensors: mul_(params) 2, lerp_(exp_avgs, grads) 3, mul_(exp_avg_sqs) 2, addcmul_(exp_avg_sqs,
// grads, grads) 3, sqrt(exp_avg_sqs) 2, div_ 2, add_(eps) 2, addcdiv_(params, exp_avgs, denom) 4: 20 tensor passes of
// the state's element size (80 bytes in FP32, 40 in pure 2-byte training). With 2-byte weights and FP32 masters (not
// autocast) the updated masters are also copied into the working weights (4 read, 2 written).
std::int64_t foreach_adamw_bytes_per_param(const AnalyticSpec& spec) {
  if (spec.gpu_optimizer != GpuOptimizerImpl::Foreach) return 0;
  if (!fp32_optimizer(spec)) return 40;
  const bool two_byte_weights = spec.dtype != DType::Fp32 && !spec.autocast;
  return 80 + (two_byte_weights ? 6 : 0);
}

// The rates a layer's kernels are priced at: the GPU's peak for the model's dtype, how close GEMMs and elementwise
// kernels come to it, and the fixed costs, as the trainer (AnalyticSpec::trainer) reaches them.
Rates rates_for(const AnalyticSpec& spec, const GpuRates& gpu) {
  Rates r;
  if (spec.tf32 && spec.dtype != DType::Fp32)
    throw ScheduleError("analytic model: tf32 (FP32 GEMMs on TF32 tensor cores) needs dtype fp32");
  if (spec.tf32 && gpu.matrix_tf32_flops_per_s <= 0)
    throw ScheduleError("analytic model: tf32 needs the machine's gpu_rates.matrix_tf32");
  // TF32 GEMMs run on the tensor cores, at the tensor-core efficiency (ASSUMED to carry from the 2-byte GEMMs it was
  // measured on to TF32's own peak; docs/machines.md, matrix_tf32) and, for an engine, the ceiling.
  const bool cuda_cores = !spec.tf32 && (spec.dtype == DType::Fp32 || gpu.matrix_fp16_flops_per_s <= 0);
  r.peak_flops = spec.tf32    ? gpu.matrix_tf32_flops_per_s
                 : cuda_cores ? gpu.matrix_fp32_flops_per_s
                              : gpu.matrix_fp16_flops_per_s;
  r.gemm_max = gpu.gemm_efficiency_max > 0 ? gpu.gemm_efficiency_max : 1.0;
  r.gemm_half = gpu.gemm_half_flops;
  // An FP32 model's GEMMs run on the CUDA cores: their own efficiency where the machine gives one (a tensor-core
  // calibration says nothing of them; docs/machines.md, gemm_efficiency_fp32).
  if (!spec.tf32 && spec.dtype == DType::Fp32 && gpu.gemm_fp32_efficiency_max > 0) {
    r.gemm_max = gpu.gemm_fp32_efficiency_max;
    r.gemm_half = gpu.gemm_fp32_half_flops;
  }
  // A hand-written engine's tensor-core GEMMs reach the measured ceiling (AnalyticSpec::trainer); its FP32 GEMMs keep
  // the CUDA-core efficiency (the ceiling is a tensor-core measurement).
  const bool engine = spec.trainer == Trainer::Engine;
  if (engine && gpu.gemm_ceiling <= 0)
    throw ScheduleError("analytic model: trainer: engine needs the machine's gpu_rates.gemm_ceiling");
  if (engine && !cuda_cores) r.gemm_max = gpu.gemm_ceiling;
  r.fwd_overhead_s = engine ? 0.0 : gpu.forward_overhead_s;  // no framework dispatch in an engine's step
  r.bwd_overhead_s = engine ? 0.0 : gpu.backward_overhead_s;
  r.mem_bw = gpu.memory_bytes_per_s;
  r.vec_eff = gpu.vector_efficiency > 0 ? gpu.vector_efficiency : 1.0;
  r.floor_s = gpu.kernel_floor_s;
  return r;
}

}  // namespace

Model analytic_model(const AnalyticSpec& spec, const GpuRates& gpu, const CpuAdam& cpu) {
  if (const std::string p = analytic_spec_problem(spec); !p.empty()) throw ScheduleError("analytic model: " + p);
  // (not a spec problem: the config's dtype may be chosen by the machine after parsing; load_model locates it)
  if (!spec.master_weights && spec.dtype == DType::Fp32)
    throw ScheduleError("analytic model: master_weights: false (pure 2-byte training) needs dtype fp16 or bf16");
  if (spec.autocast && spec.dtype == DType::Fp32)
    throw ScheduleError("analytic model: autocast (FP32 parameters, GEMMs in a 2-byte type) needs dtype fp16 or bf16");
  if (spec.autocast && !spec.master_weights)
    throw ScheduleError(
        "analytic model: autocast keeps FP32 parameters, and master_weights: false (pure 2-byte training) has none");
  if (!gpu.valid())
    throw ScheduleError("analytic model: the machine has no gpu_rates (matrix_fp32 and memory are required)");
  const Rates r = rates_for(spec, gpu);
  const bool fp32_step = fp32_optimizer(spec);
  const double step_bytes_per_param = fp32_step ? 4.0 : 2.0;
  const double adam_bps = cpu_step_bytes_per_s(spec, cpu);
  const double adam_layer_s = cpu.per_layer_s > 0 ? cpu.per_layer_s : kDefaultAdamLayerS;
  const double bpe = param_bytes(spec);  // the device weights' element size

  Model m;
  m.name = spec.name.empty() ? derived_name(spec) : spec.name;
  m.source = "analytic";
  m.fp32_optimizer = fp32_step;
  m.device_adamw_bytes_per_param = foreach_adamw_bytes_per_param(spec);
  m.ubatch_fwd = spec.ubatch_sizes;
  m.ubatch_bwd = spec.ubatch_sizes;

  const std::vector<LayerDef> defs = build_layers(spec);
  m.layers.reserve(defs.size());
  for (const LayerDef& d : defs) {
    if (d.copy_of >= 0) {
      Layer l = m.layers[static_cast<std::size_t>(d.copy_of)];
      l.name = d.name;
      m.layers.push_back(std::move(l));
      continue;
    }
    Layer l;
    l.name = d.name;
    l.is_criterion = d.is_criterion;
    l.param_count = d.owned_params;
    l.param_tensors = d.param_tensors;
    l.gathered_modules = d.gathered_modules;
    l.weight_bytes = static_cast<Bytes>(std::llround(static_cast<double>(d.resident_params) * bpe));
    l.buffer_bytes = static_cast<Bytes>(std::llround(d.buffer_bytes));
    l.optimizer_state_bytes =
        static_cast<Bytes>(std::llround(static_cast<double>(d.owned_params) * state_bytes_per_param(spec)));
    l.update_time_cpu_s = d.owned_params > 0 ? static_cast<double>(d.owned_params) * step_bytes_per_param / adam_bps *
                                                       step_cost_vs_adam(spec.optimizer) +
                                                   adam_layer_s
                                             : 0.0;
    double in_bytes = 0;
    for (int t : d.graph.inputs) in_bytes += d.graph.tensors[static_cast<std::size_t>(t)].bytes(1.0);
    l.input_bytes_per_sample = static_cast<Bytes>(std::llround(in_bytes));
    const LayerCosts c = layer_costs(d, spec.ubatch_sizes, r, static_cast<double>(l.weight_bytes + l.buffer_bytes));
    l.fwd_time_s = c.fwd_s;
    l.bwd_time_s = c.bwd_s;
    l.fwd_peak_bytes = c.fwd_peak;
    l.bwd_peak_bytes = c.bwd_peak;
    l.bwd_transient_bytes = c.bwd_transient;
    l.saved_bytes = c.saved;
    m.layers.push_back(std::move(l));
  }
  m.validate();
  return m;
}

}  // namespace harmony::core
