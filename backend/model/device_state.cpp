// The device-resident training state: per-layer allocations, the upload from and download to a HostState (bf16
// rounding the working copy from the exact fp32 master), and the update as HostState::update's sequence of
// Kernels<S>::adamw calls with the wte tie, with per-parameter non-finite flags on the device.
#include "backend/model/device_state.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "backend/model/state.hpp"

namespace harmony::backend {

namespace {

std::int64_t tied_floats(const Gpt2& model, int layer) {
  std::int64_t n = 0;
  for (const ParamSpec& p : model.params(layer)) {
    if (!p.tied_to.empty()) n += p.numel;
  }
  return n;
}

template <class S>
constexpr DType dtype_of() {
  return std::is_same_v<S, Bf16> ? DType::BF16 : DType::F32;
}

Bytes floats_bytes(std::int64_t n, Bytes element) { return static_cast<Bytes>(n) * element; }

}  // namespace

Bytes DeviceState::bytes_per_param(DType dtype) {
  // W + G in the storage type, m + v in fp32, and (bf16) the fp32 master.
  return 2 * dtype_bytes(dtype) + 8 + (dtype == DType::BF16 ? 4 : 0);
}

std::int64_t DeviceState::owned_floats(const Gpt2& model, int layer) {
  // A tied twin has no optimizer state, so it must sit at the end of its block, leaving the owned part a prefix.
  const auto& ps = model.params(layer);
  std::int64_t owned = model.param_floats(layer);
  for (auto it = ps.rbegin(); it != ps.rend() && !it->tied_to.empty(); ++it) owned = it->offset;
  if (owned != model.param_floats(layer) - tied_floats(model, layer))
    throw BackendError(fmt::format("device state: layer {}'s tied parameters are not at the end of its block",
                                   model.layer_name(layer)));
  return owned;
}

Bytes DeviceState::layer_bytes(const Gpt2& model, int layer, DType dtype) {
  const std::int64_t all = model.param_floats(layer), owned = owned_floats(model, layer);
  return floats_bytes(all, 2 * dtype_bytes(dtype)) + floats_bytes(owned, 8 + (dtype == DType::BF16 ? 4 : 0));
}

Bytes DeviceState::total_bytes(const Gpt2& model, DType dtype) {
  Bytes total = 0;
  std::int64_t params = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    total += layer_bytes(model, l, dtype);
    params += static_cast<std::int64_t>(model.params(l).size());
  }
  return total + floats_bytes(params, sizeof(std::int32_t));
}

DeviceState::DeviceState(Device& device, Stream& stream, const Gpt2& model, DType dtype)
    : device_(device), model_(model), dtype_(dtype) {
  if (dtype_ == DType::BF16) require_bf16(device_, "device state");
  const Bytes e = dtype_bytes(dtype_);
  for (int l = 0; l < model_.num_layers(); ++l) {
    const std::int64_t all = model_.param_floats(l), owned = owned_floats(model_, l);
    Layer L;
    L.w = device_.alloc(floats_bytes(all, e), fmt::format("resident W L{}", l));
    L.g = device_.alloc(floats_bytes(all, e), fmt::format("resident dW L{}", l));
    if (dtype_ == DType::BF16) L.master = device_.alloc(floats_bytes(owned, 4), fmt::format("resident master L{}", l));
    L.m = device_.alloc(floats_bytes(owned, 4), fmt::format("resident exp_avg L{}", l));
    L.v = device_.alloc(floats_bytes(owned, 4), fmt::format("resident exp_avg_sq L{}", l));
    L.flag0 = flag_count_;
    flag_count_ += static_cast<std::int64_t>(model_.params(l).size());
    layers_.push_back(std::move(L));
  }
  flags_ = device_.alloc(floats_bytes(flag_count_, sizeof(std::int32_t)), "resident non-finite flags");
  device_.fill_zero(stream, flags_.data(), flags_.bytes());
  zero_grads(stream);
  stream.synchronize();
}

const DeviceState::Layer& DeviceState::layer(int l) const {
  if (l < 0 || l >= model_.num_layers())
    throw BackendError(fmt::format("device state: layer {} outside 0..{}", l, model_.num_layers() - 1));
  return layers_[static_cast<std::size_t>(l)];
}

template <class S>
S* DeviceState::weights(int l) const {
  if (dtype_of<S>() != dtype_)
    throw BackendError(
        fmt::format("device state: weights asked as {} of a {} state", dtype_name(dtype_of<S>()), dtype_name(dtype_)));
  return layer(l).w.as<S>();
}
template <class S>
S* DeviceState::grads(int l) const {
  if (dtype_of<S>() != dtype_)
    throw BackendError(fmt::format("device state: gradients asked as {} of a {} state", dtype_name(dtype_of<S>()),
                                   dtype_name(dtype_)));
  return layer(l).g.as<S>();
}
template float* DeviceState::weights<float>(int) const;
template Bf16* DeviceState::weights<Bf16>(int) const;
template float* DeviceState::grads<float>(int) const;
template Bf16* DeviceState::grads<Bf16>(int) const;

float* DeviceState::master(int l) const {
  const Layer& L = layer(l);
  return dtype_ == DType::BF16 ? L.master.as<float>() : L.w.as<float>();
}
float* DeviceState::exp_avg(int l) const { return layer(l).m.as<float>(); }
float* DeviceState::exp_avg_sq(int l) const { return layer(l).v.as<float>(); }
std::int64_t DeviceState::steps(int l) const { return layer(l).steps; }

void DeviceState::upload(Stream& s, const HostState& host) {
  if (!(host.model().config() == model_.config()))
    throw BackendError("device state: upload from a host state of another model");
  std::vector<Bf16> staging;
  for (int l = 0; l < model_.num_layers(); ++l) {
    Layer& L = layers_[static_cast<std::size_t>(l)];
    const std::int64_t owned = owned_floats(model_, l);
    const auto w = host.weights(l);
    if (dtype_ == DType::BF16) {
      device_.copy_h2d(s, L.master.data(), w.data(), floats_bytes(owned, 4));
      staging.resize(w.size());
      std::transform(w.begin(), w.end(), staging.begin(), [](float x) { return to_bf16(x); });
      device_.copy_h2d(s, L.w.data(), staging.data(), floats_bytes(static_cast<std::int64_t>(w.size()), 2));
      s.synchronize();  // staging is reused by the next layer
    } else {
      device_.copy_h2d(s, L.w.data(), w.data(), floats_bytes(static_cast<std::int64_t>(w.size()), 4));
    }
    device_.copy_h2d(s, L.m.data(), host.exp_avg(l).data(), floats_bytes(owned, 4));
    device_.copy_h2d(s, L.v.data(), host.exp_avg_sq(l).data(), floats_bytes(owned, 4));
    L.steps = host.steps(l);
  }
  s.synchronize();
}

void DeviceState::download(Stream& s, HostState& host) const {
  if (!(host.model().config() == model_.config()))
    throw BackendError("device state: download into a host state of another model");
  for (int l = 0; l < model_.num_layers(); ++l) {
    const Layer& L = layers_[static_cast<std::size_t>(l)];
    const std::int64_t owned = owned_floats(model_, l);
    device_.copy_d2h(s, host.weights(l).data(), master(l), floats_bytes(owned, 4));
    device_.copy_d2h(s, host.exp_avg(l).data(), L.m.data(), floats_bytes(owned, 4));
    device_.copy_d2h(s, host.exp_avg_sq(l).data(), L.v.data(), floats_bytes(owned, 4));
  }
  s.synchronize();
  for (int l = 0; l < model_.num_layers(); ++l) host.set_steps(l, layers_[static_cast<std::size_t>(l)].steps);
  host.sync_tied();
}

void DeviceState::upload_grads(Stream& s, const HostState& host) {
  std::vector<Bf16> staging;
  for (int l = 0; l < model_.num_layers(); ++l) {
    const auto g = host.grads(l);
    if (dtype_ == DType::BF16) {
      staging.resize(g.size());
      std::transform(g.begin(), g.end(), staging.begin(), [](float x) { return to_bf16(x); });
      device_.copy_h2d(s, layer(l).g.data(), staging.data(), floats_bytes(static_cast<std::int64_t>(g.size()), 2));
      s.synchronize();
    } else {
      device_.copy_h2d(s, layer(l).g.data(), g.data(), floats_bytes(static_cast<std::int64_t>(g.size()), 4));
    }
  }
  s.synchronize();
}

void DeviceState::download_grads(Stream& s, HostState& host) const {
  std::vector<Bf16> staging;
  for (int l = 0; l < model_.num_layers(); ++l) {
    const auto g = host.grads(l);
    if (dtype_ == DType::BF16) {
      staging.resize(g.size());
      device_.copy_d2h(s, staging.data(), layer(l).g.data(), floats_bytes(static_cast<std::int64_t>(g.size()), 2));
      s.synchronize();
      std::transform(staging.begin(), staging.end(), g.begin(), [](Bf16 x) { return to_f32(x); });
    } else {
      device_.copy_d2h(s, g.data(), layer(l).g.data(), floats_bytes(static_cast<std::int64_t>(g.size()), 4));
    }
  }
  s.synchronize();
}

void DeviceState::zero_grads(Stream& s) {
  for (const Layer& L : layers_) device_.fill_zero(s, L.g.data(), L.g.bytes());
}

template <class S>
void DeviceState::update_as(Stream& s, const AdamWConfig& config, int first, int last) {
  Kernels<S>& k = kernels_of<S>(device_, "device state");
  const int head = model_.head_layer();
  const ParamSpec& lm_head = model_.params(head).back();  // the tied twin when model_.tied()
  auto* flags = flags_.as<std::int32_t>();
  for (int l = first; l <= last; ++l) {
    Layer& L = layers_[static_cast<std::size_t>(l)];
    const std::int64_t step = ++L.steps;
    const auto& ps = model_.params(l);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const ParamSpec& p = ps[i];
      if (!p.tied_to.empty()) continue;  // lm_head: updated through layer 0's wte
      AdamWTensors<S> t;
      t.param = master(l) + p.offset;
      if constexpr (std::is_same_v<S, Bf16>) t.working = L.w.as<S>() + p.offset;
      t.grad = L.g.as<S>() + p.offset;
      t.exp_avg = L.m.as<float>() + p.offset;
      t.exp_avg_sq = L.v.as<float>() + p.offset;
      t.nonfinite = flags + L.flag0 + static_cast<std::int64_t>(i);
      if (l == 0 && model_.tied() &&
          p.name == model_.embedding_name()) {  // the tie: both gradients, both working copies
        const Layer& H = layers_[static_cast<std::size_t>(head)];
        t.grad2 = H.g.as<S>() + lm_head.offset;
        t.twin = H.w.as<S>() + lm_head.offset;
      }
      k.adamw(s, config, step, t, p.numel);
    }
  }
}

void DeviceState::update(Stream& s, const AdamWConfig& config, int first, int last) {
  config.validate();
  if (first < 0 || last >= model_.num_layers() || first > last)
    throw BackendError(
        fmt::format("device state: update of layers {}..{} outside 0..{}", first, last, model_.num_layers() - 1));
  if (dtype_ == DType::BF16) {
    update_as<Bf16>(s, config, first, last);
  } else {
    update_as<float>(s, config, first, last);
  }
}

std::optional<NonFiniteGradient> DeviceState::take_nonfinite(Stream& s) {
  std::vector<std::int32_t> f(static_cast<std::size_t>(flag_count_));
  device_.copy_d2h(s, f.data(), flags_.data(), floats_bytes(flag_count_, sizeof(std::int32_t)));
  device_.fill_zero(s, flags_.data(), flags_.bytes());
  s.synchronize();
  // update_layers' rule: layers in order, parameters in order; the highest layer's first such parameter is named.
  std::optional<NonFiniteGradient> nonfinite;
  for (int l = 0; l < model_.num_layers(); ++l) {
    const auto& ps = model_.params(l);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (f[static_cast<std::size_t>(layers_[static_cast<std::size_t>(l)].flag0) + i] == 0) continue;
      if (!nonfinite || l > nonfinite->layer) {
        const int before = nonfinite ? nonfinite->params : 0;
        nonfinite = NonFiniteGradient{l, ps[i].name, before};
      }
      ++nonfinite->params;
    }
  }
  return nonfinite;
}

}  // namespace harmony::backend
