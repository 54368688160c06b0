// ShardState (flow_shard.hpp): one rank's shard of every layer's weights, gradient, master and AdamW moments, its
// upload from and download into a HostState, and its device update per parameter tensor (DeviceState's kernels and
// order, restricted to the shard), with per-parameter non-finite flags.
#include "backend/executor/flow_shard.hpp"

#include <algorithm>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>

#include "backend/bf16.hpp"
#include "backend/model/device_state.hpp"
#include "backend/model/state.hpp"

namespace harmony::backend::detail {

namespace {

Bytes floats_bytes(std::int64_t n, Bytes element) { return static_cast<Bytes>(n) * element; }

// [lo, hi) of the intersection of [a, a + n) and [b, b + k); hi <= lo when empty.
std::pair<std::int64_t, std::int64_t> overlap(std::int64_t a, std::int64_t n, std::int64_t b, std::int64_t k) {
  return {std::max(a, b), std::min(a + n, b + k)};
}

}  // namespace

std::pair<std::int64_t, std::int64_t> ShardState::tie_range(const Gpt2& model, int rank, int ranks) {
  if (!model.tied()) return {0, 0};
  const ParamSpec& wte = model.params(0).front();
  const auto [lo, hi] =
      overlap(shard_first(model, 0, rank, ranks), shard_len(model, 0, rank, ranks), wte.offset, wte.numel);
  return {lo, std::max<std::int64_t>(0, hi - lo)};
}

Bytes ShardState::total_bytes(const Gpt2& model, DType dtype, int rank, int ranks, Weights weights) {
  const Bytes e = dtype_bytes(dtype);
  Bytes total = 0;
  std::int64_t params = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    const std::int64_t s = std::max<std::int64_t>(1, shard_floats(model, l, ranks));
    const std::int64_t w = weights == Weights::Whole ? std::max<std::int64_t>(1, model.param_floats(l)) : s;
    total += floats_bytes(w, e) + floats_bytes(s, e + 8 + (dtype == DType::BF16 ? 4 : 0));
    params += static_cast<std::int64_t>(model.params(l).size());
  }
  total += floats_bytes(tie_range(model, rank, ranks).second, e);
  return total + floats_bytes(params, sizeof(std::int32_t));
}

ShardState::ShardState(Device& device, Stream& stream, const Gpt2& model, DType dtype, int rank, int ranks,
                       Weights weights)
    : device_(device), model_(model), dtype_(dtype), rank_(rank), ranks_(ranks), whole_(weights == Weights::Whole) {
  if (dtype_ == DType::BF16) require_bf16(device_, fmt::format("{} shard state", owner()));
  const Bytes e = dtype_bytes(dtype_);
  for (int l = 0; l < model_.num_layers(); ++l) {
    const std::int64_t s = std::max<std::int64_t>(1, shard_floats(model_, l, ranks_));
    const auto name = [&](const char* what) { return fmt::format("{} {} L{} rank {}", owner(), what, l, rank_); };
    Layer L;
    L.w = device_.alloc(floats_bytes(whole_ ? std::max<std::int64_t>(1, model_.param_floats(l)) : s, e), name("W"));
    L.g = device_.alloc(floats_bytes(s, e), name("dW"));
    if (dtype_ == DType::BF16) L.master = device_.alloc(floats_bytes(s, 4), name("master"));
    L.m = device_.alloc(floats_bytes(s, 4), name("exp_avg"));
    L.v = device_.alloc(floats_bytes(s, 4), name("exp_avg_sq"));
    L.flag0 = flag_count_;
    flag_count_ += static_cast<std::int64_t>(model_.params(l).size());
    layers_.push_back(std::move(L));
  }
  std::tie(tie_first_, tie_len_) = tie_range(model_, rank_, ranks_);
  if (tie_len_ > 0)
    tie_g_ = device_.alloc(floats_bytes(tie_len_, e), fmt::format("{} tied dW rank {}", owner(), rank_));
  flags_ = device_.alloc(floats_bytes(flag_count_, sizeof(std::int32_t)), fmt::format("{} non-finite flags", owner()));
  device_.fill_zero(stream, flags_.data(), flags_.bytes());
  stream.synchronize();
  fresh_.assign(static_cast<std::size_t>(model_.num_layers()) + 1, 1);
}

const ShardState::Layer& ShardState::layer(int l) const {
  if (l < 0 || l >= model_.num_layers())
    throw BackendError(fmt::format("{} shard state: layer {} outside 0..{}", owner(), l, model_.num_layers() - 1));
  return layers_[static_cast<std::size_t>(l)];
}

void* ShardState::weights(int l) const {
  std::byte* w = layer(l).w.as<std::byte>();
  return whole_ ? w + floats_bytes(first(l), dtype_bytes(dtype_)) : w;
}

float* ShardState::master(int l) const {
  const Layer& L = layer(l);
  return dtype_ == DType::BF16 ? L.master.as<float>() : static_cast<float*>(weights(l));
}

bool ShardState::take_fresh(int l) {
  char& f = fresh_.at(l < 0 ? fresh_.size() - 1 : static_cast<std::size_t>(l));
  const bool was = f != 0;
  f = 0;
  return was;
}

void ShardState::upload(Stream& s, const HostState& host) {
  if (!(host.model().config() == model_.config()))
    throw BackendError(fmt::format("{} shard state: upload from a host state of another model", owner()));
  std::vector<Bf16> staging;
  for (int l = 0; l < model_.num_layers(); ++l) {
    Layer& L = layers_[static_cast<std::size_t>(l)];
    L.steps = host.steps(l);
    const std::int64_t a = first(l), n = len(l);
    // the working copy: the shard's part, or with whole weights the whole layer (bf16: rounded to nearest even)
    const std::int64_t wa = whole_ ? 0 : a, wn = whole_ ? model_.param_floats(l) : n;
    const float* w = host.weights(l).data() + wa;
    if (wn > 0 && dtype_ == DType::BF16) {
      staging.resize(static_cast<std::size_t>(wn));
      std::transform(w, w + wn, staging.begin(), [](float x) { return to_bf16(x); });
      device_.copy_h2d(s, L.w.data(), staging.data(), floats_bytes(wn, 2));
      s.synchronize();  // staging is reused by the next layer
    } else if (wn > 0) {
      device_.copy_h2d(s, L.w.data(), w, floats_bytes(wn, 4));
    }
    if (n == 0) continue;
    if (dtype_ == DType::BF16) device_.copy_h2d(s, L.master.data(), host.weights(l).data() + a, floats_bytes(n, 4));
    // the moments of the owned prefix (a tied twin has none: its part of the shard is never updated)
    const std::int64_t owned = DeviceState::owned_floats(model_, l);
    device_.fill_zero(s, L.m.data(), L.m.bytes());
    device_.fill_zero(s, L.v.data(), L.v.bytes());
    if (const std::int64_t k = std::min(a + n, owned) - a; k > 0) {
      device_.copy_h2d(s, L.m.data(), host.exp_avg(l).data() + a, floats_bytes(k, 4));
      device_.copy_h2d(s, L.v.data(), host.exp_avg_sq(l).data() + a, floats_bytes(k, 4));
    }
  }
  s.synchronize();
}

void ShardState::download(Stream& s, HostState& host) const {
  if (!(host.model().config() == model_.config()))
    throw BackendError(fmt::format("{} shard state: download into a host state of another model", owner()));
  for (int l = 0; l < model_.num_layers(); ++l) {
    const Layer& L = layers_[static_cast<std::size_t>(l)];
    const std::int64_t a = first(l), k = std::min(a + len(l), DeviceState::owned_floats(model_, l)) - a;
    if (k <= 0) continue;
    device_.copy_d2h(s, host.weights(l).data() + a, master(l), floats_bytes(k, 4));
    device_.copy_d2h(s, host.exp_avg(l).data() + a, L.m.data(), floats_bytes(k, 4));
    device_.copy_d2h(s, host.exp_avg_sq(l).data() + a, L.v.data(), floats_bytes(k, 4));
  }
  s.synchronize();
  for (int l = 0; l < model_.num_layers(); ++l) host.set_steps(l, layers_[static_cast<std::size_t>(l)].steps);
}

template <class S>
void ShardState::update_as(Stream& s, const AdamWConfig& config, int l) {
  Kernels<S>& k = kernels_of<S>(device_, whole_ ? "zero2 shard state" : "fsdp shard state");
  Layer& L = layers_[static_cast<std::size_t>(l)];
  const std::int64_t step = ++L.steps;
  const std::int64_t a = first(l), n = len(l);
  const auto& ps = model_.params(l);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const ParamSpec& p = ps[i];
    if (!p.tied_to.empty()) continue;  // lm_head: updated through layer 0's wte (its rank's), gathered from there
    const auto [lo, hi] = overlap(a, n, p.offset, p.numel);
    if (hi <= lo) continue;
    const std::int64_t at = lo - a;  // within the shard
    AdamWTensors<S> t;
    t.param = master(l) + at;
    if constexpr (std::is_same_v<S, Bf16>) t.working = static_cast<S*>(weights(l)) + at;
    t.grad = L.g.as<S>() + at;
    t.exp_avg = L.m.as<float>() + at;
    t.exp_avg_sq = L.v.as<float>() + at;
    t.nonfinite = flags_.as<std::int32_t>() + L.flag0 + static_cast<std::int64_t>(i);
    if (l == 0 && model_.tied() && p.name == model_.embedding_name())  // the tie: [lo, hi) is exactly tie's range
      t.grad2 = tie_g_.as<S>();
    k.adamw(s, config, step, t, hi - lo);
  }
}

void ShardState::update(Stream& s, const AdamWConfig& config, int l) {
  config.validate();
  (void)layer(l);  // the range check
  if (dtype_ == DType::BF16) {
    update_as<Bf16>(s, config, l);
  } else {
    update_as<float>(s, config, l);
  }
}

void ShardState::take_flags(Stream& s, std::vector<std::int32_t>& any) {
  std::vector<std::int32_t> f(static_cast<std::size_t>(flag_count_));
  device_.copy_d2h(s, f.data(), flags_.data(), floats_bytes(flag_count_, sizeof(std::int32_t)));
  device_.fill_zero(s, flags_.data(), flags_.bytes());
  s.synchronize();
  any.resize(f.size(), 0);
  for (std::size_t i = 0; i < f.size(); ++i) any[i] |= f[i];
}

std::optional<NonFiniteGradient> nonfinite_of(const Gpt2& model, const std::vector<std::int32_t>& flags) {
  // update_layers' rule: layers in order, parameters in order; the highest layer's first such parameter is named.
  std::optional<NonFiniteGradient> nonfinite;
  std::size_t at = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (at >= flags.size() || flags[at++] == 0) continue;
      if (!nonfinite || l > nonfinite->layer) {
        const int before = nonfinite ? nonfinite->params : 0;
        nonfinite = NonFiniteGradient{l, p.name, before};
      }
      ++nonfinite->params;
    }
  }
  return nonfinite;
}

}  // namespace harmony::backend::detail
