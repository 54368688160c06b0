// CPU device implementation: streams as host threads with FIFO queues and sticky errors, events as
// shared futures, copies checked against the arena's live allocations, kernels (Kernels<float> and Kernels<Bf16>)
// enqueued as closures over the float reference loops, and a rendezvous-based communicator.
#include "backend/cpu/cpu_device.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "backend/adamw_parallel.hpp"
#include "backend/cpu/kernels.hpp"
#include "backend/rank_sum.hpp"
#include "backend/registry.hpp"

namespace harmony::backend::cpu {
namespace {

// memcpy with a null pointer is undefined even for 0 bytes (UBSan flags it), and an empty host vector's data()
// is null: every copy of a device goes through this.
void copy_bytes(void* dst, const void* src, core::Bytes bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

class CpuDevice;

// Enqueues `fn` on `s`, a stream of `device` (else a DeviceError naming `op`). Defined once CpuDevice is.
void enqueue(CpuDevice& device, Stream& s, const char* op, std::function<void()> fn);

// How a kernel sees its tensors of storage S: through fp32 pointers. fp32 tensors are used in place; bf16 ones through
// fp32 temporaries, widened (exactly) when read and rounded to nearest even once when stored. So the fp32 kernels
// run the reference loops on the device memory itself, and the bf16 kernels the same loops on widened copies: the
// numerics a bf16 device computes (fp32 arithmetic, bf16 storage). A null tensor (an absent bias) stays null.
template <class S>
class In;  // read
template <class S>
class Out;  // written (InOut: accumulated, read first)

template <>
class In<float> {
 public:
  In(const float* p, Index /*n*/) : p_(p) {}
  const float* get() const { return p_; }

 private:
  const float* p_;
};
template <>
class Out<float> {
 public:
  Out(float* p, Index /*n*/, bool /*accumulate*/ = false) : p_(p) {}
  float* get() const { return p_; }
  void store() const {}

 private:
  float* p_;
};

template <>
class In<Bf16> {
 public:
  In(const Bf16* p, Index n) : v_(static_cast<std::size_t>(p == nullptr ? 0 : n)), null_(p == nullptr) {
    for (std::size_t i = 0; i < v_.size(); ++i) v_[i] = to_f32(p[i]);
  }
  const float* get() const { return null_ ? nullptr : v_.data(); }

 private:
  std::vector<float> v_;
  bool null_;
};
template <>
class Out<Bf16> {
 public:
  Out(Bf16* p, Index n, bool accumulate = false) : p_(p), v_(static_cast<std::size_t>(p == nullptr ? 0 : n)) {
    if (accumulate) {
      for (std::size_t i = 0; i < v_.size(); ++i) v_[i] = to_f32(p[i]);
    }
  }
  float* get() { return p_ == nullptr ? nullptr : v_.data(); }
  void store() const {
    for (std::size_t i = 0; i < v_.size(); ++i) p_[i] = to_bf16(v_[i]);
  }

 private:
  Bf16* p_;
  std::vector<float> v_;
};
template <class S>
Out<S> InOut(S* p, Index n) {
  return Out<S>(p, n, true);
}

// The Kernels<S> of a CPU device: each call enqueues, on the stream, the float reference loop of
// backend/cpu/kernels.hpp over its tensors' fp32 views.
template <class S>
class CpuKernels final : public Kernels<S> {
 public:
  explicit CpuKernels(CpuDevice& device) : dev_(device) {}
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
  void crossentropy_fwd(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets, int N,
                        int V) override;
  void crossentropy_bwd(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N,
                        int V) override;
  void adamw(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
             std::int64_t n) override;
  void rmsnorm_fwd(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) override;
  void rmsnorm_bwd(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N,
                   int C) override;
  void rope_qkv_fwd(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) override;
  void rope_qkv_bwd(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta) override;
  void swiglu_fwd(Stream& s, S* out, const S* in, int N, int I) override;
  void swiglu_bwd(Stream& s, S* din, const S* in, const S* dout, int N, int I) override;

 private:
  CpuDevice& dev_;
};

class CpuEvent final : public Event {
 public:
  // The future of the latest record (a ready one before any record).
  std::shared_future<void> latest() {
    std::lock_guard lock(mu_);
    return latest_;
  }
  void set_latest(std::shared_future<void> f) {
    std::lock_guard lock(mu_);
    latest_ = std::move(f);
  }
  void synchronize() override { latest().wait(); }
  bool query() override { return latest().wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

 private:
  static std::shared_future<void> ready() {
    std::promise<void> p;
    p.set_value();
    return p.get_future().share();
  }
  std::mutex mu_;
  std::shared_future<void> latest_ = ready();
};

class CpuStream final : public Stream {
 public:
  CpuStream(CpuDevice& device, std::string name);
  ~CpuStream() override;
  Device& device() override;
  CpuDevice& cpu_device() { return device_; }
  const std::string& name() const override { return name_; }
  void launch_host(std::function<void()> fn) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;
  // Wait for the queue to drain without consuming the sticky error.
  void drain();
  std::exception_ptr take_error();

 private:
  void run();

  CpuDevice& device_;
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
  int jitter_us_ = 0;    // CpuDeviceOptions::jitter_us
  std::mt19937_64 rng_;  // the delays' draws (the stream's thread only)
  std::thread thread_;
};

CpuEvent& as_cpu(Event& e) {
  auto* p = dynamic_cast<CpuEvent*>(&e);
  if (p == nullptr) throw DeviceError("CPU streams can only record and wait on CPU events");
  return *p;
}

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const CpuDeviceOptions& options)
      : name_(fmt::format("cpu:{}", index)),
        index_(index),
        arena_(std::make_shared<Arena>(name_, options.capacity, options.poison)),
        jitter_us_(options.jitter_us),
        jitter_seed_(options.jitter_seed) {
    if (options.jitter_us < 0) throw DeviceError(fmt::format("{}: negative jitter_us {}", name_, options.jitter_us));
  }
  ~CpuDevice() override = default;

  const std::string& name() const override { return name_; }
  int index() const override { return index_; }
  Arena& arena() { return *arena_; }

  Buffer alloc(Bytes bytes, std::string_view label) override {
    void* p = arena_->allocate(bytes, label);
    return Buffer(arena_, p, p == nullptr ? 0 : bytes);
  }
  MemoryStats memory() const override { return arena_->stats(); }
  void reset_peak() override { arena_->reset_peak(); }

  std::unique_ptr<Stream> create_stream(std::string name) override {
    return std::make_unique<CpuStream>(*this, std::move(name));
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }

  void add_stream(CpuStream* s) {
    std::lock_guard lock(mu_);
    streams_.insert(s);
  }
  // CpuDeviceOptions::jitter_us, and a seed for the next stream's delays.
  int jitter_us() const { return jitter_us_; }
  std::uint64_t next_jitter_seed() {
    std::lock_guard lock(mu_);
    return jitter_seed_ * 1000003U + static_cast<std::uint64_t>(index_) * 7919U + streams_created_++;
  }
  void remove_stream(CpuStream* s) {
    std::lock_guard lock(mu_);
    streams_.erase(s);
  }

  void synchronize() override {
    std::vector<CpuStream*> streams;
    {
      std::lock_guard lock(mu_);
      streams.assign(streams_.begin(), streams_.end());
    }
    std::exception_ptr first;
    for (CpuStream* s : streams) {
      s->drain();
      if (auto e = s->take_error(); e && !first) first = e;
    }
    if (first) std::rethrow_exception(first);
  }

  CpuStream& own(Stream& s, const char* op) {
    auto* cs = dynamic_cast<CpuStream*>(&s);
    if (cs == nullptr || &cs->cpu_device() != this)
      throw DeviceError(fmt::format("{}: {}: stream '{}' does not belong to this device", name_, op, s.name()));
    return *cs;
  }
  void check_device(const void* p, Bytes bytes, const char* op, const char* role) {
    if (bytes == 0) return;
    if (!arena_->contains(p, bytes))
      throw DeviceError(fmt::format("{}: {}: {} {} ({} bytes) is not inside a live allocation of {}", name_, op, role,
                                    p, bytes, name_));
  }
  void check_host(const void* p, Bytes bytes, const char* op, const char* role) {
    if (bytes == 0) return;
    if (p == nullptr) throw DeviceError(fmt::format("{}: {}: {} is null", name_, op, role));
    if (arena_->in_block(p))
      throw DeviceError(fmt::format("{}: {}: {} {} is device memory, not host memory", name_, op, role, p));
  }
  static void check_size(Bytes bytes, const std::string& name, const char* op) {
    if (bytes < 0) throw DeviceError(fmt::format("{}: {}: negative size {}", name, op, bytes));
  }

  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override {
    CpuStream& cs = own(s, "copy_h2d");
    check_size(bytes, name_, "copy_h2d");
    check_device(dst, bytes, "copy_h2d", "destination");
    check_host(src, bytes, "copy_h2d", "source");
    cs.launch_host([=]() { copy_bytes(dst, src, bytes); });
  }
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override {
    CpuStream& cs = own(s, "copy_d2h");
    check_size(bytes, name_, "copy_d2h");
    check_device(src, bytes, "copy_d2h", "source");
    check_host(dst, bytes, "copy_d2h", "destination");
    cs.launch_host([=]() { copy_bytes(dst, src, bytes); });
  }
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override;
  void fill_zero(Stream& s, void* dst, Bytes bytes) override {
    CpuStream& cs = own(s, "fill_zero");
    check_size(bytes, name_, "fill_zero");
    check_device(dst, bytes, "fill_zero", "destination");
    cs.launch_host([=]() {
      if (bytes > 0) std::memset(dst, 0, static_cast<std::size_t>(bytes));
    });
  }

  Kernels<float>& kernels() override { return f32_; }
  Kernels<Bf16>* bf16_kernels() override { return &bf16_; }

 private:
  std::string name_;
  int index_;
  std::shared_ptr<Arena> arena_;
  int jitter_us_ = 0;
  std::uint64_t jitter_seed_ = 0;
  std::uint64_t streams_created_ = 0;
  std::mutex mu_;
  std::set<CpuStream*> streams_;
  CpuKernels<float> f32_{*this};
  CpuKernels<Bf16> bf16_{*this};
};

void enqueue(CpuDevice& device, Stream& s, const char* op, std::function<void()> fn) {
  device.own(s, op).launch_host(std::move(fn));
}

template <class S>
void CpuKernels<S>::embedding_fwd(Stream& s, S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T,
                                  int C, int V) {
  enqueue(dev_, s, "embedding_fwd", [=]() {
    const In<S> e(wte, Index(V) * C), p(wpe, Index(T) * C);
    Out<S> o(out, Index(B) * T * C);
    cpu::embedding_fwd<float>(o.get(), ids, e.get(), p.get(), B, T, C, V);  // checks every id before writing
    o.store();
  });
}
template <class S>
void CpuKernels<S>::embedding_bwd(Stream& s, S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T,
                                  int C, int V) {
  enqueue(dev_, s, "embedding_bwd", [=]() {
    auto de = InOut(dwte, Index(V) * C), dp = InOut(dwpe, Index(T) * C);
    const In<S> d(dout, Index(B) * T * C);
    cpu::embedding_bwd<float>(de.get(), dp.get(), d.get(), ids, B, T, C, V);  // throws before writing
    de.store();
    dp.store();
  });
}
template <class S>
void CpuKernels<S>::layernorm_fwd(Stream& s, S* out, float* mean, float* rstd, const S* in, const S* w, const S* b,
                                  int N, int C, float eps) {
  enqueue(dev_, s, "layernorm_fwd", [=]() {  // mean, rstd: fp32 for either S, written in place
    const In<S> x(in, Index(N) * C), ww(w, C), bb(b, C);
    Out<S> o(out, Index(N) * C);
    cpu::layernorm_fwd<float>(o.get(), mean, rstd, x.get(), ww.get(), bb.get(), N, C, eps);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::layernorm_bwd(Stream& s, S* din, S* dw, S* db, const S* dout, const S* in, const S* w,
                                  const float* mean, const float* rstd, int N, int C) {
  enqueue(dev_, s, "layernorm_bwd", [=]() {
    const Index NC = Index(N) * C;
    auto dx = InOut(din, NC), dww = InOut(dw, C), dbb = InOut(db, C);
    const In<S> d(dout, NC), x(in, NC), ww(w, C);
    cpu::layernorm_bwd<float>(dx.get(), dww.get(), dbb.get(), d.get(), x.get(), ww.get(), mean, rstd, N, C);
    dx.store();
    dww.store();
    dbb.store();
  });
}
template <class S>
void CpuKernels<S>::matmul_fwd(Stream& s, S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                               WeightLayout layout) {
  enqueue(dev_, s, "matmul_fwd", [=]() {
    const In<S> x(in, Index(N) * IC), ww(w, Index(IC) * OC), bb(bias, OC);
    Out<S> o(out, Index(N) * OC);
    cpu::matmul_fwd<float>(o.get(), x.get(), ww.get(), bb.get(), N, IC, OC, layout);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::matmul_bwd(Stream& s, S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N,
                               int IC, int OC, WeightLayout layout) {
  enqueue(dev_, s, "matmul_bwd", [=]() {
    const In<S> d(dout, Index(N) * OC), x(in, Index(N) * IC), ww(w, Index(IC) * OC);
    auto dww = InOut(dw, Index(IC) * OC), dbb = InOut(dbias, OC);
    Out<S> dx(din, Index(N) * IC);
    cpu::matmul_bwd<float>(dx.get(), dww.get(), dbb.get(), d.get(), x.get(), ww.get(), N, IC, OC, layout);
    dx.store();
    dww.store();
    dbb.store();
  });
}
template <class S>
void CpuKernels<S>::attention_fwd(Stream& s, S* out, S* att, const S* qkv, int B, int T, int C, int H) {
  enqueue(dev_, s, "attention_fwd", [=]() {
    const In<S> q(qkv, Index(B) * T * 3 * C);
    Out<S> o(out, Index(B) * T * C), a(att, Index(B) * H * T * T);
    cpu::attention_fwd<float>(o.get(), a.get(), q.get(), B, T, C, H);
    o.store();
    a.store();
  });
}
template <class S>
void CpuKernels<S>::attention_bwd(Stream& s, S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                                  int H) {
  enqueue(dev_, s, "attention_bwd", [=]() {
    const In<S> d(dout, Index(B) * T * C), q(qkv, Index(B) * T * 3 * C), a(att, Index(B) * H * T * T);
    Out<S> dq(dqkv, Index(B) * T * 3 * C);
    cpu::attention_bwd<float>(dq.get(), d.get(), q.get(), a.get(), B, T, C, H);
    dq.store();
  });
}
template <class S>
void CpuKernels<S>::gelu_fwd(Stream& s, S* out, const S* in, std::int64_t n) {
  enqueue(dev_, s, "gelu_fwd", [=]() {
    const In<S> x(in, n);
    Out<S> o(out, n);
    cpu::gelu_fwd<float>(o.get(), x.get(), n);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::gelu_bwd(Stream& s, S* din, const S* in, const S* dout, std::int64_t n) {
  enqueue(dev_, s, "gelu_bwd", [=]() {
    const In<S> x(in, n), d(dout, n);  // read before din (which may alias dout) is written
    Out<S> dx(din, n);
    cpu::gelu_bwd<float>(dx.get(), x.get(), d.get(), n);
    dx.store();
  });
}
template <class S>
void CpuKernels<S>::add(Stream& s, S* out, const S* a, const S* b, std::int64_t n) {
  enqueue(dev_, s, "add", [=]() {
    const In<S> x(a, n), y(b, n);
    Out<S> o(out, n);
    cpu::add<float>(o.get(), x.get(), y.get(), n);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::rmsnorm_fwd(Stream& s, S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) {
  enqueue(dev_, s, "rmsnorm_fwd", [=]() {  // rstd: fp32 for either S, written in place
    const In<S> x(in, Index(N) * C), ww(w, C);
    Out<S> o(out, Index(N) * C);
    cpu::rmsnorm_fwd<float>(o.get(), rstd, x.get(), ww.get(), N, C, eps);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::rmsnorm_bwd(Stream& s, S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd,
                                int N, int C) {
  enqueue(dev_, s, "rmsnorm_bwd", [=]() {
    const Index NC = Index(N) * C;
    auto dx = InOut(din, NC), dww = InOut(dw, C);
    const In<S> d(dout, NC), x(in, NC), ww(w, C);
    cpu::rmsnorm_bwd<float>(dx.get(), dww.get(), d.get(), x.get(), ww.get(), rstd, N, C);
    dx.store();
    dww.store();
  });
}
template <class S>
void CpuKernels<S>::rope_qkv_fwd(Stream& s, S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) {
  enqueue(dev_, s, "rope_qkv_fwd", [=]() {
    const Index N = Index(B) * T, C = Index(H) * D;
    const In<S> p(packed, N * (C + 2 * Index(Hkv) * D));
    Out<S> o(qkv, N * 3 * C);
    cpu::rope_qkv_fwd<float>(o.get(), p.get(), B, T, H, Hkv, D, theta);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::rope_qkv_bwd(Stream& s, S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D,
                                 float theta) {
  enqueue(dev_, s, "rope_qkv_bwd", [=]() {
    const Index N = Index(B) * T, C = Index(H) * D;
    const In<S> d(dqkv, N * 3 * C);
    Out<S> o(dpacked, N * (C + 2 * Index(Hkv) * D));
    cpu::rope_qkv_bwd<float>(o.get(), d.get(), B, T, H, Hkv, D, theta);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::swiglu_fwd(Stream& s, S* out, const S* in, int N, int I) {
  enqueue(dev_, s, "swiglu_fwd", [=]() {
    const In<S> x(in, Index(N) * 2 * I);
    Out<S> o(out, Index(N) * I);
    cpu::swiglu_fwd<float>(o.get(), x.get(), N, I);
    o.store();
  });
}
template <class S>
void CpuKernels<S>::swiglu_bwd(Stream& s, S* din, const S* in, const S* dout, int N, int I) {
  enqueue(dev_, s, "swiglu_bwd", [=]() {
    const In<S> x(in, Index(N) * 2 * I), d(dout, Index(N) * I);
    Out<S> dx(din, Index(N) * 2 * I);
    cpu::swiglu_bwd<float>(dx.get(), x.get(), d.get(), N, I);
    dx.store();
  });
}
template <class S>
void CpuKernels<S>::crossentropy_fwd(Stream& s, float* losses, S* probs, const S* logits, const std::int32_t* targets,
                                     int N, int V) {
  enqueue(dev_, s, "crossentropy_fwd", [=]() {
    const In<S> l(logits, Index(N) * V);
    Out<S> p(probs, Index(N) * V);
    cpu::crossentropy_fwd<float>(losses, p.get(), l.get(), targets, N, V);
    p.store();
  });
}
template <class S>
void CpuKernels<S>::crossentropy_bwd(Stream& s, S* dlogits, const S* probs, const std::int32_t* targets, float scale,
                                     int N, int V) {
  enqueue(dev_, s, "crossentropy_bwd", [=]() {
    const In<S> p(probs, Index(N) * V);
    Out<S> d(dlogits, Index(N) * V);
    cpu::crossentropy_bwd<float>(d.get(), p.get(), targets, scale, N, V);
    d.store();
  });
}

// adamw_update's element loop, vectorised (adamw_apply*: backend/adamw_parallel.hpp), on the stream's thread: bit for
// bit adamw_update (and the host path's widen-update-round for bf16).
template <class S>
void CpuKernels<S>::adamw(Stream& s, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                          std::int64_t n) {
  check_adamw_args(dev_.name(), config, step, t, n);
  if (n == 0) return;
  const AdamWFactors f = adamw_factors(config, step);
  enqueue(dev_, s, "adamw", [=]() {
    bool finite = false;
    if constexpr (std::is_same_v<S, Bf16>) {
      finite = adamw_apply_bf16(f, t.param, t.working, t.grad, t.grad2, t.exp_avg, t.exp_avg_sq, t.twin, n);
    } else {
      finite = adamw_apply(f, t.param, t.grad, t.grad2, t.exp_avg, t.exp_avg_sq, t.twin, n);
    }
    if (!finite && t.nonfinite != nullptr) *t.nonfinite = 1;
  });
}

template class CpuKernels<float>;
template class CpuKernels<Bf16>;

CpuDevice& as_cpu(Device& d) {
  auto* p = dynamic_cast<CpuDevice*>(&d);
  if (p == nullptr) throw DeviceError(fmt::format("{} is not a CPU device", d.name()));
  return *p;
}

void CpuDevice::copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) {
  CpuStream& cs = own(s, "copy_d2d");
  check_size(bytes, name_, "copy_d2d");
  check_device(src, bytes, "copy_d2d", "source");
  CpuDevice& to = dst_device == nullptr ? *this : as_cpu(*dst_device);
  to.check_device(dst, bytes, "copy_d2d", "destination");
  cs.launch_host([=]() {
    if (bytes > 0) std::memmove(dst, src, static_cast<std::size_t>(bytes));
  });
}

// --- streams ---

CpuStream::CpuStream(CpuDevice& device, std::string name)
    : device_(device), name_(std::move(name)), jitter_us_(device.jitter_us()), rng_(device.next_jitter_seed()) {
  thread_ = std::thread([this]() { run(); });
  device_.add_stream(this);
}

CpuStream::~CpuStream() {
  device_.remove_stream(this);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Device& CpuStream::device() { return device_; }

void CpuStream::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this]() { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (jitter_us_ > 0) {
      std::uniform_int_distribution<int> delay(0, jitter_us_);
      std::this_thread::sleep_for(std::chrono::microseconds(delay(rng_)));
    }
    try {
      task();
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void CpuStream::launch_host(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void CpuStream::record(Event& event) {
  CpuEvent& e = as_cpu(event);
  auto promise = std::make_shared<std::promise<void>>();
  e.set_latest(promise->get_future().share());
  launch_host([promise]() { promise->set_value(); });
}

void CpuStream::wait(Event& event) {
  std::shared_future<void> f = as_cpu(event).latest();
  launch_host([f]() { f.wait(); });
}

void CpuStream::drain() {
  if (std::this_thread::get_id() == thread_.get_id())
    throw DeviceError(fmt::format("stream '{}': synchronize called from its own thread", name_));
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  launch_host([done]() { done->set_value(); });
  f.wait();
}

std::exception_ptr CpuStream::take_error() {
  std::lock_guard lock(mu_);
  std::exception_ptr e = error_;
  error_ = nullptr;
  return e;
}

void CpuStream::synchronize() {
  drain();
  if (auto e = take_error()) std::rethrow_exception(e);
}

// --- collectives ---

class CpuCommunicator final : public Communicator {
 public:
  explicit CpuCommunicator(const std::vector<Device*>& devices) {
    if (devices.empty()) throw DeviceError("communicator: no devices");
    for (Device* d : devices) {
      if (d == nullptr) throw DeviceError("communicator: null device");
      devices_.push_back(&as_cpu(*d));
    }
    const auto n = devices_.size();
    send_seq_.assign(n, std::vector<std::int64_t>(n, 0));
    recv_seq_.assign(n, std::vector<std::int64_t>(n, 0));
    reduce_seq_.assign(n, 0);
  }

  int size() const override { return static_cast<int>(devices_.size()); }
  Device& device(int rank) override { return *devices_.at(check_rank(rank, "device")); }

  void send(int rank, Stream& s, const void* src, Bytes bytes, int peer) override {
    CpuDevice& d = *devices_[check_rank(rank, "send")];
    check_rank(peer, "send");
    CpuStream& cs = d.own(s, "send");
    d.check_device(src, bytes, "send", "source");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = send_seq_[rank][peer]++;
    }
    cs.launch_host([this, rank, peer, seq, src, bytes]() {
      const Key key{rank, peer, seq};
      std::unique_lock lock(mu_);
      Slot& slot = p2p_[key];
      slot.src = src;
      slot.bytes = bytes;
      slot.posted = true;
      cv_.notify_all();
      cv_.wait(lock, [&]() { return slot.done; });
      const std::string error = slot.error;
      p2p_.erase(key);
      if (!error.empty()) throw DeviceError(error);
    });
  }

  void recv(int rank, Stream& s, void* dst, Bytes bytes, int peer) override {
    CpuDevice& d = *devices_[check_rank(rank, "recv")];
    check_rank(peer, "recv");
    CpuStream& cs = d.own(s, "recv");
    d.check_device(dst, bytes, "recv", "destination");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = recv_seq_[peer][rank]++;
    }
    cs.launch_host([this, rank, peer, seq, dst, bytes]() {
      const Key key{peer, rank, seq};
      std::unique_lock lock(mu_);
      Slot& slot = p2p_[key];
      cv_.wait(lock, [&]() { return slot.posted; });
      std::string error;
      if (slot.bytes != bytes) {
        error = fmt::format("recv on rank {} from rank {} (message {}): expected {} bytes, the sender sent {}", rank,
                            peer, seq, bytes, slot.bytes);
      } else {
        copy_bytes(dst, slot.src, bytes);
      }
      slot.error = error;
      slot.done = true;
      cv_.notify_all();
      if (!error.empty()) throw DeviceError(error);
    });
  }

  void all_reduce_sum(int rank, Stream& s, float* buf, std::int64_t count) override {
    all_reduce<float>(rank, s, buf, count, "all_reduce_sum");
  }
  void all_reduce_sum_bf16(int rank, Stream& s, Bf16* buf, std::int64_t count) override {
    all_reduce<Bf16>(rank, s, buf, count, "all_reduce_sum_bf16");
  }

 private:
  int check_rank(int rank, const char* op) const {
    if (rank < 0 || rank >= size())
      throw DeviceError(fmt::format("{}: rank {} outside the communicator's 0..{}", op, rank, size() - 1));
    return rank;
  }
  // Both all-reduces: element-wise sum in fp32 in rank order 0, 1, ..., n-1 (bf16 widened, rounded once when
  // stored), then the same result written to every rank; each member's stream thread sums one slice. One sequence of
  // calls per rank for both kinds.
  template <class E>
  void all_reduce(int rank, Stream& s, E* buf, std::int64_t count, const char* op) {
    CpuDevice& d = *devices_[check_rank(rank, op)];
    CpuStream& cs = d.own(s, op);
    if (count < 0) throw DeviceError(fmt::format("{}: negative count {}", op, count));
    d.check_device(buf, count * static_cast<Bytes>(sizeof(E)), op, "buffer");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = reduce_seq_[rank]++;
    }
    cs.launch_host([this, rank, seq, buf, count, op]() {
      const int n = size();
      std::unique_lock lock(mu_);
      Collective& c = reduces_[seq];  // a std::map node: stays put while other collectives come and go
      if (c.bufs.empty()) {
        c.bufs.assign(n, nullptr);
        c.counts.assign(n, -1);
        c.ops.assign(n, nullptr);
      }
      c.bufs[rank] = buf;
      c.counts[rank] = count;
      c.ops[rank] = op;
      if (++c.arrived == n) {
        for (int r = 0; r < n && c.error.empty(); ++r) {
          if (std::string_view(c.ops[r]) != c.ops[0])
            c.error = fmt::format("all-reduce {}: rank {} calls {}, rank 0 {}", seq, r, c.ops[r], c.ops[0]);
          else if (c.counts[r] != c.counts[0])
            c.error = fmt::format("{} {}: rank {} reduces {} {}, rank 0 {}", op, seq, r, c.counts[r],
                                  std::is_same_v<E, float> ? "floats" : "bf16 values", c.counts[0]);
        }
        c.ready = true;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&]() { return c.ready; });
      }
      if (c.error.empty()) {
        // Every member sums its own slice of the elements over all ranks, in rank order (all_reduce_slice): the
        // n stream threads share the work, and each element's bits are those of one thread summing it all.
        std::vector<E*> bufs(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) bufs[static_cast<std::size_t>(r)] = static_cast<E*>(c.bufs[r]);
        const auto total = static_cast<std::size_t>(count);
        const auto members = static_cast<std::size_t>(n);
        const std::size_t per = ((total + members - 1) / members + 15) / 16 * 16;  // a share, in whole cache lines
        const std::size_t lo = std::min(total, per * static_cast<std::size_t>(rank));
        const std::size_t hi = std::min(total, lo + per);
        lock.unlock();
        all_reduce_slice<E>(bufs, lo, hi);
        lock.lock();
      }
      if (++c.summed == n) {
        c.done = true;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&]() { return c.done; });  // the other slices of this rank's buffer are written
      }
      const std::string error = c.error;
      if (++c.left == n) reduces_.erase(seq);
      if (!error.empty()) throw DeviceError(error);
    });
  }
  using Key = std::tuple<int, int, std::int64_t>;  // (sender, receiver, sequence)
  struct Slot {
    const void* src = nullptr;
    Bytes bytes = 0;
    bool posted = false;
    bool done = false;
    std::string error;
  };
  struct Collective {
    std::vector<void*> bufs;
    std::vector<std::int64_t> counts;
    std::vector<const char*> ops;  // which all-reduce each rank called
    int arrived = 0;
    int summed = 0;  // members whose slice is written
    int left = 0;
    bool ready = false;  // every member arrived (and the calls were checked)
    bool done = false;   // every slice written
    std::string error;
  };

  std::vector<CpuDevice*> devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::int64_t>> send_seq_, recv_seq_;
  std::vector<std::int64_t> reduce_seq_;
  std::map<Key, Slot> p2p_;
  std::map<std::int64_t, Collective> reduces_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(index, options);
}

std::unique_ptr<Communicator> make_cpu_communicator(const std::vector<Device*>& devices) {
  return std::make_unique<CpuCommunicator>(devices);
}

namespace {
class CpuFactory final : public DeviceFactory {
 public:
  std::string unavailable_reason() const override { return {}; }
  std::unique_ptr<Device> make_device(int index, const DeviceOptions& options) const override {
    CpuDeviceOptions o;
    if (options.capacity > 0) o.capacity = options.capacity;
    if (options.poison != DeviceOptions::Poison::Default) o.poison = options.poison == DeviceOptions::Poison::On;
    return make_cpu_device(index, o);
  }
  std::unique_ptr<Communicator> make_communicator(const std::vector<Device*>& devices) const override {
    return make_cpu_communicator(devices);
  }
};
}  // namespace

const DeviceFactory& device_factory() {
  static const CpuFactory factory;
  return factory;
}

}  // namespace harmony::backend::cpu
