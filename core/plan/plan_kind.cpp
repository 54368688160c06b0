// Plan kind names and their parser.
#include "core/plan/plan_kind.hpp"

#include <array>

namespace harmony::core {

namespace {
constexpr std::array<PlanKind, 6> kAllKinds = {PlanKind::HarmonyPP, PlanKind::HarmonyDP,    PlanKind::DpSwap,
                                               PlanKind::PpSwap,    PlanKind::ZeroInfinity, PlanKind::L2L};
}  // namespace

const char* plan_kind_name(PlanKind k) {
  switch (k) {
    case PlanKind::HarmonyPP:
      return "harmony-pp";
    case PlanKind::HarmonyDP:
      return "harmony-dp";
    case PlanKind::DpSwap:
      return "dp-swap";
    case PlanKind::PpSwap:
      return "pp-swap";
    case PlanKind::ZeroInfinity:
      return "zero-infinity";
    case PlanKind::L2L:
      return "l2l";
  }
  return "?";
}

std::optional<PlanKind> parse_plan_kind(std::string_view name) {
  for (PlanKind k : kAllKinds) {
    if (name == plan_kind_name(k)) return k;
  }
  return std::nullopt;
}

const std::vector<std::string>& plan_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (PlanKind k : kAllKinds) v.emplace_back(plan_kind_name(k));
    return v;
  }();
  return names;
}

bool is_baseline(PlanKind k) { return k != PlanKind::HarmonyPP && k != PlanKind::HarmonyDP; }

const std::vector<PlanKind>& baseline_kinds() {
  static const std::vector<PlanKind> kinds = {PlanKind::DpSwap, PlanKind::PpSwap, PlanKind::ZeroInfinity,
                                              PlanKind::L2L};
  return kinds;
}

bool is_data_parallel(PlanKind k) { return k != PlanKind::PpSwap && k != PlanKind::HarmonyPP; }

}  // namespace harmony::core
