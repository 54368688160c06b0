// The progress display of harmony-sim's long commands (sweep, search, compare) on stderr: a live bar on a
// terminal, a line every 10 s otherwise, each with done / total, rate, elapsed time and ETA. Part of the
// harmony-sim executable (it prints); the library reports through callbacks (sim/app/sweep.hpp,
// core/search/progress.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace harmony::sim {

// "m:ss" or "h:mm:ss"; "?" for a negative (unknown) duration.
std::string duration_text(double seconds);

class ProgressPrinter {
 public:
  // `label` starts each line ("sweep", "search"); `unit` names what is counted ("points", "candidates").
  // Nothing is shown before `delay_s` has passed since construction, nor at the end of a run that showed nothing.
  ProgressPrinter(std::string label, std::string unit, bool quiet, double delay_s = 0.0);

  // done of total; rate in units per second and eta in seconds (< 0: unknown) as the caller counts them;
  // `note` is appended (e.g. "2/6 kinds finished").
  void update(std::size_t done, std::size_t total, double rate, double eta_s, bool finished,
              const std::string& note = {});
  // The same, with rate and ETA from the time since construction.
  void update(std::size_t done, std::size_t total, bool finished, const std::string& note = {});

  double elapsed_s() const;

 private:
  std::string label_;
  std::string unit_;
  bool quiet_;
  bool tty_;
  double delay_s_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace harmony::sim
