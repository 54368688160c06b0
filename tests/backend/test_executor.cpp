// Tests of the v1 executor: Harmony-PP and Harmony-DP Programs (1, 2 and 4 GPUs, equal and re-sized
// microbatches, packs of one and of several layers and one pack of all, prefetch on and off) train the tiny GPT-2 to
// the same weights as the PlainTrainer, and a Program with a dependency removed is rejected by the read check.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"
#include "core/output/trace.hpp"
#include "core/program/lower.hpp"
#include "tests/backend/executor_fixture.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;
namespace core = harmony::core;

namespace {

using namespace executor_fixture;

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(double(a[i]) - double(b[i])) / (1e-6 + std::abs(double(b[i]))));
  return w;
}

}  // namespace

// Tolerances. Harmony-PP and single-GPU Harmony-DP: zero (bit-exact). Each layer's forward is per row; each
// pack's dW accumulates microbatch after microbatch in sample order on one device, and the kernels' weight
// gradients are row-order accumulations independent of the split (docs/backend.md), so any packing and any
// u_fwd/u_bwd give the PlainTrainer's bits. Harmony-DP on N > 1 GPUs: each replica accumulates its share,
// then the all-reduce adds the N partial sums, a different float summation order: per weight
// |ours - plain| <= 1e-6 + 1e-4·|plain| after 2 AdamW steps (a rounding difference of ~1e-7 relative in a
// gradient moves Adam's normalised step by far less; a wrong average (x N) or a dropped replica moves weights
// by ~lr = 3e-3, so the bound still catches them). Losses: rel 1e-6.
TEST_CASE("Harmony-PP and Harmony-DP Programs train like the PlainTrainer") {
  const Result ref = reference();
  struct Case {
    core::PlanKind kind;
    int gpus, u_fwd, u_bwd, pack;
    bool prefetch;
  };
  std::vector<Case> cases;
  for (core::PlanKind mode : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")})
    for (int gpus : {1, 2, 4})
      for (auto [uf, ub] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}})
        for (int pack : {1, 3, 4})
          for (bool pf : {false, true}) {
            if (mode == core::plan_kind("harmony-dp") && gpus == 4 && (uf != 1 || ub != 1)) continue;
            if (pf && !(gpus == 2 && pack == 1)) continue;  // prefetch lowering: one configuration per mode
            if (pack == 3 && gpus != 2) continue;           // keeps the test short under ASan
            cases.push_back({mode, gpus, uf, ub, pack, pf});
          }
  REQUIRE(cases.size() >= 20);  // the filters above must leave a real grid
  // DP shares of D/N = 2 and 1 samples; keep u <= share.
  int checked = 0;
  for (const Case& c : cases) {
    const int share = c.kind == core::plan_kind("harmony-dp") ? kB / c.gpus : kB;
    if (c.u_fwd > share || c.u_bwd > share) continue;
    ++checked;
    const std::string mode = core::plan_kind_name(c.kind);
    CAPTURE(mode);
    CAPTURE(c.gpus);
    CAPTURE(c.u_fwd);
    CAPTURE(c.u_bwd);
    CAPTURE(c.pack);
    CAPTURE(c.prefetch);
    Setup s(c.gpus);
    const core::Program prog = lower_harmony_plan(*s.model, c.kind, c.gpus, c.u_fwd, c.u_bwd, c.pack, c.prefetch);
    const Result r = run(prog, s);
    const bool exact = c.kind == core::plan_kind("harmony-pp") || c.gpus == 1;
    for (int k = 0; k < kSteps; ++k) {
      CHECK(std::abs(r.losses[k] - ref.losses[k]) <= 1e-6 * std::abs(ref.losses[k]));
      if (exact) CHECK(r.losses[k] == ref.losses[k]);
    }
    for (std::size_t l = 0; l < ref.weights.size(); ++l) {
      CAPTURE(l);
      if (exact) {
        CHECK(same_bits(r.weights[l], ref.weights[l]));
      } else {
        for (std::size_t i = 0; i < ref.weights[l].size(); ++i) {
          const double a = r.weights[l][i], b = ref.weights[l][i];
          if (!(std::abs(a - b) <= 1e-6 + 1e-4 * std::abs(b))) {
            CHECK(a == doctest::Approx(b));
            break;
          }
        }
      }
    }
    if (!exact) INFO("DP N=", c.gpus, " worst rel weight difference ", max_rel(r.weights[1], ref.weights[1]));
  }
  CHECK(checked >= 20);
}

TEST_CASE("a measured trace is recorded for every op") {
  Setup s(2);
  const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 2, 1, 1, true);
  std::vector<StepResult> steps;
  run(prog, s, &steps);
  const StepResult& sr = steps.back();
  REQUIRE(sr.begin.size() == prog.ops.size());
  for (std::size_t o = 0; o < prog.ops.size(); ++o) {
    CHECK(sr.begin[o] >= 0);
    CHECK(sr.end[o] >= sr.begin[o]);
  }
  std::ostringstream out;
  core::write_chrome_trace(out, prog, sr.begin, sr.end, {.source = "harmony-run (cpu)", .title = "test"});
  CHECK(out.str().find("traceEvents") != std::string::npos);
}

// topology.pinned_limit reaches the executor (harmony-run passes the machine file's) and is enforced on every
// device, the CPU device too: the total is the host weights and gradients (2 x 4 bytes per parameter) plus the
// interpreter's stash/swap channels, so at that total the executor is built and one byte less is refused with
// the numbers and the machine-file key. Before, the option never left harmony-run's defaults and the CPU device
// ignored it.
TEST_CASE("pinned_limit: the executor refuses a Program whose host buffers exceed the machine's pinned limit") {
  Setup s(2);
  const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 2, 1, 1, true);
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  Bytes weights_and_grads = 0;
  for (int l = 0; l < s.model->num_layers(); ++l) weights_and_grads += 2 * s.model->param_floats(l) * Bytes{4};
  // Find the exact total by bisection on the limit: the refusal must switch at one byte.
  auto builds = [&](Bytes limit) {
    try {
      Executor ex(prog, s.ptrs, *s.state, {.seq_len = kT, .adamw = kAdamW, .pinned_limit = limit});
      return true;
    } catch (const DeviceError& e) {
      CHECK(std::string(e.what()).find("pinned_limit") != std::string::npos);
      return false;
    }
  };
  CHECK(builds(0));                        // 0: no limit
  CHECK_FALSE(builds(weights_and_grads));  // the stash/swap channels come on top
  Bytes lo = weights_and_grads, hi = 64 * weights_and_grads;
  REQUIRE(builds(hi));
  while (hi - lo > 1) {
    const Bytes mid = lo + (hi - lo) / 2;
    (builds(mid) ? hi : lo) = mid;
  }
  CHECK(hi > weights_and_grads);
  CHECK_FALSE(builds(hi - 1));
  CHECK(builds(hi));
}

// The bf16 staging (Interpreter::stage_up / stage_down) counts in the same total: per queue that moves weights or
// gradients, two buffers of the smaller of staging_chunk_bytes and the queue's largest transfer. The smallest limit
// the executor accepts moves by exactly that difference between two chunk sizes (0 if the staging were left out).
TEST_CASE("pinned_limit: the bf16 staging buffers count in the pre-flight") {
  Setup s(2);
  const core::Program prog = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 2, 1, 1, true, DType::BF16);
  std::map<int, Bytes> largest;
  for (const core::Op& op : prog.ops) {
    if (op.kind == core::OpKind::WB || op.kind == core::OpKind::dWB) {
      Bytes& b = largest[op.queue];
      b = std::max(b, op.bytes);
    }
  }
  REQUIRE(largest.size() >= 2);
  const auto smallest_limit = [&](Bytes chunk) {
    auto builds = [&](Bytes limit) {
      try {
        Executor ex(prog, s.ptrs, *s.state,
                    {.seq_len = kT,
                     .adamw = kAdamW,
                     .pinned_limit = limit,
                     .dtype = DType::BF16,
                     .staging_chunk_bytes = chunk});
        return true;
      } catch (const DeviceError& e) {
        CHECK(std::string(e.what()).find("bf16 staging") != std::string::npos);
        return false;
      }
    };
    Bytes lo = 1, hi = Bytes{1} << 40;
    REQUIRE(builds(hi));
    while (hi - lo > 1) {
      const Bytes mid = lo + (hi - lo) / 2;
      (builds(mid) ? hi : lo) = mid;
    }
    return hi;
  };
  Bytes expected = 0;
  for (const auto& [queue, bytes] : largest)
    expected += 2 * (std::min<Bytes>(4096, bytes) - std::min<Bytes>(64, bytes));
  CHECK(expected > 0);
  CHECK(smallest_limit(4096) - smallest_limit(64) == expected);
}

// Not by luck: the check is static (the producer of every tensor read must be an ancestor of the reader
// through deps and queue order), so it fails whether or not the executor happens to run dY first.
TEST_CASE("a Program missing the dependency of a BWD on its dY is rejected") {
  // Harmony-DP with prefetch is left out on purpose: there dY is queued before the pack's WB on the SwapIn
  // stream and REC waits for WB, so dY still precedes BWD and removing the edge is harmless.
  for (auto [mode, pf] : std::vector<std::pair<core::PlanKind, bool>>{{core::plan_kind("harmony-pp"), false},
                                                                      {core::plan_kind("harmony-pp"), true},
                                                                      {core::plan_kind("harmony-dp"), false}}) {
    {
      CAPTURE(pf);
      Setup s(2);
      core::Program prog = lower_harmony_plan(*s.model, mode, 2, 1, 1, 1, pf);
      int victim = -1;
      for (std::size_t o = 0; o < prog.ops.size() && victim < 0; ++o) {
        core::Op& op = prog.ops[o];
        if (op.kind != core::OpKind::BWD) continue;
        auto it = std::find_if(op.deps.begin(), op.deps.end(),
                               [&](int d) { return prog.ops[static_cast<std::size_t>(d)].kind == core::OpKind::dY; });
        if (it != op.deps.end()) {
          op.deps.erase(it);
          victim = static_cast<int>(o);
        }
      }
      REQUIRE(victim >= 0);
      core::validate_program(prog);  // still structurally valid: only the data check can see it
      const std::string want = "executor: op " + prog.op_label(victim) + " (" + prog.op_id(victim) + ") reads";
      CHECK_THROWS_WITH_AS(run(prog, s), doctest::Contains(want.c_str()), ScheduleViolation);
    }
  }
}

// bf16 mixed precision. Harmony-PP on any GPU count and Harmony-DP on one GPU run each layer's bf16 kernels on the
// same rows in the same order as the bf16 PlainTrainer over microbatches of u_bwd (a pack's dW is rounded to bf16
// after each microbatch, as the trainer's is), and round the same fp32 masters: bit-exact. Harmony-DP on 2 GPUs
// adds the replicas' bf16 partial sums in fp32 and rounds once, where the trainer accumulates in bf16 microbatch
// after microbatch: a different rounding sequence, bounded like the bf16 oracle (tests/backend/test_oracle.cpp):
// losses within 2e-4 relative, and every weight within 2 lr steps (AdamW moves a weight by at most ~lr per step,
// so a noise-level gradient difference moves it by at most 2 lr after 2 steps; a wrong average or a dropped
// replica's gradient moves many weights further, and the loss by more than 2e-4).
TEST_CASE("bf16: Harmony Programs train like the bf16 PlainTrainer; the Program counts 2-byte tensors") {
  struct Case {
    core::PlanKind kind;
    int gpus, u_fwd, u_bwd, pack;
  };
  const std::vector<Case> cases = {
      {core::plan_kind("harmony-pp"), 1, 1, 1, 1}, {core::plan_kind("harmony-pp"), 2, 2, 1, 1},
      {core::plan_kind("harmony-pp"), 2, 1, 2, 4}, {core::plan_kind("harmony-pp"), 4, 1, 1, 1},
      {core::plan_kind("harmony-dp"), 1, 1, 2, 1}, {core::plan_kind("harmony-dp"), 2, 1, 1, 1},
  };
  for (const Case& c : cases) {
    const std::string mode = core::plan_kind_name(c.kind);
    CAPTURE(mode);
    CAPTURE(c.gpus);
    CAPTURE(c.u_fwd);
    CAPTURE(c.u_bwd);
    CAPTURE(c.pack);
    const Result ref = plain_run(DType::BF16, c.u_bwd);
    Setup s(c.gpus);
    const core::Program prog =
        lower_harmony_plan(*s.model, c.kind, c.gpus, c.u_fwd, c.u_bwd, c.pack, false, DType::BF16);
    const Result r = run(prog, s, nullptr, true, DType::BF16);
    if (c.gpus == 2) {
      // The staging in chunks of 500 elements (packs and layers split across chunks, both buffers of a queue in
      // turn) gives the same bits as whole transfers.
      Setup s2(c.gpus);
      const Result chunked = run(prog, s2, nullptr, true, DType::BF16, 1, nullptr, nullptr, 1000);
      CHECK(chunked.losses == r.losses);
      for (std::size_t l = 0; l < r.weights.size(); ++l) CHECK(same_bits(chunked.weights[l], r.weights[l]));
    }
    const bool exact = c.kind == core::plan_kind("harmony-pp") || c.gpus == 1;
    for (int k = 0; k < kSteps; ++k) {
      if (exact) {
        CHECK(r.losses[k] == ref.losses[k]);
      } else {
        CHECK(std::abs(r.losses[k] - ref.losses[k]) <= 2e-4 * std::abs(ref.losses[k]));
      }
    }
    for (std::size_t l = 0; l < ref.weights.size(); ++l) {
      CAPTURE(l);
      if (exact) {
        CHECK(same_bits(r.weights[l], ref.weights[l]));
      } else {
        CHECK(max_abs_diff(r.weights[l], ref.weights[l]) <= 2 * kSteps * kAdamW.lr);
      }
    }
  }
  // bf16 really differs from fp32 (the rounding is on), by about bf16's precision.
  const Result f32 = plain_run(DType::F32, 1), b16 = plain_run(DType::BF16, 1);
  CHECK(f32.losses[1] != b16.losses[1]);
  CHECK(std::abs(f32.losses[1] - b16.losses[1]) <= 1e-3 * std::abs(f32.losses[1]));

  // The Program's byte counts: every weight, activation and gradient transfer of a bf16 Program is half the fp32
  // Program's (the head's fp32 losses never move; the token ids a layer-0 X or sX moves stay int32).
  Setup s(2);
  const core::Program p32 = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 1, 1, 1, false, DType::F32);
  const core::Program p16 = lower_harmony_plan(*s.model, core::plan_kind("harmony-pp"), 2, 1, 1, 1, false, DType::BF16);
  REQUIRE(p32.ops.size() == p16.ops.size());
  Bytes moved32 = 0, moved16 = 0;
  for (std::size_t o = 0; o < p32.ops.size(); ++o) {
    const core::Op& a = p32.ops[o];
    const core::Op& b = p16.ops[o];
    CHECK(a.kind == b.kind);
    const bool ids = (a.kind == core::OpKind::X || a.kind == core::OpKind::sX) && a.layers.first == 0;  // int32
    if (!ids && (a.kind == core::OpKind::WB || a.kind == core::OpKind::dWB || a.kind == core::OpKind::Y ||
                 a.kind == core::OpKind::dX || a.kind == core::OpKind::dY || a.kind == core::OpKind::sX ||
                 a.kind == core::OpKind::X)) {
      CAPTURE(p32.op_label(static_cast<int>(o)));
      CHECK(b.bytes * 2 == a.bytes);
    }
    moved32 += a.bytes;
    moved16 += b.bytes;
  }
  CHECK(moved16 < moved32);
  MESSAGE("bytes moved per step: fp32 ", moved32, ", bf16 ", moved16);
}
