// The native engine: runs a Program on a model of the real server. Transfers are fluid flows over a path of links
// sharing each link max-min fairly (recomputed whenever a flow starts or ends), copy engines are FIFO per direction,
// CPU updates share the cores, and device and host memory are checked (link_graph.hpp and host_account.hpp, included
// here, declare the links and the host account). docs/native-model.md describes the model and its limitations.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"
#include "sim/engine/host_account.hpp"
#include "sim/engine/link_graph.hpp"
#include "sim/engine/simulator.hpp"

namespace harmony::sim {

struct NativeOptions {
  // false: every flow runs alone at its path's bottleneck (and its own cap), copy engines never queue,
  // every CPU update gets a whole core.
  bool contention = true;
  bool latency = true;     // false: topology.transfer_latency_s is not added to transfers
  bool capacities = true;  // false: GPU and host memory are tracked and reported but never make a plan infeasible
  // The paper's constants instead of the topology's links: host transfers at bw_swap / Nsim, P2P and
  // collectives at bw_p2p, CPU messages at bw_msg / Nsim / 2, DEL at time_del, updates at their profiled
  // time. With contention and latency off this reproduces the reference cost model. machine.compute and
  // machine.dispatch (the native model's shared compute, time scales and per-op overheads) are then ignored.
  bool reference_bandwidths = false;
  bool record_counters = false;  // keep per-GPU memory and per-link bandwidth samples (Chrome trace counters)
  // One op (a P2P pair: one transfer) at a time, in the order they become ready, as harmony-run's serial
  // executor runs a step: nothing overlaps, so the step is the sum of every op's time alone.
  bool serial = false;
};

struct MemoryOverflow {
  int op = -1;  // -1: none
  int device = 0;
  core::Bytes bytes_over = 0;  // in use after the op's allocation minus capacity
  core::Bytes in_use_bytes = 0;
  core::Bytes capacity_bytes = 0;
  core::TimePs time_ps = 0;
};

struct MemorySample {
  core::TimePs time_ps = 0;
  int device = 0;
  core::Bytes bytes = 0;  // in use after the change
};
struct BandwidthSample {
  core::TimePs time_ps = 0;
  int link = 0;
  double rate = 0;  // bytes/s in use (cores for the CPU)
};

struct LinkStats {
  core::Bytes bytes = 0;  // bytes that crossed the link (core-picoseconds are not counted for the CPU)
  core::TimePs busy_ps = 0;
};

struct NativeResult {
  Timeline timeline;                    // begin = when the op really started (copy engine granted)
  std::vector<core::TimePs> ready_ps;   // when deps and stream predecessor (and the peer) were done
  std::vector<core::Bytes> peak_bytes;  // per GPU
  MemoryOverflow overflow;              // the first op that exceeded its GPU's memory
  std::size_t overflow_count = 0;       // ops whose allocation exceeded capacity
  std::size_t memory_anomalies = 0;     // frees larger than the memory in use (clamped to 0)
  HostAccount host;
  bool feasible = true;
  std::string infeasible_reason;  // "" when feasible
  core::Bytes class_bytes[kNumTransferClasses] = {};
  core::Bytes tensor_bytes[core::kNumTensorKinds] = {};
  LinkGraph graph;
  std::vector<LinkStats> link_stats;  // indexed like graph.links
  std::vector<MemorySample> memory_samples;
  std::vector<BandwidthSample> bandwidth_samples;
};

// An op's time from the profile alone, before machine.compute's scales and any sharing: a FWD/REC/BWD's
// compute (0 for other kinds), an Update's CPU time (0 for other kinds).
double profiled_compute_s(const core::Op& op, const core::Model& model);
double profiled_update_s(const core::Op& op, const core::Model& model);

// Runs `program`. Throws core::ScheduleError when the program uses more GPUs than the machine has,
// or has a P2P op without a peer; a deadlock and infeasibility are reported in the result.
NativeResult run_native(const core::Program& program, const core::Model& model, const core::MachineSpec& machine,
                        const NativeOptions& options = {});

// A time `program`'s iteration (the last end on the GPUs its report counts) cannot beat on `machine`, the larger of
// the longest chain of dependencies, queue order and rendezvous pairs with every op priced alone (no flow sharing
// a link, no copy-engine wait) and, per shared link and copy engine, Jackson's preemptive schedule of its work
// (each flow's volume at the link's full capacity, released at the chain's earliest start, followed by the rest of
// its chain; docs/native-model.md "Bounds"). run_native never reports less; the search uses it to skip candidates
// that cannot win (run_native_within, core::run_search's cutoff). Throws what run_native throws for a Program it
// cannot run.
core::TimePs native_lower_bound_ps(const core::Program& program, const core::Model& model,
                                   const core::MachineSpec& machine, const NativeOptions& options = {});
// A time the iteration cannot beat, from the task graph alone (before lowering: far cheaper than
// native_lower_bound_ps, and weaker): core::compute_chain_bound_ps with each compute op priced alone (its
// profiled time, scaled) over the GPUs of `ranks` (core::lowered_ranks). Transfers, updates and every other edge
// only add.
core::TimePs native_task_bound_ps(const core::TaskGraph& graph, const std::vector<int>& ranks, const core::Model& model,
                                  const core::MachineSpec& machine, const NativeOptions& options = {});
// run_native, unless native_lower_bound_ps already exceeds `cutoff_ps`, or, while it runs, an op becomes ready at a
// time that its tail (its activity alone, then its longest chain of successors to an op of a reported GPU, priced
// as that bound prices them) carries past `cutoff_ps` (nullopt either way: the iteration cannot end by then; a
// Program that would deadlock later is abandoned the same way, so a search counts it as pruned).
std::optional<NativeResult> run_native_within(const core::Program& program, const core::Model& model,
                                              const core::MachineSpec& machine, const NativeOptions& options,
                                              core::TimePs cutoff_ps);

}  // namespace harmony::sim
