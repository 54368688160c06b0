// Sweeps (sim/app/sweep.hpp): the sweep file's errors and their locations, the grid's point order and ids,
// shards partitioning the points, CSV quoting, rows of invalid and unfit points, and the runner's files:
// identical for 1 and 2 threads, after a resume from a truncated file and after merging shards; a resume
// recomputes the rows whose files changed; the folder lock; the large-grid guard.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/base/error.hpp"
#include "sim/app/sweep.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using harmony::test::source_dir;
namespace fs = std::filesystem;

namespace {

// A sweep file "written" next to the bundled example's base config, so `base:` resolves against it.
std::string sweep_name() { return source_dir() + "/configs/sweeps/test_inline.yaml"; }

sim::Sweep load(const std::string& text) { return sim::load_sweep_text(text, sweep_name()); }

// The error a sweep text gives (empty when it loads).
core::ConfigError error_of(const std::string& text) {
  try {
    (void)load(text);
  } catch (const core::ConfigError& e) {
    return e;
  }
  FAIL("the sweep loaded: " << text);
  return core::ConfigError(core::SourceLoc{}, "");
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("harmony_test_sweep_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

const char* kSmall =
    "base: example_base.yaml\n"
    "grid:\n"
    "  model.profile: ../profiles/gpt2_medium.json\n"
    "  machine: [paper-1080ti, rtx4090-4x]\n"
    "  plan.gpus: [2, 8]\n"
    "kinds: [harmony-pp, dp-swap, l2l]\n"
    "budget: {tokens: 1e9, seq_len: 1024}\n";

}  // namespace

TEST_CASE("the grid expands in odometer order with the kinds innermost") {
  const auto s = load(
      "base: example_base.yaml\n"
      "grid:\n"
      "  plan.minibatch: [16, 32]\n"
      "  plan.gpus: [1, 2, 4]\n"
      "kinds: [harmony-pp, l2l]\n");
  CHECK(s.num_combos() == 6);
  CHECK(s.num_points() == 12);
  CHECK(s.base_path ==
        fs::path(source_dir() + "/configs/sweeps/example_base.yaml").lexically_normal().generic_string());
  const auto p7 = sim::sweep_point(s, 7);  // combo 3 = (minibatch 32, gpus 1), kind l2l
  CHECK(p7.kind == core::plan_kind("l2l"));
  CHECK(p7.value_index == std::vector<std::size_t>{1, 0});
  // the point's config runs its kind itself (plan.mode takes every kind); its id still hashes plan.mode=harmony-pp for
  // a kind without packs, as ids were first made (sweep_internal.hpp, id_mode_for), so resumed sweeps keep their ids
  CHECK(p7.overrides == std::vector<std::string>{"plan.minibatch=32", "plan.gpus=1", "plan.mode=l2l"});
  const auto p4 = sim::sweep_point(s, 4);  // combo 2 = (16, 4), harmony-pp
  CHECK(p4.kind == core::plan_kind("harmony-pp"));
  CHECK(p4.value_index == std::vector<std::size_t>{0, 2});
  std::set<std::string> ids;
  for (std::size_t i = 0; i < s.num_points(); ++i) ids.insert(sim::sweep_point(s, i).id);
  CHECK(ids.size() == s.num_points());
  // ids are a function of the point's overrides and kind, not of the file around it
  const auto t = load(
      "# a comment\nbase: example_base.yaml\nkinds: [harmony-pp, l2l]\n"
      "grid: {plan.minibatch: [16, 32], plan.gpus: [1, 2, 4]}\n");
  CHECK(sim::sweep_point(t, 7).id == p7.id);
  CHECK(t.fingerprint == s.fingerprint);
  const auto u = load(
      "base: example_base.yaml\nkinds: [harmony-pp, l2l]\ngrid: {plan.minibatch: [16, 64], "
      "plan.gpus: [1, 2, 4]}\n");
  CHECK(u.fingerprint != s.fingerprint);
  CHECK(sim::sweep_point(u, 1).id == sim::sweep_point(s, 1).id);  // minibatch 16: the same point
  CHECK(sim::sweep_point(u, 7).id != p7.id);
}

TEST_CASE("values: scalars are one value, lists of lists for list-valued keys, canonical flow text") {
  const auto s = load(
      "base: example_base.yaml\n"
      "set: {search.ubatch_step: 2}\n"
      "grid:\n"
      "  search.packing_fwd: [[balanced_time], [balanced_time, reuse]]\n"
      "  machine: {preset: rtx4090-4x, price_per_hour: 2.4}\n"
      "  machine.gpu_memory: [8GiB, '12GiB']\n");
  REQUIRE(s.grid.size() == 3);
  CHECK(s.grid[0].values == std::vector<std::string>{"[balanced_time]", "[balanced_time, reuse]"});
  CHECK(s.grid[1].values == std::vector<std::string>{"{preset: rtx4090-4x, price_per_hour: 2.4}"});
  CHECK(s.grid[2].values == std::vector<std::string>{"8GiB", "\"12GiB\""});
  CHECK(s.kinds.size() == 14);  // default: every kind but the in-memory ceiling (resident)
  CHECK(sim::sweep_point(s, 0).overrides.front() == "search.ubatch_step=2");
}

TEST_CASE("budget") {
  auto s = load(kSmall);
  CHECK(s.budget.tokens == 1'000'000'000);
  CHECK(s.budget.samples == 976563);  // ceil(1e9 / 1024)
  s = load("base: example_base.yaml\nbudget: {samples: 5000, bill: gpus}\n");
  CHECK(s.budget.samples == 5000);
  CHECK(s.budget.bill_gpus);
}

TEST_CASE("sweep file errors are located, with a hint") {
  auto e = error_of("base: example_base.yaml\ngird: {plan.gpus: [1]}\n");
  CHECK(e.loc().line == 2);
  CHECK(e.loc().column == 1);
  CHECK(e.hint().find("grid") != std::string::npos);

  e = error_of("base: example_base.yaml\ngrid:\n  plan.gpuz: [1, 2]\n");  // a config key the config rejects
  CHECK(e.loc().file == sweep_name());
  CHECK(e.loc().line == 3);
  CHECK(e.loc().column == 3);
  CHECK(e.message().find("gpuz") != std::string::npos);
  CHECK(e.hint().find("gpus") != std::string::npos);

  e = error_of("base: example_base.yaml\nset: {machine.gpu_mem: 8GiB}\n");
  CHECK(e.loc().line == 2);
  CHECK(e.hint().find("gpu_memory") != std::string::npos);

  e = error_of("base: example_base.yaml\ngrid: {plan.mode: [harmony-pp]}\n");
  CHECK(e.message().find("kinds") != std::string::npos);

  e = error_of("base: example_base.yaml\nkinds: [harmony-pp, l2ll]\n");
  CHECK(e.loc().line == 2);
  CHECK(e.loc().column == 21);
  CHECK(e.hint().find("'l2l'") != std::string::npos);

  e = error_of("base: example_base.yaml\ngrid: {plan.gpus: [1, 2, 1]}\n");
  CHECK(e.message().find("twice") != std::string::npos);
  e = error_of("base: example_base.yaml\ngrid: {plan.gpus: []}\n");
  CHECK(e.message().find("no values") != std::string::npos);
  e = error_of("base: example_base.yaml\ngrid: {plan..gpus: [1]}\n");
  CHECK(e.message().find("dotted") != std::string::npos);
  e = error_of("base: example_base.yaml\nbudget: {tokens: 100}\n");
  CHECK(e.message().find("seq_len") != std::string::npos);
  e = error_of("base: example_base.yaml\nbudget: {samples: 1.5}\n");
  CHECK(e.message().find("whole") != std::string::npos);
  e = error_of("base: nonexistent.yaml\n");
  CHECK(e.loc().line == 1);
  CHECK(e.message().find("nonexistent.yaml") != std::string::npos);
  e = error_of("grid: {plan.gpus: [1]}\n");
  CHECK(e.message().find("base") != std::string::npos);
  e = error_of("base: example_base.yaml\ngrid: {plan.gpus: [1, 2}\n");
  CHECK(e.loc().line == 2);
  CHECK(e.message().find("YAML") != std::string::npos);
  // Sweep files read YAML through the config's tree (core/config/yaml_tree.hpp): duplicate keys and an alias
  // inside its own anchor are located errors (the latter overflowed the stack in the emitter before).
  e = error_of("base: example_base.yaml\ngrid: {plan.gpus: [1]}\ngrid: {plan.gpus: [2]}\n");
  CHECK(e.loc().line == 3);
  CHECK(e.message().find("duplicate key") != std::string::npos);
  e = error_of("base: example_base.yaml\nset:\n  machine: &m {preset: rtx4090-4x, more: *m}\n");
  CHECK(e.loc().line == 3);
  CHECK(e.message().find("recursive anchor") != std::string::npos);
  e = error_of("base: example_base.yaml\ngrid:\n  plan.gpus: &g [1, *g]\n");
  CHECK(e.loc().line == 3);
  CHECK(e.message().find("recursive anchor") != std::string::npos);
}

TEST_CASE("shards partition the points") {
  for (std::size_t total : {0u, 1u, 7u, 96u}) {
    for (std::size_t n = 1; n <= 5; ++n) {
      std::size_t sum = 0;
      std::set<std::size_t> seen;
      for (std::size_t i = 0; i < n; ++i) {
        const sim::Shard sh{i, n};
        sum += sh.size(total);
        for (std::size_t k = 0; k < sh.size(total); ++k) {
          CHECK(sh.contains(sh.point(k)));
          CHECK(sh.point(k) < total);
          seen.insert(sh.point(k));
        }
      }
      CHECK(sum == total);
      CHECK(seen.size() == total);
    }
  }
  const auto sh = sim::parse_shard("2/4", "--shard 2/4");
  CHECK(sh.index == 2);
  CHECK(sh.count == 4);
  for (const char* bad : {"4/4", "1", "a/2", "-1/2", "1/0", "1/2/3", ""})
    CHECK_THROWS_AS(sim::parse_shard(bad, "--shard"), core::ConfigError);
}

TEST_CASE("csv fields are quoted only when needed") {
  CHECK(sim::csv_field("plain") == "plain");
  CHECK(sim::csv_field("a,b") == "\"a,b\"");
  CHECK(sim::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
  CHECK(sim::csv_field("") == "");
  CHECK(sim::fnv1a_hex("") == "cbf29ce484222325");
}

TEST_CASE("rows: ok, invalid with the config's reason, does not fit") {
  const auto s = load(kSmall);
  const auto cols = sim::sweep_columns(s);
  CHECK(cols.front() == "point");
  CHECK(cols[2] == "model.profile");
  CHECK(std::find(cols.begin(), cols.end(), "time_to_train_s") != cols.end());
  // point 0: gpt2_medium, paper-1080ti, N = 2, harmony-pp
  auto r = sim::evaluate_sweep_point(s, 0);
  CHECK(r.status == "ok");
  CHECK(r.json.rfind("{\"schema_version\":1,\"point\":0,", 0) == 0);
  CHECK(r.json.find("\"plan_kind\":\"harmony-pp\"") != std::string::npos);
  CHECK(r.json.find("\"packs_bwd\":[[") != std::string::npos);  // a JSON array, not a string
  CHECK(r.json.find("\"fits\":true,\"excess_bytes\":null") != std::string::npos);
  // Harmony recomputes by design; its masters and optimizer state stayed in host memory (no NVMe tier here)
  CHECK(r.json.find("\"swap_activations\":null,\"activation_policy\":\"checkpoint\",\"offload\":\"cpu\"") !=
        std::string::npos);
  CHECK(r.csv.find(",\"[[") != std::string::npos);  // the CSV holds the packs as quoted text
  CHECK(r.json.find("\"samples\":976563") != std::string::npos);
  CHECK(r.csv.back() == '\n');
  CHECK(std::count(r.csv.begin(), r.csv.end(), '\n') == 1);
  // rtx4090-4x has 4 GPUs: N = 8 is invalid, and says why
  const std::size_t bad = 3 * 3;  // combo (gpt2, rtx4090, 8) x kind harmony-pp
  r = sim::evaluate_sweep_point(s, bad);
  CHECK(r.status == "invalid");
  CHECK(r.reason.find("exceeds machine.gpus = 4") != std::string::npos);
  CHECK(r.json.find("\"feasible\":false") != std::string::npos);
  // a GPU too small for anything
  const auto tiny = load("base: example_base.yaml\nset: {machine.gpu_memory: 64MiB}\nkinds: [harmony-pp, l2l]\n");
  for (std::size_t i = 0; i < tiny.num_points(); ++i) {
    r = sim::evaluate_sweep_point(tiny, i);
    CHECK(r.status == "does_not_fit");
    CHECK(!r.reason.empty());
  }
}

TEST_CASE("a baseline point is checked under its own plan rules, not harmony-pp's") {
  // D = 32 on 2 GPUs with search.u_fwd: [3]: 3 does not divide D, so harmony-pp is invalid; dp-swap runs one
  // microbatch size (u_bwd) and never reads u_fwd, so its point loads and is searched.
  const auto s =
      load("base: example_base.yaml\nset: {plan.gpus: 2, search.u_fwd: [3]}\nkinds: [harmony-pp, dp-swap]\n");
  REQUIRE(s.num_points() == 2);
  const auto pp = sim::evaluate_sweep_point(s, 0);
  CHECK(pp.status == "invalid");
  CHECK(pp.reason.find("search.u_fwd") != std::string::npos);
  const auto dp = sim::evaluate_sweep_point(s, 1);
  CHECK(dp.status == "ok");
  CHECK(dp.reason.empty());
  CHECK(dp.json.find("\"plan_kind\":\"dp-swap\"") != std::string::npos);
  // lohan runs u = D/N = 16: search.u_bwd: [4] suits harmony-pp (4 divides D) but not lohan, whose point is
  // invalid at the config, located at the entry
  const auto l = load("base: example_base.yaml\nset: {plan.gpus: 2, search.u_bwd: [4]}\nkinds: [harmony-pp, lohan]\n");
  CHECK(sim::evaluate_sweep_point(l, 0).status != "invalid");
  const auto lo = sim::evaluate_sweep_point(l, 1);
  CHECK(lo.status == "invalid");
  CHECK(lo.reason.find("search.u_bwd") != std::string::npos);
}

TEST_CASE("run, stop, resume, threads and shards give the same bytes") {
  const auto s = load(kSmall);
  const fs::path a = fresh_dir("a");
  sim::SweepRunOptions o;
  o.out_dir = a.string();
  o.threads = 1;
  std::size_t calls = 0;
  const auto sum = sim::run_sweep(s, o, [&](const sim::SweepProgress&) { ++calls; });
  CHECK(sum.total == 12);
  CHECK(sum.computed == 12);
  CHECK(!sum.interrupted);
  CHECK(calls >= 2);
  const std::string csv = slurp(a / "results.csv");
  const std::string jsonl = slurp(a / "results.jsonl");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 13);
  CHECK(std::count(jsonl.begin(), jsonl.end(), '\n') == 12);

  SUBCASE("two threads") {
    const fs::path b = fresh_dir("b");
    o.out_dir = b.string();
    o.threads = 2;
    (void)sim::run_sweep(s, o);
    CHECK(slurp(b / "results.csv") == csv);
    CHECK(slurp(b / "results.jsonl") == jsonl);
    CHECK(slurp(b / "sweep.json") == slurp(a / "sweep.json"));
    fs::remove_all(b);
  }
  SUBCASE("stopped, then resumed from truncated files") {
    const fs::path c = fresh_dir("c");
    o.out_dir = c.string();
    std::atomic<bool> stop{true};
    o.stop = &stop;
    auto st = sim::run_sweep(s, o);
    CHECK(st.interrupted);
    CHECK(st.computed == 0);
    o.stop = nullptr;
    (void)sim::run_sweep(s, o);
    CHECK(slurp(c / "results.jsonl") == jsonl);
    // cut both files mid-row, as a kill during a write would
    fs::resize_file(c / "results.jsonl", jsonl.size() / 2);
    fs::resize_file(c / "results.csv", csv.size() / 3);
    st = sim::run_sweep(s, o);
    CHECK(st.resumed > 0);
    CHECK(st.resumed + st.computed == 12);
    CHECK(slurp(c / "results.csv") == csv);
    CHECK(slurp(c / "results.jsonl") == jsonl);
    // a finished sweep rerun computes nothing
    st = sim::run_sweep(s, o);
    CHECK(st.computed == 0);
    CHECK(st.resumed == 12);
    // a different sweep into the same folder is refused
    const auto other = load(std::string(kSmall) + "set: {search.ubatch_step: 2}\n");
    CHECK_THROWS_AS(sim::run_sweep(other, o), core::ConfigError);
    // so is another shard
    o.shard = sim::Shard{1, 2};
    CHECK_THROWS_AS(sim::run_sweep(s, o), core::ConfigError);
    fs::remove_all(c);
  }
  SUBCASE("shards merged") {
    std::vector<std::string> dirs;
    for (std::size_t i = 0; i < 3; ++i) {
      const fs::path d = fresh_dir("shard" + std::to_string(i));
      o.out_dir = d.string();
      o.shard = sim::Shard{i, 3};
      const auto st = sim::run_sweep(s, o);
      CHECK(st.total == 4);
      dirs.push_back(d.string());
    }
    const fs::path m = fresh_dir("merged");
    CHECK_THROWS_AS(sim::merge_sweeps(m.string(), {dirs[0], dirs[1]}), core::ConfigError);           // missing
    CHECK_THROWS_AS(sim::merge_sweeps(m.string(), {dirs[0], dirs[1], dirs[1]}), core::ConfigError);  // twice
    const auto ms = sim::merge_sweeps(m.string(), {dirs[2], dirs[0], dirs[1]});
    CHECK(ms.points == 12);
    CHECK(slurp(m / "results.csv") == csv);
    CHECK(slurp(m / "results.jsonl") == jsonl);
    CHECK(slurp(m / "sweep.json") == slurp(a / "sweep.json"));
    CHECK_THROWS_AS(sim::merge_sweeps(m.string(), {dirs[2], dirs[0], dirs[1]}), core::ConfigError);  // not empty
    // an incomplete shard is refused
    const std::string j1 = slurp(fs::path(dirs[1]) / "results.jsonl");
    fs::resize_file(fs::path(dirs[1]) / "results.jsonl", j1.size() - 10);
    const fs::path m2 = fresh_dir("merged2");
    CHECK_THROWS_AS(sim::merge_sweeps(m2.string(), {dirs[0], dirs[1], dirs[2]}), core::ConfigError);
    for (const auto& d : dirs) fs::remove_all(d);
    fs::remove_all(m);
    fs::remove_all(m2);
  }
  fs::remove_all(a);
}

TEST_CASE("the bundled sweeps load; the GPT sweep has at least 1,000 points and its points evaluate") {
  const auto example = sim::load_sweep(source_dir() + "/configs/sweeps/example.yaml");
  CHECK(example.num_points() == 96);
  const auto gpt = sim::load_sweep(source_dir() + "/configs/sweeps/gpt_1b_100b.yaml");
  CHECK(gpt.num_points() >= 1000);
  CHECK(gpt.kinds.size() == 7);  // every kind, lohan included
  CHECK(gpt.budget.samples > 0);
  // the smallest model on the first machine with one GPU, Harmony-PP, and the 100B model's last point
  auto r = sim::evaluate_sweep_point(gpt, 0);
  CHECK(r.status == "ok");
  CHECK(r.json.find("\"cost\":null") == std::string::npos);  // priced machines: a cost
  r = sim::evaluate_sweep_point(gpt, gpt.num_points() - 1);
  CHECK(!r.status.empty());
}

namespace {
void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}
}  // namespace

TEST_CASE("a resume recomputes exactly the rows whose files changed; the totals cover every row") {
  // A private copy of the base config and the two profiles, so one profile can be edited.
  const fs::path t = fresh_dir("inputs");
  fs::create_directories(t / "sweeps");
  fs::create_directories(t / "profiles");
  fs::copy_file(source_dir() + "/configs/sweeps/example_base.yaml", t / "sweeps" / "example_base.yaml");
  for (const char* p : {"bert_large.json", "gpt2_medium.json"})
    fs::copy_file(source_dir() + "/configs/profiles/" + p, t / "profiles" / p);
  const std::string text =
      "base: example_base.yaml\n"
      "grid:\n"
      "  model.profile: [../profiles/bert_large.json, ../profiles/gpt2_medium.json]\n"
      "  plan.gpus: [1, 2]\n"
      "kinds: [harmony-pp, l2l]\n";
  const auto s = sim::load_sweep_text(text, (t / "sweeps" / "s.yaml").string());
  REQUIRE(s.num_points() == 8);
  const auto row0 = sim::evaluate_sweep_point(s, 0);
  CHECK(row0.inputs == sim::sweep_point_inputs(s, 0));
  CHECK(row0.json.find("\"inputs\":\"" + row0.inputs + "\"") != std::string::npos);
  const std::string gpt_before = sim::sweep_point_inputs(s, 4);  // points 4..7 read gpt2_medium.json

  sim::SweepRunOptions o;
  o.out_dir = (t / "out").string();
  o.threads = 2;
  auto st = sim::run_sweep(s, o);
  CHECK(st.computed == 8);
  CHECK(slurp(t / "out" / "results.jsonl").find("\"model_name\":\"gpt2_medium\"") != std::string::npos);

  // Edit the second profile: its points (the last four) are stale, the first four are kept.
  const fs::path gpt = t / "profiles" / "gpt2_medium.json";
  std::string prof = slurp(gpt);
  const std::string from = "\"model\":\"gpt2_medium\"";
  REQUIRE(prof.find(from) != std::string::npos);
  prof.replace(prof.find(from), from.size(), "\"model\":\"gpt2_edited\"");
  write_file(gpt, prof);
  CHECK(sim::sweep_point_inputs(s, 4) != gpt_before);
  CHECK(sim::sweep_point_inputs(s, 0) == row0.inputs);
  st = sim::run_sweep(s, o);
  CHECK(st.resumed == 4);
  CHECK(st.computed == 4);
  CHECK(st.stale == 4);
  CHECK(st.done() == 8);
  std::size_t rows = 0;
  for (const auto& [status, n] : st.by_status) rows += n;
  CHECK(rows == 8);  // the totals count the kept rows too
  const std::string jsonl = slurp(t / "out" / "results.jsonl");
  CHECK(jsonl.find("\"model_name\":\"gpt2_medium\"") == std::string::npos);
  CHECK(jsonl.find("\"model_name\":\"gpt2_edited\"") != std::string::npos);
  // the same bytes as a fresh run on the edited files
  o.out_dir = (t / "fresh").string();
  (void)sim::run_sweep(s, o);
  CHECK(slurp(t / "fresh" / "results.jsonl") == jsonl);
  CHECK(slurp(t / "fresh" / "results.csv") == slurp(t / "out" / "results.csv"));

  // Editing the first profile makes the first rows stale: the files are cut there and the later, unchanged
  // rows written again from memory.
  const fs::path bert = t / "profiles" / "bert_large.json";
  write_file(bert, slurp(bert) + "\n");
  o.out_dir = (t / "out").string();
  st = sim::run_sweep(s, o);
  CHECK(st.stale == 4);
  CHECK(st.resumed == 4);
  CHECK(slurp(t / "out" / "results.jsonl").size() == jsonl.size());
  CHECK(slurp(t / "out" / "results.jsonl") != jsonl);  // new inputs digests in the first four rows
  st = sim::run_sweep(s, o);
  CHECK(st.computed == 0);
  CHECK(st.resumed == 8);
  // Ctrl-C while a resume re-hashes the earlier rows (after another edit) leaves the files as they were.
  write_file(gpt, slurp(gpt) + "\n");
  const std::string before = slurp(t / "out" / "results.jsonl");
  std::atomic<bool> stop{true};
  o.stop = &stop;
  st = sim::run_sweep(s, o);
  CHECK(st.interrupted);
  CHECK(st.computed == 0);
  CHECK(st.resumed == 8);
  CHECK(slurp(t / "out" / "results.jsonl") == before);
  o.stop = nullptr;
  st = sim::run_sweep(s, o, [&](const sim::SweepProgress& p) {
    if (p.checking) {
      CHECK(p.to_check == 8);
      CHECK(p.checked <= 8);
    }
  });
  CHECK(st.stale == 4);
  fs::remove_all(t);
}

TEST_CASE("the output folder is locked while a run writes it; the refusal names the holder") {
  const auto s = load(kSmall);
  const fs::path d = fresh_dir("lock");
  fs::create_directories(d);
  // Another writer: its own open file description of the lock file, flocked, with its pid and host.
  const int fd = ::open((d / "sweep.lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string holder = "pid 4242 on host elsewhere\n";
  REQUIRE(::write(fd, holder.data(), holder.size()) == static_cast<ssize_t>(holder.size()));
  sim::SweepRunOptions o;
  o.out_dir = d.string();
  o.threads = 1;
  try {
    (void)sim::run_sweep(s, o);
    FAIL("a locked folder was written");
  } catch (const core::ConfigError& e) {
    CHECK(std::string(e.what()).find("another sweep is writing into this folder, or a merge is using it") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("pid 4242 on host elsewhere") != std::string::npos);
  }
  CHECK(!fs::exists(d / "results.jsonl"));
  ::close(fd);  // the other writer is gone: the run proceeds and records itself
  const auto st = sim::run_sweep(s, o);
  CHECK(st.computed == 12);
  CHECK(slurp(d / "sweep.lock").find("pid " + std::to_string(::getpid()) + " on host ") == 0);
  fs::remove_all(d);
}

TEST_CASE("a grid above kLargeGridPoints is refused unless allowed, and then streams") {
  std::string values;
  for (int i = 1; i <= 101; ++i) values += (i > 1 ? ", " : "") + std::to_string(i);
  const auto s = load("base: example_base.yaml\nkinds: [harmony-pp]\ngrid:\n  plan.minibatch: [" + values +
                      "]\n  search.ubatch_step: [" + values + "]\n  search.top_k: [" + values + "]\n");
  REQUIRE(s.num_points() == 101u * 101u * 101u);
  REQUIRE(s.num_points() > sim::kLargeGridPoints);
  const fs::path d = fresh_dir("large");
  sim::SweepRunOptions o;
  o.out_dir = d.string();
  o.threads = 2;
  try {
    (void)sim::run_sweep(s, o);
    FAIL("a large grid ran without allow_large_grid");
  } catch (const core::ConfigError& e) {
    CHECK(std::string(e.what()).find("1030301 points") != std::string::npos);
    CHECK(std::string(e.what()).find("--allow-large-grid") != std::string::npos);
  }
  CHECK(!fs::exists(d));  // refused before anything is written
  o.allow_large_grid = true;
  std::atomic<bool> stop{false};
  o.stop = &stop;
  std::size_t seen = 0;
  const auto st = sim::run_sweep(s, o, [&](const sim::SweepProgress& p) {
    seen = p.done;
    if (p.done >= 20) stop = true;  // a few rows, then Ctrl-C
  });
  CHECK(st.interrupted);
  CHECK(st.computed >= 20);
  CHECK(st.computed < 1000);  // the window keeps the workers close to the rows written
  CHECK(seen >= 20);
  const std::string jsonl = slurp(d / "results.jsonl");
  CHECK(static_cast<std::size_t>(std::count(jsonl.begin(), jsonl.end(), '\n')) == st.computed);
  fs::remove_all(d);
}
