// harmony-pp: Harmony's vPP. The model is cut into layer packs that run round-robin over the GPUs, each pack over
// every microbatch of the whole minibatch while its weights sit on its GPU (harmony.hpp).
#include "core/kinds/harmony.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::core {
namespace {

const PlanKindSpec kHarmonyPP{
    .name = "harmony-pp",
    .description = "Harmony's vPP: layer packs round-robin over the GPUs, every GPU sees the whole minibatch",
    .aliases = {"vPP"},
    .listing_order = 10,
    .role = KindRole::Harmony,
    .color = "#1f77b4",
    .packs = true,
    .unequal_microbatches = true,
    .offload_tiers = true,
    .validate = validate_harmony_plan,
    .lower = lower_harmony_plan,
    .enumerate = enumerate_harmony_plans,
    .describe = describe_harmony_plan,
};

HARMONY_REGISTER_PLAN_KIND(kHarmonyPP);

}  // namespace
}  // namespace harmony::core
