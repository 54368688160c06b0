// The sweep file (sim/app/sweep.hpp, docs/sweeps.md): loading and checking its YAML (base, grid, set, kinds,
// budget) with located errors, preflighting every grid value against the base config, the fingerprint, shards
// (--shard I/N) and the FNV-1a / CSV helpers the rows use.
#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/config/config.hpp"
#include "core/config/yaml_tree.hpp"
#include "core/plan/plan.hpp"
#include "sim/app/sweep_internal.hpp"

namespace harmony::sim {

using namespace sweep_detail;  // NOLINT(google-build-using-namespace): the sweep's own internal pieces

namespace {

constexpr std::size_t kMaxPoints = 1'000'000'000'000;  // a guard against overflow; see kLargeGridPoints

const std::vector<std::string> kSweepKeys = {"base", "grid", "set", "kinds", "budget"};
const std::vector<std::string> kBudgetKeys = {"samples", "tokens", "seq_len", "bill"};

constexpr const char* kSweepHint =
    "a sweep file has `base: CONFIG.yaml`, `grid: {KEY: [VALUES]}` and optionally `set:`, `kinds:` and "
    "`budget:`; see docs/sweeps.md";

using core::YamlEntry;
using core::YamlNode;

bool is_scalar(const YamlNode& n) { return n.kind == YamlNode::Kind::Scalar; }
bool is_null(const YamlNode& n) { return n.kind == YamlNode::Kind::Null; }

void check_keys(const YamlNode& map, const std::string& section, const std::vector<std::string>& valid) {
  for (const YamlEntry& e : map.entries) {
    if (std::find(valid.begin(), valid.end(), e.key) != valid.end()) continue;
    const std::string best = core::closest_match(e.key, valid);
    fail(e.key_loc,
         section.empty() ? fmt::format("unknown sweep key '{}'", e.key)
                         : fmt::format("unknown key '{}' in {}", e.key, section),
         (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) +
             fmt::format("valid keys: {}", join(valid, ", ")));
  }
}

// A dotted config key: non-empty parts, no '=' or spaces.
void check_config_key(const YamlEntry& key, const std::string& section) {
  const std::string& k = key.key;
  bool ok = !k.empty() && k.find_first_of("= \t") == std::string::npos;
  for (std::size_t start = 0; ok;) {
    const auto dot = k.find('.', start);
    if ((dot == std::string::npos ? k.size() : dot) == start) ok = false;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!ok)
    fail(key.key_loc, fmt::format("'{}' in {} is not a dotted config key", k, section),
         "write config keys like plan.gpus, machine.gpu_memory or search.ubatch_step (docs/config.md)");
  if (k == "plan.mode")
    fail(key.key_loc, fmt::format("{} cannot set plan.mode: every point's plan kind comes from `kinds:`", section),
         fmt::format("list the plan kinds to sweep under `kinds:` ({})", join(core::plan_kind_names(), ", ")));
}

// A positive whole number, written plainly or with an exponent (1e9).
std::int64_t get_count(const YamlNode& v, const std::string& what) {
  const auto& loc = v.loc;
  const std::string hint = fmt::format("write {} as a whole number, e.g. 1000000 or 3e11", what);
  if (!is_scalar(v)) fail(loc, fmt::format("{} must be a number", what), hint);
  const std::string& s = v.scalar;
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !std::isfinite(x))
    fail(loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  if (x < 1 || x != std::floor(x) || x > 9e18)
    fail(loc, fmt::format("{} must be a whole number >= 1, got '{}'", what, s), hint);
  return static_cast<std::int64_t>(x);
}

// Whether a config error from a single override is a mistake in the override's key itself (as opposed to a
// value that only some combinations reject): those are the sweep file's errors.
bool is_key_error(const core::ConfigError& e) {
  if (!starts_with(e.loc().file, "--set ")) return false;
  const std::string& m = e.message();
  return starts_with(m, "unknown key") || starts_with(m, "unknown top-level key") || starts_with(m, "override") ||
         starts_with(m, "cannot apply override") || starts_with(m, "malformed value in override");
}

// The fingerprint input: everything that decides the rows, in a fixed textual form.
std::string fingerprint_of(const Sweep& s, const std::string& base_text) {
  std::string t = fmt::format("{} {}\nbase {}\n{}\n", kFormat, kFormatVersion, s.base, base_text);
  for (const auto& x : s.set) t += fmt::format("set {}={}\n", x.key, x.value);
  for (const auto& a : s.grid) {
    t += fmt::format("grid {}\n", a.key);
    for (const auto& v : a.values) t += fmt::format("  {}\n", v);
  }
  t += "kinds";
  for (auto k : s.kinds) t += fmt::format(" {}", core::plan_kind_name(k));
  t += fmt::format("\nbudget {} {} {} {}\n", s.budget.samples, s.budget.tokens, s.budget.seq_len,
                   s.budget.bill_gpus ? "gpus" : "machine");
  return fnv1a_hex(t);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Helpers

std::string fnv1a_hex(std::string_view data) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64: offset basis and prime
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return fmt::format("{:016x}", h);
}

std::string csv_field(std::string_view text) {
  const bool quote = text.find_first_of(",\"\n\r") != std::string_view::npos ||
                     (!text.empty() && (text.front() == ' ' || text.back() == ' '));
  if (!quote) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::size_t Sweep::num_combos() const {
  std::size_t n = 1;
  for (const auto& a : grid) n *= a.values.size();
  return n;
}

Shard parse_shard(std::string_view text, const std::string& where) {
  const core::SourceLoc loc{where, 0, 0};
  const std::string hint = "write --shard I/N with 0 <= I < N, e.g. --shard 0/4 ... --shard 3/4";
  const auto slash = text.find('/');
  auto number = [&](std::string_view s, std::size_t& out) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
    out = std::stoul(std::string(s));
    return true;
  };
  Shard sh;
  if (slash == std::string_view::npos || !number(text.substr(0, slash), sh.index) ||
      !number(text.substr(slash + 1), sh.count))
    fail(loc, fmt::format("shard '{}' is not I/N", text), hint);
  if (sh.count < 1 || sh.index >= sh.count)
    fail(loc, fmt::format("shard '{}': I must be below N and N at least 1", text), hint);
  return sh;
}

// ------------------------------------------------------------------------------------------------
// Loading

namespace {

// The entry `key` of the sweep file's top mapping, when it is there and not null.
const YamlEntry* find_entry(const YamlNode& root, const char* key) {
  for (const auto& e : root.entries) {
    if (e.key == key && !is_null(e.value)) return &e;
  }
  return nullptr;
}

// base: the config every point starts from, its path relative to the sweep file's folder; read and parsed.
void load_base(Sweep& s, const YamlEntry* base, const std::string& name) {
  if (!base)
    fail(core::SourceLoc{name, 0, 0}, "missing `base:`, the harmony-sim config every point starts from", kSweepHint);
  if (!is_scalar(base->value))
    fail(base->value.loc, "base must be the path of a harmony-sim config", "e.g. base: ../default.yaml");
  s.base = base->value.scalar;
  {
    fs::path p(s.base);
    if (p.is_relative()) p = fs::path(name).parent_path() / p;
    s.base_path = p.lexically_normal().generic_string();
  }
  s.base_text = read_file(s.base_path, base->value.loc, "the base config");
  (void)core::parse_yaml_tree(s.base_text, s.base_path);  // its syntax errors, located in the base config
}

// set: the overrides every point shares; their keys go into *keys_seen.
void load_set(Sweep& s, const YamlEntry& set, std::set<std::string>* keys_seen) {
  if (set.value.kind != YamlNode::Kind::Map)
    fail(set.value.loc, "set must be a mapping of config keys to values",
         "e.g. set: {search.ubatch_step: 2, cost_model: native}");
  for (const YamlEntry& e : set.value.entries) {
    check_config_key(e, "set");
    keys_seen->insert(e.key);
    s.set.push_back(SweepSetting{e.key, core::flow_yaml(e.value), e.key_loc});
  }
}

// grid: one axis per config key (not one of set's), each with its distinct values.
void load_grid(Sweep& s, const YamlEntry& grid, const std::set<std::string>& keys_seen) {
  if (grid.value.kind != YamlNode::Kind::Map)
    fail(grid.value.loc, "grid must be a mapping of config keys to lists of values",
         "e.g. grid: {plan.gpus: [1, 2, 4, 8], plan.minibatch: [32, 64]}");
  for (const YamlEntry& e : grid.value.entries) {
    check_config_key(e, "grid");
    if (keys_seen.count(e.key))
      fail(e.key_loc, fmt::format("'{}' is both in set and in grid", e.key), "keep it in one of them");
    SweepAxis axis{e.key, {}, e.key_loc};
    const std::vector<YamlNode> one{e.value};
    const std::vector<YamlNode>& items = e.value.kind == YamlNode::Kind::Seq ? e.value.items : one;
    if (items.empty())
      fail(e.value.loc, fmt::format("grid key '{}' has no values", e.key),
           "list at least one value; a list-valued config key needs a list of lists, e.g. [[balanced_time]]");
    for (const auto& item : items) {
      std::string value = core::flow_yaml(item);
      if (std::find(axis.values.begin(), axis.values.end(), value) != axis.values.end())
        fail(item.loc, fmt::format("grid key '{}' lists the value {} twice", e.key, value),
             "each value once: the same point would be evaluated twice");
      axis.values.push_back(std::move(value));
    }
    s.grid.push_back(std::move(axis));
  }
}

// kinds: the plan kinds listed, each once; without the key, Harmony's kinds and the baselines (the in-memory
// ceiling, resident, only when listed).
void load_kinds(Sweep& s, const YamlEntry* kinds) {
  if (!kinds) {
    for (const core::PlanKind& k : core::plan_kinds())
      if (k->role != core::KindRole::Ceiling) s.kinds.push_back(k);
    return;
  }
  const std::vector<YamlNode> one{kinds->value};
  const std::vector<YamlNode>& items = kinds->value.kind == YamlNode::Kind::Seq ? kinds->value.items : one;
  if (items.empty()) fail(kinds->value.loc, "kinds lists no plan kind", "leave kinds out for every kind");
  for (const auto& item : items) {
    const std::string hint_tail = "plan kinds: " + join(core::plan_kind_names(), ", ");
    if (!is_scalar(item)) fail(item.loc, "a plan kind must be a name", hint_tail);
    const auto kind = core::find_plan_kind(item.scalar);
    if (!kind) {
      const std::string best = core::closest_match(item.scalar, core::plan_kind_names());
      fail(item.loc, fmt::format("unknown plan kind '{}'", item.scalar),
           (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) + hint_tail);
    }
    if (std::find(s.kinds.begin(), s.kinds.end(), *kind) != s.kinds.end())
      fail(item.loc, fmt::format("plan kind '{}' is listed twice", item.scalar), "list each kind once");
    s.kinds.push_back(*kind);
  }
}

// budget: samples, or tokens with seq_len (rounded up to samples), and how the machine is billed.
void load_budget(Sweep& s, const YamlEntry& budget) {
  const std::string hint = "budget: {samples: N} or {tokens: N, seq_len: T}, optionally bill: machine | gpus";
  if (budget.value.kind != YamlNode::Kind::Map) fail(budget.value.loc, "budget must be a mapping", hint);
  check_keys(budget.value, "budget", kBudgetKeys);
  const YamlNode* samples = nullptr;
  const YamlNode* tokens = nullptr;
  const YamlNode* seq_len = nullptr;
  for (const auto& [k, k_loc, v] : budget.value.entries) {
    if (k == "samples") samples = &v;
    if (k == "tokens") tokens = &v;
    if (k == "seq_len") seq_len = &v;
    if (k == "bill") {
      if (!is_scalar(v) || (v.scalar != "machine" && v.scalar != "gpus"))
        fail(v.loc, "budget.bill must be machine or gpus",
             "machine: the whole machine's price per hour; gpus: the share of the GPUs the plan uses");
      s.budget.bill_gpus = v.scalar == "gpus";
    }
  }
  if ((samples != nullptr) == (tokens != nullptr))
    fail(budget.value.loc, "budget needs exactly one of samples and tokens", hint);
  if (samples) {
    if (seq_len) fail(seq_len->loc, "budget.seq_len goes with tokens, not samples", hint);
    s.budget.samples = get_count(*samples, "budget.samples");
  } else {
    if (!seq_len) fail(budget.value.loc, "budget.tokens needs budget.seq_len (tokens per sample)", hint);
    s.budget.tokens = get_count(*tokens, "budget.tokens");
    s.budget.seq_len = get_count(*seq_len, "budget.seq_len");
    s.budget.samples = (s.budget.tokens + s.budget.seq_len - 1) / s.budget.seq_len;
  }
}

// At most kMaxPoints points.
void check_sweep_size(const Sweep& s, const std::string& name) {
  double n = static_cast<double>(s.kinds.size());
  for (const auto& a : s.grid) n *= static_cast<double>(a.values.size());
  if (n > static_cast<double>(kMaxPoints))
    fail(core::SourceLoc{name, 0, 0}, fmt::format("the sweep has {:.0f} points, more than {}", n, kMaxPoints),
         "split it into several sweep files");
}

// Every key must be one the config knows: each override of set and grid is tried alone on the base config.
void preflight_keys(const Sweep& s) {
  auto preflight = [&](const std::string& key, const std::string& value, const core::SourceLoc& loc,
                       const char* section) {
    try {
      (void)core::load_config_text(s.base_text, s.base_path, {key + "=" + value});
    } catch (const core::ConfigError& e) {
      if (is_key_error(e)) fail(loc, fmt::format("{} key '{}': {}", section, key, e.message()), e.hint());
    }
  };
  for (const auto& x : s.set) preflight(x.key, x.value, x.loc, "set");
  for (const auto& a : s.grid) {
    for (const auto& v : a.values) preflight(a.key, v, a.loc, "grid");
  }
}

}  // namespace

Sweep load_sweep_text(const std::string& text, const std::string& name) {
  Sweep s;
  s.file = name;
  const YamlNode root = core::parse_yaml_tree(text, name);
  if (root.kind != YamlNode::Kind::Map) fail(core::SourceLoc{name, 0, 0}, "a sweep file must be a mapping", kSweepHint);
  check_keys(root, "", kSweepKeys);
  load_base(s, find_entry(root, "base"), name);
  std::set<std::string> keys_seen;
  if (const auto* set = find_entry(root, "set")) load_set(s, *set, &keys_seen);
  if (const auto* grid = find_entry(root, "grid")) load_grid(s, *grid, keys_seen);
  load_kinds(s, find_entry(root, "kinds"));
  if (const auto* budget = find_entry(root, "budget")) load_budget(s, *budget);
  check_sweep_size(s, name);
  preflight_keys(s);
  s.fingerprint = fingerprint_of(s, s.base_text);
  return s;
}

Sweep load_sweep(const std::string& path) {
  return load_sweep_text(read_file(path, core::SourceLoc{path, 0, 0}, "the sweep file"), path);
}

}  // namespace harmony::sim
