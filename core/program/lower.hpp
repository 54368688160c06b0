// Lowering: turns a task graph into a Program (per-device, per-stream op queues with dependencies).
// lower_harmony reproduces the paper's simulator event rules (§6.3 of the reference semantics),
// including its prefetch/offload dependency model, so that the reference cost model matches it.
#pragma once

#include <functional>
#include <vector>

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
  // Fill Program::dataflow (what every op reads and writes: the executor runs it). The engines read none: sim's
  // evaluations turn it off, which keeps a search's lowering as cheap as before the dataflow.
  bool dataflow = true;
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
// The same, keeping `graph` in the Program without copying it (a search lowers a fresh task graph per candidate).
Program lower_harmony(TaskGraph&& graph, const Model& model, const LowerOptions& options);

// A time no iteration of lower_harmony(graph, ...) on the GPUs `ranks` (lowered_ranks) can beat when each compute op
// takes at least price_ps(op) picoseconds (op: kind, device, layers and ubs of a FWD (a FWD task's sub-packs
// together), REC or BWD; an engine rounds each op's time to the picosecond): the longest chain of compute ops through
// each GPU's compute queue (its tasks in index order, each task's microbatches in order, REC before BWD: lowering puts
// every FWD, REC and BWD of a GPU in one FIFO) and the P2P channels lowering pairs (a FWD's or the loss pack's REC of
// microbatch i after its sender's FWD of microbatch i; a BWD after the next pack's BWD of microbatch i), the largest
// chain end on `ranks` less a margin for the rounding. Known before lowering: a search declines with it candidates it
// then never lowers (sim::Engine::task_bound_s).
TimePs compute_chain_bound_ps(const TaskGraph& graph, const std::vector<int>& ranks,
                              const std::function<double(const Op& op)>& price_ps);

// compute_chain_bound_ps's chain, for bounds built on it (sim::native_task_bound_ps adds the CPU updates): its end,
// each task's last op's end, and bound_ps, which turns a time on that chain into a bound with the same margin.
struct ComputeChain {
  double end_ps = 0.0;              // the largest chain end on the ranks, unrounded
  std::vector<double> task_end_ps;  // per task (idx): the end of its last microbatch's op; 0 for UPD and other ranks
  double ops = 0.0;                 // compute ops priced: each may round by a picosecond in an engine
  TimePs bound_ps(double t_ps) const;
};
ComputeChain compute_chain(const TaskGraph& graph, const std::vector<int>& ranks,
                           const std::function<double(const Op& op)>& price_ps);

// The GPUs lower_harmony gives ops, ascending (Program::devices): every rank with tasks, except that Harmony-DP
// with dp_first_gpu_only keeps rank 0 alone.
std::vector<int> lowered_ranks(const TaskGraph& graph, const LowerOptions& options);

}  // namespace harmony::core
