// The executor's internals, shared by its two interpreters and not part of the public API: the
// happens-before relation of a Program (deps + queue order + executor-added edges), the Interpreter
// interface (what one Program dialect does with its ops) and the ready-queue loop that runs one step.
// Harmony Programs: executor.cpp; the baselines' Programs: executor_baseline.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/executor.hpp"

namespace harmony::backend::detail {

// a "happens before" b in every execution: a path of deps, queue order and `extra` edges (extra[b]: ops b
// must also wait for) leads from a to b. Throws ScheduleViolation if the edges form a cycle.
class Ancestry {
 public:
  Ancestry(const core::Program& program, const std::vector<std::vector<int>>& extra);
  bool before(int a, int b) const {  // a == b, or a is an ancestor of b
    return a == b || ((bits_[static_cast<std::size_t>(b) * words_ + static_cast<std::size_t>(a) / 64] >>
                       (static_cast<unsigned>(a) % 64)) &
                      1U) != 0;
  }

 private:
  std::size_t words_ = 0;
  std::vector<std::uint64_t> bits_;  // op-major: words_ per op
};

// "t3 BWD L2 mb0 u1 (3.0.0.Compute.BWD)": the label and the reference id, for messages.
std::string op_name(const core::Program& program, int op);

// One Program dialect. run_step calls begin_step, then run() per ready group and finished() per op of it,
// then end_step.
class Interpreter {
 public:
  Interpreter() = default;
  virtual ~Interpreter() = default;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Ops the executor makes `op` wait for beyond its deps (per op; may be empty).
  virtual const std::vector<std::vector<int>>& extra_deps() const = 0;
  virtual void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) = 0;
  // The ops that run together with `op` (a P2P pair, a collective), `op` included, in run order.
  virtual std::vector<int> group(int op) const = 0;
  virtual void run(const std::vector<int>& group) = 0;
  virtual void finished(int op) = 0;  // after every op of a group ran: release what it was the last reader of
  virtual double end_step() = 0;      // the mean loss; every device tensor released
  virtual void synchronize() = 0;     // waits for every device stream
};

// One training step over the Program's queues on the calling thread: a queue's head runs when it and every
// op of its group head their queues and have their deps (and extra deps) done. Per op begin/end times.
// ScheduleViolation when no op can start.
StepResult run_step(const core::Program& program, Interpreter& interpreter);

// Harmony-PP / Harmony-DP Programs (core::lower_harmony, every replica lowered).
std::unique_ptr<Interpreter> make_harmony_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                      HostState& state, const ExecutorOptions& options);
// The baselines' Programs (core::lower_baseline: dp-swap, pp-swap, zero-infinity, l2l).
std::unique_ptr<Interpreter> make_baseline_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                       HostState& state, const ExecutorOptions& options);

}  // namespace harmony::backend::detail
