// CPU device implementation: streams as host threads with FIFO queues and sticky errors, events as
// shared futures, copies checked against the arena's live allocations, kernels enqueued as closures over
// the float reference loops, and a rendezvous-based communicator.
#include "backend/cpu/cpu_device.hpp"

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

#include "backend/cpu/kernels.hpp"
#include "backend/rank_sum.hpp"

namespace harmony::backend::cpu {
namespace {

// memcpy with a null pointer is undefined even for 0 bytes (UBSan flags it), and an empty host vector's data()
// is null: every copy of a device goes through this.
void copy_bytes(void* dst, const void* src, core::Bytes bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

class CpuDevice;

// bf16 emulation: tensors widened to fp32 temporaries, the fp32 reference loop, outputs rounded once.
std::vector<float> widen(const Bf16* p, Index n) {
  std::vector<float> v(static_cast<std::size_t>(p == nullptr ? 0 : n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_f32(p[i]);
  return v;
}
void store(Bf16* p, const std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = to_bf16(v[i]);
}
// Null for an absent optional tensor (a bias), else the temporary's data.
float* opt(std::vector<float>& v, const void* p) { return p == nullptr ? nullptr : v.data(); }

// The Bf16Kernels of a CPU device: each call enqueues widen -> fp32 reference loop -> round-to-nearest-even store
// on the stream, so the CPU tests see the numerics a bf16 device computes (fp32 arithmetic, bf16 storage).
class CpuBf16Kernels final : public Bf16Kernels {
 public:
  explicit CpuBf16Kernels(CpuDevice& device) : dev_(device) {}
  void embedding_fwd(Stream& s, Bf16* out, const std::int32_t* ids, const Bf16* wte, const Bf16* wpe, int B, int T,
                     int C, int V) override;
  void embedding_bwd(Stream& s, Bf16* dwte, Bf16* dwpe, const Bf16* dout, const std::int32_t* ids, int B, int T, int C,
                     int V) override;
  void layernorm_fwd(Stream& s, Bf16* out, Bf16* mean, Bf16* rstd, const Bf16* in, const Bf16* w, const Bf16* b, int N,
                     int C, float eps) override;
  void layernorm_bwd(Stream& s, Bf16* din, Bf16* dw, Bf16* db, const Bf16* dout, const Bf16* in, const Bf16* w,
                     const Bf16* mean, const Bf16* rstd, int N, int C) override;
  void matmul_fwd(Stream& s, Bf16* out, const Bf16* in, const Bf16* w, const Bf16* bias, int N, int IC, int OC,
                  WeightLayout layout) override;
  void matmul_bwd(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in, const Bf16* w, int N,
                  int IC, int OC, WeightLayout layout) override;
  void attention_fwd(Stream& s, Bf16* out, Bf16* att, const Bf16* qkv, int B, int T, int C, int H) override;
  void attention_bwd(Stream& s, Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* att, int B, int T, int C,
                     int H) override;
  void gelu_fwd(Stream& s, Bf16* out, const Bf16* in, std::int64_t n) override;
  void gelu_bwd(Stream& s, Bf16* din, const Bf16* in, const Bf16* dout, std::int64_t n) override;
  void add(Stream& s, Bf16* out, const Bf16* a, const Bf16* b, std::int64_t n) override;
  void crossentropy_fwd(Stream& s, float* losses, Bf16* probs, const Bf16* logits, const std::int32_t* targets, int N,
                        int V) override;
  void crossentropy_bwd(Stream& s, Bf16* dlogits, const Bf16* probs, const std::int32_t* targets, float scale, int N,
                        int V) override;

 private:
  template <class F>
  void launch(Stream& s, const char* op, F&& f);
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

class CpuDevice final : public Device, public Kernels {
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

  Kernels& kernels() override { return *this; }
  Bf16Kernels* bf16_kernels() override { return &bf16_; }

  // Kernels: each call enqueues the float reference loop.
  template <class F>
  void launch(Stream& s, const char* op, F&& f) {
    own(s, op).launch_host(std::forward<F>(f));
  }
  void embedding_fwd(Stream& s, float* out, const std::int32_t* ids, const float* wte, const float* wpe, int B, int T,
                     int C, int V) override {
    launch(s, "embedding_fwd", [=]() { cpu::embedding_fwd<float>(out, ids, wte, wpe, B, T, C, V); });
  }
  void embedding_bwd(Stream& s, float* dwte, float* dwpe, const float* dout, const std::int32_t* ids, int B, int T,
                     int C, int V) override {
    launch(s, "embedding_bwd", [=]() { cpu::embedding_bwd<float>(dwte, dwpe, dout, ids, B, T, C, V); });
  }
  void layernorm_fwd(Stream& s, float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                     int N, int C, float eps) override {
    launch(s, "layernorm_fwd", [=]() { cpu::layernorm_fwd<float>(out, mean, rstd, in, w, b, N, C, eps); });
  }
  void layernorm_bwd(Stream& s, float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                     const float* mean, const float* rstd, int N, int C) override {
    launch(s, "layernorm_bwd", [=]() { cpu::layernorm_bwd<float>(din, dw, db, dout, in, w, mean, rstd, N, C); });
  }
  void matmul_fwd(Stream& s, float* out, const float* in, const float* w, const float* bias, int N, int IC, int OC,
                  WeightLayout layout) override {
    launch(s, "matmul_fwd", [=]() { cpu::matmul_fwd<float>(out, in, w, bias, N, IC, OC, layout); });
  }
  void matmul_bwd(Stream& s, float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                  int N, int IC, int OC, WeightLayout layout) override {
    launch(s, "matmul_bwd", [=]() { cpu::matmul_bwd<float>(din, dw, dbias, dout, in, w, N, IC, OC, layout); });
  }
  void attention_fwd(Stream& s, float* out, float* att, const float* qkv, int B, int T, int C, int H) override {
    launch(s, "attention_fwd", [=]() { cpu::attention_fwd<float>(out, att, qkv, B, T, C, H); });
  }
  void attention_bwd(Stream& s, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                     int H) override {
    launch(s, "attention_bwd", [=]() { cpu::attention_bwd<float>(dqkv, dout, qkv, att, B, T, C, H); });
  }
  void gelu_fwd(Stream& s, float* out, const float* in, std::int64_t n) override {
    launch(s, "gelu_fwd", [=]() { cpu::gelu_fwd<float>(out, in, n); });
  }
  void gelu_bwd(Stream& s, float* din, const float* in, const float* dout, std::int64_t n) override {
    launch(s, "gelu_bwd", [=]() { cpu::gelu_bwd<float>(din, in, dout, n); });
  }
  void add(Stream& s, float* out, const float* a, const float* b, std::int64_t n) override {
    launch(s, "add", [=]() { cpu::add<float>(out, a, b, n); });
  }
  void crossentropy_fwd(Stream& s, float* losses, float* probs, const float* logits, const std::int32_t* targets, int N,
                        int V) override {
    launch(s, "crossentropy_fwd", [=]() { cpu::crossentropy_fwd<float>(losses, probs, logits, targets, N, V); });
  }
  void crossentropy_bwd(Stream& s, float* dlogits, const float* probs, const std::int32_t* targets, float scale, int N,
                        int V) override {
    launch(s, "crossentropy_bwd", [=]() { cpu::crossentropy_bwd<float>(dlogits, probs, targets, scale, N, V); });
  }

 private:
  std::string name_;
  int index_;
  std::shared_ptr<Arena> arena_;
  int jitter_us_ = 0;
  std::uint64_t jitter_seed_ = 0;
  std::uint64_t streams_created_ = 0;
  std::mutex mu_;
  std::set<CpuStream*> streams_;
  CpuBf16Kernels bf16_{*this};
};

template <class F>
void CpuBf16Kernels::launch(Stream& s, const char* op, F&& f) {
  dev_.own(s, op).launch_host(std::forward<F>(f));
}

void CpuBf16Kernels::embedding_fwd(Stream& s, Bf16* out, const std::int32_t* ids, const Bf16* wte, const Bf16* wpe,
                                   int B, int T, int C, int V) {
  launch(s, "embedding_fwd", [=]() {
    auto e = widen(wte, Index(V) * C), p = widen(wpe, Index(T) * C);
    std::vector<float> o(static_cast<std::size_t>(Index(B) * T * C));
    cpu::embedding_fwd<float>(o.data(), ids, e.data(), p.data(), B, T, C, V);
    store(out, o);
  });
}
void CpuBf16Kernels::embedding_bwd(Stream& s, Bf16* dwte, Bf16* dwpe, const Bf16* dout, const std::int32_t* ids, int B,
                                   int T, int C, int V) {
  launch(s, "embedding_bwd", [=]() {
    auto de = widen(dwte, Index(V) * C), dp = widen(dwpe, Index(T) * C), d = widen(dout, Index(B) * T * C);
    cpu::embedding_bwd<float>(de.data(), dp.data(), d.data(), ids, B, T, C, V);  // throws before writing
    store(dwte, de);
    store(dwpe, dp);
  });
}
void CpuBf16Kernels::layernorm_fwd(Stream& s, Bf16* out, Bf16* mean, Bf16* rstd, const Bf16* in, const Bf16* w,
                                   const Bf16* b, int N, int C, float eps) {
  launch(s, "layernorm_fwd", [=]() {
    auto x = widen(in, Index(N) * C), ww = widen(w, C), bb = widen(b, C);
    std::vector<float> o(x.size()), m(static_cast<std::size_t>(N)), r(static_cast<std::size_t>(N));
    cpu::layernorm_fwd<float>(o.data(), m.data(), r.data(), x.data(), ww.data(), bb.data(), N, C, eps);
    store(out, o);
    store(mean, m);
    store(rstd, r);
  });
}
void CpuBf16Kernels::layernorm_bwd(Stream& s, Bf16* din, Bf16* dw, Bf16* db, const Bf16* dout, const Bf16* in,
                                   const Bf16* w, const Bf16* mean, const Bf16* rstd, int N, int C) {
  launch(s, "layernorm_bwd", [=]() {
    const Index NC = Index(N) * C;
    auto dx = widen(din, NC), dww = widen(dw, C), dbb = widen(db, C), d = widen(dout, NC), x = widen(in, NC),
         ww = widen(w, C), m = widen(mean, N), r = widen(rstd, N);
    cpu::layernorm_bwd<float>(dx.data(), dww.data(), dbb.data(), d.data(), x.data(), ww.data(), m.data(), r.data(), N,
                              C);
    store(din, dx);
    store(dw, dww);
    store(db, dbb);
  });
}
void CpuBf16Kernels::matmul_fwd(Stream& s, Bf16* out, const Bf16* in, const Bf16* w, const Bf16* bias, int N, int IC,
                                int OC, WeightLayout layout) {
  launch(s, "matmul_fwd", [=]() {
    auto x = widen(in, Index(N) * IC), ww = widen(w, Index(IC) * OC), bb = widen(bias, OC);
    std::vector<float> o(static_cast<std::size_t>(Index(N) * OC));
    cpu::matmul_fwd<float>(o.data(), x.data(), ww.data(), opt(bb, bias), N, IC, OC, layout);
    store(out, o);
  });
}
void CpuBf16Kernels::matmul_bwd(Stream& s, Bf16* din, Bf16* dw, Bf16* dbias, const Bf16* dout, const Bf16* in,
                                const Bf16* w, int N, int IC, int OC, WeightLayout layout) {
  launch(s, "matmul_bwd", [=]() {
    auto d = widen(dout, Index(N) * OC), x = widen(in, Index(N) * IC), ww = widen(w, Index(IC) * OC),
         dww = widen(dw, Index(IC) * OC), dbb = widen(dbias, OC);
    std::vector<float> dx(static_cast<std::size_t>(din == nullptr ? 0 : Index(N) * IC));
    cpu::matmul_bwd<float>(opt(dx, din), dww.data(), opt(dbb, dbias), d.data(), x.data(), ww.data(), N, IC, OC, layout);
    if (din != nullptr) store(din, dx);
    store(dw, dww);
    if (dbias != nullptr) store(dbias, dbb);
  });
}
void CpuBf16Kernels::attention_fwd(Stream& s, Bf16* out, Bf16* att, const Bf16* qkv, int B, int T, int C, int H) {
  launch(s, "attention_fwd", [=]() {
    auto q = widen(qkv, Index(B) * T * 3 * C);
    std::vector<float> o(static_cast<std::size_t>(Index(B) * T * C)), a(static_cast<std::size_t>(Index(B) * H * T * T));
    cpu::attention_fwd<float>(o.data(), a.data(), q.data(), B, T, C, H);
    store(out, o);
    store(att, a);
  });
}
void CpuBf16Kernels::attention_bwd(Stream& s, Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* att, int B,
                                   int T, int C, int H) {
  launch(s, "attention_bwd", [=]() {
    auto d = widen(dout, Index(B) * T * C), q = widen(qkv, Index(B) * T * 3 * C), a = widen(att, Index(B) * H * T * T);
    std::vector<float> dq(q.size());
    cpu::attention_bwd<float>(dq.data(), d.data(), q.data(), a.data(), B, T, C, H);
    store(dqkv, dq);
  });
}
void CpuBf16Kernels::gelu_fwd(Stream& s, Bf16* out, const Bf16* in, std::int64_t n) {
  launch(s, "gelu_fwd", [=]() {
    auto x = widen(in, n);
    std::vector<float> o(x.size());
    cpu::gelu_fwd<float>(o.data(), x.data(), n);
    store(out, o);
  });
}
void CpuBf16Kernels::gelu_bwd(Stream& s, Bf16* din, const Bf16* in, const Bf16* dout, std::int64_t n) {
  launch(s, "gelu_bwd", [=]() {
    auto x = widen(in, n), d = widen(dout, n);
    std::vector<float> dx(x.size());
    cpu::gelu_bwd<float>(dx.data(), x.data(), d.data(), n);
    store(din, dx);
  });
}
void CpuBf16Kernels::add(Stream& s, Bf16* out, const Bf16* a, const Bf16* b, std::int64_t n) {
  launch(s, "add", [=]() {
    auto x = widen(a, n), y = widen(b, n);
    std::vector<float> o(x.size());
    cpu::add<float>(o.data(), x.data(), y.data(), n);
    store(out, o);
  });
}
void CpuBf16Kernels::crossentropy_fwd(Stream& s, float* losses, Bf16* probs, const Bf16* logits,
                                      const std::int32_t* targets, int N, int V) {
  launch(s, "crossentropy_fwd", [=]() {
    auto l = widen(logits, Index(N) * V);
    std::vector<float> p(l.size());
    cpu::crossentropy_fwd<float>(losses, p.data(), l.data(), targets, N, V);
    store(probs, p);
  });
}
void CpuBf16Kernels::crossentropy_bwd(Stream& s, Bf16* dlogits, const Bf16* probs, const std::int32_t* targets,
                                      float scale, int N, int V) {
  launch(s, "crossentropy_bwd", [=]() {
    auto p = widen(probs, Index(N) * V);
    std::vector<float> d(p.size());
    cpu::crossentropy_bwd<float>(d.data(), p.data(), targets, scale, N, V);
    store(dlogits, d);
  });
}

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
  // stored), then the same result written to every rank. One sequence of calls per rank for both kinds.
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
      Collective& c = reduces_[seq];
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
        if (c.error.empty()) {
          std::vector<float> sum(static_cast<std::size_t>(count));
          for (int r = 0; r < n; ++r)
            add_in_rank_order<E>(sum, {static_cast<const E*>(c.bufs[r]), sum.size()}, static_cast<std::size_t>(r));
          for (int r = 0; r < n; ++r) store_sum(std::span<E>(static_cast<E*>(c.bufs[r]), sum.size()), sum);
        }
        c.done = true;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&]() { return c.done; });
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
    int left = 0;
    bool done = false;
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

}  // namespace harmony::backend::cpu
