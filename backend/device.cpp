// Device-independent parts of the device interface: buffer handles, host buffers, the out-of-memory
// error's message, stream-ordered frees, and the default (plain memory, no ranges) host-side services.
#include "backend/device.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <fmt/format.h>

namespace harmony::backend {

namespace {
std::string oom_message(const std::string& device, std::string_view label, Bytes requested, Bytes in_use,
                        Bytes capacity, Bytes largest_free) {
  std::string what = label.empty() ? std::string() : fmt::format(" '{}'", label);
  std::string msg = fmt::format("{}: out of memory allocating{} ({}): {} of {} in use, largest free block {}", device,
                                what, core::format_bytes(requested), core::format_bytes(in_use),
                                core::format_bytes(capacity), core::format_bytes(largest_free));
  if (requested <= capacity - in_use) msg += " (the free memory is fragmented)";
  return msg;
}
}  // namespace

OutOfMemory::OutOfMemory(const std::string& device, std::string_view label, Bytes requested, Bytes in_use,
                         Bytes capacity, Bytes largest_free)
    : DeviceError(oom_message(device, label, requested, in_use, capacity, largest_free)),
      requested_(requested),
      in_use_(in_use),
      capacity_(capacity),
      largest_free_(largest_free) {}

void Buffer::reset() noexcept {
  if (ptr_ != nullptr && owner_) owner_->release(ptr_);
  owner_.reset();
  ptr_ = nullptr;
  bytes_ = 0;
}

HostBuffer::HostBuffer(Bytes bytes) : bytes_(bytes) {
  if (bytes < 0) throw BackendError(fmt::format("host buffer of negative size {}", bytes));
  if (bytes == 0) return;
  constexpr Bytes kAlign = 64;
  const Bytes rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, static_cast<std::size_t>(rounded));
  if (p == nullptr) throw BackendError(fmt::format("cannot allocate {} of host memory", core::format_bytes(bytes)));
  std::memset(p, 0, static_cast<std::size_t>(rounded));
  owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  ptr_ = p;
}

void check_pinned_limit(Bytes needed, const std::string& what, Bytes limit) {
  if (needed < 0) throw DeviceError(fmt::format("pinned host memory: negative size {} for {}", needed, what));
  if (limit > 0 && needed > limit)
    throw DeviceError(fmt::format(
        "pinned host memory: {} needed for {}, more than the limit of {} (the machine's topology.pinned_limit); "
        "raise pinned_limit in the machine file if the host allows it, or use smaller packs or microbatches",
        core::format_bytes(needed), what, core::format_bytes(limit)));
}

void Device::check_pinnable(Bytes bytes, const std::string& what, Bytes limit) {
  check_pinned_limit(bytes, what, limit);
}
std::shared_ptr<void> Device::pin_host(void* /*ptr*/, Bytes /*bytes*/, const std::string& /*what*/) { return nullptr; }
HostBuffer Device::alloc_host(Bytes bytes, const std::string& /*what*/) { return HostBuffer(bytes); }
std::shared_ptr<void> Device::trace_range(const std::string& /*name*/) { return nullptr; }

namespace {

// Stream::timer()'s default: the two points as host functions reading the steady clock.
class HostClockTimer final : public StreamTimer {
 public:
  explicit HostClockTimer(Stream& s) : s_(s) {}
  void start() override {
    s_.launch_host([t = times_]() { t->first = std::chrono::steady_clock::now(); });
  }
  void stop() override {
    s_.launch_host([t = times_]() { t->second = std::chrono::steady_clock::now(); });
  }
  double seconds() override {
    s_.synchronize();
    return std::chrono::duration<double>(times_->second - times_->first).count();
  }

 private:
  Stream& s_;
  // shared with the queued functions, which may outlive the timer if the caller drops it before they run
  std::shared_ptr<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> times_ =
      std::make_shared<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>();
};

}  // namespace

std::unique_ptr<StreamTimer> Stream::timer() { return std::make_unique<HostClockTimer>(*this); }

void Stream::release_after(Buffer buffer) {
  auto held = std::make_shared<Buffer>(std::move(buffer));
  launch_host([held]() { held->reset(); });
}

Kernels<Bf16>& require_bf16(Device& device, std::string_view who) {
  Kernels<Bf16>* k = device.bf16_kernels();
  if (k == nullptr) {
    const std::string& name = device.name();
    const std::string kind = name.substr(0, name.find(':'));
    throw DeviceError(fmt::format("{}: {}: bf16 not supported on {} yet (use dtype fp32)", name, who, kind));
  }
  return *k;
}

// The Llama family's kernels on a device that has none (DeviceCaps::llama_kernels false).
namespace {
[[noreturn]] void no_llama_kernel(Stream& s, const char* op) {
  const std::string& name = s.device().name();
  throw DeviceError(fmt::format("{}: {}: the Llama family's kernels are not implemented on {} (use device: cpu)", name,
                                op, name.substr(0, name.find(':'))));
}
}  // namespace

template <class S>
void Kernels<S>::rmsnorm_fwd(Stream& s, S*, float*, const S*, const S*, int, int, float) {
  no_llama_kernel(s, "rmsnorm_fwd");
}
template <class S>
void Kernels<S>::rmsnorm_bwd(Stream& s, S*, S*, const S*, const S*, const S*, const float*, int, int) {
  no_llama_kernel(s, "rmsnorm_bwd");
}
template <class S>
void Kernels<S>::rope_qkv_fwd(Stream& s, S*, const S*, int, int, int, int, int, float) {
  no_llama_kernel(s, "rope_qkv_fwd");
}
template <class S>
void Kernels<S>::rope_qkv_bwd(Stream& s, S*, const S*, int, int, int, int, int, float) {
  no_llama_kernel(s, "rope_qkv_bwd");
}
template <class S>
void Kernels<S>::swiglu_fwd(Stream& s, S*, const S*, int, int) {
  no_llama_kernel(s, "swiglu_fwd");
}
template <class S>
void Kernels<S>::swiglu_bwd(Stream& s, S*, const S*, const S*, int, int) {
  no_llama_kernel(s, "swiglu_bwd");
}
template class Kernels<float>;
template class Kernels<Bf16>;

template <class S>
void check_adamw_args(const std::string& device, const AdamWConfig& config, std::int64_t step, const AdamWTensors<S>& t,
                      std::int64_t n) {
  config.validate();
  if (step < 1) throw BackendError(fmt::format("{}: adamw: step {} must be >= 1", device, step));
  if (n < 0) throw DeviceError(fmt::format("{}: adamw: negative element count {}", device, n));
  if (n == 0) return;
  const auto missing = [&](const char* what) {
    throw DeviceError(fmt::format("{}: adamw: no {} tensor for {} elements", device, what, n));
  };
  if (t.param == nullptr) missing("param");
  if (t.grad == nullptr) missing("grad");
  if (t.exp_avg == nullptr) missing("exp_avg");
  if (t.exp_avg_sq == nullptr) missing("exp_avg_sq");
  if constexpr (std::is_same_v<S, Bf16>) {
    if (t.working == nullptr) missing("bf16 working");
  } else if (t.working != nullptr) {
    throw DeviceError(fmt::format("{}: adamw: fp32 takes no working copy (param is the weights)", device));
  }
}
template void check_adamw_args<float>(const std::string&, const AdamWConfig&, std::int64_t, const AdamWTensors<float>&,
                                      std::int64_t);
template void check_adamw_args<Bf16>(const std::string&, const AdamWConfig&, std::int64_t, const AdamWTensors<Bf16>&,
                                     std::int64_t);

}  // namespace harmony::backend
