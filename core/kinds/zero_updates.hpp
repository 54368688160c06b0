// What the ZeRO offload kinds (zero-infinity, zero-offload) share after the backward: one CPU Adam update per layer
// with parameters, on rank l mod N's CPU queue, waiting for every rank's last gradient transfer (DeepSpeed steps each
// rank's partition on that rank's CPUAdam after the reduce; docs/baselines.md). The kinds add their own host passes.
#pragma once

#include <cstddef>
#include <vector>

#include "core/program/program_builder.hpp"

namespace harmony::core::detail {

// The Update op of `layer` (on rank layer mod ranks) after every rank's last gradient-out op (last_out; -1: none).
inline int zero_cpu_update(ProgramBuilder& b, int layer, int ranks, const std::vector<int>& last_out) {
  const int g = layer % ranks;
  const int update = b.op(g, Stream::Cpu, OpKind::Update, b.upd_task(g, layer), 0, LayerRange{layer, layer}, 0, 0);
  for (const int o : last_out)
    if (o >= 0) b.dep(update, o);
  return update;
}

}  // namespace harmony::core::detail
