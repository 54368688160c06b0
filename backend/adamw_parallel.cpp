// AdamW split across threads and vectorised by hand: the scalar factors are computed exactly as
// adamw_update computes them, and the AVX2 / SSE2 loops apply multiply, add, sqrt and divide (each correctly
// rounded, never fused) in adamw_update's order, so each element's result is bit-identical to it. Also the
// per-layer host update on such a pool (update_layers) that the executors run and the profiler times.
#include "backend/adamw_parallel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/device.hpp"
#include "backend/model/state.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HARMONY_ADAMW_X86 1
#endif

namespace harmony::backend {
using Factors = AdamWFactors;

// adamw_update's factors, computed with the same expressions (backend/adamw.cpp).
AdamWFactors adamw_factors(const AdamWConfig& c, std::int64_t step) {
  if (step < 1) throw BackendError(fmt::format("AdamW: step {} must be >= 1", step));
  const double bias_correction1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  Factors f{};
  f.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  f.b1 = static_cast<float>(c.beta1);
  f.one_minus_b1 = static_cast<float>(1.0 - c.beta1);
  f.b2 = static_cast<float>(c.beta2);
  f.one_minus_b2 = static_cast<float>(1.0 - c.beta2);
  f.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  f.eps = static_cast<float>(c.eps);
  f.neg_step_size = static_cast<float>(-(c.lr / bias_correction1));
  return f;
}

namespace {

Factors factors(const AdamWConfig& c, std::int64_t step) { return adamw_factors(c, step); }

// adamw_update's loop body, statement for statement. Returns whether every gradient element was finite: g * 0
// is 0 for a finite g and NaN for an infinity or a NaN, so the sum of those products (one multiply and one add per
// element, beside the update's own arithmetic in a memory-bound loop) is 0 exactly when all were finite.
inline bool scalar_range(const Factors& f, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         std::int64_t begin, std::int64_t end) {
  float nonfinite = 0.0f;
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = grad[i];
    nonfinite += g * 0.0f;
    float p = param[i] * f.decay;
    const float m = exp_avg[i] * f.b1 + f.one_minus_b1 * g;
    const float v = exp_avg_sq[i] * f.b2 + f.one_minus_b2 * g * g;
    const float denom = std::sqrt(v) / f.bc2_sqrt + f.eps;
    p = p + f.neg_step_size * m / denom;
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
  return nonfinite == 0.0f;
}

#ifdef HARMONY_ADAMW_X86
// Eight lanes; every intrinsic is one IEEE operation rounded to float, as the scalar code's.
__attribute__((target("avx2"))) bool avx2_range(const Factors& f, float* param, const float* grad, float* exp_avg,
                                                float* exp_avg_sq, std::int64_t n) {
  const __m256 decay = _mm256_set1_ps(f.decay), b1 = _mm256_set1_ps(f.b1), omb1 = _mm256_set1_ps(f.one_minus_b1);
  const __m256 b2 = _mm256_set1_ps(f.b2), omb2 = _mm256_set1_ps(f.one_minus_b2);
  const __m256 bc2 = _mm256_set1_ps(f.bc2_sqrt), eps = _mm256_set1_ps(f.eps), nss = _mm256_set1_ps(f.neg_step_size);
  const __m256 zero = _mm256_setzero_ps();
  __m256 nonfinite = zero;  // scalar_range's sum of g * 0, per lane
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(grad + i);
    nonfinite = _mm256_add_ps(nonfinite, _mm256_mul_ps(g, zero));
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), decay);
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(exp_avg + i), b1), _mm256_mul_ps(omb1, g));
    const __m256 v =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), b2), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
    _mm256_storeu_ps(param + i, _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(nss, m), denom)));
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
  }
  const bool tail_finite = scalar_range(f, param, grad, exp_avg, exp_avg_sq, i, n);
  return tail_finite && _mm256_movemask_ps(_mm256_cmp_ps(nonfinite, zero, _CMP_NEQ_UQ)) == 0;
}

// Four lanes of SSE2, the x86-64 baseline.
bool sse2_range(const Factors& f, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n) {
  const __m128 decay = _mm_set1_ps(f.decay), b1 = _mm_set1_ps(f.b1), omb1 = _mm_set1_ps(f.one_minus_b1);
  const __m128 b2 = _mm_set1_ps(f.b2), omb2 = _mm_set1_ps(f.one_minus_b2);
  const __m128 bc2 = _mm_set1_ps(f.bc2_sqrt), eps = _mm_set1_ps(f.eps), nss = _mm_set1_ps(f.neg_step_size);
  const __m128 zero = _mm_setzero_ps();
  __m128 nonfinite = zero;  // scalar_range's sum of g * 0, per lane
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    nonfinite = _mm_add_ps(nonfinite, _mm_mul_ps(g, zero));
    const __m128 p = _mm_mul_ps(_mm_loadu_ps(param + i), decay);
    const __m128 m = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(exp_avg + i), b1), _mm_mul_ps(omb1, g));
    const __m128 v = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(exp_avg_sq + i), b2), _mm_mul_ps(_mm_mul_ps(omb2, g), g));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(v), bc2), eps);
    _mm_storeu_ps(param + i, _mm_add_ps(p, _mm_div_ps(_mm_mul_ps(nss, m), denom)));
    _mm_storeu_ps(exp_avg + i, m);
    _mm_storeu_ps(exp_avg_sq + i, v);
  }
  const bool tail_finite = scalar_range(f, param, grad, exp_avg, exp_avg_sq, i, n);
  return tail_finite && _mm_movemask_ps(_mm_cmpneq_ps(nonfinite, zero)) == 0;
}

bool have_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") != 0;
  return avx2;
}
#endif

// Returns whether every gradient element was finite (scalar_range).
bool vector_range(const Factors& f, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n) {
#ifdef HARMONY_ADAMW_X86
  return have_avx2() ? avx2_range(f, param, grad, exp_avg, exp_avg_sq, n)
                     : sse2_range(f, param, grad, exp_avg, exp_avg_sq, n);
#else
  return scalar_range(f, param, grad, exp_avg, exp_avg_sq, 0, n);
#endif
}

constexpr std::int64_t kLineFloats = 16;  // one 64-byte cache line

// Elements [begin, end) of an update; with grad2, the gradient is grad + grad2, summed in chunks on the stack
// (elements are independent, so chunking changes no result); with copy_to, param is then copied there. Returns
// whether every gradient element (the sum, with grad2) was finite.
bool run_range(const Factors& f, float* param, const float* grad, const float* grad2, float* exp_avg, float* exp_avg_sq,
               float* copy_to, std::int64_t begin, std::int64_t end) {
  bool finite = true;
  if (grad2 == nullptr) {
    finite = vector_range(f, param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin);
  } else {
    constexpr std::int64_t kChunk = 4096;
    std::array<float, kChunk> sum{};
    for (std::int64_t i = begin; i < end; i += kChunk) {
      const std::int64_t c = std::min(kChunk, end - i);
      for (std::int64_t j = 0; j < c; ++j) sum[static_cast<std::size_t>(j)] = grad[i + j] + grad2[i + j];
      finite = vector_range(f, param + i, sum.data(), exp_avg + i, exp_avg_sq + i, c) && finite;
    }
  }
  if (copy_to != nullptr)
    std::memcpy(copy_to + begin, param + begin, static_cast<std::size_t>(end - begin) * sizeof(float));
  return finite;
}

}  // namespace

void adamw_update_vectorized(const AdamWConfig& config, std::int64_t step, float* param, const float* grad,
                             float* exp_avg, float* exp_avg_sq, std::int64_t n) {
  const Factors f = factors(config, step);
  if (n > 0) vector_range(f, param, grad, exp_avg, exp_avg_sq, n);
}

bool adamw_apply(const AdamWFactors& f, float* param, const float* grad, const float* grad2, float* exp_avg,
                 float* exp_avg_sq, float* twin, std::int64_t n) {
  return n <= 0 || run_range(f, param, grad, grad2, exp_avg, exp_avg_sq, twin, 0, n);
}

bool adamw_apply_bf16(const AdamWFactors& f, float* master, Bf16* working, const Bf16* grad, const Bf16* grad2,
                      float* exp_avg, float* exp_avg_sq, Bf16* twin, std::int64_t n) {
  // In chunks on the stack (elements are independent, so chunking changes no result): the gradient widened (and
  // the twin's added in fp32, as the host sums the widened gradients), the update, the master rounded.
  constexpr std::int64_t kChunk = 4096;
  std::array<float, kChunk> g{};
  bool finite = true;
  for (std::int64_t i = 0; i < n; i += kChunk) {
    const std::int64_t c = std::min(kChunk, n - i);
    const auto uc = static_cast<std::size_t>(c);
    if (grad2 == nullptr) {
      for (std::size_t j = 0; j < uc; ++j) g[j] = to_f32(grad[i + static_cast<std::int64_t>(j)]);
    } else {
      for (std::size_t j = 0; j < uc; ++j) {
        const auto k = i + static_cast<std::int64_t>(j);
        g[j] = to_f32(grad[k]) + to_f32(grad2[k]);
      }
    }
    finite = vector_range(f, master + i, g.data(), exp_avg + i, exp_avg_sq + i, c) && finite;
    for (std::int64_t j = i; j < i + c; ++j) working[j] = to_bf16(master[j]);
    if (twin != nullptr) std::memcpy(twin + i, working + i, uc * sizeof(Bf16));
  }
  return finite;
}

void adamw_update_isa(std::string_view isa, const AdamWConfig& config, std::int64_t step, float* param,
                      const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n) {
  const Factors f = factors(config, step);
  if (isa == "scalar") {
    scalar_range(f, param, grad, exp_avg, exp_avg_sq, 0, n);
    return;
  }
#ifdef HARMONY_ADAMW_X86
  if (isa == "sse2") {
    sse2_range(f, param, grad, exp_avg, exp_avg_sq, n);
    return;
  }
  if (isa == "avx2" && have_avx2()) {
    avx2_range(f, param, grad, exp_avg, exp_avg_sq, n);
    return;
  }
#endif
  throw BackendError(fmt::format("AdamW: instruction set '{}' is not available on this CPU", isa));
}

const char* adamw_vector_isa() {
#ifdef HARMONY_ADAMW_X86
  return have_avx2() ? "avx2" : "sse2";
#else
  return "scalar";
#endif
}

struct ParallelAdamW::Impl {
  int threads = 1;
  std::int64_t min_per_thread = 1;
  std::vector<std::thread> workers;  // threads - 1 of them; the caller takes range 0
  std::mutex mu;
  std::condition_variable start_cv, done_cv;
  std::uint64_t generation = 0;
  int pending = 0;
  bool stop = false;
  // The current job.
  Factors f{};
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad2 = nullptr;  // update_tied: the twin's gradient, added to grad
  bool finite = true;            // every gradient element of the job's parts so far (under mu)
  float* copy_to = nullptr;      // update_tied: the twin's weights, overwritten with param
  std::int64_t n = 0;
  int parts = 1;

  // Range k of `parts`: whole cache lines (of the element index), the remainder in the last part.
  // Returns whether its gradient elements were finite.
  bool run_part(int k) const {
    const std::int64_t lines = (n + kLineFloats - 1) / kLineFloats;
    const std::int64_t begin = std::min(n, lines * k / parts * kLineFloats);
    const std::int64_t end = std::min(n, lines * (k + 1) / parts * kLineFloats);
    return end <= begin || run_range(f, param, grad, grad2, exp_avg, exp_avg_sq, copy_to, begin, end);
  }

  void worker(int k) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mu);
        start_cv.wait(lock, [&]() { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        if (k >= parts) continue;  // not needed for this job (and not counted in pending)
      }
      const bool part_finite = run_part(k);
      {
        std::lock_guard lock(mu);
        finite = finite && part_finite;
        if (--pending == 0) done_cv.notify_one();
      }
    }
  }
};

ParallelAdamW::ParallelAdamW(int threads, std::int64_t min_elements_per_thread) : impl_(std::make_unique<Impl>()) {
  if (threads <= 0) threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  impl_->threads = threads;
  impl_->min_per_thread = std::max<std::int64_t>(1, min_elements_per_thread);
  impl_->workers.reserve(static_cast<std::size_t>(threads - 1));
  for (int k = 1; k < threads; ++k) impl_->workers.emplace_back([this, k]() { impl_->worker(k); });
}

ParallelAdamW::~ParallelAdamW() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->start_cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

int ParallelAdamW::threads() const { return impl_->threads; }

bool ParallelAdamW::update(const AdamWConfig& config, std::int64_t step, float* param, const float* grad,
                           float* exp_avg, float* exp_avg_sq, std::int64_t n) {
  return update_tied(config, step, param, grad, nullptr, exp_avg, exp_avg_sq, n, nullptr);
}

bool ParallelAdamW::update_tied(const AdamWConfig& config, std::int64_t step, float* param, const float* grad,
                                const float* grad2, float* exp_avg, float* exp_avg_sq, std::int64_t n, float* copy_to) {
  const Factors f = factors(config, step);
  if (n <= 0) return true;
  const auto parts = static_cast<int>(std::clamp<std::int64_t>(n / impl_->min_per_thread, 1, impl_->threads));
  if (parts == 1) return run_range(f, param, grad, grad2, exp_avg, exp_avg_sq, copy_to, 0, n);
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    s.f = f;
    s.param = param;
    s.grad = grad;
    s.grad2 = grad2;
    s.copy_to = copy_to;
    s.exp_avg = exp_avg;
    s.exp_avg_sq = exp_avg_sq;
    s.n = n;
    s.parts = parts;
    s.pending = parts - 1;
    s.finite = true;
    ++s.generation;
  }
  s.start_cv.notify_all();
  const bool first_finite = s.run_part(0);
  std::unique_lock lock(s.mu);
  s.done_cv.wait(lock, [&]() { return s.pending == 0; });
  return first_finite && s.finite;
}

std::optional<NonFiniteGradient> update_layers(HostState& st, const AdamWConfig& config, int first, int last,
                                               ParallelAdamW& pool) {
  config.validate();
  const Gpt2& m = st.model();
  if (first < 0 || last >= m.num_layers() || first > last)
    throw BackendError(
        fmt::format("host state: update of layers {}..{} outside 0..{}", first, last, m.num_layers() - 1));
  const int head = m.head_layer();
  std::optional<NonFiniteGradient> nonfinite;
  const auto note = [&](bool finite, int l, const ParamSpec& ps) {
    if (finite) return;
    if (!nonfinite || l > nonfinite->layer) {  // the highest layer's first: the one nearest the loss
      const int before = nonfinite ? nonfinite->params : 0;
      nonfinite = NonFiniteGradient{l, ps.name, before};
    }
    ++nonfinite->params;
  };
  for (int l = first; l <= last; ++l) {
    const std::int64_t step = st.steps(l) + 1;
    st.set_steps(l, step);
    float* w = st.weights(l).data();
    float* mo = st.exp_avg(l).data();
    float* v = st.exp_avg_sq(l).data();
    const float* g = st.grads(l).data();
    for (const ParamSpec& ps : m.params(l)) {
      if (!ps.tied_to.empty()) continue;  // lm_head: updated through layer 0's wte
      if (l == 0 && m.tied() && ps.name == m.embedding_name()) {
        // the tie: wte's and lm_head's gradients summed, wte updated and copied into lm_head, in one parallel pass
        // (HostState::sync_tied's copy, split across the pool)
        const std::int64_t head_offset = m.param(head, "lm_head.weight").offset;
        const float* gh = std::as_const(st).grads(head).data() + head_offset;
        float* wh = st.weights(head).data() + head_offset;
        note(pool.update_tied(config, step, w + ps.offset, g + ps.offset, gh, mo + ps.offset, v + ps.offset, ps.numel,
                              wh),
             l, ps);
        continue;
      }
      note(pool.update(config, step, w + ps.offset, g + ps.offset, mo + ps.offset, v + ps.offset, ps.numel), l, ps);
    }
  }
  return nonfinite;
}

}  // namespace harmony::backend
