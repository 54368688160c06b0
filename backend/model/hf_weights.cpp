// Loading and saving GPT-2 and Llama-family weights under Hugging Face names (see hf_weights.hpp): the Hub's folder
// layout (model.safetensors or a sharded index + config.json), config inference from shapes checked against
// config.json, the transformer. prefix, the tied lm_head, ignored buffers, F16/BF16 tensors, config.json written back.
#include "backend/model/hf_weights.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/input_file.hpp"

namespace harmony::backend {
namespace {

std::string prefix_of(const WeightFiles& f) {
  if (f.find("wte.weight").file != nullptr) return "";
  if (f.find("transformer.wte.weight").file != nullptr) return "transformer.";
  throw FormatError(f.name(), 8, "no 'wte.weight' (or 'transformer.wte.weight') tensor: not a GPT-2 checkpoint");
}

WeightFiles::Found need(const WeightFiles& f, const std::string& name) {
  const WeightFiles::Found t = f.find(name);
  if (t.file == nullptr) throw FormatError(f.name(), 8, fmt::format("missing tensor '{}'", name));
  return t;
}

// The file offset of a tensor's data, for messages.
std::uint64_t at(const WeightFiles::Found& t) { return t.file->data_start() + t.info->begin; }

// "h.12.ln_1.weight" (after the prefix) -> 12; nullopt for other names.
std::optional<int> block_index(std::string_view rest) {
  if (!rest.starts_with("h.")) return std::nullopt;
  rest.remove_prefix(2);
  int i = -1;
  const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), i);
  if (ec != std::errc() || p == rest.data() + rest.size() || *p != '.' || i < 0) return std::nullopt;
  return i;
}

bool is_ignored_buffer(std::string_view rest) {
  if (rest.starts_with("model.layers.") && rest.ends_with(".self_attn.rotary_emb.inv_freq"))
    return true;  // older Llama checkpoints save RoPE's frequencies, recomputed here
  if (!block_index(rest)) return false;
  return rest.ends_with(".attn.bias") || rest.ends_with(".attn.masked_bias");
}

bool is_float(const std::string& dtype) { return dtype == "F32" || dtype == "F16" || dtype == "BF16"; }

// "PATH:LINE:COL" of byte POS of TEXT.
std::string text_loc(const std::string& path, const std::string& text, std::size_t pos) {
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n');
  const auto nl = text.rfind('\n', pos == 0 ? std::string::npos : pos - 1);
  const auto col = pos == 0 ? 1 : (nl == std::string::npos ? pos + 1 : pos - nl);
  return fmt::format("{}:{}:{}", path, line, col);
}

// "PATH:LINE:COL" of the first occurrence of "key" in a JSON text (of the text's start when absent).
std::string json_loc(const std::string& path, const std::string& text, const std::string& key) {
  const auto pos = text.find(nlohmann::json(key).dump());
  return text_loc(path, text, pos == std::string::npos ? 0 : pos);
}

// A Hugging Face config.json, read and parsed; errors name the file, line and column.
struct ConfigJson {
  std::string path;
  std::string text;
  nlohmann::json json;

  // Returned as a prvalue, built in place: a ConfigJson is never moved (its implicit noexcept move, over
  // nlohmann::json's, is what clang-tidy's bugprone-exception-escape flags).
  static ConfigJson read(const std::string& path) {
    std::string problem;
    auto text = core::try_read_input_file(path, &problem);
    if (!text) throw BackendError(fmt::format("{}: cannot read the model's config.json: {}", path, problem));
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      throw BackendError(
          fmt::format("{}: not valid JSON ({}); it should be the Hugging Face config.json that "
                      "came with the weights",
                      path, e.what()));
    }
    if (!json.is_object()) throw BackendError(fmt::format("{}:1:1: config.json must be a JSON object", path));
    return ConfigJson{path, std::move(*text), std::move(json)};
  }
  std::string loc(const std::string& key) const { return json_loc(path, text, key); }
  // A positive integer under KEY, nullopt when absent or null.
  std::optional<int> positive(const std::string& key) const {
    const auto it = json.find(key);
    if (it == json.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 || it->get<std::int64_t>() > 1'000'000'000)
      throw BackendError(fmt::format("{}: {} must be a positive integer, got {}", loc(key), key, it->dump()));
    return static_cast<int>(it->get<std::int64_t>());
  }
  // A string under KEY that must equal WANT when present.
  void must_be(const std::string& key, const std::string& want, const std::string& why) const {
    const auto it = json.find(key);
    if (it == json.end() || it->is_null()) return;
    if (!it->is_string() || it->get<std::string>() != want)
      throw BackendError(fmt::format("{}: {} is {}, but {}", loc(key), key, it->dump(), why));
  }
};

// n_head from the file's metadata, 0 when absent.
int metadata_heads(const SafetensorsReader& f) {
  const auto it = f.metadata().find("n_head");
  if (it == f.metadata().end()) return 0;
  int m = 0;
  const auto& s = it->second;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), m);
  if (ec != std::errc() || p != s.data() + s.size() || m <= 0)
    throw FormatError(f.name(), 8, fmt::format("metadata n_head '{}' is not a positive integer", s));
  return m;
}

// rms_norm_eps, rope_theta (positive numbers) and tie_word_embeddings, with LlamaConfig's defaults.
void read_llama_numbers(const ConfigJson& cj, Gpt2Config& c) {
  auto number = [&](const char* key, float& out) {
    const auto it = cj.json.find(key);
    if (it == cj.json.end() || it->is_null()) return;
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>()))
      throw BackendError(fmt::format("{}: {} must be a positive number, got {}", cj.loc(key), key, it->dump()));
    out = static_cast<float>(it->get<double>());
  };
  c.ln_eps = 1e-6f;  // LlamaConfig's default rms_norm_eps
  number("rms_norm_eps", c.ln_eps);
  number("rope_theta", c.rope_theta);
  if (const auto it = cj.json.find("tie_word_embeddings"); it != cj.json.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw BackendError(fmt::format("{}: tie_word_embeddings must be true or false, got {}",
                                     cj.loc("tie_word_embeddings"), it->dump()));
    c.tie_embeddings = it->get<bool>();
  } else {
    c.tie_embeddings = false;  // LlamaConfig's default
  }
}

[[noreturn]] void not_modelled(const ConfigJson& cj, const char* key, const nlohmann::json& value,
                               const std::string& fix) {
  throw BackendError(
      fmt::format("{}: {} is {}, which harmony-run does not model (plain RoPE, every token attending "
                  "to every earlier one); {}",
                  cj.loc(key), key, value.dump(), fix));
}

// Which tokens attend to which: RoPE scaling is refused; a sliding window is kept for Mistral (checked against the
// run's seq_len), refused for Qwen2 when used, and refused for the other Llama models.
void read_attention_span(const ConfigJson& cj, bool qwen2, bool mistral, Gpt2Config& c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = cj.json.find(key);
    if (it != cj.json.end() && !it->is_null()) not_modelled(cj, key, *it, "remove it or set it to null");
  }
  if (const auto it = cj.json.find("sliding_window"); mistral) {
    // MistralConfig: 4096 when absent, null for none. Within T tokens a window of >= T keys is plain causal attention,
    // so the window is kept and checked against the run's seq_len (Gpt2Config::sliding_window).
    c.sliding_window = 4096;
    if (it != cj.json.end()) c.sliding_window = it->is_null() ? 0 : cj.positive("sliding_window").value_or(0);
  } else if (qwen2) {
    // Qwen2Config always writes sliding_window; it applies only with use_sliding_window
    if (const auto use = cj.json.find("use_sliding_window"); use != cj.json.end() && !use->is_null()) {
      if (!use->is_boolean())
        throw BackendError(fmt::format("{}: use_sliding_window must be true or false, got {}",
                                       cj.loc("use_sliding_window"), use->dump()));
      if (use->get<bool>()) not_modelled(cj, "use_sliding_window", *use, "set it to false (Qwen2's default)");
    }
  } else if (it != cj.json.end() && !it->is_null()) {
    not_modelled(cj, "sliding_window", *it,
                 "remove it or set it to null (or use model_type mistral, whose window "
                 "harmony-run checks against seq_len)");
  }
}

// The Llama-family shape of config.json (model_type llama, mistral or qwen2): every key that changes the math is
// read, or refused by name when it asks for something harmony's Llama block does not compute.
Gpt2Config llama_config_from(const ConfigJson& cj, const std::string& model_type) {
  const bool qwen2 = model_type == "qwen2", mistral = model_type == "mistral";
  Gpt2Config c;
  c.arch = Arch::Llama;
  c.qkv_bias = qwen2;  // Qwen2's q_proj, k_proj and v_proj always carry biases (Qwen2Config has no key for it)
  auto required = [&](const char* key) {
    const std::optional<int> v = cj.positive(key);
    if (!v)
      throw BackendError(fmt::format("{}:1:1: a Llama config.json needs \"{}\" (a positive integer)", cj.path, key));
    return *v;
  };
  c.vocab_size = required("vocab_size");
  c.max_seq_len = required("max_position_embeddings");
  c.n_layer = required("num_hidden_layers");
  c.n_head = required("num_attention_heads");
  c.n_embd = required("hidden_size");
  c.intermediate_size = required("intermediate_size");
  c.n_kv_head = cj.positive("num_key_value_heads").value_or(0);
  read_llama_numbers(cj, c);
  cj.must_be("hidden_act", "silu", "harmony's Llama MLP computes SwiGLU with silu");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (qwen2) break;  // Qwen2Config reads neither: its biases are q, k and v's, always
    const auto it = cj.json.find(key);
    if (it != cj.json.end() && !(it->is_boolean() && !it->get<bool>()) && !it->is_null())
      throw BackendError(fmt::format(
          "{}: {} is {}, but harmony's Llama block has no biases (only Qwen2's q/k/v biases, model_type qwen2)",
          cj.loc(key), key, it->dump()));
  }
  read_attention_span(cj, qwen2, mistral, c);
  if (const std::optional<int> hd = cj.positive("head_dim"); hd && c.n_head > 0 && *hd * c.n_head != c.n_embd)
    throw BackendError(
        fmt::format("{}: head_dim = {}, but harmony's Llama block uses hidden_size / "
                    "num_attention_heads = {}",
                    cj.loc("head_dim"), *hd, c.n_embd / c.n_head));
  try {
    c.validate();
  } catch (const BackendError& e) {
    throw BackendError(fmt::format("{}:1:1: {}", cj.path, e.what()));
  }
  return c;
}

// "PATH:LINE:COL" of the NTH occurrence of KEY (quoted) in TEXT, of its start when there are fewer.
std::string nth_loc(const std::string& path, const std::string& text, const std::string& key, int nth = 1) {
  const std::string quoted = nlohmann::json(key).dump();
  std::size_t pos = std::string::npos, from = 0;
  for (; nth > 0; --nth) {
    const std::size_t next = text.find(quoted, from);
    if (next == std::string::npos) break;
    pos = next;
    from = next + 1;
  }
  return text_loc(path, text, pos == std::string::npos ? 0 : pos);
}

// A sharded checkpoint's index (model.safetensors.index.json), read into TEXT and parsed; a key repeated in any object
// (which nlohmann would keep the last of silently) is an error at its second occurrence.
nlohmann::json read_index(const std::string& path, std::string& text_out) {
  std::string problem;
  auto text = core::try_read_input_file(path, &problem);
  if (!text) throw BackendError(fmt::format("{}: cannot read the sharded checkpoint's index: {}", path, problem));
  // Duplicate keys: nlohmann keeps the last silently, so the parser callback records the first repeated one.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(*text, [&](int /*depth*/, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (ev == E::object_start) keys.emplace_back();
      if (ev == E::object_end && !keys.empty()) keys.pop_back();
      if (ev == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw BackendError(
        fmt::format("{}: not valid JSON ({}); it should be the model.safetensors.index.json that came "
                    "with the shards",
                    path, e.what()));
  }
  text_out = std::move(*text);
  if (!duplicate.empty())
    throw BackendError(
        fmt::format("{}: \"{}\" appears twice in the index: a tensor is stored once; use the index "
                    "that came with the shards",
                    nth_loc(path, text_out, duplicate, 2), duplicate));
  return doc;
}

}  // namespace

WeightFiles::WeightFiles(const SafetensorsReader& one) : name_(one.name()), view_(&one) {}

WeightFiles::Found WeightFiles::find(std::string_view tensor) const {
  for (std::size_t i = 0; i < file_count(); ++i) {
    if (const TensorInfo* t = file(i).find(tensor)) return {&file(i), t};
  }
  return {};
}

std::vector<WeightFiles::Found> WeightFiles::tensors() const {
  std::vector<Found> all;
  for (std::size_t i = 0; i < file_count(); ++i) {
    for (const TensorInfo& t : file(i).tensors()) all.push_back({&file(i), &t});
  }
  return all;
}

WeightFiles WeightFiles::open(const std::string& path) {
  WeightFiles w;
  w.name_ = path;
  if (!path.ends_with(".index.json")) {
    w.owned_.push_back(SafetensorsReader::open(path));
    return w;
  }
  namespace fs = std::filesystem;
  w.index_ = path;
  std::string text;
  const nlohmann::json doc = read_index(path, text);
  auto loc = [&](const std::string& key) { return nth_loc(path, text, key); };
  const auto map = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (!doc.is_object() || map == doc.end() || !map->is_object() || map->empty())
    throw BackendError(
        fmt::format("{}: a sharded checkpoint's index needs a \"weight_map\" object (tensor name -> "
                    "shard file), as save_pretrained writes it",
                    doc.is_object() && map != doc.end() ? loc("weight_map") : path + ":1:1"));
  const fs::path dir = fs::path(path).parent_path();
  std::map<std::string, std::size_t> shard_of_file;        // shard file name -> index in owned_
  std::map<std::string, std::size_t, std::less<>> mapped;  // tensor -> index in owned_
  for (const auto& [tensor, shard] : map->items()) {
    const std::string file = shard.is_string() ? shard.get<std::string>() : std::string();
    if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos || file == "." ||
        file == "..")
      throw BackendError(
          fmt::format("{}: tensor \"{}\" maps to {}; each entry must name a shard file in the index's "
                      "folder (\"model-00001-of-00002.safetensors\")",
                      loc(tensor), tensor, shard.dump()));
    auto it = shard_of_file.find(file);
    if (it == shard_of_file.end()) {
      const std::string shard_path = (dir / file).string();
      if (const auto why = core::input_file_problem(shard_path))
        throw BackendError(
            fmt::format("{}: tensor \"{}\" is in shard {}, which cannot be read ({}: {}): download "
                        "every shard the index names into its folder",
                        loc(tensor), tensor, file, shard_path, *why));
      it = shard_of_file.emplace(file, w.owned_.size()).first;
      w.owned_.push_back(SafetensorsReader::open(shard_path));
    }
    if (w.owned_[it->second].find(tensor) == nullptr)
      throw BackendError(
          fmt::format("{}: tensor \"{}\" is mapped to {}, which does not hold it: the index and the "
                      "shards are from different saves; download them together again",
                      loc(tensor), tensor, w.owned_[it->second].name()));
    mapped.emplace(tensor, it->second);
  }
  for (std::size_t i = 0; i < w.owned_.size(); ++i) {
    for (const TensorInfo& t : w.owned_[i].tensors()) {
      const auto it = mapped.find(t.name);
      if (it == mapped.end())
        throw FormatError(w.owned_[i].name(), w.owned_[i].data_start() + t.begin,
                          fmt::format("tensor '{}' is not in {}'s weight_map: the index and the shards are from "
                                      "different saves; download them together again",
                                      t.name, path));
      if (it->second != i)
        throw FormatError(w.owned_[i].name(), w.owned_[i].data_start() + t.begin,
                          fmt::format("tensor '{}' is stored twice, here and in {} (where {} maps it): a duplicate; "
                                      "use the shards that came with the index",
                                      t.name, w.owned_[it->second].name(), path));
    }
  }
  return w;
}

Gpt2Config gpt2_config_from(const SafetensorsReader& f, int n_head) { return gpt2_config_from(WeightFiles(f), n_head); }

Gpt2Config gpt2_config_from(const WeightFiles& f, int n_head) {
  const std::string prefix = prefix_of(f);
  const WeightFiles::Found wte_at = need(f, prefix + "wte.weight");
  const WeightFiles::Found wpe_at = need(f, prefix + "wpe.weight");
  const TensorInfo& wte = *wte_at.info;
  const TensorInfo& wpe = *wpe_at.info;
  if (wte.shape.size() != 2)
    throw FormatError(wte_at.file->name(), at(wte_at), "wte.weight must be 2-D [vocab, n_embd]");
  if (wpe.shape.size() != 2 || wpe.shape[1] != wte.shape[1])
    throw FormatError(wpe_at.file->name(), at(wpe_at),
                      fmt::format("wpe.weight must be [n_positions, {}]", wte.shape[1]));
  std::set<int> blocks;
  for (const WeightFiles::Found& t : f.tensors()) {
    if (!t.info->name.starts_with(prefix)) continue;
    if (auto i = block_index(std::string_view(t.info->name).substr(prefix.size()))) blocks.insert(*i);
  }
  const int n_layer = static_cast<int>(blocks.size());
  if (!blocks.empty() && *blocks.rbegin() != n_layer - 1)
    throw FormatError(f.name(), 8, fmt::format("block indices {} are not 0..{}", fmt::join(blocks, ", "), n_layer - 1));
  const int heads = n_head > 0 ? n_head : metadata_heads(f.file(0));
  if (heads <= 0)
    throw FormatError(f.name(), 8,
                      "n_head is not in the file's metadata (the Hub's files carry only {\"format\": \"pt\"}) and no "
                      "config.json is beside it: put the model's config.json next to the weights (or point "
                      "model.weights at the Hub's model folder), or set model.n_head (GPT-2 small: 12, medium: 16, "
                      "large: 20, xl: 25)");
  Gpt2Config c;
  c.vocab_size = static_cast<int>(wte.shape[0]);
  c.n_embd = static_cast<int>(wte.shape[1]);
  c.max_seq_len = static_cast<int>(wpe.shape[0]);
  c.n_layer = n_layer;
  c.n_head = heads;
  try {
    c.validate();
  } catch (const BackendError& e) {
    throw FormatError(f.name(), 8, e.what());
  }
  return c;
}

void load_gpt2_weights(const SafetensorsReader& f, HostState& state) { load_gpt2_weights(WeightFiles(f), state); }

void load_gpt2_weights(const WeightFiles& f, HostState& state) {
  const Gpt2& model = state.model();
  const std::string prefix = model.is_llama() ? "" : prefix_of(f);
  std::set<std::string> expected;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (!p.tied_to.empty()) continue;
      const std::string name = prefix + p.name;
      expected.insert(name);
      const WeightFiles::Found found = need(f, name);
      const TensorInfo& t = *found.info;
      if (!is_float(t.dtype))
        throw FormatError(found.file->name(), at(found),
                          fmt::format("tensor '{}' is {}; weights must be F32, F16 or BF16", name, t.dtype));
      if (t.shape != p.shape)
        throw FormatError(found.file->name(), at(found),
                          fmt::format("tensor '{}' has shape [{}], the model expects [{}]", name,
                                      fmt::join(t.shape, ", "), fmt::join(p.shape, ", ")));
      found.file->read_f32(
          name, state.weights(l).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel)));
    }
  }
  state.sync_tied();
  std::vector<std::string> unknown;
  for (const WeightFiles::Found& found : f.tensors()) {
    const TensorInfo& t = *found.info;
    if (expected.count(t.name) != 0) continue;
    std::string_view rest = t.name;
    if (rest.starts_with(prefix)) rest.remove_prefix(prefix.size());
    if (is_ignored_buffer(rest)) continue;
    if (model.tied() && (t.name == "lm_head.weight" || rest == "lm_head.weight")) {
      const auto wte = state.weight(0, model.embedding_name());
      if (!is_float(t.dtype) || t.numel != static_cast<std::int64_t>(wte.size()))
        throw FormatError(found.file->name(), at(found),
                          "lm_head.weight does not match wte.weight's shape: untied heads are not supported");
      const std::vector<float> head = found.file->read_f32(t.name);
      if (std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) != 0)
        throw FormatError(found.file->name(), at(found),
                          "lm_head.weight differs from wte.weight: untied heads are not supported");
      continue;
    }
    unknown.push_back(t.name);
  }
  if (!unknown.empty()) {
    if (unknown.size() > 5) unknown.resize(5);
    throw FormatError(f.name(), 8,
                      fmt::format("tensors the {} model does not have: {}", model.is_llama() ? "Llama" : "GPT-2",
                                  fmt::join(unknown, ", ")));
  }
}

Gpt2Files locate_gpt2_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  Gpt2Files files;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    files.weights = (dir / "model.safetensors").string();
    if (!fs::exists(files.weights, ec) && fs::exists(dir / "model.safetensors.index.json", ec))
      files.weights = (dir / "model.safetensors.index.json").string();  // sharded, as save_pretrained writes big models
    if (!fs::exists(files.weights, ec)) {
      std::string why =
          "it should hold model.safetensors or model.safetensors.index.json with its shards (and config.json), as a "
          "Hugging Face model folder does";
      if (fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec))
        why =
            "it holds only pytorch_model.bin: harmony reads safetensors; convert it (transformers: "
            "AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True))";
      throw FormatError(path, 0, fmt::format("model folder has no model.safetensors: {}", why));
    }
    const fs::path cj = dir / "config.json";
    if (fs::exists(cj, ec)) files.config_json = cj.string();
    return files;
  }
  files.weights = path;
  const fs::path cj = fs::path(path).parent_path() / "config.json";
  if (fs::exists(cj, ec)) files.config_json = cj.string();
  return files;
}

Gpt2Config gpt2_config_at(const std::string& path, int n_head) {
  const Gpt2Files files = locate_gpt2_files(path);
  const auto f = WeightFiles::open(files.weights);
  if (files.config_json.empty()) {
    if (f.find("model.embed_tokens.weight").file != nullptr)
      throw FormatError(f.name(), 8,
                        "a Llama-family checkpoint (model.embed_tokens.weight): its config.json must lie beside it");
    return gpt2_config_from(f, n_head);
  }
  const ConfigJson cj = ConfigJson::read(files.config_json);
  if (const auto mt = cj.json.find("model_type");
      mt != cj.json.end() && (*mt == "llama" || *mt == "mistral" || *mt == "qwen2"))
    return llama_config_from(cj, mt->get<std::string>());
  cj.must_be("model_type", "gpt2",
             "harmony-run trains GPT-2 (gpt2) and the Llama family (llama, mistral, qwen2) models only");
  cj.must_be("activation_function", "gelu_new",
             "harmony's GPT-2 computes gelu_new (the tanh approximation), so these weights would compute another "
             "function");
  const int file_heads = metadata_heads(f.file(0));
  const std::optional<int> json_heads = cj.positive("n_head");
  if (json_heads && file_heads > 0 && *json_heads != file_heads && n_head <= 0)
    throw BackendError(fmt::format("{}: n_head = {}, but {} carries n_head {} in its metadata", cj.loc("n_head"),
                                   *json_heads, f.name(), file_heads));
  int heads = n_head > 0 ? n_head : json_heads.value_or(0);
  if (heads <= 0 && file_heads <= 0)
    throw BackendError(
        fmt::format("{}: no n_head, and {} carries none in its metadata: add \"n_head\" to "
                    "config.json, or set model.n_head (GPT-2 small: 12, medium: 16)",
                    cj.path, f.name()));
  Gpt2Config c;
  try {
    c = gpt2_config_from(f, heads);
  } catch (const FormatError& e) {
    // n_embd not a multiple of config.json's n_head: name config.json too.
    if (json_heads && n_head <= 0 && std::string(e.what()).find("n_head") != std::string::npos)
      throw BackendError(
          fmt::format("{}: n_head = {} does not fit the weights: {}", cj.loc("n_head"), heads, e.what()));
    throw;
  }
  const std::string blocks = c.n_layer == 0 ? "no blocks" : fmt::format("blocks h.0 .. h.{}", c.n_layer - 1);
  auto check = [&](const char* key, int tensors, const std::string& from) {
    const std::optional<int> v = cj.positive(key);
    if (v && *v != tensors)
      throw BackendError(
          fmt::format("{}: {} = {}, but {} has {} ({}): config.json and the weights are from "
                      "different models; use the config.json that came with these weights",
                      cj.loc(key), key, *v, f.name(), tensors, from));
  };
  const std::string p = prefix_of(f);
  check("n_layer", c.n_layer, blocks);
  check("n_embd", c.n_embd, fmt::format("{}wte.weight is [{}, {}]", p, c.vocab_size, c.n_embd));
  check("vocab_size", c.vocab_size, fmt::format("{}wte.weight is [{}, {}]", p, c.vocab_size, c.n_embd));
  check("n_positions", c.max_seq_len, fmt::format("{}wpe.weight is [{}, {}]", p, c.max_seq_len, c.n_embd));
  if (const auto inner = cj.positive("n_inner"); inner && *inner != 4 * c.n_embd)
    throw BackendError(fmt::format("{}: n_inner = {}, but harmony's GPT-2 MLP is 4 * n_embd = {} wide",
                                   cj.loc("n_inner"), *inner, 4 * c.n_embd));
  if (const auto it = cj.json.find("layer_norm_epsilon"); it != cj.json.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>()))
      throw BackendError(fmt::format("{}: layer_norm_epsilon must be a positive number, got {}",
                                     cj.loc("layer_norm_epsilon"), it->dump()));
    c.ln_eps = static_cast<float>(it->get<double>());
  }
  return c;
}

void load_gpt2_weights_at(const std::string& path, HostState& state) {
  load_gpt2_weights(WeightFiles::open(locate_gpt2_files(path).weights), state);
}

void save_gpt2_weights(const std::string& path, const HostState& state) {
  const Gpt2& model = state.model();
  std::vector<TensorView> views;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (!p.tied_to.empty()) continue;
      views.push_back(
          {p.name, p.shape,
           state.weights(l).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel))});
    }
  }
  write_safetensors(path, views, {{"format", "pt"}, {"n_head", std::to_string(model.config().n_head)}});
}

namespace {

// A float as the JSON number that prints shortest and reads back (through double) to the same float: 1e-05, not
// 9.999999747378752e-06.
nlohmann::json float_json(float v) { return std::stod(fmt::format("{}", v)); }

}  // namespace

std::string hf_config_json(const Gpt2Config& c) {
  nlohmann::ordered_json j;
  if (c.arch == Arch::Llama) {
    // Qwen2's q/k/v biases are its model_type's; a sliding window is Mistral's (LlamaConfig has neither)
    const char* type = c.qkv_bias ? "qwen2" : c.sliding_window > 0 ? "mistral" : "llama";
    j["architectures"] = {c.qkv_bias             ? "Qwen2ForCausalLM"
                          : c.sliding_window > 0 ? "MistralForCausalLM"
                                                 : "LlamaForCausalLM"};
    j["model_type"] = type;
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_seq_len;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.kv_heads();
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.intermediate_size;
    j["head_dim"] = c.n_embd / c.n_head;
    j["rms_norm_eps"] = float_json(c.ln_eps);
    j["rope_theta"] = float_json(c.rope_theta);
    j["rope_scaling"] = nullptr;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["hidden_act"] = "silu";
    if (c.qkv_bias) {
      j["use_sliding_window"] = false;
    } else if (c.sliding_window > 0) {
      j["sliding_window"] = c.sliding_window;
    } else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
  } else {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_seq_len;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_embd"] = c.n_embd;
    j["n_inner"] = nullptr;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = float_json(c.ln_eps);
    j["tie_word_embeddings"] = true;
  }
  j["torch_dtype"] = "float32";  // save_gpt2_weights writes F32
  return j.dump(2) + "\n";
}

std::string hf_config_path_for(const std::string& path) {
  return (std::filesystem::path(path).parent_path() / "config.json").string();
}

void save_hf_model(const std::string& path, const HostState& state) {
  save_gpt2_weights(path, state);
  core::write_file_atomic(hf_config_path_for(path), hf_config_json(state.model().config()), "the model's config.json");
}

}  // namespace harmony::backend
