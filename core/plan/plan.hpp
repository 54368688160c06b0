// A Plan is one point of the configuration space the search explores: the plan kind (a Harmony mode),
// the number of GPUs, the minibatch, the forward/backward microbatch sizes and layer packs.
// Harmony-PP is the paper's vPP (packs round-robin over GPUs), Harmony-DP its vDP (replicas).
#pragma once

#include <string>
#include <vector>

#include "core/plan/plan_kind.hpp"

namespace harmony::core {

struct LayerRange {
  int first = 0;
  int last = 0;  // inclusive
  int size() const { return last - first + 1; }
  bool operator==(const LayerRange&) const = default;
};

using Packs = std::vector<LayerRange>;

// The config's `options:` section: how a plan is lowered.
struct Options {
  bool prefetch = false;              // the paper's --prefetch_offload dependency model
  int prefetch_buffers = 2;           // with prefetch: input buffers per stream (2 = the paper's double buffer)
  bool unequal_microbatches = false;  // allow D % u != 0 (paper's --inequal_ubatchsize; runtime unsupported)
};

struct Plan {
  // HarmonyPP or HarmonyDP (validate_plan rejects the rest). A baseline's Program carries its own kind
  // here too (core::lower_baseline), with the fields below describing its microbatches and stages.
  PlanKind kind = PlanKind::HarmonyPP;
  int gpus = 1;
  int minibatch = 1;  // D, samples per iteration (global)
  int u_fwd = 1;
  int u_bwd = 1;
  Packs packs_fwd;  // cover layers 0 .. packs_bwd.back().first - 1 (empty if one backward pack)
  Packs packs_bwd;  // cover layers 0 .. R-1
};

// The paper's manual packing: backward packs of `pack_size` layers counted from the end (the first
// pack takes the remainder), forward packs = all backward packs but the last.
void manual_packs(int num_layers, int pack_size, Packs& packs_fwd, Packs& packs_bwd);

// Throws ScheduleError if the kind is not a Harmony mode (harmony-pp, harmony-dp), the packs skip or overlap
// layers, are not ascending, or the forward packs do not cover exactly the layers before the last backward
// pack; or sizes are not positive.
void validate_plan(const Plan& plan, int num_layers);

// "[[0-6], [7-13]]"
std::string packs_to_string(const Packs& packs);

// The one-line title of a Harmony plan: "harmony-pp N4 D32 u 2/4 fwd [[0-6]] bwd [[0-6], [7-13]]".
std::string plan_title(const Plan& p);

// split_minibatchsize(D, U) = [U]*(D//U) (+ [D%U] if non-zero)
std::vector<int> split_minibatch(int samples, int ubatch);

// Each GPU's share of the minibatch under `kind`: data-parallel kinds split D over the N GPUs as the reference
// does, DD_n = D // N (+1 if n < D % N); the others (harmony-pp, pp-swap) run all D samples through every stage:
// one share of D.
std::vector<int> minibatch_shares(PlanKind kind, int minibatch, int gpus);

}  // namespace harmony::core
