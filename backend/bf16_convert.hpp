// The host side of the bf16 staging (docs/backend.md, "Mixed precision"): fp32 rounded to bf16 and bf16 widened to
// fp32 over an array, element by element (bf16.hpp's to_bf16 / to_f32), on up to 16 threads. The executor's
// stage_up / stage_down run their chunks through these, and `harmony-run probe` measures them (backend/probe/).
#pragma once

#include <cstdint>

#include "backend/bf16.hpp"

namespace harmony::backend {

// out[i] = to_bf16(in[i]) for i < n: memory-bound work one core does at a fraction of the host's bandwidth, so it is
// split into contiguous ranges on min(16, hardware threads, n / 1M) threads (the caller one of them); serial below
// 1M elements, where starting threads costs more than it saves. The arrays must not overlap.
void round_to_bf16(const float* in, Bf16* out, std::int64_t n);
// out[i] = to_f32(in[i]) for i < n (exact), split as round_to_bf16.
void widen_from_bf16(const Bf16* in, float* out, std::int64_t n);

}  // namespace harmony::backend
