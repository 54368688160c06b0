// Tests of the config loader (core/config/): every shipped config loads with the expected values, machine presets and
// machine files, --set overrides, and one case per kind of bad input checking the exact file:line:column
// and that the error carries a hint (a suggestion where one applies).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/config/yaml_tree.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_dir;
using harmony::test::source_path;
using harmony::test::TempDir;

namespace {

using Loader = std::function<void(const std::string&, const std::vector<std::string>&)>;

// The ConfigError that loading `yaml` (as "bad.yaml", or with `load`) with `overrides` throws.
ConfigError config_error(
    const std::string& yaml, const std::vector<std::string>& overrides = {},
    const Loader& load = [](const std::string& y, const std::vector<std::string>& o) {
      load_config_text(y, "bad.yaml", o);
    }) {
  try {
    load(yaml, overrides);
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  return ConfigError(SourceLoc{}, "unreachable");
}

void check_at(const ConfigError& e, const std::string& file, int line, int column) {
  INFO(std::string(e.what()));
  CHECK(e.loc().file == file);
  CHECK(e.loc().line == line);
  CHECK(e.loc().column == column);
  CHECK_FALSE(e.hint().empty());
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A valid minimal config; tests append or replace lines.
const std::string kModel = "model:\n  profile: model.json\n";

void check_paper_machine(const MachineSpec& m) {
  CHECK(m.name == "paper-1080ti");
  CHECK(m.gpu_name == "GTX 1080 Ti");
  CHECK(m.gpus == 8);
  CHECK(m.gpu_memory_bytes == 10 * kGiB);
  CHECK(m.memory_cap_scale == 1.0);
  // Exactly the reference scheduler's constants (sched_args.py), not approximations.
  CHECK(m.bw_swap_bytes_per_s == 11.5 * 1024 * 1024 * 1024);
  CHECK(m.bw_p2p_bytes_per_s == 8.2 * 1024 * 1024 * 1024);
  CHECK(m.bw_msg_bytes_per_s == 128.0 / 8 * 1024 * 1024 * 1024);
  CHECK(m.time_del_s == 40.0 / 1000);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Shipped configs

TEST_CASE("InternalError: a bug reads as a bug, never as bad input or an infeasible plan") {
  // The mains exit 70 on InternalError and 2 on ConfigError/ScheduleError; the search and the sweep treat a
  // ScheduleError as "this candidate cannot run", so an InternalError must not be one.
  const InternalError e("a broken invariant");
  CHECK(std::string(e.what()) == "internal: a broken invariant");
  const Error& base = e;
  CHECK(dynamic_cast<const ScheduleError*>(&base) == nullptr);
  CHECK(dynamic_cast<const ConfigError*>(&base) == nullptr);
}

TEST_CASE("examples/bert_large_simulate.yaml: a fixed harmony-pp plan") {
  const std::string file = source_path("configs/examples/bert_large_simulate.yaml");
  const RunConfig c = load_config(file);
  CHECK(c.file == file);
  CHECK(std::filesystem::path(c.model.profile_path).filename() == "bert_large.json");
  CHECK(std::filesystem::exists(c.model.profile_path));
  CHECK(contains(c.model.profile_path, "configs/profiles/bert_large.json"));
  CHECK_FALSE(contains(c.model.profile_path, ".."));
  CHECK(c.model.loc.file == file);
  CHECK(c.model.loc.line > 0);
  check_paper_machine(c.machine);
  CHECK(c.cost_model == CostModelKind::Reference);
  CHECK(c.plan.kind == plan_kind("harmony-pp"));
  CHECK(c.plan.gpus == 2);
  CHECK(c.plan.minibatch == 16);
  CHECK(c.plan.u_fwd == 8);
  CHECK(c.plan.u_bwd == 8);
  CHECK(c.plan.pack_size == 7);
  CHECK_FALSE(c.plan.packs_fwd.has_value());
  CHECK_FALSE(c.plan.packs_bwd.has_value());
  CHECK(c.plan.loc.file == file);
  CHECK(c.plan.loc.line > 0);
  CHECK_FALSE(c.options.prefetch);
  CHECK_FALSE(c.options.unequal_microbatches);
}

TEST_CASE("examples/bert_large_search.yaml: the paper's default packing methods") {
  const RunConfig c = load_config(source_path("configs/examples/bert_large_search.yaml"));
  CHECK(std::filesystem::exists(c.model.profile_path));
  check_paper_machine(c.machine);
  CHECK(c.plan.kind == plan_kind("harmony-pp"));
  CHECK(c.plan.gpus == 2);
  CHECK(c.plan.minibatch == 32);
  CHECK_FALSE(c.plan.u_fwd.has_value());
  CHECK_FALSE(c.plan.u_bwd.has_value());
  CHECK_FALSE(c.plan.pack_size.has_value());
  const SearchSpec defaults;
  CHECK(c.search.packing_fwd == defaults.packing_fwd);
  CHECK(c.search.packing_bwd == defaults.packing_bwd);
  CHECK(c.search.packing_fwd ==
        std::vector<std::string>{"greedy_reverse_addx", "balanced_addx", "reuse", "balanced_time"});
  CHECK(c.search.packing_bwd == std::vector<std::string>{"greedy_reverse_addx", "balanced_addx", "balanced_time"});
  CHECK(c.search.top_k == 5);
}

TEST_CASE("examples/gpt2_medium_search.yaml") {
  const RunConfig c = load_config(source_path("configs/examples/gpt2_medium_search.yaml"));
  CHECK(std::filesystem::path(c.model.profile_path).filename() == "gpt2_medium.json");
  CHECK(std::filesystem::exists(c.model.profile_path));
  CHECK(c.plan.kind == plan_kind("harmony-pp"));
  CHECK(c.plan.gpus == 2);
  CHECK(c.plan.minibatch == 16);
  CHECK(c.search.packing_fwd == std::vector<std::string>{"balanced_time", "reuse"});
  CHECK(c.search.packing_bwd == std::vector<std::string>{"balanced_time"});
}

TEST_CASE("configs/default.yaml: the README's bert_large search") {
  const RunConfig c = load_config(source_path("configs/default.yaml"));
  CHECK(std::filesystem::path(c.model.profile_path).filename() == "bert_large.json");
  CHECK(std::filesystem::exists(c.model.profile_path));
  check_paper_machine(c.machine);
  CHECK(c.cost_model == CostModelKind::Reference);
  CHECK(c.plan.kind == plan_kind("harmony-pp"));
  CHECK(c.plan.gpus == 2);
  CHECK(c.plan.minibatch == 32);
  CHECK(c.search.packing_fwd == std::vector<std::string>{"balanced_time", "reuse"});
  CHECK(c.search.packing_bwd == std::vector<std::string>{"balanced_time"});
  CHECK(c.search.top_k == 5);
  CHECK(c.search.ubatch_step == 1);
  CHECK_FALSE(c.search.smaller_ufwd);
  CHECK_FALSE(c.search.fit_rule);
  CHECK(c.search.u_fwd.empty());
  CHECK(c.search.u_bwd.empty());
  CHECK(c.search.threads == 0);
  CHECK_FALSE(c.options.prefetch);
}

TEST_CASE("issue 13 defaults: the native model searches wide pack counts with prefetch, the reference the paper's") {
  const std::string plan = "plan: {mode: harmony-pp, gpus: 2, minibatch: 8}\n";
  // reference (the default cost model): the paper's scheduler, prefetch off, memory-minimum pack counts
  const RunConfig ref = load_config_text(kModel + plan, "dir/ref.yaml");
  CHECK_FALSE(ref.options.prefetch);
  CHECK(ref.search.pack_counts == PackCounts::Minimum);
  // native: double-buffered prefetch and wide pack counts, up to 4 packs per GPU
  const RunConfig nat = load_config_text(kModel + "cost_model: native\n" + plan, "dir/nat.yaml");
  CHECK(nat.options.prefetch);
  CHECK(nat.options.prefetch_buffers == 2);
  CHECK(nat.search.pack_counts == PackCounts::Wide);
  CHECK(nat.search.packs_per_gpu == 4);
  // the same through --set, and each default can be overridden either way
  const RunConfig set = load_config_text(kModel + plan, "dir/set.yaml", {"cost_model=native"});
  CHECK(set.options.prefetch);
  CHECK(set.search.pack_counts == PackCounts::Wide);
  const RunConfig off = load_config_text(kModel + "cost_model: native\n" + plan + "options: {prefetch: false}\n" +
                                             "search: {pack_counts: minimum, packs_per_gpu: 0}\n",
                                         "dir/off.yaml");
  CHECK_FALSE(off.options.prefetch);
  CHECK(off.search.pack_counts == PackCounts::Minimum);
  CHECK(off.search.packs_per_gpu == 0);
  const RunConfig on =
      load_config_text(kModel + plan, "dir/on.yaml", {"search.pack_counts=wide", "options.prefetch=true"});
  CHECK(on.options.prefetch);
  CHECK(on.search.pack_counts == PackCounts::Wide);
  check_at(config_error(kModel + plan + "search: {pack_counts: widest}\n"), "bad.yaml", 4, 23);
  CHECK(contains(config_error(kModel + plan + "search: {pack_counts: widest}\n").hint(), "wide"));
  check_at(config_error(kModel + plan + "search: {packs_per_gpu: -1}\n"), "bad.yaml", 4, 25);
  // the 40 ms per-pack free time is the paper's scheduler's (time_del, reference model) only: no native preset
  // charges it
  for (const std::string& name : machine_preset_names()) {
    CAPTURE(name);
    CHECK(machine_preset(name).topology.free_time_s == 0.0);
  }
  CHECK(machine_preset("paper-1080ti").time_del_s == 40.0 / 1000);
}

// ------------------------------------------------------------------------------------------------
// Schema details that load

TEST_CASE("a minimal config gets the documented defaults") {
  const RunConfig c = load_config_text(kModel + "plan: {mode: harmony-dp, gpus: 4, minibatch: 64}\n", "dir/min.yaml");
  CHECK(c.model.profile_path == "dir/model.json");  // relative to the config's folder
  CHECK(c.model.loc.line == 2);
  CHECK(c.model.loc.column == 12);
  check_paper_machine(c.machine);  // no machine: -> the paper-1080ti preset
  CHECK(c.cost_model == CostModelKind::Reference);
  CHECK(c.plan.kind == plan_kind("harmony-dp"));
  CHECK(c.plan.loc.line == 3);
  CHECK(c.plan.loc.column == 1);
  const SearchSpec s;
  CHECK(c.search.packing_fwd == s.packing_fwd);
  CHECK(c.search.top_k == 5);
  CHECK_FALSE(c.options.prefetch);
}

TEST_CASE("mode aliases, explicit packs, search lists and options") {
  const RunConfig c = load_config_text(kModel + R"(plan:
  mode: vPP
  gpus: 2
  minibatch: 32
  u_fwd: 16
  u_bwd: 8
  packs_fwd: [[0, 6], [7, 13]]
  packs_bwd: [[0, 6], [7, 13], [14, 27]]
options: {prefetch: true, unequal_microbatches: false}
search:
  packing_fwd: [balanced_time, reuse]
  packing_bwd: balanced_time
  top_k: -1
  ubatch_step: 2
  smaller_ufwd: true
  fit_rule: true
  u_fwd: [8, 16]
  u_bwd: 4
  threads: 3
)",
                                       "/abs/c.yaml");
  CHECK(c.model.profile_path == "/abs/model.json");
  CHECK(c.plan.kind == plan_kind("harmony-pp"));
  REQUIRE(c.plan.packs_fwd.has_value());
  REQUIRE(c.plan.packs_bwd.has_value());
  CHECK(*c.plan.packs_fwd == Packs{{0, 6}, {7, 13}});
  CHECK(*c.plan.packs_bwd == Packs{{0, 6}, {7, 13}, {14, 27}});
  CHECK(c.options.prefetch);
  CHECK(c.search.packing_bwd == std::vector<std::string>{"balanced_time"});
  CHECK(c.search.top_k == -1);
  CHECK(c.search.ubatch_step == 2);
  CHECK(c.search.smaller_ufwd);
  CHECK(c.search.fit_rule);
  CHECK(c.search.u_fwd == std::vector<int>{8, 16});
  CHECK(c.search.u_bwd == std::vector<int>{4});
  CHECK(c.search.threads == 3);

  CHECK(load_config_text(kModel + "plan: {mode: vDP, gpus: 2, minibatch: 32}\n", "x.yaml").plan.kind ==
        plan_kind("harmony-dp"));
}

TEST_CASE("packs_bwd alone implies packs_fwd = all backward packs but the last; single-pack plans") {
  RunConfig c = load_config_text(
      kModel + "plan: {mode: harmony-pp, gpus: 1, minibatch: 8, u_fwd: 8, u_bwd: 8, packs_bwd: [[0, 9], [10, 27]]}\n",
      "x.yaml");
  CHECK(*c.plan.packs_fwd == Packs{{0, 9}});
  c = load_config_text(kModel +
                           "plan: {mode: harmony-pp, gpus: 1, minibatch: 8, u_fwd: 2, u_bwd: 2, packs_fwd: [], "
                           "packs_bwd: [[0, 27]]}\n",
                       "x.yaml");
  CHECK(c.plan.packs_fwd->empty());
  CHECK(*c.plan.packs_bwd == Packs{{0, 27}});
}

TEST_CASE("null values count as absent; unequal microbatches lift the divisibility rule") {
  RunConfig c = load_config_text(kModel +
                                     "plan: {mode: harmony-pp, gpus: 2, minibatch: 32, u_fwd: ~, u_bwd: ~}\n"
                                     "search:\n",
                                 "x.yaml");
  CHECK_FALSE(c.plan.u_fwd.has_value());
  c = load_config_text(kModel +
                           "plan: {mode: harmony-pp, gpus: 2, minibatch: 32, u_fwd: 7, u_bwd: 5}\n"
                           "options: {unequal_microbatches: true}\n",
                       "x.yaml");
  CHECK(c.plan.u_fwd == 7);
  CHECK(c.options.unequal_microbatches);
  // harmony-dp over 3 GPUs with D = 32 gives shares 11, 11, 10: only u = 1 is equal.
  c = load_config_text(kModel + "plan: {mode: harmony-dp, gpus: 3, minibatch: 32, u_fwd: 1, u_bwd: 1}\n", "x.yaml");
  CHECK(c.plan.u_bwd == 1);
}

TEST_CASE("machine: preset with overrides, a full mapping, or a file path") {
  TempDir dir;
  dir.write("box.yaml",
            "name: box\ngpu: A100\ngpus: 4\ngpu_memory: 80 GB\nbw_swap: 24GB/s\nbw_p2p: 300GB/s\n"
            "bw_msg: 12348030976\ntime_del: 0.01\nmemory_cap_scale: 0.9\n");
  const std::string cfg =
      dir.write("cfg.yaml", kModel + "machine: box.yaml\nplan: {mode: vPP, gpus: 4, minibatch: 8}\n");
  RunConfig c = load_config(cfg);
  CHECK(c.machine.name == "box");
  CHECK(c.machine.gpu_name == "A100");
  CHECK(c.machine.gpus == 4);
  CHECK(c.machine.gpu_memory_bytes == 80'000'000'000);
  CHECK(c.machine.bw_swap_bytes_per_s == doctest::Approx(24e9));
  CHECK(c.machine.bw_p2p_bytes_per_s == doctest::Approx(300e9));
  CHECK(c.machine.bw_msg_bytes_per_s == doctest::Approx(12348030976.0));
  CHECK(c.machine.time_del_s == doctest::Approx(0.01));
  CHECK(c.machine.memory_cap_scale == doctest::Approx(0.9));
  CHECK(c.model.profile_path == dir / "model.json");

  c = load_config(cfg, {"machine.gpu_memory=40GB"});  // `machine: FILE` + override
  CHECK(c.machine.gpu_memory_bytes == 40'000'000'000);
  CHECK(c.machine.gpu_name == "A100");

  c = load_config_text(kModel +
                           "machine: {preset: paper-1080ti, gpu_memory: 8GiB, gpus: 2, time_del: 0}\n"
                           "plan: {mode: vPP, gpus: 2, minibatch: 8}\n",
                       "x.yaml");
  CHECK(c.machine.name == "paper-1080ti");
  CHECK(c.machine.gpu_memory_bytes == 8 * kGiB);
  CHECK(c.machine.gpus == 2);
  CHECK(c.machine.time_del_s == 0.0);
  CHECK(c.machine.bw_swap_bytes_per_s == 11.5 * 1024 * 1024 * 1024);

  c = load_config_text(kModel + "machine: {gpus: 2, gpu_memory: 16GiB}\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n",
                       "x.yaml");
  CHECK(c.machine.name == "custom");
  CHECK(c.machine.gpu_memory_bytes == 16 * kGiB);
  CHECK(c.machine.time_del_s == 0.040);  // the paper's constants by default

  const MachineSpec m = load_machine_file(dir.write("derived.yaml", "preset: paper-1080ti\ngpus: 2\n"));
  CHECK(m.gpus == 2);
  CHECK(m.gpu_memory_bytes == 10 * kGiB);
}

TEST_CASE("machine presets are built in; the shipped preset file matches the embedded one") {
  check_paper_machine(machine_preset("paper-1080ti"));
  const std::vector<std::string> names = machine_preset_names();
  CHECK(std::find(names.begin(), names.end(), "paper-1080ti") != names.end());
  check_paper_machine(load_machine_file("paper-1080ti"));
  MachineSpec from_file = load_machine_file(source_path("configs/machines/paper-1080ti.yaml"));
  CHECK(from_file.name == "paper-1080ti");  // the file stem
  check_paper_machine(from_file);

  try {
    machine_preset("paper-1080");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(contains(e.message(), "paper-1080"));
    CHECK(contains(e.hint(), "did you mean 'paper-1080ti'"));
    CHECK(contains(e.hint(), "paper-1080ti"));
  }
  CHECK_THROWS_AS(load_machine_file("no-such-machine"), ConfigError);
  CHECK_THROWS_AS(load_machine_file("/no/such/machine.yaml"), ConfigError);
}

// ------------------------------------------------------------------------------------------------
// Overrides

TEST_CASE("--set overrides are applied before validation") {
  const std::string file = source_path("configs/default.yaml");
  RunConfig c =
      load_config(file, {"plan.gpus=4", "machine.gpu_memory=8GiB", "search.packing_fwd=[balanced_time, reuse]",
                         "search.top_k=-1", "plan.mode=vDP", "options.prefetch=true"});
  CHECK(c.plan.gpus == 4);
  CHECK(c.plan.kind == plan_kind("harmony-dp"));
  CHECK(c.machine.gpu_memory_bytes == 8 * kGiB);
  CHECK(c.machine.gpus == 8);  // the rest of the preset stays
  CHECK(c.search.packing_fwd == std::vector<std::string>{"balanced_time", "reuse"});
  CHECK(c.search.top_k == -1);
  CHECK(c.options.prefetch);

  // `machine: NAME` (a string) and a config without machine: both keep their preset under an override.
  c = load_config(source_path("configs/examples/bert_large_search.yaml"), {"machine.gpus=2"});
  CHECK(c.machine.gpus == 2);
  CHECK(c.machine.gpu_name == "GTX 1080 Ti");
  c = load_config_text(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", "x.yaml", {"machine.gpu_memory=6GiB"});
  CHECK(c.machine.gpu_memory_bytes == 6 * kGiB);
  CHECK(c.machine.bw_p2p_bytes_per_s == 8.2 * 1024 * 1024 * 1024);

  // New sections and keys are created; an empty value or null unsets a key.
  c = load_config(source_path("configs/examples/bert_large_simulate.yaml"),
                  {"plan.pack_size=", "plan.packs_bwd=[[0, 13], [14, 27]]", "search.u_bwd=[4, 8]"});
  CHECK_FALSE(c.plan.pack_size.has_value());
  CHECK(*c.plan.packs_bwd == Packs{{0, 13}, {14, 27}});
  CHECK(*c.plan.packs_fwd == Packs{{0, 13}});
  CHECK(c.search.u_bwd == std::vector<int>{4, 8});

  // Overrides can even supply whole required sections.
  c = load_config_text("", "x.yaml", {"model.profile=m.json", "plan={mode: vPP, gpus: 1, minibatch: 4}"});
  CHECK(c.model.profile_path == "m.json");
  CHECK(c.plan.minibatch == 4);
}

// ------------------------------------------------------------------------------------------------
// Errors: one per kind of bad input, with the exact location and a hint

TEST_CASE("error: unknown key, with the closest valid key suggested") {
  const ConfigError e = config_error(kModel + "plan:\n  mode: harmony-pp\n  gpuz: 2\n  minibatch: 32\n");
  check_at(e, "bad.yaml", 5, 3);
  CHECK(contains(e.message(), "'gpuz'"));
  CHECK(contains(e.hint(), "did you mean 'gpus'?"));
  CHECK(contains(e.hint(), "mode, gpus, minibatch"));

  const ConfigError top = config_error(kModel + "plans: {mode: vPP}\n");
  check_at(top, "bad.yaml", 3, 1);
  CHECK(contains(top.hint(), "did you mean 'plan'?"));

  const ConfigError machine = config_error(kModel +
                                           "machine: {preset: paper-1080ti, bw_swp: 1GiB/s}\n"
                                           "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(machine, "bad.yaml", 3, 33);
  CHECK(contains(machine.hint(), "did you mean 'bw_swap'?"));

  const ConfigError unrelated = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8, zzzzzzzzzzzz: 1}\n");
  CHECK(contains(unrelated.hint(), "valid keys:"));
  CHECK_FALSE(contains(unrelated.hint(), "did you mean"));
}

TEST_CASE("error: malformed YAML reports the parser's position, 1-based") {
  const ConfigError e = config_error(kModel + "plan:\n  mode: harmony-pp\n   gpus: 2\n");
  check_at(e, "bad.yaml", 5, 8);
  CHECK(contains(e.message(), "malformed YAML"));

  const ConfigError unclosed = config_error("model: {profile: p.json}\nplan: {mode: vPP, gpus: 2\n");
  check_at(unclosed, "bad.yaml", 3, 1);

  const ConfigError dup = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nplan: {}\n");
  check_at(dup, "bad.yaml", 4, 1);
  CHECK(contains(dup.message(), "duplicate key 'plan'"));
  CHECK(contains(dup.hint(), "bad.yaml:3:1"));
}

TEST_CASE("error: missing required fields and sections") {
  const ConfigError e = config_error(kModel + "plan:\n  mode: harmony-pp\n  gpus: 2\n");
  check_at(e, "bad.yaml", 3, 1);  // at `plan:`
  CHECK(contains(e.message(), "plan.minibatch"));
  CHECK(contains(e.hint(), "minibatch:"));

  const ConfigError empty_value = config_error(kModel + "plan:\n  mode: harmony-pp\n  gpus:\n  minibatch: 8\n");
  check_at(empty_value, "bad.yaml", 5, 3);
  CHECK(contains(empty_value.message(), "plan.gpus has no value"));

  const ConfigError profile = config_error("model: {}\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(profile, "bad.yaml", 1, 1);
  CHECK(contains(profile.message(), "model.profile"));

  const ConfigError no_model = config_error("plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(no_model, "bad.yaml", 0, 0);
  CHECK(contains(no_model.message(), "'model'"));

  const ConfigError no_plan = config_error(kModel);
  check_at(no_plan, "bad.yaml", 0, 0);
  CHECK(contains(no_plan.message(), "'plan'"));

  check_at(config_error(""), "bad.yaml", 0, 0);

  const ConfigError machine = config_error(kModel + "machine:\n  gpus: 2\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(machine, "bad.yaml", 3, 1);
  CHECK(contains(machine.message(), "machine.gpu_memory"));
}

TEST_CASE("error: wrong types") {
  const ConfigError e = config_error(kModel + "plan:\n  mode: harmony-pp\n  gpus: two\n  minibatch: 8\n");
  check_at(e, "bad.yaml", 5, 9);
  CHECK(contains(e.message(), "plan.gpus must be an integer, got 'two'"));

  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2.5, minibatch: 8}\n"), "bad.yaml", 3, 25);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: [2], minibatch: 8}\n"), "bad.yaml", 3, 25);
  check_at(config_error(kModel + "plan: [mode, gpus]\n"), "bad.yaml", 3, 7);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\noptions: {prefetch: maybe}\n"), "bad.yaml",
           4, 21);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nsearch: {top_k: 0}\n"), "bad.yaml", 4, 17);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nsearch: {top_k: -2}\n"), "bad.yaml", 4, 17);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 99999999999, minibatch: 8}\n"), "bad.yaml", 3, 25);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 0, minibatch: 8}\n"), "bad.yaml", 3, 25);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nmachine: [1]\n"), "bad.yaml", 4, 10);

  const ConfigError mode = config_error(kModel + "plan: {mode: harmony-p, gpus: 2, minibatch: 8}\n");
  check_at(mode, "bad.yaml", 3, 14);
  CHECK(contains(mode.hint(), "did you mean 'harmony-pp'?"));

  const ConfigError cost = config_error(kModel + "cost_model: natve\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(cost, "bad.yaml", 3, 13);
  CHECK(contains(cost.hint(), "did you mean 'native'?"));
  const ConfigError cost2 = config_error(kModel + "cost_model: referense\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  CHECK(contains(cost2.hint(), "did you mean 'reference'?"));
  CHECK(std::string(cost.what()).find("unknown cost_model 'natve'") != std::string::npos);
}

TEST_CASE("cost model kinds: parsed once, printed with the config's names") {
  for (const CostModelKind k : {CostModelKind::Reference, CostModelKind::Native})
    CHECK(parse_cost_model_kind(cost_model_name(k)) == k);
  CHECK(std::string(cost_model_name(CostModelKind::Reference)) == "reference");
  CHECK(std::string(cost_model_name(CostModelKind::Native)) == "native");
  CHECK_FALSE(parse_cost_model_kind("natve").has_value());
  CHECK_FALSE(parse_cost_model_kind("").has_value());
}

TEST_CASE("error: negative and zero sizes") {
  const ConfigError e = config_error(kModel +
                                     "machine:\n  preset: paper-1080ti\n  gpu_memory: -1GiB\n"
                                     "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(e, "bad.yaml", 5, 15);
  CHECK(contains(e.message(), "positive"));
  CHECK(contains(e.hint(), "10GiB"));
  check_at(config_error(kModel + "machine: {preset: paper-1080ti, gpu_memory: 0}\nplan: {mode: vPP, gpus: 2, "
                                 "minibatch: 8}\n"),
           "bad.yaml", 3, 45);
  check_at(config_error(kModel + "machine: {preset: paper-1080ti, bw_p2p: 0GiB/s}\nplan: {mode: vPP, gpus: 2, "
                                 "minibatch: 8}\n"),
           "bad.yaml", 3, 41);
  check_at(config_error(kModel + "machine: {preset: paper-1080ti, time_del: -40ms}\nplan: {mode: vPP, gpus: 2, "
                                 "minibatch: 8}\n"),
           "bad.yaml", 3, 43);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: -8}\n"), "bad.yaml", 3, 39);
}

TEST_CASE("error: quantities out of their documented range (issue 11)") {
  struct Case {
    std::string key, value, message, hint;
  };
  const std::vector<Case> cases = {
      // each wrapped or overflowed before: an event at a negative time, a negative capacity, a silent 1e300 s
      {"time_del", "1e300", "machine.time_del = '1e300' is too long", "0 to 1e6 s"},
      {"time_del", "1000001s", "is too long", "0 to 1e6 s"},
      {"gpu_memory", "9223372036854775807", "machine.gpu_memory = '9223372036854775807' is too large", "1 PiB"},
      {"gpu_memory", "1025TiB", "is too large", "2^50"},
      {"bw_swap", "1B/s", "machine.bw_swap = '1B/s' is too small", "1 KB/s (1000 B/s) to 1 EB/s"},
      {"bw_p2p", "999", "is too small", "1 KB/s"},
      {"bw_msg", "2e18B/s", "is too large", "1 EB/s"},
  };
  for (const Case& c : cases) {
    const std::string line = "machine: {preset: paper-1080ti, " + c.key + ": " + c.value + "}\n";
    INFO(line);
    const ConfigError e = config_error(kModel + line + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
    check_at(e, "bad.yaml", 3, static_cast<int>(line.find(c.value)) + 1);
    CHECK(contains(e.message(), c.message));
    CHECK(contains(e.hint(), c.hint));
  }
  // the bounds themselves are valid
  const RunConfig ok = load_config_text(kModel +
                                            "machine: {preset: paper-1080ti, time_del: 1000000s, gpu_memory: "
                                            "1125899906842624, bw_swap: 1KB/s, bw_p2p: 1e18}\n"
                                            "plan: {mode: vPP, gpus: 2, minibatch: 8}\n",
                                        "ok.yaml");
  CHECK(ok.machine.time_del_s == 1e6);
  CHECK(ok.machine.gpu_memory_bytes == Bytes{1} << 50);
  CHECK(ok.machine.bw_swap_bytes_per_s == 1e3);
  // counts name their range too
  const ConfigError n = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 99999999999}\n");
  CHECK(contains(n.hint(), "from 1 to 2147483647"));
  // FLOP rates and counts of an analytic machine
  const ConfigError f =
      config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"machine.gpu_rates.matrix_fp32=1kFLOP/s"});
  CHECK(contains(f.message(), "too small"));
  CHECK(contains(f.hint(), "1 MFLOP/s to 1000 PFLOP/s"));
  const ConfigError h = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n",
                                     {"machine.gpu_rates.gemm_efficiency.half=2000PFLOP"});
  CHECK(contains(h.hint(), "up to 1000 PFLOP"));
}

TEST_CASE("error: bad unit strings show the valid forms") {
  const ConfigError e = config_error(kModel +
                                     "machine:\n  preset: paper-1080ti\n  gpu_memory: 10gib\n"
                                     "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(e, "bad.yaml", 5, 15);
  CHECK(contains(e.message(), "'10gib'"));
  CHECK(contains(e.hint(), "GiB"));
  CHECK(contains(e.hint(), "case-sensitive"));

  const ConfigError bw = config_error(kModel +
                                      "machine:\n  preset: paper-1080ti\n  bw_swap: 11.5GiB\n"
                                      "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(bw, "bad.yaml", 5, 12);
  CHECK(contains(bw.hint(), "did you mean '11.5GiB/s'?"));

  const ConfigError t = config_error(kModel +
                                     "machine:\n  preset: paper-1080ti\n  time_del: 40 msec\n"
                                     "plan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(t, "bad.yaml", 5, 13);
  CHECK(contains(t.hint(), "40ms"));
}

TEST_CASE("error: unknown machine preset lists the presets") {
  const ConfigError e =
      config_error(kModel + "machine:\n  preset: paper-1080\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(e, "bad.yaml", 4, 11);
  CHECK(contains(e.message(), "'paper-1080'"));
  CHECK(contains(e.hint(), "did you mean 'paper-1080ti'?"));
  CHECK(contains(e.hint(), "built-in presets: paper-1080ti"));

  check_at(config_error(kModel + "machine: dgx\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n"), "bad.yaml", 3, 10);
  const ConfigError file =
      config_error(kModel + "machine: machines/none.yaml\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  check_at(file, "bad.yaml", 3, 10);
  CHECK(contains(file.message(), "cannot read machine file 'machines/none.yaml'"));
}

TEST_CASE("error: unknown packing method, with a suggestion") {
  const ConfigError e = config_error(kModel +
                                     "plan: {mode: vPP, gpus: 2, minibatch: 8}\n"
                                     "search:\n  packing_fwd: [balanced_time, balanced_tim]\n");
  check_at(e, "bad.yaml", 5, 32);
  CHECK(contains(e.message(), "'balanced_tim'"));
  CHECK(contains(e.hint(), "did you mean 'balanced_time'?"));

  const ConfigError reuse = config_error(kModel +
                                         "plan: {mode: vPP, gpus: 2, minibatch: 8}\n"
                                         "search:\n  packing_bwd:\n    - balanced_time\n    - reuse\n");
  check_at(reuse, "bad.yaml", 7, 7);
  CHECK(contains(reuse.message(), "forward-only"));

  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nsearch: {packing_bwd: []}\n"), "bad.yaml",
           4, 10);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\nsearch: {packing_bwd: [reuse2, reuse2]}\n"),
           "bad.yaml", 4, 24);
}

TEST_CASE("error: microbatch sizes that do not divide the minibatch") {
  const ConfigError pp = config_error(kModel +
                                      "plan:\n  mode: harmony-pp\n  gpus: 2\n  minibatch: 32\n  u_fwd: 7\n"
                                      "  u_bwd: 8\n");
  check_at(pp, "bad.yaml", 7, 10);
  CHECK(contains(pp.message(), "plan.u_fwd = 7 does not divide minibatch 32"));
  CHECK(contains(pp.hint(), "1, 2, 4, 8, 16, 32"));
  CHECK(contains(pp.hint(), "unequal_microbatches"));

  const ConfigError dp = config_error(kModel +
                                      "plan:\n  mode: harmony-dp\n  gpus: 2\n  minibatch: 36\n  u_fwd: 6\n"
                                      "  u_bwd: 4\n");
  check_at(dp, "bad.yaml", 8, 10);
  CHECK(contains(dp.message(), "harmony-dp"));
  CHECK(contains(dp.hint(), "1, 2, 3, 6, 9, 18"));

  const ConfigError uneven = config_error(kModel + "plan: {mode: vDP, gpus: 3, minibatch: 32, u_fwd: 2, u_bwd: 2}\n");
  check_at(uneven, "bad.yaml", 3, 50);
  CHECK(contains(uneven.hint(), "multiple of gpus"));

  const ConfigError search =
      config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 32}\nsearch: {u_bwd: [8, 12]}\n");
  check_at(search, "bad.yaml", 4, 21);

  const ConfigError too_big = config_error(kModel +
                                           "plan: {mode: vPP, gpus: 2, minibatch: 32, u_fwd: 64, u_bwd: 8}\n"
                                           "options: {unequal_microbatches: true}\n");
  check_at(too_big, "bad.yaml", 3, 50);

  check_at(config_error(kModel + "plan: {mode: vDP, gpus: 4, minibatch: 2}\n"), "bad.yaml", 3, 39);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 9, minibatch: 32}\n"), "bad.yaml", 3, 25);
}

TEST_CASE("error: exactly-one-of and pairing rules in plan") {
  const ConfigError both = config_error(kModel +
                                        "plan:\n  mode: vPP\n  gpus: 2\n  minibatch: 8\n  u_fwd: 8\n"
                                        "  u_bwd: 8\n  pack_size: 7\n  packs_bwd: [[0, 6], [7, 27]]\n");
  check_at(both, "bad.yaml", 10, 3);
  CHECK(contains(both.message(), "pack_size and plan.packs_bwd"));
  CHECK(contains(both.hint(), "bad.yaml:9:3"));

  const ConfigError fwd_only = config_error(kModel +
                                            "plan:\n  mode: vPP\n  gpus: 2\n  minibatch: 8\n"
                                            "  packs_fwd: [[0, 6]]\n");
  check_at(fwd_only, "bad.yaml", 7, 3);
  CHECK(contains(fwd_only.message(), "packs_fwd needs plan.packs_bwd"));

  const ConfigError u = config_error(kModel + "plan:\n  mode: vPP\n  gpus: 2\n  minibatch: 8\n  u_bwd: 8\n");
  check_at(u, "bad.yaml", 7, 3);
  CHECK(contains(u.message(), "u_bwd is given without plan.u_fwd"));

  const ConfigError gap = config_error(kModel +
                                       "plan: {mode: vPP, gpus: 2, minibatch: 8, u_fwd: 8, u_bwd: 8, "
                                       "packs_bwd: [[0, 6], [8, 27]]}\n");
  check_at(gap, "bad.yaml", 3, 82);
  CHECK(contains(gap.message(), "skips layer 7"));
  CHECK(contains(gap.message(), "must start at layer 7"));
  const ConfigError overlap = config_error(kModel +
                                           "plan: {mode: vPP, gpus: 2, minibatch: 8, u_fwd: 8, u_bwd: 8, "
                                           "packs_bwd: [[0, 13], [13, 27]]}\n");
  check_at(overlap, "bad.yaml", 3, 83);
  CHECK(contains(overlap.message(), "overlaps the previous pack at layer 13"));
  const ConfigError late = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8, packs_bwd: [[3, 27]]}\n");
  check_at(late, "bad.yaml", 3, 54);
  CHECK(contains(late.message(), "skips layers 0..2"));

  const ConfigError cover = config_error(kModel +
                                         "plan: {mode: vPP, gpus: 2, minibatch: 8, u_fwd: 8, u_bwd: 8, "
                                         "packs_fwd: [[0, 5]], packs_bwd: [[0, 6], [7, 27]]}\n");
  check_at(cover, "bad.yaml", 3, 73);
  CHECK(contains(cover.message(), "layers 0..6"));

  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8, packs_bwd: [[6, 0]]}\n"), "bad.yaml", 3, 54);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8, packs_bwd: [[0, 1, 2]]}\n"), "bad.yaml", 3,
           54);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8, packs_bwd: []}\n"), "bad.yaml", 3, 53);
}

TEST_CASE("error: unknown override path, reported at the --set text with a suggestion") {
  const ConfigError e = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"plan.gpuz=4"});
  check_at(e, "--set plan.gpuz=4", 0, 0);
  CHECK(contains(e.hint(), "did you mean 'gpus'?"));

  const ConfigError section = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"serch.top_k=3"});
  check_at(section, "--set serch.top_k=3", 0, 0);
  CHECK(contains(section.hint(), "did you mean 'search'?"));

  const ConfigError value = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"plan.gpus=four"});
  check_at(value, "--set plan.gpus=four", 0, 0);
  CHECK(contains(value.message(), "'four'"));

  const ConfigError into_scalar =
      config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"plan.mode.x=1"});
  check_at(into_scalar, "--set plan.mode.x=1", 0, 0);

  const ConfigError bad_yaml =
      config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"search.packing_fwd=[reuse"});
  check_at(bad_yaml, "--set search.packing_fwd=[reuse", 0, 0);
  CHECK(contains(bad_yaml.message(), "malformed value"));
}

TEST_CASE("error: override without '='") {
  const ConfigError e = config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"plan.gpus4"});
  check_at(e, "--set plan.gpus4", 0, 0);
  CHECK(contains(e.message(), "'plan.gpus4'"));
  CHECK(contains(e.hint(), "plan.gpus=4"));
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"=4"}), "--set =4", 0, 0);
  check_at(config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", {"plan..gpus=4"}), "--set plan..gpus=4",
           0, 0);
}

TEST_CASE("error: an unreadable config file") {
  try {
    load_config("/no/such/config.yaml");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.loc().file == "/no/such/config.yaml");
    CHECK_FALSE(e.hint().empty());
  }
}

TEST_CASE("errors in machine files point into the machine file") {
  TempDir dir;
  const std::string machine = dir.write("m.yaml", "gpus: 4\ngpu_memory: 10GiB\nbw_msg: fast\n");
  try {
    load_machine_file(machine);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    check_at(e, machine, 3, 9);
  }
  const std::string loop = dir.write("loop.yaml", "file: loop.yaml\n");
  CHECK_THROWS_AS(load_machine_file(loop), ConfigError);
  const std::string cfg =
      dir.write("c.yaml", kModel + "machine: {file: m.yaml}\nplan: {mode: vPP, gpus: 2, minibatch: 8}\n");
  try {
    load_config(cfg);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    check_at(e, dir / "m.yaml", 3, 9);
  }
}

TEST_CASE("hostile input: alias bombs and deep nesting fail cleanly") {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'k'; ++c) {
    const std::string alias = std::string("*") + static_cast<char>(c - 1);
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += (i ? ", " : "") + alias;
    bomb += "]\n";
  }
  CHECK_THROWS_AS(load_config_text(bomb, "bomb.yaml"), ConfigError);
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  CHECK_THROWS_AS(load_config_text(deep, "deep.yaml"), ConfigError);
}

TEST_CASE("hostile input: an alias inside its own anchor is a located error, not a stack overflow") {
  // The fuzzer's find (CI, stop 19): `extra: &anchor {more: *anchor}` makes yaml-cpp's graph a cycle, and the
  // tree builder recursed until the stack ran out. Every place a list or mapping can hold itself:
  const std::vector<std::pair<std::string, int>> cycles = {
      {kModel + "extra: &anchor\n  more: *anchor\n", 3},                      // a mapping holding itself
      {kModel + "plan: &p [1, *p]\n", 3},                                     // a list holding itself
      {"model: &m\n  profile: model.json\n  nested:\n    - inner: *m\n", 1},  // two levels down
  };
  for (const auto& [yaml, line] : cycles) {
    const ConfigError e = config_error(yaml);
    INFO(yaml);
    CHECK(contains(e.message(), "recursive anchor"));
    check_at(e, "bad.yaml", line, e.loc().column);
  }
  // The same in an override value, located at the --set text.
  const ConfigError o = config_error(kModel, {"plan.packs=&x [*x]"});
  CHECK(contains(o.message(), "recursive anchor"));
  CHECK(o.loc().file == "--set plan.packs=&x [*x]");
  // An alias used after its anchor's node ends is fine, however often.
  const YamlNode ok = parse_yaml_tree("a: &a [1, 2]\nb: [*a, *a]\nc: *a\n", "ok.yaml");
  REQUIRE(ok.entries.size() == 3);
  CHECK(ok.entries[1].value.items.size() == 2);
  CHECK(ok.entries[2].value.items[1].scalar == "2");
}

TEST_CASE("flow_yaml: a node's canonical flow text reads back to the same tree") {
  const YamlNode doc = parse_yaml_tree(
      "a: [1, 2.5, x]\nb: {c: d, e: [f]}\nq: \"4\"\nn: ~\nl:\n  - - p\n    - r\nt: !!str 7\n", "f.yaml");
  std::vector<std::string> flows;
  for (const YamlEntry& e : doc.entries) flows.push_back(flow_yaml(e.value));
  CHECK(flows[0] == "[1, 2.5, x]");
  CHECK(flows[1] == "{c: d, e: [f]}");
  CHECK(flows[2] == "\"4\"");  // a quoted string stays a string
  CHECK(flows[3] == "~");
  CHECK(flows[4] == "[[p, r]]");  // block style written, flow text out
  for (std::size_t i = 0; i < doc.entries.size(); ++i) {
    INFO(flows[i]);
    const YamlNode back = parse_yaml_tree(flows[i], "back.yaml");
    CHECK(back.kind == doc.entries[i].value.kind);
    CHECK(flow_yaml(back) == flows[i]);
  }
}

TEST_CASE("options.prefetch_buffers: default 2, at least 2") {
  const RunConfig c = load_config_text(
      kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\noptions: {prefetch: true, prefetch_buffers: 3}\n", "ok.yaml");
  CHECK(c.options.prefetch_buffers == 3);
  const RunConfig d = load_config_text(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\n", "ok.yaml");
  CHECK(d.options.prefetch_buffers == 2);
  const ConfigError e =
      config_error(kModel + "plan: {mode: vPP, gpus: 2, minibatch: 8}\noptions: {prefetch_buffers: 1}\n");
  check_at(e, "bad.yaml", 4, 29);
}

// ---- harmony-run configs (load_train_config) ----

namespace {
ConfigError train_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return config_error(yaml, overrides, [](const std::string& y, const std::vector<std::string>& o) {
    load_train_config_text(y, "run.yaml", o);
  });
}
const std::string kTrain =
    "model:\n"
    "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
    "  seq_len: 32\n"
    "plan: {mode: harmony-pp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 1, pack_size: 1}\n"
    "train: {steps: 5}\n";
}  // namespace

TEST_CASE("configs/run/default.yaml: the bundled harmony-run default") {
  const TrainConfig c = load_train_config(source_path("configs/run/default.yaml"));
  REQUIRE(c.model.gpt2.has_value());
  CHECK(c.model.gpt2->n_layer == 8);
  CHECK(c.model.seq_len == 32);
  CHECK(c.machine.gpus == 4);
  CHECK(c.machine.gpu_memory_bytes == kMiB);
  CHECK(c.plan.gpus == 4);
  CHECK(c.train.data.path.empty());  // the synthetic task
  CHECK(c.cost_model == CostModelKind::Native);
}

TEST_CASE("a minimal harmony-run config gets the documented defaults") {
  const TrainConfig c = load_train_config_text(kTrain, "run.yaml");
  CHECK(c.device == "cpu");
  CHECK(c.device_loc.str() == "run.yaml");  // defaulted: the file
  // A device is a name core does not check (harmony-run checks it against backend's registry); its location is kept
  // for that error: the value in the file, or the --set that gave it.
  const TrainConfig t = load_train_config_text(kTrain + "device: tpu\n", "run.yaml");
  CHECK(t.device == "tpu");
  CHECK(t.device_loc.str() == "run.yaml:6:9");
  CHECK(load_train_config_text(kTrain, "run.yaml", {"device=cuda"}).device_loc.str() == "--set device=cuda");
  CHECK(c.model.init_seed == 1);
  CHECK(c.train.steps == 5);
  CHECK(c.train.lr == 1e-3);
  CHECK(c.train.weight_decay == 0.0);
  CHECK(c.train.data.synthetic_tokens == 65536);
  CHECK(c.checkpoint.dir.empty());
  CHECK(c.checkpoint.keep == 2);
  CHECK(c.machine.name == "paper-1080ti");
  const TrainConfig o =
      load_train_config_text(kTrain, "dir/run.yaml", {"train.data=tokens.bin", "checkpoint.dir=ck", "train.lr=0.01"});
  CHECK(o.train.data.path == "dir/tokens.bin");  // relative to the config's folder
  CHECK(o.checkpoint.dir == "dir/ck");
  CHECK(o.train.lr == 0.01);
}

TEST_CASE("harmony-run config errors are located and explained") {
  CHECK(contains(train_error(kTrain + "trian: {}\n").what(), "did you mean 'train'"));
  const ConfigError heads = train_error(kTrain, {"model.gpt2.n_embd=66"});
  CHECK(contains(heads.what(), "not a multiple of n_head"));
  CHECK(contains(train_error(kTrain, {"model.seq_len=65"}).what(), "exceeds model.gpt2.max_seq_len"));
  CHECK(contains(train_error(kTrain, {"model.weights=w.safetensors"}).what(), "both given"));
  CHECK(contains(train_error(kTrain, {"model.gpt2="}).what(), "needs model.gpt2"));
  CHECK(contains(train_error(kTrain, {"train.steps=0"}).what(), "at least 1"));
  CHECK(contains(train_error(kTrain, {"train.beta1=1"}).what(), "out of range"));
  CHECK(contains(train_error(kTrain, {"train.data={file: a.bin, synthetic_tokens: 9}"}).what(), "both given"));
  CHECK(contains(train_error(kTrain, {"options.unequal_microbatches=true"}).what(), "not supported by harmony-run"));
  CHECK(contains(train_error(kTrain, {"plan.u_fwd=3"}).what(), "does not divide"));
  CHECK(contains(train_error(kTrain, {"model.gpt2.vocab_size=70000"}).what(), "65536"));
  const ConfigError missing = train_error(
      "model: {gpt2: {vocab_size: 8, max_seq_len: 4, n_layer: 1, n_head: 1, n_embd: 4}, seq_len: 4}\n"
      "plan: {mode: harmony-pp, gpus: 1, minibatch: 1}\n");
  CHECK(contains(missing.what(), "missing required section 'train'"));
  check_at(train_error(kTrain + "checkpoint: {every: -1}\n"), "run.yaml", 6, 21);
}

TEST_CASE("harmony-run train.dtype: fp32 by default, bf16 on request, a located error otherwise") {
  CHECK(load_train_config_text(kTrain, "run.yaml").train.dtype == "fp32");
  CHECK(load_train_config_text(kTrain, "run.yaml", {"train.dtype=bf16"}).train.dtype == "bf16");
  const std::string bf16 =
      "model:\n"
      "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
      "  seq_len: 32\n"
      "plan: {mode: harmony-pp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 1, pack_size: 1}\n"
      "train: {steps: 5, dtype: ";
  CHECK(load_train_config_text(bf16 + "bf16}\n", "run.yaml").train.dtype == "bf16");
  const ConfigError bad = train_error(bf16 + "fp16}\n");
  CHECK(contains(bad.what(), "train.dtype must be fp32 or bf16, got 'fp16'"));
  check_at(bad, "run.yaml", 5, 26);  // at the value
  CHECK(contains(train_error(kTrain, {"train.dtype=3"}).what(), "train.dtype"));
}

TEST_CASE("RunConfig::inputs lists every file the config was built from, then its profile") {
  const std::string file = source_path("configs/examples/bert_large_search.yaml");
  const RunConfig c = load_config(file);
  CHECK(c.inputs == std::vector<std::string>{file, c.model.profile_path});  // machine: a preset, no file
  const std::string machine = source_path("configs/machines/rtx4090-4x.yaml");
  const RunConfig m = load_config(file, {"machine=" + machine});
  REQUIRE(m.inputs.size() == 3);
  CHECK(m.inputs[0] == file);
  CHECK(std::filesystem::equivalent(m.inputs[1], machine));
  CHECK(m.inputs[2] == m.model.profile_path);
  // from text: no config file, only what it names
  const RunConfig t = load_config_text(
      "model: {profile: configs/profiles/bert_large.json}\n"
      "plan: {mode: harmony-pp, gpus: 1, minibatch: 8}\n",
      source_path("inline.yaml"));
  CHECK(t.inputs == std::vector<std::string>{t.model.profile_path});
}

TEST_CASE("harmony-run baselines are checked under their own rules, located at the key, with a hint") {
  const std::string head =
      "model:\n"
      "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
      "  seq_len: 32\n"
      "plan:\n"
      "  mode: ";
  auto yaml = [&](const std::string& mode, int gpus, int minibatch, int u_fwd, int u_bwd) {
    return head + mode + "\n  gpus: " + std::to_string(gpus) + "\n  minibatch: " + std::to_string(minibatch) +
           "\n  u_fwd: " + std::to_string(u_fwd) + "\n  u_bwd: " + std::to_string(u_bwd) + "\ntrain: {steps: 5}\n";
  };
  // a baseline runs one microbatch, plan.u_bwd: u_fwd = 3 (which harmony-pp's D % u rule refuses) is not read
  CHECK(load_train_config_text(yaml("dp-swap", 2, 8, 3, 2), "run.yaml").plan.kind == plan_kind("dp-swap"));
  CHECK(load_train_config_text(yaml("pp-swap", 2, 8, 3, 4), "run.yaml").plan.kind == plan_kind("pp-swap"));
  // the baseline's own rule: u divides D/N = 4, not D = 8 (harmony-pp's rule would take u = 8)
  const ConfigError share = train_error(yaml("dp-swap", 2, 8, 8, 8));
  check_at(share, "run.yaml", 9, 10);  // at plan.u_bwd's value
  CHECK(share.message() ==
        "plan.u_bwd = 8 does not divide every GPU's share of minibatch 8: dp-swap over 2 GPUs gives 4 samples per GPU, "
        "and each share must be a multiple of u");
  CHECK(contains(share.hint(), "sizes that divide: 1, 2, 4"));
  CHECK_FALSE(contains(share.hint(), "unequal_microbatches"));  // neither harmony-run nor a baseline has it
  // N divides D, at plan.gpus
  const ConfigError split = train_error(yaml("zero-infinity", 3, 8, 1, 1));
  check_at(split, "run.yaml", 6, 9);
  CHECK(split.message() == "zero-infinity splits the minibatch evenly: 3 GPUs do not divide minibatch 8");
  CHECK(contains(split.hint(), "1, 2, 4, 8"));
  // lohan: u = D/N
  const ConfigError lohan = train_error(yaml("lohan", 2, 8, 2, 2));
  check_at(lohan, "run.yaml", 9, 10);
  CHECK(contains(lohan.message(), "one microbatch"));
  CHECK(lohan.hint() == "use plan.u_bwd = 4 (minibatch / gpus)");
  // pp-swap: u divides D
  const ConfigError pp = train_error(yaml("pp-swap", 2, 8, 3, 3));
  check_at(pp, "run.yaml", 9, 10);
  CHECK(contains(pp.message(), "pp-swap needs D % u == 0"));
  // search.u_bwd entries too (what --plan auto would try)
  const ConfigError entry = train_error(yaml("l2l", 2, 8, 2, 2) + "search: {u_bwd: [2, 8]}\n");
  check_at(entry, "run.yaml", 11, 21);
  CHECK(contains(entry.message(), "search.u_bwd entry = 8"));
  // harmony-run's Harmony plans: the runtime's equal microbatches, no unequal_microbatches escape in the hint
  const ConfigError harmony = train_error(kTrain, {"plan.u_fwd=3"});
  CHECK(contains(harmony.message(), "harmony-pp needs D % u == 0"));
  CHECK_FALSE(contains(harmony.hint(), "unequal_microbatches"));
}

TEST_CASE("harmony-run plan.activations: a baseline's activation policy, located errors") {
  const std::string dp =
      "model:\n"
      "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
      "  seq_len: 32\n"
      "plan: {mode: dp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, activations: ";
  CHECK(load_train_config_text(dp + "keep}\ntrain: {steps: 5}\n", "run.yaml").plan.knobs.activation_policy ==
        ActivationPolicy::Keep);
  const TrainConfig c = load_train_config_text(dp + "checkpoint}\ntrain: {steps: 5}\n", "run.yaml");
  CHECK(c.plan.knobs.activation_policy == ActivationPolicy::Checkpoint);
  CHECK(c.plan.kind == plan_kind("dp-swap"));
  // the default is checkpoint
  CHECK(load_train_config_text(kTrain, "run.yaml").plan.knobs.activation_policy == ActivationPolicy::Checkpoint);
  const ConfigError bad = train_error(dp + "kep}\ntrain: {steps: 5}\n");
  CHECK(contains(bad.what(), "unknown plan.activations 'kep'"));
  CHECK(contains(bad.what(), "did you mean 'keep'"));
  check_at(bad, "run.yaml", 4, 79);  // at the value
  // Harmony recomputes by design: the key is refused on a Harmony mode
  const ConfigError harmony = train_error(kTrain, {"plan.activations=keep"});
  CHECK(contains(harmony.what(),
                 "plan.activations applies to plan.mode: dp-swap, pp-swap, zero-infinity, zero3-opt-offload, "
                 "fsdp-offload, zero-offload, l2l, lohan, zero2, fsdp, zero3, host-stream or resident only"));
}

TEST_CASE("search.offload: auto by default, cpu or nvme when given, a located error otherwise") {
  const std::string plan = "plan: {mode: harmony-pp, gpus: 1, minibatch: 8}\n";
  CHECK(load_config_text(kModel + plan, "dir/a.yaml").search.offload == SearchSpec::Offload::Auto);
  CHECK(load_config_text(kModel + plan + "search: {offload: nvme}\n", "dir/n.yaml").search.offload ==
        SearchSpec::Offload::Nvme);
  CHECK(load_config_text(kModel + plan, "dir/c.yaml", {"search.offload=cpu"}).search.offload ==
        SearchSpec::Offload::Cpu);
  const ConfigError e = config_error(kModel + plan + "search: {offload: nvm}\n");
  CHECK(e.loc().line == 4);
  CHECK(std::string(e.what()).find("unknown search.offload 'nvm'") != std::string::npos);
  CHECK(std::string(e.what()).find("nvme") != std::string::npos);
}

TEST_CASE("plan.swap and search.swap: dp-swap's and pp-swap's swap timing, search.swap defaulting to plan.swap") {
  const std::string dp =
      "model:\n"
      "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
      "  seq_len: 32\n"
      "plan: {mode: dp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, swap: ";
  const TrainConfig od = load_train_config_text(dp + "on-demand}\ntrain: {steps: 5}\n", "run.yaml");
  CHECK(od.plan.knobs.swap == SwapTiming::OnDemand);
  CHECK(od.search.swap == SwapTiming::OnDemand);  // --plan auto searches the microbatch under it
  CHECK(load_train_config_text(kTrain, "run.yaml").plan.knobs.swap == SwapTiming::Scheduled);  // the default
  const ConfigError bad = train_error(dp + "ondemand}\ntrain: {steps: 5}\n");
  CHECK(contains(bad.what(), "unknown plan.swap 'ondemand'"));
  CHECK(contains(bad.what(), "did you mean 'on-demand'"));
  check_at(bad, "run.yaml", 4, 72);  // at the value
  // a kind whose timing is its own refuses the key
  const ConfigError harmony = train_error(kTrain, {"plan.swap=on-demand"});
  CHECK(contains(harmony.what(), "plan.swap applies to plan.mode: dp-swap or pp-swap only"));
  // harmony-sim: search.swap for compare and sweeps, on any mode
  const std::string plan = "plan: {mode: harmony-pp, gpus: 1, minibatch: 8}\n";
  CHECK(load_config_text(kModel + plan, "a.yaml").search.swap == SwapTiming::Scheduled);
  CHECK(load_config_text(kModel + plan + "search: {swap: on-demand}\n", "b.yaml").search.swap == SwapTiming::OnDemand);
  const ConfigError e = config_error(kModel + plan + "search: {swap: lazy}\n");
  CHECK(e.loc().line == 4);
  CHECK(contains(e.what(), "unknown search.swap 'lazy'"));
}

TEST_CASE("search.zero3: compare's and sweeps' ZeRO-3 knobs, defaulting to plan.zero3, located errors") {
  const std::string plan = "plan: {mode: harmony-pp, gpus: 1, minibatch: 8}\n";
  const SearchSpec d = load_config_text(kModel + plan, "a.yaml").search;
  CHECK_FALSE(d.zero3.pipeline_read);
  CHECK(d.zero3.module_latency_s == doctest::Approx(200e-6));
  const SearchSpec s =
      load_config_text(kModel + plan + "search: {zero3: {pipeline_read: true, pipeline_write: true, bucket: 1e6}}\n",
                       "b.yaml")
          .search;
  CHECK(s.zero3.pipeline_read);
  CHECK(s.zero3.pipeline_write);
  CHECK(s.zero3.bucket_elements == doctest::Approx(1e6));
  // --set reaches it (compare --deepspeed's rows set it from offload_optimizer.pipeline_read / pipeline_write)
  CHECK(load_config_text(kModel + plan, "c.yaml", {"search.zero3.pipeline_write=true"}).search.zero3.pipeline_write);
  const ConfigError e = config_error(kModel + plan + "search: {zero3: {pipeline: true}}\n");
  CHECK(e.loc().line == 4);
  CHECK(contains(e.what(), "search.zero3"));
  CHECK(contains(e.hint(), "pipeline_read"));
}
