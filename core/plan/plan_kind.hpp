// The plan kinds: Harmony's two modes and the swapping baselines it is compared against, with their
// names as configs and outputs spell them. plan_kinds() is the one table of them (plan_kind.cpp); every
// other function here is a lookup in it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace harmony::core {

// Every way an iteration can be scheduled: Harmony's two modes (core::lower_harmony) and the baselines
// (core::lower_baseline).
enum class PlanKind { HarmonyPP, HarmonyDP, DpSwap, PpSwap, ZeroInfinity, L2L, LoHan };

// One row of the registry: what is known of a kind below the lowering (core/program keeps the lowerings).
struct PlanKindInfo {
  PlanKind kind;
  const char* name;         // as configs and outputs spell it: "harmony-pp", "dp-swap", ...
  bool is_baseline;         // a swapping baseline (core::lower_baseline), not a Harmony mode
  bool data_parallel;       // splits the minibatch over GPUs (each GPU takes D/N)
  bool offload_tiers;       // its parameters and optimizer state may live on NVMe (search.offload, plan.offload)
  bool one_microbatch;      // runs each GPU's share as one microbatch (no gradient accumulation): u = D/N
  const char* description;  // one line, for listings
};

// Every kind, in the order listings and `compare` show them: harmony-pp, harmony-dp, dp-swap, pp-swap,
// zero-infinity, l2l, lohan.
const std::vector<PlanKindInfo>& plan_kinds();
// The row of k; InternalError for a value not in the table (a bug).
const PlanKindInfo& plan_kind_info(PlanKind k);

// "harmony-pp", "harmony-dp", "dp-swap", "pp-swap", "zero-infinity", "l2l", "lohan"
const char* plan_kind_name(PlanKind k);
// The inverse of plan_kind_name; nullopt for an unknown name (use closest_match on plan_kind_names()).
std::optional<PlanKind> parse_plan_kind(std::string_view name);
const std::vector<std::string>& plan_kind_names();
bool is_baseline(PlanKind k);                           // every kind but HarmonyPP / HarmonyDP
const std::vector<PlanKind>& baseline_kinds();          // DpSwap, PpSwap, ZeroInfinity, L2L, LoHan
const std::vector<std::string>& baseline_kind_names();  // "dp-swap", "pp-swap", "zero-infinity", "l2l", "lohan"
// Kinds that split the minibatch over GPUs (each GPU takes D/N): all but pp-swap and harmony-pp.
bool is_data_parallel(PlanKind k);
// Kinds whose parameters and optimizer state can live on the machine's NVMe tier (search.offload, plan.offload):
// harmony-pp, harmony-dp, zero-infinity, lohan.
bool has_offload_tiers(PlanKind k);
// Kinds that run each GPU's share as one microbatch (lohan: its artifact has no gradient accumulation).
bool is_one_microbatch(PlanKind k);

}  // namespace harmony::core
