// The device conformance suite, the Llama family's kernels (Kernels<S>::rmsnorm_*, rope_qkv_*, swiglu_*: optional,
// DeviceCaps::llama_kernels) for S = float and (where the kind has them) Bf16, on every available kind that has them,
// against the CPU device on the same inputs, each output within its bound (derived beside each op below, from
// conformance.hpp's rounding model); then the bounds themselves against fp64 loops and faulty ones. Host-only parts run
// everywhere; the other kernels are test_device_conformance_kernels.cpp's.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernels.hpp"
#include "tests/backend/conformance.hpp"

using namespace conformance;

namespace {

// The kinds with the Llama kernels over E.
template <class E>
std::vector<const DeviceKind*> llama_subjects() {
  std::vector<const DeviceKind*> out;
  for (const DeviceKind* k : subjects()) {
    if (k->caps().llama_kernels && (std::is_same_v<E, float> || k->caps().bf16_kernels)) out.push_back(k);
  }
  return out;
}

// ---- bounds (fp32; stored<E> adds bf16's rounding) ----------------------------------------------------------------

// RMSNorm over C columns, |x| <= X, |w| <= 1, |dout| <= 1; R = the largest rstd of the reference's rows (measured).
//   rstd = 1 / sqrt(sum x^2 / C + eps): C squares (u each) summed, a sum of positive terms: gamma_n(C) + u relative;
//   u each for / C and + eps; the square root halves that and adds u, the reciprocal u. Per device
//   gamma_n(C) / 2 + 3.5u relative.
Bound rmsnorm_rstd_bound(int C) { return {0, gamma_n(C) + 7 * kU}; }
//   out = (x rstd) w, |out| <= X R: rstd's error and two roundings, per device.
Bound rmsnorm_out_bound(int C, double X, double R) { return {2 * X * R * (gamma_n(C) / 2 + 5.5 * kU), 0}; }
//   rmsnorm_bwd on the same rstd: xhat = x rstd and wd = w dout are the same bits on every device (the same operations
//   on the same values), |xhat| <= Xh = X R. m = mean(wd xhat): C products (u each) summed, then / C: (gamma_n(C) +
//   2u) Xh. din += rstd (wd - xhat m) moves by R Xh times m's error, plus four roundings (xhat m, the difference, the
//   product by rstd, the sum) of values at most 1 + R (1 + Xh^2). dw accumulates row by row in row order: exact.
Bound rmsnorm_din_bound(int C, double X, double R) {
  const double Xh = X * R;
  return {2 * (R * Xh * Xh * (gamma_n(C) + 2 * kU) + 4 * kU * (1 + R * (1 + Xh * Xh))), 0};
}

// Rotary embeddings at positions t < T, |x| <= 1. Per device: inv_freq = 1 / theta^e within 3u relative (the power
// within one ulp, 2u; the reciprocal u), the angle t inv_freq within 4u relative, so within 4u (T - 1) absolute
// (inv_freq <= 1); cos and sin within one ulp (2u) of their exact values there: e_cs = 4u (T - 1) + 2u. A rotated
// element x1 c - x2 s: 2 e_cs, and two products (<= 1) and the difference (<= 2) rounded: 4u. The backward's key
// gradients rotate a sum of `rep` query heads' gradients (the same bits on every device: the same additions in the
// same order), so their bound scales by rep. The values are copies (forward) or those sums (backward): exact.
double rope_cs_error(int T) { return 4 * kU * std::max(T - 1, 0) + 2 * kU; }
Bound rope_bound(int T, int rep = 1) { return {2 * rep * (2 * rope_cs_error(T) + 4 * kU), 0}; }

// SwiGLU, gate and up in [-X, X], |dout| <= 1. Per device: e = exp(-g) within 2 ulp (4u relative; CUDA's expf, glibc's
// within 1), 1 + e within 5u (a sum of positive terms), sig = 1 / (1 + e) within 6u, silu = g sig 7u, all relative.
//   out = (g / (1 + e)) up: 5u, the division's u and the product's u: 7u relative.
Bound swiglu_fwd_bound() { return {0, 2 * 7 * kU}; }
//   dup = dout silu: 8u relative. dgate = (dout up) (sig (1 + g (1 - sig))): 1 - sig within 7u absolute, g (1 - sig)
//   (|.| <= X) within 8u X, 1 + that (<= 1 + X) within 8u X + u (1 + X), times sig (<= 1 + X) within 8u (1 + X) +
//   8u X; dout up (<= X) rounds by u X and the last product (<= X (1 + X)) by u X (1 + X): X u (10 (1 + X) + 8 X).
Bound swiglu_bwd_bound(double X) { return {2 * kU * X * (10 * (1 + X) + 8 * X), 2 * 8 * kU}; }

}  // namespace

// The Llama family has no position table: embedding_fwd / _bwd with a null wpe / dwpe (device.hpp: allowed on a kind
// with the Llama kernels) gather and scatter-add the token rows alone. A copy, and the row-ordered backward: exact.
TEST_CASE_TEMPLATE("llama kernels: the embedding without a position table (null wpe and dwpe) is exact", E, float,
                   Bf16) {
  for (const DeviceKind* kind : llama_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    const int B = 3, T = 50, C = 40, V = 17;  // every id repeats
    auto id = p.ids(random_ids(B * T, V, 111));
    auto wte = p.up<E>(random_floats(V * C, 112));
    auto out = p.up<E>(random_floats(B * T * C, 113));  // overwritten
    p.run<E>([&](auto& k, Stream& s, Side x) {
      k.embedding_fwd(s, out.at(x), id.at(x), wte.at(x), static_cast<const E*>(nullptr), B, T, C, V);
    });
    p.check(named("embedding_fwd, no wpe", type_name<E>()), out, Bound{});
    const auto got = p.down(out).first, table = p.down(wte).first;
    const auto ids = random_ids(B * T, V, 111);
    bool rows = true;  // out's rows are wte's rows, bit for bit (so not wte + anything)
    for (int r = 0; r < B * T; ++r)
      rows = rows && std::equal(got.begin() + r * C, got.begin() + (r + 1) * C, table.begin() + ids[r] * C);
    CHECK(rows);
    auto dout = p.up<E>(random_floats(B * T * C, 114)), dwte = p.up<E>(random_floats(V * C, 115));
    for (int rep = 0; rep < 2; ++rep)
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.embedding_bwd(s, dwte.at(x), static_cast<E*>(nullptr), dout.at(x), id.at(x), B, T, C, V);
      });
    p.check(named("embedding_bwd dwte, no dwpe", type_name<E>()), dwte, Bound{});
  }
}

TEST_CASE_TEMPLATE("llama kernels: RMSNorm forward and backward (din and dw accumulate)", E, float, Bf16) {
  for (const DeviceKind* kind : llama_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    for (const int C : {40, 96, 777}) {
      CAPTURE(C);
      const int N = 67;
      const double X = 2.0;
      auto in = p.up<E>(random_floats(N * C, 121, float(X)));
      auto w = p.up<E>(random_floats(C, 122));
      auto out = p.zeros<E>(N * C);
      auto rstd = p.zeros<float>(N);  // fp32 for every E
      p.run<E>(
          [&](auto& k, Stream& s, Side x) { k.rmsnorm_fwd(s, out.at(x), rstd.at(x), in.at(x), w.at(x), N, C, 1e-5f); });
      const auto r = ref_of(p, rstd);
      const double R = *std::max_element(r.begin(), r.end());
      REQUIRE(R <= 2.0);  // the inputs' mean square is about X^2 / 3
      const std::string t = std::string(type_name<E>()) + " C " + std::to_string(C);
      p.check(named("rmsnorm_fwd out", t), out, stored<E>(rmsnorm_out_bound(C, X, R)));
      p.check(named("rmsnorm_fwd rstd", t), rstd, rmsnorm_rstd_bound(C));  // fp32: no bf16 rounding
      {  // the device under test's rstd against fp64 on the (rounded) inputs it saw
        std::vector<double> dout(std::size_t(N) * C), dr(N);
        const std::vector<double> ones(C, 1.0);
        cpu::rmsnorm_fwd<double>(dout.data(), dr.data(), to_double(p.down(in).second).data(), ones.data(), N, C,
                                 double(1e-5f));
        check_stats_fp64(kind->name() + " " + named("rmsnorm_fwd rstd", t), p.down(rstd).first, dr,
                         rmsnorm_rstd_bound(C));
      }
      // The backward on the reference's rstd, so that dw compares exactly (the row order).
      auto r2 = p.up<float>(r);
      auto dout = p.up<E>(random_floats(N * C, 124));
      auto din = p.up<E>(random_floats(N * C, 125)), dw = p.up<E>(random_floats(C, 126));
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.rmsnorm_bwd(s, din.at(x), dw.at(x), dout.at(x), in.at(x), w.at(x), r2.at(x), N, C);
      });
      p.check(named("rmsnorm_bwd din (accumulated)", t), din, stored<E>(rmsnorm_din_bound(C, X, R)));
      p.check(named("rmsnorm_bwd dw (accumulated)", t), dw, Bound{});
    }
  }
}

TEST_CASE_TEMPLATE("llama kernels: rotary embeddings over grouped-query heads, forward and backward", E, float, Bf16) {
  struct Shape {
    int B, T, H, Hkv, D;
    float theta;
  };
  // GQA (H / Hkv = 2, 3), multi-query (Hkv = 1), plain multi-head (Hkv = H); D = 10 and 6 have odd halves.
  const Shape shapes[] = {
      {2, 19, 4, 2, 16, 10000.0f}, {1, 70, 6, 2, 10, 10000.0f}, {3, 8, 3, 3, 8, 500000.0f}, {1, 33, 8, 1, 6, 10000.0f}};
  for (const DeviceKind* kind : llama_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    for (const Shape& sh : shapes) {
      const int C = sh.H * sh.D, P = C + 2 * sh.Hkv * sh.D, N = sh.B * sh.T;
      const std::string t = std::string(type_name<E>()) + " B" + std::to_string(sh.B) + " T" + std::to_string(sh.T) +
                            " H" + std::to_string(sh.H) + " Hkv" + std::to_string(sh.Hkv) + " D" + std::to_string(sh.D);
      CAPTURE(t);
      auto packed = p.up<E>(random_floats(std::size_t(N) * P, 131));
      auto qkv = p.up<E>(random_floats(std::size_t(N) * 3 * C, 132));  // written, not accumulated
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.rope_qkv_fwd(s, qkv.at(x), packed.at(x), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      });
      p.check(named("rope_qkv_fwd qkv", t), qkv, stored<E>(rope_bound(sh.T)));
      auto dqkv = p.up<E>(random_floats(std::size_t(N) * 3 * C, 133));
      auto dpacked = p.up<E>(random_floats(std::size_t(N) * P, 134));  // written, not accumulated
      p.run<E>([&](auto& k, Stream& s, Side x) {
        k.rope_qkv_bwd(s, dpacked.at(x), dqkv.at(x), sh.B, sh.T, sh.H, sh.Hkv, sh.D, sh.theta);
      });
      p.check(named("rope_qkv_bwd dpacked", t), dpacked, stored<E>(rope_bound(sh.T, sh.H / sh.Hkv)));
    }
  }
}

TEST_CASE_TEMPLATE("llama kernels: SwiGLU forward and backward", E, float, Bf16) {
  for (const DeviceKind* kind : llama_subjects<E>()) {
    CAPTURE(kind->name());
    Pair p(*kind);
    for (const int I : {172, 33}) {
      CAPTURE(I);
      const int N = 67;
      const double X = 4.0;
      const std::string t = std::string(type_name<E>()) + " I " + std::to_string(I);
      auto in = p.up<E>(random_floats(std::size_t(N) * 2 * I, 141, float(X)));
      auto out = p.up<E>(random_floats(std::size_t(N) * I, 142));
      p.run<E>([&](auto& k, Stream& s, Side x) { k.swiglu_fwd(s, out.at(x), in.at(x), N, I); });
      p.check(named("swiglu_fwd", t), out, stored<E>(swiglu_fwd_bound()));
      auto dout = p.up<E>(random_floats(std::size_t(N) * I, 143));
      auto din = p.up<E>(random_floats(std::size_t(N) * 2 * I, 144));  // written, not accumulated
      p.run<E>([&](auto& k, Stream& s, Side x) { k.swiglu_bwd(s, din.at(x), in.at(x), dout.at(x), N, I); });
      p.check(named("swiglu_bwd", t), din, stored<E>(swiglu_bwd_bound(X)));
    }
  }
}

// ---- the bounds themselves ----------------------------------------------------------------------------------------

// As test_device_conformance_kernels.cpp's "bounds:" cases: the reference loops in fp64, rounded once, meet every
// non-exact bound above (a legitimate other implementation), and faulty fp32 ones do not (a wrong rotary frequency
// base, the key/value head of another group, gate and up swapped). Host loops only: no device involved.
TEST_CASE("bounds: the Llama family's kernels") {
  {  // RMSNorm
    const int N = 67, C = 777;
    const double X = 2.0;
    const auto x = random_floats(N * C, 121, float(X)), w = random_floats(C, 122);
    std::vector<float> out(N * C), r(N);
    std::vector<double> dout(N * C), dr(N);
    cpu::rmsnorm_fwd<float>(out.data(), r.data(), x.data(), w.data(), N, C, 1e-5f);
    cpu::rmsnorm_fwd<double>(dout.data(), dr.data(), to_double(x).data(), to_double(w).data(), N, C, 1e-5);
    const double R = *std::max_element(r.begin(), r.end());
    record("rmsnorm_fwd out, fp64", share_of(to_float(dout), out, rmsnorm_out_bound(C, X, R)));
    record("rmsnorm_fwd rstd, fp64", share_of(to_float(dr), r, rmsnorm_rstd_bound(C)));
    const auto g = random_floats(N * C, 124), din0 = random_floats(N * C, 125);
    std::vector<float> din = din0, dw(C);
    std::vector<double> ddin = to_double(din0), ddw(C);
    cpu::rmsnorm_bwd<float>(din.data(), dw.data(), g.data(), x.data(), w.data(), r.data(), N, C);
    cpu::rmsnorm_bwd<double>(ddin.data(), ddw.data(), to_double(g).data(), to_double(x).data(), to_double(w).data(),
                             to_double(r).data(), N, C);
    record("rmsnorm_bwd din, fp64", share_of(to_float(ddin), din, rmsnorm_din_bound(C, X, R)));
  }
  {  // rotary, grouped-query: H = 6 over Hkv = 2
    const int B = 1, T = 70, H = 6, Hkv = 2, D = 10, C = H * D, P = C + 2 * Hkv * D;
    const auto packed = random_floats(std::size_t(B) * T * P, 131), g = random_floats(std::size_t(B) * T * 3 * C, 133);
    std::vector<float> qkv(std::size_t(B) * T * 3 * C), wrong(qkv.size()), dp(packed.size());
    std::vector<double> dqkv(qkv.size()), ddp(packed.size());
    cpu::rope_qkv_fwd<float>(qkv.data(), packed.data(), B, T, H, Hkv, D, 10000.0f);
    cpu::rope_qkv_fwd<double>(dqkv.data(), to_double(packed).data(), B, T, H, Hkv, D, 10000.0);
    record("rope_qkv_fwd, fp64", share_of(to_float(dqkv), qkv, rope_bound(T)));
    cpu::rope_qkv_fwd<float>(wrong.data(), packed.data(), B, T, H, Hkv, D, 500000.0f);  // another frequency base
    CHECK(share_of(wrong, qkv, rope_bound(T)) > 100);
    // The key/value head of the other group: packed with its two groups' key and value heads swapped.
    auto swapped = packed;
    for (int r = 0; r < B * T; ++r) {
      for (int part = 0; part < 2; ++part) {
        float* kv = swapped.data() + std::size_t(r) * P + C + part * Hkv * D;
        std::swap_ranges(kv, kv + D, kv + D);
      }
    }
    cpu::rope_qkv_fwd<float>(wrong.data(), swapped.data(), B, T, H, Hkv, D, 10000.0f);
    CHECK(share_of(wrong, qkv, rope_bound(T)) > 100);
    cpu::rope_qkv_bwd<float>(dp.data(), g.data(), B, T, H, Hkv, D, 10000.0f);
    cpu::rope_qkv_bwd<double>(ddp.data(), to_double(g).data(), B, T, H, Hkv, D, 10000.0);
    record("rope_qkv_bwd, fp64", share_of(to_float(ddp), dp, rope_bound(T, H / Hkv)));
  }
  {  // SwiGLU
    const int N = 67, I = 172;
    const double X = 4.0;
    const auto in = random_floats(std::size_t(N) * 2 * I, 141, float(X)), g = random_floats(std::size_t(N) * I, 143);
    std::vector<float> out(std::size_t(N) * I), wrong(out.size()), din(in.size());
    std::vector<double> dout(out.size()), ddin(in.size());
    cpu::swiglu_fwd<float>(out.data(), in.data(), N, I);
    cpu::swiglu_fwd<double>(dout.data(), to_double(in).data(), N, I);
    record("swiglu_fwd, fp64", share_of(to_float(dout), out, swiglu_fwd_bound()));
    auto swapped = in;  // gate and up swapped in every row
    for (int r = 0; r < N; ++r) {
      float* row = swapped.data() + std::size_t(r) * 2 * I;
      std::swap_ranges(row, row + I, row + I);
    }
    cpu::swiglu_fwd<float>(wrong.data(), swapped.data(), N, I);
    CHECK(share_of(wrong, out, swiglu_fwd_bound()) > 100);
    cpu::swiglu_bwd<float>(din.data(), in.data(), g.data(), N, I);
    cpu::swiglu_bwd<double>(ddin.data(), to_double(in).data(), to_double(g).data(), N, I);
    record("swiglu_bwd, fp64", share_of(to_float(ddin), din, swiglu_bwd_bound(X)));
  }
}
