// What the swapping kinds (dp-swap, pp-swap, zero-infinity, l2l, lohan; docs/baselines.md) share: their swap rules,
// the swap decisions made from them, and the validation, candidate enumeration and title every such kind's spec
// points at. A swapping kind's file fills a PlanKindSpec and its SwapRules, lowers with detail::ProgramBuilder
// (core/program/program_builder.hpp) and registers both with HARMONY_REGISTER_SWAPPING_KIND.
#pragma once

#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

// How a swapping kind decides what to swap (decide_swaps), beyond what every such kind does (keep the weights unless
// they do not fit, then keep the stash unless it does not fit beside them).
struct SwapRules {
  bool stream_weights = false;    // always streams every layer's weights in per use (knobs.weights ignored)
  bool swap_activations = false;  // always sends its checkpoints to host memory (knobs.activations ignored)
  bool keep_activations = false;  // never sends activations to host memory (fsdp-offload; knobs.activations ignored)
  // The stash always lives on the host and weights always stream; knobs.activations chooses whether the
  // activations at the current layer's boundary go through the host (l2l's layer-at-a-time schedule).
  bool stash_on_host = false;
  bool all_microbatches_alive = false;  // a stage holds every microbatch's stash until the backward (GPipe)
  // Every GPU keeps its 1/N shard of every layer's W+B across the step (zero3-opt-offload): added to the estimate.
  bool resident_param_shards = false;
};

// Registers a swapping kind: its spec (register_plan_kind) and its rules (swap_rules). Returns true.
bool register_swapping_kind(const PlanKindSpec& spec, const SwapRules& rules);
// The rules of a swapping kind; InternalError for a kind not registered as one.
const SwapRules& swap_rules(PlanKind kind);
// Whether `kind` was registered as a swapping kind (register_swapping_kind): the kinds decide_swaps serves.
bool is_swapping_kind(PlanKind kind);

// What one GPU (a kind with stages: one stage) swaps, and the memory estimate the decision was made with.
struct SwapDecision {
  bool weights = false;      // W+B swapped in per layer per microbatch (gradients out per microbatch)
  bool activations = false;  // stashed layer inputs out and in (l2l: the boundary activations through the host)
  Bytes estimate_bytes = 0;  // per-GPU memory estimate under this decision
  bool fits = false;         // estimate_bytes <= knobs.gpu_capacity_bytes
};

// The decision of every GPU (a kind with stages: one per stage, in stage order; others: one, shared by all GPUs).
// Auto policy (docs/baselines.md): keep the weights unless W+B + gradients + the layer peak + a double-buffered
// activation window exceed capacity; then keep the stash unless it does not fit beside what the weights need; the
// kind's SwapRules and the plan's forced choices (knobs.weights, knobs.activations) first. Validates the plan.
std::vector<SwapDecision> decide_swaps(const Plan& plan, const Model& model);

// PlanKindSpec::validate of a swapping kind. Throws ScheduleError unless N, D, u (plan.u_bwd) are positive, u is in the
// profiled forward and backward range, the kind's rules hold (core/plan/plan_rules: N divides D and u divides D/N,
// u = D/N for one-microbatch kinds, N <= R for kinds with stages), the stages (if given) are N contiguous ascending
// ranges covering 0..R-1, and the ZeRO-3 overheads are finite (latency >= 0, bucket >= 1).
void validate_swapping_plan(const Plan& plan, const Model& model);

// PlanKindSpec::enumerate of a swapping kind: per activation policy (space.activation_policies, in order), per
// offload tier (space.offloads, for kinds with the offload knob; cpu otherwise), ascending u: u in the profiled
// forward and backward range, u <= the per-GPU share (D/N for data-parallel kinds, D otherwise) and passing the kind's
// microbatch rule, from space.spec.u_bwd when given (else every space.spec.ubatch_step-th size). Kinds with stages get
// balanced_stages(u, N). Each plan's knobs are space.knobs with the policy, tier and space.capacity_bytes; with
// space.drop_infeasible the plans whose decisions do not fit are left out. Empty when the split or stage rule fails.
// Throws ScheduleError for N, D < 1.
std::vector<Candidate> enumerate_swapping_plans(const Model& model, const SearchSpace& space);

// PlanKindSpec::describe of a swapping kind: "dp-swap N4 D32 u 8 (weights swapped, activations kept, checkpoint)".
std::string describe_swapping_plan(const Plan& plan, const Model& model);

}  // namespace harmony::core

// Registers a swapping kind's PlanKindSpec and SwapRules defined at namespace scope in its core/kinds/ file.
#define HARMONY_REGISTER_SWAPPING_KIND(spec, rules) \
  [[maybe_unused]] static const bool harmony_plan_kind_registered = ::harmony::core::register_swapping_kind(spec, rules)
