// One-line descriptions of machines for listings (core/machine/machine.hpp). The loaders, checks and presets are in
// core/config/config_machine.cpp; this file only formats.
#include "core/machine/machine.hpp"

#include <fmt/format.h>

namespace harmony::core {

std::string machine_summary(const MachineSpec& m) {
  const double gib = static_cast<double>(kGiB), mib = gib / 1024;
  // Below 1 GiB (the CPU device's arenas) in MiB, so that a 2 MiB device does not read as 0.00 GiB.
  const double mem = static_cast<double>(m.gpu_memory_bytes);
  const std::string per_gpu = m.gpu_memory_bytes > 0 && m.gpu_memory_bytes < kGiB
                                  ? fmt::format("{:.2f} MiB", mem / mib)
                                  : fmt::format("{:.2f} GiB", mem / gib);
  std::string s = fmt::format("{} x {}, {} per GPU, swap {:.2f} GiB/s, p2p {:.2f} GiB/s", m.gpus,
                              m.gpu_name.empty() ? std::string("GPU") : m.gpu_name, per_gpu,
                              m.bw_swap_bytes_per_s / gib, m.bw_p2p_bytes_per_s / gib);
  s += m.price_per_hour > 0 ? fmt::format(", {:.2f} per hour", m.price_per_hour) : std::string(", no price");
  return s;
}

}  // namespace harmony::core
