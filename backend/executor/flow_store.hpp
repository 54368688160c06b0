// The step's tensors as the interpreter keeps them: one entry per version of a dataflow tensor (flow_versions.hpp),
// made by the op that writes it, handed to the ops that read it, updated in place by its last reader, and freed
// after its last read (stream-ordered, QueueResources::retire). No plan kind is named here.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_versions.hpp"

namespace harmony::backend::detail {

// One version's memory: device memory (buf), host memory (mem, on the host meter), or, for a ranged tensor, its
// samples in its channel's buffer (view: kept across steps, FlowInterpreter::channel_at); and the ops whose work used
// it this step (it is freed after their events).
struct FlowData {
  Buffer buf;
  std::vector<std::byte> mem;
  void* view = nullptr;
  MeteredBytes metered;
  std::vector<int> users;
  void* data() {
    if (view != nullptr) return view;
    return buf ? buf.data() : static_cast<void*>(mem.data());
  }
};

class FlowStore {
 public:
  FlowStore() = default;
  FlowStore(const core::Program& program, const FlowVersions& versions, QueueResources& queues)
      : p_(&program), v_(&versions), qr_(&queues) {}

  // A new step: nothing stored, every version's reads still to run.
  void begin_step();
  // Destroys every stored version now (after the streams have run: end_step, abandon_step).
  void clear() { store_.clear(); }

  // The version of tensor `id` op o reads (o joins its users). InternalError where o does not read id, or the
  // version is gone.
  FlowData& get(int o, int id);
  // The version holding a run of samples op o reads of a ranged tensor (FlowVersions::sample_reads; o joins its
  // users). InternalError where the version is gone.
  FlowData& get_run(int o, const FlowVersions::SampleRun& run);
  // Op o's new version of `id` (o joins its users). InternalError where o does not write id.
  FlowData& put(int o, int id, FlowData data);
  // Version v if it is stored, else nullptr: for a read the dataflow cannot name (a tied model's second gradient, which
  // the interpreter checked is read after by an op that does name it, so it is not freed before).
  FlowData* peek(const FlowVersion& v) {
    const auto it = store_.find(v);
    return it == store_.end() ? nullptr : &it->second;
  }
  // Whether op o is the last reader of the version of `id` it reads.
  bool last_reader(int o, int id) const;
  // Whether op o may overwrite the version of `id` it reads: o is its last reader. Then o's stream waits for the
  // events of the version's other users (readers on other streams whose work may still be queued: o is the last to
  // run on the host, not necessarily on the devices).
  bool writable(int o, int id);
  // Op o reads `id` and writes its next version: when o is the last reader of the old version, that version becomes
  // o's in place (o's stream waits for the events of its other users: readers on other streams whose work may still
  // be queued) and is returned; otherwise nullptr (the caller puts a new version and copies).
  FlowData* take(int o, int id);
  // After op o ran: drops the versions whose last read it was (a ranged read: once per sample run), and the versions
  // it wrote that nobody reads.
  void finished(int o);
  // Drops the versions op o's frees name (FlowVersions::freed) that are still stored (DEL).
  void drop_freed(int o) {
    for (const FlowVersion& v : v_->freed(o)) drop(v);
  }

 private:
  void drop(const FlowVersion& v);
  void count_down(const FlowVersion& v);
  int version(int o, int id) const;  // the producer of the version of id that o reads, or -1
  std::string label(int o) const { return op_name(*p_, o); }

  const core::Program* p_ = nullptr;
  const FlowVersions* v_ = nullptr;
  QueueResources* qr_ = nullptr;
  std::map<FlowVersion, FlowData> store_;
  std::map<FlowVersion, int> left_;  // per version: reads still to run this step
};

}  // namespace harmony::backend::detail
