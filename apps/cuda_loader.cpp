// Finding and loading the CUDA device module (cuda_loader.hpp): dlopen with RTLD_NOW | RTLD_LOCAL, never closed
// (the devices it makes live until exit), its table checked against this build's ABI.
#include "apps/cuda_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "core/base/error.hpp"

namespace harmony::apps {

namespace fs = std::filesystem;

bool cuda_module_built() {
#ifdef HARMONY_CUDA_MODULE_NAME
  return true;
#else
  return false;
#endif
}

namespace {

struct Loaded {
  const backend::cuda::ModuleApi* api = nullptr;
  std::string problem;  // why api is null
  std::string hint;
};

#ifdef HARMONY_CUDA_MODULE_NAME
std::vector<std::string> candidates() {
  if (const char* env = std::getenv("HARMONY_CUDA_MODULE"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / HARMONY_CUDA_MODULE_NAME).string());
  out.emplace_back(HARMONY_CUDA_MODULE_INSTALLED);
  return out;
}

Loaded load() {
  Loaded l;
  const std::vector<std::string> paths = candidates();
  std::string tried;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (paths.size() > 1 && !fs::exists(path, ec)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      l.problem = fmt::format("the CUDA device module {} cannot be loaded: {}", path, why ? why : "unknown reason");
      l.hint = "the CUDA runtime, cuBLAS and NCCL libraries it links must be on the library path (`ldd " + path +
               "` lists what is missing; LD_LIBRARY_PATH), or use `device: cpu` (--set device=cpu)";
      return l;
    }
    using Entry = const backend::cuda::ModuleApi* (*)();
    const auto entry = reinterpret_cast<Entry>(::dlsym(handle, backend::cuda::kModuleEntry));
    const backend::cuda::ModuleApi* api = entry != nullptr ? entry() : nullptr;
    if (api == nullptr || api->abi_version != backend::cuda::kModuleAbiVersion ||
        api->options_size != sizeof(backend::cuda::CudaDeviceOptions) ||
        api->api_size != sizeof(backend::cuda::ModuleApi)) {
      l.problem = fmt::format("{} is not this harmony-run's CUDA device module (another build or version)", path);
      l.hint =
          "rebuild harmony (ninja -C build), or point HARMONY_CUDA_MODULE at the module built with this harmony-run";
      return l;
    }
    l.api = api;
    return l;
  }
  l.problem =
      fmt::format("the CUDA device module {} is not installed (looked for {})", HARMONY_CUDA_MODULE_NAME, tried);
  l.hint = "install harmony whole (meson install), set HARMONY_CUDA_MODULE to the module's path, or use `device: cpu`";
  return l;
}
#endif

}  // namespace

const backend::cuda::ModuleApi& cuda_module(const std::string& config_file) {
#ifdef HARMONY_CUDA_MODULE_NAME
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (loaded.api == nullptr) throw core::ConfigError(core::SourceLoc{config_file, 0, 0}, loaded.problem, loaded.hint);
  return *loaded.api;
#else
  throw core::ConfigError(core::SourceLoc{config_file, 0, 0}, "device 'cuda' is not built into this harmony-run",
                          "rebuild where the CUDA toolkit is found (meson -Dcuda=enabled), or use `device: cpu`");
#endif
}

}  // namespace harmony::apps
