// The paper's layer-packing heuristics (layer_packing.py): each turns per-layer memory and time at
// one microbatch size into contiguous packs that fit a GPU capacity, or reports that none exist.
// One function per method, registered in one table by name; find_packs_upto widens the balanced
// methods to more pack counts than the memory minimum (the native search's default).
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

// Beyond the paper (search.pack_counts: wide): the method's packing above first, then, for the
// methods with a pack-count loop (balanced, balanced_addx, balanced_time), every further feasible
// pack count S up to `max_packs`, in increasing S, each split and tested exactly as the method does
// (an S whose split has an empty pack or does not fit is skipped). Methods without a pack count
// (greedy*, reuse) give their one packing. Empty when the method finds none. Same errors as find_packs.
std::vector<Packs> find_packs_upto(const Model& model, Phase phase, const std::string& method, int u, int num_layers,
                                   Bytes capacity_bytes, int max_packs, const Packs* reuse_from = nullptr);

}  // namespace harmony::core
