// The plan kinds: Harmony's two modes and the swapping baselines it is compared against, with their
// names as configs and outputs spell them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace harmony::core {

// Every way an iteration can be scheduled: Harmony's two modes (core::lower_harmony) and the baselines.
enum class PlanKind { HarmonyPP, HarmonyDP, DpSwap, PpSwap, ZeroInfinity, L2L };

// "harmony-pp", "harmony-dp", "dp-swap", "pp-swap", "zero-infinity", "l2l"
const char* plan_kind_name(PlanKind k);
// The inverse of plan_kind_name; nullopt for an unknown name (use closest_match on plan_kind_names()).
std::optional<PlanKind> parse_plan_kind(std::string_view name);
const std::vector<std::string>& plan_kind_names();
bool is_baseline(PlanKind k);                   // every kind but HarmonyPP / HarmonyDP
const std::vector<PlanKind>& baseline_kinds();  // DpSwap, PpSwap, ZeroInfinity, L2L
// Kinds that split the minibatch over GPUs (each GPU takes D/N): all but pp-swap and harmony-pp.
bool is_data_parallel(PlanKind k);

}  // namespace harmony::core
