// z(i): an int (or other integer) index as std::size_t, for the native engine's vectors indexed by op, GPU, link or
// layer. One definition for the engine's files (link_graph, host_account, activities, search_bounds, native_engine).
#pragma once

#include <cstddef>

namespace harmony::sim::engine_detail {

template <class T>
constexpr std::size_t z(T i) {
  return static_cast<std::size_t>(i);
}

}  // namespace harmony::sim::engine_detail
