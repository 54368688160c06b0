// The entry of the CUDA device's loadable module (cuda_module.hpp): the table of the functions harmony-run calls,
// over the CUDA device's static library, which the module links (and keeps to itself: -Wl,--exclude-libs,ALL).
#include "backend/cuda/cuda_module.hpp"

extern "C" __attribute__((visibility("default"))) const harmony::backend::cuda::ModuleApi* harmony_cuda_module_api() {
  namespace cuda = harmony::backend::cuda;
  static const cuda::ModuleApi api = [] {
    cuda::ModuleApi a;
    a.api_size = sizeof(cuda::ModuleApi);
    a.available = &cuda::cuda_available;
    a.unavailable_reason = &cuda::cuda_unavailable_reason;
    a.make_device = [](int index, const cuda::CudaDeviceOptions& options) {
      return cuda::make_cuda_device(index, options);
    };
    a.make_communicator = &cuda::make_cuda_communicator;
    return a;
  }();
  return &api;
}
