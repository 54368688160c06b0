// One rank's sharded training state (fsdp's and zero3's, N > 1; zero2's with whole weights): per layer its shard of the
// flat W+B block — working copy, gradient, fp32 master (bf16) and AdamW moments — partitioned as zero-infinity's shards
// (FlowInterpreter::shard_first), filled from a HostState and read back into one, and updated on the device by
// Kernels<S>::adamw exactly as DeviceState updates the whole tensors (the tied wte with the head's lm_head gradient).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/adamw_parallel.hpp"
#include "backend/device.hpp"
#include "backend/model/gpt2.hpp"

namespace harmony::backend {
class HostState;
}

namespace harmony::backend::detail {

// Rank r of N holds, of layer l's param_floats(l) = F elements, [r S, min(F, (r+1) S)) with S = ceil(F / N) (the
// last ranks' shards may be short or empty; each buffer is S elements, at least one). Per layer, per element of S:
//   weights  S     what the all-gather copies out (bf16: the master rounded to nearest even)
//   grads    S     what the reduce-scatter writes: the first of a step copies, the later ones add (Kernels<S>::add)
//   master   fp32  bf16 only: the fp32 master AdamW updates
//   exp_avg, exp_avg_sq  fp32
// so per parameter of the shard 16 bytes in both dtypes (DeviceState::bytes_per_param), none of it replicated.
// With whole weights (zero2: every GPU keeps the whole model's working weights, Weights::Whole) the working copy is
// the whole layer (param_floats(l) elements), of which the shard's is the slice at first(l): the update writes that
// slice in place, the all-gather copies it to the other ranks' whole copies, and in fp32 it is the master too.
// The tie (a model whose head's lm_head is wte's twin): the rank also keeps, in S, the head's lm_head gradient over
// the part of wte its layer-0 shard holds (tie_grads: what the head's reduce-scatter writes there), which its wte
// update adds (AdamWTensors::grad2). The head's own shard of lm_head is never updated nor gathered: the head's
// all-gather copies lm_head from the ranks' wte (FlowInterpreter::run_ag), so the twins stay equal.
class ShardState {
 public:
  enum class Weights { Shard, Whole };  // the working copy: the shard's (fsdp) or the whole layer's (zero2)
  // Allocates every layer's shard on `device` (OutOfMemory names the first that does not fit: "fsdp W L3 rank 1",
  // "zero2 W L3 rank 1"). Contents unset until upload(); flags zero. bf16 needs the device's bf16 kernels. `stream`
  // zeroes the flags.
  ShardState(Device& device, Stream& stream, const Gpt2& model, DType dtype, int rank, int ranks,
             Weights weights = Weights::Shard);

  // The partition: layer l's elements per rank (S), rank r's first and how many it holds.
  static std::int64_t shard_floats(const Gpt2& model, int l, int ranks) {
    return (model.param_floats(l) + ranks - 1) / ranks;
  }
  static std::int64_t shard_first(const Gpt2& model, int l, int rank, int ranks) {
    return std::min(model.param_floats(l), rank * shard_floats(model, l, ranks));
  }
  static std::int64_t shard_len(const Gpt2& model, int l, int rank, int ranks) {
    return std::min(model.param_floats(l), (rank + 1) * shard_floats(model, l, ranks)) -
           shard_first(model, l, rank, ranks);
  }
  // What rank r allocates (before the device's rounding): per layer 16 bytes per element of S (at least one), the
  // tie's gradient (the rank's part of wte in the storage type) and 4 bytes per parameter tensor (the non-finite
  // flags); with whole weights, the working copy is the layer's param_floats(l) elements instead of S.
  static Bytes total_bytes(const Gpt2& model, DType dtype, int rank, int ranks, Weights weights = Weights::Shard);
  // The part of wte rank r's layer-0 shard holds, in layer 0's block: [first, first + len), len 0 without a tie.
  static std::pair<std::int64_t, std::int64_t> tie_range(const Gpt2& model, int rank, int ranks);

  std::int64_t first(int l) const { return shard_first(model_, l, rank_, ranks_); }
  std::int64_t len(int l) const { return shard_len(model_, l, rank_, ranks_); }
  // The shard's working copy (with whole weights, its slice of the whole copy) and gradient in the storage type
  // (float or Bf16).
  void* weights(int l) const;
  // With whole weights: layer l's whole working copy (what the compute ops read and the all-gather writes); nullptr
  // with shard weights.
  void* whole_weights(int l) const { return whole_ ? layer(l).w.data() : nullptr; }
  void* grads(int l) const { return layer(l).g.data(); }
  // The tie's range of layer 0 (block elements [tie_first, tie_first + tie_len): this rank's shard of wte, empty
  // without a tie) and its gradient buffer (nullptr when empty).
  std::int64_t tie_first() const { return tie_first_; }
  std::int64_t tie_len() const { return tie_len_; }
  void* tie_grads() const { return tie_len_ > 0 ? tie_g_.data() : nullptr; }
  // The first reduce-scatter of a step into layer l's gradient (layer -1: the tie's) copies, the later ones add:
  // true once per step and layer (begin_step clears them; the reduce-scatters of one layer are issued in order).
  bool take_fresh(int l);
  void begin_step() { fresh_.assign(fresh_.size(), 1); }

  // host -> device: this rank's part of the weights (bf16: master exact, working copy rounded), moments and step
  // counts. Synchronizes s.
  void upload(Stream& s, const HostState& host);
  // device -> host: this rank's part of the masters and moments, but for a tied twin (wte's own rank writes it;
  // HostState::sync_tied copies it), and the step counts. Synchronizes s.
  void download(Stream& s, HostState& host) const;
  // Enqueues AdamW on layer l's shard on s, per parameter tensor the part the shard holds (Kernels<S>::adamw, the
  // step count advanced now, on the host), the tied twin skipped, wte with the tie's gradient added.
  void update(Stream& s, const AdamWConfig& config, int l);
  // ORs the non-finite flags the updates set since the last call into `any` (one int32 per parameter tensor, layer
  // by layer; sized here) and clears them. Synchronizes s.
  void take_flags(Stream& s, std::vector<std::int32_t>& any);

 private:
  struct Layer {
    Buffer w, g, master, m, v;
    std::int64_t steps = 0;
    std::int64_t flag0 = 0;
  };
  const Layer& layer(int l) const;
  float* master(int l) const;
  template <class S>
  void update_as(Stream& s, const AdamWConfig& config, int l);

  const char* owner() const { return whole_ ? "zero2" : "fsdp"; }  // for allocation names and messages

  Device& device_;
  const Gpt2& model_;
  DType dtype_;
  int rank_ = 0, ranks_ = 1;
  bool whole_ = false;  // Weights::Whole: Layer::w is the whole layer's working copy
  std::vector<Layer> layers_;
  std::int64_t tie_first_ = 0, tie_len_ = 0;
  Buffer tie_g_;
  Buffer flags_;
  std::int64_t flag_count_ = 0;
  std::vector<char> fresh_;  // per layer, then the tie's
};

// The non-finite flags of every rank ORed (ShardState::take_flags) as update_layers reports them: the highest
// layer's first such parameter and how many; nullopt when none.
std::optional<NonFiniteGradient> nonfinite_of(const Gpt2& model, const std::vector<std::int32_t>& flags);

}  // namespace harmony::backend::detail
