// Tests of what only the CUDA device has, beside the CPU reference device: its modes (tree column sums, the bf16 fast
// path against the exact bf16 kernels, the fused kernels against the unfused ones, TF32, the attention's workspace
// chunks, HARMONY_SYNC_DEBUG), the Llama family's kernels in each mode against the CPU device's (fp32, bf16,
// grouped-query shapes), logical devices sharing a GPU, NCCL on 2+ GPUs, and training steps of the plain trainer and of
// Harmony-PP and Harmony-DP Programs through the Executor. The Device contract itself (every kernel, copy, stream,
// event and collective against the CPU device, with derived bounds) is the conformance suite's, which covers the CUDA
// device through the registry (test_device_conformance*.cpp). Host-only cases (the arena's bookkeeping, the
// pinned-memory pre-flight) always run; without a usable GPU the binary then exits 77, which Meson reports as SKIP.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/cuda/cuda_arena.hpp"
#include "backend/cuda/cuda_device.hpp"
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/safetensors.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"
#include "core/program/lower.hpp"

using namespace harmony::backend;
using harmony::core::kKiB;
using harmony::core::kMiB;
namespace core = harmony::core;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |got - want| <= atol + rtol * |want| everywhere (NaN fails); reports the element furthest past its bound (the one
// that fails, not merely the largest difference) and how many fail.
void check_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double atol,
                 double rtol) {
  REQUIRE(got.size() == want.size());
  double worst = -std::numeric_limits<double>::infinity();
  std::size_t at = 0, failing = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    const double excess = d - (atol + rtol * std::abs(double(want[i])));
    if (!(excess <= 0)) ++failing;
    if (!(excess <= worst)) {  // NaN counts as worst
      worst = excess;
      at = i;
    }
  }
  INFO(std::string(what) << ": " << failing << " of " << got.size() << " outside the bound; worst at " << at
                         << ": cuda " << got[at] << ", cpu " << want[at] << ", |diff| "
                         << std::abs(double(got[at]) - double(want[at])) << ", bound " << atol << " + " << rtol
                         << "|cpu|");
  CHECK(failing == 0);
}

// The same buffers on a CPU device and on a CUDA device, filled from host vectors, read back after running.
// up() waits for its copies: the host vector it copies from may be a temporary that dies when up() returns
// (both devices copy asynchronously, in stream order).
struct Twin {
  std::unique_ptr<Device> cpu, gpu;
  std::unique_ptr<Stream> cs, gs;
  explicit Twin(const cuda::CudaDeviceOptions& o = {.capacity = 256 * kMiB}) {
    cpu = cpu::make_cpu_device(0, {.capacity = 256 * kMiB, .poison = true});
    gpu = cuda::make_cuda_device(0, o);
    cs = cpu->create_stream("cpu");
    gs = gpu->create_stream("cuda");
  }
  struct Buf {
    Buffer c, g;
    std::size_t floats = 0;
    float* cf() const { return c.as<float>(); }
    float* gf() const { return g.as<float>(); }
  };
  template <class T>
  Buf up(const std::vector<T>& host) {
    static_assert(sizeof(T) == 4);
    const auto bytes = static_cast<Bytes>(host.size() * 4);
    Buf b{cpu->alloc(bytes), gpu->alloc(bytes), host.size()};
    cpu->copy_h2d(*cs, b.c.data(), host.data(), bytes);
    gpu->copy_h2d(*gs, b.g.data(), host.data(), bytes);
    sync();  // `host` must outlive both copies
    return b;
  }
  Buf empty(std::size_t floats) { return up(std::vector<float>(floats, 0.0f)); }
  void sync() {
    cs->synchronize();
    gs->synchronize();
  }
  // (cuda, cpu) contents.
  std::pair<std::vector<float>, std::vector<float>> down(const Buf& b) {
    std::vector<float> g(b.floats), c(b.floats);
    gpu->copy_d2h(*gs, g.data(), b.g.data(), static_cast<Bytes>(b.floats * 4));
    cpu->copy_d2h(*cs, c.data(), b.c.data(), static_cast<Bytes>(b.floats * 4));
    sync();
    return {g, c};
  }
  void close(const char* what, const Buf& b, double atol, double rtol) {
    auto [g, c] = down(b);
    check_close(what, g, c, atol, rtol);
  }
  void exact(const char* what, const Buf& b) {
    auto [g, c] = down(b);
    INFO(what);
    CHECK(same_bits(g, c));
  }

  // bf16 tensors: the host values rounded to nearest even (to_bf16) and uploaded as 2-byte elements to both
  // devices; read back widened (exactly) to fp32.
  struct Buf16 {
    Buffer c, g;
    std::size_t n = 0;
    Bf16* cb() const { return c.as<Bf16>(); }
    Bf16* gb() const { return g.as<Bf16>(); }
  };
  Buf16 up16(const std::vector<float>& host) {
    std::vector<Bf16> h(host.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(host[i]);
    const auto bytes = static_cast<Bytes>(h.size() * sizeof(Bf16));
    Buf16 b{cpu->alloc(bytes), gpu->alloc(bytes), h.size()};
    cpu->copy_h2d(*cs, b.c.data(), h.data(), bytes);
    gpu->copy_h2d(*gs, b.g.data(), h.data(), bytes);
    sync();
    return b;
  }
  Buf16 empty16(std::size_t n) { return up16(std::vector<float>(n, 0.0f)); }
  std::pair<std::vector<float>, std::vector<float>> down16(const Buf16& b) {
    std::vector<Bf16> g(b.n), c(b.n);
    const auto bytes = static_cast<Bytes>(b.n * sizeof(Bf16));
    gpu->copy_d2h(*gs, g.data(), b.g.data(), bytes);
    cpu->copy_d2h(*cs, c.data(), b.c.data(), bytes);
    sync();
    std::vector<float> gf(b.n), cf(b.n);
    for (std::size_t i = 0; i < b.n; ++i) {
      gf[i] = to_f32(g[i]);
      cf[i] = to_f32(c[i]);
    }
    return {gf, cf};
  }
  void close16(const char* what, const Buf16& b, double atol, double rtol) {
    auto [g, c] = down16(b);
    check_close(what, g, c, atol, rtol);
  }
  Kernels<Bf16>& gk16() { return require_bf16(*gpu, "test"); }
  Kernels<Bf16>& ck16() { return require_bf16(*cpu, "test"); }
};

std::string data_dir() {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/gpt2_tiny/";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Host-only: no GPU needed (run in CI).

TEST_SUITE("host") {
  TEST_CASE("cuda arena: capacity, out-of-memory message, fragmentation and coalescing") {
    int freed = 0;
    void* fake = reinterpret_cast<void*>(std::uintptr_t{1} << 40);  // never dereferenced
    {
      auto arena = std::make_shared<cuda::CudaArena>("cuda:3", fake, 1 * kMiB + 100, [&](void* p) {
        CHECK(p == fake);
        ++freed;
      });
      CHECK(arena->capacity() == 1 * kMiB);
      void* a = arena->allocate(512 * kKiB, "W L1-4");
      CHECK(a == fake);
      CHECK(arena->contains(a, 512 * kKiB));
      CHECK_FALSE(arena->contains(a, 512 * kKiB + 1));
      CHECK(arena->in_block(static_cast<char*>(a) + 700 * kKiB));
      CHECK_FALSE(arena->in_block(static_cast<char*>(a) + 1 * kMiB));
      try {
        (void)arena->allocate(768 * kKiB, "act L5 mb0");
        FAIL("expected OutOfMemory");
      } catch (const OutOfMemory& e) {
        CHECK(std::string(e.what()) ==
              "cuda:3: out of memory allocating 'act L5 mb0' (768.00 KiB): 512.00 KiB of 1.00 MiB in use, largest free "
              "block 512.00 KiB");
      }
      void* b = arena->allocate(256 * kKiB, "");
      void* c = arena->allocate(256 * kKiB, "");
      CHECK(arena->stats().live_allocations == 3);
      arena->release(a);
      arena->release(c);
      CHECK(arena->stats().largest_free == 512 * kKiB);
      CHECK_THROWS_WITH_AS((void)arena->allocate(768 * kKiB, "big"), doctest::Contains("fragmented"), OutOfMemory);
      arena->release(b);  // everything coalesces again
      CHECK(arena->stats().largest_free == 1 * kMiB);
      CHECK(arena->stats().peak == 1 * kMiB);
      arena->reset_peak();
      CHECK(arena->stats().peak == 0);
      void* small = arena->allocate(1, "");
      CHECK(arena->allocation_bytes(small) == 256);
      CHECK(arena->allocate(0, "") == nullptr);
      arena->release(small);
      CHECK(freed == 0);
    }
    CHECK(freed == 1);  // the block is returned when the arena goes
  }

  TEST_CASE("pinned-memory pre-flight names what is needed and what is available") {
    const cuda::HostMemory m = cuda::host_memory();
    CHECK(m.total > 0);
    CHECK(m.available <= m.total);
    CHECK_NOTHROW(cuda::check_pinned_budget(1 * kMiB, "a test"));
    CHECK_THROWS_WITH_AS(cuda::check_pinned_budget(m.total * 4, "the stash buffers"),
                         doctest::Contains("needed for the stash buffers"), DeviceError);
    CHECK_THROWS_WITH_AS(cuda::check_pinned_budget(m.total * 4, "x"), doctest::Contains("available"), DeviceError);
    CHECK_THROWS_WITH_AS(cuda::check_pinned_budget(2 * kMiB, "x", 1 * kMiB), doctest::Contains("limit of 1.00 MiB"),
                         DeviceError);
  }

  TEST_CASE("availability is consistent, and without a GPU devices fail with the reason") {
    CHECK(cuda::cuda_available() == (cuda::cuda_device_count() > 0));
    CHECK(cuda::cuda_available() == cuda::cuda_unavailable_reason().empty());
    if (!cuda::cuda_available()) {
      MESSAGE("no usable GPU: " << cuda::cuda_unavailable_reason());
      CHECK_THROWS_WITH_AS(cuda::make_cuda_device(0, {.capacity = 1 * kMiB}), doctest::Contains("no usable CUDA GPU"),
                           DeviceError);
    }
  }

  TEST_CASE("HARMONY_SYNC_DEBUG parsing") {
    ::setenv("HARMONY_SYNC_DEBUG", "1", 1);
    CHECK(cuda::sync_debug_from_environment());
    ::setenv("HARMONY_SYNC_DEBUG", "0", 1);
    CHECK_FALSE(cuda::sync_debug_from_environment());
    ::unsetenv("HARMONY_SYNC_DEBUG");
    CHECK_FALSE(cuda::sync_debug_from_environment());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// On a GPU.

TEST_SUITE("gpu") {
  // The Device contract (memory, copies, streams, events, kernels, collectives) is the conformance suite's
  // (test_device_conformance*.cpp, run on every registered kind); here what only the CUDA device has.
  TEST_CASE("device: the GPU, a cap beyond its free memory, logical devices sharing it") {
    const cuda::GpuInfo info = cuda::gpu_info(0);
    MESSAGE("GPU 0: " << info.name << " sm_" << info.compute_major << info.compute_minor << ", " << info.multiprocessors
                      << " SMs, " << core::format_bytes(info.total_memory));
    auto dev = cuda::make_cuda_device(0, {.capacity = 1 * kMiB});
    CHECK(dev->name() == "cuda:0");
    // A cap beyond the GPU's free memory is refused with both numbers.
    CHECK_THROWS_WITH_AS(cuda::make_cuda_device(0, {.capacity = info.total_memory * 2}),
                         doctest::Contains("exceeds GPU 0's free memory"), DeviceError);
    // Several logical devices share GPU 0, each with its own block.
    auto other = cuda::make_cuda_device(5, {.gpu = 0, .capacity = 1 * kMiB});
    CHECK(other->name() == "cuda:5@gpu0");
    // Events of another device type are refused.
    auto s = dev->create_stream("s");
    auto cpu_dev = cpu::make_cpu_device(0, {.capacity = 1 * kMiB});
    auto cpu_event = cpu_dev->create_event();
    CHECK_THROWS_AS(s->record(*cpu_event), DeviceError);
  }

  TEST_CASE("kernel error reports surface on the stream whose kernel made them, once") {
    // Each stream has its own error record: a bad id on stream b is b's error, never a's, and is thrown once.
    auto dev = cuda::make_cuda_device(0, {.capacity = 16 * kMiB});
    auto a = dev->create_stream("a"), b = dev->create_stream("b");
    constexpr int B = 2, T = 4, C = 8, V = 5;
    std::vector<std::int32_t> good(B * T, 1), bad(B * T, 1);
    bad[5] = 9;  // (b=1, t=1)
    std::vector<float> table(static_cast<std::size_t>(V * C), 0.5f), pos(static_cast<std::size_t>(T * C), 0.25f);
    Buffer ig = dev->alloc(B * T * 4), ib = dev->alloc(B * T * 4), wte = dev->alloc(V * C * 4),
           wpe = dev->alloc(T * C * 4), oa = dev->alloc(B * T * C * 4), ob = dev->alloc(B * T * C * 4);
    dev->copy_h2d(*a, ig.data(), good.data(), B * T * 4);
    dev->copy_h2d(*a, ib.data(), bad.data(), B * T * 4);
    dev->copy_h2d(*a, wte.data(), table.data(), V * C * 4);
    dev->copy_h2d(*a, wpe.data(), pos.data(), T * C * 4);
    a->synchronize();
    for (int rep = 0; rep < 3; ++rep) {
      CAPTURE(rep);
      dev->kernels().embedding_fwd(*b, ob.as<float>(), ib.as<std::int32_t>(), wte.as<float>(), wpe.as<float>(), B, T, C,
                                   V);
      dev->kernels().embedding_fwd(*a, oa.as<float>(), ig.as<std::int32_t>(), wte.as<float>(), wpe.as<float>(), B, T, C,
                                   V);
      a->synchronize();  // a's kernel ran after b's report: the report is not a's
      CHECK_THROWS_WITH_AS(b->synchronize(),
                           doctest::Contains("token id 9 at (b=1, t=1) is outside the vocabulary [0, 5) (stream 'b')"),
                           DeviceError);
      CHECK_NOTHROW(b->synchronize());  // once
      CHECK_NOTHROW(dev->synchronize());
    }
    // Reported on b, then the device's synchronize (every stream) finds it once, still named b's.
    dev->kernels().embedding_fwd(*b, ob.as<float>(), ib.as<std::int32_t>(), wte.as<float>(), wpe.as<float>(), B, T, C,
                                 V);
    CHECK_THROWS_WITH_AS(dev->synchronize(), doctest::Contains("(stream 'b')"), DeviceError);
    CHECK_NOTHROW(dev->synchronize());
    CHECK_NOTHROW(a->synchronize());
    CHECK_NOTHROW(b->synchronize());
  }

  TEST_CASE("HARMONY_SYNC_DEBUG: synchronizing after every operation changes no result") {
    Twin t({.capacity = 64 * kMiB, .sync_debug = true});
    const auto a = random_floats(1000, 1), b = random_floats(1000, 2);
    auto x = t.up(a), y = t.up(b), z = t.empty(1000);
    t.gpu->kernels().add(*t.gs, z.gf(), x.gf(), y.gf(), 1000);
    t.cpu->kernels().add(*t.cs, z.cf(), x.cf(), y.cf(), 1000);
    t.exact("add", z);
  }

  // The CUDA device's own modes, beside the CPU device (the default mode's bounds: the conformance suite).
  // Tolerances |cuda - cpu| <= atol + rtol |cpu| with inputs in [-1, 1]: the sums run in other orders (warp trees,
  // cuBLAS's blocking: errors ~sqrt(K) ulp of the terms, so atol scales with sqrt(K) at 1e-5) and expf is CUDA's
  // (2 ulp): a wrong index or transposition is O(1) off.
  TEST_CASE("kernels: tree column sums (tree_sums) agree with the CPU's row order and are deterministic") {
    Twin t({.capacity = 256 * kMiB, .tree_sums = true});
    // N = 1000 rows: 32 parts of 31-32 rows (index.hpp); C = 777 is not a multiple of the 32-column tile.
    for (const int N : {1, 67, 1000}) {
      const int C = 777;
      INFO("N " << N);
      auto in = t.up(random_floats(N * C, 91, 2.0f)), w = t.up(random_floats(C, 92)), b = t.up(random_floats(C, 93));
      auto out = t.empty(N * C), mean = t.empty(N), rstd = t.empty(N);
      t.cpu->kernels().layernorm_fwd(*t.cs, out.cf(), mean.cf(), rstd.cf(), in.cf(), w.cf(), b.cf(), N, C, 1e-5f);
      auto [gm, cm] = t.down(mean);
      auto [gr, cr] = t.down(rstd);
      auto m2 = t.up(cm), r2 = t.up(cr);
      auto dout = t.up(random_floats(N * C, 94));
      auto din = t.up(random_floats(N * C, 95));
      const auto dw0 = random_floats(C, 96), db0 = random_floats(C, 97);
      std::vector<float> first_dw;
      for (int rep = 0; rep < 2; ++rep) {
        auto dw = t.up(dw0), db = t.up(db0);
        t.gpu->kernels().layernorm_bwd(*t.gs, din.gf(), dw.gf(), db.gf(), dout.gf(), in.gf(), w.gf(), m2.gf(), r2.gf(),
                                       N, C);
        t.cpu->kernels().layernorm_bwd(*t.cs, din.cf(), dw.cf(), db.cf(), dout.cf(), in.cf(), w.cf(), m2.cf(), r2.cf(),
                                       N, C);
        // Sums of N terms of size <= ~2 in another order: each partial sum rounds (<= 2^-24 relative).
        t.close("layernorm_bwd dw (tree)", dw, 2e-7 * N + 1e-6, 1e-5);
        t.close("layernorm_bwd db (tree)", db, 2e-7 * N + 1e-6, 1e-5);
        auto [g, c] = t.down(dw);
        if (rep == 0) first_dw = g;
        CHECK(same_bits(g, first_dw));  // run to run
      }
      auto dbias = t.up(db0);
      t.gpu->kernels().matmul_bwd(*t.gs, nullptr, din.gf(), dbias.gf(), dout.gf(), in.gf(), in.gf(), N, 1, C,
                                  WeightLayout::InOut);
      t.cpu->kernels().matmul_bwd(*t.cs, nullptr, din.cf(), dbias.cf(), dout.cf(), in.cf(), in.cf(), N, 1, C,
                                  WeightLayout::InOut);
      t.close("matmul_bwd dbias (tree)", dbias, 2e-7 * N + 1e-6, 1e-5);
    }
  }

  TEST_CASE("kernels: matmul with TF32 stays within TF32's precision") {
    Twin t({.capacity = 64 * kMiB, .tf32 = true});
    const int N = 64, IC = 256, OC = 128;
    auto in = t.up(random_floats(N * IC, 41)), w = t.up(random_floats(IC * OC, 42));
    auto out = t.empty(N * OC);
    t.gpu->kernels().matmul_fwd(*t.gs, out.gf(), in.gf(), w.gf(), nullptr, N, IC, OC, WeightLayout::InOut);
    t.cpu->kernels().matmul_fwd(*t.cs, out.cf(), in.cf(), w.cf(), nullptr, N, IC, OC, WeightLayout::InOut);
    // TF32 keeps 10 mantissa bits of each operand (relative error 2^-11 per product): |error| <= ~1e-3 sqrt(K).
    t.close("matmul_fwd tf32", out, 2e-3 * std::sqrt(double(IC)), 1e-3);
  }

  TEST_CASE("kernels: causal attention forward and backward in workspace chunks of one (b, h) pair") {
    struct Shape {
      int B, T, C, H;
    };
    for (const Shape sh : {Shape{2, 19, 48, 4}, Shape{1, 70, 64, 2}, Shape{3, 8, 24, 3}}) {
      for (Bytes workspace : {Bytes(1)}) {  // 1 byte: one (b, h) pair per chunk (the default: the conformance suite)
        INFO("B " << sh.B << " T " << sh.T << " C " << sh.C << " H " << sh.H << ", workspace " << workspace);
        Twin t({.capacity = 64 * kMiB, .attention_workspace = workspace});
        const int B = sh.B, T = sh.T, C = sh.C, H = sh.H;
        auto qkv = t.up(random_floats(B * T * 3 * C, 51));
        auto out = t.empty(B * T * C), att = t.up(random_floats(B * H * T * T, 52));  // att fully overwritten
        t.gpu->kernels().attention_fwd(*t.gs, out.gf(), att.gf(), qkv.gf(), B, T, C, H);
        t.cpu->kernels().attention_fwd(*t.cs, out.cf(), att.cf(), qkv.cf(), B, T, C, H);
        t.close("attention_fwd out", out, 1e-5, 1e-4);
        t.close("attention_fwd att", att, 1e-6, 1e-4);
        {
          auto [g, c] = t.down(att);
          bool zeros = true;
          for (std::size_t i = 0; i < g.size(); ++i) {
            const auto t1 = static_cast<int>((i / T) % T), t2 = static_cast<int>(i % T);
            if (t2 > t1 && g[i] != 0.0f) zeros = false;
          }
          CHECK(zeros);
        }
        auto dout = t.up(random_floats(B * T * C, 53));
        auto dqkv = t.up(random_floats(B * T * 3 * C, 54));  // written, not accumulated
        t.gpu->kernels().attention_bwd(*t.gs, dqkv.gf(), dout.gf(), qkv.gf(), att.gf(), B, T, C, H);
        t.cpu->kernels().attention_bwd(*t.cs, dqkv.cf(), dout.cf(), qkv.cf(), att.cf(), B, T, C, H);
        t.close("attention_bwd dqkv", dqkv, 1e-5 * std::sqrt(double(T)), 1e-4);
      }
    }
  }

  // bf16 kernels against the CPU device's bf16 kernels, on the same bf16 inputs. Both widen the inputs exactly, compute
  // in fp32 and round each output once to nearest even, so the fp32 values differ as in the fp32 tests above (same
  // atol + rtol |cpu|: summation order, CUDA's expf/tanhf) and then each side rounds. Where a rounding boundary falls
  // between the two fp32 values the stored results differ by one bf16 ulp: with 8 significant bits an ulp is at most
  // 2^-7 |v| (2^-8 |v| just below the next power of two), so kFlip = 2^-7 relative is added to every non-exact bound
  // (|round(a) - round(b)| <= |a - b| + 1 ulp). Exact where both sides do the same fp32 operations in the same order
  // (embedding gathers and scatter-adds, the residual add, the bias and LayerNorm parameter gradients given the same
  // statistics, the cross-entropy backward).
  constexpr double kFlip = 1.0 / 128;

  TEST_CASE("bf16 kernels: LayerNorm with tree column sums (tree_sums)") {
    Twin t({.capacity = 256 * kMiB, .tree_sums = true});
    for (int C : {40, 777}) {
      const int N = 1000;
      INFO("C " << C);
      auto in = t.up16(random_floats(N * C, 21, 2.0f));
      auto w = t.up16(random_floats(C, 22)), b = t.up16(random_floats(C, 23));
      auto out = t.empty16(N * C);
      auto mean = t.empty(N), rstd = t.empty(N);  // the statistics: fp32 for bf16 too
      t.ck16().layernorm_fwd(*t.cs, out.cb(), mean.cf(), rstd.cf(), in.cb(), w.cb(), b.cb(), N, C, 1e-5f);
      // The backward on the CPU's statistics for both.
      auto [gm, cm] = t.down(mean);
      auto [gr, cr] = t.down(rstd);
      auto m2 = t.up(cm), r2 = t.up(cr);
      auto dout = t.up16(random_floats(N * C, 24));
      auto din = t.up16(random_floats(N * C, 25)), dw = t.up16(random_floats(C, 26)), db = t.up16(random_floats(C, 27));
      t.gk16().layernorm_bwd(*t.gs, din.gb(), dw.gb(), db.gb(), dout.gb(), in.gb(), w.gb(), m2.gf(), r2.gf(), N, C);
      t.ck16().layernorm_bwd(*t.cs, din.cb(), dw.cb(), db.cb(), dout.cb(), in.cb(), w.cb(), m2.cf(), r2.cf(), N, C);
      t.close16("bf16 layernorm_bwd din (accumulated)", din, 1e-5 * std::sqrt(double(C)), 1e-4 + kFlip);
      // the tree's order: as the fp32 tree test, plus the flip
      t.close16("bf16 layernorm_bwd dw (tree)", dw, 2e-7 * N + 1e-6, 1e-5 + kFlip);
      t.close16("bf16 layernorm_bwd db (tree)", db, 2e-7 * N + 1e-6, 1e-5 + kFlip);
    }
  }

  // The bf16 column sums: by default (bf16_exact off) the tree, the same bits as tree_sums on the exact kernels; with
  // bf16_exact the CPU's row order, the same bits as the CPU device given the same statistics. Fails if the default
  // still ran the row order (its bits then differ from the tree's: C = 777 columns of N = 1000 rows of sums).
  TEST_CASE("bf16 kernels: column sums by the tree by default, in the CPU's row order with bf16_exact") {
    const int N = 1000, C = 777;
    struct Grads {
      std::vector<float> dw, db, dbias, cpu_dw, cpu_db, cpu_dbias;
    };
    const auto run = [&](const cuda::CudaDeviceOptions& o) {
      Twin t(o);
      auto in = t.up16(random_floats(N * C, 21, 2.0f));
      auto w = t.up16(random_floats(C, 22)), b = t.up16(random_floats(C, 23));
      auto out = t.empty16(N * C);
      auto mean = t.empty(N), rstd = t.empty(N);  // the statistics: fp32 for bf16 too
      t.ck16().layernorm_fwd(*t.cs, out.cb(), mean.cf(), rstd.cf(), in.cb(), w.cb(), b.cb(), N, C, 1e-5f);
      auto [gm, cm] = t.down(mean);
      auto [gr, cr] = t.down(rstd);
      auto m2 = t.up(cm), r2 = t.up(cr);  // the CPU's statistics for both
      // Column 0 of dout: 2^24, then N - 2 ones, then -2^24. In row order every 1 is absorbed (2^24 + 1 rounds to
      // 2^24) and the column sums to 0; any tree adds the ones of the middle parts among themselves: ~N.
      auto dout_host = random_floats(N * C, 24);
      for (int r = 0; r < N; ++r)
        dout_host[static_cast<std::size_t>(r) * C] = r == 0 ? 0x1p24f : r == N - 1 ? -0x1p24f : 1.0f;
      auto dout = t.up16(dout_host);
      auto db_host = random_floats(C, 27), dbias_host = random_floats(C, 28);
      db_host[0] = dbias_host[0] = 0.0f;
      auto din = t.up16(random_floats(N * C, 25)), dw = t.up16(random_floats(C, 26)), db = t.up16(db_host);
      t.gk16().layernorm_bwd(*t.gs, din.gb(), dw.gb(), db.gb(), dout.gb(), in.gb(), w.gb(), m2.gf(), r2.gf(), N, C);
      t.ck16().layernorm_bwd(*t.cs, din.cb(), dw.cb(), db.cb(), dout.cb(), in.cb(), w.cb(), m2.cf(), r2.cf(), N, C);
      auto dbias = t.up16(dbias_host), wide = t.up16(random_floats(C, 29));
      t.gk16().matmul_bwd(*t.gs, nullptr, wide.gb(), dbias.gb(), dout.gb(), in.gb(), in.gb(), N, 1, C,
                          WeightLayout::InOut);
      t.ck16().matmul_bwd(*t.cs, nullptr, wide.cb(), dbias.cb(), dout.cb(), in.cb(), in.cb(), N, 1, C,
                          WeightLayout::InOut);
      Grads g;
      std::tie(g.dw, g.cpu_dw) = t.down16(dw);
      std::tie(g.db, g.cpu_db) = t.down16(db);
      std::tie(g.dbias, g.cpu_dbias) = t.down16(dbias);
      return g;
    };
    // fused_epilogues off: with it, a biased matmul_bwd sums its bias gradient in cuBLASLt's epilogue, not by the tree
    // ("matmul_bwd with cuBLASLt's bias-gradient epilogue" below)
    const Grads fast = run({.capacity = 256 * kMiB, .fused_epilogues = false});
    const Grads tree = run({.capacity = 256 * kMiB, .tree_sums = true, .bf16_exact = true});
    const Grads exact = run({.capacity = 256 * kMiB, .bf16_exact = true});
    CHECK(same_bits(fast.dw, tree.dw));
    CHECK(same_bits(fast.db, tree.db));
    CHECK(same_bits(fast.dbias, tree.dbias));
    CHECK(same_bits(exact.dw, exact.cpu_dw));
    CHECK(same_bits(exact.db, exact.cpu_db));
    CHECK(same_bits(exact.dbias, exact.cpu_dbias));
    // Column 0 tells the orders apart: 0 in row order (the CPU's too), about N - 2 by the tree.
    CHECK(exact.db[0] == 0.0f);
    CHECK(exact.dbias[0] == 0.0f);
    CHECK(fast.db[0] > N / 2);
    CHECK(fast.dbias[0] > N / 2);
  }

  TEST_CASE("bf16 kernels: causal attention forward and backward in workspace chunks of one (b, h) pair") {
    struct Shape {
      int B, T, C, H;
    };
    for (const Shape sh : {Shape{2, 19, 48, 4}, Shape{1, 70, 64, 2}, Shape{3, 8, 24, 3}}) {
      for (Bytes workspace : {Bytes(1)}) {  // 1 byte: one (b, h) pair per chunk (the default: the conformance suite)
        INFO("B " << sh.B << " T " << sh.T << " C " << sh.C << " H " << sh.H << ", workspace " << workspace);
        Twin t({.capacity = 64 * kMiB, .bf16_exact = true, .attention_workspace = workspace});
        const int B = sh.B, T = sh.T, C = sh.C, H = sh.H;
        auto qkv = t.up16(random_floats(B * T * 3 * C, 51));
        auto out = t.empty16(B * T * C), att = t.up16(random_floats(B * H * T * T, 52));  // att fully overwritten
        t.gk16().attention_fwd(*t.gs, out.gb(), att.gb(), qkv.gb(), B, T, C, H);
        t.ck16().attention_fwd(*t.cs, out.cb(), att.cb(), qkv.cb(), B, T, C, H);
        // out multiplies the fp32 probabilities on both devices (not the rounded att): only its own rounding flips.
        t.close16("bf16 attention_fwd out", out, 1e-5, 1e-4 + kFlip);
        t.close16("bf16 attention_fwd att", att, 1e-6, 1e-4 + kFlip);
        {
          auto [g, c] = t.down16(att);
          bool zeros = true;
          for (std::size_t i = 0; i < g.size(); ++i) {
            const auto t1 = static_cast<int>((i / T) % T), t2 = static_cast<int>(i % T);
            if (t2 > t1 && g[i] != 0.0f) zeros = false;
          }
          CHECK(zeros);
        }
        // The backward on the CPU's stored probabilities for both.
        auto [ga, ca] = t.down16(att);
        auto att2 = t.up16(ca);
        auto dout = t.up16(random_floats(B * T * C, 53));
        auto dqkv = t.up16(random_floats(B * T * 3 * C, 54));  // written, not accumulated
        t.gk16().attention_bwd(*t.gs, dqkv.gb(), dout.gb(), qkv.gb(), att2.gb(), B, T, C, H);
        t.ck16().attention_bwd(*t.cs, dqkv.cb(), dout.cb(), qkv.cb(), att2.cb(), B, T, C, H);
        t.close16("bf16 attention_bwd dqkv", dqkv, 1e-5 * std::sqrt(double(T)), 1e-4 + kFlip);
      }
    }
  }

  // The bf16 fast attention (the default; bf16_exact off) against the exact bf16 path (bf16_exact) on the same GPU
  // and seeded bf16 inputs, qkv and dout in [-1, 1], head size hs. u = 2^-8 is bf16's unit roundoff (8 significant
  // bits: one rounding to nearest errs by at most u relative). Where the fast path rounds and the exact one does not:
  //   forward: each score s = q.k (|s| <= hs) is stored in bf16 before the softmax, so each logit s / sqrt(hs) moves
  //   by at most d = u sqrt(hs); a softmax moves by at most e^(2d) - 1 =: E relative when every logit moves by <= d.
  //   Both paths round their probabilities once (u each): att within (E + u (2 + E)) p, p <= att / (1 - u).
  //   out = sum p v (|v| <= 1, sum p = 1) multiplies the fast path's rounded probabilities: within E + u (1 + E)
  //   before both outputs' own rounding (kFlip relative, as the CPU comparisons above).
  //   backward (both on the exact path's probabilities): dp = dout.v (|dp| <= M, the largest |dp|, computed here on
  //   the host) is rounded (u M), which moves sum(p dp) by <= u M too; dscore = p (dp - sum p dp) / sqrt(hs) is
  //   then off by <= 2u p M / sqrt(hs) and rounded (<= u p 2M / sqrt(hs) more): 4u p M / sqrt(hs). dQ sums
  //   dscore k over t2 (sum p = 1): 4u M / sqrt(hs); dK sums dscore q over t: times A, the largest column sum of p
  //   (measured); dV = att^T dout is the same GEMM on both paths. Plus the fp32 sum-order terms of the tests above
  //   (1e-5 sqrt(T) absolute, 1e-4 relative), a 1% margin for the second-order terms, and kFlip for the final
  //   roundings. A wrong index, stride or transposition is O(1) off.
  TEST_CASE("bf16 kernels: the fast attention (bf16 GEMMs, fused softmax) tracks the exact path within bf16 rounding") {
    struct Shape {
      int B, T, C, H;
    };
    constexpr double u = 1.0 / 256;
    for (const Shape sh : {Shape{2, 19, 48, 4}, Shape{1, 70, 64, 2}, Shape{3, 8, 24, 3}, Shape{2, 64, 128, 2}}) {
      for (Bytes workspace : {Bytes(1), Bytes(64) * kMiB}) {  // one (b, h) pair per chunk, or every head at once
        const int B = sh.B, T = sh.T, C = sh.C, H = sh.H, hs = C / H;
        INFO("B " << B << " T " << T << " C " << C << " H " << H << ", workspace " << workspace);
        const auto qkv_host = random_floats(B * T * 3 * C, 51), dout_host = random_floats(B * T * C, 53);
        struct Result {
          std::vector<float> att, att_again, out, dqkv;
        };
        const auto run = [&](const cuda::CudaDeviceOptions& o, const std::vector<float>* bwd_att) {
          Twin t(o);
          auto qkv = t.up16(qkv_host);
          auto out = t.empty16(B * T * C), att = t.up16(random_floats(B * H * T * T, 52));  // fully overwritten
          Result r;
          t.gk16().attention_fwd(*t.gs, out.gb(), att.gb(), qkv.gb(), B, T, C, H);
          r.att = t.down16(att).first;
          r.out = t.down16(out).first;
          t.gk16().attention_fwd(*t.gs, out.gb(), att.gb(), qkv.gb(), B, T, C, H);
          r.att_again = t.down16(att).first;
          auto att_in = t.up16(bwd_att != nullptr ? *bwd_att : r.att);  // bf16 values: uploaded exactly
          auto dout = t.up16(dout_host);
          auto dqkv = t.up16(random_floats(B * T * 3 * C, 54));  // written, not accumulated
          t.gk16().attention_bwd(*t.gs, dqkv.gb(), dout.gb(), qkv.gb(), att_in.gb(), B, T, C, H);
          r.dqkv = t.down16(dqkv).first;
          return r;
        };
        const Result exact =
            run({.capacity = 64 * kMiB, .bf16_exact = true, .attention_workspace = workspace}, nullptr);
        const Result fast = run({.capacity = 64 * kMiB, .attention_workspace = workspace}, &exact.att);
        CHECK(same_bits(fast.att, fast.att_again));  // deterministic run to run
        double A = 1;                                // the largest column sum of the probabilities
        std::size_t differ = 0, nonzero_above = 0;
        for (int bh = 0; bh < B * H; ++bh) {
          for (int t2 = 0; t2 < T; ++t2) {
            double col = 0;
            for (int t = 0; t < T; ++t) {
              const std::size_t i = (static_cast<std::size_t>(bh) * T + t) * T + t2;
              col += exact.att[i];
              if (t2 > t && fast.att[i] != 0.0f) ++nonzero_above;
              if (fast.att[i] != exact.att[i]) ++differ;
            }
            A = std::max(A, col);
          }
        }
        CHECK(nonzero_above == 0);
        // The fast path really ran: its bf16 scores move some of the B H T (T + 1) / 2 probabilities across a
        // rounding boundary (each with a probability of several percent): none moving means the exact path ran.
        CHECK(differ > 0);
        // M = max |dout_t . v_t2| per head, on the bf16 values both devices read.
        const auto b16 = [](float x) { return static_cast<double>(to_f32(to_bf16(x))); };
        double M = 0;
        for (int b = 0; b < B; ++b) {
          for (int h = 0; h < H; ++h) {
            for (int t = 0; t < T; ++t) {
              for (int t2 = 0; t2 < T; ++t2) {
                double dp = 0;
                for (int k = 0; k < hs; ++k) {
                  dp += b16(dout_host[(static_cast<std::size_t>(b) * T + t) * C + h * hs + k]) *
                        b16(qkv_host[(static_cast<std::size_t>(b) * T + t2) * 3 * C + 2 * C + h * hs + k]);
                }
                M = std::max(M, std::abs(dp));
              }
            }
          }
        }
        const double sqrt_hs = std::sqrt(double(hs)), E = std::expm1(2 * u * sqrt_hs);
        check_close("fast attention_fwd att", fast.att, exact.att, 1e-6, 1.01 * (E + u * (2 + E)) / (1 - u) + 1e-4);
        check_close("fast attention_fwd out", fast.out, exact.out, 1.01 * (E + u * (1 + E)) + 1e-5, 1e-4 + kFlip);
        check_close("fast attention_bwd dqkv", fast.dqkv, exact.dqkv,
                    1.01 * 4 * u * M / sqrt_hs * A + 1e-5 * std::sqrt(double(T)), 1e-4 + kFlip);
      }
    }
  }

  // The bf16 fast path's biased matmul (bias in cuBLASLt's epilogue) against the exact path (bias rows, the product in
  // fp32 scratch, one rounded add): both sum IC products and the bias in fp32 and round once, so they differ as the
  // fp32 tests above do (sum order: 1e-5 sqrt(K) absolute, 1e-4 relative) plus one bf16 flip (kFlip). Both layouts,
  // a row count of 1, an OC that is no multiple of 8, and a bias 2 bytes off 16-byte alignment (the fast path then
  // takes the exact one).
  TEST_CASE("bf16 kernels: the fast path's biased matmul (cuBLASLt bias epilogue) tracks the exact path") {
    struct Shape {
      int N, IC, OC;
    };
    for (const Shape sh : {Shape{64, 256, 128}, Shape{67, 40, 777}, Shape{1, 768, 2304}}) {
      for (const WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
        for (const int bias_offset : {0, 1}) {
          const int N = sh.N, IC = sh.IC, OC = sh.OC;
          INFO("N " << N << " IC " << IC << " OC " << OC << " layout "
                    << (layout == WeightLayout::InOut ? "InOut" : "OutIn") << " bias offset " << bias_offset);
          const auto in_h = random_floats(N * IC, 61), w_h = random_floats(IC * OC, 62),
                     b_h = random_floats(OC + 1, 63);
          const auto run = [&](const cuda::CudaDeviceOptions& o) {
            Twin t(o);
            auto in = t.up16(in_h), w = t.up16(w_h), bias = t.up16(b_h);
            auto out = t.up16(random_floats(N * OC, 64));  // overwritten
            t.gk16().matmul_fwd(*t.gs, out.gb(), in.gb(), w.gb(), bias.gb() + bias_offset, N, IC, OC, layout);
            return t.down16(out).first;
          };
          const auto exact = run({.capacity = 64 * kMiB, .bf16_exact = true});
          const auto fast = run({.capacity = 64 * kMiB});
          check_close("fast bf16 matmul_fwd with bias", fast, exact, 1e-5 * std::sqrt(double(IC)), 1e-4 + kFlip);
        }
      }
    }
  }

  // The fused MLP forward (matmul_gelu_fwd: cuBLASLt's GELU_AUX_BIAS epilogue; CudaDeviceOptions::fused_epilogues on,
  // the default) against the unfused fast path (fused_epilogues off: the bias epilogue, then the GELU kernel) on the
  // same GPU. pre: both sum IC products and the bias in fp32 and round once: the biased matmul's bound above (sum
  // order 1e-5 sqrt(IC) absolute, 1e-4 relative, plus kFlip). out: the fused path takes the GELU of the fp32 sum, the
  // unfused one the GELU of pre rounded to bf16 (relative error <= 2^-8), so they differ by |gelu'(x)| |x| 2^-8 plus a
  // flip of out: for x >= 0, gelu(x) >= x / 2 and gelu' <= 1.13, so <= 2.26 * 2^-8 |out| (rtol 0.009); for x < 0,
  // |x gelu'(x)| <= 0.2 (near x = -1.7), so <= 0.2 * 2^-8 < 8e-4 (atol 1e-3, plus the sum-order term times 1.13).
  // cuBLASLt's own GELU may evaluate tanh by the hardware's approximation (relative 2^-11): up to 0.5 X 2^-11 more,
  // X = max |pre| (where 1 + tanh cancels, x < -2, that is as large as the erf GELU's distance from the tanh one, so
  // no test here tells the two apart: docs/backend.md).
  // Where cuBLASLt is not asked (OC not a multiple of 8, a pre-activation or bias off 16-byte alignment:
  // backend/cuda/epilogue.hpp) or offers no algorithm, the fused call is the unfused one: the same bits.
  TEST_CASE("bf16 kernels: the MLP forward with cuBLASLt's GELU epilogue tracks the unfused fast path") {
    struct Shape {
      int N, IC, OC;
    };
    for (const Shape sh : {Shape{64, 256, 1024}, Shape{67, 96, 384}, Shape{1, 768, 3072}, Shape{64, 40, 777}}) {
      for (const int offset : {0, 1}) {  // 1: the bias and pre 2 bytes off 16-byte alignment: not asked
        const int N = sh.N, IC = sh.IC, OC = sh.OC;
        INFO("N " << N << " IC " << IC << " OC " << OC << " offset " << offset);
        const auto in_h = random_floats(N * IC, 71), w_h = random_floats(IC * OC, 72, 0.1f),
                   b_h = random_floats(OC + 1, 73, 0.5f);
        const auto run = [&](bool fused) {
          Twin t({.capacity = 64 * kMiB, .fused_epilogues = fused});
          auto in = t.up16(in_h), w = t.up16(w_h), bias = t.up16(b_h);
          auto pre = t.up16(random_floats(N * OC + 1, 74)), out = t.up16(random_floats(N * OC, 75));  // overwritten
          t.gk16().matmul_gelu_fwd(*t.gs, out.gb(), pre.gb() + offset, in.gb(), w.gb(), bias.gb() + offset, N, IC, OC,
                                   WeightLayout::InOut);
          auto p = t.down16(pre).first;
          p.erase(p.begin(), p.begin() + offset);
          p.resize(static_cast<std::size_t>(N) * OC);
          return std::pair{p, t.down16(out).first};
        };
        const auto [pre0, out0] = run(false);
        const std::int64_t fallbacks = cuda::cublaslt_fallbacks();
        const auto [pre1, out1] = run(true);
        if (offset == 1 || OC % 8 != 0) {  // refused: the unfused kernels
          CHECK(same_bits(pre1, pre0));
          CHECK(same_bits(out1, out0));
          continue;
        }
        check_close("fused matmul_gelu_fwd pre", pre1, pre0, 1e-5 * std::sqrt(double(IC)), 1e-4 + kFlip);
        double X = 0;
        for (const float x : pre0) X = std::max(X, double(std::abs(x)));
        check_close("fused matmul_gelu_fwd out", out1, out0,
                    1e-3 + 1.13e-5 * std::sqrt(double(IC)) + 0.5 * X * std::ldexp(1.0, -11), 0.009 + 1e-4 + kFlip);
        // The epilogue really ran on GPT-2-like shapes (every dimension a multiple of 8): cuBLASLt offering no
        // algorithm there would leave the fast path unmeasured.
        if (N % 8 == 0 && IC % 8 == 0)
          CHECK_MESSAGE(cuda::cublaslt_fallbacks() == fallbacks, "cuBLASLt offered no GELU_AUX_BIAS algorithm");
      }
    }
  }

  // The fused MLP backward (matmul_gelu_bwd: c_proj's din GEMM with cuBLASLt's DGELU_BGRAD epilogue, DGELU without a
  // bias gradient) against the unfused fast path (the GEMM rounded to bf16, the GELU backward kernel, then c_fc's bias
  // gradient by the next matmul_bwd's tree column sums). din: the fused path multiplies gelu'(pre) by the fp32 product,
  // the unfused one by the product rounded to bf16 (2^-8 relative), then both round once (kFlip); sum order 1e-4
  // relative and 1e-5 sqrt(OC) times |gelu'| <= 1.13 absolute. dpre_bias (c_fc's bias gradient, added onto its old
  // value): per column i, with S_i = sum over rows of |din| (the unfused din): the rows' differences (2^-8 + kFlip)
  // S_i, cuBLASLt's bf16 bias gradient rounded once more (kFlip S_i), sum order (1e-4 S_i), and the add's rounding
  // (kFlip |dpre_bias|). cuBLASLt's GELU gradient may evaluate tanh by the hardware's approximation (relative 2^-11
  // in t = tanh(u)): gelu'(x) = (1 + t) / 2 + x (1 - t^2) u' / 2 then moves by up to 2^-11 (1/2 + |x| u'), u' = 0.798
  // (1 + 0.134 x^2), times the product P = dout . W^T: eg = 2^-11 (1/2 + X u'(X)) max |P| more for din (X = 3, the
  // largest |pre|), N eg more for dpre_bias. dW and dbias (c_proj's own) by the bias-gradient epilogue: the bounds of
  // "matmul_bwd with cuBLASLt's bias-gradient epilogue" below. A refused shape (IC not a multiple of 8): din and
  // dpre_bias the unfused bits. Without dpre_bias the call returns false and leaves it.
  TEST_CASE("bf16 kernels: the MLP backward with cuBLASLt's DGELU_BGRAD epilogue tracks the unfused fast path") {
    struct Shape {
      int N, IC, OC;  // IC = 4C (the GELU's width), OC = C
    };
    for (const Shape sh : {Shape{64, 1024, 256}, Shape{67, 384, 96}, Shape{64, 777, 40}}) {
      for (const bool with_dpre : {true, false}) {
        const int N = sh.N, IC = sh.IC, OC = sh.OC, K = 8;
        INFO("N " << N << " IC " << IC << " OC " << OC << " dpre_bias " << with_dpre);
        const auto dout_h = random_floats(N * OC, 81), w_h = random_floats(IC * OC, 82, 0.1f),
                   pre_h = random_floats(N * IC, 83, 3.0f), in_h = random_floats(N * IC, 84),
                   dw_h = random_floats(IC * OC, 85), db_h = random_floats(OC, 86), dpre_h = random_floats(IC, 87),
                   x_h = random_floats(N * K, 88);
        struct Out {
          std::vector<float> din, dw, db, dpre;
        };
        const auto run = [&](bool fused) {
          Twin t({.capacity = 64 * kMiB, .fused_epilogues = fused});
          auto dout = t.up16(dout_h), w = t.up16(w_h), pre = t.up16(pre_h), in = t.up16(in_h), dw = t.up16(dw_h),
               db = t.up16(db_h), dpre = t.up16(dpre_h), x = t.up16(x_h);
          auto din = t.up16(random_floats(N * IC, 89)), dwx = t.empty16(std::size_t(K) * IC);
          const bool summed =
              t.gk16().matmul_gelu_bwd(*t.gs, din.gb(), dw.gb(), db.gb(), with_dpre ? dpre.gb() : nullptr, dout.gb(),
                                       in.gb(), w.gb(), pre.gb(), N, IC, OC, WeightLayout::InOut);
          CHECK(summed == (fused && with_dpre));
          // What the GPT-2 block does when the call left c_fc's bias gradient: c_fc's matmul_bwd sums din's columns.
          if (with_dpre && !summed)
            t.gk16().matmul_bwd(*t.gs, nullptr, dwx.gb(), dpre.gb(), din.gb(), x.gb(), w.gb(), N, K, IC,
                                WeightLayout::InOut);
          return Out{t.down16(din).first, t.down16(dw).first, t.down16(db).first, t.down16(dpre).first};
        };
        const Out u = run(false);
        const std::int64_t fallbacks = cuda::cublaslt_fallbacks();
        const Out f = run(true);
        if (N % 8 == 0 && IC % 8 == 0 && OC % 8 == 0)  // GPT-2's shapes: the epilogues must really run
          CHECK_MESSAGE(cuda::cublaslt_fallbacks() == fallbacks, "cuBLASLt offered no DGELU / bias-gradient algorithm");
        check_close("fused matmul_gelu_bwd dw", f.dw, u.dw, 1e-5 * std::sqrt(double(N)), 1e-4 + kFlip);
        check_close("fused matmul_gelu_bwd dbias", f.db, u.db, 2e-7 * N * N, kFlip);
        if (!with_dpre) {
          std::vector<float> dpre0(dpre_h.size());
          for (std::size_t i = 0; i < dpre0.size(); ++i) dpre0[i] = to_f32(to_bf16(dpre_h[i]));
          CHECK(same_bits(f.dpre, dpre0));
        }
        if (IC % 8 != 0) {  // refused: the unfused kernels
          CHECK(same_bits(f.din, u.din));
          CHECK(same_bits(f.dpre, u.dpre));
          continue;
        }
        double P = 0;  // max |dout . W^T| over the N x IC products, in fp64 on the bf16 operands
        {
          const auto bf = [](float v) { return double(to_f32(to_bf16(v))); };
          for (int n = 0; n < N; ++n) {
            for (int i = 0; i < IC; ++i) {
              double p = 0;
              for (int o = 0; o < OC; ++o) p += bf(dout_h[std::size_t(n) * OC + o]) * bf(w_h[std::size_t(i) * OC + o]);
              P = std::max(P, std::abs(p));
            }
          }
        }
        const double eg = std::ldexp(1.0, -11) * (0.5 + 3.0 * 0.798 * (1 + 0.134 * 9)) * P;
        check_close("fused matmul_gelu_bwd din", f.din, u.din, 1.13e-5 * std::sqrt(double(OC)) + eg,
                    1.0 / 256 + 1e-4 + kFlip);
        if (!with_dpre) continue;
        std::size_t failing = 0;
        for (int i = 0; i < IC; ++i) {
          double S = 0;
          for (int n = 0; n < N; ++n) S += std::abs(double(u.din[std::size_t(n) * IC + i]));
          const double bound = (1.0 / 256 + 2 * kFlip + 1e-4) * S + kFlip * std::abs(double(u.dpre[i])) + N * eg + 1e-6;
          if (!(std::abs(double(f.dpre[i]) - double(u.dpre[i])) <= bound)) ++failing;
        }
        INFO(failing << " of " << IC << " bias-gradient entries outside their bound");
        CHECK(failing == 0);
      }
    }
  }

  // matmul_bwd with cuBLASLt's bias-gradient epilogue (fused_epilogues on: dW's fp32 product and dout's column sums by
  // one cublasLtMatmul, BGRADA for InOut, BGRADB for OutIn) against the unfused fast path (the product by GemmEx, the
  // column sums by the tree), on the same GPU. Both sum in fp32 and round each accumulated gradient once, so they
  // differ by summation order only, plus a flip: dW within 1e-5 sqrt(N) + (1e-4 + kFlip)|x| (|in|, |dout| <= 1, as
  // the biased matmul's bound), dbias within 2 gamma(N) sum |dout| <= 2 (N u32) N < 2e-7 N^2 (u32 = 2^-24) plus kFlip
  // |x|; din is the same GemmEx call: the same bits. Without a bias the unfused kernels: the same bits. On GPT-2-like
  // shapes (every dimension a multiple of 8) cuBLASLt must offer an algorithm (cublaslt_fallbacks unchanged).
  TEST_CASE("bf16 kernels: matmul_bwd with cuBLASLt's bias-gradient epilogue tracks the unfused fast path") {
    struct Shape {
      int N, IC, OC;
    };
    for (const Shape sh : {Shape{64, 256, 768}, Shape{67, 96, 40}, Shape{512, 1024, 4096}}) {
      for (const WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
        for (const bool with_bias : {true, false}) {
          const int N = sh.N, IC = sh.IC, OC = sh.OC;
          INFO("N " << N << " IC " << IC << " OC " << OC << " layout "
                    << (layout == WeightLayout::InOut ? "InOut" : "OutIn") << " bias " << with_bias);
          const auto dout_h = random_floats(N * OC, 101), in_h = random_floats(N * IC, 102),
                     w_h = random_floats(IC * OC, 103, 0.1f), dw_h = random_floats(IC * OC, 104),
                     db_h = random_floats(OC, 105);
          const auto run = [&](bool fused) {
            Twin t({.capacity = 256 * kMiB, .fused_epilogues = fused});
            auto dout = t.up16(dout_h), in = t.up16(in_h), w = t.up16(w_h), dw = t.up16(dw_h), db = t.up16(db_h);
            auto din = t.up16(random_floats(N * IC, 106));  // overwritten
            t.gk16().matmul_bwd(*t.gs, din.gb(), dw.gb(), with_bias ? db.gb() : nullptr, dout.gb(), in.gb(), w.gb(), N,
                                IC, OC, layout);
            return std::tuple{t.down16(din).first, t.down16(dw).first, t.down16(db).first};
          };
          const auto [din0, dw0, db0] = run(false);
          const std::int64_t fallbacks = cuda::cublaslt_fallbacks();
          const auto [din1, dw1, db1] = run(true);
          CHECK(same_bits(din1, din0));
          if (!with_bias) {
            CHECK(same_bits(dw1, dw0));
            CHECK(same_bits(db1, db0));
            continue;
          }
          if (N % 8 == 0 && IC % 8 == 0 && OC % 8 == 0)
            CHECK_MESSAGE(cuda::cublaslt_fallbacks() == fallbacks, "cuBLASLt offered no bias-gradient algorithm");
          check_close("fused matmul_bwd dw", dw1, dw0, 1e-5 * std::sqrt(double(N)), 1e-4 + kFlip);
          check_close("fused matmul_bwd dbias", db1, db0, 2e-7 * double(N) * N, kFlip);
        }
      }
    }
  }

  // The fused residual add + LayerNorm (add_layernorm_fwd: one kernel, layernorm_fwd's row code on the stored sum)
  // against the add kernel then layernorm_fwd, fp32 and bf16, on the bf16 fast path and on the exact kernels: the same
  // bits (kernels.cu builds with --fmad=false, so the shared row code cannot contract differently), also in place.
  TEST_CASE("kernels: the fused residual add + LayerNorm gives the unfused bits (fp32, bf16)") {
    for (const bool exact : {false, true}) {
      for (const int C : {64, 777, 1024}) {
        const int N = 67;
        INFO("C " << C << " bf16_exact " << exact);
        const auto a_h = random_floats(N * C, 91, 2.0f), b_h = random_floats(N * C, 92), w_h = random_floats(C, 93),
                   bias_h = random_floats(C, 94);
        const auto run = [&](bool fused, bool in_place) {
          Twin t({.capacity = 64 * kMiB, .bf16_exact = exact, .fused_epilogues = fused});
          auto a = t.up(a_h), b = t.up(b_h), w = t.up(w_h), bias = t.up(bias_h), res = t.empty(N * C),
               out = t.empty(N * C), mean = t.empty(N), rstd = t.empty(N);
          auto a16 = t.up16(a_h), b16 = t.up16(b_h), w16 = t.up16(w_h), bias16 = t.up16(bias_h),
               res16 = t.empty16(N * C), out16 = t.empty16(N * C);
          auto mean16 = t.empty(N), rstd16 = t.empty(N);
          Kernels<float>& k = t.gpu->kernels();
          k.add_layernorm_fwd(*t.gs, in_place ? a.gf() : res.gf(), out.gf(), mean.gf(), rstd.gf(), a.gf(), b.gf(),
                              w.gf(), bias.gf(), N, C, 1e-5f);
          t.gk16().add_layernorm_fwd(*t.gs, in_place ? a16.gb() : res16.gb(), out16.gb(), mean16.gf(), rstd16.gf(),
                                     a16.gb(), b16.gb(), w16.gb(), bias16.gb(), N, C, 1e-5f);
          std::vector<std::vector<float>> got = {t.down(in_place ? a : res).first,
                                                 t.down(out).first,
                                                 t.down(mean).first,
                                                 t.down(rstd).first,
                                                 t.down16(in_place ? a16 : res16).first,
                                                 t.down16(out16).first,
                                                 t.down(mean16).first,
                                                 t.down(rstd16).first};
          return got;
        };
        for (const bool in_place : {false, true}) {
          const auto unfused = run(false, in_place), fused = run(true, in_place);
          for (std::size_t i = 0; i < fused.size(); ++i) {
            INFO("output " << i << " (res, out, mean, rstd; fp32 then bf16) in place " << in_place);
            CHECK(same_bits(fused[i], unfused[i]));
          }
        }
      }
    }
  }

  // The Llama family's kernels (Kernels<S>::rmsnorm_*, rope_qkv_*, swiglu_*) against the CPU device's on the same
  // seeded inputs, fp32 (kBf16 false) and bf16, in the device's mode `o`: grouped-query heads (H / Hkv = 2, 3), one
  // key/value head, plain multi-head, odd head halves and row widths. Tolerances |cuda - cpu| <= atol + rtol |cpu| as
  // above (bf16: plus kFlip): RMSNorm's sums are warp trees (atol ~1e-5 sqrt(C), as LayerNorm's); rope's angle t /
  // theta^(2i/D) rounds by ~4 ulp of t (4e-7 T with |x| <= 1), its cos and sin are CUDA's fp64 ones rounded (glibc's
  // within an ulp), a key gradient sums H / Hkv heads first; SwiGLU differs only by expf (2 ulp; the backward's gate
  // gradient, up to 20 with gate and up in [-4, 4], carries it through sigmoid's polynomial: atol 4e-5). RMSNorm's dw:
  // in the CPU's row order (the same bits, given the CPU's rstd) unless `tree` (tree_sums, or the bf16 fast path), then
  // as the tree column sums above. The bounds the conformance suite derives for the default modes are tighter
  // (test_device_conformance_llama.cpp).
  template <bool kBf16>
  void llama_kernels_vs_cpu(const cuda::CudaDeviceOptions& o, bool tree) {
    using E = std::conditional_t<kBf16, Bf16, float>;
    Twin t(o);
    const auto up = [&](const std::vector<float>& h) {
      if constexpr (kBf16) {
        return t.up16(h);
      } else {
        return t.up(h);
      }
    };
    const auto gp = [](const auto& b) {
      if constexpr (kBf16) {
        return b.gb();
      } else {
        return b.gf();
      }
    };
    const auto cp = [](const auto& b) {
      if constexpr (kBf16) {
        return b.cb();
      } else {
        return b.cf();
      }
    };
    const auto down = [&](const auto& b) {
      if constexpr (kBf16) {
        return t.down16(b);
      } else {
        return t.down(b);
      }
    };
    const double flip = kBf16 ? kFlip : 0.0;
    const auto close = [&](const std::string& what, const auto& b, double atol, double rtol) {
      auto [g, c] = down(b);
      check_close((what + (kBf16 ? " (bf16)" : " (fp32)")).c_str(), g, c, atol, rtol + flip);
    };
    Kernels<E>& gk = kernels_of<E>(*t.gpu, "test");
    Kernels<E>& ck = kernels_of<E>(*t.cpu, "test");

    for (const int N : {1, 67, 1000}) {  // RMSNorm
      for (const int C : {40, 777}) {
        INFO("rmsnorm N " << N << " C " << C);
        auto in = up(random_floats(N * C, 201, 2.0f)), w = up(random_floats(C, 202));
        auto out = up(random_floats(N * C, 203));
        auto rstd = t.up(random_floats(N, 204));  // overwritten; fp32 for bf16 too
        gk.rmsnorm_fwd(*t.gs, gp(out), rstd.gf(), gp(in), gp(w), N, C, 1e-5f);
        ck.rmsnorm_fwd(*t.cs, cp(out), rstd.cf(), cp(in), cp(w), N, C, 1e-5f);
        close("rmsnorm_fwd out", out, 1e-6, 1e-5);
        {
          auto [g, c] = t.down(rstd);
          check_close("rmsnorm_fwd rstd (fp32 for either storage)", g, c, 0.0, 1e-5);  // no bf16 rounding
        }
        auto r2 = t.up(t.down(rstd).second);  // the backward on the CPU's rstd for both
        auto dout = up(random_floats(N * C, 205));
        auto din = up(random_floats(N * C, 206)), dw = up(random_floats(C, 207));  // both accumulate
        std::vector<float> first_dw;
        for (int rep = 0; rep < 2; ++rep) {
          gk.rmsnorm_bwd(*t.gs, gp(din), gp(dw), gp(dout), gp(in), gp(w), r2.gf(), N, C);
          ck.rmsnorm_bwd(*t.cs, cp(din), cp(dw), cp(dout), cp(in), cp(w), r2.cf(), N, C);
          close("rmsnorm_bwd din (accumulated)", din, 1e-5 * std::sqrt(double(C)) * (rep + 1), 1e-4);
          auto [g, c] = down(dw);
          if (tree) {
            check_close(kBf16 ? "rmsnorm_bwd dw (tree, bf16)" : "rmsnorm_bwd dw (tree)", g, c,
                        2 * (2e-7 * N + 1e-6) * (rep + 1), 1e-5 + flip * (rep + 1));
          } else {
            INFO("rmsnorm_bwd dw in row order: the CPU's bits");
            CHECK(same_bits(g, c));
          }
          if (rep == 0) {
            first_dw = g;
          } else {  // run to run: the second accumulation from the same start gives the same bits
            auto dw_again = up(random_floats(C, 207));
            gk.rmsnorm_bwd(*t.gs, gp(din), gp(dw_again), gp(dout), gp(in), gp(w), r2.gf(), N, C);
            gk.rmsnorm_bwd(*t.gs, gp(din), gp(dw_again), gp(dout), gp(in), gp(w), r2.gf(), N, C);
            CHECK(same_bits(down(dw_again).first, g));
          }
        }
      }
    }

    struct Rope {
      int B, T, H, Hkv, D;
      float theta;
    };
    for (const Rope sh : {Rope{2, 19, 4, 2, 16, 10000.0f}, Rope{1, 70, 6, 2, 10, 10000.0f},
                          Rope{3, 8, 3, 3, 8, 500000.0f}, Rope{1, 33, 8, 1, 6, 10000.0f}}) {
      INFO("rope B " << sh.B << " T " << sh.T << " H " << sh.H << " Hkv " << sh.Hkv << " D " << sh.D);
      const int C = sh.H * sh.D, P = C + 2 * sh.Hkv * sh.D, Nr = sh.B * sh.T, rep = sh.H / sh.Hkv;
      const double atol = 4e-7 * sh.T + 1e-6;
      auto packed = up(random_floats(std::size_t(Nr) * P, 211));
      auto qkv = up(random_floats(std::size_t(Nr) * 3 * C, 212));  // written
      gk.rope_qkv_fwd(*t.gs, gp(qkv), gp(packed), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      ck.rope_qkv_fwd(*t.cs, cp(qkv), cp(packed), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      close("rope_qkv_fwd", qkv, atol, 1e-6);
      auto dqkv = up(random_floats(std::size_t(Nr) * 3 * C, 213));
      auto dpacked = up(random_floats(std::size_t(Nr) * P, 214));  // written
      gk.rope_qkv_bwd(*t.gs, gp(dpacked), gp(dqkv), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      ck.rope_qkv_bwd(*t.cs, cp(dpacked), cp(dqkv), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      close("rope_qkv_bwd", dpacked, atol * rep, 1e-6);
    }

    for (const int I : {172, 33}) {  // SwiGLU
      const int N = 67;
      INFO("swiglu N " << N << " I " << I);
      auto in = up(random_floats(std::size_t(N) * 2 * I, 221, 4.0f)), dout = up(random_floats(std::size_t(N) * I, 222));
      auto out = up(random_floats(std::size_t(N) * I, 223)), din = up(random_floats(std::size_t(N) * 2 * I, 224));
      gk.swiglu_fwd(*t.gs, gp(out), gp(in), N, I);
      ck.swiglu_fwd(*t.cs, cp(out), cp(in), N, I);
      close("swiglu_fwd", out, 1e-6, 1e-5);
      gk.swiglu_bwd(*t.gs, gp(din), gp(in), gp(dout), N, I);
      ck.swiglu_bwd(*t.cs, cp(din), cp(in), cp(dout), N, I);
      close("swiglu_bwd", din, 4e-5, 1e-5);  // |dgate| <= X (1 + X) = 20: expf's 2 ulp through sig (conformance)
    }
  }

  TEST_CASE("Llama kernels: fp32 and bf16 against the CPU device (row-order dw), GQA and odd sizes") {
    llama_kernels_vs_cpu<false>({.capacity = 256 * kMiB}, false);
    llama_kernels_vs_cpu<true>({.capacity = 256 * kMiB, .bf16_exact = true}, false);
  }

  TEST_CASE("Llama kernels: RMSNorm's dw by the tree column sums (tree_sums; the bf16 fast path's default)") {
    llama_kernels_vs_cpu<false>({.capacity = 256 * kMiB, .tree_sums = true}, true);
    llama_kernels_vs_cpu<true>({.capacity = 256 * kMiB}, true);
  }

  TEST_CASE("Llama kernels: bad rotary shapes are refused when the call is made") {
    Twin t({.capacity = 16 * kMiB});
    auto buf = t.empty(4096);
    CHECK_THROWS_WITH_AS(t.gpu->kernels().rope_qkv_fwd(*t.gs, buf.gf(), buf.gf(), 1, 2, 4, 3, 8, 10000.0f),
                         doctest::Contains("4 query heads do not split into 3 key/value heads"), DeviceError);
    CHECK_THROWS_WITH_AS(t.gpu->kernels().rope_qkv_bwd(*t.gs, buf.gf(), buf.gf(), 1, 2, 4, 2, 7, 10000.0f),
                         doctest::Contains("head width 7 is odd"), DeviceError);
    CHECK_THROWS_WITH_AS(t.gpu->kernels().swiglu_fwd(*t.gs, buf.gf(), buf.gf(), -1, 8),
                         doctest::Contains("negative size"), DeviceError);
  }

  TEST_CASE("communicator over distinct GPUs: NCCL (needs 2 GPUs)") {
    const int gpus = cuda::cuda_device_count();
    if (gpus < 2) {
      MESSAGE("one GPU: the NCCL communicator is not exercised");
      return;
    }
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<Device*> ptrs;
    for (int r = 0; r < gpus; ++r) {
      devs.push_back(cuda::make_cuda_device(r, {.capacity = 8 * kMiB}));
      streams.push_back(devs.back()->create_stream("comm"));
      ptrs.push_back(devs.back().get());
    }
    auto comm = cuda::make_cuda_communicator(ptrs);
    MESSAGE("NCCL: " << cuda::uses_nccl(*comm));
    const std::int64_t count = 40000;
    const Bytes bytes = count * 4;
    std::vector<Buffer> bufs;
    std::vector<std::vector<float>> host;
    for (int r = 0; r < gpus; ++r) {
      host.push_back(random_floats(static_cast<std::size_t>(count), 90 + static_cast<std::uint64_t>(r)));
      bufs.push_back(devs[r]->alloc(bytes));
      devs[r]->copy_h2d(*streams[r], bufs[r].data(), host[r].data(), bytes);
    }
    for (int r = gpus - 1; r >= 0; --r) comm->all_reduce_sum(r, *streams[r], bufs[r].as<float>(), count);
    std::vector<float> sum = host[0];
    for (int r = 1; r < gpus; ++r) {
      for (std::int64_t i = 0; i < count; ++i) sum[i] += host[r][i];
    }
    std::vector<float> rank0;
    for (int r = 0; r < gpus; ++r) {
      std::vector<float> back(static_cast<std::size_t>(count));
      devs[r]->copy_d2h(*streams[r], back.data(), bufs[r].data(), bytes);
      streams[r]->synchronize();
      // NCCL's ring adds in its own order: each element within a few ulps of the rank-order sum of |terms| <= n.
      check_close("all_reduce_sum (NCCL)", back, sum, 1e-6 * gpus, 1e-6);
      if (r == 0) rank0 = back;
      CHECK(same_bits(back, rank0));  // the same on every rank
    }
    Buffer x = devs[1]->alloc(bytes);
    comm->recv(1, *streams[1], x.data(), bytes, 0);
    comm->send(0, *streams[0], bufs[0].data(), bytes, 1);
    std::vector<float> bx(static_cast<std::size_t>(count));
    devs[1]->copy_d2h(*streams[1], bx.data(), x.data(), bytes);
    for (auto& s : streams) s->synchronize();
    CHECK(same_bits(bx, rank0));
  }

  // Training, 3 steps of the plain trainer (microbatches {1, 3}; bf16 {1, 1, 1, 1}) and of a Harmony-PP Program
  // through the Executor on two logical CUDA devices sharing GPU 0, against the same on CPU devices. Bounds:
  //   fp32: gradients differ from the CPU's by summation order (~1e-6 relative); AdamW (lr 3e-3, eps 1e-5) turns that
  //   into weight differences far below lr (a sign, scale or indexing error moves weights by ~lr). Losses rel 1e-5;
  //   weights 2e-5 + 1e-4 |w| after the steps.
  //   bf16: the same fp32 differences, each then rounded to bf16 where a boundary falls between the two values (one
  //   ulp, 2^-8 to 2^-7 relative, in a fraction of every activation and gradient), carried through the layers: noise
  //   of the size of bf16 rounding itself, smaller than the whole difference between fp32 and bf16 storage. Measured
  //   on the CPU device with this set-up (GCC 12, x86-64, 3 steps): fp32 vs bf16 training moves the losses by 2.3e-5
  //   relative, a weight by at most 5.0e-3 and each layer's update (w - w0) by at most 2.8% of its norm (relative
  //   L2); a bf16 run with another dW rounding sequence (microbatches {1, 3} vs {1, 1, 1, 1}) by 3.9e-5, 9.9e-4 and
  //   0.55%. Bounds (the bf16 oracle's measures, >= 3.5x those): losses within 2e-4 relative; every weight within
  //   2 lr per step (AdamW moves a weight by at most ~lr per step whatever its gradient); per layer the updates within
  //   0.11 of the CPU's update norm. A sign or scale error in a gradient or a missing contribution moves whole tensors
  //   by ~lr (~100% of their update) and the later losses by far more than 2e-4; the rounding itself (ties to even,
  //   not truncation) is pinned by the conformance suite's exact kernel checks.
  struct TrainRun {
    std::vector<double> losses;
    std::vector<std::vector<float>> weights;
  };

  void training_vs_cpu(DType dtype) {
    constexpr int kB = 4, kT = 16, kSteps = 3;
    const AdamWConfig adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};
    const bool bf16 = dtype == DType::BF16;
    const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
    const Gpt2 model(gpt2_config_from(file));
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    const auto weights_of = [&](const HostState& st) {
      std::vector<std::vector<float>> w;
      for (int l = 0; l < model.num_layers(); ++l) w.emplace_back(st.weights(l).begin(), st.weights(l).end());
      return w;
    };
    std::vector<std::vector<float>> initial;
    {
      HostState st(model);
      load_gpt2_weights(file, st);
      initial = weights_of(st);
    }
    const auto compare = [&](const char* what, const TrainRun& got, const TrainRun& want) {
      INFO(what << (bf16 ? " (bf16)" : " (fp32)"));
      for (int k = 0; k < kSteps; ++k) {
        INFO("step " << k << ": loss " << got.losses[k] << " vs " << want.losses[k]);
        if (bf16) {
          CHECK(std::abs(got.losses[k] - want.losses[k]) <= 2e-4 * std::abs(want.losses[k]));
        } else {
          CHECK(got.losses[k] == doctest::Approx(want.losses[k]).epsilon(1e-5));
        }
      }
      for (int l = 0; l < model.num_layers(); ++l) {
        INFO("layer " << l);
        if (!bf16) {
          check_close("weights", got.weights[l], want.weights[l], 2e-5, 1e-4);
          continue;
        }
        check_close("weights", got.weights[l], want.weights[l], 2 * kSteps * adamw.lr, 0.0);
        double diff = 0, norm = 0;
        for (std::size_t i = 0; i < initial[l].size(); ++i) {
          const double u_want = double(want.weights[l][i]) - initial[l][i];
          const double u_got = double(got.weights[l][i]) - initial[l][i];
          diff += (u_got - u_want) * (u_got - u_want);
          norm += u_want * u_want;
        }
        const double rel = std::sqrt(diff / norm);
        MESSAGE(what, " layer ", l, ": weight updates relative L2 ", rel);
        CHECK(rel <= 0.11);
      }
    };
    const auto plain = [&](Device& dev) {
      HostState st(model);
      load_gpt2_weights(file, st);
      // bf16: the Program's u_bwd = 1, so the trainer rounds dW after the same microbatches (bit-exact on the CPU).
      const std::vector<int> micro = bf16 ? std::vector<int>{1, 1, 1, 1} : std::vector<int>{1, 3};
      PlainTrainer trainer(dev, st, {.batch = kB, .seq_len = kT, .microbatches = micro, .dtype = dtype});
      TrainRun r;
      std::vector<std::int32_t> in, tgt;
      for (int k = 0; k < kSteps; ++k) {
        tokens.batch(k, kB, kT, in, tgt);
        r.losses.push_back(trainer.step(in, tgt, adamw));
      }
      r.weights = weights_of(st);
      return r;
    };
    auto cpu_dev = cpu::make_cpu_device(0, {.capacity = 64 * kMiB});
    // The exact bf16 kernels (bf16_exact): the bounds above are the CPU's rounding points plus summation order.
    auto gpu_dev = cuda::make_cuda_device(0, {.capacity = 64 * kMiB, .bf16_exact = true});
    const TrainRun ref = plain(*cpu_dev);
    compare("plain trainer", plain(*gpu_dev), ref);

    // Harmony-PP over two logical CUDA devices on GPU 0 (1-layer packs, u_fwd 2, u_bwd 1, 16 MiB each).
    core::Plan plan;
    plan.kind = core::plan_kind("harmony-pp");
    plan.gpus = 2;
    plan.minibatch = kB;
    plan.u_fwd = 2;
    plan.u_bwd = 1;
    core::manual_packs(model.num_layers(), 1, plan.packs_fwd, plan.packs_bwd);
    core::validate_packs(plan, model.num_layers());
    const core::Model desc = describe_gpt2(model, kT, std::vector<int>{1, 2, 3, 4}, {.dtype = dtype});
    const core::Program prog =
        core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), desc, {.dp_first_gpu_only = false});
    const auto program_run = [&](std::vector<std::unique_ptr<Device>>& devs) {
      HostState st(model);
      load_gpt2_weights(file, st);
      std::vector<Device*> ptrs;
      for (auto& d : devs) ptrs.push_back(d.get());
      Executor ex(prog, ptrs, st, {.seq_len = kT, .adamw = adamw, .dtype = dtype});
      TrainRun r;
      std::vector<std::int32_t> in, tgt;
      for (int k = 0; k < kSteps; ++k) {
        tokens.batch(k, kB, kT, in, tgt);
        r.losses.push_back(ex.step(in, tgt).loss);
      }
      r.weights = weights_of(st);
      for (auto* d : ptrs) CHECK(d->memory().in_use == 0);
      return r;
    };
    std::vector<std::unique_ptr<Device>> cpus, gpus;
    for (int g = 0; g < 2; ++g) {
      cpus.push_back(cpu::make_cpu_device(g, {.capacity = 16 * kMiB}));
      gpus.push_back(cuda::make_cuda_device(g, {.gpu = 0, .capacity = 16 * kMiB, .bf16_exact = true}));
    }
    const TrainRun pp_cpu = program_run(cpus);
    // Bit-exact in test_executor (bf16: the trainer over u_bwd's microbatches), a sanity check of the set-up here.
    compare("Harmony-PP CPU vs plain CPU", pp_cpu, ref);
    compare("Harmony-PP on CUDA", program_run(gpus), pp_cpu);
  }

  // Replica sums on the devices (ExecutorOptions::communicator): a Harmony-DP Program on two logical CUDA devices
  // sharing GPU 0 (the communicator's rank-order kernel path, not NCCL) gives the host path's bits on the same
  // devices, fp32 and bf16, over 2 steps.
  TEST_CASE("Harmony-DP on CUDA devices: replica sums on the devices give the host path's bits") {
    constexpr int kB = 4, kT = 16, kSteps = 2;
    const AdamWConfig adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};
    const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
    const Gpt2 model(gpt2_config_from(file));
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    for (DType dtype : {DType::F32, DType::BF16}) {
      INFO(dtype_name(dtype));
      core::Plan plan;
      plan.kind = core::plan_kind("harmony-dp");
      plan.gpus = 2;
      plan.minibatch = kB;
      plan.u_fwd = 1;
      plan.u_bwd = 1;
      core::manual_packs(model.num_layers(), 1, plan.packs_fwd, plan.packs_bwd);
      core::validate_packs(plan, model.num_layers());
      const core::Model desc = describe_gpt2(model, kT, std::vector<int>{1, 2, 3, 4}, {.dtype = dtype});
      const core::Program prog =
          core::lower_harmony(core::compose_task_graph(plan, model.num_layers()), desc, {.dp_first_gpu_only = false});
      const auto program_run = [&](bool device_sums) {
        std::vector<std::unique_ptr<Device>> devs;
        std::vector<Device*> ptrs;
        for (int g = 0; g < 2; ++g) {
          devs.push_back(cuda::make_cuda_device(g, {.gpu = 0, .capacity = 16 * kMiB}));
          ptrs.push_back(devs.back().get());
        }
        auto comm = cuda::make_cuda_communicator(ptrs);
        HostState st(model);
        load_gpt2_weights(file, st);
        Executor ex(
            prog, ptrs, st,
            {.seq_len = kT, .adamw = adamw, .dtype = dtype, .communicator = device_sums ? comm.get() : nullptr});
        TrainRun r;
        std::vector<std::int32_t> in, tgt;
        for (int k = 0; k < kSteps; ++k) {
          tokens.batch(k, kB, kT, in, tgt);
          r.losses.push_back(ex.step(in, tgt).loss);
        }
        for (int l = 0; l < model.num_layers(); ++l) r.weights.emplace_back(st.weights(l).begin(), st.weights(l).end());
        return r;
      };
      const TrainRun host = program_run(false), device = program_run(true);
      CHECK(device.losses == host.losses);
      for (int l = 0; l < model.num_layers(); ++l) {
        INFO("layer " << l);
        CHECK(same_bits(device.weights[l], host.weights[l]));
      }
    }
  }

  // The Llama family end to end (issue 36): the plain trainer on the CUDA device against the CPU device (which
  // test_llama.cpp checks against PyTorch) from the oracles' initial weights, on their tokens, B = 4, T = 16, 3 steps:
  // llama_tiny (grouped-query heads, untied head) and qwen2_tiny (q/k/v biases). fp32 as the GPT-2 case above (1e-5
  // relative per loss; weights within 2e-5 + 1e-4 |cpu|); bf16 (the exact bf16 kernels) within the GPT-2 bf16 case's
  // loss bound, 2e-4, and every weight within 2 lr per step of the CPU's (each AdamW step moves a weight by ~lr at
  // most). A missing kernel, a null position table read, or a wrong rotary or head index fails by far more.
  void llama_training_vs_cpu(DType dtype) {
    constexpr int kB = 4, kT = 16, kSteps = 3;
    const AdamWConfig adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};
    const bool bf16 = dtype == DType::BF16;
    const char* root = std::getenv("HARMONY_SOURCE_DIR");
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    for (const char* name : {"llama_tiny", "qwen2_tiny"}) {
      INFO(name << (bf16 ? " (bf16)" : " (fp32)"));
      const std::string dir = std::string(root != nullptr ? root : ".") + "/tests/data/" + name + "/";
      const Gpt2 model(gpt2_config_at(dir));
      REQUIRE(model.config().arch == Arch::Llama);
      const auto run = [&](Device& dev) {
        HostState st(model);
        load_gpt2_weights_at(dir, st);
        PlainTrainer trainer(dev, st, {.batch = kB, .seq_len = kT, .microbatches = {}, .dtype = dtype});
        TrainRun r;
        std::vector<std::int32_t> in, tgt;
        for (int k = 0; k < kSteps; ++k) {
          tokens.batch(k, kB, kT, in, tgt);
          r.losses.push_back(trainer.step(in, tgt, adamw));
        }
        for (int l = 0; l < model.num_layers(); ++l) r.weights.emplace_back(st.weights(l).begin(), st.weights(l).end());
        return r;
      };
      auto cpu_dev = cpu::make_cpu_device(0, {.capacity = 64 * kMiB});
      auto gpu_dev = cuda::make_cuda_device(0, {.capacity = 64 * kMiB, .bf16_exact = true});
      const TrainRun want = run(*cpu_dev), got = run(*gpu_dev);
      for (int k = 0; k < kSteps; ++k) {
        INFO("step " << k << ": loss " << got.losses[k] << " vs " << want.losses[k]);
        CHECK(std::abs(got.losses[k] - want.losses[k]) <= (bf16 ? 2e-4 : 1e-5) * std::abs(want.losses[k]));
      }
      for (int l = 0; l < model.num_layers(); ++l) {
        INFO("layer " << l);
        if (bf16) {
          check_close("weights", got.weights[l], want.weights[l], 2 * kSteps * adamw.lr, 0.0);
        } else {
          check_close("weights", got.weights[l], want.weights[l], 2e-5, 1e-4);
        }
      }
    }
  }

  TEST_CASE("training: the Llama family on the CUDA device tracks the CPU device (fp32, bf16)") {
    llama_training_vs_cpu(DType::F32);
    llama_training_vs_cpu(DType::BF16);
  }

  TEST_CASE("training: the plain trainer and a Harmony-PP Program on CUDA devices track the CPU device") {
    training_vs_cpu(DType::F32);
  }

  TEST_CASE("training in bf16: the plain trainer and a Harmony-PP Program on CUDA devices track the CPU device") {
    CHECK(cuda::make_cuda_device(0, {.capacity = 1 * kMiB})->bf16_kernels() != nullptr);
    training_vs_cpu(DType::BF16);
  }
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (!harmony::backend::cuda::cuda_available()) {
    context.addFilter("test-suite", "host");
    const int rc = context.run();
    if (context.shouldExit() || rc != 0) return rc;
    std::printf("no usable CUDA GPU (%s): GPU cases skipped\n",
                harmony::backend::cuda::cuda_unavailable_reason().c_str());
    return 77;  // Meson: SKIP
  }
  return context.run();
}
