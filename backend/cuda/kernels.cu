// The CUDA device's kernels besides cuBLAS: embeddings (a deterministic scatter-add through a stable radix
// sort), LayerNorm, bias broadcast and gradient, the attention's causal softmax forward and backward (fp32 rows,
// and the bf16 fast path's bf16 rows), GELU, residual adds, cross-entropy and AdamW (the Llama family's kernels are
// llama_kernels.cu; the helpers both share, kernel_common.cuh). Built with --fmad=false and fixed reduction trees, so
// every result is reproducible run to run; parameter gradients accumulate row by row in row order like the CPU
// reference, or by a fixed tree (tree_sums, the bf16 fast path). Every tensor kernel is a template over its storage
// (float, or __nv_bfloat16 for Kernels<Bf16>): ld() widens, arithmetic is fp32, st() stores (rounding to nearest even
// for bf16), so the fp32 instantiation is the fp32 code.
#include "backend/cuda/kernels.hpp"

#include <cuda_bf16.h>

#include <cub/device/device_radix_sort.cuh>

#include "backend/bf16.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/index.hpp"
#include "backend/cuda/kernel_common.cuh"

namespace harmony::backend::cuda::kern {

// The project's Bf16 (its bits) is what the devices store; the kernels address the same bytes as __nv_bfloat16.
static_assert(sizeof(Bf16) == sizeof(__nv_bfloat16) && alignof(Bf16) == alignof(__nv_bfloat16));

namespace {

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
