// `harmony-run probe`: the command-line side of backend/probe/ (docs/machines.md, "Measuring a machine"): its
// options, the device it measures, the base machine, the machine file it writes and the table or JSON it prints.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace harmony::apps {

struct ProbeCli {
  std::string out;     // the machine file to write; empty: none
  std::string base;    // a preset or machine file; empty: cpu-4x for --device cpu (cuda requires one)
  std::string nvme;    // a folder on the drive to measure; empty: none
  std::string device = "cpu";
  std::string format = "table";
  bool quick = false;
  bool quiet = false;
};

// Registers `probe` on harmony-run's command line, its options stored in `cli`.
CLI::App* add_probe_command(CLI::App& app, ProbeCli& cli);
// Runs it: 0, or throws what harmony-run's main reports (core::ConfigError for bad input: exit 2).
int cmd_probe(const ProbeCli& cli);

}  // namespace harmony::apps
