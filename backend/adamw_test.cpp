// Tests of AdamW (two steps against values worked out by hand from torch.optim.AdamW's formulas) and of
// the host state's pack updates: the tied wte is updated once with the embedding and head gradients
// summed, the head's copy follows, and updating a pack without layer 0 leaves the tie alone.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/model/state.hpp"

using namespace harmony::backend;

// float arithmetic against double hand values: a few ulps, rel 1e-6 is ~8 ulps.
constexpr double kRel = 1e-6;

TEST_CASE("AdamW: two steps match hand-computed torch.optim.AdamW values") {
  const AdamWConfig c{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  // Step 1, p0 = 1, g = 0.5:
  //   p = 1 * (1 - 0.1*0.1) = 0.99;  m = 0.1*0.5 = 0.05;  v = 0.01*0.25 = 0.0025
  //   bias corrections 1 - 0.9 = 0.1 and 1 - 0.99 = 0.01: step size 0.1/0.1 = 1,
  //   denom = sqrt(0.0025)/sqrt(0.01) + 1e-8 = 0.50000001;  p = 0.99 - 0.05/0.50000001 = 0.890000002
  // Step 2, g = -0.25:
  //   p = 0.890000002 * 0.99;  m = 0.9*0.05 - 0.1*0.25 = 0.02;  v = 0.99*0.0025 + 0.01*0.0625 = 0.0031
  //   step size 0.1/(1 - 0.81);  denom = sqrt(0.0031)/sqrt(1 - 0.9801) + 1e-8
  //   p = 0.88110000198 - (0.1/0.19) * 0.02 / denom = 0.854430059747...
  // A second element with g = 0 only decays: -2 -> -1.98 -> -1.9602. A third with tiny gradients
  // (1e-3, 2e-3) shows the normalisation: 0.5 -> 0.395001 -> 0.294664110616.
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f);
  const std::vector<float> g1 = {0.5f, 0.0f, 1e-3f}, g2 = {-0.25f, 0.0f, 2e-3f};
  adamw_update(c, 1, p.data(), g1.data(), m.data(), v.data(), 3);
  CHECK(p[0] == doctest::Approx(0.890000002).epsilon(kRel));
  CHECK(m[0] == doctest::Approx(0.05).epsilon(kRel));
  CHECK(v[0] == doctest::Approx(0.0025).epsilon(kRel));
  CHECK(p[1] == doctest::Approx(-1.98).epsilon(kRel));
  CHECK(p[2] == doctest::Approx(0.3950009999900001).epsilon(kRel));
  adamw_update(c, 2, p.data(), g2.data(), m.data(), v.data(), 3);
  const double denom = std::sqrt(0.0031) / std::sqrt(1 - 0.9801) + 1e-8;
  CHECK(p[0] == doctest::Approx(0.890000002 * 0.99 - (0.1 / 0.19) * 0.02 / denom).epsilon(kRel));
  CHECK(p[0] == doctest::Approx(0.8544300597479334).epsilon(kRel));
  CHECK(m[0] == doctest::Approx(0.02).epsilon(kRel));
  CHECK(v[0] == doctest::Approx(0.0031).epsilon(kRel));
  CHECK(p[1] == doctest::Approx(-1.9602).epsilon(kRel));
  CHECK(p[2] == doctest::Approx(0.2946641106163081).epsilon(kRel));
}

TEST_CASE("AdamW: invalid settings are rejected") {
  float p = 1, g = 1, m = 0, v = 0;
  CHECK_THROWS_AS(adamw_update(AdamWConfig{}, 0, &p, &g, &m, &v, 1), BackendError);
  CHECK_THROWS_AS(AdamWConfig{.lr = -1}.validate(), BackendError);
  CHECK_THROWS_AS(AdamWConfig{.beta2 = 1.0}.validate(), BackendError);
  CHECK_NOTHROW(AdamWConfig{}.validate());
}

TEST_CASE("host state: the tied wte gets one update from both gradient contributions") {
  const Gpt2 model(Gpt2Config{.vocab_size = 3, .max_seq_len = 2, .n_layer = 1, .n_head = 1, .n_embd = 2});
  HostState s(model);
  s.init_weights(9);
  const int head = model.head_layer();
  const std::vector<float> wte0(s.weight(0, "wte.weight").begin(), s.weight(0, "wte.weight").end());
  const std::vector<float> ln1_0(s.weight(1, "h.0.ln_1.weight").begin(), s.weight(1, "h.0.ln_1.weight").end());
  for (int l = 0; l < model.num_layers(); ++l) {
    for (std::size_t i = 0; i < s.grads(l).size(); ++i) s.grads(l)[i] = 0.01f * static_cast<float>(i + 1);
  }
  const AdamWConfig c{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};

  // The head's pack first, as Harmony's backward order does: lm_head is left for layer 0.
  s.update(c, head, head);
  CHECK(s.steps(head) == 1);
  CHECK(std::equal(wte0.begin(), wte0.end(), s.weight(head, "lm_head.weight").begin()));
  CHECK(std::equal(wte0.begin(), wte0.end(), s.weight(0, "wte.weight").begin()));
  s.update(c, 0, 1);
  CHECK(s.steps(0) == 1);
  CHECK(s.steps(1) == 1);
  CHECK_FALSE(std::equal(ln1_0.begin(), ln1_0.end(), s.weight(1, "h.0.ln_1.weight").begin()));
  // Expected: one AdamW step on wte with the summed gradient.
  std::vector<float> expect = wte0, m(wte0.size(), 0.0f), v(wte0.size(), 0.0f), g(wte0.size());
  const auto ge = s.grad(0, "wte.weight");
  const auto gh = s.grad(head, "lm_head.weight");
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = ge[i] + gh[i];
  adamw_update(c, 1, expect.data(), g.data(), m.data(), v.data(), static_cast<std::int64_t>(g.size()));
  CHECK(std::equal(expect.begin(), expect.end(), s.weight(0, "wte.weight").begin()));
  CHECK(std::equal(expect.begin(), expect.end(), s.weight(head, "lm_head.weight").begin()));
  CHECK(std::equal(m.begin(), m.end(), s.exp_avg(0).begin()));
  // Issue 36: the tied lm_head keeps no moments (it is updated through wte): the head's moments end where it begins.
  const auto& lm = model.param(head, "lm_head.weight");
  CHECK(s.exp_avg(head).size() == static_cast<std::size_t>(lm.offset));
  CHECK(s.exp_avg_sq(head).size() == static_cast<std::size_t>(lm.offset));
  CHECK(s.exp_avg(0).size() == s.weights(0).size());
  CHECK_THROWS_AS(s.update(c, 1, 0), BackendError);
  CHECK_THROWS_AS(s.update(c, 0, 3), BackendError);
}

TEST_CASE("host state: GPT-2 initialisation is seeded and deterministic") {
  const Gpt2 model(Gpt2Config{.vocab_size = 7, .max_seq_len = 4, .n_layer = 2, .n_head = 2, .n_embd = 4});
  HostState a(model), b(model);
  a.init_weights(5);
  b.init_weights(5);
  for (int l = 0; l < model.num_layers(); ++l)
    CHECK(std::equal(a.weights(l).begin(), a.weights(l).end(), b.weights(l).begin()));
  CHECK(a.weight(1, "h.0.ln_1.weight")[0] == 1.0f);
  CHECK(a.weight(1, "h.0.ln_1.bias")[0] == 0.0f);
  CHECK(a.weight(0, "wte.weight")[0] != 0.0f);
  CHECK(std::equal(a.weight(0, "wte.weight").begin(), a.weight(0, "wte.weight").end(),
                   a.weight(3, "lm_head.weight").begin()));
}
