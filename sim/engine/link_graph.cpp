// The native engine's link graph: the links of a machine's topology (or of one derived from its reference keys),
// their names, and the path each kind of transfer takes over them (LinkGraph::h2d_path, d2h_path, p2p_path).
#include "sim/engine/link_graph.hpp"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "sim/engine/size_index.hpp"

namespace harmony::sim {

using engine_detail::z;

const char* link_kind_name(LinkKind k) {
  static const char* const names[] = {"gpu_down",      "gpu_up",    "switch_down", "switch_up",
                                      "inter_socket",  "nvlink",    "host_memcpy", "cpu_cores",
                                      "compute_units", "nvme_read", "nvme_write",  "host_memory"};
  return names[static_cast<int>(k)];
}

const char* transfer_class_name(TransferClass c) {
  static const char* const names[] = {"pcie_h2d", "pcie_d2h", "p2p_pcie", "nvlink", "host_staging", "cpu_msg", "none"};
  return names[static_cast<int>(c)];
}

core::Topology derive_topology(const core::MachineSpec& m) {
  core::Topology t;
  t.switches.push_back(core::PcieSwitch{"switch0", 0, m.bw_swap_bytes_per_s});
  for (int g = 0; g < m.gpus; ++g) t.gpus.push_back(core::GpuSpec{0, m.bw_swap_bytes_per_s, 1, 1});
  t.sockets = 1;
  t.p2p = core::P2PMode::Pcie;
  t.host_memcpy_bytes_per_s = m.bw_msg_bytes_per_s;
  t.cpu_cores = std::max(1, m.gpus);
  t.free_time_s = 0;
  return t;
}

LinkGraph build_link_graph(const core::MachineSpec& machine) {
  const core::Topology t = machine.topology.valid() ? machine.topology : derive_topology(machine);
  LinkGraph g;
  const int n = static_cast<int>(t.gpus.size());
  std::vector<core::PcieSwitch> switches = t.switches;
  if (switches.empty()) switches.push_back(core::PcieSwitch{"root", 0, 0});
  g.sockets = std::max(1, t.sockets);
  for (const auto& s : switches) {
    if (s.socket < 0) throw core::ScheduleError(fmt::format("topology: switch '{}' has a negative socket", s.name));
    g.sockets = std::max(g.sockets, s.socket + 1);
  }
  g.p2p = t.p2p;
  auto add = [&](std::string name, LinkKind k, double cap) {
    g.links.push_back(Link{std::move(name), k, cap});
    return static_cast<int>(g.links.size()) - 1;
  };
  for (int i = 0; i < n; ++i) {
    const auto& spec = t.gpus[z(i)];
    if (spec.pcie_switch < 0 || spec.pcie_switch >= static_cast<int>(switches.size()))
      throw core::ScheduleError(
          fmt::format("topology: GPU{} hangs off switch {}, which does not exist", i, spec.pcie_switch));
    const double bw = spec.link_bytes_per_s > 0 ? spec.link_bytes_per_s : machine.bw_swap_bytes_per_s;
    g.gpu_down.push_back(add(fmt::format("GPU{} PCIe H2D", i), LinkKind::GpuDown, bw));
    g.gpu_up.push_back(add(fmt::format("GPU{} PCIe D2H", i), LinkKind::GpuUp, bw));
    g.gpu_switch.push_back(spec.pcie_switch);
  }
  for (std::size_t s = 0; s < switches.size(); ++s) {
    const auto& sw = switches[s];
    const std::string name = sw.name.empty() ? fmt::format("switch{}", s) : sw.name;
    g.switch_down.push_back(add(name + " uplink down", LinkKind::SwitchDown, sw.uplink_bytes_per_s));
    g.switch_up.push_back(add(name + " uplink up", LinkKind::SwitchUp, sw.uplink_bytes_per_s));
    g.switch_socket.push_back(sw.socket);
  }
  g.inter_socket.assign(z(g.sockets * g.sockets), -1);
  for (int a = 0; a < g.sockets; ++a) {
    for (int b = 0; b < g.sockets; ++b) {
      if (a == b) continue;
      g.inter_socket[z(a * g.sockets + b)] =
          add(fmt::format("socket{}->{}", a, b), LinkKind::InterSocket, t.inter_socket_bytes_per_s);
    }
  }
  for (const auto& nv : t.nvlinks) {
    if (nv.gpu_a < 0 || nv.gpu_a >= n || nv.gpu_b < 0 || nv.gpu_b >= n || nv.gpu_a == nv.gpu_b)
      throw core::ScheduleError(
          fmt::format("topology: NVLink {}-{} names a GPU that does not exist", nv.gpu_a, nv.gpu_b));
    for (auto [a, b] : {std::pair{nv.gpu_a, nv.gpu_b}, std::pair{nv.gpu_b, nv.gpu_a}}) {
      if (g.nvlink.find({a, b}) != g.nvlink.end()) continue;
      const int link = add(fmt::format("NVLink {}->{}", a, b), LinkKind::NvLink, nv.bytes_per_s);
      g.nvlink.emplace(std::pair{a, b}, link);
    }
  }
  g.host_memcpy = add("host memcpy", LinkKind::HostMemcpy,
                      t.host_memcpy_bytes_per_s > 0 ? t.host_memcpy_bytes_per_s : machine.bw_msg_bytes_per_s);
  g.cpu = add("CPU cores", LinkKind::CpuCores, t.cpu_cores > 0 ? static_cast<double>(t.cpu_cores) : 0.0);
  if (machine.compute.shared()) g.compute = add("compute units", LinkKind::ComputeUnits, machine.compute.units);
  if (t.nvme.present()) {
    g.nvme_read = add("NVMe read", LinkKind::NvmeRead, t.nvme.read_bytes_per_s);
    g.nvme_write = add("NVMe write", LinkKind::NvmeWrite, t.nvme.write_bytes_per_s);
  }
  if (t.host_memory_bytes_per_s > 0)
    g.host_memory = add("host memory", LinkKind::HostMemory, t.host_memory_bytes_per_s);
  return g;
}

std::vector<int> LinkGraph::h2d_path(int gpu) const { return {switch_down[z(gpu_switch[z(gpu)])], gpu_down[z(gpu)]}; }

std::vector<int> LinkGraph::d2h_path(int gpu) const { return {gpu_up[z(gpu)], switch_up[z(gpu_switch[z(gpu)])]}; }

std::vector<int> LinkGraph::p2p_path(int from, int to, TransferClass* cls) const {
  if (from == to) {
    *cls = TransferClass::None;
    return {};
  }
  if (const auto nv = nvlink.find({from, to}); nv != nvlink.end()) {
    *cls = TransferClass::NvLink;
    return {nv->second};
  }
  const int sa = gpu_switch[z(from)];
  const int sb = gpu_switch[z(to)];
  const int ka = switch_socket[z(sa)];
  const int kb = switch_socket[z(sb)];
  std::vector<int> path{gpu_up[z(from)]};
  if (p2p == core::P2PMode::Pcie) {
    *cls = TransferClass::P2PPcie;
    if (sa != sb) {
      path.push_back(switch_up[z(sa)]);
      if (ka != kb) path.push_back(inter_socket[z(ka * sockets + kb)]);
      path.push_back(switch_down[z(sb)]);
    }
  } else {
    *cls = TransferClass::HostStaging;
    path.push_back(switch_up[z(sa)]);
    path.push_back(host_memcpy);
    if (ka != kb) path.push_back(inter_socket[z(ka * sockets + kb)]);
    path.push_back(switch_down[z(sb)]);
  }
  path.push_back(gpu_down[z(to)]);
  return path;
}

}  // namespace harmony::sim
