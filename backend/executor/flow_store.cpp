// FlowStore (flow_store.hpp): the step's tensor versions, from their writer to their last reader.
#include "backend/executor/flow_store.hpp"

#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/format.h>

namespace harmony::backend::detail {

void FlowStore::begin_step() {
  store_.clear();
  left_ = v_->reader_counts();
}

int FlowStore::version(int o, int id) const {
  int producer = -1;
  for (const FlowVersion& v : v_->reads(o))
    if (v.tensor == id) producer = v.producer;
  return producer;
}

FlowData& FlowStore::get(int o, int id) {
  const int producer = version(o, id);
  if (producer < 0)
    throw core::InternalError(
        fmt::format("executor: op {} reads {}, which it does not declare", label(o), v_->name(id)));
  auto it = store_.find(FlowVersion{id, producer});
  if (it == store_.end())
    throw core::InternalError(
        fmt::format("executor: op {} reads {} of op {}, which is gone", label(o), v_->name(id), label(producer)));
  it->second.users.push_back(o);
  return it->second;
}

FlowData& FlowStore::get_run(int o, const FlowVersions::SampleRun& run) {
  auto it = store_.find(FlowVersion{run.source, run.producer});
  if (it == store_.end())
    throw core::InternalError(fmt::format("executor: op {} reads {} samples [{}, {}) of op {}, which are gone",
                                          label(o), v_->name(run.tensor), run.s0, run.s0 + run.n, label(run.producer)));
  it->second.users.push_back(o);
  return it->second;
}

FlowData& FlowStore::put(int o, int id, FlowData data) {
  const auto& w = v_->writes(o);
  const auto& rw = v_->ranged_writes(o);
  if (std::find(w.begin(), w.end(), id) == w.end() && std::find(rw.begin(), rw.end(), id) == rw.end())
    throw core::InternalError(
        fmt::format("executor: op {} writes {}, which it does not declare", label(o), v_->name(id)));
  data.users.push_back(o);
  return store_[FlowVersion{id, o}] = std::move(data);
}

bool FlowStore::last_reader(int o, int id) const { return left_.at(FlowVersion{id, version(o, id)}) == 1; }

bool FlowStore::writable(int o, int id) {
  if (!last_reader(o, id)) return false;
  Stream& s = qr_->stream(o);
  for (const int u : store_.at(FlowVersion{id, version(o, id)}).users)
    if (&qr_->stream(u) != &s) s.wait(qr_->event(u));
  return true;
}

FlowData* FlowStore::take(int o, int id) {
  (void)get(o, id);
  if (!writable(o, id)) return nullptr;
  auto node = store_.extract(FlowVersion{id, version(o, id)});
  node.key() = FlowVersion{id, o};
  return &store_.insert(std::move(node)).position->second;
}

void FlowStore::count_down(const FlowVersion& v) {
  auto it = left_.find(v);
  if (it != left_.end() && --it->second == 0) drop(v);
}

void FlowStore::finished(int o) {
  for (const FlowVersion& v : v_->reads(o)) count_down(v);
  for (const FlowVersions::SampleRun& r : v_->sample_reads(o)) count_down(FlowVersion{r.source, r.producer});
  for (const std::vector<int>* ws : {&v_->writes(o), &v_->ranged_writes(o)})
    for (const int id : *ws)
      if (v_->readers(FlowVersion{id, o}) == 0) drop(FlowVersion{id, o});
}

void FlowStore::drop(const FlowVersion& v) {
  auto it = store_.find(v);
  if (it == store_.end()) return;
  if (it->second.view != nullptr) {  // its channel's memory, kept across steps: nothing to free
    store_.erase(it);
    return;
  }
  const std::vector<int> users = std::move(it->second.users);
  qr_->retire(p_->dataflow.tensor(v.tensor).device, users, std::make_shared<FlowData>(std::move(it->second)));
  store_.erase(it);
}

}  // namespace harmony::backend::detail
