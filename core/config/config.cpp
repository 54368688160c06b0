// The YAML config loader: reads configs, machine files and the built-in machine presets (embedded at
// build time from configs/machines/ by scripts/embed_presets.py) into RunConfig / MachineSpec, applies
// `--set a.b=value` overrides, and validates every key, reporting file:line:column with a hint.
// The schema is documented in docs/config.md and, for machines, docs/machines.md; keep them in step.
#include "core/config/config.hpp"

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
#include "core/program/baselines/baselines.hpp"

namespace harmony::core {

namespace {

struct EmbeddedPreset {
  std::string_view name;
  std::string_view yaml;
};

constexpr EmbeddedPreset kEmbeddedPresets[] = {
#include "machine_presets.inc"
};

// ------------------------------------------------------------------------------------------------
// A YAML tree that remembers where each node came from (yaml-cpp nodes cannot be re-located after
// overrides are grafted in, and their marks are 0-based).

struct Entry;

struct Node {
  enum class Kind { Null, Scalar, Seq, Map };
  Kind kind = Kind::Null;
  std::string scalar;
  std::vector<Node> items;     // Seq
  std::vector<Entry> entries;  // Map, in file order
  SourceLoc loc;
};

struct Entry {
  std::string key;
  SourceLoc key_loc;
  Node value;
};

// Aliases are expanded when copying, so a few lines of anchors could otherwise blow up.
constexpr std::size_t kMaxNodes = 100'000;
// The machine of a config without `machine:`.
constexpr std::string_view kDefaultPreset = "paper-1080ti";
// Machine files may name a base (preset or file); this bounds `file:` chains and cycles.
constexpr int kMaxMachineDepth = 8;

constexpr const char* kYamlHint =
    "check the indentation (spaces, not tabs), that each `key: value` has a space after the colon, and that "
    "brackets and quotes are closed; flow lists look like [a, b]";

SourceLoc loc_from_mark(const YAML::Mark& mark, const std::string& file) {
  if (mark.line < 0 || mark.column < 0) return SourceLoc{file, 0, 0};
  return SourceLoc{file, mark.line + 1, mark.column + 1};
}

class TreeBuilder {
 public:
  // With `fixed`, every node gets that location (override values); otherwise the yaml-cpp mark.
  TreeBuilder(std::string file, std::optional<SourceLoc> fixed) : file_(std::move(file)), fixed_(std::move(fixed)) {}

  Node build(const YAML::Node& y, const SourceLoc& fallback) {
    if (++count_ > kMaxNodes)
      throw ConfigError(fallback, fmt::format("the YAML expands to more than {} nodes", kMaxNodes),
                        "a config has a few dozen keys; check for runaway anchors and aliases");
    Node n;
    n.loc = located(y.Mark(), fallback);
    switch (y.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        n.kind = Node::Kind::Null;
        break;
      case YAML::NodeType::Scalar:
        n.kind = Node::Kind::Scalar;
        n.scalar = y.Scalar();
        break;
      case YAML::NodeType::Sequence:
        n.kind = Node::Kind::Seq;
        for (const auto& item : y) n.items.push_back(build(item, n.loc));
        break;
      case YAML::NodeType::Map:
        n.kind = Node::Kind::Map;
        for (auto it = y.begin(); it != y.end(); ++it) {
          const SourceLoc key_loc = located(it->first.Mark(), n.loc);
          if (!it->first.IsScalar())
            throw ConfigError(key_loc, "a key must be a plain name, not a list or mapping",
                              "write keys as `name: value`");
          Entry e{it->first.Scalar(), key_loc, {}};
          for (const Entry& other : n.entries) {
            if (other.key == e.key)
              throw ConfigError(key_loc, fmt::format("duplicate key '{}'", e.key),
                                fmt::format("'{}' is already given at {}; keep one", e.key, other.key_loc.str()));
          }
          e.value = build(it->second, key_loc);
          n.entries.push_back(std::move(e));
        }
        break;
    }
    return n;
  }

 private:
  SourceLoc located(const YAML::Mark& mark, const SourceLoc& fallback) const {
    if (fixed_) return *fixed_;
    if (mark.line < 0 || mark.column < 0) return fallback;
    return SourceLoc{file_, mark.line + 1, mark.column + 1};
  }

  std::string file_;
  std::optional<SourceLoc> fixed_;
  std::size_t count_ = 0;
};

// Parses YAML text into a located tree. `fixed` pins every location (used for --set values).
Node parse_yaml(const std::string& text, const std::string& file, const std::optional<SourceLoc>& fixed = {},
                const std::string& what = "malformed YAML") {
  YAML::Node y;
  try {
    y = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(fixed ? *fixed : loc_from_mark(e.mark, file), fmt::format("{}: nested too deeply", what),
                      "a config nests a few levels; check for runaway brackets");
  } catch (const YAML::Exception& e) {
    throw ConfigError(fixed ? *fixed : loc_from_mark(e.mark, file), fmt::format("{}: {}", what, e.msg), kYamlHint);
  }
  try {
    return TreeBuilder(file, fixed).build(y, fixed ? *fixed : SourceLoc{file, 0, 0});
  } catch (const YAML::Exception& e) {
    throw ConfigError(fixed ? *fixed : loc_from_mark(e.mark, file), fmt::format("{}: {}", what, e.msg), kYamlHint);
  }
}

// ------------------------------------------------------------------------------------------------
// Small helpers

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string join_ints(const std::vector<int>& items) {
  std::vector<std::string> s;
  s.reserve(items.size());
  for (int v : items) s.push_back(std::to_string(v));
  return join(s);
}

std::string describe(const Node& n) {
  switch (n.kind) {
    case Node::Kind::Null:
      return "nothing";
    case Node::Kind::Scalar:
      return fmt::format("'{}'", n.scalar);
    case Node::Kind::Seq:
      return "a list";
    case Node::Kind::Map:
      return "a mapping";
  }
  return "?";
}

std::string qualify(const std::string& section, std::string_view key) {
  return section.empty() ? std::string(key) : section + "." + std::string(key);
}

std::string suggestion_hint(const std::string& word, const std::vector<std::string>& valid, std::string_view what) {
  const std::string best = closest_match(word, valid);
  std::string hint = best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best);
  return hint + fmt::format("{}: {}", what, join(valid));
}

[[noreturn]] void fail(const SourceLoc& loc, const std::string& message, const std::string& hint = {}) {
  throw ConfigError(loc, message, hint);
}

void check_keys(const Node& map, const std::string& section, const std::vector<std::string>& valid) {
  for (const Entry& e : map.entries) {
    if (std::find(valid.begin(), valid.end(), e.key) != valid.end()) continue;
    const std::string message = section.empty() ? fmt::format("unknown top-level key '{}'", e.key)
                                                : fmt::format("unknown key '{}' in {}", e.key, section);
    fail(e.key_loc, message, suggestion_hint(e.key, valid, "valid keys"));
  }
}

// The entry for `key` when present with a non-null value; null values count as absent (`key: ~`).
const Entry* find(const Node& map, std::string_view key) {
  for (const Entry& e : map.entries) {
    if (e.key == key) return e.value.kind == Node::Kind::Null ? nullptr : &e;
  }
  return nullptr;
}

const Entry* find_any(const Node& map, std::string_view key) {
  for (const Entry& e : map.entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

// A required key: missing -> error at the section's key; present but empty -> error at the key.
const Entry& require(const Node& map, std::string_view key, const std::string& section, const SourceLoc& section_loc,
                     const std::string& hint) {
  if (const Entry* e = find(map, key)) return *e;
  const std::string name = qualify(section, key);
  if (const Entry* empty = find_any(map, key)) fail(empty->key_loc, fmt::format("{} has no value", name), hint);
  fail(section_loc, fmt::format("missing required field {}", name), hint);
}

// A section that must be a mapping when given; nullptr when absent or null.
const Node* section_map(const Node& root, std::string_view key) {
  const Entry* e = find(root, key);
  if (!e) return nullptr;
  if (e->value.kind != Node::Kind::Map)
    fail(e->value.loc, fmt::format("{} must be a mapping of keys, got {}", key, describe(e->value)),
         fmt::format("write `{}:` followed by indented `key: value` lines, or {}: {{key: value}}", key, key));
  return &e->value;
}

const std::string& expect_scalar(const Node& v, const std::string& what, std::string_view expected,
                                 const std::string& hint = {}) {
  if (v.kind != Node::Kind::Scalar)
    fail(v.loc, fmt::format("{} must be {}, got {}", what, expected, describe(v)), hint);
  return v.scalar;
}

std::string get_string(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a string");
  if (s.empty()) fail(v.loc, fmt::format("{} must not be empty", what));
  return s;
}

int get_int(const Node& v, const std::string& what, int min) {
  const std::string hint = fmt::format("write a whole number from {} to {}", min, std::numeric_limits<int>::max());
  const std::string& s = expect_scalar(v, what, "an integer", hint);
  long long value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ptr != s.data() + s.size() || s.empty() || (ec != std::errc() && ec != std::errc::result_out_of_range))
    fail(v.loc, fmt::format("{} must be an integer, got '{}'", what, s), hint);
  if (ec == std::errc::result_out_of_range || value > std::numeric_limits<int>::max() ||
      value < std::numeric_limits<int>::min())
    fail(v.loc, fmt::format("{} = {} is out of range", what, s), hint);
  if (value < min) fail(v.loc, fmt::format("{} must be at least {}, got {}", what, min, value), hint);
  return static_cast<int>(value);
}

bool get_bool(const Node& v, const std::string& what) {
  const std::string hint = "write true or false";
  const std::string& s = expect_scalar(v, what, "true or false", hint);
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  fail(v.loc, fmt::format("{} must be true or false, got '{}'", what, s), hint);
}

double get_positive_double(const Node& v, const std::string& what) {
  const std::string hint = "write a positive number, e.g. 1.0 or 0.9";
  const std::string& s = expect_scalar(v, what, "a number", hint);
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value))
    fail(v.loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  if (!(value > 0.0)) fail(v.loc, fmt::format("{} must be positive, got {}", what, s), hint);
  return value;
}

bool starts_negative(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  return first != std::string::npos && s[first] == '-';
}

constexpr const char* kSizeHint =
    "write a size like 10GiB, 512 MiB, 11GB or a byte count like 10737418240 (binary KiB/MiB/GiB/TiB, decimal "
    "KB/MB/GB/TB; units are case-sensitive)";
constexpr const char* kBandwidthHint =
    "write a bandwidth like 11.5GiB/s, 16 GB/s, 500MiB/s or a plain number of bytes per second like 12348030976 "
    "(units are case-sensitive)";
constexpr const char* kDurationHint =
    "write a duration like 40ms, 0.04s, 250us, 10ns or a plain number of seconds like 0.04";

// Range checks for quantities (the bounds and their reasons: core/base/units.hpp, docs/config.md).
const std::string kBytesRange = "sizes range from 1 B to 1 PiB (2^50 = 1125899906842624 bytes)";
const std::string kBandwidthRange = "bandwidths range from 1 KB/s (1000 B/s) to 1 EB/s (1e18 B/s)";
const std::string kDurationRange =
    "durations range from 0 to 1e6 s (11.6 days), so sums of them fit the "
    "simulated time range of about 9.2e6 s";

Bytes check_bytes_range(const Node& v, const std::string& what, const std::string& s, Bytes bytes,
                        const std::string& hint) {
  if (bytes > kMaxInputBytes)
    fail(v.loc, fmt::format("{} = '{}' is too large", what, s), fmt::format("{}; {}", kBytesRange, hint));
  return bytes;
}

double check_bandwidth_range(const Node& v, const std::string& what, const std::string& s, double bytes_per_s,
                             const std::string& hint) {
  if (!(bytes_per_s >= kMinInputBytesPerS) || !(bytes_per_s <= kMaxInputBytesPerS))
    fail(v.loc, fmt::format("{} = '{}' is too {}", what, s, bytes_per_s < kMinInputBytesPerS ? "small" : "large"),
         fmt::format("{}; {}", kBandwidthRange, hint));
  return bytes_per_s;
}

double check_duration_range(const Node& v, const std::string& what, const std::string& s, double seconds,
                            const std::string& hint) {
  if (!(seconds <= kMaxInputSeconds))
    fail(v.loc, fmt::format("{} = '{}' is too long", what, s), fmt::format("{}; {}", kDurationRange, hint));
  return seconds;
}

Bytes get_bytes(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a size", kSizeHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kSizeHint);
  const auto bytes = parse_bytes(s);
  if (!bytes) fail(v.loc, fmt::format("{}: '{}' is not a valid size", what, s), kSizeHint);
  if (*bytes <= 0) fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kSizeHint);
  return check_bytes_range(v, what, s, *bytes, kSizeHint);
}

double get_bandwidth(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a bandwidth", kBandwidthHint);
  if (starts_negative(s))
    fail(v.loc, fmt::format("{} must be a positive bandwidth, got '{}'", what, s), kBandwidthHint);
  const auto bw = parse_bandwidth(s);
  if (bw) return check_bandwidth_range(v, what, s, *bw, kBandwidthHint);
  if (const auto as_size = parse_bytes(s); as_size && *as_size > 0)
    fail(v.loc, fmt::format("{}: '{}' is a size, not a bandwidth", what, s),
         fmt::format("did you mean '{}/s'? {}", s, kBandwidthHint));
  fail(v.loc, fmt::format("{}: '{}' is not a valid positive bandwidth", what, s), kBandwidthHint);
}

double get_duration(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a duration", kDurationHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must not be negative, got '{}'", what, s), kDurationHint);
  const auto d = parse_duration_s(s);
  if (!d) fail(v.loc, fmt::format("{}: '{}' is not a valid duration", what, s), kDurationHint);
  return check_duration_range(v, what, s, *d, kDurationHint);
}

// A list value; a single scalar counts as a one-element list (handy for --set search.u_fwd=8).
std::vector<const Node*> get_list(const Node& v, const std::string& what, std::string_view example) {
  std::vector<const Node*> out;
  if (v.kind == Node::Kind::Scalar) {
    out.push_back(&v);
  } else if (v.kind == Node::Kind::Seq) {
    for (const Node& item : v.items) out.push_back(&item);
  } else if (v.kind != Node::Kind::Null) {
    fail(v.loc, fmt::format("{} must be a list, got {}", what, describe(v)), fmt::format("e.g. {}", example));
  }
  return out;
}

std::string resolve_path(const std::string& base_dir, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute() || base_dir.empty()) return p.lexically_normal().string();
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

std::string parent_dir(const std::string& file) { return std::filesystem::path(file).parent_path().string(); }

// The files read while one load_config / load_config_text call builds its RunConfig (RunConfig::inputs); per
// thread, since configs are loaded on many threads at once (sweeps).
thread_local std::vector<std::string>* t_files_read = nullptr;

class RecordFilesRead {
 public:
  RecordFilesRead() : previous_(t_files_read) { t_files_read = &files_; }
  ~RecordFilesRead() { t_files_read = previous_; }
  RecordFilesRead(const RecordFilesRead&) = delete;
  RecordFilesRead& operator=(const RecordFilesRead&) = delete;
  // The files read, then the profile the config names (read later by load_model), each once.
  std::vector<std::string> take(const RunConfig& cfg) {
    std::vector<std::string> out;
    for (auto& f : files_) {
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(std::move(f));
    }
    if (!cfg.model.profile_path.empty() && std::find(out.begin(), out.end(), cfg.model.profile_path) == out.end())
      out.push_back(cfg.model.profile_path);
    return out;
  }

 private:
  std::vector<std::string> files_;
  std::vector<std::string>* previous_;
};

// Reads one input file through the shared check (core::try_read_input_file: regular files only, never blocks on
// a FIFO), recording it in RunConfig::inputs. nullopt with *problem = the reason when it cannot be read.
std::optional<std::string> read_text_file(const std::string& path, std::string* problem) {
  if (t_files_read) t_files_read->push_back(path);
  return try_read_input_file(path, problem);
}

// ------------------------------------------------------------------------------------------------
// Machines

const std::vector<std::string> kMachineSpecKeys = {
    "name",     "gpu",       "gpus",     "gpu_memory", "memory_cap_scale",
    "bw_swap",  "bw_p2p",    "bw_msg",   "time_del",   "price_per_hour",
    "topology", "gpu_rates", "cpu_adam", "compute",    "dispatch"};

std::vector<std::string> machine_keys_with_base() {
  std::vector<std::string> keys = {"preset", "file"};
  keys.insert(keys.end(), kMachineSpecKeys.begin(), kMachineSpecKeys.end());
  return keys;
}

const EmbeddedPreset* find_preset(std::string_view name) {
  for (const EmbeddedPreset& p : kEmbeddedPresets) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

bool looks_like_path(const std::string& s) {
  const auto ends_with = [&](std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return s.find('/') != std::string::npos || s.find('\\') != std::string::npos || ends_with(".yaml") ||
         ends_with(".yml");
}

[[noreturn]] void fail_unknown_preset(const std::string& name, const SourceLoc& loc) {
  const std::vector<std::string> names = machine_preset_names();
  const std::string best = closest_match(name, names);
  std::string hint = best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best);
  // The default machine first, then the rest in name order.
  std::vector<std::string> listed = {fmt::format("{} (the default)", kDefaultPreset)};
  for (const std::string& n : names) {
    if (n != kDefaultPreset) listed.push_back(n);
  }
  hint += fmt::format("built-in presets: {}; or give the path of a machine YAML file", join(listed));
  fail(loc, fmt::format("unknown machine preset '{}'", name), hint);
}

MachineSpec machine_from_preset(const std::string& name, const SourceLoc& loc, int depth);
MachineSpec machine_from_file(const std::string& path, const SourceLoc& ref_loc, int depth);

// A machine named by a string: a preset name, else a path (relative to `base_dir`).
MachineSpec machine_from_reference(const std::string& ref, const SourceLoc& loc, const std::string& base_dir,
                                   int depth) {
  if (find_preset(ref)) return machine_from_preset(ref, loc, depth);
  const std::string path = resolve_path(base_dir, ref);
  std::error_code ec;
  if (looks_like_path(ref) || std::filesystem::is_regular_file(path, ec)) return machine_from_file(path, loc, depth);
  fail_unknown_preset(ref, loc);
}

// ------------------------------------------------------------------------------------------------
// Machine topology: the `topology:` mapping of a machine (docs/machines.md). It is read into a draft
// that starts from the base machine's topology, if any, so a mapping with `preset:` can change single
// topology keys; the draft is then checked as a whole and becomes core::Topology.

// A topology's per-GPU tables and NVLink pairs grow with the GPU count; this keeps them small.
constexpr int kMaxTopologyGpus = 1024;

const std::vector<std::string> kTopologyKeys = {
    "sockets",     "inter_socket", "switches",    "gpus",      "p2p",       "nvlink", "latency",
    "host_memory", "pinned_limit", "host_memcpy", "cpu_cores", "free_time", "nvme",   "host_memory_bandwidth"};
const std::vector<std::string> kNvmeKeys = {"read", "write", "capacity", "latency"};
const std::vector<std::string> kSwitchKeys = {"name", "socket", "uplink"};
const std::vector<std::string> kGpuKeys = {"switch", "link", "copy_engines"};
const std::vector<std::string> kCopyEngineKeys = {"h2d", "d2h"};
const std::vector<std::string> kNvLinkKeys = {"gpus", "bandwidth"};
const std::vector<std::string> kP2PModes = {"pcie", "host"};

constexpr const char* kTopologySizeHint =
    "topology sizes need a unit: binary KiB/MiB/GiB/TiB or decimal KB/MB/GB/TB (case-sensitive); plain byte counts "
    "are accepted only by the reference key gpu_memory";
constexpr const char* kTopologyBandwidthHint =
    "topology bandwidths need a unit and are per direction, e.g. 12GB/s, 11.5GiB/s or 450GB/s; plain numbers are "
    "accepted only by the reference keys bw_swap, bw_p2p and bw_msg";
constexpr const char* kTopologyDurationHint =
    "topology durations need a unit: s, ms, us or ns, e.g. 10us; a bare 0 is accepted";

// Where a topology value came from: written in the mapping being read, or inherited from its base
// machine (then `loc` is where the base is named: its `preset:` or `file:` value).
struct Origin {
  SourceLoc loc;
  bool inherited = false;
};

struct TopologyDraft {
  Topology topo;                         // GpuSpec::pcie_switch is resolved from gpu_switch at the end
  std::vector<std::string> gpu_switch;   // per GPU, the switch it names ("" = none yet)
  std::vector<Origin> gpu_switch_at;     // per GPU
  std::vector<Origin> switch_socket_at;  // per switch
  Origin topology_at, sockets_at, switches_at, gpus_at, host_memory_at, pinned_limit_at;
};

std::string_view trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

// A number without a unit ("750", "12.5"); its value, or nullopt when the text has a unit or is no number.
std::optional<double> plain_number(std::string_view s) {
  s = trimmed(s);
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s.front())) || s.front() == '.')) return std::nullopt;
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// A capacity such as host_memory: a size with a unit, > 0.
Bytes get_capacity(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a size with a unit", kTopologySizeHint);
  const std::string leave_out = "; leave the key out for no limit";
  if (starts_negative(s))
    fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0)
      fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
    const std::string t(trimmed(s));
    const std::string suggestion = *n < 1e6 ? t + "GiB" : t + "B";
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}'? {}", suggestion, kTopologySizeHint));
  }
  const auto bytes = parse_bytes(s);
  if (!bytes) fail(v.loc, fmt::format("{}: '{}' is not a valid size", what, s), kTopologySizeHint);
  if (*bytes <= 0)
    fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
  return check_bytes_range(v, what, s, *bytes, kTopologySizeHint);
}

// A link bandwidth: a bandwidth with a unit, > 0.
double get_link_bandwidth(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a bandwidth with a unit", kTopologyBandwidthHint);
  const std::string positive = fmt::format("{} must be a positive bandwidth, got '{}'", what, s);
  if (starts_negative(s)) fail(v.loc, positive, kTopologyBandwidthHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) fail(v.loc, positive, kTopologyBandwidthHint);
    const std::string t(trimmed(s));
    const std::string suggestion = *n < 1e6 ? t + "GB/s" : t + "B/s";
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}'? {}", suggestion, kTopologyBandwidthHint));
  }
  if (const auto bw = parse_bandwidth(s)) return check_bandwidth_range(v, what, s, *bw, kTopologyBandwidthHint);
  const std::string_view t = trimmed(s);
  if (t.size() > 2 && t.substr(t.size() - 2) == "/s") {
    if (const auto size = parse_bytes(t.substr(0, t.size() - 2)); size && *size == 0)
      fail(v.loc, positive, kTopologyBandwidthHint);
  } else if (const auto size = parse_bytes(t); size && *size > 0) {
    fail(v.loc, fmt::format("{}: '{}' is a size, not a bandwidth", what, s),
         fmt::format("did you mean '{}/s'? {}", t, kTopologyBandwidthHint));
  }
  fail(v.loc, fmt::format("{}: '{}' is not a valid bandwidth", what, s), kTopologyBandwidthHint);
}

// A duration with a unit (a bare 0 is fine); `unit` is the one suggested for a bare number.
double get_topology_duration(const Node& v, const std::string& what, std::string_view unit) {
  const std::string& s = expect_scalar(v, what, "a duration with a unit", kTopologyDurationHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must not be negative, got '{}'", what, s), kTopologyDurationHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) return 0.0;
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}{}'? {}", trimmed(s), unit, kTopologyDurationHint));
  }
  const auto d = parse_duration_s(s);
  if (!d) fail(v.loc, fmt::format("{}: '{}' is not a valid duration", what, s), kTopologyDurationHint);
  return check_duration_range(v, what, s, *d, kTopologyDurationHint);
}

double get_price(const Node& v, const std::string& what) {
  const std::string hint = "write a plain number (the price of the whole machine per hour), e.g. 32.77";
  const std::string& s = expect_scalar(v, what, "a number", hint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must not be negative, got '{}'", what, s), hint);
  const auto n = plain_number(s);
  if (!n) fail(v.loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  return *n;
}

// ------------------------------------------------------------------------------------------------
// Compute rates for analytic models (docs/machines.md, `gpu_rates` and `cpu_adam`): key by key over the base's.

const std::vector<std::string> kGpuRatesKeys = {"matrix_fp32",     "matrix_fp16",       "memory",
                                                "gemm_efficiency", "vector_efficiency", "overhead"};
const std::vector<std::string> kGemmEfficiencyKeys = {"max", "half"};
const std::vector<std::string> kOverheadKeys = {"kernel", "forward", "backward"};
const std::vector<std::string> kCpuAdamKeys = {"bandwidth", "per_layer"};

constexpr const char* kFlopsHint =
    "write a rate with a unit, e.g. 11.3TFLOP/s, 312 TFLOP/s or 500GFLOP/s (prefixes k, M, G, T, P; case-sensitive)";

double get_flops_per_s(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a FLOP rate", kFlopsHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must be a positive rate, got '{}'", what, s), kFlopsHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) fail(v.loc, fmt::format("{} must be a positive rate, got '{}'", what, s), kFlopsHint);
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}{}'? {}", trimmed(s), *n < 1e6 ? "TFLOP/s" : "FLOP/s", kFlopsHint));
  }
  if (const auto f = parse_flops_per_s(s)) {
    if (!(*f >= kMinInputFlopsPerS) || !(*f <= kMaxInputFlopsPerS))
      fail(v.loc, fmt::format("{} = '{}' is too {}", what, s, *f < kMinInputFlopsPerS ? "small" : "large"),
           fmt::format("FLOP rates range from 1 MFLOP/s to 1000 PFLOP/s (1e18 FLOP/s); {}", kFlopsHint));
    return *f;
  }
  if (parse_flop_count(s))
    fail(v.loc, fmt::format("{}: '{}' is an amount of work, not a rate", what, s),
         fmt::format("did you mean '{}/s'? {}", trimmed(s), kFlopsHint));
  fail(v.loc, fmt::format("{}: '{}' is not a valid FLOP rate", what, s), kFlopsHint);
}

double get_flop_count(const Node& v, const std::string& what) {
  const char* hint = "write an amount of work with a unit, e.g. 0.7GFLOP or 500MFLOP (prefixes k, M, G, T, P)";
  const std::string& s = expect_scalar(v, what, "a FLOP count", hint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must be positive, got '{}'", what, s), hint);
  if (const auto n = plain_number(s); n && *n > 0.0)
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}GFLOP'? {}", trimmed(s), hint));
  if (const auto f = parse_flop_count(s)) {
    if (!(*f <= kMaxInputFlops))
      fail(v.loc, fmt::format("{} = '{}' is too large", what, s),
           fmt::format("FLOP counts range up to 1000 PFLOP (1e18 FLOP); {}", hint));
    return *f;
  }
  fail(v.loc, fmt::format("{}: '{}' is not a valid FLOP count", what, s), hint);
}

// A fraction in (0, 1].
double get_fraction(const Node& v, const std::string& what) {
  const std::string hint = "write a number in (0, 1], the fraction of the peak reached, e.g. 0.8";
  const std::string& s = expect_scalar(v, what, "a number", hint);
  const auto n = plain_number(s);
  if (!n || starts_negative(s)) fail(v.loc, fmt::format("{} must be a number in (0, 1], got '{}'", what, s), hint);
  if (!(*n > 0.0) || *n > 1.0) fail(v.loc, fmt::format("{} must be in (0, 1], got {}", what, s), hint);
  return *n;
}

const Node& sub_map(const Entry& e, const std::string& what, const std::vector<std::string>& keys,
                    const char* example) {
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("{} must be a mapping, got {}", what, describe(e.value)), example);
  check_keys(e.value, what, keys);
  return e.value;
}

void apply_gpu_rates(GpuRates& r, const Entry& e, const std::string& what) {
  const char* example =
      "e.g. gpu_rates: {matrix_fp32: 11.3TFLOP/s, memory: 484GB/s, gemm_efficiency: {max: 0.8, half: 0.7GFLOP}}";
  const Node& map = sub_map(e, what, kGpuRatesKeys, example);
  if (const Entry* x = find(map, "matrix_fp32"))
    r.matrix_fp32_flops_per_s = get_flops_per_s(x->value, what + ".matrix_fp32");
  if (const Entry* x = find(map, "matrix_fp16"))
    r.matrix_fp16_flops_per_s = get_flops_per_s(x->value, what + ".matrix_fp16");
  if (const Entry* x = find(map, "memory")) r.memory_bytes_per_s = get_link_bandwidth(x->value, what + ".memory");
  if (const Entry* x = find(map, "gemm_efficiency")) {
    const std::string w = what + ".gemm_efficiency";
    const Node& g = sub_map(*x, w, kGemmEfficiencyKeys, "e.g. gemm_efficiency: {max: 0.8, half: 0.7GFLOP}");
    if (const Entry* y = find(g, "max")) r.gemm_efficiency_max = get_fraction(y->value, w + ".max");
    if (const Entry* y = find(g, "half")) r.gemm_half_flops = get_flop_count(y->value, w + ".half");
  }
  if (const Entry* x = find(map, "vector_efficiency"))
    r.vector_efficiency = get_fraction(x->value, what + ".vector_efficiency");
  if (const Entry* x = find(map, "overhead")) {
    const std::string w = what + ".overhead";
    const Node& o = sub_map(*x, w, kOverheadKeys, "e.g. overhead: {kernel: 20us, forward: 90us, backward: 520us}");
    if (const Entry* y = find(o, "kernel")) r.kernel_floor_s = get_topology_duration(y->value, w + ".kernel", "us");
    if (const Entry* y = find(o, "forward"))
      r.forward_overhead_s = get_topology_duration(y->value, w + ".forward", "us");
    if (const Entry* y = find(o, "backward"))
      r.backward_overhead_s = get_topology_duration(y->value, w + ".backward", "us");
  }
  if (!r.valid())
    fail(e.key_loc, fmt::format("{} needs matrix_fp32 and memory", what),
         "give at least the GPU's FP32 GEMM peak and its memory bandwidth, e.g. "
         "gpu_rates: {matrix_fp32: 11.3TFLOP/s, memory: 484GB/s} (docs/machines.md)");
}

void apply_cpu_adam(CpuAdam& c, const Entry& e, const std::string& what) {
  const Node& map = sub_map(e, what, kCpuAdamKeys, "e.g. cpu_adam: {bandwidth: 3.6GB/s, per_layer: 300us}");
  if (const Entry* x = find(map, "bandwidth")) c.bytes_per_s = get_link_bandwidth(x->value, what + ".bandwidth");
  if (const Entry* x = find(map, "per_layer"))
    c.per_layer_s = get_topology_duration(x->value, what + ".per_layer", "us");
}

// ------------------------------------------------------------------------------------------------
// Shared compute and dispatch overheads for the native model (docs/machines.md, `compute` and `dispatch`).

const std::vector<std::string> kComputeKeys = {"units", "units_per_op", "time_scale", "update_time_scale"};
const std::vector<std::string> kDispatchKeys = {"compute", "copy", "p2p", "update"};

// A plain number in [lo, hi] (lo itself only when `lo_inclusive`).
double get_number_in(const Node& v, const std::string& what, double lo, bool lo_inclusive, double hi,
                     const std::string& hint) {
  const std::string& s = expect_scalar(v, what, "a number", hint);
  const auto n = plain_number(s);
  if (!n || starts_negative(s)) {
    if (starts_negative(s) && !lo_inclusive) fail(v.loc, fmt::format("{} must be positive, got '{}'", what, s), hint);
    fail(v.loc, fmt::format("{} must be a plain number, got '{}'", what, s), hint);
  }
  if ((lo_inclusive ? *n < lo : *n <= lo) || *n > hi)
    fail(v.loc, fmt::format("{} = {} is out of range", what, s), hint);
  return *n;
}

void apply_compute(ComputeSharing& c, const Entry& e, const std::string& what) {
  const Node& map = sub_map(e, what, kComputeKeys, "e.g. compute: {units: 2, units_per_op: 1, time_scale: 1.1}");
  if (const Entry* x = find(map, "units"))
    c.units = get_number_in(x->value, what + ".units", 0.0, true, 1e6,
                            "the compute units every device shares, from 0 (not shared: each device computes alone) "
                            "to 1e6, e.g. units: 2 for logical devices on a 2-core host");
  if (const Entry* x = find(map, "units_per_op"))
    c.units_per_op =
        get_number_in(x->value, what + ".units_per_op", 0.0, false, 1e6,
                      "the most units one compute op uses, in (0, units], e.g. 1 for one thread per kernel");
  if (const Entry* x = find(map, "time_scale"))
    c.time_scale = get_number_in(x->value, what + ".time_scale", 0.0, false, 1000.0,
                                 "a factor in (0, 1000] on every profiled FWD/REC/BWD time, e.g. 1.1");
  if (const Entry* x = find(map, "update_time_scale"))
    c.update_time_scale = get_number_in(x->value, what + ".update_time_scale", 0.0, false, 1000.0,
                                        "a factor in (0, 1000] on every profiled CPU update time, e.g. 0.9");
  if (c.shared() && c.units_per_op > c.units)
    fail(e.key_loc, fmt::format("{}.units_per_op ({}) exceeds {}.units ({})", what, c.units_per_op, what, c.units),
         "one op cannot use more units than the pool has: lower units_per_op or raise units");
}

void apply_dispatch(DispatchOverheads& d, const Entry& e, const std::string& what) {
  const Node& map =
      sub_map(e, what, kDispatchKeys, "e.g. dispatch: {compute: 40us, copy: 20us, p2p: 20us, update: 50us}");
  // At most 1 s per op: a dispatch cost is a launch, not work, and this keeps every op's end in range.
  auto overhead = [&](const char* key, double& out) {
    const Entry* x = find(map, key);
    if (!x) return;
    const std::string w = what + "." + key;
    out = get_topology_duration(x->value, w, "us");
    if (out > 1.0)
      fail(x->value.loc, fmt::format("{} = '{}' is too long", w, x->value.scalar),
           "a dispatch overhead is a per-op launch cost from 0 to 1s, e.g. 40us");
  };
  overhead("compute", d.compute_s);
  overhead("copy", d.copy_s);
  overhead("p2p", d.p2p_s);
  overhead("update", d.update_s);
}

// The draft of a base machine's topology, cut or padded to `gpus` GPUs: GPUs beyond the base's are
// blank (no switch, no link) until the mapping describes them; NVLinks to cut GPUs are dropped.
TopologyDraft draft_from(const Topology& base, const SourceLoc& base_loc, const SourceLoc& topology_loc, int gpus) {
  TopologyDraft d;
  d.topo = base;
  const Origin inherited{base_loc, true};
  d.topology_at = base.valid() ? inherited : Origin{topology_loc, false};
  d.sockets_at = d.switches_at = d.gpus_at = d.host_memory_at = d.pinned_limit_at = d.topology_at;
  d.switch_socket_at.assign(base.switches.size(), inherited);
  for (const GpuSpec& g : base.gpus)
    d.gpu_switch.push_back(base.switches.at(static_cast<std::size_t>(g.pcie_switch)).name);
  d.gpu_switch_at.assign(d.gpu_switch.size(), inherited);
  const auto n = static_cast<std::size_t>(gpus);
  d.topo.gpus.resize(n, GpuSpec{});
  d.gpu_switch.resize(n);
  d.gpu_switch_at.resize(n, d.topology_at);
  std::erase_if(d.topo.nvlinks, [gpus](const NvLink& l) { return l.gpu_a >= gpus || l.gpu_b >= gpus; });
  return d;
}

void parse_switches(TopologyDraft& d, const Entry& e, const std::string& what) {
  const char* example = "e.g. switches: [{name: plx0, socket: 0, uplink: 12GB/s}]";
  if (e.value.kind != Node::Kind::Seq)
    fail(e.value.loc, fmt::format("{} must be a list of PCIe switches, got {}", what, describe(e.value)), example);
  d.topo.switches.clear();
  d.switch_socket_at.clear();
  d.switches_at = Origin{e.value.loc, false};
  std::vector<SourceLoc> name_locs;
  for (std::size_t i = 0; i < e.value.items.size(); ++i) {
    const Node& item = e.value.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Map)
      fail(item.loc, fmt::format("{} must be a mapping, got {}", name, describe(item)), example);
    check_keys(item, name, kSwitchKeys);
    PcieSwitch sw;
    const Entry& n = require(item, "name", name, item.loc, "give every switch a name that GPUs refer to, e.g. plx0");
    sw.name = get_string(n.value, name + ".name");
    for (std::size_t j = 0; j < d.topo.switches.size(); ++j) {
      if (d.topo.switches[j].name == sw.name)
        fail(n.value.loc, fmt::format("switch name '{}' is used twice in {}", sw.name, what),
             fmt::format("{}[{}] at {} has the same name; GPUs name their switch, so names must be unique", what, j,
                         name_locs[j].str()));
    }
    name_locs.push_back(n.value.loc);
    Origin socket_at{item.loc, false};
    if (const Entry* s = find(item, "socket")) {
      sw.socket = get_int(s->value, name + ".socket", 0);
      socket_at.loc = s->value.loc;
    }
    const Entry& up = require(item, "uplink", name, item.loc,
                              "give the switch's link to its CPU socket, per direction, e.g. uplink: 12GB/s");
    sw.uplink_bytes_per_s = get_link_bandwidth(up.value, name + ".uplink");
    d.topo.switches.push_back(std::move(sw));
    d.switch_socket_at.push_back(socket_at);
  }
}

// Applies one GPU mapping ({switch, link, copy_engines}, each optional) to GPU `g`.
void apply_gpu_fields(TopologyDraft& d, std::size_t g, const Node& item, const std::string& what) {
  if (item.kind != Node::Kind::Map)
    fail(item.loc, fmt::format("{} must be a mapping, got {}", what, describe(item)),
         "e.g. {switch: plx0, link: 12GB/s, copy_engines: {h2d: 1, d2h: 1}}");
  check_keys(item, what, kGpuKeys);
  if (const Entry* e = find(item, "switch")) {
    const std::string hint =
        "a GPU hangs off exactly one PCIe switch or root port: write switch: NAME, one of topology.switches";
    const std::string& name = expect_scalar(e->value, what + ".switch", "a switch name", hint);
    if (name.empty()) fail(e->value.loc, fmt::format("{}.switch must not be empty", what), hint);
    d.gpu_switch[g] = name;
    d.gpu_switch_at[g] = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(item, "link"))
    d.topo.gpus[g].link_bytes_per_s = get_link_bandwidth(e->value, what + ".link");
  if (const Entry* e = find(item, "copy_engines")) {
    const std::string ce = what + ".copy_engines";
    if (e->value.kind != Node::Kind::Map)
      fail(e->value.loc, fmt::format("{} must be a mapping, got {}", ce, describe(e->value)),
           "e.g. copy_engines: {h2d: 1, d2h: 1} (concurrent copies per direction)");
    check_keys(e->value, ce, kCopyEngineKeys);
    if (const Entry* h = find(e->value, "h2d")) d.topo.gpus[g].copy_engines_h2d = get_int(h->value, ce + ".h2d", 1);
    if (const Entry* h = find(e->value, "d2h")) d.topo.gpus[g].copy_engines_d2h = get_int(h->value, ce + ".d2h", 1);
  }
}

// "3" -> {3, 3}, "0-3" -> {0, 3}; nullopt unless digits (and one '-').
std::optional<std::pair<long long, long long>> parse_gpu_range(std::string_view key) {
  const auto number = [](std::string_view s) -> std::optional<long long> {
    long long v = 0;
    if (s.empty() || s.size() > 9) return std::nullopt;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.front() == '-' || s.front() == '+') return std::nullopt;
    return v;
  };
  const auto dash = key.find('-');
  const auto lo = number(key.substr(0, dash));
  if (!lo) return std::nullopt;
  if (dash == std::string_view::npos) return std::pair{*lo, *lo};
  const auto hi = number(key.substr(dash + 1));
  if (!hi) return std::nullopt;
  return std::pair{*lo, *hi};
}

void parse_gpus(TopologyDraft& d, const Entry& e, const std::string& what, int gpus) {
  d.gpus_at = Origin{e.value.loc, false};
  const auto n = static_cast<std::size_t>(gpus);
  if (e.value.kind == Node::Kind::Seq) {
    // The list form: one entry per GPU, in index order; it replaces every GPU of the base.
    if (e.value.items.size() != n)
      fail(e.value.loc,
           fmt::format("{} lists {} GPU{} but the machine has gpus: {}", what, e.value.items.size(),
                       e.value.items.size() == 1 ? "" : "s", gpus),
           fmt::format("give one entry per GPU, in index order ({} entries), or change the machine's gpus; the "
                       "mapping form {{all: {{...}}, 0-3: {{...}}}} sizes itself from gpus",
                       gpus));
    for (std::size_t g = 0; g < n; ++g) {
      d.topo.gpus[g] = GpuSpec{};
      d.gpu_switch[g].clear();
      apply_gpu_fields(d, g, e.value.items[g], fmt::format("{}[{}]", what, g));
    }
    return;
  }
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc,
         fmt::format("{} must be a list (one entry per GPU) or a mapping of GPU indices, got {}", what,
                     describe(e.value)),
         "e.g. gpus: [{switch: plx0, link: 12GB/s}, ...] or gpus: {all: {link: 12GB/s}, 0-1: {switch: plx0}}");
  // The mapping form: `all` applies to every GPU, then `N` or `N-M` keys to single GPUs or ranges, on top
  // of what the base machine had. A GPU may be named by one key only.
  if (const Entry* all = find(e.value, "all")) {
    for (std::size_t g = 0; g < n; ++g) apply_gpu_fields(d, g, all->value, what + ".all");
  }
  std::vector<const Entry*> named_by(n, nullptr);
  const std::string key_hint =
      fmt::format("keys of {} are `all`, a GPU index like 3 or an inclusive range like 0-3, with GPUs numbered 0..{}",
                  what, gpus - 1);
  for (const Entry& entry : e.value.entries) {
    if (entry.key == "all") continue;
    const auto range = parse_gpu_range(entry.key);
    if (!range)
      fail(entry.key_loc, fmt::format("{}: '{}' is not `all`, a GPU index or a range", what, entry.key), key_hint);
    if (range->first > range->second)
      fail(entry.key_loc, fmt::format("{}: range '{}' is reversed", what, entry.key), key_hint);
    if (range->second >= gpus)
      fail(entry.key_loc,
           fmt::format("{}: GPU {} ('{}') is out of range: the machine has {} GPU{} (0..{})", what, range->second,
                       entry.key, gpus, gpus == 1 ? "" : "s", gpus - 1),
           "raise the machine's gpus, or name GPUs that exist");
    for (auto g = static_cast<std::size_t>(range->first); g <= static_cast<std::size_t>(range->second); ++g) {
      if (named_by[g])
        fail(entry.key_loc,
             fmt::format("GPU {} is given twice in {}: by '{}' and by '{}' at {}", g, what, entry.key, named_by[g]->key,
                         named_by[g]->key_loc.str()),
             "name each GPU in one index or range (a GPU hangs off one switch); put settings shared by all GPUs "
             "under `all:`");
      named_by[g] = &entry;
    }
    if (entry.value.kind == Node::Kind::Null) continue;
    for (auto g = static_cast<std::size_t>(range->first); g <= static_cast<std::size_t>(range->second); ++g)
      apply_gpu_fields(d, g, entry.value, fmt::format("{}.{}", what, entry.key));
  }
}

void parse_nvlinks(TopologyDraft& d, const Entry& e, const std::string& what, int gpus) {
  const char* example =
      "e.g. nvlink: [{gpus: [0, 1], bandwidth: 25GB/s}]; gpus: [0, 1, 2, 3] links every pair of the listed GPUs, "
      "gpus: all every pair of the machine";
  if (e.value.kind != Node::Kind::Seq)
    fail(e.value.loc, fmt::format("{} must be a list of links, got {}", what, describe(e.value)), example);
  d.topo.nvlinks.clear();
  const auto n = static_cast<std::size_t>(gpus);
  std::vector<int> pair_owner;  // n*n, the nvlink entry that gave pair (a, b), a < b; -1 if none
  if (!e.value.items.empty()) pair_owner.assign(n * n, -1);
  for (std::size_t i = 0; i < e.value.items.size(); ++i) {
    const Node& item = e.value.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Map)
      fail(item.loc, fmt::format("{} must be a mapping, got {}", name, describe(item)), example);
    check_keys(item, name, kNvLinkKeys);
    const Entry& members_e = require(item, "gpus", name, item.loc, example);
    const Entry& bw_e =
        require(item, "bandwidth", name, item.loc, "give the link's bandwidth per direction, e.g. bandwidth: 25GB/s");
    const double bw = get_link_bandwidth(bw_e.value, name + ".bandwidth");
    std::vector<int> members;
    const Node& mv = members_e.value;
    if (mv.kind == Node::Kind::Scalar && mv.scalar == "all") {
      for (int g = 0; g < gpus; ++g) members.push_back(g);
    } else if (mv.kind == Node::Kind::Seq) {
      for (const Node& m : mv.items) {
        const int g = get_int(m, name + ".gpus entries", 0);
        if (g >= gpus)
          fail(m.loc,
               fmt::format("{} names GPU {}, but the machine has {} GPU{} (0..{})", name, g, gpus, gpus == 1 ? "" : "s",
                           gpus - 1),
               "NVLink GPUs are machine GPU indices, numbered from 0");
        if (std::find(members.begin(), members.end(), g) != members.end())
          fail(m.loc, fmt::format("{} names GPU {} twice: a GPU has no NVLink to itself", name, g),
               "list two or more different GPUs, e.g. gpus: [0, 1]");
        members.push_back(g);
      }
    } else {
      fail(mv.loc, fmt::format("{}.gpus must be a list of GPU indices or `all`, got {}", name, describe(mv)), example);
    }
    if (members.size() < 2) fail(mv.loc, fmt::format("{}.gpus must name at least two GPUs", name), example);
    for (std::size_t x = 0; x < members.size(); ++x) {
      for (std::size_t y = x + 1; y < members.size(); ++y) {
        const auto a = static_cast<std::size_t>(std::min(members[x], members[y]));
        const auto b = static_cast<std::size_t>(std::max(members[x], members[y]));
        int& owner = pair_owner[a * n + b];
        if (owner >= 0)
          fail(mv.loc,
               fmt::format("the NVLink between GPUs {} and {} is given twice: by {}[{}] and {}", a, b, what, owner,
                           name),
               "give each pair once; one entry per pair holds its total bandwidth per direction");
        owner = static_cast<int>(i);
        d.topo.nvlinks.push_back(NvLink{static_cast<int>(a), static_cast<int>(b), bw});
      }
    }
  }
}

// topology.nvme: {read: BW, write: BW, capacity: SIZE, latency: DURATION}; read and write are required, the
// rest default to unlimited capacity and no latency. `nvme: none` drops an inherited tier.
void parse_nvme(NvmeSpec& out, const Entry& e, const std::string& what) {
  const std::string hint =
      "write nvme: {read: 25GB/s, write: 20GB/s, capacity: 7.6TB, latency: 100us} (the drive array's aggregate "
      "bandwidth per direction, its capacity and the latency of one I/O), or nvme: none";
  if (e.value.kind == Node::Kind::Scalar && e.value.scalar == "none") {
    out = NvmeSpec{};
    return;
  }
  if (e.value.kind != Node::Kind::Map) fail(e.value.loc, fmt::format("{} must be a mapping", what), hint);
  check_keys(e.value, what, kNvmeKeys);
  NvmeSpec n;
  const Entry* r = find(e.value, "read");
  const Entry* w = find(e.value, "write");
  if (!r || !w) fail(e.key_loc, fmt::format("{} needs both read and write bandwidths", what), hint);
  n.read_bytes_per_s = get_link_bandwidth(r->value, what + ".read");
  n.write_bytes_per_s = get_link_bandwidth(w->value, what + ".write");
  if (const Entry* c = find(e.value, "capacity")) n.capacity_bytes = get_capacity(c->value, what + ".capacity");
  if (const Entry* l = find(e.value, "latency")) n.latency_s = get_topology_duration(l->value, what + ".latency", "us");
  out = n;
}

void apply_topology(TopologyDraft& d, const Entry& topo_entry, const std::string& what, int gpus) {
  const Node& map = topo_entry.value;
  check_keys(map, what, kTopologyKeys);
  d.topology_at = Origin{topo_entry.key_loc, false};
  if (const Entry* e = find(map, "sockets")) {
    d.topo.sockets = get_int(e->value, what + ".sockets", 1);
    d.sockets_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "inter_socket"))
    d.topo.inter_socket_bytes_per_s = get_link_bandwidth(e->value, what + ".inter_socket");
  if (const Entry* e = find(map, "switches")) parse_switches(d, *e, what + ".switches");
  if (const Entry* e = find(map, "gpus")) parse_gpus(d, *e, what + ".gpus", gpus);
  if (const Entry* e = find(map, "p2p")) {
    const std::string hint =
        "p2p: pcie (GPU-to-GPU copies over the PCIe tree) or p2p: host (no P2P: staged "
        "through pinned host memory)";
    const std::string& mode = expect_scalar(e->value, what + ".p2p", "pcie or host", hint);
    if (mode == "pcie") {
      d.topo.p2p = P2PMode::Pcie;
    } else if (mode == "host") {
      d.topo.p2p = P2PMode::Host;
    } else {
      fail(e->value.loc, fmt::format("unknown {} mode '{}'", what + ".p2p", mode),
           suggestion_hint(mode, kP2PModes, "modes"));
    }
  }
  if (const Entry* e = find(map, "nvlink")) parse_nvlinks(d, *e, what + ".nvlink", gpus);
  if (const Entry* e = find(map, "latency"))
    d.topo.transfer_latency_s = get_topology_duration(e->value, what + ".latency", "us");
  if (const Entry* e = find(map, "host_memory")) {
    d.topo.host_memory_bytes = get_capacity(e->value, what + ".host_memory");
    d.host_memory_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "pinned_limit")) {
    d.topo.pinned_limit_bytes = get_capacity(e->value, what + ".pinned_limit");
    d.pinned_limit_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "host_memcpy"))
    d.topo.host_memcpy_bytes_per_s = get_link_bandwidth(e->value, what + ".host_memcpy");
  if (const Entry* e = find(map, "cpu_cores")) d.topo.cpu_cores = get_int(e->value, what + ".cpu_cores", 1);
  if (const Entry* e = find(map, "free_time"))
    d.topo.free_time_s = get_topology_duration(e->value, what + ".free_time", "ms");
  if (const Entry* e = find(map, "host_memory_bandwidth"))
    d.topo.host_memory_bytes_per_s = get_link_bandwidth(e->value, what + ".host_memory_bandwidth");
  if (const Entry* e = find(map, "nvme")) parse_nvme(d.topo.nvme, *e, what + ".nvme");
}

// Checks that need the whole draft, pointing at what the mapping wrote rather than at its base.
Topology finish_topology(TopologyDraft d, const std::string& what) {
  Topology& t = d.topo;
  if (t.switches.empty())
    fail(d.switches_at.loc, fmt::format("{} needs at least one PCIe switch in {}.switches", what, what),
         "every GPU hangs off a switch or CPU root port, e.g. switches: [{name: rc0, socket: 0, uplink: 25GB/s}]; "
         "a GPU on its own root port is a switch with one GPU");
  if (t.sockets > 1 && t.inter_socket_bytes_per_s <= 0)
    fail(d.sockets_at.loc, fmt::format("{}.inter_socket is required with {} sockets", what, t.sockets),
         "give the bandwidth between sockets (QPI/UPI/Infinity Fabric) per direction, e.g. inter_socket: 19.2GB/s");
  for (std::size_t i = 0; i < t.switches.size(); ++i) {
    const PcieSwitch& sw = t.switches[i];
    if (sw.socket < t.sockets) continue;
    const Origin& at = d.switch_socket_at[i].inherited ? d.sockets_at : d.switch_socket_at[i];
    fail(at.loc,
         fmt::format("switch '{}' is on socket {}, but the topology has {} socket{} (0..{})", sw.name, sw.socket,
                     t.sockets, t.sockets == 1 ? "" : "s", t.sockets - 1),
         "sockets are numbered from 0: raise topology.sockets or move the switch");
  }
  std::vector<std::string> switch_names;
  for (const PcieSwitch& sw : t.switches) switch_names.push_back(sw.name);
  for (std::size_t g = 0; g < t.gpus.size(); ++g) {
    GpuSpec& gpu = t.gpus[g];
    if (d.gpu_switch[g].empty()) {
      if (t.switches.size() != 1)
        fail(d.gpus_at.loc, fmt::format("{}: GPU {} names no switch", what, g),
             fmt::format("give switch: NAME for every GPU (in the list form, or under `all:` or an index or range "
                         "of the mapping form); switches: {}",
                         join(switch_names)));
      d.gpu_switch[g] = t.switches.front().name;  // a single switch needs no naming
    }
    const auto it = std::find(switch_names.begin(), switch_names.end(), d.gpu_switch[g]);
    if (it == switch_names.end()) {
      const Origin& at = d.gpu_switch_at[g].inherited ? d.switches_at : d.gpu_switch_at[g];
      fail(at.loc, fmt::format("GPU {} names unknown switch '{}'", g, d.gpu_switch[g]),
           suggestion_hint(d.gpu_switch[g], switch_names, "switches in " + what + ".switches"));
    }
    gpu.pcie_switch = static_cast<int>(it - switch_names.begin());
    if (gpu.link_bytes_per_s <= 0)
      fail(d.gpus_at.loc, fmt::format("{}: GPU {} has no link bandwidth", what, g),
           "give link: BANDWIDTH (the GPU's own PCIe link, per direction) for every GPU, e.g. under `all:`");
  }
  if (t.host_memory_bytes > 0 && t.pinned_limit_bytes > t.host_memory_bytes) {
    const Origin& at = d.pinned_limit_at.inherited ? d.host_memory_at : d.pinned_limit_at;
    fail(at.loc,
         fmt::format("{}.pinned_limit ({}) exceeds {}.host_memory ({})", what, format_bytes(t.pinned_limit_bytes), what,
                     format_bytes(t.host_memory_bytes)),
         "pinned (page-locked) memory is part of host memory: lower pinned_limit or raise host_memory");
  }
  return std::move(d.topo);
}

// The machine's topology after `map` (a machine mapping whose flat keys are already applied to `m`):
// inherited from the base, changed by `topology:` keys, cut to `gpus`, or dropped by `topology: none`.
void resolve_topology(MachineSpec& m, const Node& map, const std::string& section, const SourceLoc& base_loc) {
  const Entry* topo = find(map, "topology");
  const std::string what = qualify(section, "topology");
  if (topo && topo->value.kind == Node::Kind::Scalar && topo->value.scalar == "none") {
    m.topology = Topology{};
    return;
  }
  if (topo && topo->value.kind != Node::Kind::Map)
    fail(topo->value.loc, fmt::format("{} must be a mapping or `none`, got {}", what, describe(topo->value)),
         "write `topology:` followed by indented keys (see docs/machines.md), or topology: none for a machine "
         "only the reference cost model can use");
  if (!topo && !m.topology.valid()) return;
  const Entry* gpus_key = find(map, "gpus");
  const SourceLoc gpus_loc = gpus_key ? gpus_key->value.loc : (topo ? topo->key_loc : base_loc);
  if (m.gpus > kMaxTopologyGpus)
    fail(gpus_loc, fmt::format("a machine with a topology has at most {} GPUs, got gpus: {}", kMaxTopologyGpus, m.gpus),
         "a topology describes one server; use fewer GPUs, or topology: none for the reference cost model only");
  const auto base_gpus = static_cast<int>(m.topology.gpus.size());
  if (m.topology.valid() && m.gpus > base_gpus && !(topo && find(topo->value, "gpus")))
    fail(gpus_loc,
         fmt::format("gpus: {} exceeds the {} GPUs of the inherited topology of '{}'", m.gpus, base_gpus, m.name),
         fmt::format("describe the new GPUs in {}.gpus (e.g. gpus: {{all: {{switch: NAME, link: 12GB/s}}}}), or "
                     "write topology: none for a machine only the reference cost model can use",
                     what));
  TopologyDraft d = draft_from(m.topology, base_loc, topo ? topo->key_loc : base_loc, m.gpus);
  if (topo) apply_topology(d, *topo, what, m.gpus);
  m.topology = finish_topology(std::move(d), what);
}

// A machine mapping: an optional base (`preset: NAME` or `file: PATH`) whose values the other keys override.
// Without a base it describes a machine from scratch: gpus and gpu_memory are required, the rest default to
// the paper's scheduler constants (MachineSpec's defaults).
MachineSpec machine_from_map(const Node& map, const std::string& section, const SourceLoc& owner_loc,
                             const std::string& base_dir, const std::string& default_name, int depth) {
  if (depth > kMaxMachineDepth)
    fail(owner_loc, fmt::format("machine files nest more than {} levels deep", kMaxMachineDepth),
         "check for a cycle of `file:` references");
  check_keys(map, section, machine_keys_with_base());
  const Entry* preset = find(map, "preset");
  const Entry* file = find(map, "file");
  MachineSpec m;
  SourceLoc base_loc = owner_loc;  // where inherited topology values are reported
  if (preset && file)
    fail(file->key_loc, fmt::format("{} and {} are both given", qualify(section, "preset"), qualify(section, "file")),
         "give at most one base machine: `preset: NAME` or `file: PATH`, then override single keys");
  if (preset) {
    const std::string name = get_string(preset->value, qualify(section, "preset"));
    if (!find_preset(name)) fail_unknown_preset(name, preset->value.loc);
    m = machine_from_preset(name, preset->value.loc, depth + 1);
    base_loc = preset->value.loc;
  } else if (file) {
    const std::string path = resolve_path(base_dir, get_string(file->value, qualify(section, "file")));
    m = machine_from_file(path, file->value.loc, depth + 1);
    base_loc = file->value.loc;
  } else {
    const std::string hint =
        "a machine without `preset:` or `file:` must give gpus and gpu_memory, e.g. {gpus: 8, gpu_memory: 10GiB}; "
        "or start from a preset: {preset: paper-1080ti}";
    require(map, "gpus", section, owner_loc, hint);
    require(map, "gpu_memory", section, owner_loc, hint);
    m.name = default_name;
  }
  if (const Entry* e = find(map, "name")) m.name = get_string(e->value, qualify(section, "name"));
  if (const Entry* e = find(map, "gpu")) m.gpu_name = get_string(e->value, qualify(section, "gpu"));
  if (const Entry* e = find(map, "gpus")) m.gpus = get_int(e->value, qualify(section, "gpus"), 1);
  if (const Entry* e = find(map, "gpu_memory"))
    m.gpu_memory_bytes = get_bytes(e->value, qualify(section, "gpu_memory"));
  if (const Entry* e = find(map, "memory_cap_scale"))
    m.memory_cap_scale = get_positive_double(e->value, qualify(section, "memory_cap_scale"));
  if (const Entry* e = find(map, "bw_swap"))
    m.bw_swap_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_swap"));
  if (const Entry* e = find(map, "bw_p2p")) m.bw_p2p_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_p2p"));
  if (const Entry* e = find(map, "bw_msg")) m.bw_msg_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_msg"));
  if (const Entry* e = find(map, "time_del")) m.time_del_s = get_duration(e->value, qualify(section, "time_del"));
  if (const Entry* e = find(map, "price_per_hour"))
    m.price_per_hour = get_price(e->value, qualify(section, "price_per_hour"));
  if (const Entry* e = find(map, "gpu_rates")) apply_gpu_rates(m.gpu_rates, *e, qualify(section, "gpu_rates"));
  if (const Entry* e = find(map, "cpu_adam")) apply_cpu_adam(m.cpu_adam, *e, qualify(section, "cpu_adam"));
  if (const Entry* e = find(map, "compute")) apply_compute(m.compute, *e, qualify(section, "compute"));
  if (const Entry* e = find(map, "dispatch")) apply_dispatch(m.dispatch, *e, qualify(section, "dispatch"));
  resolve_topology(m, map, section, base_loc);
  return m;
}

// The top of a machine document: a mapping (null means "empty file").
MachineSpec machine_from_document(const Node& root, const std::string& file, const std::string& default_name,
                                  int depth) {
  if (root.kind == Node::Kind::Null)
    fail(SourceLoc{file, 0, 0}, "the machine file is empty",
         "a machine file maps keys to values, e.g. gpus: 8 and gpu_memory: 10GiB (see docs/config.md)");
  if (root.kind != Node::Kind::Map)
    fail(root.loc, fmt::format("a machine file must be a mapping of keys, got {}", describe(root)),
         "e.g. gpus: 8 and gpu_memory: 10GiB on separate lines (see docs/config.md)");
  return machine_from_map(root, "", SourceLoc{file, 0, 0}, parent_dir(file), default_name, depth);
}

MachineSpec machine_from_preset(const std::string& name, const SourceLoc& loc, int depth) {
  const EmbeddedPreset* preset = find_preset(name);
  if (!preset) fail_unknown_preset(name, loc);
  const std::string file = fmt::format("preset {}", name);
  MachineSpec m = machine_from_document(parse_yaml(std::string(preset->yaml), file), file, name, depth);
  m.name = name;
  return m;
}

MachineSpec machine_from_file(const std::string& path, const SourceLoc& ref_loc, int depth) {
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(ref_loc, fmt::format("cannot read machine file '{}': {}", path, problem),
         fmt::format("paths are relative to the folder of the file that names them; built-in presets: {}",
                     join(machine_preset_names())));
  return machine_from_document(parse_yaml(*text, path), path, std::filesystem::path(path).stem().string(), depth);
}

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
  Node value = parse_yaml(text.substr(eq + 1), loc.file, loc, fmt::format("malformed value in override '{}'", text));

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

Mode parse_mode(const Node& v) {
  const std::string hint_tail = "modes: harmony-pp, harmony-dp (the paper's aliases vPP, vDP)";
  const std::string& s = expect_scalar(v, "plan.mode", "a mode name", hint_tail);
  if (s == "harmony-pp" || s == "vPP") return Mode::HarmonyPP;
  if (s == "harmony-dp" || s == "vDP") return Mode::HarmonyDP;
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
  plan.mode = parse_mode(mode.value);
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

// Samples per GPU: harmony-pp splits the whole minibatch into microbatches; harmony-dp gives rank n
// DD_n = D//N (+1 if n < D%N) samples (the reference's split).
std::vector<int> gpu_shares(const PlanSpec& plan) {
  if (plan.mode == Mode::HarmonyPP) return {plan.minibatch};
  std::vector<int> shares;
  shares.reserve(static_cast<std::size_t>(std::max(0, plan.gpus)));
  for (int n = 0; n < plan.gpus; ++n) shares.push_back(plan.minibatch / plan.gpus + (n < plan.minibatch % plan.gpus));
  return shares;
}

std::vector<int> divisors(int value) {
  std::vector<int> low, high;
  for (int d = 1; static_cast<long long>(d) * d <= value; ++d) {
    if (value % d) continue;
    low.push_back(d);
    if (d != value / d) high.push_back(value / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

void check_microbatch(int u, const std::string& what, const SourceLoc& loc, const PlanSpec& plan,
                      const Options& options) {
  const std::vector<int> shares = gpu_shares(plan);
  const bool pp = plan.mode == Mode::HarmonyPP;
  const int largest = *std::max_element(shares.begin(), shares.end());
  if (options.unequal_microbatches) {
    if (u > largest)
      fail(loc,
           pp ? fmt::format("{} = {} is larger than minibatch {}", what, u, plan.minibatch)
              : fmt::format("{} = {} is larger than a GPU's share ({}) of minibatch {} in harmony-dp over {} GPUs",
                            what, u, largest, plan.minibatch, plan.gpus),
           fmt::format("use a microbatch size of at most {}", largest));
    return;
  }
  if (std::all_of(shares.begin(), shares.end(), [u](int s) { return s % u == 0; })) return;
  const int common = std::accumulate(shares.begin(), shares.end(), 0, [](int a, int b) { return std::gcd(a, b); });
  const std::string fits = fmt::format("sizes that divide: {}", join_ints(divisors(common)));
  const std::string escape =
      "or set options.unequal_microbatches: true (the paper's --inequal_ubatchsize; the runtime does not support it)";
  if (pp)
    fail(loc,
         fmt::format("{} = {} does not divide minibatch {}: harmony-pp needs D % u == 0 so that all microbatches are "
                     "equal",
                     what, u, plan.minibatch),
         fmt::format("{}; {}", fits, escape));
  const bool even = plan.minibatch % plan.gpus == 0;
  fail(loc,
       fmt::format("{} = {} does not divide every GPU's share of minibatch {}: harmony-dp over {} GPUs gives {} "
                   "samples per GPU, and each share must be a multiple of u",
                   what, u, plan.minibatch, plan.gpus,
                   even ? std::to_string(shares.front()) : fmt::format("{} or {}", shares.front(), shares.back())),
       even ? fmt::format("{}; {}", fits, escape)
            : fmt::format("only u = 1 divides shares of {} and {}: make minibatch a multiple of gpus ({}), {}",
                          shares.front(), shares.back(), plan.gpus, escape));
}

void check_plan(const RunConfig& cfg, const PlanLocs& plan_locs, const SearchLocs& search_locs) {
  const PlanSpec& plan = cfg.plan;
  if (plan.gpus > cfg.machine.gpus)
    fail(plan_locs.gpus,
         fmt::format("plan.gpus = {} exceeds machine.gpus = {} (machine '{}')", plan.gpus, cfg.machine.gpus,
                     cfg.machine.name),
         fmt::format("use plan.gpus <= {}, or raise machine.gpus", cfg.machine.gpus));
  if (plan.mode == Mode::HarmonyDP && plan.minibatch < plan.gpus)
    fail(plan_locs.minibatch,
         fmt::format("plan.minibatch = {} leaves GPUs without samples in harmony-dp over {} GPUs", plan.minibatch,
                     plan.gpus),
         fmt::format("use a minibatch of at least {} (one sample per GPU), or fewer GPUs", plan.gpus));
  if (plan.u_fwd) check_microbatch(*plan.u_fwd, "plan.u_fwd", plan_locs.u_fwd, plan, cfg.options);
  if (plan.u_bwd) check_microbatch(*plan.u_bwd, "plan.u_bwd", plan_locs.u_bwd, plan, cfg.options);
  for (std::size_t i = 0; i < cfg.search.u_fwd.size(); ++i)
    check_microbatch(cfg.search.u_fwd[i], "search.u_fwd entry", search_locs.u_fwd[i], plan, cfg.options);
  for (std::size_t i = 0; i < cfg.search.u_bwd.size(); ++i)
    check_microbatch(cfg.search.u_bwd[i], "search.u_bwd entry", search_locs.u_bwd[i], plan, cfg.options);
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

const std::vector<std::string> kAnalyticKeys = {"preset",    "family",  "name",       "layers",      "hidden",
                                                "heads",     "ffn",     "seq_len",    "vocab",       "tied_head",
                                                "head",      "labels",  "image_size", "classes",     "dtype",
                                                "optimizer", "kernels", "dropout",    "ubatch_sizes"};
const std::vector<std::string> kFamilies = {"gpt", "bert", "resnet"};
const std::vector<std::string> kDTypes = {"fp32", "fp16", "bf16"};
const std::vector<std::string> kOptimizers = {"adam", "sgd", "momentum"};
const std::vector<std::string> kKernelStyles = {"eager", "fused"};
const std::vector<std::string> kBertHeads = {"mlm", "classifier"};

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
  only_for("head", spec.family == ModelFamily::Bert, "bert");
  only_for("labels", spec.family == ModelFamily::Bert, "bert");
  only_for("image_size", resnet, "resnet");
  only_for("classes", resnet, "resnet");
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
  if (const Entry* x = find(map, "name")) spec.name = get_string(x->value, what + ".name");
  if (const Entry* x = find(map, "tied_head")) spec.tied_head = get_bool(x->value, what + ".tied_head");
  if (const Entry* x = find(map, "dropout")) spec.dropout = get_bool(x->value, what + ".dropout");
  if (const Entry* x = find(map, "head"))
    spec.bert_head = static_cast<BertHead>(get_choice(x->value, what + ".head", kBertHeads, "heads"));
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

std::string parse_cost_model(const Entry& e) {
  const std::string& name = expect_scalar(e.value, "cost_model", "a cost model name", "cost models: reference, native");
  if (name != "reference" && name != "native")
    fail(e.value.loc, fmt::format("unknown cost_model '{}'", name),
         suggestion_hint(name, {"reference", "native"}, "cost models"));
  return name;
}

RunConfig build_config(Node root, const std::string& file, const std::vector<std::string>& overrides) {
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
  const bool native = cfg.cost_model == "native";
  cfg.options = parse_options(section_map(root, "options"), native);
  SearchLocs search_locs;
  cfg.search = parse_search(section_map(root, "search"), search_locs, native ? PackCounts::Wide : PackCounts::Minimum);

  check_plan(cfg, plan_locs, search_locs);
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

// plan.offload (cpu | nvme) and plan.zero3 ({module_latency: DURATION, bucket: ELEMENTS}): zero-infinity's
// offload tier and ZeRO-3 overheads (docs/baselines.md). Removed from `plan` once read.
void parse_zero_infinity_keys(Node& plan, TrainConfig& cfg) {
  for (auto it = plan.entries.begin(); it != plan.entries.end();) {
    if (it->key != "offload" && it->key != "zero3") {
      ++it;
      continue;
    }
    const std::string what = "plan." + it->key;
    if (cfg.baseline_kind != "zero-infinity")
      fail(it->key_loc, fmt::format("{} applies to plan.mode: zero-infinity only", what),
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
      fail(it->key_loc, "plan.activations applies to baseline kinds (dp-swap, pp-swap, zero-infinity, l2l)",
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
  check_plan(as_run, plan_locs, search_locs);

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
  RunConfig cfg = build_config(parse_yaml(*text, path), path, overrides);
  cfg.inputs = record.take(cfg);
  return cfg;
}

RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  RecordFilesRead record;
  RunConfig cfg = build_config(parse_yaml(text, name), name, overrides);
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
  validate_baseline_plan(b, model);
  return b;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides, bool plan_searched) {
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(SourceLoc{path, 0, 0}, fmt::format("cannot read config file '{}': {}", path, problem),
         "check the path: a config is a YAML file");
  return build_train_config(parse_yaml(*text, path), path, overrides, plan_searched);
}

TrainConfig load_train_config_text(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& overrides, bool plan_searched) {
  return build_train_config(parse_yaml(text, name), name, overrides, plan_searched);
}

MachineSpec load_machine_file(const std::string& path) {
  const SourceLoc loc{path, 0, 0};
  std::error_code ec;
  if (find_preset(path) && !std::filesystem::is_regular_file(path, ec)) return machine_from_preset(path, loc, 0);
  if (!looks_like_path(path) && !std::filesystem::exists(path, ec)) fail_unknown_preset(path, loc);
  return machine_from_file(path, loc, 0);
}

MachineSpec machine_preset(const std::string& name) {
  return machine_from_preset(name, SourceLoc{"machine preset", 0, 0}, 0);
}

std::vector<std::string> machine_preset_names() {
  std::vector<std::string> names;
  for (const EmbeddedPreset& p : kEmbeddedPresets) names.emplace_back(p.name);
  std::sort(names.begin(), names.end());
  return names;
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
  p.mode = ps.mode;
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
