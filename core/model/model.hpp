// The model the scheduler packs: a chain of layers (the last one is the loss) with per-layer
// costs measured at a set of microbatch sizes. Lookups at unmeasured sizes interpolate linearly
// per layer exactly as the paper's scheduler does (np.interp; memory truncated to an integer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/units.hpp"

namespace harmony::core {

enum class Phase { Fwd, Bwd };

struct Layer {
  std::string name;
  bool is_criterion = false;
  Bytes weight_bytes = 0;
  Bytes buffer_bytes = 0;
  Bytes optimizer_state_bytes = 0;
  std::int64_t param_count = 0;
  // The parameter tensors those parameters are (a Linear with bias: 2), which systems that handle parameters
  // tensor by tensor (ZeRO-3) pay per-tensor costs for. Analytic models derive it; profiles do not record it:
  // 0 = unknown, and param_tensors_or_default() assumes 2 (one weight and one bias) for a layer with parameters.
  int param_tensors = 0;
  int param_tensors_or_default() const { return param_tensors > 0 ? param_tensors : kDefaultParamTensors; }
  static constexpr int kDefaultParamTensors = 2;
  // The nn.Modules among those whose parameters DeepSpeed stage 3 fetches and releases around every use: the ones
  // holding a tensor above its default stage3_param_persistence_threshold (kZero3PersistenceElements; smaller tensors,
  // a norm's gain or a bias, stay whole on every GPU: parameter_offload.py mark_persistent_parameters). Stage 3 hooks
  // every submodule (_register_deepspeed_module), and these pay its fetch and release. Analytic models derive it;
  // -1 = unknown (profiles do not record it), and gathered_modules_or_default() assumes one such module per layer.
  int gathered_modules = -1;
  int gathered_modules_or_default() const { return gathered_modules >= 0 ? gathered_modules : 1; }
  static constexpr double kZero3PersistenceElements = 1e5;  // DeepSpeed zero/config.py param_persistence_threshold
  double update_time_cpu_s = 0.0;
  Bytes input_bytes_per_sample = 0;  // X[l] per sample: the previous layer's output (data for l = 0)
  // Aligned with Model::ubatch_fwd / Model::ubatch_bwd.
  std::vector<double> fwd_time_s;  // no-grad forward
  std::vector<double> bwd_time_s;  // forward-with-grad (recompute) + backward
  std::vector<Bytes> fwd_peak_bytes;
  std::vector<Bytes> bwd_peak_bytes;
  // Optional, aligned with ubatch_bwd (empty = not recorded, read as 0): the part of bwd_peak_bytes live only while
  // this layer's backward runs (its dY, dX and scratch). A pack's backward holds one layer's at a time, so a pack
  // of several layers charges the largest of these once, not their sum (docs/native-model.md, "Memory").
  std::vector<Bytes> bwd_transient_bytes;
  // Optional, aligned with ubatch_bwd (empty = not recorded): the activations this layer's forward with grad keeps
  // for its backward — what a keep-policy forward holds — where the model's maker knows them (harmony-run's
  // description and profiler exactly; the analytic models from their memory walk). Not recorded, saved_activation_bytes
  // derives them from bwd_peak_bytes as the paper's scheduler does (an estimate, docs/baselines.md, "Saved
  // activations").
  std::vector<Bytes> saved_bytes;
};

class Model {
 public:
  std::string name;
  std::string source;          // where it came from (profile path), for messages
  std::string dtype = "fp32";  // element type the device byte counts assume: "fp32" or "bf16" (mixed precision)
  // Whether the optimizer keeps FP32 parameters and state: FP32 training, or mixed precision's FP32 masters and
  // moments beside 2-byte device weights (every measured profile). false: pure 2-byte training (torchtune's bf16,
  // LLaMA-Factory's pure_bf16, torchao's bf16 optimizer states): no master, the moments in the weights' dtype
  // (model.analytic.master_weights: false; docs/config.md).
  bool fp32_optimizer = true;
  // HBM bytes a parameter of one AdamW step on the GPU (the kinds with resident_state); 0: a fused one-pass step
  // (device_adamw_bytes: 28, or 14 in pure 2-byte training). Analytic models set it for gpu_optimizer: foreach.
  std::int64_t device_adamw_bytes_per_param = 0;
  std::vector<int> ubatch_fwd;  // measured forward microbatch sizes, strictly ascending
  std::vector<int> ubatch_bwd;  // measured backward microbatch sizes, strictly ascending
  std::vector<Layer> layers;    // R layers; layers.back() is the criterion

  int num_layers() const { return static_cast<int>(layers.size()); }
  int ubatch_min(Phase p) const;
  int ubatch_max(Phase p) const;
  bool ubatch_in_range(Phase p, int u) const;

  // Per-layer time in seconds at microbatch u (np.interp between measured sizes).
  // Throws ScheduleError when u is outside the measured range.
  double time_s(Phase p, int u, int layer) const;
  // Per-layer peak memory at u: interpolated, then truncated to an integer (as the reference).
  Bytes peak_bytes(Phase p, int u, int layer) const;
  // Layer::bwd_transient_bytes at u (interpolated, truncated; 0 when not recorded), never above the bwd peak.
  Bytes bwd_transient_bytes(int u, int layer) const;
  // Layer::saved_bytes at u (interpolated, truncated), or -1 when not recorded.
  Bytes recorded_saved_bytes(int u, int layer) const;
  // The larger of the layer's forward and backward peaks at u beyond its own weights, buffers and input (which the
  // kinds' memory estimates count elsewhere); may be negative for a profile whose peaks do not hold them.
  Bytes peak_beyond_own_bytes(int u, int layer) const;
  // Bytes of X[layer] (the input of `layer`) at microbatch u; 0 for layer == R (after the loss).
  Bytes input_bytes(int u, int layer) const;
  // W + B of layers [first, last].
  Bytes weight_bytes(int first, int last) const;
  Bytes buffer_bytes(int first, int last) const;
  Bytes optimizer_state_bytes(int first, int last) const;
  // The FP32 master copy of layers [first, last] that optimizer_state_bytes does not already hold: for FP32
  // weights the weights themselves (4 bytes per parameter, or W + B without a parameter count); for 2-byte
  // weights 0, since mixed-precision optimizer state includes the masters (analytic models and bf16 profiles
  // record 12 bytes per parameter for Adam). What an offloaded optimizer step reads and writes besides the state.
  Bytes master_bytes(int first, int last) const;
  // Layer l's parameters at the optimizer's precision: 4 bytes each (FP32 training, or mixed precision's FP32
  // masters), or its weight bytes when the profile has no parameter count; 2 bytes each under pure 2-byte training
  // (fp32_optimizer false). What an AdamW step reads and writes per tensor of the layer (masters, gradient).
  Bytes optimizer_param_bytes(int l) const;
  // Whether layer l's device weights are narrower than its FP32 masters (fp16/bf16 under mixed precision: under 3
  // bytes a parameter), so the update writes a converted device copy beside the masters. Never under pure 2-byte
  // training: the optimizer steps the 2-byte weights themselves.
  bool narrow_weights(int l) const;

  // Checks internal consistency (sizes aligned, ascending ubatch lists, criterion last).
  // Throws ScheduleError naming the first problem.
  void validate() const;
};

}  // namespace harmony::core
