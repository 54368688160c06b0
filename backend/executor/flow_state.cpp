// FlowInterpreter's resident state (flow_interpreter.hpp): for a Program that keeps its weights, gradients and AdamW
// state on the devices across steps (a kind with resident state), one DeviceState per device — made and uploaded
// once, read by the compute ops and the all-reduce, zeroed, updated and checked per step, downloaded on request; or,
// sharded (fsdp, zero3, zero2 over N > 1 GPUs), one ShardState per device (flow_shard_ops.cpp) through the same entry
// points (zero2's with the whole working weights its compute ops read).
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "backend/executor/flow_interpreter.hpp"

namespace harmony::backend::detail {

void FlowInterpreter::make_states() {
  state_op.assign(static_cast<std::size_t>(p.num_devices()), -1);
  for (const core::OpQueue& q : p.queues)
    if (q.stream == core::Stream::Compute && !q.ops.empty()) state_op[static_cast<std::size_t>(q.device)] = q.ops[0];
  for (int d = 0; d < p.num_devices(); ++d)
    if (state_op[static_cast<std::size_t>(d)] < 0)
      throw BackendError(fmt::format("executor: the resident Program has no compute ops on GPU {}", d));
  if (layout.sharded) {
    make_shards();
    return;
  }
  for (int d = 0; d < p.num_devices(); ++d) {
    states.push_back(std::make_unique<DeviceState>(D(d), state_stream(d), m, dt));
    states.back()->upload(state_stream(d), st);
  }
}

const void* FlowInterpreter::state_weights(int o) {
  if (layout.whole_weights) return shards[static_cast<std::size_t>(at(o).device)]->whole_weights(at(o).layers.first);
  if (layout.carried == core::FlowKind::W && carries(at(o).device, at(o).layers.first))
    return carried_at(at(o).device, at(o).layers.first);
  if (states.empty()) return nullptr;
  auto& ds = *states[static_cast<std::size_t>(at(o).device)];
  const int l = at(o).layers.first;
  return dt == DType::BF16 ? static_cast<const void*>(ds.weights<Bf16>(l))
                           : static_cast<const void*>(ds.weights<float>(l));
}

void* FlowInterpreter::state_grads(int o) {
  if (states.empty()) return nullptr;
  auto& ds = *states[static_cast<std::size_t>(at(o).device)];
  const int l = at(o).layers.first;
  return dt == DType::BF16 ? static_cast<void*>(ds.grads<Bf16>(l)) : static_cast<void*>(ds.grads<float>(l));
}

void FlowInterpreter::zero_state_grads() {
  for (auto& sh : shards) sh->begin_step();  // sharded: each step's first reduce-scatter of a layer copies
  // every BWD adds into the device gradient, which starts each step at zero (on the stream that runs the device's
  // BWD, ARD and Update ops, after the previous step's Updates)
  for (std::size_t d = 0; d < states.size(); ++d) states[d]->zero_grads(state_stream(static_cast<int>(d)));
}

void FlowInterpreter::note_state_nonfinite() {
  if (!shards.empty()) {  // the ranks updated disjoint shards: any rank's finding is the step's
    std::vector<std::int32_t> any;
    for (std::size_t d = 0; d < shards.size(); ++d) shards[d]->take_flags(state_stream(static_cast<int>(d)), any);
    note_nonfinite(nonfinite_of(m, any));
    return;
  }
  // the replicas' updates saw the same all-reduced gradients, so their findings agree: device 0's speaks for the
  // step (every device's flags are cleared)
  for (std::size_t d = 0; d < states.size(); ++d) {
    const auto found = states[d]->take_nonfinite(state_stream(static_cast<int>(d)));
    if (d == 0) note_nonfinite(found);
  }
}

void FlowInterpreter::sync_host_state() {
  if (!shards.empty()) {  // every rank its part, then the tied lm_head made wte's copy
    qr.synchronize();
    for (std::size_t d = 0; d < shards.size(); ++d) shards[d]->download(state_stream(static_cast<int>(d)), st);
    st.sync_tied();
    return;
  }
  if (states.empty()) return;
  qr.synchronize();
  states.front()->download(state_stream(0), st);
}

void FlowInterpreter::state_update(int o) {
  const core::Op& op = at(o);
  if (!shards.empty()) {
    for (int l = op.layers.first; l <= op.layers.last; ++l)
      shards[static_cast<std::size_t>(op.device)]->update(S(o), opt.adamw, l);
    return;
  }
  states[static_cast<std::size_t>(op.device)]->update(S(o), opt.adamw, op.layers.first, op.layers.last);
}

}  // namespace harmony::backend::detail
