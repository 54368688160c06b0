// compare --deepspeed: a DeepSpeed config turned into `--set` overrides on the harmony config and priced as its
// closest plan kind beside Harmony's best plan (sim/study/compare_deepspeed.hpp).
#include "sim/study/compare_deepspeed.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::sim {

namespace {

const char* dtype_text(core::DType d) {
  switch (d) {
    case core::DType::Fp16:
      return "fp16";
    case core::DType::Bf16:
      return "bf16";
    case core::DType::Fp32:
      break;
  }
  return "fp32";
}

// The dtype the harmony config's model runs in (load_model's rule for an analytic model without dtype).
std::string model_dtype(const core::RunConfig& cfg) {
  if (!cfg.model.analytic) return "fp32";  // a measured profile: its own dtype, checked by the caller
  if (cfg.model.analytic_dtype_given) return dtype_text(cfg.model.analytic->dtype);
  const auto& r = cfg.machine.gpu_rates;
  return r.matrix_fp16_flops_per_s > r.matrix_fp32_flops_per_s ? "bf16" : "fp32";
}

// The override that sets an analytic model's dtype: inside `analytic:`, or beside `hf_config:`; the one the config
// accepts.
std::string dtype_override(const std::string& config, const std::vector<std::string>& sets, const std::string& dtype) {
  for (const char* key : {"model.analytic.dtype", "model.dtype"}) {
    std::vector<std::string> trial = sets;
    trial.push_back(fmt::format("{}={}", key, dtype));
    try {
      (void)core::load_config(config, trial);
      return trial.back();
    } catch (const core::ConfigError&) {
    }
  }
  throw core::ConfigError(core::SourceLoc{config, 0, 0},
                          fmt::format("cannot set the model's dtype to {} (the DeepSpeed config's precision)", dtype),
                          "use an analytic model (model.analytic or model.hf_config) for --deepspeed");
}

}  // namespace

DeepSpeedSetup setup_deepspeed(const std::string& config, const std::vector<std::string>& sets,
                               const std::string& deepspeed_path) {
  const core::RunConfig cfg = core::load_config(config, sets);
  core::DeepSpeedContext ctx;
  ctx.gpus = cfg.plan.gpus;
  ctx.minibatch = cfg.plan.minibatch;
  ctx.u_bwd = cfg.plan.u_bwd;
  ctx.dtype = model_dtype(cfg);
  if (!cfg.model.analytic) ctx.dtype = core::load_model(cfg.model, cfg.machine).dtype;
  DeepSpeedSetup s;
  s.run = core::read_deepspeed_config(deepspeed_path, ctx);
  // The minibatch compare runs at; the harmony config's own microbatches and packs would be checked against it, and
  // compare searches them anyway.
  s.overrides = {fmt::format("plan.minibatch={}", s.run.train_batch),
                 "plan.u_fwd=",
                 "plan.u_bwd=",
                 "plan.pack_size=",
                 "plan.packs_bwd=",
                 "plan.packs_fwd="};
  if (!s.run.dtype.empty() && s.run.dtype != ctx.dtype) {
    if (cfg.model.analytic) {
      std::vector<std::string> all = sets;
      all.insert(all.end(), s.overrides.begin(), s.overrides.end());
      s.overrides.push_back(dtype_override(config, all, s.run.dtype));
    } else {
      s.run.not_priced.push_back(fmt::format("{} precision (the profile {} was measured in {}; its times are used)",
                                             s.run.dtype, cfg.model.profile_path, ctx.dtype));
    }
  }
  s.row_overrides = {fmt::format("search.u_bwd=[{}]", s.run.micro_batch)};
  if (!s.run.offload.empty()) s.row_overrides.push_back("search.offload=" + s.run.offload);
  // the pipelined optimizer swap (an NVMe optimizer only): search.zero3's, which the ZeRO-3 kinds' candidates take
  if (s.run.pipeline_read) s.row_overrides.emplace_back("search.zero3.pipeline_read=true");
  if (s.run.pipeline_write) s.row_overrides.emplace_back("search.zero3.pipeline_write=true");
  return s;
}

KindResult price_deepspeed(const DeepSpeedSetup& setup, const std::string& config, const std::vector<std::string>& sets,
                           const core::Model& model) {
  std::vector<std::string> all = sets;
  all.insert(all.end(), setup.overrides.begin(), setup.overrides.end());
  all.insert(all.end(), setup.row_overrides.begin(), setup.row_overrides.end());
  const core::RunConfig cfg = core::load_config(config, all);
  std::vector<core::ActivationPolicy> policies = {core::ActivationPolicy::Checkpoint};
  if (setup.run.activations.empty()) policies.push_back(core::ActivationPolicy::Keep);
  const auto kind = core::find_plan_kind(setup.run.plan_kind);
  if (!kind) throw core::InternalError("compare --deepspeed: unknown plan kind " + setup.run.plan_kind);
  KindResult row = best_plan_of_kind(*kind, model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model,
                                     cfg.search, cfg.options, policies);
  // No plan to price because the model has no costs at that micro-batch, not because memory binds.
  const int micro = setup.run.micro_batch;
  if (!row.feasible && row.candidates == 0 &&
      !(model.ubatch_in_range(core::Phase::Fwd, micro) && model.ubatch_in_range(core::Phase::Bwd, micro)))
    row.reason = fmt::format(
        "train_micro_batch_size_per_gpu {} is outside the microbatch sizes the model is costed at (up to {}); "
        "an analytic model takes them from ubatch_sizes",
        micro, std::min(model.ubatch_max(core::Phase::Fwd), model.ubatch_max(core::Phase::Bwd)));
  // The tier is the DeepSpeed config's, not a search key the user set: say so where it cannot run.
  const std::string tier_key = "search.offload: nvme";
  if (!row.applicable && row.reason.rfind(tier_key, 0) == 0)
    row.reason = "the DeepSpeed config offloads to NVMe (" + tier_key + ")" + row.reason.substr(tier_key.size());
  return row;
}

const KindResult* harmony_best(const CompareResult& res) {
  const KindResult* best = nullptr;
  for (const auto& k : res.kinds) {
    if (!k.feasible || k.kind->role != core::KindRole::Harmony) continue;
    if (!best || k.best.iteration_time_s < best->best.iteration_time_s) best = &k;
  }
  return best;
}

namespace {
// The DeepSpeed run's time over Harmony's best, when both fit.
std::optional<double> time_ratio(const KindResult& row, const KindResult* harmony) {
  if (!row.feasible || !harmony) return std::nullopt;
  return row.best.iteration_time_s / harmony->best.iteration_time_s;
}

nlohmann::json text_or_null(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }
}  // namespace

nlohmann::json deepspeed_json(const DeepSpeedSetup& setup, const KindResult& row, const CompareResult& res) {
  const auto& r = setup.run;
  const KindResult* harmony = harmony_best(res);
  const auto ratio = time_ratio(row, harmony);
  nlohmann::json j = {{"config_path", r.path},
                      {"summary", r.summary},
                      {"zero_stage", r.stage},
                      {"offload_param", r.offload_param},
                      {"offload_optimizer", r.offload_optimizer},
                      {"train_micro_batch_size_per_gpu", r.micro_batch},
                      {"gradient_accumulation_steps", r.accumulation},
                      {"train_batch_size", r.train_batch},
                      {"gpus", r.gpus},
                      {"dtype", text_or_null(r.dtype)},
                      {"activations", text_or_null(r.activations)},
                      {"plan_kind", r.plan_kind},
                      {"offload", text_or_null(r.offload)},
                      {"status", r.status},
                      {"reasoning", r.reasoning},
                      {"approximation", text_or_null(r.approximation)},
                      {"notes", r.notes},
                      {"not_priced", r.not_priced},
                      {"overrides", setup.overrides},
                      {"row_overrides", setup.row_overrides}};
  j["feasible"] = row.feasible;
  j["reason"] = row.feasible ? nlohmann::json(nullptr) : nlohmann::json(row.reason);
  j["best"] = row.feasible ? core::report_to_json(row.best) : nlohmann::json(nullptr);
  j["harmony_best"] = harmony ? nlohmann::json{{"plan_kind", core::plan_kind_name(harmony->kind)},
                                               {"iteration_time_s", harmony->best.iteration_time_s}}
                              : nlohmann::json(nullptr);
  j["time_ratio"] = ratio ? nlohmann::json(*ratio) : nlohmann::json(nullptr);
  return j;
}

std::vector<std::string> deepspeed_lines(const DeepSpeedSetup& setup, const KindResult& row, const CompareResult& res) {
  const auto& r = setup.run;
  std::vector<std::string> out;
  out.push_back(fmt::format("your DeepSpeed config ({}): {} -> {}{} ({})", r.path, r.summary, r.plan_kind,
                            r.offload.empty() ? "" : ", offload " + r.offload, r.status));
  out.push_back("  why: " + r.reasoning);
  if (!r.approximation.empty()) out.push_back(fmt::format("  {}: {}", r.status, r.approximation));
  for (const auto& n : r.notes) out.push_back("  " + n);
  if (!r.not_priced.empty()) {
    std::string line = "  not priced:";
    for (std::size_t i = 0; i < r.not_priced.size(); ++i) line += (i ? ", " : " ") + r.not_priced[i];
    out.push_back(line);
  }
  const KindResult* harmony = harmony_best(res);
  if (!harmony) {
    out.push_back("  Harmony's best plan: no Harmony plan fits this machine");
  } else if (!row.feasible) {
    out.push_back(
        fmt::format("  Harmony's best plan on the same machine: {} {:.3f} s; the DeepSpeed run does not fit: {}",
                    core::plan_kind_name(harmony->kind), harmony->best.iteration_time_s, row.reason));
  } else {
    const double ratio = *time_ratio(row, harmony);
    out.push_back(fmt::format(
        "  Harmony's best plan on the same machine: {} {:.3f} s against {:.3f} s: the DeepSpeed run takes {:.2f}x "
        "Harmony's time ({})",
        core::plan_kind_name(harmony->kind), harmony->best.iteration_time_s, row.best.iteration_time_s, ratio,
        ratio > 1.0 ? fmt::format("Harmony is {:.2f}x faster", ratio)
                    : fmt::format("the DeepSpeed run is {:.2f}x faster", 1.0 / ratio)));
  }
  return out;
}

}  // namespace harmony::sim
