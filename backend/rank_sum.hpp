// The host's rank-order sum: how replicas' fp32 gradients add on the host (rank 0's values, then rank 1's added,
// ..., element by element), written once for the CPU communicator's all_reduce_sum and the executors' ARD and
// RS groups, so a Program's replica sum is bit-identical to the communicator's by construction, not by a copy.
#pragma once

#include <cstddef>
#include <span>

namespace harmony::backend {

// sum = part for rank 0, sum += part for every later rank (call in rank order 0, 1, ...).
inline void add_in_rank_order(std::span<float> sum, std::span<const float> part, std::size_t rank) {
  if (rank == 0) {
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = part[i];
  } else {
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
}

}  // namespace harmony::backend
