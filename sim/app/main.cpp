// harmony-sim: the command line of the simulator. It parses the command line, runs one command (sim/app/cmd_*.cpp:
// simulate, search, compare, memory, presets, kinds, report, calibrate; sweep and merge in sim/app/sweep_cli.cpp) and
// is the only place (with harmony-run's main) that prints errors and chooses exit codes: 0 ok, 2 bad input, 70 a bug.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <new>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "sim/app/cli_error.hpp"
#include "sim/app/commands.hpp"
#include "sim/app/sweep_cli.hpp"

using namespace harmony;
using namespace harmony::sim::app;

namespace {

// A memory failure (std::bad_alloc; sim/app/alloc_failure.cpp makes mimalloc throw it too): what the process ran out
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

// The options of the commands that read a config: the config, --set, --format and --trace.
void add_common_options(CLI::App* sub, Cli& cli) {
  sub->add_option("config", cli.config, "YAML configuration (see docs/config.md)")->required();
  sub->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=4 (repeatable)");
  sub->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
  sub->add_option("--trace", cli.trace,
                  "write a Chrome trace (Perfetto) of the plan (search: the best plan; compare: the fastest kind's)");
}

// The commands over one config's plans, and the listings `presets` and `kinds`.
struct PlanCommands {
  CLI::App* simulate;
  CLI::App* search;
  CLI::App* compare;
  CLI::App* memory;
  CLI::App* presets;
  CLI::App* kinds;
};

PlanCommands add_plan_commands(CLI::App& app, Cli& cli) {
  PlanCommands c{};
  c.simulate = app.add_subcommand("simulate", "simulate one plan (config `plan:` with u_fwd, u_bwd and packs)");
  add_common_options(c.simulate, cli);
  c.search = app.add_subcommand("search", "rank the configurations of the paper's search space");
  add_common_options(c.search, cli);
  c.compare = app.add_subcommand("compare", "best plan of every plan kind (Harmony-PP/DP and the swapping baselines)");
  add_common_options(c.compare, cli);
  for (auto* sub : {c.search, c.compare}) sub->add_flag("--quiet", cli.quiet, "no progress on stderr");
  c.compare->add_option("--deepspeed", cli.deepspeed,
                        "a DeepSpeed JSON config: price that run as its closest plan kind beside Harmony's best plan "
                        "(docs/comparison.md)");
  c.memory = app.add_subcommand(
      "memory", "what each plan kind needs of GPU, pinned host, host RAM and NVMe memory, and what binds (no search)");
  c.memory->add_option("config", cli.config, "YAML configuration (see docs/config.md)")->required();
  c.memory->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=4 (repeatable)");
  c.memory->add_option("--format", cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  c.memory
      ->add_option("--plan", cli.memory_plan,
                   "best (default): each kind's most promising plan; config: the config's plan: under every kind")
      ->check(CLI::IsMember({"best", "config"}));
  c.presets = app.add_subcommand("presets", "list the built-in machine presets");
  c.presets->add_option("--format", cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  c.kinds =
      app.add_subcommand("kinds", "list the plan kinds: role, whether harmony-run trains it, its plan.<knob> keys");
  c.kinds->add_option("--format", cli.format, "output: table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
  return c;
}

CLI::App* add_report_command(CLI::App& app, ReportCli& report_cli) {
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
  return report_cmd;
}

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCli& calibrate_cli) {
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
  return calibrate_cmd;
}

// The error ladder: runs the command and turns what it throws into a message on stderr and an exit code.
int run_reporting_errors(const Cli& cli, const std::function<int()>& command) {
  try {
    return command();
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

int run_cli(int argc, char** argv) {
  CLI::App app{"harmony-sim: simulate and search Harmony training schedules (VLDB 2022) from measured profiles"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "harmony-sim 0.1.0");
  Cli cli;
  const PlanCommands plan_cmds = add_plan_commands(app, cli);
  ReportCli report_cli;
  auto* report_cmd = add_report_command(app, report_cli);
  CalibrateCli calibrate_cli;
  auto* calibrate_cmd = add_calibrate_command(app, calibrate_cli);
  sim::SweepCommands sweep_cmds(app);  // `sweep` and `merge` (sim/app/sweep_cli.cpp)
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return sim::print_parse_error(app, e, argc, argv);  // "harmony-sim SUB: error: ..." + hint, exit 2
  }
  return run_reporting_errors(cli, [&] {
    if (*plan_cmds.presets) return cmd_presets(cli);
    if (*plan_cmds.kinds) return cmd_kinds(cli);
    if (sweep_cmds.selected()) return sweep_cmds.run();
    if (*report_cmd) return cmd_report(report_cli);
    if (*calibrate_cmd) return cmd_calibrate(calibrate_cli);
    if (*plan_cmds.simulate) return cmd_simulate(cli);
    if (*plan_cmds.compare) return cmd_compare(cli);
    if (*plan_cmds.memory) return cmd_memory(cli);
    return cmd_search(cli);
  });
}

}  // namespace

int main(int argc, char** argv) {
  core::ignore_file_size_signal();  // past `ulimit -f` a write fails with EFBIG (exit 2, named), not SIGXFSZ (153)
  try {
    // run_cli, then the check that stdout took every byte (`--format json > /dev/full` must not exit 0)
    return core::run_checking_stdout([&] { return run_cli(argc, argv); }, "harmony-sim", std::cerr);
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
