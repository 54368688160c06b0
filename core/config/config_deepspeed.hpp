// A DeepSpeed JSON config (`harmony-sim compare CONFIG --deepspeed ds_config.json`, docs/config.md, "DeepSpeed
// configs"): the keys that decide what a DeepSpeed run costs, mapped to the closest plan kind with the reasoning,
// the keys known not to be priced listed, and every other key a ConfigError at the file's line:column.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/base/error.hpp"

namespace harmony::core {

// What the harmony config supplies: the world size (DeepSpeed's launcher, not its config, sets it) and the values
// DeepSpeed's "auto" takes.
struct DeepSpeedContext {
  int gpus = 1;                // plan.gpus: DeepSpeed's world size
  int minibatch = 1;           // plan.minibatch: train_batch_size "auto"
  std::optional<int> u_bwd;    // plan.u_bwd: train_micro_batch_size_per_gpu "auto" (absent: inferred as DeepSpeed does)
  std::string dtype = "fp32";  // the harmony model's dtype: fp16/bf16.enabled "auto"
};

// The run a DeepSpeed config describes, and how harmony prices it.
struct DeepSpeedRun {
  std::string path;
  int stage = 0;                           // zero_optimization.stage (0 without the section)
  std::string offload_param = "none";      // zero_optimization.offload_param.device: none, cpu, nvme
  std::string offload_optimizer = "none";  // zero_optimization.offload_optimizer.device
  // offload_optimizer.pipeline_read / pipeline_write under the nvme device (false otherwise): plan.zero3's knobs
  bool pipeline_read = false;
  bool pipeline_write = false;
  int micro_batch = 1;   // train_micro_batch_size_per_gpu
  int accumulation = 1;  // gradient_accumulation_steps
  int train_batch = 1;   // train_batch_size = micro_batch × accumulation × gpus
  int gpus = 1;
  // fp16, bf16 or fp32 from fp16/bf16.enabled; "" when "auto" (the harmony model's dtype stays)
  std::string dtype;
  // "checkpoint" when the config has an activation_checkpointing section; "" when it does not say (both searched)
  std::string activations;
  std::string plan_kind;  // the closest plan kind: zero-infinity or dp-swap
  std::string offload;    // the kind's offload tier (zero-infinity): cpu or nvme; "" for dp-swap
  // priced: the kind runs what DeepSpeed runs; approximate: the closest kind, `approximation` says how it differs.
  // (A run no kind can price is refused by the reader, at its key, as a ConfigError.)
  std::string status = "priced";
  std::string reasoning;                // why this kind
  std::string approximation;            // how the kind differs (approximate)
  std::vector<std::string> notes;       // "auto" and inferred values, and where they came from
  std::vector<std::string> not_priced;  // keys read but not priced: "zero_optimization.overlap_comm", ...
  std::string summary;  // "ZeRO-3, offload_param cpu, offload_optimizer cpu, micro 4 × accum 2 × 2 GPUs"
};

// Reads the DeepSpeed config at `path` (DeepSpeed's config-json keys, https://www.deepspeed.ai/docs/config-json/):
// batch sizes with DeepSpeed's inference and consistency rule over `ctx.gpus`, the ZeRO stage and offload devices,
// fp16/bf16, activation checkpointing; "auto" values from `ctx`. Keys that change the run in ways no plan kind
// models (pipeline or tensor parallelism, ZeRO++ quantization, partial optimizer offload, ...) and unknown keys are
// ConfigErrors at their line:column. Records the file among the inputs of a config being loaded.
DeepSpeedRun read_deepspeed_config(const std::string& path, const DeepSpeedContext& ctx);

}  // namespace harmony::core
