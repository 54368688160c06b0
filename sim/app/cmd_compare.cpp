// harmony-sim `compare` (every plan kind's best plan, ranked; --deepspeed prices a DeepSpeed run beside Harmony's),
// `memory` (what each kind needs of every memory tier, no search) and `presets` (the built-in machines).
#include "sim/app/commands.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/search/search.hpp"
#include "sim/app/progress_cli.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/compare_deepspeed.hpp"
#include "sim/study/evaluate.hpp"
#include "sim/study/memory_answer.hpp"

namespace harmony::sim::app {

namespace {

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

// compare --trace: writes the fastest kind's best plan's trace; the line that says so (or why none was written).
std::string write_winner_trace(const Cli& cli, const sim::CompareResult& res, const core::Model& model,
                               const core::RunConfig& cfg, bool* trace_written) {
  if (const auto win = winner_of(res, model, cfg)) {
    write_trace(cli.trace, *win, core::report_title(win->report));
    *trace_written = true;
    return fmt::format("trace of the fastest plan ({}) written to {}", win->report.plan.kind.name(), cli.trace);
  }
  return "no trace written: no plan kind fits";
}

// One kind's entry in compare's JSON results.
nlohmann::json kind_json(const sim::KindResult& k, const sim::CompareResult& res) {
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
  return j;
}

// The columns shared by compare's rows that have no plan; `why` ends the line.
void print_planless_row(const std::string& label, std::size_t candidates, const std::string& why) {
  fmt::print("{:<{}} {:>6} {:>10} {:>10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}  {}\n", label,
             core::kind_column_width(), candidates, "-", "-", "-", "-", "-", "-", "-", "-", "-", why);
}

// One row of compare's table; `label` names it (the kind, or the DeepSpeed run), `note` opens its plan column.
void print_compare_row(const std::string& label, const sim::KindResult& k, const std::string& note,
                       const sim::CompareResult& res) {
  if (!k.feasible) {
    print_planless_row(label, k.candidates, note + "does not fit: " + k.reason);
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
          ? fmt::format("{:.2f}", static_cast<double>(r.host_memory.total_bytes()) / static_cast<double>(core::kGiB))
          : std::string("-");
  const double speedup = std::isfinite(res.best_baseline_time_s) ? res.best_baseline_time_s / r.iteration_time_s
                                                                 : k.speedup_over_best_baseline;
  fmt::print("{:<{}} {:>6} {:>10.3f} {:>10.3f} {:>7.2f}x {:>7} {:>10.0f} {:>10.0f} {:>10.0f} {:>9.0f} {:>8}  {}\n",
             label, core::kind_column_width(), k.candidates, r.iteration_time_s, r.throughput_samples_per_s, speedup,
             fmt::format("{}/{}", r.plan.u_fwd, r.plan.u_bwd), mib(r.swap_in_bytes + r.swap_out_bytes),
             mib(r.p2p_bytes), mib(r.collective_bytes), mib(r.peak_memory_bytes), host, note + fit + plan);
}

// What compare ran and found, as its JSON document.
struct CompareRun {
  const core::RunConfig& cfg;
  const core::Model& model;
  const sim::CompareResult& res;
  const std::optional<sim::DeepSpeedSetup>& ds;
  const std::optional<sim::KindResult>& ds_row;
  double wall_s;
};

void print_compare_json(const CompareRun& run, const std::string& trace_path) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& k : run.res.kinds) results.push_back(kind_json(k, run.res));
  nlohmann::json j = document_head("compare", run.cfg, run.model);
  j["gpus"] = run.cfg.plan.gpus;
  j["minibatch"] = run.cfg.plan.minibatch;
  j["best_baseline_time_s"] = std::isfinite(run.res.best_baseline_time_s) ? nlohmann::json(run.res.best_baseline_time_s)
                                                                          : nlohmann::json(nullptr);
  j["results"] = std::move(results);
  j["trace_path"] = !trace_path.empty() ? nlohmann::json(trace_path) : nlohmann::json(nullptr);
  j["deepspeed"] = run.ds ? sim::deepspeed_json(*run.ds, *run.ds_row, run.res) : nlohmann::json(nullptr);
  j["wall_time_s"] = run.wall_s;
  std::cout << j.dump(2) << "\n";
}

// compare's table: a row per kind (and the DeepSpeed run's), then the notes under it.
void print_compare_table(const CompareRun& run) {
  const auto& [cfg, model, res, ds, ds_row, dt] = run;
  fmt::print("compare: {} on {} ({} GPUs used), minibatch {}, cost model {}; {:.1f} ms\n\n", model.name,
             cfg.machine.name, cfg.plan.gpus, cfg.plan.minibatch, core::cost_model_name(cfg.cost_model), dt * 1e3);
  fmt::print("{:<{}} {:>6} {:>10} {:>10} {:>8} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}  {}\n", "plan kind",
             core::kind_column_width(), "cands", "time (s)", "samples/s", "speedup", "u f/b", "swap MiB", "p2p MiB",
             "coll MiB", "peak MiB", "host GiB", "plan / reason");
  for (const auto& k : res.kinds) print_compare_row(core::plan_kind_name(k.kind), k, "", res);
  if (ds) {
    const std::string note = fmt::format("your DeepSpeed config: {} -> {}; ", ds->run.summary, ds->run.plan_kind);
    print_compare_row("> deepspeed", *ds_row, note, res);
  }
  fmt::print("\nspeedup: best baseline time / this kind's time (best baseline: {:.3f} s)\n", res.best_baseline_time_s);
  for (const auto& line : sim::ceiling_lines(res)) fmt::print("{}\n", line);
  fmt::print(
      "activations: checkpoint recomputes each layer's forward in the backward (Harmony always does); keep holds "
      "or swaps the saved activations. Each baseline is searched under both; the other policy's best time is in "
      "parentheses.\n");
  if (ds) {
    fmt::print("\n");
    for (const auto& line : sim::deepspeed_lines(*ds, *ds_row, res)) fmt::print("{}\n", line);
  }
}

}  // namespace

int cmd_compare(const Cli& cli) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  // --deepspeed: the DeepSpeed run's minibatch and dtype as overrides after the user's
  // (sim/study/compare_deepspeed.hpp)
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
  // with --deepspeed, its row (ds and ds_row are set together)
  std::optional<sim::KindResult> ds_row;
  if (ds) ds_row = sim::price_deepspeed(*ds, cli.config, sets, model);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string trace_note;
  bool trace_written = false;
  if (!cli.trace.empty()) trace_note = write_winner_trace(cli, res, model, cfg, &trace_written);
  const CompareRun run{cfg, model, res, ds, ds_row, dt};
  if (cli.format == "json") {
    print_compare_json(run, trace_written ? cli.trace : std::string());
    return 0;
  }
  print_compare_table(run);
  if (!trace_note.empty()) fmt::print("{}\n", trace_note);
  return 0;
}

// `memory`: what each plan kind's most promising plan needs of GPU, pinned host, host RAM and NVMe, whether it fits
// and what binds, with no timed search (sim/study/memory_answer.hpp).
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

}  // namespace harmony::sim::app
