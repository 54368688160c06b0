// The YAML configuration of harmony-sim: model source, machine, cost model, a plan (simulate) or a
// search space (search), and options. Keys are strict (unknown keys are errors with a suggestion);
// every error names file:line:column. `--set a.b=value` overrides are applied before validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/cost_model_kind.hpp"
#include "core/base/error.hpp"
#include "core/machine/machine.hpp"
#include "core/model/analytic.hpp"
#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

// `model:` names a measured profile or describes a model the analytic formulas cost (core/model/analytic.hpp).
struct ModelSpec {
  std::string profile_path;              // resolved: relative paths are taken from the config file's folder
  std::optional<AnalyticSpec> analytic;  // set for `analytic:` (then profile_path is empty)
  // Whether `analytic:` named its dtype. If not, load_model picks mixed precision (bf16) on a machine whose
  // gpu_rates have a tensor-core rate above the FP32 one, else fp32 (docs/config.md, "model").
  bool analytic_dtype_given = false;
  SourceLoc loc;                 // where `profile:` or `analytic:` was written, for errors about it
  SourceLoc master_weights_loc;  // where `master_weights` was written (load_model's check against the dtype)
  SourceLoc autocast_loc;        // where `autocast` was written (load_model's checks against dtype, master_weights)
  SourceLoc trainer_loc;         // where `trainer` was written (load_model's check against the machine's gemm_ceiling)
  SourceLoc tf32_loc;            // where `tf32` was written (load_model's checks of the dtype and matrix_tf32)
};

// The plan section. mode/gpus/minibatch are needed by every command; the rest by the commands that run one plan.
struct PlanSpec {
  PlanKind kind;  // plan.mode: any registered kind (core/plan/plan_kind.hpp)
  int gpus = 1;
  int minibatch = 1;
  std::optional<int> u_fwd;
  std::optional<int> u_bwd;
  std::optional<int> pack_size;    // manual packing: packs of P layers counted from the end
  std::optional<Packs> packs_fwd;  // explicit packs (inclusive [first, last])
  std::optional<Packs> packs_bwd;
  // The kind's knobs (plan.activations, plan.offload, plan.zero3: each for the kinds that list it), else defaults.
  KindKnobs knobs;
  SourceLoc loc;       // the `plan:` mapping, for plan-level errors
  SourceLoc mode_loc;  // the plan.mode value (or the `plan:` mapping where none was written)
};

struct RunConfig {
  std::string file;  // the YAML it was read from
  ModelSpec model;
  MachineSpec machine;
  CostModelKind cost_model = CostModelKind::Reference;
  PlanSpec plan;
  SearchSpec search;
  Options options;
  // Every file the config was built from, in the order first read: the config file (load_config only), machine
  // files (and those they name), then the profile `model:` names (read by load_model). Sweeps hash their bytes.
  std::vector<std::string> inputs;
};

// ---- harmony-run: the same model/machine/plan/options/search keys, plus what training needs ----

// The shape of a fresh decoder: model.gpt2 or model.llama (llama = true; the Llama-only keys below).
struct Gpt2Shape {
  int vocab_size = 0;
  int max_seq_len = 0;  // GPT-2: rows of the position embedding (HF n_positions); Llama: the longest sequence
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  bool llama = false;
  int n_kv_head = 0;          // key/value heads (grouped-query attention), dividing n_head; 0: n_head
  int intermediate_size = 0;  // the SwiGLU MLP's width (required)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;  // lm_head tied to the token embedding
};

struct TrainModelSpec {
  std::optional<Gpt2Shape> gpt2;  // a fresh model of this shape (model.gpt2 or model.llama), initialised from init_seed
  std::string weights_path;       // or Hugging Face GPT-2 weights (a safetensors file or model folder); exactly one
  int n_head = 0;                 // with weights_path: heads, over config.json and the file's metadata; 0: theirs
  int seq_len = 0;                // T, tokens per sequence
  std::string profile_path;       // optional: a measured profile for --plan auto (else measured on the fly)
  std::uint64_t init_seed = 1;
  SourceLoc loc;  // the `model:` key
};

struct DataSpec {
  std::string path;                       // a token file (llm.c uint16); empty: the synthetic task
  std::int64_t synthetic_tokens = 65536;  // length of the synthetic token stream
  std::uint64_t seed = 1;                 // the synthetic stream's seed
  SourceLoc loc;
};

struct TrainSpec {
  int steps = 0;
  DataSpec data;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // Device storage: "fp32" (the default) or "bf16" (mixed precision: bf16 weights, activations and gradients on
  // the devices, fp32 master weights and AdamW on the host; docs/backend.md).
  std::string dtype = "fp32";
};

struct CheckpointSpec {
  std::string dir;  // empty: no checkpoints
  int every = 0;    // steps between checkpoints (0: only at the end and on SIGINT)
  int keep = 2;     // newest checkpoints kept
};

struct TrainConfig {
  std::string file;
  TrainModelSpec model;
  MachineSpec machine;  // machine.gpu_memory is each device's capacity
  // A device kind's name ("cpu", "cuda"), not checked here (core knows no devices): harmony-run checks it against
  // backend's device registry and locates an unknown or unavailable one at device_loc.
  std::string device = "cpu";
  SourceLoc device_loc;  // where `device:` was written (its value; --set device=...), else the file
  CostModelKind cost_model = CostModelKind::Native;  // for --plan auto
  PlanSpec plan;  // plan.mode: any kind, with its knobs; a kind without packs runs microbatch plan.u_bwd
  SearchSpec search;
  Options options;
  TrainSpec train;
  CheckpointSpec checkpoint;
};

// A config key a tool's own flag stands for (harmony-run's `--data my.bin` is train.data): applied after the
// `--set` overrides as one of them, but errors about its value name the flag ("--data my.bin: error: ...").
struct FlagOverride {
  std::string flag;      // as the user typed it: "--data my.bin"
  std::string override;  // "train.data=/abs/my.bin"
};

// harmony-run's config (docs/config.md, "harmony-run"): strict keys and file:line:column errors as above.
// `plan_searched` (harmony-run --plan auto): the search replaces plan.u_fwd and plan.u_bwd, so they are read but
// not checked against the minibatch (a u_fwd that does not divide a new minibatch is what the search replaces).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {},
                              bool plan_searched = false, const std::vector<FlagOverride>& flags = {});
TrainConfig load_train_config_text(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& overrides = {}, bool plan_searched = false);

// Reads `path`, applies `overrides` ("plan.gpus=4", "machine.gpu_memory=8GiB", ...) and validates.
// Throws ConfigError with file:line:column and a hint.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text (tests, fuzzing); `name` is used in messages and to resolve relative paths.
RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// The Plan a PlanSpec fixes for `model`, with its knobs and `gpu_capacity_bytes` (what a swapping kind's decisions
// fit against). A kind with packs needs both microbatch sizes and packs (pack_size or explicit packs), covering the
// model, sizes in its profiled range: ConfigError at the `plan:` section (or `file`), whose message starts with `who`
// ("`simulate`") where a field is missing. Any other kind needs plan.u_bwd (its one microbatch size) and passes its
// kind's validation (PlanKindSpec::validate): ConfigError at `plan:` with `hint` (what to add) otherwise.
Plan plan_from_spec(const PlanSpec& spec, const Model& model, Bytes gpu_capacity_bytes, const std::string& file,
                    std::string_view who, const std::string& hint);
// The model a config names: its profile (core::load_profile), or the analytic model of its shape on `machine`'s
// gpu_rates (ConfigError at the `analytic:` key when the machine has none).
Model load_model(const ModelSpec& spec, const MachineSpec& machine);
// A machine YAML file, or a built-in preset name ("paper-1080ti").
MachineSpec load_machine_file(const std::string& path);
MachineSpec machine_preset(const std::string& name);  // throws ConfigError listing the presets
std::vector<std::string> machine_preset_names();

}  // namespace harmony::core
