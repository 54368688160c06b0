// harmony-sim `calibrate`: a machine file's native-model parameters fitted to harmony-run's measured runs, or
// (--check) its predictions against them (docs/validation.md#calibrate).
#include "sim/app/commands.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/profile.hpp"
#include "core/program/lower.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/calibrate.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::sim::app {

namespace {

// Every GPU lowered (calibrate compares per-op timings of every device).
core::LowerOptions all_gpus(core::LowerOptions o) {
  o.dp_first_gpu_only = false;
  return o;
}

// The Programs harmony-run may have trained for a harmony-run config (apps/run/plan.cpp, `choose` without
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
                                  {"host_cores", c.compute.host_cores},
                                  {"wake_s", c.compute.wake_s}}},
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

std::string file_name(const std::string& p) { return std::filesystem::path(p).filename().string(); }

// CONFIG,TRACE[,RUN_JSON] split at its commas.
std::vector<std::string> split_at_commas(const std::string& spec) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (true) {
    const auto comma = spec.find(',', at);
    parts.push_back(spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return parts;
}

// The measured runs and what they point to (the models and Programs live here, the runs point into them), with
// each run's provenance line for the calibrated machine's header.
struct LoadedRuns {
  std::vector<std::unique_ptr<core::Model>> models;
  std::vector<std::unique_ptr<core::Program>> programs;
  std::vector<sim::CalibrationRun> runs;
  std::vector<std::string> provenance;
};

// Which files a run was read from, with their fingerprints.
std::string run_provenance(std::size_t number, const std::vector<std::string>& parts, const core::TrainConfig& cfg,
                           const std::string& trace_text) {
  std::string line = fmt::format("run {}: config {} ({})", number, file_name(parts[0]),
                                 sim::fingerprint(core::read_input_file(parts[0], "the config")));
  if (!cfg.model.profile_path.empty())
    line += fmt::format(", profile {} ({})", file_name(cfg.model.profile_path),
                        sim::fingerprint(core::read_input_file(cfg.model.profile_path, "the profile")));
  line += fmt::format(", trace {} ({})", file_name(parts[1]), sim::fingerprint(trace_text));
  if (parts.size() == 3)
    line += fmt::format(", run {} ({})", file_name(parts[2]),
                        sim::fingerprint(core::read_input_file(parts[2], "the measured run")));
  return line;
}

// One --run CONFIG,TRACE[,RUN_JSON]: its profiled model, the Program its trace measured (the first candidate the
// trace matches; none: the first candidate's error) and the measured step time, added to `loaded`.
void load_calibration_run(const std::vector<std::string>& parts, const core::MachineSpec& base, LoadedRuns& loaded) {
  const auto cfg = core::load_train_config(parts[0]);
  if (cfg.model.profile_path.empty())
    throw core::ConfigError(cfg.model.loc, "calibrate needs the run's measured profile in model.profile",
                            "add `profile: FILE` (written by harmony-run profile) under model:");
  loaded.models.push_back(std::make_unique<core::Model>(core::load_profile(cfg.model.profile_path)));
  const core::Model& model = *loaded.models.back();
  sim::CalibrationRun r;
  r.name = file_name(parts[0]);
  r.model = &model;
  r.machine = base;
  r.machine.gpu_memory_bytes = cfg.machine.gpu_memory_bytes;
  const std::string trace_text = core::read_input_file(parts[1], "the measured trace");
  const auto candidates = candidate_programs(cfg, model, trace_text);
  std::optional<core::ConfigError> first_error;
  for (const auto& p : candidates) {
    try {
      r.measured = sim::read_measured_trace(parts[1], trace_text, p);
    } catch (const core::ConfigError& e) {
      if (!first_error) first_error = e;
      continue;
    }
    loaded.programs.push_back(std::make_unique<core::Program>(p));
    break;
  }
  if (loaded.programs.size() != loaded.runs.size() + 1) throw *first_error;
  r.program = loaded.programs.back().get();
  r.measured_step_s = parts.size() == 3 ? measured_step_s(parts[2], cfg) : r.measured.span_s;
  loaded.provenance.push_back(run_provenance(loaded.runs.size() + 1, parts, cfg, trace_text));
  loaded.runs.push_back(std::move(r));
}

// The calibrated machine: the machine file's text with the fitted keys, under a header naming its inputs and fit;
// read back to check it.
void write_calibrated_machine(const CalibrateCli& cli, const std::string& machine_text, const sim::Calibration& c,
                              const LoadedRuns& loaded) {
  const auto& runs = loaded.runs;
  std::vector<std::string> header = {
      fmt::format("fitted by `harmony-sim calibrate` (docs/validation.md#calibrate) on {} from {} measured run{} "
                  "(fingerprints: FNV-1a 64 of each input file):",
                  file_name(cli.machine), runs.size(), runs.size() == 1 ? "" : "s")};
  header.insert(header.end(), loaded.provenance.begin(), loaded.provenance.end());
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
}

}  // namespace

int cmd_calibrate(const CalibrateCli& cli) {
  if (!cli.check && cli.out.empty()) {
    fmt::print(stderr,
               "harmony-sim calibrate: error: --out FILE is required (or --check to predict without fitting)\n");
    return kExitBadInput;
  }
  if (!cli.check) core::check_output_file(cli.out, "the calibrated machine (--out)");
  const std::string machine_text = core::read_input_file(cli.machine, "the machine file");
  const core::MachineSpec base = core::load_machine_file(cli.machine);
  LoadedRuns loaded;
  for (const std::string& spec : cli.runs) {
    const std::vector<std::string> parts = split_at_commas(spec);
    if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
      fmt::print(stderr, "harmony-sim calibrate: error: --run '{}' is not CONFIG,TRACE[,RUN_JSON]\n", spec);
      return kExitBadInput;
    }
    load_calibration_run(parts, base, loaded);
  }
  if (cli.check) return print_calibration(cli, sim::check_machine(loaded.runs));
  const sim::Calibration c = sim::calibrate(loaded.runs);
  write_calibrated_machine(cli, machine_text, c, loaded);
  return print_calibration(cli, c);
}

}  // namespace harmony::sim::app
