// The device-resident training state (the resident plan kind's): every layer's working weights, gradients and AdamW
// moments (and, in bf16, the fp32 master weights) allocated on one device, filled from a HostState and read back into
// one (checkpoints, --save-weights) bit for bit, and updated on the device by Kernels<S>::adamw exactly as
// HostState::update / update_layers update the host copy. Its memory per parameter is what harmony-sim should price.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/adamw_parallel.hpp"
#include "backend/device.hpp"
#include "backend/model/gpt2.hpp"

namespace harmony::backend {

class HostState;

// Per layer, in Gpt2's block layout (HostState's):
//   weights  S     param_floats(layer)  what the kernels read (bf16: the master rounded to nearest even)
//   grads    S     param_floats(layer)  what the backward accumulates into; all-reduced across replicas in place
//   master   fp32  owned_floats(layer)  bf16 only: the fp32 master weights AdamW updates
//   exp_avg, exp_avg_sq  fp32  owned_floats(layer)
// owned_floats is the block without its tied twin (the head's lm_head, last in its block), which has working weights
// and a gradient but no optimizer state: layer 0's wte update sums both gradients and writes both working copies.
// So per parameter: fp32 4 (W) + 4 (G) + 8 (m, v) = 16 bytes; bf16 2 (W) + 2 (G) + 4 (master) + 8 (m, v) = 16 bytes;
// plus the tied twin's working weights and gradient (fp32 8, bf16 4 bytes per element of wte).
class DeviceState {
 public:
  // Allocates every layer's tensors on `device` (OutOfMemory names the first that does not fit: "resident W L3").
  // Contents are unset until upload(); gradients and the non-finite flags start at zero. bf16 needs the device's
  // bf16 kernels (DeviceError otherwise). `device` must outlive the state; `stream` (of `device`) zeroes the gradients.
  DeviceState(Device& device, Stream& stream, const Gpt2& model, DType dtype);

  // ---- memory accounting (the same numbers harmony-sim and the memory pre-check should use)
  // 16 for both dtypes (see the class comment).
  static Bytes bytes_per_param(DType dtype);
  // The elements of `layer`'s block that carry optimizer state (all but a tied twin at its end).
  static std::int64_t owned_floats(const Gpt2& model, int layer);
  // The bytes of `layer`'s tensors as requested (each allocation is further rounded up to the device's granularity).
  static Bytes layer_bytes(const Gpt2& model, int layer, DType dtype);
  // Every layer's layer_bytes plus the non-finite flags: bytes_per_param(dtype) * model.param_count() + the tied
  // twin's W and G + 4 bytes per parameter tensor.
  static Bytes total_bytes(const Gpt2& model, DType dtype);

  Device& device() const { return device_; }
  const Gpt2& model() const { return model_; }
  DType dtype() const { return dtype_; }
  // The working weights and the gradients of a layer as the kernels see them (S: float for fp32, Bf16 for bf16;
  // BackendError for the other).
  template <class S>
  S* weights(int layer) const;
  template <class S>
  S* grads(int layer) const;
  // The fp32 weights AdamW updates: the master (bf16) or the weights themselves (fp32).
  float* master(int layer) const;
  float* exp_avg(int layer) const;
  float* exp_avg_sq(int layer) const;
  std::int64_t steps(int layer) const;

  // host -> device: weights (bf16: the master exactly, the working copy rounded to nearest even), AdamW moments and
  // step counts. Returns when the copies are done (s is synchronized). Host lm_head must be wte's copy (sync_tied).
  void upload(Stream& s, const HostState& host);
  // device -> host: weights (the masters; the head's lm_head made wte's copy again), moments (a tied twin's, which no
  // update touches, zero) and step counts. Synchronizes s. upload then download is the identity on a HostState whose
  // lm_head moments are zero, as every HostState's are (no update touches them).
  void download(Stream& s, HostState& host) const;
  // Gradients host -> device (bf16: rounded to nearest even) and device -> host (bf16: widened exactly).
  void upload_grads(Stream& s, const HostState& host);
  void download_grads(Stream& s, HostState& host) const;
  void zero_grads(Stream& s);

  // Enqueues AdamW on layers [first, last] on s with the gradients as they are on the device, as HostState::update:
  // every parameter but the tied lm_head updated by Kernels<S>::adamw; layer 0's wte with the head's lm_head
  // gradient added and its result written to both working copies; each layer's step count advanced (now, on the
  // host). The update never reads another layer's weights, so updates of disjoint ranges may run on different
  // streams, except that layer 0's reads the head's gradient. BackendError for a bad range or config.
  void update(Stream& s, const AdamWConfig& config, int first, int last);
  // The non-finite gradients the updates enqueued since the last call read, as update_layers reports them (the
  // highest layer's first such parameter and how many), nullopt when all were finite; clears the flags. Synchronizes s.
  std::optional<NonFiniteGradient> take_nonfinite(Stream& s);

 private:
  struct Layer {
    Buffer w, g, master, m, v;
    std::int64_t steps = 0;
    std::int64_t flag0 = 0;  // its parameters' first index in flags_
  };
  const Layer& layer(int l) const;
  template <class S>
  void update_as(Stream& s, const AdamWConfig& config, int first, int last);

  Device& device_;
  Gpt2 model_;
  DType dtype_;
  std::vector<Layer> layers_;
  Buffer flags_;  // int32 per parameter tensor, layer by layer: set by adamw when its gradient was not finite
  std::int64_t flag_count_ = 0;
};

}  // namespace harmony::backend
