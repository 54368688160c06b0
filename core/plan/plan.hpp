// A Plan is one point of the configuration space a search explores, for every plan kind: the kind (core/kinds/),
// the number of GPUs, the minibatch, the microbatch sizes, Harmony's layer packs or pp-swap's stages, and the
// kind's knobs. Harmony-PP is the paper's vPP (packs round-robin over GPUs), Harmony-DP its vDP (replicas).
#pragma once

#include <string>
#include <vector>

#include "core/plan/knobs.hpp"
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
  PlanKind kind;  // the registry's entry (default: its first, harmony-pp)
  int gpus = 1;
  int minibatch = 1;  // D, samples per iteration (global)
  // Kinds with packs: the forward packs' and the backward packs' microbatch sizes. The others run one size, u_bwd
  // (their lowering records u_fwd = u_bwd in the Program's plan).
  int u_fwd = 1;
  int u_bwd = 1;
  // Kinds with packs: packs_fwd covers layers 0 .. packs_bwd.back().first - 1 (empty if one backward pack),
  // packs_bwd covers layers 0 .. R-1. Other kinds ignore them; their Programs record what they ran here (pp-swap its
  // stages, the others one pack of every layer).
  Packs packs_fwd;
  Packs packs_bwd;
  // Kinds with one stage per GPU (pp-swap): one contiguous layer range per GPU, ascending, covering every layer;
  // empty: balanced_stages at u. Ignored by the other kinds.
  std::vector<LayerRange> stages;
  KindKnobs knobs;  // the kind's knobs (activation policy, offload tier, ...); kinds ignore the ones they do not list
};

// The paper's manual packing: backward packs of `pack_size` layers counted from the end (the first
// pack takes the remainder), forward packs = all backward packs but the last.
void manual_packs(int num_layers, int pack_size, Packs& packs_fwd, Packs& packs_bwd);

// Throws ScheduleError if the kind has no packs, the packs skip or overlap layers, are not ascending, or the
// forward packs do not cover exactly the layers before the last backward pack; or sizes are not positive.
void validate_packs(const Plan& plan, int num_layers);

// "[[0-6], [7-13]]"
std::string packs_to_string(const Packs& packs);

// The one-line title of a plan. Kinds with packs: "harmony-pp N4 D32 u 2/4 fwd [[0-6]] bwd [[0-6], [7-13]]";
// the others their one microbatch and activation policy: "dp-swap N4 D32 u 8 (checkpoint)".
std::string plan_title(const Plan& p);

// The layout part of a plan for tables: "fwd [[0-6]] bwd [[0-6], [7-13]]" (kinds with packs) or "u 8".
std::string plan_layout(const Plan& p);

// The microbatch sizes of a plan as messages name a candidate: "u 2/4" (kinds with packs) or "u 8".
std::string microbatch_label(const Plan& p);

// split_minibatchsize(D, U) = [U]*(D//U) (+ [D%U] if non-zero)
std::vector<int> split_minibatch(int samples, int ubatch);

// Each GPU's share of the minibatch under `kind`: data-parallel kinds split D over the N GPUs as the reference
// does, DD_n = D // N (+1 if n < D % N); the others (harmony-pp, pp-swap) run all D samples through every stage:
// one share of D.
std::vector<int> minibatch_shares(PlanKind kind, int minibatch, int gpus);

}  // namespace harmony::core
