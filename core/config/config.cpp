// The YAML config loader's top: `--set a.b=value` overrides, the harmony-sim config's assembly from its sections
// (build_config), and the public loaders (load_config, load_config_text, load_train_config).
// Sections live by concern: config_model.cpp, config_plan.cpp, config_train.cpp, config_machine.cpp, config_yaml.cpp
// (shared through config_internal.hpp); docs/config.md keeps the schema.
#include "core/config/config.hpp"
#include "core/config/config_internal.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace harmony::core {
namespace config_detail {
namespace {

// ------------------------------------------------------------------------------------------------
// Overrides: "a.b.c=value", the value parsed as YAML (flow style allowed).

SourceLoc override_loc(const std::string& text) { return SourceLoc{"--set " + text, 0, 0}; }

constexpr const char* kOverrideHint =
    "write --set section.key=value, e.g. --set plan.gpus=4, --set machine.gpu_memory=8GiB or "
    "--set search.packing_fwd=[balanced_time, reuse]";

}  // namespace

void open_root(Node& root, const std::string& file, const std::vector<std::string>& overrides,
               const std::vector<std::string>& top_keys, const char* start_hint,
               const std::vector<FlagOverride>& flags) {
  for (const std::string& o : overrides) apply_override(root, o);
  for (const FlagOverride& f : flags) apply_override(root, f.override, SourceLoc{f.flag, 0, 0});
  if (root.kind == Node::Kind::Null) fail(SourceLoc{file, 0, 0}, "the config is empty", start_hint);
  if (root.kind != Node::Kind::Map)
    fail(root.loc, fmt::format("the config must be a mapping of sections, got {}", describe(root)), start_hint);
  check_keys(root, "", top_keys);
}

void apply_override(Node& root, const std::string& text, const std::optional<SourceLoc>& origin) {
  const SourceLoc loc = origin ? *origin : override_loc(text);
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

}  // namespace config_detail

using namespace config_detail;  // NOLINT(google-build-using-namespace): the loader's own internals

namespace {

// ------------------------------------------------------------------------------------------------
// harmony-sim's config: its sections (config_model.cpp, config_plan.cpp, config_machine.cpp) assembled and checked

const std::vector<std::string> kTopKeys = {"model", "machine", "cost_model", "plan", "options", "search"};

RunConfig build_config(Node root, const std::string& file, const std::vector<std::string>& overrides) {
  const char* start_hint =
      "a config needs at least `model: {profile: PATH}` and `plan: {mode: harmony-pp, gpus: N, minibatch: D}`; "
      "see configs/examples/ and docs/config.md";
  open_root(root, file, overrides, kTopKeys, start_hint);

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
  cfg.plan = parse_plan(*plan, find(root, "plan")->key_loc, plan_locs, cfg.machine);

  // Harmony at its best with the native model; the paper's scheduler (prefetch off, minimum pack counts) with
  // the reference model, whose oracles are the paper's.
  const bool native = cfg.cost_model == CostModelKind::Native;
  cfg.options = parse_options(section_map(root, "options"), native);
  SearchLocs search_locs;
  cfg.search = parse_search(section_map(root, "search"), search_locs, native ? PackCounts::Wide : PackCounts::Minimum,
                            cfg.plan.knobs.swap, cfg.plan.knobs.zero3);

  // plan.mode's kind's rules; a kind without packs on the one microbatch size it runs (plan.u_bwd, search.u_bwd),
  // with equal microbatches unless the kind may run unequal ones (as harmony-run checks it).
  check_plan(cfg, cfg.options.unequal_microbatches ? UnequalMicrobatches::Allowed : UnequalMicrobatches::Offered,
             plan_locs, search_locs);
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

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides, bool plan_searched,
                              const std::vector<FlagOverride>& flags) {
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(SourceLoc{path, 0, 0}, fmt::format("cannot read config file '{}': {}", path, problem),
         "check the path: a config is a YAML file");
  return build_train_config(parse_yaml_tree(*text, path), path, overrides, plan_searched, flags);
}

TrainConfig load_train_config_text(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& overrides, bool plan_searched) {
  return build_train_config(parse_yaml_tree(text, name), name, overrides, plan_searched);
}

}  // namespace harmony::core
