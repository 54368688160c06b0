// Runs every plan kind's search with one cost model and ranks the kinds (sim/compare.hpp).
#include "sim/compare.hpp"

#include <limits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/search.hpp"
#include "sim/cost_reference.hpp"
#include "sim/evaluate.hpp"

namespace harmony::sim {

core::RunReport evaluate_baseline(const core::Model& model, const core::MachineSpec& machine,
                                  const core::BaselinePlan& plan, const std::string& cost_model) {
  const core::Program program = core::lower_baseline(plan, model);
  core::RunReport r = simulate_program(program, model, machine, cost_model);
  r.plan_kind = core::plan_kind_name(plan.kind);
  return r;
}

CompareResult compare_plan_kinds(const core::Model& model, const core::MachineSpec& machine, int gpus, int minibatch,
                                 const std::string& cost_model, const core::SearchSpec& search,
                                 const core::Options& options) {
  CompareResult out;
  const auto capacity =
      static_cast<core::Bytes>(static_cast<double>(machine.gpu_memory_bytes) * machine.memory_cap_scale);
  for (const auto& name : core::plan_kind_names()) {
    const core::PlanKind kind = *core::parse_plan_kind(name);
    KindResult kr;
    kr.kind = kind;
    if (!core::is_baseline(kind)) {
      core::SearchSpace space;
      space.mode = kind == core::PlanKind::HarmonyPP ? core::Mode::HarmonyPP : core::Mode::HarmonyDP;
      space.gpus = gpus;
      space.minibatch = minibatch;
      space.capacity_bytes = capacity;
      space.unequal_microbatches = options.unequal_microbatches;
      space.spec = search;
      space.spec.top_k = 1;
      space.spec.fit_rule = false;
      core::LowerOptions lower;
      lower.prefetch = options.prefetch;
      const auto cands = core::enumerate_candidates(model, space);
      kr.candidates = cands.size();
      const auto res = core::run_search(cands, space, [&](const core::Plan& p) {
        return evaluate_plan(model, machine, p, lower, cost_model).report;
      });
      if (!res.ranked.empty()) {
        kr.feasible = true;
        kr.best = res.ranked.front().report;
        kr.best.plan_kind = name;
      } else {
        kr.reason = cands.empty() ? fmt::format("no layer packing fits {:.0f} MiB per GPU at any microbatch size",
                                                static_cast<double>(capacity) / static_cast<double>(core::kMiB))
                                  : fmt::format("all {} candidates exceed a capacity or deadlock", cands.size());
      }
    } else {
      core::BaselineSearchOptions bo;
      bo.ubatch_step = search.ubatch_step;
      bo.ubatch_sizes = search.u_bwd;
      std::vector<core::BaselinePlan> plans;
      try {
        plans = core::enumerate_baseline_plans(kind, model, gpus, minibatch, capacity, bo);
      } catch (const core::ScheduleError& e) {
        kr.reason = e.what();
      }
      kr.candidates = plans.size();
      if (!plans.empty()) {
        const auto res = core::run_baseline_search(
            plans, [&](const core::BaselinePlan& p) { return evaluate_baseline(model, machine, p, cost_model); },
            search.threads, -1);
        for (const auto& r : res.ranked) {
          if (r.report.deadlock || !r.report.feasible) continue;
          kr.feasible = true;
          kr.best = r.report;
          break;
        }
        if (!kr.feasible) {
          kr.reason = fmt::format("all {} plans exceed a capacity or deadlock", plans.size());
        }
      } else if (kr.reason.empty()) {
        kr.reason = fmt::format("no microbatch size lets it fit {:.0f} MiB per GPU",
                                static_cast<double>(capacity) / static_cast<double>(core::kMiB));
      }
    }
    out.kinds.push_back(std::move(kr));
  }
  out.best_baseline_time_s = std::numeric_limits<double>::infinity();
  for (const auto& k : out.kinds) {
    if (k.feasible && core::is_baseline(k.kind))
      out.best_baseline_time_s = std::min(out.best_baseline_time_s, k.best.iteration_time_s);
  }
  for (auto& k : out.kinds) {
    if (k.feasible && std::isfinite(out.best_baseline_time_s))
      k.speedup_over_best_baseline = out.best_baseline_time_s / k.best.iteration_time_s;
  }
  return out;
}

}  // namespace harmony::sim
