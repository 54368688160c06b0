// `harmony-run probe` (harmony_run_probe.hpp): checks its input before measuring anything (the base machine, the
// output file, the NVMe folder), makes the device, runs backend::run_probe, writes the machine file and reads it
// back as harmony-sim will, and prints the table or the JSON document.
#include "apps/harmony_run_probe.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "apps/cuda_loader.hpp"
#include "backend/cpu/cpu_device.hpp"
#include "backend/probe/probe.hpp"
#include "backend/probe/probe_output.hpp"
#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/config/config.hpp"

namespace harmony::apps {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultCpuBase = "cpu-4x";

// The base machine: loaded (a ConfigError for a bad one), and how the written file names it.
backend::ProbeBase load_base(const ProbeCli& cli) {
  backend::ProbeBase b;
  b.given = cli.base;
  if (b.given.empty()) {
    if (cli.device != "cpu")
      throw core::ConfigError(core::SourceLoc{"--base", 0, 0},
                              fmt::format("--device {} needs --base: the machine whose host is measured", cli.device),
                              "give a preset (harmony-sim presets) or a machine file that describes the GPUs, e.g. the "
                              "machine.yaml scripts/gpu-check.sh writes; the probe adds the host rates it measures");
    b.given = kDefaultCpuBase;
  }
  const std::vector<std::string> presets = core::machine_preset_names();
  std::error_code ec;
  b.preset = std::find(presets.begin(), presets.end(), b.given) != presets.end() && !fs::is_regular_file(b.given, ec);
  b.machine = core::load_machine_file(b.given);
  if (b.preset) {
    b.yaml_ref = b.given;
  } else {
    // named from the written file's folder, so the two can move together
    const fs::path abs = fs::absolute(b.given, ec).lexically_normal();
    const fs::path from = cli.out.empty() ? fs::path() : fs::absolute(cli.out, ec).parent_path();
    const fs::path rel = from.empty() ? fs::path() : abs.lexically_relative(from);
    b.yaml_ref = rel.empty() ? abs.string() : rel.string();
  }
  return b;
}

std::string command_line(const ProbeCli& cli) {
  std::string c = fmt::format("harmony-run probe --device {}", cli.device);
  if (!cli.base.empty()) c += " --base " + cli.base;
  if (!cli.nvme.empty()) c += " --nvme " + cli.nvme;
  if (cli.quick) c += " --quick";
  if (!cli.out.empty()) c += " --out " + cli.out;
  return c;
}

std::unique_ptr<backend::Device> make_probe_device(const ProbeCli& cli) {
  const core::Bytes capacity = backend::probe_device_bytes(cli.quick);
  if (cli.device == "cuda") return cuda_module("--device cuda").make_device(0, {.capacity = capacity});
  return backend::cpu::make_cpu_device(0, {.capacity = capacity, .poison = false});
}

}  // namespace

CLI::App* add_probe_command(CLI::App& app, ProbeCli& cli) {
  auto* probe = app.add_subcommand(
      "probe", "measure this machine's host rates (AdamW, memcpy, bf16 staging, pinned memory, copies, NVMe) into a "
               "machine file");
  probe->add_option("--out", cli.out, "machine YAML to write: the base machine plus the measured keys");
  probe->add_option("--base", cli.base,
                    "the machine the measured keys go on top of: a preset or a machine file (default for --device cpu: "
                    "cpu-4x; --device cuda needs one)");
  probe->add_option("--nvme", cli.nvme, "also measure sequential reads and writes of a test file in this folder");
  probe->add_option("--device", cli.device, "the device whose copies and bf16 staging are measured: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  probe->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
  probe->add_flag("--quick", cli.quick, "small sizes and 3 runs each (about 5 s; for tests), not about 30 s");
  probe->add_flag("--quiet", cli.quiet, "no progress lines on stderr");
  probe->footer("Exit codes: 0 measured; 2 bad input (an unknown base, an output file or --nvme folder that cannot be "
                "used), nothing measured; 1 a failed write to stdout (docs/machines.md, \"Measuring a machine\")");
  return probe;
}

int cmd_probe(const ProbeCli& cli) {
  // Everything the user gave is checked before anything is measured.
  const backend::ProbeBase base = load_base(cli);
  if (!cli.out.empty()) core::check_output_file(cli.out, "the machine file (--out)");
  if (!cli.nvme.empty()) backend::check_nvme_path(cli.nvme, cli.quick);
  auto device = make_probe_device(cli);
  backend::ProbeOptions options;
  options.quick = cli.quick;
  options.device_pins = cli.device == "cuda";
  options.nvme_path = cli.nvme;
  const backend::ProbeResult r = backend::run_probe(*device, options, [&](std::string_view what) {
    if (!cli.quiet) std::cerr << fmt::format("probe: {}\n", what);
  });
  device.reset();
  if (!cli.out.empty()) {
    core::write_file_atomic(cli.out, backend::probe_machine_yaml(r, base, command_line(cli)), "the machine file");
    try {
      (void)core::load_machine_file(cli.out);  // as harmony-sim will read it
    } catch (const core::ConfigError& e) {
      throw core::InternalError(fmt::format("the machine file the probe wrote does not load: {}", e.what()));
    }
  }
  const std::string text =
      cli.format == "json" ? backend::probe_json(r, base, cli.out) : backend::probe_table(r, base, cli.out);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace harmony::apps
