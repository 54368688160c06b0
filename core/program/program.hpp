// The Program: the lowered schedule both executors consume. Per device and stream, an ordered list
// of ops (transfers, compute, frees, CPU updates) with explicit dependencies, rendezvous peers,
// the tensors each op moves, and where device memory is allocated and freed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/small_vector.hpp"
#include "core/base/units.hpp"
#include "core/program/dataflow.hpp"
#include "core/program/task_graph.hpp"

namespace harmony::core {

// Stream order is the reference's trace order.
enum class Stream : std::uint8_t { SwapIn, P2PIn, Compute, P2POut, SwapOut, Cpu };
inline constexpr int kNumStreams = 6;
const char* stream_name(Stream s);  // "SwapIn", "P2PIn", "Compute", "P2POut", "SwapOut", "CPU"

enum class OpKind : std::uint8_t {
  WB,      // swap in W+B of a pack
  X,       // input activation in (data, swap, P2P or CPU message)
  sX,      // stashed input: out in FWD, in in BWD
  dY,      // output gradient in
  FWD,     // forward of a (sub-)pack over one microbatch
  REC,     // recompute forward in BWD
  BWD,     // backward (without the recompute)
  ARD,     // all-reduce of dW across replicas (Harmony-DP)
  DEL,     // free the pack's tensors
  Y,       // output activation out
  dX,      // input gradient out
  dWB,     // swap out dW (+ B)
  MSGsX,   // CPU-side message of a stash to the consumer's process
  MSGY,    // CPU-side message of Y (microbatch re-sizing)
  Update,  // CPU optimizer step of a pack
  AG,      // all-gather of a layer range's parameters across GPUs (ZeRO-style baselines)
  RS,      // reduce-scatter of a layer range's gradients across GPUs (ZeRO-style baselines)
};
inline constexpr int kNumOpKinds = 17;
const char* op_kind_name(OpKind k);
bool is_compute(OpKind k);   // FWD, REC, BWD
bool is_transfer(OpKind k);  // ops that move bytes

// Saved: the tensors a layer's forward keeps for its backward beyond its input (the baselines' keep
// policy holds them from FWD to BWD; checkpoint's REC allocates them for the BWD).
enum class TensorKind : std::uint8_t { Weights, WeightGrad, OptState, Activation, Stash, ActGrad, Saved };
inline constexpr int kNumTensorKinds = 7;
// The class of tensor a transfer op moves (swap ledger): WB -> Weights, dWB/RS -> WeightGrad, X/Y -> Activation,
// sX/MSGsX -> Stash, dX/dY -> ActGrad, AG -> Weights, MSGY -> Activation.
TensorKind moved_tensor(OpKind k);
const char* tensor_kind_name(TensorKind k);

struct TensorRef {
  TensorKind kind = TensorKind::Activation;
  LayerRange layers;
  int microbatch = -1;  // -1 for per-pack tensors (weights, gradients)
  Bytes bytes = 0;
};

// An op's dependencies and tensor lists: most ops have at most four dependencies and two tensors per list, held
// inline (core/base/small_vector.hpp), so lowering thousands of ops does not allocate three vectors per op.
using OpDeps = SmallVector<int, 4>;
using TensorRefs = SmallVector<TensorRef, 2>;

struct Op {
  int task = 0;
  int ui = 0;   // microbatch index (BWD index for MSG ops)
  int spi = 0;  // FWD sub-pack index
  int device = 0;
  Stream stream = Stream::Compute;
  OpKind kind = OpKind::FWD;
  LayerRange layers;
  int ubs = 0;                // microbatch size; 0 where the op is per pack
  Bytes bytes = 0;            // bytes moved (transfers, ARD), a device Update's HBM traffic; 0 otherwise
  Bytes bytes_w = 0;          // WB/dWB/ARD: the weight part of `bytes`
  Bytes bytes_b = 0;          // WB/dWB/ARD: the buffer part
  OpDeps deps;                // ops that must end before this one begins (after rendezvous resolution)
  int peer = -1;              // P2P rendezvous partner (send <-> receive), else -1
  int queue = -1;             // index into Program::queues
  int queue_pos = -1;         // position in that queue
  Bytes workspace_bytes = 0;  // compute ops: transient device memory while running (beyond allocs)
  TensorRefs allocs;          // device memory allocated when the op begins
  TensorRefs frees;           // device memory freed when the op ends
};

// An Update the host runs (on a CPU queue: AdamW on the host's master weights); an Update on a device's compute
// queue runs AdamW on that device (a kind with resident state) and its `bytes` are the HBM traffic it reads and writes.
inline bool host_update(const Op& op) { return op.kind == OpKind::Update && op.stream == Stream::Cpu; }

struct OpQueue {
  int device = 0;
  Stream stream = Stream::Compute;
  std::vector<int> ops;  // FIFO order
};

// Per-op costs only the native cost model prices (docs/native-model.md "Offload tiers and host work"); the
// reference model and the executors never read them. They sit beside the ops (Program::cost), not in them.
struct NativeOpCosts {
  Bytes nvme_read_bytes = 0;   // read from the NVMe tier into pinned host memory before the op's work
  Bytes nvme_write_bytes = 0;  // written from host memory to the NVMe tier after the op's work
  // Of those, the bytes whose I/O overlaps the op's own host work instead of preceding or following it (a pipelined
  // optimizer swapper: the next update's read and the previous one's write in flight during this one's step)
  Bytes nvme_read_overlap_bytes = 0;
  Bytes nvme_write_overlap_bytes = 0;
  Bytes host_sum_bytes = 0;  // gradient bytes the CPU adds into a host accumulator after the op's work
  Bytes return_bytes = 0;    // a dWB's bytes copied back host -> device after it (ZeRO-3's pinned gradient buffer)
  // bytes a transfer moves beyond `bytes`, in its own direction (ZeRO-3's FP32 gradient copy on a dWB; host-stream's
  // moments on its update's WB and dWB)
  Bytes extra_out_bytes = 0;
  Bytes host_pass_bytes = 0;  // host DRAM bytes read and written by passes over tensors after the op's work
  int io_count = 0;           // the op's transfer is this many I/Os (buckets), each paying the latency; 0 = 1
  double overhead_s = 0;      // fixed host-side cost before the op's work (ZeRO-3 module gather/partition)
};

// What the cost models read beyond the ops' data flow: the reference model's lowering semantics and the native
// model's tiers and per-op costs. The executors read none of it.
struct CostHints {
  // The reference model (the paper's scheduler):
  bool prefetch = false;      // lowered with the reference's prefetch/offload dependency model
  bool pp_rules = false;      // lowered with the Harmony-PP event rules (the reference's sim_mode vPP)
  int bandwidth_sharers = 1;  // the reference's Nsim: GPUs sharing host bandwidth (the native model's too)
  // The native model: parameters (fp32 masters) and optimizer state live on the NVMe tier, not in host memory
  // (zero-infinity or lohan with plan.offload: nvme, Harmony's nvme tier); the host keeps pinned staging buffers.
  bool offload_nvme = false;
  // Per op (Program::ops order), or empty when no op has any: op(i) reads zeros then.
  std::vector<NativeOpCosts> op_costs;
  const NativeOpCosts& op(int i) const {
    static const NativeOpCosts kNone{};
    return static_cast<std::size_t>(i) < op_costs.size() ? op_costs[static_cast<std::size_t>(i)] : kNone;
  }
  NativeOpCosts& edit(int i) {  // op i's costs, growing op_costs to reach it
    if (static_cast<std::size_t>(i) >= op_costs.size()) op_costs.resize(static_cast<std::size_t>(i) + 1);
    return op_costs[static_cast<std::size_t>(i)];
  }
};

struct Program {
  TaskGraph graph;
  std::vector<int> devices;     // devices that have ops (Harmony-DP under the reference: only GPU 0)
  std::vector<Op> ops;          // creation order
  std::vector<OpQueue> queues;  // devices ascending, then streams in order of first use
  // Per op: its pass, layers, samples and the tensors it reads, writes and frees (dataflow.hpp). Filled by the
  // lowering (LowerOptions::dataflow): lower_harmony for Harmony's, lower_plan for the swapping kinds'.
  Dataflow dataflow;
  CostHints cost;  // what only the cost models read

  std::string op_id(int op) const;     // the reference's id: "<task>.<ui>.<spi>.<stream>.<kind>"
  std::string op_label(int op) const;  // trace name: "t3 BWD L21-27 mb0 u8"
  int num_devices() const { return graph.plan.gpus; }
};

// Mixed precision's host staging (harmony-run's executor, docs/backend.md "Mixed precision"): fp32 host masters go
// up rounded to 2-byte elements and 2-byte gradients come back widened, chunk by chunk, through two pinned host
// buffers per queue that moves weights or gradients between host and device (WB, dWB; with `host_sums` also ARD and
// RS, whose replica sums then go through the host), each min(chunk_bytes rounded down to whole 2-byte elements, at
// least one, the queue's largest such transfer). Summed over the queues; harmony-sim's host account counts it for
// a mixed-precision model (replica sums on the devices, as harmony-run runs them) and the executor allocates it (its
// pinned pre-flight counts the collectives too, whichever way they sum).
inline constexpr Bytes kStagingChunkBytes = Bytes{32} << 20;  // the executor's default chunk
Bytes staging_ring_bytes(const Program& program, bool host_sums, Bytes chunk_bytes = kStagingChunkBytes);

// The ops run together with each op (per op, the group it belongs to): a P2P pair, send first (Y, dX before their
// receivers); the collectives (ARD, AG, RS), the k-th of each device per (kind, layers, microbatch) together, in device
// order; every other op alone. From the ops alone (a Program lowered without its dataflow too): harmony-run's executor
// runs the groups (and checks one member per GPU), harmony-sim's serial replay predicts its peak with them.
std::vector<std::vector<int>> op_groups(const Program& program);

// A Program that updates on its GPUs without resident state (host-stream): an Update on a device queue in a kind whose
// weights, gradients and AdamW state live in host memory, so the update pass brings that state to the GPU and takes it
// home (core::swapping_dataflow's Opt tensors, core::host_gradients, core::state_layout, the executor).
bool updates_on_device_over_host_state(const Program& program);

// Structural checks: dependency indices in range, peers symmetric, every queue position consistent,
// and no cycle through dependencies and queue order (ProgramGraph). Throws ScheduleError naming ops.
void validate_program(const Program& program);

// Ops in an order where every op comes after its dependencies and queue predecessors
// (ProgramGraph::topological_order). Throws ScheduleError on a cycle.
std::vector<int> topological_order(const Program& program);

}  // namespace harmony::core
