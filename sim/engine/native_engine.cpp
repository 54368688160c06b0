// The native engine: link graph and transfer paths, a discrete-event loop over integer picoseconds with
// fluid flows shared max-min fairly (progressive filling), FIFO copy engines, processor-shared CPU
// updates, the per-GPU memory timeline and the static host-memory account.
#include "sim/engine/native_engine.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/base/flat_table.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_graph.hpp"
#include "sim/engine/cost_reference.hpp"

namespace harmony::sim {

using core::Bytes;
using core::Op;
using core::OpKind;
using core::Program;
using core::Stream;
using core::TimePs;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPs = 1e12;
template <class T>
std::size_t z(T i) {
  return static_cast<std::size_t>(i);
}
}  // namespace

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

// ---- topology and paths ----

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

// ---- host memory ----

bool mixed_precision(const core::Model& m) {
  if (m.dtype == "bf16") return true;
  for (int l = 0; l < m.num_layers(); ++l) {
    if (m.narrow_weights(l)) return true;
  }
  return false;
}

HostAccount host_state(const core::Model& m, bool offload_nvme) {
  HostAccount h;
  const bool mixed = mixed_precision(m);
  for (int l = 0; l < m.num_layers(); ++l) {
    const core::Layer& L = m.layers[z(l)];
    if (mixed) {
      // fp32 masters and gradients of every 2-byte device weight (the executor keeps them so: its HostState); the
      // optimizer state's own figure includes the masters (4 bytes a parameter), which count as masters here
      h.master_weights_bytes += 2 * L.weight_bytes + L.buffer_bytes;
      h.optimizer_state_bytes += std::max<Bytes>(0, L.optimizer_state_bytes - 4 * L.param_count);
      h.gradient_bytes += 2 * L.weight_bytes;
    } else {
      h.master_weights_bytes += L.weight_bytes + L.buffer_bytes;
      h.optimizer_state_bytes += L.optimizer_state_bytes;
      h.gradient_bytes += L.weight_bytes;
    }
  }
  if (offload_nvme) {
    // the masters and the optimizer state live on the drives; so does a mixed-precision model's FP32 gradient (ZeRO-
    // Infinity swaps it out at the boundary, the lowering's nvme_write): the host keeps the 2-byte gradient buffer
    h.nvme_bytes = h.master_weights_bytes + h.optimizer_state_bytes;
    h.master_weights_bytes = 0;
    h.optimizer_state_bytes = 0;
    if (mixed) {
      h.nvme_bytes += h.gradient_bytes;
      h.gradient_bytes /= 2;
    }
  }
  return h;
}

HostAccount host_floor(const core::Model& m, core::PlanKind kind, bool offload_nvme) {
  // a kind with resident state keeps its weights, gradients and optimizer state on the GPUs
  return kind->resident_state ? HostAccount{} : host_state(m, offload_nvme);
}

bool host_memory_exceeded(Bytes total_bytes, Bytes host_memory_bytes) {
  return host_memory_bytes > 0 && total_bytes > host_memory_bytes;
}

bool pinned_memory_exceeded(Bytes total_bytes, Bytes optimizer_state_bytes, Bytes pinned_limit_bytes) {
  return pinned_limit_bytes > 0 && total_bytes - optimizer_state_bytes > pinned_limit_bytes;
}

bool host_limits_exceeded(const HostAccount& h, Bytes host_memory_bytes, Bytes pinned_limit_bytes) {
  return host_memory_exceeded(h.total_bytes(), host_memory_bytes) ||
         pinned_memory_exceeded(h.total_bytes(), h.optimizer_state_bytes, pinned_limit_bytes);
}

Bytes accumulate_bounce_bytes(const Program& p) {
  // A layer's gradient is one host tensor. A dWB that writes it first copies straight into it; one that adds to what
  // an earlier dWB of the step wrote (a later microbatch's, or another GPU's under l2l) cannot: its DMA lands in a
  // pinned buffer the CPU then adds from, one per process, as large as its largest such dWB. An all-reduced (ARD)
  // gradient: a Harmony Program's replicas have one dWB of a pack each and write the same sum into it one after
  // another (per GPU: its dWB copies); a swapping Program keeps the lowest replica's dWBs and the others' land in
  // their bounce buffers. A rank of a sharded gradient (RS) writes its own shard. (harmony-run's executor does the
  // same: docs/backend.md.)
  const bool harmony = p.graph.plan.kind->dialect == core::ExecutorDialect::Harmony;
  std::set<int> replicated, sharded;
  std::map<int, std::vector<int>> dwbs;  // per first layer, in (GPU, queue) order
  for (std::size_t o = 0; o < p.ops.size(); ++o) {
    const Op& op = p.ops[o];
    if (op.kind == OpKind::ARD) replicated.insert(op.layers.first);
    if (op.kind == OpKind::RS) sharded.insert(op.layers.first);
    if (op.kind == OpKind::dWB) dwbs[op.layers.first].push_back(static_cast<int>(o));
  }
  std::vector<Bytes> largest(z(std::max(p.num_devices(), 1)), 0);
  for (auto& [layer, list] : dwbs) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      const Op& x = p.ops[z(a)];
      const Op& y = p.ops[z(b)];
      return std::pair{x.device, x.queue_pos} < std::pair{y.device, y.queue_pos};
    });
    std::map<int, int> per_gpu;
    for (int o : list) ++per_gpu[p.ops[z(o)].device];
    const bool one_each = std::all_of(per_gpu.begin(), per_gpu.end(), [](const auto& e) { return e.second == 1; });
    const bool own = replicated.count(layer) != 0 || sharded.count(layer) != 0;
    const int lowest = p.ops[z(list.front())].device;
    std::set<int> written;  // GPU, or -1 for the whole layer
    for (int o : list) {
      const Op& op = p.ops[z(o)];
      const bool writes = replicated.count(layer) == 0 || (one_each && harmony) || op.device == lowest;
      const bool copies = writes && written.insert(own ? op.device : -1).second;
      if (!copies && z(op.device) < largest.size()) largest[z(op.device)] = std::max(largest[z(op.device)], op.bytes);
    }
  }
  Bytes total = 0;
  for (Bytes b : largest) total += b;
  return total;
}

HostAccount host_account(const Program& p, const core::Model& m, bool p2p_staged) {
  HostAccount h = host_floor(m, p.graph.plan.kind, p.offload_nvme);
  // Swaps are DMA copies straight from and into the host tensors (the time model prices them at the PCIe
  // rate with no host copy), so those tensors are the pinned memory and need no staging buffer: a staging
  // buffer sized by the largest swap op would grow with how a plan groups layers into one op (a Harmony
  // pack is one WB op, a baseline swaps layer by layer) rather than with the bytes it keeps on the host.
  // Only GPU-to-GPU copies staged through the host (p2p: host) have a buffer of their own.
  const std::size_t nd = z(std::max(p.num_devices(), 1));
  std::vector<Bytes> max_p2p(nd, 0);
  for (const Op& o : p.ops) {
    const std::size_t d = z(o.device);
    if (d >= nd) continue;
    switch (o.stream) {
      case Stream::SwapOut:
        if (o.kind == OpKind::sX) h.stash_bytes += o.bytes;
        if (o.kind == OpKind::Y || o.kind == OpKind::dX) h.activation_bytes += o.bytes;
        break;
      case Stream::P2POut:
        max_p2p[d] = std::max(max_p2p[d], o.bytes);
        break;
      case Stream::Cpu:
        if (o.kind == OpKind::MSGsX || o.kind == OpKind::MSGY) h.activation_bytes += o.bytes;
        break;
      default:
        break;
    }
  }
  if (p2p_staged) {
    for (std::size_t d = 0; d < nd; ++d) h.staging_bytes += 2 * max_p2p[d];
  }
  // mixed precision: the bounces hold fp32 sums of 2-byte gradients, and the masters go up and the gradients come
  // back through the staging rings (core::staging_ring_bytes)
  const bool mixed = mixed_precision(m);
  h.staging_bytes += (mixed ? 2 : 1) * accumulate_bounce_bytes(p);
  if (mixed && !p.graph.plan.kind->resident_state) h.staging_bytes += core::staging_ring_bytes(p, false);
  if (p.offload_nvme) {
    // each process double-buffers its largest NVMe I/O (a layer's parameter shard or bucket, or a layer's optimizer
    // state and masters: an op's read split over its io_count I/Os) in pinned memory
    std::vector<Bytes> max_read(nd, 0);
    for (const Op& o : p.ops) {
      const Bytes per_io = (o.nvme_read_bytes + std::max(1, o.io_count) - 1) / std::max(1, o.io_count);
      if (z(o.device) < nd) max_read[z(o.device)] = std::max(max_read[z(o.device)], per_io);
    }
    for (std::size_t d = 0; d < nd; ++d) h.staging_bytes += 2 * max_read[d];
  }
  return h;
}

// ---- profiled op times ----

double profiled_compute_s(const Op& o, const core::Model& m) {
  switch (o.kind) {
    case OpKind::FWD:
    case OpKind::REC: {
      double s = 0.0;
      for (int l = o.layers.first; l <= o.layers.last; ++l) s += m.time_s(core::Phase::Fwd, o.ubs, l);
      return s;
    }
    case OpKind::BWD: {
      double b = 0.0;
      double f = 0.0;
      for (int l = o.layers.first; l <= o.layers.last; ++l) b += m.time_s(core::Phase::Bwd, o.ubs, l);
      for (int l = o.layers.first; l <= o.layers.last; ++l) f += m.time_s(core::Phase::Fwd, o.ubs, l);
      // A noisy measured profile can time a layer's recompute + backward below its forward; the backward
      // part then costs nothing rather than a negative time (docs/native-model.md).
      return std::max(0.0, b - f);
    }
    default:
      return 0.0;
  }
}

double profiled_update_s(const Op& o, const core::Model& m) {
  if (o.kind != OpKind::Update) return 0.0;
  double s = 0.0;
  for (int l = o.layers.first; l <= o.layers.last; ++l) s += m.layers[z(l)].update_time_cpu_s;
  return s;
}

// ---- the engine ----

namespace {

// compute.host_cores on a shared pool, priced natively: the updates, copies and dispatch run on its units.
bool on_host_pool(const core::MachineSpec& machine, const NativeOptions& options) {
  return !options.reference_bandwidths && machine.compute.host_cores && machine.compute.shared();
}

// What an update takes with the whole CPU (or pool) to itself: its profiled time at the machine's optimizer rate.
double update_work_s(const Op& o, const core::Model& model, const core::MachineSpec& machine) {
  return profiled_update_s(o, model) * machine.compute.update_time_scale;
}

// The factor on a compute op's profiled time: machine.compute.time_scale, ignored under the reference settings.
double compute_time_scale(const core::MachineSpec& machine, const NativeOptions& options) {
  return options.reference_bandwidths ? 1.0 : machine.compute.time_scale;
}

// A short list held in place: a flow's path and coefficients (at most kMaxPath links: a P2P copy across sockets
// crosses five, plus host memory and the host-core pool). An activity per op made the engine's malloc/free a fifth
// of a sweep's time with std::vector here.
constexpr std::size_t kMaxPath = 8;
template <class T>
class SmallVec {
 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> v) {
    for (const T& x : v) push_back(x);
  }
  SmallVec(const std::vector<T>& v) {  // NOLINT(google-explicit-constructor): LinkGraph's paths convert
    for (const T& x : v) push_back(x);
  }
  void push_back(T x) {
    if (n_ == kMaxPath)
      throw core::InternalError(fmt::format("native engine: a flow path longer than {} links", kMaxPath));
    v_[n_++] = x;
  }
  void assign(std::size_t n, T x) {
    clear();
    for (std::size_t i = 0; i < n; ++i) push_back(x);
  }
  void clear() { n_ = 0; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](std::size_t i) { return v_[i]; }
  const T& operator[](std::size_t i) const { return v_[i]; }
  const T* begin() const { return v_.data(); }
  const T* end() const { return v_.data() + n_; }

 private:
  std::array<T, kMaxPath> v_{};
  std::size_t n_ = 0;
};
using Path = SmallVec<int>;

enum class ActKind : std::uint8_t { Fixed, Flow };
enum class EvKind : std::uint8_t { FixedEnd, LatencyEnd, FlowEnd };

// One stage of an activity: a fixed delay, or a fluid flow over a path after a latency. Most ops are one
// stage; with the native model's host work an op runs several in turn (an NVMe read before a swap-in, a
// host gradient sum after a swap-out, NVMe I/O and dtype conversions around a CPU update).
struct Stage {
  ActKind kind = ActKind::Fixed;
  TimePs fixed_ps = 0;
  TimePs latency_ps = 0;
  double volume = 0;  // bytes (core-seconds on the CPU)
  double cap = 0;     // the flow's own rate limit; <= 0: none
  Path path;
  SmallVec<double> coef;  // per path link: what one unit of volume uses of it; empty: 1 each
};

struct Activity : Stage {  // the Stage part is the stage running now
  int a = -1;
  int b = -1;                // the P2P peer of `a`, or -1
  std::vector<Stage> later;  // the stages still to run, in order
  int engine_stage = 0;      // the copy engine is given back when the stage of this index ends (0: the first)
  int stage = 0;             // index of the running stage
  int engine = -1;           // copy engine: gpu * 2 (+ 1 for device->host), -1 none
  TransferClass cls = TransferClass::None;
  core::TensorKind tensor = core::TensorKind::Activation;
  Bytes ledger_bytes = 0;  // payload counted in the swap ledger (0: not a transfer)
  // flow state
  double remaining = 0;
  double rate = -1;
  std::uint64_t version = 0;
  bool active = false;
};

double coef_of(const Stage& x, std::size_t i) { return x.coef.empty() ? 1.0 : x.coef[i]; }

struct Event {
  TimePs t = 0;
  std::uint64_t seq = 0;
  int act = 0;
  EvKind kind = EvKind::FixedEnd;
  std::uint64_t version = 0;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// A job on one shared resource (a link, a copy engine) for the resource bounds: its work in ps at the resource's
// full capacity, the earliest time it can start, and q, the time after its work ends that the iteration still
// needs at least (the activity's later stages; the op's chain rest is added once known).
struct ResourceJob {
  double r, p, q;
  int op;
};

// The iteration's lower bound from one resource alone: its jobs, released at r, each followed by q, on one
// machine that may switch jobs at any time (a fluid share is such a schedule) end no earlier than Jackson's
// preemptive schedule (largest q first), which is optimal for that relaxation (Horn 1974). Sorts `jobs` by r;
// `heap` is a working buffer.
double jackson_bound(std::vector<ResourceJob>& jobs, std::vector<std::pair<double, double>>& heap) {
  std::sort(jobs.begin(), jobs.end(), [](const ResourceJob& a, const ResourceJob& b) { return a.r < b.r; });
  double best = 0.0;
  heap.clear();  // (q, remaining p), largest q on top
  std::size_t i = 0;
  double t = 0.0;
  while (i < jobs.size() || !heap.empty()) {
    if (heap.empty()) t = std::max(t, jobs[i].r);
    while (i < jobs.size() && jobs[i].r <= t) {
      heap.emplace_back(jobs[i].q, jobs[i].p);
      std::push_heap(heap.begin(), heap.end());
      ++i;
    }
    const double next = i < jobs.size() ? jobs[i].r : std::numeric_limits<double>::infinity();
    auto& top = heap.front();
    const double run = std::min(top.second, next - t);
    t += run;
    top.second -= run;
    if (top.second <= 0) {
      best = std::max(best, t + top.first);
      std::pop_heap(heap.begin(), heap.end());
      heap.pop_back();
    }
  }
  return best;
}

struct CopyEngine {
  int slots = 1;
  int in_use = 0;
  std::deque<int> waiting;
};

class FlowEngine {
 public:
  FlowEngine(const Program& p, const core::Model& m, const core::MachineSpec& mach, const NativeOptions& opt)
      : p_(p), m_(m), mach_(mach), opt_(opt), graph_(p) {
    if (mach.topology.valid()) {
      topo_ = mach.topology;
    } else {
      // a reference-only machine: derive its topology, wide enough for the plan
      core::MachineSpec wide = mach;
      wide.gpus = std::max(mach.gpus, p.num_devices());
      topo_ = derive_topology(wide);
    }
    core::MachineSpec with_topology = mach;
    with_topology.topology = topo_;
    r_.graph = build_link_graph(with_topology);
    const int ngpu = static_cast<int>(topo_.gpus.size());
    if (p.num_devices() > ngpu)
      throw core::ScheduleError(fmt::format("the plan uses {} GPUs but the machine '{}' has {} in its topology",
                                            p.num_devices(), mach.name, ngpu));
    for (const Op& o : p.ops) {
      if (o.device < 0 || o.device >= ngpu)
        throw core::ScheduleError(fmt::format("an op runs on GPU{}, which the machine's topology lacks", o.device));
    }
    nsim_ = static_cast<double>(std::max(1, p.bandwidth_sharers));
    const auto& links = r_.graph.links;
    cap_.resize(links.size());
    for (std::size_t l = 0; l < links.size(); ++l) {
      const bool bytes_link = links[l].kind != LinkKind::CpuCores && links[l].kind != LinkKind::ComputeUnits;
      cap_[l] = (opt.reference_bandwidths && bytes_link) || links[l].capacity <= 0 ? kInf : links[l].capacity;
    }
    load_.assign(links.size(), 0.0);
    last_sample_.assign(links.size(), 0.0);
    r_.link_stats.assign(links.size(), LinkStats{});
    for (const auto& gs : topo_.gpus) {
      engines_.push_back(CopyEngine{std::max(1, gs.copy_engines_h2d), 0, {}});
      engines_.push_back(CopyEngine{std::max(1, gs.copy_engines_d2h), 0, {}});
    }
    const std::size_t nd = z(std::max(p.num_devices(), ngpu));
    mem_.assign(nd, 0);
    r_.peak_bytes.assign(z(std::max(p.num_devices(), 1)), 0);
    latency_ps_ = opt.latency ? core::seconds_to_ps(topo_.transfer_latency_s) : 0;
    for (int g = 0; g < ngpu; ++g) {
      h2d_.emplace_back(r_.graph.h2d_path(g));
      d2h_.emplace_back(r_.graph.d2h_path(g));
    }
    init_readiness();
    acts_.reserve(p.ops.size());  // at most one activity per op (a rendezvous pair shares one): never moved
  }

  // Per device, 1 when the report counts its end (reported_devices).
  std::vector<char> counted_devices() const {
    std::vector<char> counted(z(std::max(p_.num_devices(), 1)), 0);
    for (int d : reported_devices(p_)) {
      if (d >= 0 && z(d) < counted.size()) counted[z(d)] = 1;
    }
    return counted;
  }

  // The chain the bounds price: visit(op, peer) for every op once its predecessors were visited, a rendezvous pair
  // once, when its second op is reached (peer -1 for an op alone). Ops on a cycle (a deadlock) are never visited.
  template <class Visit>
  void walk_chain(Visit visit) const {
    const std::size_t n = p_.ops.size();
    std::vector<int> pending = pending_;
    std::vector<char> reached(n, 0);
    std::vector<int> stack;
    for (std::size_t i = 0; i < n; ++i) {
      if (pending[i] == 0) stack.push_back(static_cast<int>(i));
    }
    while (!stack.empty()) {
      const int op = stack.back();
      stack.pop_back();
      reached[z(op)] = 1;
      const int peer = p_.ops[z(op)].peer;
      if (peer >= 0 && !reached[z(peer)]) continue;  // the pair starts when its second op is ready
      visit(op, peer);
      for (int o : {op, peer}) {
        if (o < 0) continue;
        for (const int s : graph_.successors(o)) {
          if (--pending[z(s)] == 0) stack.push_back(s);
        }
      }
    }
  }

  // A time the iteration cannot beat (native_lower_bound_ps): the longest chain of dependencies, queue order and
  // rendezvous pairs with every activity priced alone. A running flow's max-min fair rate never exceeds its rate
  // alone (its own cap and each link's capacity over its coefficient), copy-engine waits and hand-offs only add,
  // so no op ends before the chain's bound on it. Ops never reached (a deadlock) do not count.
  //
  // with_tails: also each op's tail (tail_), the time from its becoming ready to the end of the iteration that the
  // same pricing cannot beat (its own activity alone, then its longest chain of successors to an op of a reported
  // GPU; -inf where no such op follows), which run_until checks as ops become ready.
  //
  // stop_above (>= 0): a bound found above it is returned at once (the search only asks whether it is).
  TimePs lower_bound(bool with_tails = false, TimePs stop_above = -1) {
    const std::size_t n = p_.ops.size();
    std::vector<double> ready(n, 0.0);  // picoseconds, the latest end of a predecessor
    const std::vector<char> counted = counted_devices();
    const auto reported = [&](int op) {
      const int d = p_.ops[z(op)].device;
      return d >= 0 && z(d) < counted.size() && counted[z(d)] != 0;
    };
    struct Visit {
      int op, peer;
      double t;
    };
    // jobs for the resource bounds (jackson_bound): what each flow stage asks of each link it crosses, what each
    // activity holds a copy engine for, with the chain's earliest start and the rest of its chain after it
    const bool shared = !opt_.serial && opt_.contention;
    const std::size_t nlinks = cap_.size();
    std::vector<std::vector<ResourceJob>>& jobs = jobs_;
    jobs.resize(nlinks + engines_.size());
    for (auto& v : jobs) v.clear();
    std::vector<Visit> order;
    order.reserve(n);
    double end = 0.0;
    if (with_tails) built_.assign(n, Activity{});  // run_until takes them instead of building them again
    Activity scratch;
    walk_chain([&](int op, int peer) {
      Activity& x = with_tails ? built_[z(op)] : scratch;
      if (!with_tails) x = Activity{};
      build_activity(x, op, peer);
      const double start = std::max(ready[z(op)], peer >= 0 ? ready[z(peer)] : 0.0);
      double t = 0;
      for (int k = 0; k <= static_cast<int>(x.later.size()); ++k) {
        const Stage& st = k == 0 ? static_cast<const Stage&>(x) : x.later[z(k - 1)];
        const double a = alone_ps(st);
        if (shared && st.kind == ActKind::Flow) {
          // the volume flows after the stage's latency
          const double r = start + t + static_cast<double>(st.latency_ps);
          for (std::size_t i = 0; i < st.path.size(); ++i) {
            const std::size_t l = z(st.path[i]);
            if (std::isfinite(cap_[l]) && cap_[l] > 0 && st.volume > 0)
              jobs[l].push_back({r, st.volume * coef_of(st, i) / cap_[l] * kPs, -(t + a), op});
          }
        }
        t += a;
        if (shared && k == x.engine_stage && x.engine >= 0)
          jobs[nlinks + z(x.engine)].push_back({start, t / static_cast<double>(engines_[z(x.engine)].slots), -t, op});
      }
      const double fin = start + t;
      for (int o : {op, peer}) {
        if (o < 0) continue;
        if (reported(o)) end = std::max(end, fin);
        for (const int s : graph_.successors(o)) ready[z(s)] = std::max(ready[z(s)], fin);
      }
      order.push_back({op, peer, t});
    });
    const double none = -std::numeric_limits<double>::infinity();
    std::vector<double> tail(n, none);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      double after = none;          // the longest tail among the pair's successors
      bool ends_iteration = false;  // the pair has an op on a reported GPU
      for (int o : {it->op, it->peer}) {
        if (o < 0) continue;
        ends_iteration = ends_iteration || reported(o);
        for (const int s : graph_.successors(o)) after = std::max(after, tail[z(s)]);
      }
      const double r = std::max(ends_iteration ? 0.0 : none, after);
      for (int o : {it->op, it->peer}) {
        if (o < 0) continue;
        tail[z(o)] = it->t + r;
      }
    }
    if (with_tails) tail_.swap(tail);  // run_until's; read below as `tails` either way
    const std::vector<double>& tails = with_tails ? tail_ : tail;
    // the engine rounds each flow's end up to a picosecond and integrates rates in floating point: a relative
    // margin far below any difference a search ranks on keeps the bound below every run
    auto bound = [&] { return static_cast<TimePs>(std::floor(end * (1.0 - 1e-9))); };
    if (!shared || (stop_above >= 0 && bound() > stop_above)) return bound();
    // a job's q so far is minus its activity's time up to the job's end: its op's tail (the activity's time, then
    // the rest of its chain) completes it; a job that nothing reported follows (tail -inf) does not bound the
    // iteration. The most loaded
    // resources first: they bind most often, and a bound past stop_above ends the walk.
    std::vector<std::pair<double, std::size_t>> by_work;
    std::vector<double> most(jobs.size(), 0.0);  // per resource, at least its schedule's end (see below)
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      auto& v = jobs[k];
      std::erase_if(v, [&](const ResourceJob& j) { return !(tails[z(j.op)] > none); });
      double work = 0;
      double last_r = 0;
      double most_q = 0;
      for (auto& j : v) {
        j.q += tails[z(j.op)];
        work += j.p;
        last_r = std::max(last_r, j.r);
        most_q = std::max(most_q, j.q);
      }
      // Jackson's schedule never idles while a job is released, so it ends its jobs by the last release plus all
      // the work, each followed by at most the largest q
      most[k] = last_r + work + most_q;
      if (!v.empty()) by_work.emplace_back(-work, k);
    }
    std::sort(by_work.begin(), by_work.end());
    if (with_tails) {
      // run_until's check: what each link still owes the counted ops (see check_links)
      link_owed_ps_.assign(nlinks, 0.0);
      link_jobs_left_.assign(nlinks, 0);
      owing_links_.clear();
      counted_op_.assign(n, 0);
      for (std::size_t i = 0; i < n; ++i) counted_op_[i] = tails[i] > none ? 1 : 0;
      for (const auto& [work, k] : by_work) {
        if (k < nlinks) {
          link_owed_ps_[k] = -work;
          link_jobs_left_[k] = static_cast<int>(jobs[k].size());
          owing_links_.push_back(k);
        }
      }
    }
    for (const auto& [work, k] : by_work) {
      // a resource whose schedule cannot end past the bound so far (nor past stop_above, when that is all the
      // caller asks) changes nothing: not scheduled
      if (most[k] * (1.0 - 1e-9) <= std::max(end, static_cast<double>(stop_above))) continue;
      end = std::max(end, jackson_bound(jobs[k], jackson_heap_));
      if (stop_above >= 0 && bound() > stop_above) break;
    }
    return bound();
  }

  NativeResult run() { return *run_until(-1); }

  // run(), abandoned (nullopt) once the iteration is known to end after `cutoff` ps (-1: never): when an op
  // becomes ready at a time that its tail (lower_bound(true), which must have run) carries past the cutoff. The
  // bound's relative margin and a picosecond keep a tie (an iteration ending exactly at the cutoff) running.
  std::optional<NativeResult> run_until(TimePs cutoff) {
    cutoff_ = cutoff >= 0 && tail_.size() == p_.ops.size() ? cutoff : -1;
    links_checked_ = cutoff_ >= 0 && !owing_links_.empty() && counted_op_.size() == p_.ops.size();
    const std::size_t n = p_.ops.size();
    for (std::size_t i = 0; i < n; ++i) {
      if (pending_[i] == 0) became_ready(static_cast<int>(i));
    }
    start_pending();
    if (dirty_) recompute();
    while (!heap_.empty() && !past_cutoff_) {
      const TimePs t = heap_.top().t;
      if (t < now_)
        throw core::InternalError(fmt::format("an event at {} ps is before the current time {} ps", t, now_));
      if (t > now_) {
        advance(t);
        if (links_checked_) check_links();
      }
      while (!heap_.empty() && heap_.top().t == now_) {
        const Event e = heap_.top();
        heap_.pop();
        handle(e);
      }
      start_pending();
      if (dirty_) recompute();
    }
    if (past_cutoff_) return std::nullopt;
    finish();
    return std::move(r_);
  }

 private:
  // ---- readiness (the same rule as run_timeline) ----
  void init_readiness() {
    const std::size_t n = p_.ops.size();
    auto& t = r_.timeline;
    t.begin_ps.assign(n, -1);
    t.end_ps.assign(n, -1);
    t.duration_ps.assign(n, 0);
    r_.ready_ps.assign(n, -1);
    pending_.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const Op& o = p_.ops[i];
      if (o.peer >= 0 && (o.peer >= static_cast<int>(n) || p_.ops[z(o.peer)].peer != static_cast<int>(i)))
        throw core::ScheduleError(
            fmt::format("op {} has a rendezvous peer that does not point back", p_.op_id(static_cast<int>(i))));
      pending_[i] = graph_.predecessor_count(static_cast<int>(i));
    }
  }

  void became_ready(int op) {
    r_.ready_ps[z(op)] = now_;
    if (cutoff_ >= 0 && (static_cast<double>(now_) + tail_[z(op)]) * (1.0 - 1e-9) > static_cast<double>(cutoff_) + 1.0)
      past_cutoff_ = true;
    const int peer = p_.ops[z(op)].peer;
    if (peer >= 0) {
      if (r_.ready_ps[z(peer)] < 0) return;  // the peer will launch the pair
      launch(make_activity(op, peer));
      return;
    }
    launch(make_activity(op, -1));
  }

  void launch(int act) { to_start_.push_back(act); }

  // run_until's check on the links: a link still owes the work of the counted ops' flows over it (the resource
  // bound's jobs, at its full capacity) less what they moved so far, and moves no faster than its capacity; while
  // one of those flows has not ended, the iteration cannot end before now plus what is owed. Where
  // contention has delayed that work (a link idle while its flows waited elsewhere), this shows it when it happens,
  // not when the delayed ops become ready.
  void check_links() {
    for (const std::size_t l : owing_links_) {
      if (link_jobs_left_[l] > 0 && (static_cast<double>(now_) + std::max(0.0, link_owed_ps_[l])) * (1.0 - 1e-9) >
                                        static_cast<double>(cutoff_) + 1.0) {
        past_cutoff_ = true;
        return;
      }
    }
  }

  // The path GPU `from` -> `to` (LinkGraph::p2p_path), built once per pair the Program uses: a table of the pairs
  // met, not of all N^2 (at 4,000 GPUs that was 670 MB per engine, and the bottleneck report runs five at once).
  Path p2p(int from, int to, TransferClass* cls) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(z(from)) << 32) | static_cast<std::uint64_t>(z(to));
    if (const P2PRoute* known = p2p_.find(key)) {
      *cls = known->cls;
      return known->path;
    }
    P2PRoute route;
    route.path = r_.graph.p2p_path(from, to, &route.cls);
    p2p_.insert(key, route);
    *cls = route.cls;
    return route.path;
  }

  // A stage's time alone on the machine: its fixed time, or its latency plus its volume at the path's bottleneck
  // (capped by its own rate limit), the rate max-min fairness gives a flow that shares nothing.
  double alone_ps(const Stage& st) const {
    if (st.kind == ActKind::Fixed) return static_cast<double>(st.fixed_ps);
    double r = st.cap > 0 ? st.cap : kInf;
    for (std::size_t i = 0; i < st.path.size(); ++i) r = std::min(r, cap_[z(st.path[i])] / coef_of(st, i));
    double t = static_cast<double>(st.latency_ps);
    if (std::isfinite(r) && r > 0 && st.volume > 0) t += st.volume * kPs / r;
    return t;
  }

  // ---- pricing ----
  // profiled_compute_s, memoized per (forward or backward, microbatch size, layers): every microbatch of a pack, on
  // every replica, and lower_bound() before run() ask for the same sum again (the same terms in the same order, so
  // the same double).
  double compute_s(const Op& o) const {
    constexpr int kBits = 20;
    const bool fwd = o.kind == OpKind::FWD || o.kind == OpKind::REC;
    if (!(fwd || o.kind == OpKind::BWD) || o.ubs < 0 || o.ubs >= (1 << kBits) || o.layers.first < 0 ||
        o.layers.last < 0 || o.layers.last >= (1 << kBits))
      return profiled_compute_s(o, m_);
    const std::uint64_t key =
        (static_cast<std::uint64_t>(fwd) << (3 * kBits)) | (static_cast<std::uint64_t>(o.ubs) << (2 * kBits)) |
        (static_cast<std::uint64_t>(o.layers.first) << kBits) | static_cast<std::uint64_t>(o.layers.last);
    if (const double* s = compute_memo_.find(key)) return *s;
    const double s = profiled_compute_s(o, m_);
    compute_memo_.insert(key, s);
    return s;
  }
  double update_s(const Op& o) const { return profiled_update_s(o, m_); }

  // The stage of a compute op (FWD, REC, BWD) into a default one. machine.compute and machine.dispatch are the
  // native model's: the reference settings ignore them.
  void set_compute_stage(Stage& x, const Op& o) const {
    const bool ref = opt_.reference_bandwidths;
    const int pool = r_.graph.compute;
    if (const double s = compute_s(o) * compute_time_scale(mach_, opt_); pool >= 0 && !ref && s > 0) {
      // shared compute (machine.compute): s x units_per_op unit-seconds on the pool, at most units_per_op units at
      // a time, so an op alone takes s and n ops at once on a pool of C units take s x max(1, n x units_per_op / C)
      // each (processor sharing, via the max-min fair rates).
      const double per_op = mach_.compute.units_per_op;
      x.kind = ActKind::Flow;
      x.volume = s * per_op;
      x.path = {pool};
      x.cap = per_op;
    } else {
      x.fixed_ps = core::seconds_to_ps(s);
    }
  }

  void set_flow(Activity& x, double volume, const Path& path, double cap, TransferClass cls, Bytes ledger,
                core::TensorKind tensor, int engine) const {
    if (volume <= 0) return;  // nothing moves: a zero-length op
    x.kind = ActKind::Flow;
    x.volume = volume;
    x.remaining = volume;
    x.path = path;
    x.cap = cap;
    x.cls = cls;
    x.ledger_bytes = ledger;
    x.tensor = tensor;
    x.engine = opt_.contention ? engine : -1;
    // a transfer split into io_count I/Os (ZeRO-3's buckets) pays the latency once per I/O
    const int ios = opt_.reference_bandwidths ? 1 : std::max(1, p_.ops[z(x.a)].io_count);
    x.latency_ps = latency_ps_ * ios;
    if (!opt_.reference_bandwidths && r_.graph.host_memory >= 0) {
      // DMA to or from host memory crosses DRAM once per byte (staged P2P twice); a host copy reads and writes
      if (cls == TransferClass::PcieH2D || cls == TransferClass::PcieD2H) add_host_memory(x, 1.0);
      if (cls == TransferClass::HostStaging) add_host_memory(x, 2.0);
      if (cls == TransferClass::CpuMsg) add_host_memory(x, 2.0);
    }
  }

  void add_host_memory(Stage& x, double coef) const {
    if (x.coef.empty()) x.coef.assign(x.path.size(), 1.0);
    x.path.push_back(r_.graph.host_memory);
    x.coef.push_back(coef);
  }

  // A host-side flow stage of `volume` bytes over `link`, crossing host memory `mem_coef` times per byte.
  Stage host_stage(int link, double volume, double mem_coef, TimePs latency) const {
    Stage st;
    st.kind = ActKind::Flow;
    st.volume = volume;
    st.path = {link};
    st.latency_ps = latency;
    if (r_.graph.host_memory >= 0) add_host_memory(st, mem_coef);
    return st;
  }

  // A dWB's copy back to its device (ZeRO-3's gradient buffer, core::Op::return_bytes): the device's host -> device
  // path, one I/O per tensor as the op's own transfer, DMA crossing host memory once per byte.
  Stage return_stage(const Op& o) const {
    Stage st;
    st.kind = ActKind::Flow;
    st.volume = static_cast<double>(o.return_bytes);
    st.path = h2d_[z(o.device)];
    st.cap = host_path_cap(o, true);
    st.latency_ps = latency_ps_ * std::max(1, o.io_count);
    if (r_.graph.host_memory >= 0) add_host_memory(st, 1.0);
    return st;
  }

  // The host work around op `o`'s own stage (native model only; docs/native-model.md "Offload tiers and host
  // work"): NVMe reads before it, the dtype conversion before an update, host gradient sums and NVMe writes
  // after it, and the op's fixed overhead before everything.
  void add_host_work(Activity& x, const Op& o) const {
    const auto& g = r_.graph;
    std::vector<Stage> before;
    std::vector<Stage> after;
    const int ios = std::max(1, o.io_count);
    const TimePs nvme_lat = opt_.latency ? core::seconds_to_ps(topo_.nvme.latency_s) * ios : 0;
    if ((o.nvme_read_bytes > 0 || o.nvme_write_bytes > 0) && g.nvme_read < 0)
      throw core::ScheduleError(fmt::format(
          "op {} ({}) reads or writes the NVMe tier, but the machine '{}' has none: add topology.nvme, or use "
          "plan.offload: cpu",
          p_.op_id(x.a), p_.op_label(x.a), mach_.name));
    if (o.nvme_read_bytes > 0)
      before.push_back(host_stage(g.nvme_read, static_cast<double>(o.nvme_read_bytes), 1.0, nvme_lat));
    if (o.return_bytes > 0) after.push_back(return_stage(o));
    if (o.host_sum_bytes > 0) after.push_back(host_stage(g.host_memcpy, static_cast<double>(o.host_sum_bytes), 3.0, 0));
    // passes over host tensors (ZeRO-3's unscale and dtype copy): memory-bound, at the memcpy rate, where a copied
    // byte is one read and one write
    if (o.host_pass_bytes > 0)
      after.push_back(host_stage(g.host_memcpy, 0.5 * static_cast<double>(o.host_pass_bytes), 2.0, 0));
    if (o.nvme_write_bytes > 0)
      after.push_back(host_stage(g.nvme_write, static_cast<double>(o.nvme_write_bytes), 1.0, nvme_lat));
    if (!before.empty() || !after.empty()) {
      std::vector<Stage> all = std::move(before);
      x.engine_stage = static_cast<int>(all.size());
      all.push_back(static_cast<Stage&>(x));
      for (const Stage& st : after) all.push_back(st);
      static_cast<Stage&>(x) = all.front();
      x.later.assign(all.begin() + 1, all.end());
    }
    if (o.overhead_s > 0) {
      const TimePs ps = core::seconds_to_ps(o.overhead_s);
      if (x.kind == ActKind::Fixed) {
        x.fixed_ps += ps;
      } else {
        x.latency_ps += ps;
      }
    }
  }

  // Bytes the host converts between the GPU dtype and FP32 at an update: for every layer whose weights are
  // stored in under 4 bytes per parameter (fp16/bf16), the gradient up to FP32 and the updated weights down,
  // each counted as a copy of the FP32 side (2 x 4 bytes per parameter). They are DRAM traffic of the update
  // itself, not a pass of their own: DeepSpeed's CPU Adam writes the 2-byte copy inside its multi-threaded step
  // (Adam_Optimizer::Step_AVX's fp16 output) and casts gradients as it reads them, so the conversion costs CPU
  // time only through cpu_adam's measured rate and DRAM bandwidth through update_traffic_bytes.
  // An update that carries host_pass_bytes (ZeRO-3 stage 3: the optimizer steps the FP32 partition alone, the
  // gradient arrives in FP32 and the GPU-dtype copy is a pass of its own, priced by that pass) converts nothing.
  double conversion_bytes(const Op& o) const {
    if (o.host_pass_bytes > 0) return 0;
    double c = 0;
    for (int l = o.layers.first; l <= o.layers.last; ++l) {
      if (m_.narrow_weights(l)) c += 8.0 * static_cast<double>(m_.layers[z(l)].param_count);
    }
    return c;
  }

  // DRAM bytes one CPU Adam step touches for the op's layers: it reads the FP32 master weights, the FP32
  // gradient and the optimizer state and writes the masters and the state back (fp32 Adam: 16 bytes read +
  // 12 written = 28 bytes per parameter). FP32 bytes are 4 per parameter (the weight bytes when the profile
  // has no parameter count).
  double update_traffic_bytes(const Op& o) const {
    double t = 0;
    for (int l = o.layers.first; l <= o.layers.last; ++l) {
      const double fp32 = static_cast<double>(m_.fp32_param_bytes(l));
      t += 3.0 * fp32 + 2.0 * static_cast<double>(m_.layers[z(l)].optimizer_state_bytes);
    }
    t += conversion_bytes(o);
    return t;
  }

  int make_activity(int a, int b) {
    // the one lower_bound(true) built for the same op and peer, else built in place (it holds its paths inline)
    if (z(a) < built_.size() && built_[z(a)].a == a && built_[z(a)].b == b)
      acts_.push_back(std::move(built_[z(a)]));
    else
      build_activity(acts_.emplace_back(), a, b);
    return static_cast<int>(acts_.size()) - 1;
  }

  Activity build_activity(int a, int b) const {
    Activity x;
    build_activity(x, a, b);
    return x;
  }

  // The activity of op `a` (with its rendezvous peer `b`, or -1) into a default one: its stages, paths and copy
  // engine.
  void build_activity(Activity& x, int a, int b) const {
    x.a = a;
    x.b = b;
    const auto& g = r_.graph;
    const bool ref = opt_.reference_bandwidths;
    if (b >= 0) {
      int s = a;
      int rcv = b;
      if (p_.ops[z(a)].stream != Stream::P2POut && (p_.ops[z(b)].stream == Stream::P2POut || b < a)) std::swap(s, rcv);
      const Op& so = p_.ops[z(s)];
      TransferClass cls = TransferClass::None;
      const Path path = p2p(so.device, p_.ops[z(rcv)].device, &cls);
      set_flow(x, static_cast<double>(so.bytes), path, ref ? mach_.bw_p2p_bytes_per_s : 0, cls, so.bytes,
               core::moved_tensor(so.kind), so.device * 2 + 1);
    } else {
      const Op& o = p_.ops[z(a)];
      const double bytes = static_cast<double>(o.bytes);
      switch (o.kind) {
        case OpKind::FWD:
        case OpKind::REC:
        case OpKind::BWD:
          set_compute_stage(x, o);
          break;
        case OpKind::DEL:
          x.fixed_ps = core::seconds_to_ps(ref ? mach_.time_del_s : topo_.free_time_s);
          break;
        case OpKind::Update:
          if (gpu_update(o, mach_)) {  // AdamW on the GPU (resident state): its HBM traffic, on the compute stream
            x.fixed_ps = core::seconds_to_ps(device_update_s(o, mach_));
          } else if (ref) {
            x.fixed_ps = core::seconds_to_ps(update_s(o));
          } else if (const double w = update_work_s(o, m_, mach_); w > 0 && host_pool()) {
            // compute.host_cores: the optimizer's threads run on the pool's C units, all of them when alone (w x C
            // unit-seconds, at most C at a time), and share them with compute, copies and dispatch
            const double units = mach_.compute.units;
            x.kind = ActKind::Flow;
            x.volume = x.remaining = w * units;
            x.path = {g.compute};
            x.cap = units;
            if (const double t = update_traffic_bytes(o); g.host_memory >= 0 && t > 0) {
              x.path.push_back(g.host_memory);
              x.coef = {1.0, t / (w * units)};
            }
          } else if (w > 0) {
            // update_time_cpu_s is the whole machine's time (cpu_adam: the multi-threaded rate of every
            // core): w * cores core-seconds, with no per-update cap, so one update alone takes w and the
            // updates of all GPUs' processes running at once share the cores (processor sharing).
            const double cores = std::max(1, topo_.cpu_cores);
            x.kind = ActKind::Flow;
            x.volume = x.remaining = w * cores;
            x.path = {g.cpu};
            x.cap = 0.0;  // no per-update cap: an update alone uses every core
            if (const double t = update_traffic_bytes(o); g.host_memory >= 0 && t > 0) {
              // with a host memory bandwidth the update is t bytes of DRAM traffic, each byte w * cores / t
              // core-seconds: alone it still takes w (or t / bandwidth if that is longer), and it shares DRAM
              // with the DMA byte for byte
              x.volume = x.remaining = t;
              x.path = {g.cpu, g.host_memory};
              x.coef = {w * cores / t, 1.0};
            }
          }
          break;
        case OpKind::ARD:
        case OpKind::AG:
        case OpKind::RS: {
          const int nr = std::max(1, p_.bandwidth_sharers);
          const double k = static_cast<double>(nr);
          const double vol = o.kind == OpKind::ARD ? 2. * (k - 1) / k * bytes : (k - 1) / k * bytes;
          TransferClass cls = TransferClass::None;
          const Path path = p2p(o.device, (o.device + 1) % nr, &cls);
          if (!path.empty())
            set_flow(x, vol, path, ref ? mach_.bw_p2p_bytes_per_s : 0, cls, std::llround(vol),
                     core::moved_tensor(o.kind), -1);
          break;
        }
        case OpKind::MSGsX:
        case OpKind::MSGY:
          // two host copies (sender -> shared buffer -> receiver): 2 x bytes over the memcpy link
          set_flow(x, 2. * bytes, {g.host_memcpy}, ref ? mach_.bw_msg_bytes_per_s / nsim_ : 0, TransferClass::CpuMsg,
                   o.bytes, core::moved_tensor(o.kind), -1);
          break;
        default:  // a dWB's FP32 copy beyond its own bytes (core::Op::extra_out_bytes) is more of the same transfer
          transfer(x, o, bytes + (ref ? 0.0 : static_cast<double>(o.extra_out_bytes)));
          break;
      }
    }
    add_dispatch(x);
    if (!ref && b < 0) add_host_work(x, p_.ops[z(a)]);
    if (host_pool()) share_host_pool(x);
    x.remaining = x.volume;
  }

  // machine.compute.host_cores on the native model: the pool of compute units is the host's cores.
  bool host_pool() const { return on_host_pool(mach_, opt_); }

  // compute.host_cores: every copy stage (a swap, a P2P copy, a CPU message, a host sum) is a thread copying at
  // its path's bandwidth B: bytes / B unit-seconds of work on the pool, at most one unit (B bytes/s) at a time,
  // on no PCIe, NVLink or memcpy link (the logical devices have none between them; host memory and drives stay);
  // and the op's dispatch is a stage of its own before the op's work: that many unit-seconds of one thread on the
  // pool (holding the op's copy engine), slowed like any other thread.
  void share_host_pool(Activity& x) const {
    const int pool = r_.graph.compute;
    auto add_pool = [&](Stage& st) {
      if (st.kind != ActKind::Flow || st.path.empty()) return;
      if (std::find(st.path.begin(), st.path.end(), pool) != st.path.end()) return;  // compute or update
      // the links a copy between devices crosses (not host memory, not the drives: a thread does not bound them)
      auto copy_link = [&](int l) {
        switch (r_.graph.links[z(l)].kind) {
          case LinkKind::GpuDown:
          case LinkKind::GpuUp:
          case LinkKind::SwitchDown:
          case LinkKind::SwitchUp:
          case LinkKind::InterSocket:
          case LinkKind::NvLink:
          case LinkKind::HostMemcpy:
            return true;
          default:
            return false;
        }
      };
      double bw = kInf;
      for (std::size_t i = 0; i < st.path.size(); ++i) {
        if (copy_link(st.path[i])) bw = std::min(bw, cap_[z(st.path[i])] / coef_of(st, i));
      }
      if (!(bw < kInf) || !(bw > 0)) return;  // no copy link (an NVMe transfer: the drive's DMA)
      // the thread, not a link shared with the other devices' copies, bounds it: the copy links leave the path.
      // The volume becomes unit-seconds (bytes / B), as every other flow on the pool, so that max-min fairness
      // compares like with like: at most one unit, B bytes per unit-second on the remaining links.
      Path path;
      SmallVec<double> coef;
      for (std::size_t i = 0; i < st.path.size(); ++i) {
        if (copy_link(st.path[i])) continue;
        path.push_back(st.path[i]);
        coef.push_back(coef_of(st, i) * bw);
      }
      path.push_back(pool);
      coef.push_back(1.0);
      st.path = path;
      st.coef = coef;
      st.volume /= bw;
      st.cap = st.cap > 0 ? std::min(1.0, st.cap / bw) : 1.0;
    };
    add_pool(x);
    for (Stage& st : x.later) add_pool(st);
    const double s = dispatch_s(x);
    if (s <= 0) return;
    Stage d;
    d.kind = ActKind::Flow;
    d.volume = s;
    d.path = {pool};
    d.cap = 1.0;
    x.later.insert(x.later.begin(), static_cast<Stage&>(x));
    static_cast<Stage&>(x) = d;
    ++x.engine_stage;
  }

  // The op class's dispatch overhead (machine.dispatch), paid before the work: a fixed op lasts that much
  // longer, a flow starts that much later (after its latency, holding its copy engine). With
  // compute.host_cores it is a stage on the pool instead (share_host_pool).
  void add_dispatch(Activity& x) const {
    if (opt_.reference_bandwidths || host_pool()) return;
    const double s = dispatch_s(x);
    if (s <= 0) return;
    const TimePs ps = core::seconds_to_ps(s);
    if (x.kind == ActKind::Fixed) {
      x.fixed_ps += ps;
    } else {
      x.latency_ps += ps;
    }
  }

  double dispatch_s(const Activity& x) const {
    const auto& d = mach_.dispatch;
    const OpKind k = p_.ops[z(x.a)].kind;
    double s = 0;
    if (k == OpKind::FWD || k == OpKind::REC || k == OpKind::BWD) {
      s = d.compute_s;
    } else if (k == OpKind::Update) {
      s = gpu_update(p_.ops[z(x.a)], mach_) ? d.compute_s : d.update_s;  // a GPU Update is a kernel launch
    } else if (k == OpKind::DEL) {
      s = 0;  // freeing is priced by free_time / time_del
    } else if (x.b >= 0 || k == OpKind::ARD || k == OpKind::AG || k == OpKind::RS) {
      s = d.p2p_s;
    } else {
      s = d.copy_s;
    }
    return s;
  }

  // machine.host_paths (harmony-run probe's measured host<->GPU paths): a host transfer runs no faster than its
  // path alone. Weights going up and gradients coming down of a layer whose device weights are narrower than the
  // FP32 masters take harmony-run's bf16 staging (round / widen on the host around a pinned copy: bf16_stage_up,
  // bf16_stage_down); every other host transfer is a pinned copy (pinned_h2d, pinned_d2h: harmony-run pins the
  // host state, stash and staging buffers, docs/backend.md). 0 (not measured): the links alone price it.
  double host_path_cap(const Op& o, bool up) const {
    const core::HostPaths& h = mach_.host_paths;
    const bool staged = (o.kind == OpKind::WB || o.kind == OpKind::dWB) && o.layers.first >= 0 &&
                        o.layers.first < m_.num_layers() && m_.narrow_weights(o.layers.first);
    if (staged) return up ? h.bf16_stage_up_bytes_per_s : h.bf16_stage_down_bytes_per_s;
    return up ? h.pinned_h2d_bytes_per_s : h.pinned_d2h_bytes_per_s;
  }

  void transfer(Activity& x, const Op& o, double bytes) const {
    const auto& g = r_.graph;
    const bool ref = opt_.reference_bandwidths;
    const double swap_cap = ref ? mach_.bw_swap_bytes_per_s / nsim_ : 0;
    switch (o.stream) {
      case Stream::SwapIn:
        set_flow(x, bytes, h2d_[z(o.device)], ref ? swap_cap : host_path_cap(o, true), TransferClass::PcieH2D, o.bytes,
                 core::moved_tensor(o.kind), o.device * 2);
        break;
      case Stream::SwapOut:
        set_flow(x, bytes, d2h_[z(o.device)], ref ? swap_cap : host_path_cap(o, false), TransferClass::PcieD2H, o.bytes,
                 core::moved_tensor(o.kind), o.device * 2 + 1);
        break;
      case Stream::P2PIn:
      case Stream::P2POut:
        throw core::ScheduleError(
            fmt::format("P2P op {} ({}) has no rendezvous peer", p_.op_id(x.a), p_.op_label(x.a)));
      case Stream::Cpu:
        set_flow(x, 2. * bytes, {g.host_memcpy}, ref ? mach_.bw_msg_bytes_per_s / nsim_ : 0, TransferClass::CpuMsg,
                 o.bytes, core::moved_tensor(o.kind), -1);
        break;
      case Stream::Compute:
        break;  // a transfer kind on the compute stream moves nothing the engine can price
    }
  }

  // ---- starting and ending ----
  void start_pending() {
    if (opt_.serial) {
      // one activity at a time, FIFO in the order they became ready (nothing else runs: no engine to wait for)
      serial_wait_.insert(serial_wait_.end(), to_start_.begin(), to_start_.end());
      to_start_.clear();
      if (serial_running_ || serial_wait_.empty()) return;
      serial_running_ = true;
      const int act = serial_wait_.front();
      serial_wait_.pop_front();
      acts_[z(act)].engine = -1;  // alone: no copy engine to hold
      begin(act);
      return;
    }
    // copy-engine slots freed at this time go to the transfers already waiting (FIFO), then new requests. Only an
    // engine that gave back a slot since the last call can have both a free slot and a queue (give_back_engine),
    // so those are visited, in ascending order as a scan of all 2N engines did (O(N) per event was O(N^2) per run).
    std::sort(freed_engines_.begin(), freed_engines_.end());
    freed_engines_.erase(std::unique(freed_engines_.begin(), freed_engines_.end()), freed_engines_.end());
    for (const int e : freed_engines_) {
      auto& ce = engines_[z(e)];
      while (ce.in_use < ce.slots && !ce.waiting.empty()) {
        const int act = ce.waiting.front();
        ce.waiting.pop_front();
        ++ce.in_use;
        begin(act);
      }
    }
    freed_engines_.clear();
    for (std::size_t k = 0; k < to_start_.size(); ++k) {
      const int act = to_start_[k];
      const int e = acts_[z(act)].engine;
      if (e < 0) {
        begin(act);
        continue;
      }
      auto& ce = engines_[z(e)];
      if (ce.waiting.empty() && ce.in_use < ce.slots) {
        ++ce.in_use;
        begin(act);
      } else {
        ce.waiting.push_back(act);
      }
    }
    to_start_.clear();
  }

  void push(TimePs t, int act, EvKind k, std::uint64_t version = 0) { heap_.push(Event{t, seq_++, act, k, version}); }

  void begin(int act) {
    Activity& x = acts_[z(act)];
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      r_.timeline.begin_ps[z(op)] = now_;
      allocate(op);
    }
    start_stage(act);
  }

  void start_stage(int act) {
    Activity& x = acts_[z(act)];
    if (x.kind == ActKind::Fixed) {
      if (x.fixed_ps > core::kMaxTimePs - now_)
        throw core::ScheduleError(fmt::format(
            "op {} ({}) starts at {:.6g} s and lasts {:.6g} s: it would end past the simulated time range (about "
            "9.2e6 s); shorten the step: smaller layer times in the profile, a smaller time_del, or faster rates",
            p_.op_label(x.a), p_.op_id(x.a), core::ps_to_seconds(now_), core::ps_to_seconds(x.fixed_ps)));
      push(now_ + x.fixed_ps, act, EvKind::FixedEnd);
    } else if (x.latency_ps > 0) {
      push(now_ + x.latency_ps, act, EvKind::LatencyEnd);
    } else {
      activate(act);
    }
  }

  void activate(int act) {
    acts_[z(act)].active = true;
    active_.push_back(act);
    dirty_ = true;
  }

  void handle(const Event& e) {
    Activity& x = acts_[z(e.act)];
    switch (e.kind) {
      case EvKind::FixedEnd:
        stage_end(e.act);
        break;
      case EvKind::LatencyEnd:
        activate(e.act);
        break;
      case EvKind::FlowEnd:
        if (!x.active || x.version != e.version) return;  // superseded by a rate change
        x.active = false;
        active_.erase(std::find(active_.begin(), active_.end(), e.act));
        dirty_ = true;
        stage_end(e.act);
        break;
    }
  }

  // The running stage of `act` is done: count its bytes, give back the copy engine after the DMA stage,
  // then start the next stage or end the activity.
  void stage_end(int act) {
    Activity& x = acts_[z(act)];
    if (x.kind == ActKind::Flow) {
      const bool owed = links_checked_ && counted_op_[z(x.a)] && x.volume > 0;
      for (std::size_t i = 0; i < x.path.size(); ++i) {
        const int l = x.path[i];
        if (owed && std::isfinite(cap_[z(l)])) --link_jobs_left_[z(l)];
        const LinkKind k = r_.graph.links[z(l)].kind;
        if (k != LinkKind::CpuCores && k != LinkKind::ComputeUnits)
          r_.link_stats[z(l)].bytes += std::llround(x.volume * coef_of(x, i));
      }
    }
    if (x.stage == x.engine_stage && x.engine >= 0) {
      give_back_engine(x.engine);
      x.engine = -1;
    }
    if (x.later.empty()) {
      end(act);
      return;
    }
    static_cast<Stage&>(x) = x.later.front();
    x.later.erase(x.later.begin());
    ++x.stage;
    x.remaining = x.volume;
    x.rate = -1;
    ++x.version;
    start_stage(act);
  }

  // A copy-engine slot is free again; start_pending gives it to the engine's queue.
  void give_back_engine(int e) {
    --engines_[z(e)].in_use;
    if (!engines_[z(e)].waiting.empty()) freed_engines_.push_back(e);
  }

  void end(int act) {
    Activity& x = acts_[z(act)];
    serial_running_ = false;
    if (x.engine >= 0) give_back_engine(x.engine);
    if (x.ledger_bytes > 0) {
      r_.class_bytes[static_cast<int>(x.cls)] += x.ledger_bytes;
      r_.tensor_bytes[static_cast<int>(x.tensor)] += x.ledger_bytes;
    }
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      r_.timeline.end_ps[z(op)] = now_;
      r_.timeline.duration_ps[z(op)] = now_ - r_.timeline.begin_ps[z(op)];
      ++r_.timeline.events_processed;
      release(op);
    }
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      for (const int s : graph_.successors(op))
        if (--pending_[z(s)] == 0) became_ready(s);
    }
  }

  // ---- memory ----
  void sample_memory(int d) {
    if (opt_.record_counters) r_.memory_samples.push_back(MemorySample{now_, d, mem_[z(d)]});
  }

  void allocate(int op) {
    const Op& o = p_.ops[z(op)];
    Bytes b = o.workspace_bytes;
    for (const auto& t : o.allocs) b += t.bytes;
    if (b == 0) return;
    const std::size_t d = z(o.device);
    mem_[d] += b;
    if (d < r_.peak_bytes.size()) r_.peak_bytes[d] = std::max(r_.peak_bytes[d], mem_[d]);
    sample_memory(o.device);
    const Bytes capacity = mach_.gpu_memory_bytes;
    if (opt_.capacities && mem_[d] > capacity) {
      ++r_.overflow_count;
      if (r_.overflow.op < 0) r_.overflow = MemoryOverflow{op, o.device, mem_[d] - capacity, mem_[d], capacity, now_};
    }
  }

  void release(int op) {
    const Op& o = p_.ops[z(op)];
    Bytes b = o.workspace_bytes;
    for (const auto& t : o.frees) b += t.bytes;
    if (b == 0) return;
    const std::size_t d = z(o.device);
    if (b > mem_[d]) {
      ++r_.memory_anomalies;
      mem_[d] = 0;
    } else {
      mem_[d] -= b;
    }
    sample_memory(o.device);
  }

  // ---- fluid flows ----
  void advance(TimePs t) {
    const TimePs dt = t - now_;
    const double dts = static_cast<double>(dt);
    for (int a : active_) {
      Activity& x = acts_[z(a)];
      if (!std::isfinite(x.rate)) continue;
      x.remaining -= x.rate * dts / kPs;
      if (links_checked_ && counted_op_[z(x.a)]) {
        for (std::size_t i = 0; i < x.path.size(); ++i) {
          const std::size_t l = z(x.path[i]);
          if (std::isfinite(cap_[l])) link_owed_ps_[l] -= x.rate * coef_of(x, i) * dts / cap_[l];
        }
      }
    }
    for (const std::size_t l : loaded_) {
      if (load_[l] > 0) r_.link_stats[l].busy_ps += dt;
    }
    now_ = t;
  }

  // Max-min fair rates by progressive filling: raise all unfrozen flows together until a link is full
  // (or a flow reaches its own cap); freeze the flows on it; repeat with the remaining capacity.
  // The rates are indexed like active_; the buffers are the engine's (fair_rates runs at every rate change and
  // allocated six vectors a call: a quarter of a sweep's time went to malloc and free).
  const std::vector<double>& fair_rates() const {
    const std::size_t nf = active_.size();
    std::vector<double>& rate = fr_rate_;
    rate.assign(nf, -1.0);
    if (!opt_.contention) {
      for (std::size_t f = 0; f < nf; ++f) {
        const Activity& x = acts_[z(active_[f])];
        double r = x.cap > 0 ? x.cap : kInf;
        for (std::size_t i = 0; i < x.path.size(); ++i) r = std::min(r, cap_[z(x.path[i])] / coef_of(x, i));
        rate[f] = r;
      }
      return rate;
    }
    // weighted progressive filling: a flow at rate r uses coef x r of each link on its path; weight[l] is the
    // sum of the coefficients of the unfrozen flows on l, count[l] their number. Only the links some flow uses
    // (`used`) are visited: a machine has many links (every NVLink pair) and a step uses few.
    std::vector<double>& residual = fr_residual_;
    std::vector<int>& count = fr_count_;
    std::vector<double>& weight = fr_weight_;
    std::vector<std::size_t>& used = fr_used_;
    if (count.size() != cap_.size()) {
      residual.assign(cap_.size(), 0.0);
      count.assign(cap_.size(), 0);
      weight.assign(cap_.size(), 0.0);
    }
    for (const std::size_t l : used) {  // what the last call left
      count[l] = 0;
      weight[l] = 0.0;
    }
    used.clear();
    for (int a : active_) {
      const Activity& x = acts_[z(a)];
      for (std::size_t i = 0; i < x.path.size(); ++i) {
        const std::size_t l = z(x.path[i]);
        if (!std::isfinite(cap_[l])) continue;
        if (count[l]++ == 0) {
          used.push_back(l);
          residual[l] = cap_[l];
        }
        weight[l] += coef_of(x, i);
      }
    }
    std::size_t unfrozen = nf;
    std::vector<char>& bottleneck = fr_bottleneck_;
    bottleneck.assign(cap_.size(), 0);
    while (unfrozen > 0) {
      double best = kInf;
      for (const std::size_t l : used) {
        if (count[l] > 0) best = std::min(best, std::max(0.0, residual[l]) / weight[l]);
      }
      for (std::size_t f = 0; f < nf; ++f) {
        const Activity& x = acts_[z(active_[f])];
        if (rate[f] < 0 && x.cap > 0) best = std::min(best, x.cap);
      }
      if (!std::isfinite(best)) {
        for (auto& r : rate) {
          if (r < 0) r = kInf;
        }
        break;
      }
      for (const std::size_t l : used) bottleneck[l] = count[l] > 0 && std::max(0.0, residual[l]) / weight[l] <= best;
      std::vector<std::size_t>& frozen = fr_frozen_;
      frozen.clear();
      for (std::size_t f = 0; f < nf; ++f) {
        if (rate[f] >= 0) continue;
        const Activity& x = acts_[z(active_[f])];
        bool freeze = x.cap > 0 && x.cap <= best;
        for (int l : x.path) freeze = freeze || bottleneck[z(l)];
        if (freeze) frozen.push_back(f);
      }
      for (std::size_t f : frozen) {
        rate[f] = best;
        --unfrozen;
        const Activity& x = acts_[z(active_[f])];
        for (std::size_t i = 0; i < x.path.size(); ++i) {
          const int l = x.path[i];
          if (!std::isfinite(cap_[z(l)])) continue;
          residual[z(l)] -= best * coef_of(x, i);
          weight[z(l)] -= coef_of(x, i);
          if (--count[z(l)] == 0) weight[z(l)] = 0;
        }
      }
    }
    return rate;
  }

  void recompute() {
    dirty_ = false;
    const std::vector<double>& rate = fair_rates();
    for (const std::size_t l : loaded_) load_[l] = 0.0;
    loaded_.clear();
    for (std::size_t f = 0; f < active_.size(); ++f) {
      const int a = active_[f];
      Activity& x = acts_[z(a)];
      if (rate[f] != x.rate) {
        x.rate = rate[f];
        ++x.version;
        TimePs fin = now_;
        if (std::isfinite(x.rate) && x.remaining > 0) {
          const double ps = std::ceil(x.remaining * kPs / x.rate);
          if (!(ps < static_cast<double>(core::kMaxTimePs - now_)) && p_.ops[z(x.a)].kind == OpKind::Update)
            throw core::ScheduleError(fmt::format(
                "op {} ({}) needs {:.6g} core-seconds of optimizer work: it would end past the simulated time range "
                "(about 9.2e6 s); raise the CPU Adam rate (cpu_adam) or shrink the model",
                p_.op_label(x.a), p_.op_id(x.a), x.remaining));
          if (!(ps < static_cast<double>(core::kMaxTimePs - now_)))
            throw core::ScheduleError(fmt::format(
                "op {} ({}) still has {} to move at {}: it would end past the simulated time range (about 9.2e6 s, "
                "106 days); raise the bandwidth of its links (the topology's link, uplink, nvlink, inter_socket, "
                "host_memcpy; bw_p2p under the reference keys) or shorten the step (a smaller minibatch or model)",
                p_.op_label(x.a), p_.op_id(x.a), core::format_bytes(static_cast<Bytes>(x.remaining)),
                core::format_bandwidth(x.rate)));
          fin = now_ + static_cast<TimePs>(ps);
        }
        push(fin, a, EvKind::FlowEnd, x.version);
      }
      if (std::isfinite(x.rate)) {
        for (std::size_t i = 0; i < x.path.size(); ++i) {
          const std::size_t l = z(x.path[i]);
          const double v = x.rate * coef_of(x, i);
          if (v > 0 && load_[l] == 0.0) loaded_.push_back(l);  // listed once: rates are never negative
          load_[l] += v;
        }
      }
    }
    if (opt_.record_counters) {
      for (std::size_t l = 0; l < load_.size(); ++l) {
        if (load_[l] != last_sample_[l]) {
          r_.bandwidth_samples.push_back(BandwidthSample{now_, static_cast<int>(l), load_[l]});
          last_sample_[l] = load_[l];
        }
      }
    }
  }

  // ---- results ----
  void finish() {
    auto& t = r_.timeline;
    const std::size_t n = p_.ops.size();
    if (t.events_processed < n) mark_deadlock(p_, t, true);
    const bool staged = topo_.p2p == core::P2PMode::Host;
    r_.host = host_account(p_, m_, staged);
    r_.host.capacity_bytes = topo_.host_memory_bytes;
    r_.host.pinned_limit_bytes = topo_.pinned_limit_bytes;
    r_.host.nvme_capacity_bytes = topo_.nvme.capacity_bytes;
    std::string reason;
    if (r_.overflow.op >= 0) {
      const auto& o = r_.overflow;
      reason = fmt::format("GPU{} memory exceeded at op {} ({}): {} in use > capacity {} by {} bytes", o.device,
                           p_.op_id(o.op), p_.op_label(o.op), core::format_bytes(o.in_use_bytes),
                           core::format_bytes(o.capacity_bytes), o.bytes_over);
    }
    auto add = [&](const std::string& s) { reason += (reason.empty() ? "" : "; ") + s; };
    if (opt_.capacities) {
      const auto& h = r_.host;
      if (host_memory_exceeded(h.total_bytes(), topo_.host_memory_bytes)) {
        add(
            fmt::format("host memory exceeded: needs {} (master weights {}, optimizer state {}, gradients {}, stashes "
                        "{}, activations {}, pinned staging {}) > capacity {} by {} bytes",
                        core::format_bytes(h.total_bytes()), core::format_bytes(h.master_weights_bytes),
                        core::format_bytes(h.optimizer_state_bytes), core::format_bytes(h.gradient_bytes),
                        core::format_bytes(h.stash_bytes), core::format_bytes(h.activation_bytes),
                        core::format_bytes(h.staging_bytes), core::format_bytes(topo_.host_memory_bytes),
                        h.total_bytes() - topo_.host_memory_bytes));
      }
      if (h.nvme_bytes > 0 && !topo_.nvme.present()) {
        add("the plan keeps parameters and optimizer state on NVMe (plan.offload: nvme), but the machine has no "
            "NVMe tier (topology.nvme)");
      } else if (topo_.nvme.capacity_bytes > 0 && h.nvme_bytes > topo_.nvme.capacity_bytes) {
        add(fmt::format("NVMe capacity exceeded: master weights and optimizer state need {} > capacity {} by {} bytes",
                        core::format_bytes(h.nvme_bytes), core::format_bytes(topo_.nvme.capacity_bytes),
                        h.nvme_bytes - topo_.nvme.capacity_bytes));
      }
      if (pinned_memory_exceeded(h.total_bytes(), h.optimizer_state_bytes, topo_.pinned_limit_bytes)) {
        const Bytes pinned = h.pinned_bytes();
        add(
            fmt::format("pinned host memory exceeded: the tensors swaps copy from and into (master weights {}, "
                        "gradients {}, stashes {}, activations {}, P2P staging {}) need {} > limit {} by {} bytes",
                        core::format_bytes(h.master_weights_bytes), core::format_bytes(h.gradient_bytes),
                        core::format_bytes(h.stash_bytes), core::format_bytes(h.activation_bytes),
                        core::format_bytes(h.staging_bytes), core::format_bytes(pinned),
                        core::format_bytes(topo_.pinned_limit_bytes), pinned - topo_.pinned_limit_bytes));
      }
    }
    r_.feasible = reason.empty();
    r_.infeasible_reason = std::move(reason);
  }

  const Program& p_;
  const core::Model& m_;
  const core::MachineSpec& mach_;
  NativeOptions opt_;
  core::Topology topo_;
  NativeResult r_;
  double nsim_ = 1;
  TimePs latency_ps_ = 0;
  TimePs now_ = 0;
  std::vector<Activity> built_;  // lower_bound(true): per op, the activity its walk built (taken by make_activity)
  std::vector<double> tail_;     // lower_bound(true): per op, ps from its ready time to the iteration's end, at least
  TimePs cutoff_ = -1;           // run_until's
  bool past_cutoff_ = false;     // an op became ready too late to end the iteration by cutoff_
  std::uint64_t seq_ = 0;
  bool dirty_ = false;
  std::vector<double> cap_;
  std::vector<double> load_;
  std::vector<std::size_t> loaded_;  // the links whose load_ may be non-zero (advance and recompute visit only them)
  std::vector<Path> h2d_, d2h_;      // per GPU
  // per (from, to) GPU pair the Program uses, filled on first use (p2p)
  struct P2PRoute {
    Path path;
    TransferClass cls = TransferClass::None;
  };
  mutable core::FlatTable<P2PRoute> p2p_;
  // fair_rates' working buffers, reused across calls (their contents never outlive one call)
  mutable std::vector<double> fr_rate_, fr_residual_, fr_weight_;
  mutable std::vector<int> fr_count_;
  mutable std::vector<char> fr_bottleneck_;
  mutable std::vector<std::size_t> fr_frozen_, fr_used_;
  mutable core::FlatTable<double> compute_memo_;  // compute_s's memo
  std::vector<double> link_owed_ps_;      // lower_bound(true): per link, the counted work not yet moved (check_links)
  bool links_checked_ = false;            // run_until checks the links (check_links)
  std::vector<int> link_jobs_left_;       // per link, the counted flow stages over it not yet ended
  std::vector<std::size_t> owing_links_;  // the links with such work, most first
  std::vector<char> counted_op_;          // lower_bound(true): per op, 1 when a reported op follows it (or it is one)
  std::vector<std::vector<ResourceJob>> jobs_;  // lower_bound's per-resource jobs (links, then copy engines)
  std::vector<std::pair<double, double>> jackson_heap_;
  std::vector<double> last_sample_;
  std::vector<CopyEngine> engines_;
  std::vector<int> freed_engines_;  // engines with a queue that gave back a slot since start_pending last ran
  std::vector<Bytes> mem_;
  core::ProgramGraph graph_;
  std::vector<int> pending_;
  std::vector<Activity> acts_;
  std::vector<int> active_;
  std::vector<int> to_start_;
  std::deque<int> serial_wait_;  // NativeOptions::serial: ready activities not yet begun
  bool serial_running_ = false;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
};

}  // namespace

NativeResult run_native(const Program& program, const core::Model& model, const core::MachineSpec& machine,
                        const NativeOptions& options) {
  return FlowEngine(program, model, machine, options).run();
}

TimePs native_lower_bound_ps(const Program& program, const core::Model& model, const core::MachineSpec& machine,
                             const NativeOptions& options) {
  return FlowEngine(program, model, machine, options).lower_bound();
}

TimePs native_task_bound_ps(const core::TaskGraph& graph, const std::vector<int>& ranks, const core::Model& model,
                            const core::MachineSpec& machine, const NativeOptions& options) {
  // set_compute_stage's price: a compute op alone takes at least its scaled profiled time (a fixed stage of that
  // time, or a flow of units_per_op x s work on the shared pool capped at units_per_op)
  const double scale = compute_time_scale(machine, options);
  const core::ComputeChain chain =
      core::compute_chain(graph, ranks, [&](const Op& o) { return profiled_compute_s(o, model) * scale * 1e12; });
  double end = chain.end_ps;
  // The CPU updates, when they share one pool (the CPU cores, or compute.host_cores' units) of finite capacity:
  // the Update op of an UPD task waits for its BWD task's gradients (the dW swap-out after the last BWD), and with
  // the whole pool takes update_s x update_time_scale (an update alone uses every core or unit; its DRAM traffic
  // and NVMe stages only add). As jobs on the pool (q = 0: the update's end counts), no run beats their Jackson
  // schedule, nor each rank's updates in its CPU queue's order (the task order) one after another.
  const bool finite = on_host_pool(machine, options) ? machine.compute.units > 0
                                                     : !machine.topology.valid() || machine.topology.cpu_cores > 0;
  if (options.contention && !options.serial && !options.reference_bandwidths && finite) {
    std::vector<ResourceJob> jobs;
    std::vector<double> queue_free(graph.rank_tasks.size(), 0.0);
    std::vector<char> lowered(graph.rank_tasks.size(), 0);
    for (const int r : ranks) lowered[z(r)] = 1;
    Op u;
    u.kind = OpKind::Update;
    for (const core::Task& t : graph.tasks) {
      if (t.type != core::TaskType::Upd || !lowered[z(t.rank)] || t.updates_task < 0) continue;
      u.layers = t.layers;
      const double p = update_work_s(u, model, machine) * 1e12;
      const double r = chain.task_end_ps[z(t.updates_task)];
      if (p <= 0) continue;
      jobs.push_back({r, p, 0.0, t.idx});
      double& free = queue_free[z(t.rank)];
      free = std::max(free, r) + p;
      end = std::max(end, free);
    }
    std::vector<std::pair<double, double>> heap;
    if (!jobs.empty()) end = std::max(end, jackson_bound(jobs, heap));
  }
  return chain.bound_ps(end);
}

std::optional<NativeResult> run_native_within(const Program& program, const core::Model& model,
                                              const core::MachineSpec& machine, const NativeOptions& options,
                                              TimePs cutoff_ps) {
  FlowEngine engine(program, model, machine, options);
  if (engine.lower_bound(true, cutoff_ps) > cutoff_ps) return std::nullopt;
  return engine.run_until(cutoff_ps);
}

}  // namespace harmony::sim
