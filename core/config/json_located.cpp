// JsonConfigFile::parse_object: the one parse-and-refuse step the JSON config readers (config_hf.cpp,
// config_deepspeed.cpp) share, worded per kind of file.
#include "core/config/json_located.hpp"

#include <fmt/format.h>

namespace harmony::core {

const nlohmann::json& JsonConfigFile::parse_object(const JsonFileWords& words) {
  const std::string syntax_hint = fmt::format(
      "{} is one JSON object; check the syntax here (JSON allows no comments and no trailing commas)", words.what);
  j_ = parse_json_located(text_, path_, [&](const JsonParseProblem& p) {
    return p.syntax || words.number_hint.empty() ? syntax_hint : words.number_hint;
  });
  if (!j_.is_object())
    throw ConfigError(SourceLoc{path_, 1, 1}, fmt::format("{} must be a JSON object", words.what), words.object_hint);
  return j_;
}

}  // namespace harmony::core
