// JSON and one-line renderings of a RunReport (the CLI's --format json and the paper's summary).
#include "core/output/report.hpp"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace harmony::core {

static nlohmann::json packs_json(const Packs& packs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : packs) a.push_back({p.first, p.last});
  return a;
}

nlohmann::json report_to_json(const RunReport& r) {
  nlohmann::json j;
  j["plan_kind"] = r.plan_kind.empty() ? std::string(mode_name(r.plan.mode)) : r.plan_kind;
  j["mode"] = mode_name(r.plan.mode);
  j["activation_policy"] = r.activation_policy;
  j["gpus"] = r.plan.gpus;
  j["minibatch"] = r.plan.minibatch;
  j["u_fwd"] = r.plan.u_fwd;
  j["u_bwd"] = r.plan.u_bwd;
  j["packs_fwd"] = packs_json(r.plan.packs_fwd);
  j["packs_bwd"] = packs_json(r.plan.packs_bwd);
  if (!r.method_fwd.empty() || !r.method_bwd.empty()) {
    j["packing_fwd"] = r.method_fwd;
    j["packing_bwd"] = r.method_bwd;
  }
  j["cost_model"] = r.cost_model;
  j["deadlock"] = r.deadlock;
  j["feasible"] = r.feasible;
  if (r.deadlock) j["deadlock_report"] = r.deadlock_report;
  // JSON has no infinity: a deadlocked plan reports null times
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  j["iteration_time_s"] = num(r.iteration_time_s);
  j["throughput_samples_per_s"] = num(r.throughput_samples_per_s);
  j["per_gpu"] = nlohmann::json::array();
  for (const auto& g : r.per_gpu) {
    j["per_gpu"].push_back({{"gpu", g.gpu},
                            {"end_time_s", num(g.end_time_s)},
                            {"compute_time_s", g.compute_time_s},
                            {"peak_memory_bytes", g.peak_memory_bytes},
                            {"end_idle", num(g.end_idle)}});
  }
  j["max_end_idle"] = num(r.max_end_idle);
  j["avg_end_idle"] = num(r.avg_end_idle);
  j["compute_to_global"] = num(r.compute_to_global);
  j["compute_to_rank"] = num(r.compute_to_rank);
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["fits"] = r.fits;
  j["gpu_capacity_bytes"] = r.gpu_capacity_bytes > 0 ? nlohmann::json(r.gpu_capacity_bytes) : nlohmann::json(nullptr);
  j["excess_bytes"] = r.excess_bytes;
  j["swap_in_bytes"] = r.swap_in_bytes;
  j["swap_out_bytes"] = r.swap_out_bytes;
  j["p2p_bytes"] = r.p2p_bytes;
  j["collective_bytes"] = r.collective_bytes;
  j["msg_bytes"] = r.msg_bytes;
  j["num_ops"] = r.num_ops;
  j["num_streams"] = r.num_streams;
  if (r.native) {
    if (!r.feasible) j["infeasible_reason"] = r.infeasible_reason;
    if (r.memory_overflow.gpu >= 0) {
      const auto& o = r.memory_overflow;
      j["memory_overflow"] = {{"gpu", o.gpu},
                              {"op_id", o.op_id},
                              {"op_label", o.op_label},
                              {"bytes_over", o.bytes_over},
                              {"capacity_bytes", o.capacity_bytes},
                              {"time_s", o.time_s}};
    }
    j["memory_overflow_ops"] = r.memory_overflow_ops;
    j["memory_anomalies"] = r.memory_anomalies;
    const auto& h = r.host_memory;
    j["host_memory"] = {{"master_weights_bytes", h.master_weights_bytes},
                        {"optimizer_state_bytes", h.optimizer_state_bytes},
                        {"gradient_bytes", h.gradient_bytes},
                        {"stash_bytes", h.stash_bytes},
                        {"activation_bytes", h.activation_bytes},
                        {"pinned_staging_bytes", h.pinned_staging_bytes},
                        {"total_bytes", h.total_bytes},
                        {"capacity_bytes", h.capacity_bytes},
                        {"pinned_limit_bytes", h.pinned_limit_bytes}};
    const auto& l = r.ledger;
    nlohmann::json links = nlohmann::json::array();
    for (const auto& u : l.links) {
      links.push_back({{"name", u.name},
                       {"kind", u.kind},
                       {"capacity_bytes_per_s", u.capacity_bytes_per_s},
                       {"bytes", u.bytes},
                       {"busy_s", u.busy_s}});
    }
    j["swap_ledger"] = {{"per_link_class",
                         {{"pcie_h2d", l.pcie_h2d_bytes},
                          {"pcie_d2h", l.pcie_d2h_bytes},
                          {"p2p_pcie", l.p2p_pcie_bytes},
                          {"nvlink", l.nvlink_bytes},
                          {"host_staging", l.host_staging_bytes},
                          {"cpu_msg", l.cpu_msg_bytes}}},
                        {"per_tensor_class",
                         {{"weights", l.weights_bytes},
                          {"weight_grad", l.weight_grad_bytes},
                          {"optimizer_state", l.optimizer_state_bytes},
                          {"activation", l.activation_bytes},
                          {"stash", l.stash_bytes},
                          {"act_grad", l.act_grad_bytes}}},
                        {"links", std::move(links)}};
  }
  return j;
}

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
