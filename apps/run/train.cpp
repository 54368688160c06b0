// harmony-run train: the steps with progress, checkpoints and stop signals, the non-finite stop, and the run's
// table and JSON (docs/backend.md, docs/output-schema.md).
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
#include "core/output/host_memory.hpp"
#include "core/output/report.hpp"
#include "core/output/trace.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/program/state_layout.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::run {

// SIGINT, SIGTERM and SIGHUP during training: finish the step, save a checkpoint, exit 128 + the signal's
// number (130, 143, 129). The first one puts all three back to their default action, so a second signal (of
// any of the three) ends the process at once.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int signo) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (const int s : kStopSignals) sigaction(s, &dfl, nullptr);  // async-signal-safe
  // Two signals can reach two threads' handlers at once (the mask only blocks within one thread): the one
  // that is not first re-raises with the default action, which ends the process when its handler returns.
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, signo)) raise(signo);
}

const char* signal_name(int signo) {
  return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (const int s : kStopSignals) sigaddset(&sa.sa_mask, s);  // one handler at a time
  sa.sa_flags = SA_RESTART;
  // A signal ignored when the run started stays ignored (nohup's SIGHUP), as harmony-sim's sweep does.
  for (const int s : kStopSignals) {
    struct sigaction previous {};
    if (sigaction(s, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    sigaction(s, &sa, nullptr);
  }
}

// Every file the run will write, checked before any work so that a bad path never throws a run away.
void check_train_outputs(const Cli& cli, const core::TrainConfig& cfg) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  if (!cli.save_weights.empty()) {
    core::check_output_file(cli.save_weights, "the weights (--save-weights)");
    core::check_output_file(backend::hf_config_path_for(cli.save_weights), "the weights' config.json (--save-weights)");
  }
  if (!cfg.checkpoint.dir.empty()) core::check_output_dir(cfg.checkpoint.dir, "the checkpoint directory");
}

// What the run is: printed before step 1 (table output, without --quiet).
void print_header(const Setup& s, const Chosen& chosen) {
  const auto& cfg = s.cfg;
  const core::Plan& plan = chosen.plan;
  fmt::print("model    {} ({} parameters, {:.2f} MiB of fp32 weights; {:.2f} MiB with AdamW state)\n", s.desc.name,
             s.model->param_count(), mib(s.model->param_count() * 4), mib(s.model->param_count() * 12));
  fmt::print("devices  {} x {} with {} each{}\n", plan.gpus, cfg.device, capacity_text(cfg.machine.gpu_memory_bytes),
             cfg.train.dtype == "bf16"
                 ? "; bf16 weights, activations and gradients (fp32 masters and AdamW on the host)"
                 : "");
  fmt::print("plan     {} ({} ops)\n", chosen.title, chosen.program.ops.size());
  fmt::print("data     {} ({} tokens; {} steps per epoch)\n", s.tokens.name(), s.tokens.size(),
             s.tokens.steps_per_epoch(plan.minibatch, cfg.model.seq_len));
  std::fflush(stdout);
}

// The checkpoint directory of a run (empty: none), the meta of its checkpoints and the newest one it holds.
struct Checkpoints {
  std::string dir;
  backend::CheckpointMeta meta;
  std::string newest;  // resumed from or saved by this run; empty when none
  std::int64_t newest_step = 0;

  std::string save(int done_steps, const std::vector<double>& losses, const backend::HostState& state, int keep) {
    meta.step = done_steps;
    meta.data_position = static_cast<std::uint64_t>(done_steps);
    meta.losses = losses;
    newest = allocating("a checkpoint", [&] { return backend::save_checkpoint(dir, meta, state, keep); });
    newest_step = done_steps;
    return newest;
  }
};

// What the steps of this process measured, for the summary, the JSON and the trace.
struct RunLog {
  int start = 0;                                   // steps done before this process (a resumed run's)
  int ran = 0;                                     // steps this process ran
  double run_s = 0.0;                              // their wall time
  std::vector<double> losses;                      // every step's loss since step 1 (a resumed run's history first)
  nlohmann::json steps = nlohmann::json::array();  // this process's steps
  // --trace: the fastest step after this process's first (its warm-up; the first itself when it is the only one),
  // the step harmony-sim calibrate measures a run by, so the trace it fits and the time it compares are one step.
  backend::StepResult traced;
  int traced_step = 0;  // 1-based; 0 = none yet
  double traced_s = 0.0;
};

// A loss this many times the run's first is reported as divergence (once).
constexpr double kDivergenceFactor = 100.0;

// Training stopped at `step` (1-based) on a non-finite loss or gradient: the error, what is kept, what to do.
// Returns kExitNonFinite.
int stop_nonfinite(const Setup& s, const Cli& cli, const Checkpoints& ck, int step, const backend::StepResult& r) {
  const auto& g = r.nonfinite_gradient;
  std::string what;
  if (!std::isfinite(r.loss)) {
    what = fmt::format("the loss is {}", std::isnan(r.loss) ? "NaN" : r.loss > 0 ? "+infinity" : "-infinity");
    if (g)
      what += fmt::format(", and the gradients of {} parameters are not finite either (the one nearest the loss: {})",
                          g->params, g->param);
  } else {
    what =
        fmt::format("the gradient of {} (layer {}) holds a NaN or an infinity{}; the loss was {:.6g}", g->param,
                    s.model->layer_name(g->layer),
                    g->params > 1 ? fmt::format(", as do {} other parameters'", g->params - 1) : std::string(), r.loss);
  }
  std::string kept;
  if (ck.dir.empty()) {
    kept = "no checkpoint directory: the run's progress is not saved";
  } else if (ck.newest.empty()) {
    kept = fmt::format("no checkpoint was saved in {} before it", ck.dir);
  } else {
    kept = fmt::format("the newest checkpoint, {} (step {}), is kept as it was", ck.newest, ck.newest_step);
  }
  std::string unwritten;
  for (const auto& [flag, path] : {std::pair{"--save-weights", &cli.save_weights}, std::pair{"--trace", &cli.trace}})
    if (!path->empty()) unwritten += fmt::format("{}{} {}", unwritten.empty() ? "; not written: " : ", ", flag, *path);
  fmt::print(stderr,
             "harmony-run: error: training stopped at step {}: {}. The step's update used it, so nothing of it was "
             "saved: {}{}\n  hint: lower train.lr (now {:g}), check the data{}; a --resume repeats the same steps "
             "with the same settings (exit code {}: non-finite training, docs/backend.md)\n",
             step, what, kept, unwritten, s.cfg.train.lr, s.cfg.model.gpt2 ? "" : " and the weights (model.weights)",
             kExitNonFinite);
  return kExitNonFinite;
}

// What to change when a step runs out of device memory, in the terms of the run's kind (packs only for a kind that has
// them; a one-microbatch kind's microbatch is its share of the minibatch; keep's saved activations), and what of the
// run is saved.
std::string out_of_memory_hint(const core::PlanSpec& plan, const Checkpoints& ck) {
  const core::PlanKind kind = plan.kind;
  std::string change = kind->packs ? "use smaller packs (plan.pack_size) or microbatches (plan.u_fwd, plan.u_bwd)"
                       : kind->one_microbatch
                           ? "use a smaller minibatch or more GPUs (its one microbatch is each GPU's "
                             "share)"
                           : "use a smaller microbatch (plan.u_bwd)";
  if (kind.has_knob(core::Knob::Activations) && plan.knobs.activation_policy == core::ActivationPolicy::Keep)
    change += ", recompute the activations (plan.activations: checkpoint)";
  const std::string saved = ck.newest.empty() ? "no checkpoint was written by this run"
                                              : fmt::format("the newest checkpoint, {} (step {}), is kept as it was",
                                                            ck.newest, ck.newest_step);
  return fmt::format("raise --gpu-memory, {}, or let --plan auto pick a plan that fits; {}", change, saved);
}

// Steps log.start+1 .. train.steps with progress (stderr: a bar on a terminal, otherwise the first, the last and
// one line per 10 s), checkpoints, a warning when the loss diverges, and the stops: 0 when every step ran, else
// the exit code (a stop signal: 128 + its number, after a checkpoint; a non-finite loss or gradient:
// kExitNonFinite, nothing saved).
int train_steps(const Cli& cli, Setup& s, backend::Executor& executor, Checkpoints& ck, RunLog& log) {
  const auto& cfg = s.cfg;
  const int B = cfg.plan.minibatch, T = cfg.model.seq_len, steps = cfg.train.steps;
  const bool quiet = cli.quiet;
  install_stop_handlers();
  const bool tty = isatty(STDERR_FILENO) != 0;
  // Off a terminal (a log file, Slurm's output) one progress line for the first step, then one every
  // kProgressLineEvery_s and one for the last, as harmony-sim's sweeps and searches write theirs.
  constexpr double kProgressLineEvery_s = 10.0;
  auto last_line = std::chrono::steady_clock::now();
  bool on_bar = false;  // a terminal's progress bar is the line the cursor is on
  const auto end_bar = [&] {
    if (on_bar) fmt::print(stderr, "\n");
    on_bar = false;
  };
  bool warned = false;
  std::vector<std::int32_t> in, tgt;
  for (int step = log.start; step < steps; ++step) {
    s.tokens.batch(step, B, T, in, tgt);
    const auto t0 = std::chrono::steady_clock::now();
    backend::StepResult last;
    try {
      last = allocating(fmt::format("training step {}", step + 1), [&] { return executor.step(in, tgt); });
    } catch (const backend::OutOfMemory& e) {
      end_bar();
      throw core::ConfigError(
          core::SourceLoc{cfg.file, 0, 0},
          fmt::format("the plan does not fit the devices' memory (machine.gpu_memory = {}) at step {}: {}",
                      capacity_text(cfg.machine.gpu_memory_bytes), step + 1, e.what()),
          out_of_memory_hint(cfg.plan, ck));
    }
    if (!std::isfinite(last.loss) || last.nonfinite_gradient) {
      end_bar();
      return stop_nonfinite(s, cli, ck, step + 1, last);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log.run_s += dt;
    ++log.ran;
    if (!cli.trace.empty() && (log.ran == 1 || log.ran == 2 || dt < log.traced_s)) {
      log.traced = last;
      log.traced_step = step + 1;
      log.traced_s = dt;
    }
    log.losses.push_back(last.loss);
    log.steps.push_back(
        {{"step", step + 1}, {"loss", last.loss}, {"step_time_s", dt}, {"throughput_samples_per_s", B / dt}});
    const auto now = std::chrono::steady_clock::now();
    if (!quiet && (tty || step == log.start || step + 1 == steps ||
                   std::chrono::duration<double>(now - last_line).count() >= kProgressLineEvery_s)) {
      progress(step + 1, steps, last.loss, B * log.ran / log.run_s, (steps - step - 1) * log.run_s / log.ran, tty);
      on_bar = tty && step + 1 < steps;
      last_line = now;
    }
    if (!warned && last.loss > kDivergenceFactor * log.losses.front()) {
      warned = true;
      end_bar();
      fmt::print(stderr,
                 "harmony-run: warning: step {}: the loss {:.6g} is {:.3g} times step 1's {:.6g}: the run is "
                 "diverging\n  hint: lower train.lr (now {:g}); Ctrl-C stops it with a checkpoint{}\n",
                 step + 1, last.loss, last.loss / log.losses.front(), log.losses.front(), cfg.train.lr,
                 ck.dir.empty() ? " when --checkpoint-dir is given" : "");
    }
    const bool due = cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0;
    const int stop = g_signal.load();
    if (!ck.dir.empty() && (due || stop != 0)) {
      executor.sync_state();  // a resident kind's weights and moments are on its devices
      const std::string path = ck.save(step + 1, log.losses, *s.state, cfg.checkpoint.keep);
      if (!quiet && !tty) fmt::print(stderr, "checkpoint {}\n", path);
    }
    if (stop != 0) {
      end_bar();
      fmt::print(stderr, "interrupted by {} after step {}{}\n", signal_name(stop), step + 1,
                 ck.dir.empty() ? " (no checkpoint directory: progress is lost)"
                                : fmt::format("; checkpoint saved in {}; continue with --resume", ck.dir));
      return 128 + stop;
    }
  }
  return 0;
}

// --format json: the run's document (docs/output-schema.md, schemas/harmony-run-train.schema.json); unknown
// values (nothing ran) are null.
// Host memory of the run: the executor's metered host allocations (ExecutorHostMemory: the HostState blocks its steps
// use and the interpreters' host buffers, by core::HostBreakdown's categories), harmony-sim's host account of the same
// Program (what check_host_memory checked), and the process's peak resident set (VmHWM: everything, on the CPU device
// the devices' arenas too, as DeviceCaps::memory_in_host says).
struct HostMemoryReport {
  backend::ExecutorHostMemory measured;
  sim::HostAccount predicted;
  std::optional<core::Bytes> peak_rss_bytes;
  bool devices_in_host = false;  // the devices' memory is host RAM (counted in peak_rss_bytes, not in measured)
};

nlohmann::json host_memory_json(const HostMemoryReport& h) {
  using nlohmann::json;
  const auto parts = [](const core::HostBreakdown& b) { return core::host_breakdown_json(b, core::kStagingKey); };
  return {{"peak_bytes", h.measured.peak_bytes()},
          {"at_peak", parts(h.measured.at_peak)},
          {"category_peaks", parts(h.measured.peak)},
          {"predicted_bytes", h.predicted.total_bytes()},
          {"predicted", parts(h.predicted)},
          {"process_peak_rss_bytes", h.peak_rss_bytes ? json(*h.peak_rss_bytes) : json(nullptr)},
          {"device_memory_in_host", h.devices_in_host}};
}

void print_train_json(const Cli& cli, const Setup& s, const Chosen& chosen, const RunLog& log,
                      const std::vector<core::Bytes>& peaks, const Prediction& predicted,
                      const HostMemoryReport& host) {
  using nlohmann::json;
  const auto& cfg = s.cfg;
  const core::Plan& plan = chosen.plan;
  const int B = plan.minibatch;
  const double mean_step_s = log.ran > 0 ? log.run_s / log.ran : 0.0;
  const auto or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  const bool packs = plan.kind->packs;
  json per_gpu = json::array();
  core::Bytes peak = 0;
  for (std::size_t g = 0; g < peaks.size(); ++g) {
    per_gpu.push_back({{"gpu", g}, {"peak_memory_bytes", peaks[g]}});
    peak = std::max(peak, peaks[g]);
  }
  const json doc = {{"schema_version", core::kOutputSchemaVersion},
                    {"command", "train"},
                    {"config_path", cli.config},
                    {"device", cfg.device},
                    {"dtype", cfg.train.dtype},
                    {"plan",
                     {{"title", chosen.title},
                      {"plan_kind", plan.kind.name()},
                      {"gpus", plan.gpus},
                      {"minibatch", plan.minibatch},
                      {"u_fwd", plan.u_fwd},
                      {"u_bwd", plan.u_bwd},
                      {"packs_fwd", packs ? core::packs_to_json(plan.packs_fwd) : json(nullptr)},
                      {"packs_bwd", packs ? core::packs_to_json(plan.packs_bwd) : json(nullptr)}}},
                    {"steps", log.steps},
                    {"summary",
                     {{"first_step", log.start + 1},
                      {"last_step", cfg.train.steps},
                      {"steps_run", log.ran},
                      {"first_loss", log.losses.empty() ? json(nullptr) : json(log.losses.front())},
                      {"final_loss", log.losses.empty() ? json(nullptr) : json(log.losses.back())},
                      {"losses", log.losses},
                      {"train_time_s", log.run_s},
                      {"step_time_s", log.ran > 0 ? json(mean_step_s) : json(nullptr)},
                      {"traced_step", log.traced_step > 0 ? json(log.traced_step) : json(nullptr)},
                      {"predicted_step_time_s", or_null(predicted.step_s.value_or(std::nan("")))},
                      {"prediction_error", or_null(prediction_error(predicted, mean_step_s))},
                      {"throughput_samples_per_s", log.ran > 0 ? json(B * log.ran / log.run_s) : json(nullptr)},
                      {"gpu_capacity_bytes", cfg.machine.gpu_memory_bytes},
                      {"model_weight_bytes", s.model->param_count() * 4},
                      {"num_parameters", s.model->param_count()},
                      {"peak_memory_bytes", peaks.empty() ? json(nullptr) : json(peak)},
                      {"per_gpu", std::move(per_gpu)},
                      {"host_memory", host_memory_json(host)}}}};
  fmt::print("{}\n", doc.dump(1));
}

// The table's results (printed with --quiet too: it only drops the progress).
void print_train_summary(const Setup& s, const RunLog& log, const std::vector<core::Bytes>& peaks,
                         const Prediction& predicted, bool serial, const HostMemoryReport& host) {
  const auto& cfg = s.cfg;
  const int B = cfg.plan.minibatch;
  const double mean_step_s = log.ran > 0 ? log.run_s / log.ran : 0.0;
  const double error = prediction_error(predicted, mean_step_s);
  // this process's steps (a resumed run's earlier losses are not its own)
  const double first = log.ran > 0 ? log.losses[log.losses.size() - static_cast<std::size_t>(log.ran)] : 0.0;
  fmt::print("done     {} steps in {:.2f} s ({:.1f} samples/s); loss {:.4f} -> {:.4f}\n", log.ran, log.run_s,
             log.ran > 0 ? B * log.ran / log.run_s : 0.0, first, log.ran > 0 ? log.losses.back() : 0.0);
  std::string p;
  for (std::size_t g = 0; g < peaks.size(); ++g) p += fmt::format("{}{:.2f}", g ? ", " : "", mib(peaks[g]));
  fmt::print("memory   peak per device (MiB): {} of {:.2f}; the model's weights alone are {:.2f} MiB\n", p,
             mib(cfg.machine.gpu_memory_bytes), mib(s.model->param_count() * 4));
  const core::Bytes measured = host.measured.peak_bytes(), expected = host.predicted.total_bytes();
  fmt::print(
      "host     peak {:.2f} MiB of executor host memory (masters, optimizer state, gradients, stashes, "
      "activations, staging){}; process peak RSS {}{}\n",
      mib(measured),
      expected > 0 ? fmt::format("; harmony-sim's host account {:.2f} MiB ({:+.1f}%)", mib(expected),
                                 100.0 * (static_cast<double>(expected) / static_cast<double>(measured) - 1))
                   : std::string(),
      host.peak_rss_bytes ? fmt::format("{:.2f} MiB", mib(*host.peak_rss_bytes)) : std::string("unknown"),
      host.devices_in_host ? " (the devices' memory included: it is host RAM)" : "");
  if (predicted.step_s && std::isfinite(error))
    fmt::print("predict  {:.4f} s/step by harmony-sim (native{}) on machine {}; measured {:.4f} s/step ({:+.1f}%)\n",
               *predicted.step_s, serial ? ", one op at a time as the serial executor" : "", cfg.machine.name,
               mean_step_s, 100.0 * error);
  else if (log.ran > 0)
    fmt::print("predict  none: {}; measured {:.4f} s/step\n", predicted.why_not, mean_step_s);
}

// The checkpoint directory first (before any search or allocation): one writer at a time, and a fresh run never
// writes where a run's checkpoints are.
void lock_checkpoint_dir(const Cli& cli, const core::TrainConfig& cfg,
                         std::optional<backend::CheckpointDirLock>* lock) {
  const std::string& ckdir = cfg.checkpoint.dir;
  if (cli.resume && ckdir.empty())
    throw core::ConfigError(core::SourceLoc{cfg.file, 0, 0}, "--resume needs a checkpoint directory",
                            "give --checkpoint-dir DIR or checkpoint.dir in the config");
  if (!ckdir.empty()) {
    lock->emplace(ckdir);
    if (!cli.resume)
      if (auto latest = backend::latest_checkpoint(ckdir))
        throw core::ConfigError(core::SourceLoc{cfg.file, 0, 0},
                                fmt::format("checkpoint directory {} already holds {}", ckdir, *latest),
                                "continue that run with --resume, or give an empty --checkpoint-dir (a fresh run "
                                "never overwrites saved checkpoints)");
  }
}

// What a kind with resident state keeps on each device, for the message when it does not fit, as core::state_layout
// reads the Program: over several devices a Program that gathers and reduce-scatters shards it (fsdp, zero3: each
// device 1/N of the weights, gradients and AdamW state; zero2, gathering after its updates: the whole weights and 1/N
// of the rest). The MiB are the executor's own account (backend::held_between_steps, the largest device's).
struct ResidentState {
  bool sharded = false;
  std::string what, per;
  double mib = 0;
};

ResidentState resident_state(const core::Program& prog, const backend::Gpt2& model, backend::DType dtype) {
  const core::StateLayout layout = core::state_layout(prog);
  const int n = prog.num_devices();
  ResidentState r;
  r.sharded = layout.sharded && n > 1;
  const int w = dtype == backend::DType::BF16 ? 2 : 4;  // the working copy's bytes per parameter
  if (r.sharded && layout.whole_weights) {
    r.what = fmt::format("the whole model's weights and 1/{} of its gradients and AdamW state on each device", n);
    r.per = fmt::format("{} + {} / {} bytes per parameter", w, 16 - w, n);
  } else if (r.sharded) {
    r.what = fmt::format("1/{} of the model's weights, gradients and AdamW state on each device", n);
    r.per = fmt::format("16 bytes per parameter / {}", n);
  } else {
    r.what = "the whole model's weights, gradients and AdamW state on every device";
    r.per = "16 bytes per parameter";
  }
  core::Bytes most = 0;
  for (int d = 0; d < n; ++d) most = std::max(most, backend::held_between_steps(prog, model, dtype, d));
  r.mib = static_cast<double>(most) / (1 << 20);
  return r;
}

// The run's executor, emplaced in *executor; a kind with resident state whose state does not fit the devices is
// bad input, named.
void make_run_executor(const Cli& cli, const Setup& s, const Chosen& chosen, const std::vector<backend::Device*>& devs,
                       backend::Communicator* comm, std::optional<backend::Executor>* executor) {
  const auto& cfg = s.cfg;
  const core::Plan& plan = chosen.plan;
  try {
    allocating("the executor's host buffers (stashes and swapped activations)",
               [&] { executor->emplace(chosen.program, devs, *s.state, executor_options(cli, cfg, comm)); });
  } catch (const backend::OutOfMemory& e) {
    if (!plan.kind->resident_state) throw;
    const ResidentState rs = resident_state(chosen.program, *s.model, run_dtype(cfg));
    throw core::ConfigError(
        core::SourceLoc{cfg.file, 0, 0},
        fmt::format("{} keeps {} ({:.2f} MiB, {}) and they do not fit machine.gpu_memory = {}: {}", plan.kind.name(),
                    rs.what, rs.mib, rs.per, capacity_text(cfg.machine.gpu_memory_bytes), e.what()),
        fmt::format("raise --gpu-memory{}, or train the model larger than the devices with a kind that swaps "
                    "(harmony-pp, harmony-dp; --plan auto picks a plan that fits)",
                    rs.sharded ? " or shard over more devices (plan.gpus)" : ""));
  }
}

// --resume: the newest checkpoint's state, step and losses (a mismatched or corrupt one is refused); none there
// starts at step 0.
void resume_from_checkpoint(const Cli& cli, Setup& s, Checkpoints& ck, RunLog& log) {
  const bool json = cli.format == "json";
  const bool quiet = cli.quiet;
  if (auto latest = backend::latest_checkpoint(ck.dir)) {
    const backend::CheckpointMeta got = backend::load_checkpoint(*latest, *s.state, &ck.meta);
    if (const auto bad = nonfinite_tensor(*s.state, true))
      throw core::ConfigError(core::SourceLoc{*latest, 0, 0}, "the checkpoint cannot continue training: " + *bad,
                              "move it away and resume from an older checkpoint, or start again in another "
                              "--checkpoint-dir (harmony-run never saves a step whose loss or gradients are not "
                              "finite: this one was written by another program or version)");
    log.start = static_cast<int>(got.step);
    log.losses = got.losses;
    ck.newest = *latest;
    ck.newest_step = got.step;
    if (!quiet) fmt::print(json ? stderr : stdout, "resumed  {} at step {}\n", *latest, log.start);
  } else if (!quiet) {
    fmt::print(json ? stderr : stdout, "resume   no checkpoint in {}: starting at step 0\n", ck.dir);
  }
  std::fflush(stdout);
}

// After the steps: the last checkpoint (unless the last step saved one), --save-weights and --trace.
void write_run_outputs(const Cli& cli, const Setup& s, const Chosen& chosen, Checkpoints& ck, const RunLog& log) {
  const auto& cfg = s.cfg;
  if (!ck.dir.empty() && log.ran > 0 && (cfg.checkpoint.every == 0 || cfg.train.steps % cfg.checkpoint.every != 0))
    ck.save(cfg.train.steps, log.losses, *s.state, cfg.checkpoint.keep);
  if (!cli.save_weights.empty()) backend::save_hf_model(cli.save_weights, *s.state);
  if (!cli.trace.empty() && log.ran > 0) {
    nlohmann::json doc = core::chrome_trace_json(chosen.program, log.traced.begin, log.traced.end,
                                                 core::TraceMeta{"harmony-run (" + cfg.device + ")", chosen.title});
    doc["otherData"]["step"] = log.traced_step;
    doc["otherData"]["step_time_s"] = log.traced_s;
    core::write_file_atomic(cli.trace, doc.dump(1) + "\n", "the trace");
  }
}

int cmd_train(const Cli& cli) {
  Setup s = make_setup(cli);
  load_run_profile(s);
  const auto& cfg = s.cfg;
  check_train_outputs(cli, cfg);
  const bool json = cli.format == "json";
  const bool quiet = cli.quiet;  // progress on stderr: beside JSON too, as harmony-sim's
  adamw_config(cfg).validate();
  std::optional<backend::CheckpointDirLock> ck_lock;
  lock_checkpoint_dir(cli, cfg, &ck_lock);
  check_host_state(s, cfg.plan.gpus);
  const Chosen chosen = choose(s, cli, quiet);
  check_host_memory(s, sim::host_account(chosen.program, s.desc), chosen.plan.gpus);
  allocating(fmt::format("the host model state (fp32 weights, gradients and AdamW moments: {:.2f} GiB)",
                         gib(s.model->param_count() * 16)),
             [&] { init_state(s); });
  const core::Plan& plan = chosen.plan;
  const core::Program& program = chosen.program;
  auto owned = allocating("the devices", [&] { return make_devices(cfg, s.device_flags, plan.gpus); });
  const std::vector<backend::Device*> devs = raw_devices(owned);
  auto comm = make_communicator(cfg, cli, devs);  // outlives the executor, dies before the devices
  // In an optional so that it and the devices are released before the prediction profiles on a device of the same
  // capacity (a CUDA device holds its whole block: two at once would not fit the GPU).
  std::optional<backend::Executor> run_executor;
  if (!json && !quiet) print_header(s, chosen);

  // Checkpoints: resume from the newest one when asked; a mismatched or corrupt one is refused. Before the executor
  // is built: a kind with resident state (resident, fsdp) copies the host state onto its devices then.
  Checkpoints ck{cfg.checkpoint.dir, checkpoint_meta(s, chosen), ""};
  RunLog log;
  if (cli.resume) resume_from_checkpoint(cli, s, ck, log);
  make_run_executor(cli, s, chosen, devs, comm.get(), &run_executor);

  if (const int stopped = train_steps(cli, s, *run_executor, ck, log); stopped != 0) return stopped;
  run_executor->sync_state();  // a resident kind's weights and moments are on its devices until now
  write_run_outputs(cli, s, chosen, ck, log);

  std::vector<core::Bytes> peaks;
  peaks.reserve(devs.size());
  for (auto* d : devs) peaks.push_back(d->memory().peak);
  const HostMemoryReport host{run_executor->host_memory(), sim::host_account(program, s.desc),
                              backend::peak_rss_bytes(), device_kind(cfg).caps().memory_in_host};
  run_executor.reset();  // the run's device memory back before predict() profiles (the state is on the host)
  comm.reset();
  owned.clear();
  const bool serial = !executor_options(cli, cfg).concurrent;
  const Prediction predicted =
      log.ran > 0 ? predict(s, chosen, serial, quiet) : Prediction{std::nullopt, "no step ran"};
  if (json) {
    print_train_json(cli, s, chosen, log, peaks, predicted, host);
  } else {
    print_train_summary(s, log, peaks, predicted, serial, host);
  }
  return 0;
}

}  // namespace harmony::run
