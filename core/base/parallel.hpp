// parallel_for: runs fn(0) .. fn(n - 1) on a few threads, each index once. The one loop behind the searches, the
// sweep's resume check, compare's kinds and the bottleneck report's what-if runs (each had its own copy).
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace harmony::core {

// Indices are taken in increasing order by up to `threads` threads, the caller's among them (threads <= 1: all on
// the caller, in order). After an exception no new index starts; once every thread has stopped, the exception of the
// lowest index that threw is rethrown, so a failure reads the same whatever the thread count. When the system has
// no thread to give, fewer run.
template <class Fn>
void parallel_for(std::size_t n, unsigned threads, const Fn& fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::size_t error_index = n;
  std::exception_ptr error;
  auto worker = [&] {
    for (std::size_t i = next++; i < n && !failed.load(); i = next++) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (i < error_index) {
          error_index = i;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  const std::size_t extra = threads > 1 ? std::min<std::size_t>(threads - 1, n > 0 ? n - 1 : 0) : 0;
  try {
    for (std::size_t t = 0; t < extra; ++t) pool.emplace_back(worker);
  } catch (const std::system_error&) {
    // no more threads: those started and this one share the work
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace harmony::core
