// Runs every plan kind's search with one cost model and ranks the kinds (sim/study/compare.hpp).
#include "sim/study/compare.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"
#include "core/kinds/kinds.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/engine/engine.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/evaluate.hpp"
#include "sim/study/memory_answer.hpp"

namespace harmony::sim {

namespace {
// The plan ran out of host memory (or pinned memory) rather than GPU memory.
bool host_bound(const core::RunReport& r) {
  const auto& h = r.host_memory;
  return host_memory_exceeded(h.total_bytes(), h.capacity_bytes) ||
         pinned_memory_exceeded(h.total_bytes(), h.optimizer_state_bytes, h.pinned_limit_bytes);
}
}  // namespace

namespace {
// The candidates of space's kind (core::enumerate_plans). When none fits a streaming kind's memory estimate, a bound:
// of its nearest plans (nearest_plans, as `harmony-sim memory` takes them), those whose Program peaks within the
// capacity when its ops run one at a time (serial_peak_bytes, what `memory` reports), so that the two commands agree
// on what fits; *beyond_estimate says the estimate dropped them all, and *lowered keeps each such plan's Program,
// lowered as evaluate_plan lowers it on `engine`, for the search to run instead of lowering it again.
struct Nearest {
  core::Plan plan;
  core::Program program;
};
std::vector<core::Candidate> enumerate_or_nearest(const core::Model& model, const core::SearchSpace& space,
                                                  const Engine& engine, const core::LowerOptions& lower,
                                                  bool* beyond_estimate, std::vector<Nearest>* lowered) {
  std::vector<core::Candidate> cands = core::enumerate_plans(model, space);
  // a kind that keeps its state on the GPUs estimates that state, which its Program holds whole: nothing to gain
  if (!cands.empty() || !space.drop_infeasible || space.kind->resident_state) return cands;
  *beyond_estimate = true;
  std::vector<core::Candidate> fitting;
  for (core::Candidate& c : nearest_plans(model, space)) {
    core::Program program = lower_plan_for(engine, model, c.plan, lower);
    const auto peaks = serial_peak_bytes(program);
    if (!peaks || peaks->empty() || *std::max_element(peaks->begin(), peaks->end()) > space.capacity_bytes) continue;
    lowered->push_back({c.plan, std::move(program)});
    fitting.push_back(std::move(c));
  }
  return fitting;
}

// The Program `lowered` keeps for `plan` (the same kind, policy, tier and microbatch), taken out; nullopt if none.
std::optional<core::Program> take_lowered(std::vector<Nearest>& lowered, const core::Plan& plan) {
  for (Nearest& n : lowered) {
    if (n.plan.u_bwd == plan.u_bwd && n.plan.knobs.activation_policy == plan.knobs.activation_policy &&
        n.plan.knobs.offload == plan.knobs.offload && !n.program.ops.empty())
      return std::exchange(n.program, core::Program{});
  }
  return std::nullopt;
}

// Why a kind without packs has no candidate (none fits by its estimate, nor, beyond_estimate, by its nearest plans'
// peaks): a one-microbatch kind names its microbatch, the others the capacity.
std::string no_candidate_reason(const core::Model& model, const core::SearchSpace& space, bool beyond_estimate) {
  const double cap_mib = static_cast<double>(space.capacity_bytes) / static_cast<double>(core::kMiB);
  if (!space.kind->one_microbatch)
    return fmt::format("no microbatch size lets it fit {:.0f} MiB per GPU{}", cap_mib,
                       beyond_estimate ? " (by its estimate, nor its nearest plans by their peak)" : "");
  const int share = space.minibatch / space.gpus;
  const int hi = std::min(model.ubatch_max(core::Phase::Fwd), model.ubatch_max(core::Phase::Bwd));
  if (share > hi || !model.ubatch_in_range(core::Phase::Bwd, share))
    return fmt::format("{} runs each GPU's {} samples as one microbatch, outside the profiled sizes (up to {})",
                       space.kind.name(), share, hi);
  return fmt::format("{} runs each GPU's {} samples as one microbatch, which does not fit {:.0f} MiB per GPU",
                     space.kind.name(), share, cap_mib);
}

// A kind without packs on one tier (space.offloads): every candidate (per activation policy, ascending u) evaluated
// with core::run_search on the calling thread and ranked by iteration time, so each policy's best time is known.
void search_unpacked(KindResult& kr, core::SearchSpace space, const core::Model& model, const Engine& engine,
                     const core::LowerOptions& lower, const core::SearchProgressFn& progress, bool* all_host_bound) {
  const core::PlanKind kind = space.kind;
  space.spec.top_k = -1;
  std::vector<core::Candidate> cands;
  bool beyond_estimate = false;
  std::vector<Nearest> lowered;  // beyond the estimate: the nearest plans' Programs, lowered once
  std::mutex lowered_mutex;
  try {
    cands = enumerate_or_nearest(model, space, engine, lower, &beyond_estimate, &lowered);
  } catch (const core::ScheduleError& e) {
    kr.reason = e.what();
  }
  kr.candidates += cands.size();
  bool any_host_bound = false;
  if (!cands.empty()) {
    // Every plan of the tier needs more host memory than the machine has (Engine::host_floor_exceeded: the masters,
    // optimizer state and gradients alone): none can be feasible, so only the first, which names the miss, is run.
    const bool first_nvme = cands.front().plan.knobs.offload == core::OffloadTier::Nvme;
    const bool unfit =
        std::all_of(cands.begin(), cands.end(),
                    [&](const auto& c) { return (c.plan.knobs.offload == core::OffloadTier::Nvme) == first_nvme; }) &&
        engine.host_floor_exceeded(space.kind, first_nvme);
    const std::size_t num_plans = cands.size();
    if (unfit) cands.resize(1);
    kr.pruned += num_plans - cands.size();
    std::atomic<bool> host_miss{false};
    const auto res = core::run_search(
        cands, space,
        [&](const core::Plan& p) {
          std::optional<core::Program> program;
          if (beyond_estimate) {
            const std::lock_guard lock(lowered_mutex);
            program = take_lowered(lowered, p);
          }
          core::RunReport r = (program ? evaluate_program(engine, std::move(*program))
                                       : evaluate_plan(engine, model, p, lower))  // the kind reads its knobs
                                  .report;
          // beyond the estimate only a peak that fits counts (the reference model does not demote by itself)
          if (beyond_estimate) apply_capacity(r, r.gpu_capacity_bytes, /*demote=*/true);
          if (!r.feasible && host_bound(r)) host_miss = true;
          return r;
        },
        progress);
    any_host_bound = host_miss;
    kr.deadlocked += res.num_deadlocked;
    for (const auto& r : res.ranked) {
      const core::Plan& plan = cands[r.candidate].plan;
      const std::string policy = core::activation_policy_name(plan.knobs.activation_policy);
      if (!kr.policy_best_time_s.count(policy)) kr.policy_best_time_s[policy] = r.report.iteration_time_s;
      if (kr.feasible) continue;
      kr.feasible = true;
      kr.best = r.report;
      kr.plan = plan;
      if (kind->offload_tiers) kr.offload = core::offload_tier_name(plan.knobs.offload);
    }
    if (!kr.feasible) {
      const std::string miss =
          res.first_miss < cands.size()
              ? fmt::format("; first: u {}: {}", cands[res.first_miss].plan.u_bwd, res.first_miss_reason)
              : std::string();
      kr.reason = fmt::format("all {} plans exceed a capacity or deadlock{}", num_plans, miss);
      if (beyond_estimate && res.num_gpu_memory_misses == num_plans)
        kr.reason = fmt::format(
            "no microbatch size lets it fit {:.0f} MiB per GPU (by its estimate, nor its nearest "
            "plans by their simulated peak)",
            static_cast<double>(space.capacity_bytes) / static_cast<double>(core::kMiB));
    }
  } else if (kr.reason.empty()) {
    kr.reason = no_candidate_reason(model, space, beyond_estimate);
  }
  if (all_host_bound) *all_host_bound = !kr.feasible && any_host_bound;
}
}  // namespace

namespace {
// The offload tier of a kind that has tiers (PlanKindSpec::offload_tiers; issue 13), one rule for every such kind.
// `search_tier(nvme, host_miss)` searches the kind's plans on one tier into kr; *host_miss (when not null) is set when
// every plan that missed ran out of host (or pinned) memory rather than GPU memory. search.offload: nvme searches the
// drives only (not applicable without the native model or topology.nvme); cpu host memory only; auto host memory,
// then the drives when host memory is what binds and the machine has them. A kind without tiers: host memory.
template <class SearchTier>
void search_offload_tiers(KindResult& kr, core::PlanKind kind, const core::MachineSpec& machine,
                          core::CostModelKind cost_model, core::SearchSpec::Offload offload, SearchTier search_tier) {
  using Offload = core::SearchSpec::Offload;
  if (!kind->offload_tiers) {
    search_tier(false, nullptr);
    return;
  }
  const bool drives = cost_model == core::CostModelKind::Native && machine.topology.nvme.present();
  if (offload == Offload::Nvme) {
    if (!drives) {
      kr.applicable = false;
      kr.reason = cost_model != core::CostModelKind::Native
                      ? "search.offload: nvme needs the native cost model (the reference model has no NVMe tier)"
                      : fmt::format("search.offload: nvme, but machine '{}' has no topology.nvme", machine.name);
      return;
    }
    search_tier(true, nullptr);
    return;
  }
  bool host_miss = false;
  search_tier(false, &host_miss);
  if (offload == Offload::Auto && host_miss && drives) {
    const std::string cpu_reason = kr.reason;
    kr.reason.clear();
    search_tier(true, nullptr);
    if (!kr.feasible) kr.reason = fmt::format("offload cpu: {}; offload nvme: {}", cpu_reason, kr.reason);
  }
}
}  // namespace

namespace {
// A kind with packs on one tier (`lower.offload_nvme`): one branch-and-bound search for the best candidate, whose
// Wide pack-count bound grows while nothing under it fits the GPU memory (core::search_growing_bound).
void search_packed(KindResult& kr, core::SearchSpace space, const core::Model& model, const Engine& engine,
                   const core::LowerOptions& lower, const core::SearchProgressFn& progress, bool* host_miss) {
  space.spec.top_k = 1;
  std::atomic<bool> any_gpu_miss{false};
  // branch and bound: a candidate the engine shows cannot beat the best found is not simulated
  const auto grown =
      core::search_growing_bound(model, space, [&](const std::vector<core::Candidate>& c, const core::SearchSpace& sp) {
        any_gpu_miss = false;  // of the last search
        kr.candidates += c.size();
        return core::run_search_bounded(
            c, sp, model,
            [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
              auto e = evaluate_plan_within(engine, model, p, lower, cutoff_s);
              if (!e) return std::nullopt;
              if (!e->report.feasible && !host_bound(e->report)) any_gpu_miss = true;
              return std::move(e->report);
            },
            progress, [&](const core::Plan& p) { return task_bound_for(engine, model, p, lower); });
      });
  const auto& cands = grown.candidates;
  const auto& res = grown.result;
  kr.max_packs_grown = grown.grew() ? grown.max_packs : 0;
  // the first miss in enumeration order (nothing is pruned when no candidate is feasible)
  std::string miss;
  if (res.first_miss < cands.size()) {
    const auto& c = cands[res.first_miss].plan;
    miss = fmt::format("; first: u {}/{}: {}", c.u_fwd, c.u_bwd, res.first_miss_reason);
  }
  kr.deadlocked += res.num_deadlocked;
  kr.pruned += res.num_pruned;
  if (host_miss) *host_miss = res.ranked.empty() && !cands.empty() && !any_gpu_miss;
  if (!res.ranked.empty()) {
    kr.feasible = true;
    kr.best = res.ranked.front().report;
    kr.plan = cands[res.ranked.front().candidate].plan;
    kr.offload = lower.offload_nvme ? "nvme" : "";
    kr.reason.clear();
  } else {
    kr.reason = cands.empty() ? fmt::format("no layer packing fits {:.0f} MiB per GPU at any microbatch size",
                                            static_cast<double>(space.capacity_bytes) / static_cast<double>(core::kMiB))
                              : fmt::format("all {} candidates exceed a capacity or deadlock{}", cands.size(), miss);
  }
}
}  // namespace

KindResult best_plan_of_kind(core::PlanKind kind, const core::Model& model, const core::MachineSpec& machine, int gpus,
                             int minibatch, core::CostModelKind cost_model, const core::SearchSpec& search,
                             const core::Options& options, const std::vector<core::ActivationPolicy>& policies,
                             const core::SearchProgressFn& progress) {
  KindResult kr;
  kr.kind = kind;
  auto problem = core::split_problem(kind, gpus, minibatch);
  if (!problem) problem = core::stage_problem(kind, gpus, model.num_layers());
  if (problem) {
    kr.applicable = false;
    kr.reason = problem->message;
    return kr;
  }
  core::SearchSpec spec = search;
  spec.threads = 1;
  spec.fit_rule = false;
  core::SearchSpace space = core::search_space_for(kind, gpus, minibatch, machine.search_capacity_bytes(), spec,
                                                   options.unequal_microbatches);
  space.activation_policies = policies;
  const auto engine = make_engine(cost_model, model, machine);
  core::LowerOptions lower = core::lower_options(options);
  // One search on the tier with the masters and optimizer state in host memory or on the drives.
  auto search_tier = [&](bool nvme, bool* host_miss) {
    space.offloads = {nvme ? core::OffloadTier::Nvme : core::OffloadTier::Cpu};
    lower.offload_nvme = nvme;
    if (kind->packs) {
      search_packed(kr, space, model, *engine, lower, progress, host_miss);
    } else {
      search_unpacked(kr, space, model, *engine, lower, progress, host_miss);
    }
  };
  search_offload_tiers(kr, kind, machine, cost_model, search.offload, search_tier);
  return kr;
}

CompareResult compare_plan_kinds(const core::Model& model, const core::MachineSpec& machine, int gpus, int minibatch,
                                 core::CostModelKind cost_model, const core::SearchSpec& search,
                                 const core::Options& options, const CompareProgressFn& progress) {
  CompareResult out;
  const auto& names = core::plan_kinds();
  out.kinds.resize(names.size());
  // Progress: each kind's search reports its own counts; the sums go to `progress`, one call at a time.
  std::mutex progress_mutex;
  std::vector<core::SearchProgress> per_kind(names.size());
  std::size_t kinds_done = 0;
  std::size_t kinds_started = 0;
  auto report = [&] {  // with progress_mutex held
    CompareProgress p;
    p.kinds = names.size();
    p.kinds_done = kinds_done;
    p.kinds_started = kinds_started;
    for (const auto& k : per_kind) {
      p.candidates_done += k.done;
      p.candidates_total += k.total;
    }
    progress(p);
  };
  // Each kind's search runs on one thread; the kinds run side by side on all cores (deterministic:
  // every kind writes only its own slot).
  auto solve = [&](std::size_t slot) {
    core::SearchProgressFn on_search;
    if (progress) {
      {
        const std::lock_guard<std::mutex> lock(progress_mutex);
        ++kinds_started;
      }
      on_search = [&, slot](const core::SearchProgress& sp) {
        const std::lock_guard<std::mutex> lock(progress_mutex);
        per_kind[slot] = sp;
        report();
      };
    }
    try {
      out.kinds[slot] =
          best_plan_of_kind(names[slot], model, machine, gpus, minibatch, cost_model, search, options,
                            {core::ActivationPolicy::Checkpoint, core::ActivationPolicy::Keep}, on_search);
    } catch (const core::ScheduleError& e) {
      // a kind this machine or model cannot price (resident on a machine without gpu_rates.memory): its row says
      // why, and the other kinds are still compared
      KindResult kr;
      kr.kind = names[slot];
      kr.applicable = false;
      kr.reason = e.what();
      out.kinds[slot] = std::move(kr);
    }
    if (progress) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      ++kinds_done;
      report();
    }
  };
  unsigned threads = search.threads > 0 ? static_cast<unsigned>(search.threads) : std::thread::hardware_concurrency();
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(names.size())));
  core::parallel_for(names.size(), threads, solve);
  out.best_baseline_time_s = std::numeric_limits<double>::infinity();
  for (const auto& k : out.kinds) {
    if (k.feasible && k.kind->role == core::KindRole::Baseline)
      out.best_baseline_time_s = std::min(out.best_baseline_time_s, k.best.iteration_time_s);
  }
  out.ceiling_time_s = std::numeric_limits<double>::infinity();
  for (const auto& k : out.kinds) {
    if (k.feasible && k.kind->role == core::KindRole::Ceiling)
      out.ceiling_time_s = std::min(out.ceiling_time_s, k.best.iteration_time_s);
  }
  for (auto& k : out.kinds) {
    if (k.feasible && std::isfinite(out.best_baseline_time_s))
      k.speedup_over_best_baseline = out.best_baseline_time_s / k.best.iteration_time_s;
    if (k.feasible && std::isfinite(out.ceiling_time_s))
      k.fraction_of_ceiling = out.ceiling_time_s / k.best.iteration_time_s;
  }
  return out;
}

std::vector<std::string> ceiling_lines(const CompareResult& result) {
  std::vector<std::string> lines;
  for (const KindResult& c : result.kinds) {
    if (c.kind->role != core::KindRole::Ceiling) continue;
    if (!c.applicable) {
      lines.push_back(
          fmt::format("ceiling: {} (the in-memory trainer) cannot be compared here: {}", c.kind.name(), c.reason));
      continue;
    }
    if (!c.feasible) {
      lines.push_back(fmt::format(
          "ceiling: {} (the in-memory trainer: weights, gradients and AdamW state on every GPU) does not fit: {}. "
          "Training in memory is not an option here; the other rows are what can run",
          c.kind.name(), c.reason));
      continue;
    }
    std::string harmony;
    for (const KindResult& k : result.kinds) {
      if (k.kind->role != core::KindRole::Harmony) continue;
      harmony += harmony.empty() ? "; " : ", ";
      harmony += k.feasible
                     ? fmt::format("{} runs at {:.0f}% of its throughput", k.kind.name(), 100.0 * k.fraction_of_ceiling)
                     : fmt::format("{} has no plan", k.kind.name());
    }
    lines.push_back(fmt::format(
        "ceiling: {} (the in-memory trainer) fits: {:.3f} s per iteration, {} MiB peak per GPU{}", c.kind.name(),
        c.best.iteration_time_s, c.best.peak_memory_bytes / static_cast<core::Bytes>(core::kMiB), harmony));
  }
  return lines;
}

}  // namespace harmony::sim
