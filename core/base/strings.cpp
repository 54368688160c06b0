// Small text helpers shared by the core's rooms (strings.hpp).
#include "core/base/strings.hpp"

namespace harmony::core {

std::string join_ints(const std::vector<int>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(items[i]);
  }
  return out;
}

}  // namespace harmony::core
