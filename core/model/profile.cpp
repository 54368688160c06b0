// Loads "harmony-profile-json" v1 files (the paper's measured per-layer profiles) into a Model and owns
// the schema checks: every problem, from a JSON syntax error to a misaligned per-size array, becomes a
// ConfigError at the offending key or value (positions from JsonLocator) with a hint on how to fix it.
// One schema walker (read_model) runs over either parser's tree: simdjson for speed on valid input, and,
// when that walk meets any problem, nlohmann-json again to produce the located message.
#include "core/model/profile.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "core/base/json_locate.hpp"

namespace harmony::core {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "harmony-profile-json";
constexpr std::int64_t kFormatVersion = 1;
constexpr const char* kSchemaDoc = "configs/profiles/README.md";

// Every key the schema defines (README "Schema"), read or not. A missing required key is suggested a
// replacement only among the keys present that are not in these lists, so that a missing "fwd_time" is
// never "corrected" to the legitimate "bwd_time".
const std::vector<std::string>& top_level_keys() {
  static const std::vector<std::string> keys = {"format",
                                                "format_version",
                                                "model",
                                                "variant",
                                                "dtype",
                                                "aliases",
                                                "source",
                                                "hardware",
                                                "units",
                                                "num_layers",
                                                "criterion_layer",
                                                "availability",
                                                "interpolation_used_by_reference",
                                                "ubatch_sizes",
                                                "probe_umax",
                                                "targets",
                                                "targets_ubatch_sizes",
                                                "layers",
                                                "totals"};
  return keys;
}
const std::vector<std::string>& layer_keys() {
  static const std::vector<std::string> keys = {"index",
                                                "name",
                                                "is_criterion",
                                                "modules",
                                                "input_names",
                                                "output_names",
                                                "inputs",
                                                "input_bytes_per_sample",
                                                "input_bytes",
                                                "weight_bytes",
                                                "param_count",
                                                "params",
                                                "buffer_bytes",
                                                "buffers",
                                                "optimizer_state_bytes",
                                                "optimizer_state_names",
                                                "update_time_cpu",
                                                "fwd_time",
                                                "bwd_time",
                                                "fwd_peak_memory",
                                                "bwd_peak_memory",
                                                "bwd_transient_memory",
                                                "saved_activation_memory",
                                                "output_bytes_per_sample"};
  return keys;
}
const std::vector<std::string>& ubatch_keys() {
  static const std::vector<std::string> keys = {"fwd", "bwd", "inputs"};
  return keys;
}

// What a value must be, for messages ("... must be <what>") and hints ("e.g. <example>").
struct Expect {
  const char* what;
  const char* example;
};
constexpr Expect kObject{"an object", "{ ... }"};
constexpr Expect kArray{"an array", "[ ... ]"};
constexpr Expect kText{"a string", "\"bert_large\""};
constexpr Expect kBool{"a boolean", "false"};
constexpr Expect kInteger{"an integer", "1"};
constexpr Expect kBytes{"a non-negative integer number of bytes", "4096"};
constexpr Expect kCount{"a non-negative integer", "1024"};
constexpr Expect kSeconds{"a non-negative number of seconds", "0.0125"};
constexpr Expect kUbatch{"a positive integer microbatch size", "8"};

// "the string \"abc\"", "the floating-point number 1.5", "an array", ...: what a value actually is.
std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return fmt::format("the boolean {}", v.get<bool>());
    case json::value_t::string: {
      std::string s = v.dump();
      if (s.size() > 40) s = s.substr(0, 36) + "...\"";
      return "the string " + s;
    }
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "the integer " + v.dump();
    case json::value_t::number_float:
      return "the floating-point number " + v.dump();
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a non-JSON value";
  }
}

// Thrown by the fast walk at its first problem of any kind; load_profile_text then walks nlohmann's tree,
// which finds the same problem and words it.
struct NeedsLocatedPath {};

// The schema walker sees a value through one of two nodes with the same few calls. JsonNode (nlohmann-json)
// is the located path: it can describe a value for a message. SimdNode (simdjson's DOM) is the fast path: it
// never words a problem (kLocates is false), the Reader throws NeedsLocatedPath instead.
class JsonNode {
 public:
  static constexpr bool kLocates = true;
  JsonNode(const json& v) : v_(&v) {}  // NOLINT(google-explicit-constructor): elements convert on iteration

  bool is_object() const { return v_->is_object(); }
  bool is_array() const { return v_->is_array(); }
  bool is_string() const { return v_->is_string(); }
  bool is_boolean() const { return v_->is_boolean(); }
  bool is_null() const { return v_->is_null(); }
  bool is_number() const { return v_->is_number(); }
  bool is_number_integer() const { return v_->is_number_integer(); }
  // An integer above the int64 range (nlohmann keeps those as unsigned).
  bool is_big_unsigned() const {
    return v_->is_number_unsigned() &&
           v_->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  }
  std::size_t size() const { return v_->size(); }
  const json& elements() const { return *v_; }
  // The member `key` of an object (the last one when the key repeats, as nlohmann keeps the last).
  std::optional<JsonNode> find(const std::string& key) const {
    const auto it = v_->find(key);
    if (it == v_->end()) return std::nullopt;
    return JsonNode(*it);
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& item : v_->items()) out.push_back(item.key());
    return out;
  }
  std::string text() const { return v_->get<std::string>(); }
  bool boolean() const { return v_->get<bool>(); }
  std::int64_t int64() const { return v_->get<std::int64_t>(); }
  double number() const { return v_->get<double>(); }
  std::string dump() const { return v_->dump(); }
  std::string describe() const { return harmony::core::describe(*v_); }

 private:
  const json* v_;
};

class SimdNode {
 public:
  static constexpr bool kLocates = false;
  SimdNode(simdjson::dom::element e) : e_(e) {}  // NOLINT(google-explicit-constructor): as JsonNode

  using Type = simdjson::dom::element_type;
  bool is_object() const { return e_.type() == Type::OBJECT; }
  bool is_array() const { return e_.type() == Type::ARRAY; }
  bool is_string() const { return e_.type() == Type::STRING; }
  bool is_boolean() const { return e_.type() == Type::BOOL; }
  bool is_null() const { return e_.type() == Type::NULL_VALUE; }
  bool is_number() const { return is_number_integer() || e_.type() == Type::DOUBLE; }
  bool is_number_integer() const { return e_.type() == Type::INT64 || e_.type() == Type::UINT64; }
  // simdjson keeps integers in the int64 range as INT64, larger ones as UINT64.
  bool is_big_unsigned() const { return e_.type() == Type::UINT64; }
  std::size_t size() const {
    std::size_t n = 0;
    if (is_array()) {
      n = array().size();
    } else if (is_object()) {
      n = object().size();
    }
    if (n >= 0xFFFFFF) throw NeedsLocatedPath{};  // simdjson saturates sizes there
    return n;
  }
  simdjson::dom::array elements() const { return array(); }
  std::optional<SimdNode> find(std::string_view key) const {
    std::optional<SimdNode> found;
    if (!is_object()) return found;
    for (const simdjson::dom::key_value_pair kv : object()) {
      if (kv.key == key) found = SimdNode(kv.value);  // keep scanning: the last duplicate wins, as in nlohmann
    }
    return found;
  }
  std::string text() const { return std::string(get<std::string_view>()); }
  bool boolean() const { return get<bool>(); }
  std::int64_t int64() const { return get<std::int64_t>(); }
  double number() const { return get<double>(); }

 private:
  template <typename T>
  T get() const {
    T v{};
    if (e_.get(v) != simdjson::SUCCESS) throw NeedsLocatedPath{};
    return v;
  }
  simdjson::dom::array array() const { return get<simdjson::dom::array>(); }
  simdjson::dom::object object() const { return get<simdjson::dom::object>(); }

  simdjson::dom::element e_;
};

// The pointer of element i of a layer's array `key` (layer_ptr/key/i), built only when something is wrong.
std::string element_ptr(const std::string& layer_ptr, const std::string& key, std::size_t i) {
  std::string p = layer_ptr;
  p += '/';
  p += key;
  p += '/';
  p += std::to_string(i);
  return p;
}

// Reads one document. Pointers are built only for the fields read (a handful per layer); array elements
// get theirs through a callable, invoked only when something is wrong, so that loading stays allocation-light.
template <typename Node>
class Reader {
 public:
  Reader(std::string_view text, const std::string& file) : loc_(text), file_(file) {}

  [[noreturn]] void fail(const std::string& ptr, const std::string& message, const std::string& hint,
                         bool at_key = false) const {
    if constexpr (!Node::kLocates) throw NeedsLocatedPath{};  // the fast path words no problem
    const TextPos p = at_key ? loc_.key_pos(ptr) : loc_.value_pos(ptr);
    throw ConfigError(SourceLoc{file_, p.line, p.column}, message, hint);
  }

  [[noreturn]] void wrong_type(const Node& v, const std::string& ptr, const Expect& e) const {
    if constexpr (!Node::kLocates) {
      throw NeedsLocatedPath{};
    } else {
      const std::string path = pointer_to_path(ptr);
      if (ptr.empty()) {
        fail(ptr, fmt::format("the document must be {}, not {}", e.what, v.describe()),
             fmt::format(
                 "a harmony profile is one JSON object, {{\"format\": \"{}\", \"format_version\": {}, ...}}; see {}",
                 kFormat, kFormatVersion, kSchemaDoc));
      }
      fail(ptr, fmt::format("{} must be {}, not {}", path, e.what, v.describe()),
           fmt::format("write {} as {}, e.g. {}", path, e.what, e.example));
    }
  }

  void expect_object(const Node& v, const std::string& ptr) const {
    if (!v.is_object()) wrong_type(v, ptr, kObject);
  }
  void expect_array(const Node& v, const std::string& ptr) const {
    if (!v.is_array()) wrong_type(v, ptr, kArray);
  }

  // The member `key` of object `obj` (at `obj_ptr`); a ConfigError at the object when it is missing.
  Node member(const Node& obj, const std::string& obj_ptr, const std::string& key, const Expect& e,
              const std::vector<std::string>& known_keys) const {
    if (const auto found = obj.find(key)) return *found;
    if constexpr (!Node::kLocates) {
      throw NeedsLocatedPath{};
    } else {
      std::vector<std::string> unknown;
      for (const std::string& k : obj.keys()) {
        if (std::find(known_keys.begin(), known_keys.end(), k) == known_keys.end()) unknown.push_back(k);
      }
      const std::string guess = closest_match(key, unknown);
      const std::string where = obj_ptr.empty() ? "at the top level" : "in " + pointer_to_path(obj_ptr);
      std::string hint = fmt::format("add \"{}\": {} ({})", key, e.example, e.what);
      if (!guess.empty()) hint += fmt::format("; this object has \"{}\": did you mean \"{}\"?", guess, key);
      hint += fmt::format("; the schema is in {}", kSchemaDoc);
      fail(obj_ptr, fmt::format("missing required field \"{}\" {}", key, where), hint);
    }
  }
  std::optional<Node> optional_member(const Node& obj, const std::string& key) const { return obj.find(key); }

  std::string text(const Node& v, const std::string& ptr) const {
    if (!v.is_string()) wrong_type(v, ptr, kText);
    return v.text();
  }
  bool boolean(const Node& v, const std::string& ptr) const {
    if (!v.is_boolean()) wrong_type(v, ptr, kBool);
    return v.boolean();
  }

  template <typename Ptr>
  std::int64_t integer(const Node& v, const Ptr& ptr, const Expect& e) const {
    if (!v.is_number_integer()) wrong_type(v, ptr(), e);
    if (v.is_big_unsigned()) {
      if constexpr (!Node::kLocates) {
        throw NeedsLocatedPath{};
      } else {
        const std::string& p = ptr();  // a reference: At's ptr() returns one
        fail(p, fmt::format("{} is {}, too large for a 64-bit signed integer", pointer_to_path(p), v.dump()),
             fmt::format("write {} as {} below 2^63, e.g. {}", pointer_to_path(p), e.what, e.example));
      }
    }
    return v.int64();
  }

  // A byte count or other count: an integer >= 0.
  template <typename Ptr>
  std::int64_t size(const Node& v, const Ptr& ptr, const Expect& e = kBytes) const {
    const std::int64_t n = integer(v, ptr, e);
    if (n < 0) {
      const std::string& p = ptr();  // a reference: At's ptr() returns one
      fail(p, fmt::format("{} is {}, but it must be {}", pointer_to_path(p), n, e.what),
           fmt::format("sizes and counts are measured quantities and never negative: correct {} (e.g. {}) or "
                       "re-export the profile",
                       pointer_to_path(p), e.example));
    }
    if (n > kMaxInputBytes) {        // the bound and its reason: core/base/units.hpp
      const std::string& p = ptr();  // a reference: At's ptr() returns one
      fail(p, fmt::format("{} is {}, too large", pointer_to_path(p), n),
           fmt::format("sizes and counts range from 0 to 2^50 (1125899906842624, 1 PiB of bytes): correct {} (e.g. "
                       "{}) or re-export the profile",
                       pointer_to_path(p), e.example));
    }
    return n;
  }

  // A time in seconds: any JSON number >= 0.
  template <typename Ptr>
  double seconds(const Node& v, const Ptr& ptr) const {
    if (!v.is_number()) wrong_type(v, ptr(), kSeconds);
    const double s = v.number();
    const bool negative = !(s >= 0.0) || !std::isfinite(s);
    if (negative || s > kMaxInputSeconds) {
      if constexpr (!Node::kLocates) {
        throw NeedsLocatedPath{};
      } else {
        const std::string& p = ptr();  // a reference: At's ptr() returns one
        if (negative) {
          fail(p, fmt::format("{} is {}, but it must be {}", pointer_to_path(p), v.dump(), kSeconds.what),
               fmt::format("times are measured durations and never negative: correct {} (e.g. {}) or re-export "
                           "the profile",
                           pointer_to_path(p), kSeconds.example));
        }
        // the bound and its reason: core/base/units.hpp
        fail(p, fmt::format("{} is {} s, too long", pointer_to_path(p), v.dump()),
             fmt::format("times range from 0 to 1e6 s (11.6 days), so sums of them fit the simulated time range "
                         "of about 9.2e6 s: correct {} (e.g. {}) or re-export the profile",
                         pointer_to_path(p), kSeconds.example));
      }
    }
    return s;
  }

  // A list of measured microbatch sizes: positive, strictly ascending, non-empty.
  std::vector<int> ubatch_list(const Node& v, const std::string& ptr) const {
    expect_array(v, ptr);
    if (v.size() == 0) {
      fail(ptr, fmt::format("{} is empty", pointer_to_path(ptr)),
           "list the microbatch sizes the profile was measured at, e.g. [1, 2, 4, 8]");
    }
    std::vector<int> sizes;
    sizes.reserve(v.size());
    std::size_t i = 0;
    for (const Node x : v.elements()) {
      const auto elem = [&] { return ptr + "/" + std::to_string(i); };
      const std::int64_t u = integer(x, elem, kUbatch);
      if (u < 1 || u > std::numeric_limits<int>::max()) {
        fail(elem(), fmt::format("{} is {}, but it must be {}", pointer_to_path(elem()), u, kUbatch.what),
             "microbatch sizes count samples: use whole numbers from 1 up");
      }
      if (!sizes.empty() && u <= sizes.back()) {
        fail(elem(),
             fmt::format("{} is {}, not larger than the size before it ({}): the sizes must be strictly ascending",
                         pointer_to_path(elem()), u, sizes.back()),
             fmt::format("list the sizes in {} in ascending order without duplicates, and keep every per-size "
                         "array of every layer in the same order",
                         pointer_to_path(ptr)));
      }
      sizes.push_back(static_cast<int>(u));
      ++i;
    }
    return sizes;
  }

  // A per-layer array with one entry per microbatch size of `sizes_ptr` (e.g. "/ubatch_sizes/fwd").
  Node aligned_array(const Node& layer, const std::string& layer_ptr, const std::string& key, std::size_t expected,
                     const std::string& sizes_ptr, const Expect& e) const {
    const std::string ptr = layer_ptr + "/" + key;
    const Node a =
        member(layer, layer_ptr, key, Expect{"an array of numbers, one per microbatch size", "[...]"}, layer_keys());
    expect_array(a, ptr);
    if (a.size() != expected) {
      // Too long: point at the first extra entry. Too short: at the array.
      const std::string at = a.size() > expected ? ptr + "/" + std::to_string(expected) : ptr;
      fail(at,
           fmt::format("{} has {} entries but {} lists {} microbatch sizes", pointer_to_path(ptr), a.size(),
                       pointer_to_path(sizes_ptr), expected),
           fmt::format("give exactly one value ({}) per size in {}, in the same order", e.what,
                       pointer_to_path(sizes_ptr)));
    }
    return a;
  }

  std::vector<double> time_array(const Node& layer, const std::string& layer_ptr, const std::string& key,
                                 std::size_t expected, const std::string& sizes_ptr) const {
    const Node a = aligned_array(layer, layer_ptr, key, expected, sizes_ptr, kSeconds);
    std::vector<double> out;
    out.reserve(expected);
    for (const Node x : a.elements()) {
      const std::size_t i = out.size();
      out.push_back(seconds(x, [&] { return element_ptr(layer_ptr, key, i); }));
    }
    return out;
  }

  std::vector<Bytes> bytes_array(const Node& layer, const std::string& layer_ptr, const std::string& key,
                                 std::size_t expected, const std::string& sizes_ptr) const {
    const Node a = aligned_array(layer, layer_ptr, key, expected, sizes_ptr, kBytes);
    std::vector<Bytes> out;
    out.reserve(expected);
    for (const Node x : a.elements()) {
      const std::size_t i = out.size();
      out.push_back(size(x, [&] { return element_ptr(layer_ptr, key, i); }));
    }
    return out;
  }

 private:
  JsonLocator loc_;
  const std::string& file_;
};

// A callable returning a fixed pointer, for the scalar readers.
struct At {
  const std::string& ptr;
  const std::string& operator()() const { return ptr; }
};

std::string parse_hint(std::string_view message) {
  const auto has = [&](std::string_view s) { return message.find(s) != std::string_view::npos; };
  if (has("end of input"))
    return "the text ends before the JSON is complete: the file may be truncated, or a closing '}' or ']' is missing";
  if (has("number overflow"))
    return "this number is too large for a double; sizes are integers below 2^63 and times are seconds";
  if (has("invalid string"))
    return "strings may not contain raw control characters or line breaks; escape them (\\n, \\t, \\u001f) and "
           "check backslash escapes";
  if (has("invalid literal")) return "bare words must be true, false or null; put strings in double quotes";
  if (has("invalid number"))
    return "write numbers like 12, -3.5 or 1e-3 (no leading '+', no leading zeros, digits after '.')";
  if (has("expected string literal"))
    return "object keys must be double-quoted strings, and JSON allows no trailing comma before '}'";
  return "check the JSON syntax here: a missing or extra comma, colon, quote or bracket is the usual cause "
         "(JSON allows no comments and no trailing commas)";
}

// format and version first: a different file type should not be reported field by field
template <typename Node>
void check_format(const Node& doc, Reader<Node>& r, const std::string& root) {
  {
    const std::string ptr = "/format";
    const std::string format = r.text(r.member(doc, root, "format", kText, top_level_keys()), ptr);
    if (format != kFormat) {
      r.fail(ptr, fmt::format("unsupported profile format \"{}\"; expected \"{}\"", format, kFormat),
             fmt::format("harmony reads profiles with \"format\": \"{}\", \"format_version\": {}; see {}", kFormat,
                         kFormatVersion, kSchemaDoc));
    }
  }
  {
    const std::string ptr = "/format_version";
    const std::int64_t version =
        r.integer(r.member(doc, root, "format_version", kInteger, top_level_keys()), At{ptr}, kInteger);
    if (version != kFormatVersion) {
      r.fail(ptr, fmt::format("unsupported format_version {}; this harmony reads version {}", version, kFormatVersion),
             fmt::format("convert the profile to \"format_version\": {} (see {})", kFormatVersion, kSchemaDoc));
    }
  }
}

// The model's name (model, then _variant when given) and dtype into m.
template <typename Node>
void read_identity(const Node& doc, Reader<Node>& r, const std::string& root, Model& m) {
  m.name = r.text(r.member(doc, root, "model", kText, top_level_keys()), "/model");
  if (m.name.empty()) r.fail("/model", "model is empty", "name the model, e.g. \"model\": \"bert_large\"");
  if (const auto variant = r.optional_member(doc, "variant"); variant && !variant->is_null()) {
    const std::string v = r.text(*variant, "/variant");
    if (!v.empty()) m.name += "_" + v;
  }
  // Optional (profiles written before mixed precision have none: fp32): the element type of the device tensors
  // whose bytes the layers record. The sizes are taken as written; the field says what they mean.
  if (const auto dtype = r.optional_member(doc, "dtype"); dtype && !dtype->is_null()) {
    m.dtype = r.text(*dtype, "/dtype");
    if (m.dtype != "fp32" && m.dtype != "bf16")
      r.fail("/dtype", fmt::format("unknown dtype \"{}\"", m.dtype), "use \"fp32\" or \"bf16\"");
  }
}

// What the layers' arrays are read against: ubatch_sizes' pointers and its optional inputs list.
struct UbatchSizes {
  std::string fwd_ptr, bwd_ptr, inputs_ptr;
  bool inputs_given = false;  // ubatch_sizes.inputs is present
  std::vector<int> inputs;
};

// ubatch_sizes: the fwd and bwd lists into m; returns the pointers and the inputs list.
template <typename Node>
UbatchSizes read_ubatch_sizes(const Node& doc, Reader<Node>& r, const std::string& root, Model& m) {
  const std::string ub_ptr = "/ubatch_sizes";
  const Node ub = r.member(doc, root, "ubatch_sizes", kObject, top_level_keys());
  r.expect_object(ub, ub_ptr);
  UbatchSizes sizes;
  sizes.fwd_ptr = ub_ptr + "/fwd", sizes.bwd_ptr = ub_ptr + "/bwd", sizes.inputs_ptr = ub_ptr + "/inputs";
  m.ubatch_fwd =
      r.ubatch_list(r.member(ub, ub_ptr, "fwd", Expect{"an array of microbatch sizes", "[1, 2, 4, 8]"}, ubatch_keys()),
                    sizes.fwd_ptr);
  m.ubatch_bwd =
      r.ubatch_list(r.member(ub, ub_ptr, "bwd", Expect{"an array of microbatch sizes", "[1, 2, 4, 8]"}, ubatch_keys()),
                    sizes.bwd_ptr);
  const std::optional<Node> inputs_json = r.optional_member(ub, "inputs");
  sizes.inputs_given = inputs_json.has_value();
  if (inputs_json) sizes.inputs = r.ubatch_list(*inputs_json, sizes.inputs_ptr);
  return sizes;
}

// The layers array, checked against num_layers and criterion_layer.
template <typename Node>
Node read_layers_array(const Node& doc, Reader<Node>& r, const std::string& root) {
  const std::string num_ptr = "/num_layers", layers_ptr = "/layers";
  const std::int64_t num_layers = r.integer(r.member(doc, root, "num_layers", kCount, top_level_keys()), At{num_ptr},
                                            Expect{"a positive integer (layers incl. the loss)", "28"});
  const Node layers =
      r.member(doc, root, "layers", Expect{"an array of layer objects", "[{...}, ...]"}, top_level_keys());
  r.expect_array(layers, layers_ptr);
  if (layers.size() == 0) {
    r.fail(layers_ptr, "layers is empty; a profile has at least the criterion (loss) layer",
           "list one object per layer, ordered by index, ending with the criterion layer");
  }
  const std::size_t n_layers = layers.size();
  if (num_layers != static_cast<std::int64_t>(n_layers)) {
    r.fail(num_ptr, fmt::format("num_layers is {} but layers has {} entries", num_layers, n_layers),
           fmt::format("num_layers counts every entry of layers, the criterion included: set it to {}, or add or "
                       "remove layers",
                       n_layers));
  }
  if (const auto crit = r.optional_member(doc, "criterion_layer")) {
    const std::string ptr = "/criterion_layer";
    const std::int64_t c = r.integer(*crit, At{ptr}, kInteger);
    if (c != static_cast<std::int64_t>(n_layers) - 1) {
      r.fail(ptr, fmt::format("criterion_layer is {} but the criterion is the last layer, {}", c, n_layers - 1),
             fmt::format("set \"criterion_layer\": {} (num_layers - 1)", n_layers - 1));
    }
  }
  return layers;
}

// input_bytes is redundant (always u * input_bytes_per_sample); check it when present
template <typename Node>
void check_input_bytes(const Node& lj, const std::string& lp, const Layer& l, const UbatchSizes& ub, Reader<Node>& r) {
  if (!r.optional_member(lj, "input_bytes")) return;
  const std::string p = lp + "/" + "input_bytes";
  if (!ub.inputs_given) {
    r.fail(
        p,
        fmt::format("{} is given but ubatch_sizes.inputs, the sizes it is measured at, is missing", pointer_to_path(p)),
        "add \"inputs\": [...] to ubatch_sizes (one size per input_bytes entry), or drop input_bytes");
  }
  const std::vector<Bytes> in = r.bytes_array(lj, lp, "input_bytes", ub.inputs.size(), ub.inputs_ptr);
  for (std::size_t j = 0; j < in.size(); ++j) {
    const Bytes u = ub.inputs[j];
    Bytes expected = 0;
    const bool overflow = __builtin_mul_overflow(u, l.input_bytes_per_sample, &expected);
    if (overflow || in[j] != expected) {
      const std::string ep = p + "/" + std::to_string(j);
      r.fail(ep,
             fmt::format("{} is {}, but ubatch_sizes.inputs[{}] x input_bytes_per_sample = {} x {} = {}",
                         pointer_to_path(ep), in[j], j, u, l.input_bytes_per_sample,
                         overflow ? std::string("(overflow)") : std::to_string(expected)),
             "input bytes are exact (u x input_bytes_per_sample): correct input_bytes_per_sample or this entry");
    }
  }
}

// layers[i] of n_layers, its arrays read against m's microbatch sizes.
template <typename Node>
Layer read_layer(const Node& lj, std::size_t i, std::size_t n_layers, const Model& m, const UbatchSizes& ub,
                 Reader<Node>& r) {
  const std::string lp = std::string("/layers") + "/" + std::to_string(i);
  r.expect_object(lj, lp);
  const auto field = [&](const char* key, const Expect& e) -> Node { return r.member(lj, lp, key, e, layer_keys()); };
  const auto ptr_of = [&](const char* key) { return lp + "/" + key; };

  {
    const std::string p = ptr_of("index");
    const std::int64_t index = r.integer(field("index", kInteger), At{p}, kInteger);
    if (index != static_cast<std::int64_t>(i)) {
      r.fail(p, fmt::format("layers[{}] has index {}; layers must be listed in order 0..{}", i, index, n_layers - 1),
             fmt::format("set \"index\": {} or move this layer to position {}", i, index));
    }
  }
  Layer l;
  l.name = r.text(field("name", kText), ptr_of("name"));
  {
    const std::string p = ptr_of("is_criterion");
    l.is_criterion = r.boolean(field("is_criterion", kBool), p);
    if (l.is_criterion && i + 1 != n_layers) {
      r.fail(p,
             fmt::format("layers[{}] ({}) is marked as the criterion but is not the last layer (the last is {})", i,
                         l.name, n_layers - 1),
             "only the loss may have \"is_criterion\": true, and it must be the last entry of layers: set this "
             "one to false or move the loss to the end");
    }
    if (!l.is_criterion && i + 1 == n_layers) {
      r.fail(p, fmt::format("the last layer, layers[{}] ({}), is not marked as the criterion", i, l.name),
             "the last entry of layers must be the loss layer with \"is_criterion\": true");
    }
  }
  l.weight_bytes = r.size(field("weight_bytes", kBytes), At{ptr_of("weight_bytes")});
  l.buffer_bytes = r.size(field("buffer_bytes", kBytes), At{ptr_of("buffer_bytes")});
  l.optimizer_state_bytes = r.size(field("optimizer_state_bytes", kBytes), At{ptr_of("optimizer_state_bytes")});
  l.param_count = r.size(field("param_count", kCount), At{ptr_of("param_count")}, kCount);
  l.update_time_cpu_s = r.seconds(field("update_time_cpu", kSeconds), At{ptr_of("update_time_cpu")});
  l.input_bytes_per_sample = r.size(field("input_bytes_per_sample", kBytes), At{ptr_of("input_bytes_per_sample")});
  l.fwd_time_s = r.time_array(lj, lp, "fwd_time", m.ubatch_fwd.size(), ub.fwd_ptr);
  l.bwd_time_s = r.time_array(lj, lp, "bwd_time", m.ubatch_bwd.size(), ub.bwd_ptr);
  l.fwd_peak_bytes = r.bytes_array(lj, lp, "fwd_peak_memory", m.ubatch_fwd.size(), ub.fwd_ptr);
  l.bwd_peak_bytes = r.bytes_array(lj, lp, "bwd_peak_memory", m.ubatch_bwd.size(), ub.bwd_ptr);
  if (r.optional_member(lj, "bwd_transient_memory"))
    l.bwd_transient_bytes = r.bytes_array(lj, lp, "bwd_transient_memory", m.ubatch_bwd.size(), ub.bwd_ptr);
  if (r.optional_member(lj, "saved_activation_memory"))
    l.saved_bytes = r.bytes_array(lj, lp, "saved_activation_memory", m.ubatch_bwd.size(), ub.bwd_ptr);
  check_input_bytes(lj, lp, l, ub, r);
  return l;
}

// The whole profile, in the order the located path reports problems: format, identity, ubatch_sizes, the layer
// count, then each layer.
template <typename Node>
Model read_model(const Node& doc, Reader<Node>& r) {
  const std::string root;
  r.expect_object(doc, root);
  check_format(doc, r, root);
  Model m;
  read_identity(doc, r, root, m);
  const UbatchSizes ub = read_ubatch_sizes(doc, r, root, m);
  const Node layers = read_layers_array(doc, r, root);
  const std::size_t n_layers = layers.size();
  m.layers.reserve(n_layers);
  std::size_t i = 0;
  for (const Node lj : layers.elements()) {
    m.layers.push_back(read_layer(lj, i, n_layers, m, ub, r));
    ++i;
  }
  return m;
}

// The fast path: simdjson's DOM walked by read_model. Empty when simdjson refuses the text or the walk meets
// any problem; the located path then finds it again and says what and where.
std::optional<Model> read_fast(const std::string& text, const std::string& name) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(text).get(doc) != simdjson::SUCCESS) return std::nullopt;
  Reader<SimdNode> reader(text, name);
  try {
    return read_model(SimdNode(doc), reader);
  } catch (const NeedsLocatedPath&) {
    return std::nullopt;
  }
}

// The located path: nlohmann-json's tree, every problem a ConfigError at file:line:column with a hint.
Model read_located(const std::string& text, const std::string& name) {
  const json doc = parse_json_located(text, name, [](const JsonParseProblem& p) { return parse_hint(p.message); });
  Reader<JsonNode> reader(text, name);
  return read_model(JsonNode(doc), reader);
}

Model finish(Model m, const std::string& text, const std::string& name) {
  m.source = name;
  try {
    m.validate();
  } catch (const ScheduleError& e) {  // not reachable after the checks above; kept as a safety net
    Reader<JsonNode>(text, name)
        .fail("/layers", e.what(), fmt::format("fix the profile so that it follows the schema in {}", kSchemaDoc));
  }
  return m;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

Model load_profile_text(const std::string& text, const std::string& name) {
  std::optional<Model> m = read_fast(text, name);
  return finish(m ? std::move(*m) : read_located(text, name), text, name);
}

Model load_profile_text_located(const std::string& text, const std::string& name) {
  return finish(read_located(text, name), text, name);
}

// A config's relative paths (model.profile, in the file or in --set) start at the folder of the config that names
// them; the loaders resolve them before this sees the path.
constexpr const char* kMissingProfileHint =
    "check the path: a relative model.profile starts at the folder of the config that names it (also in --set); "
    "the bundled profiles are configs/profiles/bert_large.json and configs/profiles/gpt2_medium.json (from a "
    "config in configs/examples/: ../profiles/bert_large.json)";

Model load_profile(const std::string& path) {
  const auto fail = [&](int err) {
    throw ConfigError(SourceLoc{path, 0, 0}, fmt::format("cannot read profile {}: {}", path, std::strerror(err)),
                      kMissingProfileHint);
  };
  std::string problem;
  const int fd = open_input_file(path, &problem);  // refuses folders, FIFOs and devices with the reason
  if (fd < 0)
    throw ConfigError(SourceLoc{path, 0, 0}, fmt::format("cannot read profile {}: {}", path, problem),
                      kMissingProfileHint);
  std::unique_ptr<std::FILE, FileCloser> f(::fdopen(fd, "rb"));
  if (!f) {
    const int err = errno;
    ::close(fd);
    fail(err);
  }
  std::string text;
  // Room for the whole file plus simdjson's padding, so that neither growing nor parsing copies it.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0)
    text.reserve(static_cast<std::size_t>(st.st_size) + simdjson::SIMDJSON_PADDING);
  char buf[1 << 16];
  std::size_t n = 0;
  errno = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  if (std::ferror(f.get())) fail(errno != 0 ? errno : EIO);
  return load_profile_text(text, path);
}

}  // namespace harmony::core
