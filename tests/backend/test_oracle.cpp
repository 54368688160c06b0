// The PyTorch oracles (tests/data/gpt2_tiny and gpt2_tiny_bf16, made by scripts/make_gpt2_oracle.py with torch
// 1.13): from the same initial weights (HF safetensors) and llm.c token file, the plain trainer on a CPU device must
// reproduce torch's step-0 gradients, its per-step losses over 5 AdamW steps and its final weights within the
// tolerances below (reasons in docs/backend.md, "Tolerances" and "Mixed precision"), in fp32 and in bf16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_device.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"

using namespace harmony::backend;

namespace {

std::string data_dir(const char* name = "gpt2_tiny") {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/" + name + "/";
}

nlohmann::json load_oracle(const char* name = "gpt2_tiny") {
  std::ifstream in(data_dir(name) + "oracle.json");
  REQUIRE_MESSAGE(in.good(), "cannot open ", data_dir(name), "oracle.json (set HARMONY_SOURCE_DIR)");
  return nlohmann::json::parse(in);
}

// Largest violation of |got - want| <= atol + rtol * |want| over every HF tensor, as a ratio (<= 1 passes).
struct Worst {
  double ratio = 0;
  double abs_err = 0;
  std::string where;
};

void compare(const std::string& name, std::span<const float> got, const std::vector<float>& want, double atol,
             double rtol, Worst& worst) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double ratio = err / (atol + rtol * std::fabs(double(want[i])));
    if (!(ratio <= worst.ratio)) {
      worst.ratio = std::isnan(ratio) ? 1e30 : ratio;
      worst.abs_err = err;
      worst.where = name + "[" + std::to_string(i) + "]";
    }
  }
}

AdamWConfig adamw_of(const nlohmann::json& j) {
  AdamWConfig c;
  c.lr = j.at("lr");
  c.beta1 = j.at("beta1");
  c.beta2 = j.at("beta2");
  c.eps = j.at("eps");
  c.weight_decay = j.at("weight_decay");
  return c;
}

}  // namespace

// Tolerances (docs/backend.md, "Tolerances"). Both sides compute in fp32 but sum in different orders
// (torch's blocked BLAS and vectorised reductions, our fixed loops), a few ulps per operation. Observed
// worst cases (GCC 12, x86-64): gradients 6.5e-9 abs / 7e-5 rel (a wpe entry of 1e-4 built by cancelling
// sums), losses 6e-8 rel, weights 3.3e-7 abs after 5 steps. The bounds leave a 3x margin, and stay far
// below what a real bug moves: a sign or scale error in any gradient moves a weight by ~lr = 3e-3 per step,
// a missing weight decay by lr * wd * |w| >= 6e-6 per step for |w| >= 0.02.
constexpr double kGradAtol = 1e-8;
constexpr double kGradRtol = 1e-4;
constexpr double kLossRtol = 1e-6;  // ~10 ulps of a loss of 4.8
constexpr double kWeightAtol = 1e-6;
constexpr double kWeightRtol = 1e-5;

TEST_CASE("PyTorch oracle: step-0 gradients, per-step losses and final weights") {
  const nlohmann::json oracle = load_oracle();
  const auto dir = data_dir();
  const SafetensorsReader init = SafetensorsReader::open(dir + oracle.at("initial_weights").get<std::string>());
  const Gpt2Config cfg = gpt2_config_from(init);
  CHECK(cfg.vocab_size == oracle["config"]["vocab_size"].get<int>());
  CHECK(cfg.max_seq_len == oracle["config"]["n_positions"].get<int>());
  CHECK(cfg.n_layer == oracle["config"]["n_layer"].get<int>());
  CHECK(cfg.n_head == oracle["config"]["n_head"].get<int>());
  CHECK(cfg.n_embd == oracle["config"]["n_embd"].get<int>());
  const Gpt2 model(cfg);
  HostState state(model);
  load_gpt2_weights(init, state);

  const TokenFile tokens = TokenFile::load(dir + oracle["tokens"]["with_header"].get<std::string>());
  CHECK(tokens.has_header());
  const int B = oracle.at("batch_size"), T = oracle.at("seq_len"), steps = oracle.at("steps");
  const AdamWConfig adamw = adamw_of(oracle.at("adamw"));

  auto device = cpu::make_cpu_device(0, {.capacity = 16 * harmony::core::kMiB});
  PlainTrainer trainer(*device, state, {.batch = B, .seq_len = T, .microbatches = {}});
  std::vector<std::int32_t> inputs, targets;

  const std::vector<double> want_losses = oracle.at("losses");
  REQUIRE(static_cast<int>(want_losses.size()) == steps);
  double worst_loss = 0;
  for (int k = 0; k < steps; ++k) {
    tokens.batch(k, B, T, inputs, targets);
    const double loss = trainer.forward_backward(inputs, targets);
    const double rel = std::fabs(loss - want_losses[k]) / std::fabs(want_losses[k]);
    worst_loss = std::max(worst_loss, rel);
    CHECK_MESSAGE(rel <= kLossRtol, "step ", k, ": loss ", loss, " vs torch ", want_losses[k]);
    if (k == 0) {
      const SafetensorsReader grads = SafetensorsReader::open(dir + oracle.at("grads_step0").get<std::string>());
      Worst worst;
      for (int l = 0; l < model.num_layers(); ++l) {
        for (const ParamSpec& p : model.params(l)) {
          if (!p.tied_to.empty()) continue;
          std::vector<float> g(state.grad(l, p.name).begin(), state.grad(l, p.name).end());
          if (p.name == "wte.weight") {  // the tie: embedding + LM head contributions
            const auto gh = state.grad(model.head_layer(), "lm_head.weight");
            for (std::size_t i = 0; i < g.size(); ++i) g[i] += gh[i];
          }
          compare(p.name, g, grads.read_f32(p.name), kGradAtol, kGradRtol, worst);
        }
      }
      MESSAGE("step-0 gradients: worst ratio ", worst.ratio, " (abs err ", worst.abs_err, ") at ", worst.where);
      CHECK(worst.ratio <= 1.0);
    }
    state.update(adamw, 0, model.num_layers() - 1);
    trainer.upload_weights();
  }
  MESSAGE("losses: worst relative error ", worst_loss);

  const SafetensorsReader final_w = SafetensorsReader::open(dir + oracle.at("final_weights").get<std::string>());
  Worst worst;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (!p.tied_to.empty()) {
        CHECK(std::equal(state.weight(l, p.name).begin(), state.weight(l, p.name).end(),
                         state.weight(0, "wte.weight").begin()));
        continue;
      }
      compare(p.name, state.weight(l, p.name), final_w.read_f32(p.name), kWeightAtol, kWeightRtol, worst);
    }
  }
  MESSAGE("final weights: worst ratio ", worst.ratio, " (abs err ", worst.abs_err, ") at ", worst.where);
  CHECK(worst.ratio <= 1.0);
}

TEST_CASE("PyTorch oracle: the headerless token file gives the same batches") {
  const nlohmann::json oracle = load_oracle();
  const TokenFile with = TokenFile::load(data_dir() + oracle["tokens"]["with_header"].get<std::string>());
  const TokenFile raw = TokenFile::load(data_dir() + oracle["tokens"]["raw"].get<std::string>());
  CHECK(with.has_header());
  CHECK_FALSE(raw.has_header());
  CHECK(with.size() == oracle["tokens"]["count"].get<std::int64_t>());
  REQUIRE(with.size() == raw.size());
  CHECK(std::equal(with.tokens().begin(), with.tokens().end(), raw.tokens().begin()));
}

// ---- bf16 mixed precision (tests/data/gpt2_tiny_bf16, docs/backend.md "Mixed precision") ----

namespace {

// Per HF tensor, the relative L2 error ||got - want|| / ||want - base|| (base: zero for gradients, the initial
// weights for final weights, so that the error is relative to what training moved); the worst tensor.
struct WorstL2 {
  double rel = 0;
  std::string where;
  void add(const std::string& name, std::span<const float> got, const std::vector<float>& want,
           std::span<const float> base = {}) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double d = double(got[i]) - double(want[i]);
      const double w = double(want[i]) - (base.empty() ? 0.0 : double(base[i]));
      num += d * d;
      den += w * w;
    }
    const double r = den > 0 ? std::sqrt(num / den) : (num > 0 ? 1e30 : 0.0);
    if (!(r <= rel)) {
      rel = std::isnan(r) ? 1e30 : r;
      where = name;
    }
  }
};

struct Bf16Run {
  WorstL2 grads, weights;
  double loss_rel = 0;  // worst |loss - want| / want over the steps
  // The step-0 gradients the backward computes before it reaches the last block's attention (ln_f, the last block's
  // MLP and ln_2) pooled into one relative L2 error: no rounding point differs from torch's there but the layer-norm
  // statistics, which are fp32 on both sides.
  double tail_num = 0, tail_den = 0;
  double tail_rel() const { return tail_den > 0 ? std::sqrt(tail_num / tail_den) : 0.0; }
};

// Trains from the bf16 oracle's initial weights with `dtype` storage on a CPU device, microbatched as given,
// and measures the errors against the bf16 oracle.
Bf16Run run_against_bf16_oracle(DType dtype, const std::vector<int>& microbatches) {
  const nlohmann::json oracle = load_oracle("gpt2_tiny_bf16");
  CHECK(oracle.at("dtype") == "bf16");
  const auto dir = data_dir("gpt2_tiny_bf16");
  const SafetensorsReader init = SafetensorsReader::open(dir + oracle.at("initial_weights").get<std::string>());
  const Gpt2 model(gpt2_config_from(init));
  HostState state(model);
  load_gpt2_weights(init, state);
  const TokenFile tokens = TokenFile::load(dir + oracle["tokens"]["with_header"].get<std::string>());
  const int B = oracle.at("batch_size"), T = oracle.at("seq_len"), steps = oracle.at("steps");
  const AdamWConfig adamw = adamw_of(oracle.at("adamw"));
  auto device = cpu::make_cpu_device(0, {.capacity = 16 * harmony::core::kMiB});
  PlainTrainer trainer(*device, state, {.batch = B, .seq_len = T, .microbatches = microbatches, .dtype = dtype});
  const std::vector<double> want_losses = oracle.at("losses");
  REQUIRE(static_cast<int>(want_losses.size()) == steps);
  Bf16Run run;
  std::vector<std::int32_t> inputs, targets;
  for (int k = 0; k < steps; ++k) {
    tokens.batch(k, B, T, inputs, targets);
    const double loss = trainer.forward_backward(inputs, targets);
    run.loss_rel = std::max(run.loss_rel, std::fabs(loss - want_losses[k]) / std::fabs(want_losses[k]));
    if (k == 0) {
      const SafetensorsReader grads = SafetensorsReader::open(dir + oracle.at("grads_step0").get<std::string>());
      for (int l = 0; l < model.num_layers(); ++l) {
        for (const ParamSpec& p : model.params(l)) {
          if (!p.tied_to.empty()) continue;
          std::vector<float> g(state.grad(l, p.name).begin(), state.grad(l, p.name).end());
          if (p.name == "wte.weight") {  // the tie: both bf16 contributions added in fp32 on the host
            const auto gh = state.grad(model.head_layer(), "lm_head.weight");
            for (std::size_t i = 0; i < g.size(); ++i) g[i] += gh[i];
          }
          const std::vector<float> want = grads.read_f32(p.name);
          run.grads.add(p.name, g, want);
          const std::string last = "h." + std::to_string(model.config().n_layer - 1) + ".";
          if (p.name.starts_with("ln_f.") || p.name.starts_with(last + "mlp.") || p.name.starts_with(last + "ln_2.")) {
            for (std::size_t i = 0; i < want.size(); ++i) {
              run.tail_num += (double(g[i]) - want[i]) * (double(g[i]) - want[i]);
              run.tail_den += double(want[i]) * want[i];
            }
          }
        }
      }
    }
    state.update(adamw, 0, model.num_layers() - 1);
    trainer.upload_weights();
  }
  const SafetensorsReader final_w = SafetensorsReader::open(dir + oracle.at("final_weights").get<std::string>());
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (p.tied_to.empty())
        run.weights.add(p.name, state.weight(l, p.name), final_w.read_f32(p.name), init.read_f32(p.name));
    }
  }
  return run;
}

void report(const std::string& what, const Bf16Run& r) {
  MESSAGE(what, ": step-0 gradients worst relative L2 ", r.grads.rel, " (", r.grads.where, "), losses worst relative ",
          r.loss_rel, ", weight updates worst relative L2 ", r.weights.rel, " (", r.weights.where,
          "); ln_f, last MLP and ln_2 gradients pooled relative L2 ", r.tail_rel());
}

}  // namespace

// Tolerances for bf16 (docs/backend.md, "Mixed precision"). bf16 keeps 8 significant bits: one rounding errs
// by up to 2^-9 = 0.2% of the value. Both sides round at nearly the same points (the forward matches torch's to
// 1e-7 at step 0; the layer-norm mean/rstd are fp32 on both sides), but not all: ours keeps the attention
// probabilities in bf16 for the backward where torch keeps fp32, and a residual's gradient is summed before rather
// than after its rounding. Each such difference is one bf16 rounding, and through the two blocks' backward they add
// up to errors of the size of bf16 noise itself, so elementwise tolerances are meaningless (an element that cancels
// to ~0 has any relative error); the measure is each tensor's relative L2 error. Observed (GCC 12, x86-64): step-0
// gradients 0.48% (h.0.attn.c_attn.weight), losses 2.7e-5 relative, weight updates after 5 AdamW steps 2.5% of the
// update (AdamW divides by sqrt(v), so a gradient element at the noise level still moves its weight by up to lr).
// Bounds: 3x those. (With the statistics rounded to bf16, as before issue 34: 0.78%, 6.3e-5 and 3.5%.) Where no
// other rounding point differs, the whole minibatch's gradients of ln_f and the last block's MLP and ln_2 (the
// backward before the last attention) match torch's bf16 to 2.2e-5 pooled relative L2 (a few bf16 flips); bf16
// statistics put them at 3.0e-3; bound 3e-4. (Microbatched, dW rounds once per microbatch: 1.1e-3 there, unchecked.)
// The bf16 rounding itself moves our results by as much as the rest (fp32 storage against this oracle: 0.80%,
// 8.3e-5 and 5.8%), so this test checks that the bf16 path trains like torch's bf16 within bf16 noise, not the
// rounding points: backend/cpu/cpu_device_test.cpp checks every bf16 kernel bit-exactly against round(fp32
// kernel(widened inputs)) and the rounding function against its definition. A real bug moves far more: a sign,
// scale or missing gradient contribution moves a tensor's gradient by >= 100%; a lost weight decay moves a weight
// update by lr * wd * |w| / lr ~ 13% for |w| = 0.02.
constexpr double kBf16GradRelL2 = 1.5e-2;
constexpr double kBf16LossRtol = 1e-4;
constexpr double kBf16UpdateRelL2 = 7.5e-2;
constexpr double kBf16TailRelL2 = 3e-4;  // whole minibatch

TEST_CASE("bf16 PyTorch oracle: step-0 gradients, losses and final weights, whole minibatch and microbatched") {
  for (const std::vector<int>& micro : {std::vector<int>{}, std::vector<int>{1, 3}}) {
    CAPTURE(micro.size());
    const Bf16Run r = run_against_bf16_oracle(DType::BF16, micro);
    report(micro.empty() ? "bf16 whole minibatch" : "bf16 microbatches 1+3", r);
    CHECK(r.grads.rel <= kBf16GradRelL2);
    CHECK(r.loss_rel <= kBf16LossRtol);
    CHECK(r.weights.rel <= kBf16UpdateRelL2);
    if (micro.empty()) CHECK(r.tail_rel() <= kBf16TailRelL2);  // fails with the statistics rounded to bf16
  }
}
