// harmony-sim `simulate` (one plan priced, its bottleneck report, a Chrome trace) and `search` (the paper's search
// space ranked, the pack bound grown while nothing fits, the best plan's trace): docs/cli.md.
#include "sim/app/commands.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/output/trace.hpp"
#include "core/program/lower.hpp"
#include "core/program/task_graph.hpp"
#include "core/search/search.hpp"
#include "sim/app/progress_cli.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::sim::app {

namespace {

core::Plan plan_from_config(const core::RunConfig& cfg, const core::Model& model) {
  return core::plan_from_spec(cfg.plan, model, cfg.machine.search_capacity_bytes(), cfg.file, "`simulate`",
                              "add `u_bwd: U` (its microbatch size) to `plan:`");
}

void print_report_table(const core::RunReport& r) {
  fmt::print("{}\n", core::report_title(r));
  if (r.deadlock) {
    fmt::print("DEADLOCK: no op can start; blocked streams:\n{}", r.deadlock_report);
    return;
  }
  fmt::print(
      "iteration time  {:>12.6f} s\nthroughput      {:>12.3f} samples/s\npeak memory     {:>12.0f} MiB (cost "
      "model: {})\n",
      r.iteration_time_s, r.throughput_samples_per_s, mib(r.peak_memory_bytes), r.cost_model);
  fmt::print("swap in {:.0f} MiB, swap out {:.0f} MiB, p2p {:.0f} MiB, cpu msg {:.0f} MiB; {} ops on {} streams\n\n",
             mib(r.swap_in_bytes), mib(r.swap_out_bytes), mib(r.p2p_bytes), mib(r.msg_bytes), r.num_ops, r.num_streams);
  fmt::print("{:>4}  {:>12}  {:>12}  {:>8}  {:>10}  {:>9}\n", "gpu", "end (s)", "compute (s)", "busy %", "memory MiB",
             "end idle");
  for (const auto& g : r.per_gpu) {
    fmt::print("{:>4}  {:>12.6f}  {:>12.6f}  {:>7.1f}%  {:>10.0f}  {:>8.1f}%\n", g.gpu, g.end_time_s, g.compute_time_s,
               g.end_time_s > 0 ? 100.0 * g.compute_time_s / g.end_time_s : 0.0, mib(g.peak_memory_bytes),
               100.0 * g.end_idle);
  }
  if (r.native) {
    const auto& l = r.ledger;
    fmt::print(
        "\nswap ledger (MiB): PCIe h2d {:.0f}, PCIe d2h {:.0f}, P2P PCIe {:.0f}, NVLink {:.0f}, host staging {:.0f}, "
        "CPU msg {:.0f}\n  by tensor: weights {:.0f}, weight grads {:.0f}, optimizer state {:.0f}, activations "
        "{:.0f}, stashes {:.0f}, activation grads {:.0f}\n",
        mib(l.pcie_h2d_bytes), mib(l.pcie_d2h_bytes), mib(l.p2p_pcie_bytes), mib(l.nvlink_bytes),
        mib(l.host_staging_bytes), mib(l.cpu_msg_bytes), mib(l.weights_bytes), mib(l.weight_grad_bytes),
        mib(l.optimizer_state_bytes), mib(l.activation_bytes), mib(l.stash_bytes), mib(l.act_grad_bytes));
    fmt::print(
        "host memory: {:.2f} GiB needed (master weights {:.2f}, optimizer {:.2f}, gradients {:.2f}, stashes "
        "{:.2f}){}\n",
        static_cast<double>(r.host_memory.total_bytes()) / static_cast<double>(core::kGiB),
        static_cast<double>(r.host_memory.master_weights_bytes) / static_cast<double>(core::kGiB),
        static_cast<double>(r.host_memory.optimizer_state_bytes) / static_cast<double>(core::kGiB),
        static_cast<double>(r.host_memory.gradient_bytes) / static_cast<double>(core::kGiB),
        static_cast<double>(r.host_memory.stash_bytes) / static_cast<double>(core::kGiB),
        r.host_memory.capacity_bytes > 0
            ? fmt::format(" of {:.0f} GiB",
                          static_cast<double>(r.host_memory.capacity_bytes) / static_cast<double>(core::kGiB))
            : std::string());
  }
  if (!r.fits)
    fmt::print("\nDOES NOT FIT: peak {:.0f} MiB > GPU capacity {:.0f} MiB by {} bytes{}\n", mib(r.peak_memory_bytes),
               mib(r.gpu_capacity_bytes), r.excess_bytes,
               r.native ? "" : " (flagged only: the reference model keeps the paper's timings)");
  if (!r.feasible) fmt::print("\nINFEASIBLE: {}\n", r.infeasible_reason);
  fmt::print("\n{}\n", core::summary_line(r, "simulated"));
}

}  // namespace

int cmd_simulate(const Cli& cli) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  const auto cfg = core::load_config(cli.config, cli.sets);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto plan = plan_from_config(cfg, model);
  const auto t0 = std::chrono::steady_clock::now();
  const auto engine = sim::make_engine(cfg.cost_model, model, cfg.machine, !cli.trace.empty());
  const auto e = sim::evaluate_plan(*engine, model, plan, lower_options(cfg));
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!cli.trace.empty()) write_trace(cli.trace, e, core::report_title(e.report));
  if (cli.format == "json") {
    nlohmann::json j = document_head("simulate", cfg, model);
    j["prefetch"] = cfg.options.prefetch;
    j["result"] = core::report_to_json(e.report);
    j["bottleneck"] = e.report.deadlock ? nlohmann::json(nullptr)
                                        : sim::bottleneck_json(e.program, bottleneck_of(e.program, model, cfg));
    j["wall_time_s"] = dt;
    std::cout << j.dump(2) << "\n";
  } else {
    print_report_table(e.report);
    if (!e.report.deadlock) fmt::print("\n{}", sim::bottleneck_text(e.program, bottleneck_of(e.program, model, cfg)));
    fmt::print("simulated {} ops in {:.3f} ms\n", e.program.ops.size(), dt * 1e3);
    if (!cli.trace.empty()) fmt::print("trace written to {}\n", cli.trace);
  }
  if (e.report.deadlock) {
    fmt::print(stderr, "{}: error: the plan deadlocks\n{}", cfg.file, e.report.deadlock_report);
    return kExitBadInput;
  }
  if (!e.report.feasible) {
    fmt::print(stderr, "{}: error: the plan does not fit: {}\n  hint: use more GPUs, smaller microbatches or packs\n",
               cfg.file, e.report.infeasible_reason);
    return kExitBadInput;
  }
  return 0;
}

namespace {

// A search's outcome: the grown search's last result, the ops its evaluations lowered, and the fastest evaluation
// seen (kept for the best plan's trace and bottleneck report: without --trace the search's engine is the one that
// would evaluate it again).
struct SearchOutcome {
  core::GrownSearch grown;
  std::size_t ops = 0;
  std::optional<sim::Evaluation> fastest;
};

// Ranks the space's candidates on `engine`, top_k best: a candidate the engine shows cannot beat the k-th best so
// far is declined (core::run_search_bounded); kinds with packs: Wide's bound grows while nothing under it fits the
// GPU memory (core::search_growing_bound).
SearchOutcome run_ranked_search(const Cli& cli, const core::Model& model, const core::SearchSpace& space,
                                const core::LowerOptions& lower, const sim::Engine& engine) {
  std::atomic<std::size_t> ops{0};
  sim::ProgressPrinter printer("search", "candidates", cli.quiet, kProgressDelayS);
  // Used when it is the ranking's first (the fit rule or a tie may rank another first; that one is evaluated again).
  std::mutex fastest_mutex;
  std::optional<sim::Evaluation> fastest;
  auto search_once = [&](const std::vector<core::Candidate>& candidates, const core::SearchSpace& sp) {
    return core::run_search_bounded(
        candidates, sp, model,
        [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
          auto e = sim::evaluate_plan_within(engine, model, p, lower, cutoff_s);
          if (!e) return std::nullopt;
          ops += e->program.ops.size();
          core::RunReport r = e->report;
          if (cli.trace.empty() && !r.deadlock && r.feasible) {
            const std::lock_guard<std::mutex> lock(fastest_mutex);
            if (!fastest || r.iteration_time_s < fastest->report.iteration_time_s) fastest = std::move(*e);
          }
          return r;
        },
        [&](const core::SearchProgress& p) { printer.update(p.done, p.total, p.done == p.total); },
        [&](const core::Plan& p) { return sim::task_bound_for(engine, model, p, lower); });
  };
  SearchOutcome out{core::search_growing_bound(model, space, search_once), 0, std::nullopt};
  out.ops = ops.load();
  out.fastest = std::move(fastest);
  return out;
}

// The ranking's first plan evaluated (the search's fastest evaluation when it is that plan, else evaluated again),
// its trace written when asked for; nullopt when nothing ranked.
std::optional<sim::Evaluation> evaluate_best(const Cli& cli, const core::RunConfig& cfg, const core::Model& model,
                                             const core::LowerOptions& lower, SearchOutcome& s) {
  const auto& res = s.grown.result;
  if (res.ranked.empty()) return std::nullopt;
  std::optional<sim::Evaluation> best;
  const core::Plan& first = res.ranked.front().report.plan;
  const auto same = [&](const core::Plan& p) {  // a candidate is its microbatch sizes and packs
    return p.u_fwd == first.u_fwd && p.u_bwd == first.u_bwd && p.packs_fwd == first.packs_fwd &&
           p.packs_bwd == first.packs_bwd;
  };
  if (s.fastest && same(s.fastest->report.plan)) {
    best = std::move(s.fastest);
  } else {
    const auto traced = sim::make_engine(cfg.cost_model, model, cfg.machine, !cli.trace.empty());
    best = sim::evaluate_plan(*traced, model, first, lower);
  }
  return best;
}

void print_search_json(const core::RunConfig& cfg, const core::Model& model, const core::SearchSpace& space,
                       const core::GrownSearch& grown, const sim::Evaluation* best,
                       const std::optional<sim::Bottleneck>& best_bottleneck, double dt) {
  const auto& res = grown.result;
  nlohmann::json results = nlohmann::json::array();
  for (std::size_t i = 0; i < res.ranked.size(); ++i) {
    auto j = core::report_to_json(res.ranked[i].report);
    j["rank"] = i + 1;
    j["rank_time_s"] = res.ranked[i].rank_time_s;
    results.push_back(std::move(j));
  }
  nlohmann::json j = document_head("search", cfg, model);
  j["plan_kind"] = core::plan_kind_name(space.kind);
  j["gpus"] = space.gpus;
  j["minibatch"] = space.minibatch;
  j["gpu_capacity_bytes"] = space.capacity_bytes;
  j["num_candidates"] = res.num_candidates;
  j["num_deadlocked"] = res.num_deadlocked;
  j["num_pruned"] = res.num_pruned;
  j["fit_rule"] = space.spec.fit_rule;
  j["pack_counts"] = core::pack_counts_name(space.spec.pack_counts);
  j["max_packs"] = grown.max_packs;
  j["max_packs_configured"] = grown.configured_max_packs;
  j["prefetch"] = cfg.options.prefetch;
  j["results"] = std::move(results);
  j["best_bottleneck"] =
      best_bottleneck ? sim::bottleneck_json(best->program, *best_bottleneck) : nlohmann::json(nullptr);
  j["wall_time_s"] = dt;
  std::cout << j.dump(2) << "\n";
}

// The text report's head: what was searched, the pack bound (and whether it grew), the counts and the rate.
void print_search_head(const core::RunConfig& cfg, const core::Model& model, const core::SearchSpace& space,
                       const core::GrownSearch& grown, std::size_t ops, double dt) {
  const auto& res = grown.result;
  fmt::print("search: {} {} GPUs, minibatch {}, capacity {:.0f} MiB per GPU, {} on {}\n",
             core::plan_kind_name(space.kind), space.gpus, space.minibatch, mib(space.capacity_bytes), model.name,
             cfg.machine.name);
  std::string bound = " (the paper's: each method's memory minimum)";
  if (space.spec.pack_counts == core::PackCounts::Wide) {
    bound = fmt::format(" (up to {} packs beyond each method's minimum)", grown.max_packs);
    if (grown.grew())
      bound += fmt::format(
          "; the bound grew from {}: no plan under it fit the GPU memory (search.packs_per_gpu: {} searches this "
          "bound at once)",
          grown.configured_max_packs, grown.space.spec.packs_per_gpu);
  }
  fmt::print("pack counts: {}{}, prefetch {}\n", core::pack_counts_name(space.spec.pack_counts), bound,
             cfg.options.prefetch ? "on" : "off");
  fmt::print("{} candidates ({} deadlocked, {} declined by a lower bound) searched in {:.1f} ms, {:.2f} M ops/s{}\n\n",
             res.num_candidates, res.num_deadlocked, res.num_pruned, dt * 1e3,
             dt > 0 ? static_cast<double>(ops) / dt / 1e6 : 0.0,
             space.spec.fit_rule ? "; fit rule ON: single-pack plans ranked at time/1000" : "");
}

// The ranked plans' table, and a note on how many of them are over the GPU capacity.
void print_ranked_table(const core::SearchResult& res) {
  std::size_t wf = 9;
  std::size_t wb = 9;
  for (const auto& rr : res.ranked) {
    wf = std::max(wf, core::packs_to_string(rr.report.plan.packs_fwd).size());
    wb = std::max(wb, core::packs_to_string(rr.report.plan.packs_bwd).size());
  }
  fmt::print("{:>4}  {:>9}  {:>10}  {:>5}  {:>5}  {:>8}  {:>6}  {:<{}}  {:<{}}  {}\n", "rank", "time (s)", "samples/s",
             "u_fwd", "u_bwd", "mem MiB", "idle%", "packs_fwd", wf, "packs_bwd", wb, "packing fwd / bwd");
  std::size_t over = 0;
  for (std::size_t i = 0; i < res.ranked.size(); ++i) {
    const auto& r = res.ranked[i].report;
    over += r.fits ? 0 : 1;
    fmt::print("{:>4}  {:>9.3f}  {:>10.3f}  {:>5}  {:>5}  {:>8.0f}{} {:>5.0f}%  {:<{}}  {:<{}}  {} / {}\n", i + 1,
               r.iteration_time_s, r.throughput_samples_per_s, r.plan.u_fwd, r.plan.u_bwd, mib(r.peak_memory_bytes),
               r.fits ? " " : "!", 100.0 * r.max_end_idle, core::packs_to_string(r.plan.packs_fwd), wf,
               core::packs_to_string(r.plan.packs_bwd), wb, r.method_fwd.empty() ? "-" : r.method_fwd, r.method_bwd);
  }
  if (over > 0)
    fmt::print(
        "\n! {} of {} plans do not fit: peak memory above the GPU capacity ({:.0f} MiB); flagged, not "
        "demoted, under the reference model\n",
        over, res.ranked.size(), mib(res.ranked.front().report.gpu_capacity_bytes));
}

}  // namespace

int cmd_search(const Cli& cli) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  const auto cfg = core::load_config(cli.config, cli.sets);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto space =
      core::search_space_for(cfg.plan.kind, cfg.plan.gpus, cfg.plan.minibatch, cfg.machine.search_capacity_bytes(),
                             cfg.search, cfg.options.unequal_microbatches);
  const auto lower = lower_options(cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const auto engine = sim::make_engine(cfg.cost_model, model, cfg.machine);
  SearchOutcome outcome = run_ranked_search(cli, model, space, lower, *engine);
  const core::GrownSearch& grown = outcome.grown;
  const auto& res = grown.result;
  const auto& cands = grown.candidates;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::optional<sim::Evaluation> best = evaluate_best(cli, cfg, model, lower, outcome);
  std::optional<sim::Bottleneck> best_bottleneck;
  if (best) {
    best_bottleneck = bottleneck_of(best->program, model, cfg);
    if (!cli.trace.empty()) write_trace(cli.trace, *best, core::report_title(best->report));
  }
  if (cli.format == "json") {
    print_search_json(cfg, model, space, grown, best ? &*best : nullptr, best_bottleneck, dt);
    return 0;
  }
  print_search_head(cfg, model, space, grown, outcome.ops, dt);
  if (res.ranked.empty()) {
    if (res.first_miss < cands.size()) {
      const auto& c = cands[res.first_miss].plan;
      fmt::print("no feasible configuration; the first miss, u {}/{}: {}\n", c.u_fwd, c.u_bwd, res.first_miss_reason);
    } else {
      fmt::print("no feasible configuration: every candidate deadlocks\n");
    }
    return 0;
  }
  print_ranked_table(res);
  fmt::print("\n{}\n", core::summary_line(res.ranked.front().report, "Top1"));
  fmt::print("\nTop1 {}", sim::bottleneck_text(best->program, *best_bottleneck));
  if (!cli.trace.empty()) fmt::print("trace of the best plan written to {}\n", cli.trace);
  return 0;
}

}  // namespace harmony::sim::app
