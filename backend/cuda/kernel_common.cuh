// Device helpers the CUDA kernel units share (kernels.cu, llama_kernels.cu): the storage-to-device type map,
// widening loads and rounding stores, launch-shape helpers, warp and block reductions, and the deterministic tree
// column sums behind the parameter gradients (bias, LayerNorm, RMSNorm). Included only by .cu files; everything is
// internal to each unit (an unnamed namespace), so no kernel is defined twice across units.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/bf16.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/index.hpp"

namespace harmony::backend::cuda::kern {

namespace {  // NOLINT(cert-dcl59-cpp,google-build-namespaces): one copy per .cu unit by design

// The device element type of a launcher's storage type: float, or __nv_bfloat16 for Bf16.
template <class S>
struct DevType {
  using type = S;
};
template <>
struct DevType<Bf16> {
  using type = __nv_bfloat16;
};
template <class S>
using Dev = typename DevType<S>::type;
template <class S>
Dev<S>* dev(S* p) {
  return reinterpret_cast<Dev<S>*>(p);
}
template <class S>
const Dev<S>* dev(const S* p) {
  return reinterpret_cast<const Dev<S>*>(p);
}

// Load widened to fp32; store from fp32 (bf16: round to nearest even, once).
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void st(float& dst, float v) { dst = v; }
__device__ __forceinline__ void st(__nv_bfloat16& dst, float v) { dst = __float2bfloat16_rn(v); }

constexpr int kThreads = 256;  // threads per block
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Blocks of a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned blocks_for(std::int64_t n, int per_block = kThreads) {
  return static_cast<unsigned>(idx::blocks_for(n, per_block));
}
// Blocks of a kernel with one item (row, column) per warp or thread and no loop: never capped.
inline unsigned blocks_exact(std::int64_t items, int per_block) {
  const std::int64_t b = idx::blocks_exact(items, per_block);
  if (b > idx::kMaxGridX) throw_cuda_error(cudaErrorInvalidConfiguration, "grid too large", __FILE__, __LINE__);
  return static_cast<unsigned>(b);
}

// The grid-stride loop over [0, n) of the calling thread.
#define HARMONY_GRID_STRIDE(i, n)                                                        \
  for (std::int64_t i = idx::stride_first(blockIdx.x, blockDim.x, threadIdx.x); i < (n); \
       i += idx::stride_step(gridDim.x, blockDim.x))

// Butterfly sum over a warp: a fixed tree, and every lane ends with the same value (a + b == b + a).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Block-wide reductions for kThreads threads; every thread gets the result. `shared` holds kWarps floats.
__device__ inline float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// The tree alternative (idx::column_parts): block (tile, p) sums rows of part p for kColTile columns, kColRows
// threads per column each taking every kColRows-th row, then the kColRows partial sums in thread order; the
// partials of the parts go to `partial` ([parts, C] per output), and column_parts_add_kernel adds them to the
// gradients in part order. Deterministic, but not the CPU's row order. The sums by mode: kBias, one output (dout);
// kLayerNorm, two (dout, and (in - mean) rstd dout); kRmsNorm, one ((in rstd) dout: RMSNorm's dw).
enum class ColumnSums { kBias, kLayerNorm, kRmsNorm };
template <ColumnSums kMode, class D>
__global__ void column_parts_kernel(float* partial, const D* dout, const D* in, const float* mean, const float* rstd,
                                    int N, int C, int parts) {
  constexpr bool kLayerNorm = kMode == ColumnSums::kLayerNorm;
  __shared__ float sh_b[idx::kColRows][idx::kColTile];
  __shared__ float sh_w[idx::kColRows][idx::kColTile];
  const int tx = threadIdx.x % idx::kColTile, ty = threadIdx.x / idx::kColTile;
  const std::int64_t c = idx::at(blockIdx.x, idx::kColTile, tx);
  const std::int64_t p = blockIdx.y;
  const std::int64_t begin = idx::part_begin(N, parts, p), end = idx::part_begin(N, parts, p + 1);
  float acc_b = 0.0f, acc_w = 0.0f;
  if (c < C) {
    for (std::int64_t r = begin + ty; r < end; r += idx::kColRows) {
      const std::int64_t i = idx::at(r, C, c);
      const float d = ld(dout[i]);
      if constexpr (kMode == ColumnSums::kRmsNorm) {
        acc_b += (ld(in[i]) * rstd[r]) * d;  // as rmsnorm_bwd_params_kernel's term
      } else {
        acc_b += d;
      }
      if constexpr (kLayerNorm) acc_w += (ld(in[i]) - mean[r]) * rstd[r] * d;
    }
  }
  sh_b[ty][tx] = acc_b;
  sh_w[ty][tx] = acc_w;
  __syncthreads();
  if (ty == 0 && c < C) {
    float sb = sh_b[0][tx], sw = sh_w[0][tx];
    for (int k = 1; k < idx::kColRows; ++k) {
      sb += sh_b[k][tx];
      sw += sh_w[k][tx];
    }
    const std::int64_t total = static_cast<std::int64_t>(parts) * C;
    partial[idx::at(p, C, c)] = sb;
    if constexpr (kLayerNorm) partial[total + idx::at(p, C, c)] = sw;
  }
}

// db[c] += sum of the parts in order (and dw[c] from the second half of `partial` when dw is not null).
template <class D>
__global__ void column_parts_add_kernel(D* db, D* dw, const float* partial, int C, int parts) {
  const std::int64_t total = static_cast<std::int64_t>(parts) * C;
  HARMONY_GRID_STRIDE(c, static_cast<std::int64_t>(C)) {
    float acc_b = ld(db[c]);
    for (int p = 0; p < parts; ++p) acc_b += partial[idx::at(p, C, c)];
    st(db[c], acc_b);
    if (dw != nullptr) {
      float acc_w = ld(dw[c]);
      for (int p = 0; p < parts; ++p) acc_w += partial[total + idx::at(p, C, c)];
      st(dw[c], acc_w);
    }
  }
}

// --- matmul helpers ---

template <class D>
__global__ void fill_bias_rows_kernel(D* out, const D* bias, std::int64_t total, int OC) {
  HARMONY_GRID_STRIDE(i, total)
  out[i] = bias[idx::row_col(i, OC).c];  // a copy: exact in either storage
}

template <class D>
__global__ void bias_grad_kernel(D* dbias, const D* dout, int N, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = ld(dbias[o]);
#pragma unroll 8
  for (int r = 0; r < N; ++r) acc += ld(dout[idx::at(r, OC, o)]);
  st(dbias[o], acc);
}

// --- attention softmax: one warp per row; lane k owns the columns t2 = k, k + 32, ... in every pass ---

__global__ void causal_softmax_fwd_kernel(float* att, std::int64_t rows, int T, float sqrt_hs) {
  const int lane = threadIdx.x % 32;
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (q >= rows) return;
  const int t = static_cast<int>(q % T);
  float* a = att + idx::at(q, T, 0);
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float x = a[t2] / sqrt_hs;
    a[t2] = x;
    mx = fmaxf(mx, x);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float e = expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
}

template <class D>
__global__ void causal_softmax_bwd_kernel(float* datt, const D* att, std::int64_t rows, int T, float sqrt_hs) {
  const int lane = threadIdx.x % 32;
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (q >= rows) return;
  const int t = static_cast<int>(q % T);
  float* d = datt + idx::at(q, T, 0);
  const D* a = att + idx::at(q, T, 0);
  float dsum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) dsum += ld(a[t2]) * d[t2];
  dsum = warp_sum(dsum);
  for (int t2 = lane; t2 < T; t2 += 32) d[t2] = t2 <= t ? ld(a[t2]) * (d[t2] - dsum) / sqrt_hs : 0.0f;
}

// --- element-wise ---

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi), as cpu::kGeluScale<float>
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluCubic3 = static_cast<float>(3 * 0.044715);

template <class D>
__global__ void gelu_fwd_kernel(D* out, const D* in, std::int64_t n) {
  HARMONY_GRID_STRIDE(i, n) {
    const float x = ld(in[i]);
    st(out[i], 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * (x * x * x)))));
  }
}

template <class D>
__global__ void gelu_bwd_kernel(D* din, const D* in, const D* dout, std::int64_t n) {
  HARMONY_GRID_STRIDE(i, n) {
    const float x = ld(in[i]);
    const float u = kGeluScale * (x + kGeluCubic * (x * x * x));
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + kGeluCubic3 * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    st(din[i], grad * ld(dout[i]));
  }
}

template <class D>
__global__ void add_kernel(D* out, const D* a, const D* b, std::int64_t n) {
  HARMONY_GRID_STRIDE(i, n)
  st(out[i], ld(a[i]) + ld(b[i]));
}

// acc (fp32) += x widened (the communicator's rank-order sums).
template <class D>
__global__ void add_widened_kernel(float* acc, const D* x, std::int64_t n) {
  HARMONY_GRID_STRIDE(i, n)
  acc[i] += ld(x[i]);
}

// The bf16 fast attention's softmax (causal_softmax_bf16_fwd / _bwd): one warp per row of T, fp32 in registers, the
// row read as bf16 and written once as bf16. Forward: the scores scaled by 1 / sqrt_hs, max, exp, sum, then each
// probability recomputed and rounded (zeros above the diagonal).
__global__ void causal_softmax_bf16_fwd_kernel(__nv_bfloat16* att, std::int64_t rows, int T, float sqrt_hs) {
  const int lane = threadIdx.x % 32;
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (q >= rows) return;
  const int t = static_cast<int>(q % T);
  __nv_bfloat16* a = att + idx::at(q, T, 0);
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) mx = fmaxf(mx, ld(a[t2]) / sqrt_hs);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) sum += expf(ld(a[t2]) / sqrt_hs - mx);
  sum = warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) st(a[t2], t2 <= t ? expf(ld(a[t2]) / sqrt_hs - mx) / sum : 0.0f);
}
// Backward, in place on the bf16 probability gradients: dscore = p (dp - sum(p dp)) / sqrt_hs, rounded once.
__global__ void causal_softmax_bf16_bwd_kernel(__nv_bfloat16* datt, const __nv_bfloat16* att, std::int64_t rows, int T,
                                               float sqrt_hs) {
  const int lane = threadIdx.x % 32;
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (q >= rows) return;
  const int t = static_cast<int>(q % T);
  __nv_bfloat16* d = datt + idx::at(q, T, 0);
  const __nv_bfloat16* a = att + idx::at(q, T, 0);
  float dsum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) dsum += ld(a[t2]) * ld(d[t2]);
  dsum = warp_sum(dsum);
  for (int t2 = lane; t2 < T; t2 += 32) st(d[t2], t2 <= t ? ld(a[t2]) * (ld(d[t2]) - dsum) / sqrt_hs : 0.0f);
}

template <class Dst, class Src>
__global__ void convert_rows_kernel(Dst* dst, std::int64_t ld_dst, const Src* src, std::int64_t ld_src,
                                    std::int64_t total, std::int64_t cols) {
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, c] = idx::row_col(i, cols);
    st(dst[idx::at(r, ld_dst, c)], ld(src[idx::at(r, ld_src, c)]));
  }
}

// db (and dw, for kLayerNorm) += the column sums of `kMode` by the tree (column_parts_kernel's comment).
template <ColumnSums kMode, class D>
void column_sums_tree(cudaStream_t stream, D* db, D* dw, const D* dout, const D* in, const float* mean,
                      const float* rstd, int N, int C, void* workspace) {
  const auto parts = static_cast<int>(idx::column_parts(N, C));
  auto* partial = static_cast<float*>(workspace);
  const dim3 grid(static_cast<unsigned>(idx::column_tiles(C)), static_cast<unsigned>(parts));
  constexpr auto threads = static_cast<unsigned>(idx::kColTile * idx::kColRows);
  column_parts_kernel<kMode, D><<<grid, threads, 0, stream>>>(partial, dout, in, mean, rstd, N, C, parts);
  HARMONY_CUDA_CHECK_LAUNCH("column_parts_kernel");
  column_parts_add_kernel<<<blocks_for(C), kThreads, 0, stream>>>(db, kMode == ColumnSums::kLayerNorm ? dw : nullptr,
                                                                  partial, C, parts);
  HARMONY_CUDA_CHECK_LAUNCH("column_parts_add_kernel");
}
}  // namespace

}  // namespace harmony::backend::cuda::kern
