// Tests of replica sums on the devices (ExecutorOptions::communicator, issue 15): every plan kind with ARD or RS
// groups (Harmony-DP, dp-swap, zero-infinity on N > 1 GPUs), fp32 and bf16, trains to the host path's bits (losses,
// weights, AdamW moments) with a CPU communicator while copying no replica's gradient to the host and back (counted
// by devices that wrap the CPU device), and a communicator that does not span the devices is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/executor.hpp"
#include "core/kinds/kinds.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

// A device that forwards to `inner` and counts the host<->device copies enqueued on it.
class CountingDevice final : public Device {
 public:
  explicit CountingDevice(Device& inner) : in_(inner) {}
  Device& inner() { return in_; }
  std::atomic<int> d2h{0}, h2d{0};

  const std::string& name() const override { return in_.name(); }
  int index() const override { return in_.index(); }
  Buffer alloc(Bytes bytes, std::string_view label) override { return in_.alloc(bytes, label); }
  MemoryStats memory() const override { return in_.memory(); }
  void reset_peak() override { in_.reset_peak(); }
  std::unique_ptr<Stream> create_stream(std::string name) override { return in_.create_stream(std::move(name)); }
  std::unique_ptr<Event> create_event() override { return in_.create_event(); }
  void synchronize() override { in_.synchronize(); }
  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override {
    ++h2d;
    in_.copy_h2d(s, dst, src, bytes);
  }
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override {
    ++d2h;
    in_.copy_d2h(s, dst, src, bytes);
  }
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override {
    auto* c = dynamic_cast<CountingDevice*>(dst_device);
    in_.copy_d2d(s, dst, src, bytes, c != nullptr ? &c->inner() : dst_device);
  }
  void fill_zero(Stream& s, void* dst, Bytes bytes) override { in_.fill_zero(s, dst, bytes); }
  Kernels<float>& kernels() override { return in_.kernels(); }
  Kernels<Bf16>* bf16_kernels() override { return in_.bf16_kernels(); }

 private:
  Device& in_;
};

// The CPU communicator over the wrapped devices, naming the wrappers as its ranks' devices.
class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(Communicator& inner, std::vector<CountingDevice*> devices)
      : in_(inner), devs_(std::move(devices)) {}
  int size() const override { return in_.size(); }
  Device& device(int rank) override { return *devs_.at(static_cast<std::size_t>(rank)); }
  void send(int rank, Stream& s, const void* src, Bytes bytes, int peer) override {
    in_.send(rank, s, src, bytes, peer);
  }
  void recv(int rank, Stream& s, void* dst, Bytes bytes, int peer) override { in_.recv(rank, s, dst, bytes, peer); }
  void all_reduce_sum(int rank, Stream& s, float* buf, std::int64_t count) override {
    in_.all_reduce_sum(rank, s, buf, count);
  }
  void all_reduce_sum_bf16(int rank, Stream& s, Bf16* buf, std::int64_t count) override {
    in_.all_reduce_sum_bf16(rank, s, buf, count);
  }

 private:
  Communicator& in_;
  std::vector<CountingDevice*> devs_;
};

bool same_all(const Result& a, const Result& b) {
  if (a.losses != b.losses || a.weights.size() != b.weights.size() || a.moments.size() != b.moments.size())
    return false;
  for (std::size_t l = 0; l < a.weights.size(); ++l)
    if (!same_bits(a.weights[l], b.weights[l])) return false;
  for (std::size_t k = 0; k < a.moments.size(); ++k)
    if (!same_bits(a.moments[k], b.moments[k])) return false;
  return true;
}

struct Counted {
  Result result;
  int d2h = 0, h2d = 0;
};

// Runs prog from fresh weights on wrapped CPU devices, with the replica sums on the host or on the devices.
Counted run_counted(const core::Program& prog, int gpus, DType dtype, bool device_sums, bool concurrent) {
  Setup s(gpus);
  std::vector<std::unique_ptr<CountingDevice>> wrapped;
  std::vector<CountingDevice*> counting;
  std::vector<Device*> ptrs;
  for (Device* d : s.ptrs) {
    wrapped.push_back(std::make_unique<CountingDevice>(*d));
    counting.push_back(wrapped.back().get());
    ptrs.push_back(wrapped.back().get());
  }
  CountingCommunicator comm(*s.comm, counting);
  Counted c;
  c.result = run(prog, s, nullptr, concurrent, dtype, 1, device_sums ? &comm : nullptr, &ptrs);
  for (CountingDevice* d : counting) {
    c.d2h += d->d2h;
    c.h2d += d->h2d;
  }
  return c;
}

int collectives(const core::Program& p) {
  return static_cast<int>(std::count_if(p.ops.begin(), p.ops.end(), [](const core::Op& o) {
    return o.kind == core::OpKind::ARD || o.kind == core::OpKind::RS;
  }));
}

}  // namespace

TEST_CASE("replica sums on the devices give the host path's bits and copy no gradient to the host") {
  struct Case {
    std::string name;
    int gpus;
    std::function<core::Program(const Gpt2&, DType)> make;
  };
  using core::SwapChoice;
  const auto baseline = [](core::PlanKind kind, int gpus, int u, SwapChoice w, SwapChoice a) {
    return [=](const Gpt2& m, DType dt) { return lower_swapping_plan(m, swapping_plan(kind, gpus, u, w, a), dt); };
  };
  const auto harmony = [](int gpus, int uf, int ub, int pack) {
    return [=](const Gpt2& m, DType dt) {
      return lower_harmony_plan(m, core::plan_kind("harmony-dp"), gpus, uf, ub, pack, false, dt);
    };
  };
  const std::vector<Case> cases = {
      {"harmony-dp 2 GPUs, one-layer packs", 2, harmony(2, 1, 2, 1)},
      {"harmony-dp 2 GPUs, packs of 3", 2, harmony(2, 2, 1, 3)},
      {"harmony-dp 4 GPUs", 4, harmony(4, 1, 1, 1)},
      {"dp-swap 2 GPUs, swapped", 2, baseline(core::plan_kind("dp-swap"), 2, 1, SwapChoice::Swap, SwapChoice::Swap)},
      {"dp-swap 2 GPUs, kept", 2, baseline(core::plan_kind("dp-swap"), 2, 2, SwapChoice::Keep, SwapChoice::Keep)},
      {"dp-swap 4 GPUs", 4, baseline(core::plan_kind("dp-swap"), 4, 1, SwapChoice::Swap, SwapChoice::Keep)},
      {"zero-infinity 2 GPUs, u 1", 2,
       baseline(core::plan_kind("zero-infinity"), 2, 1, SwapChoice::Auto, SwapChoice::Swap)},
      {"zero-infinity 2 GPUs, u 2", 2,
       baseline(core::plan_kind("zero-infinity"), 2, 2, SwapChoice::Auto, SwapChoice::Keep)},
      {"zero-infinity 4 GPUs", 4, baseline(core::plan_kind("zero-infinity"), 4, 1, SwapChoice::Auto, SwapChoice::Swap)},
  };
  int checked = 0;
  for (const Case& c : cases) {
    for (DType dt : {DType::F32, DType::BF16}) {
      CAPTURE(c.name);
      const std::string dtype(dtype_name(dt));
      CAPTURE(dtype);
      Setup probe(c.gpus);
      const core::Program prog = c.make(*probe.model, dt);
      const int n = collectives(prog);
      REQUIRE(n > 0);
      const Counted host = run_counted(prog, c.gpus, dt, false, true);
      for (bool concurrent : {true, false}) {
        CAPTURE(concurrent);
        const Counted device = run_counted(prog, c.gpus, dt, true, concurrent);
        CHECK(same_all(device.result, host.result));
        // The host path brings every member's dW down and a sum up, once per collective op and step.
        CHECK(host.d2h - device.d2h == n * kSteps);
        CHECK(host.h2d - device.h2d == n * kSteps);
        ++checked;
      }
    }
  }
  CHECK(checked == 36);
}

TEST_CASE("a communicator that does not span the executor's devices is refused") {
  Setup s(2);
  const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-dp"), 2, 1, 1, 1, false);
  const auto one = cpu::make_cpu_communicator({s.ptrs[0]});
  CHECK_THROWS_WITH_AS(Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .communicator = one.get()}),
                       doctest::Contains("the communicator has 1 ranks for 2 devices"), BackendError);
  const auto swapped = cpu::make_cpu_communicator({s.ptrs[1], s.ptrs[0]});
  CHECK_THROWS_WITH_AS(
      Executor(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .communicator = swapped.get()}),
      doctest::Contains("the communicator's rank 0 is cpu:1, not device 0 (cpu:0)"), BackendError);
}
