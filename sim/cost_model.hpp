// The seam between the simulator and its cost models: a cost model prices every op of a Program
// (integer picoseconds) and estimates per-GPU memory. `reference` reproduces the paper's simulator.
#pragma once

#include <string>
#include <vector>

#include "core/program/program.hpp"

namespace harmony::sim {

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual std::string name() const = 0;
  // Duration of every op of `program`, indexed like program.ops.
  virtual std::vector<core::TimePs> durations(const core::Program& program) const = 0;
  // Peak memory figure per GPU (indexed by GPU id; 0 for GPUs not simulated).
  virtual std::vector<core::Bytes> memory_per_gpu(const core::Program& program) const = 0;
};

}  // namespace harmony::sim
