// harmony-sim's command-line errors (CLI11's ParseError) in the tool's one error format: "harmony-sim SUB: error:
// MESSAGE" and a "  hint:" line, exit 2; --help and --version print as CLI11 prints them (exit 0). Part of the
// harmony-sim executable (it prints). harmony-run has its own for now; the two may share one in core/base later.
#pragma once

#include <CLI/CLI.hpp>

namespace harmony::sim {

// Prints `e` for `app` (argv: what was parsed, to name the command) and returns the exit code: 0 for --help and
// --version, 2 for an error.
int print_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

}  // namespace harmony::sim
