// The CUDA stream's pending host functions (backend/cuda/host_calls.hpp) on the CPU: after a sticky error CUDA
// never runs them, and abandon() must still destroy their closures (release_after's frees, the executor's
// pending-free counters), exactly once, racing the trampoline. Runs in every build (no CUDA needed).
#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cuda/host_calls.hpp"

using harmony::backend::cuda::detail::HostCalls;

namespace {
// A closure that counts its runs and its destruction (what release_after's Release does).
struct Probe {
  std::shared_ptr<std::atomic<int>> runs = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> alive = std::make_shared<std::atomic<int>>(0);
  std::function<void()> make() const {
    auto token = std::shared_ptr<void>(nullptr, [a = alive](void*) { --*a; });
    ++*alive;
    return [r = runs, token]() { ++*r; };
  }
};
}  // namespace

TEST_CASE("a host function the trampoline runs runs once and its closure is destroyed") {
  HostCalls calls;
  Probe p;
  auto c = calls.add(p.make());
  CHECK(calls.pending() == 1);
  CHECK(calls.run(c));
  CHECK_FALSE(calls.run(c));
  CHECK(*p.runs == 1);
  CHECK(*p.alive == 0);
  CHECK(calls.pending() == 0);
}

TEST_CASE("after a sticky error CUDA never runs the trampoline: abandon destroys the closures, unrun") {
  // Before this, the closure lived inside the trampoline's argument, which CUDA never freed: the executor's
  // pending-free count stayed above zero and alloc_or_wait waited for it forever.
  HostCalls calls;
  Probe p;
  auto a = calls.add(p.make());
  auto b = calls.add(p.make());
  CHECK(*p.alive == 2);
  CHECK(calls.abandon() == 2);
  CHECK(*p.alive == 0);
  CHECK(*p.runs == 0);
  CHECK_FALSE(calls.run(a));  // a late trampoline does nothing
  CHECK(*p.runs == 0);
  // Later launches are dropped at once: the context will not run them either.
  CHECK(calls.add(p.make()) == nullptr);
  CHECK(*p.alive == 0);
  CHECK(calls.abandoned());
}

TEST_CASE("a launch that fails is cancelled: its closure goes at once") {
  HostCalls calls;
  Probe p;
  auto c = calls.add(p.make());
  calls.cancel(c);
  CHECK(*p.alive == 0);
  CHECK(*p.runs == 0);
  CHECK(calls.pending() == 0);
  CHECK_FALSE(calls.run(c));
}

TEST_CASE("trampolines racing abandon: every closure is run or dropped, exactly once") {
  for (int round = 0; round < 50; ++round) {
    HostCalls calls;
    Probe p;
    std::vector<std::shared_ptr<HostCalls::Call>> cs;
    for (int i = 0; i < 200; ++i) cs.push_back(calls.add(p.make()));
    std::atomic<int> ran{0};
    std::thread trampoline([&] {
      for (auto& c : cs) ran += calls.run(c) ? 1 : 0;
    });
    const std::size_t dropped = calls.abandon();
    trampoline.join();
    CHECK(*p.alive == 0);
    CHECK(*p.runs == ran.load());
    CHECK(static_cast<int>(dropped) + ran.load() == 200);
  }
}
