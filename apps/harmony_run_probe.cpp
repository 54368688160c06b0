// `harmony-run probe` (harmony_run_probe.hpp): checks its input before measuring anything (the base machine, the
// output file, the NVMe folder), makes the device, runs backend::run_probe, writes the machine file and reads it
// back as harmony-sim will, and prints the table or the JSON document.
#include "apps/harmony_run_probe.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "backend/probe/probe.hpp"
#include "backend/probe/probe_output.hpp"
#include "backend/registry.hpp"
#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "core/base/units.hpp"
#include "core/config/config.hpp"

namespace harmony::apps {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultCpuBase = "cpu-4x";

// The device whose copies are measured: --device's kind, or (auto) the first registered kind that pins host memory
// and is available here, else the reference kind with why not in `note`.
const backend::DeviceKind& probe_device_kind(const ProbeCli& cli, std::string& note) {
  if (cli.device != "auto") {
    const backend::DeviceKind& kind = backend::device_kind_at(cli.device, core::SourceLoc{"--device", 0, 0});
    backend::require_available(kind, core::SourceLoc{"--device", 0, 0});
    return kind;
  }
  std::vector<std::string> why;
  for (const backend::DeviceKind* k : backend::device_kinds()) {
    if (!k->caps().pinned_host_memory) continue;
    const backend::DeviceAvailability a = k->availability();
    if (a.available) return *k;
    why.push_back(fmt::format("{}: {}", k->name(), a.reason));
  }
  note = why.empty() ? "no device kind of this build pins host memory (built without CUDA)"
                     : fmt::format("no GPU here ({})", fmt::format("{}", fmt::join(why, "; ")));
  return backend::reference_device_kind();
}

// The base machine: loaded (a ConfigError for a bad one), and how the written file names it.
backend::ProbeBase load_base(const ProbeCli& cli, const backend::DeviceKind& kind) {
  backend::ProbeBase b;
  b.given = cli.base;
  if (b.given.empty()) {
    if (kind.caps().pinned_host_memory)
      throw core::ConfigError(core::SourceLoc{"--base", 0, 0},
                              fmt::format("the probe measures a {} device, and needs --base: the machine whose host "
                                          "links are measured",
                                          kind.name()),
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
  if (!cli.path.empty()) c += " --path " + cli.path;
  if (!cli.file_size.empty()) c += " --file-size " + cli.file_size;
  if (cli.long_run) c += " --long";
  if (!cli.out.empty()) c += " --out " + cli.out;
  return c;
}

// --file-size: a size of at least 4 MiB, a whole number of MiB (the drive is written in 4 MiB blocks by 4 threads,
// O_DIRECT in 4 KiB units); a ConfigError naming the flag otherwise.
core::Bytes file_size(const ProbeCli& cli) {
  if (cli.file_size.empty()) return 0;
  const std::optional<core::Bytes> b = core::parse_bytes(cli.file_size);
  if (!b || *b < 4 * core::kMiB || *b % core::kMiB != 0)
    throw core::ConfigError(core::SourceLoc{"--file-size", 0, 0},
                            fmt::format("--file-size '{}' is not a size of at least 4 MiB in whole MiB", cli.file_size),
                            "e.g. --file-size 256MiB or 2GiB (larger than the drive's cache measures the drive)");
  return *b;
}

}  // namespace

CLI::App* add_probe_command(CLI::App& app, ProbeCli& cli) {
  auto* probe = app.add_subcommand(
      "probe",
      "measure this machine's host rates (AdamW, memcpy, bf16 staging, pinned memory, host<->GPU copies, a "
      "drive's reads and writes) into a machine file");
  probe->add_option("--out", cli.out, "machine YAML to write (atomically): the base machine plus the measured keys");
  probe->add_option("--base", cli.base,
                    "the machine the measured keys go on top of: a preset or a machine file (default without a GPU: "
                    "cpu-4x; a GPU needs one)");
  probe->add_option("--path", cli.path,
                    "also measure sequential writes and reads of a test file in this folder (O_DIRECT where the file "
                    "system takes it; the file is removed afterwards, on an error or a stop signal too)");
  probe->add_option("--file-size", cli.file_size, "the --path test file's size (default 16MiB, 512MiB with --long)");
  std::vector<std::string> kinds = backend::device_kind_names();
  kinds.insert(kinds.begin(), "auto");
  probe
      ->add_option("--device", cli.device,
                   "the device whose host<->device copies and bf16 staging are measured: auto (default: a GPU when "
                   "one is available, else the cpu device, whose copies are not written) or " +
                       fmt::format("{}", fmt::join(backend::device_kind_names(), ", ")))
      ->check(CLI::IsMember(kinds));
  probe->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
  probe->add_flag("--long", cli.long_run, "larger sizes and 5 runs each (about 30 s), not the quick default (a few s)");
  probe->add_flag("--quiet", cli.quiet, "no progress lines on stderr");
  probe->footer(
      "Exit codes: 0 measured; 2 bad input (an unknown base or device, an output file or --path folder that "
      "cannot be used, a bad --file-size), nothing measured; 1 a failed write to stdout (docs/machines.md, "
      "\"Measuring a machine\")");
  return probe;
}

int cmd_probe(const ProbeCli& cli) {
  // Everything the user gave is checked before anything is measured.
  std::string device_note;
  const backend::DeviceKind& kind = probe_device_kind(cli, device_note);
  const backend::ProbeBase base = load_base(cli, kind);
  if (!cli.out.empty()) core::check_output_file(cli.out, "the machine file (--out)");
  backend::ProbeOptions options;
  options.quick = !cli.long_run;
  options.device_pins = kind.caps().pinned_host_memory;
  options.device_note = device_note;
  options.nvme_path = cli.path;
  options.nvme_file_bytes = file_size(cli);
  if (!cli.path.empty()) backend::check_nvme_path(cli.path, backend::nvme_file_bytes(options));
  auto device = kind.make_device(
      0, {.capacity = backend::probe_device_bytes(options.quick), .poison = backend::DeviceOptions::Poison::Off});
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
