// Tests of the plain trainer, the reference for Harmony's schedules: microbatched gradient accumulation is
// bit-identical to the whole minibatch (losses, gradients and weights after several AdamW steps, for
// every split), training lowers the loss, and a device too small says what did not fit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"
#include "backend/trainer.hpp"

using namespace harmony::backend;
using harmony::core::kMiB;

namespace {

std::string data_dir() {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/gpt2_tiny/";
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads0;  // gradients of the first minibatch, per layer
  std::vector<float> token_losses0;
  std::vector<std::vector<float>> weights;  // after all steps
};

Run train(const std::vector<int>& microbatches, int steps) {
  const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
  const Gpt2 model(gpt2_config_from(file));
  HostState state(model);
  load_gpt2_weights(file, state);
  const TokenFile tokens = TokenFile::load(data_dir() + "tokens.bin");
  auto dev = cpu::make_cpu_device(0, {.capacity = 16 * kMiB});
  PlainTrainer trainer(*dev, state, {.batch = 4, .seq_len = 16, .microbatches = microbatches});
  const AdamWConfig adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  Run run;
  std::vector<std::int32_t> in, tgt;
  for (int k = 0; k < steps; ++k) {
    tokens.batch(k, 4, 16, in, tgt);
    run.losses.push_back(trainer.forward_backward(in, tgt));
    if (k == 0) {
      for (int l = 0; l < model.num_layers(); ++l)
        run.grads0.emplace_back(state.grads(l).begin(), state.grads(l).end());
      run.token_losses0.assign(trainer.token_losses().begin(), trainer.token_losses().end());
    }
    state.update(adamw, 0, model.num_layers() - 1);
    trainer.upload_weights();
  }
  for (int l = 0; l < model.num_layers(); ++l)
    run.weights.emplace_back(state.weights(l).begin(), state.weights(l).end());
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Tolerance: zero. Every kernel sums in an order that does not depend on how rows are split into calls, and
// weight gradients accumulate row by row in row order into the same device buffer, so microbatch k's
// contribution is added exactly where the whole batch would add it (docs/backend.md).
TEST_CASE("microbatched gradient accumulation is bit-identical to the whole minibatch") {
  const Run whole = train({}, 3);
  for (const std::vector<int>& split : std::vector<std::vector<int>>{{1, 3}, {2, 2}, {3, 1}, {1, 1, 1, 1}}) {
    CAPTURE(split.size());
    CAPTURE(split.front());
    const Run mb = train(split, 3);
    CHECK(mb.losses == whole.losses);
    CHECK(same_bits(mb.token_losses0, whole.token_losses0));
    for (std::size_t l = 0; l < whole.grads0.size(); ++l) {
      CAPTURE(l);
      CHECK(same_bits(mb.grads0[l], whole.grads0[l]));
      CHECK(same_bits(mb.weights[l], whole.weights[l]));
    }
  }
}

TEST_CASE("training lowers the loss") {
  const Run run = train({2, 2}, 12);
  MESSAGE("loss ", run.losses.front(), " -> ", run.losses.back());
  CHECK(run.losses.back() < run.losses.front() - 0.1);
}

TEST_CASE("a device too small for the resident model says what did not fit") {
  const Gpt2 model(Gpt2Config{.vocab_size = 64, .max_seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 32});
  HostState state(model);
  state.init_weights(3);
  auto dev = cpu::make_cpu_device(0, {.capacity = 256 * 1024});
  CHECK_THROWS_WITH_AS(PlainTrainer(*dev, state, {.batch = 4, .seq_len = 16, .microbatches = {}}),
                       doctest::Contains("cpu:0: out of memory allocating '"), OutOfMemory);
  CHECK(dev->memory().in_use == 0);  // everything allocated before the failure was released
  auto big = cpu::make_cpu_device(1, {.capacity = 16 * kMiB});
  CHECK_THROWS_WITH_AS(PlainTrainer(*big, state, {.batch = 4, .seq_len = 16, .microbatches = {1, 2}}),
                       doctest::Contains("microbatch sizes sum to 3, the minibatch has 4"), BackendError);
  CHECK_THROWS_AS(PlainTrainer(*big, state, {.batch = 4, .seq_len = 17, .microbatches = {}}), BackendError);
  PlainTrainer ok(*big, state, {.batch = 2, .seq_len = 16, .microbatches = {}});
  std::vector<std::int32_t> ids(32, 1), bad(32, 1);
  bad[5] = 64;
  CHECK_THROWS_WITH_AS(ok.forward_backward(bad, ids), doctest::Contains("token id 64 at (b=0, t=5)"), DeviceError);
  CHECK_THROWS_WITH_AS(ok.forward_backward(ids, bad), doctest::Contains("target id 64 at row 5"), DeviceError);
  CHECK(std::isfinite(ok.forward_backward(ids, ids)));  // the device stays usable after an error
  CHECK_THROWS_AS(ok.forward_backward(std::span<const std::int32_t>(ids.data(), 3), ids), BackendError);
}
