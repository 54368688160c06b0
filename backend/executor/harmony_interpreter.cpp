// The Harmony interpreter's data flow (harmony_interpreter.hpp): construction (FlowInterpreter::analyse over its
// device tensors and host channels), device tensors by dataflow id, the host channels with their per-sample checks and
// the step's lifecycle. Its ops are FlowInterpreter's.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "backend/executor/harmony_interpreter.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::backend::detail {
namespace harmony_impl {

using core::OpKind;

HC host_chan(core::FlowKind k) {
  switch (k) {
    case core::FlowKind::HostY:
      return HC::YSwap;
    case core::FlowKind::HostYMsg:
      return HC::YMsg;
    case core::FlowKind::HostStash:
      return HC::Stash;
    case core::FlowKind::HostStashMsg:
      return HC::StashMsg;
    case core::FlowKind::HostGrad:
      return HC::DXSwap;
    default:
      throw core::InternalError(fmt::format("executor: {} is not a Harmony host channel", core::flow_kind_name(k)));
  }
}

HarmonyInterpreter::HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s,
                                       const ExecutorOptions& o)
    : FlowInterpreter(prog, std::move(d), s, o) {
  if (p.graph.plan.kind->data_parallel && static_cast<int>(p.devices.size()) != p.num_devices())
    throw BackendError(fmt::format("executor: {} Program lowered for GPU 0 only (set dp_first_gpu_only = false)",
                                   p.graph.plan.kind.name()));
  // Device tensors in versions; the host channels per sample (each read's samples resolved to their writers, and
  // refused where a writer is unordered with the reader), so a missing dependency is refused before any step.
  analyse([](const core::FlowTensor& t) { return !core::on_host(t.kind); },
          [this](const core::FlowTensor& t) { return tname(t); },
          [](const core::FlowTensor& t) { return core::on_host(t.kind); });
}

const core::FlowTensor* HarmonyInterpreter::host_in(int o) const {
  for (int id : flow(o).reads)
    if (core::on_host(tensor(id).kind)) return &tensor(id);
  return nullptr;
}

const core::FlowTensor* HarmonyInterpreter::host_out(int o) const {
  for (int id : flow(o).writes)
    if (core::on_host(tensor(id).kind)) return &tensor(id);
  return nullptr;
}

std::vector<std::pair<HC, int>> HarmonyInterpreter::chans_of(int o) const {
  std::vector<std::pair<HC, int>> r;
  for (const core::FlowTensor* t : {host_in(o), host_out(o)})
    if (t != nullptr) r.emplace_back(host_chan(t->kind), t->layer);
  return r;
}

std::set<std::pair<HC, int>> HarmonyInterpreter::all_chans() const {
  std::set<std::pair<HC, int>> r;
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    for (const auto& c : chans_of(static_cast<int>(o))) r.insert(c);
  return r;
}

Bytes HarmonyInterpreter::host_bytes() const {
  Bytes total = 0;
  for (const auto& [c, l] : all_chans()) total += chan_bytes(l);
  return total;
}

void HarmonyInterpreter::allocate_host() {
  for (const auto& [c, l] : all_chans()) {
    HostChan& h = host[{c, l}];
    h.data = D(0).alloc_host(chan_bytes(l), fmt::format("{} {}", hc_name(c), l));
    h.metered = MeteredBytes(host_meter, chan_use(c), chan_bytes(l));
  }
}

int HarmonyInterpreter::tid(int o, core::FlowKind k, int l, int s0, int n) const {
  const core::FlowTensor t{p.ops[static_cast<std::size_t>(o)].device, k, l, s0, n, -1};
  const int id = p.dataflow.find(t);
  if (id < 0)
    throw core::InternalError(fmt::format("executor: op {} uses {}, which the dataflow lacks", label(o), tname(t)));
  return id;
}

int HarmonyInterpreter::task_tid(int o, core::FlowKind k) const {
  const core::Op& op = p.ops[static_cast<std::size_t>(o)];
  const core::FlowTensor t{op.device, k, flow(o).layers.first, 0, 0, op.task};
  const int id = p.dataflow.find(t);
  if (id < 0)
    throw core::InternalError(fmt::format("executor: op {} uses {}, which the dataflow lacks", label(o), tname(t)));
  return id;
}

std::string HarmonyInterpreter::tname(const core::FlowTensor& t) const {
  if (t.device < 0) return fmt::format("{} {}", hc_name(host_chan(t.kind)), t.layer);  // a host channel
  const bool task = t.kind == core::FlowKind::W || t.kind == core::FlowKind::DW;
  return fmt::format("{} {} {} samples [{}, {})", devs[static_cast<std::size_t>(t.device)]->name(),
                     core::flow_kind_name(t.kind), task ? t.owner : t.layer, t.s0, t.s0 + t.n);
}

HostChan& HarmonyInterpreter::chan(HC c, int l) {
  HostChan& h = host[{c, l}];
  if (h.data.bytes() == 0) {  // a channel allocate_host did not foresee
    h.data = D(0).alloc_host(chan_bytes(l), fmt::format("{} {}", hc_name(c), l));
    h.metered = MeteredBytes(host_meter, chan_use(c), chan_bytes(l));
  }
  return h;
}

std::byte* HarmonyInterpreter::chan_at(HC c, int l, int s0) {
  return chan(c, l).data.as<std::byte>() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(l));
}

const void* HarmonyInterpreter::host_src(int /*o*/, int id) {  // its writers resolved when the executor was built
  const core::FlowTensor& t = tensor(id);
  return chan_at(host_chan(t.kind), t.layer, t.s0);
}

void* HarmonyInterpreter::host_dst(int /*o*/, int id, Bytes /*bytes*/) {
  const core::FlowTensor& t = tensor(id);
  return chan_at(host_chan(t.kind), t.layer, t.s0);
}

void HarmonyInterpreter::begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  in = inputs;
  tgt = targets;
  losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
  loss_written.assign(static_cast<std::size_t>(B), 0);
  store.begin_step();
  begin_updates();
  qr.begin_step();
}

double HarmonyInterpreter::end_step() {
  qr.synchronize();  // the losses' copies, the last updates' inputs, every stream-ordered free
  store.clear();
  return mean_loss();
}

}  // namespace harmony_impl

std::unique_ptr<Interpreter> make_harmony_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                      HostState& state, const ExecutorOptions& options) {
  return std::make_unique<harmony_impl::HarmonyInterpreter>(program, std::move(devices), state, options);
}

}  // namespace harmony::backend::detail
