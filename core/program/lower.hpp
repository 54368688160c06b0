// Lowering: turns a task graph into a Program (per-device, per-stream op queues with dependencies).
// lower_harmony reproduces the paper's simulator event rules (§6.3 of the reference semantics),
// including its prefetch/offload dependency model, so that the reference cost model matches it.
#pragma once

#include "core/model/model.hpp"
#include "core/program/program.hpp"
#include "core/program/task_graph.hpp"

namespace harmony::core {

struct LowerOptions {
  bool prefetch = false;  // the reference's --prefetch_offload dependency model
  // With prefetch: how many microbatch inputs may be resident per input stream. Input i is fetched once
  // microbatch i - prefetch_buffers has been computed (its buffer is free again); 2 is the paper's double
  // buffering and reproduces its simulator exactly. The memory timeline counts every buffer in flight.
  int prefetch_buffers = 2;
  // Harmony-DP: the reference simulates GPU 0 only (replicas are identical); false lowers every GPU.
  bool dp_first_gpu_only = true;
  // The NVMe tier (search.offload: nvme, or auto when host memory binds): the FP32 masters and the optimizer
  // state live on the drives, as zero-infinity's offload: nvme keeps them. Every WB first reads its pack's
  // weights from NVMe; every Update reads the pack's state and masters and writes them back (plus the device
  // copy of 2-byte weights, which the next WB reads). Priced by the native model only.
  bool offload_nvme = false;
};

// The lowering a config's `options:` section asks for (prefetch and its buffers); dp_first_gpu_only and
// offload_nvme keep their defaults for the caller to set.
inline LowerOptions lower_options(const Options& options) {
  LowerOptions o;
  o.prefetch = options.prefetch;
  o.prefetch_buffers = options.prefetch_buffers;
  return o;
}

Program lower_harmony(const TaskGraph& graph, const Model& model, const LowerOptions& options);

}  // namespace harmony::core
