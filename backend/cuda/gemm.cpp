// The CUDA device's GEMM-shaped kernels through cuBLAS: matmul forward/backward for both weight layouts
// (row-major tensors read as column-major transposes), and attention as strided-batched GEMMs around the causal
// softmax kernels, the backward in chunks of (b, h) pairs whose T x T score gradients fit the stream's workspace.
// The bf16 versions: cublasGemmEx on bf16 operands with fp32 accumulation (CUBLAS_COMPUTE_32F), rounded once
// where the CPU's bf16 kernels round (sums into an existing bf16 C through fp32 scratch); the exact attention keeps
// its probabilities and score gradients in fp32 scratch, the fast one (CudaDeviceOptions::bf16_exact off) is bf16
// strided-batched GEMMs around the fused bf16 softmax, with no fp32 T x T tensor.
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

// The same with bf16 operands: C (CUDA_R_16BF, or CUDA_R_32F scratch) = op(A) op(B) + beta C, products summed in
// fp32 (CUBLAS_COMPUTE_32F), beta C added in fp32 and the sum rounded once to C's type.
void gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const Bf16* A,
               int lda, const Bf16* B, int ldb, float beta, void* C, cudaDataType_t c_type, int ldc) {
  const float alpha = 1.0f;
  HARMONY_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                                    c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// C (bf16, m x n, contiguous: ldc = m) += op(A) op(B) with one rounding: the product in fp32 scratch (cuBLAS with
// an fp32 C rounds nothing), then c = round(widen(c) + product) by kern::add_f32_rounded. cublasGemmEx with beta = 1
// on a bf16 C rounds the product to bf16 before adding C (measured on an H200, CUDA 13.0: bias + product off by the
// product's ulp where they cancel), a second rounding the CPU's bf16 kernels do not make. Column blocks of at most
// kAccumulateScratchBytes of scratch bound the workspace (the tied head's dW is V x C).
constexpr std::size_t kAccumulateScratchBytes = std::size_t{64} << 20;
void gemm_bf16_accumulate(StreamContext& c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          const Bf16* A, int lda, const Bf16* B, int ldb, Bf16* C) {
  if (m == 0 || n == 0) return;
  const std::size_t col_bytes = static_cast<std::size_t>(m) * sizeof(float);
  const int block = static_cast<int>(std::clamp<std::size_t>(kAccumulateScratchBytes / col_bytes, 1, n));
  auto* scratch = static_cast<float*>(c.workspace(static_cast<std::size_t>(block) * col_bytes));
  for (int j0 = 0; j0 < n; j0 += block) {
    const int nb = std::min(block, n - j0);
    // columns j0.. of op(B): B's columns when it is not transposed, else its rows
    const Bf16* Bj = B + (tb == kN ? static_cast<std::int64_t>(j0) * ldb : static_cast<std::int64_t>(j0));
    gemm_bf16(c.cublas(), ta, tb, m, nb, k, A, lda, Bj, ldb, 0.0f, scratch, CUDA_R_32F, m);
    kern::add_f32_rounded(c.stream(), C + static_cast<std::int64_t>(j0) * m, scratch,
                          static_cast<std::int64_t>(m) * nb);
  }
}

void gemm_bf16_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const Bf16* A,
                       int lda, long long stride_a, const Bf16* B, int ldb, long long stride_b, void* C,
                       cudaDataType_t c_type, int ldc, long long stride_c, int batch) {
  const float alpha = 1.0f, beta = 0.0f;
  HARMONY_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, stride_a, B,
                                                  CUDA_R_16BF, ldb, stride_b, &beta, C, c_type, ldc, stride_c, batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The bf16 fast path's biased matmul: D (bf16, m x n, ld m) = op(A) B + bias (bias[i] added to row i) by one
// cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS: products summed in fp32, the bf16 bias added in fp32 in the epilogue,
// one rounding to bf16; split-K partials only in fp32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), as the cuBLAS
// handle's CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION. No fp32 pass over the output. False (nothing
// enqueued) when cuBLASLt offers no algorithm for the shape: the caller then takes the exact path.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{4} << 20;
bool gemm_bf16_bias_lt(StreamContext& c, cublasOperation_t ta, int m, int n, int k, const Bf16* A, int lda,
                       const Bf16* B, int ldb, const Bf16* bias, Bf16* D) {
  struct Descs {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    Descs() = default;
    Descs(const Descs&) = delete;
    Descs& operator=(const Descs&) = delete;
    ~Descs() {
      if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
      if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
      if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
      if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
      if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
    }
  } x;
  const cublasOperation_t tb = kN;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type = CUDA_R_16BF;
  const void* bias_ptr = bias;
  HARMONY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  HARMONY_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  HARMONY_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  HARMONY_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  // Stored shapes (column-major): A is m x k (k x m when transposed), B is k x n, D is m x n.
  const auto u64 = [](int v) { return static_cast<std::uint64_t>(v); };
  HARMONY_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, ta == kN ? u64(m) : u64(k), ta == kN ? u64(k) : u64(m), lda));
  HARMONY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, u64(k), u64(n), ldb));
  HARMONY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.d, CUDA_R_16BF, u64(m), u64(n), m));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
  const std::uint64_t ws_bytes = kLtWorkspaceBytes;
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                            sizeof(ws_bytes)));
  // The operands' alignment (cuBLASLt assumes 256 bytes unless told); the bias must be 16-byte aligned.
  const auto align = [](const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t bytes = 256;
    while (bytes > 1 && a % bytes != 0) bytes /= 2;
    return bytes;
  };
  if (align(bias) < 16) return false;
  const std::uint32_t align_a = align(A), align_b = align(B), align_d = align(D);
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &align_a, sizeof(align_a)));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &align_b, sizeof(align_b)));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &align_d, sizeof(align_d)));
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &align_d, sizeof(align_d)));
  const std::uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                            &reductions, sizeof(reductions)));
  cublasLtMatmulHeuristicResult_t found{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(c.cublaslt(), x.op, x.a, x.b, x.d, x.d, x.pref, 1, &found, &returned);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && returned == 0)) return false;
  HARMONY_CUBLAS_CHECK(st);
  void* ws = c.workspace(kLtWorkspaceBytes);
  const float alpha = 1.0f, beta = 0.0f;
  HARMONY_CUBLAS_CHECK(cublasLtMatmul(c.cublaslt(), x.op, &alpha, A, x.a, B, x.b, &beta, D, x.d, D, x.d, &found.algo,
                                      ws, kLtWorkspaceBytes, c.stream()));
  return true;
}

// (b, h) pairs per chunk of the attention's T x T fp32 tiles: as many as attention_workspace holds, 1 to H.
int attention_chunk(const StreamContext& c, int T, int H) {
  const auto tile_bytes = static_cast<Bytes>(static_cast<long long>(T) * T * static_cast<long long>(sizeof(float)));
  return static_cast<int>(std::clamp<Bytes>(c.attention_workspace() / tile_bytes, 1, H));
}

// What the chunked attention kernels share: the head size hs, qkv's row stride C3 = 3C, one T x T tile (TT) and one
// T x C block (TC) in elements, the softmax scale sqrt(hs), the chunk of heads per pass, and the stream's workspace W
// sized for chunk fp32 tiles followed by blocks fp32 T x C blocks.
struct AttentionShape {
  int hs, C3;
  long long TT, TC;
  float sqrt_hs;
  int chunk;
  float* W;
};

AttentionShape attention_shape(StreamContext& c, int T, int C, int H, int blocks) {
  AttentionShape s{};
  s.hs = C / H;
  s.C3 = 3 * C;
  s.TT = static_cast<long long>(T) * T;
  s.TC = static_cast<long long>(T) * C;
  s.sqrt_hs = std::sqrt(static_cast<float>(s.hs));
  s.chunk = attention_chunk(c, T, H);
  s.W = static_cast<float*>(c.workspace(static_cast<std::size_t>(s.chunk * s.TT + blocks * s.TC) * sizeof(float)));
  return s;
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
  if (dbias != nullptr) kern::bias_grad(c.stream(), dbias, dout, N, OC, c.column_sums_workspace(N, OC, false, false));
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
  const auto [hs, C3, TT, TC, sqrt_hs, chunk, W] = attention_shape(c, T, C, H, 0);
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

// --- bf16 ---

void matmul_fwd(StreamContext& c, Bf16* out, const Bf16* in, const Bf16* w, const Bf16* bias, int N, int IC, int OC,
                WeightLayout layout) {
  if (N == 0 || OC == 0) return;
  const cublasOperation_t ta = layout == WeightLayout::InOut ? kN : kT;
  const int lda = layout == WeightLayout::InOut ? OC : IC;
  if (bias != nullptr) {  // out = round(bias + in . W), one rounding
    // The fast path: the bias in cuBLASLt's epilogue (no fp32 pass); the exact one (and any shape cuBLASLt
    // refuses): the bias rows, the product in fp32 scratch, one rounded add.
    if (c.bf16_fast() && gemm_bf16_bias_lt(c, ta, OC, N, IC, w, lda, in, IC, bias, out)) return;
    kern::fill_bias_rows(c.stream(), out, bias, N, OC);
    gemm_bf16_accumulate(c, ta, kN, OC, N, IC, w, lda, in, IC, out);
  } else {
    gemm_bf16(c.cublas(), ta, kN, OC, N, IC, w, lda, in, IC, 0.0f, out, CUDA_R_16BF, OC);
  }
}

// dW += in^T . dout: the fp32 product added to the widened dW and rounded once, as the CPU's bf16 kernel.
void matmul_bwd(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in, const Bf16* w,
                int N, int IC, int OC, WeightLayout layout) {
  if (N == 0) return;
  cublasHandle_t h = c.cublas();
  if (layout == WeightLayout::InOut) {
    if (din != nullptr) gemm_bf16(h, kT, kN, IC, N, OC, w, OC, dout, OC, 0.0f, din, CUDA_R_16BF, IC);
    gemm_bf16_accumulate(c, kN, kT, OC, IC, N, dout, OC, in, IC, dw);
  } else {
    if (din != nullptr) gemm_bf16(h, kN, kN, IC, N, OC, w, IC, dout, OC, 0.0f, din, CUDA_R_16BF, IC);
    gemm_bf16_accumulate(c, kN, kT, IC, OC, N, in, IC, dout, OC, dw);
  }
  if (dbias != nullptr) kern::bias_grad(c.stream(), dbias, dout, N, OC, c.column_sums_workspace(N, OC, false, true));
}

namespace {

// The bf16 fast attention (CudaDeviceOptions::bf16_exact off): no fp32 T x T tensor, every GEMM on bf16 operands
// with fp32 accumulation and a bf16 result. Per sequence b, the H heads a strided batch:
//   att (bf16) = K . Q^T (the raw scores, rounded once); the fused softmax in place (fp32 in registers, scaled by
//   1 / sqrt(hs), the probabilities rounded once); out (bf16) = att . V.
// Against the exact path: the scores and the probabilities that multiply V are rounded to bf16 (relative 2^-8 each).
void attention_fwd_bf16_fast(StreamContext& c, Bf16* out, Bf16* att, const Bf16* qkv, int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const long long TT = static_cast<long long>(T) * T;
  const float sqrt_hs = std::sqrt(static_cast<float>(hs));
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const Bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    Bf16* attb = att + static_cast<std::int64_t>(b) * H * TT;
    gemm_bf16_batched(h, kT, kN, T, T, hs, base + C, C3, hs, base, C3, hs, attb, CUDA_R_16BF, T, TT, H);
  }
  kern::causal_softmax_bf16_fwd(c.stream(), att, static_cast<std::int64_t>(B) * H * T, T, sqrt_hs);
  for (int b = 0; b < B; ++b) {
    const Bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    gemm_bf16_batched(h, kN, kN, hs, T, T, base + 2 * C, C3, hs, att + static_cast<std::int64_t>(b) * H * TT, T, TT,
                      out + static_cast<std::int64_t>(b) * T * C, CUDA_R_16BF, C, hs, H);
  }
}

// Backward of the fast path: dV = att^T . dout; per chunk of heads, in bf16 tiles of the workspace (as many (b, h)
// pairs as attention_workspace holds at 2 bytes a score, at least one): W = dout . V^T (rounded once), the fused
// softmax backward in place (W = dscore / sqrt(hs), rounded once), dQ = W . K and dK = W^T . Q straight into dqkv
// (rounded once). Every slot of dqkv is written.
void attention_bwd_bf16_fast(StreamContext& c, Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* att, int B,
                             int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const long long TT = static_cast<long long>(T) * T;
  const float sqrt_hs = std::sqrt(static_cast<float>(hs));
  const auto tile_bytes = static_cast<Bytes>(TT * static_cast<long long>(sizeof(Bf16)));
  const int chunk = static_cast<int>(std::clamp<Bytes>(c.attention_workspace() / tile_bytes, 1, H));
  auto* W = static_cast<Bf16*>(c.workspace(static_cast<std::size_t>(chunk * TT) * sizeof(Bf16)));
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const Bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    Bf16* dbase = dqkv + static_cast<std::int64_t>(b) * T * C3;
    const Bf16* dob = dout + static_cast<std::int64_t>(b) * T * C;
    const Bf16* attb = att + static_cast<std::int64_t>(b) * H * TT;
    gemm_bf16_batched(h, kN, kT, hs, T, T, dob, C, hs, attb, T, TT, dbase + 2 * C, CUDA_R_16BF, C3, hs, H);
    for (int h0 = 0; h0 < H; h0 += chunk) {
      const int n = std::min(chunk, H - h0);
      const int off = h0 * hs;
      gemm_bf16_batched(h, kT, kN, T, T, hs, base + 2 * C + off, C3, hs, dob + off, C, hs, W, CUDA_R_16BF, T, TT, n);
      kern::causal_softmax_bf16_bwd(c.stream(), W, attb + h0 * TT, static_cast<std::int64_t>(n) * T, T, sqrt_hs);
      gemm_bf16_batched(h, kN, kN, hs, T, T, base + C + off, C3, hs, W, T, TT, dbase + off, CUDA_R_16BF, C3, hs, n);
      gemm_bf16_batched(h, kN, kT, hs, T, T, base + off, C3, hs, W, T, TT, dbase + C + off, CUDA_R_16BF, C3, hs, n);
    }
  }
}

}  // namespace

// The CPU's bf16 attention rounds only its outputs: the probabilities that out = att . V multiplies, and the score
// gradients that dQ, dK multiply, stay fp32. So per sequence b and chunk of heads, in the workspace:
//   W (n x T x T, fp32) = K . Q^T by GemmEx (bf16 operands, fp32 result); the causal softmax in place in fp32;
//   att (bf16) = round(W); O_f (T x C, fp32) += per head W . V_f, V_f = V widened (fp32 cuBLAS, no further rounding);
// then out = round(O_f). The products with fp32 probabilities run as fp32 GEMMs on exactly widened operands.
void attention_fwd(StreamContext& c, Bf16* out, Bf16* att, const Bf16* qkv, int B, int T, int C, int H) {
  if (B == 0 || T == 0) return;
  if (c.bf16_fast()) return attention_fwd_bf16_fast(c, out, att, qkv, B, T, C, H);
  const auto [hs, C3, TT, TC, sqrt_hs, chunk, W] = attention_shape(c, T, C, H, 2);
  float* Vf = W + chunk * TT;
  float* Of = Vf + TC;
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const Bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    kern::convert_rows(c.stream(), Vf, C, base + 2 * C, C3, T, C);
    for (int h0 = 0; h0 < H; h0 += chunk) {
      const int n = std::min(chunk, H - h0);
      const int off = h0 * hs;
      gemm_bf16_batched(h, kT, kN, T, T, hs, base + C + off, C3, hs, base + off, C3, hs, W, CUDA_R_32F, T, TT, n);
      kern::causal_softmax_fwd(c.stream(), W, static_cast<std::int64_t>(n) * T, T, sqrt_hs);
      kern::convert_rows(c.stream(), att + (static_cast<std::int64_t>(b) * H + h0) * TT, T, W, T,
                         static_cast<std::int64_t>(n) * T, T);
      sgemm_batched(h, kN, kN, hs, T, T, Vf + off, C, hs, W, T, TT, Of + off, C, hs, n);
    }
    kern::convert_rows(c.stream(), out + static_cast<std::int64_t>(b) * TC, C, Of, C, T, C);
  }
}

// dV = att^T . dout by GemmEx (both stored bf16; one rounding). Per chunk: W = dout . V^T (GemmEx, fp32 result),
// the softmax backward in place on the stored probabilities, then dQ_f = W . K_f and dK_f = W^T . Q_f in fp32
// on the widened Q, K; dQ, dK rounded once into dqkv after the last chunk.
void attention_bwd(StreamContext& c, Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* att, int B, int T,
                   int C, int H) {
  if (B == 0 || T == 0) return;
  if (c.bf16_fast()) return attention_bwd_bf16_fast(c, dqkv, dout, qkv, att, B, T, C, H);
  const auto [hs, C3, TT, TC, sqrt_hs, chunk, W] = attention_shape(c, T, C, H, 4);
  float* Qf = W + chunk * TT;
  float* Kf = Qf + TC;
  float* dQf = Kf + TC;
  float* dKf = dQf + TC;
  cublasHandle_t h = c.cublas();
  for (int b = 0; b < B; ++b) {
    const Bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3;
    Bf16* dbase = dqkv + static_cast<std::int64_t>(b) * T * C3;
    const Bf16* dob = dout + static_cast<std::int64_t>(b) * TC;
    const Bf16* attb = att + static_cast<std::int64_t>(b) * H * TT;
    kern::convert_rows(c.stream(), Qf, C, base, C3, T, C);
    kern::convert_rows(c.stream(), Kf, C, base + C, C3, T, C);
    gemm_bf16_batched(h, kN, kT, hs, T, T, dob, C, hs, attb, T, TT, dbase + 2 * C, CUDA_R_16BF, C3, hs, H);
    for (int h0 = 0; h0 < H; h0 += chunk) {
      const int n = std::min(chunk, H - h0);
      const int off = h0 * hs;
      gemm_bf16_batched(h, kT, kN, T, T, hs, base + 2 * C + off, C3, hs, dob + off, C, hs, W, CUDA_R_32F, T, TT, n);
      kern::causal_softmax_bwd(c.stream(), W, attb + h0 * TT, static_cast<std::int64_t>(n) * T, T, sqrt_hs);
      sgemm_batched(h, kN, kN, hs, T, T, Kf + off, C, hs, W, T, TT, dQf + off, C, hs, n);
      sgemm_batched(h, kN, kT, hs, T, T, Qf + off, C, hs, W, T, TT, dKf + off, C, hs, n);
    }
    kern::convert_rows(c.stream(), dbase, C3, dQf, C, T, C);
    kern::convert_rows(c.stream(), dbase + C, C3, dKf, C, T, C);
  }
}

}  // namespace harmony::backend::cuda::detail
