// The cost models a config can name (`cost_model:`): the enum parsed once by the config loader and carried
// through the simulator, with the names reports, JSON and sweep rows print. `reference` reproduces the paper's
// simulator; `native` runs the native engine (docs/reference-model.md, docs/native-model.md).
#pragma once

#include <optional>
#include <string_view>

namespace harmony::core {

enum class CostModelKind { Reference, Native };

// "reference" or "native".
constexpr const char* cost_model_name(CostModelKind k) { return k == CostModelKind::Native ? "native" : "reference"; }

// The kind a name spells, or nullopt for any other text.
constexpr std::optional<CostModelKind> parse_cost_model_kind(std::string_view name) {
  if (name == "reference") return CostModelKind::Reference;
  if (name == "native") return CostModelKind::Native;
  return std::nullopt;
}

}  // namespace harmony::core
