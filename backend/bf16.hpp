// bfloat16 storage for mixed-precision training: the Bf16 element type (fp32's sign, 8-bit exponent and top 7
// mantissa bits), rounding from fp32 to nearest even (NaN kept a quiet NaN, overflow to inf, denormals kept)
// and exact widening back, and the DType a device tensor is stored in (docs/backend.md, "Mixed precision").
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/base/units.hpp"

namespace harmony::backend {

// One bfloat16 value, as its bits. Arithmetic happens in fp32: widen with to_f32, store with to_bf16.
struct Bf16 {
  std::uint16_t bits = 0;
  bool operator==(const Bf16&) const = default;
};
static_assert(sizeof(Bf16) == 2);

// Round to nearest, ties to even: the 16 dropped bits decide, and exactly half rounds the kept mantissa to
// even (so 1 + 2^-8, halfway between two bf16 values, rounds down to 1 and 1 + 3 * 2^-8 up to 1 + 2^-6).
// A NaN stays a NaN (its top payload bit set, so a payload living only in the dropped bits cannot become inf);
// values beyond the largest bf16 round to inf; fp32 denormals round like any other value.
constexpr Bf16 to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffU) > 0x7f800000U) return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040U)};
  const std::uint32_t rounded = u + 0x7fffU + ((u >> 16) & 1U);
  return Bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

// Exact: every bf16 value is an fp32 value.
constexpr float to_f32(Bf16 b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16); }

// fp32 rounded through bf16 and back (what storing a value in a bf16 tensor does to it).
constexpr float round_bf16(float f) { return to_f32(to_bf16(f)); }

// How a device stores the model's weights, activations and gradients. F32 is the default and the numerics of
// every result before mixed precision; BF16 keeps fp32 master weights and AdamW state on the host.
enum class DType : std::uint8_t { F32, BF16 };

constexpr core::Bytes dtype_bytes(DType d) { return d == DType::BF16 ? 2 : 4; }
// "fp32" / "bf16": the spelling of train.dtype, --dtype and a profile's "dtype".
constexpr std::string_view dtype_name(DType d) { return d == DType::BF16 ? "bf16" : "fp32"; }
constexpr std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "fp32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  return std::nullopt;
}

}  // namespace harmony::backend
