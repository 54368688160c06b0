// FlowInterpreter (flow_interpreter.hpp), the executor's one interpreter: construction, the step's lifecycle, the
// issue of a group, tensors' names, tensors made and updated in the store, the P2P pair, and the gradients'
// all-reduce (ARD) — the same for every kind.
#include "backend/executor/flow_interpreter.hpp"

#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "backend/rank_sum.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::backend::detail {

FlowInterpreter::FlowInterpreter(const core::Program& program, std::vector<Device*> devices, HostState& state,
                                 const ExecutorOptions& options)
    : p(program),
      devs(std::move(devices)),
      st(state),
      opt(options),
      m(state.model()),
      B(program.graph.plan.minibatch),
      T(options.seq_len),
      dt(options.dtype),
      es(dtype_bytes(options.dtype)),
      layout(core::state_layout(program)),
      qr(program, devs, options) {
  staging_chunk_bytes = opt.staging_chunk_bytes;
  if (dt == DType::BF16)
    for (Device* d : devs) require_bf16(*d, "executor");
  if (p.graph.plan.kind->data_parallel && static_cast<int>(p.devices.size()) != p.num_devices())
    throw BackendError(fmt::format("executor: {} Program lowered for GPU 0 only (set dp_first_gpu_only = false)",
                                   p.graph.plan.kind.name()));
  analyse();
  if (layout.resident) make_states();
  if (layout.carried) make_carried();
}

void FlowInterpreter::begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  in = inputs;
  tgt = targets;
  losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
  loss_written.assign(static_cast<std::size_t>(B), 0);
  store.begin_step();
  begin_updates();
  qr.begin_step();
  zero_state_grads();  // resident: every BWD adds into the device gradient
}

double FlowInterpreter::end_step() {
  qr.synchronize();  // the losses' copies, the last updates' inputs, every stream-ordered free
  store.clear();
  const double loss = mean_loss();
  note_state_nonfinite();
  return loss;
}

std::string FlowInterpreter::tname(const core::FlowTensor& t) const {
  if (t.device < 0) return fmt::format("{} {}", channel_name(t.kind), t.layer);  // a host channel
  const std::string dev = devs[static_cast<std::size_t>(t.device)]->name();
  const std::string where = core::on_host(t.kind) ? "the host of " + dev : dev;
  const std::string task = t.owner >= 0 ? fmt::format(" of task {}", t.owner) : std::string();
  if (t.n == 0) return fmt::format("{} {} of layer {}{}", where, core::flow_kind_name(t.kind), t.layer, task);
  return fmt::format("{} {} of layer {}{} samples [{}, {})", where, core::flow_kind_name(t.kind), t.layer, task, t.s0,
                     t.s0 + t.n);
}

std::unique_ptr<Interpreter> make_interpreter(const core::Program& program, std::vector<Device*> devices,
                                              HostState& state, const ExecutorOptions& options) {
  return std::make_unique<FlowInterpreter>(program, std::move(devices), state, options);
}

void FlowInterpreter::run(const std::vector<int>& g) {
  const std::shared_ptr<void> range = qr.range(g.front());  // NVTX on CUDA, named like the trace's op
  const bool host = p.ops[static_cast<std::size_t>(g.front())].stream == core::Stream::Cpu;
  qr.await_preds(g, extra, host, [&](auto&& fn) { unlocked(fn); });
  qr.issue(g, times, host, [&] { run_group(g); });
}

FlowData& FlowInterpreter::make(int o, int id, Bytes bytes) {
  const core::FlowTensor& t = p.dataflow.tensor(id);
  FlowData data;
  if (core::on_host(t.kind)) {
    data.mem.resize(static_cast<std::size_t>(bytes));
    data.metered =
        MeteredBytes(host_meter, t.kind == core::FlowKind::HostGrad ? HostUse::Activations : HostUse::Stash, bytes);
  } else {
    data.buf = alloc_or_wait(D(t.device), bytes, versions.name(id));
  }
  return store.put(o, id, std::move(data));
}

FlowData& FlowInterpreter::update(int o, int id, Bytes bytes) {
  if (FlowData* in_place = store.take(o, id)) return *in_place;
  const void* src = store.get(o, id).data();
  FlowData& t = make(o, id, bytes);
  D(p.dataflow.tensor(id).device).copy_d2d(S(o), t.data(), src, bytes);
  return t;
}

void FlowInterpreter::run_group(const std::vector<int>& g) {
  const core::Op& op = at(g.front());
  if (op.peer >= 0) {
    run_pair(g[0], g[1]);
  } else if (op.kind == core::OpKind::ARD) {
    run_ard(g);
  } else if (op.kind == core::OpKind::AG) {
    run_ag(g);
  } else if (op.kind == core::OpKind::RS) {
    run_rs(g);
  } else if (is_move(op.kind)) {
    run_move(g.front());
  } else if (op.kind == core::OpKind::DEL) {  // what it frees, if still stored (its versions' last reads free them)
    store.drop_freed(g.front());
  } else {
    run_op(g.front());
  }
}

void FlowInterpreter::tokens_in(int o, int id, int s0, int n) {
  const Bytes bytes = Bytes(n) * per_sample(0);
  FlowData& x = make(o, id, bytes);
  D(at(o).device).copy_h2d(S(o), x.data(), in.data() + static_cast<std::size_t>(s0) * T, bytes);
}

void FlowInterpreter::weights_up(int o, void* dst, std::span<const std::span<const float>> src) {
  Device& d = D(at(o).device);
  if (dt == DType::BF16) {
    stage_up(qr.queue(o), d, S(o), dst, src);
    return;
  }
  auto* out = static_cast<float*>(dst);
  for (const std::span<const float> s : src) {
    d.copy_h2d(S(o), out, s.data(), Bytes(s.size()) * kF);
    out += s.size();
  }
}

void FlowInterpreter::run_wb(int o) {
  const core::Op& op = at(o);
  if (flow(o).writes.empty()) throw core::InternalError(fmt::format("executor: op {} writes no weights", label(o)));
  const int id = flow(o).writes[0];
  if (layout.device_update && flow(o).pass == core::Pass::Update) {
    stream_state_in(o);
    return;
  }
  if (layout.carried && p.dataflow.tensor(id).kind == *layout.carried && carries(op.device, op.layers.first)) {
    carried_up(o);
    return;
  }
  std::vector<std::span<const float>> src;  // the layers' masters, one after another (a shard: its part of one)
  if (p.dataflow.tensor(id).kind == core::FlowKind::WShard) {
    const int l = op.layers.first;
    FlowData& w = make(o, id, std::max<std::int64_t>(1, shard_floats(l)) * es);
    if (shard_len(l, op.device) == 0) return;
    src.push_back(st.weights(l).subspan(static_cast<std::size_t>(shard_first(l, op.device)),
                                        static_cast<std::size_t>(shard_len(l, op.device))));
    weights_up(o, w.data(), src);
    return;
  }
  FlowData& w = make(o, id, w_offset(op.layers, op.layers.last + 1) * es);
  for (int l = op.layers.first; l <= op.layers.last; ++l) src.push_back(st.weights(l));
  weights_up(o, w.data(), src);
}

void FlowInterpreter::run_pair(int send, int recv) {
  const std::vector<FlowVersion>& r = versions.reads(send);
  const std::vector<int>& w = versions.writes(recv);
  if (r.empty()) throw ScheduleViolation(fmt::format("executor: P2P {} -> {} sends nothing", label(send), label(recv)));
  const int src_id = r.front().tensor;
  const core::FlowTensor& a = p.dataflow.tensor(src_id);
  const auto same = [&](const core::FlowTensor& b) {
    return b.kind == a.kind && b.layer == a.layer && b.s0 == a.s0 && b.n == a.n;
  };
  if (w.empty() || !same(p.dataflow.tensor(w.front())))
    throw ScheduleViolation(fmt::format("executor: P2P {} -> {} moves {} into {}", label(send), label(recv),
                                        versions.name(src_id),
                                        w.empty() ? std::string("nothing") : versions.name(w.front())));
  const Bytes bytes = Bytes(a.n) * per_sample(a.layer);
  const void* src = store.get(send, src_id).data();
  FlowData& dst = make(recv, w.front(), bytes);
  D(at(send).device).copy_d2d(S(send), dst.data(), src, bytes, &D(at(recv).device));
  dst.users.push_back(send);  // written by the sender's stream; the receiver's stream waits for it (record_group)
}

int FlowInterpreter::dw_id(int o) const {
  for (const int id : p.dataflow.ops[static_cast<std::size_t>(o)].reads)
    if (p.dataflow.tensor(id).kind == core::FlowKind::DW) return id;
  throw core::InternalError(fmt::format("executor: op {} reads no weight gradient", label(o)));
}

void* FlowInterpreter::dw_data(int o) {
  if (void* state = state_grads(o)) return state;
  return store.get(o, dw_id(o)).data();
}

void FlowInterpreter::grads_down(int o, int d, float* dst, const void* src, std::int64_t count) {
  if (count == 0) return;
  if (dt == DType::F32) {
    D(d).copy_d2h(S(o), dst, src, count * kF);
    sync(o);
    return;
  }
  const std::span<float> to(dst, static_cast<std::size_t>(count));
  stage_down(qr.queue(o), D(d), S(o), std::span<const std::span<float>>(&to, 1), src);
}

void FlowInterpreter::grads_up(int o, int d, void* dst, const std::shared_ptr<std::vector<float>>& sum,
                               std::int64_t first, std::int64_t count) {
  const float* src = sum->data() + first;
  if (dt == DType::F32) {
    D(d).copy_h2d(S(o), dst, src, count * kF);
    keep_until_done(o, sum);
    return;
  }
  const std::span<const float> from(src, static_cast<std::size_t>(count));
  stage_up(qr.queue(o), D(d), S(o), dst, std::span<const std::span<const float>>(&from, 1));
}

std::shared_ptr<std::vector<float>> FlowInterpreter::summed_dw(const std::vector<int>& g, std::int64_t count) {
  auto sum = std::make_shared<std::vector<float>>(static_cast<std::size_t>(count));
  std::vector<float> part(static_cast<std::size_t>(count));
  const MeteredBytes metered(host_meter, HostUse::Staging, 2 * count * kF);
  for (std::size_t r = 0; r < g.size(); ++r) {
    grads_down(g[r], at(g[r]).device, part.data(), dw_data(g[r]), count);
    add_in_rank_order(*sum, part, r);
  }
  return sum;
}

void FlowInterpreter::run_ard(const std::vector<int>& g) {
  std::int64_t count = 0;
  for (int l = at(g.front()).layers.first; l <= at(g.front()).layers.last; ++l) count += m.param_floats(l);
  // in place where the gradient is a resident kind's state (its stream orders the BWDs before and the Update after),
  // else each member's next version of it
  const bool in_state = state_grads(g.front()) != nullptr;
  const auto next = [&](int a) { return in_state ? state_grads(a) : update(a, dw_id(a), count * es).data(); };
  if (qr.device_sums(g)) {
    std::vector<void*> bufs;
    bufs.reserve(g.size());
    for (const int a : g) bufs.push_back(next(a));
    qr.all_reduce(g, bufs, count, dt);
    return;
  }
  // The host path (no communicator; op_groups makes every collective span the devices in rank order).
  const auto sum = summed_dw(g, count);
  for (const int a : g) grads_up(a, at(a).device, next(a), sum, 0, count);
}

}  // namespace harmony::backend::detail
