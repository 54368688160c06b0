// How a Program holds the model's state between steps, read from its ops and dataflow (never from its kind's name):
// on the devices (a resident kind), sharded over its GPUs, with the whole working weights beside the shard, or
// carried on the devices to the next step. The one rule harmony-run's executor, its out-of-memory message and the
// tests read.
#pragma once

#include <optional>
#include <vector>

#include "core/program/dataflow.hpp"
#include "core/program/program.hpp"

namespace harmony::core {

struct StateLayout {
  // The kind keeps weights, gradients and AdamW state on the devices (PlanKindSpec::resident_state: resident, fsdp,
  // zero2, zero3).
  bool resident = false;
  // Resident and the Program all-gathers or reduce-scatters: each rank keeps its shard of that state (fsdp, zero3,
  // zero2 over N > 1 GPUs).
  bool sharded = false;
  // Sharded, and an all-gather runs in the update pass (after its layer's Update): every device keeps the whole
  // working weights beside its shard of the gradients, masters and moments (zero2).
  bool whole_weights = false;
  // Not resident, and an update pass's WB sends the updated weights up for the next step: the tensor kind it writes
  // (W: each device the whole layer; WShard: its rank's shard), kept on the devices across steps (zero3-opt-offload).
  std::optional<FlowKind> carried;
  // With `carried`: per device, the layers an update-pass WB on it writes, in the Program's order.
  std::vector<std::vector<int>> carried_layers;
};

// The layout of `p`. A Program whose dataflow does not cover it (LowerOptions::dataflow off) has none of the
// dataflow-derived parts (whole_weights, carried): the executor refuses such a Program when it analyses it.
StateLayout state_layout(const Program& p);

}  // namespace harmony::core
