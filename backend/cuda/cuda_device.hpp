// The CUDA device (harmony-run v2): a Device whose memory is one cudaMalloc'd block per logical device carved
// like the CPU arena and capped (--gpu-memory emulates a smaller GPU), whose streams are CUDA streams, whose
// kernels are cuBLAS GEMMs plus backend/cuda/kernels.cu; a Communicator over NCCL or device copies; pinned
// host memory with a pre-flight check; NVTX ranges. Free of CUDA headers. The registry reaches it through the
// module's factory (cuda_module.cpp); tests and benchmarks link it directly.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device.hpp"

namespace harmony::backend::cuda {

// HARMONY_SYNC_DEBUG=1 (or any value but "0" / empty) in the environment (CudaDeviceOptions' default).
inline bool sync_debug_from_environment() {
  const char* v = std::getenv("HARMONY_SYNC_DEBUG");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

#ifdef NDEBUG
inline constexpr bool kCudaPoisonByDefault = false;
#else
inline constexpr bool kCudaPoisonByDefault = true;
#endif

struct CudaDeviceOptions {
  // The physical GPU (CUDA ordinal). -1: logical index % cuda_device_count(), so N logical devices on fewer GPUs
  // share them round-robin (each with its own capped block; copies between them are device-to-device).
  int gpu = -1;
  // Device memory of this logical device (--gpu-memory): one block of this size is cudaMalloc'd up front and
  // every Buffer comes from it; beyond it alloc throws OutOfMemory. 0: the GPU's free memory less `reserve`.
  Bytes capacity = 0;
  // Left free when capacity is 0: the CUDA context, cuBLAS and NCCL buffers and the streams' workspaces
  // (below) live outside the block.
  Bytes reserve = core::kGiB;
  // cuBLAS may use TF32 tensor cores for fp32 GEMMs (~10 bits of mantissa in the products: relative errors
  // ~1e-3 instead of ~1e-6). Off: results track the CPU reference.
  bool tf32 = false;
  // Bias and LayerNorm parameter gradients by a tree (backend/cuda/index.hpp: column tiles x row parts, then
  // the parts in order) instead of one thread per column adding the rows in order: ~1000 blocks instead of
  // C/128, deterministic on every GPU, but rounded differently from the CPU device and from the same rows split
  // into microbatches (relative differences ~1e-6). Off: bit-identical to the CPU's row order.
  bool tree_sums = false;
  // The bf16 kernels as the CPU device's bf16 kernels compute them (true): column sums in row order (unless
  // tree_sums), attention's probabilities and score gradients in fp32 scratch around fp32 GEMMs; the same rounding
  // points as the CPU, so the CUDA tests and the conformance suite bound the difference to a bf16 ulp. false (the
  // default): the bf16 fast path, column sums by the tree (as tree_sums) and attention as bf16 strided-batched
  // GEMMs around a fused causal softmax, the T x T scores, probabilities and their gradients rounded to bf16, and
  // the biased matmuls' bias in a cuBLASLt epilogue (docs/backend.md, "CUDA bf16 fast path"). The fp32 kernels ignore
  // it. The registry's devices (harmony-run, the conformance suite) set it to !DeviceOptions::tree_sums
  // (cuda_module.cpp).
  bool bf16_exact = false;
  // The fused kernels (docs/backend.md, "Fused kernels"): the residual add and the LayerNorm that reads it in one
  // kernel (fp32 and bf16; the unfused bits), and on the bf16 fast path cuBLASLt's epilogues: bias + GELU into c_fc's
  // matmul, the GELU gradient and c_fc's bias gradient into c_proj's backward, every biased matmul's bias gradient
  // into its dW GEMM; each falling back to the unfused kernels where cuBLASLt refuses the shape. Off: the kernels of
  // before (harmony-run turns it off with --exact and --no-fuse; the registry's devices have it only when
  // DeviceOptions::fused asks).
  bool fused_epilogues = true;
  // Synchronize after every enqueued operation and check for errors, so an asynchronous fault (an illegal
  // address in a kernel) is reported against the operation that caused it. Slow; for debugging.
  bool sync_debug = sync_debug_from_environment();
  // Fill every fresh allocation with 0xFF bytes (a float NaN), synchronously, so reads of never-written memory
  // show up. A blocking memset per allocation: on by default only in debug builds (harmony-run --poison turns
  // it on in release). Freed memory is not poisoned (a free may run inside a CUDA host callback, where CUDA
  // calls are not allowed).
  bool poison = kCudaPoisonByDefault;
  // Per stream, outside the block: the attention backward's score-gradient tiles (split into chunks of
  // (b, h) pairs that fit; at least one T x T tile) and the embedding backward's sort buffers.
  Bytes attention_workspace = 64 * core::kMiB;
};

// How many cuBLASLt epilogue calls (the bf16 fast path's bias, GELU, GELU-gradient and bias-gradient epilogues) found
// no algorithm in this process and ran the unfused kernels instead (shapes refused before asking are not counted).
std::int64_t cublaslt_fallbacks() noexcept;

// Whether a CUDA GPU is usable: the runtime finds a driver and at least one device. Never throws.
bool cuda_available() noexcept;
// Number of CUDA GPUs (0 without a driver or GPU). Never throws.
int cuda_device_count() noexcept;
// Why cuda_available() is false ("cudaGetDeviceCount: CUDA driver version is insufficient ..."), or "".
std::string cuda_unavailable_reason();

struct GpuInfo {
  int ordinal = 0;
  std::string name;       // "NVIDIA H200"
  int compute_major = 0;  // 9 for sm_90
  int compute_minor = 0;
  int multiprocessors = 0;
  Bytes total_memory = 0;
  Bytes free_memory = 0;
};
GpuInfo gpu_info(int gpu);

// A logical CUDA device named "cuda:<index>" ("cuda:<index>@gpu<g>" when it shares GPU g with others).
// Throws DeviceError when CUDA or the GPU is unavailable, or capacity exceeds the GPU's free memory.
std::unique_ptr<Device> make_cuda_device(int index, const CudaDeviceOptions& options = {});

// All devices must be CUDA devices; rank r is devices[r]. On distinct GPUs with NCCL built in: one
// communicator over all of them (ncclCommInitAll). Otherwise (several logical devices on one GPU, or no
// NCCL): device-to-device and peer copies, and an all-reduce that adds in rank order on rank 0's stream.
std::unique_ptr<Communicator> make_cuda_communicator(const std::vector<Device*>& devices);
// Whether this communicator sums with NCCL (whose ring order differs from rank order; see docs/backend.md).
bool uses_nccl(const Communicator& communicator);

// Host memory of this machine: MemAvailable and MemTotal from /proc/meminfo.
struct HostMemory {
  Bytes available = 0;
  Bytes total = 0;
};
HostMemory host_memory();

// Pre-flight for pinned host memory: throws DeviceError unless `needed` bytes can be pinned, i.e. needed <=
// `limit` (when > 0) and needed <= MemAvailable - `reserve`. The message names what is needed, what is
// available and the limit: "pinned host memory: 96.00 GiB needed for <what>, 61.20 GiB available ...".
void check_pinned_budget(Bytes needed, const std::string& what, Bytes limit = 0, Bytes reserve = 2 * core::kGiB);

// Page-locked host memory (cudaHostAlloc, portable to every GPU), zero-initialised, move-only: the HostBuffer
// of the CUDA device, for copies that overlap compute. Checked with check_pinned_budget first.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(Bytes bytes, const std::string& what = "a transfer buffer");
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  Bytes bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  Bytes bytes_ = 0;
};

// Pins existing host memory (cudaHostRegister) for the lifetime of this object, e.g. HostState's weights and
// gradients, so the executor's copies from them are asynchronous DMA. Move-only.
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* ptr, Bytes bytes, const std::string& what = "host memory");
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

 private:
  void* ptr_ = nullptr;
};

// An NVTX range on the calling thread for its lifetime (Nsight Systems shows it, and projects it onto the GPU
// work launched inside). Name ranges like the trace's ops ("t3 BWD L21-27 mb0 u8"). A no-op when NVTX was
// not found at build time (nvtx_built()).
class NvtxRange {
 public:
  explicit NvtxRange(const char* name);
  explicit NvtxRange(const std::string& name) : NvtxRange(name.c_str()) {}
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};
bool nvtx_built();

}  // namespace harmony::backend::cuda
