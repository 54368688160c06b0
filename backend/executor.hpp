// The real executor, v1: runs a core::Program — Harmony-PP or Harmony-DP (lower_harmony, every GPU lowered) or a
// baseline (lower_baseline: dp-swap, pp-swap, zero-infinity, l2l) — for one training step with real tensors on N
// devices: weights swapped in per pack or layer, forwards with stashes, recompute + backward per microbatch,
// activations and gradients moved between packs, stages and replicas, AdamW on the host. Ops run one at a time on
// the host thread (no stream overlap yet); every tensor read is checked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/device.hpp"
#include "backend/model/state.hpp"
#include "core/program.hpp"
#include "core/units.hpp"

namespace harmony::backend {

// A Program that reads a tensor before (or without depending on) the op that produces it, or that cannot
// make progress. what() names the ops involved (Program::op_label).
class ScheduleViolation : public BackendError {
 public:
  using BackendError::BackendError;
};

struct ExecutorOptions {
  int seq_len = 0;  // T; the minibatch B is the Program's plan.minibatch
  AdamWConfig adamw;
};

struct StepResult {
  double loss = 0.0;                // mean cross-entropy over the B*T tokens (summed in double, token order)
  std::vector<core::TimePs> begin;  // per op (Program::ops order), ps since the step began (steady clock)
  std::vector<core::TimePs> end;    // for core::write_chrome_trace
};

class Executor {
 public:
  // devices[g] runs the Program's GPU g. `program` and `state` must outlive the executor. BackendError for a
  // Program that does not match the devices or the model; ScheduleViolation for a baseline Program whose data
  // flow its dependencies do not order (checked here, before any step; Harmony Programs are checked per read).
  Executor(const core::Program& program, std::vector<Device*> devices, HostState& state,
           const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One step: inputs and targets are B*T ids, row-major (B, T). Leaves the updated weights in state.
  StepResult step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace harmony::backend
