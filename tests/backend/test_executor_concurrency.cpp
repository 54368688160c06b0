// Tests of the executor's concurrent queues (one worker thread and one device stream per Program queue): the same
// bits as the serial loop for every plan kind of the executor grids (Harmony-PP, Harmony-DP, dp-swap, pp-swap,
// zero-infinity, l2l), the same bits on every one of many repeated runs (a race detector by repetition; run it
// under ThreadSanitizer too), and an OutOfMemory inside a worker reported with the serial loop's message, not hung.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"
#include "core/kinds/kinds.hpp"
#include "core/program/lower.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
using harmony::core::kKiB;
using harmony::core::kMiB;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

bool same(const Result& a, const Result& b) {
  if (a.losses != b.losses || a.weights.size() != b.weights.size()) return false;
  for (std::size_t l = 0; l < a.weights.size(); ++l)
    if (!same_bits(a.weights[l], b.weights[l])) return false;
  return true;
}

// Serial, then concurrent, each from the same fresh weights: the same losses and weights, bit for bit.
void check_serial_equals_concurrent(int gpus, const std::function<core::Program(const Gpt2&)>& make) {
  Setup serial(gpus), concurrent(gpus);
  const core::Program prog = make(*serial.model);
  const Result a = run(prog, serial, nullptr, false);
  const Result b = run(prog, concurrent, nullptr, true);
  CHECK(same(a, b));
}

}  // namespace

TEST_CASE("concurrent queues give the serial loop's bits for every plan kind") {
  int checked = 0;
  for (core::PlanKind mode : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")})
    for (int gpus : {1, 2, 4})
      for (auto [uf, ub] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}})
        for (int pack : {1, 3, 4})
          for (bool pf : {false, true}) {
            const int share = mode == core::plan_kind("harmony-dp") ? kB / gpus : kB;
            if (uf > share || ub > share) continue;
            if (pf && !(gpus == 2 && pack == 1)) continue;
            if (pack == 3 && gpus != 2) continue;
            const std::string name = core::plan_kind_name(mode);
            CAPTURE(name);
            CAPTURE(gpus);
            CAPTURE(uf);
            CAPTURE(ub);
            CAPTURE(pack);
            CAPTURE(pf);
            check_serial_equals_concurrent(
                gpus, [&](const Gpt2& m) { return lower_harmony_plan(m, mode, gpus, uf, ub, pack, pf); });
            ++checked;
          }
  for (core::PlanKind kind : swapping_kinds())
    for (int gpus : {1, 2, 4})
      for (int u : {1, 2}) {
        const int share = kind == core::plan_kind("pp-swap") ? kB : kB / gpus;
        if (share % u != 0 || (kind->one_microbatch && u != share)) continue;  // lohan: u = D/N
        for (core::SwapChoice a : {core::SwapChoice::Keep, core::SwapChoice::Swap}) {
          const core::SwapChoice w = kind == core::plan_kind("dp-swap") || kind == core::plan_kind("pp-swap")
                                         ? (u == 1 ? core::SwapChoice::Swap : core::SwapChoice::Keep)
                                         : core::SwapChoice::Auto;
          const std::string name = core::plan_kind_name(kind);
          CAPTURE(name);
          CAPTURE(gpus);
          CAPTURE(u);
          CAPTURE(static_cast<int>(a));
          check_serial_equals_concurrent(
              gpus, [&](const Gpt2& m) { return lower_swapping_plan(m, swapping_plan(kind, gpus, u, w, a)); });
          ++checked;
        }
      }
  CHECK(checked >= 50);
}

// A race (a tensor freed while a reader still runs, a buffer reused too early, a missing edge between queues)
// shows as different bits on some run; 20 runs of 2 steps of a 4-GPU Harmony-PP Program with one-layer packs
// (the most queues and cross-queue edges of the grid) must all give the PlainTrainer's bits.
TEST_CASE("the executor's persistent worker pool runs fn(k) once for every k per run, run after run") {
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{8}}) {
    CAPTURE(n);
    detail::WorkerPool pool(n);
    CHECK(pool.size() == n);
    std::vector<int> calls(n, 0);  // thread k writes only calls[k]; run() returns after every fn returned
    for (int r = 0; r < 50; ++r) pool.run([&](std::size_t k) { ++calls[k]; });
    CHECK(calls == std::vector<int>(n, 50));
  }
  detail::WorkerPool none(0);  // no queues: run returns at once
  none.run([](std::size_t) { FAIL("called"); });
}

TEST_CASE("repeated concurrent runs of a 4-GPU Harmony-PP Program give identical bits") {
  const Result& ref = reference();
  int identical = 0;
  for (int rep = 0; rep < 20; ++rep) {
    CAPTURE(rep);
    Setup s(4);
    const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 4, 2, 1, 1, rep % 2 == 1);
    std::vector<StepResult> steps;
    const Result r = run(prog, s, &steps);
    if (same(r, ref)) ++identical;
    // the measured times overlap: some op begins before another of a different queue ends
    bool overlap = false;
    const StepResult& sr = steps.back();
    for (std::size_t a = 0; a < prog.ops.size() && !overlap; ++a)
      for (std::size_t b = 0; b < prog.ops.size() && !overlap; ++b)
        overlap = prog.ops[a].queue != prog.ops[b].queue && sr.begin[b] > sr.begin[a] && sr.begin[b] < sr.end[a];
    if (!overlap) MESSAGE("no two ops of different queues overlapped in run ", rep);
  }
  CHECK(identical == 20);
}

// Devices too small for the Program: the OutOfMemory of the first allocation that fails, with the device's text
// (the serial loop's message where the failing op is the same), from step() and not a hang or std::terminate; the
// executor and its devices are clean afterwards, and a bigger device then trains.
TEST_CASE("an OutOfMemory inside a worker is reported, not hung") {
  SUBCASE("one device: the same op fails, the same message") {
    std::string messages[2];
    for (int k = 0; k < 2; ++k) {
      Setup s(1, 64 * kKiB);  // smaller than the first pack's weights
      const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 1, 1, 1, 4, false);
      const bool concurrent = k == 1;
      try {
        run(prog, s, nullptr, concurrent);
        FAIL("no OutOfMemory");
      } catch (const OutOfMemory& e) {
        messages[k] = e.what();
      }
      CHECK(s.ptrs[0]->memory().in_use == 0);
    }
    CHECK(messages[0].find("cpu:0: out of memory allocating") == 0);
    CHECK(messages[0] == messages[1]);
  }
  SUBCASE("four devices, failing mid-step, every kind") {
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(kind);
      Setup s(4, 100 * kKiB);  // room for a block's weights and activations, not also its gradient
      const core::Program prog =
          kind == 0   ? lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 4, 1, 1, 1, false)
          : kind == 1 ? lower_harmony_plan(*s.model, core::plan_kind("harmony-dp"), 4, 1, 1, 1, false)
                      : lower_swapping_plan(*s.model, swapping_plan(core::plan_kind("pp-swap"), 4, 1,
                                                                    core::SwapChoice::Keep, core::SwapChoice::Keep));
      const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
      Executor ex(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW});
      std::vector<std::int32_t> in, tgt;
      tokens.batch(0, kB, kT, in, tgt);
      bool threw = false;
      for (int rep = 0; rep < 3; ++rep) {  // again after a failure: the executor starts each step afresh
        try {
          ex.step(in, tgt);
        } catch (const OutOfMemory& e) {
          threw = true;
          CHECK(std::string(e.what()).find(": out of memory allocating") != std::string::npos);
        }
        for (auto* d : s.ptrs) CHECK(d->memory().in_use == 0);
      }
      CHECK(threw);
    }
  }
}

// Event ordering (docs/backend.md): ops are ordered across streams by events, not by the host waiting, so a missing
// wait (an op reading a tensor another stream is still writing, a buffer freed or reused while queued work reads
// it, a host staging buffer gone before its copy ran) is a race the undisturbed CPU device rarely loses. Here every
// stream sleeps a random 0-100 us before each piece of work (CpuDeviceOptions::jitter_us) and freed device memory
// is poisoned (NaN), over three seeds, with the host unbounded (run_ahead 0) and double-buffering (2), in the
// serial and the concurrent loop: every run must give the serial, undelayed executor's bits, for Harmony-PP,
// Harmony-DP, and the baselines (P2P, all-gather, reduce-scatter, host swaps), fp32 and bf16; replica sums on the
// host, and on the devices (ExecutorOptions::communicator: the all-reduces ordered by events alone), whose runs must
// give the host-summing reference's bits.
TEST_CASE("event ordering: random delays in the device streams never change the bits") {
  struct Case {
    std::string name;
    int gpus;
    DType dtype;
    std::function<core::Program(const Gpt2&)> make;
    bool device_sums = false;
  };
  using core::SwapChoice;
  const std::vector<Case> cases = {
      {"harmony-pp 4 GPUs, one-layer packs, prefetch", 4, DType::F32,
       [](const Gpt2& m) { return lower_harmony_plan(m, core::plan_kind("harmony-pp"), 4, 2, 1, 1, true); }},
      {"harmony-dp 2 GPUs", 2, DType::F32,
       [](const Gpt2& m) { return lower_harmony_plan(m, core::plan_kind("harmony-dp"), 2, 1, 2, 1, false); }},
      {"harmony-pp 2 GPUs bf16", 2, DType::BF16,
       [](const Gpt2& m) {
         return lower_harmony_plan(m, core::plan_kind("harmony-pp"), 2, 1, 2, 3, false, DType::BF16);
       }},
      {"dp-swap 2 GPUs, swapped", 2, DType::F32,
       [](const Gpt2& m) {
         return lower_swapping_plan(
             m, swapping_plan(core::plan_kind("dp-swap"), 2, 1, SwapChoice::Swap, SwapChoice::Swap));
       }},
      {"pp-swap 2 GPUs", 2, DType::F32,
       [](const Gpt2& m) {
         return lower_swapping_plan(
             m, swapping_plan(core::plan_kind("pp-swap"), 2, 2, SwapChoice::Keep, SwapChoice::Swap));
       }},
      {"zero-infinity 2 GPUs", 2, DType::F32,
       [](const Gpt2& m) {
         return lower_swapping_plan(
             m, swapping_plan(core::plan_kind("zero-infinity"), 2, 1, SwapChoice::Auto, SwapChoice::Swap));
       }},
      {"l2l 2 GPUs bf16", 2, DType::BF16,
       [](const Gpt2& m) {
         return lower_swapping_plan(m, swapping_plan(core::plan_kind("l2l"), 2, 1, SwapChoice::Auto, SwapChoice::Swap),
                                    DType::BF16);
       }},
      {"harmony-dp 4 GPUs, device sums", 4, DType::F32,
       [](const Gpt2& m) { return lower_harmony_plan(m, core::plan_kind("harmony-dp"), 4, 1, 1, 1, false); }, true},
      {"dp-swap 2 GPUs bf16, device sums", 2, DType::BF16,
       [](const Gpt2& m) {
         return lower_swapping_plan(
             m, swapping_plan(core::plan_kind("dp-swap"), 2, 1, SwapChoice::Swap, SwapChoice::Swap), DType::BF16);
       },
       true},
      {"zero-infinity 2 GPUs, device sums", 2, DType::F32,
       [](const Gpt2& m) {
         return lower_swapping_plan(
             m, swapping_plan(core::plan_kind("zero-infinity"), 2, 1, SwapChoice::Auto, SwapChoice::Swap));
       },
       true},
  };
  int runs = 0;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Setup ref_setup(c.gpus);
    const core::Program prog = c.make(*ref_setup.model);
    const Result ref = run(prog, ref_setup, nullptr, false, c.dtype);
    for (std::uint64_t seed : {1U, 2U, 3U}) {
      for (auto [concurrent, run_ahead] : std::vector<std::pair<bool, int>>{{false, 0}, {true, 0}, {true, 2}}) {
        CAPTURE(seed);
        CAPTURE(concurrent);
        CAPTURE(run_ahead);
        Setup s(c.gpus, 16 * kMiB, 100, seed);
        CHECK(same(run(prog, s, nullptr, concurrent, c.dtype, run_ahead, c.device_sums ? s.comm.get() : nullptr), ref));
        ++runs;
      }
    }
  }
  CHECK(runs == 90);
}

TEST_CASE("event ordering: a negative run_ahead or jitter, or a staging chunk under one element, is refused") {
  Setup s(1);
  const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 1, 1, 1, 4, false);
  CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .run_ahead = -1}),
                       doctest::Contains("run_ahead -1 is negative"), BackendError);
  CHECK_THROWS_AS(cpu::make_cpu_device(0, {.jitter_us = -1}), DeviceError);
  // a bf16 staging chunk must hold an element (0 or less would stage nothing, 1 byte half an element)
  for (const Bytes chunk : {Bytes{-4}, Bytes{0}, Bytes{1}})
    CHECK_THROWS_WITH_AS(
        Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .staging_chunk_bytes = chunk}),
        doctest::Contains("staging_chunk_bytes"), BackendError);
}

namespace {

// An interpreter with no Program of its own: it only drives the base class's bf16 staging, with mutex() held as the
// step loops hold it when they call run().
class StagingOnly final : public detail::Interpreter {
 public:
  explicit StagingOnly(Bytes chunk_bytes) { staging_chunk_bytes = chunk_bytes; }
  const std::vector<std::vector<int>>& extra_deps() const override { return none_; }
  void begin_step(std::span<const std::int32_t>, std::span<const std::int32_t>) override {}
  std::vector<int> group(int op) const override { return {op}; }
  void run(const std::vector<int>&) override {}
  void finished(int) override {}
  double end_step() override { return 0; }
  void abandon_step() override {}
  void synchronize() override {}
  void up(Device& d, Stream& s, void* dst, std::span<const float> src) {
    stage_up(0, d, s, dst, std::span<const std::span<const float>>(&src, 1));
  }
  void down(Device& d, Stream& s, std::span<float> dst, const void* src) {
    stage_down(0, d, s, std::span<const std::span<float>>(&dst, 1), src);
  }

 private:
  std::vector<std::vector<int>> none_;
};

}  // namespace

TEST_CASE("bf16 staging rounds and widens with the interpreter's lock released, so other queues issue work") {
  // A worker thread that blocks on mutex() while the host stages one chunk (the first use of each buffer waits for
  // no event, so before the lock was released around the rounding the worker could only get it after the staging
  // returned). Derivation: the worker takes the lock while `inside` is set iff the staging lets go of it.
  constexpr std::int64_t kElems = std::int64_t{4} << 20;  // 16 MiB of fp32: milliseconds of rounding
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kMiB});
  auto stream = dev->create_stream("staging");
  const Buffer on_device = dev->alloc(kElems * 2, "bf16 weights");
  std::vector<float> master(static_cast<std::size_t>(kElems)), back(static_cast<std::size_t>(kElems));
  for (std::int64_t i = 0; i < kElems; ++i) master[static_cast<std::size_t>(i)] = 1.0f + static_cast<float>(i % 255);
  StagingOnly it(kElems * 2);  // one chunk
  // On a loaded machine the worker may not reach lock() before the staging ends (it is only likely to be blocked
  // there after the 5 ms): then it takes the lock afterwards, which proves nothing either way, so the attempt is
  // repeated. With the lock held throughout, no attempt can take it inside; one that does proves the release.
  for (const bool up : {true, false}) {
    CAPTURE(up);
    bool taken = false;
    for (int attempt = 0; attempt < 20 && !taken; ++attempt) {
      std::atomic<bool> inside{false}, worker_waiting{false}, taken_inside{false};
      it.mutex().lock();
      std::thread worker([&] {
        worker_waiting = true;
        const std::lock_guard lk(it.mutex());
        taken_inside = inside.load();
      });
      while (!worker_waiting) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the worker is (likely) blocked in lock()
      inside = true;
      if (up)
        it.up(*dev, *stream, on_device.data(), master);
      else
        it.down(*dev, *stream, back, on_device.data());
      inside = false;
      it.mutex().unlock();
      worker.join();
      taken = taken_inside.load();
    }
    CHECK(taken);
  }
  stream->synchronize();
  // and the bits are those of rounding and widening element by element (values exact in bf16 here)
  CHECK(back == master);
}
