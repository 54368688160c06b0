// harmony-sim: the command line of the simulator. `simulate` prices one plan, `search` ranks the
// paper's search space; both read a YAML config (+ --set overrides) and can write a Chrome trace.
// The only place (with harmony-run's main) that prints and chooses exit codes: 0 ok, 2 bad input.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <optional>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/profile.hpp"
#include "core/output/trace.hpp"
#include "core/program/lower.hpp"
#include "core/program/task_graph.hpp"
#include "core/search/search.hpp"
#include "sim/bottleneck.hpp"
#include "sim/calibrate.hpp"
#include "sim/cli_error.hpp"
#include "sim/compare.hpp"
#include "sim/compare_deepspeed.hpp"
#include "sim/cost_native.hpp"
#include "sim/evaluate.hpp"
#include "sim/memory_answer.hpp"
#include "sim/progress_cli.hpp"
#include "sim/report.hpp"
#include "sim/sweep_cli.hpp"

using namespace harmony;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 70;        // EX_SOFTWARE: a bug in harmony (core::InternalError), never bad input
constexpr double kProgressDelayS = 2.0;  // search and compare show progress once they run longer than this

struct Cli {
  std::string config;
  std::vector<std::string> sets;
  std::string format = "table";
  std::string trace;
  bool quiet = false;                // search, compare: no progress on stderr
  std::string deepspeed;             // compare: a DeepSpeed config priced beside Harmony's best plan
  std::string memory_plan = "best";  // memory: each kind's most promising plan (best) or the config's (config)
};

double mib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kMiB); }

// The fields every harmony-sim document of a config opens with (docs/output-schema.md).
nlohmann::json document_head(const char* command, const core::RunConfig& cfg, const core::Model& model) {
  return {{"schema_version", core::kOutputSchemaVersion},
          {"command", command},
          {"config_path", cfg.file},
          {"profile_path",
           cfg.model.profile_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(cfg.model.profile_path)},
          {"model_name", model.name},
          {"machine_name", cfg.machine.name},
          {"cost_model", core::cost_model_name(cfg.cost_model)}};
}

core::Plan plan_from_config(const core::RunConfig& cfg, const core::Model& model) {
  return core::plan_from_spec(cfg.plan, model, cfg.machine.search_capacity_bytes(), cfg.file, "`simulate`",
                              "add `u_bwd: U` (its microbatch size) to `plan:`");
}

core::LowerOptions lower_options(const core::RunConfig& cfg) { return core::lower_options(cfg.options); }

// Every GPU lowered (calibrate compares per-op timings of every device).
core::LowerOptions all_gpus(core::LowerOptions o) {
  o.dp_first_gpu_only = false;
  return o;
}

// The bottleneck report of a plan, re-simulated with the native engine (with the reference cost model: the
// engine's reference settings, which reproduce it) — docs/bottleneck.md.
sim::Bottleneck bottleneck_of(const core::Program& program, const core::Model& model, const core::RunConfig& cfg) {
  const sim::NativeOptions o = sim::native_options_for(cfg.cost_model);
  return sim::simulate_bottleneck(program, model, cfg.machine, o);
}

// The Chrome trace of `e`; with the native engine's result (an engine made with counters on: the same run),
// its counter tracks: per-GPU memory in use and per-link bandwidth in use.
void write_trace(const std::string& path, const sim::Evaluation& e, const std::string& title) {
  auto doc = core::chrome_trace_json(e.program, e.timeline.begin_ps, e.timeline.end_ps,
                                     core::TraceMeta{"harmony-sim (" + e.report.cost_model + ")", title});
  if (e.native) sim::append_native_counters(doc["traceEvents"], *e.native);
  core::write_file_atomic(path, doc.dump(1) + "\n", "the trace");
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
        static_cast<double>(r.host_memory.total_bytes) / static_cast<double>(core::kGiB),
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

int cmd_search(const Cli& cli) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  const auto cfg = core::load_config(cli.config, cli.sets);
  const auto model = core::load_model(cfg.model, cfg.machine);
  core::SearchSpace space;
  space.kind = cfg.plan.kind;
  space.gpus = cfg.plan.gpus;
  space.minibatch = cfg.plan.minibatch;
  space.capacity_bytes = cfg.machine.search_capacity_bytes();
  space.unequal_microbatches = cfg.options.unequal_microbatches;
  space.spec = cfg.search;
  space.knobs.swap = cfg.search.swap;  // dp-swap, pp-swap: search.swap (default plan.swap)
  const auto lower = lower_options(cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const auto engine = sim::make_engine(cfg.cost_model, model, cfg.machine);
  std::atomic<std::size_t> ops{0};
  sim::ProgressPrinter printer("search", "candidates", cli.quiet, kProgressDelayS);
  // The fastest evaluation so far, kept for the trace and bottleneck report of the best plan: without --trace the
  // search's engine is the one that would evaluate it again. Used when it is the ranking's first (the fit rule or a
  // tie may rank another first; that one is evaluated again).
  std::mutex fastest_mutex;
  std::optional<sim::Evaluation> fastest;
  // top_k best: a candidate the engine shows cannot beat the k-th best so far is declined (core::run_search_bounded)
  auto search_once = [&](const std::vector<core::Candidate>& candidates, const core::SearchSpace& sp) {
    return core::run_search_bounded(
        candidates, sp, model,
        [&](const core::Plan& p, double cutoff_s) -> std::optional<core::RunReport> {
          auto e = sim::evaluate_plan_within(*engine, model, p, lower, cutoff_s);
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
        [&](const core::Plan& p) { return sim::task_bound_for(*engine, model, p, lower); });
  };
  // kinds with packs: Wide's bound grows while nothing under it fits the GPU memory (core::search_growing_bound)
  std::optional<core::GrownSearch> grown;
  std::vector<core::Candidate> listed;
  if (space.kind->packs) {
    grown = core::search_growing_bound(model, space, search_once);
  } else {
    listed = core::enumerate_plans(model, space);
  }
  const auto res = grown ? grown->result : search_once(listed, space);
  const auto& cands = grown ? grown->candidates : listed;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::optional<sim::Evaluation> best;
  std::optional<sim::Bottleneck> best_bottleneck;
  if (!res.ranked.empty()) {
    const core::Plan& first = res.ranked.front().report.plan;
    const auto same = [&](const core::Plan& p) {  // a candidate is its microbatch sizes and packs
      return p.u_fwd == first.u_fwd && p.u_bwd == first.u_bwd && p.packs_fwd == first.packs_fwd &&
             p.packs_bwd == first.packs_bwd;
    };
    if (fastest && same(fastest->report.plan)) {
      best = std::move(fastest);
    } else {
      const auto traced = sim::make_engine(cfg.cost_model, model, cfg.machine, !cli.trace.empty());
      best = sim::evaluate_plan(*traced, model, first, lower);
    }
    best_bottleneck = bottleneck_of(best->program, model, cfg);
    if (!cli.trace.empty()) write_trace(cli.trace, *best, core::report_title(best->report));
  }
  if (cli.format == "json") {
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
    j["max_packs"] = grown ? grown->max_packs : core::max_pack_count(model, space);
    j["max_packs_configured"] = grown ? grown->configured_max_packs : core::max_pack_count(model, space);
    j["prefetch"] = cfg.options.prefetch;
    j["results"] = std::move(results);
    j["best_bottleneck"] =
        best_bottleneck ? sim::bottleneck_json(best->program, *best_bottleneck) : nlohmann::json(nullptr);
    j["wall_time_s"] = dt;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("search: {} {} GPUs, minibatch {}, capacity {:.0f} MiB per GPU, {} on {}\n",
             core::plan_kind_name(space.kind), space.gpus, space.minibatch, mib(space.capacity_bytes), model.name,
             cfg.machine.name);
  std::string bound = " (the paper's: each method's memory minimum)";
  if (space.spec.pack_counts == core::PackCounts::Wide) {
    bound = fmt::format(" (up to {} packs beyond each method's minimum)",
                        grown ? grown->max_packs : core::max_pack_count(model, space));
    if (grown && grown->grew())
      bound += fmt::format(
          "; the bound grew from {}: no plan under it fit the GPU memory (search.packs_per_gpu: {} searches this "
          "bound at once)",
          grown->configured_max_packs, grown->space.spec.packs_per_gpu);
  }
  fmt::print("pack counts: {}{}, prefetch {}\n", core::pack_counts_name(space.spec.pack_counts), bound,
             cfg.options.prefetch ? "on" : "off");
  fmt::print("{} candidates ({} deadlocked, {} declined by a lower bound) searched in {:.1f} ms, {:.2f} M ops/s{}\n\n",
             res.num_candidates, res.num_deadlocked, res.num_pruned, dt * 1e3,
             dt > 0 ? static_cast<double>(ops.load()) / dt / 1e6 : 0.0,
             space.spec.fit_rule ? "; fit rule ON: single-pack plans ranked at time/1000" : "");
  if (res.ranked.empty()) {
    if (res.first_miss < cands.size()) {
      const auto& c = cands[res.first_miss].plan;
      fmt::print("no feasible configuration; the first miss, u {}/{}: {}\n", c.u_fwd, c.u_bwd, res.first_miss_reason);
    } else {
      fmt::print("no feasible configuration: every candidate deadlocks\n");
    }
    return 0;
  }
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
  fmt::print("\n{}\n", core::summary_line(res.ranked.front().report, "Top1"));
  fmt::print("\nTop1 {}", sim::bottleneck_text(best->program, *best_bottleneck));
  if (!cli.trace.empty()) fmt::print("trace of the best plan written to {}\n", cli.trace);
  return 0;
}

// compare --trace: the fastest kind's best plan, re-evaluated to get its Program and timeline; nullopt when no
// kind fits.
std::optional<sim::Evaluation> winner_of(const sim::CompareResult& res, const core::Model& model,
                                         const core::RunConfig& cfg) {
  const sim::KindResult* win = nullptr;
  for (const auto& k : res.kinds) {
    if (k.feasible && (!win || k.best.iteration_time_s < win->best.iteration_time_s)) win = &k;
  }
  if (!win) return std::nullopt;
  const auto engine = sim::make_engine(cfg.cost_model, model, cfg.machine, true);  // the trace's counters
  core::LowerOptions lower = lower_options(cfg);
  lower.offload_nvme = win->offload == "nvme";  // the tier the search chose
  return sim::evaluate_plan(*engine, model, *win->plan, lower);
}

int cmd_compare(const Cli& cli) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  // --deepspeed: the DeepSpeed run's minibatch and dtype as overrides after the user's (sim/compare_deepspeed.hpp)
  std::optional<sim::DeepSpeedSetup> ds;
  std::vector<std::string> sets = cli.sets;
  if (!cli.deepspeed.empty()) {
    ds = sim::setup_deepspeed(cli.config, cli.sets, cli.deepspeed);
    sets.insert(sets.end(), ds->overrides.begin(), ds->overrides.end());
  }
  const auto cfg = core::load_config(cli.config, sets);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto t0 = std::chrono::steady_clock::now();
  sim::ProgressPrinter printer("compare", "candidates", cli.quiet, kProgressDelayS);
  // The total grows while kinds are still to start: no ETA until every kind has enumerated its candidates.
  auto on_progress = [&](const sim::CompareProgress& p) {
    const double t = printer.elapsed_s();
    const double rate = t > 0 ? static_cast<double>(p.candidates_done) / t : 0.0;
    const bool known = p.kinds_started == p.kinds && rate > 0;
    printer.update(p.candidates_done, p.candidates_total, rate,
                   known ? static_cast<double>(p.candidates_total - p.candidates_done) / rate : -1.0,
                   p.kinds_done == p.kinds, fmt::format("{}/{} kinds finished", p.kinds_done, p.kinds));
  };
  const auto res = sim::compare_plan_kinds(model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model,
                                           cfg.search, cfg.options, on_progress);
  const std::optional<sim::KindResult> ds_row = ds ? sim::price_deepspeed(*ds, cli.config, sets, model) : std::nullopt;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string trace_note;
  bool trace_written = false;
  if (!cli.trace.empty()) {
    if (const auto win = winner_of(res, model, cfg)) {
      write_trace(cli.trace, *win, core::report_title(win->report));
      trace_written = true;
      trace_note = fmt::format("trace of the fastest plan ({}) written to {}", win->report.plan.kind.name(), cli.trace);
    } else {
      trace_note = "no trace written: no plan kind fits";
    }
  }
  if (cli.format == "json") {
    nlohmann::json results = nlohmann::json::array();
    for (const auto& k : res.kinds) {
      nlohmann::json j;
      j["plan_kind"] = core::plan_kind_name(k.kind);
      j["role"] = core::kind_role_name(k.kind->role);
      j["feasible"] = k.feasible;
      j["num_candidates"] = k.candidates;
      j["num_pruned"] = k.pruned;
      j["reason"] = k.feasible ? nlohmann::json(nullptr) : nlohmann::json(k.reason);
      j["speedup_over_best_baseline"] = k.feasible && std::isfinite(res.best_baseline_time_s)
                                            ? nlohmann::json(k.speedup_over_best_baseline)
                                            : nlohmann::json(nullptr);
      j["fraction_of_ceiling"] = k.fraction_of_ceiling > 0 ? nlohmann::json(k.fraction_of_ceiling) : nullptr;
      // kinds with the activations knob: both policies are searched; the winner is best.plan.knobs.activation_policy
      nlohmann::json pol = nullptr;
      if (k.kind.has_knob(core::Knob::Activations)) {
        pol = nlohmann::json::object();
        for (const std::string& name : core::activation_policy_names()) {
          const auto it = k.policy_best_time_s.find(name);
          pol[name] = it == k.policy_best_time_s.end() ? nlohmann::json(nullptr) : nlohmann::json(it->second);
        }
      }
      j["policy_best_time_s"] = std::move(pol);
      j["offload"] = k.offload.empty() ? nlohmann::json(nullptr) : nlohmann::json(k.offload);
      j["best"] = k.feasible ? core::report_to_json(k.best) : nlohmann::json(nullptr);
      results.push_back(std::move(j));
    }
    nlohmann::json j = document_head("compare", cfg, model);
    j["gpus"] = cfg.plan.gpus;
    j["minibatch"] = cfg.plan.minibatch;
    j["best_baseline_time_s"] =
        std::isfinite(res.best_baseline_time_s) ? nlohmann::json(res.best_baseline_time_s) : nlohmann::json(nullptr);
    j["results"] = std::move(results);
    j["trace_path"] = trace_written ? nlohmann::json(cli.trace) : nlohmann::json(nullptr);
    j["deepspeed"] = ds ? sim::deepspeed_json(*ds, ds_row, res) : nlohmann::json(nullptr);
    j["wall_time_s"] = dt;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("compare: {} on {} ({} GPUs used), minibatch {}, cost model {}; {:.1f} ms\n\n", model.name,
             cfg.machine.name, cfg.plan.gpus, cfg.plan.minibatch, core::cost_model_name(cfg.cost_model), dt * 1e3);
  fmt::print("{:<14} {:>6} {:>10} {:>10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}  {}\n", "plan kind", "cands",
             "time (s)", "samples/s", "speedup", "u f/b", "swap MiB", "p2p MiB", "coll MiB", "peak MiB", "host GiB",
             "plan / reason");
  // One row; `label` names it (the kind, or the DeepSpeed run), `note` opens its plan column.
  auto print_row = [&](const std::string& label, const sim::KindResult& k, const std::string& note) {
    if (!k.feasible) {
      fmt::print("{:<14} {:>6} {:>10} {:>10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}  {}does not fit: {}\n", label,
                 k.candidates, "-", "-", "-", "-", "-", "-", "-", "-", "-", note, k.reason);
      return;
    }
    const auto& r = k.best;
    const std::string r_policy = core::activation_policy_name(r.plan.knobs.activation_policy);
    std::string plan = !k.kind->packs ? fmt::format("u {}, {}", r.plan.u_bwd, r_policy)
                                      : fmt::format("fwd {} bwd {}, {}", core::packs_to_string(r.plan.packs_fwd),
                                                    core::packs_to_string(r.plan.packs_bwd), r_policy);
    for (const auto& [policy, t] : k.policy_best_time_s)
      if (policy != r_policy) plan += fmt::format(" ({} {:.3f} s)", policy, t);
    if (!k.offload.empty()) plan += fmt::format(", offload {}", k.offload);
    if (r.plan.knobs.swap == core::SwapTiming::OnDemand) plan += ", on-demand swap";
    if (k.max_packs_grown > 0) plan += fmt::format(", pack bound grew to {}", k.max_packs_grown);
    const std::string fit = r.fits ? std::string()
                                   : fmt::format("DOES NOT FIT: peak {:.0f} MiB > {:.0f} MiB by {} bytes; ",
                                                 mib(r.peak_memory_bytes), mib(r.gpu_capacity_bytes), r.excess_bytes);
    const std::string host =
        r.native
            ? fmt::format("{:.2f}", static_cast<double>(r.host_memory.total_bytes) / static_cast<double>(core::kGiB))
            : std::string("-");
    const double speedup = std::isfinite(res.best_baseline_time_s) ? res.best_baseline_time_s / r.iteration_time_s
                                                                   : k.speedup_over_best_baseline;
    fmt::print("{:<14} {:>6} {:>10.3f} {:>10.3f} {:>7.2f}x {:>7} {:>10.0f} {:>10.0f} {:>10.0f} {:>9.0f} {:>8}  {}\n",
               label, k.candidates, r.iteration_time_s, r.throughput_samples_per_s, speedup,
               fmt::format("{}/{}", r.plan.u_fwd, r.plan.u_bwd), mib(r.swap_in_bytes + r.swap_out_bytes),
               mib(r.p2p_bytes), mib(r.collective_bytes), mib(r.peak_memory_bytes), host, note + fit + plan);
  };
  for (const auto& k : res.kinds) print_row(core::plan_kind_name(k.kind), k, "");
  if (ds) {
    const std::string note = fmt::format("your DeepSpeed config: {} -> {}; ", ds->run.summary, ds->run.plan_kind);
    if (ds_row) {
      print_row("> deepspeed", *ds_row, note);
    } else {
      fmt::print("{:<14} {:>6} {:>10} {:>10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}  {}not priced: {}\n",
                 "> deepspeed", 0, "-", "-", "-", "-", "-", "-", "-", "-", "-", note, ds->run.approximation);
    }
  }
  fmt::print("\nspeedup: best baseline time / this kind's time (best baseline: {:.3f} s)\n", res.best_baseline_time_s);
  for (const auto& line : sim::ceiling_lines(res)) fmt::print("{}\n", line);
  fmt::print(
      "activations: checkpoint recomputes each layer's forward in the backward (Harmony always does); keep holds "
      "or swaps the saved activations. Each baseline is searched under both; the other policy's best time is in "
      "parentheses.\n");
  if (ds) {
    fmt::print("\n");
    for (const auto& line : sim::deepspeed_lines(*ds, ds_row, res)) fmt::print("{}\n", line);
  }
  if (!trace_note.empty()) fmt::print("{}\n", trace_note);
  return 0;
}

// `memory`: what each plan kind's most promising plan needs of GPU, pinned host, host RAM and NVMe, whether it fits
// and what binds, with no timed search (sim/memory_answer.hpp).
int cmd_memory(const Cli& cli) {
  const auto cfg = core::load_config(cli.config, cli.sets);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<core::Plan> plan;  // --plan config: the config's plan, under every kind
  if (cli.memory_plan == "config")
    plan = core::plan_from_spec(cfg.plan, model, cfg.machine.search_capacity_bytes(), cfg.file,
                                "`memory --plan config`", "add `u_bwd: U` (its microbatch size) to `plan:`");
  const auto answer = sim::answer_memory(model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.search, cfg.options,
                                         plan ? &*plan : nullptr);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cli.format == "json") {
    nlohmann::json j = document_head("memory", cfg, model);
    sim::memory_json(answer, j);
    j["wall_time_s"] = dt;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  sim::print_memory_table(answer, model.name, cfg.machine.name, dt);
  return 0;
}

// `presets`: one line per built-in machine, or (--format json) their figures (docs/output-schema.md).
int cmd_presets(const Cli& cli) {
  if (cli.format != "json") {
    const std::vector<std::string> names = core::machine_preset_names();
    std::size_t width = 0;
    for (const auto& n : names) width = std::max(width, n.size());
    for (const auto& n : names) fmt::print("{:<{}} {}\n", n, width + 1, core::machine_summary(core::machine_preset(n)));
    return 0;
  }
  nlohmann::json presets = nlohmann::json::array();
  for (const auto& n : core::machine_preset_names()) {
    const auto m = core::machine_preset(n);
    presets.push_back(
        {{"machine_name", n},
         {"gpu_name", m.gpu_name.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.gpu_name)},
         {"gpus", m.gpus},
         {"gpu_memory_bytes", m.gpu_memory_bytes},
         {"gpu_capacity_bytes", m.search_capacity_bytes()},
         {"bw_swap_bytes_per_s", m.bw_swap_bytes_per_s},
         {"bw_p2p_bytes_per_s", m.bw_p2p_bytes_per_s},
         {"bw_msg_bytes_per_s", m.bw_msg_bytes_per_s},
         {"price_per_hour", m.price_per_hour > 0 ? nlohmann::json(m.price_per_hour) : nlohmann::json(nullptr)},
         {"summary", core::machine_summary(m)}});
  }
  const nlohmann::json j = {
      {"schema_version", core::kOutputSchemaVersion}, {"command", "presets"}, {"presets", std::move(presets)}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

struct ReportCli {
  std::string results;
  std::string out;
  std::string rank_by = "throughput";
  std::string format = "table";  // table (a line per model) or json (docs/output-schema.md)
  sim::ReportOptions options;
};

// `report`: a sweep folder or a config -> one HTML file, written atomically (core::AtomicFile), so an
// interrupted run never leaves half a page where a good one was.
int cmd_report(ReportCli& cli) {
  namespace fs = std::filesystem;
  if (!sim::parse_rank_by(cli.rank_by, &cli.options.rank_by))
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "unknown ranking '" + cli.rank_by + "'",
                            "use throughput, iteration_time, time_to_train or cost");
  const bool is_dir = fs::is_directory(cli.results);
  if (!is_dir && !fs::exists(cli.results))
    throw core::ConfigError(core::SourceLoc{cli.results, 0, 0}, "no such file or folder",
                            "give a sweep's --out folder or a config YAML");
  std::string out = cli.out;
  if (out.empty()) {
    if (!is_dir)
      throw core::ConfigError(core::SourceLoc{"--out", 0, 0}, "a report of a config needs --out FILE.html",
                              "e.g. --out /tmp/report.html (a sweep folder's report defaults to DIR/report.html)");
    out = (fs::path(cli.results) / "report.html").string();
  }
  core::check_output_file(out, "the report (--out)");
  const auto t0 = std::chrono::steady_clock::now();
  auto data =
      is_dir ? sim::report_from_sweep(cli.results, cli.options) : sim::report_from_config(cli.results, cli.options);
  for (const auto& w : data.warnings) fmt::print(stderr, "warning: {}\n", w);
  // Each model's best-plan trace beside the page (the page links them), written before the page.
  const auto traces = sim::report_traces(data, out);
  for (const auto& [path, json] : traces) {
    core::check_output_file(path, "the trace");
    core::write_file_atomic(path, json, "the trace");
  }
  const std::string html = sim::render_report_html(data);
  core::write_file_atomic(out, html, "the report");
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const fs::path dir = fs::path(out).parent_path();
  if (cli.format == "json") {
    // docs/output-schema.md, "report": what was written and each model's best plan (a plan result).
    nlohmann::json models = nlohmann::json::array();
    for (const auto& m : data.models) {
      const nlohmann::json none(nullptr);
      models.push_back({{"model_name", m.name},
                        {"ranked_rows", m.rows.size()},
                        {"best_title", m.has_best ? nlohmann::json(m.best.title) : none},
                        {"best", m.has_best ? core::report_to_json(m.best.report) : none},
                        {"best_note", m.has_best || m.best_note.empty() ? none : nlohmann::json(m.best_note)},
                        {"trace_path", m.has_best ? nlohmann::json((dir / m.trace_file).string()) : none}});
    }
    const nlohmann::json j = {{"schema_version", core::kOutputSchemaVersion},
                              {"command", "report"},
                              {"results_path", cli.results},
                              {"input", is_dir ? "sweep" : "config"},
                              {"out_path", out},
                              {"page_bytes", html.size()},
                              {"rank_by", cli.rank_by},
                              {"models", std::move(models)},
                              {"warnings", data.warnings},
                              {"wall_time_s", dt}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("report written to {} ({:.0f} KiB, {:.2f} s): {} model{}\n", out,
             static_cast<double>(html.size()) / 1024.0, dt, data.models.size(), data.models.size() == 1 ? "" : "s");
  for (const auto& m : data.models) {
    if (m.has_best)
      fmt::print("  {}: {} ranked rows, best plan {} ({:.3f} samples/s, {} ops), trace {}\n", m.name, m.rows.size(),
                 m.best.title, m.best.report.throughput_samples_per_s, m.best.program.ops.size(),
                 (dir / m.trace_file).string());
    else
      fmt::print("  {}: {} ranked rows, no best plan shown\n", m.name, m.rows.size());
  }
  return 0;
}

// ---- calibrate (docs/validation.md#calibrate) ----

struct CalibrateCli {
  std::string machine;
  std::vector<std::string> runs;  // CONFIG,TRACE[,RUN_JSON]
  std::string out;
  std::string format = "table";
  bool check = false;  // no fit: the machine's predictions against the measurements
};

// The Programs harmony-run may have trained for a harmony-run config (apps/harmony_run.cpp, `choose` without
// --plan auto), lowered on the config's measured profile (model.profile, required here). A Harmony plan has one.
// A baseline's swap decisions and pp-swap's stages are made on harmony-run's own description of the model, whose
// sizes and times differ from the profile's: the candidates are the profile's decisions, then every forced
// weights/activations choice, with pp-swap's stages read off the trace (the layers each device computes).
std::vector<core::Program> candidate_programs(const core::TrainConfig& cfg, const core::Model& model,
                                              const std::string& trace_text) {
  std::vector<core::Program> out;
  const core::Plan plan = core::plan_from_spec(cfg.plan, model, cfg.machine.gpu_memory_bytes, cfg.file, "`calibrate`",
                                               "give the plan harmony-run ran, with `u_fwd: U` and `u_bwd: U`");
  if (plan.kind->packs) {
    out.push_back(core::lower_plan(plan, model, all_gpus(core::lower_options(cfg.options))));
    return out;
  }
  std::vector<core::LayerRange>
      stages;  // a kind with stages: per device, the layers its compute ops cover in the trace
  if (plan.kind->stage_per_gpu) {
    try {
      const auto doc = nlohmann::json::parse(trace_text);
      std::vector<core::LayerRange> seen(static_cast<std::size_t>(plan.gpus), core::LayerRange{-1, -1});
      for (const auto& e : doc.at("traceEvents")) {
        if (!e.is_object() || e.value("ph", "") != "X" || e.value("cat", "") != "FWD") continue;
        const int d = e.at("pid").get<int>();
        const auto& l = e.at("args").at("layers");
        if (d < 0 || d >= plan.gpus) continue;
        auto& r = seen[static_cast<std::size_t>(d)];
        r.first = r.first < 0 ? l[0].get<int>() : std::min(r.first, l[0].get<int>());
        r.last = std::max(r.last, l[1].get<int>());
      }
      stages = seen;
    } catch (const std::exception&) {
      stages.clear();  // read_measured_trace reports what is wrong with the trace
    }
  }
  for (int with_stages = 0; with_stages < (stages.empty() ? 1 : 2); ++with_stages) {
    core::Plan c = plan;
    if (with_stages == 1) c.stages = stages;
    try {
      if (with_stages == 1) core::validate_plan(c, model);
    } catch (const core::ScheduleError&) {
      continue;
    }
    for (auto w : {core::SwapChoice::Auto, core::SwapChoice::Keep, core::SwapChoice::Swap}) {
      for (auto a : {core::SwapChoice::Auto, core::SwapChoice::Keep, core::SwapChoice::Swap}) {
        if ((w == core::SwapChoice::Auto) != (a == core::SwapChoice::Auto)) continue;
        c.knobs.weights = w;
        c.knobs.activations = a;
        out.push_back(core::lower_plan(c, model));
      }
    }
  }
  return out;
}

// The measured time per step of harmony-run's `train --format json` output: the fastest step after the first
// (the warm-up), or the only step. Its plan must be the config's.
double measured_step_s(const std::string& path, const core::TrainConfig& cfg) {
  const std::string hint = "give the JSON harmony-run train --format json printed for the same config and plan";
  const std::string text = core::read_input_file(path, "the measured run");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw core::ConfigError(core::SourceLoc{path, 1, 1}, fmt::format("the measured run is not JSON: {}", e.what()),
                            hint);
  }
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array() || j["steps"].empty())
    throw core::ConfigError(core::SourceLoc{path, 1, 1}, "the measured run has no steps (not harmony-run train JSON)",
                            hint);
  if (j.contains("plan") && j["plan"].is_object()) {
    const auto& pl = j["plan"];
    auto same = [&](const char* key, const auto& want) {
      if constexpr (std::is_same_v<std::decay_t<decltype(want)>, std::optional<int>>) {
        return !want || !pl.contains(key) || pl[key] == *want;
      } else {
        return !pl.contains(key) || pl[key] == want;
      }
    };
    const std::string mode = cfg.plan.kind.name();
    if (!same("plan_kind", mode) || !same("gpus", cfg.plan.gpus) || !same("minibatch", cfg.plan.minibatch) ||
        !same("u_fwd", cfg.plan.u_fwd) || !same("u_bwd", cfg.plan.u_bwd))
      throw core::ConfigError(core::SourceLoc{path, 1, 1},
                              fmt::format("the measured run's plan ({}) is not the config's ({}): a run of another "
                                          "Program",
                                          pl.value("title", std::string("?")), cfg.file),
                              hint);
  }
  // the fastest step after the first (the warm-up): on a shared machine, the step least slowed by other load
  const auto& steps = j["steps"];
  double best = 0;
  for (std::size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) {
    if (!steps[i].is_object() || !steps[i].contains("step_time_s") || !steps[i]["step_time_s"].is_number())
      throw core::ConfigError(core::SourceLoc{path, 1, 1}, fmt::format("step {} has no step_time_s", i + 1), hint);
    const double t = steps[i]["step_time_s"].get<double>();
    best = i == (steps.size() > 1 ? 1u : 0u) ? t : std::min(best, t);
  }
  return best;
}

// The fitted values (unless --check), the residual per run and per op class; table or JSON.
int print_calibration(const CalibrateCli& cli, const sim::Calibration& c) {
  auto err = [](double p, double m) { return m > 0 ? 100.0 * (p / m - 1.0) : 0.0; };
  if (cli.format == "json") {
    nlohmann::json runs_j = nlohmann::json::array();
    auto classes_json = [&](const std::vector<sim::ClassResidual>& cs) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& k : cs)
        a.push_back({{"op_class", sim::op_class_name(k.cls)},
                     {"num_ops", k.ops},
                     {"measured_s", k.measured_s},
                     {"predicted_s", k.predicted_s},
                     {"rms_op_s", k.rms_op_s}});
      return a;
    };
    for (const auto& r : c.runs)
      runs_j.push_back({{"name", r.name},
                        {"num_ops", r.ops},
                        {"measured_step_time_s", r.measured_step_s},
                        {"predicted_step_time_s", r.predicted_step_s},
                        {"prediction_error", (r.measured_step_s - r.predicted_step_s) / r.predicted_step_s},
                        {"classes", classes_json(r.classes)}});
    const nlohmann::json j = {{"schema_version", core::kOutputSchemaVersion},
                              {"command", "calibrate"},
                              {"machine_path", cli.machine},
                              {"out_path", cli.check ? nlohmann::json(nullptr) : nlohmann::json(cli.out)},
                              {"fitted", !cli.check},
                              {"values",
                               {{"compute",
                                 {{"units", c.compute.units},
                                  {"units_per_op", c.compute.units_per_op},
                                  {"time_scale", c.compute.time_scale},
                                  {"update_time_scale", c.compute.update_time_scale},
                                  {"host_cores", c.compute.host_cores}}},
                                {"dispatch_s",
                                 {{"compute", c.dispatch.compute_s},
                                  {"copy", c.dispatch.copy_s},
                                  {"p2p", c.dispatch.p2p_s},
                                  {"update", c.dispatch.update_s}}},
                                {"copy_bandwidth_bytes_per_s",
                                 c.bandwidth_fitted ? nlohmann::json(c.copy_bytes_per_s) : nlohmann::json(nullptr)}}},
                              {"runs", runs_j},
                              {"classes", classes_json(c.classes)},
                              {"notes", c.notes}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("{}: compute units {} (0: not shared){}, time_scale {:.4f}, update_time_scale {:.4f}\n",
             cli.check ? "machine" : "fitted", c.compute.units,
             c.compute.host_cores ? " on the host's cores (copies, updates and dispatch share them)" : "",
             c.compute.time_scale, c.compute.update_time_scale);
  fmt::print("        dispatch compute {:.1f} us, copy {:.1f} us, p2p {:.1f} us, update {:.1f} us; copy bandwidth {}\n",
             c.dispatch.compute_s * 1e6, c.dispatch.copy_s * 1e6, c.dispatch.p2p_s * 1e6, c.dispatch.update_s * 1e6,
             c.bandwidth_fitted ? fmt::format("{:.3f} GB/s", c.copy_bytes_per_s / 1e9) : std::string("kept"));
  for (const auto& n : c.notes) fmt::print("note: {}\n", n);
  fmt::print("\n{:<28} {:>6} {:>14} {:>14} {:>8}\n", "run", "ops", "measured s", "predicted s", "error");
  for (const auto& r : c.runs)
    fmt::print("{:<28} {:>6} {:>14.6f} {:>14.6f} {:>+7.1f}%\n", r.name, r.ops, r.measured_step_s, r.predicted_step_s,
               err(r.predicted_step_s, r.measured_step_s));
  fmt::print("\nper op class (all runs; sums of op durations):\n{:<10} {:>6} {:>14} {:>14} {:>8} {:>12}\n", "class",
             "ops", "measured s", "predicted s", "error", "rms/op us");
  for (const auto& k : c.classes)
    fmt::print("{:<10} {:>6} {:>14.6f} {:>14.6f} {:>+7.1f}% {:>12.1f}\n", sim::op_class_name(k.cls), k.ops,
               k.measured_s, k.predicted_s, err(k.predicted_s, k.measured_s), k.rms_op_s * 1e6);
  if (!cli.check) fmt::print("\ncalibrated machine written to {}\n", cli.out);
  return 0;
}

int cmd_calibrate(const CalibrateCli& cli) {
  if (!cli.check && cli.out.empty()) {
    fmt::print(stderr,
               "harmony-sim calibrate: error: --out FILE is required (or --check to predict without fitting)\n");
    return kExitBadInput;
  }
  if (!cli.check) core::check_output_file(cli.out, "the calibrated machine (--out)");
  const std::string machine_text = core::read_input_file(cli.machine, "the machine file");
  const core::MachineSpec base = core::load_machine_file(cli.machine);
  std::vector<std::unique_ptr<core::Model>> models;
  std::vector<std::unique_ptr<core::Program>> programs;
  std::vector<sim::CalibrationRun> runs;
  std::vector<std::string> provenance;
  auto file_name = [](const std::string& p) { return std::filesystem::path(p).filename().string(); };
  for (const std::string& spec : cli.runs) {
    std::vector<std::string> parts;
    std::size_t at = 0;
    while (true) {
      const auto comma = spec.find(',', at);
      parts.push_back(spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
      fmt::print(stderr, "harmony-sim calibrate: error: --run '{}' is not CONFIG,TRACE[,RUN_JSON]\n", spec);
      return kExitBadInput;
    }
    const auto cfg = core::load_train_config(parts[0]);
    if (cfg.model.profile_path.empty())
      throw core::ConfigError(cfg.model.loc, "calibrate needs the run's measured profile in model.profile",
                              "add `profile: FILE` (written by harmony-run profile) under model:");
    models.push_back(std::make_unique<core::Model>(core::load_profile(cfg.model.profile_path)));
    const core::Model& model = *models.back();
    sim::CalibrationRun r;
    r.name = file_name(parts[0]);
    r.model = &model;
    r.machine = base;
    r.machine.gpu_memory_bytes = cfg.machine.gpu_memory_bytes;
    const std::string trace_text = core::read_input_file(parts[1], "the measured trace");
    // the first candidate the trace matches; none: the first candidate's error
    const auto candidates = candidate_programs(cfg, model, trace_text);
    std::optional<core::ConfigError> first_error;
    for (const auto& p : candidates) {
      try {
        r.measured = sim::read_measured_trace(parts[1], trace_text, p);
      } catch (const core::ConfigError& e) {
        if (!first_error) first_error = e;
        continue;
      }
      programs.push_back(std::make_unique<core::Program>(p));
      break;
    }
    if (programs.size() != runs.size() + 1) throw *first_error;
    r.program = programs.back().get();
    r.measured_step_s = parts.size() == 3 ? measured_step_s(parts[2], cfg) : r.measured.span_s;
    std::string line = fmt::format("run {}: config {} ({})", runs.size() + 1, r.name,
                                   sim::fingerprint(core::read_input_file(parts[0], "the config")));
    if (!cfg.model.profile_path.empty())
      line += fmt::format(", profile {} ({})", file_name(cfg.model.profile_path),
                          sim::fingerprint(core::read_input_file(cfg.model.profile_path, "the profile")));
    line += fmt::format(", trace {} ({})", file_name(parts[1]), sim::fingerprint(trace_text));
    if (parts.size() == 3)
      line += fmt::format(", run {} ({})", file_name(parts[2]),
                          sim::fingerprint(core::read_input_file(parts[2], "the measured run")));
    provenance.push_back(line);
    runs.push_back(std::move(r));
  }
  if (cli.check) return print_calibration(cli, sim::check_machine(runs));
  const sim::Calibration c = sim::calibrate(runs);
  std::vector<std::string> header = {
      fmt::format("fitted by `harmony-sim calibrate` (docs/validation.md#calibrate) on {} from {} measured run{} "
                  "(fingerprints: FNV-1a 64 of each input file):",
                  file_name(cli.machine), runs.size(), runs.size() == 1 ? "" : "s")};
  header.insert(header.end(), provenance.begin(), provenance.end());
  for (const auto& r : c.runs)
    header.push_back(fmt::format("{}: {} ops, measured {:.4f} s/step, predicted {:.4f} s/step ({:+.1f}%)", r.name,
                                 r.ops, r.measured_step_s, r.predicted_step_s,
                                 100.0 * (r.predicted_step_s / r.measured_step_s - 1.0)));
  for (const auto& n : c.notes) header.push_back("note: " + n);
  const std::string text = sim::calibrated_machine_text(machine_text, c, header);
  core::write_file_atomic(cli.out, text, "the calibrated machine");
  const core::MachineSpec check = core::load_machine_file(cli.out);  // what was written reads back
  if (check.compute.units != c.compute.units)
    throw core::InternalError(fmt::format("the calibrated machine {} does not read back its fitted units", cli.out));
  return print_calibration(cli, c);
}

// A memory failure (std::bad_alloc; sim/alloc_failure.cpp makes mimalloc throw it too): what the process ran out
// of and what to change. Called once the stack has unwound, so the work's memory is free again.
std::string out_of_memory_message() {
  std::string limit = "the memory the system could give it";
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    limit = fmt::format("its address-space limit (ulimit -v) of {}",
                        core::format_bytes(static_cast<core::Bytes>(rl.rlim_cur)));
  return fmt::format(
      "harmony-sim: error: out of memory: the command needed more than {}\n"
      "  hint: give it more memory, or ask for less: fewer GPUs or a smaller minibatch (plan.gpus, plan.minibatch), "
      "a smaller search space (search.*); a sweep keeps the rows it wrote: rerun it (with fewer --threads) to resume\n",
      limit);
}

int run_cli(int argc, char** argv) {
  CLI::App app{"harmony-sim: simulate and search Harmony training schedules (VLDB 2022) from measured profiles"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "harmony-sim 0.1.0");
  Cli cli;
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("config", cli.config, "YAML configuration (see docs/config.md)")->required();
    sub->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=4 (repeatable)");
    sub->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
    sub->add_option("--trace", cli.trace,
                    "write a Chrome trace (Perfetto) of the plan (search: the best plan; compare: the fastest kind's)");
  };
  auto* sim_cmd = app.add_subcommand("simulate", "simulate one plan (config `plan:` with u_fwd, u_bwd and packs)");
  add_common(sim_cmd);
  auto* search_cmd = app.add_subcommand("search", "rank the configurations of the paper's search space");
  add_common(search_cmd);
  auto* compare_cmd =
      app.add_subcommand("compare", "best plan of every plan kind (Harmony-PP/DP and the swapping baselines)");
  add_common(compare_cmd);
  for (auto* sub : {search_cmd, compare_cmd}) sub->add_flag("--quiet", cli.quiet, "no progress on stderr");
  compare_cmd->add_option("--deepspeed", cli.deepspeed,
                          "a DeepSpeed JSON config: price that run as its closest plan kind beside Harmony's best plan "
                          "(docs/comparison.md)");
  auto* memory_cmd = app.add_subcommand(
      "memory", "what each plan kind needs of GPU, pinned host, host RAM and NVMe memory, and what binds (no search)");
  memory_cmd->add_option("config", cli.config, "YAML configuration (see docs/config.md)")->required();
  memory_cmd->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=4 (repeatable)");
  memory_cmd->add_option("--format", cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  memory_cmd
      ->add_option("--plan", cli.memory_plan,
                   "best (default): each kind's most promising plan; config: the config's plan: under every kind")
      ->check(CLI::IsMember({"best", "config"}));
  auto* presets_cmd = app.add_subcommand("presets", "list the built-in machine presets");
  presets_cmd->add_option("--format", cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  ReportCli report_cli;
  auto* report_cmd =
      app.add_subcommand("report", "one self-contained HTML page for a sweep folder or a config (docs/report.md)");
  report_cmd->add_option("results", report_cli.results, "a sweep's --out folder, or a config YAML")->required();
  report_cmd->add_option("--out", report_cli.out, "the HTML file (default for a sweep folder: DIR/report.html)");
  report_cmd->add_option("--top", report_cli.options.top, "rows in each model's ranked table (0: all; default 50)");
  report_cmd->add_option("--model", report_cli.options.model,
                         "sweep: only this model (its model_name); default: one section per model");
  report_cmd->add_option("--rank-by", report_cli.rank_by,
                         "throughput (default), iteration_time, time_to_train or cost");
  report_cmd->add_option("--where", report_cli.options.where,
                         "sweep: keep rows whose column equals a value, e.g. --where machine_name=h100-sxm-8x");
  report_cmd->add_option("--sweep", report_cli.options.sweep_file,
                         "sweep: the sweep file, when it is not where sweep.json says");
  report_cmd->add_option("--set", report_cli.options.overrides, "config: override a key (repeatable)");
  report_cmd->add_option("--format", report_cli.format, "what was written: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  CalibrateCli calibrate_cli;
  auto* calibrate_cmd = app.add_subcommand(
      "calibrate", "fit a machine file's native-model parameters to measured runs (docs/validation.md#calibrate)");
  calibrate_cmd->add_option("machine", calibrate_cli.machine, "the machine YAML to fit")->required();
  calibrate_cmd
      ->add_option("--run", calibrate_cli.runs,
                   "CONFIG,TRACE[,RUN_JSON]: the harmony-run config trained (with model.profile), harmony-run's trace "
                   "of it (train --trace), and optionally its train --format json output (repeatable)")
      ->required();
  calibrate_cmd->add_option("--out", calibrate_cli.out, "the calibrated machine YAML to write");
  calibrate_cmd->add_flag("--check", calibrate_cli.check,
                          "no fit: print the machine's predictions of the runs against their measurements");
  calibrate_cmd->add_option("--format", calibrate_cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  sim::SweepCommands sweep_cmds(app);  // `sweep` and `merge` (sim/sweep_cli.cpp)
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return sim::print_parse_error(app, e, argc, argv);  // "harmony-sim SUB: error: ..." + hint, exit 2
  }
  try {
    if (*presets_cmd) return cmd_presets(cli);
    if (sweep_cmds.selected()) return sweep_cmds.run();
    if (*report_cmd) return cmd_report(report_cli);
    if (*calibrate_cmd) return cmd_calibrate(calibrate_cli);
    if (*sim_cmd) return cmd_simulate(cli);
    if (*compare_cmd) return cmd_compare(cli);
    if (*memory_cmd) return cmd_memory(cli);
    return cmd_search(cli);
  } catch (const core::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitBadInput;
  } catch (const core::InternalError& e) {
    std::cerr << "harmony-sim: " << e.what()
              << "\n  this is a bug in harmony; please report it with the command line\n";
    return kExitInternal;
  } catch (const core::ScheduleError& e) {
    std::cerr << cli.config << ": error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::cerr << out_of_memory_message();
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "harmony-sim: internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

// run_cli, then the check that stdout took every byte (`--format json > /dev/full` must not exit 0).
int run_and_flush(int argc, char** argv) {
  // Into a file or pipe, stdout is buffered whole (up to 1 MiB) so that a failed write is seen by the final
  // flush with its reason (errno), not lost inside an earlier implicit flush.
  static char stdout_buffer[std::size_t{1} << 20];  // glibc ignores the size unless given the buffer
  if (isatty(STDOUT_FILENO) == 0) std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
  const int rc = run_cli(argc, argv);
  if (const auto problem = core::stdout_write_problem()) {
    std::cerr << "harmony-sim: error: writing stdout: " << *problem << "\n";
    return rc != 0 ? rc : 1;
  }
  return rc;
}

int main(int argc, char** argv) {
  core::ignore_file_size_signal();  // past `ulimit -f` a write fails with EFBIG (exit 2, named), not SIGXFSZ (153)
  try {
    return run_and_flush(argc, argv);
  } catch (const std::bad_alloc&) {  // out of memory outside the error ladder (or while writing its message)
    std::fputs("harmony-sim: error: out of memory\n  hint: give it more memory, or ask for less (fewer GPUs)\n",
               stderr);
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "harmony-sim: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "harmony-sim: internal error\n";
  }
  return 1;
}
