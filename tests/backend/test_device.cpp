// Tests of the CPU device: the capped arena (over-capacity and fragmentation errors, statistics),
// poisoning of freed memory, copies (swap round trips bit-exact, pointer checks), streams and events,
// sticky errors, and the collectives (send/recv, all-reduce bit-exact against a serial sum in rank order).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <vector>

#include "backend/cpu/cpu_device.hpp"

using namespace harmony::backend;
using harmony::core::kKiB;
using harmony::core::kMiB;

namespace {

std::vector<std::uint32_t> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(rng());  // every bit pattern: NaNs, infinities, denormals
  return v;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("arena: allocation beyond capacity throws OutOfMemory naming sizes") {
  auto dev = cpu::make_cpu_device(3, {.capacity = 1 * kMiB, .poison = false});
  CHECK(dev->name() == "cpu:3");
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
    CHECK(std::string(e.what()) ==
          "cpu:3: out of memory allocating 'act L5 mb0' (768.00 KiB): 512.00 KiB of 1.00 MiB in use, largest free "
          "block 512.00 KiB");
  }
  a.reset();
  CHECK(dev->memory().in_use == 0);
  Buffer whole = dev->alloc(1 * kMiB);  // everything coalesced again
  CHECK(whole);
  CHECK_THROWS_AS(dev->alloc(1), OutOfMemory);
}

TEST_CASE("arena: fragmentation is reported, freeing coalesces, statistics track peaks") {
  auto dev = cpu::make_cpu_device(0, {.capacity = 1 * kMiB, .poison = false});
  std::vector<Buffer> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(dev->alloc(256 * kKiB));
  CHECK(dev->memory().live_allocations == 4);
  CHECK(dev->memory().peak == 1 * kMiB);
  quarters[0].reset();
  quarters[2].reset();
  CHECK(dev->memory().in_use == 512 * kKiB);
  CHECK(dev->memory().largest_free == 256 * kKiB);
  CHECK_THROWS_WITH_AS(dev->alloc(512 * kKiB, "big"), doctest::Contains("(the free memory is fragmented)"),
                       OutOfMemory);
  quarters[1].reset();  // joins 0..2 into one 768 KiB block
  CHECK(dev->memory().largest_free == 768 * kKiB);
  Buffer big = dev->alloc(768 * kKiB);
  CHECK(big);
  dev->reset_peak();
  CHECK(dev->memory().peak == 1 * kMiB);
  big.reset();
  quarters[3].reset();
  dev->reset_peak();
  CHECK(dev->memory().peak == 0);
  // Sizes round up to 256 bytes; zero bytes give an empty buffer.
  Buffer small = dev->alloc(1);
  CHECK(dev->memory().in_use == 256);
  CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % 256 == 0);
  Buffer none = dev->alloc(0);
  CHECK_FALSE(none);
}

TEST_CASE("poisoning: freed device memory reads as NaN") {
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB, .poison = true});
  auto s = dev->create_stream("s");
  std::vector<float> ones(256, 1.0f);
  Buffer b = dev->alloc(1024);
  CHECK(std::isnan(b.as<float>()[7]));  // fresh memory is poisoned too: reading before writing shows up
  dev->copy_h2d(*s, b.data(), ones.data(), 1024);
  s->synchronize();
  const float* stale = b.as<float>();
  CHECK(stale[10] == 1.0f);
  b.reset();
  // Use after free: the arena keeps the block, so this read is defined, and it sees the poison.
  for (int i = 0; i < 256; ++i) CHECK(std::isnan(stale[i]));
  std::uint32_t bits = 0;
  std::memcpy(&bits, stale, 4);
  CHECK(bits == 0xFFFFFFFFu);
}

TEST_CASE("poisoning is on by default in debug and sanitizer builds") {
#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__)
  CHECK(cpu::kPoisonByDefault);
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  Buffer b = dev->alloc(64);
  float* p = b.as<float>();
  b.reset();
  CHECK(std::isnan(p[0]));
#else
  MESSAGE("release build: poisoning is off by default (CpuDeviceOptions::poison turns it on)");
  CHECK_FALSE(cpu::kPoisonByDefault);
#endif
}

TEST_CASE("copies: swap round trips and peer copies are bit-exact") {
  auto d0 = cpu::make_cpu_device(0, {.capacity = 1 * kMiB});
  auto d1 = cpu::make_cpu_device(1, {.capacity = 1 * kMiB});
  auto s0 = d0->create_stream("swap");
  const std::size_t n = 10007;
  const auto host = random_bits(n, 42);
  const Bytes bytes = static_cast<Bytes>(n * 4);
  Buffer a = d0->alloc(bytes, "a");
  Buffer b = d0->alloc(bytes, "b");
  Buffer c = d1->alloc(bytes, "c");
  std::vector<std::uint32_t> back(n, 0), back2(n, 0);
  d0->copy_h2d(*s0, a.data(), host.data(), bytes);         // swap in
  d0->copy_d2d(*s0, b.data(), a.data(), bytes);            // device to device
  d0->copy_d2d(*s0, c.data(), b.data(), bytes, d1.get());  // to the peer
  d0->copy_d2h(*s0, back.data(), a.data(), bytes);         // swap out
  s0->synchronize();
  auto s1 = d1->create_stream("swap");
  d1->copy_d2h(*s1, back2.data(), c.data(), bytes);
  s1->synchronize();
  CHECK(back == host);
  CHECK(back2 == host);
  // fill_zero and partial copies at offsets.
  d0->fill_zero(*s0, a.as<std::uint32_t>() + 5, 40);
  d0->copy_d2h(*s0, back.data(), a.data(), bytes);
  s0->synchronize();
  CHECK(back[4] == host[4]);
  CHECK(back[5] == 0);
  CHECK(back[14] == 0);
  CHECK(back[15] == host[15]);
}

TEST_CASE("copies: pointers are checked against the device's live allocations") {
  auto d0 = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto d1 = cpu::make_cpu_device(1, {.capacity = 64 * kKiB});
  auto s0 = d0->create_stream("s0");
  auto s1 = d1->create_stream("s1");
  std::vector<float> host(64);
  Buffer a = d0->alloc(256, "a");
  CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, host.data(), host.data(), 16), doctest::Contains("destination"),
                       DeviceError);  // host as device
  CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, a.data(), a.data(), 16), doctest::Contains("is device memory"),
                       DeviceError);                                            // device as host
  CHECK_THROWS_AS(d0->copy_h2d(*s0, a.data(), host.data(), 257), DeviceError);  // past the end
  CHECK_THROWS_WITH_AS(d0->copy_h2d(*s1, a.data(), host.data(), 16),
                       doctest::Contains("does not belong to this device"), DeviceError);  // foreign stream
  Buffer b = d1->alloc(256, "b");
  CHECK_THROWS_AS(d0->copy_d2d(*s0, b.data(), a.data(), 16), DeviceError);  // dst on d1 but not named
  void* stale = a.data();
  a.reset();
  CHECK_THROWS_WITH_AS(d0->copy_d2h(*s0, host.data(), stale, 16), doctest::Contains("not inside a live allocation"),
                       DeviceError);  // use after free
  s0->synchronize();
}

TEST_CASE("streams run in FIFO order; events order work across streams") {
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  CHECK(e->query());  // never recorded: complete
  e->synchronize();

  std::vector<int> order;
  for (int i = 0; i < 100; ++i) a->launch_host([&order, i]() { order.push_back(i); });
  a->synchronize();
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);

  // a blocks on a gate, then sets `done` and records e; b waits for e and must see `done` set.
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::atomic<bool> done{false};
  std::atomic<bool> b_saw_done{false};
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

TEST_CASE("a stream's errors are sticky until synchronize rethrows them") {
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto s = dev->create_stream("compute");
  Buffer ids = dev->alloc(16, "ids");
  Buffer wte = dev->alloc(4 * 4 * 4, "wte");
  Buffer out = dev->alloc(2 * 4 * 4, "out");
  const std::int32_t bad[2] = {1, 9};
  dev->copy_h2d(*s, ids.data(), bad, sizeof(bad));
  dev->kernels().embedding_fwd(*s, out.as<float>(), ids.as<std::int32_t>(), wte.as<float>(), wte.as<float>(), 1, 2, 4,
                               4);
  bool later_ran = false;
  s->launch_host([&]() { later_ran = true; });  // work after a failure still runs (like CUDA, errors surface late)
  CHECK_THROWS_WITH_AS(s->synchronize(), doctest::Contains("token id 9 at (b=0, t=1)"), DeviceError);
  CHECK(later_ran);
  s->synchronize();  // reported once
  s->launch_host([]() { throw DeviceError("boom"); });
  CHECK_THROWS_WITH_AS(dev->synchronize(), "boom", DeviceError);
  // Stream-ordered free.
  Buffer tmp = dev->alloc(1024);
  const Bytes before = dev->memory().in_use;
  s->release_after(std::move(tmp));
  s->synchronize();
  CHECK(dev->memory().in_use == before - 1024);
}

TEST_CASE("embedding ids outside [0, V) are a DeviceError in both directions, and nothing is written") {
  // The policy every device follows (the CUDA device's kernels check the same before writing).
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto s = dev->create_stream("compute");
  const int B = 2, T = 3, C = 4, V = 5;
  Buffer ids = dev->alloc(B * T * 4, "ids");
  Buffer wte = dev->alloc(V * C * 4, "wte"), wpe = dev->alloc(T * C * 4, "wpe");
  Buffer out = dev->alloc(B * T * C * 4, "out"), dout = dev->alloc(B * T * C * 4, "dout");
  const auto wte0 = random_floats(V * C, 31), wpe0 = random_floats(T * C, 32), out0 = random_floats(B * T * C, 33);
  const auto dout0 = random_floats(B * T * C, 34);
  for (const std::int32_t bad : {V, 1 << 30, -1, -(1 << 30)}) {
    CAPTURE(bad);
    const std::int32_t host_ids[B * T] = {0, 1, 2, 3, bad, 4};  // the bad one at (b=1, t=1)
    dev->copy_h2d(*s, ids.data(), host_ids, sizeof(host_ids));
    dev->copy_h2d(*s, wte.data(), wte0.data(), V * C * 4);
    dev->copy_h2d(*s, wpe.data(), wpe0.data(), T * C * 4);
    dev->copy_h2d(*s, out.data(), out0.data(), B * T * C * 4);
    dev->copy_h2d(*s, dout.data(), dout0.data(), B * T * C * 4);
    const std::string at = "token id " + std::to_string(bad) + " at (b=1, t=1) is outside the vocabulary [0, 5)";
    dev->kernels().embedding_fwd(*s, out.as<float>(), ids.as<std::int32_t>(), wte.as<float>(), wpe.as<float>(), B, T, C,
                                 V);
    CHECK_THROWS_WITH_AS(s->synchronize(), doctest::Contains(("embedding: " + at).c_str()), DeviceError);
    dev->kernels().embedding_bwd(*s, wte.as<float>(), wpe.as<float>(), dout.as<float>(), ids.as<std::int32_t>(), B, T,
                                 C, V);
    CHECK_THROWS_WITH_AS(s->synchronize(),
                         doctest::Contains(("embedding_bwd: " + at + "; nothing was written").c_str()), DeviceError);
    CHECK(std::memcmp(out.data(), out0.data(), out0.size() * 4) == 0);
    CHECK(std::memcmp(wte.data(), wte0.data(), wte0.size() * 4) == 0);
    CHECK(std::memcmp(wpe.data(), wpe0.data(), wpe0.size() * 4) == 0);
  }
  // The last id, V - 1, is in range.
  const std::int32_t good[B * T] = {0, 1, 2, 3, V - 1, 0};
  dev->copy_h2d(*s, ids.data(), good, sizeof(good));
  dev->kernels().embedding_bwd(*s, wte.as<float>(), wpe.as<float>(), dout.as<float>(), ids.as<std::int32_t>(), B, T, C,
                               V);
  s->synchronize();
  CHECK(wte.as<float>()[(V - 1) * C] == wte0[(V - 1) * C] + dout0[4 * C]);
}

TEST_CASE("send/recv move bytes between devices in call order; size mismatches fail on both sides") {
  auto d0 = cpu::make_cpu_device(0, {.capacity = 256 * kKiB});
  auto d1 = cpu::make_cpu_device(1, {.capacity = 256 * kKiB});
  auto comm = cpu::make_cpu_communicator({d0.get(), d1.get()});
  CHECK(comm->size() == 2);
  auto s0 = d0->create_stream("p2p-out");
  auto s1 = d1->create_stream("p2p-in");
  const auto x = random_bits(1000, 7), y = random_bits(1000, 8);
  Buffer a = d0->alloc(4000), b = d0->alloc(4000), ra = d1->alloc(4000), rb = d1->alloc(4000);
  d0->copy_h2d(*s0, a.data(), x.data(), 4000);
  d0->copy_h2d(*s0, b.data(), y.data(), 4000);
  comm->send(0, *s0, a.data(), 4000, 1);
  comm->send(0, *s0, b.data(), 4000, 1);
  comm->recv(1, *s1, ra.data(), 4000, 0);  // first message
  comm->recv(1, *s1, rb.data(), 4000, 0);  // second
  std::vector<std::uint32_t> got_a(1000), got_b(1000);
  d1->copy_d2h(*s1, got_a.data(), ra.data(), 4000);
  d1->copy_d2h(*s1, got_b.data(), rb.data(), 4000);
  s1->synchronize();
  s0->synchronize();
  CHECK(got_a == x);
  CHECK(got_b == y);

  comm->send(0, *s0, a.data(), 4000, 1);
  comm->recv(1, *s1, ra.data(), 2000, 0);
  CHECK_THROWS_WITH_AS(s1->synchronize(), doctest::Contains("expected 2000 bytes, the sender sent 4000"), DeviceError);
  CHECK_THROWS_AS(s0->synchronize(), DeviceError);
  CHECK_THROWS_AS(comm->send(0, *s0, a.data(), 4000, 2), DeviceError);  // no rank 2
}

TEST_CASE("all-reduce is bit-exact against a serial sum in rank order, on every rank") {
  constexpr int kRanks = 4;
  constexpr std::size_t kN = 4099;
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<Device*> raw;
  for (int r = 0; r < kRanks; ++r) {
    devs.push_back(cpu::make_cpu_device(r, {.capacity = 256 * kKiB}));
    raw.push_back(devs.back().get());
  }
  auto comm = cpu::make_cpu_communicator(raw);
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Buffer> bufs;
  std::vector<std::vector<float>> data;
  for (int r = 0; r < kRanks; ++r) {
    streams.push_back(devs[r]->create_stream("ard"));
    data.push_back(random_floats(kN, 100 + r));
    bufs.push_back(devs[r]->alloc(static_cast<Bytes>(kN * 4)));
    devs[r]->copy_h2d(*streams[r], bufs[r].data(), data[r].data(), static_cast<Bytes>(kN * 4));
  }
  // Two reductions in a row (the second over the first's result).
  for (int round = 0; round < 2; ++round) {
    for (int r = kRanks - 1; r >= 0; --r) comm->all_reduce_sum(r, *streams[r], bufs[r].as<float>(), kN);
  }
  std::vector<float> expect(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    float s = data[0][i];
    for (int r = 1; r < kRanks; ++r) s += data[r][i];  // ((d0 + d1) + d2) + d3
    expect[i] = s;
  }
  for (std::size_t i = 0; i < kN; ++i) {
    float s = expect[i];
    for (int r = 1; r < kRanks; ++r) s += expect[i];
    expect[i] = s;
  }
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> got(kN);
    devs[r]->copy_d2h(*streams[r], got.data(), bufs[r].data(), static_cast<Bytes>(kN * 4));
    streams[r]->synchronize();
    CHECK(std::memcmp(got.data(), expect.data(), kN * 4) == 0);
  }
  // Mismatched counts fail on every rank.
  for (int r = 0; r < kRanks; ++r) comm->all_reduce_sum(r, *streams[r], bufs[r].as<float>(), r == 2 ? 10 : 11);
  for (int r = 0; r < kRanks; ++r)
    CHECK_THROWS_WITH_AS(streams[r]->synchronize(), doctest::Contains("rank 2 reduces 10"), DeviceError);
}

TEST_CASE("host buffers are aligned, zeroed and usable as copy endpoints") {
  HostBuffer h(1000);
  CHECK(h.bytes() == 1000);
  CHECK(reinterpret_cast<std::uintptr_t>(h.data()) % 64 == 0);
  CHECK(h.span<float>().size() == 250);
  for (float x : h.span<float>()) CHECK(x == 0.0f);
  CHECK(HostBuffer(0).data() == nullptr);
  CHECK_THROWS_AS(HostBuffer(-1), BackendError);
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto s = dev->create_stream("s");
  Buffer d = dev->alloc(1000);
  h.span<float>()[3] = 2.5f;
  dev->copy_h2d(*s, d.data(), h.data(), 1000);
  HostBuffer back(1000);
  dev->copy_d2h(*s, back.data(), d.data(), 1000);
  s->synchronize();
  CHECK(back.span<float>()[3] == 2.5f);
}
