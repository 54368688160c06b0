// What both interpreters share over a Program's dataflow, whatever its kind: the per-queue streams and events
// (QueueResources), the executor's added edges, the version analysis (FlowVersions), the step's tensor store
// (FlowStore), the groups (op_groups), and the issue of a group: ordered after its preds, a host group (ops on the
// CPU stream) waited for on the host. The ops themselves are the derived interpreter's (run_group).
#pragma once

#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_store.hpp"
#include "backend/executor/flow_versions.hpp"

namespace harmony::backend::detail {

class FlowInterpreter : public Interpreter {
 public:
  FlowInterpreter(const core::Program& program, const std::vector<Device*>& devices, const ExecutorOptions& options)
      : qr(program, devices, options), program_(program) {}

  const std::vector<std::vector<int>>& extra_deps() const override { return extra; }
  std::vector<int> group(int o) const override { return groups[static_cast<std::size_t>(o)]; }
  // Event ordering (QueueResources): the host issues a group once its queues are at most run_ahead ops ahead of their
  // devices; a host group (its ops on the CPU stream: host Updates, copies between host channels) waits on the host
  // for its preds' events, the others make their streams wait for them; each member's event is recorded after the
  // group's work (run_group).
  void run(const std::vector<int>& g) override;
  void finished(int o) override { store.finished(o); }
  void abandon_step() override { store.clear(); }
  void synchronize() override { qr.synchronize(); }

 protected:
  // The group's work (a P2P pair, a collective, or one op), enqueued on its members' streams.
  virtual void run_group(const std::vector<int>& g) = 0;
  bool frees_pending(const Device& device) override { return qr.frees_pending(device); }
  // The version analysis over the Program's dataflow and the happens-before order `anc` (its deps, queue order and
  // `extra`), and the store over it.
  void analyse_versions(const Ancestry& anc, FlowVersions::Tracked tracked, FlowVersions::Name name) {
    versions = FlowVersions(program_, anc, std::move(tracked), std::move(name));
    store = FlowStore(program_, versions, qr);
  }

  QueueResources qr;                     // per queue: its stream, events, AdamW pool
  std::vector<std::vector<int>> extra;   // per op: the executor's added edges (extra_deps)
  FlowVersions versions;                 // which version each read sees, the reads per version
  FlowStore store;                       // the step's tensor versions
  std::vector<std::vector<int>> groups;  // per op: the ops run with it (op_groups)

 private:
  const core::Program& program_;
};

}  // namespace harmony::backend::detail
