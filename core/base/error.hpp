// The error types harmony's libraries throw; only the mains print them and choose exit codes.
// ConfigError points at a file:line:column and carries a hint on how to fix the input;
// ScheduleError reports plans that cannot be built or run (bad packs, deadlocks); InternalError a broken
// invariant inside harmony (a bug, never bad input: the mains exit 70, EX_SOFTWARE, not 2).
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace harmony::core {

struct SourceLoc {
  std::string file;
  int line = 0;             // 1-based; 0 when unknown
  int column = 0;           // 1-based; 0 when unknown
  std::string str() const;  // "file:line:column" (parts omitted when unknown)
};

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: YAML, JSON profiles, CLI values. what() = "file:line:col: error: message\n  hint: ..."
class ConfigError : public Error {
 public:
  ConfigError(SourceLoc loc, const std::string& message, std::string hint = {});
  const SourceLoc& loc() const { return loc_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  SourceLoc loc_;
  std::string message_;
  std::string hint_;
};

// A file that cannot be read or written, named with the OS's reason: what() = "PATH: error: MESSAGE\n  hint: ...".
// A ConfigError (the path is the user's input), so every main reports it as bad input.
class FileError : public ConfigError {
 public:
  FileError(const std::string& path, const std::string& message, std::string hint = {})
      : ConfigError(SourceLoc{path, 0, 0}, message, std::move(hint)) {}
  const std::string& path() const { return loc().file; }
};

// A plan that cannot be scheduled or simulated (overlapping packs, deadlock, ...).
class ScheduleError : public Error {
 public:
  using Error::Error;
};

// A broken invariant: a bug in harmony, not in the user's input. what() starts with "internal: ".
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message);
};

// "WHERE: error: MESSAGE\n  hint: HINT" (no hint line when the hint is empty): the one format of every error the
// tools print, ConfigError's what() included.
std::string format_error(const std::string& where, const std::string& message, const std::string& hint = {});

// A command-line error of `tool` (CLI11's message: an unknown flag, a missing argument, a value out of range) in that
// format, naming the command: "harmony-run train: error: MESSAGE\n  hint: `harmony-run train --help` lists its
// arguments and options". `subcommand`: the command the parse got to ("" when none: "harmony-run: error: ..." and
// the hint names `tool --help`). Both tools' command lines use it.
std::string command_line_error(const std::string& tool, const std::string& message, const std::string& subcommand);

// "did you mean" helper: the candidate closest to `word` by edit distance, or "" if none is close.
std::string closest_match(const std::string& word, const std::initializer_list<std::string>& candidates);
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace harmony::core
