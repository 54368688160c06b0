// harmony-run: the command line of real training. It parses the command line and runs one command: `train`
// (apps/run/train.cpp: a Program with real tensors on capped devices, the plan from apps/run/plan.cpp and the setup
// from apps/run/setup.cpp), `profile` (apps/run/profile.cpp) or `probe` (harmony_run_probe.cpp). The composition
// root: apps/ alone sees core/, sim/ (the search behind --plan auto) and backend/ together; this file prints the
// errors and picks exit codes (2: bad input).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/harmony_run_probe.hpp"
#include "apps/run/common.hpp"
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

using namespace harmony;
using namespace harmony::run;

namespace {

// Integer flag ranges with finite bounds: CLI11's PositiveNumber prints DBL_MAX's 309 digits.
const CLI::Range kPositiveInt(1, std::numeric_limits<int>::max());

const CLI::Range kNonNegativeInt(0, std::numeric_limits<int>::max());

// A host resource that failed after the pre-flight passed (`failure`: "out of host memory (std::bad_alloc)
// allocating X", "cannot start a thread: ..."), with the limits as they stand now.
void report_host_resource_failure(const std::string& failure, const std::string& why = "") {
  const backend::HostMemoryProbe probe = backend::probe_host_memory();
  const backend::HostMemoryLimit* limit = probe.tightest();
  std::cerr << fmt::format("harmony-run: error: {}; {}\n  hint: {}\n", failure,
                           limit == nullptr ? std::string("no host memory limit could be read")
                                            : fmt::format("this process may allocate {:.2f} GiB more: {}",
                                                          gib(limit->headroom_bytes()), limit->describe()),
                           why + host_limit_hint(limit));
}

// The options every command shares: the config, --set, the dtype, the device memory and the device flags.
void add_common_options(CLI::App* sub, Cli& cli) {
  sub->add_option("config", cli.config, "YAML configuration (configs/run/, docs/config.md)")->required();
  sub->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=2 (repeatable)");
  sub->add_option("--dtype", cli.dtype,
                  "device storage: fp32 (default) or bf16 (mixed precision: bf16 weights, activations and "
                  "gradients on the devices, fp32 master weights and AdamW on the host; train.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--gpu-memory", cli.gpu_memory, "each device's memory, e.g. 2MiB (machine.gpu_memory)");
  sub->add_flag("--tf32", cli.device_flags.tf32,
                "device: cuda: fp32 GEMMs on TF32 tensor cores (faster; ~1e-3 relative error)");
  sub->add_flag("--exact", cli.device_flags.exact,
                "strict-order reductions: bias and norm gradients summed row by row, bf16 exact kernels (the CPU "
                "device's bits; slower on cuda, where parallel tree sums are the default)");
  sub->add_flag("--tree-sums", cli.device_flags.tree_sums,
                "device: cuda: parallel tree sums for bias and norm gradients (the default there; refused with "
                "--exact)");
  sub->add_flag("--no-fuse", cli.device_flags.no_fuse,
                "the unfused kernels: no cuBLASLt GELU epilogues, no fused residual add + LayerNorm (fused is the "
                "default on cuda, off with --exact; no effect on devices without fused kernels)");
  sub->add_flag("--poison", cli.device_flags.poison,
                "fill fresh device memory with NaN to catch reads before writes (default only in debug builds)");
}

// `train` and its options.
CLI::App* add_train_command(CLI::App& app, Cli& cli) {
  auto* train = app.add_subcommand("train", "train for train.steps steps, printing loss, samples/s and ETA");
  add_common_options(train, cli);
  train->footer(
      "Exit codes: 0 trained; 1 a failed write to stdout; 2 bad input, or a run refused up front (host memory, a "
      "checkpoint folder another run "
      "holds) or out of host memory; 3 stopped on a NaN or infinite loss or gradient (nothing of that step saved); "
      "70 a bug in harmony; 128 + n stopped by signal n after a checkpoint (docs/backend.md)");
  train->add_option("--steps", cli.steps, "steps to train (train.steps)")->check(kPositiveInt);
  train->add_option("--data", cli.data, "llm.c token file (uint16 ids) instead of the config's data");
  train->add_option("--plan", cli.plan, "config (the plan: section) or auto (search the best plan that fits)")
      ->check(CLI::IsMember({"config", "auto"}));
  train->add_option("--trace", cli.trace,
                    "write the measured Chrome trace (Perfetto) of the fastest step after the first (the step "
                    "harmony-sim calibrate measures the run by)");
  train->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
  train->add_option("--checkpoint-dir", cli.checkpoint_dir, "save checkpoints here (checkpoint.dir)");
  train->add_option("--checkpoint-every", cli.checkpoint_every, "steps between checkpoints (checkpoint.every)")
      ->check(kNonNegativeInt);
  train->add_flag("--resume", cli.resume, "continue from the newest checkpoint in the checkpoint directory");
  train->add_option("--save-weights", cli.save_weights,
                    "write the trained weights (HF safetensors) and config.json beside them");
  train->add_flag("--quiet", cli.quiet, "no progress output");
  train
      ->add_option("--executor", cli.executor,
                   "serial: one op at a time; concurrent: a worker and stream per Program queue (copies overlap "
                   "compute; allocation order then varies with timing); auto (default): serial on CPU devices, "
                   "concurrent on CUDA")
      ->check(CLI::IsMember({"auto", "serial", "concurrent"}));
  train
      ->add_option("--run-ahead", cli.run_ahead,
                   "how far the host issues ops ahead of the devices (ops are ordered by events either way; the "
                   "same bits): 1 (default): once the ops each follows have completed, device memory as the "
                   "Program says; 2: one op per queue may still run (more memory); 0: unbounded")
      ->check(kNonNegativeInt);
  train->add_flag("--host-sums", cli.host_sums,
                  "sum data-parallel replicas' gradients on the host (each replica's copied down, added in rank "
                  "order, the sum copied back up: the reference path) instead of on the devices with a "
                  "communicator (the default; the same bits on CPU devices)");
  return train;
}

// `profile` and its options.
CLI::App* add_profile_command(CLI::App& app, Cli& cli) {
  auto* profile = app.add_subcommand("profile", "measure per-layer times and memory into a harmony-sim profile");
  add_common_options(profile, cli);
  profile->add_option("--out", cli.out, "profile JSON to write")->required();
  profile->add_option("--ubatch", cli.ubatch, "microbatch sizes (default 1..plan.minibatch)")->delimiter(',');
  profile->add_option("--repeats", cli.repeats, "timed repetitions per measurement (median)")->check(kPositiveInt);
  profile
      ->add_option("--rounds", cli.rounds,
                   "passes over all layers and sizes the repetitions are spread over (default 3, at most --repeats)")
      ->check(kPositiveInt);
  return profile;
}

// The error ladder: runs the command and turns what it throws into a message on stderr and an exit code.
int run_reporting_errors(const Cli& cli, const std::function<int()>& command) {
  try {
    return command();
  } catch (const core::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitBadInput;
  } catch (const core::InternalError& e) {
    std::cerr << "harmony-run: " << e.what()
              << "\n  this is a bug in harmony; please report it with the command line\n";
    return kExitInternal;
  } catch (const core::ScheduleError& e) {
    std::cerr << cli.config << ": error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const backend::BackendError& e) {  // bad weights, token file or checkpoint (FormatError, CheckpointError)
    std::cerr << "harmony-run: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const HostAllocationError& e) {
    report_host_resource_failure(fmt::format("out of host memory (std::bad_alloc) allocating {}", e.what()));
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    report_host_resource_failure("out of host memory (std::bad_alloc)");
    return kExitBadInput;
  } catch (const std::system_error& e) {  // a thread that cannot start: the address space or the process limit
    if (e.code() != std::errc::resource_unavailable_try_again && e.code() != std::errc::not_enough_memory) {
      std::cerr << "harmony-run: internal error: " << e.what() << "\n";
      return 1;
    }
    report_host_resource_failure(fmt::format("cannot start a thread: {}", e.what()),
                                 "each thread maps its stack (ulimit -s) and may reserve a malloc arena of 64 MiB "
                                 "in the address space: ");
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "harmony-run: internal error: " << e.what() << "\n";
    return 1;
  }
}

int run_cli(int argc, char** argv) {
  CLI::App app{"harmony-run: train a GPT model with a Harmony schedule on capped devices (docs/backend.md)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "harmony-run 0.1.0");
  Cli cli;
  add_train_command(app, cli);
  auto* profile = add_profile_command(app, cli);
  apps::ProbeCli probe_cli;
  auto* probe = apps::add_probe_command(app, probe_cli);  // apps/harmony_run_probe.cpp
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<CLI::App*> subs = app.get_subcommands();
    std::cerr << core::command_line_error("harmony-run", e.what(), subs.empty() ? "" : subs.front()->get_name())
              << "\n";
    return kExitBadInput;
  }
  return run_reporting_errors(cli, [&] {
    if (*profile) return cmd_profile(cli);
    if (*probe) return apps::cmd_probe(probe_cli);
    return cmd_train(cli);
  });
}

}  // namespace

int main(int argc, char** argv) {
  core::ignore_file_size_signal();  // past `ulimit -f` a write fails with EFBIG (exit 2, named), not SIGXFSZ (153)
  try {
    // run_cli, then the check that stdout took every byte (`--format json > /dev/full` must not exit 0)
    return core::run_checking_stdout([&] { return run_cli(argc, argv); }, "harmony-run", std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "harmony-run: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "harmony-run: internal error\n";
  }
  return 1;
}
