// Host master weights, gradients and AdamW state per layer, and the pack update with the wte tie
// (layer 0 owns the tied weight and sums both gradient contributions).
#include "backend/model/state.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include <fmt/format.h>

#include "backend/model/device_state.hpp"

namespace harmony::backend {

HostState::HostState(const Gpt2& model) : model_(model) {
  for (int l = 0; l < model_.num_layers(); ++l) {
    const auto n = static_cast<std::size_t>(model_.param_floats(l));
    weights_.emplace_back(n, 0.0f);
    grads_.emplace_back(n, 0.0f);
    // moments for the parameters the layer owns: a tied twin (the head's lm_head, last in its block) is updated
    // through layer 0's wte and has none
    const auto owned = static_cast<std::size_t>(DeviceState::owned_floats(model_, l));
    exp_avg_.emplace_back(owned, 0.0f);
    exp_avg_sq_.emplace_back(owned, 0.0f);
    steps_.push_back(0);
  }
}

std::span<float> HostState::block(std::vector<std::vector<float>>& v, int layer) {
  if (layer < 0 || layer >= model_.num_layers())
    throw BackendError(fmt::format("host state: layer {} outside 0..{}", layer, model_.num_layers() - 1));
  return v[static_cast<std::size_t>(layer)];
}

std::span<const float> HostState::block(const std::vector<std::vector<float>>& v, int layer) const {
  if (layer < 0 || layer >= model_.num_layers())
    throw BackendError(fmt::format("host state: layer {} outside 0..{}", layer, model_.num_layers() - 1));
  return v[static_cast<std::size_t>(layer)];
}

std::span<float> HostState::weight(int layer, std::string_view name) {
  const ParamSpec& p = model_.param(layer, name);
  return weights(layer).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
}

std::span<const float> HostState::weight(int layer, std::string_view name) const {
  const ParamSpec& p = model_.param(layer, name);
  return weights(layer).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
}

std::span<float> HostState::grad(int layer, std::string_view name) {
  const ParamSpec& p = model_.param(layer, name);
  return grads(layer).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
}

void HostState::update(const AdamWConfig& config, int first, int last) {
  config.validate();
  if (first < 0 || last >= model_.num_layers() || first > last)
    throw BackendError(
        fmt::format("host state: update of layers {}..{} outside 0..{}", first, last, model_.num_layers() - 1));
  const int head = model_.head_layer();
  for (int l = first; l <= last; ++l) {
    const std::int64_t step = ++steps_[static_cast<std::size_t>(l)];
    float* w = weights(l).data();
    float* m = exp_avg(l).data();
    float* v = exp_avg_sq(l).data();
    const float* g = grads(l).data();
    for (const ParamSpec& p : model_.params(l)) {
      if (!p.tied_to.empty()) continue;  // lm_head: updated through layer 0's wte
      if (l == 0 && model_.tied() && p.name == model_.embedding_name()) {
        // The tied weight's two gradient contributions: embedding (layer 0) and LM head.
        const std::span<const float> gh = grads(head).subspan(
            static_cast<std::size_t>(model_.param(head, "lm_head.weight").offset), static_cast<std::size_t>(p.numel));
        std::vector<float> sum(static_cast<std::size_t>(p.numel));
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = g[p.offset + static_cast<std::int64_t>(i)] + gh[i];
        adamw_update(config, step, w + p.offset, sum.data(), m + p.offset, v + p.offset, p.numel);
        sync_tied();
        continue;
      }
      adamw_update(config, step, w + p.offset, g + p.offset, m + p.offset, v + p.offset, p.numel);
    }
  }
}

void HostState::set_steps(int layer, std::int64_t steps) {
  if (layer < 0 || layer >= model_.num_layers())
    throw BackendError(fmt::format("host state: layer {} outside 0..{}", layer, model_.num_layers() - 1));
  if (steps < 0) throw BackendError(fmt::format("host state: step count {} of layer {} is negative", steps, layer));
  steps_[static_cast<std::size_t>(layer)] = steps;
}

void HostState::sync_tied() {
  if (!model_.tied()) return;
  const auto src = weight(0, model_.embedding_name());
  auto dst = weight(model_.head_layer(), "lm_head.weight");
  std::copy(src.begin(), src.end(), dst.begin());
}

void HostState::zero_grads() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
}

void HostState::init_weights(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(std::max(1, model_.config().n_layer)));
  for (int l = 0; l < model_.num_layers(); ++l) {
    for (const ParamSpec& p : model_.params(l)) {
      if (!p.tied_to.empty()) continue;
      auto w = weights(l).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
      // norm weights (GPT-2's ln_*, Llama's *layernorm / model.norm) start at 1; output projections (c_proj, o_proj,
      // down_proj) at std 0.02 / sqrt(2 L) (GPT-2's scheme, used for both families)
      const bool is_ln = p.name.find("ln_") != std::string::npos || p.name.find("layernorm.") != std::string::npos ||
                         p.name == "model.norm.weight";
      const bool is_bias = p.name.ends_with(".bias");
      if (is_ln && !is_bias) {
        std::fill(w.begin(), w.end(), 1.0f);
      } else if (is_bias) {
        std::fill(w.begin(), w.end(), 0.0f);
      } else {
        const bool out_proj = p.name.ends_with("c_proj.weight") || p.name.ends_with("o_proj.weight") ||
                              p.name.ends_with("down_proj.weight");
        const float std = out_proj ? proj_std : 0.02f;
        for (float& x : w) x = std * normal(rng);
      }
    }
  }
  sync_tied();
}

}  // namespace harmony::backend
