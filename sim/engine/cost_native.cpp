// The `native` cost model's report side: NativeEngine's one run, the RunReport with feasibility, host account
// and swap ledger, and the Chrome-trace counter events.
#include "sim/engine/cost_native.hpp"

#include <cmath>

#include <nlohmann/json.hpp>

namespace harmony::sim {

EngineResult NativeEngine::run(const core::Program& program) const {
  return result_of(program, run_native(program, model_, machine_, options_));
}

std::optional<EngineResult> NativeEngine::run_within(const core::Program& program, double cutoff_s) const {
  // cutoffs beyond the simulated range (or infinite) cannot prune
  const double ps = cutoff_s * 1e12;
  if (!(ps < static_cast<double>(core::kMaxTimePs))) return run(program);
  auto res = run_native_within(program, model_, machine_, options_, static_cast<core::TimePs>(std::floor(ps)));
  if (!res) return std::nullopt;
  return result_of(program, std::move(*res));
}

double NativeEngine::task_bound_s(const core::TaskGraph& graph, const std::vector<int>& ranks) const {
  return core::ps_to_seconds(native_task_bound_ps(graph, ranks, model_, machine_, options_));
}

bool NativeEngine::host_floor_exceeded(core::PlanKind kind, bool offload_nvme) const {
  if (!options_.capacities || !machine_.topology.valid()) return false;
  const core::Topology& t = machine_.topology;
  return host_limits_exceeded(host_floor(model_, kind, offload_nvme), t.host_memory_bytes, t.pinned_limit_bytes);
}

EngineResult NativeEngine::result_of(const core::Program& program, NativeResult res) const {
  EngineResult e;
  e.report = native_report(program, res);
  apply_capacity(e.report, machine_.gpu_memory_bytes, true);
  e.peak_bytes = res.peak_bytes;
  if (options_.record_counters) {
    e.timeline = res.timeline;
    e.native = std::make_shared<const NativeResult>(std::move(res));
  } else {
    e.timeline = std::move(res.timeline);
  }
  return e;
}

std::vector<core::TimePs> native_durations(const core::Program& program, const NativeResult& r) {
  std::vector<core::TimePs> d(program.ops.size(), 0);
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (r.timeline.end_ps[i] >= 0) d[i] = r.timeline.end_ps[i] - r.ready_ps[i];
  }
  return d;
}

core::RunReport native_report(const core::Program& program, const NativeResult& res) {
  core::RunReport r = make_report(program, res.timeline, core::CostModelKind::Native, res.peak_bytes);
  r.native = true;
  r.feasible = res.feasible;
  r.infeasible_reason = res.infeasible_reason;
  if (res.overflow.op >= 0) {
    const auto& o = res.overflow;
    r.memory_overflow = core::MemoryOverflowReport{o.device,     program.op_id(o.op), program.op_label(o.op),
                                                   o.bytes_over, o.capacity_bytes,    core::ps_to_seconds(o.time_ps)};
  }
  r.memory_overflow_ops = res.overflow_count;
  r.memory_anomalies = res.memory_anomalies;
  r.host_memory = static_cast<const core::HostMemoryReport&>(res.host);  // the account less its NVMe tier
  auto& l = r.ledger;
  auto cls = [&](TransferClass c) { return res.class_bytes[static_cast<int>(c)]; };
  l.pcie_h2d_bytes = cls(TransferClass::PcieH2D);
  l.pcie_d2h_bytes = cls(TransferClass::PcieD2H);
  l.p2p_pcie_bytes = cls(TransferClass::P2PPcie);
  l.nvlink_bytes = cls(TransferClass::NvLink);
  l.host_staging_bytes = cls(TransferClass::HostStaging);
  l.cpu_msg_bytes = cls(TransferClass::CpuMsg);
  auto ten = [&](core::TensorKind k) { return res.tensor_bytes[static_cast<int>(k)]; };
  l.weights_bytes = ten(core::TensorKind::Weights);
  l.weight_grad_bytes = ten(core::TensorKind::WeightGrad);
  l.optimizer_state_bytes = ten(core::TensorKind::OptState);
  l.activation_bytes = ten(core::TensorKind::Activation);
  l.stash_bytes = ten(core::TensorKind::Stash);
  l.act_grad_bytes = ten(core::TensorKind::ActGrad);
  for (std::size_t i = 0; i < res.graph.links.size(); ++i) {
    const auto& link = res.graph.links[i];
    const auto& st = res.link_stats[i];
    l.links.push_back(core::LinkUsage{link.name, link_kind_name(link.kind), link.capacity > 0 ? link.capacity : 0.0,
                                      st.bytes, core::ps_to_seconds(st.busy_ps)});
  }
  return r;
}

core::RunReport simulate_native(const core::Program& program, const core::Model& model,
                                const core::MachineSpec& machine, const NativeOptions& options,
                                NativeResult* result_out) {
  NativeResult res = run_native(program, model, machine, options);
  core::RunReport r = native_report(program, res);
  if (result_out) *result_out = std::move(res);
  return r;
}

void append_native_counters(nlohmann::json& trace_events, const NativeResult& res) {
  constexpr double kMiB = 1024.0 * 1024.0;
  constexpr double kGiB = 1024.0 * kMiB;
  trace_events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", kLinkCounterPid}, {"args", {{"name", "links"}}}});
  trace_events.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", kLinkCounterPid}, {"args", {{"sort_index", 1000}}}});
  auto ts = [](core::TimePs t) { return static_cast<double>(t) / 1e6; };
  for (const auto& s : res.memory_samples) {
    trace_events.push_back({{"ph", "C"},
                            {"name", "memory"},
                            {"pid", s.device},
                            {"ts", ts(s.time_ps)},
                            {"args", {{"MiB", static_cast<double>(s.bytes) / kMiB}}}});
  }
  for (const auto& s : res.bandwidth_samples) {
    const auto& link = res.graph.links[static_cast<std::size_t>(s.link)];
    const bool cpu = link.kind == LinkKind::CpuCores;
    const bool units = link.kind == LinkKind::ComputeUnits;
    trace_events.push_back({{"ph", "C"},
                            {"name", link.name},
                            {"pid", kLinkCounterPid},
                            {"ts", ts(s.time_ps)},
                            {"args",
                             {{cpu     ? "cores"
                               : units ? "units"
                                       : "GiB/s",
                               cpu || units ? s.rate : s.rate / kGiB}}}});
  }
}

}  // namespace harmony::sim
