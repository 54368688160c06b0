// Reads the paper's measured per-layer profiles (format "harmony-profile-json", version 1) into a
// Model. Malformed JSON and missing or ill-typed fields are ConfigErrors naming file:line:column.
#pragma once

#include <string>

#include "core/model/model.hpp"

namespace harmony::core {

Model load_profile(const std::string& path);
// Same, from text; `name` is used in messages.
Model load_profile_text(const std::string& text, const std::string& name);

}  // namespace harmony::core
