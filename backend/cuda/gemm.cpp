// The CUDA device's GEMM-shaped kernels through cuBLAS: matmul forward/backward for both weight layouts
// (row-major tensors read as column-major transposes), and attention as strided-batched GEMMs around the causal
// softmax kernels, the backward in chunks of (b, h) pairs whose T x T score gradients fit the stream's workspace.
// The bf16 versions: cublasGemmEx on bf16 operands with fp32 accumulation (CUBLAS_COMPUTE_32F), rounded once
// where the CPU's bf16 kernels round (sums into an existing bf16 C through fp32 scratch); the exact attention keeps
// its probabilities and score gradients in fp32 scratch, the fast one (CudaDeviceOptions::bf16_exact off) is bf16
// strided-batched GEMMs around the fused bf16 softmax, with no fp32 T x T tensor.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_internal.hpp"
#include "backend/cuda/epilogue.hpp"

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

// One cublasLtMatmul on bf16 operands, products summed in fp32: D (d_type, m x n, ld m) = op(A) op(B) through
// `epilogue`, with its vector `bias` (the bias it adds, or the bias gradient it writes: m entries of D's type) and its
// `aux` matrix (the GELU input, m x n, ld m, bf16: written by GELU_AUX_BIAS, read by DGELU_BGRAD) where the epilogue
// has them. Split-K partials only in fp32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), as the cuBLAS handle's
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION. False (nothing enqueued) when cuBLASLt offers no algorithm: the
// caller then takes its unfused path.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{4} << 20;
struct LtCall {
  cublasOperation_t ta = kN, tb = kN;
  int m = 0, n = 0, k = 0;
  const Bf16* A = nullptr;
  int lda = 0;
  const Bf16* B = nullptr;
  int ldb = 0;
  void* D = nullptr;
  cudaDataType_t d_type = CUDA_R_16BF;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
};

struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
void lt_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& value) {
  HARMONY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)));
}
template <class T>
void lt_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// The operation's descriptor: transposes, epilogue, its vector (typed as D's elements) and aux matrix.
void lt_describe(LtDescs& x, const LtCall& g) {
  HARMONY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  lt_set(x.op, CUBLASLT_MATMUL_DESC_TRANSA, g.ta);
  lt_set(x.op, CUBLASLT_MATMUL_DESC_TRANSB, g.tb);
  lt_set(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias != nullptr) {
    lt_set(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    lt_set(x.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, g.d_type);
  }
  if (g.aux != nullptr) {
    lt_set(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    lt_set(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(g.m));
  }
  // Stored shapes (column-major): A is m x k (k x m when transposed), B is k x n (n x k when transposed), D is m x n.
  const auto u64 = [](int v) { return static_cast<std::uint64_t>(v); };
  HARMONY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, g.ta == kN ? u64(g.m) : u64(g.k),
                                                  g.ta == kN ? u64(g.k) : u64(g.m), g.lda));
  HARMONY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, g.tb == kN ? u64(g.k) : u64(g.n),
                                                  g.tb == kN ? u64(g.n) : u64(g.k), g.ldb));
  HARMONY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.d, g.d_type, u64(g.m), u64(g.n), g.m));
}

// The search preferences: the workspace, the operands' alignment (cuBLASLt assumes 256 bytes unless told), fp32
// split-K reductions only.
void lt_prefer(LtDescs& x, const LtCall& g) {
  HARMONY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(kLtWorkspaceBytes));
  const std::uint32_t align_d = epi::alignment_bytes(g.D);
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, epi::alignment_bytes(g.A));
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, epi::alignment_bytes(g.B));
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  lt_pref(x.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
          static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
}

std::atomic<std::int64_t> lt_no_algorithm{0};  // cublaslt_fallbacks()

// The heuristic's answer for `g` (described in `x`), asked once per stream and shape (StreamContext::lt_algorithms).
const StreamContext::LtAlgo& lt_choose(StreamContext& c, LtDescs& x, const LtCall& g) {
  const auto align_or_0 = [](const void* p) { return p != nullptr ? epi::alignment_bytes(p) : 0u; };
  const epi::LtKey key{.epilogue = static_cast<int>(g.epilogue),
                       .ta = static_cast<int>(g.ta),
                       .tb = static_cast<int>(g.tb),
                       .m = g.m,
                       .n = g.n,
                       .k = g.k,
                       .lda = g.lda,
                       .ldb = g.ldb,
                       .d_type = static_cast<int>(g.d_type),
                       .align_a = epi::alignment_bytes(g.A),
                       .align_b = epi::alignment_bytes(g.B),
                       .align_d = epi::alignment_bytes(g.D),
                       .align_bias = align_or_0(g.bias),
                       .align_aux = align_or_0(g.aux)};
  auto& cache = c.lt_algorithms();
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  lt_prefer(x, g);
  cublasLtMatmulHeuristicResult_t found{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(c.cublaslt(), x.op, x.a, x.b, x.d, x.d, x.pref, 1, &found, &returned);
  StreamContext::LtAlgo choice;
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
    HARMONY_CUBLAS_CHECK(st);
    choice = {.found = returned > 0, .algo = found.algo};
  }
  return cache.emplace(key, choice).first->second;
}

// `ws`: kLtWorkspaceBytes of the stream's workspace, not overlapping anything the call reads or writes.
bool lt_matmul(StreamContext& c, const LtCall& g, void* ws) {
  LtDescs x;
  lt_describe(x, g);
  const StreamContext::LtAlgo& choice = lt_choose(c, x, g);
  if (!choice.found) {
    lt_no_algorithm.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  HARMONY_CUBLAS_CHECK(cublasLtMatmul(c.cublaslt(), x.op, &alpha, g.A, x.a, g.B, x.b, &beta, g.D, x.d, g.D, x.d,
                                      &choice.algo, ws, kLtWorkspaceBytes, c.stream()));
  return true;
}

// The bf16 fast path's biased matmul: D (bf16, m x n, ld m) = op(A) B + bias (bias[i] added to row i) by one
// cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS: the bf16 bias added in fp32 in the epilogue, one rounding to bf16. No
// fp32 pass over the output. False (nothing enqueued) when the bias is not 16-byte aligned or cuBLASLt offers no
// algorithm for the shape: the caller then takes the exact path.
bool gemm_bf16_bias_lt(StreamContext& c, cublasOperation_t ta, int m, int n, int k, const Bf16* A, int lda,
                       const Bf16* B, int ldb, const Bf16* bias, Bf16* D) {
  if (epi::alignment_bytes(bias) < 16) return false;
  const LtCall g{.ta = ta,
                 .m = m,
                 .n = n,
                 .k = k,
                 .A = A,
                 .lda = lda,
                 .B = B,
                 .ldb = ldb,
                 .D = D,
                 .epilogue = CUBLASLT_EPILOGUE_BIAS,
                 .bias = bias};
  return lt_matmul(c, g, c.workspace(kLtWorkspaceBytes));
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

namespace {

// din (N x IC, bf16) = dout . W^T, rounded once.
void matmul_din_bf16(StreamContext& c, Bf16* din, const Bf16* dout, const Bf16* w, int N, int IC, int OC,
                     WeightLayout layout) {
  if (layout == WeightLayout::InOut) {
    gemm_bf16(c.cublas(), kT, kN, IC, N, OC, w, OC, dout, OC, 0.0f, din, CUDA_R_16BF, IC);
  } else {
    gemm_bf16(c.cublas(), kN, kN, IC, N, OC, w, IC, dout, OC, 0.0f, din, CUDA_R_16BF, IC);
  }
}

// dW (bf16) += in^T . dout and dbias (bf16) += dout's column sums by one cublasLtMatmul into fp32 scratch with the
// bias-gradient epilogue (CUBLASLT_EPILOGUE_BGRADA where dout is the GEMM's A, InOut; BGRADB where it is its B,
// OutIn), then each added to its widened gradient and rounded once (add_f32_rounded): the unfused fast path's rounding
// points, summed in cuBLASLt's order, without bias_grad's pass over dout. False (nothing enqueued) when dW's product
// exceeds one scratch block (the unfused path splits it) or cuBLASLt offers no algorithm.
bool dw_bgrad_lt(StreamContext& c, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in, int N, int IC, int OC,
                 WeightLayout layout) {
  const bool in_out = layout == WeightLayout::InOut;
  const int m = in_out ? OC : IC, n = in_out ? IC : OC;
  const std::size_t product_bytes = static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * sizeof(float);
  if (N <= 0 || m <= 0 || n <= 0 || product_bytes > kAccumulateScratchBytes) return false;
  const std::size_t bgrad_bytes = (static_cast<std::size_t>(OC) * sizeof(float) + 255) / 256 * 256;
  auto* ws = static_cast<unsigned char*>(c.workspace(kLtWorkspaceBytes + bgrad_bytes + product_bytes));
  auto* bgrad = reinterpret_cast<float*>(ws + kLtWorkspaceBytes);
  auto* product = reinterpret_cast<float*>(ws + kLtWorkspaceBytes + bgrad_bytes);
  const LtCall g{.ta = kN,
                 .tb = kT,
                 .m = m,
                 .n = n,
                 .k = N,
                 .A = in_out ? dout : in,
                 .lda = m,
                 .B = in_out ? in : dout,
                 .ldb = n,
                 .D = product,
                 .d_type = CUDA_R_32F,
                 .epilogue = in_out ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB,
                 .bias = bgrad};
  if (!lt_matmul(c, g, ws)) return false;
  kern::add_f32_rounded(c.stream(), dw, product, static_cast<std::int64_t>(m) * n);
  kern::add_f32_rounded(c.stream(), dbias, bgrad, OC);
  return true;
}

}  // namespace

// dW += in^T . dout: the fp32 product added to the widened dW and rounded once, as the CPU's bf16 kernel.
void matmul_bwd(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in, const Bf16* w,
                int N, int IC, int OC, WeightLayout layout) {
  if (N == 0) return;
  if (din != nullptr) matmul_din_bf16(c, din, dout, w, N, IC, OC, layout);
  if (layout == WeightLayout::InOut) {
    gemm_bf16_accumulate(c, kN, kT, OC, IC, N, dout, OC, in, IC, dw);
  } else {
    gemm_bf16_accumulate(c, kN, kT, IC, OC, N, in, IC, dout, OC, dw);
  }
  if (dbias != nullptr) kern::bias_grad(c.stream(), dbias, dout, N, OC, c.column_sums_workspace(N, OC, false, true));
}

// With fused epilogues (the bf16 fast path): dW and dbias by dw_bgrad_lt where it runs, else as matmul_bwd.
void matmul_bwd_fused(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in,
                      const Bf16* w, int N, int IC, int OC, WeightLayout layout) {
  if (N == 0) return;
  if (dbias == nullptr || !dw_bgrad_lt(c, dw, dbias, dout, in, N, IC, OC, layout))
    return matmul_bwd(c, din, dw, dbias, dout, in, w, N, IC, OC, layout);
  if (din != nullptr) matmul_din_bf16(c, din, dout, w, N, IC, OC, layout);
}

// The fused MLP forward (Kernels<Bf16>::matmul_gelu_fwd on the fast path with fused epilogues): out^T = gelu(W^T.in^T
// + bias) and pre^T = W^T.in^T + bias by one cublasLtMatmul with CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_AUX without a
// bias): pre rounded once to bf16 as the unfused path stores it, but out the GELU of the unrounded fp32 sum, rounded
// once (the unfused path rounds pre first, then its GELU). Refused shapes (epilogue.hpp) and no algorithm: the unfused
// path, matmul_fwd then the GELU kernel (its bits).
void matmul_gelu_fwd(StreamContext& c, Bf16* out, Bf16* pre, const Bf16* in, const Bf16* w, const Bf16* bias, int N,
                     int IC, int OC, WeightLayout layout) {
  if (N == 0 || OC == 0) return;
  const cublasOperation_t ta = layout == WeightLayout::InOut ? kN : kT;
  const int lda = layout == WeightLayout::InOut ? OC : IC;
  if (epi::gelu_epilogue_refusal(OC, N, IC, pre, bias).empty()) {
    const LtCall g{.ta = ta,
                   .m = OC,
                   .n = N,
                   .k = IC,
                   .A = w,
                   .lda = lda,
                   .B = in,
                   .ldb = IC,
                   .D = out,
                   .epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                   .bias = bias,
                   .aux = pre};
    if (lt_matmul(c, g, c.workspace(kLtWorkspaceBytes))) return;
  }
  matmul_fwd(c, pre, in, w, bias, N, IC, OC, layout);
  kern::gelu_fwd(c.stream(), out, pre, static_cast<std::int64_t>(N) * OC);
}

namespace {

// din^T (IC x N) = gelu'(pre^T) * (op(W^T) . dout^T) by one cublasLtMatmul with CUBLASLT_EPILOGUE_DGELU_BGRAD (DGELU
// when dpre_bias is null): the product's GELU gradient rounded once into din, and din's row sums over the N columns
// (the gradient of the bias that made pre, in bf16: D's type) into workspace scratch, then added to dpre_bias with one
// more rounding. False (nothing enqueued) when refused or cuBLASLt has no algorithm.
bool dgelu_din_lt(StreamContext& c, Bf16* din, Bf16* dpre_bias, const Bf16* dout, const Bf16* w, const Bf16* pre, int N,
                  int IC, int OC, WeightLayout layout) {
  auto* ws = static_cast<unsigned char*>(c.workspace(kLtWorkspaceBytes + static_cast<std::size_t>(IC) * sizeof(Bf16)));
  Bf16* bgrad = dpre_bias != nullptr ? reinterpret_cast<Bf16*>(ws + kLtWorkspaceBytes) : nullptr;
  if (!epi::gelu_epilogue_refusal(IC, N, OC, pre, bgrad).empty()) return false;
  const bool in_out = layout == WeightLayout::InOut;
  const LtCall g{.ta = in_out ? kT : kN,
                 .m = IC,
                 .n = N,
                 .k = OC,
                 .A = w,
                 .lda = in_out ? OC : IC,
                 .B = dout,
                 .ldb = OC,
                 .D = din,
                 .epilogue = bgrad != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU,
                 .bias = bgrad,
                 .aux = pre};
  if (!lt_matmul(c, g, ws)) return false;
  if (bgrad != nullptr) kern::add(c.stream(), dpre_bias, dpre_bias, bgrad, IC);
  return true;
}

}  // namespace

// The fused MLP backward (Kernels<Bf16>::matmul_gelu_bwd on the fast path with fused epilogues): din by dgelu_din_lt,
// or else as the unfused path computes it (the GEMM, the GELU backward kernel, then dpre_bias += din's column sums
// by bias_grad, the call the unfused c_fc matmul_bwd makes: the same bits); then dW and dbias as matmul_bwd.
void matmul_gelu_bwd(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, Bf16* dpre_bias, const Bf16* dout,
                     const Bf16* in, const Bf16* w, const Bf16* pre, int N, int IC, int OC, WeightLayout layout) {
  if (N == 0) return;
  if (!dgelu_din_lt(c, din, dpre_bias, dout, w, pre, N, IC, OC, layout)) {
    matmul_din_bf16(c, din, dout, w, N, IC, OC, layout);
    kern::gelu_bwd(c.stream(), din, pre, din, static_cast<std::int64_t>(N) * IC);
    if (dpre_bias != nullptr)
      kern::bias_grad(c.stream(), dpre_bias, din, N, IC, c.column_sums_workspace(N, IC, false, true));
  }
  matmul_bwd_fused(c, nullptr, dw, dbias, dout, in, w, N, IC, OC, layout);
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

namespace harmony::backend::cuda {
std::int64_t cublaslt_fallbacks() noexcept { return detail::lt_no_algorithm.load(std::memory_order_relaxed); }
}  // namespace harmony::backend::cuda
