// The host functions a CUDA stream has handed to cudaLaunchHostFunc and CUDA has not run yet. CUDA never runs
// them once the context has failed (a sticky error), so their closures (a stream-ordered free, a counter a
// waiter watches) would never be destroyed and a waiter on them would wait forever: abandon() destroys them
// without running them. Each call is claimed once, by the trampoline (run) or by abandon. No CUDA here, so the
// protocol is tested on the CPU (backend/cuda/host_calls_test.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

namespace harmony::backend::cuda::detail {

class HostCalls {
 public:
  struct Call {
    std::atomic<bool> claimed{false};
    std::function<void()> fn;
  };

  // Registers fn; null (fn destroyed, not run) once abandon() has run: the context has failed.
  std::shared_ptr<Call> add(std::function<void()> fn) {
    auto c = std::make_shared<Call>();
    c->fn = std::move(fn);
    {
      const std::lock_guard lock(mu_);
      if (!abandoned_) {
        calls_.insert(c);
        return c;
      }
    }
    c->claimed = true;
    c->fn = nullptr;
    return nullptr;
  }

  // The trampoline: runs fn unless abandon() claimed it first (exceptions propagate); false when it did not run.
  bool run(const std::shared_ptr<Call>& c) {
    if (!c || c->claimed.exchange(true)) return false;
    {
      const std::lock_guard lock(mu_);
      calls_.erase(c);
    }
    std::function<void()> fn = std::move(c->fn);
    c->fn = nullptr;
    fn();
    return true;
  }

  // Withdraws a call whose launch failed (CUDA will not run it): destroys fn without running it.
  void cancel(const std::shared_ptr<Call>& c) {
    if (!c || c->claimed.exchange(true)) return;
    {
      const std::lock_guard lock(mu_);
      calls_.erase(c);
    }
    c->fn = nullptr;
  }

  // The context has failed: destroys every pending fn without running it (outside the lock: a closure's
  // destructor may take other locks), and every later add(). Returns how many were dropped.
  std::size_t abandon() {
    std::vector<std::shared_ptr<Call>> dropped;
    {
      const std::lock_guard lock(mu_);
      abandoned_ = true;
      dropped.assign(calls_.begin(), calls_.end());
      calls_.clear();
    }
    std::size_t n = 0;
    for (auto& c : dropped) {
      if (c->claimed.exchange(true)) continue;  // the trampoline got there first
      c->fn = nullptr;
      ++n;
    }
    return n;
  }

  std::size_t pending() const {
    const std::lock_guard lock(mu_);
    return calls_.size();
  }
  bool abandoned() const {
    const std::lock_guard lock(mu_);
    return abandoned_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<std::shared_ptr<Call>> calls_;
  bool abandoned_ = false;
};

}  // namespace harmony::backend::cuda::detail
