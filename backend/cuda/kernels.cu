// The CUDA device's kernels besides cuBLAS: embeddings (a deterministic scatter-add through a stable radix
// sort), LayerNorm, bias broadcast and gradient, the attention's causal softmax forward and backward (fp32 rows,
// and the bf16 fast path's bf16 rows), GELU, residual adds, cross-entropy, and the Llama family's RMSNorm, rotary
// embeddings with grouped-query heads and SwiGLU. Built with --fmad=false and fixed
// reduction trees, so every result is reproducible run to run; parameter gradients accumulate row by row in row
// order like the CPU reference, or by a fixed tree (tree_sums, the bf16 fast path). Every
// tensor kernel is a template over its storage (float, or __nv_bfloat16 for Kernels<Bf16>): ld() widens,
// arithmetic is fp32, st() stores (rounding to nearest even for bf16), so the fp32 instantiation is the fp32 code.
#include "backend/cuda/kernels.hpp"

#include <cuda_bf16.h>

#include <cub/device/device_radix_sort.cuh>

#include "backend/bf16.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/index.hpp"

namespace harmony::backend::cuda::kern {

// The project's Bf16 (its bits) is what the devices store; the kernels address the same bytes as __nv_bfloat16.
static_assert(sizeof(Bf16) == sizeof(__nv_bfloat16) && alignof(Bf16) == alignof(__nv_bfloat16));

namespace {

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
unsigned blocks_for(std::int64_t n, int per_block = kThreads) {
  return static_cast<unsigned>(idx::blocks_for(n, per_block));
}
// Blocks of a kernel with one item (row, column) per warp or thread and no loop: never capped.
unsigned blocks_exact(std::int64_t items, int per_block) {
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
__device__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// --- embeddings ---

template <class D>
__global__ void embedding_fwd_kernel(ErrorRecord* err, D* out, const std::int32_t* ids, const D* wte, const D* wpe,
                                     int T, int C, int V) {
  const std::int64_t r = blockIdx.x;
  const int t = static_cast<int>(r % T);
  const std::int32_t id = ids[r];
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0) report_error(err, kErrEmbeddingId, id, r / T, t, V);
    return;
  }
  const D* e = wte + idx::at(id, C, 0);
  D* o = out + idx::at(r, C, 0);
  if (wpe == nullptr) {  // no position table (the Llama family: rotary positions in the attention): a copy
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = e[c];
    return;
  }
  const D* p = wpe + idx::at(t, C, 0);
  for (int c = threadIdx.x; c < C; c += blockDim.x) st(o[c], ld(e[c]) + ld(p[c]));
}

// Whether the sorted ids keys[0..N) all lie in [0, V): the smallest is first and the largest last. Checked by
// every block of the backward before it writes, so a bad id anywhere leaves dwte and dwpe untouched.
__device__ __forceinline__ bool sorted_ids_valid(const std::int32_t* keys, int N, int V) {
  return keys[0] >= 0 && keys[N - 1] < V;
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... (the CPU's row order restricted to position t).
template <class D>
__global__ void embedding_dwpe_kernel(D* dwpe, const D* dout, const std::int32_t* keys, int B, int T, int C, int V) {
  if (!sorted_ids_valid(keys, B * T, V)) return;  // reported by embedding_dwte_kernel
  const std::int64_t total = static_cast<std::int64_t>(T) * C;
  HARMONY_GRID_STRIDE(i, total) {
    const auto [t, c] = idx::row_col(i, C);
    float acc = ld(dwpe[i]);
    for (int b = 0; b < B; ++b) acc += ld(dout[idx::at(idx::at(b, T, t), C, c)]);
    st(dwpe[i], acc);
  }
}

__global__ void iota_kernel(std::int32_t* v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

// One block per sorted position; the first position of each token id adds that id's rows in ascending row
// order (the radix sort is stable), so dwte[id] gets exactly the CPU's sequence of additions. A bad id (< 0 sorts
// first, >= V last) is reported once and nothing is written.
template <class D>
__global__ void embedding_dwte_kernel(ErrorRecord* err, D* dwte, const D* dout, const std::int32_t* keys,
                                      const std::int32_t* rows, int N, int T, int C, int V) {
  const int p = blockIdx.x;
  if (!sorted_ids_valid(keys, N, V)) {
    if (p == 0 && threadIdx.x == 0) {
      const int bad = keys[0] < 0 ? 0 : N - 1;
      report_error(err, kErrEmbeddingBwdId, keys[bad], rows[bad] / T, rows[bad] % T, V);
    }
    return;
  }
  const std::int32_t id = keys[p];
  if (p > 0 && keys[p - 1] == id) return;
  D* d = dwte + idx::at(id, C, 0);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = ld(d[c]);
    for (int q = p; q < N && keys[q] == id; ++q) acc += ld(dout[idx::at(rows[q], C, c)]);
    st(d[c], acc);
  }
}

struct SortLayout {
  std::size_t keys_out = 0, rows_in = 0, rows_out = 0, temp = 0, temp_bytes = 0, total = 0;
};

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

SortLayout sort_layout(int N) {
  SortLayout l;
  const std::size_t ints = align256(static_cast<std::size_t>(N) * sizeof(std::int32_t));
  l.keys_out = 0;
  l.rows_in = ints;
  l.rows_out = 2 * ints;
  l.temp = 3 * ints;
  HARMONY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, l.temp_bytes, static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), N));
  l.total = l.temp + align256(l.temp_bytes);
  return l;
}

// --- LayerNorm: one warp per row for the row statistics and din; one thread per column for dw, db ---

// Row r of LayerNorm by the warp whose lane this is: statistics in fp32 (lane-strided sums, a warp tree), the output
// rounded once, mean and rstd stored in fp32. layernorm_fwd_kernel and add_layernorm_fwd_kernel both call it, so the
// fused kernel's LayerNorm is this code on the same stored input (--fmad=false: no contraction differs).
template <class D>
__device__ __forceinline__ void layernorm_row(D* out, float* mean, float* rstd, const D* in, const D* w, const D* b,
                                              std::int64_t r, int C, float eps, int lane) {
  const D* x = in + idx::at(r, C, 0);
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += ld(x[c]);
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = ld(x[c]) - m;
    var += d * d;
  }
  var = warp_sum(var) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + eps);
  D* o = out + idx::at(r, C, 0);
  for (int c = lane; c < C; c += 32) st(o[c], (ld(x[c]) - m) * s * ld(w[c]) + ld(b[c]));
  if (lane == 0) {  // fp32 for either D: the backward reads the statistics the output above used
    mean[r] = m;
    rstd[r] = s;
  }
}

template <class D>
__global__ void layernorm_fwd_kernel(D* out, float* mean, float* rstd, const D* in, const D* w, const D* b, int N,
                                     int C, float eps) {
  const int lane = threadIdx.x % 32;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= N) return;
  layernorm_row(out, mean, rstd, in, w, b, r, C, eps, lane);
}

// The residual add and the LayerNorm that reads it (add_layernorm_fwd): each lane stores res = round(a + b) for its
// columns c = lane, lane + 32, ... (add_kernel's arithmetic), then layernorm_row reads them back: every lane reads
// only what it wrote itself, so no barrier is needed, and a or b may alias res. One pass over a and b instead of
// add_kernel's pass plus LayerNorm's; the same bits as add then layernorm_fwd.
template <class D>
__global__ void add_layernorm_fwd_kernel(D* res, D* out, float* mean, float* rstd, const D* a, const D* b, const D* w,
                                         const D* bias, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= N) return;
  const std::int64_t row = idx::at(r, C, 0);
  for (int c = lane; c < C; c += 32) st(res[row + c], ld(a[row + c]) + ld(b[row + c]));
  layernorm_row(out, mean, rstd, res, w, bias, r, C, eps, lane);
}

template <class D>
__global__ void layernorm_bwd_rows_kernel(D* din, const D* dout, const D* in, const D* w, const float* mean,
                                          const float* rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= N) return;
  const D* x = in + idx::at(r, C, 0);
  const D* d = dout + idx::at(r, C, 0);
  const float m = mean[r], s = rstd[r];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (ld(x[c]) - m) * s;
    const float dnorm = ld(w[c]) * ld(d[c]);
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = warp_sum(dnorm_mean) / static_cast<float>(C);
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / static_cast<float>(C);
  D* dx = din + idx::at(r, C, 0);
  for (int c = lane; c < C; c += 32) {
    const float norm = (ld(x[c]) - m) * s;
    const float dnorm = ld(w[c]) * ld(d[c]);
    st(dx[c], ld(dx[c]) + s * ((dnorm - dnorm_mean) - norm * dnorm_norm_mean));
  }
}

template <class D>
__global__ void layernorm_bwd_params_kernel(D* dw, D* db, const D* dout, const D* in, const float* mean,
                                            const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc_w = ld(dw[c]), acc_b = ld(db[c]);
#pragma unroll 8
  for (int r = 0; r < N; ++r) {
    const std::int64_t i = idx::at(r, C, c);
    const float d = ld(dout[i]);
    const float norm = (ld(in[i]) - mean[r]) * rstd[r];
    acc_b += d;
    acc_w += norm * d;
  }
  st(dw[c], acc_w);
  st(db[c], acc_b);
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

// --- the Llama family: RMSNorm (one warp per row; dw as LayerNorm's), rotary embeddings with grouped-query heads
// and SwiGLU (one thread per output element) ---

template <class D>
__global__ void rmsnorm_fwd_kernel(D* out, float* rstd, const D* in, const D* w, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= N) return;
  const D* x = in + idx::at(r, C, 0);
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = ld(x[c]);
    ss += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  D* o = out + idx::at(r, C, 0);
  for (int c = lane; c < C; c += 32) st(o[c], (ld(x[c]) * s) * ld(w[c]));
  if (lane == 0) rstd[r] = s;  // fp32 for either D: the backward reads the value the output above used
}

template <class D>
__global__ void rmsnorm_bwd_rows_kernel(D* din, const D* dout, const D* in, const D* w, const float* rstd, int N,
                                        int C) {
  const int lane = threadIdx.x % 32;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= N) return;
  const D* x = in + idx::at(r, C, 0);
  const D* d = dout + idx::at(r, C, 0);
  const float s = rstd[r];
  float dot_dn = 0.0f;  // sum_c (w d)_c * xhat_c
  for (int c = lane; c < C; c += 32) dot_dn += (ld(w[c]) * ld(d[c])) * (ld(x[c]) * s);
  dot_dn = warp_sum(dot_dn) / static_cast<float>(C);
  D* dx = din + idx::at(r, C, 0);
  for (int c = lane; c < C; c += 32) {
    const float norm = ld(x[c]) * s;
    st(dx[c], ld(dx[c]) + s * (ld(w[c]) * ld(d[c]) - norm * dot_dn));
  }
}

// dw[c] += (in rstd) dout for r = 0, 1, ..., N-1 in order: the CPU's additions.
template <class D>
__global__ void rmsnorm_bwd_params_kernel(D* dw, const D* dout, const D* in, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = ld(dw[c]);
#pragma unroll 8
  for (int r = 0; r < N; ++r) {
    const std::int64_t i = idx::at(r, C, c);
    acc += (ld(in[i]) * rstd[r]) * ld(dout[i]);
  }
  st(dw[c], acc);
}

// cos and sin of position t's angle for frequency index k of a head of width hd (cpu::rope_angle: inv_freq =
// 1 / theta^(2k / hd) with the exponent and the quotient in fp32, the angle t * inv_freq in fp32). The power, cosine
// and sine are evaluated in fp64 and rounded to fp32: the correctly rounded values (but in rare near-ties), which
// glibc's powf, cosf and sinf, the CPU's, give to within 0.6 ulp.
__device__ __forceinline__ void rope_cos_sin(std::int64_t t, int k, int hd, float theta, float& c, float& s) {
  const float exponent = static_cast<float>(2 * k) / static_cast<float>(hd);
  const float inv_freq = 1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(exponent)));
  const float a = static_cast<float>(t) * inv_freq;
  double sd = 0.0, cd = 0.0;
  sincos(static_cast<double>(a), &sd, &cd);
  c = static_cast<float>(cd);
  s = static_cast<float>(sd);
}

// Element e of a head rotated (HF rotate_half) from the head's pair (x1, x2) = (v[k], v[k + hd/2]), k = e mod hd/2;
// sin_sign -1 rotates back (cpu::rope_rotate's `sign`).
__device__ __forceinline__ float rope_element(float x1, float x2, bool first_half, std::int64_t t, int k, int hd,
                                              float theta, float sin_sign) {
  float c = 0.0f, sn = 0.0f;
  rope_cos_sin(t, k, hd, theta, c, sn);
  sn = sin_sign * sn;
  return first_half ? x1 * c - x2 * sn : x2 * c + x1 * sn;
}

// qkv (N, 3C) from packed (N, C + 2 KV): one thread per output element; query head h reads key/value head h / rep.
template <class D>
__global__ void rope_qkv_fwd_kernel(D* qkv, const D* packed, std::int64_t total, int T, int H, int Hkv, int hd,
                                    float theta) {
  const std::int64_t C = static_cast<std::int64_t>(H) * hd, KV = static_cast<std::int64_t>(Hkv) * hd;
  const std::int64_t P = C + 2 * KV;
  const int rep = H / Hkv, half = hd / 2;
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, j] = idx::row_col(i, 3 * C);
    const D* in = packed + idx::at(r, P, 0);
    const std::int64_t section = j / C, h = (j % C) / hd, g = h / rep;
    const int e = static_cast<int>(j % hd);
    if (section == 2) {
      qkv[i] = in[C + KV + g * hd + e];  // v: a copy, exact in either storage
      continue;
    }
    const D* head = section == 0 ? in + h * hd : in + C + g * hd;
    const int k = e < half ? e : e - half;
    st(qkv[i], rope_element(ld(head[k]), ld(head[k + half]), e < half, r % T, k, hd, theta, 1.0f));
  }
}

// dpacked (N, C + 2 KV) from dqkv (N, 3C): one thread per output element. Key and value gradients sum their rep query
// heads in head order from 0 (the CPU's sums), then q and k rotate back.
template <class D>
__global__ void rope_qkv_bwd_kernel(D* dpacked, const D* dqkv, std::int64_t total, int T, int H, int Hkv, int hd,
                                    float theta) {
  const std::int64_t C = static_cast<std::int64_t>(H) * hd, KV = static_cast<std::int64_t>(Hkv) * hd;
  const std::int64_t P = C + 2 * KV;
  const int rep = H / Hkv, half = hd / 2;
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, j] = idx::row_col(i, P);
    const D* d = dqkv + idx::at(r, 3 * C, 0);
    if (j >= C + KV) {  // v
      const std::int64_t g = (j - C - KV) / hd, e = (j - C - KV) % hd;
      float acc = 0.0f;
      for (std::int64_t h = g * rep; h < (g + 1) * rep; ++h) acc += ld(d[2 * C + h * hd + e]);
      st(dpacked[i], acc);
      continue;
    }
    const bool is_q = j < C;
    const int e = static_cast<int>((is_q ? j : j - C) % hd);
    const int k = e < half ? e : e - half;
    float x1 = 0.0f, x2 = 0.0f;
    if (is_q) {
      const std::int64_t h = j / hd;
      x1 = ld(d[h * hd + k]);
      x2 = ld(d[h * hd + k + half]);
    } else {
      const std::int64_t g = (j - C) / hd;
      for (std::int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        x1 += ld(d[C + h * hd + k]);
        x2 += ld(d[C + h * hd + k + half]);
      }
    }
    st(dpacked[i], rope_element(x1, x2, e < half, r % T, k, hd, theta, -1.0f));
  }
}

// out (N, I) = silu(gate) up from in (N, 2I) = [gate | up]: cpu::swiglu_fwd's expression.
template <class D>
__global__ void swiglu_fwd_kernel(D* out, const D* in, std::int64_t total, int I) {
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, k] = idx::row_col(i, I);
    const D* row = in + idx::at(r, 2 * static_cast<std::int64_t>(I), 0);
    const float g = ld(row[k]), u = ld(row[I + k]);
    st(out[i], (g / (1.0f + expf(-g))) * u);
  }
}

// din (N, 2I) = [dgate | dup] from dout (N, I): cpu::swiglu_bwd's expressions.
template <class D>
__global__ void swiglu_bwd_kernel(D* din, const D* in, const D* dout, std::int64_t total, int I) {
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, k] = idx::row_col(i, I);
    const std::int64_t base = idx::at(r, 2 * static_cast<std::int64_t>(I), 0);
    const float g = ld(in[base + k]), u = ld(in[base + I + k]), d = ld(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float silu = g * sig;
    st(din[base + I + k], d * silu);
    st(din[base + k], d * u * (sig * (1.0f + g * (1.0f - sig))));
  }
}

// --- cross-entropy: one block per row ---

template <class D>
__global__ void crossentropy_fwd_kernel(ErrorRecord* err, float* losses, D* probs, const D* logits,
                                        const std::int32_t* targets, int V) {
  __shared__ float shared[kWarps];
  const std::int64_t r = blockIdx.x;
  const std::int32_t target = targets[r];
  if (target < 0 || target >= V) {
    if (threadIdx.x == 0) report_error(err, kErrTargetId, target, r, -1, V);
    return;
  }
  const D* l = logits + idx::at(r, V, 0);
  D* p = probs + idx::at(r, V, 0);  // may alias l: every read of l happens before the first write below
  const float lt = ld(l[target]);
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, ld(l[v]));
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(ld(l[v]) - mx);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) losses[r] = (logf(sum) + mx) - lt;
  const float inv = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) st(p[v], expf(ld(l[v]) - mx) * inv);
}

template <class D>
__global__ void crossentropy_bwd_kernel(D* dlogits, const D* probs, const std::int32_t* targets, float scale,
                                        std::int64_t total, int V) {
  HARMONY_GRID_STRIDE(i, total) {
    const auto [r, v] = idx::row_col(i, V);
    st(dlogits[i], (ld(probs[i]) - (v == targets[r] ? 1.0f : 0.0f)) * scale);
  }
}

// adamw_update's loop body (backend/adamw.cpp) with every operation an explicit round-to-nearest intrinsic.
template <class D>
__global__ void adamw_kernel(AdamWScalars f, float* param, D* working, const D* grad, const D* grad2, float* exp_avg,
                             float* exp_avg_sq, D* twin, std::int32_t* nonfinite, std::int64_t n) {
  bool bad = false;
  HARMONY_GRID_STRIDE(i, n) {
    float g = ld(grad[i]);
    if (grad2 != nullptr) g = __fadd_rn(g, ld(grad2[i]));
    bad = bad || !isfinite(g);
    const float p = __fmul_rn(param[i], f.decay);
    const float m = __fadd_rn(__fmul_rn(exp_avg[i], f.b1), __fmul_rn(f.one_minus_b1, g));
    const float v = __fadd_rn(__fmul_rn(exp_avg_sq[i], f.b2), __fmul_rn(__fmul_rn(f.one_minus_b2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), f.bc2_sqrt), f.eps);
    const float updated = __fadd_rn(p, __fdiv_rn(__fmul_rn(f.neg_step_size, m), denom));
    param[i] = updated;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (working != nullptr) st(working[i], updated);
    if (twin != nullptr) st(twin[i], updated);
  }
  if (bad && nonfinite != nullptr) *nonfinite = 1;  // every writer stores the same value
}

}  // namespace

template <class S>
void embedding_fwd(cudaStream_t stream, ErrorRecord* err, S* out, const std::int32_t* ids, const S* wte, const S* wpe,
                   int B, int T, int C, int V) {
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  if (N == 0) return;
  embedding_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(err, dev(out), ids, dev(wte), dev(wpe), T, C,
                                                                          V);
  HARMONY_CUDA_CHECK_LAUNCH("embedding_fwd_kernel");
}

std::size_t embedding_bwd_workspace_bytes(int N) { return N > 0 ? sort_layout(N).total : 0; }

template <class S>
void embedding_bwd(cudaStream_t stream, ErrorRecord* err, void* workspace, std::size_t workspace_bytes, S* dwte,
                   S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C, int V) {
  const int N = B * T;
  if (N == 0) return;
  SortLayout l = sort_layout(N);
  if (workspace_bytes < l.total) throw_cuda_error(cudaErrorInvalidValue, "embedding_bwd workspace", __FILE__, __LINE__);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* keys = reinterpret_cast<std::int32_t*>(base + l.keys_out);
  auto* rows_in = reinterpret_cast<std::int32_t*>(base + l.rows_in);
  auto* rows = reinterpret_cast<std::int32_t*>(base + l.rows_out);
  iota_kernel<<<blocks_for(N), kThreads, 0, stream>>>(rows_in, N);
  HARMONY_CUDA_CHECK_LAUNCH("iota_kernel");
  HARMONY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + l.temp, l.temp_bytes, ids, keys, rows_in, rows, N, 0,
                                                     static_cast<int>(8 * sizeof(std::int32_t)), stream));
  if (dwpe != nullptr) {  // null: no position table (the Llama family)
    embedding_dwpe_kernel<<<blocks_for(static_cast<std::int64_t>(T) * C), kThreads, 0, stream>>>(dev(dwpe), dev(dout),
                                                                                                 keys, B, T, C, V);
    HARMONY_CUDA_CHECK_LAUNCH("embedding_dwpe_kernel");
  }
  embedding_dwte_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(err, dev(dwte), dev(dout), keys, rows, N, T,
                                                                           C, V);
  HARMONY_CUDA_CHECK_LAUNCH("embedding_dwte_kernel");
}

template <class S>
void layernorm_fwd(cudaStream_t stream, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N,
                   int C, float eps) {
  if (N == 0 || C == 0) return;
  layernorm_fwd_kernel<<<blocks_exact(N, kWarps), kThreads, 0, stream>>>(dev(out), mean, rstd, dev(in), dev(w), dev(b),
                                                                         N, C, eps);
  HARMONY_CUDA_CHECK_LAUNCH("layernorm_fwd_kernel");
}

template <class S>
void add_layernorm_fwd(cudaStream_t stream, S* res, S* out, float* mean, float* rstd, const S* a, const S* b,
                       const S* w, const S* bias, int N, int C, float eps) {
  if (N == 0 || C == 0) return;
  add_layernorm_fwd_kernel<<<blocks_exact(N, kWarps), kThreads, 0, stream>>>(dev(res), dev(out), mean, rstd, dev(a),
                                                                             dev(b), dev(w), dev(bias), N, C, eps);
  HARMONY_CUDA_CHECK_LAUNCH("add_layernorm_fwd_kernel");
}

std::size_t column_sums_workspace_bytes(int N, int C, bool layernorm) {
  const std::int64_t parts = idx::column_parts(N, C);
  return static_cast<std::size_t>(parts * C * (layernorm ? 2 : 1)) * sizeof(float);
}

namespace {
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

template <class S>
void layernorm_bwd(cudaStream_t stream, S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean,
                   const float* rstd, int N, int C, void* tree_workspace) {
  if (N == 0 || C == 0) return;
  layernorm_bwd_rows_kernel<<<blocks_exact(N, kWarps), kThreads, 0, stream>>>(dev(din), dev(dout), dev(in), dev(w),
                                                                              mean, rstd, N, C);
  HARMONY_CUDA_CHECK_LAUNCH("layernorm_bwd_rows_kernel");
  if (tree_workspace != nullptr) {
    column_sums_tree<ColumnSums::kLayerNorm>(stream, dev(db), dev(dw), dev(dout), dev(in), mean, rstd, N, C,
                                             tree_workspace);
    return;
  }
  layernorm_bwd_params_kernel<<<blocks_exact(C, 128), 128, 0, stream>>>(dev(dw), dev(db), dev(dout), dev(in), mean,
                                                                        rstd, N, C);
  HARMONY_CUDA_CHECK_LAUNCH("layernorm_bwd_params_kernel");
}

template <class S>
void rmsnorm_fwd(cudaStream_t stream, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) {
  if (N == 0 || C == 0) return;
  rmsnorm_fwd_kernel<<<blocks_exact(N, kWarps), kThreads, 0, stream>>>(dev(out), rstd, dev(in), dev(w), N, C, eps);
  HARMONY_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}

template <class S>
void rmsnorm_bwd(cudaStream_t stream, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                 int C, void* tree_workspace) {
  if (N == 0 || C == 0) return;
  rmsnorm_bwd_rows_kernel<<<blocks_exact(N, kWarps), kThreads, 0, stream>>>(dev(din), dev(dout), dev(in), dev(w), rstd,
                                                                            N, C);
  HARMONY_CUDA_CHECK_LAUNCH("rmsnorm_bwd_rows_kernel");
  if (tree_workspace != nullptr) {
    column_sums_tree<ColumnSums::kRmsNorm>(stream, dev(dw), static_cast<Dev<S>*>(nullptr), dev(dout), dev(in),
                                           static_cast<const float*>(nullptr), rstd, N, C, tree_workspace);
    return;
  }
  rmsnorm_bwd_params_kernel<<<blocks_exact(C, 128), 128, 0, stream>>>(dev(dw), dev(dout), dev(in), rstd, N, C);
  HARMONY_CUDA_CHECK_LAUNCH("rmsnorm_bwd_params_kernel");
}

template <class S>
void rope_qkv_fwd(cudaStream_t stream, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) {
  const std::int64_t total = static_cast<std::int64_t>(B) * T * 3 * H * D;
  if (total == 0) return;
  rope_qkv_fwd_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(qkv), dev(packed), total, T, H, Hkv, D, theta);
  HARMONY_CUDA_CHECK_LAUNCH("rope_qkv_fwd_kernel");
}

template <class S>
void rope_qkv_bwd(cudaStream_t stream, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta) {
  const std::int64_t total = static_cast<std::int64_t>(B) * T * (static_cast<std::int64_t>(H) + 2 * Hkv) * D;
  if (total == 0) return;
  rope_qkv_bwd_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(dpacked), dev(dqkv), total, T, H, Hkv, D, theta);
  HARMONY_CUDA_CHECK_LAUNCH("rope_qkv_bwd_kernel");
}

template <class S>
void swiglu_fwd(cudaStream_t stream, S* out, const S* in, int N, int I) {
  const std::int64_t total = static_cast<std::int64_t>(N) * I;
  if (total == 0) return;
  swiglu_fwd_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(out), dev(in), total, I);
  HARMONY_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

template <class S>
void swiglu_bwd(cudaStream_t stream, S* din, const S* in, const S* dout, int N, int I) {
  const std::int64_t total = static_cast<std::int64_t>(N) * I;
  if (total == 0) return;
  swiglu_bwd_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(din), dev(in), dev(dout), total, I);
  HARMONY_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

template <class S>
void fill_bias_rows(cudaStream_t stream, S* out, const S* bias, int N, int OC) {
  const std::int64_t total = static_cast<std::int64_t>(N) * OC;
  if (total == 0) return;
  fill_bias_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(out), dev(bias), total, OC);
  HARMONY_CUDA_CHECK_LAUNCH("fill_bias_rows_kernel");
}

template <class S>
void bias_grad(cudaStream_t stream, S* dbias, const S* dout, int N, int OC, void* tree_workspace) {
  if (N == 0 || OC == 0) return;
  using D = Dev<S>;
  if (tree_workspace != nullptr) {
    column_sums_tree<ColumnSums::kBias, D>(stream, dev(dbias), nullptr, dev(dout), nullptr, nullptr, nullptr, N, OC,
                                           tree_workspace);
    return;
  }
  bias_grad_kernel<<<blocks_exact(OC, 128), 128, 0, stream>>>(dev(dbias), dev(dout), N, OC);
  HARMONY_CUDA_CHECK_LAUNCH("bias_grad_kernel");
}

void causal_softmax_fwd(cudaStream_t stream, float* att, std::int64_t rows, int T, float sqrt_hs) {
  if (rows == 0) return;
  causal_softmax_fwd_kernel<<<blocks_exact(rows, kWarps), kThreads, 0, stream>>>(att, rows, T, sqrt_hs);
  HARMONY_CUDA_CHECK_LAUNCH("causal_softmax_fwd_kernel");
}

template <class S>
void causal_softmax_bwd(cudaStream_t stream, float* datt, const S* att, std::int64_t rows, int T, float sqrt_hs) {
  if (rows == 0) return;
  causal_softmax_bwd_kernel<<<blocks_exact(rows, kWarps), kThreads, 0, stream>>>(datt, dev(att), rows, T, sqrt_hs);
  HARMONY_CUDA_CHECK_LAUNCH("causal_softmax_bwd_kernel");
}

void causal_softmax_bf16_fwd(cudaStream_t stream, Bf16* att, std::int64_t rows, int T, float sqrt_hs) {
  if (rows == 0) return;
  causal_softmax_bf16_fwd_kernel<<<blocks_exact(rows, kWarps), kThreads, 0, stream>>>(dev(att), rows, T, sqrt_hs);
  HARMONY_CUDA_CHECK_LAUNCH("causal_softmax_bf16_fwd_kernel");
}

void causal_softmax_bf16_bwd(cudaStream_t stream, Bf16* datt, const Bf16* att, std::int64_t rows, int T,
                             float sqrt_hs) {
  if (rows == 0) return;
  causal_softmax_bf16_bwd_kernel<<<blocks_exact(rows, kWarps), kThreads, 0, stream>>>(dev(datt), dev(att), rows, T,
                                                                                      sqrt_hs);
  HARMONY_CUDA_CHECK_LAUNCH("causal_softmax_bf16_bwd_kernel");
}

template <class S>
void gelu_fwd(cudaStream_t stream, S* out, const S* in, std::int64_t n) {
  if (n == 0) return;
  gelu_fwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dev(out), dev(in), n);
  HARMONY_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
}

template <class S>
void gelu_bwd(cudaStream_t stream, S* din, const S* in, const S* dout, std::int64_t n) {
  if (n == 0) return;
  gelu_bwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dev(din), dev(in), dev(dout), n);
  HARMONY_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
}

template <class S>
void add(cudaStream_t stream, S* out, const S* a, const S* b, std::int64_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dev(out), dev(a), dev(b), n);
  HARMONY_CUDA_CHECK_LAUNCH("add_kernel");
}

__global__ void add_f32_rounded_kernel(__nv_bfloat16* c, const float* s, std::int64_t n) {
  HARMONY_GRID_STRIDE(i, n)
  st(c[i], ld(c[i]) + s[i]);
}

void add_f32_rounded(cudaStream_t stream, Bf16* c, const float* s, std::int64_t n) {
  if (n == 0) return;
  add_f32_rounded_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dev(c), s, n);
  HARMONY_CUDA_CHECK_LAUNCH("add_f32_rounded_kernel");
}

template <class S>
void add_inplace(cudaStream_t stream, float* acc, const S* x, std::int64_t n) {
  if (n == 0) return;
  add_widened_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, dev(x), n);
  HARMONY_CUDA_CHECK_LAUNCH("add_widened_kernel");
}

template <class S>
void adamw(cudaStream_t stream, const AdamWScalars& f, float* param, S* working, const S* grad, const S* grad2,
           float* exp_avg, float* exp_avg_sq, S* twin, std::int32_t* nonfinite, std::int64_t n) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, param, dev(working), dev(grad), dev(grad2), exp_avg,
                                                       exp_avg_sq, dev(twin), nonfinite, n);
  HARMONY_CUDA_CHECK_LAUNCH("adamw_kernel");
}

template <class S>
void crossentropy_fwd(cudaStream_t stream, ErrorRecord* err, float* losses, S* probs, const S* logits,
                      const std::int32_t* targets, int N, int V) {
  if (N == 0) return;
  crossentropy_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(err, losses, dev(probs), dev(logits),
                                                                             targets, V);
  HARMONY_CUDA_CHECK_LAUNCH("crossentropy_fwd_kernel");
}

template <class S>
void crossentropy_bwd(cudaStream_t stream, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                      int V) {
  const std::int64_t total = static_cast<std::int64_t>(N) * V;
  if (total == 0) return;
  crossentropy_bwd_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(dlogits), dev(probs), targets, scale, total,
                                                                      V);
  HARMONY_CUDA_CHECK_LAUNCH("crossentropy_bwd_kernel");
}

template <class Dst, class Src>
void convert_rows(cudaStream_t stream, Dst* dst, std::int64_t ld_dst, const Src* src, std::int64_t ld_src,
                  std::int64_t rows, std::int64_t cols) {
  const std::int64_t total = rows * cols;
  if (total == 0) return;
  convert_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dev(dst), ld_dst, dev(src), ld_src, total, cols);
  HARMONY_CUDA_CHECK_LAUNCH("convert_rows_kernel");
}

// The launchers' instantiations: fp32 (Kernels<float>) and bf16 (Kernels<Bf16>) storage.
#define HARMONY_KERNELS_FOR(S)                                                                                        \
  template void embedding_fwd<S>(cudaStream_t, ErrorRecord*, S*, const std::int32_t*, const S*, const S*, int, int,   \
                                 int, int);                                                                           \
  template void embedding_bwd<S>(cudaStream_t, ErrorRecord*, void*, std::size_t, S*, S*, const S*,                    \
                                 const std::int32_t*, int, int, int, int);                                            \
  template void layernorm_fwd<S>(cudaStream_t, S*, float*, float*, const S*, const S*, const S*, int, int, float);    \
  template void add_layernorm_fwd<S>(cudaStream_t, S*, S*, float*, float*, const S*, const S*, const S*, const S*,    \
                                     int, int, float);                                                                \
  template void layernorm_bwd<S>(cudaStream_t, S*, S*, S*, const S*, const S*, const S*, const float*, const float*,  \
                                 int, int, void*);                                                                    \
  template void rmsnorm_fwd<S>(cudaStream_t, S*, float*, const S*, const S*, int, int, float);                        \
  template void rmsnorm_bwd<S>(cudaStream_t, S*, S*, const S*, const S*, const S*, const float*, int, int, void*);    \
  template void rope_qkv_fwd<S>(cudaStream_t, S*, const S*, int, int, int, int, int, float);                          \
  template void rope_qkv_bwd<S>(cudaStream_t, S*, const S*, int, int, int, int, int, float);                          \
  template void swiglu_fwd<S>(cudaStream_t, S*, const S*, int, int);                                                  \
  template void swiglu_bwd<S>(cudaStream_t, S*, const S*, const S*, int, int);                                        \
  template void fill_bias_rows<S>(cudaStream_t, S*, const S*, int, int);                                              \
  template void bias_grad<S>(cudaStream_t, S*, const S*, int, int, void*);                                            \
  template void causal_softmax_bwd<S>(cudaStream_t, float*, const S*, std::int64_t, int, float);                      \
  template void gelu_fwd<S>(cudaStream_t, S*, const S*, std::int64_t);                                                \
  template void gelu_bwd<S>(cudaStream_t, S*, const S*, const S*, std::int64_t);                                      \
  template void add<S>(cudaStream_t, S*, const S*, const S*, std::int64_t);                                           \
  template void add_inplace<S>(cudaStream_t, float*, const S*, std::int64_t);                                         \
  template void crossentropy_fwd<S>(cudaStream_t, ErrorRecord*, float*, S*, const S*, const std::int32_t*, int, int); \
  template void crossentropy_bwd<S>(cudaStream_t, S*, const S*, const std::int32_t*, float, int, int);                \
  template void adamw<S>(cudaStream_t, const AdamWScalars&, float*, S*, const S*, const S*, float*, float*, S*,       \
                         std::int32_t*, std::int64_t);
HARMONY_KERNELS_FOR(float)
HARMONY_KERNELS_FOR(Bf16)
#undef HARMONY_KERNELS_FOR
template void convert_rows<float, Bf16>(cudaStream_t, float*, std::int64_t, const Bf16*, std::int64_t, std::int64_t,
                                        std::int64_t);
template void convert_rows<Bf16, float>(cudaStream_t, Bf16*, std::int64_t, const float*, std::int64_t, std::int64_t,
                                        std::int64_t);

}  // namespace harmony::backend::cuda::kern
