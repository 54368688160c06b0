// The CUDA kernels' index arithmetic (backend/cuda/kernels.cu), all in 64 bits: element offsets, grid sizes,
// grid-stride loops and the column reductions' row parts. Plain inline functions compiled both by nvcc (host and
// device) and by the host compiler, so CPU tests check them at sizes past 2^31 elements without allocating any.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HARMONY_HD __host__ __device__ __forceinline__
#else
#define HARMONY_HD inline
#endif

namespace harmony::backend::cuda::idx {

// A grid-stride loop's grid is capped at this many blocks (the loop covers the rest).
inline constexpr std::int64_t kMaxStrideBlocks = 65535 * 32;
// CUDA's limit on gridDim.x.
inline constexpr std::int64_t kMaxGridX = 2147483647;

// Offset of element (r, c) of a row-major matrix with `cols` columns.
HARMONY_HD constexpr std::int64_t at(std::int64_t r, std::int64_t cols, std::int64_t c) { return r * cols + c; }

// Row and column of flat element i of a row-major matrix with `cols` columns.
struct RowCol {
  std::int64_t r, c;
};
HARMONY_HD constexpr RowCol row_col(std::int64_t i, std::int64_t cols) { return {i / cols, i % cols}; }

// A grid-stride loop: the first element of a thread and the step between its elements.
HARMONY_HD constexpr std::int64_t stride_first(std::int64_t block, std::int64_t block_dim, std::int64_t thread) {
  return block * block_dim + thread;
}
HARMONY_HD constexpr std::int64_t stride_step(std::int64_t grid, std::int64_t block_dim) { return grid * block_dim; }

// Blocks of a grid-stride loop over n elements, per_block per block: capped at kMaxStrideBlocks.
HARMONY_HD constexpr std::int64_t blocks_for(std::int64_t n, std::int64_t per_block) {
  const std::int64_t b = (n + per_block - 1) / per_block;
  return b < kMaxStrideBlocks ? b : kMaxStrideBlocks;
}
// Blocks of a kernel with one item (row, column) per warp or thread and no loop: never capped (the launcher
// checks kMaxGridX).
HARMONY_HD constexpr std::int64_t blocks_exact(std::int64_t items, std::int64_t per_block) {
  return (items + per_block - 1) / per_block;
}

// The column reductions (bias and LayerNorm parameter gradients) as a tree: the N rows are cut into `parts`
// parts of consecutive rows, each summed per column by one block of kColTile columns x kColRows threads; then
// each column adds its parts in part order. The cut depends on N and the number of columns only (never on the
// GPU), so results are the same on every GPU and every run.
inline constexpr std::int64_t kColTile = 32;            // columns per block (one warp wide: coalesced rows)
inline constexpr std::int64_t kColRows = 8;             // threads per column in a block
inline constexpr std::int64_t kColMinRows = 32;         // rows per part at least
inline constexpr std::int64_t kColTargetBlocks = 1024;  // blocks wanted in all (several per SM on an H200's 132)
inline constexpr std::int64_t kColMaxParts = 256;
HARMONY_HD constexpr std::int64_t column_tiles(std::int64_t cols) { return (cols + kColTile - 1) / kColTile; }
HARMONY_HD constexpr std::int64_t column_parts(std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  const std::int64_t by_rows = (rows + kColMinRows - 1) / kColMinRows;  // no part shorter than kColMinRows
  const std::int64_t tiles = column_tiles(cols);
  std::int64_t want = (kColTargetBlocks + tiles - 1) / tiles;
  if (want > kColMaxParts) want = kColMaxParts;
  return want < by_rows ? want : by_rows;
}
// Rows [part_begin(p), part_begin(p + 1)) of part p of `parts` over `rows` rows; part_begin(parts) == rows.
HARMONY_HD constexpr std::int64_t part_begin(std::int64_t rows, std::int64_t parts, std::int64_t p) {
  return rows / parts * p + (p < rows % parts ? p : rows % parts);
}

}  // namespace harmony::backend::cuda::idx
