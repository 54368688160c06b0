// Shared set-up of the executor tests (test_executor*.cpp): the tiny GPT-2 of
// tests/data/gpt2_tiny, its plain-trainer reference after kSteps AdamW steps (computed once), N capped CPU
// devices, and a run of a Program through the Executor (concurrent queues or serial) that checks every device is
// empty after each step.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"
#include "core/kinds/kinds.hpp"
#include "core/kinds/swapping.hpp"
#include "core/program/lower.hpp"
#include "core/program/state_layout.hpp"

namespace executor_fixture {

using namespace harmony::backend;
using harmony::core::kMiB;
namespace core = harmony::core;

constexpr int kB = 4, kT = 16, kSteps = 2;
const AdamWConfig kAdamW{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};

inline std::string data_dir() {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/gpt2_tiny/";
}

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> moments;  // run(): per layer its AdamW exp_avg, then its exp_avg_sq
};

// The PlainTrainer in `dtype` over microbatches of u (0: the whole minibatch): losses, weights and AdamW moments.
inline Result plain_run(DType dtype, int u) {
  const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
  const Gpt2 model(gpt2_config_from(file));
  HostState state(model);
  load_gpt2_weights(file, state);
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  std::vector<int> micro;
  for (int s = 0; u > 0 && s < kB; s += u) micro.push_back(std::min(u, kB - s));
  PlainTrainer trainer(*dev, state, {.batch = kB, .seq_len = kT, .microbatches = micro, .dtype = dtype});
  Result r;
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < kSteps; ++k) {
    tokens.batch(k, kB, kT, in, tgt);
    r.losses.push_back(trainer.step(in, tgt, kAdamW));
  }
  for (int l = 0; l < model.num_layers(); ++l) {
    r.weights.emplace_back(state.weights(l).begin(), state.weights(l).end());
    r.moments.emplace_back(state.exp_avg(l).begin(), state.exp_avg(l).end());
    r.moments.emplace_back(state.exp_avg_sq(l).begin(), state.exp_avg_sq(l).end());
  }
  return r;
}

inline const Result& reference() {
  static const Result ref = [] {
    const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
    const Gpt2 model(gpt2_config_from(file));
    HostState state(model);
    load_gpt2_weights(file, state);
    const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
    auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
    PlainTrainer trainer(*dev, state, {.batch = kB, .seq_len = kT, .microbatches = {}});
    Result r;
    std::vector<std::int32_t> in, tgt;
    for (int k = 0; k < kSteps; ++k) {
      tokens.batch(k, kB, kT, in, tgt);
      r.losses.push_back(trainer.step(in, tgt, kAdamW));
    }
    for (int l = 0; l < model.num_layers(); ++l)
      r.weights.emplace_back(state.weights(l).begin(), state.weights(l).end());
    return r;
  }();
  return ref;
}

struct Setup {
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<HostState> state;
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<Device*> ptrs;
  std::unique_ptr<Communicator> comm;  // the CPU communicator over ptrs (for run's comm)
  // jitter_us > 0: devices whose streams sleep randomly before each piece of work (CpuDeviceOptions::jitter_us,
  // seeded by jitter_seed), with freed memory poisoned, so a missing cross-stream order shows as different bits.
  explicit Setup(int gpus, Bytes capacity = 16 * kMiB, int jitter_us = 0, std::uint64_t jitter_seed = 0) {
    const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
    model = std::make_unique<Gpt2>(gpt2_config_from(file));
    state = std::make_unique<HostState>(*model);
    load_gpt2_weights(file, *state);
    for (int g = 0; g < gpus; ++g) {
      devs.push_back(cpu::make_cpu_device(g, {.capacity = capacity,
                                              .poison = jitter_us > 0 || cpu::kPoisonByDefault,
                                              .jitter_us = jitter_us,
                                              .jitter_seed = jitter_seed}));
      ptrs.push_back(devs.back().get());
    }
    comm = cpu::make_cpu_communicator(ptrs);
  }
};

// concurrent: ExecutorOptions::concurrent (one worker per Program queue) or the serial loop.
// run_ahead: ExecutorOptions::run_ahead. comm: ExecutorOptions::communicator (replica sums on the devices; e.g.
// s.comm), null: on the host. devices: what the executor runs on (null: s.ptrs).
inline Result run(const core::Program& prog, Setup& s, std::vector<StepResult>* steps = nullptr, bool concurrent = true,
                  DType dtype = DType::F32, int run_ahead = 1, Communicator* comm = nullptr,
                  const std::vector<Device*>* devices = nullptr, Bytes staging_chunk_bytes = Bytes{32} << 20) {
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  Executor ex(prog, devices != nullptr ? *devices : s.ptrs, *s.state,
              {.seq_len = kT,
               .adamw = kAdamW,
               .concurrent = concurrent,
               .run_ahead = run_ahead,
               .dtype = dtype,
               .staging_chunk_bytes = staging_chunk_bytes,
               .communicator = comm});
  Result r;
  // what the executor holds across steps: nothing, but a Program that sends updated weights up for the next step
  // (zero3-opt-offload: an update pass's WB) carries them from when it is built (core::state_layout)
  const bool carries = core::state_layout(prog).carried.has_value();
  std::vector<Bytes> held;
  for (auto* d : s.ptrs) {
    held.push_back(d->memory().in_use);
    CHECK((held.back() == 0) != carries);
  }
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < kSteps; ++k) {
    tokens.batch(k, kB, kT, in, tgt);
    StepResult sr = ex.step(in, tgt);
    r.losses.push_back(sr.loss);
    if (steps != nullptr) steps->push_back(std::move(sr));
    for (std::size_t d = 0; d < s.ptrs.size(); ++d)  // every step's device tensor released at its end
      CHECK(s.ptrs[d]->memory().in_use == held[d]);
  }
  for (int l = 0; l < s.model->num_layers(); ++l) {
    r.weights.emplace_back(s.state->weights(l).begin(), s.state->weights(l).end());
    r.moments.emplace_back(s.state->exp_avg(l).begin(), s.state->exp_avg(l).end());
    r.moments.emplace_back(s.state->exp_avg_sq(l).begin(), s.state->exp_avg_sq(l).end());
  }
  return r;
}

// The largest |a[i] - b[i]| (the replica runs' weight bound: at most 2 * kSteps * lr from the reference).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two runs' losses, weights and AdamW moments the same bits (doctest CHECKs, each layer and moment captured).
inline void check_same_bits(const Result& a, const Result& b) {
  CHECK(a.losses == b.losses);
  REQUIRE(a.weights.size() == b.weights.size());
  for (std::size_t l = 0; l < a.weights.size(); ++l) {
    CAPTURE(l);
    CHECK(same_bits(a.weights[l], b.weights[l]));
  }
  REQUIRE(a.moments.size() == b.moments.size());
  for (std::size_t i = 0; i < a.moments.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(a.moments[i], b.moments[i]));
  }
}

// A run stopped and restarted every step (a new executor each step, on `b`'s devices and state) trains `straight`'s
// losses, weights and first moments bit for bit: whatever an executor keeps across steps it rebuilds from the
// HostState, which every step leaves current.
inline void check_restarted(const core::Program& prog, Setup& b, const Result& straight, DType dtype) {
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  const ExecutorOptions opts{.seq_len = kT, .adamw = kAdamW, .dtype = dtype};
  std::vector<double> losses;
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < kSteps; ++k) {
    Executor ex(prog, b.ptrs, *b.state, opts);
    tokens.batch(k, kB, kT, in, tgt);
    losses.push_back(ex.step(in, tgt).loss);
  }
  CHECK(losses == straight.losses);
  for (int l = 0; l < b.model->num_layers(); ++l) {
    CAPTURE(l);
    CHECK(same_bits({b.state->weights(l).begin(), b.state->weights(l).end()},
                    straight.weights[static_cast<std::size_t>(l)]));
    CHECK(same_bits({b.state->exp_avg(l).begin(), b.state->exp_avg(l).end()},
                    straight.moments[2 * static_cast<std::size_t>(l)]));
  }
}

// The grids' Programs. Harmony: manual packs of pack_size layers, every replica lowered (as harmony-run does).
inline core::Program lower_harmony_plan(const Gpt2& model, core::PlanKind mode, int gpus, int u_fwd, int u_bwd,
                                        int pack_size, bool prefetch, DType dtype = DType::F32) {
  core::Plan plan;
  plan.kind = mode;
  plan.gpus = gpus;
  plan.minibatch = kB;
  plan.u_fwd = u_fwd;
  plan.u_bwd = u_bwd;
  core::manual_packs(model.num_layers(), pack_size, plan.packs_fwd, plan.packs_bwd);
  core::validate_packs(plan, model.num_layers());
  const core::Model desc = describe_gpt2(model, kT, {1, 2, 3, 4}, {.dtype = dtype});
  const core::TaskGraph g = core::compose_task_graph(plan, model.num_layers());
  return core::lower_harmony(g, desc, {.prefetch = prefetch, .dp_first_gpu_only = false});
}

// A swapping kind's plan: one microbatch size u, forced swap choices.
inline core::Plan swapping_plan(core::PlanKind kind, int gpus, int u, core::SwapChoice w, core::SwapChoice a) {
  core::Plan p;
  p.kind = kind;
  p.gpus = gpus;
  p.minibatch = kB;
  p.u_fwd = p.u_bwd = u;
  p.knobs.weights = w;
  p.knobs.activations = a;
  return p;
}

// The kinds without packs (the swapping kinds), in listing order.
inline std::vector<core::PlanKind> swapping_kinds() {
  std::vector<core::PlanKind> out;
  for (const core::PlanKind& k : core::plan_kinds())
    if (core::is_swapping_kind(k) && k->trains) out.push_back(k);  // zero-offload never swaps
  return out;
}

inline core::Program lower_swapping_plan(const Gpt2& model, const core::Plan& plan, DType dtype = DType::F32) {
  return core::lower_plan(plan, describe_gpt2(model, kT, {1, 2, 3, 4}, {.dtype = dtype}));
}

}  // namespace executor_fixture
