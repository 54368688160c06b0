// The CUDA device as a loadable module (libharmony-cuda.so, backend/device_module.hpp): its one export returns the
// registry's factory of the "cuda" kind, over the CUDA device's static library, which the module links (and keeps
// to itself: -Wl,--exclude-libs,ALL). The registry loads it only when a `cuda` device is asked for, so a run on CPU
// devices, --help and --version never load the CUDA runtime, cuBLAS or NCCL.
#include "backend/cuda/cuda_device.hpp"
#include "backend/device_module.hpp"
#include "backend/registry.hpp"

namespace harmony::backend::cuda {
namespace {

class CudaFactory final : public DeviceFactory {
 public:
  std::string unavailable_reason() const override {
    return cuda_available() ? std::string() : "no usable GPU: " + cuda_unavailable_reason();
  }
  // DeviceOptions -> CudaDeviceOptions (tree_sums also selects the bf16 fast path, fused the fused kernels); the rest
  // (gpu: index % the GPUs, reserve, sync_debug from the environment, attention_workspace) keep their defaults.
  std::unique_ptr<Device> make_device(int index, const DeviceOptions& options) const override {
    CudaDeviceOptions o;
    o.capacity = options.capacity;
    o.tf32 = options.tf32;
    o.tree_sums = options.tree_sums;
    // The registry's callers compare bf16 runs with the CPU device (the conformance suite, gpu-check's loss rows):
    // they keep the exact bf16 kernels unless --tree-sums asks for the fast ones.
    o.bf16_exact = !options.tree_sums;
    o.fused_epilogues = options.fused;  // harmony-run asks for it unless --exact or --no-fuse
    if (options.poison != DeviceOptions::Poison::Default) o.poison = options.poison == DeviceOptions::Poison::On;
    return make_cuda_device(index, o);
  }
  std::unique_ptr<Communicator> make_communicator(const std::vector<Device*>& devices) const override {
    return make_cuda_communicator(devices);
  }
};

}  // namespace
}  // namespace harmony::backend::cuda

extern "C" __attribute__((visibility("default"))) const harmony::backend::DeviceModuleApi* harmony_device_module() {
  static const harmony::backend::cuda::CudaFactory factory;
  static const harmony::backend::DeviceModuleApi api{.factory = &factory};
  return &api;
}
