// The library behind `harmony-run profile`: measures a GPT-2's layers on a device (per-layer forward and
// recompute+backward time and peak device memory per microbatch size, host AdamW time per layer) into the
// core::Model the search packs, and writes it as a "harmony-profile-json" v1 profile with device and
// model metadata (core/model/profile_write.hpp), so that profile -> search -> run closes the loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/device.hpp"
#include "backend/model/gpt2.hpp"
#include "backend/model/state.hpp"
#include "core/model/model.hpp"

namespace harmony::backend {

struct ProfileOptions {
  int seq_len = 0;                // T tokens per sample, 1..max_seq_len
  std::vector<int> ubatch_sizes;  // microbatch sizes to measure, positive and strictly ascending
  int warmup = 1;                 // untimed runs before the timed ones (>= 0)
  int repeats = 3;                // timed runs; the median is recorded (>= 1)
  // Passes over every layer and size the timed runs are spread over (>= 1; at most `repeats` are made): a slow
  // spell of a shared machine then lands in one pass's samples of every layer, not in all samples of a few.
  int rounds = 3;
  AdamWConfig adamw;       // the optimizer whose host update is timed
  int adamw_threads = 0;   // its thread pool, as the executor's (ExecutorOptions::adamw_threads; <= 0: all)
  std::uint64_t seed = 0;  // synthetic inputs, targets, output gradients and update gradients
  // Device storage of weights, activations and gradients: the layers run in this dtype and every byte count is
  // in its elements; the written profile records it ("dtype": "bf16"; nothing for fp32, which old profiles are).
  DType dtype = DType::F32;
};

// What the profiler is doing, for a progress display. `step` counts from 1 to at most `total_steps`
// (rounds x 2 x sizes x layers + layers); steps of sizes dropped for memory are skipped.
enum class ProfileStage : std::uint8_t { Forward, Backward, Update };
struct ProfileProgress {
  ProfileStage stage = ProfileStage::Forward;
  int layer = 0;
  int ubatch = 0;  // 0 for Update
  int step = 0;
  int total_steps = 0;
};
using ProgressFn = std::function<void(const ProfileProgress&)>;

struct ProfileResult {
  core::Model model;  // ubatch_fwd / ubatch_bwd: the measured sizes (a prefix of the requested ones)
  std::string device_name;
  Bytes device_capacity_bytes = 0;
  Gpt2Config config;
  ProfileOptions options;
  // Requested sizes left out because one layer's forward / backward at that size did not fit in device
  // memory (with every larger size: memory grows with u, as the paper's profiler stops at its u_max),
  // and the OutOfMemory message of the first size that did not fit ("" when nothing was dropped).
  std::vector<int> dropped_fwd, dropped_bwd;
  std::string dropped_fwd_reason, dropped_bwd_reason;
};

// Profiles `model` on `device` layer by layer. Per microbatch size u (ascending) and layer l, with every
// buffer of profile_buffers(l, phase, u) allocated on an otherwise idle device:
//   fwd_time_s      median over `repeats` runs of one no-grad forward of layer l over u samples of T tokens
//                   (the same kernels as the recompute: the layers have one forward, writing `act`, which a FWD
//                   task keeps in one reused buffer)
//   bwd_time_s      median of one forward-with-grad (the recompute) + backward of layer l, timed together
//   fwd/bwd_peak    Device::memory().peak after reset_peak(), minus in_use when the layer started (0 on an
//                   empty device): all of the layer's buffers at once, each rounded up to the device's
//                   allocation granularity (256 bytes on the CPU device)
// Each run's time is the device's own (Stream::timer: CUDA events, the CPU stream thread's clock), the runs of
// one measurement enqueued back to back, so the host's launch and synchronize latency is in none of them. The
// `repeats` runs are split over min(rounds, repeats) passes over every size and layer (each pass allocates and
// fills the layer's buffers again); the first pass runs `warmup` untimed runs first and measures the peaks. Weights
// come from state.weights(l); inputs, targets and output gradients are synthetic (seeded). Per layer, update_time_cpu_s
// is the median time of state.update(adamw, l, l) (AdamW on the host over the parameters the layer owns; layer 0
// updates the tied wte with both gradient contributions and copies it into the head) with synthetic gradients. Sizes:
// weight_bytes = the layer's block (the head's includes its wte copy), param_count and optimizer_state_bytes (AdamW's m
// and v) count the parameters it owns, input_bytes_per_sample = input_bytes(l, 1, T), buffer_bytes = 0; all equal
// describe_gpt2's. The head is the criterion.
//
// `state` is left as it was: the update timing restores each layer's weights, gradients, moments and step
// count (and the head's block, which layer 0's tied update rewrites).
// A size whose forward (or backward) does not fit in device memory ends that phase's list (see
// ProfileResult::dropped_*); if the smallest size does not fit, the OutOfMemory naming the layer, phase
// and size is rethrown. Invalid options throw BackendError; device errors propagate.
ProfileResult profile_gpt2(Device& device, HostState& state, const ProfileOptions& options,
                           const ProgressFn& progress = {});

// One device buffer the profiler allocates for a layer (all of them are live together).
struct ProfileBuffer {
  std::string name;  // "W", "dW", "X", "tokens", "targets", "Y", "act", "dY", "dX", "scratch"
  Bytes bytes = 0;
};
// The buffers of layer `layer`'s forward (Phase::Fwd: W, X or tokens, targets for the head, Y, act) or
// recompute + backward (Phase::Bwd: those plus dW, dY unless the head, dX unless the embedding, scratch) at
// microbatch u, zero-sized ones left out. Compared with describe_gpt2's peaks: fwd = describe + W (+
// targets for the head); bwd = describe + W + Y (+ targets), describe's "dW" term being our dW.
std::vector<ProfileBuffer> profile_buffers(const Gpt2& model, int layer, core::Phase phase, int u, int seq_len,
                                           DType dtype = DType::F32);

// Metadata the caller adds to the written profile (the rest comes from ProfileResult).
struct ProfileMeta {
  std::string model_name;           // the profile's "model"; empty: the result's generated name
  std::string device_kind = "cpu";  // "cpu" or "cuda"
  std::string device_description;   // e.g. "NVIDIA H200"; may be empty
  int threads = 0;                  // host threads available to the profiler (0: not recorded)
  std::string host;                 // host name (may be empty)
  std::string date_utc;             // ISO 8601, e.g. "2025-01-31T12:00:00Z" (may be empty)
  std::string tool = "harmony-run profile";
};

// The harmony-profile-json v1 text of `result` (harmony-sim reads it with --set model.profile=...): the
// model's fields plus "hardware" (device, kind, memory, host, threads), "source" (tool, date, GPT-2
// config, seq_len), "units" and "profiler" (warm-up, repeats, statistic, requested and dropped sizes).
// With meta.model_name set, the model's name is replaced by it.
std::string profile_json(const ProfileResult& result, const ProfileMeta& meta = {});

}  // namespace harmony::backend
