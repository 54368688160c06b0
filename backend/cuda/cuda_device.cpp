// CUDA device implementation: the capped arena over one cudaMalloc'd block, checked copies, the fp32 and bf16 kernels
// (cuBLAS + kernels.cu, each in an NVTX range), kernel error reports turned into errors, pinned host memory with its
// pre-flight check, NVTX, and the Device host-side services (pin, pinned host buffers, ranges) the executor uses.
// Its streams and events (one submission thread per CUDA stream, sticky errors) are cuda_stream.cpp's.
#include "backend/cuda/cuda_device.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/adamw_parallel.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_internal.hpp"

#ifdef HARMONY_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace harmony::backend::cuda {

using core::format_bytes;

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: nothing else should see it
    return 0;
  }
  return n;
}

bool cuda_available() noexcept { return cuda_device_count() > 0; }

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return n == 0 ? "cudaGetDeviceCount: no CUDA GPU" : "";
}

GpuInfo gpu_info(int gpu) {
  cudaDeviceProp p{};
  HARMONY_CUDA_CHECK(cudaGetDeviceProperties(&p, gpu));
  detail::DeviceGuard guard(gpu);
  std::size_t free_b = 0, total_b = 0;
  HARMONY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {
      gpu, p.name, p.major, p.minor, p.multiProcessorCount, static_cast<Bytes>(total_b), static_cast<Bytes>(free_b)};
}

namespace detail {

DeviceGuard::DeviceGuard(int gpu) {
  HARMONY_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != gpu) {
    HARMONY_CUDA_CHECK(cudaSetDevice(gpu));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) set_device_quietly(previous_);
}

void enable_peer_access(int from_gpu, int to_gpu) {
  if (from_gpu == to_gpu) return;
  static std::mutex mu;
  static std::set<std::pair<int, int>> done;
  std::lock_guard lock(mu);
  if (!done.insert({from_gpu, to_gpu}).second) return;
  int can = 0;
  HARMONY_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from_gpu, to_gpu));
  if (can == 0) return;  // copies still work, staged through the host
  DeviceGuard guard(from_gpu);
  const cudaError_t e = cudaDeviceEnablePeerAccess(to_gpu, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return;
  }
  HARMONY_CUDA_CHECK(e);
}

// --- device ---

CudaDevice::CudaDevice(int index, const CudaDeviceOptions& options) : index_(index), options_(options) {
  const int count = cuda_device_count();
  if (count == 0) throw DeviceError(fmt::format("cuda:{}: no usable CUDA GPU ({})", index, cuda_unavailable_reason()));
  if (index < 0) throw DeviceError(fmt::format("cuda: negative device index {}", index));
  gpu_ = options.gpu >= 0 ? options.gpu : index % count;
  if (gpu_ >= count)
    throw DeviceError(fmt::format("cuda:{}: GPU {} does not exist (this machine has {})", index, gpu_, count));
  name_ = gpu_ == index ? fmt::format("cuda:{}", index) : fmt::format("cuda:{}@gpu{}", index, gpu_);
  if (options.capacity < 0) throw DeviceError(fmt::format("{}: negative memory capacity {}", name_, options.capacity));
  if (options.attention_workspace < 0) throw DeviceError(fmt::format("{}: negative attention workspace", name_));

  DeviceGuard guard(gpu_);
  std::size_t free_b = 0, total_b = 0;
  HARMONY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const auto free_bytes = static_cast<Bytes>(free_b);
  Bytes capacity = options.capacity;
  if (capacity == 0) {
    capacity = free_bytes - options.reserve;
    if (capacity <= 0)
      throw DeviceError(fmt::format("{}: GPU {} has {} free, not more than the {} reserve (CudaDeviceOptions::reserve)",
                                    name_, gpu_, format_bytes(free_bytes), format_bytes(options.reserve)));
  } else if (capacity > free_bytes) {
    throw DeviceError(fmt::format(
        "{}: the requested device memory {} (--gpu-memory) exceeds GPU {}'s free memory: {} "
        "of {}",
        name_, format_bytes(capacity), gpu_, format_bytes(free_bytes), format_bytes(static_cast<Bytes>(total_b))));
  }
  capacity = capacity / kCudaArenaAlignment * kCudaArenaAlignment;
  void* base = nullptr;
  if (capacity > 0) {
    const cudaError_t e = cudaMalloc(&base, static_cast<std::size_t>(capacity));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw DeviceError(fmt::format("{}: cudaMalloc of the {} device block failed: {} ({})", name_,
                                    format_bytes(capacity), cudaGetErrorName(e), cudaGetErrorString(e)));
    }
  }
  const int gpu = gpu_;
  arena_ = std::make_shared<CudaArena>(name_, base, capacity, [gpu](void* p) {
    const QuietDeviceGuard guard(gpu);
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();  // also at exit, when the runtime is unloading
  });
  if (options_.poison) HARMONY_CUDA_CHECK(cudaStreamCreateWithFlags(&poison_stream_, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  const QuietDeviceGuard guard(gpu_);
  if (poison_stream_ != nullptr && cudaStreamDestroy(poison_stream_) != cudaSuccess) (void)cudaGetLastError();
}

Buffer CudaDevice::alloc(Bytes bytes, std::string_view label) {
  void* p = arena_->allocate(bytes, label);
  Buffer buf(arena_, p, p == nullptr ? 0 : bytes);
  if (p != nullptr && options_.poison) {
    DeviceGuard guard(gpu_);
    HARMONY_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, static_cast<std::size_t>(arena_->allocation_bytes(p)), poison_stream_));
    HARMONY_CUDA_CHECK(cudaStreamSynchronize(poison_stream_));
  }
  return buf;
}

void CudaDevice::check_pinnable(Bytes bytes, const std::string& what, Bytes limit) {
  check_pinned_budget(bytes, what, limit);
}

std::shared_ptr<void> CudaDevice::pin_host(void* ptr, Bytes bytes, const std::string& what) {
  if (ptr == nullptr || bytes == 0) return nullptr;
  return std::make_shared<HostRegistration>(ptr, bytes, what);
}

HostBuffer CudaDevice::alloc_host(Bytes bytes, const std::string& what) {
  if (bytes == 0) return {};
  auto pinned = std::make_shared<PinnedHostBuffer>(bytes, what);
  void* p = pinned->data();
  return HostBuffer(p, bytes, std::move(pinned));
}

std::shared_ptr<void> CudaDevice::trace_range(const std::string& name) {
  if (!nvtx_built()) return nullptr;
  return std::make_shared<NvtxRange>(name);
}

std::unique_ptr<Stream> CudaDevice::create_stream(std::string name) {
  return std::make_unique<CudaStream>(*this, std::move(name));
}

std::unique_ptr<Event> CudaDevice::create_event() { return std::make_unique<CudaEvent>(gpu_); }

void CudaDevice::add_stream(CudaStream* s) {
  std::lock_guard lock(mu_);
  streams_.insert(s);
}

void CudaDevice::remove_stream(CudaStream* s) {
  std::lock_guard lock(mu_);
  streams_.erase(s);
}

void CudaDevice::synchronize() {
  std::vector<CudaStream*> streams;
  {
    std::lock_guard lock(mu_);
    streams.assign(streams_.begin(), streams_.end());
  }
  std::exception_ptr first;
  for (CudaStream* s : streams) {
    if (auto e = s->finish(); e && !first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

void CudaDevice::check_alive() {
  std::vector<CudaStream*> streams;
  {
    std::lock_guard lock(mu_);
    streams.assign(streams_.begin(), streams_.end());
  }
  const QuietDeviceGuard guard(gpu_);
  std::exception_ptr first;
  for (CudaStream* s : streams) {  // every stream: each drops the host functions CUDA will not run
    if (auto e = s->poll(); e && !first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

std::exception_ptr CudaDevice::kernel_error(const kern::ErrorReport& r, const std::string& stream) const {
  const long long value = r.value, a = r.a, b = r.b, limit = r.limit;
  std::string what;
  switch (r.code) {
    case kern::kErrEmbeddingId:
      what =
          fmt::format("embedding: token id {} at (b={}, t={}) is outside the vocabulary [0, {})", value, a, b, limit);
      break;
    case kern::kErrTargetId:
      what = fmt::format("cross-entropy: target id {} at row {} is outside the vocabulary [0, {})", value, a, limit);
      break;
    case kern::kErrEmbeddingBwdId:
      what = fmt::format(
          "embedding_bwd: token id {} at (b={}, t={}) is outside the vocabulary [0, {}); nothing was written", value, a,
          b, limit);
      break;
    default:
      what = fmt::format("a kernel reported error code {}", r.code);
  }
  return std::make_exception_ptr(DeviceError(fmt::format("{}: {} (stream '{}')", name_, what, stream)));
}

CudaStream& CudaDevice::own(Stream& s, const char* op) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  if (cs == nullptr || &cs->cuda_device() != this)
    throw DeviceError(fmt::format("{}: {}: stream '{}' does not belong to this device", name_, op, s.name()));
  return *cs;
}

void CudaDevice::check_device(const void* p, Bytes bytes, const char* op, const char* role) const {
  if (bytes == 0) return;
  if (!arena_->contains(p, bytes))
    throw DeviceError(fmt::format("{}: {}: {} {} ({} bytes) is not inside a live allocation of {}", name_, op, role, p,
                                  bytes, name_));
}

void CudaDevice::check_host(const void* p, Bytes bytes, const char* op, const char* role) const {
  if (bytes == 0) return;
  if (p == nullptr) throw DeviceError(fmt::format("{}: {}: {} is null", name_, op, role));
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (arena_->in_block(p) || (e == cudaSuccess && attr.type == cudaMemoryTypeDevice))
    throw DeviceError(fmt::format("{}: {}: {} {} is device memory, not host memory", name_, op, role, p));
}

namespace {
void check_size(Bytes bytes, const std::string& name, const char* op) {
  if (bytes < 0) throw DeviceError(fmt::format("{}: {}: negative size {}", name, op, bytes));
}
}  // namespace

void CudaDevice::copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) {
  CudaStream& cs = own(s, "copy_h2d");
  check_size(bytes, name_, "copy_h2d");
  check_device(dst, bytes, "copy_h2d", "destination");
  check_host(src, bytes, "copy_h2d", "source");
  if (bytes == 0) return;
  cs.submit("copy_h2d", [=](StreamContext& c) {
    HARMONY_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, c.stream()));
  });
}

void CudaDevice::copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) {
  CudaStream& cs = own(s, "copy_d2h");
  check_size(bytes, name_, "copy_d2h");
  check_device(src, bytes, "copy_d2h", "source");
  check_host(dst, bytes, "copy_d2h", "destination");
  if (bytes == 0) return;
  cs.submit("copy_d2h", [=](StreamContext& c) {
    HARMONY_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, c.stream()));
  });
}

CudaDevice& as_cuda(Device& d) {
  auto* p = dynamic_cast<CudaDevice*>(&d);
  if (p == nullptr) throw DeviceError(fmt::format("{} is not a CUDA device", d.name()));
  return *p;
}

void CudaDevice::copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) {
  CudaStream& cs = own(s, "copy_d2d");
  check_size(bytes, name_, "copy_d2d");
  check_device(src, bytes, "copy_d2d", "source");
  CudaDevice& to = dst_device == nullptr ? *this : as_cuda(*dst_device);
  to.check_device(dst, bytes, "copy_d2d", "destination");
  if (bytes == 0) return;
  const int from_gpu = gpu_, to_gpu = to.gpu();
  if (from_gpu == to_gpu) {
    cs.submit("copy_d2d", [=](StreamContext& c) {
      HARMONY_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, c.stream()));
    });
  } else {
    enable_peer_access(from_gpu, to_gpu);
    cs.submit("copy_peer", [=](StreamContext& c) {
      HARMONY_CUDA_CHECK(cudaMemcpyPeerAsync(dst, to_gpu, src, from_gpu, static_cast<std::size_t>(bytes), c.stream()));
    });
  }
}

void CudaDevice::fill_zero(Stream& s, void* dst, Bytes bytes) {
  CudaStream& cs = own(s, "fill_zero");
  check_size(bytes, name_, "fill_zero");
  check_device(dst, bytes, "fill_zero", "destination");
  if (bytes == 0) return;
  cs.submit("fill_zero", [=](StreamContext& c) {
    HARMONY_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(bytes), c.stream()));
  });
}

// --- kernels: checked here, run by the stream's thread inside an NVTX range named after the kernel ---

template <class F>
void CudaDevice::launch(Stream& s, const char* op, F&& f) {
  own(s, op).submit(op, [op, f = std::forward<F>(f)](StreamContext& c) {
    const NvtxRange range(op);
    f(c);
  });
}

namespace {
void check_dims(const std::string& name, const char* op, std::initializer_list<std::int64_t> dims) {
  for (std::int64_t d : dims) {
    if (d < 0) throw DeviceError(fmt::format("{}: {}: negative size {}", name, op, d));
  }
}
}  // namespace

template <class S>
void CudaDevice::embedding_fwd_as(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T,
                                  int C, int V) {
  check_dims(name_, "embedding_fwd", {B, T, C, V});
  launch(s, "embedding_fwd",
         [=](StreamContext& c) { kern::embedding_fwd(c.stream(), c.errors(), out, ids, wte, wpe, B, T, C, V); });
}

template <class S>
void CudaDevice::embedding_bwd_as(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T,
                                  int C, int V) {
  check_dims(name_, "embedding_bwd", {B, T, C, V});
  launch(s, "embedding_bwd", [=](StreamContext& c) {
    const std::size_t bytes = kern::embedding_bwd_workspace_bytes(B * T);
    void* ws = c.workspace(bytes);
    kern::embedding_bwd(c.stream(), c.errors(), ws, bytes, dwte, dwpe, dout, ids, B, T, C, V);
  });
}

template <class S>
void CudaDevice::layernorm_fwd_as(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b,
                                  int N, int C, float eps) {
  check_dims(name_, "layernorm_fwd", {N, C});
  launch(s, "layernorm_fwd",
         [=](StreamContext& c) { kern::layernorm_fwd(c.stream(), out, mean, rstd, in, w, b, N, C, eps); });
}

template <class S>
void CudaDevice::layernorm_bwd_as(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w,
                                  const float* mean, const float* rstd, int N, int C) {
  check_dims(name_, "layernorm_bwd", {N, C});
  launch(s, "layernorm_bwd", [=](StreamContext& c) {
    kern::layernorm_bwd(c.stream(), din, dw, db, dout, in, w, mean, rstd, N, C,
                        c.column_sums_workspace(N, C, true, std::is_same_v<S, Bf16>));
  });
}

template <class S>
void CudaDevice::matmul_fwd_as(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                               WeightLayout layout) {
  check_dims(name_, "matmul_fwd", {N, IC, OC});
  launch(s, "matmul_fwd", [=](StreamContext& c) { detail::matmul_fwd(c, out, in, w, bias, N, IC, OC, layout); });
}

template <class S>
void CudaDevice::matmul_bwd_as(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N,
                               int IC, int OC, WeightLayout layout) {
  check_dims(name_, "matmul_bwd", {N, IC, OC});
  launch(s, "matmul_bwd",
         [=](StreamContext& c) { detail::matmul_bwd(c, din, dw, dbias, dout, in, w, N, IC, OC, layout); });
}

template <class S>
void CudaDevice::attention_fwd_as(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H) {
  check_dims(name_, "attention_fwd", {B, T, C, H});
  if (H == 0 || C % H != 0)
    throw DeviceError(fmt::format("{}: attention_fwd: {} channels do not split into {} heads", name_, C, H));
  launch(s, "attention_fwd", [=](StreamContext& c) { detail::attention_fwd(c, out, att, qkv, B, T, C, H); });
}

template <class S>
void CudaDevice::attention_bwd_as(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                                  int H) {
  check_dims(name_, "attention_bwd", {B, T, C, H});
  if (H == 0 || C % H != 0)
    throw DeviceError(fmt::format("{}: attention_bwd: {} channels do not split into {} heads", name_, C, H));
  launch(s, "attention_bwd", [=](StreamContext& c) { detail::attention_bwd(c, dqkv, dout, qkv, att, B, T, C, H); });
}

template <class S>
void CudaDevice::gelu_fwd_as(Stream& s, S* out, const S* in, std::int64_t n) {
  check_dims(name_, "gelu_fwd", {n});
  launch(s, "gelu_fwd", [=](StreamContext& c) { kern::gelu_fwd(c.stream(), out, in, n); });
}

template <class S>
void CudaDevice::gelu_bwd_as(Stream& s, S* din, const S* in, const S* dout, std::int64_t n) {
  check_dims(name_, "gelu_bwd", {n});
  launch(s, "gelu_bwd", [=](StreamContext& c) { kern::gelu_bwd(c.stream(), din, in, dout, n); });
}

template <class S>
void CudaDevice::add_as(Stream& s, S* out, const S* a, const S* b, std::int64_t n) {
  check_dims(name_, "add", {n});
  launch(s, "add", [=](StreamContext& c) { kern::add(c.stream(), out, a, b, n); });
}

namespace {
// The rotary kernels' shape: H query heads in Hkv groups, heads of even width D.
void check_rope(const std::string& name, const char* op, int B, int T, int H, int Hkv, int D) {
  check_dims(name, op, {B, T, H, Hkv, D});
  if (Hkv == 0 || H % Hkv != 0)
    throw DeviceError(fmt::format("{}: {}: {} query heads do not split into {} key/value heads", name, op, H, Hkv));
  if (D % 2 != 0) throw DeviceError(fmt::format("{}: {}: head width {} is odd (rotary needs it even)", name, op, D));
}
}  // namespace

template <class S>
void CudaDevice::rmsnorm_fwd_as(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) {
  check_dims(name_, "rmsnorm_fwd", {N, C});
  launch(s, "rmsnorm_fwd", [=](StreamContext& c) { kern::rmsnorm_fwd(c.stream(), out, rstd, in, w, N, C, eps); });
}

template <class S>
void CudaDevice::rmsnorm_bwd_as(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd,
                                int N, int C) {
  check_dims(name_, "rmsnorm_bwd", {N, C});
  launch(s, "rmsnorm_bwd", [=](StreamContext& c) {
    kern::rmsnorm_bwd(c.stream(), din, dw, dout, in, w, rstd, N, C,
                      c.column_sums_workspace(N, C, false, std::is_same_v<S, Bf16>));
  });
}

template <class S>
void CudaDevice::rope_qkv_fwd_as(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) {
  check_rope(name_, "rope_qkv_fwd", B, T, H, Hkv, D);
  launch(s, "rope_qkv_fwd",
         [=](StreamContext& c) { kern::rope_qkv_fwd(c.stream(), qkv, packed, B, T, H, Hkv, D, theta); });
}

template <class S>
void CudaDevice::rope_qkv_bwd_as(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D,
                                 float theta) {
  check_rope(name_, "rope_qkv_bwd", B, T, H, Hkv, D);
  launch(s, "rope_qkv_bwd",
         [=](StreamContext& c) { kern::rope_qkv_bwd(c.stream(), dpacked, dqkv, B, T, H, Hkv, D, theta); });
}

template <class S>
void CudaDevice::swiglu_fwd_as(Stream& s, S* out, const S* in, int N, int I) {
  check_dims(name_, "swiglu_fwd", {N, I});
  launch(s, "swiglu_fwd", [=](StreamContext& c) { kern::swiglu_fwd(c.stream(), out, in, N, I); });
}

template <class S>
void CudaDevice::swiglu_bwd_as(Stream& s, S* din, const S* in, const S* dout, int N, int I) {
  check_dims(name_, "swiglu_bwd", {N, I});
  launch(s, "swiglu_bwd", [=](StreamContext& c) { kern::swiglu_bwd(c.stream(), din, in, dout, N, I); });
}

template <class S>
void CudaDevice::crossentropy_fwd_as(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets,
                                     int N, int V) {
  check_dims(name_, "crossentropy_fwd", {N, V});
  launch(s, "crossentropy_fwd", [=](StreamContext& c) {
    kern::crossentropy_fwd(c.stream(), c.errors(), losses, probs, logits, targets, N, V);
  });
}

template <class S>
void CudaDevice::crossentropy_bwd_as(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale,
                                     int N, int V) {
  check_dims(name_, "crossentropy_bwd", {N, V});
  launch(s, "crossentropy_bwd",
         [=](StreamContext& c) { kern::crossentropy_bwd(c.stream(), dlogits, probs, targets, scale, N, V); });
}

template <class S>
void CudaDevice::adamw_as(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                          std::int64_t n) {
  check_adamw_args(name_, config, step, t, n);
  check_dims(name_, "adamw", {n});
  if (n == 0) return;
  const AdamWFactors f = adamw_factors(config, step);  // on the host, as the CPU device: the same bits
  const kern::AdamWScalars k{f.decay, f.b1, f.one_minus_b1, f.b2, f.one_minus_b2, f.bc2_sqrt, f.eps, f.neg_step_size};
  launch(s, "adamw", [=](StreamContext& c) {
    kern::adamw(c.stream(), k, t.param, t.working, t.grad, t.grad2, t.exp_avg, t.exp_avg_sq, t.twin, t.nonfinite, n);
  });
}

void CudaDevice::matmul_bwd_fused_bf16(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in,
                                       const Bf16* w, int N, int IC, int OC, WeightLayout layout) {
  check_dims(name_, "matmul_bwd", {N, IC, OC});
  launch(s, "matmul_bwd",
         [=](StreamContext& c) { detail::matmul_bwd_fused(c, din, dw, dbias, dout, in, w, N, IC, OC, layout); });
}

void CudaDevice::matmul_gelu_fwd_bf16(Stream& s, Bf16* out, Bf16* pre, const Bf16* in, const Bf16* w, const Bf16* bias,
                                      int N, int IC, int OC, WeightLayout layout) {
  check_dims(name_, "matmul_gelu_fwd", {N, IC, OC});
  launch(s, "matmul_gelu_fwd",
         [=](StreamContext& c) { detail::matmul_gelu_fwd(c, out, pre, in, w, bias, N, IC, OC, layout); });
}

void CudaDevice::matmul_gelu_bwd_bf16(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, Bf16* dpre_bias, const Bf16* dout,
                                      const Bf16* in, const Bf16* w, const Bf16* pre, int N, int IC, int OC,
                                      WeightLayout layout) {
  check_dims(name_, "matmul_gelu_bwd", {N, IC, OC});
  if (din == nullptr) throw DeviceError(fmt::format("{}: matmul_gelu_bwd: din is null", name_));
  launch(s, "matmul_gelu_bwd", [=](StreamContext& c) {
    detail::matmul_gelu_bwd(c, din, dw, dbias, dpre_bias, dout, in, w, pre, N, IC, OC, layout);
  });
}

template <class S>
void CudaDevice::add_layernorm_fwd_as(Stream& s, S* res, S* out, float* mean, float* rstd, const S* a, const S* b,
                                      const S* w, const S* bias, int N, int C, float eps) {
  check_dims(name_, "add_layernorm_fwd", {N, C});
  launch(s, "add_layernorm_fwd", [=](StreamContext& c) {
    kern::add_layernorm_fwd(c.stream(), res, out, mean, rstd, a, b, w, bias, N, C, eps);
  });
}

// Kernels<float> and Kernels<Bf16>: the same templates.
template <class S>
void CudaKernels<S>::embedding_fwd(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T,
                                   int C, int V) {
  dev_.embedding_fwd_as(s, out, ids, wte, wpe, B, T, C, V);
}
template <class S>
void CudaKernels<S>::embedding_bwd(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T,
                                   int C, int V) {
  dev_.embedding_bwd_as(s, dwte, dwpe, dout, ids, B, T, C, V);
}
template <class S>
void CudaKernels<S>::layernorm_fwd(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b,
                                   int N, int C, float eps) {
  dev_.layernorm_fwd_as(s, out, mean, rstd, in, w, b, N, C, eps);
}
template <class S>
void CudaKernels<S>::layernorm_bwd(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w,
                                   const float* mean, const float* rstd, int N, int C) {
  dev_.layernorm_bwd_as(s, din, dw, db, dout, in, w, mean, rstd, N, C);
}
template <class S>
void CudaKernels<S>::matmul_fwd(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                                WeightLayout layout) {
  dev_.matmul_fwd_as(s, out, in, w, bias, N, IC, OC, layout);
}
template <class S>
void CudaKernels<S>::matmul_bwd(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N,
                                int IC, int OC, WeightLayout layout) {
  if constexpr (std::is_same_v<S, Bf16>) {
    if (epi::fuse_epilogues(dev_.fusion(), true))
      return dev_.matmul_bwd_fused_bf16(s, din, dw, dbias, dout, in, w, N, IC, OC, layout);
  }
  dev_.matmul_bwd_as(s, din, dw, dbias, dout, in, w, N, IC, OC, layout);
}
template <class S>
void CudaKernels<S>::matmul_gelu_fwd(Stream& s, S* out, S* pre, const S* in, const S* w, const S* bias, int N, int IC,
                                     int OC, WeightLayout layout) {
  if constexpr (std::is_same_v<S, Bf16>) {
    if (epi::fuse_epilogues(dev_.fusion(), true))
      return dev_.matmul_gelu_fwd_bf16(s, out, pre, in, w, bias, N, IC, OC, layout);
  }
  Kernels<S>::matmul_gelu_fwd(s, out, pre, in, w, bias, N, IC, OC, layout);
}
template <class S>
bool CudaKernels<S>::matmul_gelu_bwd(Stream& s, S* din, S* dw, S* dbias, S* dpre_bias, const S* dout, const S* in,
                                     const S* w, const S* pre, int N, int IC, int OC, WeightLayout layout) {
  if constexpr (std::is_same_v<S, Bf16>) {
    if (epi::fuse_epilogues(dev_.fusion(), true)) {
      dev_.matmul_gelu_bwd_bf16(s, din, dw, dbias, dpre_bias, dout, in, w, pre, N, IC, OC, layout);
      return dpre_bias != nullptr;
    }
  }
  return Kernels<S>::matmul_gelu_bwd(s, din, dw, dbias, dpre_bias, dout, in, w, pre, N, IC, OC, layout);
}
template <class S>
void CudaKernels<S>::add_layernorm_fwd(Stream& s, S* res, S* out, float* mean, float* rstd, const S* a, const S* b,
                                       const S* w, const S* bias, int N, int C, float eps) {
  if (epi::fuse_add_layernorm(dev_.fusion()))
    return dev_.add_layernorm_fwd_as(s, res, out, mean, rstd, a, b, w, bias, N, C, eps);
  Kernels<S>::add_layernorm_fwd(s, res, out, mean, rstd, a, b, w, bias, N, C, eps);
}
template <class S>
void CudaKernels<S>::attention_fwd(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H) {
  dev_.attention_fwd_as(s, out, att, qkv, B, T, C, H);
}
template <class S>
void CudaKernels<S>::attention_bwd(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                                   int H) {
  dev_.attention_bwd_as(s, dqkv, dout, qkv, att, B, T, C, H);
}
template <class S>
void CudaKernels<S>::gelu_fwd(Stream& s, S* out, const S* in, std::int64_t n) {
  dev_.gelu_fwd_as(s, out, in, n);
}
template <class S>
void CudaKernels<S>::gelu_bwd(Stream& s, S* din, const S* in, const S* dout, std::int64_t n) {
  dev_.gelu_bwd_as(s, din, in, dout, n);
}
template <class S>
void CudaKernels<S>::add(Stream& s, S* out, const S* a, const S* b, std::int64_t n) {
  dev_.add_as(s, out, a, b, n);
}
template <class S>
void CudaKernels<S>::rmsnorm_fwd(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) {
  dev_.rmsnorm_fwd_as(s, out, rstd, in, w, N, C, eps);
}
template <class S>
void CudaKernels<S>::rmsnorm_bwd(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd,
                                 int N, int C) {
  dev_.rmsnorm_bwd_as(s, din, dw, dout, in, w, rstd, N, C);
}
template <class S>
void CudaKernels<S>::rope_qkv_fwd(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D,
                                  float theta) {
  dev_.rope_qkv_fwd_as(s, qkv, packed, B, T, H, Hkv, D, theta);
}
template <class S>
void CudaKernels<S>::rope_qkv_bwd(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D,
                                  float theta) {
  dev_.rope_qkv_bwd_as(s, dpacked, dqkv, B, T, H, Hkv, D, theta);
}
template <class S>
void CudaKernels<S>::swiglu_fwd(Stream& s, S* out, const S* in, int N, int I) {
  dev_.swiglu_fwd_as(s, out, in, N, I);
}
template <class S>
void CudaKernels<S>::swiglu_bwd(Stream& s, S* din, const S* in, const S* dout, int N, int I) {
  dev_.swiglu_bwd_as(s, din, in, dout, N, I);
}
template <class S>
void CudaKernels<S>::crossentropy_fwd(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets,
                                      int N, int V) {
  dev_.crossentropy_fwd_as(s, losses, probs, logits, targets, N, V);
}
template <class S>
void CudaKernels<S>::crossentropy_bwd(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale,
                                      int N, int V) {
  dev_.crossentropy_bwd_as(s, dlogits, probs, targets, scale, N, V);
}
template <class S>
void CudaKernels<S>::adamw(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                           std::int64_t n) {
  dev_.adamw_as(s, config, step, t, n);
}
template class CudaKernels<float>;
template class CudaKernels<Bf16>;

}  // namespace detail

std::unique_ptr<Device> make_cuda_device(int index, const CudaDeviceOptions& options) {
  return std::make_unique<detail::CudaDevice>(index, options);
}

// --- host memory ---

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    long long kib = 0;
    ls >> key >> kib;
    if (key == "MemTotal:") m.total = static_cast<Bytes>(kib) * core::kKiB;
    if (key == "MemAvailable:") m.available = static_cast<Bytes>(kib) * core::kKiB;
  }
  return m;
}

void check_pinned_budget(Bytes needed, const std::string& what, Bytes limit, Bytes reserve) {
  check_pinned_limit(needed, what, limit);
  const HostMemory m = host_memory();
  if (m.total == 0) return;  // no /proc/meminfo: nothing to check against
  const Bytes available = std::max<Bytes>(0, m.available - reserve);
  if (needed > available)
    throw DeviceError(fmt::format(
        "pinned host memory: {} needed for {}, {} available ({} MemAvailable of {} less a {} reserve); pinned pages "
        "cannot be swapped out: use smaller packs or microbatches, or a machine with more memory",
        format_bytes(needed), what, format_bytes(available), format_bytes(m.available), format_bytes(m.total),
        format_bytes(reserve)));
}

PinnedHostBuffer::PinnedHostBuffer(Bytes bytes, const std::string& what) : bytes_(bytes) {
  check_pinned_budget(bytes, what);
  if (bytes == 0) return;
  HARMONY_CUDA_CHECK(cudaHostAlloc(&ptr_, static_cast<std::size_t>(bytes), cudaHostAllocPortable));
  std::memset(ptr_, 0, static_cast<std::size_t>(bytes));
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    PinnedHostBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (ptr_ != nullptr && cudaFreeHost(ptr_) != cudaSuccess) (void)cudaGetLastError();
}

HostRegistration::HostRegistration(void* ptr, Bytes bytes, const std::string& what) {
  check_pinned_budget(bytes, what);
  if (ptr == nullptr || bytes == 0) return;
  HARMONY_CUDA_CHECK(cudaHostRegister(ptr, static_cast<std::size_t>(bytes), cudaHostRegisterPortable));
  ptr_ = ptr;
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    HostRegistration old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

HostRegistration::~HostRegistration() {
  if (ptr_ != nullptr && cudaHostUnregister(ptr_) != cudaSuccess) (void)cudaGetLastError();
}

// --- NVTX ---

#ifdef HARMONY_HAVE_NVTX
NvtxRange::NvtxRange(const char* name) { nvtxRangePushA(name); }
NvtxRange::~NvtxRange() { nvtxRangePop(); }
bool nvtx_built() { return true; }
#else
NvtxRange::NvtxRange(const char* /*name*/) {}
NvtxRange::~NvtxRange() = default;
bool nvtx_built() { return false; }
#endif

}  // namespace harmony::backend::cuda
