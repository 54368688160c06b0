// Serialises a Model to "harmony-profile-json" v1 text that core/model/profile.cpp reads back field for field:
// the schema's fields in its order, caller metadata at the top level, one layer per line.
#include "core/model/profile_write.hpp"

#include <array>
#include <cmath>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"

namespace harmony::core {
namespace {

using ordered = nlohmann::ordered_json;

// The top-level keys the writer emits itself; metadata may not replace them.
constexpr std::array<std::string_view, 9> kSchemaKeys = {
    "format", "format_version", "model", "variant", "dtype", "num_layers", "criterion_layer", "ubatch_sizes", "layers"};

void check_size(const Layer& l, int index, const char* field, std::int64_t v) {
  if (v < 0)
    throw ScheduleError(
        fmt::format("cannot write the profile: layer {} ({}) has {} = {}, negative", index, l.name, field, v));
}

void check_time(const Layer& l, int index, const char* field, double v) {
  if (!std::isfinite(v) || v < 0.0)
    throw ScheduleError(
        fmt::format("cannot write the profile: layer {} ({}) has {} = {}, not a finite non-negative number of seconds",
                    index, l.name, field, v));
}

ordered layer_json(const Layer& l, int index) {
  check_size(l, index, "weight_bytes", l.weight_bytes);
  check_size(l, index, "buffer_bytes", l.buffer_bytes);
  check_size(l, index, "optimizer_state_bytes", l.optimizer_state_bytes);
  check_size(l, index, "param_count", l.param_count);
  check_size(l, index, "input_bytes_per_sample", l.input_bytes_per_sample);
  check_time(l, index, "update_time_cpu", l.update_time_cpu_s);
  for (const double t : l.fwd_time_s) check_time(l, index, "fwd_time", t);
  for (const double t : l.bwd_time_s) check_time(l, index, "bwd_time", t);
  for (const Bytes b : l.fwd_peak_bytes) check_size(l, index, "fwd_peak_memory", b);
  for (const Bytes b : l.bwd_peak_bytes) check_size(l, index, "bwd_peak_memory", b);
  for (const Bytes b : l.bwd_transient_bytes) check_size(l, index, "bwd_transient_memory", b);
  for (const Bytes b : l.saved_bytes) check_size(l, index, "saved_activation_memory", b);

  ordered j = ordered::object();
  j["index"] = index;
  j["name"] = l.name;
  j["is_criterion"] = l.is_criterion;
  j["input_bytes_per_sample"] = l.input_bytes_per_sample;
  j["weight_bytes"] = l.weight_bytes;
  j["param_count"] = l.param_count;
  j["buffer_bytes"] = l.buffer_bytes;
  j["optimizer_state_bytes"] = l.optimizer_state_bytes;
  j["update_time_cpu"] = l.update_time_cpu_s;
  j["fwd_time"] = l.fwd_time_s;
  j["bwd_time"] = l.bwd_time_s;
  j["fwd_peak_memory"] = l.fwd_peak_bytes;
  j["bwd_peak_memory"] = l.bwd_peak_bytes;
  if (!l.bwd_transient_bytes.empty()) j["bwd_transient_memory"] = l.bwd_transient_bytes;
  if (!l.saved_bytes.empty()) j["saved_activation_memory"] = l.saved_bytes;
  return j;
}

// One member per line: `"key": value` with the value compact.
void append_member(std::string& out, std::string_view key, const std::string& value_text) {
  out += "  ";
  out += ordered(key).dump();
  out += ": ";
  out += value_text;
  out += ",\n";
}

}  // namespace

std::string write_profile_json(const Model& model) { return write_profile_json(model, nlohmann::json()); }

std::string write_profile_json(const Model& model, const nlohmann::json& metadata) {
  if (model.name.empty()) throw ScheduleError("cannot write the profile: the model has no name");
  model.validate();
  if (!metadata.is_null() && !metadata.is_object())
    throw ScheduleError(
        fmt::format("cannot write the profile: metadata must be a JSON object, not {}", metadata.type_name()));
  if (metadata.is_object()) {
    for (const std::string_view key : kSchemaKeys) {
      if (metadata.contains(key))
        throw ScheduleError(fmt::format(
            "cannot write the profile: metadata key \"{}\" is a schema field the writer sets from the model", key));
    }
  }

  std::string out = "{\n";
  append_member(out, "format", ordered("harmony-profile-json").dump());
  append_member(out, "format_version", ordered(1).dump());
  if (metadata.is_object()) {
    for (const auto& item : metadata.items()) append_member(out, item.key(), item.value().dump());
  }
  append_member(out, "model", ordered(model.name).dump());
  append_member(out, "variant", "null");
  if (model.dtype != "fp32") append_member(out, "dtype", ordered(model.dtype).dump());  // absent means fp32
  append_member(out, "num_layers", ordered(model.num_layers()).dump());
  append_member(out, "criterion_layer", ordered(model.num_layers() - 1).dump());
  ordered ub = ordered::object();
  ub["fwd"] = model.ubatch_fwd;
  ub["bwd"] = model.ubatch_bwd;
  append_member(out, "ubatch_sizes", ub.dump());
  out += "  \"layers\": [\n";
  for (int i = 0; i < model.num_layers(); ++i) {
    out += "    ";
    out += layer_json(model.layers[static_cast<std::size_t>(i)], i).dump();
    out += i + 1 < model.num_layers() ? ",\n" : "\n";
  }
  out += "  ]\n}\n";
  return out;
}

}  // namespace harmony::core
