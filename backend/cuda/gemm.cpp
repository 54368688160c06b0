// The CUDA device's GEMM-shaped kernels through cuBLAS: matmul forward/backward for both weight layouts
// (row-major tensors read as column-major transposes), and attention as strided-batched GEMMs around the causal
// softmax kernels, the backward in chunks of (b, h) pairs whose T x T score gradients fit the stream's workspace.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_internal.hpp"

namespace harmony::backend::cuda::detail {
namespace {

constexpr cublasOperation_t kN = CUBLAS_OP_N;
constexpr cublasOperation_t kT = CUBLAS_OP_T;

// C (m x n, column-major) = op(A) op(B) + beta C.
void sgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  const float alpha = 1.0f;
  HARMONY_CUBLAS_CHECK(cublasSgemm(h, ta, tb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc));
}

void sgemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A,
                   int lda, long long stride_a, const float* B, int ldb, long long stride_b, float* C, int ldc,
                   long long stride_c, int batch) {
  const float alpha = 1.0f, beta = 0.0f;
  HARMONY_CUBLAS_CHECK(cublasSgemmStridedBatched(h, ta, tb, m, n, k, &alpha, A, lda, stride_a, B, ldb, stride_b, &beta,
                                                 C, ldc, stride_c, batch));
}

}  // namespace

// A row-major (r x c) array is the column-major (c x r) matrix of its transpose with leading dimension c.
//   InOut: out^T (OC x N) = W^T (OC x IC, ld OC) . in^T (IC x N, ld IC)
//   OutIn: out^T (OC x N) = (W^T (IC x OC, ld IC))^T . in^T
void matmul_fwd(StreamContext& c, float* out, const float* in, const float* w, const float* bias, int N, int IC, int OC,
                WeightLayout layout) {
  if (N == 0 || OC == 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    kern::fill_bias_rows(c.stream(), out, bias, N, OC);
    beta = 1.0f;
  }
  if (layout == WeightLayout::InOut) {
    sgemm(c.cublas(), kN, kN, OC, N, IC, w, OC, in, IC, beta, out, OC);
  } else {
    sgemm(c.cublas(), kT, kN, OC, N, IC, w, IC, in, IC, beta, out, OC);
  }
}

//   InOut: din^T (IC x N) = (W^T)^T . dout^T;       dW^T (OC x IC) += dout^T (OC x N) . (in^T)^T
//   OutIn: din^T (IC x N) = W^T (IC x OC) . dout^T;  dW^T (IC x OC) += in^T (IC x N) . (dout^T)^T
void matmul_bwd(StreamContext& c, float* din, float* dw, float* dbias, const float* dout, const float* in,
                const float* w, int N, int IC, int OC, WeightLayout layout) {
  if (N == 0) return;
  if (layout == WeightLayout::InOut) {
    if (din != nullptr) sgemm(c.cublas(), kT, kN, IC, N, OC, w, OC, dout, OC, 0.0f, din, IC);
    sgemm(c.cublas(), kN, kT, OC, IC, N, dout, OC, in, IC, 1.0f, dw, OC);
  } else {
    if (din != nullptr) sgemm(c.cublas(), kN, kN, IC, N, OC, w, IC, dout, OC, 0.0f, din, IC);
    sgemm(c.cublas(), kN, kT, IC, OC, N, in, IC, dout, OC, 1.0f, dw, IC);
  }
  if (dbias != nullptr) kern::bias_grad(c.stream(), dbias, dout, N, OC, c.column_sums_workspace(N, OC, false));
}

// Per sequence b, the H heads are a strided batch (stride hs within qkv's rows of 3C, T*T within att):
//   scores: att_bh^T (T x T) = (K^T)^T . Q^T         (column t of att^T is row t of the scores)
//   out:    out_bh^T (hs x T, ld C) = V^T (hs x T, ld 3C) . att_bh^T
void attention_fwd(StreamContext& c, float* out, float* att, const float* qkv, int B, int T, int C, int H) {
  if (B == 0 || T == 0) return;
  const int hs = C / H, C3 = 3 * C;
  const long long TT = static_cast<long long>(T) * T;
  const float sqrt_hs = std::sqrt(static_cast<float>(hs));
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    sgemm_batched(h, kT, kN, T, T, hs, base + C, C3, hs, base, C3, hs, att + b * H * TT, T, TT, H);
  }
  kern::causal_softmax_fwd(c.stream(), att, static_cast<std::int64_t>(B) * H * T, T, sqrt_hs);
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    sgemm_batched(h, kN, kN, hs, T, T, base + 2 * C, C3, hs, att + b * H * TT, T, TT,
                  out + static_cast<std::int64_t>(b) * T * C, C, hs, H);
  }
}

// dV_bh = att^T . dout_bh; then per chunk of heads, in the workspace W (T x T per pair):
//   W = dout_bh . V^T (the probabilities' gradient), softmax backward in place (W = dscore / sqrt(hs)),
//   dQ_bh = W . K,  dK_bh = W^T . Q. Every slot of dqkv is written (beta = 0).
void attention_bwd(StreamContext& c, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                   int C, int H) {
  if (B == 0 || T == 0) return;
  const int hs = C / H, C3 = 3 * C;
  const long long TT = static_cast<long long>(T) * T;
  const float sqrt_hs = std::sqrt(static_cast<float>(hs));
  const auto tile_bytes = static_cast<Bytes>(TT * static_cast<long long>(sizeof(float)));
  const int chunk = static_cast<int>(std::clamp<Bytes>(c.attention_workspace() / tile_bytes, 1, H));
  auto* W = static_cast<float*>(c.workspace(static_cast<std::size_t>(chunk * tile_bytes)));
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    float* dbase = dqkv + static_cast<std::int64_t>(b) * T * C3;
    const float* dob = dout + static_cast<std::int64_t>(b) * T * C;
    const float* attb = att + b * H * TT;
    sgemm_batched(h, kN, kT, hs, T, T, dob, C, hs, attb, T, TT, dbase + 2 * C, C3, hs, H);
    for (int h0 = 0; h0 < H; h0 += chunk) {
      const int n = std::min(chunk, H - h0);
      const int off = h0 * hs;
      sgemm_batched(h, kT, kN, T, T, hs, base + 2 * C + off, C3, hs, dob + off, C, hs, W, T, TT, n);
      kern::causal_softmax_bwd(c.stream(), W, attb + h0 * TT, static_cast<std::int64_t>(n) * T, T, sqrt_hs);
      sgemm_batched(h, kN, kN, hs, T, T, base + C + off, C3, hs, W, T, TT, dbase + off, C3, hs, n);
      sgemm_batched(h, kN, kT, hs, T, T, base + off, C3, hs, W, T, TT, dbase + C + off, C3, hs, n);
    }
  }
}

}  // namespace harmony::backend::cuda::detail
