// A plan kind's knobs: the values besides sizes and packs that a plan of some kinds carries (Plan::knobs) and that a
// kind lists as `plan.<knob>` keys (PlanKindSpec::knobs): the activation policy, the offload tier, ZeRO-3's
// overheads, forced swap choices and the capacity the swap decisions fit against. Their types, names and defaults.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/base/units.hpp"

namespace harmony::core {

// A forced or automatic swap decision. Auto decides from the profile and KindKnobs::gpu_capacity_bytes.
enum class SwapChoice { Auto, Keep, Swap };

// What a plan does with the tensors its backward needs (docs/baselines.md "Activation policies").
// Checkpoint: only each layer's input is kept (or swapped); the backward recomputes the layer's forward
// (a REC op, priced at the fwd time like Harmony's) before the BWD. Keep: the forward also keeps the
// layer's saved activations (saved_activation_bytes) on the GPU, or swaps them out and in with the
// stash, and the backward does not recompute. Harmony's plans always recompute (checkpoint).
enum class ActivationPolicy { Checkpoint, Keep };
const char* activation_policy_name(ActivationPolicy p);  // "checkpoint", "keep"
std::optional<ActivationPolicy> parse_activation_policy(const std::string& name);
const std::vector<std::string>& activation_policy_names();  // {"checkpoint", "keep"}

// Where a kind with offload tiers keeps parameters and optimizer state (DeepSpeed's offload_param /
// offload_optimizer device): host memory (cpu, the default) or the machine's NVMe tier (topology.nvme), read into
// pinned host buffers before each parameter fetch and each optimizer step and written back after the step.
enum class OffloadTier { Cpu, Nvme };
const char* offload_tier_name(OffloadTier t);  // "cpu", "nvme"
std::optional<OffloadTier> parse_offload_tier(const std::string& name);
const std::vector<std::string>& offload_tier_names();  // {"cpu", "nvme"}

// When a swapping kind's transfers run (docs/baselines.md "Swap timing"). Scheduled: each input is prefetched one
// compute step ahead (double-buffered, overlapped with the step before its consumer) and a step's swap-outs may trail
// it by one step: a tuned swapper at its best (vDNN with prefetch, Harmony's own executor). OnDemand: virtualized
// memory as the paper's baselines ran it (IBM LMS, CUDA unified memory, vDNN without prefetch): an input moves only
// when the op that reads it is reached (the step before it has ended) and the op waits for it; a step's swap-outs
// (the evictions that make room) finish before the next step starts. Nothing moves ahead of use, so every transfer
// is on the critical path; which tensors move, and their bytes, are the same under both.
enum class SwapTiming { Scheduled, OnDemand };
const char* swap_timing_name(SwapTiming t);  // "scheduled", "on-demand"
std::optional<SwapTiming> parse_swap_timing(const std::string& name);
const std::vector<std::string>& swap_timing_names();  // {"scheduled", "on-demand"}

// ZeRO-3's implementation overheads the zero-infinity lowering prices (native cost model only;
// docs/baselines.md "ZeRO-3 overheads").
struct Zero3Overheads {
  // ASSUMPTION (not measured here): the fixed host-side cost of one module's (layer's) pre-forward or
  // pre-backward hook in DeepSpeed stage 3 (fetch bookkeeping, all-gather launch, stream waits, re-partition
  // after use), paid on the compute stream by every FWD and BWD of a layer with parameters.
  static constexpr double kDefaultModuleLatencyS = 200e-6;
  // DeepSpeed's stage3_prefetch_bucket_size default, in parameter elements (deepspeed/runtime/zero/config.py:
  // prefetch_bucket_size = 5e7): a layer's parameters are fetched in buckets of at most this many elements,
  // each bucket one transfer paying the transfer latency (and the NVMe latency under offload: nvme).
  static constexpr double kDefaultBucketElements = 5e7;
  // ASSUMPTION (not measured here), per parameter tensor and pass: the host-side work stage 3 does for every
  // parameter tensor of a module it fetches and releases (DeepSpeed 38327e07, deepspeed/runtime/zero/
  // partitioned_param_coordinator.py fetch_sub_module: a ds_status check, the in-flight registry and one
  // handle wait per parameter; __release_param: param.partition() per parameter; partition_parameters.py
  // NoGatherCoalescedHandle / all_gather_coalesced: one `ds_tensor.to(device, non_blocking=True)` per
  // parameter). About 4 framework calls at the presets' assumed 5 us kernel floor (gpu_rates.overhead.kernel).
  // Paid on the compute stream by every FWD and BWD, times the layer's Layer::param_tensors.
  static constexpr double kDefaultTensorLatencyS = 20e-6;
  // ASSUMPTION (not measured here), per parameter tensor in the backward only: its gradient's path
  // (DeepSpeed 38327e07, deepspeed/runtime/zero/stage3.py: the per-parameter grad hook
  // reduce_partition_and_remove_grads; __add_grad_to_ipg_bucket's copy into the flat bucket; partition_grads'
  // copy into the grad partition, _constant_buffered_norm2 (double, norm, pow: 3 kernels), .float() and, with
  // offload_optimizer, `fp32_grad_tensor.copy_(grad_buffer.float())`, a blocking device-to-host copy): 7 kernels
  // at the presets' assumed 5 us kernel floor plus one host-device synchronisation at the presets' assumed 10 us
  // transfer latency (topology.latency). Paid on the compute stream by every BWD, times Layer::param_tensors.
  static constexpr double kDefaultGradTensorLatencyS = 45e-6;
  // DeepSpeed's offload_optimizer pipeline_read / pipeline_write (default off; deepspeed/runtime/swap_tensor/
  // pipelined_optimizer_swapper.py, PipelinedOptimizerSwapper): with the optimizer on NVMe, the next sub-group's
  // optimizer-state read (pipeline_read) and the previous one's write (pipeline_write) are in flight on their own aio
  // handles while this sub-group's CPU Adam runs, so an update costs about the longest of its read, its write and its
  // host work rather than their sum. Under plan.offload: nvme only; the native cost model prices it
  // (docs/native-model.md "Offload tiers and host work").
  bool pipeline_read = false;
  bool pipeline_write = false;
  double module_latency_s = kDefaultModuleLatencyS;
  double bucket_elements = kDefaultBucketElements;
  double tensor_latency_s = kDefaultTensorLatencyS;
  double grad_tensor_latency_s = kDefaultGradTensorLatencyS;
};

// The knobs a config can set as `plan.<name>` keys, each for the kinds that list it (PlanKindSpec::knobs; the
// config loader refuses the key for the others). A kind shaped like the existing ones picks from these; a new knob is
// a value here, its field in KindKnobs, its parser in core/config/config_plan.cpp and its docs.
enum class Knob {
  Activations,  // plan.activations: checkpoint | keep (KindKnobs::activation_policy)
  Offload,      // plan.offload: cpu | nvme (KindKnobs::offload)
  Zero3,        // plan.zero3: {module_latency, bucket, ..., pipeline_read, pipeline_write} (KindKnobs::zero3)
  Swap,         // plan.swap: scheduled | on-demand (KindKnobs::swap)
};
const char* knob_name(Knob k);  // "activations", "offload", "zero3", "swap"
const std::vector<Knob>& all_knobs();

// The knob values of one plan. Kinds read the ones they list and ignore the rest (Harmony's plans: none).
struct KindKnobs {
  ActivationPolicy activation_policy = ActivationPolicy::Checkpoint;
  OffloadTier offload = OffloadTier::Cpu;  // kinds with offload tiers (PlanKindSpec::offload_tiers)
  Zero3Overheads zero3;
  SwapTiming swap = SwapTiming::Scheduled;  // kinds with the swap knob (dp-swap, pp-swap)
  // Swapping kinds: stream every layer's W+B (and gradients) per microbatch, and swap stashed layer inputs out in
  // forward and in for backward (or, for a kind whose stash lives on the host, its boundary activations); Auto
  // decides from the profile. Kinds that always stream or always swap ignore the choice.
  SwapChoice weights = SwapChoice::Auto;
  SwapChoice activations = SwapChoice::Auto;
  Bytes gpu_capacity_bytes = 10 * kGiB;  // what the swapping kinds' swap decisions fit against
};

}  // namespace harmony::core
