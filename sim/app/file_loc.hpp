// Where harmony-sim's located errors about a file point (core::SourceLoc): the path in generic form and a 1-based
// line (0: the whole file). Shared by the sweep (sweep_internal.hpp) and the report (report_data.cpp) so that both
// name a folder's files the same way.
#pragma once

#include <filesystem>

#include "core/base/error.hpp"

namespace harmony::sim {

inline core::SourceLoc file_loc(const std::filesystem::path& p, int line = 0) {
  return core::SourceLoc{p.generic_string(), line, 0};
}

}  // namespace harmony::sim
