// The baseline interpreter's class (the swapping kinds' Programs, ExecutorDialect::Swapping: dp-swap, pp-swap,
// zero-infinity, l2l, lohan), private to its three files: baseline.cpp (construction, the step's lifecycle, resident
// state, tensors at run time), baseline_analysis.cpp (the Program's dataflow resolved to versions and checked when
// the executor is built) and baseline_ops.cpp (the ops).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_interpreter.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/device_state.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail::baseline_impl {

// Tensors as the Program's dataflow names them (core/program/dataflow.hpp): a kind (TK), and a Key per device, kind,
// layer and samples.
using TK = core::FlowKind;
using Key = core::FlowTensor;
using core::on_host;
inline const char* tk_name(TK k) { return core::flow_kind_name(k); }

using Tensor = FlowData;  // one version of a tensor (flow_store.hpp)

// The executor's interpreter of the swapping kinds' Programs (ExecutorDialect::Swapping: dp-swap, pp-swap,
// zero-infinity, l2l, lohan): per-layer ops with pseudo task ids and no Harmony tasks. Tensors are versioned by the op
// that produced them; which version an op reads (the latest producer among its ancestors) and every host gradient and
// weight an Update touches are checked when the executor is built, so a missing dependency is refused before any step.
// Ops of different queues run on their own streams and worker threads (detail.hpp's lock discipline). A kind with
// resident state (PlanKindSpec::resident_state: resident) keeps its weights, gradients and AdamW state in one
// DeviceState per device across steps instead: its FWD/BWD read them there, its ARD sums them in place, and its
// Update runs AdamW on the device; sync_host_state() copies them back into the HostState (FlowInterpreter's).
class BaselineInterpreter final : public FlowInterpreter {
 public:
  BaselineInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o);

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override;

  double end_step() override;

 private:
  std::int64_t floats(int l) const { return m.param_floats(l); }

  std::string tname(const Key& k) const;

  // ---------------------------------------------------------------------------------------------------------
  // Static analysis: the Program's dataflow (what every op reads, writes and frees) resolved to versions (which
  // version each read sees), the groups, the checks.

  void analyse();

  // Which dWB ops bring the gradient an Update(l) on device `dev` uses: its own replica's when the gradient was
  // all-reduced on the GPUs (ARD: every replica's process holds the sum), else every GPU's (l2l's parameter
  // server adds the N gradients; zero-infinity's ranks bring disjoint shards).
  std::vector<int> grad_sources(int l, int dev) const;

  // The executor-added edges. A layer has one host gradient (HostState::grads), as harmony-sim's host account has it
  // (sim::accumulate_bounce_bytes makes the same choices): its dWBs write it (writes_host_), those whose elements
  // overlap one after another in (device, queue) order (each waits for the previous one's event). A replicated
  // (all-reduced) gradient is written by the lowest replica's dWBs alone; the other replicas' (the same sum) land in
  // their bounce buffers, unused, and wait for nobody (ordering them would keep their device gradients longer); the
  // other replicas' Updates wait for the writer's. A sharded gradient's ranks write their own shards. The first dWB of
  // a device's replicated or sharded gradient, or of a layer's, copies; the later ones add through the queue's bounce
  // buffer (grad_to_host): the sums of the per-process sums this replaced, in the same order, to the bit. The tie:
  // Update(0) also waits for the head's gradient (core::Model cannot express it).
  void build_update_edges();

  // ---------------------------------------------------------------------------------------------------------
  // Resident state (PlanKindSpec::resident_state).

  // W and DW of a resident kind live in the DeviceState, not in the store (no versions, no producers).
  static bool in_state(TK k) { return k == TK::W || k == TK::DW; }

  // A resident Program moves no weights or gradients to or from the host, and on every device updates each layer with
  // parameters exactly once, on the device (not on the CPU), after every op of that device that reads the layer's
  // weights or adds to its gradient (layer 0's also after the head's: the tied lm_head gradient joins wte's update).
  void check_resident_updates(const Ancestry& anc) const;

  // Every Update(l) comes after the dWB ops its gradient needs (grad_sources), and after every WB that reads the
  // host weights it overwrites (layer l; layer 0 also rewrites the head's tied lm_head). Every layer is updated.
  void check_updates(const Ancestry& anc) const;

  // ---------------------------------------------------------------------------------------------------------
  // Tensors at run time.

  Tensor& get(int o, const Key& k);
  Tensor& put(int o, const Key& k, Bytes bytes);

  // ---------------------------------------------------------------------------------------------------------
  // Ops.

  void run_op(int o) override;

  // dWB: the gradient (zero-infinity: this rank's shard) into the layer's host gradient (build_update_edges).
  void grad_to_host(int o);

  // Checks that every dWB an Update on `dev` needs for layer l (grad_sources) brought its gradient this step.
  void gather_grad(int o, int l, int dev);

  // Update(l): AdamW on the host master copy (docs/backend.md: the tie's two gradients summed by layer 0). The
  // replicas' Updates of one layer (dp-swap) see the same all-reduced gradient: the shared master is updated once.
  //
  // Each layer's host gradient is gathered once per step (every Update that gathers it sees the same dWBs done:
  // the replicas' sums are equal, the other sources the same), so an Update running unlocked reads it while no
  // other op writes it: the AdamW of different layers (and the tie's lm_head) overlaps safely.
  void host_update(int o);

  int R_ = 0, N_ = 0;
  bool pp_ = false;       // pp-swap: every stage sees all samples; else rank r owns samples [r D/N, (r+1) D/N)
  bool sharded_ = false;  // zero-infinity with N > 1: WB brings a shard, AG gathers, RS reduce-scatters
  std::vector<std::vector<int>> dwb_, wb_;  // per layer
  std::vector<char> replicated_;            // per layer: the gradient is all-reduced on the GPUs (ARD)
  bool resident_ = false;  // PlanKindSpec::resident_state: W, DW and AdamW state in FlowInterpreter::states
  // per step
  // Per queue (a device's dWBs are all on its swap-out queue): where a dWB that adds to a host gradient lands
  // first, as large as its largest such dWB; kept across steps (pinned in a real system: one per process).
  struct Bounce {
    std::vector<float> floats;
    MeteredBytes metered;  // staging, on the host meter
  };
  std::map<std::size_t, Bounce> bounce_;
  std::vector<char> writes_host_;             // per op: a dWB that writes the host gradient (build_update_edges)
  std::vector<std::vector<int>> host_edges_;  // per op: the edges ordering those writes (in extra after the checks)
  std::set<std::pair<int, int>> written_;     // (layer, device or -1): a dWB wrote it this step (grad_to_host)
  std::vector<char> brought_;                 // per op: the dWB ran this step
  std::vector<char> updated_;
  std::vector<char> gathered_;  // per layer: HostState::grads holds this step's gradient (gather_grad ran)
};

}  // namespace harmony::backend::detail::baseline_impl
