// The device registry: every kind of device harmony-run can train on ("cpu", "cuda"), each with a one-line
// description, its capabilities, whether it is available here (and why not), and factories for its devices and
// communicators. The one place that knows which device kinds exist and how each is built in (registry.cpp holds
// the only #ifdefs); apps, tests and the conformance suite ask it rather than naming devices. Modelled on ggml's
// backend registry (docs/backend.md, "Device registry").
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device.hpp"
#include "core/base/error.hpp"

namespace harmony::backend {

// What a device kind offers beyond the required Device interface (device.hpp marks the optional members).
struct DeviceCaps {
  bool bf16_kernels = false;        // Device::bf16_kernels() (train.dtype: bf16)
  bool tf32 = false;                // DeviceOptions::tf32: fp32 GEMMs on TF32 tensor cores (--tf32)
  bool tree_sums = false;           // DeviceOptions::tree_sums: bias / LayerNorm gradients by tree sums (--tree-sums)
  bool fused = false;               // DeviceOptions::fused: fused kernels (cuBLASLt GELU epilogues, add + LayerNorm)
  bool pinned_host_memory = false;  // alloc_host / pin_host page-lock, so copies are asynchronous DMA
  bool profiler_ranges = false;     // trace_range names ranges on a profiler's timeline (NVTX)
  bool llama_kernels = false;       // Kernels<S>::rmsnorm_*, rope_qkv_*, swiglu_*: the Llama family trains here
  bool collectives = false;         // make_communicator: send/recv and all-reduces between devices of the kind
  // The devices' memory is host memory (the CPU device's arenas): counted in the run's host-memory budget.
  bool memory_in_host = false;
  // harmony-run's --executor auto picks the concurrent executor (copies overlap compute on real hardware);
  // otherwise the serial one, whose allocation order (and so fragmentation) is the same every run.
  bool concurrent_executor = false;
};

// The device-independent options of a device (harmony-run's --gpu-memory, --tf32, --tree-sums, --poison; fused is
// on unless --exact or --no-fuse).
struct DeviceOptions {
  enum class Poison { Default, On, Off };  // Default: the kind's build default (on in debug builds)
  Bytes capacity = 0;                      // device memory; 0: the kind's default
  bool tf32 = false;                       // needs DeviceCaps::tf32
  bool tree_sums = false;                  // needs DeviceCaps::tree_sums
  bool fused = false;                      // needs DeviceCaps::fused
  Poison poison = Poison::Default;         // fill fresh device memory with NaN bytes
};

// What a device kind implements (in its folder) for the registry: a statically linked kind returns one from a
// function (cpu::device_factory()), a loadable one from its module's entry (device_module.hpp).
class DeviceFactory {
 public:
  virtual ~DeviceFactory() = default;
  // Why no device of the kind can be made on this machine ("no usable GPU: ..."), or "" when one can.
  virtual std::string unavailable_reason() const = 0;
  virtual std::unique_ptr<Device> make_device(int index, const DeviceOptions& options) const = 0;
  // Optional (DeviceCaps::collectives): devices[r] is rank r, every one a device of this kind.
  virtual std::unique_ptr<Communicator> make_communicator(const std::vector<Device*>& /*devices*/) const {
    return nullptr;
  }
};

// Whether a kind's devices can be made here; when not, why (the reason) and what to do (the hint).
struct DeviceAvailability {
  bool available = false;
  std::string reason;
  std::string hint;
};

// One registered device kind: a row of the registry (registry.cpp).
class DeviceKind {
 public:
  // Finds the kind's factory (a function's result, or a module loaded with dlopen): nullptr with `why` filled in
  // when it cannot. Called once per process, on first use.
  using Loader = const DeviceFactory* (*)(DeviceAvailability& why);
  DeviceKind(std::string name, std::string description, DeviceCaps caps, Loader load);
  DeviceKind(const DeviceKind&) = delete;
  DeviceKind& operator=(const DeviceKind&) = delete;

  const std::string& name() const { return name_; }                // "cuda": what `device:` names
  const std::string& description() const { return description_; }  // one line
  const DeviceCaps& caps() const { return caps_; }
  // Loads the kind on first use; never throws.
  DeviceAvailability availability() const;
  // Device `index` of the kind ("<name>:<index>"). DeviceError when the kind is unavailable (its reason), or
  // `options` asks for a capability the kind lacks.
  std::unique_ptr<Device> make_device(int index, const DeviceOptions& options = {}) const;
  // A communicator over `devices` (of this kind). DeviceError when unavailable or without DeviceCaps::collectives.
  std::unique_ptr<Communicator> make_communicator(const std::vector<Device*>& devices) const;

 private:
  const DeviceFactory& factory() const;  // loaded and available, else a DeviceError
  std::string name_, description_;
  DeviceCaps caps_;
  Loader load_;
  mutable std::once_flag once_;
  mutable const DeviceFactory* factory_ = nullptr;
  mutable DeviceAvailability load_problem_;  // why factory_ is null
};

// Every registered kind, in registry order: "cpu" (the reference device, always available) first.
const std::vector<const DeviceKind*>& device_kinds();
// The kind named `name`, or nullptr.
const DeviceKind* find_device_kind(std::string_view name);
// The names in registry order ("cpu", "cuda").
std::vector<std::string> device_kind_names();
// The names of the kinds with a capability, e.g. kinds_with(&DeviceCaps::tf32) = {"cuda"}.
std::vector<std::string> device_kinds_with(bool DeviceCaps::*cap);
// The reference kind every device is checked against (the conformance suite): "cpu".
const DeviceKind& reference_device_kind();

// For callers that locate errors in a config (harmony-run's `device:`): the kind named `name`, or a
// core::ConfigError at `where` naming the registered kinds ("unknown device 'tpu'", "did you mean ...").
const DeviceKind& device_kind_at(const std::string& name, const core::SourceLoc& where);
// A core::ConfigError at `where` unless `kind` is available: its reason and hint.
void require_available(const DeviceKind& kind, const core::SourceLoc& where);

}  // namespace harmony::backend
