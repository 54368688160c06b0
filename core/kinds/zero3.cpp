// zero3: DeepSpeed ZeRO stage 3 with everything on the GPUs (no offload_param, no offload_optimizer). fsdp's Program
// (each GPU keeps 1/N of every layer's parameters, gradient and AdamW state; all-gather before each forward and
// backward, reduce-scatter after each backward, AdamW on the shard on the GPU) plus the host-side work stage 3 does in
// its hooks on every module and parameter (plan.zero3, zero3_hooks.hpp), paid on the compute stream at any GPU count.
// harmony-run trains it as it trains fsdp (the same Program and dataflow: stage 3's hooks are host time the simulator
// prices, which the executor does not spend).
#include <fmt/format.h>

#include "core/kinds/fsdp.hpp"
#include "core/kinds/microbatch_sizes.hpp"
#include "core/kinds/zero3_hooks.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"

namespace harmony::core {
namespace {

void validate_zero3(const Plan& plan, const Model& model) {
  validate_microbatch_plan(plan, model);
  detail::validate_zero3_overheads("zero3", plan.knobs.zero3);
}

Program lower_zero3(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_zero3(plan, model);
  return lower_sharded(plan, model, /*stage3_hooks=*/true);
}

std::string describe_zero3(const Plan& p, const Model& model) {
  const Zero3Overheads& z = p.knobs.zero3;
  return fmt::format(
      "zero3 N{} D{} u {} (DeepSpeed ZeRO-3 on the GPUs: weights, gradients and AdamW state partitioned, {} on each; "
      "layers all-gathered for forward and backward, gradients reduce-scattered; hooks {:.0f} us a module, {:.0f} us a "
      "parameter tensor; {})",
      p.gpus, p.minibatch, p.u_bwd, format_bytes(sharded_state_bytes(p, model)), z.module_latency_s * 1e6,
      z.tensor_latency_s * 1e6, activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "zero3",
    .description =
        "DeepSpeed ZeRO-3 without offload: fsdp's all-gather per layer, reduce-scatter and AdamW on each GPU's "
        "partition, plus stage 3's per-module and per-parameter hook work",
    .listing_order = 86,
    .role = KindRole::Baseline,
    .color = "#e377c2",
    .data_parallel = true,
    .even_split = true,
    .resident_state = true,
    .trains = true,
    .knobs = {Knob::Activations, Knob::Zero3},
    .validate = validate_zero3,
    .lower = lower_zero3,
    .enumerate = enumerate_sharded,
    .describe = describe_zero3,
};

HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
