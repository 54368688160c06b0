// The YAML configuration of harmony-sim: model source, machine, cost model, a plan (simulate) or a
// search space (search), and options. Keys are strict (unknown keys are errors with a suggestion);
// every error names file:line:column. `--set a.b=value` overrides are applied before validation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/machine.hpp"
#include "core/plan.hpp"

namespace harmony::core {

struct ModelSpec {
  std::string profile_path;  // resolved: relative paths are taken from the config file's folder
  SourceLoc loc;             // where `profile:` was written, for errors about the file
};

// The plan section. mode/gpus/minibatch are needed by both commands; the rest only by simulate.
struct PlanSpec {
  Mode mode = Mode::HarmonyPP;
  int gpus = 1;
  int minibatch = 1;
  std::optional<int> u_fwd;
  std::optional<int> u_bwd;
  std::optional<int> pack_size;    // manual packing: packs of P layers counted from the end
  std::optional<Packs> packs_fwd;  // explicit packs (inclusive [first, last])
  std::optional<Packs> packs_bwd;
  SourceLoc loc;  // the `plan:` mapping, for plan-level errors
};

struct SearchSpec {
  std::vector<std::string> packing_fwd{"greedy_reverse_addx", "balanced_addx", "reuse", "balanced_time"};
  std::vector<std::string> packing_bwd{"greedy_reverse_addx", "balanced_addx", "balanced_time"};
  int top_k = 5;              // -1 keeps every candidate
  int ubatch_step = 1;        // stride of candidate microbatch sizes
  bool smaller_ufwd = false;  // allow u_fwd < u_bwd
  bool fit_rule = false;      // the paper's quirk: a single-pack plan's time / 1000 for ranking
  std::vector<int> u_fwd;     // explicit candidate lists (empty = all valid sizes)
  std::vector<int> u_bwd;
  int threads = 0;  // 0 = all hardware threads
};

struct Options {
  bool prefetch = false;              // the paper's --prefetch_offload dependency model
  int prefetch_buffers = 2;           // with prefetch: input buffers per stream (2 = the paper's double buffer)
  bool unequal_microbatches = false;  // allow D % u != 0 (paper's --inequal_ubatchsize; runtime unsupported)
};

struct RunConfig {
  std::string file;  // the YAML it was read from
  ModelSpec model;
  MachineSpec machine;
  std::string cost_model = "reference";
  PlanSpec plan;
  SearchSpec search;
  Options options;
};

// Reads `path`, applies `overrides` ("plan.gpus=4", "machine.gpu_memory=8GiB", ...) and validates.
// Throws ConfigError with file:line:column and a hint.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text (tests, fuzzing); `name` is used in messages and to resolve relative paths.
RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// A machine YAML file, or a built-in preset name ("paper-1080ti").
MachineSpec load_machine_file(const std::string& path);
MachineSpec machine_preset(const std::string& name);  // throws ConfigError listing the presets
std::vector<std::string> machine_preset_names();

}  // namespace harmony::core
