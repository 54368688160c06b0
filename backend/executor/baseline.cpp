// The baseline interpreter (baseline_interpreter.hpp): construction, the step's lifecycle, the dispatch of a group,
// resident state, and tensors at run time; its static analysis is in baseline_analysis.cpp, its ops in
// baseline_ops.cpp.
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
  R_ = m.num_layers();
  N_ = p.num_devices();
  pp_ = !p.graph.plan.kind->data_parallel;  // pp-swap
  resident_ = p.graph.plan.kind->resident_state;
  analyse();
  if (resident_) make_states();
}

void BaselineInterpreter::begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  in = inputs;
  tgt = targets;
  losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
  loss_written.assign(static_cast<std::size_t>(B), 0);
  store.begin_step();
  written_.clear();
  brought_.assign(p.ops.size(), 0);
  updated_.assign(static_cast<std::size_t>(R_), 0);
  gathered_.assign(static_cast<std::size_t>(R_), 0);
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

Tensor& BaselineInterpreter::get(int o, const Key& k) { return store.get(o, p.dataflow.find(k)); }

Tensor& BaselineInterpreter::put(int o, const Key& k, Bytes bytes) { return make(o, p.dataflow.find(k), bytes); }

}  // namespace baseline_impl

std::unique_ptr<Interpreter> make_baseline_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                       HostState& state, const ExecutorOptions& options) {
  return std::make_unique<baseline_impl::BaselineInterpreter>(program, std::move(devices), state, options);
}

}  // namespace harmony::backend::detail
