// What the kinds that shard their state over the GPUs share (fsdp.cpp): fsdp's Program and its memory estimate, zero3
// (zero3.cpp) the same Program with DeepSpeed stage 3's hook work; their collective keys and the gradient
// reduce-scatter zero2 also runs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

namespace detail {
class ProgramBuilder;
}

// A per-layer collective's key: (pass, layer, microbatch). fsdp, zero3 and zero-infinity: pass 0 the forward's
// all-gather, 1 the backward's, 2 the reduce-scatter; zero2: 2 its reduce-scatter, 3 the updated weights' all-gather.
inline std::uint64_t layer_collective_key(int pass, int l, int i) {
  return (static_cast<std::uint64_t>(pass) << 60) | (static_cast<std::uint64_t>(l) << 32) |
         static_cast<std::uint32_t>(i);
}

// After `after` (layer l's BWD of microbatch i at step k on GPU g): the layer's full gradient allocated there, the RS
// on P2POut that reduce-scatters it into the rank's state (fsdp, zero2: every microbatch) and frees it, registered as
// step k's output. Returns the RS.
int reduce_scatter_gradient(detail::ProgramBuilder& b, int g, int l, int i, int k, int after);

// fsdp's Program (fsdp.cpp describes it); with stage3_hooks, every FWD and BWD of a layer with parameters also carries
// plan.knobs.zero3's hook work (zero3_hooks.hpp, the optimizer on the GPUs).
Program lower_sharded(const Plan& plan, const Model& model, bool stage3_hooks);

// One GPU's peak estimate (microbatch_sizes.hpp): its shards, one microbatch's inputs, the largest layer transient and
// three layers' gathered weights or gradient.
Bytes sharded_estimate_bytes(const Plan& plan, const Model& model);

// The search's candidates of a sharded kind: per activation policy, ascending u; with space.drop_infeasible only the
// plans whose sharded_estimate_bytes fits.
std::vector<Candidate> enumerate_sharded(const Model& model, const SearchSpace& space);

// What one GPU keeps for the whole run: every layer's ceil(1/N) of weights, gradient and AdamW state.
Bytes sharded_state_bytes(const Plan& plan, const Model& model);

}  // namespace harmony::core
