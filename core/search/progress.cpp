// The throttle between a search's worker threads and the caller's progress callback (core/search/progress.hpp):
// a counter every thread bumps, and at most one callback every ~0.1 s, made by whichever thread gets the lock.
#include "core/search/progress.hpp"

#include <algorithm>

namespace harmony::core {

namespace {
constexpr std::chrono::milliseconds kInterval{100};
}  // namespace

SearchProgressTicker::SearchProgressTicker(const SearchProgressFn& fn, std::size_t total)
    : fn_(fn), total_(total), last_(std::chrono::steady_clock::now()) {}

void SearchProgressTicker::tick() {
  const std::size_t done = ++done_;
  if (!fn_) return;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread is reporting
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < kInterval) return;
  last_ = now;
  fn_(SearchProgress{std::min(done, total_), total_});
}

void SearchProgressTicker::finish() {
  if (!fn_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  fn_(SearchProgress{total_, total_});
}

}  // namespace harmony::core
