// The native engine's link graph: the machine's links (GPU PCIe links, switch uplinks, inter-socket links,
// NVLinks, host memcpy, the CPU cores, the shared compute pool, NVMe, host memory) built from its topology (or one
// derived from the reference keys), and the path of every kind of transfer over them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/machine/machine.hpp"

namespace harmony::sim {

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

}  // namespace harmony::sim
