// The model side of a config: `model:` ({profile: PATH}, {analytic: NAME | {...}} with the shape keys checked per
// family, or {hf_config: PATH} with run keys beside it), `cost_model:`, and load_model, which turns a ModelSpec into
// a Model on a machine (docs/config.md, "model"). Shared with config.cpp and config_train.cpp through
// config_internal.hpp.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/config/config_hf.hpp"
#include "core/config/config_internal.hpp"
#include "core/model/analytic.hpp"
#include "core/model/profile.hpp"

namespace harmony::core {
namespace config_detail {

namespace {

// ------------------------------------------------------------------------------------------------
// model: {profile: PATH}, {analytic: NAME | {...}} or {hf_config: PATH, ...} (docs/config.md, "model")
// The keys beside hf_config: how the model described by the file is run (they change no parameter).
const std::vector<std::string> kHfRunKeys = {
    "name",          "seq_len",  "dtype",         "optimizer",   "kernels", "ubatch_sizes", "master_weights",
    "cpu_optimizer", "autocast", "gpu_optimizer", "loss_chunks", "trainer", "tf32"};
const std::vector<std::string> kModelKeys = {"profile",       "analytic",       "hf_config",     "name",
                                             "seq_len",       "dtype",          "optimizer",     "kernels",
                                             "ubatch_sizes",  "master_weights", "cpu_optimizer", "autocast",
                                             "gpu_optimizer", "loss_chunks",    "trainer",       "tf32"};
const std::vector<std::string> kAnalyticKeys = {"preset",
                                                "family",
                                                "name",
                                                "layers",
                                                "hidden",
                                                "heads",
                                                "ffn",
                                                "seq_len",
                                                "vocab",
                                                "tied_head",
                                                "head",
                                                "labels",
                                                "image_size",
                                                "classes",
                                                "dtype",
                                                "optimizer",
                                                "kernels",
                                                "dropout",
                                                "ubatch_sizes",
                                                "layers_per_block",
                                                "positions",
                                                "kv_heads",
                                                "head_dim",
                                                "qk_norm",
                                                "attn_bias",
                                                "mlp_bias",
                                                "sliding_window",
                                                "rope",
                                                "rope_dims",
                                                "parallel_residual",
                                                "act",
                                                "master_weights",
                                                "cpu_optimizer",
                                                "autocast",
                                                "projections",
                                                "gpu_optimizer",
                                                "loss_chunks",
                                                "trainer",
                                                "tf32"};
const std::vector<std::string> kFamilies = {"gpt", "bert", "resnet", "llama", "neox"};
const std::vector<std::string> kActivations = {"gelu", "gelu_new"};
const std::vector<std::string> kDTypes = {"fp32", "fp16", "bf16"};
const std::vector<std::string> kOptimizers = {"adam", "sgd", "momentum"};
const std::vector<std::string> kCpuOptimizers = {"deepspeed", "torch"};              // CpuOptimizerImpl order
const std::vector<std::string> kGpuOptimizers = {"fused", "foreach"};                // GpuOptimizerImpl order
const std::vector<std::string> kKernelStyles = {"eager", "fused", "flash", "sdpa"};  // KernelStyle order
const std::vector<std::string> kTrainers = {"framework", "engine"};                  // Trainer order
const std::vector<std::string> kProjections = {"auto", "separate", "packed"};        // Projections order
const std::vector<std::string> kBertHeads = {"mlm", "classifier"};
const std::vector<std::string> kGptHeads = {"lm", "none"};

// One of `names` (the enum value at the same index).
std::size_t get_choice(const Node& v, const std::string& what, const std::vector<std::string>& names,
                       std::string_view kind) {
  const std::string& s = expect_scalar(v, what, std::string(kind), fmt::format("{}: {}", kind, join(names)));
  const auto it = std::find(names.begin(), names.end(), s);
  if (it == names.end())
    fail(v.loc, fmt::format("unknown {} '{}'", what, s), suggestion_hint(s, names, std::string(kind)));
  return static_cast<std::size_t>(it - names.begin());
}

[[noreturn]] void fail_unknown_model_preset(const std::string& name, const SourceLoc& loc) {
  fail(loc, fmt::format("unknown analytic model preset '{}'", name),
       suggestion_hint(name, analytic_preset_names(), "presets") +
           "; or describe the shape: {family: gpt, layers: 24, hidden: 1024, heads: 16, seq_len: 1024, vocab: 50257}");
}

// name, dtype, optimizer, cpu_optimizer, gpu_optimizer, kernels, ubatch_sizes, master_weights, autocast: the keys of
// both model.analytic and the run keys beside model.hf_config (`what` is the mapping's path for messages).
void apply_run_keys(const Node& map, const std::string& what, AnalyticSpec& spec) {
  if (const Entry* x = find(map, "name")) spec.name = get_string(x->value, what + ".name");
  if (const Entry* x = find(map, "master_weights")) spec.master_weights = get_bool(x->value, what + ".master_weights");
  if (const Entry* x = find(map, "autocast")) spec.autocast = get_bool(x->value, what + ".autocast");
  if (const Entry* x = find(map, "dtype"))
    spec.dtype = static_cast<DType>(get_choice(x->value, what + ".dtype", kDTypes, "dtypes"));
  if (const Entry* x = find(map, "optimizer"))
    spec.optimizer = static_cast<OptimizerKind>(get_choice(x->value, what + ".optimizer", kOptimizers, "optimizers"));
  if (const Entry* x = find(map, "cpu_optimizer"))
    spec.cpu_optimizer = static_cast<CpuOptimizerImpl>(
        get_choice(x->value, what + ".cpu_optimizer", kCpuOptimizers, "CPU optimizer implementations"));
  if (const Entry* x = find(map, "gpu_optimizer"))
    spec.gpu_optimizer = static_cast<GpuOptimizerImpl>(
        get_choice(x->value, what + ".gpu_optimizer", kGpuOptimizers, "GPU optimizer implementations"));
  if (const Entry* x = find(map, "kernels"))
    spec.kernels = static_cast<KernelStyle>(get_choice(x->value, what + ".kernels", kKernelStyles, "kernel styles"));
  if (const Entry* x = find(map, "trainer"))
    spec.trainer = static_cast<Trainer>(get_choice(x->value, what + ".trainer", kTrainers, "trainers"));
  if (const Entry* x = find(map, "tf32")) spec.tf32 = get_bool(x->value, what + ".tf32");
  if (const Entry* x = find(map, "loss_chunks")) spec.loss_chunks = get_int(x->value, what + ".loss_chunks", 1);
  if (const Entry* x = find(map, "ubatch_sizes")) {
    spec.ubatch_sizes.clear();
    const std::string w = what + ".ubatch_sizes";
    for (const Node* item : get_list(x->value, w, "ubatch_sizes: [1, 2, 4, 8, 16]")) {
      const int u = get_int(*item, w + " entries", 1);
      if (!spec.ubatch_sizes.empty() && u <= spec.ubatch_sizes.back())
        fail(item->loc, fmt::format("{} must be strictly ascending: {} follows {}", w, u, spec.ubatch_sizes.back()),
             "list each microbatch size once, smallest first, e.g. [1, 2, 4, 8, 16]");
      spec.ubatch_sizes.push_back(u);
    }
    if (spec.ubatch_sizes.empty())
      fail(x->value.loc, fmt::format("{} must list at least one size", w), "e.g. ubatch_sizes: [1, 2, 4, 8, 16]");
  }
}

// attn_bias: true (q, k, v and o), false, or qkv (q, k and v only, as Qwen2; llama only).
AttnBias get_attn_bias(const Node& v, const std::string& what, bool llama) {
  if (llama && v.kind == Node::Kind::Scalar && v.scalar == "qkv") return AttnBias::Qkv;
  const std::string hint = llama ? "true (biases on q, k, v and o, Llama's attention_bias), false, or qkv (on q, k "
                                   "and v only, as Qwen2)"
                                 : "true (biases on query_key_value and dense, GPT-NeoX's default) or false";
  const std::string& s = expect_scalar(v, what, llama ? "true, false or qkv" : "true or false", hint);
  if (s == "true" || s == "True" || s == "TRUE") return AttnBias::All;
  if (s == "false" || s == "False" || s == "FALSE") return AttnBias::None;
  fail(v.loc, fmt::format("{} must be {}, got '{}'", what, llama ? "true, false or qkv" : "true or false", s), hint);
}

// The spec a model.analytic mapping starts from: its preset, or an empty shape of its family with the family's
// defaults (llama and neox: their own LM head; neox: biases).
AnalyticSpec analytic_start(const Entry& e, const std::string& what) {
  const Node& map = e.value;
  AnalyticSpec spec;
  const Entry* preset = find(map, "preset");
  const Entry* family = find(map, "family");
  if (preset) {
    const std::string name = get_string(preset->value, what + ".preset");
    const auto p = analytic_preset(name);
    if (!p) fail_unknown_model_preset(name, preset->value.loc);
    spec = *p;
  }
  if (family) {
    const auto f = static_cast<ModelFamily>(get_choice(family->value, what + ".family", kFamilies, "families"));
    if (preset && f != spec.family)
      fail(family->value.loc,
           fmt::format("{}.family '{}' contradicts preset '{}' ({})", what, family->value.scalar, preset->value.scalar,
                       kFamilies[static_cast<std::size_t>(spec.family)]),
           "leave family out when a preset is given");
    if (!preset) {
      spec.family = f;
      if (f == ModelFamily::Llama || f == ModelFamily::Neox) spec.tied_head = false;  // as their published configs
      if (f == ModelFamily::Neox) {
        spec.attn_bias = AttnBias::All;
        spec.mlp_bias = true;
      }
    }
  } else if (!preset) {
    fail(e.key_loc, fmt::format("{} needs a family or a preset", what),
         fmt::format("add family: gpt (or bert, resnet, llama, neox), or preset: NAME; presets: {}",
                     join(analytic_preset_names())));
  }
  return spec;
}

// Keys that belong to other families are errors, not silently ignored.
void check_family_keys(const Node& map, const std::string& what, ModelFamily family) {
  const bool resnet = family == ModelFamily::Resnet, gpt = family == ModelFamily::Gpt;
  const bool bert = family == ModelFamily::Bert, llama = family == ModelFamily::Llama;
  const bool neox = family == ModelFamily::Neox;
  const auto only_for = [&](std::string_view key, bool ok, std::string_view families) {
    if (const Entry* x = find_any(map, key); x && !ok)
      fail(x->key_loc,
           fmt::format("{}.{} does not apply to family {}", what, key, kFamilies[static_cast<std::size_t>(family)]),
           fmt::format("{} is a key of {} models only", key, families));
  };
  for (const char* key : {"hidden", "heads", "ffn", "seq_len", "vocab", "tied_head", "kernels"})
    only_for(key, !resnet, "gpt, bert, llama and neox");
  only_for("dropout", gpt || bert, "gpt and bert (llama and neox have no dropout)");
  only_for("head", gpt || bert, "gpt and bert");
  only_for("labels", bert, "bert");
  only_for("image_size", resnet, "resnet");
  only_for("classes", resnet, "resnet");
  only_for("layers_per_block", gpt, "gpt");
  only_for("positions", gpt, "gpt");
  only_for("kv_heads", llama, "llama");
  only_for("head_dim", llama, "llama");
  only_for("qk_norm", llama, "llama");
  only_for("projections", llama, "llama");
  only_for("sliding_window", llama, "llama");
  only_for("rope_dims", neox, "neox");
  only_for("parallel_residual", neox, "neox");
  only_for("act", neox, "neox");
  for (const char* key : {"attn_bias", "mlp_bias", "rope"}) only_for(key, llama || neox, "llama and neox");
}

// head: gpt's lm or none, bert's mlm or classifier; one of the other family's is named as such, not as unknown.
void parse_head(const Node& map, const std::string& what, AnalyticSpec& spec) {
  const Entry* x = find(map, "head");
  if (!x) return;
  const bool gpt = spec.family == ModelFamily::Gpt;
  const std::string& fam = kFamilies[static_cast<std::size_t>(spec.family)];
  const std::vector<std::string>& own = gpt ? kGptHeads : kBertHeads;
  const std::vector<std::string>& other = gpt ? kBertHeads : kGptHeads;
  const std::string own_kind = fmt::format("{} heads", fam);
  if (x->value.kind == Node::Kind::Scalar && std::find(other.begin(), other.end(), x->value.scalar) != other.end())
    fail(x->value.loc, fmt::format("{}.head '{}' does not apply to family {}", what, x->value.scalar, fam),
         fmt::format("{}: {} ({} are {} heads)", own_kind, join(own), join(other), gpt ? "bert" : "gpt"));
  const std::size_t choice = get_choice(x->value, what + ".head", own, own_kind);
  if (gpt) {
    spec.gpt_head = static_cast<GptHead>(choice);
  } else {
    spec.bert_head = static_cast<BertHead>(choice);
  }
}

// The keys of the llama and neox families, and gpt's positions, each checked where it is written (run after the
// shape keys: kv_heads, rope_dims and positions are checked against heads, hidden and seq_len).
void parse_decoder_keys(const Node& map, const std::string& what, AnalyticSpec& spec) {
  const auto int_key = [&](std::string_view key, int& field, int min) -> const Entry* {
    const Entry* x = find(map, key);
    if (x) field = get_int(x->value, fmt::format("{}.{}", what, key), min);
    return x;
  };
  const Entry* positions = int_key("positions", spec.positions, 1);
  const Entry* kv_heads = int_key("kv_heads", spec.kv_heads, 1);
  int_key("head_dim", spec.head_dim, 1);
  if (const Entry* x = find(map, "qk_norm")) spec.qk_norm = get_bool(x->value, what + ".qk_norm");
  if (const Entry* x = find(map, "projections"))
    spec.projections =
        static_cast<Projections>(get_choice(x->value, what + ".projections", kProjections, "projection layouts"));
  int_key("sliding_window", spec.sliding_window, 1);
  const Entry* rope_dims = int_key("rope_dims", spec.rope_dims, 2);
  if (const Entry* x = find(map, "attn_bias"))
    spec.attn_bias = get_attn_bias(x->value, what + ".attn_bias", spec.family == ModelFamily::Llama);
  if (const Entry* x = find(map, "mlp_bias")) spec.mlp_bias = get_bool(x->value, what + ".mlp_bias");
  if (const Entry* x = find(map, "rope")) spec.rope = get_bool(x->value, what + ".rope");
  if (const Entry* x = find(map, "parallel_residual"))
    spec.parallel_residual = get_bool(x->value, what + ".parallel_residual");
  if (const Entry* x = find(map, "act"))
    spec.act = static_cast<MlpActivation>(get_choice(x->value, what + ".act", kActivations, "activations"));
  if (kv_heads && (spec.kv_heads > spec.heads || spec.heads % spec.kv_heads != 0))
    fail(kv_heads->value.loc,
         fmt::format("{}.kv_heads = {} does not divide heads = {}", what, spec.kv_heads, spec.heads),
         "grouped-query attention shares each key/value head among heads / kv_heads query heads");
  if (kv_heads && spec.kv_heads == spec.heads) spec.kv_heads = 0;  // one k and v per head: plain attention
  if (positions && spec.positions < spec.seq_len)
    fail(positions->value.loc,
         fmt::format("{}.positions = {} is below seq_len = {}", what, spec.positions, spec.seq_len),
         "the position table needs a row per token: positions >= seq_len");
  const int head_size = spec.heads > 0 ? spec.hidden / spec.heads : 0;
  if (rope_dims && (spec.rope_dims % 2 != 0 || spec.rope_dims > head_size))
    fail(rope_dims->value.loc,
         fmt::format("{}.rope_dims = {} is not an even number up to the head size ({})", what, spec.rope_dims,
                     head_size),
         "rotary embeddings rotate pairs of a head's dimensions");
}

AnalyticSpec parse_analytic(const Entry& e) {
  const std::string what = "model.analytic";
  if (e.value.kind == Node::Kind::Scalar) {
    const auto preset = analytic_preset(e.value.scalar);
    if (!preset) fail_unknown_model_preset(e.value.scalar, e.value.loc);
    return *preset;
  }
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("{} must be a preset name or a mapping, got {}", what, describe(e.value)),
         "e.g. analytic: gpt2-medium, or analytic: {preset: gpt3-13b, dtype: fp16}, or analytic: {family: gpt, "
         "layers: 24, hidden: 1024, heads: 16, seq_len: 1024, vocab: 50257}");
  const Node& map = e.value;
  check_keys(map, what, kAnalyticKeys);
  AnalyticSpec spec = analytic_start(e, what);
  const bool preset = find(map, "preset") != nullptr;
  const bool resnet = spec.family == ModelFamily::Resnet;
  const bool llama = spec.family == ModelFamily::Llama;
  const std::string& fam = kFamilies[static_cast<std::size_t>(spec.family)];
  check_family_keys(map, what, spec.family);
  const auto int_key = [&](std::string_view key, int& field, int min, bool required) -> const Entry* {
    const Entry* x = find(map, key);
    if (x) {
      field = get_int(x->value, fmt::format("{}.{}", what, key), min);
    } else if (required) {
      const std::string shape = resnet  ? "layers: 50 (the depth: 50, 101 or 152)"
                                : llama ? "layers, hidden, heads, ffn (the intermediate size), seq_len and vocab"
                                        : "layers, hidden, heads, seq_len and vocab";
      require(map, key, what, e.key_loc,
              fmt::format("a {} model without a preset needs {}; or start from a preset: {}", fam, shape,
                          join(analytic_preset_names())));
    }
    return x;
  };
  const Entry* layers = int_key("layers", spec.layers, 1, !preset);
  const Entry* hidden = int_key("hidden", spec.hidden, 1, !preset && !resnet);
  const Entry* heads = int_key("heads", spec.heads, 1, !preset && !resnet);
  int_key("ffn", spec.ffn, 1, !preset && llama);
  int_key("seq_len", spec.seq_len, 2, !preset && !resnet);
  int_key("vocab", spec.vocab, 2, !preset && !resnet);
  int_key("labels", spec.labels, 1, false);
  int_key("image_size", spec.image_size, 32, false);
  int_key("classes", spec.classes, 1, false);
  if (const Entry* x = find(map, "layers_per_block")) {
    spec.layers_per_block = get_int(x->value, what + ".layers_per_block", std::numeric_limits<int>::min());
    if (spec.layers_per_block != 1 && spec.layers_per_block != 2)
      fail(x->value.loc, fmt::format("{}.layers_per_block = {} is not 1 or 2", what, spec.layers_per_block),
           "layers_per_block: 1 (a layer per block) or 2 (its attention and MLP halves, as LoHan checkpoints them)");
  }
  if (const Entry* x = find(map, "tied_head")) spec.tied_head = get_bool(x->value, what + ".tied_head");
  if (const Entry* x = find(map, "dropout")) spec.dropout = get_bool(x->value, what + ".dropout");
  parse_head(map, what, spec);
  if (const Entry* x = find(map, "tied_head"); x && spec.gpt_head == GptHead::None)
    fail(x->key_loc, fmt::format("{}.tied_head does not apply with head: none", what),
         "a GPT without an LM head has no output projection to tie to the embedding: drop tied_head, or use head: lm");
  apply_run_keys(map, what, spec);
  // Shape checks, located at the key that breaks them (the rest at `analytic:`).
  if (resnet && spec.layers != 50 && spec.layers != 101 && spec.layers != 152)
    fail(layers ? layers->value.loc : e.key_loc, fmt::format("{}.layers = {} is not a ResNet depth", what, spec.layers),
         "resnet layers is the depth: 50, 101 or 152");
  if (!resnet && spec.heads > 0 && spec.hidden % spec.heads != 0 && !find(map, "head_dim"))
    fail(heads ? heads->value.loc : (hidden ? hidden->value.loc : e.key_loc),
         fmt::format("{}.heads = {} does not divide hidden = {}", what, spec.heads, spec.hidden),
         "the head size is hidden / heads: pick heads that divide hidden (llama: or give head_dim)");
  parse_decoder_keys(map, what, spec);
  if (const std::string problem = analytic_spec_problem(spec); !problem.empty())
    fail(e.key_loc, fmt::format("{}: {}", what, problem), "see docs/config.md, model.analytic");
  return spec;
}

// model: {hf_config: PATH, seq_len: ..., dtype: ..., ...}: the file's shape, run as the keys beside it say.
AnalyticSpec parse_hf_model(const Node& model, const Entry& hf, const std::string& base_dir) {
  const std::string path = resolve_path(base_dir, get_string(hf.value, "model.hf_config"));
  const Entry* seq = find(model, "seq_len");
  AnalyticSpec spec = read_hf_config(path, hf.value.loc, seq != nullptr);
  if (seq) {
    spec.seq_len = get_int(seq->value, "model.seq_len", 2);
    if (spec.positions > 0 && spec.seq_len > spec.positions)
      fail(seq->value.loc,
           fmt::format("model.seq_len = {} exceeds the {} positions of {}'s position table (n_positions)", spec.seq_len,
                       spec.positions, path),
           "a GPT-2 cannot run sequences longer than its position table");
  }
  apply_run_keys(model, "model", spec);
  if (const std::string problem = analytic_spec_problem(spec); !problem.empty())
    fail(seq ? seq->value.loc : hf.value.loc, fmt::format("model.hf_config {}: {}", path, problem),
         "see docs/config.md, model.hf_config");
  return spec;
}

}  // namespace

ModelSpec parse_model(const Node& model, const SourceLoc& model_loc, const std::string& base_dir) {
  check_keys(model, "model", kModelKeys);
  const Entry* profile = find(model, "profile");
  const Entry* analytic = find(model, "analytic");
  const Entry* hf = find(model, "hf_config");
  const std::string hint =
      "give `profile: PATH/TO/PROFILE.json` (a measured profile, relative to this file's folder), `analytic: NAME` / "
      "`analytic: {...}` (a model from formulas) or `hf_config: PATH/TO/config.json` (a Hugging Face model's "
      "config; docs/config.md)";
  const int given = (profile ? 1 : 0) + (analytic ? 1 : 0) + (hf ? 1 : 0);
  if (given > 1) {
    std::vector<std::string> names;
    for (const auto& [entry, key] : {std::pair{profile, "model.profile"}, std::pair{analytic, "model.analytic"},
                                     std::pair{hf, "model.hf_config"}}) {
      if (entry) names.emplace_back(key);
    }
    const Entry* second = hf && (profile || analytic) ? hf : analytic;
    fail(second->key_loc,
         given == 2 ? fmt::format("{} and {} are both given", names[0], names[1])
                    : fmt::format("{}, {} and {} are all given", names[0], names[1], names[2]),
         "give exactly one: " + hint);
  }
  if (!hf) {
    for (const std::string& key : kHfRunKeys) {
      if (const Entry* x = find_any(model, key))
        fail(x->key_loc, fmt::format("model.{} goes beside model.hf_config only", key),
             analytic ? fmt::format("with analytic, write it inside: analytic: {{preset: NAME, {}: ...}}", key)
                      : "a measured profile fixes its own sizes and microbatches");
    }
  }
  ModelSpec spec;
  if (hf) {
    spec.analytic = parse_hf_model(model, *hf, base_dir);
    spec.analytic_dtype_given = find(model, "dtype") != nullptr;
    if (const Entry* x = find(model, "master_weights")) spec.master_weights_loc = x->value.loc;
    if (const Entry* x = find(model, "autocast")) spec.autocast_loc = x->value.loc;
    if (const Entry* x = find(model, "trainer")) spec.trainer_loc = x->value.loc;
    if (const Entry* x = find(model, "tf32")) spec.tf32_loc = x->value.loc;
    spec.loc = hf->value.loc;
    return spec;
  }
  if (analytic) {
    spec.analytic = parse_analytic(*analytic);
    const bool map = analytic->value.kind == Node::Kind::Map;
    spec.analytic_dtype_given = map && find(analytic->value, "dtype") != nullptr;
    if (const Entry* x = map ? find(analytic->value, "master_weights") : nullptr)
      spec.master_weights_loc = x->value.loc;
    if (const Entry* x = map ? find(analytic->value, "autocast") : nullptr) spec.autocast_loc = x->value.loc;
    if (const Entry* x = map ? find(analytic->value, "trainer") : nullptr) spec.trainer_loc = x->value.loc;
    if (const Entry* x = map ? find(analytic->value, "tf32") : nullptr) spec.tf32_loc = x->value.loc;
    spec.loc = analytic->value.loc;
    return spec;
  }
  if (!profile) {
    if (const Entry* empty = find_any(model, "profile")) fail(empty->key_loc, "model.profile has no value", hint);
    if (const Entry* empty = find_any(model, "analytic")) fail(empty->key_loc, "model.analytic has no value", hint);
    if (const Entry* empty = find_any(model, "hf_config")) fail(empty->key_loc, "model.hf_config has no value", hint);
    fail(model_loc, "missing required field model.profile (or model.analytic, model.hf_config)", hint);
  }
  spec.profile_path = resolve_path(base_dir, get_string(profile->value, "model.profile"));
  spec.loc = profile->value.loc;
  return spec;
}

CostModelKind parse_cost_model(const Entry& e) {
  const std::string& name = expect_scalar(e.value, "cost_model", "a cost model name", "cost models: reference, native");
  const std::optional<CostModelKind> kind = parse_cost_model_kind(name);
  if (!kind)
    fail(e.value.loc, fmt::format("unknown cost_model '{}'", name),
         suggestion_hint(name, {"reference", "native"}, "cost models"));
  return *kind;
}

}  // namespace config_detail

using namespace config_detail;  // NOLINT(google-build-using-namespace): the loader's own internals

namespace {

// The run keys that depend on the machine or the dtype it chose (load_model), each error at the key written.
void check_run_keys(const ModelSpec& spec, const AnalyticSpec& a, const MachineSpec& machine) {
  if (a.tf32 && a.dtype != DType::Fp32)
    throw ConfigError(
        spec.tf32_loc,
        fmt::format("tf32: true runs an FP32 model's GEMMs on TF32 tensor cores, and the model's dtype is "
                    "{}",
                    a.dtype == DType::Bf16 ? "bf16" : "fp16"),
        "remove dtype (tf32 implies fp32) or write dtype: fp32; a 2-byte model's GEMMs are on the tensor "
        "cores already");
  if (a.tf32 && machine.gpu_rates.matrix_tf32_flops_per_s <= 0)
    throw ConfigError(spec.tf32_loc,
                      fmt::format("tf32: true prices GEMMs at the machine's TF32 tensor-core peak, and machine '{}' "
                                  "has no gpu_rates.matrix_tf32",
                                  machine.name),
                      "add gpu_rates: {matrix_tf32: R} to the machine, its dense TF32 peak from the GPU's spec sheet "
                      "(Ampere and later; docs/machines.md, matrix_tf32), or remove tf32 (a GPU without TF32 runs FP32 "
                      "GEMMs on its CUDA cores)");
  // why an unwritten dtype came out fp32
  const std::string why_fp32 =
      spec.analytic_dtype_given ? ""
      : a.tf32                  ? " (tf32: true makes it fp32)"
               : fmt::format(" (machine '{}' has no tensor-core rate above its FP32 one)", machine.name);
  if (!a.master_weights && a.dtype == DType::Fp32)
    throw ConfigError(spec.master_weights_loc,
                      fmt::format("master_weights: false (pure 2-byte training) needs a 2-byte dtype, and the model's "
                                  "is fp32{}",
                                  why_fp32),
                      "set dtype: bf16 (or fp16) beside it, or remove master_weights");
  if (a.autocast && a.dtype == DType::Fp32)
    throw ConfigError(spec.autocast_loc,
                      fmt::format("autocast: true (FP32 parameters, GEMMs cast to a 2-byte type) needs a 2-byte dtype, "
                                  "and the model's is fp32{}",
                                  why_fp32),
                      "set dtype: bf16 (or fp16) beside it: the type autocast computes in");
  if (a.autocast && !a.master_weights)
    throw ConfigError(spec.autocast_loc,
                      "autocast: true keeps FP32 parameters, gradients and optimizer state; master_weights: false "
                      "(pure 2-byte training) keeps none",
                      "remove master_weights: false (autocast), or remove autocast (pure 2-byte training)");
  if (a.trainer == Trainer::Engine && machine.gpu_rates.gemm_ceiling <= 0)
    throw ConfigError(spec.trainer_loc,
                      fmt::format("trainer: engine prices GEMMs at the machine's measured GEMM ceiling, and machine "
                                  "'{}' has no gpu_rates.gemm_ceiling",
                                  machine.name),
                      "add gpu_rates: {gemm_ceiling: F} to the machine, the fraction of matrix_fp16 a GEMM "
                      "microbenchmark reaches on that GPU (docs/machines.md, gemm_ceiling), or use trainer: framework");
}

}  // namespace

Model load_model(const ModelSpec& spec, const MachineSpec& machine) {
  if (!spec.analytic) return load_profile(spec.profile_path);
  if (!machine.gpu_rates.valid()) {
    std::vector<std::string> with_rates;
    for (const std::string& name : machine_preset_names()) {
      if (machine_preset(name).gpu_rates.valid()) with_rates.push_back(name);
    }
    throw ConfigError(
        spec.loc,
        fmt::format("an analytic model needs the machine's gpu_rates, and machine '{}' has none", machine.name),
        fmt::format("add gpu_rates: {{matrix_fp32: ..., memory: ...}} to the machine (docs/machines.md), "
                    "or start from a preset that has them: {}",
                    join(with_rates)));
  }
  AnalyticSpec a = *spec.analytic;
  // tf32 is an FP32 model's option: it fixes the dtype the machine would otherwise choose
  if (!spec.analytic_dtype_given)
    a.dtype = a.tf32 || machine.gpu_rates.matrix_fp16_flops_per_s <= machine.gpu_rates.matrix_fp32_flops_per_s
                  ? DType::Fp32
                  : DType::Bf16;
  check_run_keys(spec, a, machine);
  return analytic_model(a, machine.gpu_rates, machine.cpu_adam);
}

}  // namespace harmony::core
