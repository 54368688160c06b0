// The `reference` cost model: the paper's simulator (Executor._duration and CofTask), reproduced
// term for term: static 1/N bandwidth shares, flat free time, P2P at bw_p2p, half-duplex CPU messages.
// ReferenceCostModel prices ops and packs; ReferenceEngine runs a Program with it (the Engine seam).
#pragma once

#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "sim/engine/engine.hpp"

namespace harmony::sim {

// Whether an Update runs on a GPU's memory (a kind with resident state: core::host_update is false) on a machine
// whose devices are GPUs. On a machine whose devices are host cores (compute.host_cores: harmony's CPU device) the
// device's AdamW is the host's, priced as a host Update (the profile's update time, on the shared pool).
bool gpu_update(const core::Op& op, const core::MachineSpec& machine);
// The time of a gpu_update, in both cost models (the paper's simulator has no such op): its HBM traffic (op.bytes) at
// the GPU's memory bandwidth as elementwise kernels reach it, gpu_rates.memory x gpu_rates.vector_efficiency (1 when
// not given). ScheduleError naming the fix when the machine gives no gpu_rates.memory.
double device_update_s(const core::Op& op, const core::MachineSpec& machine);

class ReferenceCostModel {
 public:
  ReferenceCostModel(const core::Model& model, const core::MachineSpec& machine) : model_(model), machine_(machine) {}
  // Duration of every op of `program`, indexed like program.ops.
  std::vector<core::TimePs> durations(const core::Program& program) const;
  // The reference's memory per GPU (indexed by GPU id; 0 for GPUs not simulated): the largest task_memory.
  std::vector<core::Bytes> memory_per_gpu(const core::Program& program) const;

  // The reference's duration of one op, in seconds, with its evaluation order.
  double duration_s(const core::Program& program, const core::Op& op) const;
  // duration_s of a compute op (FWD, REC: its layers' forward times; BWD: backward minus forward); 0 for the rest.
  double compute_s(const core::Op& op) const;
  // CofTask: the reference's memory estimate of one task (0 for UPD).
  core::Bytes task_memory(const core::TaskGraph& graph, const core::Task& task) const;
  // memory_of_pack: sum of per-layer peaks minus the inner layers' inputs.
  core::Bytes pack_memory(core::Phase phase, int u, int first, int last) const;

 private:
  const core::Model& model_;
  core::MachineSpec machine_;
};

// The reference simulator: run_timeline on ReferenceCostModel's durations. A Program without pack memory (a
// baseline's) gets its peaks from replaying its allocations and frees on the native engine's reference
// settings; the capacity is machine.search_capacity_bytes(), and a plan over it keeps its time and rank.
class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(const core::Model& model, const core::MachineSpec& machine)
      : model_(model), machine_(machine), cost_(model, machine) {}
  core::CostModelKind kind() const override { return core::CostModelKind::Reference; }
  EngineResult run(const core::Program& program) const override;
  // core::compute_chain_bound_ps at ReferenceCostModel::compute_s: run_timeline's ends are the longest chain of
  // these durations through the same edges and more
  double task_bound_s(const core::TaskGraph& graph, const std::vector<int>& ranks) const override;

 private:
  const core::Model& model_;
  core::MachineSpec machine_;
  ReferenceCostModel cost_;
};

// The reference's run without the baseline replay and the capacity: run_timeline + make_report.
core::RunReport simulate(const core::Program& program, const ReferenceCostModel& cost,
                         Timeline* timeline_out = nullptr);

}  // namespace harmony::sim
