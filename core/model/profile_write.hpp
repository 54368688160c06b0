// Writes a Model as "harmony-profile-json" version 1 text, the format core/model/profile.cpp reads
// (configs/profiles/README.md): every field load_profile_text reads, exactly (integers as integers,
// doubles in shortest round-trip form), plus caller-supplied metadata objects at the top level.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/model/model.hpp"

namespace harmony::core {

// The profile text of `model`: "model" is model.name ("variant" null), then the schema's fields, one
// layer per line. `metadata` (a JSON object, or null for none) adds its members at the top level after
// "format_version" ("hardware", "source", "units", ...); a member that names a schema field the writer
// emits ("format", "model", "layers", "ubatch_sizes", ...) is refused, as are a Model that fails
// validate(), an empty name, and negative or non-finite times or sizes. Throws ScheduleError naming the
// problem. load_profile_text(write_profile_json(m), ...) equals m in every field but `source`.
std::string write_profile_json(const Model& model, const nlohmann::json& metadata);
std::string write_profile_json(const Model& model);

}  // namespace harmony::core
