// The CUDA device's Llama-family kernels (Kernels<S>::rmsnorm_*, rope_qkv_*, swiglu_*): RMSNorm (one warp per
// row; dw by rows in order or by the shared tree column sums), rotary embeddings with grouped-query heads and SwiGLU
// (one thread per output element). Same conventions as kernels.cu: fp32 arithmetic, ld() widens, st() rounds once,
// built with --fmad=false so the results are reproducible and the fp32 ones the CPU reference's.
#include <cuda_bf16.h>

#include "backend/cuda/kernel_common.cuh"
#include "backend/cuda/kernels.hpp"

namespace harmony::backend::cuda::kern {

namespace {

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

}  // namespace

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

// The launchers' instantiations: fp32 (Kernels<float>) and bf16 (Kernels<Bf16>) storage.
#define HARMONY_LLAMA_KERNELS_FOR(S)                                                                               \
  template void rmsnorm_fwd<S>(cudaStream_t, S*, float*, const S*, const S*, int, int, float);                     \
  template void rmsnorm_bwd<S>(cudaStream_t, S*, S*, const S*, const S*, const S*, const float*, int, int, void*); \
  template void rope_qkv_fwd<S>(cudaStream_t, S*, const S*, int, int, int, int, int, float);                       \
  template void rope_qkv_bwd<S>(cudaStream_t, S*, const S*, int, int, int, int, int, float);                       \
  template void swiglu_fwd<S>(cudaStream_t, S*, const S*, int, int);                                               \
  template void swiglu_bwd<S>(cudaStream_t, S*, const S*, const S*, int, int);
HARMONY_LLAMA_KERNELS_FOR(float)
HARMONY_LLAMA_KERNELS_FOR(Bf16)
#undef HARMONY_LLAMA_KERNELS_FOR

}  // namespace harmony::backend::cuda::kern
