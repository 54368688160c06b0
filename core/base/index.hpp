// An int index (op, layer, device ids are ints in the Program) as the std::size_t a container takes: one cast,
// written once, for the files that index vectors by such ids.
#pragma once

#include <cstddef>

namespace harmony::core {

constexpr std::size_t ix(int i) { return static_cast<std::size_t>(i); }

}  // namespace harmony::core
