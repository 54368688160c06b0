// What the fully sharded kinds share (fsdp.cpp): fsdp's Program and its memory estimate; zero3 (zero3.cpp) is the same
// Program with DeepSpeed stage 3's hook work on its forwards and backwards.
#pragma once

#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

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
