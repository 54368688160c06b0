// harmony-sim kinds: the plan kinds the registry holds (core/plan/plan_kind.hpp), as a table or a JSON document
// (schemas/kinds.schema.json): name, aliases, role, whether harmony-run trains it (or which kind trains its updates),
// the plan.<knob> keys it reads and the properties shared code reads. What a user asks before writing plan.mode, and
// what the CLI tests list from.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/output/report.hpp"
#include "core/plan/plan_kind.hpp"
#include "sim/app/commands.hpp"

namespace harmony::sim::app {
namespace {

std::vector<std::string> knob_names(const core::PlanKind& k) {
  std::vector<std::string> out;
  for (const core::Knob knob : k->knobs) out.emplace_back(core::knob_name(knob));
  return out;
}

nlohmann::json kind_json(const core::PlanKind& k) {
  const core::PlanKindSpec& s = k.spec();
  return {{"name", s.name},
          {"aliases", s.aliases},
          {"role", core::kind_role_name(s.role)},
          {"description", s.description},
          {"trains", s.trains},
          {"trains_as", s.trains_as != nullptr ? nlohmann::json(s.trains_as) : nlohmann::json(nullptr)},
          {"knobs", knob_names(k)},
          {"packs", s.packs},
          {"data_parallel", s.data_parallel},
          {"stage_per_gpu", s.stage_per_gpu},
          {"one_microbatch", s.one_microbatch},
          {"offload_tiers", s.offload_tiers},
          {"resident_state", s.resident_state},
          {"one_gpu", s.one_gpu}};
}

void print_table(const std::vector<core::PlanKind>& kinds) {
  std::size_t width = 0;
  for (const auto& k : kinds) width = std::max(width, std::string(k.name()).size());
  fmt::print("{:<{}} {:<9} {:<6} {}\n", "kind", width + 1, "role", "trains", "description");
  for (const auto& k : kinds) {
    const std::vector<std::string> knobs = knob_names(k);
    fmt::print("{:<{}} {:<9} {:<6} {}{}{}\n", k.name(), width + 1, core::kind_role_name(k->role),
               k->trains ? "yes" : "no", k->description,
               knobs.empty() ? std::string() : fmt::format(" (plan.{})", fmt::join(knobs, ", plan.")),
               k->trains_as != nullptr ? fmt::format("; harmony-run trains its updates as {}", k->trains_as) : "");
  }
}

}  // namespace

int cmd_kinds(const Cli& cli) {
  const auto& kinds = core::plan_kinds();
  if (cli.format != "json") {
    print_table(kinds);
    return 0;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& k : kinds) list.push_back(kind_json(k));
  const nlohmann::json j = {
      {"schema_version", core::kOutputSchemaVersion}, {"command", "kinds"}, {"kinds", std::move(list)}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace harmony::sim::app
