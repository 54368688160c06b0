// The device registry's table (registry.hpp): one row per device kind, with the only #ifdefs of device selection
// (whether the build has the CUDA device module, and where it installs it), and the checks every kind shares:
// availability, options against capabilities, the located errors harmony-run reports.
#include "backend/registry.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "backend/cpu/cpu_device.hpp"
#include "backend/device_module.hpp"

namespace harmony::backend {

namespace {

const char* const kFallback = "use `device: cpu` (--set device=cpu), which every build has";

const DeviceFactory* load_cpu(DeviceAvailability& /*why*/) { return &cpu::device_factory(); }

#ifdef HARMONY_CUDA_MODULE_NAME
const DeviceFactory* load_cuda(DeviceAvailability& why) {
  return load_device_module({.file = HARMONY_CUDA_MODULE_NAME,
                             .env = "HARMONY_CUDA_MODULE",
                             .installed = HARMONY_CUDA_MODULE_INSTALLED,
                             .what = "the CUDA device module",
                             .libraries = "the CUDA runtime, cuBLAS and NCCL libraries",
                             .fallback = kFallback},
                            why);
}
#else
const DeviceFactory* load_cuda(DeviceAvailability& why) {
  why.reason = "not built into this harmony (the build found no CUDA toolkit)";
  why.hint = std::string("rebuild where the CUDA toolkit is found (meson setup -Dcuda=enabled), or ") + kFallback;
  return nullptr;
}
#endif

// The registry. A new device kind is one row here (and its folder): docs/backend.md, "Adding a device".
const std::vector<const DeviceKind*>& table() {
  static const DeviceKind cpu_kind(
      "cpu", "the CPU reference device (a capped host arena, streams as threads, fp32 reference loops; bf16 emulated)",
      {.bf16_kernels = true, .llama_kernels = true, .collectives = true, .memory_in_host = true}, &load_cpu);
  static const DeviceKind cuda_kind("cuda",
                                    "NVIDIA GPUs (cuBLAS and CUDA kernels, NCCL, pinned host memory; a module loaded "
                                    "on first use)",
                                    {.bf16_kernels = true,
                                     .tf32 = true,
                                     .tree_sums = true,
                                     .fused = true,
                                     .pinned_host_memory = true,
                                     .profiler_ranges = true,
                                     .llama_kernels = true,
                                     .collectives = true,
                                     .concurrent_executor = true},
                                    &load_cuda);
  static const std::vector<const DeviceKind*> kinds = {&cpu_kind, &cuda_kind};
  return kinds;
}

// The options that need a capability.
struct OptionCap {
  const char* name;
  bool DeviceOptions::*option;
  bool DeviceCaps::*cap;
};
constexpr OptionCap kOptionCaps[] = {{"tf32", &DeviceOptions::tf32, &DeviceCaps::tf32},
                                     {"tree_sums", &DeviceOptions::tree_sums, &DeviceCaps::tree_sums},
                                     {"fused", &DeviceOptions::fused, &DeviceCaps::fused}};

std::string kind_list() {
  std::string out;
  for (const DeviceKind* k : table())
    out += fmt::format("{}{} ({})", out.empty() ? "" : "; ", k->name(), k->description());
  return out;
}

}  // namespace

DeviceKind::DeviceKind(std::string name, std::string description, DeviceCaps caps, Loader load)
    : name_(std::move(name)), description_(std::move(description)), caps_(caps), load_(load) {}

DeviceAvailability DeviceKind::availability() const {
  std::call_once(once_, [this] { factory_ = load_(load_problem_); });
  if (factory_ == nullptr) return load_problem_;
  std::string why = factory_->unavailable_reason();
  if (!why.empty())
    return {false, std::move(why),
            fmt::format("run on a machine where device '{}' is usable, or {}", name_, kFallback)};
  return {true, {}, {}};
}

const DeviceFactory& DeviceKind::factory() const {
  const DeviceAvailability a = availability();
  if (!a.available) throw DeviceError(fmt::format("device '{}' is not available: {}", name_, a.reason));
  return *factory_;
}

std::unique_ptr<Device> DeviceKind::make_device(int index, const DeviceOptions& options) const {
  for (const OptionCap& o : kOptionCaps) {
    if (options.*o.option && !(caps_.*o.cap))
      throw DeviceError(fmt::format("device '{}' has no {} option (devices with it: {})", name_, o.name,
                                    fmt::join(device_kinds_with(o.cap), ", ")));
  }
  return factory().make_device(index, options);
}

std::unique_ptr<Communicator> DeviceKind::make_communicator(const std::vector<Device*>& devices) const {
  if (!caps_.collectives) throw DeviceError(fmt::format("device '{}' has no communicator", name_));
  std::unique_ptr<Communicator> c = factory().make_communicator(devices);
  if (!c) throw DeviceError(fmt::format("device '{}' made no communicator", name_));
  return c;
}

const std::vector<const DeviceKind*>& device_kinds() { return table(); }

const DeviceKind* find_device_kind(std::string_view name) {
  for (const DeviceKind* k : table()) {
    if (k->name() == name) return k;
  }
  return nullptr;
}

std::vector<std::string> device_kind_names() {
  std::vector<std::string> names;
  for (const DeviceKind* k : table()) names.push_back(k->name());
  return names;
}

std::vector<std::string> device_kinds_with(bool DeviceCaps::*cap) {
  std::vector<std::string> names;
  for (const DeviceKind* k : table()) {
    if (k->caps().*cap) names.push_back(k->name());
  }
  return names;
}

const DeviceKind& reference_device_kind() { return *table().front(); }

const DeviceKind& device_kind_at(const std::string& name, const core::SourceLoc& where) {
  if (const DeviceKind* k = find_device_kind(name)) return *k;
  const std::vector<std::string> names = device_kind_names();
  const std::string near = core::closest_match(name, names);
  throw core::ConfigError(where, fmt::format("unknown device '{}'", name),
                          (near.empty() ? std::string() : fmt::format("did you mean '{}'? ", near)) +
                              fmt::format("devices: {}", kind_list()));
}

void require_available(const DeviceKind& kind, const core::SourceLoc& where) {
  const DeviceAvailability a = kind.availability();
  if (!a.available)
    throw core::ConfigError(where, fmt::format("device '{}' is not available: {}", kind.name(), a.reason), a.hint);
}

}  // namespace harmony::backend
