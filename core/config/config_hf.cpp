// model.hf_config: a Hugging Face config.json read into an AnalyticSpec, family by family (gpt2 -> gpt; gpt_neox ->
// neox; llama, mistral, qwen2, qwen3 -> llama), with transformers' defaults for absent keys and every key that is not
// read or known to be harmless refused at its line:column (docs/config.md, "model.hf_config").
#include "core/config/config_hf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/config/config_internal.hpp"
#include "core/config/json_located.hpp"

namespace harmony::core {

using config_detail::fail;
using config_detail::join;
using nlohmann::json;

namespace {

constexpr int kMaxDim = 1 << 20;

// Keys of every transformers config that change nothing the analytic model computes: token ids, bookkeeping,
// generation and task settings.
const std::vector<std::string> kHarmless = {"_name_or_path",
                                            "architectures",
                                            "torch_dtype",
                                            "dtype",
                                            "transformers_version",
                                            "use_cache",
                                            "bos_token_id",
                                            "eos_token_id",
                                            "pad_token_id",
                                            "sep_token_id",
                                            "decoder_start_token_id",
                                            "initializer_range",
                                            "tokenizer_class",
                                            "prefix",
                                            "task_specific_params",
                                            "problem_type",
                                            "id2label",
                                            "label2id",
                                            "return_dict",
                                            "output_hidden_states",
                                            "output_attentions",
                                            "torchscript",
                                            "max_length",
                                            "min_length",
                                            "do_sample",
                                            "early_stopping",
                                            "num_beams",
                                            "temperature",
                                            "top_k",
                                            "top_p",
                                            "repetition_penalty",
                                            "length_penalty",
                                            "no_repeat_ngram_size",
                                            "num_return_sequences",
                                            "finetuning_task",
                                            "_attn_implementation_autoset",
                                            "model_type"};

// Keys of mixture-of-experts configs (Mixtral, Qwen2-MoE, ...): their MLP is not modelled.
const std::vector<std::string> kMoeKeys = {"num_local_experts",
                                           "num_experts",
                                           "num_experts_per_tok",
                                           "moe_intermediate_size",
                                           "shared_expert_intermediate_size",
                                           "router_aux_loss_coef",
                                           "output_router_logits",
                                           "decoder_sparse_step",
                                           "router_jitter_noise",
                                           "mlp_only_layers",
                                           "norm_topk_prob"};

// rope_scaling types: each changes only the rotation frequencies (and, yarn and longrope, a factor folded into cos
// and sin; dynamic recomputes the frequencies once per forward when the sequence outgrows the original length):
// the same kernels on the same tensors, so the same FLOPs, bytes and memory.
const std::vector<std::string> kRopeTypes = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "su"};

const std::vector<std::string> kModelTypes = {"gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"};

std::string pointer(std::string_view key) { return "/" + json_pointer_token(key); }

// One config.json: typed getters that locate every problem, and the record of which keys were read.
class HfConfig {
 public:
  HfConfig(std::string path, std::string text) : file_(std::move(path), std::move(text)) {}

  void parse() {
    file_.parse_object({"a Hugging Face config.json", "numbers in a config.json are small integers and decimals",
                        "use the config.json of a model on the Hugging Face Hub (the file next to its weights)"});
  }

  const std::string& path() const { return file_.path(); }
  SourceLoc value_at(std::string_view key) const { return file_.value_at(pointer(key)); }
  SourceLoc value_at_pointer(const std::string& ptr) const { return file_.value_at(ptr); }
  SourceLoc key_at(std::string_view key) const { return file_.key_at(pointer(key)); }
  [[noreturn]] void fail_value(std::string_view key, const std::string& message, const std::string& hint) const {
    fail(value_at(key), message, hint);
  }

  // The value of `key`, nullptr when absent or null; marks it read.
  const json* get(std::string_view key) {
    used_.emplace_back(key);
    const auto it = file_.doc().find(std::string(key));
    if (it == file_.doc().end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool present(std::string_view key) const { return file_.doc().contains(std::string(key)); }
  bool has(std::string_view key) const {
    const auto it = file_.doc().find(std::string(key));
    return it != file_.doc().end() && !it->is_null();
  }
  void ignore(std::string_view key) { used_.emplace_back(key); }

  std::optional<int> opt_int(std::string_view key, int min, int max) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    const std::string range = fmt::format("{} is a whole number from {} to {}", key, min, max);
    if (!v->is_number_integer()) fail_value(key, fmt::format("{} must be an integer, got {}", key, v->dump()), range);
    const auto x = v->get<std::int64_t>();
    if (x < min || x > max) fail_value(key, fmt::format("{} = {} is out of range", key, x), range);
    return static_cast<int>(x);
  }
  int req_int(std::string_view key, int min, int max, std::string_view model_type) {
    if (const auto v = opt_int(key, min, max)) return *v;
    missing(key, model_type);
  }
  bool opt_bool(std::string_view key, bool fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean())
      fail_value(key, fmt::format("{} must be true or false, got {}", key, v->dump()), "write true or false");
    return v->get<bool>();
  }
  double opt_number(std::string_view key, double fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number())
      fail_value(key, fmt::format("{} must be a number, got {}", key, v->dump()), "write a number such as 0.0");
    return v->get<double>();
  }
  std::string opt_string(std::string_view key, const std::string& fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string())
      fail_value(key, fmt::format("{} must be a string, got {}", key, v->dump()), "write it in double quotes");
    return v->get<std::string>();
  }
  [[noreturn]] void missing(std::string_view key, std::string_view model_type) const {
    fail(SourceLoc{path(), 1, 1}, fmt::format("{} (model_type {}) has no {}", path(), model_type, key),
         fmt::format("a {} config.json states {}; use the file as the Hub ships it", model_type, key));
  }
  // A dropout probability: 0 (absent: transformers' default 0) or the model has dropout layers it is not modelled with.
  void zero_dropout(std::string_view key, std::string_view model_type) {
    const double p = opt_number(key, 0.0);
    if (p != 0.0)
      fail_value(key, fmt::format("{} = {} is not modelled: the {} analytic model has no dropout", key, p, model_type),
                 fmt::format("set {} to 0.0 in a copy of the file (its published configs have 0.0)", key));
  }

  // Every key neither read nor harmless is an error: one the analytic model does not follow would silently give
  // wrong numbers. `known` lists the family's keys that are read or harmless.
  void refuse_others(const std::vector<std::string>& known, std::string_view model_type) const {
    for (const auto& item : file_.doc().items()) {
      const std::string& key = item.key();
      const auto listed = [&](const std::vector<std::string>& v) {
        return std::find(v.begin(), v.end(), key) != v.end();
      };
      if (listed(used_) || listed(known) || listed(kHarmless)) continue;
      if (listed(kMoeKeys))
        fail(key_at(key), fmt::format("{} is a mixture-of-experts key: MoE layers are not modelled", key),
             "the analytic models have dense MLPs (gpt2, gpt_neox, llama, mistral, qwen2, qwen3 without experts)");
      if (key == "quantization_config")
        fail(key_at(key), "quantized weights (quantization_config) are not modelled",
             "use the config.json of the unquantized model, whose shape is the same");
      if (key == "auto_map")
        fail(key_at(key), "auto_map names custom modelling code, which may differ from the standard architecture",
             fmt::format("harmony models transformers' own {} code; use a config.json without auto_map if the model "
                         "is that architecture",
                         model_type));
      fail(key_at(key),
           fmt::format("config.json key '{}' is not one harmony reads or knows to be harmless for "
                       "model_type {}",
                       key, model_type),
           fmt::format("a key that changes the model would be silently wrong if ignored; if '{}' does not (a "
                       "tokenizer, generation or bookkeeping setting), delete it from a copy of the file",
                       key));
    }
  }

 private:
  JsonConfigFile file_;
  std::vector<std::string> used_;
};

// rope_scaling (transformers' name) or rope_parameters (its newer one): null, or an object whose rope_type (or
// type) changes only the rotation frequencies (kRopeTypes); any other type is refused.
void check_rope_scaling(HfConfig& c, std::string_view key) {
  const json* v = c.get(key);
  if (!v) return;
  if (!v->is_object())
    c.fail_value(key, fmt::format("{} must be an object or null, got {}", key, v->dump()),
                 R"(e.g. {"rope_type": "llama3", "factor": 8.0, ...}, or null)");
  for (const char* field : {"rope_type", "type"}) {
    const auto it = v->find(field);
    if (it == v->end() || it->is_null()) continue;
    if (it->is_string() && std::find(kRopeTypes.begin(), kRopeTypes.end(), it->get<std::string>()) != kRopeTypes.end())
      continue;
    fail(c.value_at_pointer(pointer(key) + pointer(field)),
         fmt::format("{}.{} {} is not a rotary scaling harmony models", key, field, it->dump()),
         fmt::format("known types ({}) change only the rotation frequencies, so the FLOPs, bytes and memory are "
                     "those of plain rotary embeddings; another type may not be",
                     join(kRopeTypes)));
  }
}

std::string name_of(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename() == "config.json" && !p.parent_path().filename().empty()) return p.parent_path().filename().string();
  return p.stem().string();
}

// The shape keys every family names differently. seq_len from the position limit unless given.
struct Dims {
  const char* layers;
  const char* hidden;
  const char* heads;
  const char* positions;
};

void read_dims(HfConfig& c, const Dims& k, std::string_view type, bool seq_len_given, AnalyticSpec& s) {
  s.layers = c.req_int(k.layers, 1, 10000, type);
  s.hidden = c.req_int(k.hidden, 1, kMaxDim, type);
  s.heads = c.req_int(k.heads, 1, kMaxDim, type);
  s.vocab = c.req_int("vocab_size", 2, 16 * kMaxDim, type);
  if (s.hidden % s.heads != 0 && !c.has("head_dim"))  // the llama family's head_dim sets the head size itself
    c.fail_value(k.heads, fmt::format("{} = {} does not divide {} = {}", k.heads, s.heads, k.hidden, s.hidden),
                 "the head size is hidden / heads; this is not a config.json transformers can load");
  if (const auto p = c.opt_int(k.positions, 2, kMaxDim)) {
    s.seq_len = *p;
  } else if (!seq_len_given) {
    fail(SourceLoc{c.path(), 1, 1}, fmt::format("{} (model_type {}) has no {}", c.path(), type, k.positions),
         fmt::format("set model.seq_len beside hf_config (the sequence length to train at), or use the file with "
                     "its {}",
                     k.positions));
  }
}

// gpt2: GPT-2 (the gpt family, transformers' GPT2LMHeadModel).
void read_gpt2(HfConfig& c, bool seq_len_given, AnalyticSpec& s) {
  s.family = ModelFamily::Gpt;
  read_dims(c, {"n_layer", "n_embd", "n_head", "n_positions"}, "gpt2", seq_len_given, s);
  if (!c.has("n_positions")) c.missing("n_positions", "gpt2");  // the position table's rows, a parameter count
  s.positions = s.seq_len;  // n_positions here: the table keeps its rows whatever seq_len the config sets
  if (const auto inner = c.opt_int("n_inner", 1, 4 * kMaxDim)) s.ffn = *inner;
  const std::string act = c.opt_string("activation_function", "gelu_new");
  if (act != "gelu_new")
    c.fail_value("activation_function", fmt::format("activation_function \"{}\" is not modelled for gpt2", act),
                 "the gpt analytic model's GELU is gelu_new (GPT-2's tanh form, as its published configs)");
  const double resid = c.opt_number("resid_pdrop", 0.1), embd = c.opt_number("embd_pdrop", 0.1),
               attn = c.opt_number("attn_pdrop", 0.1);
  const bool any = resid > 0 || embd > 0 || attn > 0, all = resid > 0 && embd > 0 && attn > 0;
  if (any && !all)
    c.fail_value(resid > 0 ? (embd > 0 ? "attn_pdrop" : "embd_pdrop") : "resid_pdrop",
                 "some of resid_pdrop, embd_pdrop and attn_pdrop are 0 and some are not: not modelled",
                 "the gpt analytic model has all three dropouts (all above 0) or none (all 0)");
  s.dropout = all;
  const auto must = [&](const char* key, bool want, const char* why) {
    if (c.opt_bool(key, want) != want)
      c.fail_value(key, fmt::format("{} = {} is not modelled", key, want ? "false" : "true"), why);
  };
  must("scale_attn_weights", true, "the gpt analytic model scales the scores by 1/sqrt(d), as GPT-2 does");
  must("scale_attn_by_inverse_layer_idx", false, "every block of the gpt analytic model is the same graph");
  must("reorder_and_upcast_attn", false, "the gpt analytic model computes the scores in the model's dtype");
  must("add_cross_attention", false, "the gpt analytic model is a decoder without cross-attention");
  s.tied_head = c.opt_bool("tie_word_embeddings", true);
  c.refuse_others({"n_ctx", "layer_norm_epsilon", "summary_type", "summary_use_proj", "summary_activation",
                   "summary_proj_to_labels", "summary_first_dropout"},
                  "gpt2");
}

// gpt_neox: GPT-NeoX and Pythia (the neox family, transformers' GPTNeoXForCausalLM).
void read_neox(HfConfig& c, bool seq_len_given, AnalyticSpec& s) {
  s.family = ModelFamily::Neox;
  read_dims(c, {"num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"}, "gpt_neox",
            seq_len_given, s);
  s.ffn = c.req_int("intermediate_size", 1, 4 * kMaxDim, "gpt_neox");
  const std::string act = c.opt_string("hidden_act", "gelu");
  if (act == "gelu" || act == "gelu_pytorch_tanh") {
    s.act = MlpActivation::Gelu;
  } else if (act == "gelu_new" || act == "gelu_fast") {
    s.act = MlpActivation::GeluNew;  // gelu_fast's Python formula (9 kernels eager) is costed as gelu_new's 8
  } else {
    c.fail_value("hidden_act", fmt::format("hidden_act \"{}\" is not modelled for gpt_neox", act),
                 "gelu, gelu_pytorch_tanh (one kernel), gelu_new or gelu_fast (GPT-2's Python tanh formula)");
  }
  const char* pct_key = c.has("partial_rotary_factor") ? "partial_rotary_factor" : "rotary_pct";
  if (c.has("partial_rotary_factor") && c.has("rotary_pct"))
    c.fail_value("partial_rotary_factor", "both rotary_pct and partial_rotary_factor are given",
                 "they are the same setting under transformers' old and new names: keep one");
  const double pct = c.opt_number(pct_key, 0.25);
  const int d = s.hidden / s.heads;
  const int dims = static_cast<int>(d * pct);  // transformers: int(head_size * rotary_pct)
  if (!(pct > 0 && pct <= 1) || dims < 2 || dims % 2 != 0)
    c.fail_value(pct_key,
                 fmt::format("{} = {} rotates {} of the head's {} dimensions: not an even number above 0", pct_key, pct,
                             dims, d),
                 "rotary embeddings rotate pairs of dimensions: a fraction in (0, 1] of an even count");
  s.rope_dims = dims == d ? 0 : dims;
  s.parallel_residual = c.opt_bool("use_parallel_residual", true);
  s.attn_bias = c.opt_bool("attention_bias", true) ? AttnBias::All : AttnBias::None;
  s.mlp_bias = true;
  s.tied_head = c.opt_bool("tie_word_embeddings", false);
  c.zero_dropout("attention_dropout", "gpt_neox");
  c.zero_dropout("hidden_dropout", "gpt_neox");
  check_rope_scaling(c, "rope_scaling");
  check_rope_scaling(c, "rope_parameters");
  c.refuse_others({"layer_norm_eps", "rotary_emb_base", "rope_theta", "classifier_dropout"}, "gpt_neox");
}

// Qwen2's window: only with use_sliding_window, on the layers from max_window_layers on; modelled when that is
// every layer (max_window_layers 0) or none (>= the layers).
void read_qwen2_window(HfConfig& c, AnalyticSpec& s) {
  const bool use = c.opt_bool("use_sliding_window", false);
  const auto w = c.opt_int("sliding_window", 1, kMaxDim);
  const auto from = c.opt_int("max_window_layers", 0, 10000);
  if (use && w) {
    const int first = from ? *from : 28;  // transformers' default max_window_layers
    if (first == 0) {
      s.sliding_window = *w;
    } else if (first < s.layers) {
      c.fail_value("max_window_layers",
                   fmt::format("layers {} to {} use the sliding window and the first {} do not: not modelled", first,
                               s.layers - 1, first),
                   "every block of the analytic model is the same graph: all layers windowed (max_window_layers 0) "
                   "or none (use_sliding_window false)");
    }
  }
  if (c.opt_bool("use_mrope", false))
    c.fail_value("use_mrope", "use_mrope (Qwen2-VL's multimodal rotary embedding) is not modelled",
                 "a text-only Qwen2 has use_mrope false");
}

// transformers' newer per-layer list: all full_attention (no window), or all sliding_attention (the window read).
void read_layer_types(HfConfig& c, AnalyticSpec& s) {
  const json* types = c.get("layer_types");
  if (!types) return;
  if (!types->is_array()) c.fail_value("layer_types", "layer_types must be a list", "one entry per layer");
  bool full = false, sliding = false;
  for (const json& t : *types) {
    full = full || t == "full_attention";
    sliding = sliding || t == "sliding_attention";
    if (t != "full_attention" && t != "sliding_attention")
      c.fail_value("layer_types", fmt::format("layer_types holds {}: not modelled", t.dump()),
                   "full_attention and sliding_attention are the layer types harmony models");
  }
  if (full && sliding)
    c.fail_value("layer_types", "layer_types mixes full and sliding-window attention: not modelled",
                 "every block of the analytic model is the same graph");
  if (full) s.sliding_window = 0;
}

// llama, mistral, qwen2, qwen3: the llama family (transformers' LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM).
void read_llama(HfConfig& c, const std::string& type, bool seq_len_given, AnalyticSpec& s) {
  s.family = ModelFamily::Llama;
  // transformers' modelling code keeps q_proj, k_proj, v_proj, gate_proj and up_proj apart with every attention
  // implementation and kernel style (the GEMMs priced, and the modules ZeRO-3 gathers)
  s.projections = Projections::Separate;
  read_dims(c, {"num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"}, type,
            seq_len_given, s);
  s.ffn = c.req_int("intermediate_size", 1, 4 * kMaxDim, type);
  if (const auto kv = c.opt_int("num_key_value_heads", 1, kMaxDim)) {
    if (s.heads % *kv != 0)
      c.fail_value("num_key_value_heads",
                   fmt::format("num_key_value_heads = {} does not divide num_attention_heads = {}", *kv, s.heads),
                   "each key/value head serves heads / num_key_value_heads query heads");
    s.kv_heads = *kv == s.heads ? 0 : *kv;
  }
  // transformers' LlamaAttention (and Mistral's, Qwen2's, Qwen3's): head_dim = config.head_dim, else hidden / heads;
  // q_proj is hidden -> heads x head_dim and o_proj back, whatever hidden is.
  if (const auto hd = c.opt_int("head_dim", 1, kMaxDim); hd && (*hd != s.hidden / s.heads || s.hidden % s.heads))
    s.head_dim = *hd;
  const std::string act = c.opt_string("hidden_act", "silu");
  if (act != "silu")
    c.fail_value("hidden_act", fmt::format("hidden_act \"{}\" is not modelled for {}", act, type),
                 "the llama family's MLP is SwiGLU: silu(gate) * up");
  s.tied_head = c.opt_bool("tie_word_embeddings", false);
  c.zero_dropout("attention_dropout", type);
  check_rope_scaling(c, "rope_scaling");
  check_rope_scaling(c, "rope_parameters");
  const std::vector<std::string> known = {"rms_norm_eps", "rope_theta"};
  if (type == "llama") {
    s.attn_bias = c.opt_bool("attention_bias", false) ? AttnBias::All : AttnBias::None;
    s.mlp_bias = c.opt_bool("mlp_bias", false);
    if (const auto tp = c.opt_int("pretraining_tp", 1, kMaxDim); tp && *tp != 1)
      c.fail_value("pretraining_tp", fmt::format("pretraining_tp = {} is not modelled", *tp),
                   "transformers' eager code then splits every projection into slices; set it to 1 in a copy (the "
                   "math is the same)");
  } else if (type == "mistral") {
    // transformers' MistralConfig defaults sliding_window to 4096 when the key is absent; null turns it off
    const bool present = c.present("sliding_window");
    const auto w = c.opt_int("sliding_window", 1, kMaxDim);
    s.sliding_window = w ? *w : (present ? 0 : 4096);
  } else if (type == "qwen2") {  // biases on q, k, v
    s.attn_bias = AttnBias::Qkv;
    read_qwen2_window(c, s);
  } else {  // qwen3: Qwen2's window keys, q_norm and k_norm, biases only with attention_bias (false in its configs)
    s.qk_norm = true;
    s.attn_bias = c.opt_bool("attention_bias", false) ? AttnBias::All : AttnBias::None;
    read_qwen2_window(c, s);
  }
  read_layer_types(c, s);
  c.refuse_others(known, type);
}

}  // namespace

AnalyticSpec read_hf_config(const std::string& path, const SourceLoc& ref, bool seq_len_given) {
  std::string problem;
  auto text = config_detail::read_text_file(path, &problem);
  if (!text)
    fail(ref, fmt::format("cannot read model.hf_config '{}': {}", path, problem),
         "name a Hugging Face config.json (relative paths are taken from this config file's folder)");
  HfConfig c(path, std::move(*text));
  c.parse();
  const std::string type = c.opt_string("model_type", "");
  if (type.empty())
    fail(SourceLoc{path, 1, 1}, fmt::format("{} has no model_type", path),
         fmt::format("a Hugging Face config.json names its architecture in model_type; harmony reads {}",
                     join(kModelTypes)));
  if (std::find(kModelTypes.begin(), kModelTypes.end(), type) == kModelTypes.end())
    c.fail_value("model_type", fmt::format("model_type \"{}\" is not one harmony models", type),
                 fmt::format("model types: {} (mixture-of-experts models such as mixtral and qwen2_moe are not "
                             "modelled)",
                             join(kModelTypes)));
  AnalyticSpec s;
  s.name = name_of(path);
  if (type == "gpt2") {
    read_gpt2(c, seq_len_given, s);
  } else if (type == "gpt_neox") {
    read_neox(c, seq_len_given, s);
  } else {
    read_llama(c, type, seq_len_given, s);
  }
  return s;
}

}  // namespace harmony::core
