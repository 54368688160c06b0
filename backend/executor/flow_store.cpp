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

FlowData& FlowStore::put(int o, int id, FlowData data) {
  const auto& w = v_->writes(o);
  if (std::find(w.begin(), w.end(), id) == w.end())
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

void FlowStore::finished(int o) {
  for (const FlowVersion& v : v_->reads(o)) {
    auto it = left_.find(v);
    if (it != left_.end() && --it->second == 0) drop(v);
  }
  for (const int id : v_->writes(o))
    if (v_->readers(FlowVersion{id, o}) == 0) drop(FlowVersion{id, o});
}

void FlowStore::drop(const FlowVersion& v) {
  auto it = store_.find(v);
  if (it == store_.end()) return;
  const std::vector<int> users = std::move(it->second.users);
  qr_->retire(p_->dataflow.tensor(v.tensor).device, users, std::make_shared<FlowData>(std::move(it->second)));
  store_.erase(it);
}

}  // namespace harmony::backend::detail
