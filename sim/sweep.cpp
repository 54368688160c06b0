// Sweeps (sim/sweep.hpp, docs/sweeps.md): the sweep file loader, point expansion and ids, the evaluation of
// one point into CSV / JSON Lines cells, and the runner that writes rows in point order from a pool of
// workers, resumes a killed run and merges shards. Prints nothing; progress goes through a callback.
#include "sim/sweep.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/input_file.hpp"
#include "core/config/config.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan.hpp"
#include "sim/compare.hpp"

namespace harmony::sim {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// The model cache: one Model per distinct model source, loaded by the first worker that needs it.

class ModelCache {
 public:
  // `key` names the model's source: the profile's path, or (analytic models, which depend on the machine's
  // rates) the point's model and machine overrides.
  std::shared_ptr<const core::Model> get(const std::string& key, const core::RunConfig& cfg) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = models_.find(key); it != models_.end()) return it->second;
    }
    auto model = std::make_shared<const core::Model>(core::load_model(cfg.model, cfg.machine));
    const std::lock_guard<std::mutex> lock(mutex_);
    return models_.emplace(key, std::move(model)).first->second;  // a racing loader's copy wins: same bits
  }

  // The FNV-1a digest and size of a file's bytes, read once per run; "missing" when it cannot be read.
  std::string file_digest(const std::string& path) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = digests_.find(path); it != digests_.end()) return it->second;
    }
    std::string digest = "missing";
    std::string problem;  // a file that cannot be read (or a directory, FIFO, device) digests as "missing"
    if (const auto text = core::try_read_input_file(path, &problem))
      digest = fnv1a_hex(*text) + " " + std::to_string(text->size());
    const std::lock_guard<std::mutex> lock(mutex_);
    return digests_.emplace(path, std::move(digest)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const core::Model>> models_;
  std::map<std::string, std::string> digests_;
};

namespace {

constexpr const char* kFormat = "harmony-sweep-results";
// 2: the `inputs` column; 3: output schema 1 (docs/output-schema.md): plan_kind, cost_model, packing_fwd/bwd,
// num_candidates, gpu_capacity_bytes, fits, excess_bytes, packs as JSON arrays, schema_version in every row.
constexpr int kFormatVersion = kSweepFormatVersion;
constexpr std::size_t kMaxPoints = 1'000'000'000'000;  // a guard against overflow; see kLargeGridPoints

const std::vector<std::string> kSweepKeys = {"base", "grid", "set", "kinds", "budget"};
const std::vector<std::string> kBudgetKeys = {"samples", "tokens", "seq_len", "bill"};

constexpr const char* kSweepHint =
    "a sweep file has `base: CONFIG.yaml`, `grid: {KEY: [VALUES]}` and optionally `set:`, `kinds:` and "
    "`budget:`; see docs/sweeps.md";

core::SourceLoc loc_of(const YAML::Node& n, const std::string& file) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0 || m.column < 0) return core::SourceLoc{file, 0, 0};
  return core::SourceLoc{file, m.line + 1, m.column + 1};
}

[[noreturn]] void fail(const core::SourceLoc& loc, const std::string& message, const std::string& hint = {}) {
  throw core::ConfigError(loc, message, hint);
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// The canonical text of a value: flow-style YAML, the form a `--set key=value` override takes.
std::string canonical_yaml(const YAML::Node& n) {
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  if (n.IsScalar() && n.Tag() == "!") {
    e << YAML::DoubleQuoted << n.Scalar();  // a quoted string stays a string
  } else {
    e << n;
  }
  return e.c_str();
}

// The key/value pairs of a mapping, in file order; duplicate and non-scalar keys are errors.
std::vector<std::pair<YAML::Node, YAML::Node>> entries(const YAML::Node& map, const std::string& file) {
  std::vector<std::pair<YAML::Node, YAML::Node>> out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar())
      fail(loc_of(it->first, file), "a key must be a plain name, not a list or mapping", "write keys as `name: value`");
    for (const auto& [k, v] : out) {
      if (k.Scalar() == it->first.Scalar())
        fail(loc_of(it->first, file), fmt::format("duplicate key '{}'", it->first.Scalar()),
             fmt::format("'{}' is already given at {}; keep one", k.Scalar(), loc_of(k, file).str()));
    }
    out.emplace_back(it->first, it->second);
  }
  return out;
}

void check_keys(const std::vector<std::pair<YAML::Node, YAML::Node>>& es, const std::string& section,
                const std::vector<std::string>& valid, const std::string& file) {
  for (const auto& [k, v] : es) {
    if (std::find(valid.begin(), valid.end(), k.Scalar()) != valid.end()) continue;
    const std::string best = core::closest_match(k.Scalar(), valid);
    fail(loc_of(k, file),
         section.empty() ? fmt::format("unknown sweep key '{}'", k.Scalar())
                         : fmt::format("unknown key '{}' in {}", k.Scalar(), section),
         (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) +
             fmt::format("valid keys: {}", join(valid, ", ")));
  }
}

// A dotted config key: non-empty parts, no '=' or spaces.
void check_config_key(const YAML::Node& key, const std::string& file, const std::string& section) {
  const std::string& k = key.Scalar();
  bool ok = !k.empty() && k.find_first_of("= \t") == std::string::npos;
  for (std::size_t start = 0; ok;) {
    const auto dot = k.find('.', start);
    if ((dot == std::string::npos ? k.size() : dot) == start) ok = false;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!ok)
    fail(loc_of(key, file), fmt::format("'{}' in {} is not a dotted config key", k, section),
         "write config keys like plan.gpus, machine.gpu_memory or search.ubatch_step (docs/config.md)");
  if (k == "plan.mode")
    fail(loc_of(key, file),
         fmt::format("{} cannot set plan.mode: every point's plan kind comes from `kinds:`", section),
         "list the plan kinds to sweep under `kinds:` (harmony-pp, harmony-dp, dp-swap, pp-swap, zero-infinity, l2l)");
}

// A positive whole number, written plainly or with an exponent (1e9).
std::int64_t get_count(const YAML::Node& v, const std::string& what, const std::string& file) {
  const auto loc = loc_of(v, file);
  const std::string hint = fmt::format("write {} as a whole number, e.g. 1000000 or 3e11", what);
  if (!v.IsScalar()) fail(loc, fmt::format("{} must be a number", what), hint);
  const std::string& s = v.Scalar();
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

// The one input check (core/base/input_file): a directory, FIFO or unreadable file is refused with the reason,
// located where the sweep names it.
std::string read_file(const std::string& path, const core::SourceLoc& where, const std::string& what) {
  std::string problem;
  auto text = core::try_read_input_file(path, &problem);
  if (!text)
    fail(where, fmt::format("cannot read {} '{}': {}", what, path, problem),
         "check the path (relative to the sweep file's folder)");
  return std::move(*text);
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Whether a config error from a single override is a mistake in the override's key itself (as opposed to a
// value that only some combinations reject): those are the sweep file's errors.
bool is_key_error(const core::ConfigError& e) {
  if (!starts_with(e.loc().file, "--set ")) return false;
  const std::string& m = e.message();
  return starts_with(m, "unknown key") || starts_with(m, "unknown top-level key") || starts_with(m, "override") ||
         starts_with(m, "cannot apply override") || starts_with(m, "malformed value in override");
}

const char* mode_for(core::PlanKind k) {
  // Harmony kinds run in their mode; baselines are validated as harmony-pp (the rules that need D % N are the
  // baseline search's, which reports them per point).
  return k == core::PlanKind::HarmonyDP ? "harmony-dp" : "harmony-pp";
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

Sweep load_sweep_text(const std::string& text, const std::string& name) {
  Sweep s;
  s.file = name;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(core::SourceLoc{name, e.mark.line >= 0 ? e.mark.line + 1 : 0, e.mark.column >= 0 ? e.mark.column + 1 : 0},
         fmt::format("malformed YAML: {}", e.msg), kSweepHint);
  }
  if (!root.IsMap()) fail(core::SourceLoc{name, 0, 0}, "a sweep file must be a mapping", kSweepHint);
  const auto top = entries(root, name);
  check_keys(top, "", kSweepKeys, name);
  auto find = [&](const char* key) -> const std::pair<YAML::Node, YAML::Node>* {
    for (const auto& e : top) {
      if (e.first.Scalar() == key && !e.second.IsNull()) return &e;
    }
    return nullptr;
  };

  // base
  const auto* base = find("base");
  if (!base)
    fail(core::SourceLoc{name, 0, 0}, "missing `base:`, the harmony-sim config every point starts from", kSweepHint);
  if (!base->second.IsScalar())
    fail(loc_of(base->second, name), "base must be the path of a harmony-sim config", "e.g. base: ../default.yaml");
  s.base = base->second.Scalar();
  {
    fs::path p(s.base);
    if (p.is_relative()) p = fs::path(name).parent_path() / p;
    s.base_path = p.lexically_normal().generic_string();
  }
  s.base_text = read_file(s.base_path, loc_of(base->second, name), "the base config");
  const std::string& base_text = s.base_text;
  try {
    (void)YAML::Load(base_text);
  } catch (const YAML::Exception& e) {
    fail(core::SourceLoc{s.base_path, e.mark.line >= 0 ? e.mark.line + 1 : 0,
                         e.mark.column >= 0 ? e.mark.column + 1 : 0},
         fmt::format("malformed YAML: {}", e.msg), "the sweep's base config must be a valid harmony-sim config");
  }

  // set
  std::set<std::string> keys_seen;
  if (const auto* set = find("set")) {
    if (!set->second.IsMap())
      fail(loc_of(set->second, name), "set must be a mapping of config keys to values",
           "e.g. set: {search.ubatch_step: 2, cost_model: native}");
    for (const auto& [k, v] : entries(set->second, name)) {
      check_config_key(k, name, "set");
      keys_seen.insert(k.Scalar());
      s.set.push_back(SweepSetting{k.Scalar(), canonical_yaml(v), loc_of(k, name)});
    }
  }

  // grid
  if (const auto* grid = find("grid")) {
    if (!grid->second.IsMap())
      fail(loc_of(grid->second, name), "grid must be a mapping of config keys to lists of values",
           "e.g. grid: {plan.gpus: [1, 2, 4, 8], plan.minibatch: [32, 64]}");
    for (const auto& [k, v] : entries(grid->second, name)) {
      check_config_key(k, name, "grid");
      if (keys_seen.count(k.Scalar()))
        fail(loc_of(k, name), fmt::format("'{}' is both in set and in grid", k.Scalar()), "keep it in one of them");
      SweepAxis axis{k.Scalar(), {}, loc_of(k, name)};
      std::vector<YAML::Node> items;
      if (v.IsSequence()) {
        for (const auto& item : v) items.push_back(item);
      } else {
        items.push_back(v);
      }
      if (items.empty())
        fail(loc_of(v, name), fmt::format("grid key '{}' has no values", k.Scalar()),
             "list at least one value; a list-valued config key needs a list of lists, e.g. [[balanced_time]]");
      for (const auto& item : items) {
        std::string value = canonical_yaml(item);
        if (std::find(axis.values.begin(), axis.values.end(), value) != axis.values.end())
          fail(loc_of(item, name), fmt::format("grid key '{}' lists the value {} twice", k.Scalar(), value),
               "each value once: the same point would be evaluated twice");
        axis.values.push_back(std::move(value));
      }
      s.grid.push_back(std::move(axis));
    }
  }

  // kinds
  if (const auto* kinds = find("kinds")) {
    std::vector<YAML::Node> items;
    if (kinds->second.IsSequence()) {
      for (const auto& item : kinds->second) items.push_back(item);
    } else {
      items.push_back(kinds->second);
    }
    if (items.empty()) fail(loc_of(kinds->second, name), "kinds lists no plan kind", "leave kinds out for every kind");
    for (const auto& item : items) {
      const std::string hint_tail = "plan kinds: " + join(core::plan_kind_names(), ", ");
      if (!item.IsScalar()) fail(loc_of(item, name), "a plan kind must be a name", hint_tail);
      const auto kind = core::parse_plan_kind(item.Scalar());
      if (!kind) {
        const std::string best = core::closest_match(item.Scalar(), core::plan_kind_names());
        fail(loc_of(item, name), fmt::format("unknown plan kind '{}'", item.Scalar()),
             (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) + hint_tail);
      }
      if (std::find(s.kinds.begin(), s.kinds.end(), *kind) != s.kinds.end())
        fail(loc_of(item, name), fmt::format("plan kind '{}' is listed twice", item.Scalar()), "list each kind once");
      s.kinds.push_back(*kind);
    }
  } else {
    for (const auto& n : core::plan_kind_names()) s.kinds.push_back(*core::parse_plan_kind(n));
  }

  // budget
  if (const auto* budget = find("budget")) {
    const std::string hint = "budget: {samples: N} or {tokens: N, seq_len: T}, optionally bill: machine | gpus";
    if (!budget->second.IsMap()) fail(loc_of(budget->second, name), "budget must be a mapping", hint);
    const auto es = entries(budget->second, name);
    check_keys(es, "budget", kBudgetKeys, name);
    const YAML::Node* samples = nullptr;
    const YAML::Node* tokens = nullptr;
    const YAML::Node* seq_len = nullptr;
    for (const auto& [k, v] : es) {
      if (k.Scalar() == "samples") samples = &v;
      if (k.Scalar() == "tokens") tokens = &v;
      if (k.Scalar() == "seq_len") seq_len = &v;
      if (k.Scalar() == "bill") {
        if (!v.IsScalar() || (v.Scalar() != "machine" && v.Scalar() != "gpus"))
          fail(loc_of(v, name), "budget.bill must be machine or gpus",
               "machine: the whole machine's price per hour; gpus: the share of the GPUs the plan uses");
        s.budget.bill_gpus = v.Scalar() == "gpus";
      }
    }
    if ((samples != nullptr) == (tokens != nullptr))
      fail(loc_of(budget->second, name), "budget needs exactly one of samples and tokens", hint);
    if (samples) {
      if (seq_len) fail(loc_of(*seq_len, name), "budget.seq_len goes with tokens, not samples", hint);
      s.budget.samples = get_count(*samples, "budget.samples", name);
    } else {
      if (!seq_len) fail(loc_of(budget->second, name), "budget.tokens needs budget.seq_len (tokens per sample)", hint);
      s.budget.tokens = get_count(*tokens, "budget.tokens", name);
      s.budget.seq_len = get_count(*seq_len, "budget.seq_len", name);
      s.budget.samples = (s.budget.tokens + s.budget.seq_len - 1) / s.budget.seq_len;
    }
  }

  // size
  {
    double n = static_cast<double>(s.kinds.size());
    for (const auto& a : s.grid) n *= static_cast<double>(a.values.size());
    if (n > static_cast<double>(kMaxPoints))
      fail(core::SourceLoc{name, 0, 0}, fmt::format("the sweep has {:.0f} points, more than {}", n, kMaxPoints),
           "split it into several sweep files");
  }

  // Every key must be one the config knows: try each override alone on the base config.
  auto preflight = [&](const std::string& key, const std::string& value, const core::SourceLoc& loc,
                       const char* section) {
    try {
      (void)core::load_config_text(base_text, s.base_path, {key + "=" + value});
    } catch (const core::ConfigError& e) {
      if (is_key_error(e)) fail(loc, fmt::format("{} key '{}': {}", section, key, e.message()), e.hint());
    }
  };
  for (const auto& x : s.set) preflight(x.key, x.value, x.loc, "set");
  for (const auto& a : s.grid) {
    for (const auto& v : a.values) preflight(a.key, v, a.loc, "grid");
  }
  s.fingerprint = fingerprint_of(s, base_text);
  return s;
}

Sweep load_sweep(const std::string& path) {
  return load_sweep_text(read_file(path, core::SourceLoc{path, 0, 0}, "the sweep file"), path);
}

// ------------------------------------------------------------------------------------------------
// Points

SweepPoint sweep_point(const Sweep& sweep, std::size_t index) {
  SweepPoint p;
  p.index = index;
  const std::size_t k = sweep.kinds.size();
  p.kind = sweep.kinds[index % k];
  std::size_t combo = index / k;
  p.value_index.assign(sweep.grid.size(), 0);
  for (std::size_t a = sweep.grid.size(); a-- > 0;) {
    const std::size_t n = sweep.grid[a].values.size();
    p.value_index[a] = combo % n;
    combo /= n;
  }
  for (const auto& x : sweep.set) p.overrides.push_back(x.key + "=" + x.value);
  for (std::size_t a = 0; a < sweep.grid.size(); ++a)
    p.overrides.push_back(sweep.grid[a].key + "=" + sweep.grid[a].values[p.value_index[a]]);
  p.overrides.push_back(std::string("plan.mode=") + mode_for(p.kind));
  p.id = fnv1a_hex(std::string(core::plan_kind_name(p.kind)) + "\n" + join(p.overrides, "\n"));
  return p;
}

namespace {

// A grid key that is also a result column (`cost_model`: the resolved name is the grid's value) gets no column
// of its own.
bool grid_key_is_column(const std::string& key) { return key == "cost_model"; }

}  // namespace

std::vector<std::string> sweep_columns(const Sweep& sweep) {
  std::vector<std::string> c = {"point", "id"};
  for (const auto& a : sweep.grid)
    if (!grid_key_is_column(a.key)) c.push_back(a.key);
  for (const char* name : {"plan_kind",
                           "model_name",
                           "machine_name",
                           "gpus",
                           "minibatch",
                           "cost_model",
                           "status",
                           "feasible",
                           "reason",
                           "num_candidates",
                           "iteration_time_s",
                           "throughput_samples_per_s",
                           "u_fwd",
                           "u_bwd",
                           "packs_fwd",
                           "packs_bwd",
                           "packing_fwd",
                           "packing_bwd",
                           "swap_weights",
                           "swap_activations",
                           "swap_in_bytes",
                           "swap_out_bytes",
                           "p2p_bytes",
                           "collective_bytes",
                           "msg_bytes",
                           "peak_memory_bytes",
                           "gpu_capacity_bytes",
                           "fits",
                           "excess_bytes",
                           "host_memory_bytes",
                           "samples",
                           "iterations",
                           "time_to_train_s",
                           "price_per_hour",
                           "cost",
                           "inputs"})
    c.emplace_back(name);
  return c;
}

namespace {

// A cell: null, text, a JSON-ready literal (numbers, booleans, packs' arrays; the CSV gets the same text), or
// a grid value (YAML text).
struct Cell {
  enum class Kind { Null, Text, Literal, Yaml };
  Kind kind = Kind::Null;
  std::string text;
};

Cell null_cell() { return {}; }
Cell text_cell(std::string s) { return {Cell::Kind::Text, std::move(s)}; }
Cell int_cell(std::int64_t v) { return {Cell::Kind::Literal, std::to_string(v)}; }
Cell bool_cell(bool v) { return {Cell::Kind::Literal, v ? "true" : "false"}; }
Cell num_cell(double v) {
  if (!std::isfinite(v)) return null_cell();
  return {Cell::Kind::Literal, fmt::format("{}", v)};  // shortest round-trip
}

bool is_json_number(const std::string& s) {
  std::size_t i = 0;
  const std::size_t n = s.size();
  if (i < n && s[i] == '-') ++i;
  if (i >= n) return false;
  if (s[i] == '0') {
    ++i;
  } else if (s[i] >= '1' && s[i] <= '9') {
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  } else {
    return false;
  }
  if (i < n && s[i] == '.') {
    ++i;
    if (i >= n || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (i >= n || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  }
  return i == n;
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string cell_json(const Cell& c) {
  switch (c.kind) {
    case Cell::Kind::Null:
      return "null";
    case Cell::Kind::Literal:
      return c.text;
    case Cell::Kind::Text:
      return json_string(c.text);
    case Cell::Kind::Yaml:
      if (c.text == "~" || c.text == "null") return "null";
      if (c.text == "true" || c.text == "false" || is_json_number(c.text)) return c.text;
      return json_string(c.text);
  }
  return "null";
}

std::string cell_csv(const Cell& c) { return c.kind == Cell::Kind::Null ? std::string() : csv_field(c.text); }

// Packs as compact JSON-style text: [[0,6],[7,27]].
std::string packs_text(const core::Packs& packs) {
  std::string out = "[";
  for (std::size_t i = 0; i < packs.size(); ++i)
    out += fmt::format("{}[{},{}]", i ? "," : "", packs[i].first, packs[i].last);
  return out + "]";
}

// One line: newlines and runs of spaces in messages (deadlock reports) become "; " and " ".
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      if (!out.empty() && out.back() != ';') out += "; ";
      continue;
    }
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

// A config error as a reason: the override or the file's name (not its path, which depends on the working
// folder), line and column, and the message.
std::string config_reason(const core::ConfigError& e) {
  core::SourceLoc loc = e.loc();
  if (!starts_with(loc.file, "--set ")) loc.file = fs::path(loc.file).filename().string();
  return one_line(fmt::format("{}: {}", loc.str(), e.message()));
}

// What a point's row depends on besides the sweep file and the base config (both in the fingerprint): the
// bytes of every file its config read, or the error that kept the config from being built.
std::string inputs_digest(const core::RunConfig* cfg, const std::string& config_error, ModelCache& cache) {
  std::string t = fmt::format("inputs {}\n", kFormatVersion);
  if (cfg) {
    for (const auto& f : cfg->inputs) t += "file " + cache.file_digest(f) + "\n";
  } else {
    t += "error " + config_error + "\n";
  }
  return fnv1a_hex(t);
}

}  // namespace

std::string sweep_point_inputs(const Sweep& sweep, std::size_t index, ModelCache* cache) {
  ModelCache local;
  if (!cache) cache = &local;
  const SweepPoint p = sweep_point(sweep, index);
  try {
    const auto cfg = core::load_config_text(sweep.base_text, sweep.base_path, p.overrides);
    return inputs_digest(&cfg, {}, *cache);
  } catch (const core::ConfigError& e) {
    return inputs_digest(nullptr, config_reason(e), *cache);
  } catch (const core::ScheduleError& e) {
    return inputs_digest(nullptr, one_line(e.what()), *cache);
  }
}

SweepRow evaluate_sweep_point(const Sweep& sweep, std::size_t index, ModelCache* cache) {
  ModelCache local;
  if (!cache) cache = &local;
  const SweepPoint p = sweep_point(sweep, index);
  const auto columns = sweep_columns(sweep);
  std::vector<Cell> cells;
  cells.reserve(columns.size());
  cells.push_back(int_cell(static_cast<std::int64_t>(index)));
  cells.push_back(text_cell(p.id));
  std::optional<std::string> grid_cost_model;  // the grid's value of `cost_model`, when it has that key
  for (std::size_t a = 0; a < sweep.grid.size(); ++a) {
    if (grid_key_is_column(sweep.grid[a].key))
      grid_cost_model = sweep.grid[a].values[p.value_index[a]];
    else
      cells.push_back(Cell{Cell::Kind::Yaml, sweep.grid[a].values[p.value_index[a]]});
  }
  cells.push_back(text_cell(core::plan_kind_name(p.kind)));

  std::string status;
  std::string reason;
  std::string inputs;
  std::optional<core::RunConfig> cfg;
  std::shared_ptr<const core::Model> model;
  std::optional<KindResult> kr;
  try {
    try {
      cfg = core::load_config_text(sweep.base_text, sweep.base_path, p.overrides);
    } catch (const core::ConfigError& e) {
      inputs = inputs_digest(nullptr, config_reason(e), *cache);
      throw;
    } catch (const core::ScheduleError& e) {
      inputs = inputs_digest(nullptr, one_line(e.what()), *cache);
      throw;
    }
    inputs = inputs_digest(&*cfg, {}, *cache);
    std::string key = "profile " + cfg->model.profile_path;
    if (cfg->model.profile_path.empty()) {
      key = "overrides";
      for (const auto& o : p.overrides) {
        if (starts_with(o, "model") || starts_with(o, "machine")) key += "\n" + o;
      }
    }
    model = cache->get(key, *cfg);
    kr = best_plan_of_kind(p.kind, *model, cfg->machine, cfg->plan.gpus, cfg->plan.minibatch, cfg->cost_model,
                           cfg->search, cfg->options);
    if (kr->feasible) {
      status = "ok";
    } else {
      status = !kr->applicable                                            ? "invalid"
               : (kr->candidates > 0 && kr->deadlocked == kr->candidates) ? "deadlock"
                                                                          : "does_not_fit";
      reason = one_line(kr->reason);
    }
  } catch (const core::ConfigError& e) {
    status = "invalid";
    reason = config_reason(e);
  } catch (const core::ScheduleError& e) {
    status = "invalid";
    reason = one_line(e.what());
  }

  const bool ok = status == "ok";
  const core::RunReport* r = ok ? &kr->best : nullptr;
  auto when = [&](bool have, Cell c) { return have ? std::move(c) : null_cell(); };
  cells.push_back(when(model != nullptr, text_cell(model ? model->name : "")));
  cells.push_back(when(cfg.has_value(), text_cell(cfg ? cfg->machine.name : "")));
  cells.push_back(when(cfg.has_value(), int_cell(cfg ? cfg->plan.gpus : 0)));
  cells.push_back(when(cfg.has_value(), int_cell(cfg ? cfg->plan.minibatch : 0)));
  if (cfg)
    cells.push_back(text_cell(cfg->cost_model));
  else
    cells.push_back(grid_cost_model ? Cell{Cell::Kind::Yaml, *grid_cost_model} : null_cell());
  cells.push_back(text_cell(status));
  cells.push_back(bool_cell(ok));
  cells.push_back(ok ? null_cell() : text_cell(reason));
  cells.push_back(when(kr.has_value(), int_cell(kr ? static_cast<std::int64_t>(kr->candidates) : 0)));
  if (r) {
    cells.push_back(num_cell(r->iteration_time_s));
    cells.push_back(num_cell(r->throughput_samples_per_s));
    cells.push_back(int_cell(r->plan.u_fwd));
    cells.push_back(int_cell(r->plan.u_bwd));
    cells.push_back(Cell{Cell::Kind::Literal, packs_text(r->plan.packs_fwd)});
    cells.push_back(Cell{Cell::Kind::Literal, packs_text(r->plan.packs_bwd)});
    cells.push_back(r->method_fwd.empty() ? null_cell() : text_cell(r->method_fwd));
    cells.push_back(r->method_bwd.empty() ? null_cell() : text_cell(r->method_bwd));
    if (kr->baseline) {
      const auto ds = core::decide_swaps(*kr->baseline, *model);
      cells.push_back(bool_cell(std::any_of(ds.begin(), ds.end(), [](const auto& d) { return d.weights; })));
      cells.push_back(bool_cell(std::any_of(ds.begin(), ds.end(), [](const auto& d) { return d.activations; })));
    } else {
      cells.push_back(null_cell());
      cells.push_back(null_cell());
    }
    cells.push_back(int_cell(r->swap_in_bytes));
    cells.push_back(int_cell(r->swap_out_bytes));
    cells.push_back(int_cell(r->p2p_bytes));
    cells.push_back(int_cell(r->collective_bytes));
    cells.push_back(int_cell(r->msg_bytes));
    // The reference model estimates no memory for the baselines (0): unknown, not zero.
    cells.push_back(r->peak_memory_bytes > 0 || r->native ? int_cell(r->peak_memory_bytes) : null_cell());
  } else {
    for (int i = 0; i < 16; ++i) cells.push_back(null_cell());
  }
  const core::MachineSpec* m = cfg ? &cfg->machine : nullptr;
  cells.push_back(
      when(m != nullptr,
           int_cell(m ? static_cast<core::Bytes>(static_cast<double>(m->gpu_memory_bytes) * m->memory_cap_scale) : 0)));
  // fits / excess_bytes: whether the best plan's peak fits the GPU capacity (null without a plan or a known
  // peak); the excess is null when it fits.
  const bool fit_known = r != nullptr && r->gpu_capacity_bytes > 0 && (r->peak_memory_bytes > 0 || r->native);
  cells.push_back(fit_known ? bool_cell(r->fits) : null_cell());
  cells.push_back(fit_known && !r->fits ? int_cell(r->excess_bytes) : null_cell());
  cells.push_back(when(r != nullptr && r->native, int_cell(r ? r->host_memory.total_bytes : 0)));
  const bool budget = sweep.budget.samples > 0;
  cells.push_back(budget ? int_cell(sweep.budget.samples) : null_cell());
  double time_to_train_s = 0.0;
  if (budget && r && cfg) {
    const std::int64_t d = cfg->plan.minibatch;
    const std::int64_t iterations = (sweep.budget.samples + d - 1) / d;
    time_to_train_s = static_cast<double>(iterations) * r->iteration_time_s;
    cells.push_back(int_cell(iterations));
    cells.push_back(num_cell(time_to_train_s));
  } else {
    cells.push_back(null_cell());
    cells.push_back(null_cell());
  }
  const bool priced = m != nullptr && m->price_per_hour > 0;
  cells.push_back(priced ? num_cell(m->price_per_hour) : null_cell());
  if (budget && r && priced) {
    const double t = time_to_train_s;
    const double share =
        sweep.budget.bill_gpus ? static_cast<double>(cfg->plan.gpus) / static_cast<double>(m->gpus) : 1.0;
    cells.push_back(num_cell(t / 3600.0 * m->price_per_hour * share));
  } else {
    cells.push_back(null_cell());
  }
  cells.push_back(text_cell(inputs));

  if (cells.size() != columns.size())
    throw std::logic_error(fmt::format("sweep row has {} cells for {} columns", cells.size(), columns.size()));
  SweepRow row;
  row.point = index;
  row.status = status;
  row.reason = reason;
  row.inputs = inputs;
  row.json = fmt::format("{{\"schema_version\":{}", core::kOutputSchemaVersion);
  for (std::size_t i = 0; i < cells.size(); ++i) {
    row.csv += (i ? "," : "") + cell_csv(cells[i]);
    row.json += "," + json_string(columns[i]) + ":" + cell_json(cells[i]);
  }
  row.csv += "\n";
  row.json += "}\n";
  return row;
}

// ------------------------------------------------------------------------------------------------
// Output folders: sweep.json, results.csv, results.jsonl

namespace {

constexpr const char* kMetaFile = "sweep.json";
constexpr const char* kCsvFile = "results.csv";
constexpr const char* kJsonlFile = "results.jsonl";
constexpr const char* kLockFile = "sweep.lock";
constexpr const char* kFreshHint = "use a new --out folder, or delete this one to start the sweep over";

std::string csv_header(const Sweep& s) {
  std::string h;
  const auto cols = sweep_columns(s);
  for (std::size_t i = 0; i < cols.size(); ++i) h += (i ? "," : "") + csv_field(cols[i]);
  return h + "\n";
}

nlohmann::ordered_json shard_json(const Shard& sh) {
  nlohmann::ordered_json j;
  j["index"] = sh.index;
  j["count"] = sh.count;
  return j;
}

nlohmann::ordered_json sweep_meta(const Sweep& s, const std::string& file_as_given, const Shard& shard) {
  nlohmann::ordered_json j;
  j["schema_version"] = core::kOutputSchemaVersion;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["sweep_file"] = file_as_given;
  // Lets `report` find the sweep file from any working folder (docs/report.md).
  j["sweep_file_absolute"] = fs::absolute(s.file).lexically_normal().generic_string();
  j["base"] = s.base;
  j["fingerprint"] = s.fingerprint;
  j["points"] = s.num_points();
  j["order"] =
      "point p = grid combination p / K (odometer order, the last grid key fastest) with plan kind p % K, K = "
      "len(kinds); shard I/N holds the points with p % N == I";
  nlohmann::ordered_json set = nlohmann::ordered_json::object();
  for (const auto& x : s.set) set[x.key] = x.value;
  j["set"] = std::move(set);
  nlohmann::ordered_json grid = nlohmann::ordered_json::array();
  for (const auto& a : s.grid) {
    nlohmann::ordered_json axis;
    axis["key"] = a.key;
    axis["values"] = a.values;
    grid.push_back(std::move(axis));
  }
  j["grid"] = std::move(grid);
  nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
  for (auto k : s.kinds) kinds.push_back(core::plan_kind_name(k));
  j["kinds"] = std::move(kinds);
  if (s.budget.samples > 0) {
    nlohmann::ordered_json b;
    b["samples"] = s.budget.samples;
    if (s.budget.tokens > 0) {
      b["tokens"] = s.budget.tokens;
      b["seq_len"] = s.budget.seq_len;
    }
    b["bill"] = s.budget.bill_gpus ? "gpus" : "machine";
    j["budget"] = std::move(b);
  } else {
    j["budget"] = nullptr;
  }
  j["columns"] = sweep_columns(s);
  j["shard"] = shard_json(shard);
  return j;
}

std::string dump_meta(const nlohmann::ordered_json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

core::SourceLoc file_loc(const fs::path& p, int line = 0) { return core::SourceLoc{p.generic_string(), line, 0}; }

std::string slurp(const fs::path& p) { return read_file(p.string(), file_loc(p), "the file"); }

void write_atomically(const fs::path& p, const std::string& text) {
  core::write_file_atomic(p.string(), text, "the file", "check the folder is writable and the disk has space");
}

// The complete ('\n'-terminated) lines of a text, with the byte offset after each; a partial last line (a
// write cut short by a kill) is left out.
struct Lines {
  std::vector<std::string_view> lines;
  std::vector<std::uint64_t> ends;
};
Lines complete_lines(const std::string& text) {
  Lines l;
  std::size_t start = 0;
  for (std::size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    l.lines.push_back(std::string_view(text).substr(start, nl - start));
    l.ends.push_back(nl + 1);
    start = nl + 1;
  }
  return l;
}

nlohmann::ordered_json read_meta(const fs::path& p) {
  const std::string text = slurp(p);
  try {
    auto j = nlohmann::ordered_json::parse(text);
    if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("fingerprint") || !j.contains("points") ||
        !j.contains("shard"))
      fail(file_loc(p), "not a harmony-sim sweep description", kFreshHint);
    return j;
  } catch (const nlohmann::json::exception& e) {
    fail(file_loc(p), fmt::format("malformed sweep description: {}", e.what()), kFreshHint);
  }
}

Shard meta_shard(const nlohmann::ordered_json& meta, const fs::path& p) {
  try {
    Shard sh;
    sh.index = meta.at("shard").at("index").get<std::size_t>();
    sh.count = meta.at("shard").at("count").get<std::size_t>();
    if (sh.count < 1 || sh.index >= sh.count) throw std::out_of_range("shard");
    return sh;
  } catch (const std::exception&) {
    fail(file_loc(p), "its `shard` is not {index: I, count: N} with I < N", kFreshHint);
  }
}

// The point index a JSON Lines row names, or nullopt when the line is not a row object.
std::optional<std::pair<std::size_t, std::string>> row_key(std::string_view line) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("point") || !j.contains("id")) return std::nullopt;
    return std::make_pair(j.at("point").get<std::size_t>(), j.at("id").get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A row of an earlier run, as read back for a resume.
struct OldRow {
  std::string csv;   // the line with its '\n'
  std::string json;  // the line with its '\n'
  std::string inputs;
  std::string status;
  std::string reason;
};

// The valid rows of an earlier run (the shard's first points, in order, in both files), and the byte offsets to
// truncate each file to for keeping the first k of them (csv_ends[k], jsonl_ends[k]); throws for rows that belong
// to another sweep.
struct Resumable {
  std::vector<OldRow> rows;
  std::vector<std::uint64_t> csv_ends;    // 0 when the file has no header
  std::vector<std::uint64_t> jsonl_ends;  // jsonl_ends[0] = 0
};

Resumable resumable_rows(const Sweep& sweep, const Shard& shard, const fs::path& csv_path, const fs::path& jsonl_path) {
  const std::size_t total = shard.size(sweep.num_points());
  Resumable out;
  const std::string header = csv_header(sweep);
  std::string csv = fs::exists(csv_path) ? slurp(csv_path) : std::string();
  std::string jsonl = fs::exists(jsonl_path) ? slurp(jsonl_path) : std::string();
  const Lines cl = complete_lines(csv);
  const Lines jl = complete_lines(jsonl);
  std::size_t csv_rows = 0;
  if (!cl.lines.empty()) {
    if (std::string(cl.lines[0]) + "\n" != header)
      fail(file_loc(csv_path, 1), "its header is not this sweep's columns", kFreshHint);
    csv_rows = cl.lines.size() - 1;
  }
  const std::size_t n = std::min({csv_rows, jl.lines.size(), total});
  if (csv_rows > total || jl.lines.size() > total)
    fail(file_loc(csv_rows > total ? csv_path : jsonl_path),
         fmt::format("it has more rows than the {} points of this shard", total), kFreshHint);
  out.csv_ends.push_back(cl.lines.empty() ? 0 : cl.ends[0]);
  out.jsonl_ends.push_back(0);
  // Rows beyond n in the longer file are complete but unmatched in the other: recomputed (same bytes).
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t p = shard.point(k);
    const std::string id = sweep_point(sweep, p).id;
    OldRow row;
    bool ok = false;
    try {
      const auto j = nlohmann::json::parse(jl.lines[k]);
      ok = j.is_object() && j.contains("point") && j.contains("id") && j.at("point").get<std::size_t>() == p &&
           j.at("id").get<std::string>() == id;
      if (ok) {
        row.inputs = j.contains("inputs") && j.at("inputs").is_string() ? j.at("inputs").get<std::string>() : "";
        row.status = j.value("status", "");
        row.reason = j.contains("reason") && j.at("reason").is_string() ? j.at("reason").get<std::string>() : "";
      }
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok)
      fail(file_loc(jsonl_path, static_cast<int>(k + 1)),
           fmt::format("row {} is not point {} (id {}) of this sweep", k + 1, p, id), kFreshHint);
    if (!starts_with(cl.lines[k + 1], fmt::format("{},{},", p, id)))
      fail(file_loc(csv_path, static_cast<int>(k + 2)),
           fmt::format("row {} is not point {} (id {}) of this sweep", k + 1, p, id), kFreshHint);
    row.csv = std::string(cl.lines[k + 1]) + "\n";
    row.json = std::string(jl.lines[k]) + "\n";
    out.rows.push_back(std::move(row));
    out.csv_ends.push_back(cl.ends[k + 1]);
    out.jsonl_ends.push_back(jl.ends[k]);
  }
  return out;
}

// A flock on DIR/sweep.lock for the life of a run: exclusive for a writer (a sweep, a merge's output folder),
// shared for a reader (merge reading a shard, so a sweep cannot write into it meanwhile, and two merges may read
// it at once). A writer records its pid and host in the file, so a second run names it; the file stays
// (unlocked) afterwards: deleting it would let two runs lock different files. A reader opens the file read-only
// and skips a folder that has none (no locking sweep ever wrote there; read-only copies merge as before).
enum class LockMode { Write, Read };

class FolderLock {
 public:
  explicit FolderLock(const fs::path& dir, LockMode mode = LockMode::Write) {
    const fs::path path = dir / kLockFile;
    const bool write = mode == LockMode::Write;
    fd_ = ::open(path.c_str(), write ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0644);
    if (fd_ < 0 && !write && errno == ENOENT) return;
    if (fd_ < 0)
      fail(file_loc(path), fmt::format("cannot {} the lock file: {}", write ? "create" : "open", std::strerror(errno)),
           write ? "pick a writable --out folder" : "check the folder's permissions");
    if (::flock(fd_, (write ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
      const int err = errno;
      std::string holder;
      // The holder writes its name just after locking: give it a moment when the file is still empty.
      for (int attempt = 0; attempt < 50 && holder.empty() && err == EWOULDBLOCK; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        char buf[256];
        const ssize_t got = ::pread(fd_, buf, sizeof buf - 1, 0);
        if (got > 0) holder = one_line(std::string(buf, static_cast<std::size_t>(got)));
      }
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK && !write)
        fail(file_loc(dir),
             fmt::format("a sweep is writing into this shard folder ({})",
                         holder.empty() ? "holder not recorded yet" : holder),
             "wait for it to finish (or stop it: Ctrl-C keeps its rows, and a rerun resumes), then merge");
      if (err == EWOULDBLOCK)
        fail(file_loc(dir),
             fmt::format("another sweep is writing into this folder, or a merge is using it ({})",
                         holder.empty() ? "holder not recorded yet" : "last locked by " + holder),
             fmt::format("wait for it to finish or stop it (Ctrl-C keeps its rows), or use another --out folder; "
                         "{} names the last writer",
                         path.generic_string()));
      fail(file_loc(path), fmt::format("cannot lock the folder: {}", std::strerror(err)),
           "use a --out folder on a local file system");
    }
    if (!write) return;
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
    const std::string text = fmt::format("pid {} on host {}\n", static_cast<long>(::getpid()), host);
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      fail(file_loc(path), "cannot write the lock file", "check the folder is writable and the disk has space");
  }
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

// Counts a row into the summary's statuses and invalid reasons.
void count_row(SweepSummary& summary, const std::string& status, const std::string& reason) {
  ++summary.by_status[status];
  if (status == "invalid" && summary.invalid_reasons.size() < 5 &&
      std::find(summary.invalid_reasons.begin(), summary.invalid_reasons.end(), reason) ==
          summary.invalid_reasons.end())
    summary.invalid_reasons.push_back(reason);
}

// Runs f(0) .. f(n - 1) on `threads` threads; the first exception is rethrown after all have stopped.
template <class F>
void parallel_for(std::size_t n, unsigned threads, const F& f) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mutex;
  auto worker = [&] {
    for (std::size_t i = next++; i < n && !failed.load(); i = next++) {
      try {
        f(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

SweepSummary run_sweep(const Sweep& sweep, const SweepRunOptions& options, const SweepProgressFn& progress) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const Shard shard = options.shard;
  if (sweep.num_points() > kLargeGridPoints && !options.allow_large_grid)
    fail(core::SourceLoc{sweep.file, 0, 0},
         fmt::format("the sweep has {} points, more than {} (grid combinations x {} plan kinds)", sweep.num_points(),
                     kLargeGridPoints, sweep.kinds.size()),
         "pass --allow-large-grid to run it anyway (points stream: memory does not grow with the grid), or shrink "
         "the grid or split it into several sweep files (docs/sweeps.md)");
  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail(file_loc(dir), fmt::format("cannot create the output folder: {}", ec ? ec.message() : "not a folder"),
         "pick a writable --out folder");
  const FolderLock folder_lock(dir);
  const fs::path meta_path = dir / kMetaFile;
  const fs::path csv_path = dir / kCsvFile;
  const fs::path jsonl_path = dir / kJsonlFile;
  const auto meta =
      sweep_meta(sweep, options.sweep_file_as_given.empty() ? sweep.file : options.sweep_file_as_given, shard);
  if (fs::exists(meta_path)) {
    const auto old = read_meta(meta_path);
    if (const auto v = old.value("version", 0); v != kFormatVersion)
      fail(
          file_loc(meta_path),
          fmt::format("this folder holds results in sweep format {}, written by {} harmony-sim; this one writes format "
                      "{} (output schema {}, docs/output-schema.md) and cannot resume the older rows",
                      v, v < kFormatVersion ? "an older" : "a newer", kFormatVersion, core::kOutputSchemaVersion),
          "rerun the sweep into a new --out folder (or delete this one): every point is computed again");
    if (old.at("fingerprint") != meta.at("fingerprint"))
      fail(file_loc(meta_path),
           fmt::format("this folder holds the results of a different sweep (fingerprint {}, this sweep {}): the "
                       "sweep file or its base config changed since it was started, or harmony-sim's output format",
                       old.at("fingerprint").dump(), meta.at("fingerprint").dump()),
           kFreshHint);
    const Shard was = meta_shard(old, meta_path);
    if (was.index != shard.index || was.count != shard.count)
      fail(file_loc(meta_path),
           fmt::format("this folder holds shard {}/{} of the sweep, not {}/{}", was.index, was.count, shard.index,
                       shard.count),
           "resume a shard with the same --shard I/N, or use a new --out folder");
  } else {
    if (fs::exists(csv_path) || fs::exists(jsonl_path))
      fail(file_loc(dir), "the folder holds results but no sweep.json", kFreshHint);
    write_atomically(meta_path, dump_meta(meta));
  }

  SweepSummary summary;
  summary.total = shard.size(sweep.num_points());
  unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads) : std::thread::hardware_concurrency();
  threads = std::max(1u, threads);
  ModelCache cache;

  // Rows of an earlier run: kept when the files their point reads are unchanged, else recomputed. The files are
  // cut after the last row before the first stale one; later kept rows are written again from memory.
  Resumable old = resumable_rows(sweep, shard, csv_path, jsonl_path);
  const std::size_t found = old.rows.size();
  std::vector<char> fresh(found, 0);
  {
    // Re-hash on the workers; this thread reports progress (a resume of a million rows takes a while).
    std::atomic<std::size_t> checked{0};
    std::atomic<bool> check_finished{false};
    std::exception_ptr check_error;
    std::thread checker([&] {
      try {
        parallel_for(found, std::min<unsigned>(threads, static_cast<unsigned>(std::max<std::size_t>(found, 1))),
                     [&](std::size_t k) {
                       if (options.stop != nullptr && options.stop->load()) return;
                       fresh[k] = sweep_point_inputs(sweep, shard.point(k), &cache) == old.rows[k].inputs ? 1 : 0;
                       ++checked;
                     });
      } catch (...) {
        check_error = std::current_exception();
      }
      check_finished = true;
    });
    const auto interval = std::chrono::duration<double>(std::max(0.01, options.progress_interval_s));
    while (!check_finished.load()) {
      std::this_thread::sleep_for(std::min(interval, std::chrono::duration<double>(0.05)));
      if (progress && !check_finished.load()) {
        SweepProgress pr;
        pr.total = summary.total;
        pr.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
        pr.checking = true;
        pr.checked = checked.load();
        pr.to_check = found;
        progress(pr);
      }
    }
    checker.join();
    if (check_error) std::rethrow_exception(check_error);
    if (options.stop != nullptr && options.stop->load() && checked.load() < found) {
      // Stopped while checking: nothing was changed on disk.
      summary.resumed = found;
      for (const auto& row : old.rows) count_row(summary, row.status, row.reason);
      summary.interrupted = true;
      summary.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
      return summary;
    }
  }
  const std::size_t prefix = static_cast<std::size_t>(std::find(fresh.begin(), fresh.end(), 0) - fresh.begin());
  for (std::size_t k = 0; k < prefix; ++k) count_row(summary, old.rows[k].status, old.rows[k].reason);
  const auto truncate = [&](const fs::path& p, std::uint64_t size) {
    if (!fs::exists(p)) return;
    fs::resize_file(p, size, ec);
    if (ec) fail(file_loc(p), fmt::format("cannot truncate the file: {}", ec.message()), "check its permissions");
  };
  truncate(csv_path, old.csv_ends[prefix]);
  truncate(jsonl_path, old.jsonl_ends[prefix]);
  std::ofstream csv(csv_path, std::ios::binary | std::ios::app);
  std::ofstream jsonl(jsonl_path, std::ios::binary | std::ios::app);
  if (!csv || !jsonl) fail(file_loc(dir), "cannot open the result files for writing", "check the folder is writable");
  if (old.csv_ends[prefix] == 0) {
    csv << csv_header(sweep);
    csv.flush();
  }

  // The points after the prefix, in order, through a window of slots: a worker takes the next point only when it
  // is fewer than `window` ahead of the last row written, so memory stays bounded for any grid.
  const std::size_t todo = summary.total - prefix;
  const std::size_t window = std::max<std::size_t>(64, std::size_t{8} * threads);
  std::vector<std::optional<SweepRow>> slots(std::min(window, std::max<std::size_t>(todo, 1)));
  const std::size_t nslots = slots.size();
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t completed = 0;  // evaluated by this run (not kept rows)
  std::size_t next = 0;
  std::size_t written = 0;
  std::atomic<bool> abort{false};
  std::exception_ptr error;
  std::size_t running = 0;
  auto stopped = [&] { return abort.load() || (options.stop != nullptr && options.stop->load()); };
  auto worker = [&] {
    for (;;) {
      std::size_t j = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stopped() || next >= todo || next < written + nslots; });
        if (stopped() || next >= todo) break;
        j = next++;
      }
      try {
        const std::size_t k = prefix + j;  // position in the shard
        SweepRow row;
        bool evaluated = true;
        if (k < found && fresh[k]) {
          row.point = shard.point(k);
          row.csv = std::move(old.rows[k].csv);
          row.json = std::move(old.rows[k].json);
          row.status = old.rows[k].status;
          row.reason = old.rows[k].reason;
          row.inputs = old.rows[k].inputs;
          evaluated = false;
        } else {
          row = evaluate_sweep_point(sweep, shard.point(k), &cache);
        }
        const std::lock_guard<std::mutex> lock(mutex);
        slots[j % nslots] = std::move(row);
        if (evaluated) ++completed;
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        abort = true;
      }
      cv.notify_all();
    }
    const std::lock_guard<std::mutex> lock(mutex);
    --running;
    cv.notify_all();
  };
  const unsigned pool_size = std::min<unsigned>(
      threads, static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>(todo, 1), 1u << 16)));
  std::vector<std::thread> pool;
  running = todo > 0 ? pool_size : 0;
  for (unsigned t = 0; t < running; ++t) pool.emplace_back(worker);

  std::size_t kept = prefix;  // rows of the earlier run in the files
  std::size_t computed = 0;
  auto report = [&](bool finished) {  // with mutex not held
    if (!progress) return;
    SweepProgress pr;
    pr.total = summary.total;
    pr.resumed = kept;
    pr.computed = computed;
    pr.done = kept + computed;
    pr.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::size_t rate_base = 0;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      rate_base = std::max(completed, computed);
    }
    pr.points_per_s = pr.elapsed_s > 0 ? static_cast<double>(rate_base) / pr.elapsed_s : 0.0;
    pr.eta_s = pr.points_per_s > 0 ? static_cast<double>(summary.total - pr.done) / pr.points_per_s : -1.0;
    pr.finished = finished;
    progress(pr);
  };
  report(false);
  auto last_report = Clock::now();
  const auto interval = std::chrono::duration<double>(std::max(0.01, options.progress_interval_s));
  std::unique_lock<std::mutex> lock(mutex);
  while (written < todo) {
    cv.wait_for(lock, interval, [&] { return slots[written % nslots].has_value() || running == 0; });
    std::vector<SweepRow> ready;
    while (written + ready.size() < todo && ready.size() < nslots &&
           slots[(written + ready.size()) % nslots].has_value()) {
      auto& slot = slots[(written + ready.size()) % nslots];
      ready.push_back(std::move(*slot));
      slot.reset();
    }
    const bool done_running = running == 0;
    lock.unlock();
    for (std::size_t i = 0; i < ready.size(); ++i) {
      const SweepRow& row = ready[i];
      csv << row.csv;
      jsonl << row.json;
      csv.flush();
      jsonl.flush();
      if (!csv || !jsonl) {
        abort = true;
        cv.notify_all();
        for (auto& t : pool) t.join();
        fail(file_loc(dir), "writing the result files failed", "check free disk space");
      }
      count_row(summary, row.status, row.reason);
      const std::size_t k = prefix + written + i;  // position in the shard
      if (k < found && fresh[k]) {
        ++kept;
      } else {
        ++computed;
        if (k < found) ++summary.stale;
      }
    }
    lock.lock();
    written += ready.size();
    cv.notify_all();  // workers waiting for the window
    if (!ready.empty() || Clock::now() - last_report >= interval) {
      lock.unlock();
      report(false);
      last_report = Clock::now();
      lock.lock();
    }
    if (done_running && ready.empty() && (written >= todo || !slots[written % nslots].has_value())) break;
  }
  lock.unlock();
  abort = abort.load() || written < todo;  // interrupted: let the workers stop
  cv.notify_all();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  summary.resumed = kept;
  summary.computed = computed;
  summary.interrupted = written < todo;
  summary.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  report(true);
  return summary;
}

MergeSummary merge_sweeps(const std::string& out_dir, const std::vector<std::string>& shard_dirs) {
  const std::string again = "rerun that shard's `harmony-sim sweep ... --shard I/N --out DIR` (it resumes), then merge";
  if (shard_dirs.empty())
    fail(core::SourceLoc{"merge", 0, 0}, "no shard folders given", "harmony-sim merge OUT SHARD_DIR...");
  struct In {
    fs::path dir;
    Shard shard;
    std::string fingerprint;
    std::size_t points = 0;
    std::string identity;  // sweep.json without its shard and sweep file: equal for the shards of one sweep
    std::string meta_text;
    std::string csv, jsonl;
    Lines csv_lines, jsonl_lines;
  };
  // Held by pointer: the lines are views into the strings beside them, which must not move.
  std::vector<std::unique_ptr<In>> held;
  std::vector<In*> ins;
  held.reserve(shard_dirs.size());
  ins.reserve(shard_dirs.size());
  std::vector<std::unique_ptr<FolderLock>> locks;  // shared on every shard: no sweep writes into one meanwhile
  for (const auto& d : shard_dirs) {
    if (fs::is_directory(d)) locks.push_back(std::make_unique<FolderLock>(fs::path(d), LockMode::Read));
    auto in = std::make_unique<In>();
    in->dir = d;
    const fs::path meta_path = in->dir / kMetaFile;
    if (!fs::exists(meta_path))
      fail(file_loc(in->dir), "not a sweep output folder (no sweep.json)", "give the --out folders of the shards");
    auto meta = read_meta(meta_path);
    in->shard = meta_shard(meta, meta_path);
    in->fingerprint = meta.at("fingerprint").dump();
    in->points = meta.at("points").get<std::size_t>();
    in->meta_text = meta.dump();
    meta.erase("shard");
    meta.erase("sweep_file");
    meta.erase("sweep_file_absolute");
    in->identity = meta.dump();
    ins.push_back(in.get());
    held.push_back(std::move(in));
  }
  const In& first = *ins.front();
  const std::size_t count = first.shard.count;
  const std::size_t points = first.points;
  std::vector<const In*> by_index(count, nullptr);
  for (const In* in_ptr : ins) {
    const In& in = *in_ptr;
    const fs::path meta_path = in.dir / kMetaFile;
    if (in.fingerprint != first.fingerprint || in.identity != first.identity)
      fail(file_loc(meta_path),
           fmt::format("a different sweep from {} (fingerprint {} vs {})", (first.dir / kMetaFile).generic_string(),
                       in.fingerprint, first.fingerprint),
           "merge only the shards of one sweep file");
    if (in.shard.count != count)
      fail(file_loc(meta_path),
           fmt::format("shard {}/{} does not split the sweep like {} ({} shards)", in.shard.index, in.shard.count,
                       first.dir.generic_string(), count),
           "merge the shards of one --shard I/N split");
    if (by_index[in.shard.index])
      fail(file_loc(meta_path),
           fmt::format("shard {}/{} is given twice (also {})", in.shard.index, count,
                       by_index[in.shard.index]->dir.generic_string()),
           "give each shard's folder once");
    by_index[in.shard.index] = &in;
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < count; ++i) {
    if (!by_index[i]) missing.push_back(fmt::format("{}/{}", i, count));
  }
  if (!missing.empty())
    fail(core::SourceLoc{"merge", 0, 0}, fmt::format("missing shard(s) {}", join(missing, ", ")),
         "give the --out folder of every shard 0/N .. N-1/N");

  std::string header;
  for (In* in_ptr : ins) {
    In& in = *in_ptr;
    in.csv = slurp(in.dir / kCsvFile);
    in.jsonl = slurp(in.dir / kJsonlFile);
    in.csv_lines = complete_lines(in.csv);
    in.jsonl_lines = complete_lines(in.jsonl);
    const std::size_t want = in.shard.size(points);
    const std::size_t csv_rows = in.csv_lines.lines.empty() ? 0 : in.csv_lines.lines.size() - 1;
    if (in.jsonl_lines.lines.size() != want || csv_rows != want || in.csv_lines.ends.empty() ||
        in.csv_lines.ends.back() != in.csv.size() || (want > 0 && in.jsonl_lines.ends.back() != in.jsonl.size()))
      fail(file_loc(in.dir),
           fmt::format("shard {}/{} is incomplete: {} of its {} points", in.shard.index, count,
                       std::min(in.jsonl_lines.lines.size(), csv_rows), want),
           again);
    const std::string h(in.csv_lines.lines[0]);
    if (header.empty()) header = h;
    if (h != header) fail(file_loc(in.dir / kCsvFile, 1), "its columns differ from the other shards'", again);
  }

  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    fail(file_loc(out), "cannot create the output folder", "pick a writable folder for the merged results");
  const auto refuse_results = [&] {
    for (const char* f : {kMetaFile, kCsvFile, kJsonlFile}) {
      if (fs::exists(out / f))
        fail(file_loc(out / f), "the merge output folder already holds results", "merge into a new, empty folder");
    }
  };
  refuse_results();  // before locking: a shard folder given as the output is named as such
  // exclusive on the output: a concurrent merge (or sweep) into it is refused naming the holder; checked again
  // under the lock for one that finished in between
  const FolderLock out_lock(out);
  refuse_results();
  std::string csv = header + "\n";
  std::string jsonl;
  for (std::size_t p = 0; p < points; ++p) {
    const In& in = *by_index[p % count];
    const std::size_t k = p / count;
    const auto key = row_key(in.jsonl_lines.lines[k]);
    if (!key || key->first != p || !starts_with(in.csv_lines.lines[k + 1], fmt::format("{},{},", p, key->second)))
      fail(file_loc(in.dir / kJsonlFile, static_cast<int>(k + 1)), fmt::format("row {} is not point {}", k + 1, p),
           again);
    csv += in.csv_lines.lines[k + 1];
    csv += '\n';
    jsonl += in.jsonl_lines.lines[k];
    jsonl += '\n';
  }
  auto meta = nlohmann::ordered_json::parse(first.meta_text);
  meta["shard"] = shard_json(Shard{});
  write_atomically(out / kCsvFile, csv);
  write_atomically(out / kJsonlFile, jsonl);
  write_atomically(out / kMetaFile, dump_meta(meta));
  return MergeSummary{points, count};
}

}  // namespace harmony::sim
