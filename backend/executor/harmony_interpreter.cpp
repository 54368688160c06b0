// The Harmony interpreter (harmony_interpreter.hpp): construction (FlowInterpreter::analyse over its device tensors
// and its host channels, resolved per sample), its tensors' names and the step's lifecycle. Its ops and tensors are
// FlowInterpreter's.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "backend/executor/harmony_interpreter.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::backend::detail {
namespace harmony_impl {

using core::OpKind;

HarmonyInterpreter::HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s,
                                       const ExecutorOptions& o)
    : FlowInterpreter(prog, std::move(d), s, o) {
  if (p.graph.plan.kind->data_parallel && static_cast<int>(p.devices.size()) != p.num_devices())
    throw BackendError(fmt::format("executor: {} Program lowered for GPU 0 only (set dp_first_gpu_only = false)",
                                   p.graph.plan.kind.name()));
  // Device tensors in versions; the host channels per sample (each read's samples resolved to their writers, and
  // refused where a writer is unordered with the reader), so a missing dependency is refused before any step.
  analyse([](const core::FlowTensor& t) { return !ranged(t); }, [this](const core::FlowTensor& t) { return tname(t); },
          [](const core::FlowTensor& t) { return ranged(t); });
}

std::string HarmonyInterpreter::tname(const core::FlowTensor& t) const {
  if (t.device < 0) return fmt::format("{} {}", channel_name(t.kind), t.layer);  // a host channel
  const bool task = t.kind == core::FlowKind::W || t.kind == core::FlowKind::DW;
  return fmt::format("{} {} {} samples [{}, {})", devs[static_cast<std::size_t>(t.device)]->name(),
                     core::flow_kind_name(t.kind), task ? t.owner : t.layer, t.s0, t.s0 + t.n);
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
