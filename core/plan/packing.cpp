// The paper's layer-packing heuristics (layer_packing.py + searcher.find_layer_packs), reproduced
// decision for decision: per-layer m = peak - x and x = input bytes, the greedy / balanced /
// balanced_time / reuse packers, and numpy's cumsum / floor-division / searchsorted / split
// semantics inside _balanced_sum_split. One function per method, registered in kMethods by name.
#include "core/plan/packing.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/base/error.hpp"

namespace harmony::core {
namespace {

// Arithmetic notes (where C++ could differ from the reference's numpy, and why it does not):
//  * The reference sums int64 byte counts (in float64 for greedy / greedy_reverse without x, whose
//    xmems is np.zeros). We sum in int64 throughout: identical while sums stay below 2^53 bytes.
//  * The reference's capacity is a float (--memory_cap x --memory_cap_scale); ours is an integer
//    byte count, exact for integer capacities such as the default 10 GiB. For a fractional scaled
//    capacity c no single integer reproduces both tests: with floor(c), `<=` stays exact and `<`
//    differs only for a pack costing exactly floor(c) bytes.
//  * ceil(Σm / C) is math.ceil(float64(Σm) / float64(C)), computed the same way here.

struct PackingInput {
  const Model& model;
  Phase phase;
  int u;
  int n;      // layers [0, n)
  Bytes cap;  // C
  const Packs* reuse_from;
  std::vector<Bytes> m;         // peak - x, per layer (may be negative in principle)
  std::vector<Bytes> x;         // input bytes per layer
  std::vector<Bytes> m_prefix;  // m.cumsum(): m_prefix[l] = m[0] + ... + m[l] (integers: any order is exact)
};

using PackFn = std::optional<Packs> (*)(const PackingInput&);

// Sum of m over [first, last] (0 for an empty range).
Bytes sum_m(const PackingInput& in, int first, int last) {
  if (last < first) return 0;
  return in.m_prefix[static_cast<std::size_t>(last)] -
         (first > 0 ? in.m_prefix[static_cast<std::size_t>(first - 1)] : 0);
}

// ---------------------------------------------------------------------------------------------
// greedy_memory_packing(reverse=False): front to back. A pack opened at layer f starts at
// s = m[f] + x[f] (x = 0 without _addx); layer l joins while s + m[l] < C, else the pack closes and
// l opens the next one. A layer that alone has s >= C makes the whole packing infeasible.
std::optional<Packs> greedy_forward(const PackingInput& in, bool addx) {
  auto xv = [&](int l) { return addx ? in.x[static_cast<std::size_t>(l)] : Bytes{0}; };
  Packs packs;
  int first = 0;
  Bytes s = in.m[0] + xv(0);
  if (s >= in.cap) return std::nullopt;
  for (int l = 1; l < in.n; ++l) {
    s += in.m[static_cast<std::size_t>(l)];
    if (s < in.cap) continue;
    packs.push_back({first, l - 1});
    first = l;
    s = in.m[static_cast<std::size_t>(l)] + xv(l);
    if (s >= in.cap) return std::nullopt;
  }
  packs.push_back({first, in.n - 1});  // the remainder ends up in the last pack
  return packs;
}

// greedy_memory_packing(reverse=True): back to front. A pack [l, last] is kept while
// Σm + x[l] < C (x = 0 without _addx), i.e. the candidate first layer's input is charged; the
// first pack (layers from 0) holds the remainder.
std::optional<Packs> greedy_backward(const PackingInput& in, bool addx) {
  auto xv = [&](int l) { return addx ? in.x[static_cast<std::size_t>(l)] : Bytes{0}; };
  Packs packs;
  int last = in.n - 1;
  Bytes s = in.m[static_cast<std::size_t>(last)];
  if (s + xv(last) >= in.cap) return std::nullopt;
  for (int l = in.n - 2; l >= 0; --l) {
    s += in.m[static_cast<std::size_t>(l)];
    if (s + xv(l) < in.cap) continue;
    packs.push_back({l + 1, last});
    last = l;
    s = in.m[static_cast<std::size_t>(l)];
    if (s + xv(l) >= in.cap) return std::nullopt;
  }
  packs.push_back({0, last});
  std::reverse(packs.begin(), packs.end());
  return packs;
}

// ---------------------------------------------------------------------------------------------
// numpy pieces of _balanced_sum_split.

// Python/numpy floor division of int64 (rounds toward -inf); d > 0 here.
std::int64_t floor_div(std::int64_t a, std::int64_t d) {
  std::int64_t q = a / d;
  if ((a % d != 0) && ((a < 0) != (d < 0))) --q;
  return q;
}

// numpy's sort-order "less" (npysort): NaN sorts last for floats.
bool np_less(std::int64_t a, std::int64_t b) { return a < b; }
bool np_less(double a, double b) { return a < b || (b != b && a == a); }

// A.cumsum() (sequential, also for float64: the reference's order), computed once per packing input for every S
// its loop tries.
template <typename T>
std::vector<T> cumsum(const std::vector<T>& a) {
  std::vector<T> prefix(a.size());
  T acc{};
  for (std::size_t i = 0; i < a.size(); ++i) prefix[i] = acc = acc + a[i];
  return prefix;
}

// _balanced_sum_split(A, S) for S >= 1 given prefix = A.cumsum(), as layer ranges into `packs`, built only while
// every pack so far is non-empty and passes `fits_pack`: numpy.split would produce an empty pack (cut indices that
// repeat, start at 0, reach n, or go backwards, the last only possible with negative sums), or a pack would not
// fit, and every caller then skips this S, so the split stops at the first such pack (false). The target per-pack
// sum is prefix[-1] // S for int64 and prefix[-1] / S for float64; the cut keys are k * target for k = 1 .. S-1
// (int64 * int64, resp. float64(k) * float64). The cuts are numpy.searchsorted(prefix, keys, side='left')
// including numpy's reuse of the previous key's bounds (binsearch in npysort/binsearch.cpp): for a sorted prefix
// the plain lower bound; when negative per-layer values make the prefix sums non-monotonic, the reused bounds can
// change the answer, so this follows numpy's loop step by step.
template <typename T, typename Fits>
bool balanced_split_fitting(const std::vector<T>& prefix, int s, Fits fits_pack, Packs& packs) {
  packs.clear();
  T target;
  if constexpr (std::is_integral_v<T>) {
    target = floor_div(prefix.back(), s);
  } else {
    target = prefix.back() / static_cast<double>(s);
  }
  const auto len = static_cast<std::ptrdiff_t>(prefix.size());
  std::ptrdiff_t lo = 0;
  std::ptrdiff_t hi = len;
  T last_key = target;  // keys.front() = 1 * target
  std::ptrdiff_t start = 0;
  for (int k = 1; k <= s; ++k) {
    std::ptrdiff_t end = len;  // numpy.split's last slice A[c_{S-2}:]
    if (k < s) {
      const T key = static_cast<T>(k) * target;
      if (np_less(last_key, key)) {
        hi = len;
      } else {
        lo = 0;
        hi = (hi < len) ? (hi + 1) : len;
      }
      last_key = key;
      while (lo < hi) {
        const std::ptrdiff_t mid = lo + ((hi - lo) >> 1);
        if (np_less(prefix[static_cast<std::size_t>(mid)], key)) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      end = lo;
    }
    if (end <= start) return false;  // a slice is empty when its end <= its start
    const LayerRange pack{static_cast<int>(start), static_cast<int>(end - 1)};
    if (!fits_pack(pack)) return false;
    packs.push_back(pack);
    start = end;
  }
  return true;
}

// First S of the reference's `for S in range(ceil(Σm / float(C)), n + 1)`. S <= 1 (Σm <= C, or even
// Σm <= 0) all give the single pack [0, n) — numpy.split with no cuts — so starting at 1 is the
// same. Returns n + 1 (an empty loop) when the quotient exceeds n.
int first_pack_count(const PackingInput& in) {
  const double q = static_cast<double>(sum_m(in, 0, in.n - 1)) / static_cast<double>(in.cap);
  const double c = std::ceil(q);
  if (c > static_cast<double>(in.n)) return in.n + 1;
  return std::max(1, static_cast<int>(c));
}

// Feasible with x: the pack has Σm + x[first] <= C (the reference tests `> capacity` to reject).
bool fits_addx(const PackingInput& in, const LayerRange& p) {
  return sum_m(in, p.first, p.last) + in.x[static_cast<std::size_t>(p.first)] <= in.cap;
}

// Feasible without x: the pack has Σm < C (strict).
bool fits_no_x(const PackingInput& in, const LayerRange& p) { return sum_m(in, p.first, p.last) < in.cap; }

// The split of m itself into S packs, each tested with (addx) or without x.
bool split_memory(const PackingInput& in, int s, bool addx, Packs& packs) {
  if (addx)
    return balanced_split_fitting(
        in.m_prefix, s, [&](const LayerRange& p) { return fits_addx(in, p); }, packs);
  return balanced_split_fitting(
      in.m_prefix, s, [&](const LayerRange& p) { return fits_no_x(in, p); }, packs);
}

// balanced_memory_packing: split m itself (int64) into S ≈equal-sum packs, smallest feasible S.
std::optional<Packs> balanced_memory(const PackingInput& in, bool addx) {
  Packs packs;
  for (int s = first_pack_count(in); s <= in.n; ++s) {
    if (split_memory(in, s, addx, packs)) return packs;  // else an empty pack or one that does not fit: more packs
  }
  return std::nullopt;
}

// Every feasible S of balanced_memory's loop from its first (the paper's answer) up to `max_packs`:
// the same splits and tests, the loop just does not stop at the first feasible S. An S whose split
// has an empty pack or does not fit is skipped; the paper's S is always included, even above max_packs.
template <typename Split>
std::vector<Packs> balanced_upto(const PackingInput& in, int max_packs, Split split) {
  std::vector<Packs> out;
  Packs packs;
  for (int s = first_pack_count(in); s <= in.n; ++s) {
    if (!out.empty() && s > max_packs) break;
    if (split(s, packs)) out.push_back(packs);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The methods, one function each.

std::optional<Packs> pack_greedy(const PackingInput& in) { return greedy_forward(in, false); }
std::optional<Packs> pack_greedy_addx(const PackingInput& in) { return greedy_forward(in, true); }
std::optional<Packs> pack_greedy_reverse(const PackingInput& in) { return greedy_backward(in, false); }
std::optional<Packs> pack_greedy_reverse_addx(const PackingInput& in) { return greedy_backward(in, true); }
std::optional<Packs> pack_balanced(const PackingInput& in) { return balanced_memory(in, false); }
std::optional<Packs> pack_balanced_addx(const PackingInput& in) { return balanced_memory(in, true); }

// balanced_time_packing: the S loop still starts at ceil(Σm / C) (memory), but the split is over
// the per-layer compute times (float64); feasibility is always Σm + x[first] <= C.
std::vector<double> time_cumsum(const PackingInput& in) {
  std::vector<double> times(static_cast<std::size_t>(in.n));
  for (int l = 0; l < in.n; ++l) times[static_cast<std::size_t>(l)] = in.model.time_s(in.phase, in.u, l);
  return cumsum(times);
}

std::optional<Packs> pack_balanced_time(const PackingInput& in) {
  const std::vector<double> prefix = time_cumsum(in);
  Packs packs;
  for (int s = first_pack_count(in); s <= in.n; ++s) {
    if (balanced_split_fitting(
            prefix, s, [&](const LayerRange& p) { return fits_addx(in, p); }, packs))
      return packs;
  }
  return std::nullopt;
}

// reuse_memory_packing: the backward packs but the last, kept iff every pack has
// Σ m_fwd + x[first] < C (strict, unlike balanced_addx's <=). An empty list is returned as is.
std::optional<Packs> pack_reuse(const PackingInput& in) {
  if (in.phase != Phase::Fwd)
    throw ScheduleError("packing method 'reuse' applies to forward packs only (it reuses the backward packs)");
  if (in.reuse_from == nullptr)
    throw ScheduleError("packing method 'reuse' needs the backward packs to reuse; none were given");
  const Packs& packs = *in.reuse_from;
  if (packs.empty()) return packs;
  int next = 0;
  for (const LayerRange& p : packs) {
    if (p.first != next || p.last < p.first)
      throw ScheduleError(fmt::format("packing method 'reuse': packs {} do not cover layers 0..{} in order",
                                      packs_to_string(packs), in.n - 1));
    next = p.last + 1;
  }
  if (next != in.n)
    throw ScheduleError(fmt::format("packing method 'reuse': packs {} do not cover layers 0..{} in order",
                                    packs_to_string(packs), in.n - 1));
  for (const LayerRange& p : packs) {
    if (sum_m(in, p.first, p.last) + in.x[static_cast<std::size_t>(p.first)] >= in.cap) return std::nullopt;
  }
  return packs;
}

// The pack-count variants of the balanced methods (find_packs_upto): the same split and feasibility
// test as the method, for every feasible S up to a bound.
using PackUptoFn = std::vector<Packs> (*)(const PackingInput&, int max_packs);

std::vector<Packs> upto_balanced(const PackingInput& in, int max_packs, bool addx) {
  return balanced_upto(in, max_packs, [&](int s, Packs& packs) { return split_memory(in, s, addx, packs); });
}
std::vector<Packs> upto_balanced_no_x(const PackingInput& in, int max_packs) {
  return upto_balanced(in, max_packs, false);
}
std::vector<Packs> upto_balanced_addx(const PackingInput& in, int max_packs) {
  return upto_balanced(in, max_packs, true);
}
std::vector<Packs> upto_balanced_time(const PackingInput& in, int max_packs) {
  const std::vector<double> prefix = time_cumsum(in);
  return balanced_upto(in, max_packs, [&](int s, Packs& packs) {
    return balanced_split_fitting(
        prefix, s, [&](const LayerRange& p) { return fits_addx(in, p); }, packs);
  });
}

struct MethodEntry {
  const char* name;
  PackFn fn;
  PackUptoFn upto;  // nullptr: the method has no pack-count parameter (one packing)
};

constexpr MethodEntry kMethods[] = {
    {"greedy", pack_greedy, nullptr},
    {"greedy_addx", pack_greedy_addx, nullptr},
    {"greedy_reverse", pack_greedy_reverse, nullptr},
    {"greedy_reverse_addx", pack_greedy_reverse_addx, nullptr},
    {"balanced", pack_balanced, upto_balanced_no_x},
    {"balanced_addx", pack_balanced_addx, upto_balanced_addx},
    {"balanced_time", pack_balanced_time, upto_balanced_time},
    {"reuse", pack_reuse, nullptr},
};

const MethodEntry* lookup_entry(const std::string& name) {
  for (const MethodEntry& e : kMethods) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

PackFn lookup(const std::string& name) {
  const MethodEntry* e = lookup_entry(name);
  return e == nullptr ? nullptr : e->fn;
}

}  // namespace

const std::vector<std::string>& packing_method_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const MethodEntry& e : kMethods) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

bool is_packing_method(const std::string& name) { return lookup(name) != nullptr; }

namespace {

PackingInput make_input(const Model& model, Phase phase, const std::string& method, int u, int num_layers,
                        Bytes capacity_bytes, const Packs* reuse_from) {
  if (lookup(method) == nullptr) {
    const std::string hint = closest_match(method, packing_method_names());
    throw ScheduleError(fmt::format("unknown packing method '{}'{}; known: {}", method,
                                    hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                                    fmt::join(packing_method_names(), ", ")));
  }
  if (num_layers < 1 || num_layers > model.num_layers())
    throw ScheduleError(
        fmt::format("cannot pack {} layers of {} ({} layers)", num_layers, model.name, model.num_layers()));
  if (capacity_bytes <= 0)
    throw ScheduleError(
        fmt::format("GPU memory capacity must be positive to pack layers (got {} bytes)", capacity_bytes));
  PackingInput in{model, phase, u, num_layers, capacity_bytes, reuse_from, {}, {}, {}};
  in.m.resize(static_cast<std::size_t>(num_layers));
  in.x.resize(static_cast<std::size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    const Bytes x = model.input_bytes(u, l);
    in.x[static_cast<std::size_t>(l)] = x;
    in.m[static_cast<std::size_t>(l)] = model.peak_bytes(phase, u, l) - x;
  }
  in.m_prefix = cumsum(in.m);
  return in;
}

}  // namespace

std::optional<Packs> find_packs(const Model& model, Phase phase, const std::string& method, int u, int num_layers,
                                Bytes capacity_bytes, const Packs* reuse_from) {
  const PackingInput in = make_input(model, phase, method, u, num_layers, capacity_bytes, reuse_from);
  return lookup(method)(in);
}

std::vector<Packs> find_packs_upto(const Model& model, Phase phase, const std::string& method, int u, int num_layers,
                                   Bytes capacity_bytes, int max_packs, const Packs* reuse_from) {
  const PackingInput in = make_input(model, phase, method, u, num_layers, capacity_bytes, reuse_from);
  const MethodEntry* e = lookup_entry(method);
  if (e->upto != nullptr) return e->upto(in, max_packs);
  std::vector<Packs> out;
  if (std::optional<Packs> packs = e->fn(in)) out.push_back(std::move(*packs));
  return out;
}

}  // namespace harmony::core
