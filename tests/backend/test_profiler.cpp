// Tests of the profiler behind `harmony-run profile` and the profile writer: a tiny GPT-2 profiled on a CPU
// device has describe_gpt2's sizes, positive times, peaks equal to the documented buffers, round-trips
// through core::load_profile_text field for field and feeds the search; sizes that do not fit are dropped;
// the bundled paper profiles survive write -> read exactly. No assertion depends on how long anything took.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_device.hpp"
#include "backend/model/describe.hpp"
#include "backend/profiler.hpp"
#include "core/base/error.hpp"
#include "core/model/profile.hpp"
#include "core/model/profile_write.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/program/task_graph.hpp"
#include "core/search/search.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;
namespace core = harmony::core;
using core::Phase;

namespace {

const Gpt2Config kTiny{.vocab_size = 64, .max_seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
constexpr int kT = 8;
const std::vector<int> kSizes{1, 2, 4};
const AdamWConfig kAdamW{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};

ProfileOptions options() {
  ProfileOptions o;
  o.seq_len = kT;
  o.ubatch_sizes = kSizes;
  o.warmup = 1;
  o.repeats = 3;
  o.adamw = kAdamW;
  o.seed = 7;
  return o;
}

Bytes rounded(Bytes b) { return (b + cpu::kArenaAlignment - 1) / cpu::kArenaAlignment * cpu::kArenaAlignment; }

Bytes buffer_sum(const Gpt2& m, int l, Phase p, int u, bool round) {
  Bytes s = 0;
  for (const ProfileBuffer& b : profile_buffers(m, l, p, u, kT)) s += round ? rounded(b.bytes) : b.bytes;
  return s;
}

Bytes buffer(const Gpt2& m, int l, Phase p, int u, const std::string& name) {
  for (const ProfileBuffer& b : profile_buffers(m, l, p, u, kT)) {
    if (b.name == name) return b.bytes;
  }
  return 0;
}

// Every field load_profile reads, compared exactly (doubles too: the writer keeps full precision).
void check_same(const core::Model& a, const core::Model& b) {
  CHECK(a.name == b.name);
  CHECK(a.dtype == b.dtype);
  CHECK(a.ubatch_fwd == b.ubatch_fwd);
  CHECK(a.ubatch_bwd == b.ubatch_bwd);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    CAPTURE(i);
    const core::Layer &x = a.layers[i], &y = b.layers[i];
    CHECK(x.name == y.name);
    CHECK(x.is_criterion == y.is_criterion);
    CHECK(x.weight_bytes == y.weight_bytes);
    CHECK(x.buffer_bytes == y.buffer_bytes);
    CHECK(x.optimizer_state_bytes == y.optimizer_state_bytes);
    CHECK(x.param_count == y.param_count);
    CHECK(x.update_time_cpu_s == y.update_time_cpu_s);
    CHECK(x.input_bytes_per_sample == y.input_bytes_per_sample);
    CHECK(x.fwd_time_s == y.fwd_time_s);
    CHECK(x.bwd_time_s == y.bwd_time_s);
    CHECK(x.fwd_peak_bytes == y.fwd_peak_bytes);
    CHECK(x.bwd_peak_bytes == y.bwd_peak_bytes);
    CHECK(x.bwd_transient_bytes == y.bwd_transient_bytes);
    CHECK(x.saved_bytes == y.saved_bytes);
  }
}

std::string profile_path(const std::string& name) {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/configs/profiles/" + name;
}

struct Tiny {
  Gpt2 model{kTiny};
  HostState state{model};
  Tiny() { state.init_weights(3); }
};

}  // namespace

TEST_CASE("a tiny GPT-2 profiled on the CPU device: sizes, times, peaks, progress, state untouched") {
  Tiny t;
  const int R = t.model.num_layers();
  for (int l = 0; l < R; ++l) {  // non-zero gradients and moments, to see that they are restored
    std::fill(t.state.grads(l).begin(), t.state.grads(l).end(), 0.25f);
    std::fill(t.state.exp_avg(l).begin(), t.state.exp_avg(l).end(), 0.5f);
  }
  t.state.update(kAdamW, 0, R - 1);
  std::vector<std::vector<float>> w0, g0, m0, v0;
  for (int l = 0; l < R; ++l) {
    w0.emplace_back(t.state.weights(l).begin(), t.state.weights(l).end());
    g0.emplace_back(t.state.grads(l).begin(), t.state.grads(l).end());
    m0.emplace_back(t.state.exp_avg(l).begin(), t.state.exp_avg(l).end());
    v0.emplace_back(t.state.exp_avg_sq(l).begin(), t.state.exp_avg_sq(l).end());
  }

  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  std::vector<ProfileProgress> seen;
  const ProfileResult res =
      profile_gpt2(*dev, t.state, options(), [&](const ProfileProgress& p) { seen.push_back(p); });
  const core::Model& m = res.model;

  CHECK_NOTHROW(m.validate());
  CHECK(m.ubatch_fwd == kSizes);
  CHECK(m.ubatch_bwd == kSizes);
  CHECK(res.dropped_fwd.empty());
  CHECK(res.dropped_bwd.empty());
  CHECK(res.dropped_fwd_reason.empty());
  CHECK(res.device_name == "cpu:0");
  CHECK(res.device_capacity_bytes == 16 * kMiB);
  CHECK(res.config == kTiny);
  CHECK(dev->memory().in_use == 0);  // everything freed

  // Sizes exactly as describe_gpt2 has them.
  const core::Model d = describe_gpt2(t.model, kT, kSizes);
  CHECK(m.name == d.name);
  REQUIRE(m.num_layers() == R);
  for (int l = 0; l < R; ++l) {
    CAPTURE(l);
    const core::Layer &p = m.layers[static_cast<std::size_t>(l)], &q = d.layers[static_cast<std::size_t>(l)];
    CHECK(p.name == q.name);
    CHECK(p.is_criterion == (l == R - 1));
    CHECK(p.is_criterion == q.is_criterion);
    CHECK(p.weight_bytes == q.weight_bytes);
    CHECK(p.buffer_bytes == 0);
    CHECK(p.optimizer_state_bytes == q.optimizer_state_bytes);
    CHECK(p.param_count == q.param_count);
    CHECK(p.input_bytes_per_sample == q.input_bytes_per_sample);
    CHECK(p.update_time_cpu_s > 0.0);
    CHECK(std::isfinite(p.update_time_cpu_s));
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const int u = kSizes[i];
      CAPTURE(u);
      CHECK(p.fwd_time_s[i] > 0.0);
      CHECK(p.bwd_time_s[i] > 0.0);
      CHECK(std::isfinite(p.fwd_time_s[i]));
      CHECK(std::isfinite(p.bwd_time_s[i]));
      // Peaks: exactly the documented buffers, each rounded to the arena's 256 bytes.
      CHECK(p.fwd_peak_bytes[i] == buffer_sum(t.model, l, Phase::Fwd, u, true));
      CHECK(p.bwd_peak_bytes[i] ==
            buffer_sum(t.model, l, Phase::Bwd, u, true) - rounded(buffer(t.model, l, Phase::Bwd, u, "Y")));
      const Bytes W = p.weight_bytes, X = t.model.input_bytes(l, u, kT), Y = t.model.output_bytes(l, u, kT);
      CHECK(p.fwd_peak_bytes[i] >= W + X + Y);
      CHECK(p.bwd_peak_bytes[i] >= 2 * W + X);
      CHECK(p.bwd_peak_bytes[i] > p.fwd_peak_bytes[i]);
      // Against describe_gpt2's formulas, in the same convention (the weights and, backward, the whole weight
      // gradient in the peak; not the backward's output, which the harness allocates for the recomputed forward and
      // subtracts): ours add the head's targets; the difference is then only the rounding of each buffer.
      const Bytes targets = buffer(t.model, l, Phase::Fwd, u, "targets");
      CHECK(buffer_sum(t.model, l, Phase::Fwd, u, false) == q.fwd_peak_bytes[i] + targets);
      CHECK(buffer_sum(t.model, l, Phase::Bwd, u, false) == q.bwd_peak_bytes[i] + Y + targets);
      const auto n = static_cast<Bytes>(profile_buffers(t.model, l, Phase::Bwd, u, kT).size());
      CHECK(p.bwd_peak_bytes[i] - (q.bwd_peak_bytes[i] + targets) < n * cpu::kArenaAlignment);
      // The saved activations are recorded as the description has them: the executor's act block.
      REQUIRE(p.saved_bytes.size() == kSizes.size());
      CHECK(p.saved_bytes[i] == q.saved_bytes[i]);
      CHECK(p.saved_bytes[i] == t.model.act_floats(l, u, kT) * 4);
      CHECK(core::saved_activation_bytes(m, u, l) == p.saved_bytes[i]);
      if (i > 0) {
        CHECK(p.fwd_peak_bytes[i] >= p.fwd_peak_bytes[i - 1]);
        CHECK(p.bwd_peak_bytes[i] >= p.bwd_peak_bytes[i - 1]);
      }
    }
  }

  // The buffer lists name what each layer kind holds.
  const auto names = [&](int l, Phase ph) {
    std::vector<std::string> v;
    for (const ProfileBuffer& b : profile_buffers(t.model, l, ph, 2, kT)) v.push_back(b.name);
    return v;
  };
  CHECK(names(0, Phase::Fwd) == std::vector<std::string>{"W", "tokens", "Y"});
  CHECK(names(0, Phase::Bwd) == std::vector<std::string>{"W", "dW", "tokens", "Y", "dY"});
  CHECK(names(1, Phase::Fwd) == std::vector<std::string>{"W", "X", "Y", "act"});
  CHECK(names(1, Phase::Bwd) == std::vector<std::string>{"W", "dW", "X", "Y", "act", "dY", "dX", "scratch"});
  CHECK(names(R - 1, Phase::Bwd) == std::vector<std::string>{"W", "dW", "X", "targets", "Y", "act", "dX", "scratch"});
  CHECK_THROWS_AS(profile_buffers(t.model, R, Phase::Fwd, 1, kT), BackendError);

  // Progress: every step once, in order: three passes (rounds 3, one of the 3 repeats each) over every size and
  // layer, forward then backward, then the updates.
  const int pass = 2 * static_cast<int>(kSizes.size()) * R;
  const int total = 3 * pass + R;
  REQUIRE(seen.size() == static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].step == static_cast<int>(i) + 1);
    CHECK(seen[i].total_steps == total);
  }
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto at = [&](int k) { return seen[static_cast<std::size_t>(r * pass + k)]; };
    CHECK(at(0).stage == ProfileStage::Forward);
    CHECK(at(0).layer == 0);
    CHECK(at(0).ubatch == kSizes.front());
    CHECK(at(pass / 2 - 1).stage == ProfileStage::Forward);
    CHECK(at(pass / 2).stage == ProfileStage::Backward);
    CHECK(at(pass - 1).stage == ProfileStage::Backward);
    CHECK(at(pass - 1).ubatch == kSizes.back());
  }
  CHECK(seen.back().stage == ProfileStage::Update);
  CHECK(seen.back().layer == R - 1);

  // The host state is as it was (weights, gradients, moments, step counts).
  for (int l = 0; l < R; ++l) {
    CAPTURE(l);
    CHECK(std::equal(w0[l].begin(), w0[l].end(), t.state.weights(l).begin()));
    CHECK(std::equal(g0[l].begin(), g0[l].end(), t.state.grads(l).begin()));
    CHECK(std::equal(m0[l].begin(), m0[l].end(), t.state.exp_avg(l).begin()));
    CHECK(std::equal(v0[l].begin(), v0[l].end(), t.state.exp_avg_sq(l).begin()));
    CHECK(t.state.steps(l) == 1);
  }
}

TEST_CASE("the profile JSON round-trips, carries its metadata and feeds the search") {
  Tiny t;
  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  const ProfileResult res = profile_gpt2(*dev, t.state, options());
  ProfileMeta meta;
  meta.threads = 2;
  meta.host = "testhost";
  meta.date_utc = "2025-01-31T12:00:00Z";
  const std::string text = profile_json(res, meta);

  const core::Model back = core::load_profile_text(text, "tiny.json");
  check_same(back, res.model);
  CHECK(back.source == "tiny.json");
  CHECK_NOTHROW(back.validate());

  const nlohmann::json j = nlohmann::json::parse(text);
  CHECK(j["format"] == "harmony-profile-json");
  CHECK(j["format_version"] == 1);
  CHECK(j["model"] == res.model.name);
  CHECK(j["hardware"]["device"] == "cpu:0");
  CHECK(j["hardware"]["device_kind"] == "cpu");
  CHECK(j["hardware"]["device_memory_bytes"] == 16 * kMiB);
  CHECK(j["hardware"]["host"] == "testhost");
  CHECK(j["hardware"]["threads"] == 2);
  CHECK(j["source"]["tool"] == "harmony-run profile");
  CHECK(j["source"]["date_utc"] == "2025-01-31T12:00:00Z");
  CHECK(j["source"]["seq_len"] == kT);
  CHECK(j["source"]["gpt2_config"]["vocab_size"] == 64);
  CHECK(j["source"]["gpt2_config"]["n_layer"] == 2);
  CHECK(j["source"]["gpt2_config"]["n_head"] == 2);
  CHECK(j["source"]["gpt2_config"]["n_embd"] == 16);
  CHECK(j["source"]["gpt2_config"]["max_seq_len"] == 8);
  CHECK(j["profiler"]["warmup"] == 1);
  CHECK(j["profiler"]["repeats"] == 3);
  CHECK(j["profiler"]["statistic"] == "median");
  CHECK(j["profiler"]["rounds"] == 3);
  CHECK(j["profiler"]["requested_ubatch_sizes"] == kSizes);
  CHECK(j["profiler"]["dropped_bwd"].empty());
  CHECK(j.contains("units"));

  // A chosen model name replaces the generated one.
  ProfileMeta named = meta;
  named.model_name = "gpt2_tiny";
  CHECK(core::load_profile_text(profile_json(res, named), "n.json").name == "gpt2_tiny");

  // The paper's search over the profile on two GPUs: candidates exist, lower to Programs, and rank.
  core::SearchSpace space;
  space.kind = core::plan_kind("harmony-pp");
  space.gpus = 2;
  space.minibatch = 4;
  space.capacity_bytes = 16 * kMiB;
  space.spec.threads = 1;
  space.spec.top_k = -1;
  const std::vector<core::Candidate> cands = core::enumerate_candidates(back, space);
  REQUIRE(!cands.empty());
  const core::SearchResult sr = core::run_search(cands, space, [&](const core::Plan& plan) {
    const core::TaskGraph g = core::compose_task_graph(plan, back.num_layers());
    const core::Program prog = core::lower_harmony(g, back, core::LowerOptions{});
    core::RunReport r;
    r.plan = plan;
    r.num_ops = prog.ops.size();
    // A stand-in cost: every layer's measured backward time at u_bwd for each microbatch.
    for (int l = 0; l < back.num_layers(); ++l)
      r.iteration_time_s += back.time_s(Phase::Bwd, plan.u_bwd, l) * (static_cast<double>(plan.minibatch) / plan.u_bwd);
    return r;
  });
  CHECK(sr.num_candidates == cands.size());
  REQUIRE(!sr.ranked.empty());
  CHECK(sr.ranked.front().report.num_ops > 0);
  CHECK(sr.ranked.front().report.iteration_time_s > 0.0);
}

TEST_CASE("sizes that do not fit in device memory end the list; the smallest not fitting is an error") {
  Tiny t;
  const Gpt2& m = t.model;
  const int R = m.num_layers();
  Bytes fwd4 = 0, bwd2 = 0, bwd4 = 0;
  for (int l = 0; l < R; ++l) {
    fwd4 = std::max(fwd4, buffer_sum(m, l, Phase::Fwd, 4, true));
    bwd2 = std::max(bwd2, buffer_sum(m, l, Phase::Bwd, 2, true));
    bwd4 = std::max(bwd4, buffer_sum(m, l, Phase::Bwd, 4, true));
  }
  const Bytes capacity = std::max(fwd4, bwd2);
  REQUIRE(bwd4 > capacity);  // the backward at u = 4 cannot fit, everything else can

  auto dev = cpu::make_cpu_device(0, {.capacity = capacity});
  std::vector<ProfileProgress> seen;
  const ProfileResult res =
      profile_gpt2(*dev, t.state, options(), [&](const ProfileProgress& p) { seen.push_back(p); });
  // The later passes measure only what fitted in the first; the steps of the dropped size are skipped in each.
  REQUIRE(!seen.empty());
  CHECK(seen.back().step == seen.back().total_steps);
  const int pass = 2 * static_cast<int>(kSizes.size()) * R;
  CHECK(seen.back().total_steps == 3 * pass + R);
  for (const ProfileProgress& p : seen) {
    if (p.stage == ProfileStage::Backward && p.ubatch == 4) CHECK(p.step <= pass);
  }
  CHECK(res.model.ubatch_fwd == kSizes);
  CHECK(res.model.ubatch_bwd == std::vector<int>{1, 2});
  CHECK(res.dropped_fwd.empty());
  CHECK(res.dropped_bwd == std::vector<int>{4});
  CHECK(res.dropped_bwd_reason.find("backward u=4") != std::string::npos);
  CHECK(res.dropped_bwd_reason.find("out of memory") != std::string::npos);
  for (const core::Layer& l : res.model.layers) {
    CHECK(l.bwd_time_s.size() == 2);
    CHECK(l.bwd_peak_bytes.size() == 2);
  }
  CHECK(dev->memory().in_use == 0);
  const std::string text = profile_json(res);
  check_same(core::load_profile_text(text, "t.json"), res.model);
  CHECK(nlohmann::json::parse(text)["profiler"]["dropped_bwd"] == std::vector<int>{4});

  // Not even u = 1 fits: the OutOfMemory names the layer, the phase and the size.
  Bytes fwd1 = 0;
  for (int l = 0; l < R; ++l) fwd1 = std::max(fwd1, buffer_sum(m, l, Phase::Fwd, 1, true));
  auto small = cpu::make_cpu_device(1, {.capacity = fwd1 - cpu::kArenaAlignment});
  try {
    (void)profile_gpt2(*small, t.state, options());
    FAIL("expected OutOfMemory");
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    CHECK(what.find("forward u=1") != std::string::npos);
    CHECK(what.find("profile layer") != std::string::npos);
  }
}

TEST_CASE("more rounds than repeats: one pass per timed run") {
  Tiny t;
  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  ProfileOptions o = options();
  o.repeats = 2;
  o.rounds = 5;
  int total = 0;
  const ProfileResult res = profile_gpt2(*dev, t.state, o, [&](const ProfileProgress& p) { total = p.total_steps; });
  const int R = t.model.num_layers();
  CHECK(total == 2 * (2 * static_cast<int>(kSizes.size()) * R) + R);
  CHECK(nlohmann::json::parse(profile_json(res))["profiler"]["rounds"] == 2);
  for (const core::Layer& l : res.model.layers) {
    for (const double v : l.fwd_time_s) CHECK(v > 0.0);
    for (const double v : l.bwd_time_s) CHECK(v > 0.0);
  }
}

TEST_CASE("invalid profiler options are refused") {
  Tiny t;
  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  const auto fails = [&](auto edit) {
    ProfileOptions o = options();
    edit(o);
    CHECK_THROWS_AS(profile_gpt2(*dev, t.state, o), BackendError);
  };
  fails([](ProfileOptions& o) { o.seq_len = 0; });
  fails([](ProfileOptions& o) { o.seq_len = kTiny.max_seq_len + 1; });
  fails([](ProfileOptions& o) { o.ubatch_sizes = {}; });
  fails([](ProfileOptions& o) { o.ubatch_sizes = {2, 1}; });
  fails([](ProfileOptions& o) { o.ubatch_sizes = {0, 1}; });
  fails([](ProfileOptions& o) { o.repeats = 0; });
  fails([](ProfileOptions& o) { o.warmup = -1; });
  fails([](ProfileOptions& o) { o.rounds = 0; });
  fails([](ProfileOptions& o) { o.adamw.lr = -1.0; });
}

TEST_CASE("the writer round-trips the paper's profiles exactly") {
  for (const char* name : {"gpt2_medium.json", "bert_large.json"}) {
    CAPTURE(name);
    const core::Model m = core::load_profile(profile_path(name));
    const std::string text = core::write_profile_json(m);
    const core::Model back = core::load_profile_text(text, "written.json");
    check_same(back, m);
    // Written twice, the text is the same (deterministic).
    CHECK(core::write_profile_json(back) == text);
  }
}

TEST_CASE("the writer refuses what the reader would reject") {
  const core::Model good = core::load_profile(profile_path("gpt2_medium.json"));
  {
    core::Model m = good;
    m.layers[1].fwd_time_s[0] = std::nan("");
    CHECK_THROWS_AS(core::write_profile_json(m), core::ScheduleError);
  }
  {
    core::Model m = good;
    m.layers[2].bwd_time_s[0] = -1.0;
    CHECK_THROWS_AS(core::write_profile_json(m), core::ScheduleError);
  }
  {
    core::Model m = good;
    m.layers[2].fwd_peak_bytes[0] = -1;
    CHECK_THROWS_AS(core::write_profile_json(m), core::ScheduleError);
  }
  {
    core::Model m = good;
    m.name.clear();
    CHECK_THROWS_AS(core::write_profile_json(m), core::ScheduleError);
  }
  {
    core::Model m = good;
    m.layers[0].fwd_time_s.pop_back();  // misaligned: validate() fails
    CHECK_THROWS_AS(core::write_profile_json(m), core::ScheduleError);
  }
  CHECK_THROWS_AS(core::write_profile_json(good, nlohmann::json{{"layers", 1}}), core::ScheduleError);
  CHECK_THROWS_AS(core::write_profile_json(good, nlohmann::json::array()), core::ScheduleError);
  // Metadata members land at the top level and are ignored by the reader.
  const std::string text = core::write_profile_json(good, nlohmann::json{{"hardware", {{"gpu", "x"}}}});
  CHECK(nlohmann::json::parse(text)["hardware"]["gpu"] == "x");
  check_same(core::load_profile_text(text, "m.json"), good);
}

TEST_CASE("a bf16 profile: 2-byte sizes and peaks, \"dtype\": \"bf16\" recorded; a profile without dtype is fp32") {
  Tiny t;
  const Gpt2& m = t.model;
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kMiB});
  ProfileOptions o = options();
  o.repeats = 1;
  const ProfileResult f32 = profile_gpt2(*dev, t.state, o);
  o.dtype = DType::BF16;
  const ProfileResult b16 = profile_gpt2(*dev, t.state, o);
  CHECK(f32.model.dtype == "fp32");
  CHECK(b16.model.dtype == "bf16");
  for (int l = 0; l < m.num_layers(); ++l) {
    CAPTURE(l);
    const core::Layer &a = f32.model.layers[static_cast<std::size_t>(l)],
                      &b = b16.model.layers[static_cast<std::size_t>(l)];
    CHECK(b.weight_bytes * 2 == a.weight_bytes);
    // fp32 moments on the host either way; bf16 adds the fp32 masters the device weights no longer are
    CHECK(b.optimizer_state_bytes * 2 == a.optimizer_state_bytes * 3);
    if (l > 0) CHECK(b.input_bytes_per_sample * 2 == a.input_bytes_per_sample);
    for (std::size_t i = 0; i < a.bwd_peak_bytes.size(); ++i) {
      CHECK(b.bwd_peak_bytes[i] < a.bwd_peak_bytes[i]);  // measured: about half (fp32 losses and ids stay)
      CHECK(b.bwd_peak_bytes[i] * 10 <= a.bwd_peak_bytes[i] * 6);
    }
    for (const ProfileBuffer& pb : profile_buffers(m, l, Phase::Bwd, 2, kT, DType::BF16)) {
      CAPTURE(pb.name);
      const bool same = pb.name == "tokens" || pb.name == "targets" || (pb.name == "Y" && l == m.head_layer());
      if (pb.name == "act") {  // half, but the LayerNorms' mean and rstd rows stay fp32 (4 per block, 2 in the head)
        const Bytes stats = (l == m.head_layer() ? 2 : 4) * Bytes(2) * kT;
        CHECK(pb.bytes * 2 == buffer(m, l, Phase::Bwd, 2, pb.name) + stats * 4);
        CHECK(pb.bytes == Bytes(m.act_floats(l, 2, kT, DType::BF16)) * 2);
      } else {
        CHECK(pb.bytes * (same ? 1 : 2) == buffer(m, l, Phase::Bwd, 2, pb.name));
      }
    }
  }
  // The written profile records the dtype and round-trips; fp32 writes none (the format before mixed precision).
  const std::string text = profile_json(b16);
  CHECK(nlohmann::json::parse(text)["dtype"] == "bf16");
  const core::Model back = core::load_profile_text(text, "b.json");
  CHECK(back.dtype == "bf16");
  check_same(back, b16.model);
  const std::string old = profile_json(f32);
  CHECK_FALSE(nlohmann::json::parse(old).contains("dtype"));
  CHECK(core::load_profile_text(old, "f.json").dtype == "fp32");
  // A bad dtype is a located error.
  std::string bad = text;
  bad.replace(bad.find("\"bf16\""), 6, "\"fp8\"");
  try {
    (void)core::load_profile_text(bad, "bad.json");
    FAIL("expected a ConfigError");
  } catch (const core::ConfigError& e) {
    CHECK(std::string(e.what()).find("unknown dtype \"fp8\"") != std::string::npos);
    CHECK(std::string(e.what()).find("bad.json:") != std::string::npos);
  }
}
