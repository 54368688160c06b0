// The CUDA kernels' index arithmetic (backend/cuda/index.hpp) on the CPU, at sizes past 2^31 elements that no
// test could allocate: GPT-2's logits (B*T = 65536 rows x V = 50257), a LayerNorm/bias gradient over
// 2^21 rows x 1600 columns, the attention's B*H*T rows of T scores. Runs in every build (no CUDA needed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/cuda/index.hpp"

namespace idx = harmony::backend::cuda::idx;

namespace {
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
// GPT-2's padded vocabulary and a batch of 64 sequences of 1024 tokens: 3.29e9 logits.
constexpr int kRows = 64 * 1024, kVocab = 50257;
constexpr std::int64_t kLogits = std::int64_t{kRows} * kVocab;
}  // namespace

TEST_CASE("the logits are more than 2^31 elements, so every offset below must be 64-bit") {
  static_assert(kLogits > kInt32Max);
  CHECK(kLogits == 3293642752);
}

TEST_CASE("element offsets and their inverse past 2^31 (crossentropy_fwd rows, crossentropy_bwd elements)") {
  // The cross-entropy forward's row base and the last element, computed from int arguments as the kernels do.
  const int r = kRows - 1, V = kVocab;
  CHECK(idx::at(r, V, 0) == std::int64_t{65535} * 50257);
  CHECK(idx::at(r, V, V - 1) == kLogits - 1);
  CHECK(idx::at(r, V, V - 1) > kInt32Max);
  // The backward's flat index back to (row, vocabulary entry), at and around 2^31 and at the end.
  for (const std::int64_t i : {kInt32Max - 1, kInt32Max, kInt32Max + 1, kLogits - kVocab, kLogits - 1}) {
    CAPTURE(i);
    const idx::RowCol rc = idx::row_col(i, V);
    CHECK(rc.r >= 0);
    CHECK(rc.r < kRows);
    CHECK(rc.c >= 0);
    CHECK(rc.c < V);
    CHECK(idx::at(rc.r, V, rc.c) == i);
  }
  CHECK(idx::row_col(kLogits - 1, kVocab).r == kRows - 1);
  CHECK(idx::row_col(kLogits - 1, kVocab).c == kVocab - 1);
}

TEST_CASE("a capped grid-stride loop over more than 2^31 elements visits each exactly once") {
  constexpr int kThreads = 256;
  const std::int64_t blocks = idx::blocks_for(kLogits, kThreads);
  CHECK(blocks == idx::kMaxStrideBlocks);  // capped: the loop covers the rest
  CHECK(blocks <= idx::kMaxGridX);
  const std::int64_t step = idx::stride_step(blocks, kThreads);
  CHECK(step == idx::kMaxStrideBlocks * kThreads);
  // Element i belongs to thread (i % step) and its iteration i / step; the first and the last thread's walks
  // reach past 2^31 in steps that do not wrap, and end at the last element or just before it.
  const std::int64_t last_thread = idx::stride_first(blocks - 1, kThreads, kThreads - 1);
  CHECK(last_thread == step - 1);
  std::int64_t visits = 0, last = -1;
  for (std::int64_t thread : {std::int64_t{0}, last_thread}) {
    for (std::int64_t i = thread; i < kLogits; i += step) {
      CHECK(i % step == thread);
      CHECK(i > last);
      last = i;
      ++visits;
    }
    last = -1;
  }
  // Iterations per thread: ceil(kLogits / step) for the first, floor for the last when step does not divide.
  CHECK(visits == (kLogits + step - 1) / step + kLogits / step);
  CHECK(idx::blocks_for(1000, kThreads) == 4);  // small sizes are not capped
}

TEST_CASE("one-per-item grids: a row per warp for the attention softmax and LayerNorm, no cap, 64-bit rows") {
  // B = 64, H = 25, T = 1024: 1.6M rows of T scores; 1.7e9 scores, and att offsets q * T past 2^31 for B = 96.
  const std::int64_t rows = std::int64_t{96} * 25 * 1024;
  CHECK(idx::blocks_exact(rows, 8) == rows / 8);
  CHECK(idx::at(rows - 1, 1024, 1023) == rows * 1024 - 1);
  CHECK(idx::at(rows - 1, 1024, 1023) > kInt32Max);
  CHECK(idx::blocks_exact(7, 8) == 1);
  CHECK(idx::blocks_exact(0, 8) == 0);
}

TEST_CASE("column reductions: parts cover the rows exactly, in order, sized by the shape only") {
  struct Shape {
    std::int64_t rows, cols;
  };
  for (const Shape sh : {Shape{1, 1}, Shape{31, 5}, Shape{67, 777}, Shape{1000, 777}, Shape{8192, 768},
                         Shape{8192, 50257}, Shape{std::int64_t{1} << 21, 1600}}) {
    CAPTURE(sh.rows);
    CAPTURE(sh.cols);
    const std::int64_t parts = idx::column_parts(sh.rows, sh.cols);
    REQUIRE(parts >= 1);
    CHECK(parts <= idx::kColMaxParts);
    CHECK(parts <= (sh.rows + idx::kColMinRows - 1) / idx::kColMinRows);
    CHECK(idx::part_begin(sh.rows, parts, 0) == 0);
    CHECK(idx::part_begin(sh.rows, parts, parts) == sh.rows);
    std::int64_t covered = 0, shortest = sh.rows, longest = 0;
    for (std::int64_t p = 0; p < parts; ++p) {
      const std::int64_t b = idx::part_begin(sh.rows, parts, p), e = idx::part_begin(sh.rows, parts, p + 1);
      CHECK(b == covered);  // consecutive, in order
      covered = e;
      shortest = std::min(shortest, e - b);
      longest = std::max(longest, e - b);
    }
    CHECK(covered == sh.rows);
    CHECK(longest - shortest <= 1);  // balanced
    // The partial-sum workspace offset of the last column of the last part (and of the second output).
    const std::int64_t total = parts * sh.cols;
    CHECK(idx::at(parts - 1, sh.cols, sh.cols - 1) == total - 1);
  }
  // 2^21 rows x 1600 columns: the element offsets of the gradient's input pass 2^31.
  const std::int64_t rows = std::int64_t{1} << 21;
  CHECK(idx::at(rows - 1, 1600, 1599) == rows * 1600 - 1);
  CHECK(idx::at(rows - 1, 1600, 1599) > kInt32Max);
  // Enough blocks for a large GPU: 768 columns = 24 tiles x 43 parts >= 1024 blocks.
  CHECK(idx::column_tiles(768) * idx::column_parts(8192, 768) >= idx::kColTargetBlocks);
  CHECK(idx::column_parts(0, 768) == 0);
}
