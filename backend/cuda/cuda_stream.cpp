// CUDA streams (cuda_internal.hpp's StreamContext, EventState, CudaEvent, CudaStream): each CUDA stream fed in order
// by one submission thread (sticky errors, HARMONY_SYNC_DEBUG), its cuBLAS handles and workspace, events with CUDA's
// record/wait binding, host functions through cudaLaunchHostFunc, and each stream's kernel error record in mapped
// memory. The device that owns them is cuda_device.cpp.
#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_internal.hpp"

namespace harmony::backend::cuda::detail {
namespace {

// cudaLaunchHostFunc's argument. CUDA does not run host functions after the context fails: then the trampoline
// never frees this (a few pointers), but HostCalls::abandon has destroyed the function's closure.
struct HostCall {
  std::shared_ptr<StickyError> sticky;
  std::shared_ptr<HostCalls> calls;
  std::shared_ptr<HostCalls::Call> call;
};

// cudaLaunchHostFunc's callback: runs the function; an exception becomes the stream's sticky error.
void host_trampoline(void* p) noexcept {
  std::unique_ptr<HostCall> hc(static_cast<HostCall*>(p));
  try {
    (void)hc->calls->run(hc->call);
  } catch (...) {
    hc->sticky->set(std::current_exception());
  }
}

// A stream's kernel error record: mapped pinned memory, zeroed; *device is the address its kernels write.
kern::ErrorRecord* alloc_error_record(kern::ErrorRecord** device) {
  void* rec = nullptr;
  HARMONY_CUDA_CHECK(cudaHostAlloc(&rec, sizeof(kern::ErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(rec, 0, sizeof(kern::ErrorRecord));
  void* dev_rec = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&dev_rec, rec, 0);
  if (e != cudaSuccess) {
    if (cudaFreeHost(rec) != cudaSuccess) (void)cudaGetLastError();
    HARMONY_CUDA_CHECK(e);
  }
  *device = static_cast<kern::ErrorRecord*>(dev_rec);
  return static_cast<kern::ErrorRecord*>(rec);
}

CudaEvent& as_cuda_event(Event& e) {
  auto* p = dynamic_cast<CudaEvent*>(&e);
  if (p == nullptr) throw DeviceError("CUDA streams can only record and wait on CUDA events");
  return *p;
}

}  // namespace

// --- stream context ---

StreamContext::~StreamContext() {
  const QuietDeviceGuard guard(gpu_);
  if (workspace_ != nullptr && cudaFreeAsync(workspace_, stream_) != cudaSuccess) (void)cudaGetLastError();
  if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  if (cublaslt_ != nullptr) (void)cublasLtDestroy(cublaslt_);
}

cublasLtHandle_t StreamContext::cublaslt() {
  if (cublaslt_ == nullptr) HARMONY_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  return cublaslt_;
}

cublasHandle_t StreamContext::cublas() {
  if (cublas_ == nullptr) {
    cublasHandle_t h = nullptr;
    HARMONY_CUBLAS_CHECK(cublasCreate(&h));
    try {
      HARMONY_CUBLAS_CHECK(cublasSetStream(h, stream_));
      // Split-K reductions in fp32, never in a bf16 output's precision: cuBLAS's default lets split-K kernels add
      // their partial sums in the output type, rounding each partial (PyTorch's allow_bf16_reduced_precision_
      // reduction). (Not what the first H200 run's bf16 matmul failures were: those came from beta = 1 on a bf16
      // C, which gemm.cpp now avoids; this keeps a long-k dW GEMM from rounding its partials.)
      const auto math = static_cast<cublasMath_t>((tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                                  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      HARMONY_CUBLAS_CHECK(cublasSetMathMode(h, math));
    } catch (...) {
      (void)cublasDestroy(h);
      throw;
    }
    cublas_ = h;
  }
  return cublas_;
}

void* StreamContext::workspace(std::size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  constexpr std::size_t kStep = 1 << 20;
  const std::size_t want = (bytes + kStep - 1) / kStep * kStep;
  // Stream-ordered: the old block is freed after the work already enqueued, the new one is valid for what follows.
  if (workspace_ != nullptr) HARMONY_CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  HARMONY_CUDA_CHECK(cudaMallocAsync(&workspace_, want, stream_));
  workspace_bytes_ = want;
  return workspace_;
}

// --- events ---

EventState::~EventState() {
  if (event != nullptr && cudaEventDestroy(event) != cudaSuccess) (void)cudaGetLastError();
}

void EventState::wait_issued(std::int64_t n) {
  std::unique_lock lock(mu);
  cv.wait(lock, [&]() { return issued >= n; });
}

void EventState::mark_issued(std::int64_t n) {
  {
    std::lock_guard lock(mu);
    issued = std::max(issued, n);
  }
  cv.notify_all();
}

CudaEvent::CudaEvent(int gpu) : state_(std::make_shared<EventState>()) {
  state_->gpu = gpu;
  DeviceGuard guard(gpu);
  HARMONY_CUDA_CHECK(cudaEventCreateWithFlags(&state_->event, cudaEventDisableTiming));
}

void CudaEvent::synchronize() {
  std::int64_t n = 0;
  {
    std::lock_guard lock(state_->mu);
    n = state_->requested;
  }
  state_->wait_issued(n);
  HARMONY_CUDA_CHECK(cudaEventSynchronize(state_->event));
}

bool CudaEvent::query() {
  {
    std::lock_guard lock(state_->mu);
    if (state_->issued < state_->requested) return false;
  }
  const cudaError_t e = cudaEventQuery(state_->event);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  HARMONY_CUDA_CHECK(e);
  return true;
}

// --- streams ---

CudaStream::CudaStream(CudaDevice& device, std::string name) : device_(device), name_(std::move(name)) {
  DeviceGuard guard(device.gpu());
  errors_host_ = alloc_error_record(&errors_device_);
  const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    if (cudaFreeHost(errors_host_) != cudaSuccess) (void)cudaGetLastError();
    HARMONY_CUDA_CHECK(e);
  }
  ctx_ = std::make_unique<StreamContext>(device.gpu(), stream_, device.options().tf32, device.options().tree_sums,
                                         device.options().bf16_exact, device.options().attention_workspace,
                                         errors_device_);
  thread_ = std::thread([this]() { run(); });
  device_.add_stream(this);
}

CudaStream::~CudaStream() {
  device_.remove_stream(this);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // issues everything still queued first
  ctx_.reset();    // synchronizes the stream
  const QuietDeviceGuard guard(device_.gpu());
  // After the synchronize every host function has run, unless the context failed: then CUDA never will.
  (void)host_calls_->abandon();
  if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
  if (cudaFreeHost(errors_host_) != cudaSuccess) (void)cudaGetLastError();
}

Device& CudaStream::device() { return device_; }

void CudaStream::run() {
  if (cudaSetDevice(ctx_->gpu()) != cudaSuccess) {
    (void)cudaGetLastError();
    sticky_->set(std::make_exception_ptr(
        DeviceError(fmt::format("{}: stream '{}': cannot select GPU {}", device_.name(), name_, ctx_->gpu()))));
  }
  for (;;) {
    std::pair<const char*, Work> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this]() { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task.second(*ctx_);
      if (device_.options().sync_debug) {
        const cudaError_t e = cudaStreamSynchronize(stream_);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          (void)host_calls_->abandon();  // the context has failed: CUDA will not run them
          throw DeviceError(fmt::format("{}: stream '{}': {} failed (HARMONY_SYNC_DEBUG): cuda error {} {} ({})",
                                        device_.name(), name_, task.first, static_cast<int>(e), cudaGetErrorName(e),
                                        cudaGetErrorString(e)));
        }
        if (auto k = take_kernel_error()) std::rethrow_exception(k);
      }
    } catch (...) {
      sticky_->set(std::current_exception());
    }
  }
}

void CudaStream::submit(const char* op, Work work) {
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(op, std::move(work));
  }
  cv_.notify_one();
}

void CudaStream::drain() {
  if (std::this_thread::get_id() == thread_.get_id())
    throw DeviceError(fmt::format("stream '{}': synchronize called from its own thread", name_));
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  submit("drain", [done](StreamContext&) { done->set_value(); });
  f.wait();
}

std::exception_ptr CudaStream::finish() {
  drain();
  const cudaError_t e = cudaStreamSynchronize(stream_);
  std::exception_ptr failure = e == cudaSuccess ? nullptr : failed(e);
  std::exception_ptr first = sticky_->take();
  if (!first) first = failure;
  // Every kernel enqueued before the synchronize has finished writing its report: this stream's, once.
  if (!first) first = take_kernel_error();
  return first;
}

std::exception_ptr CudaStream::failed(cudaError_t e) {
  (void)cudaGetLastError();
  (void)host_calls_->abandon();
  return std::make_exception_ptr(DeviceError(
      fmt::format("{}: stream '{}': cuda error {} {} ({}); run with HARMONY_SYNC_DEBUG=1 to find the operation",
                  device_.name(), name_, static_cast<int>(e), cudaGetErrorName(e), cudaGetErrorString(e))));
}

std::exception_ptr CudaStream::poll() {
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaSuccess) return nullptr;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return failed(e);
}

std::exception_ptr CudaStream::take_kernel_error() {
  std::optional<kern::ErrorReport> r;
  {
    const std::lock_guard lock(errors_mu_);  // one consumer at a time (a stream's and the device's synchronize)
    r = kern::consume_error(errors_host_);
  }
  return r ? device_.kernel_error(*r, name_) : nullptr;
}

void CudaStream::synchronize() {
  if (auto e = finish()) std::rethrow_exception(e);
}

namespace {

// CudaStream::timer(): two events with timing, recorded by the submission thread in stream order. Shared with the
// queued records, which may outlive the timer.
struct TimerEvents {
  int gpu = 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  explicit TimerEvents(int g) : gpu(g) {
    DeviceGuard guard(gpu);
    HARMONY_CUDA_CHECK(cudaEventCreate(&start));
    const cudaError_t e = cudaEventCreate(&stop);
    if (e != cudaSuccess) {
      if (cudaEventDestroy(start) != cudaSuccess) (void)cudaGetLastError();
      HARMONY_CUDA_CHECK(e);
    }
  }
  TimerEvents(const TimerEvents&) = delete;
  TimerEvents& operator=(const TimerEvents&) = delete;
  ~TimerEvents() {
    if (cudaEventDestroy(start) != cudaSuccess) (void)cudaGetLastError();
    if (cudaEventDestroy(stop) != cudaSuccess) (void)cudaGetLastError();
  }
};

class CudaStreamTimer final : public StreamTimer {
 public:
  explicit CudaStreamTimer(CudaStream& s) : s_(s), ev_(std::make_shared<TimerEvents>(s.cuda_device().gpu())) {}
  void start() override {
    s_.submit("timer start",
              [ev = ev_](StreamContext& c) { HARMONY_CUDA_CHECK(cudaEventRecord(ev->start, c.stream())); });
  }
  void stop() override {
    s_.submit("timer stop",
              [ev = ev_](StreamContext& c) { HARMONY_CUDA_CHECK(cudaEventRecord(ev->stop, c.stream())); });
  }
  double seconds() override {
    s_.synchronize();
    DeviceGuard guard(ev_->gpu);
    float ms = 0.0f;
    HARMONY_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_->start, ev_->stop));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  CudaStream& s_;
  std::shared_ptr<TimerEvents> ev_;
};

}  // namespace

std::unique_ptr<StreamTimer> CudaStream::timer() { return std::make_unique<CudaStreamTimer>(*this); }

void CudaStream::launch_host(std::function<void()> fn) {
  // Registered now, so a failed context drops it even while it is still queued for the submission thread.
  std::shared_ptr<HostCalls::Call> call = host_calls_->add(std::move(fn));
  if (!call) return;  // the context has failed: CUDA would not run it
  submit("launch_host", [sticky = sticky_, calls = host_calls_, call](StreamContext& c) {
    auto hc = std::make_unique<HostCall>(HostCall{sticky, calls, call});
    const cudaError_t e = cudaLaunchHostFunc(c.stream(), host_trampoline, hc.get());
    if (e != cudaSuccess) calls->cancel(call);  // never runs: its closure goes now, not never
    HARMONY_CUDA_CHECK(e);
    (void)hc.release();  // the trampoline owns it now
  });
}

void CudaStream::record(Event& event) {
  std::shared_ptr<EventState> st = as_cuda_event(event).state();
  if (st->gpu != device_.gpu())
    throw DeviceError(fmt::format("{}: stream '{}': cannot record an event of GPU {} on GPU {}", device_.name(), name_,
                                  st->gpu, device_.gpu()));
  std::int64_t n = 0;
  {
    std::lock_guard lock(st->mu);
    n = ++st->requested;
  }
  submit("record", [st, n](StreamContext& c) {
    const cudaError_t e = cudaEventRecord(st->event, c.stream());
    st->mark_issued(n);  // even on failure: waiters must not hang (the error is sticky on this stream)
    HARMONY_CUDA_CHECK(e);
  });
}

void CudaStream::wait(Event& event) {
  std::shared_ptr<EventState> st = as_cuda_event(event).state();
  std::int64_t n = 0;
  {
    std::lock_guard lock(st->mu);
    n = st->requested;  // the latest record made before this call
  }
  submit("wait", [st, n](StreamContext& c) {
    st->wait_issued(n);
    HARMONY_CUDA_CHECK(cudaStreamWaitEvent(c.stream(), st->event, 0));
  });
}

}  // namespace harmony::backend::cuda::detail
