// harmony-run's shared pieces (apps/run/*.cpp, apps/harmony_run.cpp): the command line's options, the run's
// setup (config, model, devices), the plan that runs and the functions the command files share. Internal to
// harmony-run: nothing outside apps/ includes it.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include "backend/executor/executor.hpp"
#include "backend/host_memory.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/profiler.hpp"
#include "backend/registry.hpp"
#include "backend/tokens.hpp"
#include "backend/train_checkpoint.hpp"
#include "core/base/atomic_file.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/profile.hpp"
#include "core/output/report.hpp"
#include "core/output/trace.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::run {

constexpr int kExitBadInput = 2;

constexpr int kExitInternal = 70;  // EX_SOFTWARE: a bug in harmony (core::InternalError), never bad input

// A non-finite loss or gradient stopped training (docs/backend.md): not 1 (a crash, a failed write), 2 (input
// refused before anything ran), 70 (a bug) or 128 + n (a signal), so a job script can tell "the numbers diverged:
// change the hyperparameters" from those; the first small code no tool here or the shell gives another meaning.
constexpr int kExitNonFinite = 3;

// A host allocation that failed (std::bad_alloc) in spite of the pre-flight (check_host_memory): what was being
// allocated, reported with exit 2 like the pre-flight's refusal.
class HostAllocationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// f(), with a std::bad_alloc inside it reported as a HostAllocationError naming `what`.
template <class F>
decltype(auto) allocating(const std::string& what, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
    throw HostAllocationError(what);
  }
}

// Device options from the command line.
struct DeviceFlags {
  bool tf32 = false;       // --tf32 (CUDA): TF32 tensor-core GEMMs
  bool tree_sums = false;  // --tree-sums (CUDA): tree column sums (the default; kept for command lines that name it)
  bool exact = false;      // --exact: strict-order reductions, the CPU device's bits (tree sums and bf16 fast path off)
  bool poison = false;     // --poison: fill fresh device memory with NaN (by default in debug builds only)
  bool no_fuse = false;    // --no-fuse: the unfused kernels (fused ones are the default where the kind has them)
};

struct Cli {
  std::string config;
  std::vector<std::string> sets;
  int steps = 0;
  std::string gpu_memory;
  std::string data;
  std::string plan = "config";
  std::string trace;
  std::string format = "table";
  std::string checkpoint_dir;
  int checkpoint_every = -1;
  bool resume = false;
  std::string save_weights;
  bool quiet = false;
  std::string executor = "auto";  // serial | concurrent | auto (serial on CPU devices, concurrent on CUDA)
  int run_ahead = 1;              // ExecutorOptions::run_ahead
  std::string dtype;              // --dtype: train.dtype (fp32 | bf16)
  bool host_sums = false;         // --host-sums: replica sums on the host (ExecutorOptions::communicator unset)
  DeviceFlags device_flags;
  // profile
  std::string out;
  std::vector<int> ubatch;
  int repeats = 3;
  int rounds = 3;  // ProfileOptions::rounds
};

struct Setup {
  core::TrainConfig cfg;
  std::unique_ptr<backend::Gpt2> model;
  std::unique_ptr<backend::HostState> state;
  backend::TokenFile tokens;
  core::Model desc;                    // exact byte sizes of the model (describe_gpt2), the Program's memory account
  std::optional<core::Model> profile;  // model.profile, read and checked against the model before any work
  DeviceFlags device_flags;
};

// What runs: the plan (for a baseline: gpus, minibatch and its microbatch), its kind, title and Program.
struct Chosen {
  core::Plan plan;  // its kind: plan.kind
  std::string title;
  core::Program program;
  std::optional<core::Model> priced;  // --plan auto: the model it was priced on (reused for the prediction)
};

// harmony-sim's prediction (native cost model) of the run's Program on the config's machine, priced on the
// model --plan auto searched on, else on a profile (model.profile, or measured now at the Program's microbatch
// sizes only). nullopt with the reason when it cannot be made (the profile lacks a size, a profile step ran out of
// memory): a missing prediction never fails a finished run.
struct Prediction {
  std::optional<double> step_s;
  std::string why_not;
};

// ---- apps/run/setup.cpp ----

double mib(core::Bytes b);

// A device capacity as the tables print it ("1.00 MiB", "10 B"): never "0.00 MiB" for a handful of bytes.
std::string capacity_text(core::Bytes b);

double gib(core::Bytes b);

// train.dtype (validated by the config loader).
backend::DType run_dtype(const core::TrainConfig& cfg);

// The registry's kind of the config's `device:` (a located error naming the registered kinds when unknown).
const backend::DeviceKind& device_kind(const core::TrainConfig& cfg);

Setup make_setup(const Cli& cli);

// model.profile for `train` (the profile --plan auto searches on and the prediction is priced on), read and checked
// against the model before any work: a missing or mismatched one is refused before step 1, not after the run.
// (`profile` does not read it: a config may name the profile that command is about to write.)
void load_run_profile(Setup& s);

// The first element of a loaded model state that is a NaN or an infinity, named: "h.3.attn.c_attn.weight holds NaN at
// element 17"; nullopt when every weight (and, with `moments`, every AdamW moment) is finite. A model that holds one
// can only train to NaN: it is refused at load, naming the tensor, rather than after a step.
std::optional<std::string> nonfinite_tensor(const backend::HostState& st, bool moments);

// The host-side model (weights, gradients, AdamW state), allocated only after check_host_memory: fresh from
// init_seed or loaded from model.weights (refused when a weight is not finite).
void init_state(Setup& s);

// What to do about the host limit that binds (backend::probe_host_memory's tightest).
std::string host_limit_hint(const backend::HostMemoryLimit* limit);

// Host memory up front, before anything large is allocated: `h` (sim::host_account of the run's Program on the
// model's exact sizes: master weights, gradients, optimizer state, stashes and activations swapped to the host, P2P
// staging; or sim::host_state, the model state harmony-run keeps on the host whatever the plan, before a plan is
// chosen) plus, on CPU devices, the `devices`
// arenas (host memory too) against what this process may still allocate: the tightest of MemAvailable, its
// RLIMIT_AS / RLIMIT_DATA and its cgroup's memory limit (backend::probe_host_memory). A run that cannot fit is
// refused, not killed later.
void check_host_memory(const Setup& s, const sim::HostAccount& h, int devices);

// Before a plan is chosen (--plan auto profiles and trial-steps scratch copies of the model; `profile` measures
// one): the model state init_state allocates on the host for every kind (a kind with resident state, whose
// sim::host_floor is empty, copies it to its devices and back), on `devices` devices.
void check_host_state(const Setup& s, int devices);

// Device g of the config's kind (the registry's), capped at machine.gpu_memory, with the command line's --tf32,
// --exact and --poison; `timing`: never poisoned (the profiler's timings). The fast reductions are the default
// wherever the kind has them (DeviceCaps::tree_sums: tree column sums, the bf16 fast path); --exact keeps the
// strict row order, the CPU device's bits (docs/backend.md, "Fast and exact reductions").
std::unique_ptr<backend::Device> make_device(const core::TrainConfig& cfg, const DeviceFlags& f, int g, bool timing);

std::vector<std::unique_ptr<backend::Device>> make_devices(const core::TrainConfig& cfg, const DeviceFlags& f, int n);

// The communicator the executor sums replicas' gradients with on the devices (ExecutorOptions::communicator):
// over `devs` in rank order, of the devices' kind; nullptr with --host-sums (the host path) or one device (no
// replicas, or a device kind without collectives: the executor then sums on the host). The caller keeps it alive as
// long as the executor, and destroys it before the devices.
std::unique_ptr<backend::Communicator> make_communicator(const core::TrainConfig& cfg, const Cli& cli,
                                                         const std::vector<backend::Device*>& devs);

// The devices as the executor takes them (the caller keeps `owned`).
std::vector<backend::Device*> raw_devices(const std::vector<std::unique_ptr<backend::Device>>& owned);

// A profile of the run's model: model.profile when given, else measured now on a device like the run's at the
// microbatch sizes given (what the run's Program uses, or every size for --plan auto; warm-up 1, one timed repeat).
core::Model measured_profile(const Setup& s, const std::vector<int>& sizes, bool quiet);

// The model harmony-sim prices the run's Programs on: the profile's times with the run's exact byte sizes (s.desc,
// which the executed Program is lowered from), so the search's memory ledger is the Program the executor runs
// and not the profiler's per-layer peaks (which count a layer's weights in its forward too).
core::Model priced_model(const Setup& s, core::Model prof);

core::LowerOptions lower_options(const core::TrainConfig& cfg);

backend::AdamWConfig adamw_config(const core::TrainConfig& cfg);

backend::ExecutorOptions executor_options(const Cli& cli, const core::TrainConfig& cfg,
                                          backend::Communicator* communicator = nullptr);

backend::CheckpointMeta checkpoint_meta(const Setup& s, const Chosen& chosen);

// One progress line: "step 12/100 [#####.....] loss 4.1234 | 45.1 samples/s | ETA 00:35".
void progress(int step, int steps, double loss, double samples_per_s, double eta_s, bool tty);

// ---- apps/run/plan.cpp ----

Chosen choose(const Setup& s, const Cli& cli, bool quiet);

// `serial`: the run used the serial executor (one op at a time), so the prediction runs the ops one at a time
// too (sim::NativeOptions::serial); with concurrent queues, the default engine.
Prediction predict(const Setup& s, const Chosen& c, bool serial, bool quiet);

// (measured - predicted) / predicted: + means the run was slower than predicted; NaN: no prediction.
double prediction_error(const Prediction& predicted, double measured_step_s);

// ---- apps/run/train.cpp ----

int cmd_train(const Cli& cli);

// ---- apps/run/profile.cpp ----

int cmd_profile(const Cli& cli);

}  // namespace harmony::run
