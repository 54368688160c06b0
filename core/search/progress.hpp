// Progress of a long search (core::run_search, core::run_search_bounded): how many candidates are evaluated of
// how many. The searches call the caller's callback, one call at a time, at most every ~0.1 s and once at the end;
// library code never prints, so the mains turn these calls into a bar or lines on stderr.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>

namespace harmony::core {

struct SearchProgress {
  std::size_t done = 0;   // candidates evaluated
  std::size_t total = 0;  // candidates to evaluate
};
using SearchProgressFn = std::function<void(const SearchProgress&)>;

// Throttles a SearchProgressFn for the threads of one search: tick() after each candidate.
class SearchProgressTicker {
 public:
  SearchProgressTicker(const SearchProgressFn& fn, std::size_t total);
  void tick();    // one more candidate done; calls fn when ~0.1 s passed since the last call
  void finish();  // calls fn with done = total (when fn is set)

 private:
  const SearchProgressFn& fn_;
  std::size_t total_;
  std::atomic<std::size_t> done_{0};
  std::mutex mutex_;  // one call of fn_ at a time
  std::chrono::steady_clock::time_point last_;
};

}  // namespace harmony::core
