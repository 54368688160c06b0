// harmony-run's setup: command-line flags as config overrides, the model and its token file, the host-memory
// pre-flight, the devices of the config's kind (the registry), the profile a prediction is priced on, and the
// small helpers every command shares (apps/run/common.hpp).
#include "apps/run/common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
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

double mib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kMiB); }

// A device capacity as the tables print it ("1.00 MiB", "10 B"): never "0.00 MiB" for a handful of bytes.
std::string capacity_text(core::Bytes b) { return core::format_bytes(b); }

std::string absolute(const std::string& path) { return std::filesystem::absolute(path).lexically_normal().string(); }

double gib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kGiB); }

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
  if (f.exact && f.tree_sums)
    throw core::ConfigError(core::SourceLoc{"--exact", 0, 0}, "--exact and --tree-sums ask for opposite reductions",
                            "drop one: tree sums are the default on a device that has them, --exact turns them off");
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
  if (const core::PlanKind kind = cfg.plan.kind; !kind->trains)
    throw core::ConfigError(
        cfg.plan.mode_loc,
        fmt::format("plan.mode {}: harmony-run does not train this kind yet; harmony-sim prices it", kind.name()),
        fmt::format("price it with harmony-sim (simulate, compare); to train the same updates, use mode: {} "
                    "(docs/baselines.md#{})",
                    kind->trains_as, kind.name()));
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
  const core::Bytes need = h.total_bytes() + arenas;
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
                  h.staging_bytes > 0 ? fmt::format(", staging buffers {}", core::format_bytes(h.staging_bytes))
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
// --exact, --no-fuse and --poison; `timing`: never poisoned (the profiler's timings). The fast reductions and the
// fused kernels are the default wherever the kind has them (DeviceCaps::tree_sums: tree column sums, the bf16 fast
// path; DeviceCaps::fused); --exact keeps the strict row order, the CPU device's bits, and no fused kernel (docs/
// backend.md, "Fast and exact reductions", "Fused kernels"); --no-fuse only the latter.
std::unique_ptr<backend::Device> make_device(const core::TrainConfig& cfg, const DeviceFlags& f, int g, bool timing) {
  using Poison = backend::DeviceOptions::Poison;
  const backend::DeviceKind& kind = device_kind(cfg);
  return kind.make_device(g, {.capacity = cfg.machine.gpu_memory_bytes,
                              .tf32 = f.tf32,
                              .tree_sums = kind.caps().tree_sums && !f.exact,
                              .fused = kind.caps().fused && !f.exact && !f.no_fuse,
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
// and not the profiler's per-layer peaks (the same buffers, each rounded to the device's allocation granule, and the
// head's targets).
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
    // the saved activations exactly as the executor keeps them (a profile written before they were recorded has
    // none; one whose sizes the description does not cover keeps its own)
    std::vector<core::Bytes> saved;
    for (const int u : prof.ubatch_bwd) {
      const core::Bytes b = exact.ubatch_in_range(core::Phase::Bwd, u) ? exact.recorded_saved_bytes(u, l) : -1;
      if (b < 0) break;
      saved.push_back(b);
    }
    if (saved.size() == prof.ubatch_bwd.size()) L.saved_bytes = std::move(saved);
  }
  return prof;
}

core::LowerOptions lower_options(const core::TrainConfig& cfg) {
  core::LowerOptions o = core::lower_options(cfg.options);
  o.dp_first_gpu_only = false;  // the executor runs every GPU
  return o;
}

backend::AdamWConfig adamw_config(const core::TrainConfig& cfg) {
  return backend::AdamWConfig{.lr = cfg.train.lr,
                              .beta1 = cfg.train.beta1,
                              .beta2 = cfg.train.beta2,
                              .eps = cfg.train.eps,
                              .weight_decay = cfg.train.weight_decay};
}

backend::ExecutorOptions executor_options(const Cli& cli, const core::TrainConfig& cfg,
                                          backend::Communicator* communicator) {
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

}  // namespace harmony::run
