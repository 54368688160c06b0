// The bf16 staging's element-wise rounding and widening on a few threads (bf16_convert.hpp).
#include "backend/bf16_convert.hpp"

#include <algorithm>
#include <thread>

#include "core/base/parallel.hpp"

namespace harmony::backend {
namespace {

// fn(begin, end) over [0, n) in contiguous chunks on up to 16 threads (core::parallel_for; the calling one among
// them). Serial below 1M elements, where starting threads costs more than it saves.
template <class F>
void parallel_chunks(std::int64_t n, F&& fn) {
  constexpr std::int64_t kMinChunk = std::int64_t{1} << 20;
  const std::int64_t hw = std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  const std::int64_t parts = std::clamp<std::int64_t>(n / kMinChunk, 1, std::min<std::int64_t>(hw, 16));
  const std::int64_t step = (n + parts - 1) / parts;
  core::parallel_for(static_cast<std::size_t>(parts), static_cast<unsigned>(parts), [&](std::size_t k) {
    const auto b = static_cast<std::int64_t>(k) * step;
    fn(b, std::min(n, b + step));
  });
}

}  // namespace

void round_to_bf16(const float* in, Bf16* out, std::int64_t n) {
  parallel_chunks(n, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) out[i] = to_bf16(in[i]);
  });
}

void widen_from_bf16(const Bf16* in, float* out, std::int64_t n) {
  parallel_chunks(n, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) out[i] = to_f32(in[i]);
  });
}

}  // namespace harmony::backend
