// bench_cuda: what a CUDA GPU gives harmony-run — pinned and pageable host<->device copy bandwidth (the swap
// links harmony-sim's machine files describe): the ceiling (raw cudaMemcpyAsync, best of several sizes) and
// harmony's own path (CudaDevice::copy_h2d / copy_d2h in chunks, as the executor swaps packs); cuBLAS GEMM
// rates in strict fp32, with TF32 tensor cores and in BF16 (fp32 accumulation).
// Prints a table, or one JSON object with --json (scripts/gpu-check.sh reads it). Exits 77 without a GPU.
// Usage: bench_cuda [--gpu G] [--copy-mib M] [--gemm N] [--repeats R] [--json]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_device.hpp"

using namespace harmony::backend;

namespace {

struct Options {
  int gpu = 0;
  int copy_mib = 256;
  int gemm = 8192;
  int repeats = 10;
  bool json = false;
};

// Median milliseconds of `repeats` runs of fn() on `stream`, timed with CUDA events, after one warm-up run.
template <class F>
double median_ms(cudaStream_t stream, int repeats, F&& fn) {
  cudaEvent_t a = nullptr, b = nullptr;
  HARMONY_CUDA_CHECK(cudaEventCreate(&a));
  HARMONY_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  HARMONY_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    HARMONY_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    HARMONY_CUDA_CHECK(cudaEventRecord(b, stream));
    HARMONY_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    HARMONY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  HARMONY_CUDA_CHECK(cudaEventDestroy(a));
  HARMONY_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Result {
  double h2d_pinned_gbs = 0, d2h_pinned_gbs = 0, h2d_pageable_gbs = 0, d2h_pageable_gbs = 0;
  double h2d_ceiling_gbs = 0, d2h_ceiling_gbs = 0;  // raw cudaMemcpyAsync, pinned, best size
  double h2d_device_gbs = 0, d2h_device_gbs = 0;    // CudaDevice copies of kChunkMiB each, pinned
  double sgemm_tflops = 0, tf32_tflops = 0, bf16_tflops = 0;
};

constexpr int kChunkMiB = 16;  // harmony's copies: one pack's weights or stash is a few to tens of MiB

// GB/s of harmony's copy path: `bytes` in kChunkMiB copies enqueued on one stream of a CudaDevice, then one
// synchronize; the median of `repeats` wall-clock timings after one warm-up.
std::pair<double, double> device_copy_rates(const Options& o, std::size_t bytes) {
  auto dev =
      cuda::make_cuda_device(0, {.gpu = o.gpu, .capacity = static_cast<Bytes>(bytes) + 16 * harmony::core::kMiB});
  auto s = dev->create_stream("swap");
  Buffer d = dev->alloc(static_cast<Bytes>(bytes), "copy benchmark");
  HostBuffer h = dev->alloc_host(static_cast<Bytes>(bytes), "copy benchmark");
  const std::size_t chunk = std::size_t{kChunkMiB} << 20;
  const auto time = [&](bool h2d) {
    std::vector<double> t;
    for (int r = 0; r <= o.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t off = 0; off < bytes; off += chunk) {
        const auto n = static_cast<Bytes>(std::min(chunk, bytes - off));
        if (h2d) {
          dev->copy_h2d(*s, d.as<char>() + off, h.as<char>() + off, n);
        } else {
          dev->copy_d2h(*s, h.as<char>() + off, d.as<char>() + off, n);
        }
      }
      s->synchronize();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (r > 0) t.push_back(dt.count());  // r = 0 warms up
    }
    std::sort(t.begin(), t.end());
    return static_cast<double>(bytes) / 1e9 / t[t.size() / 2];
  };
  const double h2d = time(true);
  const double d2h = time(false);
  return {h2d, d2h};
}

Result run(const Options& o) {
  Result res;
  HARMONY_CUDA_CHECK(cudaSetDevice(o.gpu));
  cudaStream_t stream = nullptr;
  HARMONY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto bytes = static_cast<std::size_t>(o.copy_mib) << 20;
  void* dev = nullptr;
  HARMONY_CUDA_CHECK(cudaMalloc(&dev, bytes));
  {
    cuda::PinnedHostBuffer pinned(static_cast<Bytes>(bytes), "the copy benchmark");
    std::vector<char> pageable(bytes, 1);
    const double gb = static_cast<double>(bytes) / 1e9;
    const auto rate = [&](void* dst, const void* src, cudaMemcpyKind kind) {
      return gb / (median_ms(stream, o.repeats,
                             [&]() { HARMONY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream)); }) /
                   1e3);
    };
    res.h2d_pinned_gbs = rate(dev, pinned.data(), cudaMemcpyHostToDevice);
    res.d2h_pinned_gbs = rate(pinned.data(), dev, cudaMemcpyDeviceToHost);
    // The ceiling: the best raw rate over sizes from one chunk to the whole buffer.
    res.h2d_ceiling_gbs = res.h2d_pinned_gbs;
    res.d2h_ceiling_gbs = res.d2h_pinned_gbs;
    for (std::size_t mib : {std::size_t{kChunkMiB}, std::size_t{64}, std::size_t{1024}}) {
      const std::size_t n = std::min(bytes, mib << 20);
      const double g = static_cast<double>(n) / 1e9;
      const auto best = [&](void* dst, const void* src, cudaMemcpyKind kind) {
        return g / (median_ms(stream, o.repeats,
                              [&]() { HARMONY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream)); }) /
                    1e3);
      };
      res.h2d_ceiling_gbs = std::max(res.h2d_ceiling_gbs, best(dev, pinned.data(), cudaMemcpyHostToDevice));
      res.d2h_ceiling_gbs = std::max(res.d2h_ceiling_gbs, best(pinned.data(), dev, cudaMemcpyDeviceToHost));
    }
    res.h2d_pageable_gbs = rate(dev, pageable.data(), cudaMemcpyHostToDevice);
    res.d2h_pageable_gbs = rate(pageable.data(), dev, cudaMemcpyDeviceToHost);
  }
  HARMONY_CUDA_CHECK(cudaFree(dev));
  std::tie(res.h2d_device_gbs, res.d2h_device_gbs) = device_copy_rates(o, bytes);

  const auto n = static_cast<std::size_t>(o.gemm);
  float *A = nullptr, *B = nullptr, *C = nullptr;
  HARMONY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&A), n * n * sizeof(float)));
  HARMONY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&B), n * n * sizeof(float)));
  HARMONY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&C), n * n * sizeof(float)));
  HARMONY_CUDA_CHECK(
      cudaMemsetAsync(A, 0, n * n * sizeof(float), stream));  // zeros: the rate does not depend on values
  HARMONY_CUDA_CHECK(cudaMemsetAsync(B, 0, n * n * sizeof(float), stream));
  cublasHandle_t h = nullptr;
  HARMONY_CUBLAS_CHECK(cublasCreate(&h));
  HARMONY_CUBLAS_CHECK(cublasSetStream(h, stream));
  const double flop = 2.0 * double(n) * double(n) * double(n);
  for (bool tf32 : {false, true}) {
    HARMONY_CUBLAS_CHECK(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    const float alpha = 1, beta = 0;
    const int m = o.gemm;
    const double ms = median_ms(stream, std::max(3, o.repeats / 2), [&]() {
      HARMONY_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, A, m, B, m, &beta, C, m));
    });
    (tf32 ? res.tf32_tflops : res.sgemm_tflops) = flop / (ms / 1e3) / 1e12;
  }
  {  // BF16 inputs and output, fp32 accumulation: the dense tensor-core rate the MFU target is measured against
    HARMONY_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    const float alpha = 1, beta = 0;
    const int m = o.gemm;
    const double ms = median_ms(stream, std::max(3, o.repeats / 2), [&]() {
      HARMONY_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, A, CUDA_R_16BF, m, B, CUDA_R_16BF,
                                        m, &beta, C, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    res.bf16_tflops = flop / (ms / 1e3) / 1e12;
  }
  HARMONY_CUBLAS_CHECK(cublasDestroy(h));
  HARMONY_CUDA_CHECK(cudaFree(A));
  HARMONY_CUDA_CHECK(cudaFree(B));
  HARMONY_CUDA_CHECK(cudaFree(C));
  HARMONY_CUDA_CHECK(cudaStreamDestroy(stream));
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--gpu" && has_value) {
      o.gpu = std::atoi(argv[++i]);
    } else if (a == "--copy-mib" && has_value) {
      o.copy_mib = std::atoi(argv[++i]);
    } else if (a == "--gemm" && has_value) {
      o.gemm = std::atoi(argv[++i]);
    } else if (a == "--repeats" && has_value) {
      o.repeats = std::atoi(argv[++i]);
    } else if (a == "--json") {
      o.json = true;
    } else {
      fmt::print(stderr, "usage: bench_cuda [--gpu G] [--copy-mib M] [--gemm N] [--repeats R] [--json]\n");
      return 2;
    }
  }
  if (o.copy_mib < 1 || o.gemm < 1 || o.repeats < 1) {
    fmt::print(stderr, "bench_cuda: sizes and repeats must be >= 1\n");
    return 2;
  }
  if (!cuda::cuda_available()) {
    fmt::print(stderr, "bench_cuda: no usable CUDA GPU ({})\n", cuda::cuda_unavailable_reason());
    return 77;
  }
  try {
    const cuda::GpuInfo g = cuda::gpu_info(o.gpu);
    const Result r = run(o);
    if (o.json) {
      fmt::print(
          "{{\"gpu\": \"{}\", \"compute_capability\": \"{}.{}\", \"multiprocessors\": {}, \"memory_bytes\": {}, "
          "\"copy_bytes\": {}, \"h2d_pinned_GBps\": {:.2f}, \"d2h_pinned_GBps\": {:.2f}, \"h2d_pageable_GBps\": "
          "{:.2f}, "
          "\"d2h_pageable_GBps\": {:.2f}, \"h2d_ceiling_GBps\": {:.2f}, \"d2h_ceiling_GBps\": {:.2f}, "
          "\"h2d_device_GBps\": {:.2f}, \"d2h_device_GBps\": {:.2f}, \"copy_chunk_bytes\": {}, "
          "\"gemm_n\": {}, \"sgemm_TFLOPs\": {:.2f}, \"tf32_TFLOPs\": {:.2f}, \"bf16_TFLOPs\": {:.2f}}}\n",
          g.name, g.compute_major, g.compute_minor, g.multiprocessors, g.total_memory,
          static_cast<long long>(o.copy_mib) << 20, r.h2d_pinned_gbs, r.d2h_pinned_gbs, r.h2d_pageable_gbs,
          r.d2h_pageable_gbs, r.h2d_ceiling_gbs, r.d2h_ceiling_gbs, r.h2d_device_gbs, r.d2h_device_gbs,
          static_cast<long long>(kChunkMiB) << 20, o.gemm, r.sgemm_tflops, r.tf32_tflops, r.bf16_tflops);
    } else {
      fmt::print("GPU {}: {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", o.gpu, g.name, g.compute_major, g.compute_minor,
                 g.multiprocessors, double(g.total_memory) / double(1LL << 30));
      fmt::print("{:<34} {:>10}\n", "measurement", "value");
      fmt::print("{:<34} {:>10.2f} GB/s\n", fmt::format("H2D pinned ({} MiB)", o.copy_mib), r.h2d_pinned_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", fmt::format("D2H pinned ({} MiB)", o.copy_mib), r.d2h_pinned_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", "H2D pageable", r.h2d_pageable_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", "D2H pageable", r.d2h_pageable_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", "H2D pinned ceiling (best size)", r.h2d_ceiling_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", "D2H pinned ceiling (best size)", r.d2h_ceiling_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", fmt::format("H2D CudaDevice ({} MiB copies)", kChunkMiB), r.h2d_device_gbs);
      fmt::print("{:<34} {:>10.2f} GB/s\n", fmt::format("D2H CudaDevice ({} MiB copies)", kChunkMiB), r.d2h_device_gbs);
      fmt::print("{:<34} {:>10.2f} TFLOP/s\n", fmt::format("cuBLAS SGEMM fp32 (n={})", o.gemm), r.sgemm_tflops);
      fmt::print("{:<34} {:>10.2f} TFLOP/s\n", fmt::format("cuBLAS SGEMM TF32 (n={})", o.gemm), r.tf32_tflops);
      fmt::print("{:<34} {:>10.2f} TFLOP/s\n", fmt::format("cuBLAS GEMM BF16 (n={})", o.gemm), r.bf16_tflops);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cuda: {}\n", e.what());
    return 1;
  }
  return 0;
}
