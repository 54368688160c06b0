// The config loader's located YAML tree (yaml-cpp nodes re-located, 1-based), key checks with suggestions, the
// getters of every quantity (sizes, bandwidths, durations, counts) with their unit policy and range checks, and
// reading input files while recording them (config_internal.hpp).
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/base/input_file.hpp"
#include "core/base/units.hpp"
#include "core/config/config_internal.hpp"

namespace harmony::core::config_detail {

thread_local std::vector<std::string>* t_files_read = nullptr;

// ------------------------------------------------------------------------------------------------
// A YAML tree that remembers where each node came from (yaml-cpp nodes cannot be re-located after
// overrides are grafted in, and their marks are 0-based).

// Aliases are expanded when copying, so a few lines of anchors could otherwise blow up.
constexpr std::size_t kMaxNodes = 100'000;
// Deeper than any config; bounds the recursion below (yaml-cpp's own guard covers the text, not aliases).
constexpr std::size_t kMaxDepth = 256;

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
    n.tag = y.Tag();
    if (y.IsSequence() || y.IsMap()) {
      // An alias inside the node its anchor names (`a: &x {b: *x}`) makes yaml-cpp's graph a cycle.
      for (const YAML::Node& open : path_) {
        if (open.is(y))
          throw ConfigError(n.loc, "an alias refers to the list or mapping that contains it (a recursive anchor)",
                            "an anchor (&name) can only be used (*name) after its node ends; copy the values instead");
      }
      if (path_.size() >= kMaxDepth)
        throw ConfigError(n.loc, fmt::format("the YAML nests more than {} levels", kMaxDepth),
                          "a config nests a few levels; check for runaway anchors and aliases");
      path_.push_back(y);
    }
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
    if (n.kind == Node::Kind::Seq || n.kind == Node::Kind::Map) path_.pop_back();
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
  std::vector<YAML::Node> path_;  // the lists and mappings being built, outermost first
};

// The located tree back as a yaml-cpp node (same structure, scalars and tags), for the emitter.
YAML::Node to_yaml_cpp(const Node& n) {
  YAML::Node y;
  switch (n.kind) {
    case Node::Kind::Null:
      y = YAML::Node(YAML::NodeType::Null);
      break;
    case Node::Kind::Scalar:
      y = YAML::Node(n.scalar);
      break;
    case Node::Kind::Seq:
      y = YAML::Node(YAML::NodeType::Sequence);
      for (const Node& item : n.items) y.push_back(to_yaml_cpp(item));
      break;
    case Node::Kind::Map:
      y = YAML::Node(YAML::NodeType::Map);
      for (const Entry& e : n.entries) y[e.key] = to_yaml_cpp(e.value);
      break;
  }
  if (!n.tag.empty()) y.SetTag(n.tag);
  return y;
}

}  // namespace harmony::core::config_detail

namespace harmony::core {

YamlNode parse_yaml_tree(const std::string& text, const std::string& file, const std::optional<SourceLoc>& fixed,
                         const std::string& what) {
  using config_detail::kYamlHint;
  using config_detail::loc_from_mark;
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
    return config_detail::TreeBuilder(file, fixed).build(y, fixed ? *fixed : SourceLoc{file, 0, 0});
  } catch (const YAML::Exception& e) {
    throw ConfigError(fixed ? *fixed : loc_from_mark(e.mark, file), fmt::format("{}: {}", what, e.msg), kYamlHint);
  }
}

std::string flow_yaml(const YamlNode& node) {
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  if (node.kind == YamlNode::Kind::Scalar && node.tag == "!") {
    e << YAML::DoubleQuoted << node.scalar;  // a quoted string stays a string
  } else {
    e << config_detail::to_yaml_cpp(node);
  }
  return e.c_str();
}

}  // namespace harmony::core

namespace harmony::core::config_detail {

// ------------------------------------------------------------------------------------------------
// Small helpers

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
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

[[noreturn]] void fail(const SourceLoc& loc, const std::string& message, const std::string& hint) {
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
                                 const std::string& hint) {
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

// Reads one input file through the shared check (core::try_read_input_file: regular files only, never blocks on
// a FIFO), recording it in RunConfig::inputs. nullopt with *problem = the reason when it cannot be read.
std::optional<std::string> read_text_file(const std::string& path, std::string* problem) {
  if (t_files_read) t_files_read->push_back(path);
  return try_read_input_file(path, problem);
}

}  // namespace harmony::core::config_detail
