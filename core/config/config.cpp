// The YAML config loader's top: the sections of harmony-sim and harmony-run configs (model, plan, options, search,
// train, data, checkpoint), `--set a.b=value` overrides, the cross-section checks, and the public loaders
// (load_config, load_train_config, load_model, plan_from_spec). The located YAML tree and quantity getters are
// config_yaml.cpp, machines and presets config_machine.cpp (config_internal.hpp); docs/config.md keeps the schema.
#include "core/config/config.hpp"
#include "core/config/config_as_kind.hpp"
#include "core/config/config_internal.hpp"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/base/input_file.hpp"
#include "core/base/units.hpp"
#include "core/model/analytic.hpp"
#include "core/model/profile.hpp"
#include "core/plan/packing.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/baselines/baselines.hpp"

namespace harmony::core {

using namespace config_detail;  // NOLINT(google-build-using-namespace): the loader's own internals

namespace {

// ------------------------------------------------------------------------------------------------
// Overrides: "a.b.c=value", the value parsed as YAML (flow style allowed).

SourceLoc override_loc(const std::string& text) { return SourceLoc{"--set " + text, 0, 0}; }

constexpr const char* kOverrideHint =
    "write --set section.key=value, e.g. --set plan.gpus=4, --set machine.gpu_memory=8GiB or "
    "--set search.packing_fwd=[balanced_time, reuse]";

void apply_override(Node& root, const std::string& text) {
  const SourceLoc loc = override_loc(text);
  const auto eq = text.find('=');
  if (eq == std::string::npos) fail(loc, fmt::format("override '{}' has no '='", text), kOverrideHint);
  std::string path_text = text.substr(0, eq);
  path_text.erase(0, path_text.find_first_not_of(" \t"));
  path_text.erase(path_text.find_last_not_of(" \t") + 1);
  std::vector<std::string> path;
  for (std::size_t start = 0;;) {
    const auto dot = path_text.find('.', start);
    path.push_back(path_text.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const std::string& part : path) {
    if (part.empty())
      fail(loc, fmt::format("override path '{}' has an empty part", path_text),
           "write dotted key names, e.g. plan.gpus or machine.gpu_memory");
  }
  Node value =
      parse_yaml_tree(text.substr(eq + 1), loc.file, loc, fmt::format("malformed value in override '{}'", text));

  if (root.kind == Node::Kind::Null) {
    root.kind = Node::Kind::Map;
    root.loc = loc;
  }
  if (root.kind != Node::Kind::Map)
    fail(loc, fmt::format("cannot apply override '{}': the config is not a mapping", text), kOverrideHint);
  Node* cur = &root;
  std::string walked;
  for (std::size_t i = 0; i < path.size(); ++i) {
    Entry* entry = nullptr;
    for (Entry& e : cur->entries) {
      if (e.key == path[i]) entry = &e;
    }
    if (!entry) {
      cur->entries.push_back(Entry{path[i], loc, Node{}});
      entry = &cur->entries.back();
      entry->value.loc = loc;
    }
    walked = qualify(walked, path[i]);
    if (i + 1 == path.size()) {
      entry->value = std::move(value);
      return;
    }
    Node& next = entry->value;
    if (next.kind == Node::Kind::Null) {
      next.kind = Node::Kind::Map;
      next.loc = loc;
      // A config without `machine:` runs on the default preset; overriding one key keeps that base.
      if (i == 0 && path[0] == "machine" && path[1] != "preset" && path[1] != "file") {
        Node preset;
        preset.kind = Node::Kind::Scalar;
        preset.scalar = std::string(kDefaultPreset);
        preset.loc = loc;
        next.entries.push_back(Entry{"preset", loc, std::move(preset)});
      }
    } else if (next.kind == Node::Kind::Scalar && i == 1 && path[0] == "model" && path[1] == "analytic") {
      // `analytic: NAME` becomes {preset: NAME} so single shape keys can be overridden.
      Node base = next;
      next = Node{};
      next.kind = Node::Kind::Map;
      next.loc = base.loc;
      next.entries.push_back(Entry{"preset", base.loc, std::move(base)});
    } else if (next.kind == Node::Kind::Scalar && i == 0 && path[0] == "machine") {
      // `machine: NAME` becomes {preset: NAME} (or {file: PATH}) so single keys can be overridden.
      Node base = next;
      next = Node{};
      next.kind = Node::Kind::Map;
      next.loc = base.loc;
      const std::string key = find_preset(base.scalar) ? "preset" : "file";
      next.entries.push_back(Entry{key, base.loc, std::move(base)});
    }
    if (next.kind != Node::Kind::Map)
      fail(loc, fmt::format("cannot apply override '{}': {} is {}, not a mapping", text, walked, describe(next)),
           kOverrideHint);
    cur = &next;
  }
}

// ------------------------------------------------------------------------------------------------
// Config sections

const std::vector<std::string> kTopKeys = {"model", "machine", "cost_model", "plan", "options", "search"};
const std::vector<std::string> kModelKeys = {"profile", "analytic"};
const std::vector<std::string> kPlanKeys = {"mode",  "gpus",      "minibatch", "u_fwd",
                                            "u_bwd", "pack_size", "packs_fwd", "packs_bwd"};
const std::vector<std::string> kOptionKeys = {"prefetch", "prefetch_buffers", "unequal_microbatches"};
const std::vector<std::string> kSearchKeys = {"packing_fwd",  "packing_bwd", "top_k",         "ubatch_step",
                                              "smaller_ufwd", "fit_rule",    "u_fwd",         "u_bwd",
                                              "threads",      "pack_counts", "packs_per_gpu", "offload"};
const std::vector<std::string> kModeNames = {"harmony-pp", "harmony-dp", "vPP", "vDP"};

// Where plan values were written, for the checks that combine sections.
struct PlanLocs {
  SourceLoc gpus, minibatch, u_fwd, u_bwd;
};

struct SearchLocs {
  std::vector<SourceLoc> u_fwd, u_bwd;
};

PlanKind parse_mode(const Node& v) {
  const std::string hint_tail = "modes: harmony-pp, harmony-dp (the paper's aliases vPP, vDP)";
  const std::string& s = expect_scalar(v, "plan.mode", "a mode name", hint_tail);
  if (s == "harmony-pp" || s == "vPP") return PlanKind::HarmonyPP;
  if (s == "harmony-dp" || s == "vDP") return PlanKind::HarmonyDP;
  const std::string best = closest_match(s, kModeNames);
  fail(v.loc, fmt::format("unknown plan.mode '{}'", s),
       (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) + hint_tail);
}

constexpr const char* kPacksHint =
    "packs are inclusive [first, last] layer ranges, contiguous and ascending from layer 0, e.g. "
    "packs_bwd: [[0, 6], [7, 13], [14, 27]]";

Packs parse_packs(const Node& v, const std::string& what, bool allow_empty) {
  if (v.kind != Node::Kind::Seq)
    fail(v.loc, fmt::format("{} must be a list of packs, got {}", what, describe(v)), kPacksHint);
  if (v.items.empty() && !allow_empty) fail(v.loc, fmt::format("{} must list at least one pack", what), kPacksHint);
  Packs packs;
  for (std::size_t i = 0; i < v.items.size(); ++i) {
    const Node& item = v.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Seq || item.items.empty() || item.items.size() > 2)
      fail(item.loc, fmt::format("{} must be [first, last] (an inclusive layer range), got {}", name, describe(item)),
           kPacksHint);
    LayerRange r;
    r.first = get_int(item.items.front(), name + " first layer", 0);
    r.last = get_int(item.items.back(), name + " last layer", 0);
    if (r.first > r.last)
      fail(item.loc, fmt::format("{} = [{}, {}] is reversed", name, r.first, r.last),
           "write [first, last] with first <= last");
    const int expected = packs.empty() ? 0 : packs.back().last + 1;
    if (r.first != expected) {
      const std::string what_wrong =
          r.first > expected ? (r.first - 1 == expected ? fmt::format("skips layer {}", expected)
                                                        : fmt::format("skips layers {}..{}", expected, r.first - 1))
                             : fmt::format("overlaps the previous pack at layer {}", r.first);
      fail(item.loc,
           fmt::format("{} = [{}, {}] {}: packs must be contiguous and ascending, so it must start at layer {}", name,
                       r.first, r.last, what_wrong, expected),
           kPacksHint);
    }
    packs.push_back(r);
  }
  return packs;
}

PlanSpec parse_plan(const Node& map, const SourceLoc& plan_key_loc, PlanLocs& locs) {
  check_keys(map, "plan", kPlanKeys);
  PlanSpec plan;
  plan.loc = plan_key_loc;
  const Entry& mode = require(map, "mode", "plan", plan_key_loc, "add `mode: harmony-pp` (or harmony-dp) under plan:");
  plan.kind = parse_mode(mode.value);
  const Entry& gpus = require(map, "gpus", "plan", plan_key_loc, "add `gpus: N` (GPUs the plan uses) under plan:");
  plan.gpus = get_int(gpus.value, "plan.gpus", 1);
  locs.gpus = gpus.value.loc;
  const Entry& minibatch =
      require(map, "minibatch", "plan", plan_key_loc, "add `minibatch: D` (samples per iteration) under plan:");
  plan.minibatch = get_int(minibatch.value, "plan.minibatch", 1);
  locs.minibatch = minibatch.value.loc;

  const Entry* u_fwd = find(map, "u_fwd");
  const Entry* u_bwd = find(map, "u_bwd");
  if (u_fwd && !u_bwd)
    fail(u_fwd->key_loc, "plan.u_fwd is given without plan.u_bwd",
         "give both microbatch sizes (e.g. u_fwd: 8 and u_bwd: 8), or neither for a search");
  if (u_bwd && !u_fwd)
    fail(u_bwd->key_loc, "plan.u_bwd is given without plan.u_fwd",
         "give both microbatch sizes (e.g. u_fwd: 8 and u_bwd: 8), or neither for a search");
  if (u_fwd) {
    plan.u_fwd = get_int(u_fwd->value, "plan.u_fwd", 1);
    plan.u_bwd = get_int(u_bwd->value, "plan.u_bwd", 1);
    locs.u_fwd = u_fwd->value.loc;
    locs.u_bwd = u_bwd->value.loc;
  }

  const Entry* pack_size = find(map, "pack_size");
  const Entry* packs_fwd = find(map, "packs_fwd");
  const Entry* packs_bwd = find(map, "packs_bwd");
  if (pack_size && packs_bwd)
    fail(packs_bwd->key_loc, "plan.pack_size and plan.packs_bwd are both given",
         fmt::format("give exactly one: pack_size: P (backward packs of P layers counted from the end) or "
                     "packs_bwd: [[first, last], ...]; pack_size is at {}",
                     pack_size->key_loc.str()));
  if (packs_fwd && !packs_bwd)
    fail(packs_fwd->key_loc, "plan.packs_fwd needs plan.packs_bwd",
         "give packs_bwd too (packs_fwd covers the layers before the last backward pack), or drop packs_fwd");
  if (pack_size) plan.pack_size = get_int(pack_size->value, "plan.pack_size", 1);
  if (packs_bwd) {
    plan.packs_bwd = parse_packs(packs_bwd->value, "plan.packs_bwd", false);
    const int fwd_end = plan.packs_bwd->back().first;  // forward packs cover layers [0, fwd_end)
    if (packs_fwd) {
      plan.packs_fwd = parse_packs(packs_fwd->value, "plan.packs_fwd", true);
      const int covered = plan.packs_fwd->empty() ? 0 : plan.packs_fwd->back().last + 1;
      if (covered != fwd_end) {
        const std::string expected = fwd_end == 0 ? std::string("no layers ([]), as packs_bwd has a single pack")
                                                  : fmt::format("layers 0..{}", fwd_end - 1);
        fail(packs_fwd->value.loc,
             fmt::format("plan.packs_fwd must cover {}: the layers before the last backward pack", expected),
             "the last backward pack runs forward and backward in one task, so forward packs stop before it");
      }
    } else {
      plan.packs_fwd = Packs(plan.packs_bwd->begin(), plan.packs_bwd->end() - 1);
    }
  }
  return plan;
}

// `prefetch_default`: the value when options.prefetch is not given (harmony-sim: on with the native cost model,
// off with the paper's reference model; harmony-run: off).
Options parse_options(const Node* map, bool prefetch_default) {
  Options o;
  o.prefetch = prefetch_default;
  if (!map) return o;
  check_keys(*map, "options", kOptionKeys);
  if (const Entry* e = find(*map, "prefetch")) o.prefetch = get_bool(e->value, "options.prefetch");
  if (const Entry* e = find(*map, "prefetch_buffers"))
    o.prefetch_buffers = get_int(e->value, "options.prefetch_buffers", 2);
  if (const Entry* e = find(*map, "unequal_microbatches"))
    o.unequal_microbatches = get_bool(e->value, "options.unequal_microbatches");
  return o;
}

std::vector<std::string> parse_methods(const Entry& e, const std::string& what, bool forward) {
  std::vector<std::string> valid;
  for (const std::string& name : packing_method_names()) {
    if (forward || name != "reuse") valid.push_back(name);
  }
  const std::string example = forward ? "[balanced_time, reuse]" : "[balanced_time]";
  std::vector<std::string> methods;
  for (const Node* item : get_list(e.value, what, fmt::format("{}: {}", what.substr(what.rfind('.') + 1), example))) {
    const std::string& name =
        expect_scalar(*item, what + " entries", "a packing method name", fmt::format("methods: {}", join(valid)));
    if (!forward && name == "reuse")
      fail(item->loc, fmt::format("'reuse' in {} is a forward-only packing method", what),
           fmt::format("backward methods: {}", join(valid)));
    if (!is_packing_method(name))
      fail(item->loc, fmt::format("unknown packing method '{}' in {}", name, what),
           suggestion_hint(name, valid, "methods"));
    if (std::find(methods.begin(), methods.end(), name) != methods.end())
      fail(item->loc, fmt::format("packing method '{}' is listed twice in {}", name, what), "list each method once");
    methods.push_back(name);
  }
  if (methods.empty())
    fail(e.key_loc, fmt::format("{} must list at least one packing method", what),
         fmt::format("e.g. {}, or remove the key for the default methods", example));
  return methods;
}

std::vector<int> parse_sizes(const Entry& e, const std::string& what, std::vector<SourceLoc>& locs) {
  std::vector<int> sizes;
  for (const Node* item : get_list(e.value, what, fmt::format("{}: [4, 8, 16]", what.substr(what.rfind('.') + 1)))) {
    sizes.push_back(get_int(*item, what + " entries", 1));
    locs.push_back(item->loc);
  }
  return sizes;
}

// `pack_counts_default`: the value when search.pack_counts is not given (harmony-sim: wide with the native cost
// model, the paper's minimum with the reference model; harmony-run: minimum).
SearchSpec parse_search(const Node* map, SearchLocs& locs, PackCounts pack_counts_default) {
  SearchSpec s;
  s.pack_counts = pack_counts_default;
  if (!map) return s;
  check_keys(*map, "search", kSearchKeys);
  if (const Entry* e = find(*map, "pack_counts")) {
    const std::string& v =
        expect_scalar(e->value, "search.pack_counts", "a pack-count rule", "pack_counts: minimum or wide");
    if (v == "minimum") {
      s.pack_counts = PackCounts::Minimum;
    } else if (v == "wide") {
      s.pack_counts = PackCounts::Wide;
    } else {
      fail(e->value.loc, fmt::format("unknown search.pack_counts '{}'", v),
           suggestion_hint(v, {"minimum", "wide"}, "pack-count rules"));
    }
  }
  if (const Entry* e = find(*map, "offload")) {
    const std::string& v = expect_scalar(e->value, "search.offload", "an offload tier", "offload: auto, cpu or nvme");
    const std::vector<std::string> names = {"auto", "cpu", "nvme"};
    const auto it = std::find(names.begin(), names.end(), v);
    if (it == names.end())
      fail(e->value.loc, fmt::format("unknown search.offload '{}'", v), suggestion_hint(v, names, "offload tiers"));
    s.offload = static_cast<SearchSpec::Offload>(it - names.begin());
  }
  if (const Entry* e = find(*map, "packs_per_gpu")) s.packs_per_gpu = get_int(e->value, "search.packs_per_gpu", 0);
  if (const Entry* e = find(*map, "packing_fwd")) s.packing_fwd = parse_methods(*e, "search.packing_fwd", true);
  if (const Entry* e = find(*map, "packing_bwd")) s.packing_bwd = parse_methods(*e, "search.packing_bwd", false);
  if (const Entry* e = find(*map, "top_k")) {
    s.top_k = get_int(e->value, "search.top_k", -1);
    if (s.top_k == 0)
      fail(e->value.loc, "search.top_k must be -1 (keep every candidate) or at least 1, got 0",
           "e.g. top_k: 5, or top_k: -1 to keep all");
  }
  if (const Entry* e = find(*map, "ubatch_step")) s.ubatch_step = get_int(e->value, "search.ubatch_step", 1);
  if (const Entry* e = find(*map, "smaller_ufwd")) s.smaller_ufwd = get_bool(e->value, "search.smaller_ufwd");
  if (const Entry* e = find(*map, "fit_rule")) s.fit_rule = get_bool(e->value, "search.fit_rule");
  if (const Entry* e = find(*map, "u_fwd")) s.u_fwd = parse_sizes(*e, "search.u_fwd", locs.u_fwd);
  if (const Entry* e = find(*map, "u_bwd")) s.u_bwd = parse_sizes(*e, "search.u_bwd", locs.u_bwd);
  if (const Entry* e = find(*map, "threads")) s.threads = get_int(e->value, "search.threads", 0);
  return s;
}

// ------------------------------------------------------------------------------------------------
// Cross-section checks

// The plan rules (core/plan/plan_rules) for the kind the config runs, each problem located at the key it is
// about: plan.gpus, plan.minibatch, or the microbatch key or search entry that breaks it.
struct RuleCheck {
  PlanKind kind = PlanKind::HarmonyPP;  // a baseline's own kind for harmony-run's plan.mode: dp-swap, ...
  UnequalMicrobatches unequal = UnequalMicrobatches::Offered;
  bool uses_u_fwd = true;  // baselines run one microbatch size, plan.u_bwd (and search.u_bwd): u_fwd is not read
};

[[noreturn]] void fail_problem(const PlanProblem& p, const PlanLocs& plan_locs, const SourceLoc& u_loc) {
  fail(p.field == PlanField::Gpus        ? plan_locs.gpus
       : p.field == PlanField::Minibatch ? plan_locs.minibatch
                                         : u_loc,
       p.message, p.hint);
}

void check_plan(const RunConfig& cfg, const RuleCheck& rules, const PlanLocs& plan_locs,
                const SearchLocs& search_locs) {
  const PlanSpec& plan = cfg.plan;
  if (plan.gpus > cfg.machine.gpus)
    fail(plan_locs.gpus,
         fmt::format("plan.gpus = {} exceeds machine.gpus = {} (machine '{}')", plan.gpus, cfg.machine.gpus,
                     cfg.machine.name),
         fmt::format("use plan.gpus <= {}, or raise machine.gpus", cfg.machine.gpus));
  if (const auto p = split_problem(rules.kind, plan.gpus, plan.minibatch)) fail_problem(*p, plan_locs, plan.loc);
  auto check = [&](int u, const std::string& what, const SourceLoc& loc) {
    if (const auto p = microbatch_problem(rules.kind, plan.gpus, plan.minibatch, u, what, rules.unequal))
      fail_problem(*p, plan_locs, loc);
  };
  if (plan.u_fwd && rules.uses_u_fwd) check(*plan.u_fwd, "plan.u_fwd", plan_locs.u_fwd);
  if (plan.u_bwd) check(*plan.u_bwd, "plan.u_bwd", plan_locs.u_bwd);
  for (std::size_t i = 0; rules.uses_u_fwd && i < cfg.search.u_fwd.size(); ++i)
    check(cfg.search.u_fwd[i], "search.u_fwd entry", search_locs.u_fwd[i]);
  for (std::size_t i = 0; i < cfg.search.u_bwd.size(); ++i)
    check(cfg.search.u_bwd[i], "search.u_bwd entry", search_locs.u_bwd[i]);
}

// machine: absent -> the paper's testbed; a string -> preset or file; a mapping -> base + overrides.
MachineSpec parse_machine_section(const Node& root, const std::string& file, const std::string& base_dir) {
  if (const Entry* e = find(root, "machine")) {
    if (e->value.kind == Node::Kind::Scalar) return machine_from_reference(e->value.scalar, e->value.loc, base_dir, 0);
    if (e->value.kind == Node::Kind::Map)
      return machine_from_map(e->value, "machine", e->key_loc, base_dir, "custom", 0);
    fail(e->value.loc,
         fmt::format("machine must be a preset name, a file path or a mapping, got {}", describe(e->value)),
         "e.g. machine: paper-1080ti, machine: ../machines/box.yaml or machine: {preset: paper-1080ti, gpus: 4}");
  }
  return machine_from_preset(std::string(kDefaultPreset), SourceLoc{file, 0, 0}, 0);
}

// ------------------------------------------------------------------------------------------------
// model: {profile: PATH} or {analytic: NAME | {...}} (docs/config.md, "model")

const std::vector<std::string> kAnalyticKeys = {
    "preset",  "family",    "name",      "layers",  "hidden",       "heads",           "ffn",
    "seq_len", "vocab",     "tied_head", "head",    "labels",       "image_size",      "classes",
    "dtype",   "optimizer", "kernels",   "dropout", "ubatch_sizes", "layers_per_block"};
const std::vector<std::string> kFamilies = {"gpt", "bert", "resnet"};
const std::vector<std::string> kDTypes = {"fp32", "fp16", "bf16"};
const std::vector<std::string> kOptimizers = {"adam", "sgd", "momentum"};
const std::vector<std::string> kKernelStyles = {"eager", "fused", "flash"};
const std::vector<std::string> kBertHeads = {"mlm", "classifier"};
const std::vector<std::string> kGptHeads = {"lm", "none"};

// One of `names` (the enum value at the same index).
std::size_t get_choice(const Node& v, const std::string& what, const std::vector<std::string>& names,
                       std::string_view kind) {
  const std::string& s = expect_scalar(v, what, std::string(kind), fmt::format("{}: {}", kind, join(names)));
  const auto it = std::find(names.begin(), names.end(), s);
  if (it == names.end())
    fail(v.loc, fmt::format("unknown {} '{}'", what, s), suggestion_hint(s, names, std::string(kind)));
  return static_cast<std::size_t>(it - names.begin());
}

[[noreturn]] void fail_unknown_model_preset(const std::string& name, const SourceLoc& loc) {
  fail(loc, fmt::format("unknown analytic model preset '{}'", name),
       suggestion_hint(name, analytic_preset_names(), "presets") +
           "; or describe the shape: {family: gpt, layers: 24, hidden: 1024, heads: 16, seq_len: 1024, vocab: 50257}");
}

AnalyticSpec parse_analytic(const Entry& e) {
  const std::string what = "model.analytic";
  if (e.value.kind == Node::Kind::Scalar) {
    const auto preset = analytic_preset(e.value.scalar);
    if (!preset) fail_unknown_model_preset(e.value.scalar, e.value.loc);
    return *preset;
  }
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("{} must be a preset name or a mapping, got {}", what, describe(e.value)),
         "e.g. analytic: gpt2-medium, or analytic: {preset: gpt3-13b, dtype: fp16}, or analytic: {family: gpt, "
         "layers: 24, hidden: 1024, heads: 16, seq_len: 1024, vocab: 50257}");
  const Node& map = e.value;
  check_keys(map, what, kAnalyticKeys);
  AnalyticSpec spec;
  const Entry* preset = find(map, "preset");
  const Entry* family = find(map, "family");
  if (preset) {
    const std::string name = get_string(preset->value, what + ".preset");
    const auto p = analytic_preset(name);
    if (!p) fail_unknown_model_preset(name, preset->value.loc);
    spec = *p;
  }
  if (family) {
    const auto f = static_cast<ModelFamily>(get_choice(family->value, what + ".family", kFamilies, "families"));
    if (preset && f != spec.family)
      fail(family->value.loc,
           fmt::format("{}.family '{}' contradicts preset '{}' ({})", what, family->value.scalar, preset->value.scalar,
                       kFamilies[static_cast<std::size_t>(spec.family)]),
           "leave family out when a preset is given");
    spec.family = f;
  } else if (!preset) {
    fail(e.key_loc, fmt::format("{} needs a family or a preset", what),
         fmt::format("add family: gpt (or bert, resnet), or preset: NAME; presets: {}", join(analytic_preset_names())));
  }
  const bool resnet = spec.family == ModelFamily::Resnet;
  const std::string& fam = kFamilies[static_cast<std::size_t>(spec.family)];
  // Keys that belong to other families are errors, not silently ignored.
  const auto only_for = [&](std::string_view key, bool ok, std::string_view families) {
    if (const Entry* x = find_any(map, key); x && !ok)
      fail(x->key_loc, fmt::format("{}.{} does not apply to family {}", what, key, fam),
           fmt::format("{} is a key of {} models only", key, families));
  };
  only_for("hidden", !resnet, "gpt and bert");
  only_for("heads", !resnet, "gpt and bert");
  only_for("ffn", !resnet, "gpt and bert");
  only_for("seq_len", !resnet, "gpt and bert");
  only_for("vocab", !resnet, "gpt and bert");
  only_for("tied_head", !resnet, "gpt and bert");
  only_for("dropout", !resnet, "gpt and bert");
  only_for("kernels", !resnet, "gpt and bert");
  only_for("head", !resnet, "gpt and bert");
  only_for("labels", spec.family == ModelFamily::Bert, "bert");
  only_for("image_size", resnet, "resnet");
  only_for("classes", resnet, "resnet");
  only_for("layers_per_block", spec.family == ModelFamily::Gpt, "gpt");
  const auto int_key = [&](std::string_view key, int& field, int min, bool required) -> const Entry* {
    const Entry* x = find(map, key);
    if (x) {
      field = get_int(x->value, fmt::format("{}.{}", what, key), min);
    } else if (required) {
      const std::string shape =
          resnet ? "layers: 50 (the depth: 50, 101 or 152)" : "layers, hidden, heads, seq_len and vocab";
      require(map, key, what, e.key_loc,
              fmt::format("a {} model without a preset needs {}; or start from a preset: {}", fam, shape,
                          join(analytic_preset_names())));
    }
    return x;
  };
  const Entry* layers = int_key("layers", spec.layers, 1, !preset);
  const Entry* hidden = int_key("hidden", spec.hidden, 1, !preset && !resnet);
  const Entry* heads = int_key("heads", spec.heads, 1, !preset && !resnet);
  int_key("ffn", spec.ffn, 1, false);
  int_key("seq_len", spec.seq_len, 2, !preset && !resnet);
  int_key("vocab", spec.vocab, 2, !preset && !resnet);
  int_key("labels", spec.labels, 1, false);
  int_key("image_size", spec.image_size, 32, false);
  int_key("classes", spec.classes, 1, false);
  if (const Entry* x = find(map, "layers_per_block")) {
    spec.layers_per_block = get_int(x->value, what + ".layers_per_block", std::numeric_limits<int>::min());
    if (spec.layers_per_block != 1 && spec.layers_per_block != 2)
      fail(x->value.loc, fmt::format("{}.layers_per_block = {} is not 1 or 2", what, spec.layers_per_block),
           "layers_per_block: 1 (a layer per block) or 2 (its attention and MLP halves, as LoHan checkpoints them)");
  }
  if (const Entry* x = find(map, "name")) spec.name = get_string(x->value, what + ".name");
  if (const Entry* x = find(map, "tied_head")) spec.tied_head = get_bool(x->value, what + ".tied_head");
  if (const Entry* x = find(map, "dropout")) spec.dropout = get_bool(x->value, what + ".dropout");
  if (const Entry* x = find(map, "head")) {
    // gpt and bert take different heads; one of the other family's is named as such, not as unknown
    const bool gpt = spec.family == ModelFamily::Gpt;
    const std::vector<std::string>& own = gpt ? kGptHeads : kBertHeads;
    const std::vector<std::string>& other = gpt ? kBertHeads : kGptHeads;
    const std::string own_kind = fmt::format("{} heads", fam);
    if (x->value.kind == Node::Kind::Scalar && std::find(other.begin(), other.end(), x->value.scalar) != other.end())
      fail(x->value.loc, fmt::format("{}.head '{}' does not apply to family {}", what, x->value.scalar, fam),
           fmt::format("{}: {} ({} are {} heads)", own_kind, join(own), join(other), gpt ? "bert" : "gpt"));
    const std::size_t choice = get_choice(x->value, what + ".head", own, own_kind);
    if (gpt) {
      spec.gpt_head = static_cast<GptHead>(choice);
    } else {
      spec.bert_head = static_cast<BertHead>(choice);
    }
  }
  if (const Entry* x = find(map, "tied_head"); x && spec.gpt_head == GptHead::None)
    fail(x->key_loc, fmt::format("{}.tied_head does not apply with head: none", what),
         "a GPT without an LM head has no output projection to tie to the embedding: drop tied_head, or use head: lm");
  if (const Entry* x = find(map, "dtype"))
    spec.dtype = static_cast<DType>(get_choice(x->value, what + ".dtype", kDTypes, "dtypes"));
  if (const Entry* x = find(map, "optimizer"))
    spec.optimizer = static_cast<OptimizerKind>(get_choice(x->value, what + ".optimizer", kOptimizers, "optimizers"));
  if (const Entry* x = find(map, "kernels"))
    spec.kernels = static_cast<KernelStyle>(get_choice(x->value, what + ".kernels", kKernelStyles, "kernel styles"));
  if (const Entry* x = find(map, "ubatch_sizes")) {
    spec.ubatch_sizes.clear();
    const std::string w = what + ".ubatch_sizes";
    for (const Node* item : get_list(x->value, w, "ubatch_sizes: [1, 2, 4, 8, 16]")) {
      const int u = get_int(*item, w + " entries", 1);
      if (!spec.ubatch_sizes.empty() && u <= spec.ubatch_sizes.back())
        fail(item->loc, fmt::format("{} must be strictly ascending: {} follows {}", w, u, spec.ubatch_sizes.back()),
             "list each microbatch size once, smallest first, e.g. [1, 2, 4, 8, 16]");
      spec.ubatch_sizes.push_back(u);
    }
    if (spec.ubatch_sizes.empty())
      fail(x->value.loc, fmt::format("{} must list at least one size", w), "e.g. ubatch_sizes: [1, 2, 4, 8, 16]");
  }
  // Shape checks, located at the key that breaks them (the rest at `analytic:`).
  if (resnet && spec.layers != 50 && spec.layers != 101 && spec.layers != 152)
    fail(layers ? layers->value.loc : e.key_loc, fmt::format("{}.layers = {} is not a ResNet depth", what, spec.layers),
         "resnet layers is the depth: 50, 101 or 152");
  if (!resnet && spec.heads > 0 && spec.hidden % spec.heads != 0)
    fail(heads ? heads->value.loc : (hidden ? hidden->value.loc : e.key_loc),
         fmt::format("{}.heads = {} does not divide hidden = {}", what, spec.heads, spec.hidden),
         "the head size is hidden / heads: pick heads that divide hidden");
  if (const std::string problem = analytic_spec_problem(spec); !problem.empty())
    fail(e.key_loc, fmt::format("{}: {}", what, problem), "see docs/config.md, model.analytic");
  return spec;
}

ModelSpec parse_model(const Node& model, const SourceLoc& model_loc, const std::string& base_dir) {
  check_keys(model, "model", kModelKeys);
  const Entry* profile = find(model, "profile");
  const Entry* analytic = find(model, "analytic");
  const std::string hint =
      "give `profile: PATH/TO/PROFILE.json` (a measured profile, relative to this file's folder) or `analytic: "
      "NAME` / `analytic: {...}` (a model from formulas, docs/config.md)";
  if (profile && analytic)
    fail(analytic->key_loc, "model.profile and model.analytic are both given", "give exactly one: " + hint);
  ModelSpec spec;
  if (analytic) {
    spec.analytic = parse_analytic(*analytic);
    spec.analytic_dtype_given = analytic->value.kind == Node::Kind::Map && find(analytic->value, "dtype") != nullptr;
    spec.loc = analytic->value.loc;
    return spec;
  }
  if (!profile) {
    if (const Entry* empty = find_any(model, "profile")) fail(empty->key_loc, "model.profile has no value", hint);
    if (const Entry* empty = find_any(model, "analytic")) fail(empty->key_loc, "model.analytic has no value", hint);
    fail(model_loc, "missing required field model.profile (or model.analytic)", hint);
  }
  spec.profile_path = resolve_path(base_dir, get_string(profile->value, "model.profile"));
  spec.loc = profile->value.loc;
  return spec;
}

CostModelKind parse_cost_model(const Entry& e) {
  const std::string& name = expect_scalar(e.value, "cost_model", "a cost model name", "cost models: reference, native");
  const std::optional<CostModelKind> kind = parse_cost_model_kind(name);
  if (!kind)
    fail(e.value.loc, fmt::format("unknown cost_model '{}'", name),
         suggestion_hint(name, {"reference", "native"}, "cost models"));
  return *kind;
}

// `rules_kind`: the plan kind whose plan rules check the plan (load_config_text_as); nullopt: plan.mode's.
RunConfig build_config(Node root, const std::string& file, const std::vector<std::string>& overrides,
                       std::optional<PlanKind> rules_kind = std::nullopt) {
  for (const std::string& o : overrides) apply_override(root, o);
  const char* start_hint =
      "a config needs at least `model: {profile: PATH}` and `plan: {mode: harmony-pp, gpus: N, minibatch: D}`; "
      "see configs/examples/ and docs/config.md";
  if (root.kind == Node::Kind::Null) fail(SourceLoc{file, 0, 0}, "the config is empty", start_hint);
  if (root.kind != Node::Kind::Map)
    fail(root.loc, fmt::format("the config must be a mapping of sections, got {}", describe(root)), start_hint);
  check_keys(root, "", kTopKeys);

  RunConfig cfg;
  cfg.file = file;
  const std::string base_dir = parent_dir(file);

  // model
  const Node* model = section_map(root, "model");
  if (!model) {
    if (const Entry* e = find_any(root, "model")) fail(e->key_loc, "model has no value", start_hint);
    fail(SourceLoc{file, 0, 0}, "missing required section 'model'", "add `model: {profile: PATH/TO/PROFILE.json}`");
  }
  cfg.model = parse_model(*model, find(root, "model")->key_loc, base_dir);

  cfg.machine = parse_machine_section(root, file, base_dir);
  if (const Entry* e = find(root, "cost_model")) cfg.cost_model = parse_cost_model(*e);

  // plan
  const Node* plan = section_map(root, "plan");
  if (!plan) {
    if (const Entry* e = find_any(root, "plan")) fail(e->key_loc, "plan has no value", start_hint);
    fail(SourceLoc{file, 0, 0}, "missing required section 'plan'",
         "add `plan: {mode: harmony-pp, gpus: N, minibatch: D}`");
  }
  PlanLocs plan_locs;
  cfg.plan = parse_plan(*plan, find(root, "plan")->key_loc, plan_locs);

  // Harmony at its best with the native model; the paper's scheduler (prefetch off, minimum pack counts) with
  // the reference model, whose oracles are the paper's.
  const bool native = cfg.cost_model == CostModelKind::Native;
  cfg.options = parse_options(section_map(root, "options"), native);
  SearchLocs search_locs;
  cfg.search = parse_search(section_map(root, "search"), search_locs, native ? PackCounts::Wide : PackCounts::Minimum);

  // A baseline kind is checked under its own rules (N divides D, u divides D/N, lohan's u = D/N) on the one
  // microbatch size it runs (plan.u_bwd, search.u_bwd), with equal microbatches, as harmony-run checks it.
  const PlanKind rules = rules_kind ? *rules_kind : cfg.plan.kind;
  if (is_baseline(rules))
    check_plan(cfg, RuleCheck{rules, UnequalMicrobatches::Refused, false}, plan_locs, search_locs);
  else
    check_plan(
        cfg,
        RuleCheck{rules, cfg.options.unequal_microbatches ? UnequalMicrobatches::Allowed : UnequalMicrobatches::Offered,
                  true},
        plan_locs, search_locs);
  return cfg;
}

// ------------------------------------------------------------------------------------------------
// harmony-run's config: the sections above plus model shape, training, data and checkpoints.

const std::vector<std::string> kTrainTopKeys = {"model",   "machine", "device", "cost_model", "plan",
                                                "options", "search",  "train",  "checkpoint"};
const std::vector<std::string> kTrainModelKeys = {"gpt2", "weights", "n_head", "seq_len", "profile", "init_seed"};
const std::vector<std::string> kGpt2Keys = {"vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd"};
const std::vector<std::string> kTrainKeys = {"steps", "data", "lr", "beta1", "beta2", "eps", "weight_decay", "dtype"};
const std::vector<std::string> kDataKeys = {"file", "synthetic_tokens", "seed"};
const std::vector<std::string> kCheckpointKeys = {"dir", "every", "keep"};
const std::vector<std::string> kDevices = {"cpu", "cuda"};

double get_nonneg_double(const Node& v, const std::string& what, double below = 0.0) {
  const std::string hint = below > 0.0 ? fmt::format("write a number in [0, {})", below)
                                       : std::string("write a non-negative number, e.g. 0.001 or 1e-3");
  const std::string& s = expect_scalar(v, what, "a number", hint);
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value))
    fail(v.loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  if (value < 0.0 || (below > 0.0 && value >= below))
    fail(v.loc, fmt::format("{} = {} is out of range", what, s), hint);
  return value;
}

std::uint64_t get_u64(const Node& v, const std::string& what) {
  const std::string hint = "write a whole number, 0 or more";
  const std::string& s = expect_scalar(v, what, "an integer", hint);
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
    fail(v.loc, fmt::format("{} must be a whole number, got '{}'", what, s), hint);
  return value;
}

Gpt2Shape parse_gpt2_shape(const Entry& e) {
  const std::string example = "gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}";
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("model.gpt2 must be a mapping, got {}", describe(e.value)), example);
  check_keys(e.value, "model.gpt2", kGpt2Keys);
  Gpt2Shape g;
  auto need = [&](const char* key, int min) {
    const Entry& k = require(e.value, key, "model.gpt2", e.key_loc, example);
    return get_int(k.value, fmt::format("model.gpt2.{}", key), min);
  };
  g.vocab_size = need("vocab_size", 2);
  if (g.vocab_size > 65536)
    fail(
        find(e.value, "vocab_size")->value.loc,
        fmt::format("model.gpt2.vocab_size = {} exceeds 65536, the most a uint16 token file can address", g.vocab_size),
        "use a vocabulary of at most 65536 tokens");
  g.max_seq_len = need("max_seq_len", 1);
  g.n_layer = need("n_layer", 1);
  g.n_head = need("n_head", 1);
  g.n_embd = need("n_embd", 1);
  if (g.n_embd % g.n_head != 0)
    fail(find(e.value, "n_embd")->value.loc,
         fmt::format("model.gpt2.n_embd = {} is not a multiple of n_head = {}", g.n_embd, g.n_head),
         "each head gets n_embd / n_head channels: pick n_embd divisible by n_head");
  return g;
}

// plan.offload (cpu | nvme; zero-infinity and lohan) and plan.zero3 ({module_latency: DURATION, bucket: ELEMENTS};
// zero-infinity): the offload tier and ZeRO-3's overheads (docs/baselines.md). Removed from `plan` once read.
void parse_zero_infinity_keys(Node& plan, TrainConfig& cfg) {
  for (auto it = plan.entries.begin(); it != plan.entries.end();) {
    if (it->key != "offload" && it->key != "zero3") {
      ++it;
      continue;
    }
    const std::string what = "plan." + it->key;
    const auto kind = parse_plan_kind(cfg.baseline_kind);
    if (it->key == "offload" && !(kind && is_baseline(*kind) && has_offload_tiers(*kind)))
      fail(it->key_loc, "plan.offload applies to plan.mode: zero-infinity or lohan only",
           "remove the key, or set mode: zero-infinity or lohan");
    if (it->key == "zero3" && cfg.baseline_kind != "zero-infinity")
      fail(it->key_loc, "plan.zero3 applies to plan.mode: zero-infinity only",
           "remove the key, or set mode: zero-infinity");
    if (it->key == "offload") {
      const std::string hint =
          "offload tiers: cpu (parameters and optimizer state in host memory) or nvme (on the machine's "
          "topology.nvme drives, as DeepSpeed's offload_param/offload_optimizer device: nvme)";
      const std::string& v = expect_scalar(it->value, what, "an offload tier", hint);
      const auto tier = parse_offload_tier(v);
      if (!tier)
        fail(it->value.loc, fmt::format("unknown {} '{}'", what, v), suggestion_hint(v, offload_tier_names(), "tiers"));
      if (*tier == OffloadTier::Nvme && !cfg.machine.topology.nvme.present())
        fail(it->value.loc, "plan.offload: nvme needs a machine with an NVMe tier",
             "add topology.nvme: {read: 25GB/s, write: 20GB/s, capacity: 7.6TB, latency: 100us} to the machine, or "
             "use plan.offload: cpu");
      cfg.baseline_offload = *tier;
    } else {
      const std::string hint =
          "write zero3: {module_latency: 200us, bucket: 5e7} (the per-module hook cost and the prefetch bucket in "
          "parameter elements, DeepSpeed's stage3_prefetch_bucket_size)";
      if (it->value.kind != Node::Kind::Map) fail(it->value.loc, fmt::format("{} must be a mapping", what), hint);
      check_keys(it->value, what, {"module_latency", "bucket"});
      if (const Entry* e = find(it->value, "module_latency"))
        cfg.baseline_zero3.module_latency_s = get_topology_duration(e->value, what + ".module_latency", "us");
      if (const Entry* e = find(it->value, "bucket")) {
        const double v = get_positive_double(e->value, what + ".bucket");
        if (v < 1) fail(e->value.loc, fmt::format("{}.bucket must be at least 1 element, got {}", what, v), hint);
        cfg.baseline_zero3.bucket_elements = v;
      }
    }
    it = plan.entries.erase(it);
  }
}

TrainConfig build_train_config(Node root, const std::string& file, const std::vector<std::string>& overrides,
                               bool plan_searched) {
  for (const std::string& o : overrides) apply_override(root, o);
  const char* start_hint =
      "a harmony-run config needs `model: {gpt2: {...}, seq_len: T}`, `plan: {mode: harmony-pp, gpus: N, "
      "minibatch: B, ...}` and `train: {steps: S}`; see configs/run/default.yaml and docs/config.md";
  if (root.kind == Node::Kind::Null) fail(SourceLoc{file, 0, 0}, "the config is empty", start_hint);
  if (root.kind != Node::Kind::Map)
    fail(root.loc, fmt::format("the config must be a mapping of sections, got {}", describe(root)), start_hint);
  check_keys(root, "", kTrainTopKeys);
  TrainConfig cfg;
  cfg.file = file;
  const std::string base_dir = parent_dir(file);

  const Node* model = section_map(root, "model");
  if (!model) fail(SourceLoc{file, 0, 0}, "missing required section 'model'", start_hint);
  const SourceLoc model_loc = find(root, "model")->key_loc;
  cfg.model.loc = model_loc;
  check_keys(*model, "model", kTrainModelKeys);
  const Entry* gpt2 = find(*model, "gpt2");
  const Entry* weights = find(*model, "weights");
  if (gpt2 && weights)
    fail(weights->key_loc, "model.gpt2 and model.weights are both given",
         fmt::format("give one: a shape to initialise (gpt2: at {}) or a safetensors file to load",
                     gpt2->key_loc.str()));
  if (!gpt2 && !weights)
    fail(model_loc, "model needs model.gpt2 (a shape) or model.weights (a safetensors file)",
         "e.g. gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}");
  if (gpt2) cfg.model.gpt2 = parse_gpt2_shape(*gpt2);
  if (weights) cfg.model.weights_path = resolve_path(base_dir, get_string(weights->value, "model.weights"));
  if (const Entry* e = find(*model, "n_head")) {
    if (!weights)
      fail(e->key_loc, "model.n_head goes with model.weights (it overrides the heads of loaded weights)",
           "for a fresh model give the heads in model.gpt2: {..., n_head: H}");
    cfg.model.n_head = get_int(e->value, "model.n_head", 1);
  }
  const Entry& seq = require(*model, "seq_len", "model", model_loc, "add `seq_len: T` (tokens per sequence)");
  cfg.model.seq_len = get_int(seq.value, "model.seq_len", 1);
  if (cfg.model.gpt2 && cfg.model.seq_len > cfg.model.gpt2->max_seq_len)
    fail(seq.value.loc,
         fmt::format("model.seq_len = {} exceeds model.gpt2.max_seq_len = {}", cfg.model.seq_len,
                     cfg.model.gpt2->max_seq_len),
         "use a shorter sequence or a larger position table");
  if (const Entry* e = find(*model, "profile"))
    cfg.model.profile_path = resolve_path(base_dir, get_string(e->value, "model.profile"));
  if (const Entry* e = find(*model, "init_seed")) cfg.model.init_seed = get_u64(e->value, "model.init_seed");

  cfg.machine = parse_machine_section(root, file, base_dir);
  if (const Entry* e = find(root, "cost_model")) cfg.cost_model = parse_cost_model(*e);
  if (const Entry* e = find(root, "device")) {
    const std::string& d = expect_scalar(e->value, "device", "a device kind", "devices: cpu, cuda");
    if (std::find(kDevices.begin(), kDevices.end(), d) == kDevices.end())
      fail(e->value.loc, fmt::format("unknown device '{}'", d), suggestion_hint(d, kDevices, "devices"));
    cfg.device = d;
  }

  const Node* plan = section_map(root, "plan");
  if (!plan) fail(SourceLoc{file, 0, 0}, "missing required section 'plan'", start_hint);
  PlanLocs plan_locs;
  Node harmony_plan = *plan;  // a baseline kind in plan.mode is read as harmony-pp's keys, then recorded
  for (Entry& e : harmony_plan.entries) {
    if (e.key != "mode" || e.value.kind != Node::Kind::Scalar) continue;
    const auto kind = parse_plan_kind(e.value.scalar);
    if (kind && is_baseline(*kind)) {
      cfg.baseline_kind = e.value.scalar;
      e.value.scalar = "harmony-pp";
    }
  }
  // plan.activations: a baseline's activation policy (Harmony's plans always recompute)
  for (auto it = harmony_plan.entries.begin(); it != harmony_plan.entries.end(); ++it) {
    if (it->key != "activations") continue;
    const std::string hint =
        "activation policies: checkpoint (recompute each layer's forward in the backward), "
        "keep (hold or swap the saved activations)";
    if (cfg.baseline_kind.empty())
      fail(it->key_loc, fmt::format("plan.activations applies to baseline kinds ({})", join(baseline_kind_names())),
           "Harmony's plans recompute by design (checkpoint); remove the key");
    const std::string& v = expect_scalar(it->value, "plan.activations", "an activation policy", hint);
    const auto policy = parse_activation_policy(v);
    if (!policy)
      fail(it->value.loc, fmt::format("unknown plan.activations '{}'", v),
           suggestion_hint(v, activation_policy_names(), "activation policies"));
    cfg.baseline_activations = *policy;
    harmony_plan.entries.erase(it);
    break;
  }
  parse_zero_infinity_keys(harmony_plan, cfg);
  cfg.plan = parse_plan(harmony_plan, find(root, "plan")->key_loc, plan_locs);
  // harmony-run keeps the paper's defaults (prefetch off, minimum pack counts): its runs and --plan auto
  // choices stay as they were; both keys can be set.
  cfg.options = parse_options(section_map(root, "options"), false);
  SearchLocs search_locs;
  cfg.search = parse_search(section_map(root, "search"), search_locs, PackCounts::Minimum);
  if (cfg.options.unequal_microbatches)
    fail(find(*section_map(root, "options"), "unequal_microbatches")->value.loc,
         "options.unequal_microbatches is not supported by harmony-run", "remove it: the runtime needs D % u == 0");
  RunConfig as_run;
  as_run.file = file;
  as_run.machine = cfg.machine;
  as_run.plan = cfg.plan;
  if (plan_searched) as_run.plan.u_fwd = as_run.plan.u_bwd = std::nullopt;  // the search replaces them
  as_run.search = cfg.search;
  as_run.options = cfg.options;
  // A baseline is checked under its own rules (N divides D, u divides D/N, lohan's u = D/N), on the one
  // microbatch size it runs (plan.u_bwd); Harmony under its mode's, with equal microbatches (the runtime's).
  const auto baseline = parse_plan_kind(cfg.baseline_kind);
  check_plan(as_run,
             RuleCheck{baseline ? *baseline : cfg.plan.kind, UnequalMicrobatches::Refused, !baseline.has_value()},
             plan_locs, search_locs);

  const Node* train = section_map(root, "train");
  if (!train) fail(SourceLoc{file, 0, 0}, "missing required section 'train'", "add `train: {steps: 100}`");
  const SourceLoc train_loc = find(root, "train")->key_loc;
  check_keys(*train, "train", kTrainKeys);
  cfg.train.steps = get_int(require(*train, "steps", "train", train_loc, "add `steps: S`").value, "train.steps", 1);
  if (const Entry* e = find(*train, "lr")) cfg.train.lr = get_nonneg_double(e->value, "train.lr");
  if (const Entry* e = find(*train, "beta1")) cfg.train.beta1 = get_nonneg_double(e->value, "train.beta1", 1.0);
  if (const Entry* e = find(*train, "beta2")) cfg.train.beta2 = get_nonneg_double(e->value, "train.beta2", 1.0);
  if (const Entry* e = find(*train, "eps")) cfg.train.eps = get_nonneg_double(e->value, "train.eps");
  if (const Entry* e = find(*train, "weight_decay"))
    cfg.train.weight_decay = get_nonneg_double(e->value, "train.weight_decay");
  if (const Entry* e = find(*train, "dtype")) {
    cfg.train.dtype = get_string(e->value, "train.dtype");
    if (cfg.train.dtype != "fp32" && cfg.train.dtype != "bf16")
      fail(e->value.loc, fmt::format("train.dtype must be fp32 or bf16, got '{}'", cfg.train.dtype),
           "fp32 (the default) or bf16 (mixed precision: bf16 on the devices, fp32 master weights and AdamW on the "
           "host; docs/backend.md)");
  }
  cfg.train.data.loc = train_loc;
  if (const Entry* e = find(*train, "data")) {
    cfg.train.data.loc = e->value.loc;
    const char* data_hint =
        "write `data: PATH` (llm.c uint16 token file), `data: {file: PATH}` or `data: {synthetic_tokens: 65536, "
        "seed: 1}` for the synthetic task";
    if (e->value.kind == Node::Kind::Scalar) {
      cfg.train.data.path = resolve_path(base_dir, get_string(e->value, "train.data"));
    } else if (e->value.kind == Node::Kind::Map) {
      check_keys(e->value, "train.data", kDataKeys);
      const Entry* f = find(e->value, "file");
      const Entry* n = find(e->value, "synthetic_tokens");
      if (f && n) fail(n->key_loc, "train.data.file and train.data.synthetic_tokens are both given", data_hint);
      if (f) cfg.train.data.path = resolve_path(base_dir, get_string(f->value, "train.data.file"));
      if (n) cfg.train.data.synthetic_tokens = get_int(n->value, "train.data.synthetic_tokens", 2);
      if (const Entry* s = find(e->value, "seed")) cfg.train.data.seed = get_u64(s->value, "train.data.seed");
    } else {
      fail(e->value.loc, fmt::format("train.data must be a path or a mapping, got {}", describe(e->value)), data_hint);
    }
  }

  if (const Node* ck = section_map(root, "checkpoint")) {
    check_keys(*ck, "checkpoint", kCheckpointKeys);
    if (const Entry* e = find(*ck, "dir"))
      cfg.checkpoint.dir = resolve_path(base_dir, get_string(e->value, "checkpoint.dir"));
    if (const Entry* e = find(*ck, "every")) cfg.checkpoint.every = get_int(e->value, "checkpoint.every", 0);
    if (const Entry* e = find(*ck, "keep")) cfg.checkpoint.keep = get_int(e->value, "checkpoint.keep", 1);
  }
  return cfg;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  RecordFilesRead record;
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(SourceLoc{path, 0, 0}, fmt::format("cannot read config file '{}': {}", path, problem),
         "check the path: a config is a YAML file");
  RunConfig cfg = build_config(parse_yaml_tree(*text, path), path, overrides);
  cfg.inputs = record.take(cfg);
  return cfg;
}

RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  RecordFilesRead record;
  RunConfig cfg = build_config(parse_yaml_tree(text, name), name, overrides);
  cfg.inputs = record.take(cfg);
  return cfg;
}

RunConfig load_config_text_as(PlanKind kind, const std::string& text, const std::string& name,
                              const std::vector<std::string>& overrides) {
  RecordFilesRead record;
  RunConfig cfg = build_config(parse_yaml_tree(text, name), name, overrides, kind);
  cfg.inputs = record.take(cfg);
  return cfg;
}

BaselinePlan baseline_plan_of(const TrainConfig& cfg, const Model& model, const std::string& hint) {
  if (!cfg.plan.u_bwd)
    throw ConfigError(cfg.plan.loc, fmt::format("{} needs plan.u_bwd (its microbatch size)", cfg.baseline_kind), hint);
  BaselinePlan b;
  b.kind = *parse_plan_kind(cfg.baseline_kind);
  b.gpus = cfg.plan.gpus;
  b.minibatch = cfg.plan.minibatch;
  b.ubatch = *cfg.plan.u_bwd;
  b.activation_policy = cfg.baseline_activations;
  b.offload = cfg.baseline_offload;
  b.zero3 = cfg.baseline_zero3;
  b.gpu_capacity_bytes = cfg.machine.gpu_memory_bytes;
  try {
    validate_baseline_plan(b, model);
  } catch (const ScheduleError& e) {  // located at the plan, as a Harmony plan's problems are
    throw ConfigError(cfg.plan.loc, e.what(), hint);
  }
  return b;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides, bool plan_searched) {
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(SourceLoc{path, 0, 0}, fmt::format("cannot read config file '{}': {}", path, problem),
         "check the path: a config is a YAML file");
  return build_train_config(parse_yaml_tree(*text, path), path, overrides, plan_searched);
}

TrainConfig load_train_config_text(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& overrides, bool plan_searched) {
  return build_train_config(parse_yaml_tree(text, name), name, overrides, plan_searched);
}

// ------------------------------------------------------------------------------------------------

namespace {

// Plan problems are input errors: point at the config's `plan:` section.
[[noreturn]] void plan_error(const PlanSpec& ps, const std::string& file, const std::string& msg,
                             const std::string& hint) {
  throw ConfigError(ps.loc.file.empty() ? SourceLoc{file, 0, 0} : ps.loc, msg, hint);
}

}  // namespace

Model load_model(const ModelSpec& spec, const MachineSpec& machine) {
  if (!spec.analytic) return load_profile(spec.profile_path);
  if (!machine.gpu_rates.valid()) {
    std::vector<std::string> with_rates;
    for (const std::string& name : machine_preset_names()) {
      if (machine_preset(name).gpu_rates.valid()) with_rates.push_back(name);
    }
    throw ConfigError(
        spec.loc,
        fmt::format("an analytic model needs the machine's gpu_rates, and machine '{}' has none", machine.name),
        fmt::format("add gpu_rates: {{matrix_fp32: ..., memory: ...}} to the machine (docs/machines.md), "
                    "or start from a preset that has them: {}",
                    join(with_rates)));
  }
  AnalyticSpec a = *spec.analytic;
  if (!spec.analytic_dtype_given)
    a.dtype = machine.gpu_rates.matrix_fp16_flops_per_s > machine.gpu_rates.matrix_fp32_flops_per_s ? DType::Bf16
                                                                                                    : DType::Fp32;
  return analytic_model(a, machine.gpu_rates, machine.cpu_adam);
}

Plan plan_from_spec(const PlanSpec& ps, const Model& model, const std::string& file, std::string_view who) {
  Plan p;
  p.kind = ps.kind;
  p.gpus = ps.gpus;
  p.minibatch = ps.minibatch;
  if (!ps.u_fwd || !ps.u_bwd) {
    plan_error(ps, file, fmt::format("{} needs plan.u_fwd and plan.u_bwd", who),
               "add e.g. `u_fwd: 8` and `u_bwd: 8` to `plan:`");
  }
  p.u_fwd = *ps.u_fwd;
  p.u_bwd = *ps.u_bwd;
  if (ps.pack_size) {
    manual_packs(model.num_layers(), *ps.pack_size, p.packs_fwd, p.packs_bwd);
  } else if (ps.packs_bwd) {
    p.packs_bwd = *ps.packs_bwd;
    if (ps.packs_fwd) {
      p.packs_fwd = *ps.packs_fwd;
    } else {
      p.packs_fwd.assign(p.packs_bwd.begin(), p.packs_bwd.end() - 1);
    }
  } else {
    plan_error(ps, file, fmt::format("{} needs packs: plan.pack_size or plan.packs_bwd", who),
               "add `pack_size: 7`, or `packs_bwd: [[0, 13], [14, 27]]` (inclusive layer ranges)");
  }
  try {
    validate_plan(p, model.num_layers());
  } catch (const ScheduleError& e) {
    plan_error(ps, file, e.what(),
               fmt::format("the model has {} layers (0..{}); backward packs cover all of them, forward packs cover the "
                           "layers before the last backward pack",
                           model.num_layers(), model.num_layers() - 1));
  }
  for (Phase ph : {Phase::Fwd, Phase::Bwd}) {
    const int u = ph == Phase::Fwd ? p.u_fwd : p.u_bwd;
    if (ph == Phase::Fwd && p.packs_fwd.empty()) continue;
    if (!model.ubatch_in_range(ph, u)) {
      plan_error(
          ps, file,
          fmt::format("{} microbatch size {} is outside the profiled range {}..{} of {}",
                      ph == Phase::Fwd ? "u_fwd" : "u_bwd", u, model.ubatch_min(ph), model.ubatch_max(ph), model.name),
          "profiles cannot be extrapolated: pick a size inside the profiled range");
    }
  }
  return p;
}

}  // namespace harmony::core
