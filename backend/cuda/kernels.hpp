// Host launchers of the CUDA device's own kernels (backend/cuda/kernels.cu, llama_kernels.cu): everything but the
// GEMMs, which are cuBLAS calls (gemm.cpp). Plain C++, so only the nvcc units see device code. Every launcher enqueues
// on `stream` and checks the launch; bad token ids are reported through the stream's ErrorRecord (error_record.hpp).
// The tensor launchers are templates over the storage type S, instantiated for float and Bf16 (stored as __nv_bfloat16:
// loads widen to fp32, every kernel computes in fp32, stores round to nearest even once).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/error_record.hpp"

namespace harmony::backend {
struct Bf16;  // backend/bf16.hpp
}  // namespace harmony::backend

namespace harmony::backend::cuda::kern {

// wpe null: no position table (out = wte[id], a copy); likewise a null dwpe in embedding_bwd is skipped.
template <class S>
void embedding_fwd(cudaStream_t stream, ErrorRecord* err, S* out, const std::int32_t* ids, const S* wte, const S* wpe,
                   int B, int T, int C, int V);
// Scratch the backward's deterministic scatter-add needs for N = B*T rows (a stable radix sort by token id).
std::size_t embedding_bwd_workspace_bytes(int N);
// Ids outside [0, V) are reported (kErrEmbeddingBwdId) and then nothing is written: dwte and dwpe stay as they were.
template <class S>
void embedding_bwd(cudaStream_t stream, ErrorRecord* err, void* workspace, std::size_t workspace_bytes, S* dwte,
                   S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C, int V);
template <class S>
void layernorm_fwd(cudaStream_t stream, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N,
                   int C, float eps);
// res = a + b (a or b may alias res), then out = LayerNorm(res) as layernorm_fwd, by one kernel: the same bits as add
// then layernorm_fwd (the same row code on the same stored res), one pass over the inputs fewer.
template <class S>
void add_layernorm_fwd(cudaStream_t stream, S* res, S* out, float* mean, float* rstd, const S* a, const S* b,
                       const S* w, const S* bias, int N, int C, float eps);
// Scratch of the tree column sums (idx::column_parts) over N rows of C columns: one output (bias) or two
// (LayerNorm's dw and db).
std::size_t column_sums_workspace_bytes(int N, int C, bool layernorm);
// tree_workspace null: dw and db accumulate row by row in row order (the CPU's order, one thread per column).
// Otherwise by the tree (column_sums_workspace_bytes(N, C, true) of scratch): ~10x more parallel, deterministic,
// but rounded differently from the CPU (and from the same rows split into microbatches).
template <class S>
void layernorm_bwd(cudaStream_t stream, S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean,
                   const float* rstd, int N, int C, void* tree_workspace);
// The Llama family's kernels (Kernels<S>::rmsnorm_*, rope_qkv_*, swiglu_*: backend/device.hpp has the contract).
// RMSNorm: one warp per row; rstd is stored in fp32, the value the output used (as layernorm_fwd's statistics).
template <class S>
void rmsnorm_fwd(cudaStream_t stream, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps);
// din += ...; dw += (in rstd) dout row by row in row order when tree_workspace is null, else by the tree as
// layernorm_bwd (column_sums_workspace_bytes(N, C, false) of scratch).
template <class S>
void rmsnorm_bwd(cudaStream_t stream, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                 int C, void* tree_workspace);
// Rotary embeddings with grouped-query heads (H % Hkv == 0, D even; checked by the caller): one thread per output
// element, cos and sin of each angle from fp64 and rounded (the CPU's glibc values but in near-ties).
template <class S>
void rope_qkv_fwd(cudaStream_t stream, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta);
template <class S>
void rope_qkv_bwd(cudaStream_t stream, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta);
template <class S>
void swiglu_fwd(cudaStream_t stream, S* out, const S* in, int N, int I);
template <class S>
void swiglu_bwd(cudaStream_t stream, S* din, const S* in, const S* dout, int N, int I);
// out[r, :] = bias (before a GEMM with beta = 1).
template <class S>
void fill_bias_rows(cudaStream_t stream, S* out, const S* bias, int N, int OC);
// dbias[o] += dout[r, o] for r = 0, 1, ..., N-1 in order; or by the tree as layernorm_bwd when tree_workspace
// (column_sums_workspace_bytes(N, OC, false)) is given.
template <class S>
void bias_grad(cudaStream_t stream, S* dbias, const S* dout, int N, int OC, void* tree_workspace);
// rows = pairs * T rows of T scores each (row t of its (b, h) pair): scores / sqrt_hs, causal softmax, zeros
// above the diagonal; in place.
void causal_softmax_fwd(cudaStream_t stream, float* att, std::int64_t rows, int T, float sqrt_hs);
// In place: datt -> dscore = att * (datt - sum(att * datt)) / sqrt_hs below the diagonal, 0 above.
// att in float or Bf16 (the stored probabilities); datt is fp32 scratch.
template <class S>
void causal_softmax_bwd(cudaStream_t stream, float* datt, const S* att, std::int64_t rows, int T, float sqrt_hs);
// The bf16 fast attention's softmax (CudaDeviceOptions::bf16_exact off): as causal_softmax_fwd / _bwd, but the
// rows are bf16 in and out (fp32 arithmetic in between, one rounding per stored value): att holds the bf16 scores
// on entry and the bf16 probabilities on return; datt the bf16 probability gradients on entry and the bf16 score
// gradients (divided by sqrt_hs) on return.
void causal_softmax_bf16_fwd(cudaStream_t stream, Bf16* att, std::int64_t rows, int T, float sqrt_hs);
void causal_softmax_bf16_bwd(cudaStream_t stream, Bf16* datt, const Bf16* att, std::int64_t rows, int T, float sqrt_hs);
template <class S>
void gelu_fwd(cudaStream_t stream, S* out, const S* in, std::int64_t n);
template <class S>
void gelu_bwd(cudaStream_t stream, S* din, const S* in, const S* dout, std::int64_t n);
template <class S>
void add(cudaStream_t stream, S* out, const S* a, const S* b, std::int64_t n);
// acc += x, x widened to fp32 (the communicator's rank-order sum; instantiated for float and Bf16).
template <class S>
void add_inplace(cudaStream_t stream, float* acc, const S* x, std::int64_t n);
// c[i] = round_bf16(widen(c[i]) + s[i]): one rounding of the sum (the bf16 GEMMs' beta = 1 epilogue, done here
// because cuBLAS rounds the product to bf16 before adding C, a second rounding).
void add_f32_rounded(cudaStream_t stream, Bf16* c, const float* s, std::int64_t n);
// adamw_update's factors (backend/adamw_parallel.hpp's AdamWFactors, computed on the host).
struct AdamWScalars {
  float decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
};
// One AdamW step over n elements (Kernels<S>::adamw): per element the gradient widened (grad2 widened and added when
// not null), adamw_update's operations in its order, each an IEEE round-to-nearest intrinsic (__fmul_rn, __fadd_rn,
// __fdiv_rn, __fsqrt_rn: never contracted into a fused multiply-add), so the fp32 results are the CPU's bits. param
// is the fp32 parameter (fp32) or master (bf16); working (bf16 only, else null) and twin (optional) get the rounded
// result. *nonfinite = 1 when a gradient element is not finite (nonfinite may be null).
template <class S>
void adamw(cudaStream_t stream, const AdamWScalars& f, float* param, S* working, const S* grad, const S* grad2,
           float* exp_avg, float* exp_avg_sq, S* twin, std::int32_t* nonfinite, std::int64_t n);
// losses in fp32 for either storage.
template <class S>
void crossentropy_fwd(cudaStream_t stream, ErrorRecord* err, float* losses, S* probs, const S* logits,
                      const std::int32_t* targets, int N, int V);
template <class S>
void crossentropy_bwd(cudaStream_t stream, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                      int V);
// dst[r * ld_dst + c] = src[r * ld_src + c] for r < rows, c < cols: Bf16 -> float widens exactly, float -> Bf16
// rounds to nearest even (the bf16 attention's fp32 scratch around its fp32 GEMMs).
template <class Dst, class Src>
void convert_rows(cudaStream_t stream, Dst* dst, std::int64_t ld_dst, const Src* src, std::int64_t ld_src,
                  std::int64_t rows, std::int64_t cols);

}  // namespace harmony::backend::cuda::kern
