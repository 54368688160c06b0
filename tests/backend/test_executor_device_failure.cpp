// The executor's memory waits after the device has failed (issue 34: harmony-run hung after a sticky CUDA error in
// tight memory): the deferred frees alloc_or_wait waits for never come once CUDA stops running host functions, so
// every wait must ask the device (Device::check_alive) and end with its error. A CPU device stands in for the GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/detail.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;

namespace {

// Forwards to a CPU device; once failed, check_alive throws what a CUDA device throws after a sticky error.
class FailingDevice final : public Device {
 public:
  explicit FailingDevice(Bytes capacity) : in_(cpu::make_cpu_device(0, {.capacity = capacity})) {}
  std::atomic<bool> failed{false};
  std::atomic<int> checks{0};

  const std::string& name() const override { return in_->name(); }
  int index() const override { return in_->index(); }
  Buffer alloc(Bytes bytes, std::string_view label) override { return in_->alloc(bytes, label); }
  MemoryStats memory() const override { return in_->memory(); }
  void reset_peak() override { in_->reset_peak(); }
  std::unique_ptr<Stream> create_stream(std::string name) override { return in_->create_stream(std::move(name)); }
  std::unique_ptr<Event> create_event() override { return in_->create_event(); }
  void synchronize() override { in_->synchronize(); }
  void check_alive() override {
    ++checks;
    if (failed) throw DeviceError("cuda:0: stream 'compute': cuda error 700 cudaErrorIllegalAddress");
  }
  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override { in_->copy_h2d(s, dst, src, bytes); }
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override { in_->copy_d2h(s, dst, src, bytes); }
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override {
    in_->copy_d2d(s, dst, src, bytes, dst_device);
  }
  void fill_zero(Stream& s, void* dst, Bytes bytes) override { in_->fill_zero(s, dst, bytes); }
  Kernels<float>& kernels() override { return in_->kernels(); }

 private:
  std::unique_ptr<Device> in_;
};

// An interpreter with no ops whose device still has deferred frees queued: host functions a failed context will
// never run (until `give_up`, so an implementation that never asks the device ends the test instead of hanging).
class WaitingInterpreter final : public detail::Interpreter {
 public:
  std::atomic<bool> give_up{false};

  const std::vector<std::vector<int>>& extra_deps() const override { return none_; }
  void begin_step(std::span<const std::int32_t>, std::span<const std::int32_t>) override {}
  std::vector<int> group(int op) const override { return {op}; }
  void run(const std::vector<int>&) override {}
  void finished(int) override {}
  double end_step() override { return 0.0; }
  void abandon_step() override {}
  void synchronize() override {}
  Buffer take(Device& d, Bytes bytes) {
    const std::lock_guard lock(mutex());
    return alloc_or_wait(d, bytes, "act");
  }

 protected:
  bool frees_pending(const Device&) override { return !give_up; }

 private:
  std::vector<std::vector<int>> none_;
};

// Runs it.take on a thread; the error it ended with ("" when it returned a buffer), or "hung" after 10 s.
std::string take_or_hang(WaitingInterpreter& it, Device& d, Bytes bytes) {
  std::atomic<bool> done{false};
  std::string error;
  std::thread t([&] {
    try {
      (void)it.take(d, bytes);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool hung = !done;
  it.give_up = true;
  t.join();
  return hung ? "hung" : error;
}

}  // namespace

TEST_CASE("the serial loop's wait for deferred frees ends with the device's error once it has failed") {
  FailingDevice d(1 * kMiB);
  d.failed = true;
  WaitingInterpreter it;
  it.exact_memory = true;
  const std::string e = take_or_hang(it, d, 1024);
  CHECK(e.find("cudaErrorIllegalAddress") != std::string::npos);
  CHECK(d.checks > 0);
}

TEST_CASE("an out-of-memory wait for frees that will never come ends with the device's error") {
  FailingDevice d(1 * kMiB);
  d.failed = true;
  WaitingInterpreter it;
  const std::string e = take_or_hang(it, d, 2 * kMiB);  // more than the device: OutOfMemory, frees "pending"
  CHECK(e.find("cudaErrorIllegalAddress") != std::string::npos);
}

TEST_CASE("a live device is only asked, and the wait goes on until the frees come") {
  FailingDevice d(1 * kMiB);
  WaitingInterpreter it;
  it.exact_memory = true;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    it.give_up = true;  // the frees are done
  });
  Buffer b = it.take(d, 1024);
  later.join();
  CHECK(b);
  CHECK(d.checks > 0);
}
