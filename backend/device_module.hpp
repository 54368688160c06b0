// Loadable device modules: a device kind built as a shared module (the CUDA device, libharmony-cuda.so) that the
// registry dlopen()s the first time the kind is asked for, so a process that never uses it never loads its
// libraries (the CUDA runtime, cuBLAS, NCCL). The module exports one C symbol, kDeviceModuleEntry, returning a
// DeviceModuleApi: its DeviceFactory. Both sides are built from one tree by one compiler: the table passes C++
// types (std::string, std::unique_ptr) as they are, and kDeviceModuleAbiVersion plus the sizes catch a module of
// another build.
#pragma once

#include <cstddef>
#include <string>

#include "backend/registry.hpp"

namespace harmony::backend {

// Bump when DeviceModuleApi, DeviceOptions, DeviceFactory or the Device / Kernels / Communicator interfaces change.
// 1: the CUDA-only table of before the registry.
inline constexpr int kDeviceModuleAbiVersion = 2;
inline constexpr const char* kDeviceModuleEntry = "harmony_device_module";

struct DeviceModuleApi {
  int abi_version = kDeviceModuleAbiVersion;
  std::size_t api_size = sizeof(DeviceModuleApi);  // of the module's build: a mismatch is another build's module
  std::size_t options_size = sizeof(DeviceOptions);
  std::size_t caps_size = sizeof(DeviceCaps);
  const DeviceFactory* factory = nullptr;  // valid for the life of the process
};

// Where a module is looked for and what it is called in messages.
struct DeviceModuleSpec {
  std::string file;       // "libharmony-cuda.so"
  std::string env;        // "HARMONY_CUDA_MODULE": a path that overrides the search
  std::string installed;  // the install folder's copy, "<prefix>/lib/harmony/libharmony-cuda.so"
  std::string what;       // "the CUDA device module"
  std::string libraries;  // what it links that may be missing: "the CUDA runtime, cuBLAS and NCCL libraries"
  std::string fallback;   // the alternative named in hints: "use `device: cpu` (--set device=cpu)"
};

// The module's factory, loaded with dlopen (RTLD_NOW | RTLD_LOCAL, never closed: its devices live until exit) from
// $<env> when set, else beside the running executable, else the install folder; nullptr with `why` (the reason:
// dlerror()'s for a module that is there but does not load, and a hint) when none loads or it is another build's.
const DeviceFactory* load_device_module(const DeviceModuleSpec& spec, DeviceAvailability& why);

}  // namespace harmony::backend

// The entry every device module defines (visibility default), returning its table.
extern "C" const harmony::backend::DeviceModuleApi* harmony_device_module();
