// The baseline interpreter (baseline_interpreter.hpp): construction (FlowInterpreter::analyse over its tensors), the
// step's lifecycle and its tensors' names; its ops are FlowInterpreter's.
#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "backend/executor/baseline_interpreter.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::backend::detail {
namespace baseline_impl {

using core::OpKind;

BaselineInterpreter::BaselineInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s,
                                         const ExecutorOptions& o)
    : FlowInterpreter(prog, std::move(d), s, o) {
  // Which version each read sees (flow_versions.hpp); a resident kind's W and DW are the DeviceState's, ordered by
  // check_resident_updates.
  const bool resident = p.graph.plan.kind->resident_state;
  analyse([resident](const Key& k) { return !(resident && in_state(k.kind)); },
          [this](const Key& k) { return tname(k); });
  if (resident) make_states();
}

void BaselineInterpreter::begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  in = inputs;
  tgt = targets;
  losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
  loss_written.assign(static_cast<std::size_t>(B), 0);
  store.begin_step();
  begin_updates();
  qr.begin_step();
  zero_state_grads();  // resident: every BWD adds into the device gradient
}

double BaselineInterpreter::end_step() {
  qr.synchronize();  // the losses' copies, every stream-ordered free
  store.clear();
  const double loss = mean_loss();
  note_state_nonfinite();
  return loss;
}

std::string BaselineInterpreter::tname(const Key& k) const {
  const std::string dev = devs[static_cast<std::size_t>(k.device)]->name();
  const std::string where = on_host(k.kind) ? "the host of " + dev : dev;
  if (k.n == 0) return fmt::format("{} {} of layer {}", where, tk_name(k.kind), k.layer);
  return fmt::format("{} {} of layer {} samples [{}, {})", where, tk_name(k.kind), k.layer, k.s0, k.s0 + k.n);
}

}  // namespace baseline_impl

std::unique_ptr<Interpreter> make_baseline_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                       HostState& state, const ExecutorOptions& options) {
  return std::make_unique<baseline_impl::BaselineInterpreter>(program, std::move(devices), state, options);
}

}  // namespace harmony::backend::detail
