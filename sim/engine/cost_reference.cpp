// Durations and memory of the reference cost model (SEMANTICS.md §6.5 and §6.6). Every formula keeps
// the reference's evaluation order so the doubles round identically before conversion to picoseconds.
#include "sim/engine/cost_reference.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/program/lower.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim {

using core::Op;
using core::OpKind;
using core::Phase;
using core::Stream;

bool gpu_update(const Op& op, const core::MachineSpec& machine) {
  return op.kind == OpKind::Update && !core::host_update(op) && !machine.compute.host_cores;
}

double device_update_s(const Op& op, const core::MachineSpec& machine) {
  const core::GpuRates& r = machine.gpu_rates;
  if (!(r.memory_bytes_per_s > 0))
    throw core::ScheduleError(fmt::format(
        "machine '{}' gives no gpu_rates.memory: the AdamW step on the GPU ({} of device memory traffic) cannot be "
        "priced; add gpu_rates: {{memory: <the GPU's memory bandwidth, e.g. 3350GB/s>}} to the machine "
        "(docs/machines.md)",
        machine.name, core::format_bytes(op.bytes)));
  const double eff = r.vector_efficiency > 0 ? r.vector_efficiency : 1.0;
  return static_cast<double>(op.bytes) / (r.memory_bytes_per_s * eff);
}

double ReferenceCostModel::duration_s(const core::Program& program, const Op& op) const {
  const double n = static_cast<double>(program.cost.bandwidth_sharers);
  const double bytes = static_cast<double>(op.bytes);
  const bool swap = op.stream == Stream::SwapIn || op.stream == Stream::SwapOut;
  switch (op.kind) {
    case OpKind::FWD:
    case OpKind::REC:
    case OpKind::BWD:
      return compute_s(op);
    case OpKind::Update: {
      if (gpu_update(op, machine_)) return device_update_s(op, machine_);
      double s = 0.0;
      for (int l = op.layers.first; l <= op.layers.last; ++l)
        s += model_.layers[static_cast<std::size_t>(l)].update_time_cpu_s;
      return s;
    }
    case OpKind::DEL:
      return machine_.time_del_s;
    case OpKind::WB:
    case OpKind::dWB:
      return bytes / (machine_.bw_swap_bytes_per_s / n);
    case OpKind::ARD:
      return 2. * (n - 1) / n * bytes / machine_.bw_p2p_bytes_per_s;
    case OpKind::AG:
    case OpKind::RS:
      // not in the paper's simulator: ring all-gather / reduce-scatter, half an all-reduce each
      return (n - 1) / n * bytes / machine_.bw_p2p_bytes_per_s;
    case OpKind::X:
    case OpKind::sX:
    case OpKind::dX:
    case OpKind::Y:
    case OpKind::dY:
      return swap ? bytes / (machine_.bw_swap_bytes_per_s / n) : bytes / machine_.bw_p2p_bytes_per_s;
    case OpKind::MSGsX:
    case OpKind::MSGY:
      return bytes / (machine_.bw_msg_bytes_per_s / n) * 2.;
  }
  return 0.0;
}

double ReferenceCostModel::compute_s(const Op& op) const {
  switch (op.kind) {
    case OpKind::FWD:
    case OpKind::REC: {
      double s = 0.0;
      for (int l = op.layers.first; l <= op.layers.last; ++l) s += model_.time_s(Phase::Fwd, op.ubs, l);
      return s;
    }
    case OpKind::BWD: {
      double b = 0.0;
      double f = 0.0;
      for (int l = op.layers.first; l <= op.layers.last; ++l) b += model_.time_s(Phase::Bwd, op.ubs, l);
      for (int l = op.layers.first; l <= op.layers.last; ++l) f += model_.time_s(Phase::Fwd, op.ubs, l);
      return b - f;
    }
    default:
      return 0.0;
  }
}

std::vector<core::TimePs> ReferenceCostModel::durations(const core::Program& program) const {
  // Per-layer compute times are looked up once per microbatch size (interpolation and range checks
  // are the costly part); the sums below keep the reference's order, so results are unchanged.
  const int R = model_.num_layers();
  std::vector<std::vector<double>> fwd;
  std::vector<std::vector<double>> bwd;
  auto table = [&](std::vector<std::vector<double>>& t, Phase ph, int u) -> const std::vector<double>& {
    if (static_cast<int>(t.size()) <= u) t.resize(static_cast<std::size_t>(u) + 1);
    auto& row = t[static_cast<std::size_t>(u)];
    if (row.empty()) {
      row.resize(static_cast<std::size_t>(R));
      for (int l = 0; l < R; ++l) row[static_cast<std::size_t>(l)] = model_.time_s(ph, u, l);
    }
    return row;
  };
  std::vector<core::TimePs> d(program.ops.size());
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    double s = 0.0;
    if (op.kind == OpKind::FWD || op.kind == OpKind::REC) {
      const auto& f = table(fwd, Phase::Fwd, op.ubs);
      for (int l = op.layers.first; l <= op.layers.last; ++l) s += f[static_cast<std::size_t>(l)];
    } else if (op.kind == OpKind::BWD) {
      const auto& b = table(bwd, Phase::Bwd, op.ubs);
      const auto& f = table(fwd, Phase::Fwd, op.ubs);
      double sb = 0.0;
      double sf = 0.0;
      for (int l = op.layers.first; l <= op.layers.last; ++l) sb += b[static_cast<std::size_t>(l)];
      for (int l = op.layers.first; l <= op.layers.last; ++l) sf += f[static_cast<std::size_t>(l)];
      s = sb - sf;
    } else {
      s = duration_s(program, op);
    }
    d[i] = core::seconds_to_ps(s);
  }
  return d;
}

core::Bytes ReferenceCostModel::pack_memory(Phase phase, int u, int first, int last) const {
  core::Bytes s = 0;
  for (int l = first; l <= last; ++l) {
    s += model_.peak_bytes(phase, u, l);
    if (l > first) s -= model_.input_bytes(u, l);
  }
  return s;
}

core::Bytes ReferenceCostModel::task_memory(const core::TaskGraph& graph, const core::Task& t) const {
  if (t.type == core::TaskType::Upd) return 0;
  const int u = t.ubatch_sizes.front();
  const int a = t.layers.first;
  const int b = t.layers.last;
  const int R = graph.num_layers;
  const core::Bytes input_x = model_.input_bytes(u, a);
  const core::Bytes dx = a != 0 ? input_x : 0;
  const core::Bytes y = b != R - 1 ? model_.input_bytes(u, b + 1) : 0;
  const core::Bytes dy = y;
  if (t.type == core::TaskType::Fwd) {
    core::Bytes stash = 0;
    for (const auto& st : t.stashes) stash += model_.input_bytes(u, st.layer);
    return input_x + pack_memory(Phase::Fwd, u, a, b) + y + stash;
  }
  const core::Bytes stash = input_x;
  return 2 * stash + dy + pack_memory(Phase::Bwd, u, a, b) + dx;
}

std::vector<core::Bytes> ReferenceCostModel::memory_per_gpu(const core::Program& program) const {
  std::vector<core::Bytes> mem(static_cast<std::size_t>(program.num_devices()), 0);
  for (int r : program.devices) {
    for (int idx : program.graph.rank_tasks[static_cast<std::size_t>(r)]) {
      const auto& t = program.graph.tasks[static_cast<std::size_t>(idx)];
      mem[static_cast<std::size_t>(r)] = std::max(mem[static_cast<std::size_t>(r)], task_memory(program.graph, t));
    }
  }
  return mem;
}

core::RunReport simulate(const core::Program& program, const ReferenceCostModel& cost, Timeline* timeline_out) {
  Timeline t = run_timeline(program, cost.durations(program));
  core::RunReport r = make_report(program, t, core::CostModelKind::Reference, cost.memory_per_gpu(program));
  if (timeline_out) *timeline_out = std::move(t);
  return r;
}

double ReferenceEngine::task_bound_s(const core::TaskGraph& graph, const std::vector<int>& ranks) const {
  return core::ps_to_seconds(
      core::compute_chain_bound_ps(graph, ranks, [&](const Op& o) { return cost_.compute_s(o) * 1e12; }));
}

EngineResult ReferenceEngine::run(const core::Program& program) const {
  EngineResult e;
  e.timeline = run_timeline(program, cost_.durations(program));
  e.peak_bytes = cost_.memory_per_gpu(program);
  core::RunReport& r = e.report;
  r = make_report(program, e.timeline, kind(), e.peak_bytes);
  if (r.peak_memory_bytes == 0 && !program.ops.empty()) {
    // The reference model prices memory per Harmony pack only; a baseline's peak comes from replaying the
    // Program's allocations and frees with the engine's reference settings (no contention, no latency).
    NativeOptions o;
    o.contention = false;
    o.latency = false;
    o.reference_bandwidths = true;
    NativeResult replay = run_native(program, model_, machine_, o);
    for (auto& g : r.per_gpu) {
      const auto i = static_cast<std::size_t>(g.gpu);
      if (g.gpu >= 0 && i < replay.peak_bytes.size()) g.peak_memory_bytes = replay.peak_bytes[i];
    }
    for (const core::Bytes b : replay.peak_bytes) r.peak_memory_bytes = std::max(r.peak_memory_bytes, b);
    e.peak_bytes = std::move(replay.peak_bytes);
  }
  // Flag, do not demote: under `reference` a plan over the capacity keeps its time and rank (the paper's).
  apply_capacity(r, machine_.search_capacity_bytes(), false);
  return e;
}

}  // namespace harmony::sim
