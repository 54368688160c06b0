// What every kind with one microbatch size (plan.u_bwd; no packs: the swapping kinds, zero-offload and resident)
// shares: the first checks of its validation (the whole of it for zero-offload and resident), the sizes its
// enumeration offers the search and the candidate of one size. Each kind's file adds its own rules and knobs.
#pragma once

#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

// Throws ScheduleError unless N and D are positive (size_problem), u = plan.u_bwd >= 1 and u is in the profiled
// forward and backward range. The kind's own rules on N, D and u (microbatch_problem, ...) come after.
void validate_microbatch_size(const Plan& plan, const Model& model);

// The microbatch sizes of space.kind's candidates, ascending and distinct: space.spec.u_bwd when given (else every
// space.spec.ubatch_step-th size from the profiled minimum), keeping those in the profiled forward and backward
// range, at most the per-GPU share (D/N for data-parallel kinds, D otherwise) and passing the kind's microbatch rule
// (microbatch_fits). Empty when the split or stage rule fails (split_problem, stage_problem). Throws ScheduleError
// for N, D < 1.
std::vector<int> candidate_microbatch_sizes(const Model& model, const SearchSpace& space);

// The candidate of space.kind at microbatch u (u_fwd = u_bwd = u) under `policy`: space's N, D and knobs, with the
// policy and knobs.gpu_capacity_bytes = space.capacity_bytes.
Candidate microbatch_candidate(const SearchSpace& space, ActivationPolicy policy, int u);

// The whole validation of a kind whose only rules are these (resident, zero-offload): validate_microbatch_size, then
// the kind's microbatch rule (plan_rules: microbatch_problem), as ScheduleError.
void validate_microbatch_plan(const Plan& plan, const Model& model);

// The whole enumeration of such a kind: per activation policy (space.activation_policies, in order), ascending u
// (candidate_microbatch_sizes), one microbatch_candidate each; with space.drop_infeasible only those whose
// `estimate_bytes` (one GPU's peak estimate of the plan) fits space.capacity_bytes.
std::vector<Candidate> enumerate_microbatch_plans(const Model& model, const SearchSpace& space,
                                                  Bytes (*estimate_bytes)(const Plan&, const Model&));

// The kinds whose state lives on the GPUs (resident, fsdp): the HBM traffic of one AdamW step per parameter the GPU
// steps (fp32 reads the parameter, gradient, m and v, writes the parameter, m and v; bf16 reads the fp32 master, the
// bf16 gradient, m and v and writes the master, m, v and the bf16 working copy: 28 bytes either way,
// backend/model/device_state.hpp's layout).
inline constexpr Bytes kDeviceAdamWBytesPerParam = 28;
// Pure 2-byte training (Model::fp32_optimizer false): reads the 2-byte parameter, gradient, m and v and writes the
// parameter, m and v, 7 x 2 bytes.
inline constexpr Bytes kDevicePureAdamWBytesPerParam = 14;

// One rank's part of `bytes` split over `ranks` (ZeRO and FSDP pad their partitions to equal sizes): ceil(bytes /
// ranks); the whole when ranks is 1.
inline Bytes shard_bytes(Bytes bytes, int ranks) { return (bytes + ranks - 1) / ranks; }

// The HBM bytes of one GPU's AdamW step over its shard of layer l (the whole layer when shards is 1): its share of
// the layer's parameters times Model::device_adamw_bytes_per_param (torch's foreach step), else
// kDeviceAdamWBytesPerParam, or kDevicePureAdamWBytesPerParam under pure 2-byte training.
inline Bytes device_adamw_bytes(const Model& model, int layer, int shards) {
  const bool fp32 = model.fp32_optimizer;
  const Bytes params = model.optimizer_param_bytes(layer) / (fp32 ? 4 : 2);
  const Bytes per_param = model.device_adamw_bytes_per_param > 0 ? model.device_adamw_bytes_per_param
                          : fp32                                 ? kDeviceAdamWBytesPerParam
                                                                 : kDevicePureAdamWBytesPerParam;
  return per_param * shard_bytes(params, shards);
}

// Every Update op of `prog` priced as one GPU's AdamW over its shard (device_adamw_bytes over `shards`): the kinds
// whose Updates run on the GPUs (resident, fsdp, zero2, zero3).
inline void price_device_adamw(Program& prog, const Model& model, int shards) {
  for (Op& op : prog.ops)
    if (op.kind == OpKind::Update) op.bytes = device_adamw_bytes(model, op.layers.first, shards);
}

// What one GPU keeps of layer l for the whole run when the state is split into `shards` equal, padded parts (1: all
// of it): ceil(bytes / shards) of the weights and buffers, of the gradient, and of the optimizer state (AdamW's
// moments; with weights narrower than fp32 the profile's optimizer state also holds the fp32 masters).
Bytes device_state_bytes(const Model& model, int layer, int shards);

// What one microbatch at plan.u_bwd adds to a GPU that keeps its state (device_state_estimate_bytes, zero2's estimate):
// every layer's input (under keep also its saved activations: the backward starts after the last forward) and the
// largest layer peak beyond its own weights and input.
Bytes microbatch_working_bytes(const Plan& plan, const Model& model);

// One GPU's peak estimate of such a kind at plan.u_bwd (the search's drop_infeasible): every layer's
// device_state_bytes over plan.gpus shards (1 for a replicating kind), every layer's input for one microbatch (under
// keep also its saved activations: the backward starts after the last forward), the largest layer peak beyond its
// own weights and input, and, when sharded over several GPUs, three layers' full weights and buffers (the gathered
// layer, the prefetched one and a full gradient before its reduce-scatter).
Bytes device_state_estimate_bytes(const Plan& plan, const Model& model, bool sharded);

}  // namespace harmony::core
