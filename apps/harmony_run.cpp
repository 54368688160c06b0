// harmony-run: the command line of real training. `train` runs a Harmony Program with real tensors on capped
// devices (the CPU device today), with progress, traces, JSON output and checkpoints; `profile` measures a
// model on a device into a profile harmony-sim reads; `probe` measures the host's rates into a machine file
// (harmony_run_probe.cpp). The composition root: the only file that sees core/,
// sim/ (the search behind --plan auto) and backend/ together; it prints and picks exit codes (2: bad input).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/harmony_run_probe.hpp"
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
#include "sim/compare.hpp"
#include "sim/cost_native.hpp"
#include "sim/evaluate.hpp"
#include "sim/native_engine.hpp"

using namespace harmony;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 70;  // EX_SOFTWARE: a bug in harmony (core::InternalError), never bad input
constexpr int kExitFailure = 1;    // a failed write to stdout
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

// Integer flag ranges with finite bounds: CLI11's PositiveNumber prints DBL_MAX's 309 digits.
const CLI::Range kPositiveInt(1, std::numeric_limits<int>::max());
const CLI::Range kNonNegativeInt(0, std::numeric_limits<int>::max());

// SIGINT, SIGTERM and SIGHUP during training: finish the step, save a checkpoint, exit 128 + the signal's
// number (130, 143, 129). The first one puts all three back to their default action, so a second signal (of
// any of the three) ends the process at once.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int signo) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (const int s : kStopSignals) sigaction(s, &dfl, nullptr);  // async-signal-safe
  // Two signals can reach two threads' handlers at once (the mask only blocks within one thread): the one
  // that is not first re-raises with the default action, which ends the process when its handler returns.
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, signo)) raise(signo);
}

const char* signal_name(int signo) {
  return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (const int s : kStopSignals) sigaddset(&sa.sa_mask, s);  // one handler at a time
  sa.sa_flags = SA_RESTART;
  // A signal ignored when the run started stays ignored (nohup's SIGHUP), as harmony-sim's sweep does.
  for (const int s : kStopSignals) {
    struct sigaction previous {};
    if (sigaction(s, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    sigaction(s, &sa, nullptr);
  }
}

// Device options from the command line.
struct DeviceFlags {
  bool tf32 = false;       // --tf32 (CUDA): TF32 tensor-core GEMMs
  bool tree_sums = false;  // --tree-sums (CUDA): tree column sums for bias and LayerNorm gradients
  bool poison = false;     // --poison: fill fresh device memory with NaN (by default in debug builds only)
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
};

double mib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kMiB); }

// A device capacity as the tables print it ("1.00 MiB", "10 B"): never "0.00 MiB" for a handful of bytes.
std::string capacity_text(core::Bytes b) { return core::format_bytes(b); }

std::string absolute(const std::string& path) { return std::filesystem::absolute(path).lexically_normal().string(); }

// CLI flags are config overrides, applied after the --set ones; paths given on the command line are relative to the
// working directory. Errors about their values name the flag ("--data my.bin: error: ..."), not a --set.
std::vector<core::FlagOverride> flag_overrides(const Cli& cli) {
  std::vector<core::FlagOverride> flags;
  const auto add = [&](const std::string& flag, const std::string& typed, const std::string& key,
                       const std::string& value) {
    flags.push_back({flag + " " + typed, key + "=" + value});
  };
  if (cli.steps > 0) add("--steps", std::to_string(cli.steps), "train.steps", std::to_string(cli.steps));
  if (!cli.gpu_memory.empty()) add("--gpu-memory", cli.gpu_memory, "machine.gpu_memory", cli.gpu_memory);
  // paths as YAML single-quoted scalars: taken literally, whatever characters they hold
  const auto quoted = [](const std::string& path) {
    std::string q = "'";
    for (const char c : path) q += c == '\'' ? std::string("''") : std::string(1, c);
    return q + "'";
  };
  if (!cli.data.empty()) add("--data", cli.data, "train.data", quoted(absolute(cli.data)));
  if (!cli.checkpoint_dir.empty())
    add("--checkpoint-dir", cli.checkpoint_dir, "checkpoint.dir", quoted(absolute(cli.checkpoint_dir)));
  if (cli.checkpoint_every >= 0)
    add("--checkpoint-every", std::to_string(cli.checkpoint_every), "checkpoint.every",
        std::to_string(cli.checkpoint_every));
  if (!cli.dtype.empty()) add("--dtype", cli.dtype, "train.dtype", cli.dtype);
  return flags;
}

struct Setup {
  core::TrainConfig cfg;
  std::unique_ptr<backend::Gpt2> model;
  std::unique_ptr<backend::HostState> state;
  backend::TokenFile tokens;
  core::Model desc;                    // exact byte sizes of the model (describe_gpt2), the Program's memory account
  std::optional<core::Model> profile;  // model.profile, read and checked against the model before any work
  DeviceFlags device_flags;
};

// train.dtype (validated by the config loader).
backend::DType run_dtype(const core::TrainConfig& cfg) {
  return backend::parse_dtype(cfg.train.dtype).value_or(backend::DType::F32);
}

backend::Gpt2Config gpt2_config(const core::TrainConfig& cfg) {
  if (cfg.model.gpt2) {
    const auto& g = *cfg.model.gpt2;
    backend::Gpt2Config c{.vocab_size = g.vocab_size,
                          .max_seq_len = g.max_seq_len,
                          .n_layer = g.n_layer,
                          .n_head = g.n_head,
                          .n_embd = g.n_embd};
    if (g.llama) {
      c.arch = backend::Arch::Llama;
      c.ln_eps = static_cast<float>(g.rms_norm_eps);
      c.n_kv_head = g.n_kv_head;
      c.intermediate_size = g.intermediate_size;
      c.rope_theta = static_cast<float>(g.rope_theta);
      c.tie_embeddings = g.tie_embeddings;
    }
    return c;
  }
  return backend::gpt2_config_at(cfg.model.weights_path, cfg.model.n_head);
}

// The registry's kind of the config's `device:` (a located error naming the registered kinds when unknown).
const backend::DeviceKind& device_kind(const core::TrainConfig& cfg) {
  return backend::device_kind_at(cfg.device, cfg.device_loc);
}

// The config's device against the registry, before anything is read or allocated: a registered kind, the command
// line's device flags and train.dtype among its capabilities, and available here (a module kind is loaded now, and
// only for a config that names it).
void check_device(const core::TrainConfig& cfg, const DeviceFlags& f) {
  const backend::DeviceKind& kind = device_kind(cfg);
  const struct {
    bool on;
    const char* flag;
    bool backend::DeviceCaps::*cap;
  } flags[] = {{f.tf32, "--tf32", &backend::DeviceCaps::tf32},
               {f.tree_sums, "--tree-sums", &backend::DeviceCaps::tree_sums}};
  for (const auto& x : flags) {
    if (!x.on || kind.caps().*x.cap) continue;
    const std::vector<std::string> with = backend::device_kinds_with(x.cap);
    throw core::ConfigError(cfg.device_loc,
                            fmt::format("{} applies to device: {} only; this run's device is {}", x.flag,
                                        fmt::join(with, ", "), kind.name()),
                            fmt::format("drop the flag{}", with.empty() ? "" : ", or use --set device=" + with[0]));
  }
  if (run_dtype(cfg) == backend::DType::BF16 && !kind.caps().bf16_kernels)
    throw core::ConfigError(
        cfg.device_loc, fmt::format("train.dtype bf16: device {} has no bf16 kernels", kind.name()),
        fmt::format("use dtype fp32, or a device with bf16 kernels ({})",
                    fmt::join(backend::device_kinds_with(&backend::DeviceCaps::bf16_kernels), ", ")));
  backend::require_available(kind, cfg.device_loc);
}

Setup make_setup(const Cli& cli) {
  Setup s;
  s.cfg = core::load_train_config(cli.config, cli.sets, cli.plan == "auto", flag_overrides(cli));
  // A valid size without a unit is bytes: on the command line that is a slip (--gpu-memory 10 for 10 GiB), refused
  // once the loader has checked the value's range.
  if (const std::string& v = cli.gpu_memory;
      !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw core::ConfigError(core::SourceLoc{"--gpu-memory " + v, 0, 0},
                            fmt::format("a device's memory needs a unit: a bare {} would be {} bytes", v, v),
                            fmt::format("write --gpu-memory {}GiB, {}MiB or {}KiB (or {}B for bytes)", v, v, v, v));
  s.device_flags = cli.device_flags;
  const auto& cfg = s.cfg;
  check_device(cfg, cli.device_flags);
  const backend::Gpt2Config gc = gpt2_config(cfg);
  if (gc.arch == backend::Arch::Llama) {
    const backend::DeviceKind& kind = device_kind(cfg);
    if (!kind.caps().llama_kernels)
      throw core::ConfigError(
          cfg.device_loc,
          fmt::format("device {} has no kernels for the Llama family (RMSNorm, rotary embeddings, SwiGLU) yet",
                      kind.name()),
          fmt::format("train this model with device: {}",
                      fmt::join(backend::device_kinds_with(&backend::DeviceCaps::llama_kernels), ", ")));
    if (!cfg.checkpoint.dir.empty())
      throw core::ConfigError(cfg.model.loc,
                              "checkpoints (checkpoint.dir) record GPT-2 models only; a Llama model cannot be "
                              "checkpointed yet",
                              "drop checkpoint.dir (and --checkpoint-dir); save the weights with --save-weights");
  }
  if (cfg.model.seq_len > gc.max_seq_len)
    throw core::ConfigError(
        cfg.model.loc,
        fmt::format("model.seq_len = {} exceeds the model's {} positions", cfg.model.seq_len, gc.max_seq_len),
        "use a shorter seq_len");
  if (gc.sliding_window > 0 && cfg.model.seq_len > gc.sliding_window)
    throw core::ConfigError(cfg.model.loc,
                            fmt::format("model.seq_len = {} exceeds the model's sliding_window {} (config.json), which "
                                        "harmony-run does not model: every token attends to every earlier one",
                                        cfg.model.seq_len, gc.sliding_window),
                            fmt::format("use a seq_len of at most {}", gc.sliding_window));
  s.model = std::make_unique<backend::Gpt2>(gc);
  // read before the plan is known (the pre-flight checks come later): a failure names the data
  s.tokens = allocating(
      cfg.train.data.path.empty()
          ? fmt::format("the synthetic token data ({} tokens)", cfg.train.data.synthetic_tokens)
          : fmt::format("the token file {} (its bytes, then as many 2-byte tokens)", cfg.train.data.path),
      [&] {
        return cfg.train.data.path.empty()
                   ? backend::TokenFile::synthetic(gc.vocab_size, cfg.train.data.synthetic_tokens, cfg.train.data.seed)
                   : backend::TokenFile::load(cfg.train.data.path);
      });
  if (s.tokens.max_token() >= gc.vocab_size)
    throw core::ConfigError(cfg.train.data.loc,
                            fmt::format("token file {} holds token id {}, outside the model's vocabulary of {}",
                                        s.tokens.name(), s.tokens.max_token(), gc.vocab_size),
                            "use a token file made with this model's tokenizer, or a larger vocab_size");
  const int B = cfg.plan.minibatch, T = cfg.model.seq_len;
  if (s.tokens.size() < std::int64_t(B) * T + 1)
    throw core::ConfigError(cfg.train.data.loc,
                            fmt::format("{} has {} tokens; one minibatch of {} x {} needs {}", s.tokens.name(),
                                        s.tokens.size(), B, T, std::int64_t(B) * T + 1),
                            "use more data, or a smaller plan.minibatch or model.seq_len");
  std::vector<int> sizes(static_cast<std::size_t>(B));
  for (int u = 1; u <= B; ++u) sizes[static_cast<std::size_t>(u - 1)] = u;
  s.desc = backend::describe_gpt2(*s.model, T, sizes, {.dtype = run_dtype(cfg)});
  s.desc.name = fmt::format("{} L{} C{} H{} V{} T{}", backend::arch_name(gc.arch), gc.n_layer, gc.n_embd, gc.n_head,
                            gc.vocab_size, T);
  return s;
}

// model.profile for `train` (the profile --plan auto searches on and the prediction is priced on), read and checked
// against the model before any work: a missing or mismatched one is refused before step 1, not after the run.
// (`profile` does not read it: a config may name the profile that command is about to write.)
void load_run_profile(Setup& s) {
  const auto& cfg = s.cfg;
  if (!cfg.model.profile_path.empty()) {
    core::Model m = core::load_profile(cfg.model.profile_path);
    if (m.num_layers() != s.model->num_layers())
      throw core::ConfigError(cfg.model.loc,
                              fmt::format("profile {} has {} layers, the model {}", cfg.model.profile_path,
                                          m.num_layers(), s.model->num_layers()),
                              "profile this model with `harmony-run profile`, or drop model.profile");
    if (m.dtype != cfg.train.dtype)
      throw core::ConfigError(
          cfg.model.loc,
          fmt::format("profile {} was measured in {}, the run trains in {} (train.dtype)", cfg.model.profile_path,
                      m.dtype, cfg.train.dtype),
          fmt::format("profile with `harmony-run profile --dtype {}`, or drop model.profile", cfg.train.dtype));
    s.profile = std::move(m);
  }
}

// The first element of a loaded model state that is a NaN or an infinity, named: "h.3.attn.c_attn.weight holds NaN at
// element 17"; nullopt when every weight (and, with `moments`, every AdamW moment) is finite. A model that holds one
// can only train to NaN: it is refused at load, naming the tensor, rather than after a step.
std::optional<std::string> nonfinite_tensor(const backend::HostState& st, bool moments) {
  const backend::Gpt2& m = st.model();
  for (int l = 0; l < m.num_layers(); ++l) {
    const std::pair<const char*, std::span<const float>> blocks[] = {
        {"", st.weights(l)}, {" (AdamW first moment)", st.exp_avg(l)}, {" (AdamW second moment)", st.exp_avg_sq(l)}};
    for (const auto& [what, block] : std::span(blocks).first(moments ? 3 : 1)) {
      const auto bad = std::find_if(block.begin(), block.end(), [](float x) { return !std::isfinite(x); });
      if (bad == block.end()) continue;
      const auto at = static_cast<std::int64_t>(bad - block.begin());
      for (const backend::ParamSpec& p : m.params(l))
        if (at >= p.offset && at < p.offset + p.numel)
          return fmt::format("{}{} holds {} at element {} of {}", p.name, what,
                             std::isnan(*bad) ? "NaN"
                             : *bad > 0       ? "+infinity"
                                              : "-infinity",
                             at - p.offset, p.numel);
    }
  }
  return std::nullopt;
}

// The host-side model (weights, gradients, AdamW state), allocated only after check_host_memory: fresh from
// init_seed or loaded from model.weights (refused when a weight is not finite).
void init_state(Setup& s) {
  const auto& cfg = s.cfg;
  s.state = std::make_unique<backend::HostState>(*s.model);
  if (cfg.model.gpt2) {
    s.state->init_weights(cfg.model.init_seed);
  } else {
    backend::load_gpt2_weights_at(cfg.model.weights_path, *s.state);
    if (const auto bad = nonfinite_tensor(*s.state, false))
      throw core::ConfigError(core::SourceLoc{cfg.model.weights_path, 0, 0}, "the weights cannot train: tensor " + *bad,
                              "a NaN or infinite weight makes every loss NaN: use weights saved before the run that "
                              "produced them diverged, or a fresh model (model.gpt2)");
  }
}

double gib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kGiB); }

// What to do about the host limit that binds (backend::probe_host_memory's tightest).
std::string host_limit_hint(const backend::HostMemoryLimit* limit) {
  std::string smaller =
      "use a smaller model (model.gpt2: n_layer, n_embd, vocab_size), a smaller plan.minibatch or model.seq_len "
      "(the stashes)";
  if (limit == nullptr) return smaller;
  if (limit->name.starts_with("RLIMIT_AS"))
    return "raise the process's address-space limit (ulimit -v, set by the shell or the job script), or " + smaller;
  if (limit->name.starts_with("RLIMIT_DATA"))
    return "raise the process's data limit (ulimit -d, set by the shell or the job script), or " + smaller;
  if (limit->name.starts_with("the cgroup"))
    return "ask for more memory for the job or container (its cgroup's limit: Slurm --mem, docker --memory, "
           "systemd MemoryMax), or " +
           smaller;
  return smaller + ", or free host memory";
}

// Host memory up front, before anything large is allocated: `h` (sim::host_account of the run's Program on the
// model's exact sizes: master weights, gradients, optimizer state, stashes and activations swapped to the host, P2P
// staging; or sim::host_state, the model state harmony-run keeps on the host whatever the plan, before a plan is
// chosen) plus, on CPU devices, the `devices`
// arenas (host memory too) against what this process may still allocate: the tightest of MemAvailable, its
// RLIMIT_AS / RLIMIT_DATA and its cgroup's memory limit (backend::probe_host_memory). A run that cannot fit is
// refused, not killed later.
void check_host_memory(const Setup& s, const sim::HostAccount& h, int devices) {
  const auto& cfg = s.cfg;
  const core::Bytes arenas =
      device_kind(cfg).caps().memory_in_host ? core::Bytes{devices} * cfg.machine.gpu_memory_bytes : 0;
  const core::Bytes need = h.total_bytes + arenas;
  const backend::HostMemoryProbe probe = backend::probe_host_memory();
  const backend::HostMemoryLimit* limit = probe.tightest();
  if (limit == nullptr || need <= limit->headroom_bytes()) return;
  throw core::ConfigError(
      core::SourceLoc{cfg.file, 0, 0},
      fmt::format("the run needs {:.2f} GiB of host memory (master weights {}, gradients {}, optimizer state {}, "
                  "stashes {}, activations {}{}{}); this process may allocate {:.2f} GiB more: {}",
                  gib(need), core::format_bytes(h.master_weights_bytes), core::format_bytes(h.gradient_bytes),
                  core::format_bytes(h.optimizer_state_bytes), core::format_bytes(h.stash_bytes),
                  core::format_bytes(h.activation_bytes),
                  h.pinned_staging_bytes > 0
                      ? fmt::format(", staging buffers {}", core::format_bytes(h.pinned_staging_bytes))
                      : std::string(),
                  arenas > 0 ? fmt::format(", the {} CPU devices' arenas {}", devices, core::format_bytes(arenas))
                             : std::string(),
                  gib(limit->headroom_bytes()), limit->describe()),
      host_limit_hint(limit) + "; nothing was allocated");
}

// Before a plan is chosen (--plan auto profiles and trial-steps scratch copies of the model; `profile` measures
// one): the model state init_state allocates on the host for every kind (a kind with resident state, whose
// sim::host_floor is empty, copies it to its devices and back), on `devices` devices.
void check_host_state(const Setup& s, int devices) { check_host_memory(s, sim::host_state(s.desc, false), devices); }

// Device g of the config's kind (the registry's), capped at machine.gpu_memory, with the command line's --tf32,
// --tree-sums and --poison; `timing`: never poisoned (the profiler's timings).
std::unique_ptr<backend::Device> make_device(const core::TrainConfig& cfg, const DeviceFlags& f, int g, bool timing) {
  using Poison = backend::DeviceOptions::Poison;
  return device_kind(cfg).make_device(g, {.capacity = cfg.machine.gpu_memory_bytes,
                                          .tf32 = f.tf32,
                                          .tree_sums = f.tree_sums,
                                          .poison = timing     ? Poison::Off
                                                    : f.poison ? Poison::On
                                                               : Poison::Default});
}

std::vector<std::unique_ptr<backend::Device>> make_devices(const core::TrainConfig& cfg, const DeviceFlags& f, int n) {
  std::vector<std::unique_ptr<backend::Device>> devs;
  devs.reserve(static_cast<std::size_t>(std::max(0, n)));
  for (int g = 0; g < n; ++g) devs.push_back(make_device(cfg, f, g, false));
  return devs;
}

// The communicator the executor sums replicas' gradients with on the devices (ExecutorOptions::communicator):
// over `devs` in rank order, of the devices' kind; nullptr with --host-sums (the host path) or one device (no
// replicas, or a device kind without collectives: the executor then sums on the host). The caller keeps it alive as
// long as the executor, and destroys it before the devices.
std::unique_ptr<backend::Communicator> make_communicator(const core::TrainConfig& cfg, const Cli& cli,
                                                         const std::vector<backend::Device*>& devs) {
  const backend::DeviceKind& kind = device_kind(cfg);
  if (cli.host_sums || devs.size() < 2 || !kind.caps().collectives) return nullptr;
  return kind.make_communicator(devs);
}

// The devices as the executor takes them (the caller keeps `owned`).
std::vector<backend::Device*> raw_devices(const std::vector<std::unique_ptr<backend::Device>>& owned) {
  std::vector<backend::Device*> devs;
  devs.reserve(owned.size());
  for (const auto& d : owned) devs.push_back(d.get());
  return devs;
}

// A profile of the run's model: model.profile when given, else measured now on a device like the run's at the
// microbatch sizes given (what the run's Program uses, or every size for --plan auto; warm-up 1, one timed repeat).
core::Model measured_profile(const Setup& s, const std::vector<int>& sizes, bool quiet) {
  const auto& cfg = s.cfg;
  if (s.profile) return *s.profile;
  if (!quiet) fmt::print(stderr, "profiling the model on {} (microbatch {}) ...\n", cfg.device, fmt::join(sizes, ","));
  auto dev = make_device(cfg, s.device_flags, 0, true);
  backend::HostState scratch(*s.model);
  scratch.init_weights(cfg.model.init_seed);
  backend::ProfileOptions po;
  po.seq_len = cfg.model.seq_len;
  po.ubatch_sizes = sizes;
  po.warmup = 1;
  po.repeats = 1;
  po.dtype = run_dtype(cfg);
  return backend::profile_gpt2(*dev, scratch, po).model;
}

// The model harmony-sim prices the run's Programs on: the profile's times with the run's exact byte sizes (s.desc,
// which the executed Program is lowered from), so the search's memory ledger is the Program the executor runs
// and not the profiler's per-layer peaks (which count a layer's weights in its forward too).
core::Model priced_model(const Setup& s, core::Model prof) {
  const core::Model& exact = s.desc;
  for (int l = 0; l < prof.num_layers(); ++l) {
    core::Layer& L = prof.layers[static_cast<std::size_t>(l)];
    const core::Layer& E = exact.layers[static_cast<std::size_t>(l)];
    L.weight_bytes = E.weight_bytes;
    L.buffer_bytes = E.buffer_bytes;
    L.optimizer_state_bytes = E.optimizer_state_bytes;
    L.param_count = E.param_count;
    L.input_bytes_per_sample = E.input_bytes_per_sample;
    for (const core::Phase ph : {core::Phase::Fwd, core::Phase::Bwd}) {
      const bool fwd = ph == core::Phase::Fwd;
      const std::vector<int>& sizes = fwd ? prof.ubatch_fwd : prof.ubatch_bwd;
      std::vector<core::Bytes>& peaks = fwd ? L.fwd_peak_bytes : L.bwd_peak_bytes;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        if (exact.ubatch_in_range(ph, sizes[i])) peaks[i] = exact.peak_bytes(ph, sizes[i], l);
    }
  }
  return prof;
}

core::LowerOptions lower_options(const core::TrainConfig& cfg) {
  core::LowerOptions o = core::lower_options(cfg.options);
  o.dp_first_gpu_only = false;  // the executor runs every GPU
  return o;
}

// What runs: the plan (for a baseline: gpus, minibatch and its microbatch), its kind, title and Program.
struct Chosen {
  core::Plan plan;  // its kind: plan.kind
  std::string title;
  core::Program program;
  std::optional<core::Model> priced;  // --plan auto: the model it was priced on (reused for the prediction)
};

backend::AdamWConfig adamw_config(const core::TrainConfig& cfg) {
  return backend::AdamWConfig{.lr = cfg.train.lr,
                              .beta1 = cfg.train.beta1,
                              .beta2 = cfg.train.beta2,
                              .eps = cfg.train.eps,
                              .weight_decay = cfg.train.weight_decay};
}

backend::ExecutorOptions executor_options(const Cli& cli, const core::TrainConfig& cfg,
                                          backend::Communicator* communicator = nullptr) {
  return {.seq_len = cfg.model.seq_len,
          .adamw = adamw_config(cfg),
          .concurrent =
              cli.executor == "concurrent" || (cli.executor == "auto" && device_kind(cfg).caps().concurrent_executor),
          .run_ahead = cli.run_ahead,
          .pinned_limit = cfg.machine.topology.pinned_limit_bytes,
          .dtype = run_dtype(cfg),
          .communicator = communicator};
}

backend::CheckpointMeta checkpoint_meta(const Setup& s, const Chosen& chosen) {
  const core::Plan& plan = chosen.plan;
  backend::CheckpointMeta m;
  m.model = s.model->config();
  m.batch = plan.minibatch;
  m.seq_len = s.cfg.model.seq_len;
  m.plan = chosen.title;
  m.data = fmt::format("{} ({} tokens)", s.tokens.name(), s.tokens.size());
  m.adamw = adamw_config(s.cfg);
  m.dtype = run_dtype(s.cfg);
  return m;
}

std::string hms(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long long t = std::llround(seconds);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

// One progress line: "step 12/100 [#####.....] loss 4.1234 | 45.1 samples/s | ETA 00:35".
void progress(int step, int steps, double loss, double samples_per_s, double eta_s, bool tty) {
  constexpr int kWidth = 24;
  const int fill = steps > 0 ? kWidth * step / steps : kWidth;
  const std::string bar =
      std::string(static_cast<std::size_t>(fill), '#') + std::string(static_cast<std::size_t>(kWidth - fill), '.');
  fmt::print(stderr, "{}step {:>5}/{} [{}] loss {:.4f} | {:.1f} samples/s | ETA {}{}", tty ? "\r" : "", step, steps,
             bar, loss, samples_per_s, hms(eta_s), tty ? "" : "\n");
  if (tty && step == steps) fmt::print(stderr, "\n");
}

// The plan as it runs: its title (PlanKindSpec::describe) and its Program (PlanKindSpec::lower) on the run's model.
Chosen chosen_plan(const Setup& s, const core::Plan& plan) {
  Chosen c;
  c.plan = plan;
  c.title = core::describe_plan(plan, s.desc);
  c.program = core::lower_plan(plan, s.desc, lower_options(s.cfg));
  return c;
}

// --plan auto's candidates of the config's kind, each as the run would execute it (its Program lowered on the
// exact sizes), priced by harmony-sim on `priced`: a kind with packs the search's candidates (core::enumerate_plans
// at the device capacity), plus one layer per pack at every microbatch pair (the least memory any packing takes,
// so a capacity too small for the packers still has candidates), plus the config's own plan when it is a valid one;
// a kind without packs every microbatch core::enumerate_plans lists, whatever its swap estimate says.
struct Candidate {
  Chosen chosen;
  core::RunReport report;
};

std::vector<Candidate> auto_candidates(const Setup& s, const core::Model& priced, std::string& why_none) {
  const auto& cfg = s.cfg;
  const auto capacity = cfg.machine.search_capacity_bytes();
  std::vector<Candidate> out;
  std::set<std::string> seen;
  const auto engine = sim::make_engine(cfg.cost_model, priced, cfg.machine);
  auto add = [&](Chosen c) {
    if (!seen.insert(c.title).second) return;
    core::RunReport r = engine->run(c.program).report;
    out.push_back(Candidate{std::move(c), std::move(r)});
  };
  const core::PlanKind kind = cfg.plan.kind;
  if (!kind->packs) {
    core::SearchSpace space;
    space.kind = kind;
    space.gpus = cfg.plan.gpus;
    space.minibatch = cfg.plan.minibatch;
    space.capacity_bytes = capacity;
    space.spec.ubatch_step = cfg.search.ubatch_step;
    space.spec.u_bwd = cfg.search.u_bwd;
    space.drop_infeasible = false;  // the swap decisions' estimate is not the executor: the trial step decides
    space.activation_policies = {cfg.plan.knobs.activation_policy};
    space.knobs.swap = cfg.search.swap;  // dp-swap, pp-swap as scheduled or on-demand swappers (plan.swap)
    for (const core::Candidate& c : core::enumerate_plans(priced, space))
      add(chosen_plan(s, c.plan));  // pp-swap keeps the stages balanced on the profile's times
    if (out.empty()) {
      auto problem = core::split_problem(kind, cfg.plan.gpus, cfg.plan.minibatch);
      if (!problem) problem = core::stage_problem(kind, cfg.plan.gpus, priced.num_layers());
      why_none =
          problem ? problem->message
                  : fmt::format(
                        "no microbatch size of the profile ({}..{}) divides a device's share of "
                        "minibatch {}",
                        priced.ubatch_min(core::Phase::Bwd), priced.ubatch_max(core::Phase::Bwd), cfg.plan.minibatch);
    }
    return out;
  }
  const core::PlanKind mode = kind;
  if (const auto problem = core::split_problem(mode, cfg.plan.gpus, cfg.plan.minibatch)) {
    why_none = problem->message;
    return out;
  }
  core::SearchSpace space;
  space.kind = mode;
  space.gpus = cfg.plan.gpus;
  space.minibatch = cfg.plan.minibatch;
  space.capacity_bytes = capacity;
  space.unequal_microbatches = false;  // the runtime needs D % u == 0
  space.spec = cfg.search;
  auto try_add = [&](const core::Plan& p) {
    try {
      core::validate_packs(p, priced.num_layers());
      // the runtime's rule: equal microbatches on every device's share (core/plan/plan_rules)
      if (!core::microbatch_fits(p.kind, p.gpus, p.minibatch, p.u_bwd) ||
          (!p.packs_fwd.empty() && !core::microbatch_fits(p.kind, p.gpus, p.minibatch, p.u_fwd)))
        return;
      if (!priced.ubatch_in_range(core::Phase::Bwd, p.u_bwd)) return;
      if (!p.packs_fwd.empty() && !priced.ubatch_in_range(core::Phase::Fwd, p.u_fwd)) return;
      add(chosen_plan(s, p));
    } catch (const core::ScheduleError&) {
      // not a plan this model can run: not a candidate
    }
  };
  for (const core::Candidate& c : core::enumerate_plans(priced, space)) try_add(c.plan);
  const int R = priced.num_layers();
  core::Plan fine;
  fine.kind = mode;
  fine.gpus = cfg.plan.gpus;
  fine.minibatch = cfg.plan.minibatch;
  for (int l = 0; l < R; ++l) fine.packs_bwd.push_back({l, l});
  fine.packs_fwd.assign(fine.packs_bwd.begin(), fine.packs_bwd.end() - 1);
  for (const int uf : core::candidate_ubatch_sizes(priced, core::Phase::Fwd, space))
    for (const int ub : core::candidate_ubatch_sizes(priced, core::Phase::Bwd, space)) {
      fine.u_fwd = uf;
      fine.u_bwd = ub;
      try_add(fine);
    }
  if (cfg.plan.u_fwd && cfg.plan.u_bwd && (cfg.plan.pack_size || cfg.plan.packs_bwd)) {
    try {
      try_add(core::plan_from_spec(cfg.plan, priced, capacity, cfg.file, "harmony-run", ""));
    } catch (const core::ConfigError&) {
      // the config's plan is not valid here (e.g. its u_fwd does not divide a new minibatch): the search replaces it
    }
  }
  if (out.empty())
    why_none = fmt::format("no microbatch size of the profile divides minibatch {} over {} devices", cfg.plan.minibatch,
                           cfg.plan.gpus);
  return out;
}

// One step of `c` on fresh devices like the run's, with a scratch copy of the model and the run's first batch:
// the executor's own verdict on memory (allocation order, granularity and fragmentation included). Returns the
// out-of-memory message, or nullopt when the step ran.
std::optional<std::string> trial_step(const Setup& s, const Cli& cli, const Chosen& c) {
  check_host_memory(s, sim::host_account(c.program, s.desc), c.plan.gpus);
  backend::HostState scratch(*s.model);
  scratch.init_weights(s.cfg.model.init_seed);
  auto owned = make_devices(s.cfg, s.device_flags, c.plan.gpus);
  const std::vector<backend::Device*> devs = raw_devices(owned);
  const auto comm = make_communicator(s.cfg, cli, devs);
  std::vector<std::int32_t> in, tgt;
  s.tokens.batch(0, c.plan.minibatch, s.cfg.model.seq_len, in, tgt);
  try {
    backend::Executor executor(c.program, devs, scratch, executor_options(cli, s.cfg, comm.get()));
    (void)executor.step(in, tgt);
  } catch (const backend::OutOfMemory& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// At most this many candidates get a trial step before --plan auto gives up (the most promising first).
constexpr std::size_t kAutoTrials = 24;

// --plan auto: the candidates ranked (those harmony-sim predicts to fit by predicted step time; then the others by
// how far they exceed the capacity, then time; deadlocked ones never), and the first that runs a trial step on the
// devices wins. So a plan an explicit config proves possible is never reported impossible because the model's
// memory account disagrees with the executor's.
Chosen auto_choose(const Setup& s, const Cli& cli, bool quiet) {
  const auto& cfg = s.cfg;
  const std::string kind = cfg.plan.kind.name();
  const core::Model priced = priced_model(s, measured_profile(s, s.desc.ubatch_fwd, quiet));
  std::string why_none;
  std::vector<Candidate> cands = auto_candidates(s, priced, why_none);
  const std::size_t total = cands.size();
  std::size_t deadlocked = 0, predicted_fit = 0;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const core::RunReport& r = cands[i].report;
    if (r.deadlock) {
      ++deadlocked;
      continue;
    }
    if (r.feasible && r.fits) ++predicted_fit;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const core::RunReport &x = cands[a].report, &y = cands[b].report;
    const bool fx = x.feasible && x.fits, fy = y.feasible && y.fits;
    if (fx != fy) return fx;
    if (!fx && x.excess_bytes != y.excess_bytes) return x.excess_bytes < y.excess_bytes;
    return x.iteration_time_s < y.iteration_time_s;
  });
  const std::string hint =
      "raise machine.gpu_memory (--gpu-memory), use more devices (plan.gpus) or a smaller "
      "plan.minibatch";
  if (order.empty())
    throw core::ConfigError(cfg.plan.loc,
                            total == 0 ? fmt::format("--plan auto: no {} candidate: {}", kind, why_none)
                                       : fmt::format("--plan auto: all {} {} candidates deadlock", total, kind),
                            total == 0 ? "change plan.gpus or plan.minibatch" : hint);
  if (!quiet)
    fmt::print(stderr,
               "--plan auto: {} {} candidates ({} cost model, {} deadlocked), {} predicted to fit {:.2f} MiB; "
               "trying the best on the devices\n",
               total, kind, core::cost_model_name(cfg.cost_model), deadlocked, predicted_fit,
               mib(cfg.machine.gpu_memory_bytes));
  std::string first_oom;
  // A plan that ran out of memory shows the prediction is optimistic by at least its margin: a later candidate that
  // the model gives no more headroom (a predicted peak at or above the lowest that failed) is skipped untried, so the
  // trials walk towards headroom in time order instead of spending themselves on plans as tight as the failures
  // (the executor's allocator fragments; the model's account does not).
  core::Bytes failed_peak = std::numeric_limits<core::Bytes>::max();
  std::size_t trials = 0;
  for (std::size_t t = 0; t < order.size() && trials < kAutoTrials; ++t) {
    Candidate& c = cands[order[t]];
    if (c.report.peak_memory_bytes >= failed_peak) continue;
    ++trials;
    const std::optional<std::string> oom = trial_step(s, cli, c.chosen);
    if (!oom) {
      if (!quiet)
        fmt::print(stderr, "--plan auto: {} predicted {:.4f} s/step{}\n", c.chosen.title, c.report.iteration_time_s,
                   c.report.fits ? ""
                                 : fmt::format(" (predicted peak {:.2f} MiB; the trial step ran)",
                                               mib(c.report.peak_memory_bytes)));
      c.chosen.priced = priced;
      return std::move(c.chosen);
    }
    if (first_oom.empty()) first_oom = *oom;
    failed_peak = std::min(failed_peak, c.report.peak_memory_bytes);
    if (!quiet) fmt::print(stderr, "--plan auto: {} ran out of device memory in a trial step; next\n", c.chosen.title);
  }
  throw core::ConfigError(cfg.plan.loc,
                          fmt::format("--plan auto: the {} most promising of {} {} candidates all ran out of memory "
                                      "in a trial step on {:.2f} MiB devices (the others were predicted no more "
                                      "headroom than those, or were past {} trials); first: {}",
                                      trials, total, kind, mib(cfg.machine.gpu_memory_bytes), kAutoTrials, first_oom),
                          hint);
}

Chosen choose(const Setup& s, const Cli& cli, bool quiet) {
  const auto& cfg = s.cfg;
  if (cli.plan == "auto") return auto_choose(s, cli, quiet);
  // a kind without packs runs the config's one microbatch (plan.u_bwd)
  return chosen_plan(s, core::plan_from_spec(cfg.plan, s.desc, cfg.machine.gpu_memory_bytes, cfg.file, "harmony-run",
                                             "add `u_fwd: U` and `u_bwd: U` to plan:, or use --plan auto"));
}

// harmony-sim's prediction (native cost model) of the run's Program on the config's machine, priced on the
// model --plan auto searched on, else on a profile (model.profile, or measured now at the Program's microbatch
// sizes only). nullopt with the reason when it cannot be made (the profile lacks a size, a profile step ran out of
// memory): a missing prediction never fails a finished run.
struct Prediction {
  std::optional<double> step_s;
  std::string why_not;
};

// `serial`: the run used the serial executor (one op at a time), so the prediction runs the ops one at a time
// too (sim::NativeOptions::serial); with concurrent queues, the default engine.
Prediction predict(const Setup& s, const Chosen& c, bool serial, bool quiet) {
  try {
    std::vector<int> sizes = {c.plan.u_fwd, c.plan.u_bwd};
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const core::Model priced = c.priced ? *c.priced : priced_model(s, measured_profile(s, sizes, quiet));
    sim::NativeOptions options;
    options.serial = serial;
    const core::RunReport r = sim::NativeEngine(priced, s.cfg.machine, options).run(c.program).report;
    if (r.deadlock) return {std::nullopt, "harmony-sim finds the Program deadlocks"};
    return {r.iteration_time_s, ""};
  } catch (const backend::OutOfMemory& e) {
    return {std::nullopt, fmt::format("profiling for the prediction ran out of device memory: {}", e.what())};
  } catch (const backend::DeviceError& e) {  // e.g. the GPU has less free memory than the profile's device asks
    return {std::nullopt, fmt::format("profiling for the prediction failed on the device: {}", e.what())};
  } catch (const core::ScheduleError& e) {
    return {std::nullopt, e.what()};
  }
}

// (measured - predicted) / predicted: + means the run was slower than predicted; NaN: no prediction.
double prediction_error(const Prediction& predicted, double measured_step_s) {
  return predicted.step_s && *predicted.step_s > 0 ? (measured_step_s - *predicted.step_s) / *predicted.step_s
                                                   : std::numeric_limits<double>::quiet_NaN();
}

// Every file the run will write, checked before any work so that a bad path never throws a run away.
void check_train_outputs(const Cli& cli, const core::TrainConfig& cfg) {
  if (!cli.trace.empty()) core::check_output_file(cli.trace, "the trace (--trace)");
  if (!cli.save_weights.empty()) {
    core::check_output_file(cli.save_weights, "the weights (--save-weights)");
    core::check_output_file(backend::hf_config_path_for(cli.save_weights), "the weights' config.json (--save-weights)");
  }
  if (!cfg.checkpoint.dir.empty()) core::check_output_dir(cfg.checkpoint.dir, "the checkpoint directory");
}

// What the run is: printed before step 1 (table output, without --quiet).
void print_header(const Setup& s, const Chosen& chosen) {
  const auto& cfg = s.cfg;
  const core::Plan& plan = chosen.plan;
  fmt::print("model    {} ({} parameters, {:.2f} MiB of fp32 weights; {:.2f} MiB with AdamW state)\n", s.desc.name,
             s.model->param_count(), mib(s.model->param_count() * 4), mib(s.model->param_count() * 12));
  fmt::print("devices  {} x {} with {} each{}\n", plan.gpus, cfg.device, capacity_text(cfg.machine.gpu_memory_bytes),
             cfg.train.dtype == "bf16"
                 ? "; bf16 weights, activations and gradients (fp32 masters and AdamW on the host)"
                 : "");
  fmt::print("plan     {} ({} ops)\n", chosen.title, chosen.program.ops.size());
  fmt::print("data     {} ({} tokens; {} steps per epoch)\n", s.tokens.name(), s.tokens.size(),
             s.tokens.steps_per_epoch(plan.minibatch, cfg.model.seq_len));
  std::fflush(stdout);
}

// The checkpoint directory of a run (empty: none), the meta of its checkpoints and the newest one it holds.
struct Checkpoints {
  std::string dir;
  backend::CheckpointMeta meta;
  std::string newest;  // resumed from or saved by this run; empty when none
  std::int64_t newest_step = 0;

  std::string save(int done_steps, const std::vector<double>& losses, const backend::HostState& state, int keep) {
    meta.step = done_steps;
    meta.data_position = static_cast<std::uint64_t>(done_steps);
    meta.losses = losses;
    newest = allocating("a checkpoint", [&] { return backend::save_checkpoint(dir, meta, state, keep); });
    newest_step = done_steps;
    return newest;
  }
};

// What the steps of this process measured, for the summary, the JSON and the trace.
struct RunLog {
  int start = 0;                                   // steps done before this process (a resumed run's)
  int ran = 0;                                     // steps this process ran
  double run_s = 0.0;                              // their wall time
  std::vector<double> losses;                      // every step's loss since step 1 (a resumed run's history first)
  nlohmann::json steps = nlohmann::json::array();  // this process's steps
  // --trace: the fastest step after this process's first (its warm-up; the first itself when it is the only one),
  // the step harmony-sim calibrate measures a run by, so the trace it fits and the time it compares are one step.
  backend::StepResult traced;
  int traced_step = 0;  // 1-based; 0 = none yet
  double traced_s = 0.0;
};

// A loss this many times the run's first is reported as divergence (once).
constexpr double kDivergenceFactor = 100.0;

// Training stopped at `step` (1-based) on a non-finite loss or gradient: the error, what is kept, what to do.
// Returns kExitNonFinite.
int stop_nonfinite(const Setup& s, const Cli& cli, const Checkpoints& ck, int step, const backend::StepResult& r) {
  const auto& g = r.nonfinite_gradient;
  std::string what;
  if (!std::isfinite(r.loss)) {
    what = fmt::format("the loss is {}", std::isnan(r.loss) ? "NaN" : r.loss > 0 ? "+infinity" : "-infinity");
    if (g)
      what += fmt::format(", and the gradients of {} parameters are not finite either (the one nearest the loss: {})",
                          g->params, g->param);
  } else {
    what =
        fmt::format("the gradient of {} (layer {}) holds a NaN or an infinity{}; the loss was {:.6g}", g->param,
                    s.model->layer_name(g->layer),
                    g->params > 1 ? fmt::format(", as do {} other parameters'", g->params - 1) : std::string(), r.loss);
  }
  std::string kept;
  if (ck.dir.empty()) {
    kept = "no checkpoint directory: the run's progress is not saved";
  } else if (ck.newest.empty()) {
    kept = fmt::format("no checkpoint was saved in {} before it", ck.dir);
  } else {
    kept = fmt::format("the newest checkpoint, {} (step {}), is kept as it was", ck.newest, ck.newest_step);
  }
  std::string unwritten;
  for (const auto& [flag, path] : {std::pair{"--save-weights", &cli.save_weights}, std::pair{"--trace", &cli.trace}})
    if (!path->empty()) unwritten += fmt::format("{}{} {}", unwritten.empty() ? "; not written: " : ", ", flag, *path);
  fmt::print(stderr,
             "harmony-run: error: training stopped at step {}: {}. The step's update used it, so nothing of it was "
             "saved: {}{}\n  hint: lower train.lr (now {:g}), check the data{}; a --resume repeats the same steps "
             "with the same settings (exit code {}: non-finite training, docs/backend.md)\n",
             step, what, kept, unwritten, s.cfg.train.lr, s.cfg.model.gpt2 ? "" : " and the weights (model.weights)",
             kExitNonFinite);
  return kExitNonFinite;
}

// Steps log.start+1 .. train.steps with progress (stderr: a bar on a terminal, otherwise the first, the last and
// one line per 10 s), checkpoints, a warning when the loss diverges, and the stops: 0 when every step ran, else
// the exit code (a stop signal: 128 + its number, after a checkpoint; a non-finite loss or gradient:
// kExitNonFinite, nothing saved).
int train_steps(const Cli& cli, Setup& s, backend::Executor& executor, Checkpoints& ck, RunLog& log) {
  const auto& cfg = s.cfg;
  const int B = cfg.plan.minibatch, T = cfg.model.seq_len, steps = cfg.train.steps;
  const bool quiet = cli.quiet;
  install_stop_handlers();
  const bool tty = isatty(STDERR_FILENO) != 0;
  // Off a terminal (a log file, Slurm's output) one progress line for the first step, then one every
  // kProgressLineEvery_s and one for the last, as harmony-sim's sweeps and searches write theirs.
  constexpr double kProgressLineEvery_s = 10.0;
  auto last_line = std::chrono::steady_clock::now();
  bool on_bar = false;  // a terminal's progress bar is the line the cursor is on
  const auto end_bar = [&] {
    if (on_bar) fmt::print(stderr, "\n");
    on_bar = false;
  };
  bool warned = false;
  std::vector<std::int32_t> in, tgt;
  for (int step = log.start; step < steps; ++step) {
    s.tokens.batch(step, B, T, in, tgt);
    const auto t0 = std::chrono::steady_clock::now();
    backend::StepResult last;
    try {
      last = allocating(fmt::format("training step {}", step + 1), [&] { return executor.step(in, tgt); });
    } catch (const backend::OutOfMemory& e) {
      end_bar();
      throw core::ConfigError(
          core::SourceLoc{cfg.file, 0, 0},
          fmt::format("the plan does not fit the devices' memory (machine.gpu_memory = {}) at step {}: {}",
                      capacity_text(cfg.machine.gpu_memory_bytes), step + 1, e.what()),
          "raise --gpu-memory, use smaller packs (plan.pack_size) or microbatches, or let --plan auto pick a plan "
          "that fits; no checkpoint was written by this run");
    }
    if (!std::isfinite(last.loss) || last.nonfinite_gradient) {
      end_bar();
      return stop_nonfinite(s, cli, ck, step + 1, last);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log.run_s += dt;
    ++log.ran;
    if (!cli.trace.empty() && (log.ran == 1 || log.ran == 2 || dt < log.traced_s)) {
      log.traced = last;
      log.traced_step = step + 1;
      log.traced_s = dt;
    }
    log.losses.push_back(last.loss);
    log.steps.push_back(
        {{"step", step + 1}, {"loss", last.loss}, {"step_time_s", dt}, {"throughput_samples_per_s", B / dt}});
    const auto now = std::chrono::steady_clock::now();
    if (!quiet && (tty || step == log.start || step + 1 == steps ||
                   std::chrono::duration<double>(now - last_line).count() >= kProgressLineEvery_s)) {
      progress(step + 1, steps, last.loss, B * log.ran / log.run_s, (steps - step - 1) * log.run_s / log.ran, tty);
      on_bar = tty && step + 1 < steps;
      last_line = now;
    }
    if (!warned && last.loss > kDivergenceFactor * log.losses.front()) {
      warned = true;
      end_bar();
      fmt::print(stderr,
                 "harmony-run: warning: step {}: the loss {:.6g} is {:.3g} times step 1's {:.6g}: the run is "
                 "diverging\n  hint: lower train.lr (now {:g}); Ctrl-C stops it with a checkpoint{}\n",
                 step + 1, last.loss, last.loss / log.losses.front(), log.losses.front(), cfg.train.lr,
                 ck.dir.empty() ? " when --checkpoint-dir is given" : "");
    }
    const bool due = cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0;
    const int stop = g_signal.load();
    if (!ck.dir.empty() && (due || stop != 0)) {
      executor.sync_state();  // a resident kind's weights and moments are on its devices
      const std::string path = ck.save(step + 1, log.losses, *s.state, cfg.checkpoint.keep);
      if (!quiet && !tty) fmt::print(stderr, "checkpoint {}\n", path);
    }
    if (stop != 0) {
      end_bar();
      fmt::print(stderr, "interrupted by {} after step {}{}\n", signal_name(stop), step + 1,
                 ck.dir.empty() ? " (no checkpoint directory: progress is lost)"
                                : fmt::format("; checkpoint saved in {}; continue with --resume", ck.dir));
      return 128 + stop;
    }
  }
  return 0;
}

// --format json: the run's document (docs/output-schema.md, schemas/harmony-run-train.schema.json); unknown
// values (nothing ran) are null.
// Host memory of the run: the executor's metered host allocations (ExecutorHostMemory: the HostState blocks its steps
// use and the interpreters' host buffers, by sim::HostAccount's categories), harmony-sim's host account of the same
// Program (what check_host_memory checked), and the process's peak resident set (VmHWM: everything, on the CPU device
// the devices' arenas too, as DeviceCaps::memory_in_host says).
struct HostMemoryReport {
  backend::ExecutorHostMemory measured;
  sim::HostAccount predicted;
  std::optional<core::Bytes> peak_rss_bytes;
  bool devices_in_host = false;  // the devices' memory is host RAM (counted in peak_rss_bytes, not in measured)
};

nlohmann::json host_memory_json(const HostMemoryReport& h) {
  using nlohmann::json;
  const auto parts = [](const backend::ExecutorHostMemory::Parts& p) {
    return json{{"master_weights_bytes", p.master_weights_bytes},
                {"optimizer_state_bytes", p.optimizer_state_bytes},
                {"gradient_bytes", p.gradient_bytes},
                {"stash_bytes", p.stash_bytes},
                {"activation_bytes", p.activation_bytes},
                {"staging_bytes", p.staging_bytes}};
  };
  const sim::HostAccount& a = h.predicted;
  return {{"peak_bytes", h.measured.peak_bytes},
          {"at_peak", parts(h.measured.at_peak)},
          {"category_peaks", parts(h.measured.peak)},
          {"predicted_bytes", a.total_bytes},
          {"predicted",
           {{"master_weights_bytes", a.master_weights_bytes},
            {"optimizer_state_bytes", a.optimizer_state_bytes},
            {"gradient_bytes", a.gradient_bytes},
            {"stash_bytes", a.stash_bytes},
            {"activation_bytes", a.activation_bytes},
            {"staging_bytes", a.pinned_staging_bytes}}},
          {"process_peak_rss_bytes", h.peak_rss_bytes ? json(*h.peak_rss_bytes) : json(nullptr)},
          {"device_memory_in_host", h.devices_in_host}};
}

void print_train_json(const Cli& cli, const Setup& s, const Chosen& chosen, const RunLog& log,
                      const std::vector<core::Bytes>& peaks, const Prediction& predicted,
                      const HostMemoryReport& host) {
  using nlohmann::json;
  const auto& cfg = s.cfg;
  const core::Plan& plan = chosen.plan;
  const int B = plan.minibatch;
  const double mean_step_s = log.ran > 0 ? log.run_s / log.ran : 0.0;
  const auto or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  const bool packs = plan.kind->packs;
  json per_gpu = json::array();
  core::Bytes peak = 0;
  for (std::size_t g = 0; g < peaks.size(); ++g) {
    per_gpu.push_back({{"gpu", g}, {"peak_memory_bytes", peaks[g]}});
    peak = std::max(peak, peaks[g]);
  }
  const json doc = {{"schema_version", core::kOutputSchemaVersion},
                    {"command", "train"},
                    {"config_path", cli.config},
                    {"device", cfg.device},
                    {"dtype", cfg.train.dtype},
                    {"plan",
                     {{"title", chosen.title},
                      {"plan_kind", plan.kind.name()},
                      {"gpus", plan.gpus},
                      {"minibatch", plan.minibatch},
                      {"u_fwd", plan.u_fwd},
                      {"u_bwd", plan.u_bwd},
                      {"packs_fwd", packs ? core::packs_to_json(plan.packs_fwd) : json(nullptr)},
                      {"packs_bwd", packs ? core::packs_to_json(plan.packs_bwd) : json(nullptr)}}},
                    {"steps", log.steps},
                    {"summary",
                     {{"first_step", log.start + 1},
                      {"last_step", cfg.train.steps},
                      {"steps_run", log.ran},
                      {"first_loss", log.losses.empty() ? json(nullptr) : json(log.losses.front())},
                      {"final_loss", log.losses.empty() ? json(nullptr) : json(log.losses.back())},
                      {"losses", log.losses},
                      {"train_time_s", log.run_s},
                      {"step_time_s", log.ran > 0 ? json(mean_step_s) : json(nullptr)},
                      {"traced_step", log.traced_step > 0 ? json(log.traced_step) : json(nullptr)},
                      {"predicted_step_time_s", or_null(predicted.step_s.value_or(std::nan("")))},
                      {"prediction_error", or_null(prediction_error(predicted, mean_step_s))},
                      {"throughput_samples_per_s", log.ran > 0 ? json(B * log.ran / log.run_s) : json(nullptr)},
                      {"gpu_capacity_bytes", cfg.machine.gpu_memory_bytes},
                      {"model_weight_bytes", s.model->param_count() * 4},
                      {"num_parameters", s.model->param_count()},
                      {"peak_memory_bytes", peaks.empty() ? json(nullptr) : json(peak)},
                      {"per_gpu", std::move(per_gpu)},
                      {"host_memory", host_memory_json(host)}}}};
  fmt::print("{}\n", doc.dump(1));
}

// The table's results (printed with --quiet too: it only drops the progress).
void print_train_summary(const Setup& s, const RunLog& log, const std::vector<core::Bytes>& peaks,
                         const Prediction& predicted, bool serial, const HostMemoryReport& host) {
  const auto& cfg = s.cfg;
  const int B = cfg.plan.minibatch;
  const double mean_step_s = log.ran > 0 ? log.run_s / log.ran : 0.0;
  const double error = prediction_error(predicted, mean_step_s);
  // this process's steps (a resumed run's earlier losses are not its own)
  const double first = log.ran > 0 ? log.losses[log.losses.size() - static_cast<std::size_t>(log.ran)] : 0.0;
  fmt::print("done     {} steps in {:.2f} s ({:.1f} samples/s); loss {:.4f} -> {:.4f}\n", log.ran, log.run_s,
             log.ran > 0 ? B * log.ran / log.run_s : 0.0, first, log.ran > 0 ? log.losses.back() : 0.0);
  std::string p;
  for (std::size_t g = 0; g < peaks.size(); ++g) p += fmt::format("{}{:.2f}", g ? ", " : "", mib(peaks[g]));
  fmt::print("memory   peak per device (MiB): {} of {:.2f}; the model's weights alone are {:.2f} MiB\n", p,
             mib(cfg.machine.gpu_memory_bytes), mib(s.model->param_count() * 4));
  const core::Bytes measured = host.measured.peak_bytes, expected = host.predicted.total_bytes;
  fmt::print(
      "host     peak {:.2f} MiB of executor host memory (masters, optimizer state, gradients, stashes, "
      "activations, staging){}; process peak RSS {}{}\n",
      mib(measured),
      expected > 0 ? fmt::format("; harmony-sim's host account {:.2f} MiB ({:+.1f}%)", mib(expected),
                                 100.0 * (static_cast<double>(expected) / static_cast<double>(measured) - 1))
                   : std::string(),
      host.peak_rss_bytes ? fmt::format("{:.2f} MiB", mib(*host.peak_rss_bytes)) : std::string("unknown"),
      host.devices_in_host ? " (the devices' memory included: it is host RAM)" : "");
  if (predicted.step_s && std::isfinite(error))
    fmt::print("predict  {:.4f} s/step by harmony-sim (native{}) on machine {}; measured {:.4f} s/step ({:+.1f}%)\n",
               *predicted.step_s, serial ? ", one op at a time as the serial executor" : "", cfg.machine.name,
               mean_step_s, 100.0 * error);
  else if (log.ran > 0)
    fmt::print("predict  none: {}; measured {:.4f} s/step\n", predicted.why_not, mean_step_s);
}

int cmd_train(const Cli& cli) {
  Setup s = make_setup(cli);
  load_run_profile(s);
  const auto& cfg = s.cfg;
  check_train_outputs(cli, cfg);
  const bool json = cli.format == "json";
  const bool quiet = cli.quiet;  // progress on stderr: beside JSON too, as harmony-sim's
  adamw_config(cfg).validate();
  const std::string& ckdir = cfg.checkpoint.dir;
  // The checkpoint directory first (before any search or allocation): one writer at a time, and a fresh run never
  // writes where a run's checkpoints are.
  std::optional<backend::CheckpointDirLock> ck_lock;
  if (cli.resume && ckdir.empty())
    throw core::ConfigError(core::SourceLoc{cfg.file, 0, 0}, "--resume needs a checkpoint directory",
                            "give --checkpoint-dir DIR or checkpoint.dir in the config");
  if (!ckdir.empty()) {
    ck_lock.emplace(ckdir);
    if (!cli.resume)
      if (auto latest = backend::latest_checkpoint(ckdir))
        throw core::ConfigError(core::SourceLoc{cfg.file, 0, 0},
                                fmt::format("checkpoint directory {} already holds {}", ckdir, *latest),
                                "continue that run with --resume, or give an empty --checkpoint-dir (a fresh run "
                                "never overwrites saved checkpoints)");
  }
  check_host_state(s, cfg.plan.gpus);
  const Chosen chosen = choose(s, cli, quiet);
  check_host_memory(s, sim::host_account(chosen.program, s.desc), chosen.plan.gpus);
  allocating(fmt::format("the host model state (fp32 weights, gradients and AdamW moments: {:.2f} GiB)",
                         gib(s.model->param_count() * 16)),
             [&] { init_state(s); });
  const core::Plan& plan = chosen.plan;
  const core::Program& program = chosen.program;
  auto owned = allocating("the devices", [&] { return make_devices(cfg, s.device_flags, plan.gpus); });
  const std::vector<backend::Device*> devs = raw_devices(owned);
  auto comm = make_communicator(cfg, cli, devs);  // outlives the executor, dies before the devices
  // In an optional so that it and the devices are released before the prediction profiles on a device of the same
  // capacity (a CUDA device holds its whole block: two at once would not fit the GPU).
  std::optional<backend::Executor> run_executor;
  try {
    allocating("the executor's host buffers (stashes and swapped activations)",
               [&] { run_executor.emplace(program, devs, *s.state, executor_options(cli, cfg, comm.get())); });
  } catch (const backend::OutOfMemory& e) {
    if (!plan.kind->resident_state) throw;
    // a kind with resident state allocates its weights, gradients and AdamW state on every device up front
    throw core::ConfigError(
        core::SourceLoc{cfg.file, 0, 0},
        fmt::format("{} keeps the whole model's weights, gradients and AdamW state on every device ({:.2f} MiB, 16 "
                    "bytes per parameter) and they do not fit machine.gpu_memory = {}: {}",
                    plan.kind.name(), static_cast<double>(s.model->param_count() * 16) / (1 << 20),
                    capacity_text(cfg.machine.gpu_memory_bytes), e.what()),
        "raise --gpu-memory, or train the model larger than the devices with a kind that swaps (harmony-pp, "
        "harmony-dp; --plan auto picks a plan that fits)");
  }
  if (!json && !quiet) print_header(s, chosen);

  // Checkpoints: resume from the newest one when asked; a mismatched or corrupt one is refused.
  Checkpoints ck{ckdir, checkpoint_meta(s, chosen), ""};
  RunLog log;
  if (cli.resume) {
    if (auto latest = backend::latest_checkpoint(ckdir)) {
      const backend::CheckpointMeta got = backend::load_checkpoint(*latest, *s.state, &ck.meta);
      if (const auto bad = nonfinite_tensor(*s.state, true))
        throw core::ConfigError(core::SourceLoc{*latest, 0, 0}, "the checkpoint cannot continue training: " + *bad,
                                "move it away and resume from an older checkpoint, or start again in another "
                                "--checkpoint-dir (harmony-run never saves a step whose loss or gradients are not "
                                "finite: this one was written by another program or version)");
      log.start = static_cast<int>(got.step);
      log.losses = got.losses;
      ck.newest = *latest;
      if (!quiet) fmt::print(json ? stderr : stdout, "resumed  {} at step {}\n", *latest, log.start);
    } else if (!quiet) {
      fmt::print(json ? stderr : stdout, "resume   no checkpoint in {}: starting at step 0\n", ckdir);
    }
    std::fflush(stdout);
  }

  if (const int stopped = train_steps(cli, s, *run_executor, ck, log); stopped != 0) return stopped;
  run_executor->sync_state();  // a resident kind's weights and moments are on its devices until now
  if (!ckdir.empty() && log.ran > 0 && (cfg.checkpoint.every == 0 || cfg.train.steps % cfg.checkpoint.every != 0))
    ck.save(cfg.train.steps, log.losses, *s.state, cfg.checkpoint.keep);
  if (!cli.save_weights.empty()) backend::save_hf_model(cli.save_weights, *s.state);
  if (!cli.trace.empty() && log.ran > 0) {
    nlohmann::json doc = core::chrome_trace_json(program, log.traced.begin, log.traced.end,
                                                 core::TraceMeta{"harmony-run (" + cfg.device + ")", chosen.title});
    doc["otherData"]["step"] = log.traced_step;
    doc["otherData"]["step_time_s"] = log.traced_s;
    core::write_file_atomic(cli.trace, doc.dump(1) + "\n", "the trace");
  }

  std::vector<core::Bytes> peaks;
  peaks.reserve(devs.size());
  for (auto* d : devs) peaks.push_back(d->memory().peak);
  const HostMemoryReport host{run_executor->host_memory(), sim::host_account(program, s.desc),
                              backend::peak_rss_bytes(), device_kind(cfg).caps().memory_in_host};
  run_executor.reset();  // the run's device memory back before predict() profiles (the state is on the host)
  comm.reset();
  owned.clear();
  const bool serial = !executor_options(cli, cfg).concurrent;
  const Prediction predicted =
      log.ran > 0 ? predict(s, chosen, serial, quiet) : Prediction{std::nullopt, "no step ran"};
  if (json) {
    print_train_json(cli, s, chosen, log, peaks, predicted, host);
  } else {
    print_train_summary(s, log, peaks, predicted, serial, host);
  }
  return 0;
}

int cmd_profile(const Cli& cli) {
  core::check_output_file(cli.out, "the profile (--out)");
  Setup s = make_setup(cli);
  const auto& cfg = s.cfg;
  backend::ProfileOptions po;
  po.seq_len = cfg.model.seq_len;
  po.ubatch_sizes = cli.ubatch.empty() ? s.desc.ubatch_fwd : cli.ubatch;
  po.repeats = cli.repeats;
  po.dtype = run_dtype(cfg);
  check_host_state(s, 1);
  allocating(fmt::format("the host model state (fp32 weights, gradients and AdamW moments: {:.2f} GiB)",
                         gib(s.model->param_count() * 16)),
             [&] { init_state(s); });
  auto dev = make_device(cfg, s.device_flags, 0, true);
  const bool tty = isatty(STDERR_FILENO) != 0;
  const backend::ProfileResult prof = backend::profile_gpt2(*dev, *s.state, po, [&](const backend::ProfileProgress& p) {
    if (tty) fmt::print(stderr, "\rprofiling {}/{}", p.step, p.total_steps);
  });
  if (tty) fmt::print(stderr, "\n");
  backend::ProfileMeta meta;
  meta.model_name = s.desc.name;
  meta.device_kind = cfg.device;
  meta.threads = static_cast<int>(std::thread::hardware_concurrency());
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) meta.host = host;
  const std::time_t now = std::time(nullptr);
  char date[32] = {};
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  meta.date_utc = date;
  const std::string text = backend::profile_json(prof, meta);
  core::write_file_atomic(cli.out, text, "the profile");
  fmt::print("profile of {} on {} ({} layers, microbatch {}..{}) written to {}\n", s.desc.name, prof.device_name,
             prof.model.num_layers(), prof.model.ubatch_min(core::Phase::Fwd), prof.model.ubatch_max(core::Phase::Fwd),
             cli.out);
  if (!prof.dropped_fwd.empty() || !prof.dropped_bwd.empty())
    fmt::print("sizes left out (did not fit {:.2f} MiB): forward {}, backward {}\n", mib(prof.device_capacity_bytes),
               fmt::join(prof.dropped_fwd, ","), fmt::join(prof.dropped_bwd, ","));
  return 0;
}

// A host resource that failed after the pre-flight passed (`failure`: "out of host memory (std::bad_alloc)
// allocating X", "cannot start a thread: ..."), with the limits as they stand now.
void report_host_resource_failure(const std::string& failure, const std::string& why = "") {
  const backend::HostMemoryProbe probe = backend::probe_host_memory();
  const backend::HostMemoryLimit* limit = probe.tightest();
  std::cerr << fmt::format("harmony-run: error: {}; {}\n  hint: {}\n", failure,
                           limit == nullptr ? std::string("no host memory limit could be read")
                                            : fmt::format("this process may allocate {:.2f} GiB more: {}",
                                                          gib(limit->headroom_bytes()), limit->describe()),
                           why + host_limit_hint(limit));
}

int run_cli(int argc, char** argv) {
  CLI::App app{"harmony-run: train a GPT model with a Harmony schedule on capped devices (docs/backend.md)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "harmony-run 0.1.0");
  Cli cli;
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("config", cli.config, "YAML configuration (configs/run/, docs/config.md)")->required();
    sub->add_option("--set", cli.sets, "override a config key, e.g. --set plan.gpus=2 (repeatable)");
    sub->add_option("--dtype", cli.dtype,
                    "device storage: fp32 (default) or bf16 (mixed precision: bf16 weights, activations and "
                    "gradients on the devices, fp32 master weights and AdamW on the host; train.dtype)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    sub->add_option("--gpu-memory", cli.gpu_memory, "each device's memory, e.g. 2MiB (machine.gpu_memory)");
    sub->add_flag("--tf32", cli.device_flags.tf32,
                  "device: cuda: fp32 GEMMs on TF32 tensor cores (faster; ~1e-3 relative error)");
    sub->add_flag("--tree-sums", cli.device_flags.tree_sums,
                  "device: cuda: bias and LayerNorm gradients by parallel tree sums (faster; no longer bit-identical "
                  "to the CPU device)");
    sub->add_flag("--poison", cli.device_flags.poison,
                  "fill fresh device memory with NaN to catch reads before writes (default only in debug builds)");
  };
  auto* train = app.add_subcommand("train", "train for train.steps steps, printing loss, samples/s and ETA");
  add_common(train);
  train->footer(
      "Exit codes: 0 trained; 1 a failed write to stdout; 2 bad input, or a run refused up front (host memory, a "
      "checkpoint folder another run "
      "holds) or out of host memory; 3 stopped on a NaN or infinite loss or gradient (nothing of that step saved); "
      "70 a bug in harmony; 128 + n stopped by signal n after a checkpoint (docs/backend.md)");
  train->add_option("--steps", cli.steps, "steps to train (train.steps)")->check(kPositiveInt);
  train->add_option("--data", cli.data, "llm.c token file (uint16 ids) instead of the config's data");
  train->add_option("--plan", cli.plan, "config (the plan: section) or auto (search the best plan that fits)")
      ->check(CLI::IsMember({"config", "auto"}));
  train->add_option("--trace", cli.trace,
                    "write the measured Chrome trace (Perfetto) of the fastest step after the first (the step "
                    "harmony-sim calibrate measures the run by)");
  train->add_option("--format", cli.format, "output: table (default) or json")->check(CLI::IsMember({"table", "json"}));
  train->add_option("--checkpoint-dir", cli.checkpoint_dir, "save checkpoints here (checkpoint.dir)");
  train->add_option("--checkpoint-every", cli.checkpoint_every, "steps between checkpoints (checkpoint.every)")
      ->check(kNonNegativeInt);
  train->add_flag("--resume", cli.resume, "continue from the newest checkpoint in the checkpoint directory");
  train->add_option("--save-weights", cli.save_weights,
                    "write the trained weights (HF safetensors) and config.json beside them");
  train->add_flag("--quiet", cli.quiet, "no progress output");
  train
      ->add_option("--executor", cli.executor,
                   "serial: one op at a time; concurrent: a worker and stream per Program queue (copies overlap "
                   "compute; allocation order then varies with timing); auto (default): serial on CPU devices, "
                   "concurrent on CUDA")
      ->check(CLI::IsMember({"auto", "serial", "concurrent"}));
  train
      ->add_option("--run-ahead", cli.run_ahead,
                   "how far the host issues ops ahead of the devices (ops are ordered by events either way; the "
                   "same bits): 1 (default): once the ops each follows have completed, device memory as the "
                   "Program says; 2: one op per queue may still run (more memory); 0: unbounded")
      ->check(kNonNegativeInt);
  train->add_flag("--host-sums", cli.host_sums,
                  "sum data-parallel replicas' gradients on the host (each replica's copied down, added in rank "
                  "order, the sum copied back up: the reference path) instead of on the devices with a "
                  "communicator (the default; the same bits on CPU devices)");
  auto* profile = app.add_subcommand("profile", "measure per-layer times and memory into a harmony-sim profile");
  add_common(profile);
  profile->add_option("--out", cli.out, "profile JSON to write")->required();
  profile->add_option("--ubatch", cli.ubatch, "microbatch sizes (default 1..plan.minibatch)")->delimiter(',');
  profile->add_option("--repeats", cli.repeats, "timed repetitions per measurement (median)")->check(kPositiveInt);
  apps::ProbeCli probe_cli;
  auto* probe = apps::add_probe_command(app, probe_cli);  // apps/harmony_run_probe.cpp
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<CLI::App*> subs = app.get_subcommands();
    std::cerr << core::command_line_error("harmony-run", e.what(), subs.empty() ? "" : subs.front()->get_name())
              << "\n";
    return kExitBadInput;
  }
  try {
    if (*profile) return cmd_profile(cli);
    if (*probe) return apps::cmd_probe(probe_cli);
    return cmd_train(cli);
  } catch (const core::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitBadInput;
  } catch (const core::InternalError& e) {
    std::cerr << "harmony-run: " << e.what()
              << "\n  this is a bug in harmony; please report it with the command line\n";
    return kExitInternal;
  } catch (const core::ScheduleError& e) {
    std::cerr << cli.config << ": error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const backend::BackendError& e) {  // bad weights, token file or checkpoint (FormatError, CheckpointError)
    std::cerr << "harmony-run: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const HostAllocationError& e) {
    report_host_resource_failure(fmt::format("out of host memory (std::bad_alloc) allocating {}", e.what()));
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    report_host_resource_failure("out of host memory (std::bad_alloc)");
    return kExitBadInput;
  } catch (const std::system_error& e) {  // a thread that cannot start: the address space or the process limit
    if (e.code() != std::errc::resource_unavailable_try_again && e.code() != std::errc::not_enough_memory) {
      std::cerr << "harmony-run: internal error: " << e.what() << "\n";
      return 1;
    }
    report_host_resource_failure(fmt::format("cannot start a thread: {}", e.what()),
                                 "each thread maps its stack (ulimit -s) and may reserve a malloc arena of 64 MiB "
                                 "in the address space: ");
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "harmony-run: internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

// run_cli, then the check that stdout took every byte (`--format json > /dev/full` must not exit 0).
int run_and_flush(int argc, char** argv) {
  // Into a file or pipe, stdout is buffered whole (up to 1 MiB) so that a failed write is seen by the final
  // flush with its reason (errno), not lost inside an earlier implicit flush.
  static char stdout_buffer[std::size_t{1} << 20];  // glibc ignores the size unless given the buffer
  if (isatty(STDOUT_FILENO) == 0) std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
  const int rc = run_cli(argc, argv);
  if (const auto problem = core::stdout_write_problem()) {
    std::cerr << "harmony-run: error: writing stdout: " << *problem << "\n";
    return rc != 0 ? rc : kExitFailure;
  }
  return rc;
}

int main(int argc, char** argv) {
  core::ignore_file_size_signal();  // past `ulimit -f` a write fails with EFBIG (exit 2, named), not SIGXFSZ (153)
  try {
    return run_and_flush(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "harmony-run: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "harmony-run: internal error\n";
  }
  return 1;
}
