// The paper's layer-packing heuristics (layer_packing.py): each turns per-layer memory and time at
// one microbatch size into contiguous packs that fit a GPU capacity, or reports that none exist.
// One function per method, registered in one table by name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"

namespace harmony::core {

// Names, in the paper's spelling: greedy, greedy_addx, greedy_reverse, greedy_reverse_addx,
// balanced, balanced_addx, balanced_time, reuse (forward only).
const std::vector<std::string>& packing_method_names();
bool is_packing_method(const std::string& name);

// Packs layers [0, num_layers) for `phase` at microbatch `u` against `capacity_bytes`.
// `reuse_from` is pack_bwd[:-1], used by the `reuse` method (forward only).
// Returns nullopt when the method finds no feasible packing. Throws ScheduleError for an unknown
// method or `reuse` without `reuse_from`.
std::optional<Packs> find_packs(const Model& model, Phase phase, const std::string& method, int u, int num_layers,
                                Bytes capacity_bytes, const Packs* reuse_from = nullptr);

}  // namespace harmony::core
