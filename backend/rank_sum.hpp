// The host's rank-order sum: how replicas' gradients add on the host (rank 0's values, then rank 1's added, ...,
// element by element, in fp32: bf16 parts are widened exactly and the sum rounded once), written once for the CPU
// communicator's all_reduce_sum / all_reduce_sum_bf16 and the executors' host ARD and RS groups, so a Program's
// replica sum is bit-identical to the communicator's by construction, not by a copy.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>

#include "backend/bf16.hpp"

namespace harmony::backend {

// An element of a part as the sum adds it: fp32 as is, bf16 widened (exact).
inline float widened(float x) { return x; }
inline float widened(Bf16 x) { return to_f32(x); }

// sum = part for rank 0, sum += part for every later rank (call in rank order 0, 1, ...).
template <class E>
void add_in_rank_order(std::span<float> sum, std::span<const E> part, std::size_t rank) {
  if (rank == 0) {
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = widened(part[i]);
  } else {
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += widened(part[i]);
  }
}
inline void add_in_rank_order(std::span<float> sum, std::span<const float> part, std::size_t rank) {
  add_in_rank_order<float>(sum, part, rank);
}

// out = the fp32 sum stored as E: fp32 copied, bf16 rounded to nearest even once.
inline void store_sum(std::span<float> out, std::span<const float> sum) {
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = sum[i];
}
inline void store_sum(std::span<Bf16> out, std::span<const float> sum) {
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = to_bf16(sum[i]);
}

// Elements [lo, hi) of an all-reduce in place over the replicas' buffers bufs[0..n): their rank-order sum
// (add_in_rank_order, a block at a time) stored into every buffer (store_sum). Disjoint slices may run on different
// threads at once, each reading and writing only its own elements, and give the same bits as one thread summing
// everything: every element is still added in rank order 0, 1, ..., n-1 and rounded once.
template <class E>
void all_reduce_slice(std::span<E* const> bufs, std::size_t lo, std::size_t hi) {
  constexpr std::size_t kBlock = 2048;  // 8 KiB of fp32 sums: stays in L1 while the parts stream through
  std::array<float, kBlock> block{};
  for (std::size_t b = lo; b < hi; b += kBlock) {
    const std::size_t m = std::min(kBlock, hi - b);
    const std::span<float> sum(block.data(), m);
    for (std::size_t r = 0; r < bufs.size(); ++r) add_in_rank_order<E>(sum, {bufs[r] + b, m}, r);
    for (E* out : bufs) store_sum(std::span<E>(out + b, m), sum);
  }
}

}  // namespace harmony::backend
