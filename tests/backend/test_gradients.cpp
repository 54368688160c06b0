// Gradient checks of the GPT-2 layers in double: every weight and input gradient of the embedding, a block
// and the head against central finite differences, the whole chain with the tied wte (embedding + head
// contributions summed), the layer chain as a core::Model, and the device path (DeviceOps on a CPU device, float)
// bit-identical to the host reference loops (HostOps<float>).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/gpt2.hpp"
#include "core/program/program_builder.hpp"

using namespace harmony::backend;

namespace {

// Tiny, with T < max_seq_len and C/H = 4 so every code path (partial wpe, several heads) is exercised.
const Gpt2Config kCfg{.vocab_size = 11, .max_seq_len = 6, .n_layer = 2, .n_head = 2, .n_embd = 8};
constexpr int kB = 2;
constexpr int kT = 5;

// Central differences in double with h = 1e-6: truncation error ~h^2 * f''' ~ 1e-12 and rounding error
// ~1e-16 * |J| / h ~ 1e-9 for objectives |J| ~ 10, so analytic and numeric gradients must agree to 1e-7
// absolute plus 1e-6 relative; a wrong term in any backward formula is off by far more (~1e-2 and up).
constexpr double kH = 1e-6;
constexpr double kAtol = 1e-7;
constexpr double kRtol = 1e-6;

template <class T>
std::vector<T> random_vec(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(rng));
  return v;
}

std::vector<std::int32_t> random_ids(std::mt19937_64& rng, std::size_t n, int V) {
  std::uniform_int_distribution<int> u(0, V - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Weights of one layer: layer norms near 1, everything else small and random (biases included).
template <class T>
std::vector<T> random_weights(const Gpt2& m, int l, std::mt19937_64& rng) {
  std::vector<T> w(static_cast<std::size_t>(m.param_floats(l)));
  std::normal_distribution<double> n(0.0, 1.0);
  for (const ParamSpec& p : m.params(l)) {
    const bool ln_weight = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    for (std::int64_t i = 0; i < p.numel; ++i) {
      w[static_cast<std::size_t>(p.offset + i)] = T(ln_weight ? 1.0 + 0.1 * n(rng) : 0.3 * n(rng));
    }
  }
  return w;
}

// One layer's inputs and a fixed upstream gradient R (the objective is sum(y * R), or the scaled loss sum
// for the head).
template <class T>
struct LayerCase {
  const Gpt2& m;
  int layer;
  std::vector<T> w, x, r;
  std::vector<std::int32_t> tokens, targets;
  T loss_scale = T(1) / T(kB * kT);

  LayerCase(const Gpt2& model, int l, std::uint64_t seed) : m(model), layer(l) {
    std::mt19937_64 rng(seed);
    const auto NC = static_cast<std::size_t>(kB * kT * kCfg.n_embd);
    w = random_weights<T>(m, l, rng);
    x = random_vec<T>(rng, NC, -1.0, 1.0);
    r = random_vec<T>(rng, NC, -1.0, 1.0);
    tokens = random_ids(rng, kB * kT, kCfg.vocab_size);
    targets = random_ids(rng, kB * kT, kCfg.vocab_size);
  }
  LayerKind kind() const { return m.kind(layer); }

  LayerArgs<T> args(std::vector<T>& y, std::vector<T>& act) {
    y.assign(static_cast<std::size_t>(m.output_bytes(layer, kB, kT) / Bytes(sizeof(float))), T(0));
    act.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, m.act_floats(layer, kB, kT))), T(0));
    LayerArgs<T> a;
    a.B = kB;
    a.T = kT;
    a.w = w.data();
    a.tokens = tokens.data();
    a.targets = targets.data();
    a.x = x.data();
    a.y = y.data();
    a.act = act.data();
    a.loss_scale = loss_scale;
    return a;
  }

  T objective() {
    HostOps<T> ops;
    std::vector<T> y, act;
    auto a = args(y, act);
    m.forward(ops, layer, a);
    T j = T(0);
    if (kind() == LayerKind::Head) {
      for (T v : y) j += v;
      return j * loss_scale;
    }
    for (std::size_t i = 0; i < y.size(); ++i) j += y[i] * r[i];
    return j;
  }

  // Analytic gradients: (dw, dx).
  std::pair<std::vector<T>, std::vector<T>> gradients() {
    HostOps<T> ops;
    std::vector<T> y, act;
    auto a = args(y, act);
    m.forward(ops, layer, a);
    std::vector<T> dw(w.size(), T(0)), dx(x.size(), T(0));
    std::vector<T> scratch(static_cast<std::size_t>(std::max<std::int64_t>(1, m.scratch_floats(layer, kB, kT))));
    a.dw = dw.data();
    a.dy = r.data();
    a.dx = dx.data();
    a.scratch = scratch.data();
    m.backward(ops, layer, a);
    return {dw, dx};
  }
};

struct Report {
  double worst = 0;  // largest |analytic - numeric| / (atol + rtol |numeric|)
  std::string where;
  int checked = 0;
};

void check_fd(Report& rep, const std::string& what, double analytic, double numeric) {
  const double ratio = std::fabs(analytic - numeric) / (kAtol + kRtol * std::fabs(numeric));
  ++rep.checked;
  if (!(ratio <= rep.worst)) {
    rep.worst = std::isnan(ratio) ? 1e30 : ratio;
    rep.where = what + " analytic " + std::to_string(analytic) + " numeric " + std::to_string(numeric);
  }
}

std::string param_at(const Gpt2& m, int l, std::size_t i) {
  for (const ParamSpec& p : m.params(l)) {
    if (static_cast<std::int64_t>(i) >= p.offset && static_cast<std::int64_t>(i) < p.offset + p.numel)
      return p.name + "[" + std::to_string(static_cast<std::int64_t>(i) - p.offset) + "]";
  }
  return "?";
}

void fd_layer(int layer) {
  const Gpt2 m(kCfg);
  LayerCase<double> c(m, layer, 1000 + layer);
  const auto [dw, dx] = c.gradients();
  Report rep;
  for (std::size_t i = 0; i < c.w.size(); ++i) {
    const double keep = c.w[i];
    c.w[i] = keep + kH;
    const double jp = c.objective();
    c.w[i] = keep - kH;
    const double jm = c.objective();
    c.w[i] = keep;
    check_fd(rep, param_at(m, layer, i), dw[i], (jp - jm) / (2 * kH));
  }
  if (c.kind() != LayerKind::Embedding) {
    for (std::size_t i = 0; i < c.x.size(); ++i) {
      const double keep = c.x[i];
      c.x[i] = keep + kH;
      const double jp = c.objective();
      c.x[i] = keep - kH;
      const double jm = c.objective();
      c.x[i] = keep;
      check_fd(rep, "x[" + std::to_string(i) + "]", dx[i], (jp - jm) / (2 * kH));
    }
  }
  MESSAGE(m.layer_name(layer), ": ", rep.checked, " gradients, worst ratio ", rep.worst, " at ", rep.where);
  CHECK(rep.worst <= 1.0);
}

}  // namespace

TEST_CASE("finite differences: embedding layer (wte, wpe)") { fd_layer(0); }
TEST_CASE("finite differences: transformer block (all 12 tensors and x)") { fd_layer(1); }
TEST_CASE("finite differences: head (ln_f, tied lm_head, cross-entropy, x)") { fd_layer(kCfg.n_layer + 1); }

TEST_CASE("finite differences: the whole chain, wte tied between layer 0 and the head") {
  const Gpt2 m(kCfg);
  const int L = m.num_layers();
  std::mt19937_64 rng(77);
  std::vector<std::vector<double>> w;
  for (int l = 0; l < L; ++l) w.push_back(random_weights<double>(m, l, rng));
  const ParamSpec& wte = m.param(0, "wte.weight");
  const ParamSpec& head = m.param(L - 1, "lm_head.weight");
  std::copy(w[0].begin() + wte.offset, w[0].begin() + wte.offset + wte.numel, w[L - 1].begin() + head.offset);
  const auto tokens = random_ids(rng, kB * kT, kCfg.vocab_size);
  const auto targets = random_ids(rng, kB * kT, kCfg.vocab_size);
  const auto NC = static_cast<std::size_t>(kB * kT * kCfg.n_embd);

  // Forward through every layer; with grads, the backward too. Returns the mean loss.
  std::vector<std::vector<double>> dw(static_cast<std::size_t>(L));
  auto run = [&](bool grads) {
    HostOps<double> ops;
    std::vector<std::vector<double>> y(static_cast<std::size_t>(L)), act(static_cast<std::size_t>(L));
    LayerArgs<double> a;
    a.B = kB;
    a.T = kT;
    a.tokens = tokens.data();
    a.targets = targets.data();
    a.loss_scale = 1.0 / (kB * kT);
    for (int l = 0; l < L; ++l) {
      y[l].assign(l == L - 1 ? static_cast<std::size_t>(kB * kT) : NC, 0.0);
      act[l].assign(static_cast<std::size_t>(std::max<std::int64_t>(1, m.act_floats(l, kB, kT))), 0.0);
      a.w = w[l].data();
      a.x = l > 0 ? y[l - 1].data() : nullptr;
      a.y = y[l].data();
      a.act = act[l].data();
      m.forward(ops, l, a);
    }
    double loss = 0;
    for (double v : y[L - 1]) loss += v;
    loss /= kB * kT;
    if (grads) {
      std::vector<double> scratch(NC * 6), ga(NC), gb(NC);
      double* dy = nullptr;
      for (int l = L - 1; l >= 0; --l) {
        dw[l].assign(w[l].size(), 0.0);
        a.w = w[l].data();
        a.x = l > 0 ? y[l - 1].data() : nullptr;
        a.act = act[l].data();
        a.dw = dw[l].data();
        a.dy = dy;
        a.dx = l > 0 ? ga.data() : nullptr;
        a.scratch = scratch.data();
        m.backward(ops, l, a);
        std::swap(ga, gb);
        dy = gb.data();
      }
    }
    return loss;
  };
  run(true);
  Report rep;
  for (int l = 0; l < L; ++l) {
    for (std::size_t i = 0; i < w[l].size(); ++i) {
      const bool in_tie_copy = l == L - 1 && static_cast<std::int64_t>(i) >= head.offset;
      if (in_tie_copy) continue;  // perturbed together with layer 0's wte
      const bool tied = l == 0 && static_cast<std::int64_t>(i) < wte.offset + wte.numel;
      double* copy = tied ? &w[L - 1][static_cast<std::size_t>(head.offset) + i] : nullptr;
      const double keep = w[l][i];
      auto set = [&](double v) {
        w[l][i] = v;
        if (copy != nullptr) *copy = v;
      };
      set(keep + kH);
      const double jp = run(false);
      set(keep - kH);
      const double jm = run(false);
      set(keep);
      const double analytic = tied ? dw[0][i] + dw[L - 1][static_cast<std::size_t>(head.offset) + i] : dw[l][i];
      check_fd(rep, m.layer_name(l) + " " + param_at(m, l, i), analytic, (jp - jm) / (2 * kH));
    }
  }
  MESSAGE("chain: ", rep.checked, " gradients, worst ratio ", rep.worst, " at ", rep.where);
  CHECK(rep.worst <= 1.0);
}

TEST_CASE("DeviceOps on a CPU device is bit-identical to the host reference loops") {
  const Gpt2 m(kCfg);
  auto dev = cpu::make_cpu_device(0, {.capacity = 4 * harmony::core::kMiB});
  auto stream = dev->create_stream("compute");
  for (int l = 0; l < m.num_layers(); ++l) {
    CAPTURE(l);
    LayerCase<float> c(m, l, 2000 + l);
    // Host reference.
    std::vector<float> y, act;
    auto a = c.args(y, act);
    HostOps<float> host;
    m.forward(host, l, a);
    const std::vector<float> y_ref = y;
    auto [dw_ref, dx_ref] = c.gradients();
    // Device: upload, run, download.
    auto up = [&](const void* src, std::size_t bytes, const char* what) {
      Buffer b = dev->alloc(std::max<Bytes>(1, static_cast<Bytes>(bytes)), what);
      dev->copy_h2d(*stream, b.data(), src, static_cast<Bytes>(bytes));
      return b;
    };
    const std::size_t f = sizeof(float);
    Buffer w = up(c.w.data(), c.w.size() * f, "w");
    Buffer x = up(c.x.data(), c.x.size() * f, "x");
    Buffer r = up(c.r.data(), c.r.size() * f, "dy");
    Buffer tok = up(c.tokens.data(), c.tokens.size() * 4, "tokens");
    Buffer tgt = up(c.targets.data(), c.targets.size() * 4, "targets");
    Buffer dy = dev->alloc(static_cast<Bytes>(y.size() * f), "y");
    Buffer dact = dev->alloc(static_cast<Bytes>(act.size() * f), "act");
    Buffer dw = dev->alloc(static_cast<Bytes>(c.w.size() * f), "dw");
    Buffer dx = dev->alloc(static_cast<Bytes>(c.x.size() * f), "dx");
    Buffer scratch = dev->alloc(std::max<Bytes>(1, m.scratch_floats(l, kB, kT) * Bytes(f)), "scratch");
    dev->fill_zero(*stream, dw.data(), dw.bytes());
    LayerArgs<float> d;
    d.B = kB;
    d.T = kT;
    d.w = w.as<float>();
    d.x = x.as<float>();
    d.tokens = tok.as<std::int32_t>();
    d.targets = tgt.as<std::int32_t>();
    d.y = dy.as<float>();
    d.act = dact.as<float>();
    d.dw = dw.as<float>();
    d.dy = r.as<float>();
    d.dx = dx.as<float>();
    d.scratch = scratch.as<float>();
    d.loss_scale = c.loss_scale;
    DeviceOps ops(*dev, *stream);
    m.forward(ops, l, d);
    std::vector<float> y_dev(y.size()), dw_dev(c.w.size()), dx_dev(c.x.size());
    dev->copy_d2h(*stream, y_dev.data(), dy.data(), dy.bytes());
    m.backward(ops, l, d);
    dev->copy_d2h(*stream, dw_dev.data(), dw.data(), dw.bytes());
    if (l > 0) dev->copy_d2h(*stream, dx_dev.data(), dx.data(), dx.bytes());
    stream->synchronize();
    CHECK(std::memcmp(y_dev.data(), y_ref.data(), y_ref.size() * f) == 0);
    CHECK(std::memcmp(dw_dev.data(), dw_ref.data(), dw_ref.size() * f) == 0);
    if (l > 0) CHECK(std::memcmp(dx_dev.data(), dx_ref.data(), dx_ref.size() * f) == 0);
  }
}

TEST_CASE("layers reject bad arguments with a message") {
  const Gpt2 m(kCfg);
  LayerCase<double> c(m, 1, 5);
  std::vector<double> y, act;
  auto a = c.args(y, act);
  HostOps<double> ops;
  a.T = kCfg.max_seq_len + 1;
  CHECK_THROWS_WITH_AS(m.forward(ops, 1, a), doctest::Contains("sequence length T = 7 outside 1..6"), BackendError);
  a.T = kT;
  a.x = nullptr;
  CHECK_THROWS_WITH_AS(m.forward(ops, 1, a), doctest::Contains("x is null"), BackendError);
  CHECK_THROWS_AS(m.forward(ops, 9, a), BackendError);
  // A token id outside the vocabulary.
  LayerCase<double> e(m, 0, 6);
  auto b = e.args(y, act);
  e.tokens[3] = kCfg.vocab_size;
  CHECK_THROWS_WITH_AS(m.forward(ops, 0, b), doctest::Contains("token id 11 at (b=0, t=3)"), DeviceError);
  CHECK_THROWS_WITH_AS(Gpt2(Gpt2Config{.vocab_size = 10, .max_seq_len = 4, .n_layer = 1, .n_head = 3, .n_embd = 8}),
                       doctest::Contains("not a multiple of n_head"), BackendError);
}

TEST_CASE("parameter tables follow Hugging Face names, shapes and the tie") {
  const Gpt2 m(kCfg);
  const int C = kCfg.n_embd;
  CHECK(m.num_layers() == kCfg.n_layer + 2);
  CHECK(m.params(0)[0].name == "wte.weight");
  CHECK(m.params(0)[1].shape == std::vector<std::int64_t>{kCfg.max_seq_len, C});
  CHECK(m.param(2, "h.1.attn.c_attn.weight").shape == std::vector<std::int64_t>{C, 3 * C});
  CHECK(m.param(2, "h.1.mlp.c_proj.weight").shape == std::vector<std::int64_t>{4 * C, C});
  CHECK(m.param_floats(1) == 12 * C * C + 13 * C);
  CHECK(m.param(3, "lm_head.weight").tied_to == "wte.weight");
  CHECK(m.param_count() == std::int64_t(kCfg.vocab_size) * C + std::int64_t(kCfg.max_seq_len) * C +
                               kCfg.n_layer * (12 * C * C + 13 * C) + 2 * C);
  CHECK(m.layer_name(0) == "embedding");
  CHECK(m.layer_name(2) == "h.1");
  CHECK(m.layer_name(3) == "head");
  CHECK(m.input_bytes(0, 2, 5) == 2 * 5 * 4);
  CHECK(m.output_bytes(3, 2, 5) == 2 * 5 * 4);
  CHECK(m.output_bytes(1, 2, 5) == 2 * 5 * C * 4);
}

TEST_CASE("describe_gpt2: the layer chain as the core schedules it") {
  const Gpt2 m(kCfg);
  const auto model = describe_gpt2(m, kT, {1, 2, 4}, {.seconds_per_flop = 1e-9, .update_seconds_per_param = 1e-8});
  REQUIRE(model.num_layers() == m.num_layers());
  CHECK(model.layers.back().is_criterion);
  CHECK(model.layers[1].name == "h.0");
  Bytes total = 0;
  for (int l = 0; l < m.num_layers(); ++l) total += model.layers[static_cast<std::size_t>(l)].weight_bytes;
  CHECK(total == (m.param_count() + std::int64_t(kCfg.vocab_size) * kCfg.n_embd) * 4);  // + the head's wte copy
  CHECK(model.layers.back().param_count == 2 * kCfg.n_embd);  // the tied wte is owned by layer 0
  CHECK(model.layers[0].optimizer_state_bytes == 2 * m.param_floats(0) * 4);
  CHECK(model.input_bytes(1, 0) == kT * 4);                    // layer 0 reads (1, T) int32 ids
  CHECK(model.input_bytes(2, 2) == 2 * kT * kCfg.n_embd * 4);  // u = 2 sequences of (T, C) floats
  // Peaks in core's convention (the layer's weights in both, its whole weight gradient in the backward), so that
  // core's workspace and keep accounts find the executor's buffers: the saved activations are its act block.
  const Bytes W1 = model.layers[1].weight_bytes;
  CHECK(model.layers[1].fwd_peak_bytes[2] ==
        W1 + m.input_bytes(1, 4, kT) + m.output_bytes(1, 4, kT) + m.act_floats(1, 4, kT) * 4);
  CHECK(model.layers[1].bwd_peak_bytes[2] == 2 * W1 + 2 * m.input_bytes(1, 4, kT) + m.output_bytes(1, 4, kT) +
                                                 (m.act_floats(1, 4, kT) + m.scratch_floats(1, 4, kT)) * 4);
  for (int u : {1, 2, 4}) {
    for (int l = 0; l < m.num_layers(); ++l) {
      CAPTURE(u);
      CAPTURE(l);
      CHECK(harmony::core::saved_activation_bytes(model, u, l) == m.act_floats(l, u, kT) * 4);
    }
  }
  CHECK(model.time_s(harmony::core::Phase::Fwd, 2, 1) == doctest::Approx(forward_flops(m, 1, 2, kT) * 1e-9));
  CHECK(model.time_s(harmony::core::Phase::Bwd, 2, 1) == doctest::Approx(3 * forward_flops(m, 1, 2, kT) * 1e-9));
  CHECK_THROWS_AS(describe_gpt2(m, kCfg.max_seq_len + 1, {1}), BackendError);
}
