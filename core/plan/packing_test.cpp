// Tests of core/packing: the reference's packing test vectors on the bert_large profile, and a
// small synthetic model per method with the expected packs derived by hand (derivations inline),
// covering the strict/non-strict capacity tests, remainder placement, empty-pack skips and errors.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/base/error.hpp"
#include "core/model/profile.hpp"
#include "core/plan/packing.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_dir;

namespace {

constexpr Bytes kCap = 10 * kGiB;

const Model& bert_large() {
  static const Model model = load_profile(source_dir() + "/configs/profiles/bert_large.json");
  return model;
}

// A synthetic model measured only at u = 1, so m[l] = peak - x = `m[l]` and x[l] = `x[l]` exactly.
// Forward and backward get the same memory; times are backward (and forward) compute times.
Model synthetic(const std::vector<Bytes>& m, const std::vector<Bytes>& x, std::vector<double> times = {}) {
  if (times.empty()) times.assign(m.size(), 1.0);
  Model model;
  model.name = "synthetic";
  model.source = "test_packing";
  model.ubatch_fwd = {1};
  model.ubatch_bwd = {1};
  for (std::size_t l = 0; l < m.size(); ++l) {
    Layer layer;
    layer.name = "L" + std::to_string(l);
    layer.is_criterion = l + 1 == m.size();
    layer.input_bytes_per_sample = x[l];
    layer.fwd_time_s = {times[l]};
    layer.bwd_time_s = {times[l]};
    layer.fwd_peak_bytes = {m[l] + x[l]};
    layer.bwd_peak_bytes = {m[l] + x[l]};
    model.layers.push_back(layer);
  }
  model.validate();
  return model;
}

std::optional<Packs> pack(const Model& model, const std::string& method, Bytes cap, Phase phase = Phase::Bwd,
                          int num_layers = -1, int u = 1, const Packs* reuse = nullptr) {
  return find_packs(model, phase, method, u, num_layers < 0 ? model.num_layers() : num_layers, cap, reuse);
}

std::string show(const std::optional<Packs>& p) { return p ? packs_to_string(*p) : "None"; }

Packs P(std::initializer_list<LayerRange> ranges) { return Packs(ranges); }

}  // namespace

TEST_CASE("method table") {
  const std::vector<std::string> expected = {"greedy",   "greedy_addx",   "greedy_reverse", "greedy_reverse_addx",
                                             "balanced", "balanced_addx", "balanced_time",  "reuse"};
  CHECK(packing_method_names() == expected);
  for (const auto& name : expected) CHECK(is_packing_method(name));
  CHECK_FALSE(is_packing_method("greedy_rev"));
  CHECK_FALSE(is_packing_method(""));
  CHECK_FALSE(is_packing_method("Greedy"));
}

// ---------------------------------------------------------------------------------------------
// Reference vectors (shared/reference/README.md, "Packing test vectors"), bert_large, C = 10 GiB.

TEST_CASE("bert_large BWD u=8: reference vectors") {
  const Model& m = bert_large();
  const Packs greedy = P({{0, 9}, {10, 19}, {20, 27}});
  const Packs reverse = P({{0, 4}, {5, 14}, {15, 27}});
  const Packs balanced = P({{0, 7}, {8, 15}, {16, 27}});
  CHECK(show(pack(m, "greedy", kCap, Phase::Bwd, 28, 8)) == show(greedy));
  CHECK(show(pack(m, "greedy_addx", kCap, Phase::Bwd, 28, 8)) == show(greedy));
  CHECK(show(pack(m, "greedy_reverse", kCap, Phase::Bwd, 28, 8)) == show(reverse));
  CHECK(show(pack(m, "greedy_reverse_addx", kCap, Phase::Bwd, 28, 8)) == show(reverse));
  CHECK(show(pack(m, "balanced", kCap, Phase::Bwd, 28, 8)) == show(balanced));
  CHECK(show(pack(m, "balanced_addx", kCap, Phase::Bwd, 28, 8)) == show(balanced));
  CHECK(show(pack(m, "balanced_time", kCap, Phase::Bwd, 28, 8)) == show(balanced));
}

TEST_CASE("bert_large FWD u=8 over the 16 layers before the last BWD pack: reference vectors") {
  const Model& m = bert_large();
  for (const auto& method : packing_method_names()) {
    if (method == "reuse") continue;
    INFO(method);
    CHECK(show(pack(m, method, kCap, Phase::Fwd, 16, 8)) == "[[0-15]]");
  }
  const Packs reuse_from = P({{0, 7}, {8, 15}});  // balanced BWD packs but the last
  CHECK(show(pack(m, "reuse", kCap, Phase::Fwd, 16, 8, &reuse_from)) == "[[0-7], [8-15]]");
}

TEST_CASE("bert_large: packs behind the paper's vDP D32 N2 search result") {
  const Model& m = bert_large();
  // BWD u=4: [0-5][6-27], produced by greedy_reverse(_addx) (the default first BWD method);
  // the others differ, which pins down that the search result came from the reverse greedy.
  CHECK(show(pack(m, "greedy_reverse_addx", kCap, Phase::Bwd, 28, 4)) == "[[0-5], [6-27]]");
  CHECK(show(pack(m, "greedy_reverse", kCap, Phase::Bwd, 28, 4)) == "[[0-5], [6-27]]");
  CHECK(show(pack(m, "greedy_addx", kCap, Phase::Bwd, 28, 4)) == "[[0-18], [19-27]]");
  CHECK(show(pack(m, "balanced_addx", kCap, Phase::Bwd, 28, 4)) == "[[0-11], [12-27]]");
  CHECK(show(pack(m, "balanced_time", kCap, Phase::Bwd, 28, 4)) == "[[0-11], [12-27]]");
  // FWD u=16 over layers 0..5: one pack, by every method (and by reuse of [0-5]).
  for (const auto& method : packing_method_names()) {
    if (method == "reuse") continue;
    INFO(method);
    CHECK(show(pack(m, method, kCap, Phase::Fwd, 6, 16)) == "[[0-5]]");
  }
  const Packs reuse_from = P({{0, 5}});
  CHECK(show(pack(m, "reuse", kCap, Phase::Fwd, 6, 16, &reuse_from)) == "[[0-5]]");
}

TEST_CASE("bert_large: nothing fits a tiny capacity") {
  const Model& m = bert_large();
  for (const auto& method : packing_method_names()) {
    if (method == "reuse") continue;
    INFO(method);
    CHECK_FALSE(pack(m, method, 64 * kMiB, Phase::Bwd, 28, 8).has_value());
  }
}

// ---------------------------------------------------------------------------------------------
// Synthetic model A: m = [30, 30, 30, 30, 30], x = [5, 5, 5, 5, 5], C = 100.

TEST_CASE("synthetic A: greedy leaves the remainder last, greedy_reverse first") {
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5});
  // greedy: s = 30 | +30 = 60 < 100 | +30 = 90 < 100 | +30 = 120: close [0-2], s = 30 | +30 = 60.
  CHECK(show(pack(a, "greedy", 100)) == "[[0-2], [3-4]]");
  // greedy_addx: s = 30+5 = 35 | 65 | 95 < 100 | 125: close [0-2], s = 35 | 65.
  CHECK(show(pack(a, "greedy_addx", 100)) == "[[0-2], [3-4]]");
  // greedy_reverse from layer 4: 30 | 60 | 90 < 100 | 120: close [2-4], s = 30 (layer 1) | 60.
  CHECK(show(pack(a, "greedy_reverse", 100)) == "[[0-1], [2-4]]");
  // greedy_reverse_addx: Σm + x[candidate first]: 35 | 65 | 95 < 100 | 125: close [2-4] | 35 | 65.
  CHECK(show(pack(a, "greedy_reverse_addx", 100)) == "[[0-1], [2-4]]");
}

TEST_CASE("synthetic A: x charged to the pack's first layer tips greedy_addx") {
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5});
  // C = 95: greedy (no x) 30 | 60 | 90 < 95 | 120 -> [0-2], 30 | 60 -> [0-2][3-4].
  CHECK(show(pack(a, "greedy", 95)) == "[[0-2], [3-4]]");
  // greedy_addx: 35 | 65 | 95 !< 95 -> close [0-1], s = 30+5 = 35 | 65 | 95 -> close [2-3], 35 -> [4].
  CHECK(show(pack(a, "greedy_addx", 95)) == "[[0-1], [2-3], [4]]");
  // greedy_reverse_addx: 35 | 65 | 95 !< 95 -> close [3-4]; 35 | 65 | 95 -> close [1-2]; [0].
  CHECK(show(pack(a, "greedy_reverse_addx", 95)) == "[[0], [1-2], [3-4]]");
}

TEST_CASE("synthetic A: balanced splits memory, balanced_time splits time") {
  // times [1, 1, 1, 1, 4] so that time and memory balance differently.
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5}, {1, 1, 1, 1, 4});
  // balanced: S0 = ceil(150 / 100.) = 2; target = 150 // 2 = 75; prefix [30,60,90,120,150];
  // searchsorted(75, left) = 2 -> [0-1][2-4], sums 60, 90; max 90 < 100 -> accepted.
  CHECK(show(pack(a, "balanced", 100)) == "[[0-1], [2-4]]");
  // balanced_addx: same split; 60+5 <= 100, 90+5 <= 100.
  CHECK(show(pack(a, "balanced_addx", 100)) == "[[0-1], [2-4]]");
  // balanced_time: S0 = 2 (from memory); time prefix [1,2,3,4,8], target 8/2 = 4.0;
  // searchsorted(4.0, left) = 3 -> [0-2][3-4]; memory 90+5 = 95 <= 100, 60+5 <= 100.
  CHECK(show(pack(a, "balanced_time", 100)) == "[[0-2], [3-4]]");
  // C = 95: balanced_addx's <= accepts 95 (= 90 + x[2]); balanced_time's [0-2] costs 90+5 = 95 <= 95 too.
  CHECK(show(pack(a, "balanced_addx", 95)) == "[[0-1], [2-4]]");
  CHECK(show(pack(a, "balanced_time", 95)) == "[[0-2], [3-4]]");
  // C = 94: S0 = ceil(150/94) = 2: [0-1][2-4] fails 95 > 94. S = 3: target 50, keys [50, 100] ->
  // cuts [1, 3] -> [0][1-2][3-4], costs 35, 65, 65 -> accepted.
  CHECK(show(pack(a, "balanced_addx", 94)) == "[[0], [1-2], [3-4]]");
  // balanced_time at C = 94: S = 2 fails (95 > 94); S = 3: target 8/3, keys [2.67, 5.33] -> cuts
  // [2, 4] -> [0-1][2-3][4]: costs 65, 65, 35 -> accepted.
  CHECK(show(pack(a, "balanced_time", 94)) == "[[0-1], [2-3], [4]]");
}

TEST_CASE("synthetic B: strict < (balanced, greedy) vs <= (balanced_addx) at exactly C, empty-pack skips") {
  // m = [40, 60, 40, 60], x = 0, C = 100.
  const Model b = synthetic({40, 60, 40, 60}, {0, 0, 0, 0});
  // S0 = ceil(200/100.) = 2: target 100, prefix [40,100,140,200], searchsorted(100, left) = 1 ->
  // [0][1-3] (40, 160) fails both tests.
  // S = 3: target 200 // 3 = 66, keys [66, 132] -> cuts [1, 2] -> [0][1][2-3] sums 40, 60, 100:
  //   balanced needs max < 100: fails; balanced_addx needs 100 + x[2] = 100 <= 100: accepted.
  // S = 4: target 50, keys [50, 100, 150] -> cuts [1, 1, 3]: an empty pack, skipped -> balanced None.
  CHECK(show(pack(b, "balanced", 100)) == "None");
  CHECK(show(pack(b, "balanced_addx", 100)) == "[[0], [1], [2-3]]");
  // greedy: 40 | 100 !< 100 -> [0]; 60 | 100 -> [1]; 40 | 100 -> [2]; 60 -> [0][1][2][3].
  CHECK(show(pack(b, "greedy", 100)) == "[[0], [1], [2], [3]]");
  // greedy_reverse: 60 | 100 !< 100 -> [3]; 40 | 100 -> [2]; 60 | 100 -> [1]; [0].
  CHECK(show(pack(b, "greedy_reverse", 100)) == "[[0], [1], [2], [3]]");
  // balanced_time with equal times: S = 2: target 2.0, prefix [1,2,3,4] -> cut 1 -> [0][1-3]: 160 > 100.
  // S = 3: target 4/3, keys [1.33, 2.67] -> cuts [1, 2] -> [0][1][2-3]: 40, 60, 100 <= 100: accepted.
  CHECK(show(pack(b, "balanced_time", 100)) == "[[0], [1], [2-3]]");

  // m = [50, 50], C = 100: S0 = 1: [0-1] sums 100 (balanced needs < 100: fails); S = 2: target 50,
  // searchsorted([50,100], 50, left) = 0 -> an empty first pack, skipped; the loop ends -> None.
  // greedy instead packs [0][1] (50 | 100 !< 100).
  const Model two = synthetic({50, 50}, {0, 0});
  CHECK(show(pack(two, "balanced", 100)) == "None");
  CHECK(show(pack(two, "balanced_addx", 100)) == "[[0-1]]");  // 100 + 0 <= 100
  CHECK(show(pack(two, "greedy", 100)) == "[[0], [1]]");
  CHECK(show(pack(two, "greedy_reverse", 100)) == "[[0], [1]]");
}

TEST_CASE("infeasible: a single layer larger than C") {
  // m = [10, 120, 10], x = 0, C = 100.
  const Model c = synthetic({10, 120, 10}, {0, 0, 0});
  // greedy: 10 | 130 -> close [0], s = 120 >= 100 -> None. reverse: 10 | 130 -> close [2], 120 -> None.
  // balanced(_addx): S0 = 2: target 70 -> cut 1 -> [0][1-2] (130) fails; S = 3: target 46,
  // keys [46, 92] -> cuts [1, 1] -> empty -> None. balanced_time: every split has 120 in some pack.
  for (const auto& method : packing_method_names()) {
    if (method == "reuse") continue;
    INFO(method);
    CHECK_FALSE(pack(c, method, 100).has_value());
  }
  const Packs reuse_from = P({{0, 0}, {1, 2}});
  CHECK_FALSE(pack(c, "reuse", 100, Phase::Fwd, 3, 1, &reuse_from).has_value());
  // The first layer alone: greedy_addx tests m[0] + x[0] = 60 + 50 >= 100 at once.
  const Model d = synthetic({60, 10}, {50, 0});
  CHECK_FALSE(pack(d, "greedy_addx", 100).has_value());
  CHECK(show(pack(d, "greedy", 100)) == "[[0-1]]");  // 60 | 70 < 100, x ignored
  // ceil(Σm / C) beyond the layer count: the S loop is empty.
  const Model e = synthetic({150, 150}, {0, 0});
  CHECK_FALSE(pack(e, "balanced", 100).has_value());
  CHECK_FALSE(pack(e, "balanced_time", 100).has_value());
}

TEST_CASE("negative per-layer memory (peak below the input size)") {
  // m = [10, -5, 10, 90], x = 0, C = 100. Σm = 105 -> S0 = 2; target 52; prefix [10, 5, 15, 105]
  // (not monotonic); numpy's binary search: mid 2 (15 < 52) -> lo 3; mid 3 (105) -> 3 -> [0-2][3],
  // sums 15, 90 < 100.
  const Model f = synthetic({10, -5, 10, 90}, {0, 0, 0, 0});
  CHECK(show(pack(f, "balanced", 100)) == "[[0-2], [3]]");
  // greedy: 10 | 5 | 15 | 105 -> [0-2][3].
  CHECK(show(pack(f, "greedy", 100)) == "[[0-2], [3]]");

  // A negative total: m = [-16, 1, -16], x = [200, 0, 0], C = 100. Σm = -31 -> ceil(-0.31) = 0,
  // treated as S = 1 (no cuts): -31 + 200 > 100 fails. S = 2: target = -31 // 2 = -16 (floor);
  // prefix [-16, -15, -31]; searchsorted(-16) = 0 -> empty first pack. S = 3: target = -11, keys
  // [-11, -22]: -11 -> 3; -22 (keys descending: numpy restarts at lo 0, hi min(3 + 1, 3)) -> 0:
  // cuts [3, 0] -> empty -> None.
  const Model g = synthetic({-16, 1, -16}, {200, 0, 0});
  CHECK(show(pack(g, "balanced_addx", 100)) == "None");
  // Without x the single pack (-31 < 100) is fine.
  CHECK(show(pack(g, "balanced", 100)) == "[[0-2]]");
}

TEST_CASE("reuse: strict < with x of each pack's first layer, forward only") {
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5});
  const Packs three_two = P({{0, 2}, {3, 4}});  // costs 95, 65
  const Packs two_three = P({{0, 1}, {2, 4}});  // costs 65, 95
  const Packs fine = P({{0, 1}, {2, 3}, {4, 4}});
  CHECK(show(pack(a, "reuse", 100, Phase::Fwd, 5, 1, &three_two)) == "[[0-2], [3-4]]");
  CHECK(show(pack(a, "reuse", 96, Phase::Fwd, 5, 1, &two_three)) == "[[0-1], [2-4]]");
  CHECK(show(pack(a, "reuse", 95, Phase::Fwd, 5, 1, &two_three)) == "None");  // 95 !< 95
  CHECK(show(pack(a, "reuse", 95, Phase::Fwd, 5, 1, &fine)) == "[[0-1], [2-3], [4]]");
  // The reference returns an empty list unchanged.
  const Packs none;
  CHECK(show(pack(a, "reuse", 95, Phase::Fwd, 5, 1, &none)) == "[]");

  CHECK_THROWS_AS(pack(a, "reuse", 100, Phase::Bwd, 5, 1, &three_two), ScheduleError);
  CHECK_THROWS_AS(pack(a, "reuse", 100, Phase::Fwd, 5, 1, nullptr), ScheduleError);
  const Packs gap = P({{0, 1}, {3, 4}});
  CHECK_THROWS_AS(pack(a, "reuse", 100, Phase::Fwd, 5, 1, &gap), ScheduleError);
  const Packs short_cover = P({{0, 1}, {2, 3}});
  CHECK_THROWS_AS(pack(a, "reuse", 100, Phase::Fwd, 5, 1, &short_cover), ScheduleError);
  // Other methods ignore reuse_from.
  CHECK(show(pack(a, "greedy", 100, Phase::Fwd, 5, 1, &gap)) == "[[0-2], [3-4]]");
}

TEST_CASE("packing a prefix of the model") {
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5});
  // Layers 0..2 only: 30 | 60 | 90 < 100 -> one pack.
  CHECK(show(pack(a, "greedy", 100, Phase::Fwd, 3)) == "[[0-2]]");
  CHECK(show(pack(a, "balanced_time", 100, Phase::Fwd, 3)) == "[[0-2]]");
}

TEST_CASE("errors") {
  const Model a = synthetic({30, 30}, {5, 5});
  CHECK_THROWS_AS(pack(a, "greedy_rev", 100), ScheduleError);
  CHECK_THROWS_AS(pack(a, "", 100), ScheduleError);
  try {
    pack(a, "balanced_adx", 100);
    FAIL("no throw");
  } catch (const ScheduleError& e) {
    CHECK(std::string(e.what()).find("balanced_addx") != std::string::npos);
  }
  CHECK_THROWS_AS(pack(a, "greedy", 100, Phase::Bwd, 0), ScheduleError);
  CHECK_THROWS_AS(pack(a, "greedy", 100, Phase::Bwd, 3), ScheduleError);
  CHECK_THROWS_AS(pack(a, "greedy", 0), ScheduleError);
  CHECK_THROWS_AS(pack(a, "greedy", 100, Phase::Bwd, 2, 2), ScheduleError);  // u outside the profile
}

// ---------------------------------------------------------------------------------------------
// find_packs_upto (search.pack_counts: wide): the method's own packing first, then more pack counts.

TEST_CASE("find_packs_upto: balanced methods add every feasible pack count up to the bound") {
  const Model a = synthetic({30, 30, 30, 30, 30}, {5, 5, 5, 5, 5}, {1, 1, 1, 1, 4});
  auto upto = [&](const std::string& method, int max_packs) {
    std::vector<std::string> out;
    for (const Packs& p : find_packs_upto(a, Phase::Bwd, method, 1, 5, 100, max_packs)) out.push_back(show(p));
    return out;
  };
  using V = std::vector<std::string>;
  // balanced_addx, C = 100: S = 2 is the paper's [0-1][2-4] (above).
  // S = 3: target 150 // 3 = 50, keys [50, 100] on prefix [30,60,90,120,150] -> cuts [1, 3] -> [0][1-2][3-4],
  //   costs 35, 65, 65 <= 100.
  // S = 4: target 37, keys [37, 74, 111] -> cuts [1, 2, 3] -> [0][1][2][3-4], costs 35, 35, 35, 65.
  // S = 5: target 30, keys [30, ...] -> first cut 0: an empty pack, skipped.
  CHECK(upto("balanced_addx", 5) == V{"[[0-1], [2-4]]", "[[0], [1-2], [3-4]]", "[[0], [1], [2], [3-4]]"});
  CHECK(upto("balanced", 5) == V{"[[0-1], [2-4]]", "[[0], [1-2], [3-4]]", "[[0], [1], [2], [3-4]]"});
  CHECK(upto("balanced_addx", 3) == V{"[[0-1], [2-4]]", "[[0], [1-2], [3-4]]"});
  // A bound below the paper's count keeps the paper's packing alone.
  CHECK(upto("balanced_addx", 1) == V{"[[0-1], [2-4]]"});
  // balanced_time, times [1,1,1,1,4] (prefix [1,2,3,4,8]): S = 2 is the paper's [0-2][3-4].
  // S = 3: target 8/3, keys [2.67, 5.33] -> cuts [2, 4] -> [0-1][2-3][4] (65, 65, 35).
  // S = 4: target 2, keys [2, 4, 6] -> cuts [1, 3, 4] -> [0][1-2][3][4] (35, 65, 35, 35).
  // S = 5: target 1.6, keys [1.6, 3.2, 4.8, 6.4] -> cuts [1, 3, 4, 4]: an empty pack, skipped.
  CHECK(upto("balanced_time", 5) == V{"[[0-2], [3-4]]", "[[0-1], [2-3], [4]]", "[[0], [1-2], [3], [4]]"});
  // Methods without a pack count give their one packing.
  CHECK(upto("greedy_reverse_addx", 5) == V{show(pack(a, "greedy_reverse_addx", 100))});
  CHECK(upto("greedy", 5) == V{show(pack(a, "greedy", 100))});
  // Nothing fits: empty.
  CHECK(find_packs_upto(a, Phase::Bwd, "balanced_addx", 1, 5, 30, 5).empty());
  CHECK_THROWS_AS(find_packs_upto(a, Phase::Bwd, "balancd", 1, 5, 100, 5), ScheduleError);
}

TEST_CASE("find_packs_upto: the first packing is exactly find_packs' on bert_large, every method") {
  for (int u : {1, 4, 8, 16}) {
    for (const std::string& method : packing_method_names()) {
      if (method == "reuse") continue;
      for (Phase phase : {Phase::Fwd, Phase::Bwd}) {
        CAPTURE(u);
        CAPTURE(method);
        const int n = bert_large().num_layers();
        const auto paper = find_packs(bert_large(), phase, method, u, n, kCap);
        const auto all = find_packs_upto(bert_large(), phase, method, u, n, kCap, n);
        REQUIRE(all.empty() == !paper.has_value());
        if (!paper) continue;
        CHECK(all.front() == *paper);
        for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i].size() > all[i - 1].size());
      }
    }
  }
}
