// `harmony-run probe`: the command-line side of backend/probe/ (docs/machines.md, "Measuring a machine"): its
// options, the device it measures, the base machine, the machine file it writes and the table or JSON it prints.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace harmony::apps {

struct ProbeCli {
  std::string out;              // the machine file to write; empty: none
  std::string base;             // a preset or machine file; empty: cpu-4x for a cpu device (a GPU requires one)
  std::string path;             // a folder on the drive to measure (NVMe or any file system); empty: none
  std::string file_size;        // the drive test file's size ("256MiB"); empty: 16 MiB, 512 MiB with --long
  std::string device = "auto";  // a registered device kind, or auto: the first with pinned host memory available
  std::string format = "table";
  bool long_run = false;  // --long: the larger sizes and 5 runs (about 30 s), not the quick default (a few seconds)
  bool quiet = false;
};

// Registers `probe` on harmony-run's command line, its options stored in `cli`.
CLI::App* add_probe_command(CLI::App& app, ProbeCli& cli);
// Runs it: 0, or throws what harmony-run's main reports (core::ConfigError for bad input: exit 2).
int cmd_probe(const ProbeCli& cli);

}  // namespace harmony::apps
