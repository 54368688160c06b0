// The device conformance suite, the optimizer: Kernels<S>::adamw on every available registered device kind against
// the host's adamw_update (fp32; bf16 through an fp32 master) bit for bit, with the tied pair, the non-finite flag and
// its argument checks; and the device-resident training state (backend/model/device_state.hpp) on every kind: its
// upload / download round trip and several updates, step for step, against HostState::update and update_layers, bit
// for bit, fp32 and bf16, with the non-finite report. The bound is exact on every device: AdamW's element loop has no
// sums, each operation is correctly rounded on both (no fused multiply-add) and the factors come from the host.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/adamw_parallel.hpp"
#include "backend/model/device_state.hpp"
#include "backend/model/state.hpp"
#include "tests/backend/conformance.hpp"

using namespace conformance;

namespace {

template <class E>
std::vector<const DeviceKind*> optimizer_subjects() {
  std::vector<const DeviceKind*> out;
  for (const DeviceKind* k : subjects()) {
    if (std::is_same_v<E, float> || k->caps().bf16_kernels) out.push_back(k);
  }
  return out;
}

std::vector<float> positive(std::vector<float> v) {
  for (float& x : v) x = std::abs(x);
  return v;
}

std::vector<float> rounded_if_bf16(std::vector<float> v, bool bf16) {
  if (bf16) {
    for (float& x : v) x = round_bf16(x);
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const AdamWConfig kConfig{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

// The state one adamw call updates, on both devices: the fp32 master and moments, the E working copy (bf16 only) and
// the tie's twin, and the non-finite flag.
template <class E>
struct AdamWBuffers {
  Tensor<float> param, m, v;
  Tensor<E> working, twin;
  Tensor<std::int32_t> flag;

  // The call's arguments on side x: gradient g, and with the tie the twin's gradient g2 (the twin gets the copy).
  AdamWTensors<E> on(Side x, const Tensor<E>& g, const Tensor<E>* g2, bool twin_copy) const {
    AdamWTensors<E> a;
    a.param = param.at(x);
    if constexpr (std::is_same_v<E, Bf16>) a.working = working.at(x);
    a.grad = g.at(x);
    a.grad2 = g2 ? g2->at(x) : nullptr;
    a.exp_avg = m.at(x);
    a.exp_avg_sq = v.at(x);
    a.twin = twin_copy ? twin.at(x) : nullptr;
    a.nonfinite = flag.at(x);
    return a;
  }
};

}  // namespace

TEST_CASE_TEMPLATE("optimizer: adamw equals adamw_update bit for bit, with the tie and over several steps", E, float,
                   Bf16) {
  constexpr bool bf16 = std::is_same_v<E, Bf16>;
  for (const DeviceKind* kind : optimizer_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const std::size_t n = 5003;  // not a multiple of any vector width: the tails run too
    const std::string t = type_name<E>();
    // The host's copy of everything: the master (fp32 param), the moments, the gradients as the device stores them.
    std::vector<float> param = random_floats(n, 81), m = random_floats(n, 82, 0.1f),
                       v = positive(random_floats(n, 83, 0.01f));
    const AdamWBuffers<E> b{p.up<float>(param), p.up<float>(m), p.up<float>(v),
                            p.zeros<E>(n),      p.zeros<E>(n),  p.ids(std::vector<std::int32_t>(1, 0))};
    for (std::int64_t step = 1; step <= 3; ++step) {
      CAPTURE(step);
      const std::vector<float> g = rounded_if_bf16(random_floats(n, 90 + step, 2.0f), bf16);
      const std::vector<float> g2 = rounded_if_bf16(random_floats(n, 95 + step, 0.5f), bf16);
      auto dg = p.up<E>(g), dg2 = p.up<E>(g2);
      const bool tied = step != 2;  // steps 1 and 3 with the twin's gradient and the copy, step 2 plain
      std::vector<float> sum = g;
      if (tied) {
        for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + g2[i];
      }
      adamw_update(kConfig, step, param.data(), sum.data(), m.data(), v.data(), static_cast<std::int64_t>(n));
      p.run<E>([&](Kernels<E>& k, Stream& s, Side x) {
        k.adamw(s, kConfig, step, b.on(x, dg, tied ? &dg2 : nullptr, tied), static_cast<std::int64_t>(n));
      });
      p.check("adamw param " + t, b.param, Bound{});
      p.check("adamw exp_avg " + t, b.m, Bound{});
      p.check("adamw exp_avg_sq " + t, b.v, Bound{});
      // The device against adamw_update itself (the reference side is the CPU device).
      const auto [dut, ref] = p.down(b.param);
      CHECK(same_bits(ref, param));
      CHECK(same_bits(dut, param));
      CHECK(same_bits(p.down(b.m).first, m));
      CHECK(same_bits(p.down(b.v).first, v));
      const std::vector<float> want_working = rounded_if_bf16(param, true);
      if constexpr (bf16) CHECK(same_bits(p.down(b.working).first, want_working));
      if (tied) CHECK(same_bits(p.down(b.twin).first, bf16 ? want_working : param));
      const auto [fd, fr] = p.down(b.flag);
      CHECK(fd == std::vector<float>{0.0f});
      CHECK(fr == std::vector<float>{0.0f});
    }
  }
}

TEST_CASE_TEMPLATE("optimizer: adamw flags a non-finite gradient, also one the tie's sum makes", E, float, Bf16) {
  constexpr bool bf16 = std::is_same_v<E, Bf16>;
  for (const DeviceKind* kind : optimizer_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const std::size_t n = 300;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
      const char* what;
      std::size_t at;
      float g, g2;
      bool flagged;
    };
    // 3e38 + 3e38 overflows fp32 (and bf16 holds 3e38 too): both gradients finite, their sum not.
    for (const Case& c :
         {Case{"finite", 7, 1.0f, 1.0f, false}, Case{"nan", 7, nan, 0.0f, true},
          Case{"inf in the twin", 299, 0.0f, -inf, true}, Case{"sum overflows", 64, 3e38f, 3e38f, true}}) {
      CAPTURE(c.what);
      std::vector<float> g = rounded_if_bf16(random_floats(n, 101), bf16), g2(n, 0.0f);
      g[c.at] = c.g;
      g2[c.at] = c.g2;
      const AdamWBuffers<E> b{
          p.up<float>(random_floats(n, 102)),    p.zeros<float>(n), p.zeros<float>(n), p.zeros<E>(n), {},
          p.ids(std::vector<std::int32_t>(1, 0))};
      auto dg = p.up<E>(g), dg2 = p.up<E>(g2);
      p.run<E>([&](Kernels<E>& k, Stream& s, Side x) {
        k.adamw(s, kConfig, 1, b.on(x, dg, &dg2, false), static_cast<std::int64_t>(n));
      });
      const auto [fd, fr] = p.down(b.flag);
      CHECK(fd == std::vector<float>{c.flagged ? 1.0f : 0.0f});
      CHECK(fr == fd);
      // Every element with a finite gradient is updated as usual, the same bits on both (NaN payloads may differ).
      const auto [pd, pr] = p.down(b.param);
      for (std::size_t i = 0; i < n; ++i) {
        if (i != c.at) CHECK(std::memcmp(&pd[i], &pr[i], sizeof(float)) == 0);
      }
      if (c.flagged) CHECK_FALSE(std::isfinite(pr[c.at]));
    }
  }
}

TEST_CASE_TEMPLATE("optimizer: adamw's arguments are checked when it is called", E, float, Bf16) {
  for (const DeviceKind* kind : optimizer_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    auto param = p.zeros<float>(16), m = p.zeros<float>(16), v = p.zeros<float>(16);
    auto g = p.zeros<E>(16), w = p.zeros<E>(16);
    AdamWTensors<E> a;
    a.param = param.dut.template as<float>();
    a.grad = g.dut.template as<E>();
    a.exp_avg = m.dut.template as<float>();
    a.exp_avg_sq = v.dut.template as<float>();
    if constexpr (std::is_same_v<E, Bf16>) {
      CHECK_THROWS_AS(p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, kConfig, 1, a, 16); }),
                      DeviceError);  // no working copy
      a.working = w.dut.template as<E>();
    } else {
      AdamWTensors<E> b = a;
      b.working = w.dut.template as<E>();
      CHECK_THROWS_AS(p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, kConfig, 1, b, 16); }),
                      DeviceError);  // fp32 has none
    }
    CHECK_THROWS_AS(p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, kConfig, 0, a, 16); }),
                    BackendError);  // step 0
    AdamWConfig bad = kConfig;
    bad.beta1 = 1.0;
    CHECK_THROWS_AS(p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, bad, 1, a, 16); }), BackendError);
    AdamWTensors<E> no_grad = a;
    no_grad.grad = nullptr;
    CHECK_THROWS_AS(p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, kConfig, 1, no_grad, 16); }),
                    DeviceError);
    p.run_dut<E>([&](Kernels<E>& k, Stream& s, Side) { k.adamw(s, kConfig, 1, AdamWTensors<E>{}, 0); });  // nothing
    p.sync();
  }
}

// ---- the device-resident training state ----------------------------------------------------------------------------

namespace {

const Gpt2 kModel(Gpt2Config{.vocab_size = 67, .max_seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 24});

// A host state with seeded weights, moments and step counts everywhere except the tied lm_head's moments (which no
// update touches: always zero).
HostState seeded_state(std::uint64_t seed) {
  HostState st(kModel);
  st.init_weights(seed);
  for (int l = 0; l < kModel.num_layers(); ++l) {
    const auto n = st.exp_avg(l).size();  // the tied lm_head has none
    const auto m = random_floats(n, seed + 10 + static_cast<std::uint64_t>(l), 0.01f);
    const auto v = positive(random_floats(n, seed + 20 + static_cast<std::uint64_t>(l), 1e-4f));
    std::copy(m.begin(), m.end(), st.exp_avg(l).begin());
    std::copy(v.begin(), v.end(), st.exp_avg_sq(l).begin());
    st.set_steps(l, 5 + l);
  }
  return st;
}

void seed_grads(HostState& st, std::uint64_t seed, bool bf16) {
  for (int l = 0; l < kModel.num_layers(); ++l) {
    const auto g =
        rounded_if_bf16(random_floats(st.grads(l).size(), seed + static_cast<std::uint64_t>(l), 0.05f), bf16);
    std::copy(g.begin(), g.end(), st.grads(l).begin());
  }
}

template <class T>
bool same_span(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Weights, moments and step counts of every layer, the same bits.
void check_same_state(const HostState& got, const HostState& want) {
  for (int l = 0; l < kModel.num_layers(); ++l) {
    CAPTURE(l);
    CHECK(same_span(got.weights(l), want.weights(l)));
    CHECK(same_span(got.exp_avg(l), want.exp_avg(l)));
    CHECK(same_span(got.exp_avg_sq(l), want.exp_avg_sq(l)));
    CHECK(got.steps(l) == want.steps(l));
  }
}

// The working weights on the device (what the kernels read, the tied lm_head's included): the host's weights, in
// bf16 rounded to nearest even.
void check_working_copy(DeviceState& ds, Stream& s, const HostState& want) {
  for (int l = 0; l < kModel.num_layers(); ++l) {
    const auto w = want.weights(l);
    std::vector<float> got(w.size());
    if (ds.dtype() == DType::BF16) {
      std::vector<Bf16> b(w.size());
      ds.device().copy_d2h(s, b.data(), ds.weights<Bf16>(l), static_cast<Bytes>(b.size() * sizeof(Bf16)));
      s.synchronize();
      std::transform(b.begin(), b.end(), got.begin(), [](Bf16 x) { return to_f32(x); });
    } else {
      ds.device().copy_d2h(s, got.data(), ds.weights<float>(l), static_cast<Bytes>(got.size() * sizeof(float)));
      s.synchronize();
    }
    const auto expected = rounded_if_bf16({w.begin(), w.end()}, ds.dtype() == DType::BF16);
    CHECK_MESSAGE(same_bits(got, expected), "layer " << l);
  }
}

struct DeviceUnderTest {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  explicit DeviceUnderTest(const DeviceKind& kind, Bytes capacity = 16 * kMiB)
      : dev(kind.make_device(0, test_options(capacity))), stream(dev->create_stream("state")) {}
  ~DeviceUnderTest() { stream.reset(); }
};

// body(kind, dtype, device) for every available kind in fp32 and, where it has bf16 kernels, bf16: each on a fresh
// device under test, the kind and dtype captured for failure messages.
template <class Body>
void each_state_subject(Body&& body) {
  for (const DeviceKind* kind : subjects()) {
    for (const DType dt : {DType::F32, DType::BF16}) {
      if (dt == DType::BF16 && !kind->caps().bf16_kernels) continue;
      CAPTURE(kind->name());
      CAPTURE(dtype_name(dt));
      DeviceUnderTest d(*kind);
      body(*kind, dt, d);
    }
  }
}

}  // namespace

TEST_CASE("device state: memory per parameter, and what the device holds") {
  CHECK(DeviceState::bytes_per_param(DType::F32) == 16);
  CHECK(DeviceState::bytes_per_param(DType::BF16) == 16);
  const auto V = static_cast<Bytes>(kModel.config().vocab_size), C = static_cast<Bytes>(kModel.config().n_embd);
  std::int64_t tensors = 0;
  for (int l = 0; l < kModel.num_layers(); ++l) tensors += static_cast<std::int64_t>(kModel.params(l).size());
  const Bytes flags = 4 * static_cast<Bytes>(tensors);
  const auto P = static_cast<Bytes>(kModel.param_count());
  CHECK(DeviceState::total_bytes(kModel, DType::F32) == 16 * P + 8 * V * C + flags);
  CHECK(DeviceState::total_bytes(kModel, DType::BF16) == 16 * P + 4 * V * C + flags);
  CHECK(DeviceState::owned_floats(kModel, kModel.head_layer()) == 2 * static_cast<std::int64_t>(C));
  each_state_subject([](const DeviceKind& kind, DType dt, DeviceUnderTest& d) {
    const Bytes before = d.dev->memory().in_use;
    {
      const DeviceState ds(*d.dev, *d.stream, kModel, dt);
      const Bytes held = d.dev->memory().in_use - before;
      CHECK(held >= DeviceState::total_bytes(kModel, dt));
      CHECK(held <= DeviceState::total_bytes(kModel, dt) + 5 * 256 * static_cast<Bytes>(kModel.num_layers() + 1));
      CHECK_THROWS_AS((void)ds.weights<Bf16>(dt == DType::F32 ? 0 : -1), BackendError);
    }
    CHECK(d.dev->memory().in_use == before);
    // Too little memory: OutOfMemory naming the resident tensor that did not fit.
    DeviceUnderTest small(kind, DeviceState::total_bytes(kModel, dt) / 2);
    try {
      const DeviceState ds(*small.dev, *small.stream, kModel, dt);
      FAIL("expected OutOfMemory");
    } catch (const OutOfMemory& e) {
      CHECK(std::string(e.what()).find("resident") != std::string::npos);
    }
  });
}

TEST_CASE("device state: upload then download is the identity, bit for bit, fp32 and bf16") {
  each_state_subject([](const DeviceKind&, DType dt, DeviceUnderTest& d) {
    const HostState src = seeded_state(7);
    DeviceState ds(*d.dev, *d.stream, kModel, dt);
    ds.upload(*d.stream, src);
    for (int l = 0; l < kModel.num_layers(); ++l) CHECK(ds.steps(l) == src.steps(l));
    HostState back(kModel);
    // Garbage in the destination's moments: download overwrites them.
    std::fill(back.exp_avg(kModel.head_layer()).begin(), back.exp_avg(kModel.head_layer()).end(), 1.0f);
    ds.download(*d.stream, back);
    check_same_state(back, src);
    check_working_copy(ds, *d.stream, src);
    // Gradients: fp32 exactly; bf16 as the device stores them (rounded going up, widened exactly coming down).
    HostState g = seeded_state(8);
    seed_grads(g, 300, false);
    ds.upload_grads(*d.stream, g);
    HostState gback(kModel);
    ds.download_grads(*d.stream, gback);
    for (int l = 0; l < kModel.num_layers(); ++l) {
      const auto want = rounded_if_bf16({g.grads(l).begin(), g.grads(l).end()}, dt == DType::BF16);
      CHECK(same_span(std::span<const float>(gback.grads(l)), std::span<const float>(want)));
    }
    ds.zero_grads(*d.stream);
    ds.download_grads(*d.stream, gback);
    for (int l = 0; l < kModel.num_layers(); ++l) {
      const auto gl = gback.grads(l);
      CHECK(std::all_of(gl.begin(), gl.end(), [](float x) { return x == 0.0f; }));
    }
  });
}

TEST_CASE("device state: updates on the device equal HostState::update and update_layers, step for step, bit for bit") {
  each_state_subject([](const DeviceKind&, DType dt, DeviceUnderTest& d) {
    const bool bf16 = dt == DType::BF16;
    HostState host = seeded_state(11), pooled = seeded_state(11);
    DeviceState ds(*d.dev, *d.stream, kModel, dt);
    ds.upload(*d.stream, host);
    ParallelAdamW pool(2, 64);
    const int L = kModel.num_layers();
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      // The gradients as the plain trainer brings them to the host (bf16: widened device values).
      seed_grads(host, 1000 + 10 * static_cast<std::uint64_t>(step), bf16);
      seed_grads(pooled, 1000 + 10 * static_cast<std::uint64_t>(step), bf16);
      ds.upload_grads(*d.stream, host);
      // Packs as Harmony updates them: the last ones first (backward order), layer 0 last, reading the head's
      // gradient; on odd steps the whole range at once.
      if (step % 2 == 0) {
        host.update(kConfig, 2, L - 1);
        host.update(kConfig, 0, 1);
        CHECK_FALSE(update_layers(pooled, kConfig, 2, L - 1, pool).has_value());
        CHECK_FALSE(update_layers(pooled, kConfig, 0, 1, pool).has_value());
        ds.update(*d.stream, kConfig, 2, L - 1);
        ds.update(*d.stream, kConfig, 0, 1);
      } else {
        host.update(kConfig, 0, L - 1);
        CHECK_FALSE(update_layers(pooled, kConfig, 0, L - 1, pool).has_value());
        ds.update(*d.stream, kConfig, 0, L - 1);
      }
      CHECK_FALSE(ds.take_nonfinite(*d.stream).has_value());
      HostState back(kModel);
      ds.download(*d.stream, back);
      check_same_state(back, host);
      check_same_state(pooled, host);
      check_working_copy(ds, *d.stream, host);
    }
    CHECK_THROWS_AS(ds.update(*d.stream, kConfig, 1, L), BackendError);
    CHECK_THROWS_AS(ds.update(*d.stream, kConfig, 2, 1), BackendError);
  });
}

TEST_CASE("device state: a non-finite gradient is reported as update_layers reports it") {
  each_state_subject([](const DeviceKind&, DType dt, DeviceUnderTest& d) {
    HostState host = seeded_state(21);
    DeviceState ds(*d.dev, *d.stream, kModel, dt);
    ds.upload(*d.stream, host);
    seed_grads(host, 500, dt == DType::BF16);
    // A NaN in block h.0 (layer 1), infinities in two tensors of h.1 (layer 2): the report names h.1's first
    // and counts three; and an overflow of the tie's sum counts on layer 0.
    host.grad(1, "h.0.mlp.c_fc.weight")[3] = std::numeric_limits<float>::quiet_NaN();
    host.grad(2, "h.1.attn.c_proj.bias")[0] = std::numeric_limits<float>::infinity();
    host.grad(2, "h.1.ln_1.weight")[5] = -std::numeric_limits<float>::infinity();
    host.grad(0, "wte.weight")[9] = 3e38f;
    host.grad(kModel.head_layer(), "lm_head.weight")[9] = 3e38f;
    ds.upload_grads(*d.stream, host);
    ParallelAdamW pool(1);
    const auto want = update_layers(host, kConfig, 0, kModel.num_layers() - 1, pool);
    ds.update(*d.stream, kConfig, 0, kModel.num_layers() - 1);
    const auto got = ds.take_nonfinite(*d.stream);
    REQUIRE(want.has_value());
    REQUIRE(got.has_value());
    CHECK(got->layer == 2);
    CHECK(got->param == "h.1.ln_1.weight");
    CHECK(got->params == 4);
    CHECK(got->layer == want->layer);
    CHECK(got->param == want->param);
    CHECK(got->params == want->params);
    // Taken: the flags are clear again; a finite update reports nothing.
    seed_grads(host, 600, dt == DType::BF16);
    ds.upload_grads(*d.stream, host);
    ds.update(*d.stream, kConfig, 1, 1);
    CHECK_FALSE(ds.take_nonfinite(*d.stream).has_value());
  });
}
