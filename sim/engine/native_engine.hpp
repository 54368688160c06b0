// The native engine: runs a Program on a model of the real server. Transfers are fluid flows over a
// path of links sharing each link max-min fairly (recomputed whenever a flow starts or ends), copy
// engines are FIFO per direction, CPU updates share the cores, and device and host memory are checked.
// docs/native-model.md describes the links, the paths, the memory accounts and the limitations.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"
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

// A physical link (one direction) or a shared resource the engine divides between flows.
// ComputeUnits: the pool of compute every device shares (machine.compute.units > 0 only; capacity in units).
enum class LinkKind : std::uint8_t {
  GpuDown,
  GpuUp,
  SwitchDown,
  SwitchUp,
  InterSocket,
  NvLink,
  HostMemcpy,
  CpuCores,
  ComputeUnits,
  NvmeRead,    // the NVMe array, host <- drives (topology.nvme.read)
  NvmeWrite,   // host -> drives (topology.nvme.write)
  HostMemory,  // DRAM bandwidth shared by DMA, host copies and the CPU optimizer (topology.host_memory_bandwidth)
};
const char* link_kind_name(LinkKind k);  // "gpu_down", ..., "compute_units", "nvme_read", "nvme_write", "host_memory"

// The class of a transfer in the swap ledger.
enum class TransferClass : std::uint8_t { PcieH2D, PcieD2H, P2PPcie, NvLink, HostStaging, CpuMsg, None };
inline constexpr int kNumTransferClasses = 6;
const char* transfer_class_name(TransferClass c);  // "pcie_h2d", "pcie_d2h", "p2p_pcie", "nvlink", ...

struct Link {
  std::string name;  // "GPU0 PCIe H2D", "switch1 uplink down", "socket0->1", "NVLink 0->1", "host memcpy"
  LinkKind kind = LinkKind::GpuDown;
  double capacity = 0;  // bytes/s (cores for CpuCores); <= 0: unlimited
};

// The links of a machine and the path of every kind of transfer over them.
struct LinkGraph {
  std::vector<Link> links;
  std::vector<int> gpu_down, gpu_up;          // per GPU
  std::vector<int> switch_down, switch_up;    // per switch
  std::vector<int> inter_socket;              // sockets x sockets (from * sockets + to), -1 on the diagonal
  std::map<std::pair<int, int>, int> nvlink;  // (from, to) -> its NVLink, for the pairs that have one (not N^2)
  int host_memcpy = -1;
  int cpu = -1;
  int compute = -1;      // the shared compute pool; -1 when every device computes alone
  int nvme_read = -1;    // -1 without an NVMe tier
  int nvme_write = -1;   // -1 without an NVMe tier
  int host_memory = -1;  // -1 when host memory bandwidth is unlimited
  int sockets = 1;
  core::P2PMode p2p = core::P2PMode::Pcie;
  std::vector<int> gpu_switch;  // per GPU
  std::vector<int> switch_socket;

  std::vector<int> h2d_path(int gpu) const;  // switch uplink down, GPU link down
  std::vector<int> d2h_path(int gpu) const;  // GPU link up, switch uplink up
  // GPU `from` -> GPU `to`: NVLink if present, else through the PCIe tree, else staged through host memory.
  std::vector<int> p2p_path(int from, int to, TransferClass* cls) const;
};

// The topology the native model uses when the machine has none (widened to the plan's GPU count when the
// plan uses more GPUs than machine.gpus): every GPU behind one switch whose
// uplink is bw_swap (the reference's shared host bandwidth), GPU links at bw_swap, P2P over PCIe,
// host memcpy at bw_msg, one core per GPU, no latency, free time 0, host memory unlimited.
core::Topology derive_topology(const core::MachineSpec& machine);
// machine.topology when valid, else derive_topology. Zero GPU-link and host-memcpy bandwidths fall back
// to bw_swap and bw_msg; zero switch-uplink and inter-socket bandwidths mean "not a bottleneck". With
// machine.compute.units > 0 the graph ends with the shared compute pool (LinkKind::ComputeUnits).
LinkGraph build_link_graph(const core::MachineSpec& machine);

struct MemoryOverflow {
  int op = -1;  // -1: none
  int device = 0;
  core::Bytes bytes_over = 0;  // in use after the op's allocation minus capacity
  core::Bytes in_use_bytes = 0;
  core::Bytes capacity_bytes = 0;
  core::TimePs time_ps = 0;
};

// Host memory needed by one iteration (static upper bound, see docs/native-model.md): the plan result's
// host_memory (its six categories, core::HostBreakdown, and the machine's limits) and the NVMe tier. The categories:
//   master_weights_bytes   W + B of every layer
//   optimizer_state_bytes  every layer's optimizer state
//   gradient_bytes         W of every layer (dW buffers the swap-out writes into)
//   stash_bytes            every stashed X swapped out in the iteration
//   activation_bytes       Y / dX swapped out, CPU-message copies
//   staging_bytes          pinned: p2p: host only: per GPU, a double buffer of its largest P2P send; offload: nvme:
//                          also the NVMe swap buffers (two largest reads); per GPU, a bounce for its largest dWB
//                          that adds to a host gradient (accumulate_bounce_bytes; fp32: twice it in mixed
//                          precision); mixed precision: the staging rings (core::staging_ring_bytes)
struct HostAccount : core::HostMemoryReport {
  core::Bytes nvme_bytes = 0;           // offload: nvme: master weights and optimizer state on the NVMe tier
  core::Bytes nvme_capacity_bytes = 0;  // topology.nvme.capacity (0: unlimited)
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

// The static host-memory account of one iteration of `program`. Swaps copy straight from and into the host
// tensors (pinned; no staging buffers); `p2p_staged`: P2P copies go through pinned host buffers
// (P2PMode::Host without NVLink), which count as staging buffers.
HostAccount host_account(const core::Program& program, const core::Model& model, bool p2p_staged = false);

// Per GPU, its largest dWB that adds to a layer's host gradient an earlier dWB of the step wrote (a later
// microbatch's, or another GPU's under l2l; not a replica of an all-reduced gradient or a rank's shard): the pinned
// buffer its copy lands in before the CPU adds it. Summed over the GPUs.
core::Bytes accumulate_bounce_bytes(const core::Program& program);

// Whether `model` trains in mixed precision: a bf16 profile, or 2-byte device weights (Model::narrow_weights).
bool mixed_precision(const core::Model& model);

// The whole model's training state in host memory: the masters, the optimizer state and the gradients
// (`offload_nvme`: the gradients, the masters and optimizer state in nvme_bytes). Mixed precision: fp32 masters and
// gradients (twice the 2-byte weights), and the optimizer state less the fp32 masters its figure includes.
HostAccount host_state(const core::Model& model, bool offload_nvme);

// The part of host_account every Program of `kind` on `model` needs whatever its plan: host_state, or nothing for a
// kind whose state lives on its GPUs (PlanKindSpec::resident_state). host_account adds the plan's stashes,
// activations and staging buffers to it, so a floor over a limit puts every plan of the kind over it.
HostAccount host_floor(const core::Model& model, core::PlanKind kind, bool offload_nvme);

// The engine's host verdicts, one rule for its runs, its host floor and the searches that read a report's host
// account (a limit of 0 is unlimited): the total over the host memory; the page-locked part (the total less the
// optimizer state) over the pinned limit.
bool host_memory_exceeded(core::Bytes total_bytes, core::Bytes host_memory_bytes);
bool pinned_memory_exceeded(core::Bytes total_bytes, core::Bytes optimizer_state_bytes, core::Bytes pinned_limit_bytes);
// Either verdict on an account `h` (a host floor over them: no plan of its kind fits).
bool host_limits_exceeded(const HostAccount& h, core::Bytes host_memory_bytes, core::Bytes pinned_limit_bytes);

}  // namespace harmony::sim
