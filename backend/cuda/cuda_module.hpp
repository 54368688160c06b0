// The CUDA device as a loadable module: harmony-run dlopen()s it (apps/cuda_loader.cpp) when a config asks for
// `device: cuda`, so a run on CPU devices, --help and --version never load the CUDA runtime, cuBLAS or NCCL. The
// module exports one C symbol, kModuleEntry, returning this table of the functions harmony-run calls. Free of CUDA
// headers. Both sides are built from one tree by one compiler: the table passes C++ types (std::string,
// std::unique_ptr) as is, and kModuleAbiVersion plus the sizes below catch a module from another build.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.hpp"

namespace harmony::backend::cuda {

// Bump when ModuleApi, CudaDeviceOptions or the Device / Communicator interfaces change.
inline constexpr int kModuleAbiVersion = 1;
inline constexpr const char* kModuleEntry = "harmony_cuda_module_api";

struct ModuleApi {
  int abi_version = kModuleAbiVersion;
  std::size_t options_size = sizeof(CudaDeviceOptions);  // a mismatch: another build's module
  std::size_t api_size = 0;                              // sizeof(ModuleApi) of the module's build
  bool poison_by_default = kCudaPoisonByDefault;         // the module's build type (debug: poison)
  bool (*available)() noexcept = nullptr;                // cuda_available
  std::string (*unavailable_reason)() = nullptr;         // cuda_unavailable_reason
  std::unique_ptr<Device> (*make_device)(int, const CudaDeviceOptions&) = nullptr;            // make_cuda_device
  std::unique_ptr<Communicator> (*make_communicator)(const std::vector<Device*>&) = nullptr;  // make_cuda_communicator
};

}  // namespace harmony::backend::cuda

// The module's one export (kModuleEntry): its table, valid for the life of the process.
extern "C" const harmony::backend::cuda::ModuleApi* harmony_cuda_module_api();
