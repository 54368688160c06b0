// What the host-optimizer sharded kinds (zero-infinity, zero-offload, fsdp-offload) share: one CPU Adam update per
// layer with parameters, on rank l mod N's CPU queue, waiting for every rank's last gradient transfer (DeepSpeed steps
// each rank's partition on that rank's CPUAdam after the reduce; docs/baselines.md), and the bytes a shard carries in
// the optimizer's dtype beyond its GPU dtype. The kinds add their own host passes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/kinds/microbatch_sizes.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core::detail {

// What rank's shard of `layer` carries beyond its GPU-dtype bytes when it crosses the link in the optimizer's parameter
// dtype (the FP32 masters under mixed precision; 0 when they are the GPU dtype): a transfer's extra bytes, narrowed or
// widened on the GPU.
inline Bytes wide_shard_extra_bytes(const Model& m, int layer, int ranks) {
  const Bytes gpu = shard_bytes(m.weight_bytes(layer, layer), ranks) + shard_bytes(m.buffer_bytes(layer, layer), ranks);
  return std::max<Bytes>(0, shard_bytes(m.optimizer_param_bytes(layer), ranks) - gpu);
}

// The Update op of `layer` (on rank layer mod ranks) after every rank's last gradient-out op (last_out; -1: none).
inline int zero_cpu_update(ProgramBuilder& b, int layer, int ranks, const std::vector<int>& last_out) {
  const int g = layer % ranks;
  const int update = b.op(g, Stream::Cpu, OpKind::Update, b.upd_task(g, layer), 0, LayerRange{layer, layer}, 0, 0);
  for (const int o : last_out)
    if (o >= 0) b.dep(update, o);
  return update;
}

}  // namespace harmony::core::detail
