// The PyTorch oracle (tests/data/gpt2_tiny, made by scripts/make_gpt2_oracle.py with torch 1.13): from the
// same initial weights (HF safetensors) and llm.c token file, the plain trainer on a CPU device must
// reproduce torch's step-0 gradients, its per-step losses over 5 AdamW steps and its final weights within
// the tolerances below (reasons in docs/backend.md, "Tolerances").
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_device.hpp"
#include "backend/model/checkpoint.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"

using namespace harmony::backend;

namespace {

std::string data_dir() {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/gpt2_tiny/";
}

nlohmann::json load_oracle() {
  std::ifstream in(data_dir() + "oracle.json");
  REQUIRE_MESSAGE(in.good(), "cannot open ", data_dir(), "oracle.json (set HARMONY_SOURCE_DIR)");
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
