// Checked CUDA, cuBLAS and NCCL calls: HARMONY_CUDA_CHECK(expr) and friends throw DeviceError naming the
// error, the file:line and the expression ("cuda error 700 cudaErrorIllegalAddress (an illegal memory access
// was encountered) at backend/cuda/cuda_device.cpp:312: cudaStreamSynchronize(stream_)"). No fmt here: the
// header is shared with nvcc-compiled code; the messages are built in check.cpp.
#pragma once

#include <cuda_runtime_api.h>

namespace harmony::backend::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line);
[[noreturn]] void throw_nccl_error(int result, const char* expr, const char* file, int line);

inline void cuda_check(cudaError_t error, const char* expr, const char* file, int line) {
  if (error != cudaSuccess) throw_cuda_error(error, expr, file, line);
}

}  // namespace harmony::backend::cuda

#define HARMONY_CUDA_CHECK(expr) ::harmony::backend::cuda::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: the launch's own error (bad configuration, no kernel image for this GPU).
#define HARMONY_CUDA_CHECK_LAUNCH(kernel) \
  ::harmony::backend::cuda::cuda_check(cudaGetLastError(), "launch of " kernel, __FILE__, __LINE__)
#define HARMONY_CUBLAS_CHECK(expr)                                                                            \
  do {                                                                                                        \
    const auto harmony_cublas_status_ = (expr);                                                               \
    if (harmony_cublas_status_ != 0)                                                                          \
      ::harmony::backend::cuda::throw_cublas_error(static_cast<int>(harmony_cublas_status_), #expr, __FILE__, \
                                                   __LINE__);                                                 \
  } while (false)
#define HARMONY_NCCL_CHECK(expr)                                                                                     \
  do {                                                                                                               \
    const auto harmony_nccl_result_ = (expr);                                                                        \
    if (harmony_nccl_result_ != 0)                                                                                   \
      ::harmony::backend::cuda::throw_nccl_error(static_cast<int>(harmony_nccl_result_), #expr, __FILE__, __LINE__); \
  } while (false)
