// What the fully sharded kinds share (fsdp.cpp): fsdp's Program and its memory estimate; zero3 (zero3.cpp) is the same
// Program with DeepSpeed stage 3's hook work on its forwards and backwards.
#pragma once

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"

namespace harmony::core {

// fsdp's Program (fsdp.cpp describes it); with stage3_hooks, every FWD and BWD of a layer with parameters also carries
// plan.knobs.zero3's hook work (zero3_hooks.hpp, the optimizer on the GPUs).
Program lower_sharded(const Plan& plan, const Model& model, bool stage3_hooks);

// One GPU's peak estimate (microbatch_sizes.hpp): its shards, one microbatch's inputs, the largest layer transient and
// three layers' gathered weights or gradient.
Bytes sharded_estimate_bytes(const Plan& plan, const Model& model);

}  // namespace harmony::core
