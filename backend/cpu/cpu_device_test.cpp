// Tests of what only the CPU device has: poisoning of freed memory and its build default, the messages of its kernel
// errors, host buffers, and bf16 (rounding to nearest even against its definition; the CPU device's bf16 kernels
// bit-exact against round(fp32 reference loop), the emulation every other device's bf16 kernels are checked
// against), and a device without bf16 kernels. The Device contract itself (memory, copies, streams, events,
// kernels, collectives) is the conformance suite's, on every registered kind (test_device_conformance*.cpp).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "backend/cpu/kernels.hpp"
#include "backend/model/ops.hpp"

using namespace harmony::backend;
using harmony::core::kKiB;
using harmony::core::kMiB;

namespace {

std::vector<std::uint32_t> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(rng());  // every bit pattern: NaNs, infinities, denormals
  return v;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("poisoning: freed device memory reads as NaN") {
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB, .poison = true});
  auto s = dev->create_stream("s");
  std::vector<float> ones(256, 1.0f);
  Buffer b = dev->alloc(1024);
  CHECK(std::isnan(b.as<float>()[7]));  // fresh memory is poisoned too: reading before writing shows up
  dev->copy_h2d(*s, b.data(), ones.data(), 1024);
  s->synchronize();
  const float* stale = b.as<float>();
  CHECK(stale[10] == 1.0f);
  b.reset();
  // Use after free: the arena keeps the block, so this read is defined, and it sees the poison.
  for (int i = 0; i < 256; ++i) CHECK(std::isnan(stale[i]));
  std::uint32_t bits = 0;
  std::memcpy(&bits, stale, 4);
  CHECK(bits == 0xFFFFFFFFu);
}

TEST_CASE("poisoning is on by default in debug and sanitizer builds") {
#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__)
  CHECK(cpu::kPoisonByDefault);
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  Buffer b = dev->alloc(64);
  float* p = b.as<float>();
  b.reset();
  CHECK(std::isnan(p[0]));
#else
  MESSAGE("release build: poisoning is off by default (CpuDeviceOptions::poison turns it on)");
  CHECK_FALSE(cpu::kPoisonByDefault);
#endif
}

TEST_CASE("embedding ids outside [0, V) are a DeviceError in both directions, and nothing is written") {
  // The policy every device follows (the CUDA device's kernels check the same before writing).
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto s = dev->create_stream("compute");
  const int B = 2, T = 3, C = 4, V = 5;
  Buffer ids = dev->alloc(B * T * 4, "ids");
  Buffer wte = dev->alloc(V * C * 4, "wte"), wpe = dev->alloc(T * C * 4, "wpe");
  Buffer out = dev->alloc(B * T * C * 4, "out"), dout = dev->alloc(B * T * C * 4, "dout");
  const auto wte0 = random_floats(V * C, 31), wpe0 = random_floats(T * C, 32), out0 = random_floats(B * T * C, 33);
  const auto dout0 = random_floats(B * T * C, 34);
  for (const std::int32_t bad : {V, 1 << 30, -1, -(1 << 30)}) {
    CAPTURE(bad);
    const std::int32_t host_ids[B * T] = {0, 1, 2, 3, bad, 4};  // the bad one at (b=1, t=1)
    dev->copy_h2d(*s, ids.data(), host_ids, sizeof(host_ids));
    dev->copy_h2d(*s, wte.data(), wte0.data(), V * C * 4);
    dev->copy_h2d(*s, wpe.data(), wpe0.data(), T * C * 4);
    dev->copy_h2d(*s, out.data(), out0.data(), B * T * C * 4);
    dev->copy_h2d(*s, dout.data(), dout0.data(), B * T * C * 4);
    const std::string at = "token id " + std::to_string(bad) + " at (b=1, t=1) is outside the vocabulary [0, 5)";
    dev->kernels().embedding_fwd(*s, out.as<float>(), ids.as<std::int32_t>(), wte.as<float>(), wpe.as<float>(), B, T, C,
                                 V);
    CHECK_THROWS_WITH_AS(s->synchronize(), doctest::Contains(("embedding: " + at).c_str()), DeviceError);
    dev->kernels().embedding_bwd(*s, wte.as<float>(), wpe.as<float>(), dout.as<float>(), ids.as<std::int32_t>(), B, T,
                                 C, V);
    CHECK_THROWS_WITH_AS(s->synchronize(),
                         doctest::Contains(("embedding_bwd: " + at + "; nothing was written").c_str()), DeviceError);
    CHECK(std::memcmp(out.data(), out0.data(), out0.size() * 4) == 0);
    CHECK(std::memcmp(wte.data(), wte0.data(), wte0.size() * 4) == 0);
    CHECK(std::memcmp(wpe.data(), wpe0.data(), wpe0.size() * 4) == 0);
  }
  // The last id, V - 1, is in range.
  const std::int32_t good[B * T] = {0, 1, 2, 3, V - 1, 0};
  dev->copy_h2d(*s, ids.data(), good, sizeof(good));
  dev->kernels().embedding_bwd(*s, wte.as<float>(), wpe.as<float>(), dout.as<float>(), ids.as<std::int32_t>(), B, T, C,
                               V);
  s->synchronize();
  CHECK(wte.as<float>()[(V - 1) * C] == wte0[(V - 1) * C] + dout0[4 * C]);
}

// The bf16 all-reduce is the executor's host replica sum (docs/backend.md, "Replica sums"): every rank's value
// widened, added in fp32 in rank order, rounded once. Element 0 is a case where rounding after each add differs:
// 1 + 2^-8 + 2^-8 is 1 + 2^-7 in fp32 (exact in bf16), but 1 + 2^-8 alone rounds back to 1 (ties to even).
TEST_CASE("host buffers are aligned, zeroed and usable as copy endpoints") {
  HostBuffer h(1000);
  CHECK(h.bytes() == 1000);
  CHECK(reinterpret_cast<std::uintptr_t>(h.data()) % 64 == 0);
  CHECK(h.span<float>().size() == 250);
  for (float x : h.span<float>()) CHECK(x == 0.0f);
  CHECK(HostBuffer(0).data() == nullptr);
  CHECK_THROWS_AS(HostBuffer(-1), BackendError);
  auto dev = cpu::make_cpu_device(0, {.capacity = 64 * kKiB});
  auto s = dev->create_stream("s");
  Buffer d = dev->alloc(1000);
  h.span<float>()[3] = 2.5f;
  dev->copy_h2d(*s, d.data(), h.data(), 1000);
  HostBuffer back(1000);
  dev->copy_d2h(*s, back.data(), d.data(), 1000);
  s->synchronize();
  CHECK(back.span<float>()[3] == 2.5f);
}

// ---- bf16 ----

namespace {

std::uint16_t bits_of(float f) { return to_bf16(f).bits; }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// The definition, independently of the bit trick: the two bf16 neighbours of a finite f (truncation and the next
// value up in magnitude), the nearer one in exact (double) arithmetic, a tie to the even mantissa.
std::uint16_t reference_round(std::uint32_t u) {
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);  // next magnitude (into the exponent or to inf)
  const double f = std::fabs(double(from_bits(u)));
  if (std::isinf(f)) return lo;
  // Above the largest bf16 the next value up is inf, which IEEE rounding treats as 2^128 for the distance.
  const double above = (hi & 0x7fffU) == 0x7f80U ? std::ldexp(1.0, 128) : std::fabs(double(to_f32(Bf16{hi})));
  const double dl = f - std::fabs(double(to_f32(Bf16{lo})));
  const double dh = above - f;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1U) == 0 ? lo : hi;
}

}  // namespace

TEST_CASE("bf16 rounding: nearest, ties to even, NaN kept, overflow to inf, denormals") {
  // Ties between two bf16 values go to the even mantissa (a truncating rounding fails the second and third).
  CHECK(bits_of(1.0f) == 0x3f80);
  CHECK(bits_of(from_bits(0x3f808000)) == 0x3f80);  // 1 + 2^-8: halfway between 1 and 1 + 2^-7 -> 1 (even)
  CHECK(bits_of(from_bits(0x3f818000)) == 0x3f82);  // 1 + 3 * 2^-8: halfway, up to the even 1 + 2^-6
  CHECK(bits_of(from_bits(0x3f808001)) == 0x3f81);  // just above halfway: up
  CHECK(bits_of(from_bits(0x3f807fff)) == 0x3f80);  // just below: down
  CHECK(bits_of(from_bits(0xbf818000)) == 0xbf82);  // negative ties alike
  CHECK(bits_of(from_bits(0x3fffffff)) == 0x4000);  // carry into the exponent
  // Infinities stay; the largest floats round to inf; just below the halfway point they do not.
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bits_of(from_bits(0x7f7f7fff)) == 0x7f7f);
  // NaN stays NaN with its sign, even when its payload lives only in the dropped bits (truncation gives inf).
  for (std::uint32_t nan : {0x7fc00000U, 0x7f800001U, 0xff800001U, 0x7fbfffffU, 0xffffffffU}) {
    CAPTURE(nan);
    CHECK(std::isnan(to_f32(to_bf16(from_bits(nan)))));
    CHECK((bits_of(from_bits(nan)) >> 15) == (nan >> 31));
  }
  // Denormals round like any other value: to zero, to even at a tie, up into the smallest normal.
  CHECK(bits_of(from_bits(0x00000001)) == 0x0000);
  CHECK(bits_of(from_bits(0x00008000)) == 0x0000);  // tie, 0 is even
  CHECK(bits_of(from_bits(0x00018000)) == 0x0002);  // tie, up to even
  CHECK(bits_of(from_bits(0x00010001)) == 0x0001);
  CHECK(bits_of(from_bits(0x007fffff)) == 0x0080);  // largest denormal -> smallest normal
  CHECK(bits_of(from_bits(0x80008001)) == 0x8001);  // negative denormal
  // Widening is exact: every non-NaN bf16 survives a round trip.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const Bf16 v{static_cast<std::uint16_t>(b)};
    if (std::isnan(to_f32(v))) continue;
    if (to_bf16(to_f32(v)).bits != b) FAIL("bf16 round trip changes ", b);
  }
  // Every bit pattern class (random bits: denormals, infinities, huge and tiny values) against the definition.
  int mismatches = 0;
  for (std::uint32_t u : random_bits(200000, 99)) {
    if (std::isnan(from_bits(u))) continue;
    if (bits_of(from_bits(u)) != reference_round(u)) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(dtype_bytes(DType::BF16) == 2);
  CHECK(dtype_bytes(DType::F32) == 4);
  CHECK(parse_dtype("bf16") == DType::BF16);
  CHECK(parse_dtype("fp32") == DType::F32);
  CHECK_FALSE(parse_dtype("fp16").has_value());
}

namespace {

std::vector<Bf16> to_bf16_vec(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
std::vector<float> widened(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_f32(v[i]);
  return out;
}

// bf16 device tensors for a kernel test: upload, run, download.
struct Bf16Bench {
  std::unique_ptr<Device> dev = cpu::make_cpu_device(0, {.capacity = 4 * kMiB});
  std::unique_ptr<Stream> s = dev->create_stream("bf16");
  std::vector<Buffer> keep;
  Bf16* up(const std::vector<Bf16>& v) {
    keep.push_back(dev->alloc(Bytes(v.size()) * 2));
    dev->copy_h2d(*s, keep.back().data(), v.data(), Bytes(v.size()) * 2);
    s->synchronize();  // v may be a temporary
    return keep.back().as<Bf16>();
  }
  std::vector<Bf16> down(const Bf16* p, std::size_t n) {
    std::vector<Bf16> v(n);
    dev->copy_d2h(*s, v.data(), p, Bytes(n) * 2);
    s->synchronize();
    return v;
  }
  float* zeros_f32(std::size_t n) {  // an fp32 tensor (the norms' statistics), zeroed
    keep.push_back(dev->alloc(Bytes(n) * 4));
    dev->fill_zero(*s, keep.back().data(), Bytes(n) * 4);
    return keep.back().as<float>();
  }
  std::vector<float> down_f32(const float* p, std::size_t n) {
    std::vector<float> v(n);
    dev->copy_d2h(*s, v.data(), p, Bytes(n) * 4);
    s->synchronize();
    return v;
  }
};

void check_rounded(const std::vector<Bf16>& got, const std::vector<float>& fp32, const char* what) {
  REQUIRE(got.size() == fp32.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += got[i].bits != to_bf16(fp32[i]).bits ? 1 : 0;
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " values are not round(fp32 result)");
}

}  // namespace

TEST_CASE("bf16 kernels: widen, compute in fp32, round once (bit-exact against the fp32 reference loops)") {
  Bf16Bench b;
  DeviceOpsBf16 ops(*b.dev, *b.s);
  const int N = 6, IC = 8, OC = 5, C = 8;
  const auto in = to_bf16_vec(random_floats(N * IC, 1)), w = to_bf16_vec(random_floats(IC * OC, 2)),
             bias = to_bf16_vec(random_floats(OC, 3)), dout = to_bf16_vec(random_floats(N * OC, 4)),
             dw0 = to_bf16_vec(random_floats(IC * OC, 5));
  const auto fin = widened(in), fw = widened(w), fb = widened(bias), fd = widened(dout);
  for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
    CAPTURE(static_cast<int>(layout));
    // matmul forward with a bias.
    Bf16* out = b.up(std::vector<Bf16>(N * OC));
    ops.matmul_fwd(out, b.up(in), b.up(w), b.up(bias), N, IC, OC, layout);
    std::vector<float> ref(N * OC);
    cpu::matmul_fwd<float>(ref.data(), fin.data(), fw.data(), fb.data(), N, IC, OC, layout);
    check_rounded(b.down(out, ref.size()), ref, "matmul_fwd");
    // matmul backward: din written, dw and dbias accumulated in fp32 onto their bf16 values, each rounded once.
    Bf16* din = b.up(std::vector<Bf16>(N * IC));
    Bf16* dw = b.up(dw0);
    Bf16* db = b.up(bias);
    ops.matmul_bwd(din, dw, db, b.up(dout), b.up(in), b.up(w), N, IC, OC, layout);
    std::vector<float> rdin(N * IC), rdw = widened(dw0), rdb = fb;
    cpu::matmul_bwd<float>(rdin.data(), rdw.data(), rdb.data(), fd.data(), fin.data(), fw.data(), N, IC, OC, layout);
    check_rounded(b.down(din, rdin.size()), rdin, "matmul_bwd din");
    check_rounded(b.down(dw, rdw.size()), rdw, "matmul_bwd dw");
    check_rounded(b.down(db, rdb.size()), rdb, "matmul_bwd dbias");
  }
  // layer norm forward and backward (din accumulates); the statistics stay fp32, the fp32 loop's bits.
  const auto x = to_bf16_vec(random_floats(N * C, 6)), g = to_bf16_vec(random_floats(C, 7));
  Bf16* lo = b.up(std::vector<Bf16>(N * C));
  float* mean = b.zeros_f32(N);
  float* rstd = b.zeros_f32(N);
  Bf16* xd = b.up(x);
  Bf16* gd = b.up(g);
  ops.layernorm_fwd(lo, mean, rstd, xd, gd, gd, N, C, 1e-5f);
  std::vector<float> rlo(N * C), rm(N), rr(N);
  const auto fx = widened(x), fg = widened(g);
  cpu::layernorm_fwd<float>(rlo.data(), rm.data(), rr.data(), fx.data(), fg.data(), fg.data(), N, C, 1e-5f);
  check_rounded(b.down(lo, rlo.size()), rlo, "layernorm_fwd out");
  CHECK(b.down_f32(mean, rm.size()) == rm);  // not rounded to bf16: the fp32 statistics the output used
  CHECK(b.down_f32(rstd, rr.size()) == rr);
  const auto dx0 = to_bf16_vec(random_floats(N * C, 8));
  Bf16* ldx = b.up(dx0);
  Bf16* ldw = b.up(g);
  Bf16* ldb = b.up(g);
  ops.layernorm_bwd(ldx, ldw, ldb, lo, xd, gd, mean, rstd, N, C);
  std::vector<float> rdx = widened(dx0), rdw = fg, rdb = fg;
  const auto flo = widened(b.down(lo, N * C)), fm = b.down_f32(mean, N), fr = b.down_f32(rstd, N);
  cpu::layernorm_bwd<float>(rdx.data(), rdw.data(), rdb.data(), flo.data(), fx.data(), fg.data(), fm.data(), fr.data(),
                            N, C);
  check_rounded(b.down(ldx, rdx.size()), rdx, "layernorm_bwd din");
  check_rounded(b.down(ldw, rdw.size()), rdw, "layernorm_bwd dw");
  // cross-entropy: fp32 losses exactly as the fp32 loop computes them from the widened logits; probs in place.
  const int V = 7;
  const auto logits = to_bf16_vec(random_floats(N * V, 9));
  std::vector<std::int32_t> tg = {0, 6, 3, 2, 5, 1};
  Buffer tgt = b.dev->alloc(N * 4), losses = b.dev->alloc(N * 4);
  b.dev->copy_h2d(*b.s, tgt.data(), tg.data(), N * 4);
  Bf16* probs = b.up(logits);
  ops.crossentropy_fwd(losses.as<float>(), probs, probs, tgt.as<std::int32_t>(), N, V);
  std::vector<float> rl(N), rp(N * V), got_l(N);
  const auto fl = widened(logits);
  cpu::crossentropy_fwd<float>(rl.data(), rp.data(), fl.data(), tg.data(), N, V);
  b.dev->copy_d2h(*b.s, got_l.data(), losses.data(), N * 4);
  b.s->synchronize();
  CHECK(got_l == rl);
  check_rounded(b.down(probs, rp.size()), rp, "crossentropy_fwd probs");
  // GELU backward in place (din aliases dout).
  const auto gx = to_bf16_vec(random_floats(64, 10)), gd0 = to_bf16_vec(random_floats(64, 11));
  Bf16* gdd = b.up(gd0);
  ops.gelu_bwd(gdd, b.up(gx), gdd, 64);
  std::vector<float> rg(64);
  const auto fgx = widened(gx), fgd = widened(gd0);
  cpu::gelu_bwd<float>(rg.data(), fgx.data(), fgd.data(), 64);
  check_rounded(b.down(gdd, 64), rg, "gelu_bwd");
}

namespace {

// A device without bf16 kernels (as the CUDA device is today): the CPU device with bf16_kernels() null.
class NoBf16Device final : public Device {
 public:
  NoBf16Device() : inner_(cpu::make_cpu_device(7, {.capacity = 4 * kMiB})), name_("gpu:7") {}
  const std::string& name() const override { return name_; }
  int index() const override { return 7; }
  Buffer alloc(Bytes bytes, std::string_view label) override { return inner_->alloc(bytes, label); }
  MemoryStats memory() const override { return inner_->memory(); }
  void reset_peak() override { inner_->reset_peak(); }
  std::unique_ptr<Stream> create_stream(std::string name) override { return inner_->create_stream(std::move(name)); }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }
  void synchronize() override { inner_->synchronize(); }
  void copy_h2d(Stream& s, void* dst, const void* src, Bytes bytes) override { inner_->copy_h2d(s, dst, src, bytes); }
  void copy_d2h(Stream& s, void* dst, const void* src, Bytes bytes) override { inner_->copy_d2h(s, dst, src, bytes); }
  void copy_d2d(Stream& s, void* dst, const void* src, Bytes bytes, Device* dst_device) override {
    inner_->copy_d2d(s, dst, src, bytes, dst_device);
  }
  void fill_zero(Stream& s, void* dst, Bytes bytes) override { inner_->fill_zero(s, dst, bytes); }
  Kernels<float>& kernels() override { return inner_->kernels(); }

 private:
  std::unique_ptr<Device> inner_;
  std::string name_;
};

}  // namespace

TEST_CASE("a device without bf16 kernels is refused by name when bf16 is set up") {
  auto cpu_dev = cpu::make_cpu_device(0, {.capacity = kMiB});
  CHECK(cpu_dev->bf16_kernels() != nullptr);
  CHECK(&require_bf16(*cpu_dev, "trainer") == cpu_dev->bf16_kernels());
  NoBf16Device dev;
  CHECK(dev.bf16_kernels() == nullptr);
  CHECK_THROWS_WITH_AS(require_bf16(dev, "trainer"), "gpu:7: trainer: bf16 not supported on gpu yet (use dtype fp32)",
                       DeviceError);
  auto s = dev.create_stream("s");
  CHECK_THROWS_AS(DeviceOpsBf16(dev, *s), DeviceError);
  DeviceOps fp32(dev, *s);  // fp32 still works on it
  CHECK(&fp32.device() == &dev);
}
