// Tests of the CPU device: the capped arena (over-capacity and fragmentation errors, statistics),
// poisoning of freed memory, copies (swap round trips bit-exact, pointer checks), streams and events,
// sticky errors, the collectives (send/recv, all-reduce bit-exact against a serial sum in rank order), and
// bf16 (rounding to nearest even against its definition; the bf16 kernels bit-exact against round(fp32 kernel)).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/cpu/kernels.hpp"
#include "backend/model/ops.hpp"

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
  {
    Buffer odd = d0->alloc(100, "odd");  // 100 bytes asked, 256 held: past the 100 is past the end
    CHECK_NOTHROW(d0->copy_h2d(*s0, odd.as<char>() + 96, host.data(), 4));
    CHECK_THROWS_WITH_AS(d0->copy_h2d(*s0, odd.as<char>() + 96, host.data(), 8),
                         doctest::Contains("not inside a live allocation"), DeviceError);
    s0->synchronize();
  }
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

// The bf16 all-reduce is the executor's host replica sum (docs/backend.md, "Replica sums"): every rank's value
// widened, added in fp32 in rank order, rounded once. Element 0 is a case where rounding after each add differs:
// 1 + 2^-8 + 2^-8 is 1 + 2^-7 in fp32 (exact in bf16), but 1 + 2^-8 alone rounds back to 1 (ties to even).
TEST_CASE("bf16 all-reduce widens, adds in rank order in fp32 and rounds once, on every rank") {
  constexpr int kRanks = 3;
  constexpr std::size_t kN = 2053;
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<Device*> raw;
  for (int r = 0; r < kRanks; ++r) {
    devs.push_back(cpu::make_cpu_device(r, {.capacity = 256 * kKiB}));
    raw.push_back(devs.back().get());
  }
  auto comm = cpu::make_cpu_communicator(raw);
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Buffer> bufs;
  std::vector<std::vector<Bf16>> data;
  data.reserve(kRanks);                    // the copies up read data[r] asynchronously
  const Bf16 tiny = to_bf16(0.00390625f);  // 2^-8
  for (int r = 0; r < kRanks; ++r) {
    streams.push_back(devs[r]->create_stream("ard"));
    std::vector<Bf16> v;
    for (const float f : random_floats(kN, 300 + r)) v.push_back(to_bf16(f));
    v[0] = r == 0 ? to_bf16(1.0f) : tiny;
    data.push_back(std::move(v));
    bufs.push_back(devs[r]->alloc(static_cast<Bytes>(kN * 2)));
    devs[r]->copy_h2d(*streams[r], bufs[r].data(), data[r].data(), static_cast<Bytes>(kN * 2));
  }
  for (int r = kRanks - 1; r >= 0; --r) comm->all_reduce_sum_bf16(r, *streams[r], bufs[r].as<Bf16>(), kN);
  std::vector<Bf16> expect(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    float s = to_f32(data[0][i]);
    for (int r = 1; r < kRanks; ++r) s += to_f32(data[r][i]);
    expect[i] = to_bf16(s);
  }
  CHECK(to_f32(expect[0]) == 1.0078125f);                                               // 1 + 2^-7
  CHECK(to_f32(to_bf16(to_f32(to_bf16(1.0f + to_f32(tiny))) + to_f32(tiny))) == 1.0f);  // rounded per add
  for (int r = 0; r < kRanks; ++r) {
    std::vector<Bf16> got(kN);
    devs[r]->copy_d2h(*streams[r], got.data(), bufs[r].data(), static_cast<Bytes>(kN * 2));
    streams[r]->synchronize();
    CHECK(got == expect);
  }
  // fp32 and bf16 all-reduces share one call order: mixing them in one call, or mismatched counts, fails everywhere.
  for (int r = 0; r < kRanks; ++r) {
    if (r == 1) {
      comm->all_reduce_sum(r, *streams[r], bufs[r].as<float>(), 4);
    } else {
      comm->all_reduce_sum_bf16(r, *streams[r], bufs[r].as<Bf16>(), 8);
    }
  }
  for (int r = 0; r < kRanks; ++r)
    CHECK_THROWS_WITH_AS(streams[r]->synchronize(), doctest::Contains("rank 1 calls all_reduce_sum"), DeviceError);
  for (int r = 0; r < kRanks; ++r) comm->all_reduce_sum_bf16(r, *streams[r], bufs[r].as<Bf16>(), r == 2 ? 7 : 8);
  for (int r = 0; r < kRanks; ++r)
    CHECK_THROWS_WITH_AS(streams[r]->synchronize(), doctest::Contains("rank 2 reduces 7 bf16 values"), DeviceError);
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

// ---- bf16 ----

namespace {

std::uint16_t bits_of(float f) { return to_bf16(f).bits; }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// The definition, independently of the bit trick: the two bf16 neighbours of a finite f (truncation and the next
// value up in magnitude), the nearer one in exact (double) arithmetic, a tie to the even mantissa.
std::uint16_t reference_round(std::uint32_t u) {
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);  // next magnitude (into the exponent or to inf)
  const double f = std::fabs(double(from_bits(u)));
  if (std::isinf(f)) return lo;
  // Above the largest bf16 the next value up is inf, which IEEE rounding treats as 2^128 for the distance.
  const double above = (hi & 0x7fffU) == 0x7f80U ? std::ldexp(1.0, 128) : std::fabs(double(to_f32(Bf16{hi})));
  const double dl = f - std::fabs(double(to_f32(Bf16{lo})));
  const double dh = above - f;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1U) == 0 ? lo : hi;
}

}  // namespace

TEST_CASE("bf16 rounding: nearest, ties to even, NaN kept, overflow to inf, denormals") {
  // Ties between two bf16 values go to the even mantissa (a truncating rounding fails the second and third).
  CHECK(bits_of(1.0f) == 0x3f80);
  CHECK(bits_of(from_bits(0x3f808000)) == 0x3f80);  // 1 + 2^-8: halfway between 1 and 1 + 2^-7 -> 1 (even)
  CHECK(bits_of(from_bits(0x3f818000)) == 0x3f82);  // 1 + 3 * 2^-8: halfway, up to the even 1 + 2^-6
  CHECK(bits_of(from_bits(0x3f808001)) == 0x3f81);  // just above halfway: up
  CHECK(bits_of(from_bits(0x3f807fff)) == 0x3f80);  // just below: down
  CHECK(bits_of(from_bits(0xbf818000)) == 0xbf82);  // negative ties alike
  CHECK(bits_of(from_bits(0x3fffffff)) == 0x4000);  // carry into the exponent
  // Infinities stay; the largest floats round to inf; just below the halfway point they do not.
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bits_of(from_bits(0x7f7f7fff)) == 0x7f7f);
  // NaN stays NaN with its sign, even when its payload lives only in the dropped bits (truncation gives inf).
  for (std::uint32_t nan : {0x7fc00000U, 0x7f800001U, 0xff800001U, 0x7fbfffffU, 0xffffffffU}) {
    CAPTURE(nan);
    CHECK(std::isnan(to_f32(to_bf16(from_bits(nan)))));
    CHECK((bits_of(from_bits(nan)) >> 15) == (nan >> 31));
  }
  // Denormals round like any other value: to zero, to even at a tie, up into the smallest normal.
  CHECK(bits_of(from_bits(0x00000001)) == 0x0000);
  CHECK(bits_of(from_bits(0x00008000)) == 0x0000);  // tie, 0 is even
  CHECK(bits_of(from_bits(0x00018000)) == 0x0002);  // tie, up to even
  CHECK(bits_of(from_bits(0x00010001)) == 0x0001);
  CHECK(bits_of(from_bits(0x007fffff)) == 0x0080);  // largest denormal -> smallest normal
  CHECK(bits_of(from_bits(0x80008001)) == 0x8001);  // negative denormal
  // Widening is exact: every non-NaN bf16 survives a round trip.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const Bf16 v{static_cast<std::uint16_t>(b)};
    if (std::isnan(to_f32(v))) continue;
    if (to_bf16(to_f32(v)).bits != b) FAIL("bf16 round trip changes ", b);
  }
  // Every bit pattern class (random bits: denormals, infinities, huge and tiny values) against the definition.
  int mismatches = 0;
  for (std::uint32_t u : random_bits(200000, 99)) {
    if (std::isnan(from_bits(u))) continue;
    if (bits_of(from_bits(u)) != reference_round(u)) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(dtype_bytes(DType::BF16) == 2);
  CHECK(dtype_bytes(DType::F32) == 4);
  CHECK(parse_dtype("bf16") == DType::BF16);
  CHECK(parse_dtype("fp32") == DType::F32);
  CHECK_FALSE(parse_dtype("fp16").has_value());
}

namespace {

std::vector<Bf16> to_bf16_vec(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
std::vector<float> widened(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_f32(v[i]);
  return out;
}

// bf16 device tensors for a kernel test: upload, run, download.
struct Bf16Bench {
  std::unique_ptr<Device> dev = cpu::make_cpu_device(0, {.capacity = 4 * kMiB});
  std::unique_ptr<Stream> s = dev->create_stream("bf16");
  std::vector<Buffer> keep;
  Bf16* up(const std::vector<Bf16>& v) {
    keep.push_back(dev->alloc(Bytes(v.size()) * 2));
    dev->copy_h2d(*s, keep.back().data(), v.data(), Bytes(v.size()) * 2);
    s->synchronize();  // v may be a temporary
    return keep.back().as<Bf16>();
  }
  std::vector<Bf16> down(const Bf16* p, std::size_t n) {
    std::vector<Bf16> v(n);
    dev->copy_d2h(*s, v.data(), p, Bytes(n) * 2);
    s->synchronize();
    return v;
  }
};

void check_rounded(const std::vector<Bf16>& got, const std::vector<float>& fp32, const char* what) {
  REQUIRE(got.size() == fp32.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += got[i].bits != to_bf16(fp32[i]).bits ? 1 : 0;
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " values are not round(fp32 result)");
}

}  // namespace

TEST_CASE("bf16 kernels: widen, compute in fp32, round once (bit-exact against the fp32 reference loops)") {
  Bf16Bench b;
  DeviceOpsBf16 ops(*b.dev, *b.s);
  const int N = 6, IC = 8, OC = 5, C = 8;
  const auto in = to_bf16_vec(random_floats(N * IC, 1)), w = to_bf16_vec(random_floats(IC * OC, 2)),
             bias = to_bf16_vec(random_floats(OC, 3)), dout = to_bf16_vec(random_floats(N * OC, 4)),
             dw0 = to_bf16_vec(random_floats(IC * OC, 5));
  const auto fin = widened(in), fw = widened(w), fb = widened(bias), fd = widened(dout);
  for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
    CAPTURE(static_cast<int>(layout));
    // matmul forward with a bias.
    Bf16* out = b.up(std::vector<Bf16>(N * OC));
    ops.matmul_fwd(out, b.up(in), b.up(w), b.up(bias), N, IC, OC, layout);
    std::vector<float> ref(N * OC);
    cpu::matmul_fwd<float>(ref.data(), fin.data(), fw.data(), fb.data(), N, IC, OC, layout);
    check_rounded(b.down(out, ref.size()), ref, "matmul_fwd");
    // matmul backward: din written, dw and dbias accumulated in fp32 onto their bf16 values, each rounded once.
    Bf16* din = b.up(std::vector<Bf16>(N * IC));
    Bf16* dw = b.up(dw0);
    Bf16* db = b.up(bias);
    ops.matmul_bwd(din, dw, db, b.up(dout), b.up(in), b.up(w), N, IC, OC, layout);
    std::vector<float> rdin(N * IC), rdw = widened(dw0), rdb = fb;
    cpu::matmul_bwd<float>(rdin.data(), rdw.data(), rdb.data(), fd.data(), fin.data(), fw.data(), N, IC, OC, layout);
    check_rounded(b.down(din, rdin.size()), rdin, "matmul_bwd din");
    check_rounded(b.down(dw, rdw.size()), rdw, "matmul_bwd dw");
    check_rounded(b.down(db, rdb.size()), rdb, "matmul_bwd dbias");
  }
  // layer norm forward and backward (din accumulates).
  const auto x = to_bf16_vec(random_floats(N * C, 6)), g = to_bf16_vec(random_floats(C, 7));
  Bf16* lo = b.up(std::vector<Bf16>(N * C));
  Bf16* mean = b.up(std::vector<Bf16>(N));
  Bf16* rstd = b.up(std::vector<Bf16>(N));
  Bf16* xd = b.up(x);
  Bf16* gd = b.up(g);
  ops.layernorm_fwd(lo, mean, rstd, xd, gd, gd, N, C, 1e-5f);
  std::vector<float> rlo(N * C), rm(N), rr(N);
  const auto fx = widened(x), fg = widened(g);
  cpu::layernorm_fwd<float>(rlo.data(), rm.data(), rr.data(), fx.data(), fg.data(), fg.data(), N, C, 1e-5f);
  check_rounded(b.down(lo, rlo.size()), rlo, "layernorm_fwd out");
  check_rounded(b.down(mean, rm.size()), rm, "layernorm_fwd mean");
  check_rounded(b.down(rstd, rr.size()), rr, "layernorm_fwd rstd");
  const auto dx0 = to_bf16_vec(random_floats(N * C, 8));
  Bf16* ldx = b.up(dx0);
  Bf16* ldw = b.up(g);
  Bf16* ldb = b.up(g);
  ops.layernorm_bwd(ldx, ldw, ldb, lo, xd, gd, mean, rstd, N, C);
  std::vector<float> rdx = widened(dx0), rdw = fg, rdb = fg;
  const auto flo = widened(b.down(lo, N * C)), fm = widened(b.down(mean, N)), fr = widened(b.down(rstd, N));
  cpu::layernorm_bwd<float>(rdx.data(), rdw.data(), rdb.data(), flo.data(), fx.data(), fg.data(), fm.data(), fr.data(),
                            N, C);
  check_rounded(b.down(ldx, rdx.size()), rdx, "layernorm_bwd din");
  check_rounded(b.down(ldw, rdw.size()), rdw, "layernorm_bwd dw");
  // cross-entropy: fp32 losses exactly as the fp32 loop computes them from the widened logits; probs in place.
  const int V = 7;
  const auto logits = to_bf16_vec(random_floats(N * V, 9));
  std::vector<std::int32_t> tg = {0, 6, 3, 2, 5, 1};
  Buffer tgt = b.dev->alloc(N * 4), losses = b.dev->alloc(N * 4);
  b.dev->copy_h2d(*b.s, tgt.data(), tg.data(), N * 4);
  Bf16* probs = b.up(logits);
  ops.crossentropy_fwd(losses.as<float>(), probs, probs, tgt.as<std::int32_t>(), N, V);
  std::vector<float> rl(N), rp(N * V), got_l(N);
  const auto fl = widened(logits);
  cpu::crossentropy_fwd<float>(rl.data(), rp.data(), fl.data(), tg.data(), N, V);
  b.dev->copy_d2h(*b.s, got_l.data(), losses.data(), N * 4);
  b.s->synchronize();
  CHECK(got_l == rl);
  check_rounded(b.down(probs, rp.size()), rp, "crossentropy_fwd probs");
  // GELU backward in place (din aliases dout).
  const auto gx = to_bf16_vec(random_floats(64, 10)), gd0 = to_bf16_vec(random_floats(64, 11));
  Bf16* gdd = b.up(gd0);
  ops.gelu_bwd(gdd, b.up(gx), gdd, 64);
  std::vector<float> rg(64);
  const auto fgx = widened(gx), fgd = widened(gd0);
  cpu::gelu_bwd<float>(rg.data(), fgx.data(), fgd.data(), 64);
  check_rounded(b.down(gdd, 64), rg, "gelu_bwd");
}

namespace {

// A device without bf16 kernels (as the CUDA device is today): the CPU device with bf16_kernels() null.
class NoBf16Device final : public Device {
 public:
  NoBf16Device() : inner_(cpu::make_cpu_device(7, {.capacity = 4 * kMiB})), name_("gpu:7") {}
  const std::string& name() const override { return name_; }
  int index() const override { return 7; }
  Buffer alloc(Bytes bytes, std::string_view label) override { return inner_->alloc(bytes, label); }
  MemoryStats memory() const override { return inner_->memory(); }
  void reset_peak() override { inner_->reset_peak(); }
  std::unique_ptr<Stream> create_stream(std::string name) override { return inner_->create_stream(std::move(name)); }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }
  void synchronize() override { inner_->synchronize(); }
  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override { inner_->copy_h2d(s, dst, src, bytes); }
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override { inner_->copy_d2h(s, dst, src, bytes); }
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override {
    inner_->copy_d2d(s, dst, src, bytes, dst_device);
  }
  void fill_zero(Stream& s, void* dst, Bytes bytes) override { inner_->fill_zero(s, dst, bytes); }
  Kernels<float>& kernels() override { return inner_->kernels(); }

 private:
  std::unique_ptr<Device> inner_;
  std::string name_;
};

}  // namespace

TEST_CASE("a device without bf16 kernels is refused by name when bf16 is set up") {
  auto cpu_dev = cpu::make_cpu_device(0, {.capacity = kMiB});
  CHECK(cpu_dev->bf16_kernels() != nullptr);
  CHECK(&require_bf16(*cpu_dev, "trainer") == cpu_dev->bf16_kernels());
  NoBf16Device dev;
  CHECK(dev.bf16_kernels() == nullptr);
  CHECK_THROWS_WITH_AS(require_bf16(dev, "trainer"), "gpu:7: trainer: bf16 not supported on gpu yet (use dtype fp32)",
                       DeviceError);
  auto s = dev.create_stream("s");
  CHECK_THROWS_AS(DeviceOpsBf16(dev, *s), DeviceError);
  DeviceOps fp32(dev, *s);  // fp32 still works on it
  CHECK(&fp32.device() == &dev);
}
