// harmony-run's side of the CUDA device module (backend/cuda/cuda_module.hpp): finds and dlopen()s it on first
// use (a config with `device: cuda`), so nothing else harmony-run does loads the CUDA libraries.
#pragma once

#include <string>

#include "backend/cuda/cuda_module.hpp"

namespace harmony::apps {

// Whether this harmony-run was built with the CUDA device (meson found CUDA): the module exists to be loaded.
bool cuda_module_built();

// The module's table, loaded on the first call. Where it is looked for: $HARMONY_CUDA_MODULE when set (a path),
// else beside the harmony-run executable (the build tree), else the install folder (lib/harmony/). Throws
// core::ConfigError located at `config_file` when it is not built in, cannot be found or loaded (dlerror()'s
// reason: e.g. the CUDA runtime's libraries are missing), or is another build's.
const backend::cuda::ModuleApi& cuda_module(const std::string& config_file);

}  // namespace harmony::apps
