// The plain trainer, the in-project reference for Harmony's schedules: every layer's weights, gradients
// and activations resident on one device, the minibatch run whole or as microbatches in order (gradient
// accumulation, each microbatch's loss gradient scaled by 1/(B*T) of the whole minibatch), gradients
// brought to the host and AdamW applied there by the CPU, as Harmony does.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/device.hpp"
#include "backend/model/state.hpp"

namespace harmony::backend {

struct TrainerOptions {
  int batch = 0;                  // B sequences per minibatch
  int seq_len = 0;                // T tokens per sequence
  std::vector<int> microbatches;  // sizes in order, summing to B; empty: the whole minibatch at once
  // Device storage (docs/backend.md, "Mixed precision"). BF16: weights, activations and gradients in bf16 on
  // the device (the upload rounds the fp32 master weights to nearest even; gradients are widened exactly on
  // the way back), fp32 master weights and AdamW on the host. Needs the device's bf16 kernels (DeviceError
  // at construction otherwise).
  DType dtype = DType::F32;
};

class PlainTrainer {
 public:
  // Allocates everything on `device` (OutOfMemory names what did not fit) and uploads state's weights.
  // `state` must outlive the trainer.
  PlainTrainer(Device& device, HostState& state, const TrainerOptions& options);
  ~PlainTrainer();
  PlainTrainer(const PlainTrainer&) = delete;
  PlainTrainer& operator=(const PlainTrainer&) = delete;

  // Forward and backward over one minibatch (inputs and targets: B*T ids, row-major (B, T)). Every layer's
  // gradient lands in state.grads(); returns the mean cross-entropy over the B*T tokens (summed in double,
  // in token order).
  double forward_backward(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets);
  // forward_backward, then AdamW on the host for every layer and the new weights uploaded.
  double step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, const AdamWConfig& config);
  // The last minibatch's per-token losses, (B, T).
  std::span<const float> token_losses() const { return losses_; }
  // Copies state's weights to the device again (after changing them outside step()).
  void upload_weights();

 private:
  Device& device_;
  HostState& state_;
  TrainerOptions options_;
  std::unique_ptr<Stream> stream_;
  std::vector<Buffer> w_, dw_, y_, act_;
  Buffer tokens_, targets_, scratch_, grad_a_, grad_b_;
  std::vector<float> losses_;
  std::vector<Bf16> staging_;  // bf16: the rounded weights on their way up, the gradients on their way down

  template <class S>
  void run_minibatch(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets);
};

}  // namespace harmony::backend
