// The `reference` cost model: the paper's simulator (Executor._duration and CofTask), reproduced
// term for term: static 1/N bandwidth shares, flat free time, P2P at bw_p2p, half-duplex CPU messages.
#pragma once

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "sim/cost_model.hpp"

namespace harmony::sim {

class ReferenceCostModel final : public CostModel {
 public:
  ReferenceCostModel(const core::Model& model, const core::MachineSpec& machine) : model_(model), machine_(machine) {}
  std::string name() const override { return "reference"; }
  std::vector<core::TimePs> durations(const core::Program& program) const override;
  std::vector<core::Bytes> memory_per_gpu(const core::Program& program) const override;

  // The reference's duration of one op, in seconds, with its evaluation order.
  double duration_s(const core::Program& program, const core::Op& op) const;
  // CofTask: the reference's memory estimate of one task (0 for UPD).
  core::Bytes task_memory(const core::TaskGraph& graph, const core::Task& task) const;
  // memory_of_pack: sum of per-layer peaks minus the inner layers' inputs.
  core::Bytes pack_memory(core::Phase phase, int u, int first, int last) const;

 private:
  const core::Model& model_;
  core::MachineSpec machine_;
};

}  // namespace harmony::sim
