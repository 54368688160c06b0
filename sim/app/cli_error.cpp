// harmony-sim's command-line errors in its error format (sim/app/cli_error.hpp).
#include "sim/app/cli_error.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/base/error.hpp"

namespace harmony::sim {

int print_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: CLI11's own text, exit 0
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(sub->get_name());
  // The command the line named (argv[1]), when it is one: the messages and hints name it.
  const std::string first = argc > 1 ? argv[1] : "";
  const bool known = std::find(commands.begin(), commands.end(), first) != commands.end();
  if (!known && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    const std::string message = first.empty()     ? "a command is required"
                                : first[0] == '-' ? "unknown option '" + first + "' where a command is expected"
                                                  : "unknown command '" + first + "'";
    fmt::print(stderr, "{}\n",
               core::format_error("harmony-sim", message,
                                  fmt::format("use one of: {} (`harmony-sim --help` says what each does)",
                                              fmt::join(commands, ", "))));
  } else {
    fmt::print(stderr, "{}\n", core::command_line_error("harmony-sim", e.what(), known ? first : ""));
  }
  return 2;
}

}  // namespace harmony::sim
