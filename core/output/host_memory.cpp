// HostBreakdown's categories, sum and JSON (host_memory.hpp).
#include "core/output/host_memory.hpp"

#include <string>

#include <nlohmann/json.hpp>

namespace harmony::core {

Bytes& HostBreakdown::at(HostCategory c) {
  switch (c) {
    case HostCategory::MasterWeights:
      return master_weights_bytes;
    case HostCategory::OptimizerState:
      return optimizer_state_bytes;
    case HostCategory::Gradients:
      return gradient_bytes;
    case HostCategory::Stash:
      return stash_bytes;
    case HostCategory::Activations:
      return activation_bytes;
    case HostCategory::Staging:
      break;
  }
  return staging_bytes;
}

Bytes HostBreakdown::total_bytes() const {
  Bytes sum = 0;
  for (HostCategory c : kHostCategories) sum += at(c);
  return sum;
}

nlohmann::json host_breakdown_json(const HostBreakdown& b, std::string_view staging_key) {
  return {{"master_weights_bytes", b.master_weights_bytes},
          {"optimizer_state_bytes", b.optimizer_state_bytes},
          {"gradient_bytes", b.gradient_bytes},
          {"stash_bytes", b.stash_bytes},
          {"activation_bytes", b.activation_bytes},
          {std::string(staging_key), b.staging_bytes}};
}

}  // namespace harmony::core
