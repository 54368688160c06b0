// The host side of training, as Harmony keeps it: fp32 master weights, the gradients brought back from
// the devices, one flat block per layer (Gpt2's parameter layout), and the AdamW moments of the block's owned prefix
// (all but a tied twin: the head's lm_head has none). The CPU updates
// a layer range (a pack) at a time; the tied wte/lm_head weight is updated once, by layer 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/model/gpt2.hpp"

namespace harmony::backend {

class HostState {
 public:
  explicit HostState(const Gpt2& model);  // all zero

  const Gpt2& model() const { return model_; }
  std::span<float> weights(int layer) { return block(weights_, layer); }
  std::span<const float> weights(int layer) const { return block(weights_, layer); }
  std::span<float> grads(int layer) { return block(grads_, layer); }
  std::span<const float> grads(int layer) const { return block(grads_, layer); }
  // A layer's moments: its block's first DeviceState::owned_floats elements (the tied lm_head, last in the head's
  // block, is updated through layer 0's wte and keeps none).
  std::span<float> exp_avg(int layer) { return block(exp_avg_, layer); }
  std::span<float> exp_avg_sq(int layer) { return block(exp_avg_sq_, layer); }
  std::span<const float> exp_avg(int layer) const { return block(exp_avg_, layer); }
  std::span<const float> exp_avg_sq(int layer) const { return block(exp_avg_sq_, layer); }
  std::int64_t steps(int layer) const { return steps_.at(static_cast<std::size_t>(layer)); }
  // Sets a layer's AdamW step count (restoring a checkpoint). BackendError for a bad layer or steps < 0.
  void set_steps(int layer, std::int64_t steps);
  // One parameter's slice of a layer's weight or gradient block.
  std::span<float> weight(int layer, std::string_view name);
  std::span<const float> weight(int layer, std::string_view name) const;
  std::span<float> grad(int layer, std::string_view name);

  // AdamW on layers [first, last] with their gradients as they are in grads(). The head's lm_head is
  // skipped: the tied weight is owned by layer 0, whose update uses grad(0, wte) + grad(head, lm_head) (so
  // the head's gradients must be on the host before layer 0 is updated, which a backward pass guarantees)
  // and then copies the new value into the head's block. Each layer's step count advances by one.
  void update(const AdamWConfig& config, int first, int last);
  // Copies layer 0's wte into the head's lm_head (after loading or initialising weights).
  void sync_tied();
  void zero_grads();
  // GPT-2 initialisation (normal(0, 0.02); c_proj weights 0.02/sqrt(2L); biases 0; layer norms 1), from a
  // seeded std::mt19937_64 (deterministic with one standard library), then sync_tied().
  void init_weights(std::uint64_t seed);

 private:
  std::span<float> block(std::vector<std::vector<float>>& v, int layer);
  std::span<const float> block(const std::vector<std::vector<float>>& v, int layer) const;

  Gpt2 model_;
  std::vector<std::vector<float>> weights_, grads_, exp_avg_, exp_avg_sq_;
  std::vector<std::int64_t> steps_;
};

}  // namespace harmony::backend
