// The plan harmony-run runs: the config's, or --plan auto's (every candidate of the config's kind priced by
// harmony-sim, then tried one step each on fresh devices until one fits), and harmony-sim's prediction of it.
#include "apps/run/common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include "backend/executor/executor.hpp"
#include "backend/host_memory.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/profiler.hpp"
#include "backend/registry.hpp"
#include "backend/tokens.hpp"
#include "backend/train_checkpoint.hpp"
#include "core/base/atomic_file.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/profile.hpp"
#include "core/output/report.hpp"
#include "core/output/trace.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::run {

// The plan as it runs: its title (PlanKindSpec::describe) and its Program (PlanKindSpec::lower) on the run's model.
Chosen chosen_plan(const Setup& s, const core::Plan& plan) {
  Chosen c;
  c.plan = plan;
  c.title = core::describe_plan(plan, s.desc);
  c.program = core::lower_plan(plan, s.desc, lower_options(s.cfg));
  return c;
}

// --plan auto's candidates of the config's kind, each as the run would execute it (its Program lowered on the
// exact sizes), priced by harmony-sim on `priced`: the kind's own enumeration (core::enumerate_plans at the device
// capacity, whatever a swapping kind's estimate says: the trial step decides) that passes the runtime's rules; a kind
// with packs also one layer per pack at every microbatch pair (the least memory any packing takes, so a capacity too
// small for the packers still has candidates), and the config's own plan when it is a valid one.
struct Candidate {
  Chosen chosen;
  core::RunReport report;
};

std::vector<Candidate> auto_candidates(const Setup& s, const core::Model& priced, std::string& why_none) {
  const auto& cfg = s.cfg;
  const auto capacity = cfg.machine.search_capacity_bytes();
  const core::PlanKind kind = cfg.plan.kind;
  std::vector<Candidate> out;
  auto problem = core::split_problem(kind, cfg.plan.gpus, cfg.plan.minibatch);
  if (!problem) problem = core::stage_problem(kind, cfg.plan.gpus, priced.num_layers());
  if (problem) {
    why_none = problem->message;
    return out;
  }
  std::set<std::string> seen;
  const auto engine = sim::make_engine(cfg.cost_model, priced, cfg.machine);
  // the runtime needs D % u == 0 (unequal microbatches refused)
  core::SearchSpace space = core::search_space_for(kind, cfg.plan.gpus, cfg.plan.minibatch, capacity, cfg.search);
  space.drop_infeasible = false;  // the swap decisions' estimate is not the executor: the trial step decides
  space.activation_policies = {cfg.plan.knobs.activation_policy};
  auto try_add = [&](const core::Plan& p) {
    try {
      core::validate_plan(p, priced);  // the kind's rules: packs or stages, microbatch sizes in the profiled range
      // the runtime's rule: equal microbatches on every device's share (core/plan/plan_rules)
      if (!core::microbatch_fits(p.kind, p.gpus, p.minibatch, p.u_bwd) ||
          (!p.packs_fwd.empty() && !core::microbatch_fits(p.kind, p.gpus, p.minibatch, p.u_fwd)))
        return;
      Chosen c = chosen_plan(s, p);  // pp-swap keeps the stages balanced on the profile's times
      if (!seen.insert(c.title).second) return;
      core::RunReport r = engine->run(c.program).report;
      out.push_back(Candidate{std::move(c), std::move(r)});
    } catch (const core::ScheduleError&) {
      // not a plan this model can run: not a candidate
    }
  };
  for (const core::Candidate& c : core::enumerate_plans(priced, space)) try_add(c.plan);
  if (kind->packs) {
    core::Plan fine;
    fine.kind = kind;
    fine.gpus = cfg.plan.gpus;
    fine.minibatch = cfg.plan.minibatch;
    for (int l = 0; l < priced.num_layers(); ++l) fine.packs_bwd.push_back({l, l});
    fine.packs_fwd.assign(fine.packs_bwd.begin(), fine.packs_bwd.end() - 1);
    for (const int uf : core::candidate_ubatch_sizes(priced, core::Phase::Fwd, space))
      for (const int ub : core::candidate_ubatch_sizes(priced, core::Phase::Bwd, space)) {
        fine.u_fwd = uf;
        fine.u_bwd = ub;
        try_add(fine);
      }
    if (cfg.plan.u_fwd && cfg.plan.u_bwd && (cfg.plan.pack_size || cfg.plan.packs_bwd)) {
      try {
        try_add(core::plan_from_spec(cfg.plan, priced, capacity, cfg.file, "harmony-run", ""));
      } catch (const core::ConfigError&) {
        // the config's plan is not valid here (e.g. its u_fwd does not divide a new minibatch): the search replaces it
      }
    }
  }
  if (out.empty())
    why_none = fmt::format("no microbatch size of the profile ({}..{}) divides minibatch {} over {} devices",
                           priced.ubatch_min(core::Phase::Bwd), priced.ubatch_max(core::Phase::Bwd), cfg.plan.minibatch,
                           cfg.plan.gpus);
  return out;
}

// One step of `c` on fresh devices like the run's, with a scratch copy of the model and the run's first batch:
// the executor's own verdict on memory (allocation order, granularity and fragmentation included). Returns the
// out-of-memory message, or nullopt when the step ran.
std::optional<std::string> trial_step(const Setup& s, const Cli& cli, const Chosen& c) {
  check_host_memory(s, sim::host_account(c.program, s.desc), c.plan.gpus);
  backend::HostState scratch(*s.model);
  scratch.init_weights(s.cfg.model.init_seed);
  auto owned = make_devices(s.cfg, s.device_flags, c.plan.gpus);
  const std::vector<backend::Device*> devs = raw_devices(owned);
  const auto comm = make_communicator(s.cfg, cli, devs);
  std::vector<std::int32_t> in, tgt;
  s.tokens.batch(0, c.plan.minibatch, s.cfg.model.seq_len, in, tgt);
  try {
    backend::Executor executor(c.program, devs, scratch, executor_options(cli, s.cfg, comm.get()));
    (void)executor.step(in, tgt);
  } catch (const backend::OutOfMemory& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// At most this many candidates get a trial step before --plan auto gives up (the most promising first).
constexpr std::size_t kAutoTrials = 24;

// --plan auto: the candidates ranked (those harmony-sim predicts to fit by predicted step time; then the others by
// how far they exceed the capacity, then time; deadlocked ones never), and the first that runs a trial step on the
// devices wins. So a plan an explicit config proves possible is never reported impossible because the model's
// memory account disagrees with the executor's.
Chosen auto_choose(const Setup& s, const Cli& cli, bool quiet) {
  const auto& cfg = s.cfg;
  const std::string kind = cfg.plan.kind.name();
  const core::Model priced = priced_model(s, measured_profile(s, s.desc.ubatch_fwd, quiet));
  std::string why_none;
  std::vector<Candidate> cands = auto_candidates(s, priced, why_none);
  const std::size_t total = cands.size();
  std::size_t deadlocked = 0, predicted_fit = 0;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const core::RunReport& r = cands[i].report;
    if (r.deadlock) {
      ++deadlocked;
      continue;
    }
    if (r.feasible && r.fits) ++predicted_fit;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const core::RunReport &x = cands[a].report, &y = cands[b].report;
    const bool fx = x.feasible && x.fits, fy = y.feasible && y.fits;
    if (fx != fy) return fx;
    if (!fx && x.excess_bytes != y.excess_bytes) return x.excess_bytes < y.excess_bytes;
    return x.iteration_time_s < y.iteration_time_s;
  });
  const std::string hint =
      "raise machine.gpu_memory (--gpu-memory), use more devices (plan.gpus) or a smaller "
      "plan.minibatch";
  if (order.empty())
    throw core::ConfigError(cfg.plan.loc,
                            total == 0 ? fmt::format("--plan auto: no {} candidate: {}", kind, why_none)
                                       : fmt::format("--plan auto: all {} {} candidates deadlock", total, kind),
                            total == 0 ? "change plan.gpus or plan.minibatch" : hint);
  if (!quiet)
    fmt::print(stderr,
               "--plan auto: {} {} candidates ({} cost model, {} deadlocked), {} predicted to fit {:.2f} MiB; "
               "trying the best on the devices\n",
               total, kind, core::cost_model_name(cfg.cost_model), deadlocked, predicted_fit,
               mib(cfg.machine.gpu_memory_bytes));
  std::string first_oom;
  // A plan that ran out of memory shows the prediction is optimistic by at least its margin: a later candidate that
  // the model gives no more headroom (a predicted peak at or above the lowest that failed) is skipped untried, so the
  // trials walk towards headroom in time order instead of spending themselves on plans as tight as the failures
  // (the executor's allocator fragments; the model's account does not).
  core::Bytes failed_peak = std::numeric_limits<core::Bytes>::max();
  std::size_t trials = 0;
  for (std::size_t t = 0; t < order.size() && trials < kAutoTrials; ++t) {
    Candidate& c = cands[order[t]];
    if (c.report.peak_memory_bytes >= failed_peak) continue;
    ++trials;
    const std::optional<std::string> oom = trial_step(s, cli, c.chosen);
    if (!oom) {
      if (!quiet)
        fmt::print(stderr, "--plan auto: {} predicted {:.4f} s/step{}\n", c.chosen.title, c.report.iteration_time_s,
                   c.report.fits ? ""
                                 : fmt::format(" (predicted peak {:.2f} MiB; the trial step ran)",
                                               mib(c.report.peak_memory_bytes)));
      c.chosen.priced = priced;
      return std::move(c.chosen);
    }
    if (first_oom.empty()) first_oom = *oom;
    failed_peak = std::min(failed_peak, c.report.peak_memory_bytes);
    if (!quiet) fmt::print(stderr, "--plan auto: {} ran out of device memory in a trial step; next\n", c.chosen.title);
  }
  throw core::ConfigError(cfg.plan.loc,
                          fmt::format("--plan auto: the {} most promising of {} {} candidates all ran out of memory "
                                      "in a trial step on {:.2f} MiB devices (the others were predicted no more "
                                      "headroom than those, or were past {} trials); first: {}",
                                      trials, total, kind, mib(cfg.machine.gpu_memory_bytes), kAutoTrials, first_oom),
                          hint);
}

Chosen choose(const Setup& s, const Cli& cli, bool quiet) {
  const auto& cfg = s.cfg;
  if (cli.plan == "auto") return auto_choose(s, cli, quiet);
  // a kind without packs runs the config's one microbatch (plan.u_bwd)
  return chosen_plan(s, core::plan_from_spec(cfg.plan, s.desc, cfg.machine.gpu_memory_bytes, cfg.file, "harmony-run",
                                             "add `u_fwd: U` and `u_bwd: U` to plan:, or use --plan auto"));
}

// `serial`: the run used the serial executor (one op at a time), so the prediction runs the ops one at a time
// too (sim::NativeOptions::serial); with concurrent queues, the default engine.
Prediction predict(const Setup& s, const Chosen& c, bool serial, bool quiet) {
  try {
    std::vector<int> sizes = {c.plan.u_fwd, c.plan.u_bwd};
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const core::Model priced = c.priced ? *c.priced : priced_model(s, measured_profile(s, sizes, quiet));
    sim::NativeOptions options;
    options.serial = serial;
    const core::RunReport r = sim::NativeEngine(priced, s.cfg.machine, options).run(c.program).report;
    if (r.deadlock) return {std::nullopt, "harmony-sim finds the Program deadlocks"};
    return {r.iteration_time_s, ""};
  } catch (const backend::OutOfMemory& e) {
    return {std::nullopt, fmt::format("profiling for the prediction ran out of device memory: {}", e.what())};
  } catch (const backend::DeviceError& e) {  // e.g. the GPU has less free memory than the profile's device asks
    return {std::nullopt, fmt::format("profiling for the prediction failed on the device: {}", e.what())};
  } catch (const core::ScheduleError& e) {
    return {std::nullopt, e.what()};
  }
}

// (measured - predicted) / predicted: + means the run was slower than predicted; NaN: no prediction.
double prediction_error(const Prediction& predicted, double measured_step_s) {
  return predicted.step_s && *predicted.step_s > 0 ? (measured_step_s - *predicted.step_s) / *predicted.step_s
                                                   : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace harmony::run
