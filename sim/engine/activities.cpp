// The native engine's activities: each op's (or rendezvous pair's) stages built from the Program, the profile and
// the machine (compute, transfers over their paths, CPU updates, collectives, the host work and dispatch around
// them, compute.host_cores' pool), and the profiled op times the bounds share.
#include "sim/engine/activities.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/program/host_gradients.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/engine/size_index.hpp"

namespace harmony::sim {

using core::Bytes;
using core::Op;
using core::OpKind;
using core::Stream;
using core::TimePs;

using engine_detail::z;

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

namespace native_detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPs = 1e12;
}  // namespace

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

ActivityBuilder::ActivityBuilder(const core::Program& p, const core::Model& m, const core::MachineSpec& mach,
                                 const NativeOptions& opt, const core::Topology& topo, const LinkGraph& graph,
                                 const std::vector<double>& capacity)
    : p_(p), m_(m), mach_(mach), opt_(opt), topo_(topo), graph_(graph), cap_(capacity), owner_(core::update_owners(p)) {
  nsim_ = static_cast<double>(std::max(1, p.cost.bandwidth_sharers));
  latency_ps_ = opt.latency ? core::seconds_to_ps(topo.transfer_latency_s) : 0;
  for (int g = 0; g < static_cast<int>(topo.gpus.size()); ++g) {
    h2d_.emplace_back(graph.h2d_path(g));
    d2h_.emplace_back(graph.d2h_path(g));
  }
}

// The path GPU `from` -> `to` (LinkGraph::p2p_path), built once per pair the Program uses: a table of the pairs
// met, not of all N^2 (at 4,000 GPUs that was 670 MB per engine, and the bottleneck report runs five at once).
Path ActivityBuilder::p2p(int from, int to, TransferClass* cls) const {
  const std::uint64_t key = (static_cast<std::uint64_t>(z(from)) << 32) | static_cast<std::uint64_t>(z(to));
  if (const P2PRoute* known = p2p_.find(key)) {
    *cls = known->cls;
    return known->path;
  }
  P2PRoute route;
  route.path = graph_.p2p_path(from, to, &route.cls);
  p2p_.insert(key, route);
  *cls = route.cls;
  return route.path;
}

// A stage's time alone on the machine: its fixed time, or its latency plus its volume at the path's bottleneck
// (capped by its own rate limit), the rate max-min fairness gives a flow that shares nothing.
double ActivityBuilder::alone_ps(const Stage& st) const {
  if (st.kind == ActKind::Fixed) return static_cast<double>(st.fixed_ps);
  double r = st.cap > 0 ? st.cap : kInf;
  for (std::size_t i = 0; i < st.path.size(); ++i) r = std::min(r, cap_[z(st.path[i])] / coef_of(st, i));
  double t = static_cast<double>(st.latency_ps);
  if (std::isfinite(r) && r > 0 && st.volume > 0) t += st.volume * kPs / r;
  return t;
}

// profiled_compute_s, memoized per (forward or backward, microbatch size, layers): every microbatch of a pack, on
// every replica, and lower_bound() before run() ask for the same sum again (the same terms in the same order, so
// the same double).
double ActivityBuilder::compute_s(const Op& o) const {
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

// The stage of a compute op (FWD, REC, BWD) into a default one. machine.compute and machine.dispatch are the
// native model's: the reference settings ignore them.
void ActivityBuilder::set_compute_stage(Stage& x, const Op& o) const {
  const bool ref = opt_.reference_bandwidths;
  const int pool = graph_.compute;
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

void ActivityBuilder::set_flow(Activity& x, double volume, const Path& path, double cap, TransferClass cls,
                               Bytes ledger, core::TensorKind tensor, int engine) const {
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
  const int ios = opt_.reference_bandwidths ? 1 : std::max(1, p_.cost.op(x.a).io_count);
  x.latency_ps = latency_ps_ * ios;
  if (!opt_.reference_bandwidths && graph_.host_memory >= 0) {
    // DMA to or from host memory crosses DRAM once per byte (staged P2P twice); a host copy reads and writes
    if (cls == TransferClass::PcieH2D || cls == TransferClass::PcieD2H) add_host_memory(x, 1.0);
    if (cls == TransferClass::HostStaging) add_host_memory(x, 2.0);
    if (cls == TransferClass::CpuMsg) add_host_memory(x, 2.0);
  }
}

void ActivityBuilder::add_host_memory(Stage& x, double coef) const {
  if (x.coef.empty()) x.coef.assign(x.path.size(), 1.0);
  x.path.push_back(graph_.host_memory);
  x.coef.push_back(coef);
}

// A host-side flow stage of `volume` bytes over `link`, crossing host memory `mem_coef` times per byte.
Stage ActivityBuilder::host_stage(int link, double volume, double mem_coef, TimePs latency) const {
  Stage st;
  st.kind = ActKind::Flow;
  st.volume = volume;
  st.path = {link};
  st.latency_ps = latency;
  if (graph_.host_memory >= 0) add_host_memory(st, mem_coef);
  return st;
}

// A dWB's copy back to its device (ZeRO-3's gradient buffer, core::NativeOpCosts::return_bytes): the device's host
// -> device path, one I/O per tensor as the op's own transfer, DMA crossing host memory once per byte.
Stage ActivityBuilder::return_stage(const Op& o, const core::NativeOpCosts& c) const {
  Stage st;
  st.kind = ActKind::Flow;
  st.volume = static_cast<double>(c.return_bytes);
  st.path = h2d_[z(o.device)];
  st.cap = host_path_cap(o, true);
  st.latency_ps = latency_ps_ * std::max(1, c.io_count);
  if (graph_.host_memory >= 0) add_host_memory(st, 1.0);
  return st;
}

// The host work around op `o`'s own stage (native model only; docs/native-model.md "Offload tiers and host
// work"): NVMe reads before it, the dtype conversion before an update, host gradient sums and NVMe writes
// after it, and the op's fixed overhead before everything.
void ActivityBuilder::add_host_work(Activity& x) const {
  const auto& g = graph_;
  const core::NativeOpCosts& o = p_.cost.op(x.a);
  std::vector<Stage> before;
  std::vector<Stage> after;
  const int ios = std::max(1, o.io_count);
  const TimePs nvme_lat = opt_.latency ? core::seconds_to_ps(topo_.nvme.latency_s) * ios : 0;
  if ((o.nvme_read_bytes > 0 || o.nvme_write_bytes > 0) && g.nvme_read < 0)
    throw core::ScheduleError(fmt::format(
        "op {} ({}) reads or writes the NVMe tier, but the machine '{}' has none: add topology.nvme, or use "
        "plan.offload: cpu",
        p_.op_id(x.a), p_.op_label(x.a), mach_.name));
  // I/O that overlaps the op's host work rides on its work stages; only a host update (a flow) has any to ride on
  const bool overlap = (o.nvme_read_overlap_bytes > 0 || o.nvme_write_overlap_bytes > 0) && x.kind == ActKind::Flow &&
                       host_update(p_.ops[z(x.a)]);
  const Bytes read_serial = o.nvme_read_bytes - (overlap ? o.nvme_read_overlap_bytes : 0);
  const Bytes write_serial = o.nvme_write_bytes - (overlap ? o.nvme_write_overlap_bytes : 0);
  if (read_serial > 0) before.push_back(host_stage(g.nvme_read, static_cast<double>(read_serial), 1.0, nvme_lat));
  if (o.return_bytes > 0) {
    after.push_back(return_stage(p_.ops[z(x.a)], o));
    x.return_ledger_bytes = o.return_bytes;
  }
  if (o.host_sum_bytes > 0) after.push_back(host_stage(g.host_memcpy, static_cast<double>(o.host_sum_bytes), 3.0, 0));
  // passes over host tensors (ZeRO-3's unscale and dtype copy): multi-threaded and memory-bound (pass_stage)
  if (o.host_pass_bytes > 0) after.push_back(pass_stage(static_cast<double>(o.host_pass_bytes)));
  if (overlap) {
    std::vector<Stage*> work = {&x};
    for (Stage& st : after) work.push_back(&st);
    overlap_io(work, static_cast<double>(o.nvme_read_overlap_bytes), static_cast<double>(o.nvme_write_overlap_bytes));
  }
  if (write_serial > 0) after.push_back(host_stage(g.nvme_write, static_cast<double>(write_serial), 1.0, nvme_lat));
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

// NVMe reads and writes that overlap an update's host work (plan.zero3.pipeline_read / pipeline_write: DeepSpeed's
// pipelined optimizer swapper) ride on its work stages (the CPU update, then its host passes) as more links of the
// same flows: each stage carries a share of the bytes in proportion to its time alone, so alone the op takes about
// the longest of its host work, its reads and its writes (each stage's I/O is its share of the whole, so the side
// that binds the whole binds every stage), and under contention the drives, the cores and host memory are shared as
// usual. Each such stage is re-expressed in bytes of its I/O (its volume, rate and rate limit), as the drives' other
// flows are: max-min fairness raises every flow's rate together, so a flow counted in core-seconds beside flows
// counted in bytes would starve them. The DMA crosses host memory once per byte. No NVMe latency: each I/O is issued
// while the previous work runs. Not priced: the pipeline's fill and drain (the first sub-group's read and the last
// one's write per step, DeepSpeed's sub_group_size elements; 1e8 of a 10-billion-element partition is 1%).
void ActivityBuilder::overlap_io(const std::vector<Stage*>& work, double read_bytes, double write_bytes) const {
  const auto& g = graph_;
  const double io = read_bytes + write_bytes;
  double total_ps = 0;
  for (const Stage* st : work) total_ps += alone_ps(*st);
  if (!(total_ps > 0) || !(io > 0))
    throw core::InternalError("native engine: overlapped NVMe I/O on an update without host work or bytes");
  for (Stage* st : work) {
    if (st->kind != ActKind::Flow || st->volume <= 0) continue;
    const double io_bytes = io * alone_ps(*st) / total_ps;  // this stage's share of the I/O: its new volume
    if (!(io_bytes > 0)) continue;
    const double per_byte = st->volume / io_bytes;  // the stage's old units per byte of I/O
    if (st->coef.empty()) st->coef.assign(st->path.size(), 1.0);
    for (std::size_t i = 0; i < st->path.size(); ++i) st->coef[i] *= per_byte;
    if (st->cap > 0) st->cap /= per_byte;
    st->volume = io_bytes;
    auto add = [&](int link, double coef) {
      if (link < 0 || coef <= 0) return;
      for (std::size_t i = 0; i < st->path.size(); ++i) {
        if (st->path[i] == link) {
          st->coef[i] += coef;
          return;
        }
      }
      st->path.push_back(link);
      st->coef.push_back(coef);
    };
    add(g.nvme_read, read_bytes / io);
    add(g.nvme_write, write_bytes / io);
    add(g.host_memory, 1.0);
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
double ActivityBuilder::conversion_bytes(int a) const {
  const Op& o = p_.ops[z(a)];
  if (p_.cost.op(a).host_pass_bytes > 0) return 0;
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
double ActivityBuilder::update_traffic_bytes(int a) const {
  const Op& o = p_.ops[z(a)];
  double t = 0;
  for (int l = o.layers.first; l <= o.layers.last; ++l) {
    const double fp32 = static_cast<double>(m_.optimizer_param_bytes(l));
    t += 3.0 * fp32 + 2.0 * static_cast<double>(m_.layers[z(l)].optimizer_state_bytes);
  }
  t += conversion_bytes(a);
  return t;
}

// An Update's stage: AdamW on the GPU (resident state) at its HBM traffic's time; under the reference settings its
// profiled time; else its CPU work on the host cores (or compute.host_cores' pool), sharing host memory bandwidth.
void ActivityBuilder::set_update_stage(Activity& x, const Op& o) const {
  const bool ref = opt_.reference_bandwidths;
  if (gpu_update(o, mach_)) {  // AdamW on the GPU (resident state): its HBM traffic, on the compute stream
    x.fixed_ps = core::seconds_to_ps(device_update_s(o, mach_));
  } else if (ref) {
    x.fixed_ps = core::seconds_to_ps(profiled_update_s(o, m_));
  } else if (const double w = update_work_s(o, m_, mach_); w > 0) {
    cpu_work(x, w, update_traffic_bytes(x.a));  // build() sets x.remaining from the volume, after the host work
  }
}

// Multi-threaded host work of `w` seconds alone with the whole CPU, moving `dram_bytes` of host memory, as a flow of
// `st`. compute.host_cores: the threads run on the pool's C units, all of them when alone (w x C unit-seconds, at most
// C at a time), and share them with compute, copies and dispatch. Else w x cores core-seconds on the CPU with no cap
// (cpu_adam and the passes' rate are the whole machine's: one such op alone takes w, and the ops of all GPUs'
// processes running at once share the cores: processor sharing). With a host memory bandwidth the flow is its DRAM
// bytes t, each w x cores / t core-seconds: alone it still takes w (or t / bandwidth if that is longer), and it shares
// DRAM with the DMA byte for byte.
void ActivityBuilder::cpu_work(Stage& st, double w, double dram_bytes) const {
  const auto& g = graph_;
  st.kind = ActKind::Flow;
  if (host_pool()) {
    const double units = mach_.compute.units;
    st.volume = w * units;
    st.path = {g.compute};
    st.cap = units;
    if (g.host_memory >= 0 && dram_bytes > 0) {
      st.path.push_back(g.host_memory);
      st.coef = {1.0, dram_bytes / (w * units)};
    }
    return;
  }
  const double cores = std::max(1, topo_.cpu_cores);
  st.volume = w * cores;
  st.path = {g.cpu};
  st.cap = 0.0;
  if (g.host_memory >= 0 && dram_bytes > 0) {
    st.volume = dram_bytes;
    st.path = {g.cpu, g.host_memory};
    st.coef = {w * cores / dram_bytes, 1.0};
  }
}

// A CPU optimizer's host passes over tensors after its step (ZeRO-3's unscale and GPU-dtype copy, `bytes` of DRAM
// read and written): PyTorch CPU tensor ops, which run on the process's intra-op threads, every core it has. Memory-
// bound: priced as multi-threaded host work at the DRAM rate the machine's cpu_adam implies (a DeepSpeed-style CPU
// Adam moves 28 bytes of DRAM per parameter, 7 per byte of its FP32 parameters, so its rate B is 7 B of DRAM traffic)
// on the CPU the updates use, scaled like them by compute.update_time_scale. Without a cpu_adam rate: one thread's
// copy, half the bytes over the host memcpy link (a copied byte is a read and a write), as before session 14.
Stage ActivityBuilder::pass_stage(double bytes) const {
  const double adam = mach_.cpu_adam.bytes_per_s;
  if (!(adam > 0)) return host_stage(graph_.host_memcpy, 0.5 * bytes, 2.0, 0);
  Stage st;
  cpu_work(st, bytes / (kAdamDramBytesPerFp32Byte * adam) * mach_.compute.update_time_scale, bytes);
  return st;
}

// The activity of op `a` (with its rendezvous peer `b`, or -1) into a default one: its stages, paths and copy
// engine.
void ActivityBuilder::build(Activity& x, int a, int b) const {
  x.a = a;
  x.b = b;
  const auto& g = graph_;
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
        if (!idle_update(a)) set_update_stage(x, o);
        break;
      case OpKind::ARD:
      case OpKind::AG:
      case OpKind::RS: {
        const int nr = std::max(1, p_.cost.bandwidth_sharers);
        const double k = static_cast<double>(nr);
        const double vol = o.kind == OpKind::ARD ? 2. * (k - 1) / k * bytes : (k - 1) / k * bytes;
        TransferClass cls = TransferClass::None;
        const Path path = p2p(o.device, (o.device + 1) % nr, &cls);
        if (!path.empty())
          set_flow(x, vol, path, ref ? mach_.bw_p2p_bytes_per_s : 0, cls, std::llround(vol), core::moved_tensor(o.kind),
                   -1);
        break;
      }
      case OpKind::MSGsX:
      case OpKind::MSGY:
        // two host copies (sender -> shared buffer -> receiver): 2 x bytes over the memcpy link
        set_flow(x, 2. * bytes, {g.host_memcpy}, ref ? mach_.bw_msg_bytes_per_s / nsim_ : 0, TransferClass::CpuMsg,
                 o.bytes, core::moved_tensor(o.kind), -1);
        break;
      default:  // a dWB's FP32 copy beyond its own bytes (core::NativeOpCosts::extra_out_bytes): more of the transfer
        transfer(x, o, bytes + (ref ? 0.0 : static_cast<double>(p_.cost.op(a).extra_out_bytes)));
        break;
    }
  }
  add_dispatch(x);
  if (!ref && b < 0 && !idle_update(a)) add_host_work(x);
  if (host_pool()) share_host_pool(x);
  x.remaining = x.volume;
}

// A replica's Update of a layer range whose host masters another Update steps (core::update_owners: Harmony-DP's and
// dp-swap's replicas update one shared master, once, as harmony-run's executor does): it runs nothing, so beyond its
// dispatch it costs nothing. The reference settings keep the paper's rule (every replica's update on its own CPU).
bool ActivityBuilder::idle_update(int a) const {
  const Op& o = p_.ops[z(a)];
  return !opt_.reference_bandwidths && o.kind == OpKind::Update && core::host_update(o) && owner_[z(a)] == 0;
}

// machine.compute.host_cores on the native model: the pool of compute units is the host's cores.
bool ActivityBuilder::host_pool() const { return on_host_pool(mach_, opt_); }

// compute.host_cores: every copy stage (a swap, a P2P copy, a CPU message, a host sum) is a thread copying at
// its path's bandwidth B: bytes / B unit-seconds of work on the pool, at most one unit (B bytes/s) at a time,
// on no PCIe, NVLink or memcpy link (the logical devices have none between them; host memory and drives stay);
// and the op's dispatch is a stage of its own before the op's work: that many unit-seconds of one thread on the
// pool (holding the op's copy engine), slowed like any other thread.
void ActivityBuilder::share_host_pool(Activity& x) const {
  const int pool = graph_.compute;
  auto add_pool = [&](Stage& st) {
    if (st.kind != ActKind::Flow || st.path.empty()) return;
    if (std::find(st.path.begin(), st.path.end(), pool) != st.path.end()) return;  // compute or update
    // the links a copy between devices crosses (not host memory, not the drives: a thread does not bound them)
    auto copy_link = [&](int l) {
      switch (graph_.links[z(l)].kind) {
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
void ActivityBuilder::add_dispatch(Activity& x) const {
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

double ActivityBuilder::dispatch_s(const Activity& x) const {
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
double ActivityBuilder::host_path_cap(const Op& o, bool up) const {
  const core::HostPaths& h = mach_.host_paths;
  const bool staged = (o.kind == OpKind::WB || o.kind == OpKind::dWB) && o.layers.first >= 0 &&
                      o.layers.first < m_.num_layers() && m_.narrow_weights(o.layers.first);
  if (staged) return up ? h.bf16_stage_up_bytes_per_s : h.bf16_stage_down_bytes_per_s;
  return up ? h.pinned_h2d_bytes_per_s : h.pinned_d2h_bytes_per_s;
}

void ActivityBuilder::transfer(Activity& x, const Op& o, double bytes) const {
  const auto& g = graph_;
  const bool ref = opt_.reference_bandwidths;
  const double swap_cap = ref ? mach_.bw_swap_bytes_per_s / nsim_ : 0;
  switch (o.stream) {
    case Stream::SwapIn:  // the ledger counts what crosses: the op's bytes and any extra it carries (a dWB's FP32 copy)
      set_flow(x, bytes, h2d_[z(o.device)], ref ? swap_cap : host_path_cap(o, true), TransferClass::PcieH2D,
               std::llround(bytes), core::moved_tensor(o.kind), o.device * 2);
      break;
    case Stream::SwapOut:
      set_flow(x, bytes, d2h_[z(o.device)], ref ? swap_cap : host_path_cap(o, false), TransferClass::PcieD2H,
               std::llround(bytes), core::moved_tensor(o.kind), o.device * 2 + 1);
      break;
    case Stream::P2PIn:
    case Stream::P2POut:
      throw core::ScheduleError(fmt::format("P2P op {} ({}) has no rendezvous peer", p_.op_id(x.a), p_.op_label(x.a)));
    case Stream::Cpu:
      set_flow(x, 2. * bytes, {g.host_memcpy}, ref ? mach_.bw_msg_bytes_per_s / nsim_ : 0, TransferClass::CpuMsg,
               o.bytes, core::moved_tensor(o.kind), -1);
      break;
    case Stream::Compute:
      break;  // a transfer kind on the compute stream moves nothing the engine can price
  }
}

}  // namespace native_detail
}  // namespace harmony::sim
