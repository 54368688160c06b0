// Tests of the Llama-family and GPT-NeoX analytic models (core/model/analytic_llama.cpp), their model.analytic keys,
// and model.hf_config (core/config/config_hf.cpp): parameter counts of the named shapes against the checkpoints'
// published ones, FLOPs against the shape formulas, what grouped-query attention, biases, tied heads, the sliding
// window and the kernel styles change, Hugging Face config.json files of every supported model_type, and every
// bad input located at its file:line:column.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/analytic.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_dir;
using harmony::test::TempDir;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

AnalyticSpec preset(const char* name) {
  const auto s = analytic_preset(name);
  REQUIRE_MESSAGE(s.has_value(), "no analytic preset ", name);
  return *s;
}

std::int64_t total_params(const AnalyticSpec& s) {
  std::int64_t n = 0;
  for (const AnalyticLayerInfo& l : analytic_layer_info(s)) n += l.param_count;
  return n;
}

const GpuRates& h100() {
  static const GpuRates r = machine_preset("h100-sxm-8x").gpu_rates;
  return r;
}

// The parameters of a Llama-family model from its shape: per block the q, k, v, o projections (q and o of width
// heads x d, k and v of kv_heads x d), q/k/v biases (Qwen2), the gate, up and down projections, two RMSNorm gains;
// then the embedding, the final norm and an untied LM head.
std::int64_t llama_formula(std::int64_t L, std::int64_t h, std::int64_t nh, std::int64_t kv, std::int64_t f,
                           std::int64_t V, bool qkv_bias) {
  const std::int64_t d = h / nh, q = nh * d, k = kv * d;
  const std::int64_t block = h * q + 2 * h * k + q * h + (qkv_bias ? q + 2 * k : 0) + 3 * h * f + 2 * h;
  return L * block + V * h + h + V * h;
}

const std::string kPlan = "plan: {mode: harmony-pp, gpus: 2, minibatch: 16}\nmachine: h100-sxm-8x\n";

// A config naming `json` (written as DIR/m/config.json) with `extra` keys beside hf_config.
RunConfig load_hf(const TempDir& dir, const std::string& json, const std::string& extra = "") {
  dir.write("m/config.json", json);
  const std::string yaml = dir.write("run.yaml", "model: {hf_config: m/config.json" + extra + "}\n" + kPlan);
  return load_config(yaml);
}

ConfigError hf_error(const TempDir& dir, const std::string& json, const std::string& extra = "") {
  try {
    load_hf(dir, json, extra);
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError for:\n" << json);
  return ConfigError(SourceLoc{}, "");
}

// The error is in the config.json at line:column, with a hint.
void check_json_at(const ConfigError& e, const TempDir& dir, int line, int column) {
  INFO(std::string(e.what()));
  CHECK(e.loc().file == dir / "m/config.json");
  CHECK(e.loc().line == line);
  CHECK(e.loc().column == column);
  CHECK_FALSE(e.hint().empty());
}

ConfigError yaml_error(const std::string& yaml) {
  try {
    load_config_text(yaml, "bad.yaml");
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  return ConfigError(SourceLoc{}, "");
}

void check_yaml_at(const ConfigError& e, int line, int column) {
  INFO(std::string(e.what()));
  CHECK(e.loc().file == "bad.yaml");
  CHECK(e.loc().line == line);
  CHECK(e.loc().column == column);
  CHECK_FALSE(e.hint().empty());
}

// Llama-2-7B's config.json, as meta-llama/Llama-2-7b-hf ships it (transformers 4.3x fields). Line numbers below
// count from its first line.
const std::string kLlama2 = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

// kLlama2 with `key`'s line replaced by `line` (or, when `key` is absent from it, `line` added after the first).
std::string llama2_with(const std::string& key, const std::string& line) {
  std::string s = kLlama2;
  const std::size_t at = s.find("\"" + key + "\":");
  if (at == std::string::npos) return s.insert(2, line + "\n");
  const std::size_t start = s.rfind('\n', at) + 1, end = s.find('\n', at);
  return s.replace(start, end - start, line);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Named shapes: parameter counts exact against the checkpoints

TEST_CASE("ZeRO-3's gathered modules: a Llama block's seven projections in eager kernels, four when packed") {
  // Hugging Face's LlamaDecoderLayer: q, k, v, o, gate, up, down (Linears above DeepSpeed's 1e5-element persistence
  // threshold) and two RMSNorms of 4096 gains (persistent); fused and flash kernels pack qkv and gate_up
  AnalyticSpec s = preset("llama3-8b");
  s.seq_len = 256;
  s.ubatch_sizes = {1};
  s.kernels = KernelStyle::Eager;
  const Model eager = analytic_model(s, h100());
  CHECK(eager.layers[1].gathered_modules == 7);
  CHECK(eager.layers[1].param_tensors == 9);
  CHECK(eager.layers[0].gathered_modules == 1);   // the embedding
  CHECK(eager.layers[33].gathered_modules == 0);  // the final norm
  CHECK(eager.layers[34].gathered_modules == 1);  // lm_head
  s.kernels = KernelStyle::Fused;
  const Model fused = analytic_model(s, h100());
  CHECK(fused.layers[1].gathered_modules == 4);
  CHECK(fused.layers[1].param_tensors == 6);
}

TEST_CASE("projections: the code's q/k/v and gate/up layout whatever the kernels, the same parameters and FLOPs") {
  AnalyticSpec s = preset("llama3-8b");
  s.seq_len = 256;
  s.ubatch_sizes = {1};
  const auto block = [](const AnalyticSpec& x) { return analytic_layer_info(x)[1]; };
  for (KernelStyle k : {KernelStyle::Eager, KernelStyle::Fused, KernelStyle::Flash, KernelStyle::Sdpa}) {
    INFO(static_cast<int>(k));
    s.kernels = k;
    s.projections = Projections::Auto;
    const bool packed_by_default = k == KernelStyle::Fused || k == KernelStyle::Flash;
    const AnalyticLayerInfo base = block(s);
    for (Projections p : {Projections::Separate, Projections::Packed}) {
      s.projections = p;
      const AnalyticLayerInfo b = block(s);
      CHECK(b.param_count == base.param_count);
      CHECK(b.fwd_flops_per_sample == doctest::Approx(base.fwd_flops_per_sample).epsilon(1e-12));
      const Model m = analytic_model(s, h100());
      const bool packed = p == Projections::Packed;
      CHECK(m.layers[1].gathered_modules == (packed ? 4 : 7));
      CHECK(m.layers[1].param_tensors == (packed ? 6 : 9));
      if (packed == packed_by_default) {  // Auto's layout: the same graph, the same times
        s.projections = Projections::Auto;
        const Model a = analytic_model(s, h100());
        CHECK(a.layers[1].fwd_time_s == m.layers[1].fwd_time_s);
        CHECK(a.layers[1].bwd_time_s == m.layers[1].bwd_time_s);
      }
    }
  }
}

TEST_CASE("named shapes: each parameter count is the shape formula's and the published checkpoint's") {
  struct Published {
    const char* preset;
    std::int64_t L, h, nh, kv, f, V;
    bool qkv_bias;
    std::int64_t params;  // the sum of the checkpoint's tensor shapes, as the Hub's model pages give it
  };
  // Shapes from each model's config.json (core/model/analytic_llama.cpp cites the files).
  const Published models[] = {
      {"llama2-7b", 32, 4096, 32, 32, 11008, 32000, false, 6'738'415'616},
      {"llama2-13b", 40, 5120, 40, 40, 13824, 32000, false, 13'015'864'320},
      {"llama2-70b", 80, 8192, 64, 8, 28672, 32000, false, 68'976'648'192},
      {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, false, 8'030'261'248},
      {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, false, 70'553'706'496},
      {"mistral-7b", 32, 4096, 32, 8, 14336, 32000, false, 7'241'732'096},
      {"qwen2-7b", 28, 3584, 28, 4, 18944, 152064, true, 7'615'616'512},
  };
  for (const Published& m : models) {
    INFO(m.preset);
    const AnalyticSpec s = preset(m.preset);
    CHECK(s.family == ModelFamily::Llama);
    CHECK_FALSE(s.tied_head);
    CHECK(llama_formula(m.L, m.h, m.nh, m.kv, m.f, m.V, m.qkv_bias) == m.params);
    CHECK(total_params(s) == m.params);
    const std::vector<AnalyticLayerInfo> info = analytic_layer_info(s);
    REQUIRE(info.size() == static_cast<std::size_t>(m.L + 4));
    CHECK(info.front().kind == "embedding");
    CHECK(info.front().param_count == m.V * m.h);
    CHECK(info[1].kind == "block");
    CHECK(info[static_cast<std::size_t>(m.L) + 1].kind == "final_norm");
    CHECK(info[static_cast<std::size_t>(m.L) + 1].param_count == m.h);
    CHECK(info[static_cast<std::size_t>(m.L) + 2].kind == "lm_head");
    CHECK(info[static_cast<std::size_t>(m.L) + 2].param_count == m.V * m.h);
    CHECK(info.back().kind == "criterion");
  }
  CHECK(preset("mistral-7b").sliding_window == 4096);
  CHECK(preset("qwen2-7b").attn_bias == AttnBias::Qkv);
  // Qwen3-8B (its config.json: 36 layers, 4096 hidden, 32 heads of head_dim 128, 8 kv heads, 12288 intermediate,
  // 151936 vocab, untied): the llama formula plus q_norm and k_norm (head_dim each) per block.
  const AnalyticSpec q3 = preset("qwen3-8b");
  CHECK(q3.qk_norm);
  CHECK(total_params(q3) == llama_formula(36, 4096, 32, 8, 12288, 151936, false) + 36 * 2 * 128);
  CHECK(total_params(q3) == 8'190'735'360);
  CHECK(preset("llama3-8b").seq_len == 8192);
}

TEST_CASE("FLOPs: the projections, SwiGLU and attention GEMMs of the shape formula in every kernel style") {
  for (const char* name : {"llama2-7b", "llama3-8b", "qwen2-7b"}) {
    AnalyticSpec s = preset(name);
    s.seq_len = 2048;
    const double T = s.seq_len, h = s.hidden, nh = s.heads, V = s.vocab, f = s.ffn;
    const double d = h / nh, kv = s.kv_heads > 0 ? s.kv_heads : nh;
    // per sample: 2 T (h q + 2 h k + q h + 3 h f) in the projections, 4 T^2 q in q k^T and p v; 2 T h V in the head
    const double block = 2 * T * (h * nh * d + 2 * h * kv * d + nh * d * h + 3 * h * f) + 4 * T * T * nh * d;
    for (KernelStyle k : {KernelStyle::Eager, KernelStyle::Fused, KernelStyle::Flash, KernelStyle::Sdpa}) {
      INFO(name, " style ", static_cast<int>(k));
      s.kernels = k;
      const std::vector<AnalyticLayerInfo> info = analytic_layer_info(s);
      CHECK(info[0].fwd_flops_per_sample == 0);
      CHECK(info[1].fwd_flops_per_sample == doctest::Approx(block).epsilon(1e-12));
      CHECK(info[info.size() - 2].fwd_flops_per_sample == doctest::Approx(2 * T * h * V).epsilon(1e-12));
      CHECK(info.back().fwd_flops_per_sample == 0);
    }
  }
}

TEST_CASE("sliding window: flash attends to the window's keys only; eager and fused mask a full T x T") {
  AnalyticSpec s = preset("mistral-7b");  // window 4096
  s.seq_len = 8192;
  const double T = 8192, W = 4096, q = 4096;
  const double dense = 2 * T * (4096.0 * q + 2 * 4096.0 * 1024 + q * 4096 + 3 * 4096.0 * 14336);
  s.kernels = KernelStyle::Flash;
  CHECK(analytic_layer_info(s)[1].fwd_flops_per_sample == doctest::Approx(dense + 4 * T * W * q).epsilon(1e-12));
  s.kernels = KernelStyle::Fused;
  CHECK(analytic_layer_info(s)[1].fwd_flops_per_sample == doctest::Approx(dense + 4 * T * T * q).epsilon(1e-12));
  s.kernels = KernelStyle::Flash;
  s.ubatch_sizes = {1};
  const Model windowed = analytic_model(s, h100());
  s.sliding_window = 0;
  const Model full = analytic_model(s, h100());
  CHECK(windowed.layers[1].fwd_time_s[0] < full.layers[1].fwd_time_s[0]);
  CHECK(windowed.layers[1].bwd_time_s[0] < full.layers[1].bwd_time_s[0]);
  CHECK(windowed.layers[1].bwd_peak_bytes == full.layers[1].bwd_peak_bytes);  // flash keeps no scores either way
  // A window at least as long as the sequence changes nothing.
  s.seq_len = 2048;
  const Model no_window = analytic_model(s, h100());
  s.sliding_window = 4096;
  CHECK(analytic_model(s, h100()).layers[1].fwd_time_s == no_window.layers[1].fwd_time_s);
}

TEST_CASE("grouped-query attention: smaller k and v projections, no repeat in flash, the same query FLOPs") {
  AnalyticSpec s = preset("llama3-8b");  // 32 query heads, 8 key/value heads
  s.seq_len = 1024;
  s.dtype = DType::Bf16;
  s.ubatch_sizes = {2};
  AnalyticSpec mha = s;
  mha.kv_heads = 0;
  const double h = 4096;
  CHECK(analytic_layer_info(mha)[1].param_count - analytic_layer_info(s)[1].param_count ==
        static_cast<std::int64_t>(2 * h * (4096 - 1024)));
  for (KernelStyle k : {KernelStyle::Eager, KernelStyle::Fused, KernelStyle::Flash, KernelStyle::Sdpa}) {
    INFO("style ", static_cast<int>(k));
    s.kernels = mha.kernels = k;
    const Model g = analytic_model(s, h100());
    const Model m = analytic_model(mha, h100());
    CHECK(g.layers[1].weight_bytes < m.layers[1].weight_bytes);
    CHECK(g.layers[1].fwd_time_s[0] < m.layers[1].fwd_time_s[0]);
    CHECK(g.layers[1].bwd_peak_bytes[0] <= m.layers[1].bwd_peak_bytes[0]);
  }
  // Flash saves q, k, v at their own widths: per sample 2 x T x (h - kv d) bytes less for k alone (bf16), and
  // the packed qkv shrinks by as much again for k and v.
  s.kernels = mha.kernels = KernelStyle::Flash;
  const double T = 1024, kvd = 1024;
  CHECK(analytic_layer_info(mha)[1].saved_bytes_per_sample - analytic_layer_info(s)[1].saved_bytes_per_sample ==
        doctest::Approx(2 * T * (h - kvd) * (1 + 2)));
}

TEST_CASE("sdpa: eager's block but the attention core, k and v repeated for it; eager's FLOPs, no T x T tensor") {
  AnalyticSpec s = preset("llama3-8b");  // 32 query heads of 128, 8 key/value heads
  s.seq_len = 1024;
  s.dtype = DType::Bf16;
  s.ubatch_sizes = {1, 2};
  const std::vector<AnalyticLayerInfo> eager_info = analytic_layer_info(s);
  const Model eager = analytic_model(s, h100());
  s.kernels = KernelStyle::Sdpa;
  const std::vector<AnalyticLayerInfo> sdpa_info = analytic_layer_info(s);
  const Model sdpa = analytic_model(s, h100());
  s.kernels = KernelStyle::Flash;
  const std::vector<AnalyticLayerInfo> flash_info = analytic_layer_info(s);
  const double T = 1024, nh = 32, q = 4096, kv = 1024, bpe = 2;
  for (std::size_t i = 0; i < eager_info.size(); ++i) {
    CHECK(sdpa_info[i].fwd_flops_per_sample == doctest::Approx(eager_info[i].fwd_flops_per_sample).epsilon(1e-12));
    CHECK(sdpa_info[i].param_count == eager_info[i].param_count);
  }
  // Eager keeps the FP32 probabilities (softmax's output) and the bf16 ones (p v's input): heads T^2 (4 + 2) bytes;
  // sdpa its output o (T q) and the log-sum-exp (T heads FP32). Both keep q and the repeated k and v.
  CHECK(eager_info[1].saved_bytes_per_sample - sdpa_info[1].saved_bytes_per_sample ==
        doctest::Approx(nh * T * T * (4 + 2) - T * q * bpe - 4 * T * nh));
  // Against flash: eager's RMSNorm copies, the rotary halves and the separate projections are kept, and k and v
  // are saved at every query head (repeat_kv) where FlashAttention-2 reads the kv heads.
  CHECK(sdpa_info[1].saved_bytes_per_sample > flash_info[1].saved_bytes_per_sample + 2 * T * (q - kv) * bpe);
  for (std::size_t u = 0; u < 2; ++u) {
    CHECK(sdpa.layers[1].bwd_peak_bytes[u] + static_cast<Bytes>((u + 1) * nh * T * T * 4) <=
          eager.layers[1].bwd_peak_bytes[u]);
    CHECK(sdpa.layers[1].fwd_time_s[u] < eager.layers[1].fwd_time_s[u]);
  }
  // embedding, final norm, head and the FP32 criterion are eager's
  for (std::size_t i : {std::size_t{0}, std::size_t{33}, std::size_t{34}, std::size_t{35}}) {
    CHECK(sdpa.layers[i].fwd_time_s == eager.layers[i].fwd_time_s);
    CHECK(sdpa.layers[i].bwd_time_s == eager.layers[i].bwd_time_s);
    CHECK(sdpa.layers[i].fwd_peak_bytes == eager.layers[i].fwd_peak_bytes);
  }
}

TEST_CASE("sdpa with a sliding window: every key, as eager (the window is a mask the kernel reads and keeps)") {
  AnalyticSpec s = preset("mistral-7b");  // window 4096
  s.seq_len = 8192;
  s.kernels = KernelStyle::Sdpa;
  const double T = 8192, q = 4096;
  const double dense = 2 * T * (4096.0 * q + 2 * 4096.0 * 1024 + q * 4096 + 3 * 4096.0 * 14336);
  CHECK(analytic_layer_info(s)[1].fwd_flops_per_sample == doctest::Approx(dense + 4 * T * T * q).epsilon(1e-12));
  s.ubatch_sizes = {1};
  s.dtype = DType::Bf16;
  const Model windowed = analytic_model(s, h100());
  s.sliding_window = 0;
  const Model full = analytic_model(s, h100());
  CHECK(windowed.layers[1].fwd_time_s[0] > full.layers[1].fwd_time_s[0]);  // the mask's read
  CHECK(windowed.layers[1].bwd_peak_bytes[0] - full.layers[1].bwd_peak_bytes[0] == static_cast<Bytes>(T * T * 2));
}

TEST_CASE("flash block: exactly the tensors FlashAttention-2, fused RMSNorm and fused SwiGLU keep") {
  AnalyticSpec s = preset("llama3-8b");
  s.seq_len = 2048;
  s.dtype = DType::Bf16;
  s.kernels = KernelStyle::Flash;
  const double T = 2048, h = 4096, nh = 32, q = 4096, k = 1024, f = 14336, bpe = 2;
  // x, norm_1's output (qkv's input), x + attn and norm_2's output (gate_up's input): T h each; the rotated q and
  // k, the packed qkv (v's view), o; [gate, up] (2 f) and the SwiGLU output (f); two RMSNorm rstd rows and the
  // log-sum-exp in FP32.
  const double saved = bpe * T * (4 * h + q + k + (q + 2 * k) + q + 2 * f + f) + 4 * (2 * T) + 4 * T * nh;
  CHECK(analytic_layer_info(s)[1].saved_bytes_per_sample == doctest::Approx(saved));
}

TEST_CASE("eager keeps the FP32 probabilities and more; fused less; flash no T x T tensor") {
  AnalyticSpec s = preset("llama2-7b");
  s.seq_len = 1024;
  s.dtype = DType::Bf16;
  s.ubatch_sizes = {1, 2};
  std::vector<double> saved;
  std::vector<Model> models;
  for (KernelStyle k : {KernelStyle::Eager, KernelStyle::Fused, KernelStyle::Flash}) {
    s.kernels = k;
    saved.push_back(analytic_layer_info(s)[1].saved_bytes_per_sample);
    models.push_back(analytic_model(s, h100()));
  }
  const double probs32 = 32.0 * 1024 * 1024 * 4;  // heads x T x T in FP32: softmax's saved output
  CHECK(saved[0] - saved[1] > probs32 - 32.0 * 1024 * 1024 * 2);
  CHECK(saved[1] > saved[2]);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(models[0].layers[1].bwd_peak_bytes[i] > models[1].layers[1].bwd_peak_bytes[i]);
    CHECK(models[1].layers[1].bwd_peak_bytes[i] > models[2].layers[1].bwd_peak_bytes[i]);
    CHECK(models[0].layers[1].fwd_time_s[i] > models[1].layers[1].fwd_time_s[i]);
  }
  // fp32 has no casts: the probabilities are saved once, at 4 bytes.
  s.kernels = KernelStyle::Eager;
  s.dtype = DType::Fp32;
  const double fp32 = analytic_layer_info(s)[1].saved_bytes_per_sample;
  CHECK(fp32 < 2 * saved[0]);
  // The eager criterion works in FP32, as transformers' loss: the bf16 logits (2 n bytes, n = T V) cast up (4 n),
  // the shifted copy (4 n', n' = (T - 1) V), then log-softmax; its forward peak is the first three. Fused takes
  // the cross-entropy of the bf16 logits as they are.
  s.dtype = DType::Bf16;
  const double n = 1024.0 * 32000, shifted = 1023.0 * 32000;
  CHECK(models[0].layers.back().fwd_peak_bytes[0] == static_cast<Bytes>(6 * n + 4 * shifted));
  CHECK(models[1].layers.back().fwd_peak_bytes[0] ==
        static_cast<Bytes>(2 * n + 2 * n + 8 * 1024 + 4));  // + labels, loss
}

TEST_CASE("biases, tied heads and no rope change what the formulas say") {
  AnalyticSpec s = preset("llama2-7b");
  s.layers = 2;
  s.seq_len = 512;
  const std::int64_t base = total_params(s), h = 4096, f = 11008, V = 32000;
  s.attn_bias = AttnBias::Qkv;
  CHECK(total_params(s) - base == 2 * 3 * h);
  s.attn_bias = AttnBias::All;
  CHECK(total_params(s) - base == 2 * 4 * h);
  s.attn_bias = AttnBias::None;
  s.mlp_bias = true;
  CHECK(total_params(s) - base == 2 * (2 * f + h));
  s.mlp_bias = false;
  s.tied_head = true;
  CHECK(total_params(s) == base - V * h);
  s.ubatch_sizes = {1};
  const Model tied = analytic_model(s, h100());
  CHECK(tied.layers[4].param_count == 0);  // lm_head
  CHECK(tied.layers[4].weight_bytes == V * h * 4);
  CHECK(tied.layers[4].optimizer_state_bytes == 0);
  s.tied_head = false;
  const Model with_rope = analytic_model(s, h100());
  s.rope = false;
  const Model without = analytic_model(s, h100());
  CHECK(without.layers[1].param_count == with_rope.layers[1].param_count);
  CHECK(without.layers[1].fwd_time_s[0] < with_rope.layers[1].fwd_time_s[0]);
}

TEST_CASE("GPT-NeoX: Pythia's published non-embedding counts; parallel or sequential residual, partial rotary") {
  // Pythia's model cards (e.g. huggingface.co/EleutherAI/pythia-160m) list the non-embedding parameters; the
  // embeddings are the untied embed_in and embed_out, 2 V h.
  struct Pythia {
    int L, h, heads;
    std::int64_t V, non_embedding;
  };
  for (const Pythia& p : {Pythia{12, 768, 12, 50304, 85'056'000}, Pythia{24, 1024, 16, 50304, 302'311'424},
                          Pythia{16, 2048, 8, 50304, 805'736'448}}) {
    AnalyticSpec s;
    s.family = ModelFamily::Neox;
    s.layers = p.L;
    s.hidden = p.h;
    s.heads = p.heads;
    s.seq_len = 2048;
    s.vocab = static_cast<int>(p.V);
    s.tied_head = false;
    s.attn_bias = AttnBias::All;
    s.mlp_bias = true;
    s.rope_dims = p.h / p.heads / 4;  // rotary_pct 0.25
    CHECK(total_params(s) == p.non_embedding + 2 * p.V * p.h);
    for (KernelStyle k : {KernelStyle::Eager, KernelStyle::Fused, KernelStyle::Flash}) {
      s.kernels = k;
      const double T = 2048, h = p.h;
      CHECK(analytic_layer_info(s)[1].fwd_flops_per_sample ==
            doctest::Approx(24 * T * h * h + 4 * T * T * h).epsilon(1e-12));
    }
  }
  AnalyticSpec s;
  s.family = ModelFamily::Neox;
  s.layers = 2;
  s.hidden = 512;
  s.heads = 8;
  s.seq_len = 256;
  s.vocab = 1000;
  s.ubatch_sizes = {1};
  const Model parallel = analytic_model(s, h100());
  s.parallel_residual = false;
  const Model sequential = analytic_model(s, h100());
  CHECK(parallel.layers[1].param_count == sequential.layers[1].param_count);
  CHECK(parallel.layers[1].fwd_time_s == sequential.layers[1].fwd_time_s);  // the same kernels, in another order
  // ln_2 saves the block's input (already saved by ln_1) in parallel, x + attn (a tensor of its own) in sequence.
  AnalyticSpec par = s;
  par.parallel_residual = true;
  CHECK(analytic_layer_info(s)[1].saved_bytes_per_sample - analytic_layer_info(par)[1].saved_bytes_per_sample ==
        256.0 * 512 * 4);
  s.act = MlpActivation::GeluNew;  // eager: GPT-2's 8-kernel GELU instead of one
  CHECK(analytic_model(s, h100()).layers[1].fwd_time_s[0] > sequential.layers[1].fwd_time_s[0]);
}

TEST_CASE("bad llama and neox specs are refused") {
  AnalyticSpec s = preset("llama2-7b");
  s.kv_heads = 5;
  CHECK(contains(analytic_spec_problem(s), "kv_heads (5) must divide heads (32)"));
  s = preset("llama2-7b");
  s.ffn = 0;
  CHECK(contains(analytic_spec_problem(s), "ffn"));
  s = preset("llama2-7b");
  s.rope_dims = 64;
  CHECK(contains(analytic_spec_problem(s), "rope_dims is for family neox"));
  s = preset("llama2-7b");
  s.gpt_head = GptHead::None;
  CHECK(contains(analytic_spec_problem(s), "head none is for family gpt"));
  s = preset("gpt2-small");
  s.kv_heads = 4;
  CHECK(contains(analytic_spec_problem(s), "llama and neox families"));
  s = preset("gpt2-small");
  s.positions = 512;
  CHECK(contains(analytic_spec_problem(s), "positions 512"));
  s = preset("bert-base");
  s.positions = 1024;
  CHECK(contains(analytic_spec_problem(s), "positions"));
  s = preset("llama2-7b");
  s.family = ModelFamily::Neox;
  s.attn_bias = AttnBias::Qkv;
  CHECK(contains(analytic_spec_problem(s), "attn_bias qkv"));
  CHECK_THROWS_AS(analytic_model(s, h100()), ScheduleError);
}

TEST_CASE("gpt positions: the position table keeps n_positions rows at a shorter seq_len") {
  AnalyticSpec s = preset("gpt2-small");
  const std::int64_t full = total_params(s);  // 124,439,808 at T = 1024
  CHECK(full == 124'439'808);
  s.seq_len = 256;
  s.positions = 1024;
  CHECK(total_params(s) == full);
  s.positions = 0;
  CHECK(total_params(s) == full - (1024 - 256) * 768);
}

// ------------------------------------------------------------------------------------------------
// model.analytic: family llama and neox

TEST_CASE("model.analytic: llama presets, family llama and neox from scratch, their keys") {
  RunConfig c = load_config_text("model: {analytic: llama3-8b}\n" + kPlan, "run.yaml");
  CHECK(c.model.analytic->kv_heads == 8);
  c = load_config_text(
      "model: {analytic: {family: llama, layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn: 1376, seq_len: 256, "
      "vocab: 1000, attn_bias: qkv, mlp_bias: true, sliding_window: 128, rope: true}}\n" +
          kPlan,
      "run.yaml");
  const AnalyticSpec& a = *c.model.analytic;
  CHECK(a.family == ModelFamily::Llama);
  CHECK(a.kv_heads == 2);
  CHECK(a.ffn == 1376);
  CHECK(a.attn_bias == AttnBias::Qkv);
  CHECK(a.mlp_bias);
  CHECK(a.sliding_window == 128);
  CHECK_FALSE(a.tied_head);  // the family's default: its own LM head
  const Model m = load_model(c.model, c.machine);
  CHECK(m.num_layers() == 4 + 4);
  CHECK(m.name == "llama_L4_h512_s256");
  c = load_config_text(
      "model: {analytic: {preset: llama2-7b, tied_head: true, attn_bias: true, kv_heads: 32}}\n" + kPlan, "run.yaml");
  CHECK(c.model.analytic->tied_head);
  CHECK(c.model.analytic->attn_bias == AttnBias::All);
  CHECK(c.model.analytic->kv_heads == 0);  // as many kv heads as heads: plain attention
  c = load_config_text(
      "model: {analytic: {family: neox, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 500, rope_dims: 16, "
      "parallel_residual: false, act: gelu_new}}\n" +
          kPlan,
      "run.yaml");
  CHECK(c.model.analytic->family == ModelFamily::Neox);
  CHECK(c.model.analytic->attn_bias == AttnBias::All);  // neox defaults: biases, untied head
  CHECK(c.model.analytic->mlp_bias);
  CHECK_FALSE(c.model.analytic->tied_head);
  CHECK(c.model.analytic->rope_dims == 16);
  CHECK_FALSE(c.model.analytic->parallel_residual);
  CHECK(c.model.analytic->act == MlpActivation::GeluNew);
  CHECK(c.model.analytic->ffn == 0);  // 4 x hidden
  c = load_config_text("model: {analytic: {preset: gpt2-small, seq_len: 512, positions: 1024}}\n" + kPlan, "run.yaml");
  CHECK(c.model.analytic->positions == 1024);
}

TEST_CASE("error: model.analytic llama and neox keys are located and explained") {
  ConfigError e = yaml_error(
      "model: {analytic: {family: llama, layers: 2, hidden: 512, heads: 8, seq_len: 256, vocab: 1000}}\n" + kPlan);
  check_yaml_at(e, 1, 9);
  CHECK(contains(e.message(), "model.analytic.ffn"));
  CHECK(contains(e.hint(), "ffn (the intermediate size)"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, kv_heads: 5}}\n" + kPlan);
  check_yaml_at(e, 1, 49);
  CHECK(contains(e.message(), "kv_heads = 5 does not divide heads = 32"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, kv_heads: 64}}\n" + kPlan);
  check_yaml_at(e, 1, 49);
  e = yaml_error("model: {analytic: {preset: llama2-7b, dropout: true}}\n" + kPlan);
  check_yaml_at(e, 1, 39);
  CHECK(contains(e.message(), "does not apply to family llama"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, head: none}}\n" + kPlan);
  CHECK(contains(e.message(), "does not apply to family llama"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, rope_dims: 32}}\n" + kPlan);
  CHECK(contains(e.message(), "model.analytic.rope_dims does not apply to family llama"));
  e = yaml_error("model: {analytic: {preset: gpt2-small, kv_heads: 4}}\n" + kPlan);
  CHECK(contains(e.message(), "model.analytic.kv_heads does not apply to family gpt"));
  e = yaml_error("model: {analytic: {preset: gpt2-small, head_dim: 128}}\n" + kPlan);
  CHECK(contains(e.message(), "model.analytic.head_dim does not apply to family gpt"));
  e = yaml_error(
      "model: {analytic: {family: llama, layers: 2, hidden: 1000, heads: 16, ffn: 64, vocab: 100, "
      "seq_len: 64}}\n" +
      kPlan);
  CHECK(contains(e.message(), "does not divide hidden"));
  CHECK(contains(e.hint(), "give head_dim"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, positions: 8192}}\n" + kPlan);
  CHECK(contains(e.message(), "does not apply to family llama"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, attn_bias: maybe}}\n" + kPlan);
  check_yaml_at(e, 1, 50);
  CHECK(contains(e.hint(), "qkv"));
  e = yaml_error(
      "model: {analytic: {family: neox, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 500, "
      "attn_bias: qkv}}\n" +
      kPlan);
  CHECK(contains(e.message(), "must be true or false"));
  e = yaml_error(
      "model: {analytic: {family: neox, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 500, "
      "rope_dims: 6, act: relu}}\n" +
      kPlan);
  CHECK(contains(e.message(), "unknown model.analytic.act 'relu'"));
  e = yaml_error(
      "model: {analytic: {family: neox, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 500, "
      "rope_dims: 66}}\n" +
      kPlan);
  CHECK(contains(e.message(), "rope_dims = 66 is not an even number up to the head size (64)"));
  e = yaml_error("model: {analytic: {preset: gpt2-small, positions: 512}}\n" + kPlan);
  check_yaml_at(e, 1, 51);
  CHECK(contains(e.message(), "positions = 512 is below seq_len = 1024"));
  e = yaml_error("model: {analytic: {preset: llama2-7b, sliding_window: 0}}\n" + kPlan);
  CHECK(contains(e.message(), "must be at least 1"));
}

// ------------------------------------------------------------------------------------------------
// model.hf_config

TEST_CASE("hf_config: the bundled Qwen2-7B config.json is the qwen2-7b shape at its own context") {
  const std::string dir = source_dir() + "/configs/models/qwen2-7b";
  RunConfig c = load_config(dir + "/compare.yaml");
  REQUIRE(c.model.analytic.has_value());
  AnalyticSpec a = *c.model.analytic;
  CHECK(a.name == "qwen2-7b");
  CHECK(a.seq_len == 4096);
  CHECK(a.kernels == KernelStyle::Flash);
  CHECK(c.model.analytic_dtype_given);
  const std::string file = std::filesystem::path(dir + "/config.json").lexically_normal().string();
  CHECK(std::find(c.inputs.begin(), c.inputs.end(), file) != c.inputs.end());
  AnalyticSpec p = preset("qwen2-7b");
  CHECK(total_params(a) == 7'615'616'512);
  a.seq_len = p.seq_len;
  a.kernels = p.kernels;
  a.dtype = p.dtype;
  a.ubatch_sizes = p.ubatch_sizes;
  CHECK(analytic_layer_info(a)[1].fwd_flops_per_sample == analytic_layer_info(p)[1].fwd_flops_per_sample);
  // Without seq_len the sequence is the file's max_position_embeddings.
  c = load_config_text("model: {hf_config: " + dir + "/config.json}\n" + kPlan, "run.yaml");
  CHECK(c.model.analytic->seq_len == 131072);
  CHECK(c.model.analytic->sliding_window == 0);  // use_sliding_window false
  CHECK_FALSE(c.model.analytic_dtype_given);
  CHECK_FALSE(c.model.analytic->autocast);
  // autocast beside hf_config: read as in model.analytic, and its checks located at the key
  c = load_config_text("model: {hf_config: " + dir + "/config.json, seq_len: 512, autocast: true}\n" + kPlan,
                       "run.yaml");
  CHECK(c.model.analytic->autocast);
  c = load_config_text(
      "model: {hf_config: " + dir + "/config.json, seq_len: 512, dtype: fp32,\n  autocast: true}\n" + kPlan,
      "run.yaml");
  try {
    (void)load_model(c.model, c.machine);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.loc().line == 2);
    CHECK(e.loc().column == 13);
    CHECK(e.message().find("needs a 2-byte dtype") != std::string::npos);
  }
}

TEST_CASE("hf_config: Qwen3, whose head_dim is not hidden / heads, has its published parameter count") {
  // Qwen/Qwen3-0.6B's config.json (huggingface.co/Qwen/Qwen3-0.6B); 596,049,920 parameters is the count keras-hub's
  // qwen3_0.6b_en preset publishes for that checkpoint. Heads are 128 wide, not 1024 / 16 = 64: q_proj is
  // 1024 x 2048, o_proj 2048 x 1024, k and v 1024 x 1024; q_norm and k_norm 128 each; the head tied.
  const std::string qwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
})";
  TempDir dir;
  RunConfig c = load_hf(dir, qwen3);
  const AnalyticSpec& a = *c.model.analytic;
  CHECK(a.head_dim == 128);
  CHECK(a.qk_norm);
  CHECK(a.tied_head);
  CHECK(a.attn_bias == AttnBias::None);
  CHECK(a.sliding_window == 0);
  CHECK(total_params(a) == 596'049'920);
  // The attention GEMMs run at the heads' own width: q k^T and p v are 16 heads x T x T x 128 each.
  AnalyticSpec narrow = a;
  narrow.head_dim = 0;  // 64-wide heads: a different model, smaller projections and attention products
  CHECK(total_params(narrow) < total_params(a));
  CHECK(analytic_layer_info(narrow)[1].fwd_flops_per_sample < analytic_layer_info(a)[1].fwd_flops_per_sample);
  // The same file as model_type qwen2 has no q_norm / k_norm (and q, k, v biases): what the type decides.
  std::string as_qwen2 = qwen3;
  as_qwen2.replace(as_qwen2.find("\"qwen3\""), 7, "\"qwen2\"");
  as_qwen2.replace(as_qwen2.find("\"attention_bias\": false, "), 25, "");
  const AnalyticSpec q2 = *load_hf(dir, as_qwen2).model.analytic;
  CHECK_FALSE(q2.qk_norm);
  CHECK(total_params(q2) == 596'049'920 - 28 * 2 * 128 + 28 * (2048 + 2 * 1024));
  // YAML: family llama with head_dim and qk_norm from scratch, and the keys refused elsewhere.
  c = load_config_text(
      "model:\n  analytic: {family: llama, layers: 28, hidden: 1024, heads: 16, kv_heads: 8, "
      "head_dim: 128, qk_norm: true, ffn: 3072, vocab: 151936, seq_len: 4096, tied_head: true}\n" +
          kPlan,
      "run.yaml");
  CHECK(total_params(*c.model.analytic) == 596'049'920);
  // projections: the code's layout (llama only), located errors for a bad value and another family
  c = load_config_text("model:\n  analytic: {preset: llama3-8b, kernels: flash, projections: separate}\n" + kPlan,
                       "run.yaml");
  CHECK(c.model.analytic->projections == Projections::Separate);
  CHECK(c.model.analytic->kernels == KernelStyle::Flash);
  const auto error_of = [](const std::string& text) {
    try {
      load_config_text(text, "run.yaml");
    } catch (const ConfigError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string("no error");
  };
  const std::string bad = error_of("model:\n  analytic: {preset: llama3-8b, projections: fused}\n" + kPlan);
  CHECK(bad.find("run.yaml:2:") != std::string::npos);
  CHECK(bad.find("separate") != std::string::npos);
  const std::string gpt = error_of("model:\n  analytic: {preset: gpt2-medium, projections: packed}\n" + kPlan);
  CHECK(gpt.find("projections is a key of llama models only") != std::string::npos);
}

TEST_CASE("hf_config: Llama 2 and 3, Mistral, GPT-2 and GPT-NeoX files give the published shapes") {
  TempDir dir;
  RunConfig c = load_hf(dir, kLlama2);
  CHECK(c.model.analytic->family == ModelFamily::Llama);
  CHECK(c.model.analytic->name == "m");
  CHECK(c.model.analytic->seq_len == 4096);
  CHECK(total_params(*c.model.analytic) == 6'738'415'616);
  CHECK(c.model.loc.file == dir / "run.yaml");
  // Llama 3.1-style fields: rope_scaling llama3 changes only the frequencies; newer transformers keys.
  const std::string llama3 = R"({
  "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
  "head_dim": 128, "attention_bias": false, "attention_dropout": 0.0, "mlp_bias": false, "hidden_act": "silu",
  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "rms_norm_eps": 1e-05, "pretraining_tp": 1
})";
  c = load_hf(dir, llama3,
              ", seq_len: 8192, dtype: bf16, kernels: fused, optimizer: sgd, name: l3, ubatch_sizes: [1, 2]");
  const AnalyticSpec& l3 = *c.model.analytic;
  CHECK(total_params(l3) == 8'030'261'248);
  CHECK(l3.seq_len == 8192);
  CHECK(l3.dtype == DType::Bf16);
  CHECK(l3.kernels == KernelStyle::Fused);
  CHECK(l3.projections == Projections::Separate);  // transformers' code, whatever the kernels
  CHECK(l3.optimizer == OptimizerKind::Sgd);
  CHECK(l3.name == "l3");
  CHECK(l3.ubatch_sizes == std::vector<int>{1, 2});
  CHECK(load_model(c.model, c.machine).name == "l3");
  // Mistral: sliding_window read; absent it is transformers' default 4096, null none.
  const std::string mistral = R"({
  "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 2048, "tie_word_embeddings": false,
  "vocab_size": 32000
})";
  c = load_hf(dir, mistral);
  CHECK(total_params(*c.model.analytic) == 7'241'732'096);
  CHECK(c.model.analytic->sliding_window == 2048);
  std::string no_window = mistral;
  no_window.replace(no_window.find("\"sliding_window\": 2048, "), 24, "");
  CHECK(load_hf(dir, no_window).model.analytic->sliding_window == 4096);
  std::string null_window = mistral;
  null_window.replace(null_window.find("2048"), 4, "null");
  CHECK(load_hf(dir, null_window).model.analytic->sliding_window == 0);
  std::string text_window = mistral;
  text_window.replace(text_window.find("2048"), 4, "\"2048\"");
  ConfigError e = hf_error(dir, text_window);
  check_json_at(e, dir, 4, 67);
  CHECK(contains(e.message(), "sliding_window must be an integer"));
  // GPT-2 as openai-community/gpt2 ships it: 124,439,808 parameters (tied head).
  const std::string gpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
  "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257
})";
  c = load_hf(dir, gpt2);
  CHECK(c.model.analytic->family == ModelFamily::Gpt);
  CHECK(c.model.analytic->dropout);
  CHECK(c.model.analytic->tied_head);
  CHECK(total_params(*c.model.analytic) == 124'439'808);
  c = load_hf(dir, gpt2, ", seq_len: 256");
  CHECK(c.model.analytic->seq_len == 256);
  CHECK(total_params(*c.model.analytic) == 124'439'808);  // n_positions rows whatever the sequence
  // The analytic gpt2-small preset is this model.
  AnalyticSpec g = preset("gpt2-small");
  g.ubatch_sizes = {1};
  AnalyticSpec from_file = *load_hf(dir, gpt2, ", ubatch_sizes: [1], dtype: fp32").model.analytic;
  from_file.name = g.name;
  from_file.positions = 0;
  CHECK(analytic_model(from_file, h100()).layers[1].fwd_time_s == analytic_model(g, h100()).layers[1].fwd_time_s);
  // GPT-NeoX: Pythia-160M (rotary_pct 0.25 of 64: 16 dimensions) and GPT-NeoX-20B (gelu_fast).
  const std::string pythia = R"({
  "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
  "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
  "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.24.0", "use_cache": true, "use_parallel_residual": true, "vocab_size": 50304
})";
  c = load_hf(dir, pythia);
  CHECK(c.model.analytic->family == ModelFamily::Neox);
  CHECK(c.model.analytic->rope_dims == 16);
  CHECK(c.model.analytic->attn_bias == AttnBias::All);
  CHECK(total_params(*c.model.analytic) == 85'056'000 + 2 * 50304 * 768);
  std::string neox20 = pythia;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("hidden_act": "gelu")", R"("hidden_act": "gelu_fast")"},
           {R"("hidden_size": 768)", R"("hidden_size": 6144)"},
           {R"("intermediate_size": 3072)", R"("intermediate_size": 24576)"},
           {R"("num_attention_heads": 12)", R"("num_attention_heads": 64)"},
           {R"("num_hidden_layers": 12)", R"("num_hidden_layers": 44)"},
           {R"("vocab_size": 50304)", R"("vocab_size": 50432)"}})
    neox20.replace(neox20.find(from), from.size(), to);
  c = load_hf(dir, neox20);
  CHECK(c.model.analytic->act == MlpActivation::GeluNew);
  CHECK(c.model.analytic->rope_dims == 24);
  CHECK(total_params(*c.model.analytic) == 20'554'567'680);
}

TEST_CASE("hf_config: Qwen2's window only with use_sliding_window, for all layers or none") {
  TempDir dir;
  const std::string qwen = R"({
  "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
  "use_sliding_window": USE, "sliding_window": 4096, "max_window_layers": FROM, "tie_word_embeddings": true
})";
  const auto with = [&](const std::string& use, const std::string& from) {
    std::string s = qwen;
    s.replace(s.find("USE"), 3, use);
    s.replace(s.find("FROM"), 4, from);
    return s;
  };
  RunConfig c = load_hf(dir, with("false", "21"));
  CHECK(c.model.analytic->sliding_window == 0);
  CHECK(c.model.analytic->tied_head);
  CHECK(c.model.analytic->attn_bias == AttnBias::Qkv);
  CHECK(total_params(*c.model.analytic) == 494'032'768);  // Qwen2-0.5B
  CHECK(load_hf(dir, with("true", "24")).model.analytic->sliding_window == 0);
  CHECK(load_hf(dir, with("true", "0")).model.analytic->sliding_window == 4096);
  ConfigError e = hf_error(dir, with("true", "21"));
  check_json_at(e, dir, 4, 76);
  CHECK(contains(e.message(), "layers 21 to 23 use the sliding window"));
  e = hf_error(dir, with("1", "0"));
  check_json_at(e, dir, 4, 25);
  CHECK(contains(e.message(), "use_sliding_window must be true or false"));
}

TEST_CASE("error: hf_config problems are located in the config.json and explained") {
  TempDir dir;
  // a missing shape key: the file, line 1
  std::string s = kLlama2;
  s.erase(s.find("  \"hidden_size\": 4096,\n"), 23);
  ConfigError e = hf_error(dir, s);
  check_json_at(e, dir, 1, 1);
  CHECK(contains(e.message(), "has no hidden_size"));
  // wrong types, at the value
  e = hf_error(dir, llama2_with("num_attention_heads", R"(  "num_attention_heads": "32",)"));
  check_json_at(e, dir, 11, 26);
  CHECK(contains(e.message(), "num_attention_heads must be an integer, got \"32\""));
  e = hf_error(dir, llama2_with("tie_word_embeddings", R"(  "tie_word_embeddings": "no",)"));
  check_json_at(e, dir, 17, 26);
  CHECK(contains(e.message(), "must be true or false"));
  e = hf_error(dir, llama2_with("num_hidden_layers", R"(  "num_hidden_layers": 32.5,)"));
  check_json_at(e, dir, 12, 24);
  e = hf_error(dir, llama2_with("num_hidden_layers", R"(  "num_hidden_layers": 0,)"));
  CHECK(contains(e.message(), "num_hidden_layers = 0 is out of range"));
  // an unsupported model_type
  e = hf_error(dir, llama2_with("model_type", R"(  "model_type": "mixtral",)"));
  check_json_at(e, dir, 10, 17);
  CHECK(contains(e.message(), "model_type \"mixtral\" is not one harmony models"));
  CHECK(contains(e.hint(), "gpt2, gpt_neox, llama, mistral, qwen2"));
  s = kLlama2;
  s.erase(s.find("  \"model_type\": \"llama\",\n"), 25);
  e = hf_error(dir, s);
  check_json_at(e, dir, 1, 1);
  CHECK(contains(e.message(), "has no model_type"));
  // keys that change the math and are not modelled
  e = hf_error(dir, llama2_with("num_local_experts", R"(  "num_local_experts": 8,)"));
  check_json_at(e, dir, 2, 3);
  CHECK(contains(e.message(), "mixture-of-experts"));
  e = hf_error(dir, llama2_with("hidden_act", R"(  "hidden_act": "gelu",)"));
  check_json_at(e, dir, 5, 17);
  CHECK(contains(e.message(), "hidden_act \"gelu\" is not modelled for llama"));
  // head_dim sets the head width itself (transformers' LlamaAttention): 256 is read, not refused
  CHECK(load_hf(dir, llama2_with("head_dim", R"(  "head_dim": 256,)")).model.analytic->head_dim == 256);
  CHECK(load_hf(dir, llama2_with("head_dim", R"(  "head_dim": 128,)")).model.analytic->head_dim == 0);
  e = hf_error(dir, llama2_with("head_dim", R"(  "head_dim": 0,)"));
  check_json_at(e, dir, 2, 15);
  e = hf_error(dir, llama2_with("num_key_value_heads", R"(  "num_key_value_heads": 5,)"));
  check_json_at(e, dir, 13, 26);
  CHECK(contains(e.message(), "does not divide num_attention_heads = 32"));
  e = hf_error(dir, llama2_with("num_attention_heads", R"(  "num_attention_heads": 33,)"));
  check_json_at(e, dir, 11, 26);
  e = hf_error(dir, llama2_with("rope_scaling", R"(  "rope_scaling": {"type": "mrope", "factor": 2.0},)"));
  check_json_at(e, dir, 16, 28);
  CHECK(contains(e.message(), "rope_scaling.type \"mrope\" is not a rotary scaling harmony models"));
  e = hf_error(dir, llama2_with("rope_scaling", R"(  "rope_scaling": 2.0,)"));
  check_json_at(e, dir, 16, 19);
  for (const char* type : {"linear", "dynamic", "yarn", "llama3", "longrope"}) {
    const std::string line = std::string(R"(  "rope_scaling": {"rope_type": ")") + type + R"(", "factor": 4.0},)";
    CHECK(total_params(*load_hf(dir, llama2_with("rope_scaling", line)).model.analytic) == 6'738'415'616);
  }
  e = hf_error(dir, llama2_with("attention_dropout", R"(  "attention_dropout": 0.1,)"));
  check_json_at(e, dir, 2, 24);
  CHECK(contains(e.message(), "no dropout"));
  e = hf_error(dir, llama2_with("pretraining_tp", R"(  "pretraining_tp": 2,)"));
  check_json_at(e, dir, 14, 21);
  e = hf_error(dir, llama2_with("quantization_config", R"(  "quantization_config": {"quant_method": "awq"},)"));
  check_json_at(e, dir, 2, 3);
  CHECK(contains(e.message(), "quantized"));
  e = hf_error(dir, llama2_with("auto_map", R"(  "auto_map": {"AutoConfig": "x.Config"},)"));
  CHECK(contains(e.message(), "custom modelling code"));
  e = hf_error(dir, llama2_with("use_flux_capacitor", R"(  "use_flux_capacitor": true,)"));
  check_json_at(e, dir, 2, 3);
  CHECK(contains(e.message(), "'use_flux_capacitor' is not one harmony reads"));
  // the biases Llama has keys for are modelled, not refused
  RunConfig c = load_hf(dir, llama2_with("attention_bias", R"(  "attention_bias": true, "mlp_bias": true,)"));
  CHECK(c.model.analytic->attn_bias == AttnBias::All);
  CHECK(c.model.analytic->mlp_bias);
  e = hf_error(dir, llama2_with("attention_bias", R"(  "attention_bias": 1,)"));
  CHECK(contains(e.message(), "attention_bias must be true or false"));
  e = hf_error(dir, llama2_with("mlp_bias", R"(  "mlp_bias": "yes",)"));
  check_json_at(e, dir, 2, 15);
  CHECK(contains(e.message(), "mlp_bias must be true or false"));
  // malformed JSON, at the character
  e = hf_error(dir, "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}\n");
  check_json_at(e, dir, 3, 23);
  CHECK(contains(e.message(), "malformed JSON"));
  e = hf_error(dir, "[1, 2]\n");
  check_json_at(e, dir, 1, 1);
  // no max_position_embeddings: fine with seq_len beside hf_config, else an error that says so
  s = kLlama2;
  s.erase(s.find("  \"max_position_embeddings\": 4096,\n"), 35);
  e = hf_error(dir, s);
  check_json_at(e, dir, 1, 1);
  CHECK(contains(e.hint(), "model.seq_len"));
  CHECK(load_hf(dir, s, ", seq_len: 2048").model.analytic->seq_len == 2048);
}

TEST_CASE("error: gpt2 and gpt_neox keys the models do not follow") {
  TempDir dir;
  const std::string gpt2 = R"({
  "model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128, "vocab_size": 500,
  "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1
})";
  const auto with = [](std::string s, const std::string& from, const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  ConfigError e = hf_error(dir, with(gpt2, "\"gelu_new\"", "\"relu\""));
  check_json_at(e, dir, 3, 26);
  CHECK(contains(e.message(), "activation_function \"relu\" is not modelled for gpt2"));
  e = hf_error(dir, with(gpt2, "\"embd_pdrop\": 0.1", "\"embd_pdrop\": 0.0"));
  check_json_at(e, dir, 3, 72);
  CHECK(contains(e.message(), "some of resid_pdrop, embd_pdrop and attn_pdrop are 0"));
  RunConfig c = load_hf(dir, with(with(with(gpt2, "\"embd_pdrop\": 0.1", "\"embd_pdrop\": 0"), "\"resid_pdrop\": 0.1",
                                       "\"resid_pdrop\": 0"),
                                  "\"attn_pdrop\": 0.1", "\"attn_pdrop\": 0"));
  CHECK_FALSE(c.model.analytic->dropout);
  e = hf_error(dir, with(gpt2, "\"vocab_size\": 500", "\"vocab_size\": 500, \"reorder_and_upcast_attn\": true"));
  CHECK(contains(e.message(), "reorder_and_upcast_attn = true is not modelled"));
  e = hf_error(dir, with(gpt2, "\"n_positions\": 128, ", ""));
  CHECK(contains(e.message(), "has no n_positions"));
  e = hf_error(dir, gpt2, ", seq_len: 256");
  INFO(std::string(e.what()));
  CHECK(e.loc().file == dir / "run.yaml");
  CHECK(e.loc().line == 1);
  CHECK(contains(e.message(), "model.seq_len = 256 exceeds the 128 positions"));
  const std::string neox = R"({
  "model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
  "intermediate_size": 1024, "vocab_size": 500, "max_position_embeddings": 128, "rotary_pct": 0.25,
  "hidden_act": "gelu"
})";
  c = load_hf(dir, neox);
  CHECK(c.model.analytic->rope_dims == 16);
  e = hf_error(dir, with(neox, "\"gelu\"", "\"relu\""));
  check_json_at(e, dir, 4, 17);
  e = hf_error(dir, with(neox, "0.25", "0.3"));
  check_json_at(e, dir, 3, 95);
  CHECK(contains(e.message(), "rotates 19 of the head's 64 dimensions"));
  e = hf_error(dir, with(neox, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu\", \"hidden_dropout\": 0.1"));
  CHECK(contains(e.message(), "hidden_dropout = 0.1 is not modelled"));
  e = hf_error(dir, with(neox, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu\", \"num_key_value_heads\": 2"));
  CHECK(contains(e.message(), "'num_key_value_heads' is not one harmony reads"));
  CHECK(
      load_hf(dir, with(neox, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu\", \"use_parallel_residual\": false"))
          .model.analytic->parallel_residual == false);
}

TEST_CASE("error: model.hf_config in the config file: exclusive, run keys only beside it, the file readable") {
  ConfigError e = yaml_error("model: {analytic: gpt2-small, hf_config: x.json}\n" + kPlan);
  check_yaml_at(e, 1, 31);
  CHECK(contains(e.message(), "model.analytic and model.hf_config are both given"));
  e = yaml_error("model: {profile: p.json, analytic: gpt2-small, hf_config: x.json}\n" + kPlan);
  CHECK(contains(e.message(), "are all given"));
  e = yaml_error("model: {profile: p.json, analytic: gpt2-small}\n" + kPlan);
  check_yaml_at(e, 1, 26);
  CHECK(contains(e.message(), "both given"));
  e = yaml_error("model: {analytic: gpt2-small, seq_len: 512}\n" + kPlan);
  check_yaml_at(e, 1, 31);
  CHECK(contains(e.message(), "model.seq_len goes beside model.hf_config only"));
  CHECK(contains(e.hint(), "analytic: {preset: NAME, seq_len: ...}"));
  e = yaml_error("model: {hf_config: x.json, hidden: 512}\n" + kPlan);
  check_yaml_at(e, 1, 28);
  CHECK(contains(e.message(), "unknown key 'hidden' in model"));
  e = yaml_error("model: {hf_config: /nonexistent/harmony/config.json}\n" + kPlan);
  check_yaml_at(e, 1, 20);
  CHECK(contains(e.message(), "cannot read model.hf_config '/nonexistent/harmony/config.json'"));
  e = yaml_error("model: {hf_config: }\n" + kPlan);
  check_yaml_at(e, 1, 9);
  CHECK(contains(e.message(), "model.hf_config has no value"));
  e = yaml_error("model: {hf_config: " + source_dir() + "/configs/models/qwen2-7b/config.json, seq_len: 1}\n" + kPlan);
  CHECK(contains(e.message(), "model.seq_len must be at least 2"));
  e = yaml_error("model: {hf_config: " + source_dir() + "/configs/models/qwen2-7b/config.json, kernels: flsh}\n" +
                 kPlan);
  CHECK(contains(e.hint(), "did you mean 'flash'"));
  CHECK(contains(e.hint(), "eager, fused, flash, sdpa"));
  // A relative path is taken from the config file's folder; --set reaches the run keys.
  TempDir dir;
  dir.write("models/tiny/config.json", kLlama2);
  const std::string yaml = dir.write("configs/run.yaml", "model: {hf_config: ../models/tiny/config.json}\n" + kPlan);
  RunConfig c = load_config(yaml, {"model.seq_len=1024", "model.dtype=fp16"});
  CHECK(c.model.analytic->name == "tiny");
  CHECK(c.model.analytic->seq_len == 1024);
  CHECK(c.model.analytic->dtype == DType::Fp16);
  CHECK(std::find(c.inputs.begin(), c.inputs.end(), dir / "models/tiny/config.json") != c.inputs.end());
}
