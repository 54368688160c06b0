// The plan-kind registry: one row per kind (as nccl-tests keeps one table per collective). Adding a kind
// is a row here, a value in PlanKind, and its lowering in core/program (docs/design.md, "Plan kinds").
#include "core/plan/plan_kind.hpp"

#include <algorithm>
#include <string>

#include "core/base/error.hpp"

namespace harmony::core {

const std::vector<PlanKindInfo>& plan_kinds() {
  static const std::vector<PlanKindInfo> table = {
      // kind, name, is_baseline, data_parallel, offload_tiers, one_microbatch, description
      {PlanKind::HarmonyPP, "harmony-pp", false, false, true, false,
       "Harmony's vPP: layer packs round-robin over the GPUs, every GPU sees the whole minibatch"},
      {PlanKind::HarmonyDP, "harmony-dp", false, true, true, false,
       "Harmony's vDP: every GPU a replica running all packs on its share of the minibatch"},
      {PlanKind::DpSwap, "dp-swap", true, true, false, false,
       "data parallelism over virtualized GPU memory: weights swapped in per layer, activations as memory requires"},
      {PlanKind::PpSwap, "pp-swap", true, false, false, false,
       "GPipe-style pipeline over time-balanced contiguous stages, each swapping like dp-swap"},
      {PlanKind::ZeroInfinity, "zero-infinity", true, true, true, false,
       "ZeRO stage 3: parameters, gradients and optimizer state partitioned and offloaded to host (or NVMe)"},
      {PlanKind::L2L, "l2l", true, true, false, false,
       "layer-to-layer: one layer resident at a time over all microbatches, activations stashed on the host"},
      {PlanKind::LoHan, "lohan", true, true, true, true,
       "LoHan (Fuyou): each layer's parameters streamed from host or NVMe, checkpoints on the host, each layer's CPU "
       "Adam overlapped with the rest of the backward"},
  };
  return table;
}

namespace {
const PlanKindInfo* find_kind(PlanKind k) {
  const auto& t = plan_kinds();
  const auto it = std::find_if(t.begin(), t.end(), [k](const PlanKindInfo& i) { return i.kind == k; });
  return it == t.end() ? nullptr : &*it;
}
}  // namespace

const PlanKindInfo& plan_kind_info(PlanKind k) {
  const PlanKindInfo* info = find_kind(k);
  if (!info) throw InternalError("plan kind " + std::to_string(static_cast<int>(k)) + " is not in plan_kinds()");
  return *info;
}

const char* plan_kind_name(PlanKind k) {
  const PlanKindInfo* info = find_kind(k);
  return info ? info->name : "?";
}

std::optional<PlanKind> parse_plan_kind(std::string_view name) {
  for (const PlanKindInfo& i : plan_kinds()) {
    if (name == i.name) return i.kind;
  }
  return std::nullopt;
}

const std::vector<std::string>& plan_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const PlanKindInfo& i : plan_kinds()) v.emplace_back(i.name);
    return v;
  }();
  return names;
}

bool is_baseline(PlanKind k) { return plan_kind_info(k).is_baseline; }

const std::vector<PlanKind>& baseline_kinds() {
  static const std::vector<PlanKind> kinds = [] {
    std::vector<PlanKind> v;
    for (const PlanKindInfo& i : plan_kinds())
      if (i.is_baseline) v.push_back(i.kind);
    return v;
  }();
  return kinds;
}

const std::vector<std::string>& baseline_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (PlanKind k : baseline_kinds()) v.emplace_back(plan_kind_name(k));
    return v;
  }();
  return names;
}

bool is_data_parallel(PlanKind k) { return plan_kind_info(k).data_parallel; }

bool has_offload_tiers(PlanKind k) { return plan_kind_info(k).offload_tiers; }

bool is_one_microbatch(PlanKind k) { return plan_kind_info(k).one_microbatch; }

}  // namespace harmony::core
