// When the CUDA device fuses (Kernels<S>::matmul_gelu_fwd / _bwd and add_layernorm_fwd): the options that turn its
// fused kernels on, and what cuBLASLt's GELU epilogues document they need (checked before asking cuBLASLt for an
// algorithm; a call that fails a check, or finds no algorithm, takes the unfused path), and the key its answers are
// cached under. Host-only and free of CUDA
// headers, so CPU tests check every decision (epilogue_test.cpp); gemm.cpp and cuda_device.cpp act on them.
#pragma once

#include <compare>
#include <cstdint>
#include <string_view>

namespace harmony::backend::cuda::epi {

// The largest power of two dividing the address, at most 256: the alignment cuBLASLt is told an operand has.
inline std::uint32_t alignment_bytes(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

// The device's fusion switches: CudaDeviceOptions::fused_epilogues (off under harmony-run's --exact and --no-fuse)
// and whether its bf16 kernels are the fast path (CudaDeviceOptions::bf16_exact off).
struct FusionMode {
  bool fused = false;
  bool bf16_fast = false;
};

// cuBLASLt's epilogues (GELU, GELU gradient, bias gradient) change rounding or summation order (the GELU of the fp32
// sum, not of the rounded pre-activation; bias gradients summed by cuBLASLt, not by the tree): bf16 fast path only.
// fp32 storage keeps cuBLAS's GEMMs and the separate kernels.
inline bool fuse_epilogues(FusionMode m, bool bf16_storage) { return m.fused && bf16_storage && m.bf16_fast; }

// The fused residual add + LayerNorm computes the unfused bits (kernels.hpp), but stays behind the same switch so that
// --exact and --no-fuse run exactly the kernels they ran before it existed.
inline bool fuse_add_layernorm(FusionMode m) { return m.fused; }

// Why cuBLASLt cannot be asked for a GELU epilogue on D (rows x cols, column-major, ld = rows) with the GELU input
// `aux` (same shape and ld) and the bias or bias-gradient vector `bias` (rows entries; null: none), over an inner
// dimension k; "" when it can. cuBLASLt's documented limits (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD): the
// aux leading dimension a multiple of 8; vectors and aux 16-byte aligned (what the bias epilogue needed on an H200).
inline std::string_view gelu_epilogue_refusal(int rows, int cols, int k, const void* aux, const void* bias) {
  if (rows <= 0 || cols <= 0 || k <= 0) return "an empty dimension";
  if (rows % 8 != 0) return "the GELU input's leading dimension (rows) is not a multiple of 8";
  if (alignment_bytes(aux) < 16) return "the GELU input is not 16-byte aligned";
  if (bias != nullptr && alignment_bytes(bias) < 16) return "the bias vector is not 16-byte aligned";
  return {};
}

// What cuBLASLt's algorithm choice for one call depends on (every descriptor and preference attribute but the
// pointers' values, for which only their alignment counts): a stream caches the heuristic's answer under it, so a
// training step's repeated shapes ask cuBLASLt once (CudaDevice: StreamContext::lt_algorithms).
struct LtKey {
  int epilogue = 0;
  int ta = 0, tb = 0;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0;
  int d_type = 0;
  std::uint32_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0, align_aux = 0;  // 0: no such operand
  auto operator<=>(const LtKey&) const = default;
};

}  // namespace harmony::backend::cuda::epi
