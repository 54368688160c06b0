// The device conformance suite's harness (tests/backend/test_device_conformance.cpp): the devices under test (every
// kind the registry says is available here), a Pair of one device of a kind and one of the reference kind (the CPU
// device) with the same tensors on both, the per-op error bounds and their derivations, and the comparison, which
// records the largest difference of every check for the summary the suite prints.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.hpp"

namespace conformance {

using namespace harmony::backend;
using harmony::core::kKiB;
using harmony::core::kMiB;

// ---- inputs ---------------------------------------------------------------------------------------------------------

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int V, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(V));
  return v;
}

inline std::vector<std::uint32_t> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(rng());  // every bit pattern: NaNs, infinities, denormals
  return v;
}

// ---- the devices under test -----------------------------------------------------------------------------------------

// The registered kinds available here, in registry order (the reference kind first).
const std::vector<const DeviceKind*>& subjects();
inline bool is_reference(const DeviceKind& kind) { return &kind == &reference_device_kind(); }
inline DeviceOptions test_options(Bytes capacity) {
  return {.capacity = capacity, .poison = DeviceOptions::Poison::On};  // reads of unwritten memory show up as NaN
}

// ---- bounds ---------------------------------------------------------------------------------------------------------

// |dut - ref| <= kMargin * (abs + rel * |ref|) for every element, NaN failing; exact (abs = rel = 0): the same bits.
struct Bound {
  double abs = 0;
  double rel = 0;
  bool exact() const { return abs == 0 && rel == 0; }
};

// Where a bound is derived: u = 2^-24 is fp32's unit roundoff (a correctly rounded operation errs by at most u times
// its result; an ulp of a value v is at most 2u |v|), gamma_n(k) = k u / (1 - k u) bounds the rounding of a k-term
// sum or dot product in any order, FMA or not: |computed - exact| <= gamma_n(k) * sum |terms| (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., 3.1 and 3.5). Two devices that each meet that bound differ by at most
// twice it. The bounds are first order (the u^2 terms are below 1e-9 relative here); kMargin doubles every one, a
// margin for slips in the analysis, which cannot hide a real fault: a wrong index, sign or missing term is off by
// O(1) of the values, 100x and more beyond any bound here.
inline constexpr double kU = 0x1p-24;
inline constexpr double kMargin = 2.0;
inline double gamma_n(double k) { return k * kU / (1.0 - k * kU); }

// The bounds' own tests ("bounds:" cases): the largest |got - want| / bound over the elements (bound = abs + rel
// |want|, without kMargin), and the check that an fp64 result rounded once is within one device's share of a bound
// (half of it, before the margin).
inline double share_of(const std::vector<float>& got, const std::vector<float>& want, Bound b) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    worst = std::max(worst, d / (b.abs + b.rel * std::abs(double(want[i]))));
  }
  return worst;
}
inline void record(const std::string& what, double share) {
  MESSAGE(what << ": " << share << " of the bound");
  CHECK(share <= 0.5);
}
inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }
// bf16 storage: both devices compute in fp32 as above and round each stored output once to nearest even. Where a
// rounding boundary falls between the two fp32 values the stored ones differ by one more bf16 ulp, at most 2^-7 of
// the value (8 significant bits): |round(a) - round(b)| <= |a - b| + ulp. `roundings`: stored values the output has
// passed through (an accumulated output stored twice carries two). Exact bounds stay exact: the same fp32 bits round
// to the same bf16 bits.
inline constexpr double kFlip = 0x1p-7;
template <class E>
Bound stored(Bound fp32, int roundings = 1) {
  if constexpr (std::is_same_v<E, Bf16>) {
    if (!fp32.exact()) fp32.rel += roundings * kFlip;
  }
  return fp32;
}

// The normalizations' row statistics are fp32 for every storage type (Kernels<S>): one device's stored statistics
// against their fp64 values on the same inputs (as the device saw them) must be within that device's share of the
// fp32 bound, half of it (as record's). Rounded to bf16 they would err by up to 2^-9 relative: 50 to 1,000 times
// that share.
inline void check_stats_fp64(const std::string& what, const std::vector<float>& got, const std::vector<double>& exact,
                             Bound b) {
  const double share = share_of(to_float(exact), got, b);
  MESSAGE(what << " against fp64: " << share << " of the fp32 bound");
  CHECK_MESSAGE(share <= 0.5, what, ": ", share, " of the fp32 bound against fp64 (statistics not kept in fp32?)");
}

// ---- comparison -----------------------------------------------------------------------------------------------------

// Every check's largest difference and its share of the bound, by "<kind> <what>", for the suite's summary.
struct Record {
  double max_diff = 0;
  double max_share = 0;  // max |diff| / (kMargin * bound) over the elements; 0 for an exact check
  bool exact = false;
  std::size_t checks = 0;
};
std::map<std::string, Record>& records();

// Compares dut against ref under `b` (exact on the reference kind whatever `b` says) and records the result.
void compare(const DeviceKind& kind, const std::string& what, const std::vector<float>& dut,
             const std::vector<float>& ref, Bound b);

// ---- a device of the kind under test beside a reference device -----------------------------------------------------

enum class Side { Dut, Ref };

// The same tensor on both devices; E is float, Bf16 or std::int32_t.
template <class E>
struct Tensor {
  Buffer dut, ref;
  std::size_t n = 0;
  E* at(Side s) const { return (s == Side::Dut ? dut : ref).template as<E>(); }
};

class Pair {
 public:
  explicit Pair(const DeviceKind& kind, Bytes capacity = 64 * kMiB)
      : kind_(kind),
        dut_(kind.make_device(0, test_options(capacity))),
        ref_(reference_device_kind().make_device(1, test_options(capacity))),
        ds_(dut_->create_stream("dut")),
        rs_(ref_->create_stream("ref")) {}
  // Devices made with the given options, the "reference" one of `ref_kind` (the fused entry points: a kind with its
  // fused kernels on against the same kind with them off).
  Pair(const DeviceKind& kind, const DeviceOptions& dut_options, const DeviceKind& ref_kind,
       const DeviceOptions& ref_options)
      : kind_(kind),
        dut_(kind.make_device(0, dut_options)),
        ref_(ref_kind.make_device(1, ref_options)),
        ds_(dut_->create_stream("dut")),
        rs_(ref_->create_stream("ref")) {}
  const DeviceKind& kind() const { return kind_; }
  Device& dut() { return *dut_; }
  Stream& dut_stream() { return *ds_; }

  // Host values (rounded to nearest even for Bf16) on both devices. Waits for the copies: `host` may be a temporary.
  template <class E>
  Tensor<E> up(const std::vector<float>& host) {
    std::vector<E> h(host.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      if constexpr (std::is_same_v<E, Bf16>) {
        h[i] = to_bf16(host[i]);
      } else {
        h[i] = static_cast<E>(host[i]);
      }
    }
    return up_raw(h);
  }
  Tensor<std::int32_t> ids(const std::vector<std::int32_t>& host) { return up_raw(host); }
  template <class E>
  Tensor<E> zeros(std::size_t n) {
    return up<E>(std::vector<float>(n, 0.0f));
  }
  // (dut, ref) contents, widened to fp32 (exactly).
  template <class E>
  std::pair<std::vector<float>, std::vector<float>> down(const Tensor<E>& t) {
    std::vector<E> d(t.n), r(t.n);
    const auto bytes = static_cast<Bytes>(t.n * sizeof(E));
    dut_->copy_d2h(*ds_, d.data(), t.dut.data(), bytes);
    ref_->copy_d2h(*rs_, r.data(), t.ref.data(), bytes);
    sync();
    return {widen(d), widen(r)};
  }
  // f(kernels, stream, side) on the device under test, then on the reference device.
  template <class E, class F>
  void run(F&& f) {
    f(kernels_of<E>(*dut_, "conformance"), *ds_, Side::Dut);
    f(kernels_of<E>(*ref_, "conformance"), *rs_, Side::Ref);
  }
  // f on the device under test only.
  template <class E, class F>
  void run_dut(F&& f) {
    f(kernels_of<E>(*dut_, "conformance"), *ds_, Side::Dut);
  }
  template <class E>
  void check(const std::string& what, const Tensor<E>& t, Bound b) {
    auto [d, r] = down(t);
    compare(kind_, what, d, r, b);
  }
  void sync() {
    ds_->synchronize();
    rs_->synchronize();
  }

 private:
  template <class E>
  Tensor<E> up_raw(const std::vector<E>& h) {
    const auto bytes = static_cast<Bytes>(h.size() * sizeof(E));
    Tensor<E> t{dut_->alloc(bytes), ref_->alloc(bytes), h.size()};
    dut_->copy_h2d(*ds_, t.dut.data(), h.data(), bytes);
    ref_->copy_h2d(*rs_, t.ref.data(), h.data(), bytes);
    sync();
    return t;
  }
  template <class E>
  static std::vector<float> widen(const std::vector<E>& v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<E, Bf16>) {
        out[i] = to_f32(v[i]);
      } else {
        out[i] = static_cast<float>(v[i]);
      }
    }
    return out;
  }

  const DeviceKind& kind_;
  std::unique_ptr<Device> dut_, ref_;
  std::unique_ptr<Stream> ds_, rs_;
};

// The element type's name in test output.
template <class E>
const char* type_name() {
  return std::is_same_v<E, Bf16> ? "bf16" : "fp32";
}

// A check's name: the op, then what distinguishes it (a tensor, the element type).
inline std::string named(const char* op, const std::string& detail = {}) {
  return detail.empty() ? std::string(op) : std::string(op) + " " + detail;
}

// Host copies of what the reference device computed (for measured magnitudes in the bounds).
template <class E>
std::vector<float> ref_of(Pair& p, const Tensor<E>& t) {
  return p.down(t).second;
}

}  // namespace conformance
