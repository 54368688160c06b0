// The machine a plan runs on, as the reference cost model sees it: GPU count and memory capacity
// and the paper's scheduler constants (swap, P2P and CPU-message bandwidths, per-task free time).
// Loaded from a machine YAML (configs/machines/*.yaml) or a built-in preset name.
#pragma once

#include <string>

#include "core/units.hpp"

namespace harmony::core {

struct MachineSpec {
  std::string name;                    // preset or file name, for reports
  std::string gpu_name;                // "GTX 1080 Ti"
  int gpus = 1;                        // GPUs present in the box (a plan may use fewer)
  Bytes gpu_memory_bytes = 10 * kGiB;  // the per-GPU capacity the search packs against
  double memory_cap_scale = 1.0;       // multiplies gpu_memory_bytes in the search (paper's flag)
  double bw_swap_bytes_per_s = 11.5 * static_cast<double>(kGiB);  // host<->GPU, per direction, shared
  double bw_p2p_bytes_per_s = 8.2 * static_cast<double>(kGiB);    // GPU<->GPU, per direction
  double bw_msg_bytes_per_s = 16.0 * static_cast<double>(kGiB);   // CPU<->CPU message
  double time_del_s = 0.040;                                      // freeing one task's tensors
};

}  // namespace harmony::core
