// core::SmallVector against std::vector on the same operations: inline up to N, on the heap beyond, and across
// copies, moves (inline and heap), inserts, erases and resizes, the elements and their order always std::vector's.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/base/small_vector.hpp"
#include "core/program/program.hpp"

using harmony::core::SmallVector;

namespace {
template <class V>
std::vector<int> as_vector(const V& v) {
  return {v.begin(), v.end()};
}
}  // namespace

TEST_CASE("small vector: inline up to N, then the heap, the same elements as std::vector") {
  SmallVector<int, 4> s;
  std::vector<int> v;
  CHECK(s.empty());
  for (int i = 0; i < 4; ++i) {
    s.push_back(i);
    v.push_back(i);
  }
  CHECK(s.capacity() == 4);  // still inline
  s.push_back(s[0]);         // an element of its own, as it grows
  v.push_back(v[0]);
  CHECK(s.capacity() == 8);
  CHECK(as_vector(s) == v);
  CHECK(s.front() == 0);
  CHECK(s.back() == 0);
  CHECK(std::vector<int>(s.rbegin(), s.rend()) == std::vector<int>(v.rbegin(), v.rend()));
}

TEST_CASE("small vector: copies and moves keep the elements, inline or on the heap, and leave the source empty") {
  for (const int n : {0, 3, 4, 9}) {
    CAPTURE(n);
    SmallVector<int, 4> a;
    for (int i = 0; i < n; ++i) a.push_back(10 * i);
    const std::vector<int> want = as_vector(a);
    SmallVector<int, 4> copy = a;
    CHECK(as_vector(copy) == want);
    SmallVector<int, 4> moved = std::move(a);
    CHECK(as_vector(moved) == want);
    CHECK(a.empty());  // NOLINT(bugprone-use-after-move): a moved-from SmallVector is empty and reusable
    a.push_back(7);
    CHECK(as_vector(a) == std::vector<int>{7});
    SmallVector<int, 4> assigned{1, 2};
    assigned = std::move(moved);
    CHECK(as_vector(assigned) == want);
    assigned = copy;
    CHECK(as_vector(assigned) == want);
    assigned = {5, 6, 7, 8, 9, 10};
    CHECK(as_vector(assigned) == std::vector<int>{5, 6, 7, 8, 9, 10});
  }
}

TEST_CASE("small vector: random inserts, erases, resizes and sorts match std::vector (seeded)") {
  std::mt19937 rng(12);
  SmallVector<int, 2> s;
  std::vector<int> v;
  for (int step = 0; step < 5000; ++step) {
    const auto pick = [&](std::size_t n) { return n == 0 ? std::size_t{0} : std::size_t{rng() % (n + 1)}; };
    switch (rng() % 6) {
      case 0:
      case 1: {
        const int x = static_cast<int>(rng() % 100);
        s.push_back(x);
        v.push_back(x);
        break;
      }
      case 2: {
        const std::vector<int> more(rng() % 4, static_cast<int>(rng() % 100));
        const std::size_t at = pick(v.size());
        s.insert(s.begin() + at, more.begin(), more.end());
        v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), more.begin(), more.end());
        break;
      }
      case 3:
        if (!v.empty()) {
          const std::size_t at = rng() % v.size();
          s.erase(s.begin() + at);
          v.erase(v.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      case 4: {
        const std::size_t n = rng() % 12;
        s.resize(n);
        v.resize(n);
        break;
      }
      default:
        std::sort(s.begin(), s.end());
        std::sort(v.begin(), v.end());
        break;
    }
    REQUIRE(as_vector(s) == v);
  }
}

TEST_CASE("an op's lists are small vectors: tensors copy as values") {
  harmony::core::Op o;
  o.deps = {3, 1};
  o.allocs.push_back(harmony::core::TensorRef{harmony::core::TensorKind::Weights, {0, 1}, -1, 100});
  o.allocs.emplace_back(harmony::core::TensorRef{harmony::core::TensorKind::Saved, {2, 2}, 0, 7});
  o.allocs.push_back(o.allocs[0]);
  const harmony::core::Op copy = o;
  REQUIRE(copy.allocs.size() == 3);
  CHECK(copy.allocs[2].bytes == 100);
  CHECK(copy.allocs[1].kind == harmony::core::TensorKind::Saved);
  CHECK(as_vector(copy.deps) == std::vector<int>{3, 1});
}
