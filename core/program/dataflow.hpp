// A Program's dataflow: for every op its pass, layer and sample range and the tensors it reads, writes and frees,
// each tensor interned once per Program (device, kind, layer, samples). Lowering fills it (Program::dataflow), so
// the executor's interpreters consume it instead of re-deriving it from pseudo task ids or the task graph.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <vector>

#include "core/base/small_vector.hpp"
#include "core/plan/plan.hpp"

namespace harmony::core {

struct Program;

// The pass an op belongs to: forward, backward (recompute included), or the optimizer step.
enum class Pass : std::uint8_t { Fwd, Bwd, Update };
const char* pass_name(Pass p);  // "fwd", "bwd", "update"

// Tensor kinds. Device: a layer's input activation (Act; layer 0: the token ids), a stashed input brought back for
// the backward (Stash), the gradient of a layer's input (Grad), a layer's weights (W; Harmony: a task's pack's) or
// this rank's shard of them (WShard, zero-infinity), its weight gradient (DW) or this rank's reduced shard (DWShard),
// the saved activations of a layer's forward its backward reads (Saved: written by the REC of the checkpoint policy,
// or kept by the FWD under keep); Harmony's recompute: a layer's input inside a pack (RecX) and its activations
// (RecAct), which the REC keeps for the BWD. Host: a swapped-out stash (HostStash), a swapped-out input gradient
// (HostGrad: l2l, Harmony's dX swap), swapped-out saved activations (HostSaved, keep), and Harmony's host channels: a
// swapped-out output (HostY), the copies CPU messages make of it and of a stash (HostYMsg, HostStashMsg). A device
// Update over host state (host-stream: not a resident kind, its Update on a GPU): a layer's AdamW state brought to the
// device for it (Opt: the moments, bf16's fp32 masters and the update's non-finite flags).
enum class FlowKind : std::uint8_t {
  Act,
  Stash,
  Grad,
  W,
  WShard,
  DW,
  DWShard,
  HostStash,
  HostGrad,
  Saved,
  HostSaved,
  RecX,
  RecAct,
  HostY,
  HostYMsg,
  HostStashMsg,
  Opt,
};
const char* flow_kind_name(FlowKind k);  // "Act", "Stash", "dX", "W", ...
bool on_host(FlowKind k);                // HostStash, HostGrad, HostSaved, HostY, HostYMsg, HostStashMsg

// A tensor of the dataflow. Per-layer tensors (weights, gradients) have s0 = n = 0.
struct FlowTensor {
  int device = 0;  // the device; host tensors: the host memory of that device's process, or -1 (Harmony: one host)
  FlowKind kind = FlowKind::Act;
  int layer = 0;   // Harmony's W and DW: the first layer of their task's pack
  int s0 = 0;      // first sample (of the minibatch)
  int n = 0;       // samples
  int owner = -1;  // Harmony's W and DW: the task whose weights they are (a FWD and a BWD task fetch their own)
  auto operator<=>(const FlowTensor&) const = default;
};

// Interned tensor ids, in the order the op uses them.
using TensorIds = SmallVector<int, 4>;

struct OpFlow {
  Pass pass = Pass::Fwd;
  LayerRange layers;  // the layers the op works for: a swapping op's pseudo task's one layer, a Harmony task's pack
  int s0 = 0, n = 0;  // the op's samples [s0, s0 + n) of the minibatch; 0, 0 for per-layer ops
  TensorIds reads;    // what the op reads (its own side of a pair or collective)
  TensorIds writes;   // what it produces (a new version of each)
  TensorIds frees;    // the tensors its Op::frees name (freed when it ends); kinds the dataflow does not track left out
};

class Dataflow {
 public:
  std::vector<FlowTensor> tensors;  // by id
  std::vector<OpFlow> ops;          // by Program op index

  int intern(const FlowTensor& t);      // its id, added when new
  int find(const FlowTensor& t) const;  // its id, or -1
  const FlowTensor& tensor(int id) const { return tensors.at(static_cast<std::size_t>(id)); }
  bool covers(const Program& p) const;  // one OpFlow per op of p

 private:
  std::map<FlowTensor, int> ids_;
};

// The dataflow of a swapping kind's Program (a kind without packs: per-layer ops with pseudo task ids, built by
// detail::ProgramBuilder; core::lower_plan fills it). Throws ScheduleError naming the op where an op does not fit
// the swapping ops' shapes (a task that is not a pseudo task of its GPU, a microbatch not in the GPU's list, an op
// over several layers, a Harmony-only op).
Dataflow swapping_dataflow(const Program& p);

// The dataflow of a Harmony Program (a kind with packs: core::lower_harmony fills it from the task graph):
// activations, stashes, input gradients, the recompute's inputs and activations, each task's weights and weight
// gradients, and the host channels (swap, CPU messages: a message between tasks of one rank reads and writes its
// source channel, as no copy is needed). Samples: rank r's share starts at the sum of the earlier ranks' backward
// microbatches (Harmony-DP; Harmony-PP: 0); a message op's microbatch is its rank's backward microbatch.
Dataflow harmony_dataflow(const Program& p);

}  // namespace harmony::core
