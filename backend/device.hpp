// The device interface the real executor runs a core::Program on: capped device memory (Buffer), host
// buffers, streams (in-order queues) and events (cross-stream dependencies), host<->device and
// device<->device copies, the kernels the GPT-2 model needs (Kernels<S>, fp32 and bf16), and collectives.
// backend/cpu/ implements it on the host (one thread per stream), backend/cuda/ on NVIDIA GPUs; the host-side
// services a device may specialise (pinned host memory, profiler ranges) default to plain memory and nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "backend/adamw.hpp"
#include "backend/bf16.hpp"
#include "core/base/error.hpp"
#include "core/base/units.hpp"

namespace harmony::backend {

using core::Bytes;

// Everything backend/ throws derives from this (and so from core::Error).
class BackendError : public core::Error {
 public:
  using core::Error::Error;
};

// Misuse of a device: a pointer outside the device's live allocations, mixed device types, a failed kernel
// (a token id out of range), mismatched collective sizes. Errors raised while a stream runs are kept and
// rethrown by the next Stream::synchronize() / Device::synchronize() (sticky, as CUDA errors are).
class DeviceError : public BackendError {
 public:
  using BackendError::BackendError;
};

// An allocation that does not fit. what(): "cpu:0: out of memory allocating 'dW L3' (12.00 MiB): 60.00 MiB
// of 64.00 MiB in use, largest free block 4.00 MiB".
class OutOfMemory : public DeviceError {
 public:
  OutOfMemory(const std::string& device, std::string_view label, Bytes requested, Bytes in_use, Bytes capacity,
              Bytes largest_free);
  Bytes requested() const { return requested_; }
  Bytes in_use() const { return in_use_; }
  Bytes capacity() const { return capacity_; }
  Bytes largest_free() const { return largest_free_; }

 private:
  Bytes requested_, in_use_, capacity_, largest_free_;
};

// DeviceError unless `needed` bytes of pinned host memory fit `limit` (> 0; 0: no limit): the machine file's
// topology.pinned_limit. Every device's check_pinnable starts with it.
void check_pinned_limit(Bytes needed, const std::string& what, Bytes limit);

// Returns device memory to whoever allocated it. Implemented by each device's allocator.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void release(void* ptr) noexcept = 0;
};

// Owning handle to one device allocation (move-only). Freed (and, in debug/sanitizer builds, poisoned)
// when destroyed or reset(); the caller must make sure no queued stream work still uses it (synchronize
// the stream first, or hand it to Stream::release_after()).
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<DeviceAllocator> owner, void* ptr, Bytes bytes)
      : owner_(std::move(owner)), ptr_(ptr), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() noexcept;
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  Bytes bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(owner_, o.owner_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  std::shared_ptr<DeviceAllocator> owner_;
  void* ptr_ = nullptr;
  Bytes bytes_ = 0;
};

// Host memory for transfers (64-byte aligned, zero-initialised; Device::alloc_host pins it on CUDA). Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(Bytes bytes);
  // Memory some other owner allocated (a pinned block): `owner` keeps it alive and frees it when released.
  HostBuffer(void* ptr, Bytes bytes, std::shared_ptr<void> owner)
      : ptr_(ptr), bytes_(bytes), owner_(std::move(owner)) {}
  HostBuffer(HostBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        owner_(std::move(other.owner_)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    HostBuffer tmp(std::move(other));
    std::swap(ptr_, tmp.ptr_);
    std::swap(bytes_, tmp.bytes_);
    std::swap(owner_, tmp.owner_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() = default;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  template <class T>
  std::span<T> span() const {
    return {as<T>(), static_cast<std::size_t>(bytes_) / sizeof(T)};
  }
  Bytes bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  Bytes bytes_ = 0;
  std::shared_ptr<void> owner_;  // frees ptr_ with the last reference
};

struct MemoryStats {
  Bytes capacity = 0;
  Bytes in_use = 0;        // live allocations, rounded up to the allocation granularity
  Bytes peak = 0;          // high-water mark of in_use since creation or reset_peak()
  Bytes largest_free = 0;  // the largest allocation that would succeed now
  std::int64_t live_allocations = 0;
};

class Device;

// Marks a point in a stream. Stream::wait(e) makes a stream wait for the most recent record(e) made before
// the wait call (CUDA semantics); an event never recorded counts as complete.
class Event {
 public:
  virtual ~Event() = default;
  virtual void synchronize() = 0;  // host blocks until the recorded point has run
  virtual bool query() = 0;        // whether it has
};

// Device time between two points of one stream, read where the stream's work runs: the host's launch and
// synchronize latency is not in it, so a batch of work timed this way measures what the device spent on it
// (the profiler's layer times). start() and stop() enqueue the two points; seconds() blocks until the second has
// run and returns the time between them. Start, stop, read, in that order; reusable after a read.
class StreamTimer {
 public:
  virtual ~StreamTimer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  virtual double seconds() = 0;
};

// An in-order queue of work on one device. Enqueueing returns at once; work runs in FIFO order.
class Stream {
 public:
  virtual ~Stream() = default;  // waits for queued work to finish
  virtual Device& device() = 0;
  virtual const std::string& name() const = 0;
  // Runs `fn` on the host when the stream reaches it (cudaLaunchHostFunc). An exception thrown by `fn`
  // becomes the stream's sticky error.
  virtual void launch_host(std::function<void()> fn) = 0;
  virtual void record(Event& event) = 0;
  virtual void wait(Event& event) = 0;
  // Host blocks until all queued work has run; rethrows (once) the first error raised on the stream.
  virtual void synchronize() = 0;
  // Frees `buffer` when the stream reaches this point (stream-ordered free).
  void release_after(Buffer buffer);
  // A timer of this stream. The default stamps the host's steady clock from host functions (launch_host) when the
  // stream reaches each point: exact for a stream whose work runs on a host thread (the CPU device); CUDA times
  // with events instead, since a host function's own dispatch would be in the interval.
  virtual std::unique_ptr<StreamTimer> timer();
};

// How a weight matrix is laid out. InOut: [in, out] row-major, HF Conv1D (GPT-2's c_attn, c_proj, c_fc).
// OutIn: [out, in] row-major, torch.nn.Linear (the LM head tied to wte, whose rows are tokens).
enum class WeightLayout : std::uint8_t { InOut, OutIn };

// The tensors of one AdamW update on a device (Kernels<S>::adamw): n elements each, device memory of the stream's
// device, none overlapping another. The optimizer of the resident training state (backend/model/device_state.hpp).
template <class S>
struct AdamWTensors {
  float* param = nullptr;  // fp32: the parameter itself; bf16: its fp32 master copy. Updated.
  S* working = nullptr;    // bf16: the working copy the kernels read, set to param rounded to nearest even (required);
                           // fp32: must be null (param is the working copy)
  const S* grad = nullptr;
  const S* grad2 = nullptr;  // optional: a tied twin's gradient; the update uses grad + grad2 (both widened to fp32
                             // first in bf16, one fp32 add): GPT-2's wte with the head's lm_head gradient
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  S* twin = nullptr;  // optional: the tied twin's weights, set to the updated working weights (fp32: param)
  // optional: one int32, set to 1 when a gradient element (of grad + grad2) is a NaN or an infinity, left as it was
  // otherwise (so one flag can gather several updates; zero it first). The host path's NonFiniteGradient.
  std::int32_t* nonfinite = nullptr;
};

// The kernels of the GPT-2 and Llama-family models over storage S: float (fp32) or Bf16 (mixed precision,
// docs/backend.md), enqueued on a stream; all pointers are device memory of the stream's device. N = B*T rows. One
// interface for both element types: the signatures differ only in S, except what stays fp32 in both (the per-token
// cross-entropy `losses`, the normalizations' row statistics `mean` and `rstd`, and the `eps` and `scale` arguments).
//
// fp32: every reduction runs in a fixed order that does not depend on how the rows are split into calls, and every
// weight-gradient kernel accumulates (+=) row by row in row order, so gradients summed over microbatches are
// bit-identical to the whole batch's (docs/backend.md).
// bf16: every input is widened to fp32, the kernel computes in fp32 exactly as the fp32 kernel does (every sum and
// GEMM accumulates in fp32) and each output is rounded to nearest even once when stored; an accumulated output
// (dw +=, din += of layernorm_bwd) is widened, accumulated in fp32 and rounded back.
// Aliasing is allowed where noted, for both element types.
template <class S>
class Kernels {
 public:
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, Bf16>, "Kernels<S>: S is float or Bf16");
  using Scalar = S;
  virtual ~Kernels() = default;
  // out[b,t,:] = wte[ids[b,t],:] + wpe[t,:]. Ids outside [0, V) are a DeviceError. wpe (and dwpe below) may be null
  // on a device with the Llama kernels (no position table).
  virtual void embedding_fwd(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T,
                             int C, int V) = 0;  // out (B,T,C), ids (B,T), wte (V,C), wpe (>=T,C)
  // dwte[ids[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Ids outside [0, V) are a DeviceError, and then
  // nothing is written (dwte and dwpe keep their values) on every device.
  virtual void embedding_bwd(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C,
                             int V) = 0;
  // out = (in - mean) * rstd * w + b per row; mean, rstd (N, fp32 for either S: as torch keeps them under bf16
  // autocast) kept for the backward.
  virtual void layernorm_fwd(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N,
                             int C, float eps) = 0;
  // din += d/din (accumulates), dw += ..., db += ... .
  virtual void layernorm_bwd(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean,
                             const float* rstd, int N, int C) = 0;
  // out (N,OC) = in (N,IC) x W + bias; bias may be null.
  virtual void matmul_fwd(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                          WeightLayout layout) = 0;
  // din (N,IC) = dout x W^T (written; may be null), dw += in^T x dout, dbias += column sums (may be null).
  virtual void matmul_bwd(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N, int IC,
                          int OC, WeightLayout layout) = 0;
  // Causal self-attention over qkv (B,T,3C) = [q | k | v], H heads: out (B,T,C); att (B,H,T,T) the
  // probabilities (zero above the diagonal), kept for the backward. Scores are q.k / sqrt(C/H).
  virtual void attention_fwd(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H) = 0;
  // dqkv (B,T,3C) written.
  virtual void attention_bwd(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                             int H) = 0;
  // GPT-2's tanh approximation; din written (may alias dout).
  virtual void gelu_fwd(Stream& s, S* out, const S* in, std::int64_t n) = 0;
  virtual void gelu_bwd(Stream& s, S* din, const S* in, const S* dout, std::int64_t n) = 0;
  // out = a + b (may alias either).
  virtual void add(Stream& s, S* out, const S* a, const S* b, std::int64_t n) = 0;
  // Per row: probs = softmax(logits), losses (fp32 for either S) = -log softmax(logits)[target]. probs may alias
  // logits. Targets outside [0, V) are a DeviceError.
  virtual void crossentropy_fwd(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets, int N,
                                int V) = 0;
  // dlogits = (probs - onehot(target)) * scale; may alias probs.
  virtual void crossentropy_bwd(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                                int V) = 0;
  // --- fused entry points (optional). Each default is the composition of the kernels above, in the order the layer
  // code called them before they existed, so a device that does not override them (the CPU device) keeps its bits;
  // the CUDA device fuses them on its fast path (docs/backend.md, "Fused kernels").
  // pre (N,OC) = in x W + bias (bias may be null); out = gelu(pre): the MLP's first matmul and its GELU, pre kept
  // for the backward.
  virtual void matmul_gelu_fwd(Stream& s, S* out, S* pre, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                               WeightLayout layout) {
    matmul_fwd(s, pre, in, w, bias, N, IC, OC, layout);
    gelu_fwd(s, out, pre, static_cast<std::int64_t>(N) * OC);
  }
  // matmul_bwd of a matmul whose input was in = gelu(pre) (N,IC): din = gelu'(pre) * (dout x W^T) (written, not
  // null), dw += in^T x dout, dbias += column sums of dout (may be null). Returns true when it also added din's
  // column sums into dpre_bias (the gradient of the bias that made pre; may be null), false when it left dpre_bias
  // alone and the caller's matmul_bwd of the matmul that made pre sums them (the default). Decided when the call is
  // made (the device's options), never by what the enqueued work finds.
  virtual bool matmul_gelu_bwd(Stream& s, S* din, S* dw, S* dbias, S* dpre_bias, const S* dout, const S* in, const S* w,
                               const S* pre, int N, int IC, int OC, WeightLayout layout) {
    (void)dpre_bias;
    matmul_bwd(s, din, dw, dbias, dout, in, w, N, IC, OC, layout);
    gelu_bwd(s, din, pre, din, static_cast<std::int64_t>(N) * IC);
    return false;
  }
  // res (N,C) = a + b (may alias either), then out = layernorm(res) as layernorm_fwd (mean, rstd fp32): the residual
  // add and the LayerNorm that reads it.
  virtual void add_layernorm_fwd(Stream& s, S* res, S* out, float* mean, float* rstd, const S* a, const S* b,
                                 const S* w, const S* bias, int N, int C, float eps) {
    add(s, res, a, b, static_cast<std::int64_t>(N) * C);
    layernorm_fwd(s, out, mean, rstd, res, w, bias, N, C, eps);
  }
  // --- the Llama family's kernels (optional: DeviceCaps::llama_kernels). The defaults throw a DeviceError naming the
  // kernel; the CPU device implements them (docs/backend.md, "The Llama family").
  // out = in * rstd * w per row (RMSNorm), rstd = 1 / sqrt(mean(in^2) + eps) (N, fp32 for either S) kept for the
  // backward.
  virtual void rmsnorm_fwd(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps);
  // din += d/din (accumulates), dw += ... .
  virtual void rmsnorm_bwd(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                           int C);
  // qkv (B,T,3C) = [rope(q) | rope(k) | v], the key/value heads repeated (query head h reads head h / (H / Hkv)),
  // from packed (B,T,C + 2*Hkv*C/H) = [q | k | v]: the layout attention_fwd reads. Rotary embeddings as HF's
  // (rotate_half, inv_freq_i = theta^(-2i/D), D = C/H, even).
  virtual void rope_qkv_fwd(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta);
  // dpacked written from dqkv (B,T,3C): key/value gradients summed over their query heads, q and k rotated back.
  virtual void rope_qkv_bwd(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta);
  // out (N,I) = silu(gate) * up, in (N,2I) = [gate | up] per row.
  virtual void swiglu_fwd(Stream& s, S* out, const S* in, int N, int I);
  // din (N,2I) written.
  virtual void swiglu_bwd(Stream& s, S* din, const S* in, const S* dout, int N, int I);
  // One AdamW step (`step` >= 1: the parameter's step count after the increment) over n elements, element for element
  // adamw_update's float operations in its order (backend/adamw.hpp): the factors are computed on the host when the
  // call is made (adamw_factors), so every device starts from the same bits. Throws BackendError at once for an
  // invalid config or step, DeviceError for a missing required tensor.
  virtual void adamw(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                     std::int64_t n) = 0;
};

// The checks every device's Kernels<S>::adamw makes before enqueueing (config, step, required tensors), naming
// `device`.
template <class S>
void check_adamw_args(const std::string& device, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                      std::int64_t n);

// One accelerator (or its CPU stand-in). Allocation is synchronous and thread-safe; copies and kernels are
// enqueued on a stream of this device. Device pointers passed to copies must lie inside live allocations
// of the device they are named for (checked: a DeviceError names the pointer), host pointers outside.
//
// The members by role. Required (pure virtual): identity, memory, streams and events, copies, the fp32 kernels.
// Optional (a default here; the registry's DeviceCaps says which a device kind provides, backend/registry.hpp):
// the bf16 kernels, pinned host memory, profiler ranges. A new device implements the required members, overrides
// the optional ones it has, and registers (docs/backend.md, "Adding a device").
class Device {
 public:
  virtual ~Device() = default;

  // --- identity (required)
  virtual const std::string& name() const = 0;  // "cpu:0"
  virtual int index() const = 0;

  // --- memory (required). Buffers are 256-byte aligned. Throws OutOfMemory when `bytes` does not fit; `label`
  // names the allocation in that message.
  virtual Buffer alloc(Bytes bytes, std::string_view label = {}) = 0;
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak() = 0;

  // --- streams and events (required). Streams and events must be destroyed before their device.
  virtual std::unique_ptr<Stream> create_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Waits for every stream of this device; rethrows the first sticky error.
  virtual void synchronize() = 0;
  // Without blocking: throws when the device can no longer complete queued work (CUDA: a sticky error poisoned
  // the context), after dropping the host functions it will never run (launch_host's closures are destroyed,
  // so release_after's frees happen). For loops that wait on queued work (the executor's alloc_or_wait).
  virtual void check_alive() {}

  // --- copies (required)
  virtual void copy_h2d(Stream& s, void* dst_device, const void* src_host, Bytes bytes) = 0;
  virtual void copy_d2h(Stream& s, void* dst_host, const void* src_device, Bytes bytes) = 0;
  // src on this device, dst on this device or on `dst_device` (a peer copy).
  virtual void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device = nullptr) = 0;
  virtual void fill_zero(Stream& s, void* dst_device, Bytes bytes) = 0;

  // --- kernels: fp32 (required); bf16 (optional, DeviceCaps::bf16_kernels): nullptr where the device has none,
  // which mixed-precision trainers check when they are set up (require_bf16 below, a DeviceError naming the device).
  virtual Kernels<float>& kernels() = 0;
  virtual Kernels<Bf16>* bf16_kernels() { return nullptr; }

  // --- host-side services (optional). The defaults (the CPU device) are plain memory and no ranges; the CUDA
  // device pins and names NVTX ranges (DeviceCaps::pinned_host_memory, profiler_ranges). They let the executor use
  // them without knowing the device type (backend/ is built before, and without, backend/cuda/).
  //
  // Throws DeviceError (naming `what` and the numbers) unless `bytes` of host memory can be pinned: within
  // `limit` when > 0, and (CUDA) within what the machine has available. Call once with the total before
  // pinning. The CPU device pins nothing but enforces `limit` too, so a plan the machine file cannot pin is
  // refused on every device, as harmony-sim refuses it.
  virtual void check_pinnable(Bytes bytes, const std::string& what, Bytes limit);
  // Page-locks [ptr, ptr + bytes) until the returned handle dies, so copies from and to it are asynchronous DMA
  // (cudaHostRegister); nullptr where there is nothing to do. Pin a range once, through one device.
  virtual std::shared_ptr<void> pin_host(void* ptr, Bytes bytes, const std::string& what);
  // Host memory for transfers with this device: pinned on CUDA (cudaHostAlloc), else HostBuffer(bytes).
  virtual HostBuffer alloc_host(Bytes bytes, const std::string& what);
  // Whether trace_range names anything (so callers can skip building the names).
  virtual bool names_ranges() const { return false; }
  // A range on the calling thread's profiler timeline (NVTX on CUDA) until the returned handle dies; nullptr
  // where the device names none.
  virtual std::shared_ptr<void> trace_range(const std::string& name);
};

// Collectives among a fixed group of devices (ranks 0..size-1). Each call is enqueued on the calling rank's
// stream; the operation happens when every participant's stream reaches it (all stall until then).
// Sends and receives between one pair are matched in call order; all_reduce calls in call order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual Device& device(int rank) = 0;
  virtual void send(int rank, Stream& s, const void* src, Bytes bytes, int peer) = 0;
  virtual void recv(int rank, Stream& s, void* dst, Bytes bytes, int peer) = 0;
  // buf (count floats on every rank) = sum over ranks, added in rank order 0, 1, ..., size-1 for every
  // element, so the result is bit-identical on every rank and to a serial sum in that order.
  virtual void all_reduce_sum(int rank, Stream& s, float* buf, std::int64_t count) = 0;
  // buf (count bf16 values on every rank) = the sum of the ranks' values as the executor's host replica sum
  // forms it (rank_sum.hpp): per element every rank's value widened to fp32 (exact), added in fp32 in rank
  // order 0, 1, ..., size-1, and rounded to nearest even once. Bit-identical on every rank; all_reduce_sum and
  // all_reduce_sum_bf16 calls share one call order (a rank's k-th all-reduce of either kind meets the others').
  virtual void all_reduce_sum_bf16(int rank, Stream& s, Bf16* buf, std::int64_t count) = 0;
  // Optional: false where the all-reduces add in another order than rank order (NCCL's ring over distinct GPUs;
  // docs/backend.md), so their sums match a serial rank-order sum only within rounding. Every rank still gets the
  // same bits.
  virtual bool sums_in_rank_order() const { return true; }
};

// device.bf16_kernels(), or a DeviceError "<device>: bf16 not supported on <device kind> yet" (`who` names the
// caller, e.g. "trainer").
Kernels<Bf16>& require_bf16(Device& device, std::string_view who);

// The device's kernels over storage S: kernels() for float, require_bf16(device, who) for Bf16.
template <class S>
Kernels<S>& kernels_of(Device& device, std::string_view who) {
  if constexpr (std::is_same_v<S, Bf16>) {
    return require_bf16(device, who);
  } else {
    return device.kernels();
  }
}

}  // namespace harmony::backend
