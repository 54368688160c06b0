// Host launchers of the CUDA device's own kernels (backend/cuda/kernels.cu): everything but the GEMMs, which
// are cuBLAS calls (gemm.cpp). Plain C++ so the device code stays in one nvcc unit. Every launcher enqueues
// on `stream` and checks the launch; bad token ids are reported through the device's ErrorRecord.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace harmony::backend::cuda::kern {

// Written by a kernel that finds bad input (the first one wins), read by the host after a synchronize. Lives in
// mapped pinned host memory. code 0: none; -1: being written.
struct ErrorRecord {
  int code;
  int pad;
  long long value;  // the bad id
  long long a, b;   // (b, t) for the embedding, (row, -) for the cross-entropy
  long long limit;  // the vocabulary size (-1: unknown)
};
enum ErrorCode : int { kErrNone = 0, kErrEmbeddingId = 1, kErrEmbeddingBwdId = 2, kErrTargetId = 3 };

void embedding_fwd(cudaStream_t stream, ErrorRecord* err, float* out, const std::int32_t* ids, const float* wte,
                   const float* wpe, int B, int T, int C, int V);
// Scratch the backward's deterministic scatter-add needs for N = B*T rows (a stable radix sort by token id).
std::size_t embedding_bwd_workspace_bytes(int N);
// Ids outside [0, V) are reported (kErrEmbeddingBwdId) and then nothing is written: dwte and dwpe stay as they were.
void embedding_bwd(cudaStream_t stream, ErrorRecord* err, void* workspace, std::size_t workspace_bytes, float* dwte,
                   float* dwpe, const float* dout, const std::int32_t* ids, int B, int T, int C, int V);
void layernorm_fwd(cudaStream_t stream, float* out, float* mean, float* rstd, const float* in, const float* w,
                   const float* b, int N, int C, float eps);
// Scratch of the tree column sums (idx::column_parts) over N rows of C columns: one output (bias) or two
// (LayerNorm's dw and db).
std::size_t column_sums_workspace_bytes(int N, int C, bool layernorm);
// tree_workspace null: dw and db accumulate row by row in row order (the CPU's order, one thread per column).
// Otherwise by the tree (column_sums_workspace_bytes(N, C, true) of scratch): ~10x more parallel, deterministic,
// but rounded differently from the CPU (and from the same rows split into microbatches).
void layernorm_bwd(cudaStream_t stream, float* din, float* dw, float* db, const float* dout, const float* in,
                   const float* w, const float* mean, const float* rstd, int N, int C, void* tree_workspace);
// out[r, :] = bias (before a GEMM with beta = 1).
void fill_bias_rows(cudaStream_t stream, float* out, const float* bias, int N, int OC);
// dbias[o] += dout[r, o] for r = 0, 1, ..., N-1 in order; or by the tree as layernorm_bwd when tree_workspace
// (column_sums_workspace_bytes(N, OC, false)) is given.
void bias_grad(cudaStream_t stream, float* dbias, const float* dout, int N, int OC, void* tree_workspace);
// rows = pairs * T rows of T scores each (row t of its (b, h) pair): scores / sqrt_hs, causal softmax, zeros
// above the diagonal; in place.
void causal_softmax_fwd(cudaStream_t stream, float* att, std::int64_t rows, int T, float sqrt_hs);
// In place: datt -> dscore = att * (datt - sum(att * datt)) / sqrt_hs below the diagonal, 0 above.
void causal_softmax_bwd(cudaStream_t stream, float* datt, const float* att, std::int64_t rows, int T, float sqrt_hs);
void gelu_fwd(cudaStream_t stream, float* out, const float* in, std::int64_t n);
void gelu_bwd(cudaStream_t stream, float* din, const float* in, const float* dout, std::int64_t n);
void add(cudaStream_t stream, float* out, const float* a, const float* b, std::int64_t n);
// acc += x (the communicator's rank-order sum).
void add_inplace(cudaStream_t stream, float* acc, const float* x, std::int64_t n);
void crossentropy_fwd(cudaStream_t stream, ErrorRecord* err, float* losses, float* probs, const float* logits,
                      const std::int32_t* targets, int N, int V);
void crossentropy_bwd(cudaStream_t stream, float* dlogits, const float* probs, const std::int32_t* targets, float scale,
                      int N, int V);

}  // namespace harmony::backend::cuda::kern
