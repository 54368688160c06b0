// The paper's task graph (task_graph_composor.py): FWD/BWD/UPD tasks over layer packs, their
// placement on GPUs (round-robin for Harmony-PP, replicated for Harmony-DP), the channels between
// them (P2P, swap, CPU message, JIT weight pin) and the microbatch lists of every GPU.
#pragma once

#include <vector>

#include "core/plan/plan.hpp"

namespace harmony::core {

enum class TaskType { Fwd, Bwd, Upd };
// How a tensor travels between two tasks (the reference's Medium).
enum class Medium { None, Data, SharedCpu, LocalCpu, P2P, Msg, Swap, Pin };

const char* task_type_name(TaskType t);  // "FWD" / "BWD" / "UPD"
const char* medium_name(Medium m);       // "DAT", "SHM", "LOC", "P2P", "MSG", "SWP", "PIN", "-"

struct Channel {
  Medium medium = Medium::None;
  int peer_task = -1;  // the task on the other end (P2P, MSG, SWP, PIN)
};

struct Stash {
  int layer = 0;     // the stashed X is the input of this layer (a backward pack starts here)
  int bwd_task = 0;  // the backward task that consumes it
};

struct Task {
  int idx = 0;
  TaskType type = TaskType::Fwd;
  LayerRange layers;
  int rank = 0;                   // GPU (FWD/BWD) or the CPU of that GPU's process (UPD)
  std::vector<int> ubatch_sizes;  // empty for UPD
  bool has_data = false;          // contains layer 0
  bool has_criterion = false;     // contains the loss layer R-1
  bool is_last_fwd = false;
  Channel in_x;                // X[first]: FWD and BWD (stashed X for non-criterion BWD)
  Channel out_y;               // FWD: Y[last]
  std::vector<Stash> stashes;  // FWD: stashed inputs, ascending by layer
  Channel in_dy;               // BWD (non-criterion): dY[last]
  Channel out_dx;              // BWD (unless has_data): dX[first]
  int w_pinned_to = -1;        // FWD: W/B stay on the GPU for this BWD task (JIT pin)
  int w_pinned_from = -1;      // BWD: W/B already resident from this FWD task
  int updates_task = -1;       // UPD: the BWD task whose gradients it applies
};

struct TaskGraph {
  Plan plan;
  int num_layers = 0;
  bool last_fwd_msg = false;  // Harmony-PP, N > 1, u_fwd != u_bwd: last FWD's Y goes through the CPU
  int loss_rank = 0;
  std::vector<Task> tasks;                   // global order (idx)
  std::vector<std::vector<int>> rank_tasks;  // per rank: task indices in idx order
  std::vector<std::vector<int>> ubatch_fwd;  // per rank (Harmony-PP: the same list on every rank)
  std::vector<std::vector<int>> ubatch_bwd;

  int non_empty_ranks() const;
  // Index of the sub-pack (FWD tasks are split at their stash layers) that starts at `layer`.
  int subpack_of_stash(const Task& fwd, int layer) const;
  int num_subpacks(const Task& t) const;  // 1 for BWD/UPD
};

// Builds the task graph of a validated plan (validate_packs first).
TaskGraph compose_task_graph(const Plan& plan, int num_layers);

// The reference's UBSConverter: which backward microbatches each forward microbatch yields.
struct UbatchConverter {
  std::vector<std::vector<int>> bwd_idx;    // per FWD microbatch: BWD microbatch indices it completes
  std::vector<std::vector<int>> bwd_sizes;  // and their sizes
  std::vector<int> fwd_of_bwd;              // per BWD microbatch: the FWD microbatch that completes it
};
UbatchConverter make_ubatch_converter(const std::vector<int>& fwd, const std::vector<int>& bwd, int u_bwd);

}  // namespace harmony::core
