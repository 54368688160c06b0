// Measures a GPT-2's layers on a device (times as medians of the device's own stream timers, spread over
// several passes; peaks from the device's memory statistics) and the host AdamW per layer, and writes the result
// with metadata as a harmony-profile-json v1 profile.
#include "backend/profiler.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/adamw_parallel.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/ops.hpp"
#include "core/model/profile_write.hpp"

namespace harmony::backend {

namespace {

constexpr Bytes kI = sizeof(std::int32_t);

enum class Slot : std::uint8_t { W, dW, X, Tokens, Targets, Y, Act, dY, dX, Scratch };
constexpr std::array<const char*, 10> kSlotNames = {"W", "dW",  "X",  "tokens", "targets",
                                                    "Y", "act", "dY", "dX",     "scratch"};
const char* slot_name(Slot s) { return kSlotNames[static_cast<std::size_t>(s)]; }

std::vector<std::pair<Slot, Bytes>> buffer_plan(const Gpt2& m, int l, core::Phase phase, int u, int T, DType dt) {
  const Bytes es = dtype_bytes(dt);
  const LayerKind k = m.kind(l);
  const bool bwd = phase == core::Phase::Bwd;
  const Bytes ids = Bytes(u) * T * kI;
  std::vector<std::pair<Slot, Bytes>> plan;
  plan.emplace_back(Slot::W, m.param_floats(l) * es);
  if (bwd) plan.emplace_back(Slot::dW, m.param_floats(l) * es);
  if (k == LayerKind::Embedding) {
    plan.emplace_back(Slot::Tokens, ids);
  } else {
    plan.emplace_back(Slot::X, m.input_bytes(l, u, T, dt));
  }
  if (k == LayerKind::Head) plan.emplace_back(Slot::Targets, ids);
  plan.emplace_back(Slot::Y, m.output_bytes(l, u, T, dt));
  plan.emplace_back(Slot::Act, m.act_floats(l, u, T, dt) * es);
  if (bwd) {
    if (k != LayerKind::Head) plan.emplace_back(Slot::dY, m.output_bytes(l, u, T, dt));
    if (k != LayerKind::Embedding) plan.emplace_back(Slot::dX, m.input_bytes(l, u, T, dt));
    plan.emplace_back(Slot::Scratch, m.scratch_floats(l, u, T) * es);
  }
  std::erase_if(plan, [](const auto& e) { return e.second == 0; });
  return plan;
}

const char* phase_word(core::Phase p) { return p == core::Phase::Fwd ? "forward" : "backward"; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Synchronizes a stream when leaving a scope (declared after the buffers its work uses, so that an
// exception never frees memory a queued kernel still reads).
class SyncOnExit {
 public:
  explicit SyncOnExit(Stream& s) : s_(s) {}
  SyncOnExit(const SyncOnExit&) = delete;
  SyncOnExit& operator=(const SyncOnExit&) = delete;
  ~SyncOnExit() {
    try {
      s_.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error was already thrown to the caller, or will be
    }
  }

 private:
  Stream& s_;
};

struct Measurement {
  std::vector<double> times_s;  // one per timed run
  Bytes peak_bytes = 0;
  Bytes transient_bytes = 0;  // backward: what dY, dX and scratch take on the device (allocated last)
};

bool is_transient(Slot s) { return s == Slot::dY || s == Slot::dX || s == Slot::Scratch; }

class LayerProfiler {
 public:
  LayerProfiler(Device& device, const Gpt2& model, const HostState& state, const ProfileOptions& options)
      : dev_(device), m_(model), state_(state), opt_(options), rng_(options.seed) {
    stream_ = dev_.create_stream("profiler");
  }
  LayerProfiler(const LayerProfiler&) = delete;
  LayerProfiler& operator=(const LayerProfiler&) = delete;

  // `warmup` untimed and `runs` timed runs of layer l at microbatch u (peaks: of the whole measurement).
  Measurement measure(int l, core::Phase phase, int u, int warmup, int runs) {
    return opt_.dtype == DType::BF16 ? measure_as<Bf16>(l, phase, u, warmup, runs)
                                     : measure_as<float>(l, phase, u, warmup, runs);
  }

  // The layer's arguments over the device buffers, for a microbatch of u sequences of T tokens (n_tok in all).
  template <class E>
  static LayerArgs<E> layer_args(const std::array<Buffer, kSlotNames.size()>& buf, int u, int T, std::size_t n_tok) {
    const auto fptr = [&](Slot slot) { return buf[static_cast<std::size_t>(slot)].as<E>(); };
    LayerArgs<E> a;
    a.B = u;
    a.T = T;
    a.w = fptr(Slot::W);
    a.tokens = buf[static_cast<std::size_t>(Slot::Tokens)].as<std::int32_t>();
    a.targets = buf[static_cast<std::size_t>(Slot::Targets)].as<std::int32_t>();
    a.x = fptr(Slot::X);
    a.y = fptr(Slot::Y);
    a.act = fptr(Slot::Act);
    a.dw = fptr(Slot::dW);
    a.dy = fptr(Slot::dY);
    a.dx = fptr(Slot::dX);
    a.scratch = fptr(Slot::Scratch);
    a.loss_scale = 1.0f / static_cast<float>(n_tok);
    return a;
  }

  // The device time of each of `runs` runs of the layer's forward, and backward when `bwd`, after `warmup` untimed
  // ones: every run enqueued back to back between its own two stream timer points, read after the last, so that
  // the stream's queue stays as deep as in a training run and neither the host's launch of the first kernel nor
  // its synchronize is in a sample (timing each run from the host up to a synchronize put ~45 us of hand-off into
  // every CPU-device sample: a 1 us embedding measured 47 us).
  template <class E>
  std::vector<double> run_times(BasicDeviceOps<E>& ops, int l, const LayerArgs<E>& a, bool bwd, int warmup, int runs) {
    for (int i = 0; i < warmup; ++i) {
      m_.forward(ops, l, a);
      if (bwd) m_.backward(ops, l, a);
    }
    Stream& s = *stream_;
    std::vector<std::unique_ptr<StreamTimer>> timers;
    for (int i = 0; i < runs; ++i) {
      timers.push_back(s.timer());
      timers.back()->start();
      m_.forward(ops, l, a);
      if (bwd) m_.backward(ops, l, a);
      timers.back()->stop();
    }
    std::vector<double> times;
    times.reserve(timers.size());
    for (auto& t : timers) times.push_back(t->seconds());
    return times;
  }

  // E: the device element (float, or Bf16: synthetic data and weights rounded to nearest even on the host).
  template <class E>
  Measurement measure_as(int l, core::Phase phase, int u, int warmup, int runs) {
    const DType dt = opt_.dtype;
    const auto elem = [](float v) {
      if constexpr (std::is_same_v<E, Bf16>) {
        return to_bf16(v);
      } else {
        return v;
      }
    };
    const int T = opt_.seq_len, V = m_.config().vocab_size;
    const LayerKind k = m_.kind(l);
    const bool bwd = phase == core::Phase::Bwd;
    Stream& s = *stream_;
    s.synchronize();

    // Host data (outlives the copies: declared before the guard). The activations and their gradients are prefixes
    // of noise drawn once per profile and grown on demand: drawing them per layer and size dominated a GPU profile
    // (a GPT-2 medium at T = 1024: ~3 G normal draws, over 90 s on the first H200 run, for ~1 s of kernels).
    const auto n_tok = static_cast<std::size_t>(u) * static_cast<std::size_t>(T);
    HostBuffer ids_in, ids_tgt;
    std::uniform_int_distribution<std::int32_t> token(0, V - 1);
    const Bytes x_bytes = k == LayerKind::Embedding ? 0 : m_.input_bytes(l, u, T, dt);
    const Bytes dy_bytes = bwd && k != LayerKind::Head ? m_.output_bytes(l, u, T, dt) : 0;
    const std::span<const E> x_noise = noise<E>(x_noise_, x_bytes, 1.0f);
    const std::span<const E> dy_noise = noise<E>(dy_noise_, dy_bytes, 0.01f);
    if (k == LayerKind::Embedding) {
      ids_in = HostBuffer(Bytes(n_tok) * kI);
      for (std::int32_t& t : ids_in.span<std::int32_t>()) t = token(rng_);
    }
    if (k == LayerKind::Head) {
      ids_tgt = HostBuffer(Bytes(n_tok) * kI);
      for (std::int32_t& t : ids_tgt.span<std::int32_t>()) t = token(rng_);
    }

    dev_.reset_peak();
    const Bytes base = dev_.memory().in_use;
    std::array<Buffer, kSlotNames.size()> buf;
    Bytes transient = 0, output = 0;
    for (const auto& [slot, bytes] : buffer_plan(m_, l, phase, u, T, dt)) {
      const Bytes before = dev_.memory().in_use;
      buf[static_cast<std::size_t>(slot)] = dev_.alloc(
          bytes,
          fmt::format("profile layer {} ({}) {} u={}: {}", l, m_.layer_name(l), phase_word(phase), u, slot_name(slot)));
      if (is_transient(slot)) transient += dev_.memory().in_use - before;
      if (slot == Slot::Y) output = dev_.memory().in_use - before;
    }
    const SyncOnExit sync(s);
    const auto ptr = [&](Slot slot) { return buf[static_cast<std::size_t>(slot)].data(); };

    std::vector<E> w_host(state_.weights(l).size());
    std::transform(state_.weights(l).begin(), state_.weights(l).end(), w_host.begin(), elem);
    dev_.copy_h2d(s, ptr(Slot::W), w_host.data(), m_.param_floats(l) * Bytes(sizeof(E)));
    if (ids_in.bytes() > 0) dev_.copy_h2d(s, ptr(Slot::Tokens), ids_in.data(), ids_in.bytes());
    if (x_bytes > 0) dev_.copy_h2d(s, ptr(Slot::X), x_noise.data(), x_bytes);
    if (ids_tgt.bytes() > 0) dev_.copy_h2d(s, ptr(Slot::Targets), ids_tgt.data(), ids_tgt.bytes());
    if (dy_bytes > 0) dev_.copy_h2d(s, ptr(Slot::dY), dy_noise.data(), dy_bytes);
    if (bwd) dev_.fill_zero(s, ptr(Slot::dW), m_.param_floats(l) * Bytes(sizeof(E)));
    s.synchronize();

    const LayerArgs<E> a = layer_args<E>(buf, u, T, n_tok);
    BasicDeviceOps<E> ops(dev_, s);
    std::vector<double> times = run_times(ops, l, a, bwd, warmup, runs);
    // The backward's peak less its output: the timed backward recomputes the forward, whose output this harness
    // must give a buffer, but no executor holds a layer's output while its backward runs (a REC or FWD wrote and
    // released it), and core's accounts (docs/backend.md, "Profiling") do not count it there.
    return {std::move(times), dev_.memory().peak - base - (bwd ? output : 0), bwd ? transient : 0};
  }

 private:
  // The first `bytes` of `cache` as elements of E: scale * N(0, 1) draws, extended (never redrawn) when a larger
  // prefix is asked for, so each profile draws each element once. Called only with the stream idle (the copies
  // that read the cache have finished), since growing it moves it.
  template <class E>
  std::span<const E> noise(std::vector<std::byte>& cache, Bytes bytes, float scale) {
    const auto n = static_cast<std::size_t>(bytes) / sizeof(E);
    const std::size_t have = cache.size() / sizeof(E);
    if (n > have) {
      cache.resize(n * sizeof(E));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      E* p = reinterpret_cast<E*>(cache.data());
      for (std::size_t i = have; i < n; ++i) {
        const float v = scale * normal(rng_);
        if constexpr (std::is_same_v<E, Bf16>) {
          p[i] = to_bf16(v);
        } else {
          p[i] = v;
        }
      }
    }
    return {reinterpret_cast<const E*>(cache.data()), n};
  }

  Device& dev_;
  const Gpt2& m_;
  const HostState& state_;
  const ProfileOptions& opt_;
  std::mt19937_64 rng_;
  std::vector<std::byte> x_noise_, dy_noise_;  // noise<E>()'s caches (one dtype per profile)
  std::unique_ptr<Stream> stream_;
};

// The run times of every pass (profile_gpt2): [0 forward, 1 backward][size index][layer].
using Samples = std::array<std::vector<std::vector<std::vector<double>>>, 2>;
using ReportFn = std::function<void(ProfileStage, int, int)>;

// The first pass over one phase: every requested size (ascending) and layer, after the warm-up, until a size does
// not fit (it and the larger ones are dropped, with the reason; the smallest not fitting rethrows). Records the
// sizes measured, their peaks and saved bytes in res and their run times in samples. Returns the progress steps
// skipped by the drop.
int first_pass(LayerProfiler& prof, core::Phase phase, int runs, const ProfileOptions& o,
               const std::vector<std::vector<core::Bytes>>& saved, ProfileResult& res, Samples& samples,
               const ReportFn& report) {
  const bool fwd = phase == core::Phase::Fwd;
  const auto& sizes = o.ubatch_sizes;
  const int R = static_cast<int>(res.model.layers.size());
  std::vector<int>& measured = fwd ? res.model.ubatch_fwd : res.model.ubatch_bwd;
  auto& times = samples[fwd ? 0 : 1];
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int u = sizes[i];
    std::vector<Measurement> column;
    try {
      for (int l = 0; l < R; ++l) {
        report(fwd ? ProfileStage::Forward : ProfileStage::Backward, l, u);
        column.push_back(prof.measure(l, phase, u, o.warmup, runs));
      }
    } catch (const OutOfMemory& e) {
      if (i == 0) throw;  // not even the smallest size fits: nothing to profile
      (fwd ? res.dropped_fwd : res.dropped_bwd).assign(sizes.begin() + static_cast<std::ptrdiff_t>(i), sizes.end());
      (fwd ? res.dropped_fwd_reason : res.dropped_bwd_reason) = e.what();
      return static_cast<int>(sizes.size() - i) * R - static_cast<int>(column.size()) - 1;
    }
    measured.push_back(u);
    times.emplace_back();
    for (int l = 0; l < R; ++l) {
      core::Layer& L = res.model.layers[static_cast<std::size_t>(l)];
      Measurement& c = column[static_cast<std::size_t>(l)];
      times.back().push_back(std::move(c.times_s));
      (fwd ? L.fwd_peak_bytes : L.bwd_peak_bytes).push_back(c.peak_bytes);
      if (!fwd) L.bwd_transient_bytes.push_back(c.transient_bytes);
      if (!fwd) L.saved_bytes.push_back(saved[static_cast<std::size_t>(l)][i]);
    }
  }
  return 0;
}

// A later pass over one phase: the sizes the first measured, every layer, `runs` more run times each.
void later_pass(LayerProfiler& prof, core::Phase phase, int runs, const ProfileResult& res, Samples& samples,
                const ReportFn& report) {
  const bool fwd = phase == core::Phase::Fwd;
  const std::vector<int>& measured = fwd ? res.model.ubatch_fwd : res.model.ubatch_bwd;
  auto& times = samples[fwd ? 0 : 1];
  for (std::size_t i = 0; i < measured.size(); ++i) {
    for (int l = 0; l < static_cast<int>(res.model.layers.size()); ++l) {
      report(fwd ? ProfileStage::Forward : ProfileStage::Backward, l, measured[i]);
      const std::vector<double> t = prof.measure(l, phase, measured[i], 0, runs).times_s;
      auto& into = times[i][static_cast<std::size_t>(l)];
      into.insert(into.end(), t.begin(), t.end());
    }
  }
}

void validate(const Gpt2& model, const ProfileOptions& o) {
  if (o.seq_len <= 0 || o.seq_len > model.config().max_seq_len)
    throw BackendError(fmt::format("profile: sequence length {} outside 1..{} (the model's max_seq_len)", o.seq_len,
                                   model.config().max_seq_len));
  if (o.ubatch_sizes.empty()) throw BackendError("profile: no microbatch sizes to measure");
  for (std::size_t i = 0; i < o.ubatch_sizes.size(); ++i) {
    const int u = o.ubatch_sizes[i];
    if (u <= 0) throw BackendError(fmt::format("profile: microbatch size {} must be positive", u));
    if (i > 0 && u <= o.ubatch_sizes[i - 1])
      throw BackendError(
          fmt::format("profile: microbatch sizes must be strictly ascending ({} after {})", u, o.ubatch_sizes[i - 1]));
    if (std::int64_t(u) * o.seq_len > INT_MAX)
      throw BackendError(fmt::format("profile: microbatch {} x {} tokens is too large", u, o.seq_len));
  }
  if (o.warmup < 0) throw BackendError(fmt::format("profile: warm-up runs {} must be >= 0", o.warmup));
  if (o.repeats < 1) throw BackendError(fmt::format("profile: repeats {} must be >= 1", o.repeats));
  if (o.rounds < 1) throw BackendError(fmt::format("profile: rounds {} must be >= 1", o.rounds));
  o.adamw.validate();
}

// Times layer l's host update as the executors run it (update_layers on a ParallelAdamW pool of the run's thread
// count: timing the one-thread HostState::update instead made a GPT-2 medium's profile predict 1.5 s of updates
// per step where the first H200 run measured 73 ms) with synthetic gradients; restores the layer's weights,
// gradients, moments and step count (and, for layer 0, the head's weights and gradients, which the tied update
// reads and writes).
double time_update(HostState& state, int l, const ProfileOptions& o, ParallelAdamW& pool, std::mt19937_64& rng) {
  const Gpt2& m = state.model();
  const int head = m.head_layer();
  const auto copy = [](std::span<const float> s) { return std::vector<float>(s.begin(), s.end()); };
  const auto restore = [](const std::vector<float>& from, std::span<float> to) {
    std::copy(from.begin(), from.end(), to.begin());
  };
  const std::vector<float> w = copy(state.weights(l)), g = copy(state.grads(l)), mom1 = copy(state.exp_avg(l)),
                           mom2 = copy(state.exp_avg_sq(l));
  const std::int64_t steps = state.steps(l);
  std::vector<float> head_w, head_g;
  if (l == 0) {
    head_w = copy(state.weights(head));
    head_g = copy(state.grads(head));
  }
  std::uniform_real_distribution<float> grad(-1e-2f, 1e-2f);
  for (float& v : state.grads(l)) v = grad(rng);
  if (l == 0) {
    for (float& v : state.grads(head)) v = grad(rng);
  }
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    update_layers(state, o.adamw, l, l, pool);
    const double t = seconds_since(t0);
    if (i >= o.warmup) times.push_back(t);
  }
  restore(w, state.weights(l));
  restore(g, state.grads(l));
  restore(mom1, state.exp_avg(l));
  restore(mom2, state.exp_avg_sq(l));
  state.set_steps(l, steps);
  if (l == 0) {
    restore(head_w, state.weights(head));
    restore(head_g, state.grads(head));
  }
  return median(std::move(times));
}

}  // namespace

std::vector<ProfileBuffer> profile_buffers(const Gpt2& model, int layer, core::Phase phase, int u, int seq_len,
                                           DType dtype) {
  if (layer < 0 || layer >= model.num_layers())
    throw BackendError(fmt::format("profile_buffers: layer {} outside 0..{}", layer, model.num_layers() - 1));
  if (u <= 0 || seq_len <= 0)
    throw BackendError(fmt::format("profile_buffers: microbatch {} x {} tokens must be positive", u, seq_len));
  std::vector<ProfileBuffer> out;
  for (const auto& [slot, bytes] : buffer_plan(model, layer, phase, u, seq_len, dtype))
    out.push_back({slot_name(slot), bytes});
  return out;
}

ProfileResult profile_gpt2(Device& device, HostState& state, const ProfileOptions& options,
                           const ProgressFn& progress) {
  const Gpt2& model = state.model();
  validate(model, options);
  const int R = model.num_layers();
  const auto& sizes = options.ubatch_sizes;

  ProfileResult res;
  res.device_name = device.name();
  res.device_capacity_bytes = device.memory().capacity;
  res.config = model.config();
  res.options = options;
  // Sizes (weights, optimizer state, inputs) exactly as describe_gpt2 has them; times and peaks measured.
  res.model = describe_gpt2(model, options.seq_len, sizes, {.dtype = options.dtype});
  res.model.source = fmt::format("backend::profile_gpt2 on {}", device.name());
  res.model.ubatch_fwd.clear();
  res.model.ubatch_bwd.clear();
  std::vector<std::vector<core::Bytes>> saved;  // per layer and size: described exactly, kept for the sizes measured
  for (core::Layer& l : res.model.layers) {
    l.fwd_time_s.clear();
    l.bwd_time_s.clear();
    l.fwd_peak_bytes.clear();
    l.bwd_peak_bytes.clear();
    l.bwd_transient_bytes.clear();
    saved.push_back(std::move(l.saved_bytes));
    l.saved_bytes.clear();
  }

  // The timed runs are spread over `rounds` passes over every size and layer (round r takes repeats / rounds of
  // them, one more for r < repeats % rounds), so that a slow spell of a shared machine lands in one pass's samples of
  // every layer, not in every sample of a few layers. The first pass also runs the warm-up, measures the peaks and
  // finds the sizes that fit; later passes re-measure those.
  const int rounds = std::min(options.rounds, options.repeats);
  ProfileProgress pg;
  pg.total_steps = rounds * 2 * static_cast<int>(sizes.size()) * R + R;
  const auto report = [&](ProfileStage stage, int layer, int u) {
    ++pg.step;
    if (!progress) return;
    pg.stage = stage;
    pg.layer = layer;
    pg.ubatch = u;
    progress(pg);
  };

  Samples samples;
  {
    LayerProfiler prof(device, model, state, options);
    for (int r = 0; r < rounds; ++r) {
      const int runs = options.repeats / rounds + (r < options.repeats % rounds ? 1 : 0);
      for (const core::Phase phase : {core::Phase::Fwd, core::Phase::Bwd}) {
        if (r == 0) {
          pg.step += first_pass(prof, phase, runs, options, saved, res, samples, report);
        } else {
          later_pass(prof, phase, runs, res, samples, report);
          const auto& measured = phase == core::Phase::Fwd ? res.model.ubatch_fwd : res.model.ubatch_bwd;
          pg.step += static_cast<int>(sizes.size() - measured.size()) * R;
        }
      }
    }
  }
  for (int l = 0; l < R; ++l) {
    core::Layer& L = res.model.layers[static_cast<std::size_t>(l)];
    for (const auto& column : samples[0]) L.fwd_time_s.push_back(median(column[static_cast<std::size_t>(l)]));
    for (const auto& column : samples[1]) L.bwd_time_s.push_back(median(column[static_cast<std::size_t>(l)]));
  }

  std::mt19937_64 rng(options.seed ^ 0x9E3779B97F4A7C15ULL);
  ParallelAdamW pool(options.adamw_threads);
  for (int l = 0; l < R; ++l) {
    report(ProfileStage::Update, l, 0);
    res.model.layers[static_cast<std::size_t>(l)].update_time_cpu_s = time_update(state, l, options, pool, rng);
  }
  res.model.validate();
  return res;
}

std::string profile_json(const ProfileResult& result, const ProfileMeta& meta) {
  using nlohmann::json;
  core::Model model = result.model;
  if (!meta.model_name.empty()) model.name = meta.model_name;
  const Gpt2Config& c = result.config;
  const ProfileOptions& o = result.options;
  json md = json::object();
  md["hardware"] = {{"device", result.device_name},
                    {"device_kind", meta.device_kind},
                    {"device_description", meta.device_description},
                    {"device_memory_bytes", result.device_capacity_bytes},
                    {"host", meta.host},
                    {"threads", meta.threads}};
  md["source"] = {{"tool", meta.tool},
                  {"date_utc", meta.date_utc},
                  {"model_family", "gpt2"},
                  {"gpt2_config",
                   {{"vocab_size", c.vocab_size},
                    {"max_seq_len", c.max_seq_len},
                    {"n_layer", c.n_layer},
                    {"n_head", c.n_head},
                    {"n_embd", c.n_embd},
                    {"ln_eps", static_cast<double>(c.ln_eps)}}},
                  {"seq_len", o.seq_len}};
  md["units"] = {{"time",
                  "seconds (float; median of the timed repeats after the warm-up, each the device time between two "
                  "points of its stream, the repeats spread over `rounds` passes over every layer and size)"},
                 {"memory",
                  "bytes (int; device peak after reset_peak minus in-use at the layer's start: weights, inputs, "
                  "outputs, activations, gradients and scratch of one layer, each rounded to the allocation "
                  "granularity)"},
                 {"size", "bytes (int)"},
                 {"ubatch_size", "samples per microbatch"}};
  md["profiler"] = {{"warmup", o.warmup},
                    {"repeats", o.repeats},
                    {"rounds", std::min(o.rounds, o.repeats)},
                    {"statistic", "median"},
                    {"seed", o.seed},
                    {"adamw",
                     {{"lr", o.adamw.lr},
                      {"beta1", o.adamw.beta1},
                      {"beta2", o.adamw.beta2},
                      {"eps", o.adamw.eps},
                      {"weight_decay", o.adamw.weight_decay}}},
                    {"requested_ubatch_sizes", o.ubatch_sizes},
                    {"dropped_fwd", result.dropped_fwd},
                    {"dropped_fwd_reason", result.dropped_fwd_reason},
                    {"dropped_bwd", result.dropped_bwd},
                    {"dropped_bwd_reason", result.dropped_bwd_reason}};
  return core::write_profile_json(model, md);
}

}  // namespace harmony::backend
