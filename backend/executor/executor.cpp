// The Executor (executor.hpp): its checks of a Program against the model and devices, its interpreter, the
// pinned-memory pre-flight, and the step that drives a step loop and drains a failed step. The loops: step_loops.cpp;
// per-queue streams and event ordering: queue_resources.cpp; bf16 staging: staging.cpp; the interpreter, one for
// every kind: flow_interpreter.hpp (flow_versions, flow_store, op_groups; its ops in the flow_*.cpp files).
#include "backend/executor/executor.hpp"

#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"
#include "backend/model/describe.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/program_graph.hpp"
#include "core/program/task_graph.hpp"

namespace harmony::backend {

struct Executor::Impl {
  const core::Program& p;
  int B = 0;
  int T = 0;
  bool concurrent = true;
  std::vector<std::shared_ptr<void>> pins;  // HostState's weights and gradients, where the devices pin
  std::unique_ptr<detail::Interpreter> interpreter;
  // Concurrent steps: one persistent thread per queue (made at the first step; idle between steps). Declared
  // last, so destroyed first: its threads are joined before the interpreter goes.
  std::unique_ptr<detail::WorkerPool> workers = nullptr;
};

namespace {
// A kind whose plans have packs (PlanKindSpec::packs: Harmony's) lowers them to a task graph, the others to ops with
// pseudo task ids: a Program whose task graph contradicts its kind is malformed and refused, not guessed at.
void check_tasks(const core::Program& p) {
  const bool packs = p.graph.plan.kind->packs;
  const bool no_tasks = p.graph.tasks.empty() && std::all_of(p.graph.rank_tasks.begin(), p.graph.rank_tasks.end(),
                                                             [](const auto& r) { return r.empty(); });
  if (packs == no_tasks)
    throw BackendError(fmt::format("executor: a {} Program {} Harmony tasks: its kind and its task graph disagree",
                                   p.graph.plan.kind.name(), packs ? "without" : "with"));
}
}  // namespace

Executor::Executor(const core::Program& program, std::vector<Device*> devices, HostState& state,
                   const ExecutorOptions& options) {
  const Gpt2& m = state.model();
  if (static_cast<int>(devices.size()) != program.num_devices())
    throw BackendError(
        fmt::format("executor: {} devices for a Program of {} GPUs", devices.size(), program.num_devices()));
  if (program.graph.num_layers != m.num_layers())
    throw BackendError(
        fmt::format("executor: Program has {} layers, the model {}", program.graph.num_layers, m.num_layers()));
  if (options.seq_len < 1 || options.seq_len > m.config().max_seq_len)
    throw BackendError(
        fmt::format("executor: sequence length {} outside 1..{}", options.seq_len, m.config().max_seq_len));
  core::validate_program(program);
  if (const core::PlanKind kind = program.graph.plan.kind; !kind->trains)
    throw BackendError(
        fmt::format("executor: plan kind {} is priced by harmony-sim only; the executor does not run its Programs "
                    "(docs/baselines.md#{})",
                    kind.name(), kind.name()));
  if (Communicator* c = options.communicator) {
    if (c->size() != static_cast<int>(devices.size()))
      throw BackendError(
          fmt::format("executor: the communicator has {} ranks for {} devices", c->size(), devices.size()));
    for (int r = 0; r < c->size(); ++r)
      if (&c->device(r) != devices[static_cast<std::size_t>(r)])
        throw BackendError(fmt::format("executor: the communicator's rank {} is {}, not device {} ({})", r,
                                       c->device(r).name(), r, devices[static_cast<std::size_t>(r)]->name()));
  }
  Device& first = *devices.at(0);
  check_tasks(program);
  auto interpreter = detail::make_interpreter(program, devices, state, options);
  // Pinned host memory (CUDA; nothing on the CPU device): HostState's weights (every WB reads them) and gradients
  // (every dWB writes them), the interpreter's stash/swap channels and its bf16 staging, checked once as a total so a
  // plan that cannot pin is refused with the numbers before anything is pinned. The AdamW moments never cross the bus:
  // pinning them would only shrink the budget. All through devices[0]: registrations are portable to every GPU.
  // A kind with resident state moves its weights and gradients once, at construction: nothing of the HostState pinned.
  const bool resident = program.graph.plan.kind->resident_state;
  Bytes state_bytes = 0;
  for (int l = 0; l < m.num_layers() && !resident; ++l) state_bytes += 2 * m.param_floats(l) * Bytes{sizeof(float)};
  first.check_pinnable(state_bytes + interpreter->host_bytes() + detail::Interpreter::staging_bytes(program, options),
                       "the host weights, gradients, stash/swap buffers and bf16 staging", options.pinned_limit);
  std::vector<std::shared_ptr<void>> pins;
  for (int l = 0; l < m.num_layers() && !resident; ++l) {
    const auto w = state.weights(l), g = state.grads(l);
    pins.push_back(first.pin_host(w.data(), Bytes(w.size_bytes()), fmt::format("the host weights of layer {}", l)));
    pins.push_back(first.pin_host(g.data(), Bytes(g.size_bytes()), fmt::format("the host gradients of layer {}", l)));
  }
  interpreter->allocate_host();
  // The HostState blocks the steps read and write, for as long as the executor lives (HostState's own layout: every
  // layer's weights and gradients, the head's tied lm_head included, and the AdamW moments of what a layer owns). A
  // resident kind's steps touch none of them (harmony-run keeps the HostState for loading and checkpoints only).
  for (int l = 0; l < m.num_layers() && !resident; ++l) {
    interpreter->host_meter.add(detail::HostUse::MasterWeights, Bytes(state.weights(l).size_bytes()));
    interpreter->host_meter.add(detail::HostUse::Gradients, Bytes(state.grads(l).size_bytes()));
    interpreter->host_meter.add(detail::HostUse::OptimizerState,
                                Bytes(state.exp_avg(l).size_bytes() + state.exp_avg_sq(l).size_bytes()));
  }
  impl_ = new Impl{program,         program.graph.plan.minibatch, options.seq_len, options.concurrent,
                   std::move(pins), std::move(interpreter),       nullptr};
}

Executor::~Executor() {
  try {
    impl_->interpreter->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  delete impl_;
}

void Executor::sync_state() { impl_->interpreter->sync_host_state(); }

ExecutorHostMemory Executor::host_memory() const { return impl_->interpreter->host_meter.read(); }

StepResult Executor::step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  const auto bt = static_cast<std::size_t>(impl_->B) * static_cast<std::size_t>(impl_->T);
  if (inputs.size() != bt || targets.size() != bt)
    throw BackendError(
        fmt::format("executor: expected {} inputs and targets, got {} and {}", bt, inputs.size(), targets.size()));
  if (impl_->concurrent && !impl_->workers)
    impl_->workers = std::make_unique<detail::WorkerPool>(impl_->p.queues.size());
  detail::Interpreter& it = *impl_->interpreter;
  (void)it.take_nonfinite();  // a failed step's report is not this step's
  it.begin_step(inputs, targets);
  StepResult res;
  try {
    res = impl_->concurrent ? detail::run_step_concurrent(impl_->p, it, impl_->workers.get())
                            : detail::run_step(impl_->p, it);
    res.loss = it.end_step();  // waits for every stream: a device error of the step's last work is thrown here
    res.nonfinite_gradient = it.take_nonfinite();
  } catch (...) {
    // Drain what the failed step enqueued, then free its device tensors, so the devices are empty again.
    try {
      it.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the step's own error is the one to report
    }
    it.abandon_step();
    throw;
  }
  return res;
}

}  // namespace harmony::backend
