// Internals of the CUDA device shared by its translation units (device, communicator, GEMMs): the device, its
// streams (a CUDA stream fed in order by one submission thread, which owns the stream's cuBLAS handle and
// workspace), its events, its kernels (CudaKernels<S>, one template for fp32 and bf16), and a guard for
// the calling thread's current GPU. Not part of the public API.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_arena.hpp"
#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/epilogue.hpp"
#include "backend/cuda/host_calls.hpp"
#include "backend/cuda/kernels.hpp"

namespace harmony::backend::cuda::detail {

// Makes `gpu` the calling thread's current device for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int gpu);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Sets the current device without throwing (destructors, teardown paths).
inline void set_device_quietly(int gpu) noexcept {
  if (cudaSetDevice(gpu) != cudaSuccess) (void)cudaGetLastError();
}

// DeviceGuard for destructors: never throws, restores the caller's device.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int gpu) noexcept {
    restore_ = cudaGetDevice(&previous_) == cudaSuccess;
    if (!restore_) (void)cudaGetLastError();
    set_device_quietly(gpu);
  }
  ~QuietDeviceGuard() {
    if (restore_) set_device_quietly(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Lets device `from_gpu` address `to_gpu`'s memory directly when the hardware allows it (once per pair).
void enable_peer_access(int from_gpu, int to_gpu);

// What work on one stream needs; used only by the stream's submission thread.
class StreamContext {
 public:
  StreamContext(int gpu, cudaStream_t stream, bool tf32, bool tree_sums, bool bf16_exact, Bytes attention_workspace,
                kern::ErrorRecord* errors)
      : gpu_(gpu),
        stream_(stream),
        tf32_(tf32),
        tree_sums_(tree_sums),
        bf16_exact_(bf16_exact),
        attention_workspace_(attention_workspace),
        errors_(errors) {}
  ~StreamContext();
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

  int gpu() const { return gpu_; }
  cudaStream_t stream() const { return stream_; }
  kern::ErrorRecord* errors() const { return errors_; }
  Bytes attention_workspace() const { return attention_workspace_; }
  // Scratch for the tree column sums over N rows of C columns of a bf16 (bf16 true) or fp32 tensor, or null when
  // they run in row order: CudaDeviceOptions::tree_sums off and, for bf16, bf16_exact on.
  void* column_sums_workspace(int N, int C, bool layernorm, bool bf16) {
    const bool tree = tree_sums_ || (bf16 && !bf16_exact_);
    return tree ? workspace(kern::column_sums_workspace_bytes(N, C, layernorm)) : nullptr;
  }
  // The bf16 fast path (CudaDeviceOptions::bf16_exact off): attention as bf16 GEMMs around the fused softmax, the
  // biased matmul's bias in cuBLASLt's epilogue.
  bool bf16_fast() const { return !bf16_exact_; }
  cublasHandle_t cublas();      // created on first use, bound to this stream
  cublasLtHandle_t cublaslt();  // created on first use (the bf16 fast path's bias epilogue)
  // cuBLASLt's heuristic answers on this stream by call shape (found false: none offered), asked once per key.
  struct LtAlgo {
    bool found = false;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<epi::LtKey, LtAlgo>& lt_algorithms() { return lt_algorithms_; }
  // At least `bytes` of device scratch, valid for work enqueued from now on (growing synchronizes the stream).
  void* workspace(std::size_t bytes);

 private:
  int gpu_;
  cudaStream_t stream_;
  bool tf32_;
  bool tree_sums_;
  bool bf16_exact_;
  Bytes attention_workspace_;
  kern::ErrorRecord* errors_;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  std::map<epi::LtKey, LtAlgo> lt_algorithms_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

// The first error of a stream, shared with its host callbacks (which may outlive the stream object).
class StickyError {
 public:
  void set(std::exception_ptr e) {
    std::lock_guard lock(mu_);
    if (!error_) error_ = std::move(e);
  }
  std::exception_ptr take() {
    std::lock_guard lock(mu_);
    return std::exchange(error_, nullptr);
  }

 private:
  std::mutex mu_;
  std::exception_ptr error_;
};

// The CUDA event plus the host-side record count: wait() binds to the record made last before it (CUDA
// semantics) even though records are issued later by submission threads.
struct EventState {
  int gpu = 0;
  cudaEvent_t event = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t requested = 0;  // records asked for (host calls to Stream::record)
  std::int64_t issued = 0;     // records issued to CUDA by the stream's thread
  ~EventState();
  void wait_issued(std::int64_t n);
  void mark_issued(std::int64_t n);
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int gpu);
  void synchronize() override;
  bool query() override;
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

class CudaDevice;

// The device's Kernels<S>: the same kernels (the CudaDevice::*_as templates) for S = float and for S = Bf16
// (__nv_bfloat16 tensors), the Llama family's included.
template <class S>
class CudaKernels final : public Kernels<S> {
 public:
  explicit CudaKernels(CudaDevice& device) : dev_(device) {}
  void embedding_fwd(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T, int C,
                     int V) override;
  void embedding_bwd(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C,
                     int V) override;
  void layernorm_fwd(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N, int C,
                     float eps) override;
  void layernorm_bwd(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean,
                     const float* rstd, int N, int C) override;
  void matmul_fwd(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                  WeightLayout layout) override;
  void matmul_bwd(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N, int IC, int OC,
                  WeightLayout layout) override;
  void attention_fwd(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H) override;
  void attention_bwd(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                     int H) override;
  void gelu_fwd(Stream& s, S* out, const S* in, std::int64_t n) override;
  void gelu_bwd(Stream& s, S* din, const S* in, const S* dout, std::int64_t n) override;
  void add(Stream& s, S* out, const S* a, const S* b, std::int64_t n) override;
  void rmsnorm_fwd(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) override;
  void rmsnorm_bwd(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                   int C) override;
  void rope_qkv_fwd(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) override;
  void rope_qkv_bwd(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta) override;
  void swiglu_fwd(Stream& s, S* out, const S* in, int N, int I) override;
  void swiglu_bwd(Stream& s, S* din, const S* in, const S* dout, int N, int I) override;
  void crossentropy_fwd(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets, int N,
                        int V) override;
  void crossentropy_bwd(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                        int V) override;
  void adamw(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
             std::int64_t n) override;
  // Fused where the device's options say (epilogue.hpp), else Kernels<S>' composition.
  void matmul_gelu_fwd(Stream& s, S* out, S* pre, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                       WeightLayout layout) override;
  bool matmul_gelu_bwd(Stream& s, S* din, S* dw, S* dbias, S* dpre_bias, const S* dout, const S* in, const S* w,
                       const S* pre, int N, int IC, int OC, WeightLayout layout) override;
  void add_layernorm_fwd(Stream& s, S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* w,
                         const S* bias, int N, int C, float eps) override;

 private:
  CudaDevice& dev_;
};

class CudaStream final : public Stream {
 public:
  using Work = std::function<void(StreamContext&)>;
  CudaStream(CudaDevice& device, std::string name);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Device& device() override;
  CudaDevice& cuda_device() { return device_; }
  const std::string& name() const override { return name_; }
  void launch_host(std::function<void()> fn) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;
  // Times with two timing-enabled CUDA events recorded on the stream (cudaEventElapsedTime).
  std::unique_ptr<StreamTimer> timer() override;

  // Enqueues `work` for the submission thread; `op` names it in errors (a string literal).
  void submit(const char* op, Work work);
  // Host blocks until the submission thread has issued everything enqueued so far.
  void drain();
  // Waits for the GPU side too; the first error (sticky, CUDA's or a kernel's report) is returned, not thrown.
  std::exception_ptr finish();
  // Without blocking: CUDA's error when the context has failed (then the host functions CUDA will never run are
  // dropped, so whoever waits on them stops waiting), else null.
  std::exception_ptr poll();
  cudaStream_t handle() const { return stream_; }
  const std::shared_ptr<StickyError>& sticky() const { return sticky_; }

 private:
  void run();
  // The context has failed (CUDA's error e): the host functions still pending will never run.
  std::exception_ptr failed(cudaError_t e);
  // What this stream's kernels reported since the last check (thrown once), or null.
  std::exception_ptr take_kernel_error();

  CudaDevice& device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<StickyError> sticky_ = std::make_shared<StickyError>();
  std::shared_ptr<HostCalls> host_calls_ = std::make_shared<HostCalls>();
  kern::ErrorRecord* errors_host_ = nullptr;    // this stream's record, mapped pinned memory
  kern::ErrorRecord* errors_device_ = nullptr;  // the same, as its kernels address it
  std::mutex errors_mu_;                        // serializes the host's consume_error calls
  std::unique_ptr<StreamContext> ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<const char*, Work>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const CudaDeviceOptions& options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const std::string& name() const override { return name_; }
  int index() const override { return index_; }
  int gpu() const { return gpu_; }
  const CudaDeviceOptions& options() const { return options_; }

  Buffer alloc(Bytes bytes, std::string_view label) override;
  MemoryStats memory() const override { return arena_->stats(); }
  void reset_peak() override { arena_->reset_peak(); }

  std::unique_ptr<Stream> create_stream(std::string name) override;
  std::unique_ptr<Event> create_event() override;
  void synchronize() override;
  void check_alive() override;

  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override;
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override;
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override;
  void fill_zero(Stream& s, void* dst, Bytes bytes) override;
  Kernels<float>& kernels() override { return f32_; }
  Kernels<Bf16>* bf16_kernels() override { return &bf16_; }

  // Host-side services: check_pinned_budget, HostRegistration, PinnedHostBuffer and NvtxRange behind the
  // device interface, so the executor (built without CUDA headers) pins and names ranges on CUDA devices.
  void check_pinnable(Bytes bytes, const std::string& what, Bytes limit) override;
  std::shared_ptr<void> pin_host(void* ptr, Bytes bytes, const std::string& what) override;
  HostBuffer alloc_host(Bytes bytes, const std::string& what) override;
  bool names_ranges() const override { return nvtx_built(); }
  std::shared_ptr<void> trace_range(const std::string& name) override;

  // The kernels over storage S (CudaKernels<S> calls them): checked here, run by the stream's thread.
  template <class S>
  void embedding_fwd_as(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T, int C,
                        int V);
  template <class S>
  void embedding_bwd_as(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C,
                        int V);
  template <class S>
  void layernorm_fwd_as(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N, int C,
                        float eps);
  template <class S>
  void layernorm_bwd_as(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean,
                        const float* rstd, int N, int C);
  template <class S>
  void matmul_fwd_as(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                     WeightLayout layout);
  template <class S>
  void matmul_bwd_as(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N, int IC, int OC,
                     WeightLayout layout);
  template <class S>
  void attention_fwd_as(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H);
  template <class S>
  void attention_bwd_as(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C, int H);
  template <class S>
  void gelu_fwd_as(Stream& s, S* out, const S* in, std::int64_t n);
  template <class S>
  void gelu_bwd_as(Stream& s, S* din, const S* in, const S* dout, std::int64_t n);
  template <class S>
  void add_as(Stream& s, S* out, const S* a, const S* b, std::int64_t n);
  template <class S>
  void rmsnorm_fwd_as(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps);
  template <class S>
  void rmsnorm_bwd_as(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                      int C);
  template <class S>
  void rope_qkv_fwd_as(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta);
  template <class S>
  void rope_qkv_bwd_as(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta);
  template <class S>
  void swiglu_fwd_as(Stream& s, S* out, const S* in, int N, int I);
  template <class S>
  void swiglu_bwd_as(Stream& s, S* din, const S* in, const S* dout, int N, int I);
  template <class S>
  void crossentropy_fwd_as(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets, int N,
                           int V);
  template <class S>
  void crossentropy_bwd_as(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                           int V);
  template <class S>
  void adamw_as(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t, std::int64_t n);
  // The fused entry points (CudaKernels<S> calls them only when fusion() says so).
  epi::FusionMode fusion() const { return {.fused = options_.fused_epilogues, .bf16_fast = !options_.bf16_exact}; }
  void matmul_bwd_fused_bf16(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in,
                             const Bf16* w, int N, int IC, int OC, WeightLayout layout);
  void matmul_gelu_fwd_bf16(Stream& s, Bf16* out, Bf16* pre, const Bf16* in, const Bf16* w, const Bf16* bias, int N,
                            int IC, int OC, WeightLayout layout);
  void matmul_gelu_bwd_bf16(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, Bf16* dpre_bias, const Bf16* dout,
                            const Bf16* in, const Bf16* w, const Bf16* pre, int N, int IC, int OC, WeightLayout layout);
  template <class S>
  void add_layernorm_fwd_as(Stream& s, S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* w,
                            const S* bias, int N, int C, float eps);

  // For the streams and the communicator.
  CudaStream& own(Stream& s, const char* op);
  void check_device(const void* p, Bytes bytes, const char* op, const char* role) const;
  void check_host(const void* p, Bytes bytes, const char* op, const char* role) const;
  // The error a kernel of stream `stream` reported (kern::report_error), in the CPU device's words.
  std::exception_ptr kernel_error(const kern::ErrorReport& r, const std::string& stream) const;
  void add_stream(CudaStream* s);
  void remove_stream(CudaStream* s);

 private:
  template <class F>
  void launch(Stream& s, const char* op, F&& f);

  std::string name_;
  int index_;
  int gpu_;
  CudaDeviceOptions options_;
  std::shared_ptr<CudaArena> arena_;
  cudaStream_t poison_stream_ = nullptr;
  std::mutex mu_;
  std::set<CudaStream*> streams_;
  CudaKernels<float> f32_{*this};
  CudaKernels<Bf16> bf16_{*this};
};

extern template class CudaKernels<float>;
extern template class CudaKernels<Bf16>;

CudaDevice& as_cuda(Device& d);

// cuBLAS-based kernels (gemm.cpp), run by a stream's submission thread.
void matmul_fwd(StreamContext& c, float* out, const float* in, const float* w, const float* bias, int N, int IC, int OC,
                WeightLayout layout);
void matmul_bwd(StreamContext& c, float* din, float* dw, float* dbias, const float* dout, const float* in,
                const float* w, int N, int IC, int OC, WeightLayout layout);
void attention_fwd(StreamContext& c, float* out, float* att, const float* qkv, int B, int T, int C, int H);
void attention_bwd(StreamContext& c, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                   int C, int H);
// The same over bf16 tensors: cublasGemmEx with fp32 accumulation, rounded where the CPU's bf16 kernels round.
void matmul_fwd(StreamContext& c, Bf16* out, const Bf16* in, const Bf16* w, const Bf16* bias, int N, int IC, int OC,
                WeightLayout layout);
void matmul_bwd(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in, const Bf16* w,
                int N, int IC, int OC, WeightLayout layout);
void attention_fwd(StreamContext& c, Bf16* out, Bf16* att, const Bf16* qkv, int B, int T, int C, int H);
void attention_bwd(StreamContext& c, Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* att, int B, int T,
                   int C, int H);
// The bf16 fast path's fused matmuls (cuBLASLt's GELU and bias-gradient epilogues, each falling back to the unfused
// kernels).
void matmul_bwd_fused(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in,
                      const Bf16* w, int N, int IC, int OC, WeightLayout layout);
void matmul_gelu_fwd(StreamContext& c, Bf16* out, Bf16* pre, const Bf16* in, const Bf16* w, const Bf16* bias, int N,
                     int IC, int OC, WeightLayout layout);
void matmul_gelu_bwd(StreamContext& c, Bf16* din, Bf16* dw, Bf16* dbias, Bf16* dpre_bias, const Bf16* dout,
                     const Bf16* in, const Bf16* w, const Bf16* pre, int N, int IC, int OC, WeightLayout layout);

}  // namespace harmony::backend::cuda::detail
