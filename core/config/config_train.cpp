// harmony-run's config (TrainConfig): the sections of a harmony-sim config plus the model shape or weights,
// `device:`, `train:` with its data, and `checkpoint:`. The loaders are in config.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "core/config/config_internal.hpp"

namespace harmony::core {
namespace config_detail {

namespace {

// ------------------------------------------------------------------------------------------------
// harmony-run's config: the harmony-sim sections plus model shape, training, data and checkpoints.

const std::vector<std::string> kTrainTopKeys = {"model",   "machine", "device", "cost_model", "plan",
                                                "options", "search",  "train",  "checkpoint"};
const std::vector<std::string> kTrainModelKeys = {"gpt2",    "llama",   "weights",  "n_head",
                                                  "seq_len", "profile", "init_seed"};
const std::vector<std::string> kGpt2Keys = {"vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
const std::vector<std::string> kLlamaKeys = {"vocab_size",   "max_seq_len",   "n_layer",           "n_head",
                                             "n_kv_head",    "n_embd",        "intermediate_size", "rope_theta",
                                             "rms_norm_eps", "tie_embeddings"};
const std::vector<std::string> kTrainKeys = {"steps", "data", "lr", "beta1", "beta2", "eps", "weight_decay", "dtype"};
const std::vector<std::string> kDataKeys = {"file", "synthetic_tokens", "seed"};
const std::vector<std::string> kCheckpointKeys = {"dir", "every", "keep"};

double get_nonneg_double(const Node& v, const std::string& what, double below = 0.0) {
  const std::string hint = below > 0.0 ? fmt::format("write a number in [0, {})", below)
                                       : std::string("write a non-negative number, e.g. 0.001 or 1e-3");
  const std::string& s = expect_scalar(v, what, "a number", hint);
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value))
    fail(v.loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  if (value < 0.0 || (below > 0.0 && value >= below))
    fail(v.loc, fmt::format("{} = {} is out of range", what, s), hint);
  return value;
}

std::uint64_t get_u64(const Node& v, const std::string& what) {
  const std::string hint = "write a whole number, 0 or more";
  const std::string& s = expect_scalar(v, what, "an integer", hint);
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
    fail(v.loc, fmt::format("{} must be a whole number, got '{}'", what, s), hint);
  return value;
}

// model.gpt2 or (llama) model.llama.
Gpt2Shape parse_gpt2_shape(const Entry& e, bool llama) {
  const std::string section = llama ? "model.llama" : "model.gpt2";
  const std::string example =
      llama ? "llama: {vocab_size: 256, max_seq_len: 64, n_layer: 4, n_head: 4, n_kv_head: 2, n_embd: 64, "
              "intermediate_size: 172}"
            : "gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}";
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("{} must be a mapping, got {}", section, describe(e.value)), example);
  check_keys(e.value, section, llama ? kLlamaKeys : kGpt2Keys);
  Gpt2Shape g;
  g.llama = llama;
  auto need = [&](const char* key, int min) {
    const Entry& k = require(e.value, key, section, e.key_loc, example);
    return get_int(k.value, fmt::format("{}.{}", section, key), min);
  };
  g.vocab_size = need("vocab_size", 2);
  if (g.vocab_size > 65536)
    fail(find(e.value, "vocab_size")->value.loc,
         fmt::format("{}.vocab_size = {} exceeds 65536, the most a uint16 token file can address", section,
                     g.vocab_size),
         "use a vocabulary of at most 65536 tokens");
  g.max_seq_len = need("max_seq_len", 1);
  g.n_layer = need("n_layer", 1);
  g.n_head = need("n_head", 1);
  g.n_embd = need("n_embd", 1);
  if (g.n_embd % g.n_head != 0)
    fail(find(e.value, "n_embd")->value.loc,
         fmt::format("{}.n_embd = {} is not a multiple of n_head = {}", section, g.n_embd, g.n_head),
         "each head gets n_embd / n_head channels: pick n_embd divisible by n_head");
  if (!llama) return g;
  if ((g.n_embd / g.n_head) % 2 != 0)
    fail(find(e.value, "n_embd")->value.loc,
         fmt::format("model.llama: the head width n_embd / n_head = {} is odd; rotary embeddings rotate pairs",
                     g.n_embd / g.n_head),
         "pick n_embd / n_head even");
  g.intermediate_size = need("intermediate_size", 1);
  if (const Entry* k = find(e.value, "n_kv_head")) {
    g.n_kv_head = get_int(k->value, "model.llama.n_kv_head", 1);
    if (g.n_head % g.n_kv_head != 0)
      fail(k->value.loc, fmt::format("model.llama.n_kv_head = {} does not divide n_head = {}", g.n_kv_head, g.n_head),
           "each key/value head serves n_head / n_kv_head query heads: pick a divisor of n_head");
  }
  if (const Entry* k = find(e.value, "rope_theta"))
    g.rope_theta = get_positive_double(k->value, "model.llama.rope_theta");
  if (const Entry* k = find(e.value, "rms_norm_eps"))
    g.rms_norm_eps = get_positive_double(k->value, "model.llama.rms_norm_eps");
  if (const Entry* k = find(e.value, "tie_embeddings"))
    g.tie_embeddings = get_bool(k->value, "model.llama.tie_embeddings");
  return g;
}

// model: a shape (gpt2 or llama) or weights, with seq_len and the optional n_head, profile and init_seed.
void parse_train_model(TrainConfig& cfg, const Node& root, const std::string& file, const std::string& base_dir,
                       const char* start_hint) {
  const Node* model = section_map(root, "model");
  if (!model) fail(SourceLoc{file, 0, 0}, "missing required section 'model'", start_hint);
  const SourceLoc model_loc = find(root, "model")->key_loc;
  cfg.model.loc = model_loc;
  check_keys(*model, "model", kTrainModelKeys);
  const Entry* gpt2 = find(*model, "gpt2");
  const Entry* llama = find(*model, "llama");
  const Entry* weights = find(*model, "weights");
  if (gpt2 && llama)
    fail(llama->key_loc, "model.gpt2 and model.llama are both given",
         fmt::format("give one shape: the GPT-2 at {} or this Llama", gpt2->key_loc.str()));
  const Entry* shape = gpt2 ? gpt2 : llama;
  if (shape && weights)
    fail(weights->key_loc, fmt::format("model.{} and model.weights are both given", shape->key),
         fmt::format("give one: a shape to initialise ({}: at {}) or a safetensors file to load", shape->key,
                     shape->key_loc.str()));
  if (!shape && !weights)
    fail(model_loc, "model needs model.gpt2 or model.llama (a shape) or model.weights (a safetensors file)",
         "e.g. gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}");
  if (shape) cfg.model.gpt2 = parse_gpt2_shape(*shape, shape == llama);
  if (weights) cfg.model.weights_path = resolve_path(base_dir, get_string(weights->value, "model.weights"));
  if (const Entry* e = find(*model, "n_head")) {
    if (!weights)
      fail(e->key_loc, "model.n_head goes with model.weights (it overrides the heads of loaded weights)",
           "for a fresh model give the heads in model.gpt2: {..., n_head: H}");
    cfg.model.n_head = get_int(e->value, "model.n_head", 1);
  }
  const Entry& seq = require(*model, "seq_len", "model", model_loc, "add `seq_len: T` (tokens per sequence)");
  cfg.model.seq_len = get_int(seq.value, "model.seq_len", 1);
  if (cfg.model.gpt2 && cfg.model.seq_len > cfg.model.gpt2->max_seq_len)
    fail(seq.value.loc,
         fmt::format("model.seq_len = {} exceeds model.{}.max_seq_len = {}", cfg.model.seq_len, shape->key,
                     cfg.model.gpt2->max_seq_len),
         "use a shorter sequence or a larger position table");
  if (const Entry* e = find(*model, "profile"))
    cfg.model.profile_path = resolve_path(base_dir, get_string(e->value, "model.profile"));
  if (const Entry* e = find(*model, "init_seed")) cfg.model.init_seed = get_u64(e->value, "model.init_seed");
}

// plan, options and search as harmony-run reads them, checked by plan.mode's kind's rules with equal microbatches.
void parse_train_plan(TrainConfig& cfg, const Node& root, const std::string& file, bool plan_searched,
                      const char* start_hint) {
  const Node* plan = section_map(root, "plan");
  if (!plan) fail(SourceLoc{file, 0, 0}, "missing required section 'plan'", start_hint);
  PlanLocs plan_locs;
  cfg.plan = parse_plan(*plan, find(root, "plan")->key_loc, plan_locs, cfg.machine);
  // harmony-run keeps the paper's defaults (prefetch off, minimum pack counts): its runs and --plan auto
  // choices stay as they were; both keys can be set.
  cfg.options = parse_options(section_map(root, "options"), false);
  SearchLocs search_locs;
  cfg.search = parse_search(section_map(root, "search"), search_locs, PackCounts::Minimum, cfg.plan.knobs.swap,
                            cfg.plan.knobs.zero3);
  if (cfg.options.unequal_microbatches)
    fail(find(*section_map(root, "options"), "unequal_microbatches")->value.loc,
         "options.unequal_microbatches is not supported by harmony-run", "remove it: the runtime needs D % u == 0");
  RunConfig as_run;
  as_run.file = file;
  as_run.machine = cfg.machine;
  as_run.plan = cfg.plan;
  if (plan_searched) as_run.plan.u_fwd = as_run.plan.u_bwd = std::nullopt;  // the search replaces them
  as_run.search = cfg.search;
  as_run.options = cfg.options;
  // plan.mode's kind's rules (a kind without packs on the one microbatch size it runs, plan.u_bwd), with equal
  // microbatches (the runtime's).
  check_plan(as_run, UnequalMicrobatches::Refused, plan_locs, search_locs);
}

// train.data: a token file's path, or a mapping with a file or a synthetic task's size and seed.
void parse_train_data(TrainConfig& cfg, const Entry& e, const std::string& base_dir) {
  cfg.train.data.loc = e.value.loc;
  const char* data_hint =
      "write `data: PATH` (llm.c uint16 token file), `data: {file: PATH}` or `data: {synthetic_tokens: 65536, "
      "seed: 1}` for the synthetic task";
  if (e.value.kind == Node::Kind::Scalar) {
    cfg.train.data.path = resolve_path(base_dir, get_string(e.value, "train.data"));
  } else if (e.value.kind == Node::Kind::Map) {
    check_keys(e.value, "train.data", kDataKeys);
    const Entry* f = find(e.value, "file");
    const Entry* n = find(e.value, "synthetic_tokens");
    if (f && n) fail(n->key_loc, "train.data.file and train.data.synthetic_tokens are both given", data_hint);
    if (f) cfg.train.data.path = resolve_path(base_dir, get_string(f->value, "train.data.file"));
    if (n) cfg.train.data.synthetic_tokens = get_int(n->value, "train.data.synthetic_tokens", 2);
    if (const Entry* s = find(e.value, "seed")) cfg.train.data.seed = get_u64(s->value, "train.data.seed");
  } else {
    fail(e.value.loc, fmt::format("train.data must be a path or a mapping, got {}", describe(e.value)), data_hint);
  }
}

// train: steps, AdamW's hyperparameters, the dtype and the data.
void parse_train_section(TrainConfig& cfg, const Node& root, const std::string& file, const std::string& base_dir) {
  const Node* train = section_map(root, "train");
  if (!train) fail(SourceLoc{file, 0, 0}, "missing required section 'train'", "add `train: {steps: 100}`");
  const SourceLoc train_loc = find(root, "train")->key_loc;
  check_keys(*train, "train", kTrainKeys);
  cfg.train.steps = get_int(require(*train, "steps", "train", train_loc, "add `steps: S`").value, "train.steps", 1);
  if (const Entry* e = find(*train, "lr")) cfg.train.lr = get_nonneg_double(e->value, "train.lr");
  if (const Entry* e = find(*train, "beta1")) cfg.train.beta1 = get_nonneg_double(e->value, "train.beta1", 1.0);
  if (const Entry* e = find(*train, "beta2")) cfg.train.beta2 = get_nonneg_double(e->value, "train.beta2", 1.0);
  if (const Entry* e = find(*train, "eps")) cfg.train.eps = get_nonneg_double(e->value, "train.eps");
  if (const Entry* e = find(*train, "weight_decay"))
    cfg.train.weight_decay = get_nonneg_double(e->value, "train.weight_decay");
  if (const Entry* e = find(*train, "dtype")) {
    cfg.train.dtype = get_string(e->value, "train.dtype");
    if (cfg.train.dtype != "fp32" && cfg.train.dtype != "bf16")
      fail(e->value.loc, fmt::format("train.dtype must be fp32 or bf16, got '{}'", cfg.train.dtype),
           "fp32 (the default) or bf16 (mixed precision: bf16 on the devices, fp32 master weights and AdamW on the "
           "host; docs/backend.md)");
  }
  cfg.train.data.loc = train_loc;
  if (const Entry* e = find(*train, "data")) parse_train_data(cfg, *e, base_dir);
}

}  // namespace

TrainConfig build_train_config(Node root, const std::string& file, const std::vector<std::string>& overrides,
                               bool plan_searched, const std::vector<FlagOverride>& flags) {
  const char* start_hint =
      "a harmony-run config needs `model: {gpt2: {...}, seq_len: T}`, `plan: {mode: harmony-pp, gpus: N, "
      "minibatch: B, ...}` and `train: {steps: S}`; see configs/run/default.yaml and docs/config.md";
  open_root(root, file, overrides, kTrainTopKeys, start_hint, flags);
  TrainConfig cfg;
  cfg.file = file;
  const std::string base_dir = parent_dir(file);

  parse_train_model(cfg, root, file, base_dir, start_hint);
  cfg.machine = parse_machine_section(root, file, base_dir);
  if (const Entry* e = find(root, "cost_model")) cfg.cost_model = parse_cost_model(*e);
  cfg.device_loc = SourceLoc{file, 0, 0};
  if (const Entry* e = find(root, "device")) {
    // The name is checked against the device registry by harmony-run (backend/registry.hpp), at device_loc.
    cfg.device = expect_scalar(e->value, "device", "a device kind", "e.g. device: cpu (harmony-run lists the kinds)");
    cfg.device_loc = e->value.loc;
  }
  parse_train_plan(cfg, root, file, plan_searched, start_hint);
  parse_train_section(cfg, root, file, base_dir);

  if (const Node* ck = section_map(root, "checkpoint")) {
    check_keys(*ck, "checkpoint", kCheckpointKeys);
    if (const Entry* e = find(*ck, "dir"))
      cfg.checkpoint.dir = resolve_path(base_dir, get_string(e->value, "checkpoint.dir"));
    if (const Entry* e = find(*ck, "every")) cfg.checkpoint.every = get_int(e->value, "checkpoint.every", 0);
    if (const Entry* e = find(*ck, "keep")) cfg.checkpoint.keep = get_int(e->value, "checkpoint.keep", 1);
  }
  return cfg;
}

}  // namespace config_detail

}  // namespace harmony::core
