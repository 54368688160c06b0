// Finding and loading a device module (device_module.hpp): the search path, dlopen, the entry, the ABI check.
#include "backend/device_module.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace harmony::backend {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> candidates(const DeviceModuleSpec& spec) {
  if (const char* env = std::getenv(spec.env.c_str()); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / spec.file).string());
  out.push_back(spec.installed);
  return out;
}

const DeviceFactory* fail(DeviceAvailability& why, std::string reason, std::string hint) {
  why.available = false;
  why.reason = std::move(reason);
  why.hint = std::move(hint);
  return nullptr;
}

}  // namespace

const DeviceFactory* load_device_module(const DeviceModuleSpec& spec, DeviceAvailability& why) {
  const std::vector<std::string> paths = candidates(spec);
  std::string tried;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (paths.size() > 1 && !fs::exists(path, ec)) {  // a path from the environment is tried as it is
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = ::dlerror();
      return fail(why, fmt::format("{} {} cannot be loaded: {}", spec.what, path, err ? err : "unknown reason"),
                  fmt::format("{} it links must be on the library path (`ldd {}` lists what is missing; "
                              "LD_LIBRARY_PATH), or {}",
                              spec.libraries, path, spec.fallback));
    }
    using Entry = const DeviceModuleApi* (*)();
    const auto entry = reinterpret_cast<Entry>(::dlsym(handle, kDeviceModuleEntry));
    const DeviceModuleApi* api = entry != nullptr ? entry() : nullptr;
    if (api == nullptr || api->abi_version != kDeviceModuleAbiVersion || api->api_size != sizeof(DeviceModuleApi) ||
        api->options_size != sizeof(DeviceOptions) || api->caps_size != sizeof(DeviceCaps) || api->factory == nullptr)
      return fail(
          why, fmt::format("{} is not {} of this build (another build or version)", path, spec.what),
          fmt::format("rebuild harmony (ninja -C build), or point {} at the module built with this binary", spec.env));
    return api->factory;
  }
  return fail(why, fmt::format("{} {} is not installed (looked for {})", spec.what, spec.file, tried),
              fmt::format("install harmony whole (meson install), set {} to the module's path, or {}", spec.env,
                          spec.fallback));
}

}  // namespace harmony::backend
