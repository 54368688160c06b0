// Bottleneck report of one simulated Program (native cost model): the critical path through the ops, what
// each GPU's compute stream spends the iteration on (computing, waiting for swaps, for peers, for the CPU,
// idle), and which resource binds — found by re-simulating with each resource twice as fast.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/program/program.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim {

// Where a GPU's compute stream spends [0, iteration end]. The parts add up to the iteration time.
struct GpuBreakdown {
  int gpu = 0;
  double compute_s = 0;    // FWD / REC / BWD running
  double wait_swap_s = 0;  // the next compute op waited for a host<->GPU transfer (WB, X, sX, dY, Y, dX, dWB)
  double wait_peer_s = 0;  // ... for a GPU-to-GPU transfer or a collective (P2P X/dY, ARD, AG, RS)
  double wait_cpu_s = 0;   // ... for the CPU (an optimizer update or a CPU message)
  double idle_s = 0;       // nothing to wait for (other ops of the stream, DEL) or after its last compute op
};

// One resource made twice as fast (or large), the plan re-simulated.
struct WhatIf {
  std::string resource;  // "compute", "host links", "gpu-gpu links", "cpu optimizer", "host memcpy", "memory"
  std::string change;    // what was doubled, in words
  double iteration_time_s = 0;
  bool feasible = true;  // the plan fits with this change
  double speedup = 1;    // baseline time / this time
};

struct CriticalStep {
  int op = 0;
  double wait_s = 0;  // from the gating predecessor's end to this op's begin (copy engine or rendezvous)
  double run_s = 0;   // this op's duration
};

struct Bottleneck {
  double iteration_time_s = 0;
  bool feasible = true;
  std::vector<CriticalStep> critical_path;  // first to last op; each op's predecessor ended last among its gates
  double path_compute_s = 0, path_transfer_s = 0, path_cpu_s = 0, path_wait_s = 0, path_other_s = 0;
  std::vector<GpuBreakdown> per_gpu;
  std::vector<WhatIf> what_if;  // largest speedup first (ties: the order above)
  std::string binding;          // the resource of what_if.front() ("memory" when the plan does not fit)
};

// Analyses `result` (run_native of `program` with `options`) and re-simulates five variants of the machine
// and model (compute, host links, GPU-to-GPU links, CPU optimizer, host memcpy: each 2x) plus, for an
// infeasible plan, 2x GPU memory. Deterministic.
Bottleneck analyze_bottleneck(const core::Program& program, const core::Model& model, const core::MachineSpec& machine,
                              const NativeResult& result, const NativeOptions& options = {});

// run_native of `program` and analyze_bottleneck of it, the base run at once with the what-ifs (the "memory" one
// after it, when the plan does not fit). The same result.
Bottleneck simulate_bottleneck(const core::Program& program, const core::Model& model, const core::MachineSpec& machine,
                               const NativeOptions& options = {});

nlohmann::json bottleneck_json(const core::Program& program, const Bottleneck& b);
// A few lines for the table output: the binding resource, the what-if table, the per-GPU breakdown and the
// critical path's make-up.
std::string bottleneck_text(const core::Program& program, const Bottleneck& b);

}  // namespace harmony::sim
