// The plain (everything resident) trainer: per microbatch a forward through all layers and a backward
// accumulating weight gradients on the device; then gradients to the host, AdamW, weights back.
#include "backend/trainer.hpp"
#include "backend/model/describe.hpp"

#include <algorithm>
#include <numeric>
#include <type_traits>

#include <fmt/format.h>

namespace harmony::backend {

PlainTrainer::PlainTrainer(Device& device, HostState& state, const TrainerOptions& options)
    : device_(device), state_(state), options_(options) {
  const Gpt2& m = state_.model();
  const int B = options_.batch, T = options_.seq_len;
  if (B <= 0 || T <= 0 || T > m.config().max_seq_len)
    throw BackendError(fmt::format("trainer: batch {} x {} invalid (T must be 1..{})", B, T, m.config().max_seq_len));
  if (options_.microbatches.empty()) options_.microbatches = {B};
  for (int u : options_.microbatches) {
    if (u <= 0) throw BackendError(fmt::format("trainer: microbatch size {} must be positive", u));
  }
  const int sum = std::accumulate(options_.microbatches.begin(), options_.microbatches.end(), 0);
  if (sum != B) throw BackendError(fmt::format("trainer: microbatch sizes sum to {}, the minibatch has {}", sum, B));
  const int U = *std::max_element(options_.microbatches.begin(), options_.microbatches.end());

  const DType dt = options_.dtype;
  if (dt == DType::BF16) require_bf16(device_, "trainer");
  const Bytes es = dtype_bytes(dt);
  stream_ = device_.create_stream("plain-trainer");
  std::int64_t scratch = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    const std::string name = m.layer_name(l);
    w_.push_back(device_.alloc(m.param_floats(l) * es, "W " + name));
    dw_.push_back(device_.alloc(m.param_floats(l) * es, "dW " + name));
    y_.push_back(device_.alloc(m.output_bytes(l, U, T, dt), "Y " + name));
    act_.push_back(device_.alloc(m.act_floats(l, U, T, dt) * es, "act " + name));
    scratch = std::max(scratch, m.scratch_floats(l, U, T));
  }
  const Bytes ids = Bytes(U) * T * Bytes(sizeof(std::int32_t));
  tokens_ = device_.alloc(ids, "tokens");
  targets_ = device_.alloc(ids, "targets");
  scratch_ = device_.alloc(scratch * es, "scratch");
  grad_a_ = device_.alloc(Bytes(U) * T * m.config().n_embd * es, "dX a");
  grad_b_ = device_.alloc(Bytes(U) * T * m.config().n_embd * es, "dX b");
  losses_.assign(static_cast<std::size_t>(B) * T, 0.0f);
  upload_weights();
}

PlainTrainer::~PlainTrainer() {
  try {
    stream_->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the error was the caller's to see
  }
}

void PlainTrainer::upload_weights() {
  const Gpt2& m = state_.model();
  for (int l = 0; l < m.num_layers(); ++l) {
    if (options_.dtype == DType::F32) {
      device_.copy_h2d(*stream_, w_[l].data(), state_.weights(l).data(), m.param_floats(l) * kF);
      continue;
    }
    const auto w = state_.weights(l);
    staging_.resize(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) staging_[i] = to_bf16(w[i]);
    device_.copy_h2d(*stream_, w_[l].data(), staging_.data(), Bytes(w.size()) * Bytes(sizeof(Bf16)));
    stream_->synchronize();  // staging_ is reused by the next layer
  }
  stream_->synchronize();
}

double PlainTrainer::forward_backward(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  const int B = options_.batch, T = options_.seq_len;
  const auto bt = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (inputs.size() != bt || targets.size() != bt)
    throw BackendError(
        fmt::format("trainer: expected {} inputs and targets, got {} and {}", bt, inputs.size(), targets.size()));
  if (options_.dtype == DType::BF16) {
    run_minibatch<Bf16>(inputs, targets);
  } else {
    run_minibatch<float>(inputs, targets);
  }
  double total = 0.0;
  for (const float x : losses_) total += x;
  return total / static_cast<double>(bt);
}

template <class S>
void PlainTrainer::run_minibatch(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  const Gpt2& m = state_.model();
  const int B = options_.batch, T = options_.seq_len, L = m.num_layers();
  const auto bt = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  Stream& s = *stream_;
  for (int l = 0; l < L; ++l) device_.fill_zero(s, dw_[l].data(), dw_[l].bytes());
  BasicDeviceOps<S> ops(device_, s);
  const float scale = 1.0f / static_cast<float>(bt);
  std::size_t row = 0;  // first token of the microbatch
  for (const int u : options_.microbatches) {
    const std::size_t n = static_cast<std::size_t>(u) * static_cast<std::size_t>(T);
    device_.copy_h2d(s, tokens_.data(), inputs.data() + row, Bytes(n) * Bytes(sizeof(std::int32_t)));
    device_.copy_h2d(s, targets_.data(), targets.data() + row, Bytes(n) * Bytes(sizeof(std::int32_t)));
    LayerArgs<S> a;
    a.B = u;
    a.T = T;
    a.tokens = tokens_.as<std::int32_t>();
    a.targets = targets_.as<std::int32_t>();
    a.scratch = scratch_.as<S>();
    a.loss_scale = scale;
    for (int l = 0; l < L; ++l) {
      a.w = w_[l].as<S>();
      a.x = l > 0 ? y_[l - 1].as<S>() : nullptr;
      a.y = y_[l].as<S>();
      a.act = act_[l].as<S>();
      m.forward(ops, l, a);
    }
    device_.copy_d2h(s, losses_.data() + row, y_[L - 1].data(), Bytes(n) * kF);  // fp32 losses in every dtype
    S* dy = nullptr;
    S* dx = grad_a_.as<S>();
    S* spare = grad_b_.as<S>();
    for (int l = L - 1; l >= 0; --l) {
      a.w = w_[l].as<S>();
      a.dw = dw_[l].as<S>();
      a.x = l > 0 ? y_[l - 1].as<S>() : nullptr;
      a.act = act_[l].as<S>();
      a.dy = dy;
      a.dx = l > 0 ? dx : nullptr;
      m.backward(ops, l, a);
      dy = dx;
      std::swap(dx, spare);
    }
    row += n;
  }
  if constexpr (std::is_same_v<S, float>) {
    for (int l = 0; l < L; ++l) device_.copy_d2h(s, state_.grads(l).data(), dw_[l].data(), dw_[l].bytes());
    s.synchronize();
  } else {
    for (int l = 0; l < L; ++l) {  // bf16 gradients widened exactly into the host's fp32 gradients
      const auto g = state_.grads(l);
      staging_.resize(g.size());
      device_.copy_d2h(s, staging_.data(), dw_[l].data(), dw_[l].bytes());
      s.synchronize();
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = to_f32(staging_[i]);
    }
  }
}

double PlainTrainer::step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                          const AdamWConfig& config) {
  const double loss = forward_backward(inputs, targets);
  state_.update(config, 0, state_.model().num_layers() - 1);
  upload_weights();
  return loss;
}

}  // namespace harmony::backend
