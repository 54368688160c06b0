// The real executor: runs a core::Program of any plan kind (core::lower_plan: Harmony-PP or Harmony-DP with every GPU
// lowered, or a swapping kind: dp-swap, pp-swap, zero-infinity, l2l, lohan) — for one training step with real tensors
// on N devices: weights swapped in per pack or layer, forwards with stashes, recompute + backward per microbatch,
// activations and gradients moved between packs, stages and replicas, AdamW on the host. One worker thread and one
// device stream per Program queue, so copies overlap compute (or, for debugging, one op at a time on the calling
// thread, with the same bits); every tensor read is checked.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/adamw_parallel.hpp"
#include "backend/device.hpp"
#include "backend/model/state.hpp"
#include "core/base/units.hpp"
#include "core/output/host_memory.hpp"
#include "core/program/program.hpp"

namespace harmony::backend {

// A Program that reads a tensor before (or without depending on) the op that produces it, or that cannot
// make progress. what() names the ops involved (Program::op_label).
class ScheduleViolation : public BackendError {
 public:
  using BackendError::BackendError;
};

struct ExecutorOptions {
  int seq_len = 0;  // T; the minibatch B is the Program's plan.minibatch
  AdamWConfig adamw;
  // One worker thread per Program queue (device, stream), each on its own device stream: an op starts when its
  // deps and its queue predecessor have completed. false: the ops one at a time on the calling thread, in the
  // v1 ready-queue order (for debugging; the results are the same bits).
  bool concurrent = true;
  // How far the host may issue ops ahead of the devices (docs/backend.md, "Event ordering"). Ops are ordered by
  // events whatever the value (bit-identical results); it bounds when an op is issued, and so when its device
  // memory is allocated: the host issues an op once, for each op it follows (deps, queue predecessor), the ops of
  // that op's queue up to run_ahead - 1 before it have completed. 1: once they have all completed (device memory
  // as the Program says, as when every op synchronized its stream; the host still never waits inside an op or
  // for ops it does not follow). 2: one op of each queue may still run (a stream's next work is queued while its
  // current runs; more memory in use). 0: unbounded (only device memory stops the host).
  int run_ahead = 1;
  // Threads of each Update queue's ParallelAdamW; <= 0: std::thread::hardware_concurrency(). Updates on several
  // devices' CPU queues run at the same time and share the cores.
  int adamw_threads = 0;
  // Devices that pin host memory (CUDA): at most this many bytes (the machine file's pinned_limit); 0: what the
  // machine has available less a reserve. Checked once, before anything is pinned.
  Bytes pinned_limit = 0;
  // Device storage (docs/backend.md, "Mixed precision"). BF16: weights, activations, gradients and their swaps
  // in bf16 on the devices (a WB rounds the fp32 masters to nearest even on the host; a dWB widens the gradients
  // exactly; replica sums add the widened gradients in fp32 and round once); the masters and AdamW state stay
  // fp32 on the host. Harmony and baseline Programs alike. Needs the devices' bf16 kernels (DeviceError at
  // construction otherwise).
  DType dtype = DType::F32;
  // bf16: the host staging buffers' size (two per queue that moves weights or gradients; Interpreter::stage_up):
  // transfers larger than this go in chunks, the host rounding or widening one while the link moves the other.
  // The bits do not depend on it.
  Bytes staging_chunk_bytes = core::kStagingChunkBytes;
  // Where replicas' weight gradients are summed (docs/backend.md, "Replica sums"). nullptr: on the host (every
  // replica's dW copied down, added in rank order on one host thread, the sum copied back up; the reference).
  // Set (not owned; must outlive the executor, and span the executor's devices: size() == devices.size() and
  // device(r) == devices[r], BackendError otherwise): on the devices, with Communicator::all_reduce_sum (bf16:
  // all_reduce_sum_bf16) on every member's own stream, in place, with no host copy and no host wait. The sums
  // are the host path's bits where the communicator adds in rank order (the CPU communicator, the CUDA one's
  // kernel path; not NCCL). Harmony-DP's and dp-swap's ARD groups, and zero-infinity's RS (an all-reduce of the
  // whole gradient, then each rank keeps its shard: more traffic than a true reduce-scatter). A group that does
  // not span every device in rank order, or an RS that is not the last reader of its dW, keeps the host path.
  Communicator* communicator = nullptr;
};

struct StepResult {
  double loss = 0.0;  // mean cross-entropy over the B*T tokens (summed in double, token order)
  // A gradient the step's Updates found holding a NaN or an infinity (found inside AdamW's element loop, at no
  // extra pass; the highest layer's, with the count); nullopt when all were finite. The updates ran anyway.
  std::optional<NonFiniteGradient> nonfinite_gradient;
  std::vector<core::TimePs> begin;  // per op (Program::ops order), ps since the step began (steady clock);
  std::vector<core::TimePs> end;    // ops of different queues overlap; for core::write_chrome_trace
};

// The host memory a training step of the executor uses, measured where it is allocated (backend/executor/
// host_meter.hpp), by the categories of harmony-sim's host account (core::HostBreakdown):
//   master_weights_bytes   HostState weights
//   optimizer_state_bytes  HostState AdamW moments (exp_avg, exp_avg_sq)
//   gradient_bytes         HostState gradients, and host gradient sums / replicas' scratch
//   stash_bytes            stashed inputs (and saved activations under keep) swapped out
//   activation_bytes       Y / dX swapped out, host message copies
//   staging_bytes          bf16 staging rings and transient host bounce buffers
// The HostState blocks are the ones the steps read and write (none for a kind with resident state, whose steps never
// touch them). Device memory (also host RAM on the CPU device) is not in it.
struct ExecutorHostMemory {
  core::HostBreakdown peak;                                   // each category's own peak
  core::HostBreakdown at_peak;                                // each category when the total peaked
  Bytes peak_bytes() const { return at_peak.total_bytes(); }  // the most in use at one time
  Bytes in_use_bytes = 0;
};

// What an executor of `program` keeps on device `device` between steps, before the device rounds each allocation
// (core::state_layout): a resident kind's weights, gradients and AdamW state (DeviceState::total_bytes; sharded: its
// rank's ShardState::total_bytes, with the whole working weights where it gathers after the update), or the weights a
// Program carries to the next step (one buffer per layer in StateLayout::carried_layers: its shard or the whole
// layer); 0 for every other Program. harmony-run's out-of-memory message and the memory tests read it.
Bytes held_between_steps(const core::Program& program, const Gpt2& model, DType dtype, int device);

class Executor {
 public:
  // devices[g] runs the Program's GPU g. `program` and `state` must outlive the executor. BackendError for a
  // Program that does not match the devices or the model; ScheduleViolation for a baseline Program whose data
  // flow its dependencies do not order (checked here, before any step; Harmony Programs are checked per read).
  // Where the devices pin host memory (CUDA), pins the state's weights and gradients and the executor's host
  // stash/swap buffers, after one check that the total fits (DeviceError with the numbers otherwise).
  Executor(const core::Program& program, std::vector<Device*> devices, HostState& state,
           const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One step: inputs and targets are B*T ids, row-major (B, T). Leaves the updated weights in state, except for a
  // kind with resident state (resident), whose weights, AdamW moments and step counts stay on the devices until
  // sync_state(). An exception in any op (OutOfMemory, ScheduleViolation, a device error) stops every queue after its
  // current op and is rethrown here; the next step starts afresh.
  StepResult step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets);
  // Brings the state a resident kind keeps on its devices into `state` (weights, moments, step counts; device 0's,
  // which every replica equals): call before reading or saving `state`. Nothing for the other kinds.
  void sync_state();
  // The host memory the executor's steps have used so far (ExecutorHostMemory); thread-safe.
  ExecutorHostMemory host_memory() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace harmony::backend
