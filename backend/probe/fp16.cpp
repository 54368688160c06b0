// IEEE half-precision conversion for the probe's fp16 AdamW measurement (probe.hpp): scalar round to nearest even,
// and F16C's vcvtps2ph / vcvtph2ps (the same bits) where the CPU has them.
#include <bit>
#include <cmath>
#include <cstdint>

#include "backend/probe/probe.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HARMONY_PROBE_F16C 1
#endif

namespace harmony::backend {

std::uint16_t to_fp16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t a = x & 0x7fffffffU;
  if (a > 0x7f800000U) return static_cast<std::uint16_t>(sign | 0x7e00U | ((a >> 13) & 0x3ffU));  // NaN, quiet
  if (a >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // >= 65520 (65504 + half an ulp): inf
  if (a < 0x33000000U) return sign;                                         // <= 2^-25: rounds to 0
  const std::uint32_t e = a >> 23;
  if (e < 113) {  // below 2^-14: a half subnormal, m_h = f * 2^24 rounded
    const std::uint32_t mant = (a & 0x7fffffU) | 0x800000U;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1U << shift) - 1U), half = 1U << (shift - 1);
    if (rem > half || (rem == half && (h & 1U) != 0)) ++h;  // may carry into the smallest normal: still exact
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ffU);
  const std::uint32_t rem = a & 0x1fffU;
  if (rem > 0x1000U || (rem == 0x1000U && (h & 1U) != 0)) ++h;  // a carry moves into the exponent, as it should
  return static_cast<std::uint16_t>(sign | h);
}

float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fU, mant = h & 0x3ffU;
  if (e == 0x1f) {  // inf, or NaN made quiet (as vcvtph2ps does)
    return std::bit_cast<float>(sign | 0x7f800000U | (mant << 13) | (mant != 0 ? 0x400000U : 0U));
  }
  if (e == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (mant << 13));
}

#ifdef HARMONY_PROBE_F16C
namespace {

bool have_f16c() {
  static const bool f16c = __builtin_cpu_supports("f16c") != 0 && __builtin_cpu_supports("avx") != 0;
  return f16c;
}

__attribute__((target("avx,f16c"))) void to_fp16_f16c(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);  // NOLINT(*-reinterpret-cast): the intrinsics' type
  }
  for (; i < n; ++i) out[i] = to_fp16(in[i]);
}

__attribute__((target("avx,f16c"))) void from_fp16_f16c(const std::uint16_t* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));  // NOLINT(*-reinterpret-cast)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = from_fp16(in[i]);
}

}  // namespace
#endif

void to_fp16_array(const float* in, std::uint16_t* out, std::int64_t n) {
#ifdef HARMONY_PROBE_F16C
  if (have_f16c()) return to_fp16_f16c(in, out, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_fp16(in[i]);
}

void from_fp16_array(const std::uint16_t* in, float* out, std::int64_t n) {
#ifdef HARMONY_PROBE_F16C
  if (have_f16c()) return from_fp16_f16c(in, out, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) out[i] = from_fp16(in[i]);
}

const char* fp16_isa() {
#ifdef HARMONY_PROBE_F16C
  if (have_f16c()) return "f16c";
#endif
  return "scalar";
}

}  // namespace harmony::backend
