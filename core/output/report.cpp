// JSON and one-line renderings of a RunReport (the CLI's --format json and the paper's summary).
#include "core/output/report.hpp"

#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/plan/plan_kind.hpp"

namespace harmony::core {

nlohmann::json packs_to_json(const Packs& packs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : packs) a.push_back({p.first, p.last});
  return a;
}

namespace {

using nlohmann::json;

// JSON has no infinity: a deadlocked plan reports null times.
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json per_gpu_json(const RunReport& r) {
  json a = json::array();
  for (const auto& g : r.per_gpu) {
    a.push_back({{"gpu", g.gpu},
                 {"end_time_s", num(g.end_time_s)},
                 {"compute_time_s", num(g.compute_time_s)},
                 {"peak_memory_bytes", g.peak_memory_bytes},
                 {"end_idle", num(g.end_idle)}});
  }
  return a;
}

// The first allocation over a GPU's capacity (native cost model only; null without one).
json memory_overflow_json(const RunReport& r) {
  json overflow = nullptr;
  if (r.native && r.memory_overflow.gpu >= 0) {
    const auto& o = r.memory_overflow;
    overflow = {{"gpu", o.gpu},
                {"op_id", o.op_id},
                {"op_label", o.op_label},
                {"excess_bytes", o.bytes_over},
                {"gpu_capacity_bytes", o.capacity_bytes},
                {"time_s", o.time_s}};
  }
  return overflow;
}

// The host memory the plan needs, by purpose, with the host's limits (0: unlimited, null).
json report_host_json(const RunReport& r) {
  const auto& h = r.host_memory;
  auto limit = [](Bytes b) { return b > 0 ? json(b) : json(nullptr); };  // 0: unlimited
  json host = host_breakdown_json(h, kPinnedStagingKey);
  host["total_bytes"] = h.total_bytes();
  host["host_capacity_bytes"] = limit(h.capacity_bytes);
  host["pinned_limit_bytes"] = limit(h.pinned_limit_bytes);
  return host;
}

// The swap ledger: bytes per link class and per tensor class, and each link's bytes and busy time.
json swap_ledger_json(const RunReport& r) {
  const auto& l = r.ledger;
  json links = json::array();
  for (const auto& u : l.links) {
    links.push_back(
        {{"name", u.name},
         {"kind", u.kind},
         {"capacity_bytes_per_s", u.capacity_bytes_per_s > 0 ? json(u.capacity_bytes_per_s) : json(nullptr)},
         {"bytes", u.bytes},
         {"busy_s", u.busy_s}});
  }
  return {{"per_link_class",
           {{"pcie_h2d_bytes", l.pcie_h2d_bytes},
            {"pcie_d2h_bytes", l.pcie_d2h_bytes},
            {"p2p_pcie_bytes", l.p2p_pcie_bytes},
            {"nvlink_bytes", l.nvlink_bytes},
            {"host_staging_bytes", l.host_staging_bytes},
            {"cpu_msg_bytes", l.cpu_msg_bytes}}},
          {"per_tensor_class",
           {{"weights_bytes", l.weights_bytes},
            {"weight_grad_bytes", l.weight_grad_bytes},
            {"optimizer_state_bytes", l.optimizer_state_bytes},
            {"activation_bytes", l.activation_bytes},
            {"stash_bytes", l.stash_bytes},
            {"act_grad_bytes", l.act_grad_bytes}}},
          {"links", std::move(links)}};
}

}  // namespace

nlohmann::json report_to_json(const RunReport& r) {
  auto text_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  auto native_only = [&](json v) { return r.native ? std::move(v) : json(nullptr); };
  const bool capacity_known = r.gpu_capacity_bytes > 0;
  json j;
  j["plan_kind"] = r.plan.kind.name();
  j["activation_policy"] = activation_policy_name(r.plan.knobs.activation_policy);
  j["swap_timing"] = r.plan.kind.has_knob(Knob::Swap) ? json(swap_timing_name(r.plan.knobs.swap)) : json(nullptr);
  j["gpus"] = r.plan.gpus;
  j["minibatch"] = r.plan.minibatch;
  j["u_fwd"] = r.plan.u_fwd;
  j["u_bwd"] = r.plan.u_bwd;
  j["packs_fwd"] = packs_to_json(r.plan.packs_fwd);
  j["packs_bwd"] = packs_to_json(r.plan.packs_bwd);
  j["packing_fwd"] = text_or_null(r.method_fwd);
  j["packing_bwd"] = text_or_null(r.method_bwd);
  j["cost_model"] = r.cost_model;
  j["deadlock"] = r.deadlock;
  j["deadlock_report"] = r.deadlock ? json(r.deadlock_report) : json(nullptr);
  j["feasible"] = r.feasible;
  j["infeasible_reason"] = r.feasible ? json(nullptr) : json(r.infeasible_reason);
  j["iteration_time_s"] = num(r.iteration_time_s);
  j["throughput_samples_per_s"] = num(r.throughput_samples_per_s);
  j["per_gpu"] = per_gpu_json(r);
  j["max_end_idle"] = num(r.max_end_idle);
  j["avg_end_idle"] = num(r.avg_end_idle);
  j["compute_to_global"] = num(r.compute_to_global);
  j["compute_to_rank"] = num(r.compute_to_rank);
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["gpu_capacity_bytes"] = capacity_known ? json(r.gpu_capacity_bytes) : json(nullptr);
  j["fits"] = capacity_known ? json(r.fits) : json(nullptr);
  j["excess_bytes"] = capacity_known && !r.fits ? json(r.excess_bytes) : json(nullptr);
  j["swap_in_bytes"] = r.swap_in_bytes;
  j["swap_out_bytes"] = r.swap_out_bytes;
  j["p2p_bytes"] = r.p2p_bytes;
  j["collective_bytes"] = r.collective_bytes;
  j["msg_bytes"] = r.msg_bytes;
  j["num_ops"] = r.num_ops;
  j["num_streams"] = r.num_streams;
  // native cost model only (null under `reference`)
  j["memory_overflow"] = memory_overflow_json(r);
  j["memory_overflow_ops"] = native_only(r.memory_overflow_ops);
  j["memory_anomalies"] = native_only(r.memory_anomalies);
  j["host_memory"] = native_only(report_host_json(r));
  j["swap_ledger"] = native_only(swap_ledger_json(r));
  return j;
}

std::string report_title(const RunReport& r) { return plan_title(r.plan); }

std::string summary_line(const RunReport& r, const std::string& title) {
  std::string per;
  for (std::size_t i = 0; i < r.per_gpu.size(); ++i) {
    if (i) per += ", ";
    per += fmt::format("{:.0f}", static_cast<double>(r.per_gpu[i].peak_memory_bytes) / 1024.0 / 1024.0);
  }
  return fmt::format(
      "=== {} : {:.3f} sec (idle max/avg: {:.0f}%/{:.0f}%) (compute2global/compute2rank: {:.0f}%/{:.0f}%), {:.0f} MiB "
      "({}) ===",
      title, r.iteration_time_s, r.max_end_idle * 100, r.avg_end_idle * 100, r.compute_to_global * 100,
      r.compute_to_rank * 100, static_cast<double>(r.peak_memory_bytes) / 1024.0 / 1024.0, per);
}

}  // namespace harmony::core
