// The device conformance suite: the Device and Communicator contract (device.hpp) checked on every device kind the
// registry says is available here, against the CPU device, which is checked against itself bit for bit. A new
// device gets the whole suite by registering (docs/backend.md, "Adding a device"). Here: the registry's capabilities
// against the devices it makes, allocation and out-of-memory behaviour, poisoning, copies (h2d, d2h, d2d, peer,
// fill, host buffers, pinned ranges) and their pointer checks, streams, events and sticky errors, and every
// collective; the kernels are in test_device_conformance_kernels.cpp. The binary prints the registry first and the
// largest difference of every checked output against its bound last. HARMONY_CONFORMANCE_REQUIRE=cuda (a
// comma-separated list; scripts/gpu-check.sh sets it) makes a kind that is not available a failure instead of a skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <sstream>
#include <thread>

#include "backend/rank_sum.hpp"
#include "tests/backend/conformance.hpp"

namespace conformance {

const std::vector<const DeviceKind*>& subjects() {
  static const std::vector<const DeviceKind*> kinds = [] {
    std::vector<const DeviceKind*> out;
    for (const DeviceKind* k : device_kinds()) {
      if (k->availability().available) out.push_back(k);
    }
    return out;
  }();
  return kinds;
}

std::map<std::string, Record>& records() {
  static std::map<std::string, Record> r;
  return r;
}

void compare(const DeviceKind& kind, const std::string& what, const std::vector<float>& dut,
             const std::vector<float>& ref, Bound b) {
  REQUIRE(dut.size() == ref.size());
  if (is_reference(kind)) b = Bound{};  // the CPU device against itself: the same bits
  double max_diff = 0, max_share = 0;
  std::size_t failing = 0, worst = 0;
  for (std::size_t i = 0; i < dut.size(); ++i) {
    const double d = std::abs(double(dut[i]) - double(ref[i]));
    const bool same_bits = std::bit_cast<std::uint32_t>(dut[i]) == std::bit_cast<std::uint32_t>(ref[i]);
    const double bound = kMargin * (b.abs + b.rel * std::abs(double(ref[i])));
    const bool ok = b.exact() ? same_bits : d <= bound;  // NaN fails
    if (!(d <= max_diff)) max_diff = d;                  // NaN propagates
    if (!b.exact() && bound > 0) max_share = std::max(max_share, d / bound);
    if (!ok && failing++ == 0) worst = i;
  }
  Record& r = records()[kind.name() + " " + what];
  r.max_diff = std::max(r.max_diff, max_diff);
  r.max_share = std::max(r.max_share, max_share);
  r.exact = b.exact();
  ++r.checks;
  INFO(kind.name() << " " << what << ": " << failing << " of " << dut.size() << " outside "
                   << (b.exact() ? std::string("exact")
                                 : "bound " + std::to_string(kMargin * b.abs) + " + " +
                                       std::to_string(kMargin * b.rel) + " |ref|")
                   << "; first at " << worst << ": " << kind.name() << " " << dut[worst] << ", cpu " << ref[worst]
                   << "; max |diff| " << max_diff);
  CHECK(failing == 0);
}

}  // namespace conformance

using namespace conformance;

namespace {

template <class T>
std::vector<T> download(Device& d, Stream& s, const Buffer& b, std::size_t n) {
  std::vector<T> v(n);
  d.copy_d2h(s, v.data(), b.data(), static_cast<Bytes>(n * sizeof(T)));
  s.synchronize();
  return v;
}

// n devices of a kind (indices 0..n-1) with one stream each.
struct Group {
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Device*> ptrs;
  Group(const DeviceKind& kind, int n, Bytes capacity) {
    for (int r = 0; r < n; ++r) {
      devs.push_back(kind.make_device(r, test_options(capacity)));
      streams.push_back(devs.back()->create_stream("comm"));
      ptrs.push_back(devs.back().get());
    }
  }
  ~Group() {
    streams.clear();  // streams before their devices
  }
};

}  // namespace

TEST_CASE("registry: every kind is registered once, named, described; the reference kind is available") {
  const std::vector<std::string> names = device_kind_names();
  REQUIRE_FALSE(names.empty());
  CHECK(names.front() == "cpu");
  CHECK(&reference_device_kind() == find_device_kind("cpu"));
  CHECK(reference_device_kind().availability().available);
  for (const DeviceKind* k : device_kinds()) {
    CHECK(std::count(names.begin(), names.end(), k->name()) == 1);
    CHECK_FALSE(k->description().empty());
    const DeviceAvailability a = k->availability();
    CHECK(a.available == a.reason.empty());
  }
}

TEST_CASE("capabilities: what the registry says each kind offers, its devices have") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(1 * kMiB));
    CHECK(dev->name() == kind->name() + ":0");
    CHECK(dev->index() == 0);
    CHECK((dev->bf16_kernels() != nullptr) == kind->caps().bf16_kernels);
    if (!kind->caps().profiler_ranges) CHECK_FALSE(dev->names_ranges());
    // The options a kind lacks are refused by name.
    if (!kind->caps().tf32)
      CHECK_THROWS_WITH_AS(kind->make_device(1, {.capacity = kMiB, .tf32 = true}), doctest::Contains("no tf32 option"),
                           DeviceError);
    if (!kind->caps().tree_sums)
      CHECK_THROWS_WITH_AS(kind->make_device(1, {.capacity = kMiB, .tree_sums = true}),
                           doctest::Contains("no tree_sums option"), DeviceError);
    {  // the Llama kernels: where the registry says a kind lacks them, the interface's default refuses by name
      auto stream = dev->create_stream("caps");
      auto buf = dev->alloc(4 * kKiB);
      auto* f = buf.as<float>();
      const auto call = [&] { dev->kernels().swiglu_fwd(*stream, f, f + 64, 2, 8); };
      if (kind->caps().llama_kernels) {
        CHECK_NOTHROW(call());
      } else {
        CHECK_THROWS_WITH_AS(call(), doctest::Contains("swiglu_fwd"), DeviceError);
      }
      CHECK_NOTHROW(stream->synchronize());
    }
    if (kind->caps().collectives) {
      auto other = kind->make_device(1, test_options(1 * kMiB));
      CHECK(kind->make_communicator({dev.get(), other.get()})->size() == 2);
    }
  }
}

TEST_CASE("memory: capacity, out of memory naming the sizes, fragmentation, coalescing, statistics") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(3, test_options(1 * kMiB));
    CHECK(dev->memory().capacity == 1 * kMiB);
    Buffer a = dev->alloc(512 * kKiB, "W L1-4");
    CHECK(a.bytes() == 512 * kKiB);
    CHECK(dev->memory().in_use == 512 * kKiB);
    try {
      Buffer b = dev->alloc(768 * kKiB, "act L5 mb0");
      FAIL("expected OutOfMemory");
    } catch (const OutOfMemory& e) {
      CHECK(e.requested() == 768 * kKiB);
      CHECK(e.in_use() == 512 * kKiB);
      CHECK(e.capacity() == 1 * kMiB);
      CHECK(e.largest_free() == 512 * kKiB);
      CHECK(std::string(e.what()) == dev->name() +
                                         ": out of memory allocating 'act L5 mb0' (768.00 KiB): 512.00 KiB of 1.00 MiB "
                                         "in use, largest free block 512.00 KiB");
    }
    a.reset();
    std::vector<Buffer> quarters;
    quarters.reserve(4);
    for (int i = 0; i < 4; ++i) quarters.push_back(dev->alloc(256 * kKiB));
    CHECK(dev->memory().live_allocations == 4);
    CHECK(dev->memory().peak == 1 * kMiB);
    quarters[0].reset();
    quarters[2].reset();
    CHECK(dev->memory().largest_free == 256 * kKiB);
    CHECK_THROWS_WITH_AS(dev->alloc(512 * kKiB, "big"), doctest::Contains("(the free memory is fragmented)"),
                         OutOfMemory);
    quarters[1].reset();  // joins 0..2 into one 768 KiB block
    CHECK(dev->memory().largest_free == 768 * kKiB);
    quarters[3].reset();
    Buffer whole = dev->alloc(1 * kMiB);  // everything coalesced again
    CHECK(whole);
    CHECK_THROWS_AS(dev->alloc(1), OutOfMemory);
    whole.reset();
    dev->reset_peak();
    CHECK(dev->memory().peak == 0);
    // Sizes round up to the 256-byte granularity, buffers are 256-byte aligned; zero bytes give an empty buffer.
    Buffer small = dev->alloc(1);
    CHECK(dev->memory().in_use == 256);
    CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % 256 == 0);
    CHECK_FALSE(dev->alloc(0));
  }
}

TEST_CASE("memory: with poisoning on, fresh device memory reads as NaN bytes") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(1 * kMiB));
    auto s = dev->create_stream("s");
    Buffer a = dev->alloc(4096, "fresh");
    CHECK(download<std::uint32_t>(*dev, *s, a, 1024) == std::vector<std::uint32_t>(1024, 0xFFFFFFFFu));
  }
}

TEST_CASE("copies: h2d, d2d, peer, d2h and fill round trips are bit-exact, from and to every kind of host memory") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto d0 = kind->make_device(0, test_options(4 * kMiB));
    auto d1 = kind->make_device(1, test_options(4 * kMiB));
    auto s0 = d0->create_stream("swap");
    auto s1 = d1->create_stream("swap");
    const std::size_t n = 100003;
    const auto host = random_bits(n, 42);
    const auto bytes = static_cast<Bytes>(n * 4);
    Buffer a = d0->alloc(bytes, "a"), b = d0->alloc(bytes, "b"), c = d1->alloc(bytes, "c");
    HostBuffer staging = d0->alloc_host(bytes, "a test buffer");  // pinned where the kind pins
    std::vector<std::uint32_t> back2(n, 0);
    d0->copy_h2d(*s0, a.data(), host.data(), bytes);         // swap in
    d0->copy_d2d(*s0, b.data(), a.data(), bytes);            // on the device
    d0->copy_d2d(*s0, c.data(), b.data(), bytes, d1.get());  // to the peer
    d0->copy_d2h(*s0, staging.data(), a.data(), bytes);      // swap out into host memory of the device's
    s0->synchronize();
    d1->copy_d2h(*s1, back2.data(), c.data(), bytes);
    s1->synchronize();
    CHECK(std::vector<std::uint32_t>(staging.as<std::uint32_t>(), staging.as<std::uint32_t>() + n) == host);
    CHECK(back2 == host);
    // fill_zero and copies at offsets: exactly the range.
    d0->fill_zero(*s0, a.as<std::uint32_t>() + 5, 40);
    const auto back = download<std::uint32_t>(*d0, *s0, a, n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += back[i] != ((i >= 5 && i < 15) ? 0u : host[i]) ? 1 : 0;
    CHECK(wrong == 0);
    // A pinned range (pin_host) works the same.
    std::vector<std::uint32_t> pinned_back(n, 0);
    {
      const std::shared_ptr<void> pin = d0->pin_host(pinned_back.data(), bytes, "a test vector");
      d0->copy_d2h(*s0, pinned_back.data(), b.data(), bytes);
      s0->synchronize();
    }
    CHECK(pinned_back == host);
  }
}

TEST_CASE("copies: pointers are checked against the device's live allocations") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto d0 = kind->make_device(0, test_options(1 * kMiB));
    auto d1 = kind->make_device(1, test_options(1 * kMiB));
    auto s0 = d0->create_stream("s0");
    auto s1 = d1->create_stream("s1");
    std::vector<float> host(64);
    Buffer a = d0->alloc(256, "a");
    CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, host.data(), host.data(), 16),
                         doctest::Contains("not inside a live allocation"),
                         DeviceError);  // host as device
    CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, a.data(), a.data(), 16), doctest::Contains("is device memory"),
                         DeviceError);                                            // device as host
    CHECK_THROWS_AS(d0->copy_h2d(*s0, a.data(), host.data(), 257), DeviceError);  // past the end
    {
      Buffer odd = d0->alloc(100, "odd");  // 100 bytes asked, 256 held: past the 100 is past the end
      CHECK_NOTHROW(d0->copy_h2d(*s0, odd.as<char>() + 96, host.data(), 4));
      CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, odd.as<char>() + 96, host.data(), 8),
                           doctest::Contains("not inside a live allocation"), DeviceError);
      s0->synchronize();
    }
    CHECK_THROWS_WITH_AS(d0->copy_h2d(*s1, a.data(), host.data(), 16),
                         doctest::Contains("does not belong to this device"), DeviceError);  // another device's stream
    Buffer b = d1->alloc(256, "b");
    CHECK_THROWS_AS(d0->copy_d2d(*s0, b.data(), a.data(), 16), DeviceError);  // dst on d1 but not named
    void* stale = a.data();
    a.reset();
    CHECK_THROWS_WITH_AS(d0->copy_d2h(*s0, host.data(), stale, 16), doctest::Contains("not inside a live allocation"),
                         DeviceError);  // use after free
    s0->synchronize();
  }
}

TEST_CASE("streams run in FIFO order; events order work across streams; a never-recorded event is complete") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(1 * kMiB));
    auto a = dev->create_stream("a");
    auto b = dev->create_stream("b");
    auto e = dev->create_event();
    CHECK(e->query());
    e->synchronize();
    std::vector<int> order;
    for (int i = 0; i < 100; ++i) a->launch_host([&order, i]() { order.push_back(i); });
    a->synchronize();
    REQUIRE(order.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
    // a blocks on a gate, then sets `done` and records e; b waits for e and must see `done` set.
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    std::atomic<bool> done{false}, b_saw_done{false};
    a->launch_host([opened]() { opened.wait(); });
    a->launch_host([&done]() { done = true; });
    a->record(*e);
    b->wait(*e);
    b->launch_host([&]() { b_saw_done = done.load(); });
    CHECK_FALSE(e->query());  // a is held at the gate, so the record has not run
    gate.set_value();
    b->synchronize();
    CHECK(b_saw_done.load());
    CHECK(e->query());
    dev->synchronize();
  }
}

TEST_CASE("stream timers read the work between their points where the stream runs it, nothing queued before") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(1 * kMiB));
    auto s = dev->create_stream("timed");
    auto timer = s->timer();
    // Work between the points is in the interval (a host function holds the stream, CUDA's too).
    timer->start();
    s->launch_host([]() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    timer->stop();
    CHECK(timer->seconds() >= 0.019);
    // Work queued before the first point is not, though the host enqueued both points while it still ran (a host
    // clock from the enqueue to a synchronize would read 200 ms): two adjacent points read microseconds.
    s->launch_host([]() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    timer->start();
    timer->stop();
    const double empty = timer->seconds();
    CHECK(empty >= 0.0);
    CHECK(empty < 0.100);
    // A timer dropped before its points have run: they still run, harmlessly.
    auto dropped = s->timer();
    dropped->start();
    s->launch_host([]() { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
    dropped->stop();
    dropped.reset();
    s->synchronize();
  }
}

TEST_CASE("events order copies across streams; the device's synchronize waits for every stream") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(64 * kMiB));
    auto s1 = dev->create_stream("h2d");
    auto s2 = dev->create_stream("compute");
    auto e = dev->create_event();
    const std::size_t n = 4 * 1024 * 1024;  // 16 MiB: copies that take long enough to race on real hardware
    const auto host = random_bits(n, 7);
    const auto bytes = static_cast<Bytes>(n * 4);
    Buffer a = dev->alloc(bytes), b = dev->alloc(bytes);
    std::vector<std::uint32_t> back(n, 0);
    for (int round = 0; round < 3; ++round) {
      dev->copy_h2d(*s1, a.data(), host.data(), bytes);
      s1->record(*e);
      s2->wait(*e);
      dev->copy_d2d(*s2, b.data(), a.data(), bytes);
      dev->copy_d2h(*s2, back.data(), b.data(), bytes);
      s2->synchronize();
      CHECK(back == host);
      dev->fill_zero(*s1, a.data(), bytes);  // the next round overwrites a only after s2 read it (s2 synced)
      s1->synchronize();
    }
    dev->copy_h2d(*s1, a.data(), host.data(), bytes);
    dev->copy_h2d(*s2, b.data(), host.data(), bytes);
    dev->synchronize();
    CHECK(download<std::uint32_t>(*dev, *s1, a, n) == host);
    CHECK(download<std::uint32_t>(*dev, *s2, b, n) == host);
  }
}

TEST_CASE("a stream's errors are sticky until synchronize rethrows them once; stream-ordered frees") {
  for (const DeviceKind* kind : subjects()) {
    CAPTURE(kind->name());
    auto dev = kind->make_device(0, test_options(1 * kMiB));
    auto s = dev->create_stream("compute");
    std::vector<int> order;
    s->launch_host([&]() { order.push_back(1); });
    s->launch_host([]() { throw DeviceError("boom"); });
    s->launch_host([&]() { order.push_back(2); });  // work after a failure still runs (errors surface late)
    CHECK_THROWS_WITH_AS(s->synchronize(), "boom", DeviceError);
    CHECK(order == std::vector<int>{1, 2});
    CHECK_NOTHROW(s->synchronize());  // reported once
    s->launch_host([]() { throw DeviceError("boom again"); });
    CHECK_THROWS_WITH_AS(dev->synchronize(), "boom again", DeviceError);  // the device's synchronize too
    Buffer tmp = dev->alloc(1024);
    const Bytes before = dev->memory().in_use;
    s->release_after(std::move(tmp));
    s->synchronize();
    CHECK(dev->memory().in_use == before - 1024);
  }
}

// ---- collectives ------------------------------------------------------------------------------------------------

// Where a communicator adds in rank order, its all-reduce is the serial rank-order sum, bit for bit (the contract);
// where it does not (NCCL's ring, sums_in_rank_order() false), each element is a sum of n terms |x| <= 1 in another
// order: within 2 gamma_n(n) n of it.
Bound all_reduce_bound(const Communicator& comm, int n) {
  return comm.sums_in_rank_order() ? Bound{} : Bound{2 * gamma_n(n) * n, 0};
}

TEST_CASE("collectives: send and recv move bytes in call order per pair; size mismatches fail on both sides") {
  for (const DeviceKind* kind : subjects()) {
    if (!kind->caps().collectives) continue;
    CAPTURE(kind->name());
    Group g(*kind, 3, 4 * kMiB);
    auto comm = kind->make_communicator(g.ptrs);
    CHECK(comm->size() == 3);
    CHECK(&comm->device(2) == g.ptrs[2]);
    const std::int64_t count = 50001;
    const Bytes bytes = count * 4;
    const auto x = random_bits(count, 7), y = random_bits(count, 8);
    Buffer a = g.devs[0]->alloc(bytes), b = g.devs[2]->alloc(bytes), ra = g.devs[1]->alloc(bytes),
           rb = g.devs[1]->alloc(bytes), rc = g.devs[1]->alloc(bytes);
    g.devs[0]->copy_h2d(*g.streams[0], a.data(), x.data(), bytes);
    g.devs[2]->copy_h2d(*g.streams[2], b.data(), y.data(), bytes);
    // Rank 1 receives from 0 twice and from 2 once; the calls never block the host, the streams meet on their own.
    comm->recv(1, *g.streams[1], ra.data(), bytes, 0);
    comm->recv(1, *g.streams[1], rb.data(), bytes, 2);
    comm->recv(1, *g.streams[1], rc.data(), bytes, 0);
    comm->send(2, *g.streams[2], b.data(), bytes, 1);
    comm->send(0, *g.streams[0], a.data(), bytes, 1);  // the first message 0 -> 1
    g.devs[0]->fill_zero(*g.streams[0], a.data(), bytes);
    comm->send(0, *g.streams[0], a.data(), bytes, 1);  // the second: zeros
    for (auto& s : g.streams) s->synchronize();
    CHECK(download<std::uint32_t>(*g.devs[1], *g.streams[1], ra, count) == x);
    CHECK(download<std::uint32_t>(*g.devs[1], *g.streams[1], rb, count) == y);
    CHECK(download<std::uint32_t>(*g.devs[1], *g.streams[1], rc, count) == std::vector<std::uint32_t>(count, 0));
    comm->send(0, *g.streams[0], a.data(), 8, 2);
    comm->recv(2, *g.streams[2], b.data(), 4, 0);
    CHECK_THROWS_WITH_AS(g.streams[2]->synchronize(), doctest::Contains("expected 4 bytes, the sender sent 8"),
                         DeviceError);
    CHECK_THROWS_AS(g.streams[0]->synchronize(), DeviceError);
    CHECK_THROWS_AS(comm->send(0, *g.streams[0], a.data(), 8, 3), DeviceError);  // no rank 3
  }
}

TEST_CASE("collectives: fp32 all-reduce is the serial rank-order sum on every rank, twice in a row") {
  for (const DeviceKind* kind : subjects()) {
    if (!kind->caps().collectives) continue;
    CAPTURE(kind->name());
    const int n = 3;
    Group g(*kind, n, 4 * kMiB);
    auto comm = kind->make_communicator(g.ptrs);
    const std::size_t count = 50001;
    const auto bytes = static_cast<Bytes>(count * 4);
    std::vector<std::vector<float>> host;
    std::vector<Buffer> bufs;
    for (int r = 0; r < n; ++r) {
      host.push_back(random_floats(count, 80 + static_cast<std::uint64_t>(r)));
      bufs.push_back(g.devs[r]->alloc(bytes));
      g.devs[r]->copy_h2d(*g.streams[r], bufs[r].data(), host[r].data(), bytes);
    }
    std::vector<float> sum = host[0];
    for (int r = 1; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) sum[i] += host[r][i];
    }
    for (const int round : {0, 1}) {  // the second reduces the first's result: n times the sum, in rank order
      for (const int r : {2, 0, 1}) comm->all_reduce_sum(r, *g.streams[r], bufs[r].as<float>(), count);
      std::vector<float> want = sum;
      if (round == 1) {
        for (std::size_t i = 0; i < count; ++i) want[i] = (sum[i] + sum[i]) + sum[i];
      }
      std::vector<float> rank0;
      for (int r = 0; r < n; ++r) {
        const auto got = download<float>(*g.devs[r], *g.streams[r], bufs[r], count);
        compare(*kind, "all_reduce_sum round " + std::to_string(round), got, want, all_reduce_bound(*comm, n));
        if (r == 0) rank0 = got;
        bool same_bits = true;  // the same bits on every rank
        for (std::size_t i = 0; i < count; ++i)
          same_bits = same_bits && std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(rank0[i]);
        CHECK(same_bits);
      }
      if (round == 0 && !comm->sums_in_rank_order()) break;  // the second round's rank-order form needs the first's
    }
  }
}

TEST_CASE("collectives: all-reduces shorter than the members' slices, and empty ones, are exact on every rank") {
  // The CPU communicator splits the elements into one slice per member in whole cache lines: here most members get
  // an empty slice or a partial one.
  for (const DeviceKind* kind : subjects()) {
    if (!kind->caps().collectives) continue;
    CAPTURE(kind->name());
    const int n = 3;
    Group g(*kind, n, 1 * kMiB);
    auto comm = kind->make_communicator(g.ptrs);
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{47}, std::size_t{49}}) {
      CAPTURE(count);
      std::vector<std::vector<float>> host;
      std::vector<Buffer> bufs;
      for (int r = 0; r < n; ++r) {
        host.push_back(random_floats(count, 300 + static_cast<std::uint64_t>(r)));
        bufs.push_back(g.devs[r]->alloc(static_cast<Bytes>(std::max<std::size_t>(count, 1) * 4)));
        if (count > 0)
          g.devs[r]->copy_h2d(*g.streams[r], bufs[r].data(), host[r].data(), static_cast<Bytes>(count * 4));
      }
      std::vector<float> want = host[0];
      for (int r = 1; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i) want[i] += host[r][i];
      }
      for (int r = 0; r < n; ++r)
        comm->all_reduce_sum(r, *g.streams[r], bufs[r].as<float>(), static_cast<std::int64_t>(count));
      for (int r = 0; r < n; ++r) {
        g.streams[r]->synchronize();
        if (count == 0) continue;
        const auto got = download<float>(*g.devs[r], *g.streams[r], bufs[r], count);
        compare(*kind, "short all_reduce_sum", got, want, all_reduce_bound(*comm, n));
      }
    }
  }
}

TEST_CASE("collectives: bf16 all-reduce adds in fp32 in rank order and rounds once; mismatches fail everywhere") {
  for (const DeviceKind* kind : subjects()) {
    if (!kind->caps().collectives) continue;
    CAPTURE(kind->name());
    const int n = 3;
    Group g(*kind, n, 4 * kMiB);
    auto comm = kind->make_communicator(g.ptrs);
    const std::size_t count = 30001;
    const auto bytes = static_cast<Bytes>(count * 2);
    const Bf16 tiny = to_bf16(0.00390625f);  // 2^-8
    std::vector<std::vector<Bf16>> host(n);
    std::vector<Buffer> bufs;
    for (int r = 0; r < n; ++r) {
      for (const float f : random_floats(count, 120 + static_cast<std::uint64_t>(r))) host[r].push_back(to_bf16(f));
      host[r][0] = r == 0 ? to_bf16(1.0f) : tiny;
      bufs.push_back(g.devs[r]->alloc(bytes));
      g.devs[r]->copy_h2d(*g.streams[r], bufs[r].data(), host[r].data(), bytes);
    }
    for (int r = n - 1; r >= 0; --r) comm->all_reduce_sum_bf16(r, *g.streams[r], bufs[r].as<Bf16>(), count);
    std::vector<float> want(count);
    for (std::size_t i = 0; i < count; ++i) {
      float s = to_f32(host[0][i]);
      for (int r = 1; r < n; ++r) s += to_f32(host[r][i]);
      want[i] = to_f32(to_bf16(s));
    }
    CHECK(want[0] == 1.0078125f);  // 1 + 2 * 2^-8 rounded once; rounding after every add would give 1
    const Bound b = comm->sums_in_rank_order() ? Bound{} : stored<Bf16>(all_reduce_bound(*comm, n));
    for (int r = 0; r < n; ++r) {
      std::vector<float> got;
      for (const Bf16 v : download<Bf16>(*g.devs[r], *g.streams[r], bufs[r], count)) got.push_back(to_f32(v));
      compare(*kind, "all_reduce_sum_bf16", got, want, b);
    }
    // fp32 and bf16 all-reduces share one call order: a rank calling the other kind, or another count, fails the
    // call on every rank, naming the rank.
    for (int r = 0; r < n; ++r) {
      if (r == 1) {
        comm->all_reduce_sum(r, *g.streams[r], bufs[r].as<float>(), 4);
      } else {
        comm->all_reduce_sum_bf16(r, *g.streams[r], bufs[r].as<Bf16>(), 8);
      }
    }
    for (int r = 0; r < n; ++r)
      CHECK_THROWS_WITH_AS(g.streams[r]->synchronize(), doctest::Contains("rank 1"), DeviceError);
    for (int r = 0; r < n; ++r) comm->all_reduce_sum_bf16(r, *g.streams[r], bufs[r].as<Bf16>(), r == 2 ? 7 : 8);
    for (int r = 0; r < n; ++r)
      CHECK_THROWS_WITH_AS(g.streams[r]->synchronize(), doctest::Contains("rank 2 reduces 7 bf16 values"), DeviceError);
  }
}

// ---- main ---------------------------------------------------------------------------------------------------------

namespace {

void print_registry() {
  std::printf("device registry:\n");
  for (const DeviceKind* k : device_kinds()) {
    const DeviceAvailability a = k->availability();
    const DeviceCaps& c = k->caps();
    std::printf("  %-5s %s\n        %s; caps:%s%s%s%s%s%s%s%s%s\n", k->name().c_str(), k->description().c_str(),
                a.available ? "available, under test" : ("not available, skipped: " + a.reason).c_str(),
                c.bf16_kernels ? " bf16_kernels" : "", c.tf32 ? " tf32" : "", c.tree_sums ? " tree_sums" : "",
                c.pinned_host_memory ? " pinned_host_memory" : "", c.profiler_ranges ? " profiler_ranges" : "",
                c.llama_kernels ? " llama_kernels" : "", c.collectives ? " collectives" : "",
                c.memory_in_host ? " memory_in_host" : "", c.concurrent_executor ? " concurrent_executor" : "");
  }
}

void print_records() {
  std::printf("largest difference of every checked output (share of its bound; exact: bit for bit):\n");
  for (const auto& [what, r] : records()) {
    if (r.exact) {
      std::printf("  %-70s exact %s\n", what.c_str(), r.max_diff == 0 ? "(equal)" : "(DIFFERS)");
    } else {
      std::printf("  %-70s %.3g (%.3f of its bound)\n", what.c_str(), r.max_diff, r.max_share);
    }
  }
}

// The kinds HARMONY_CONFORMANCE_REQUIRE names that are not available here, with their reasons.
std::vector<std::string> missing_required() {
  std::vector<std::string> missing;
  const char* env = std::getenv("HARMONY_CONFORMANCE_REQUIRE");
  if (env == nullptr) return missing;
  std::stringstream list(env);
  std::string name;
  while (std::getline(list, name, ',')) {
    if (name.empty()) continue;
    const DeviceKind* k = find_device_kind(name);
    if (k == nullptr) {
      missing.push_back(name + ": not a registered device kind");
    } else if (const DeviceAvailability a = k->availability(); !a.available) {
      missing.push_back(name + ": " + a.reason);
    }
  }
  return missing;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  print_registry();
  const std::vector<std::string> missing = missing_required();
  for (const std::string& m : missing) std::printf("HARMONY_CONFORMANCE_REQUIRE: %s\n", m.c_str());
  if (!missing.empty()) return 1;
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  print_records();
  return rc;
}
