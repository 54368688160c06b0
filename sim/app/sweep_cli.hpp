// The `sweep` and `merge` subcommands of harmony-sim (docs/sweeps.md): their CLI11 options, progress on stderr
// (sim/app/progress_cli.hpp), the summary on stdout. Part of the harmony-sim executable (it prints), not of the
// library.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace harmony::sim {

class SweepCommands {
 public:
  explicit SweepCommands(CLI::App& app);  // adds `sweep` and `merge` to app
  bool selected() const;                  // after parsing: one of them was given
  int run();                              // throws core::ConfigError for bad input (exit 2 in main)

 private:
  CLI::App* sweep_ = nullptr;
  CLI::App* merge_ = nullptr;
  std::string sweep_file_;
  std::string out_;
  std::string shard_ = "0/1";
  int threads_ = 0;
  bool quiet_ = false;
  bool allow_large_grid_ = false;
  bool repair_ = false;           // --repair: recompute the broken rows of an earlier run (docs/sweeps.md, "Resume")
  std::string format_ = "table";  // table or json (the summary; docs/output-schema.md)
  std::string merge_out_;
  std::vector<std::string> merge_in_;
};

}  // namespace harmony::sim
