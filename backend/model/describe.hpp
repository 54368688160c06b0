// The GPT-2 layer chain as the core schedules it: a core::Model whose layers carry the exact byte sizes
// the backend allocates (weights swapped per layer, host optimizer state, inputs, per-microbatch peaks)
// and, until measured profiles exist, compute and update times estimated from FLOP and parameter counts.
#pragma once

#include <vector>

#include "backend/model/gpt2.hpp"
#include "core/model/model.hpp"

namespace harmony::backend {

// Bytes per element of the fp32 tensors the CPU and CUDA devices hold.
inline constexpr core::Bytes kF = sizeof(float);

struct DescribeOptions {
  double seconds_per_flop = 0.0;          // forward time = FLOPs x this; backward (recompute + backward) 3x
  double update_seconds_per_param = 0.0;  // CPU AdamW time per parameter
  // The device storage of weights, activations and gradients: every device byte count (weights, inputs,
  // peaks) uses its element size. optimizer_state_bytes is what the host keeps beyond the device-dtype weights:
  // AdamW's fp32 moments, plus in bf16 the fp32 master copy (12 bytes per parameter, as analytic models and
  // ZeRO count it; core::Model::master_bytes is then 0).
  DType dtype = DType::F32;
};

// Layer l of the result is layer l of `model` (the head is the criterion); ubatch_sizes (strictly
// ascending) serve as both the forward and backward sizes. Per layer: weight_bytes = its block (the head's
// includes its copy of wte), optimizer_state_bytes = AdamW's m and v of the parameters it owns (+ their
// fp32 masters in bf16; the tied wte's belong to layer 0), input_bytes_per_sample = input_bytes(l, 1, T), fwd peak =
// W + x + y + act, bwd peak = W + dW + x + act + scratch + dy + dx (core's convention: what the pass holds, its
// weights included), bwd transient = scratch + dy + dx, saved = act (what a forward with grad keeps).
core::Model describe_gpt2(const Gpt2& model, int seq_len, const std::vector<int>& ubatch_sizes,
                          const DescribeOptions& options = {});

// Forward FLOPs of one layer over B sequences of T tokens (multiply-adds count 2).
double forward_flops(const Gpt2& model, int layer, int B, int T);

}  // namespace harmony::backend
