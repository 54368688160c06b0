// The device conformance suite, kernels: every kernel of Kernels<S>, for S = float and (where the kind has them)
// S = Bf16, on every available registered device kind against the CPU device on the same inputs, each output within
// its bound (derived beside each op below, from conformance.hpp's rounding model); the CPU device against itself
// bit for bit. The rest of the suite (memory, copies, streams, collectives, the summary): test_device_conformance.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernels.hpp"
#include "tests/backend/conformance.hpp"

using namespace conformance;

namespace {

// The kinds with kernels over E (every kind has fp32 ones; bf16 ones are optional: DeviceCaps::bf16_kernels).
template <class E>
std::vector<const DeviceKind*> kernel_subjects() {
  std::vector<const DeviceKind*> out;
  for (const DeviceKind* k : subjects()) {
    if (std::is_same_v<E, float> || k->caps().bf16_kernels) out.push_back(k);
  }
  return out;
}

// ---- bounds (fp32; stored<E> adds bf16's rounding). Inputs are uniform in [-1, 1] unless an op says otherwise. ----

// matmul_fwd: out = bias + sum_{i < IC} in * w: IC + 1 terms of magnitude <= 1 each, so twice gamma_n(IC + 1) (IC + 1).
Bound matmul_fwd_bound(int IC) { return {2 * gamma_n(IC + 1) * (IC + 1), 0}; }
// matmul_bwd din = dout . W^T: OC terms of magnitude <= 1.
Bound matmul_din_bound(int OC) { return {2 * gamma_n(OC) * OC, 0}; }
// dw += in^T . dout onto |dw| <= 1: N + 1 terms of magnitude <= 1.
Bound matmul_dw_bound(int N) { return {2 * gamma_n(N + 1) * (N + 1), 0}; }
// A second dw += onto the first's result (|dw| <= N + 1): N + 1 terms summing to at most 2N + 1 in magnitude, plus
// the first accumulation's difference carried.
Bound matmul_dw_twice_bound(int N) { return {2 * gamma_n(N + 1) * (N + 1) + 2 * gamma_n(N + 1) * (2 * N + 1), 0}; }

// LayerNorm over C columns, inputs |x| <= X, |w|, |b| <= 1; R = the largest rstd and D = the largest |x - mean| of
// the reference's rows (measured; the suite requires R <= 2).
//   mean = (sum x) / C: per device gamma_n(C) C X / C plus the division's u |mean|.
Bound layernorm_mean_bound(int C, double X) { return {2 * gamma_n(C) * X, 2 * kU}; }
//   rstd = 1 / sqrt(sum (x - mean)^2 / C + eps): a sum of positive terms, so gamma_n(C) relative, plus 3u per term
//   (the subtraction, doubled by the square, and the square), u each for / C and + eps; the square root halves that
//   and adds u, the reciprocal u (mean's own error enters only to second order: sum (x - mean) = 0). Per device
//   gamma_n(C) / 2 + 4.5u relative.
Bound layernorm_rstd_bound(int C) { return {0, gamma_n(C) + 9 * kU}; }
//   out = (x - mean) rstd w + b: mean's error times rstd, |x - mean| times rstd's error, and four roundings (-, *, *,
//   +) of values at most D R + 1.
Bound layernorm_out_bound(int C, double X, double R, double D) {
  const Bound m = layernorm_mean_bound(C, X), s = layernorm_rstd_bound(C);
  return {R * (m.abs + m.rel * X) + D * R * s.rel + 8 * kU * (D * R + 1), 0};
}
//   layernorm_bwd on the same mean and rstd: norm = (x - mean) rstd and dnorm = w dout are the same bits on every
//   device (the same operations on the same values). a = mean(dnorm), |dnorm| <= 1: 2 gamma_n(C) + 2u; b =
//   mean(dnorm norm), |norm| <= N = D R: (2 gamma_n(C) + 2u) N. din += rstd ((dnorm - a) - norm b) moves by R (|da| +
//   N |db|), plus five roundings per device of values at most 1 + R (2 + N^2). dw and db accumulate row by row in
//   row order: exact.
Bound layernorm_din_bound(int C, double R, double D) {
  const double N = D * R, d = 2 * gamma_n(C) + 2 * kU;
  return {R * (1 + N * N) * d + 10 * kU * (1 + R * (2 + N * N)), 0};
}

// Causal attention, qkv in [-1, 1], head size hs, T positions.
//   score = q.k / sqrt(hs): per device gamma_n(hs) hs / sqrt(hs) and the division's u |score|, |score| <= sqrt(hs):
//   e_s. exp(score - max): the two scores' errors, the subtraction's u |score - max| <= 2u sqrt(hs) and 2 ulp (4u)
//   of exp (CUDA's expf; glibc's is within 1): e_e relative. The row sum of <= T positive terms: e_e + gamma_n(T);
//   p = e / sum: e_p = 2 e_e + gamma_n(T) + u relative per device.
double attention_p_error(int hs, int T) {
  const double r = std::sqrt(double(hs));
  const double e_s = gamma_n(hs) * r + kU * r;
  const double e_e = 2 * e_s + 2 * kU * r + 4 * kU;
  return 2 * e_e + gamma_n(T) + kU;
}
Bound attention_att_bound(int hs, int T) { return {0, 2 * attention_p_error(hs, T)}; }
//   out = sum_{t2 <= t} p v: the probabilities' errors (they sum to 1, |v| <= 1) and gamma_n(T) of the sum.
Bound attention_out_bound(int hs, int T) { return {2 * (attention_p_error(hs, T) + gamma_n(T)), 0}; }
//   attention_bwd on the same probabilities; A = the largest column sum of the probabilities (sum over t of
//   p[t][t2], measured; <= T). datt = dout.v: gamma_n(hs) hs; dsum = sum a datt: (gamma_n(T) + gamma_n(hs)) hs;
//   dscore = a (datt - dsum) / sqrt(hs): a sqrt(hs) (2 gamma_n(hs) + gamma_n(T) + 6u) =: a d. dq = sum_{t2} dscore k:
//   d + gamma_n(T) 2 sqrt(hs) (|dscore| <= 2 a sqrt(hs), sum a = 1); dk = sum_t dscore q: A times that; dv =
//   sum_t a dout: gamma_n(T) A. All per device.
Bound attention_dqkv_bound(int hs, int T, double A) {
  const double r = std::sqrt(double(hs));
  const double d = r * (2 * gamma_n(hs) + gamma_n(T) + 6 * kU);
  return {2 * std::max(A, 1.0) * (d + 2 * gamma_n(T) * r), 0};
}

// GELU, |x| <= X = 4, |dout| <= 1. Every device evaluates the same expression in the same order; only tanh differs
// (2 ulp of the exact value on CUDA and in glibc: 4u |th|). Per device: the argument U = c (x + k x^3) carries
// du = c (3u k X^3 + u (X + k X^3)) + u |U| (c = sqrt(2/pi), k = 0.044715), th = tanh(U) then du + 4u.
double gelu_th_error(double X) {
  const double c = 0.7978845608028654, k = 0.044715;
  const double U = c * (X + k * X * X * X);
  return c * (3 * kU * k * X * X * X + kU * (X + k * X * X * X)) + kU * U + 4 * kU;
}
//   out = 0.5 x (1 + th): 0.5 X (th's error + 2u), and u |out| <= u X.
Bound gelu_fwd_bound(double X) { return {2 * (0.5 * X * (gelu_th_error(X) + 2 * kU) + kU * X), 0}; }
//   grad = 0.5 (1 + th) + 0.5 x (1 - th^2) dd, dd = c (1 + 3k x^2) <= Dd: d grad / d th = 0.5 - x th dd, at most
//   0.5 + X Dd; eight roundings of the second term (<= 0.5 X Dd), two of the first (<= 1), and two of grad and
//   grad dout (<= G = 1 + 0.5 X Dd).
Bound gelu_bwd_bound(double X) {
  const double c = 0.7978845608028654, k = 0.044715;
  const double Dd = c * (1 + 3 * k * X * X), G = 1 + 0.5 * X * Dd;
  return {2 * ((0.5 + X * Dd) * gelu_th_error(X) + 2 * kU + 8 * kU * 0.5 * X * Dd + 2 * kU * G), 0};
}

// Cross-entropy over V classes, logits in [-L, L]. Per device: exp(l - max) with the subtraction's u 2L and exp's
// 4u; the sum of V such terms adds gamma_n(V) relative; log(sum) errs by that relative error plus 2 ulp (2u ln V);
// + max and - l[target] round values at most ln V + L and ln V + 2L.
Bound crossentropy_loss_bound(int V, double L) {
  const double lnV = std::log(double(V));
  return {2 * (gamma_n(V) + kU * (2 * L + 4) + 2 * kU * lnV + kU * (lnV + L) + kU * (lnV + 2 * L)), 0};
}
//   probs = exp(l - max) * (1 / sum): the exp's 2Lu + 4u, the sum's the same plus gamma_n(V), the reciprocal's and the
//   product's u each: relative.
Bound crossentropy_probs_bound(int V, double L) { return {0, 2 * (4 * L * kU + 10 * kU + gamma_n(V))}; }

}  // namespace

TEST_CASE_TEMPLATE("kernels: embedding forward and row-ordered backward are exact; bad ids are errors", E, float,
                   Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const int B = 3, T = 50, C = 40, V = 17;  // V << B*T: every id repeats
    auto id = p.ids(random_ids(B * T, V, 11));
    auto wte = p.up<E>(random_floats(V * C, 12)), wpe = p.up<E>(random_floats(T * C, 13));
    auto out = p.zeros<E>(B * T * C);
    // out = wte[id] + wpe[t]: one addition per element, correctly rounded everywhere: exact.
    p.run<E>(
        [&](auto& k, Stream& s, Side x) { k.embedding_fwd(s, out.at(x), id.at(x), wte.at(x), wpe.at(x), B, T, C, V); });
    p.check(named("embedding_fwd", type_name<E>()), out, Bound{});
    // The backward accumulates row by row in row order (the contract): exact, also when called twice.
    auto dout = p.up<E>(random_floats(B * T * C, 14));
    auto dwte = p.up<E>(random_floats(V * C, 15)), dwpe = p.up<E>(random_floats(T * C, 16));
    for (int rep = 0; rep < 2; ++rep)
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.embedding_bwd(s, dwte.at(x), dwpe.at(x), dout.at(x), id.at(x), B, T, C, V);
      });
    p.check(named("embedding_bwd dwte", type_name<E>()), dwte, Bound{});
    p.check(named("embedding_bwd dwpe", type_name<E>()), dwpe, Bound{});
    // An id outside [0, V), anywhere: a DeviceError at the next synchronize naming it and its (b, t); the backward
    // then writes nothing; the device works on.
    for (const std::int32_t bad : {V, 1000, -1}) {
      CAPTURE(bad);
      auto ids = random_ids(B * T, V, 81);
      ids[53] = bad;  // (b=1, t=3)
      auto badid = p.ids(ids);
      const std::string at = "token id " + std::to_string(bad) + " at (b=1, t=3) is outside the vocabulary [0, 17)";
      p.run_dut<E>([&](auto& k, Stream& s, Side x) {
        k.embedding_fwd(s, out.at(x), badid.at(x), wte.at(x), wpe.at(x), B, T, C, V);
      });
      CHECK_THROWS_WITH_AS(p.dut_stream().synchronize(), doctest::Contains(at.c_str()), DeviceError);
      const auto before = p.down(dwte).first, before_pe = p.down(dwpe).first;
      p.run_dut<E>([&](auto& k, Stream& s, Side x) {
        k.embedding_bwd(s, dwte.at(x), dwpe.at(x), dout.at(x), badid.at(x), B, T, C, V);
      });
      CHECK_THROWS_WITH_AS(p.dut_stream().synchronize(), doctest::Contains(at.c_str()), DeviceError);
      CHECK(p.down(dwte).first == before);
      CHECK(p.down(dwpe).first == before_pe);
    }
    p.run<E>([&](auto& k, Stream& s, Side x) {
      k.embedding_bwd(s, dwte.at(x), dwpe.at(x), dout.at(x), id.at(x), B, T, C, V);
    });
    p.check(named("embedding_bwd after errors", type_name<E>()), dwte, Bound{});
  }
}

TEST_CASE_TEMPLATE("kernels: LayerNorm forward and backward", E, float, Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    for (const int C : {40, 96, 777}) {
      CAPTURE(C);
      const int N = 67;
      const double X = 2.0;
      const auto host_in = random_floats(N * C, 21, float(X));
      auto in = p.up<E>(host_in);
      auto w = p.up<E>(random_floats(C, 22)), b = p.up<E>(random_floats(C, 23));
      auto out = p.zeros<E>(N * C);
      auto mean = p.zeros<float>(N), rstd = p.zeros<float>(N);  // fp32 for every E
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.layernorm_fwd(s, out.at(x), mean.at(x), rstd.at(x), in.at(x), w.at(x), b.at(x), N, C, 1e-5f);
      });
      // The measured magnitudes the bounds use (on the values the devices saw: bf16 inputs are rounded).
      const auto m = ref_of(p, mean), r = ref_of(p, rstd), xs = p.down(in).second;
      double R = 0, D = 0;
      for (int row = 0; row < N; ++row) {
        R = std::max(R, double(r[row]));
        for (int c = 0; c < C; ++c) D = std::max(D, std::abs(double(xs[row * C + c]) - m[row]));
      }
      REQUIRE(R <= 2.0);  // the bounds' assumption: every row's variance >= 1/4
      const std::string t = std::string(type_name<E>()) + " C " + std::to_string(C);
      p.check(named("layernorm_fwd out", t), out, stored<E>(layernorm_out_bound(C, X, R, D)));
      p.check(named("layernorm_fwd mean", t), mean, layernorm_mean_bound(C, X));  // fp32: no bf16 rounding
      p.check(named("layernorm_fwd rstd", t), rstd, layernorm_rstd_bound(C));
      {  // the statistics of the device under test against fp64 on the (rounded) inputs it saw
        std::vector<double> dout(std::size_t(N) * C), dm(N), dr(N);
        const std::vector<double> ones(C, 1.0), zeros(C, 0.0);
        cpu::layernorm_fwd<double>(dout.data(), dm.data(), dr.data(), to_double(xs).data(), ones.data(), zeros.data(),
                                   N, C, double(1e-5f));
        check_stats_fp64(kind->name() + " " + named("layernorm_fwd mean", t), p.down(mean).first, dm,
                         layernorm_mean_bound(C, X));
        check_stats_fp64(kind->name() + " " + named("layernorm_fwd rstd", t), p.down(rstd).first, dr,
                         layernorm_rstd_bound(C));
      }
      // The backward on the reference's statistics, so that dw and db compare exactly (the row order).
      auto m2 = p.up<float>(m), r2 = p.up<float>(r);
      auto dout = p.up<E>(random_floats(N * C, 24));
      auto din = p.up<E>(random_floats(N * C, 25)), dw = p.up<E>(random_floats(C, 26)),
           db = p.up<E>(random_floats(C, 27));
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.layernorm_bwd(s, din.at(x), dw.at(x), db.at(x), dout.at(x), in.at(x), w.at(x), m2.at(x), r2.at(x), N, C);
      });
      p.check(named("layernorm_bwd din (accumulated)", t), din, stored<E>(layernorm_din_bound(C, R, D)));
      p.check(named("layernorm_bwd dw", t), dw, Bound{});
      p.check(named("layernorm_bwd db", t), db, Bound{});
    }
  }
}

TEST_CASE_TEMPLATE("kernels: matmul forward and backward, both layouts, with and without bias", E, float, Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const int N = 37, IC = 48, OC = 80;
    for (const WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
      for (const bool with_bias : {true, false}) {
        const std::string t = std::string(type_name<E>()) + (layout == WeightLayout::InOut ? " InOut" : " OutIn") +
                              (with_bias ? " bias" : "");
        auto in = p.up<E>(random_floats(N * IC, 31)), w = p.up<E>(random_floats(IC * OC, 32));
        auto bias = p.up<E>(random_floats(OC, 33));
        auto out = p.zeros<E>(N * OC);
        p.run<E>([&](auto& k, Stream& s, Side x) {
          k.matmul_fwd(s, out.at(x), in.at(x), w.at(x), with_bias ? bias.at(x) : nullptr, N, IC, OC, layout);
        });
        p.check(named("matmul_fwd", t), out, stored<E>(matmul_fwd_bound(IC)));
        auto dout = p.up<E>(random_floats(N * OC, 34)), din = p.up<E>(random_floats(N * IC, 35));
        auto dw = p.up<E>(random_floats(IC * OC, 36)), dbias = p.up<E>(random_floats(OC, 37));
        p.run<E>([&](auto& k, Stream& s, Side x) {
          k.matmul_bwd(s, din.at(x), dw.at(x), with_bias ? dbias.at(x) : nullptr, dout.at(x), in.at(x), w.at(x), N, IC,
                       OC, layout);
        });
        p.check(named("matmul_bwd din", t), din, stored<E>(matmul_din_bound(OC)));
        p.check(named("matmul_bwd dw (accumulated)", t), dw, stored<E>(matmul_dw_bound(N)));
        p.check(named("matmul_bwd dbias (row order)", t), dbias, Bound{});
        // din may be null (the first layer's input needs no gradient); dw accumulates a second time.
        p.run<E>([&](auto& k, Stream& s, Side x) {
          k.matmul_bwd(s, nullptr, dw.at(x), nullptr, dout.at(x), in.at(x), w.at(x), N, IC, OC, layout);
        });
        p.check(named("matmul_bwd dw, din null", t), dw, stored<E>(matmul_dw_twice_bound(N), 2));
      }
    }
  }
}

TEST_CASE_TEMPLATE("kernels: causal attention forward and backward", E, float, Bf16) {
  struct Shape {
    int B, T, C, H;
  };
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    for (const Shape sh : {Shape{2, 19, 48, 4}, Shape{1, 70, 64, 2}, Shape{3, 8, 24, 3}}) {
      const int B = sh.B, T = sh.T, C = sh.C, H = sh.H, hs = C / H;
      const std::string t = std::string(type_name<E>()) + " B" + std::to_string(B) + " T" + std::to_string(T) + " C" +
                            std::to_string(C) + " H" + std::to_string(H);
      auto qkv = p.up<E>(random_floats(B * T * 3 * C, 51));
      auto out = p.zeros<E>(B * T * C), att = p.up<E>(random_floats(B * H * T * T, 52));  // att fully overwritten
      p.run<E>([&](auto& k, Stream& s, Side x) { k.attention_fwd(s, out.at(x), att.at(x), qkv.at(x), B, T, C, H); });
      p.check(named("attention_fwd out", t), out, stored<E>(attention_out_bound(hs, T)));
      // A relative bound: the zeros above the diagonal must be zeros.
      p.check(named("attention_fwd att", t), att, stored<E>(attention_att_bound(hs, T)));
      // The backward on the reference's probabilities for both.
      const auto a = ref_of(p, att);
      double A = 0;
      for (int bh = 0; bh < B * H; ++bh) {
        for (int t2 = 0; t2 < T; ++t2) {
          double col = 0;
          for (int t1 = 0; t1 < T; ++t1) col += a[(std::size_t(bh) * T + t1) * T + t2];
          A = std::max(A, col);
        }
      }
      auto att2 = p.up<E>(a);
      auto dout = p.up<E>(random_floats(B * T * C, 53));
      auto dqkv = p.up<E>(random_floats(B * T * 3 * C, 54));  // written, not accumulated
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.attention_bwd(s, dqkv.at(x), dout.at(x), qkv.at(x), att2.at(x), B, T, C, H);
      });
      p.check(named("attention_bwd dqkv", t), dqkv, stored<E>(attention_dqkv_bound(hs, T, A)));
    }
  }
}

TEST_CASE_TEMPLATE("kernels: GELU and the residual add, also in place", E, float, Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const std::int64_t n = 100000;
    const double X = 4.0;
    const std::string t = type_name<E>();
    auto in = p.up<E>(random_floats(n, 61, float(X))), dout = p.up<E>(random_floats(n, 62));
    auto out = p.zeros<E>(n), din = p.zeros<E>(n);
    p.run<E>([&](auto& k, Stream& s, Side x) { k.gelu_fwd(s, out.at(x), in.at(x), n); });
    p.check(named("gelu_fwd", t), out, stored<E>(gelu_fwd_bound(X)));
    p.run<E>([&](auto& k, Stream& s, Side x) { k.gelu_bwd(s, din.at(x), in.at(x), dout.at(x), n); });
    p.check(named("gelu_bwd", t), din, stored<E>(gelu_bwd_bound(X)));
    p.run<E>([&](auto& k, Stream& s, Side x) { k.gelu_bwd(s, dout.at(x), in.at(x), dout.at(x), n); });  // din = dout
    p.check(named("gelu_bwd in place", t), dout, stored<E>(gelu_bwd_bound(X)));
    // One addition, correctly rounded everywhere (and, bf16, one rounding of its fp32 sum): exact.
    auto a = p.up<E>(random_floats(n, 65)), b = p.up<E>(random_floats(n, 66, 0.01f)), o = p.zeros<E>(n);
    p.run<E>([&](auto& k, Stream& s, Side x) { k.add(s, o.at(x), a.at(x), b.at(x), n); });
    p.check(named("add", t), o, Bound{});
    p.run<E>([&](auto& k, Stream& s, Side x) { k.add(s, a.at(x), a.at(x), b.at(x), n); });
    p.check(named("add in place", t), a, Bound{});
    if constexpr (std::is_same_v<E, Bf16>) {
      // Round to nearest, ties to even: 1 + 2^-8 (halfway) rounds to 1, 1 + 3 * 2^-8 to 1 + 2^-6, -(1 + 2^-8) to -1;
      // a truncating store gives 1 + 2^-7 for the second, a round-half-up one 1 + 2^-7 for the first.
      const float h = std::ldexp(1.0f, -8);
      auto x1 = p.up<E>({1.0f, 1.0f, -1.0f, 1.0f}), y1 = p.up<E>({h, 3 * h, -h, 2 * h}), z = p.zeros<E>(4);
      p.run<E>([&](auto& k, Stream& s, Side x) { k.add(s, z.at(x), x1.at(x), y1.at(x), 4); });
      CHECK(p.down(z).first == std::vector<float>{1.0f, 1.0f + 4 * h, -1.0f, 1.0f + 2 * h});
    }
  }
}

TEST_CASE_TEMPLATE("kernels: cross-entropy forward and backward, also in place; bad targets are errors", E, float,
                   Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const double L = 5.0;
    for (const int V : {7, 1000, 5003}) {
      const int N = 13;
      const std::string t = std::string(type_name<E>()) + " V " + std::to_string(V);
      auto logits = p.up<E>(random_floats(N * V, 63, float(L)));
      auto tgt = p.ids(random_ids(N, V, 64));
      auto losses = p.zeros<float>(N);  // fp32 for either storage
      auto probs = p.zeros<E>(N * V);
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.crossentropy_fwd(s, losses.at(x), probs.at(x), logits.at(x), tgt.at(x), N, V);
      });
      p.check(named("crossentropy_fwd losses (fp32)", t), losses, crossentropy_loss_bound(V, L));
      p.check(named("crossentropy_fwd probs", t), probs, stored<E>(crossentropy_probs_bound(V, L)));
      p.run<E>([&](auto& k, Stream& s, Side x) {  // probs aliasing logits
        k.crossentropy_fwd(s, losses.at(x), logits.at(x), logits.at(x), tgt.at(x), N, V);
      });
      p.check(named("crossentropy_fwd in place", t), logits, stored<E>(crossentropy_probs_bound(V, L)));
      // (probs - onehot) * scale on the reference's probabilities: the same operations on the same values, exact.
      auto p2 = p.up<E>(ref_of(p, probs));
      auto dlogits = p.zeros<E>(N * V);
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.crossentropy_bwd(s, dlogits.at(x), p2.at(x), tgt.at(x), 1.0f / 52, N, V);
      });
      p.check(named("crossentropy_bwd", t), dlogits, Bound{});
      p.run<E>(
          [&](auto& k, Stream& s, Side x) { k.crossentropy_bwd(s, p2.at(x), p2.at(x), tgt.at(x), 1.0f / 52, N, V); });
      p.check(named("crossentropy_bwd in place", t), p2, Bound{});
    }
    auto tgt = p.ids({0, 1, -1});
    auto logits = p.up<E>(random_floats(3 * 5, 4));
    auto losses = p.zeros<float>(3);
    p.run_dut<E>([&](auto& k, Stream& s, Side x) {
      k.crossentropy_fwd(s, losses.at(x), logits.at(x), logits.at(x), tgt.at(x), 3, 5);
    });
    CHECK_THROWS_WITH_AS(p.dut_stream().synchronize(), doctest::Contains("target id -1 at row 2"), DeviceError);
  }
}

TEST_CASE_TEMPLATE("kernels: results are identical run to run", E, float, Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const int B = 2, T = 33, C = 64, H = 4;
    auto qkv = p.up<E>(random_floats(B * T * 3 * C, 71)), dout = p.up<E>(random_floats(B * T * C, 72));
    auto out = p.zeros<E>(B * T * C), att = p.zeros<E>(B * H * T * T), dqkv = p.zeros<E>(B * T * 3 * C);
    std::vector<float> first;
    for (int rep = 0; rep < 3; ++rep) {
      p.run_dut<E>([&](auto& k, Stream& s, Side x) {
        k.attention_fwd(s, out.at(x), att.at(x), qkv.at(x), B, T, C, H);
        k.attention_bwd(s, dqkv.at(x), dout.at(x), qkv.at(x), att.at(x), B, T, C, H);
      });
      const auto got = p.down(dqkv).first;
      if (rep == 0) first = got;
      CHECK(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
    }
  }
}

// The fused entry points (Kernels<S>::matmul_gelu_fwd / _bwd, add_layernorm_fwd) on each kind with its fused kernels
// on (DeviceOptions::fused where the kind has it: the CUDA device's fused residual add + LayerNorm) against the same
// kind with them off (the composition of the separate kernels, Kernels<S>' defaults): the same bits, as the registry
// makes the devices (strict reductions: no GELU epilogue, whose fast-path bounds are test_cuda_device.cpp's). A
// matmul_gelu_bwd that returns false leaves the pre-activation's bias gradient to the caller's next matmul_bwd, as
// the GPT-2 block does; the result must not depend on which side summed it.
TEST_CASE_TEMPLATE("kernels: the fused entry points give the composition's bits", E, float, Bf16) {
  for (const DeviceKind* kind : kernel_subjects<E>()) {
    CAPTURE(kind->name());
    DeviceOptions fused = test_options(64 * kMiB);
    fused.fused = kind->caps().fused;
    Pair p(*kind, fused, *kind, test_options(64 * kMiB));
    const int N = 37, C = 48, IC = C, OC = 4 * C;
    const std::string t = type_name<E>();
    // res = a + b, LayerNorm(res); a aliased by res on the second pass.
    auto a = p.up<E>(random_floats(N * C, 81, 2.0f)), b = p.up<E>(random_floats(N * C, 82));
    auto w = p.up<E>(random_floats(C, 83)), bias = p.up<E>(random_floats(C, 84));
    auto res = p.zeros<E>(N * C), out = p.zeros<E>(N * C);
    auto mean = p.zeros<float>(N), rstd = p.zeros<float>(N);
    p.run<E>([&](auto& k, Stream& s, Side x) {
      if (x == Side::Dut) {
        k.add_layernorm_fwd(s, res.at(x), out.at(x), mean.at(x), rstd.at(x), a.at(x), b.at(x), w.at(x), bias.at(x), N,
                            C, 1e-5f);
      } else {
        k.add(s, res.at(x), a.at(x), b.at(x), std::int64_t(N) * C);
        k.layernorm_fwd(s, out.at(x), mean.at(x), rstd.at(x), res.at(x), w.at(x), bias.at(x), N, C, 1e-5f);
      }
    });
    p.check(named("add_layernorm_fwd res", t), res, Bound{});
    p.check(named("add_layernorm_fwd out", t), out, Bound{});
    p.check(named("add_layernorm_fwd mean", t), mean, Bound{});
    p.check(named("add_layernorm_fwd rstd", t), rstd, Bound{});
    p.run<E>([&](auto& k, Stream& s, Side x) {  // in place: res aliases a
      k.add_layernorm_fwd(s, a.at(x), out.at(x), mean.at(x), rstd.at(x), a.at(x), b.at(x), w.at(x), bias.at(x), N, C,
                          1e-5f);
    });
    p.check(named("add_layernorm_fwd res in place", t), a, Bound{});
    p.check(named("add_layernorm_fwd out in place", t), out, Bound{});
    // The MLP: pre = in . W_fc + b_fc, g = gelu(pre); backward through W_proj (OC x C) into din, dpre_bias.
    auto in = p.up<E>(random_floats(N * IC, 85)), wfc = p.up<E>(random_floats(IC * OC, 86, 0.2f));
    auto bfc = p.up<E>(random_floats(OC, 87)), pre = p.zeros<E>(N * OC), g = p.zeros<E>(N * OC);
    p.run<E>([&](auto& k, Stream& s, Side x) {
      if (x == Side::Dut) {
        k.matmul_gelu_fwd(s, g.at(x), pre.at(x), in.at(x), wfc.at(x), bfc.at(x), N, IC, OC, WeightLayout::InOut);
      } else {
        k.matmul_fwd(s, pre.at(x), in.at(x), wfc.at(x), bfc.at(x), N, IC, OC, WeightLayout::InOut);
        k.gelu_fwd(s, g.at(x), pre.at(x), std::int64_t(N) * OC);
      }
    });
    p.check(named("matmul_gelu_fwd pre", t), pre, Bound{});
    p.check(named("matmul_gelu_fwd out", t), g, Bound{});
    auto wproj = p.up<E>(random_floats(OC * C, 88, 0.2f)), dout = p.up<E>(random_floats(N * C, 89));
    auto dg = p.zeros<E>(N * OC), dwproj = p.up<E>(random_floats(OC * C, 90)), dbproj = p.up<E>(random_floats(C, 91));
    auto dbfc = p.up<E>(random_floats(OC, 92)), dwfc = p.up<E>(random_floats(IC * OC, 93)), dx = p.zeros<E>(N * IC);
    p.run<E>([&](auto& k, Stream& s, Side x) {
      bool summed = false;
      if (x == Side::Dut) {
        summed = k.matmul_gelu_bwd(s, dg.at(x), dwproj.at(x), dbproj.at(x), dbfc.at(x), dout.at(x), g.at(x),
                                   wproj.at(x), pre.at(x), N, OC, C, WeightLayout::InOut);
      } else {
        k.matmul_bwd(s, dg.at(x), dwproj.at(x), dbproj.at(x), dout.at(x), g.at(x), wproj.at(x), N, OC, C,
                     WeightLayout::InOut);
        k.gelu_bwd(s, dg.at(x), pre.at(x), dg.at(x), std::int64_t(N) * OC);
      }
      k.matmul_bwd(s, dx.at(x), dwfc.at(x), summed ? nullptr : dbfc.at(x), dg.at(x), in.at(x), wfc.at(x), N, IC, OC,
                   WeightLayout::InOut);
    });
    p.check(named("matmul_gelu_bwd din", t), dg, Bound{});
    p.check(named("matmul_gelu_bwd dw", t), dwproj, Bound{});
    p.check(named("matmul_gelu_bwd dbias", t), dbproj, Bound{});
    p.check(named("matmul_gelu_bwd dpre_bias", t), dbfc, Bound{});
    p.check(named("matmul_gelu_bwd then matmul_bwd dw", t), dwfc, Bound{});
    p.check(named("matmul_gelu_bwd then matmul_bwd din", t), dx, Bound{});
  }
}

// ---- the bounds themselves --------------------------------------------------------------------------------------

// A legitimate other implementation must meet every non-exact bound, and a faulty one must not. The reference loops
// in double precision, rounded to fp32 once, are the first (each result within a rounding of the exact value, so
// within one device's share of the bound, half of it); the fp32 loops with the weight read in the wrong layout (a
// transposition, as a wrong leading dimension gives) the second. Host loops only: no device involved.
TEST_CASE("bounds: an fp64 implementation meets them, a transposed matmul does not") {
  {                                      // matmul
    const int N = 37, IC = 48, OC = 48;  // square, so that the wrong layout is a valid call
    const auto in = random_floats(N * IC, 31), w = random_floats(IC * OC, 32), bias = random_floats(OC, 33);
    std::vector<float> f(N * OC), wrong(N * OC);
    std::vector<double> d(N * OC);
    cpu::matmul_fwd<float>(f.data(), in.data(), w.data(), bias.data(), N, IC, OC, WeightLayout::InOut);
    cpu::matmul_fwd<double>(d.data(), to_double(in).data(), to_double(w).data(), to_double(bias).data(), N, IC, OC,
                            WeightLayout::InOut);
    cpu::matmul_fwd<float>(wrong.data(), in.data(), w.data(), bias.data(), N, IC, OC, WeightLayout::OutIn);
    record("matmul_fwd, fp64", share_of(to_float(d), f, matmul_fwd_bound(IC)));
    CHECK(share_of(wrong, f, matmul_fwd_bound(IC)) > 100);
  }
}

TEST_CASE("bounds: LayerNorm forward and backward") {
  {
    const int N = 67, C = 777;
    const auto x = random_floats(N * C, 21, 2.0f), w = random_floats(C, 22), b = random_floats(C, 23);
    std::vector<float> out(N * C), m(N), r(N);
    std::vector<double> dout(N * C), dm(N), dr(N);
    cpu::layernorm_fwd<float>(out.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    cpu::layernorm_fwd<double>(dout.data(), dm.data(), dr.data(), to_double(x).data(), to_double(w).data(),
                               to_double(b).data(), N, C, 1e-5);
    double R = 0, D = 0;
    for (int row = 0; row < N; ++row) {
      R = std::max(R, double(r[row]));
      for (int c = 0; c < C; ++c) D = std::max(D, std::abs(double(x[row * C + c]) - m[row]));
    }
    record("layernorm_fwd out, fp64", share_of(to_float(dout), out, layernorm_out_bound(C, 2.0, R, D)));
    record("layernorm_fwd mean, fp64", share_of(to_float(dm), m, layernorm_mean_bound(C, 2.0)));
    record("layernorm_fwd rstd, fp64", share_of(to_float(dr), r, layernorm_rstd_bound(C)));
    const auto g = random_floats(N * C, 24), din0 = random_floats(N * C, 25);
    std::vector<float> din = din0, dw(C), db(C);
    std::vector<double> ddin = to_double(din0), ddw(C), ddb(C);
    cpu::layernorm_bwd<float>(din.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), m.data(), r.data(), N, C);
    cpu::layernorm_bwd<double>(ddin.data(), ddw.data(), ddb.data(), to_double(g).data(), to_double(x).data(),
                               to_double(w).data(), to_double(m).data(), to_double(r).data(), N, C);
    record("layernorm_bwd din, fp64", share_of(to_float(ddin), din, layernorm_din_bound(C, R, D)));
  }
}

TEST_CASE("bounds: attention forward and backward") {
  {
    const int B = 1, T = 70, C = 64, H = 2, hs = C / H;
    const auto qkv = random_floats(B * T * 3 * C, 51), g = random_floats(B * T * C, 53);
    std::vector<float> out(B * T * C), att(B * H * T * T), dqkv(B * T * 3 * C);
    std::vector<double> dout(out.size()), datt(att.size()), ddqkv(dqkv.size());
    cpu::attention_fwd<float>(out.data(), att.data(), qkv.data(), B, T, C, H);
    cpu::attention_fwd<double>(dout.data(), datt.data(), to_double(qkv).data(), B, T, C, H);
    record("attention_fwd out, fp64", share_of(to_float(dout), out, attention_out_bound(hs, T)));
    record("attention_fwd att, fp64", share_of(to_float(datt), att, attention_att_bound(hs, T)));
    double A = 0;
    for (int bh = 0; bh < B * H; ++bh) {
      for (int t2 = 0; t2 < T; ++t2) {
        double col = 0;
        for (int t1 = 0; t1 < T; ++t1) col += att[(std::size_t(bh) * T + t1) * T + t2];
        A = std::max(A, col);
      }
    }
    cpu::attention_bwd<float>(dqkv.data(), g.data(), qkv.data(), att.data(), B, T, C, H);
    cpu::attention_bwd<double>(ddqkv.data(), to_double(g).data(), to_double(qkv).data(), to_double(att).data(), B, T, C,
                               H);
    record("attention_bwd dqkv, fp64", share_of(to_float(ddqkv), dqkv, attention_dqkv_bound(hs, T, A)));
  }
}

TEST_CASE("bounds: GELU and cross-entropy") {
  {
    const int n = 100000;
    const auto x = random_floats(n, 61, 4.0f), g = random_floats(n, 62);
    std::vector<float> f(n), fb(n);
    std::vector<double> d(n), db(n);
    cpu::gelu_fwd<float>(f.data(), x.data(), n);
    cpu::gelu_fwd<double>(d.data(), to_double(x).data(), n);
    record("gelu_fwd, fp64", share_of(to_float(d), f, gelu_fwd_bound(4.0)));
    cpu::gelu_bwd<float>(fb.data(), x.data(), g.data(), n);
    cpu::gelu_bwd<double>(db.data(), to_double(x).data(), to_double(g).data(), n);
    record("gelu_bwd, fp64", share_of(to_float(db), fb, gelu_bwd_bound(4.0)));
    const int N = 13, V = 5003;
    const auto logits = random_floats(N * V, 63, 5.0f);
    const auto tgt = random_ids(N, V, 64);
    std::vector<float> loss(N), probs(N * V);
    std::vector<double> dloss(N), dprobs(N * V);
    cpu::crossentropy_fwd<float>(loss.data(), probs.data(), logits.data(), tgt.data(), N, V);
    cpu::crossentropy_fwd<double>(dloss.data(), dprobs.data(), to_double(logits).data(), tgt.data(), N, V);
    record("crossentropy_fwd losses, fp64", share_of(to_float(dloss), loss, crossentropy_loss_bound(V, 5.0)));
    record("crossentropy_fwd probs, fp64", share_of(to_float(dprobs), probs, crossentropy_probs_bound(V, 5.0)));
  }
}
