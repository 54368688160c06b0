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
  // Not resident, and a device tensor is written only in the update pass and read in the forward or backward: it is
  // kept on the devices across steps, written for the next step (zero3-opt-offload: the update pass's WB sends the
  // updated weights up, W on one GPU or each rank's WShard; host-stream: the device Update of a layer whose weights
  // never stream rewrites them in place). The tensor kind (one per Program).
  std::optional<FlowKind> carried;
  // With `carried`: per device, the layers whose tensor of that kind is carried, ascending.
  std::vector<std::vector<int>> carried_layers;
  // Not resident, and an Update runs on a GPU (host-stream): the update pass brings each layer's AdamW state from the
  // host to the device (FlowKind::Opt), updates there and takes the state home.
  bool device_update = false;
};

// The layout of `p`. A Program whose dataflow does not cover it (LowerOptions::dataflow off) has none of the
// dataflow-derived parts (whole_weights, carried): the executor refuses such a Program when it analyses it. A
// Program whose carried tensors are of two kinds is refused (ScheduleError).
StateLayout state_layout(const Program& p);

}  // namespace harmony::core
