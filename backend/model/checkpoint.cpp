// Loading and saving GPT-2 weights under Hugging Face names (see checkpoint.hpp): config inference from
// shapes, the transformer. prefix, the tied lm_head and ignored mask buffers.
#include "backend/model/checkpoint.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harmony::backend {
namespace {

std::string prefix_of(const SafetensorsReader& f) {
  if (f.find("wte.weight") != nullptr) return "";
  if (f.find("transformer.wte.weight") != nullptr) return "transformer.";
  throw FormatError(f.name(), 8, "no 'wte.weight' (or 'transformer.wte.weight') tensor: not a GPT-2 checkpoint");
}

const TensorInfo& need(const SafetensorsReader& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (t == nullptr) throw FormatError(f.name(), 8, fmt::format("missing tensor '{}'", name));
  return *t;
}

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
  if (!block_index(rest)) return false;
  return rest.ends_with(".attn.bias") || rest.ends_with(".attn.masked_bias");
}

}  // namespace

Gpt2Config gpt2_config_from(const SafetensorsReader& f, int n_head) {
  const std::string prefix = prefix_of(f);
  const TensorInfo& wte = need(f, prefix + "wte.weight");
  const TensorInfo& wpe = need(f, prefix + "wpe.weight");
  auto at = [&](const TensorInfo& t) { return f.data_start() + t.begin; };
  if (wte.shape.size() != 2) throw FormatError(f.name(), at(wte), "wte.weight must be 2-D [vocab, n_embd]");
  if (wpe.shape.size() != 2 || wpe.shape[1] != wte.shape[1])
    throw FormatError(f.name(), at(wpe), fmt::format("wpe.weight must be [n_positions, {}]", wte.shape[1]));
  std::set<int> blocks;
  for (const TensorInfo& t : f.tensors()) {
    if (!t.name.starts_with(prefix)) continue;
    if (auto i = block_index(std::string_view(t.name).substr(prefix.size()))) blocks.insert(*i);
  }
  const int n_layer = static_cast<int>(blocks.size());
  if (!blocks.empty() && *blocks.rbegin() != n_layer - 1)
    throw FormatError(f.name(), 8, fmt::format("block indices {} are not 0..{}", fmt::join(blocks, ", "), n_layer - 1));
  int heads = n_head;
  if (auto it = f.metadata().find("n_head"); it != f.metadata().end()) {
    int m = 0;
    const auto& s = it->second;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), m);
    if (ec != std::errc() || p != s.data() + s.size() || m <= 0)
      throw FormatError(f.name(), 8, fmt::format("metadata n_head '{}' is not a positive integer", s));
    if (heads > 0 && heads != m)
      throw FormatError(f.name(), 8, fmt::format("n_head {} was asked for but the file's metadata says {}", heads, m));
    heads = m;
  }
  if (heads <= 0)
    throw FormatError(f.name(), 8, "n_head is not in the file's metadata: pass it (GPT-2 small: 12, medium: 16)");
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

void load_gpt2_weights(const SafetensorsReader& f, HostState& state) {
  const Gpt2& model = state.model();
  const std::string prefix = prefix_of(f);
  std::set<std::string> expected;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (!p.tied_to.empty()) continue;
      const std::string name = prefix + p.name;
      expected.insert(name);
      const TensorInfo& t = need(f, name);
      const std::uint64_t at = f.data_start() + t.begin;
      if (t.dtype != "F32")
        throw FormatError(f.name(), at,
                          fmt::format("tensor '{}' is {}; only F32 checkpoints are supported", name, t.dtype));
      if (t.shape != p.shape)
        throw FormatError(f.name(), at,
                          fmt::format("tensor '{}' has shape [{}], the model expects [{}]", name,
                                      fmt::join(t.shape, ", "), fmt::join(p.shape, ", ")));
      f.read_f32(name, state.weights(l).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel)));
    }
  }
  state.sync_tied();
  std::vector<std::string> unknown;
  for (const TensorInfo& t : f.tensors()) {
    if (expected.count(t.name) != 0) continue;
    std::string_view rest = t.name;
    if (rest.starts_with(prefix)) rest.remove_prefix(prefix.size());
    if (is_ignored_buffer(rest)) continue;
    if (t.name == "lm_head.weight" || rest == "lm_head.weight") {
      const auto wte = state.weight(0, "wte.weight");
      const std::uint64_t at = f.data_start() + t.begin;
      if (t.dtype != "F32" || t.numel != static_cast<std::int64_t>(wte.size()))
        throw FormatError(f.name(), at,
                          "lm_head.weight does not match wte.weight's shape: untied heads are not supported");
      const std::vector<float> head = f.read_f32(t.name);
      if (std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) != 0)
        throw FormatError(f.name(), at, "lm_head.weight differs from wte.weight: untied heads are not supported");
      continue;
    }
    unknown.push_back(t.name);
  }
  if (!unknown.empty()) {
    if (unknown.size() > 5) unknown.resize(5);
    throw FormatError(f.name(), 8, fmt::format("tensors the GPT-2 model does not have: {}", fmt::join(unknown, ", ")));
  }
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

}  // namespace harmony::backend
