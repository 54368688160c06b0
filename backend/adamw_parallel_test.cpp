// Tests of the parallel, vectorised AdamW (backend/adamw_parallel): every element is bit-identical to
// adamw_update's over several steps, for sizes around the vector widths and the thread split, unaligned
// pointers, 1..8 threads and pools reused across calls, the tied pair's fused pass; invalid steps are rejected
// before any write.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/adamw_parallel.hpp"
#include "backend/device.hpp"
#include "backend/model/state.hpp"

using namespace harmony::backend;

namespace {

const AdamWConfig kConfig{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};

struct State {
  std::vector<float> p, m, v;
};

// Parameters and gradients spanning many magnitudes (including exact zeros, tiny values next to eps and
// denormal gradients), so divisions, square roots and the decay all round non-trivially.
std::vector<float> values(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 2);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(rng() % 16);
    x[i] = kind == 0 ? 0.0f : kind == 1 ? 1e-40f * u(rng) : scale * u(rng) * std::ldexp(1.0f, e(rng));
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp with a null pointer is undefined even for 0 bytes (UBSan reports it): empty vectors compare equal.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs `steps` updates with adamw_update and with `update` on copies of the same state, starting at element
// `offset` (to test unaligned pointers), and checks every bit of parameters and moments after each step.
template <class Update>
void check_identical(std::size_t n, std::size_t offset, int steps, Update&& update) {
  const std::size_t total = n + offset;
  State ref{values(total, 1, 1.0f), std::vector<float>(total, 0.0f), std::vector<float>(total, 0.0f)};
  State got = ref;
  for (int k = 1; k <= steps; ++k) {
    const auto g = values(total, 100 + static_cast<std::uint64_t>(k), 0.1f);
    adamw_update(kConfig, k, ref.p.data() + offset, g.data() + offset, ref.m.data() + offset, ref.v.data() + offset,
                 static_cast<std::int64_t>(n));
    update(k, got.p.data() + offset, g.data() + offset, got.m.data() + offset, got.v.data() + offset,
           static_cast<std::int64_t>(n));
    INFO("n = " << n << ", offset = " << offset << ", step " << k);
    REQUIRE(same_bits(ref.p, got.p));
    REQUIRE(same_bits(ref.m, got.m));
    REQUIRE(same_bits(ref.v, got.v));
  }
}

const std::vector<std::size_t> kSizes{0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 255, 1000, 4097, 65536, 200003};

}  // namespace

TEST_CASE("vectorised AdamW is bit-identical to adamw_update") {
  MESSAGE("vector ISA on this CPU: " << std::string(adamw_vector_isa()));
  for (std::size_t n : kSizes) {
    for (std::size_t offset : {0, 1, 3}) {
      check_identical(n, offset, 3,
                      [](std::int64_t step, float* p, const float* g, float* m, float* v, std::int64_t count) {
                        adamw_update_vectorized(kConfig, step, p, g, m, v, count);
                      });
    }
  }
  // Every instruction set this CPU has, not only the one picked.
  std::vector<std::string> isas{"scalar"};
#if defined(__x86_64__)
  isas.emplace_back("sse2");
  if (std::string(adamw_vector_isa()) == "avx2") isas.emplace_back("avx2");
#endif
  for (const std::string& isa : isas) {
    INFO("isa " << isa);
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{31}, std::size_t{4099}}) {
      check_identical(n, 1, 2,
                      [&](std::int64_t step, float* p, const float* g, float* m, float* v, std::int64_t count) {
                        adamw_update_isa(isa, kConfig, step, p, g, m, v, count);
                      });
    }
  }
  float x = 0;
  CHECK_THROWS_AS(adamw_update_isa("avx1024", kConfig, 1, &x, &x, &x, &x, 0), BackendError);
}

TEST_CASE("parallel AdamW is bit-identical to adamw_update for 1..8 threads") {
  for (int threads : {1, 2, 3, 4, 8}) {
    // A small grain so that even the small sizes are split across every thread.
    ParallelAdamW opt(threads, 5);
    CHECK(opt.threads() == threads);
    for (std::size_t n : kSizes) {
      check_identical(n, threads % 2, 3,
                      [&](std::int64_t step, float* p, const float* g, float* m, float* v, std::int64_t count) {
                        opt.update(kConfig, step, p, g, m, v, count);
                      });
    }
  }
  ParallelAdamW defaults;  // hardware_concurrency threads, default grain
  CHECK(defaults.threads() >= 1);
  check_identical(1u << 20, 0, 2,
                  [&](std::int64_t step, float* p, const float* g, float* m, float* v, std::int64_t count) {
                    defaults.update(kConfig, step, p, g, m, v, count);
                  });
}

TEST_CASE("the tied update: sum, update and copy in one parallel pass, bit-identical to doing them in turn") {
  // The executor's wte/lm_head update: before, one thread summed the two gradients into a buffer, the pool
  // updated wte, one thread copied wte into lm_head (HostState::sync_tied). update_tied must give the same bits
  // in all three outputs (the parameters, both moments and the twin), for sizes around the 4096-element chunk.
  for (int threads : {1, 2, 3, 8}) {
    ParallelAdamW opt(threads, 5);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4095}, std::size_t{4096},
                          std::size_t{4097}, std::size_t{8193}, std::size_t{200003}}) {
      INFO("threads " << threads << ", n " << n);
      State ref{values(n, 7, 1.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
      State got = ref;
      std::vector<float> twin_ref(n, -1.0f), twin_got(n, -2.0f);
      for (int k = 1; k <= 3; ++k) {
        const auto g = values(n, 200 + static_cast<std::uint64_t>(k), 0.1f);
        const auto g2 = values(n, 300 + static_cast<std::uint64_t>(k), 0.1f);
        std::vector<float> sum(n);
        for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + g2[i];
        adamw_update(kConfig, k, ref.p.data(), sum.data(), ref.m.data(), ref.v.data(), static_cast<std::int64_t>(n));
        twin_ref = ref.p;
        opt.update_tied(kConfig, k, got.p.data(), g.data(), g2.data(), got.m.data(), got.v.data(),
                        static_cast<std::int64_t>(n), twin_got.data());
        REQUIRE(same_bits(ref.p, got.p));
        REQUIRE(same_bits(ref.m, got.m));
        REQUIRE(same_bits(ref.v, got.v));
        REQUIRE(same_bits(twin_ref, twin_got));
      }
    }
  }
  // no twin: the update alone, as update() with the summed gradient
  ParallelAdamW opt(2, 5);
  std::vector<float> p(100, 0.5f), g(100, 0.25f), g2(100, 0.5f), m(100, 0.0f), v(100, 0.0f);
  std::vector<float> p2 = p, sum(100, 0.75f), m2 = m, v2 = v;
  opt.update_tied(kConfig, 1, p.data(), g.data(), g2.data(), m.data(), v.data(), 100, nullptr);
  opt.update(kConfig, 1, p2.data(), sum.data(), m2.data(), v2.data(), 100);
  CHECK(same_bits(p, p2));
}

TEST_CASE("parallel AdamW rejects an invalid step before writing") {
  ParallelAdamW opt(2, 1);
  std::vector<float> p(64, 1.0f), g(64, 1.0f), m(64, 0.0f), v(64, 0.0f);
  CHECK_THROWS_AS(opt.update(kConfig, 0, p.data(), g.data(), m.data(), v.data(), 64), BackendError);
  CHECK_THROWS_AS(adamw_update_vectorized(kConfig, 0, p.data(), g.data(), m.data(), v.data(), 64), BackendError);
  CHECK(p == std::vector<float>(64, 1.0f));
  CHECK(m == std::vector<float>(64, 0.0f));
}

// Issue 32: a NaN or an infinity in a gradient is reported by the update that reads it (found inside the element
// loop), in every instruction set, at any position (vector body or scalar tail) and in any thread's part; the
// results of finite elements are unchanged.
TEST_CASE("parallel AdamW reports a non-finite gradient") {
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{37}, std::size_t{1000}}) {
    for (const float bad : bad_values) {
      for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        std::vector<float> g(n, 0.25f);
        CHECK(ParallelAdamW(3, 5).update(kConfig, 1, std::vector<float>(n, 1.0f).data(), g.data(),
                                         std::vector<float>(n, 0.0f).data(), std::vector<float>(n, 0.0f).data(),
                                         static_cast<std::int64_t>(n)));
        g[at] = bad;
        for (const int threads : {1, 3}) {
          std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
          CHECK_FALSE(ParallelAdamW(threads, 5)
                          .update(kConfig, 1, p.data(), g.data(), m.data(), v.data(), static_cast<std::int64_t>(n)));
        }
        // the tied pair: a finite sum is finite, a non-finite one is reported (here via the second gradient)
        std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f), ok(n, 0.5f);
        CHECK_FALSE(ParallelAdamW(2, 5).update_tied(kConfig, 1, p.data(), ok.data(), g.data(), m.data(), v.data(),
                                                    static_cast<std::int64_t>(n), nullptr));
        CHECK(ParallelAdamW(2, 5).update_tied(kConfig, 1, p.data(), ok.data(), ok.data(), m.data(), v.data(),
                                              static_cast<std::int64_t>(n), nullptr));
      }
    }
  }
}

TEST_CASE("update_layers names the non-finite gradient nearest the loss") {
  const Gpt2 model(Gpt2Config{.vocab_size = 64, .max_seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 16});
  HostState st(model);
  st.init_weights(1);
  ParallelAdamW pool(2, 5);
  for (int l = 0; l < model.num_layers(); ++l) std::fill(st.grads(l).begin(), st.grads(l).end(), 0.01f);
  CHECK_FALSE(update_layers(st, kConfig, 0, model.num_layers() - 1, pool).has_value());
  st.grad(1, "h.0.mlp.c_fc.weight")[5] = std::nanf("");
  st.grad(2, "h.1.attn.c_proj.bias")[0] = INFINITY;
  st.grad(2, "h.1.mlp.c_proj.weight")[3] = -INFINITY;
  const auto bad = update_layers(st, kConfig, 0, model.num_layers() - 1, pool);
  REQUIRE(bad.has_value());
  CHECK(bad->layer == 2);
  CHECK(bad->param == "h.1.attn.c_proj.bias");
  CHECK(bad->params == 3);
}
