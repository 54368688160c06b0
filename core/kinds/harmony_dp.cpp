// harmony-dp: Harmony's vDP. Every GPU is a replica that runs all of the layer packs on its share of the minibatch,
// each pack over every microbatch of the share while its weights sit on the GPU (harmony.hpp).
#include "core/kinds/harmony.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::core {
namespace {

const PlanKindSpec kHarmonyDP{
    .name = "harmony-dp",
    .description = "Harmony's vDP: every GPU a replica running all packs on its share of the minibatch",
    .aliases = {"vDP"},
    .listing_order = 20,
    .role = KindRole::Harmony,
    .color = "#17becf",
    .packs = true,
    .data_parallel = true,
    .unequal_microbatches = true,
    .offload_tiers = true,
    .validate = validate_harmony_plan,
    .lower = lower_harmony_plan,
    .enumerate = enumerate_harmony_plans,
    .describe = describe_harmony_plan,
};

HARMONY_REGISTER_PLAN_KIND(kHarmonyDP);

}  // namespace
}  // namespace harmony::core
