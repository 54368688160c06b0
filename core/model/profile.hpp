// Reads the paper's measured per-layer profiles (format "harmony-profile-json", version 1) into a
// Model. Malformed JSON and missing or ill-typed fields are ConfigErrors naming file:line:column.
#pragma once

#include <string>

#include "core/model/model.hpp"

namespace harmony::core {

Model load_profile(const std::string& path);
// Same, from text; `name` is used in messages.
Model load_profile_text(const std::string& text, const std::string& name);
// Same through the located path alone (nlohmann-json), which load_profile_text takes only when its simdjson
// fast path meets a problem: for checks that both paths agree (fuzz/fuzz_profile.cpp, tests).
Model load_profile_text_located(const std::string& text, const std::string& name);

}  // namespace harmony::core
