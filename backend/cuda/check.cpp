// The messages of checked CUDA, cuBLAS and NCCL calls (check.hpp): the library's error name and text, the
// source location (relative to the source root) and the failing expression, as a DeviceError.
#include "backend/cuda/check.hpp"

#include <cstring>
#include <string>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "backend/device.hpp"

#ifdef HARMONY_HAVE_NCCL
#include <nccl.h>
#endif

namespace harmony::backend::cuda {
namespace {

// "../backend/cuda/x.cpp" (meson's build-relative paths) -> "backend/cuda/x.cpp".
const char* source_path(const char* file) {
  const char* p = std::strstr(file, "backend/");
  return p != nullptr ? p : file;
}

}  // namespace

void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line) {
  throw DeviceError(fmt::format("cuda error {} {} ({}) at {}:{}: {}", static_cast<int>(error), cudaGetErrorName(error),
                                cudaGetErrorString(error), source_path(file), line, expr));
}

void throw_cublas_error(int status, const char* expr, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  throw DeviceError(fmt::format("cuBLAS error {} {} ({}) at {}:{}: {}", status, cublasGetStatusName(s),
                                cublasGetStatusString(s), source_path(file), line, expr));
}

void throw_nccl_error(int result, const char* expr, const char* file, int line) {
#ifdef HARMONY_HAVE_NCCL
  const char* text = ncclGetErrorString(static_cast<ncclResult_t>(result));
#else
  const char* text = "NCCL is not built in";
#endif
  throw DeviceError(fmt::format("NCCL error {} ({}) at {}:{}: {}", result, text, source_path(file), line, expr));
}

}  // namespace harmony::backend::cuda
