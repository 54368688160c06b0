// Error types and the "did you mean" suggestion used by every loader.
#include "core/base/error.hpp"

#include <algorithm>

namespace harmony::core {

std::string SourceLoc::str() const {
  std::string s = file.empty() ? std::string("<input>") : file;
  if (line > 0) {
    s.append(1, ':').append(std::to_string(line));
    if (column > 0) s.append(1, ':').append(std::to_string(column));
  }
  return s;
}

std::string format_error(const std::string& where, const std::string& message, const std::string& hint) {
  std::string s = where + ": error: " + message;
  if (!hint.empty()) s += "\n  hint: " + hint;
  return s;
}

std::string command_line_error(const std::string& tool, const std::string& message, const std::string& subcommand) {
  std::string text = message;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (subcommand.empty()) return format_error(tool, text, "`" + tool + " --help` lists the commands");
  const std::string command = tool + " " + subcommand;
  return format_error(command, text, "`" + command + " --help` lists its arguments and options");
}

ConfigError::ConfigError(SourceLoc loc, const std::string& message, std::string hint)
    : Error(format_error(loc.str(), message, hint)), loc_(std::move(loc)), message_(message), hint_(std::move(hint)) {}

InternalError::InternalError(const std::string& message) : Error("internal: " + message) {}

static std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(3, word.size() / 2) + 1;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string closest_match(const std::string& word, const std::initializer_list<std::string>& candidates) {
  return closest_match(word, std::vector<std::string>(candidates));
}

}  // namespace harmony::core
