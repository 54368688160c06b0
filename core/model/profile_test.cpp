// Tests of the profile loader (core/model/profile.cpp) and the JSON locator behind its error positions
// (core/base/json_locate.cpp): the bundled paper profiles load with the values the JSON holds, interpolation
// at unmeasured sizes matches hand-derived numbers, and every kind of bad input is a ConfigError at the
// right line:column with a hint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/json_locate.hpp"
#include "core/model/model.hpp"
#include "core/model/profile.hpp"
#include "core/model/profile_write.hpp"
#include "tests/common/test_support.hpp"

using harmony::test::source_dir;

using harmony::core::Bytes;
using harmony::core::ConfigError;
using harmony::core::JsonLocator;
using harmony::core::load_profile;
using harmony::core::load_profile_text;
using harmony::core::Model;
using harmony::core::Phase;
using harmony::core::ScheduleError;
using harmony::core::TextPos;

namespace {

std::string profile_path(const std::string& name) { return source_dir() + "/configs/profiles/" + name; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path, " (set HARMONY_SOURCE_DIR to the source root)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A two-layer profile measured at sizes {1, 4}. Line numbers (1-based) matter to the error tests below,
// which count columns by hand: the raw string starts with '{' on line 1, nesting is indented by 2 spaces,
// so a key of layer 0 starts at column 7 and its value at 7 + len("\"key\"") + 2.
// Layer 0's times are chosen so that the interpolated values are exact in binary floating point.
const std::string kMini = R"({
  "format": "harmony-profile-json",
  "format_version": 1,
  "model": "mini",
  "variant": null,
  "num_layers": 2,
  "ubatch_sizes": {"fwd": [1, 4], "bwd": [1, 4], "inputs": [1, 4]},
  "layers": [
    {
      "index": 0,
      "name": "vlayer0",
      "is_criterion": false,
      "weight_bytes": 1000,
      "buffer_bytes": 24,
      "optimizer_state_bytes": 2000,
      "param_count": 250,
      "update_time_cpu": 0.5,
      "input_bytes_per_sample": 10,
      "input_bytes": [10, 40],
      "fwd_time": [0.25, 1.75],
      "bwd_time": [0.5, 2.0],
      "fwd_peak_memory": [100, 201],
      "bwd_peak_memory": [300, 700],
      "extra_metadata": {"note": "unknown keys are allowed"}
    },
    {
      "index": 1,
      "name": "criterion",
      "is_criterion": true,
      "weight_bytes": 0,
      "buffer_bytes": 0,
      "optimizer_state_bytes": 0,
      "param_count": 0,
      "update_time_cpu": 0,
      "input_bytes_per_sample": 8,
      "fwd_time": [0.125, 0.125],
      "bwd_time": [0.25, 0.5],
      "fwd_peak_memory": [64, 64],
      "bwd_peak_memory": [128, 256]
    }
  ],
  "totals": {"note": "not read by the loader"}
})";

// kMini with `from` (which must occur exactly once) replaced by `to`.
std::string edit(const std::string& from, const std::string& to, const std::string& base = kMini) {
  const std::size_t at = base.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "test text lacks: ", from);
  REQUIRE_MESSAGE(base.find(from, at + 1) == std::string::npos, "test text has more than one: ", from);
  std::string out = base;
  out.replace(at, from.size(), to);
  return out;
}

// The ConfigError loading `text` throws (as "mini.json"); fails the test when it loads.
ConfigError error_of(const std::string& text) {
  try {
    load_profile_text(text, "mini.json");
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return ConfigError({}, "");
}

// Checks the error's file:line:column (also in what()), that the message mentions `needle` and that
// there is a hint.
void check_error(const ConfigError& e, int line, int column, const std::string& needle) {
  INFO("what(): ", e.what());
  CHECK(e.loc().file == "mini.json");
  CHECK(e.loc().line == line);
  CHECK(e.loc().column == column);
  const std::string where = "mini.json:" + std::to_string(line) + ":" + std::to_string(column) + ": error: ";
  CHECK(std::string(e.what()).rfind(where, 0) == 0);
  CHECK(e.message().find(needle) != std::string::npos);
  CHECK(!e.hint().empty());
  CHECK(std::string(e.what()).find("\n  hint: ") != std::string::npos);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The bundled profiles

TEST_CASE("bert_large loads: 28 layers, fwd sizes 1..243, bwd 1..78, spot values from the JSON") {
  const Model m = load_profile(profile_path("bert_large.json"));
  CHECK(m.name == "bert_large_seqlen512");  // "model" + "_" + "variant"
  CHECK(m.source == profile_path("bert_large.json"));
  REQUIRE(m.num_layers() == 28);
  REQUIRE(m.ubatch_fwd.size() == 243);
  REQUIRE(m.ubatch_bwd.size() == 78);
  for (int i = 0; i < 243; ++i) CHECK(m.ubatch_fwd[static_cast<std::size_t>(i)] == i + 1);
  for (int i = 0; i < 78; ++i) CHECK(m.ubatch_bwd[static_cast<std::size_t>(i)] == i + 1);
  CHECK(m.ubatch_min(Phase::Fwd) == 1);
  CHECK(m.ubatch_max(Phase::Fwd) == 243);
  CHECK(m.ubatch_max(Phase::Bwd) == 78);

  // Literals copied from layers[1] of configs/profiles/bert_large.json (Python repr, which round-trips).
  const auto& l1 = m.layers[1];
  CHECK(l1.name == "vlayer1");
  CHECK(!l1.is_criterion);
  CHECK(l1.weight_bytes == 50384896);
  CHECK(l1.buffer_bytes == 0);
  CHECK(l1.optimizer_state_bytes == 100769792);  // Adam: 2 x W
  CHECK(l1.param_count == 12596224);             // fp32: W / 4
  CHECK(l1.update_time_cpu_s == 0.02160293096676469);
  CHECK(l1.input_bytes_per_sample == 2099200);
  CHECK(l1.fwd_time_s[0] == 0.004080253827851266);  // u = 1
  CHECK(l1.fwd_time_s[7] == 0.020411737787071615);  // u = 8
  CHECK(l1.fwd_time_s[242] == 0.6248372780391946);  // u = 243
  CHECK(l1.bwd_time_s[0] == 0.017158548755105585);  // u = 1
  CHECK(l1.bwd_time_s[77] == 0.6369074705871753);   // u = 78
  CHECK(l1.fwd_peak_bytes[7] == 419500032);         // u = 8
  CHECK(l1.fwd_peak_bytes[242] == 11262257152);     // u = 243: above 2^32, needs 64 bits
  CHECK(l1.bwd_peak_bytes[0] == 193009664);         // u = 1
  CHECK(l1.bwd_peak_bytes[77] == 9882324992);       // u = 78
  // The same numbers through Model's lookups at measured sizes.
  CHECK(m.time_s(Phase::Fwd, 8, 1) == 0.020411737787071615);
  CHECK(m.time_s(Phase::Bwd, 78, 1) == 0.6369074705871753);
  CHECK(m.peak_bytes(Phase::Fwd, 243, 1) == 11262257152);
  CHECK(m.peak_bytes(Phase::Bwd, 1, 1) == 193009664);

  CHECK(m.layers[0].input_bytes_per_sample == 10240);  // the data: 2 x 512 int64 + 512 float32 = 4096+4096+2048
  CHECK(m.layers[27].name == "criterion");
  CHECK(m.layers[27].is_criterion);
  CHECK(m.layers[27].input_bytes_per_sample == 8);  // two float32 logits per sample
  for (int l = 0; l < 27; ++l) CHECK(!m.layers[static_cast<std::size_t>(l)].is_criterion);
}

TEST_CASE("gpt2_medium loads: 28 layers, fwd sizes 1..18, bwd 1..9, spot values from the JSON") {
  const Model m = load_profile(profile_path("gpt2_medium.json"));
  CHECK(m.name == "gpt2_medium");  // "variant": null adds no suffix
  REQUIRE(m.num_layers() == 28);
  REQUIRE(m.ubatch_fwd.size() == 18);
  REQUIRE(m.ubatch_bwd.size() == 9);
  for (int i = 0; i < 18; ++i) CHECK(m.ubatch_fwd[static_cast<std::size_t>(i)] == i + 1);
  for (int i = 0; i < 9; ++i) CHECK(m.ubatch_bwd[static_cast<std::size_t>(i)] == i + 1);

  const auto& l1 = m.layers[1];  // layers[1] of configs/profiles/gpt2_medium.json
  CHECK(l1.weight_bytes == 50384896);
  CHECK(l1.buffer_bytes == 4194304);  // the causal-mask buffer attn.bias: 1024 x 1024 float32
  CHECK(l1.optimizer_state_bytes == 100769792);
  CHECK(l1.update_time_cpu_s == 0.013971929787658155);
  CHECK(l1.input_bytes_per_sample == 4194304);  // 1024 tokens x 1024 hidden x float32
  CHECK(m.time_s(Phase::Fwd, 18, 1) == 0.12041691201739013);
  CHECK(m.time_s(Phase::Bwd, 9, 1) == 0.1611836107331328);
  CHECK(m.peak_bytes(Phase::Fwd, 18, 1) == 4211134464);
  CHECK(m.peak_bytes(Phase::Bwd, 9, 1) == 3527569408);
  CHECK(m.layers[27].is_criterion);
  CHECK(m.layers[27].input_bytes_per_sample == 205852672);  // logits: 1024 tokens x 50257 vocab x float32
}

TEST_CASE("every measured value of both profiles equals the JSON exactly (read independently with nlohmann)") {
  for (const char* file : {"bert_large.json", "gpt2_medium.json"}) {
    INFO(file);
    const Model m = load_profile(profile_path(file));
    const auto j = nlohmann::json::parse(read_text(profile_path(file)));
    const auto& layers = j.at("layers");
    REQUIRE(layers.size() == static_cast<std::size_t>(m.num_layers()));
    const auto& fwd = j.at("ubatch_sizes").at("fwd");
    const auto& bwd = j.at("ubatch_sizes").at("bwd");
    int mismatches = 0;
    for (int l = 0; l < m.num_layers(); ++l) {
      const auto& lj = layers[static_cast<std::size_t>(l)];
      const auto& ml = m.layers[static_cast<std::size_t>(l)];
      CHECK(ml.name == lj.at("name").get<std::string>());
      CHECK(ml.weight_bytes == lj.at("weight_bytes").get<Bytes>());
      CHECK(ml.buffer_bytes == lj.at("buffer_bytes").get<Bytes>());
      CHECK(ml.optimizer_state_bytes == lj.at("optimizer_state_bytes").get<Bytes>());
      CHECK(ml.param_count == lj.at("param_count").get<std::int64_t>());
      CHECK(ml.update_time_cpu_s == lj.at("update_time_cpu").get<double>());
      for (std::size_t i = 0; i < fwd.size(); ++i) {
        const int u = fwd[i].get<int>();
        mismatches += m.time_s(Phase::Fwd, u, l) != lj.at("fwd_time")[i].get<double>();
        mismatches += m.peak_bytes(Phase::Fwd, u, l) != lj.at("fwd_peak_memory")[i].get<Bytes>();
      }
      for (std::size_t i = 0; i < bwd.size(); ++i) {
        const int u = bwd[i].get<int>();
        mismatches += m.time_s(Phase::Bwd, u, l) != lj.at("bwd_time")[i].get<double>();
        mismatches += m.peak_bytes(Phase::Bwd, u, l) != lj.at("bwd_peak_memory")[i].get<Bytes>();
      }
      // input_bytes[i] in the JSON is the exact X at ubatch_sizes.inputs[i]
      const auto& inputs = j.at("ubatch_sizes").at("inputs");
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        mismatches += m.input_bytes(inputs[i].get<int>(), l) != lj.at("input_bytes")[i].get<Bytes>();
      }
    }
    CHECK(mismatches == 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Lookups on the synthetic profile

TEST_CASE("the synthetic profile loads; unknown keys are ignored") {
  const Model m = load_profile_text(kMini, "mini.json");
  CHECK(m.name == "mini");
  CHECK(m.source == "mini.json");
  REQUIRE(m.num_layers() == 2);
  CHECK(m.ubatch_fwd == std::vector<int>{1, 4});
  CHECK(m.ubatch_bwd == std::vector<int>{1, 4});
  CHECK(m.layers[0].name == "vlayer0");
  CHECK(m.layers[0].weight_bytes == 1000);
  CHECK(m.layers[0].buffer_bytes == 24);
  CHECK(m.layers[0].optimizer_state_bytes == 2000);
  CHECK(m.layers[0].param_count == 250);
  CHECK(m.layers[0].update_time_cpu_s == 0.5);
  CHECK(m.layers[1].update_time_cpu_s == 0.0);  // written as the integer 0: any JSON number is a time
  CHECK(m.layers[1].is_criterion);
  CHECK(m.weight_bytes(0, 1) == 1000);
  CHECK(m.buffer_bytes(0, 1) == 24);
  CHECK(m.optimizer_state_bytes(0, 1) == 2000);

  // A string variant is appended to the model name.
  CHECK(load_profile_text(edit("\"variant\": null", "\"variant\": \"tiny\""), "x").name == "mini_tiny");
  // ubatch_sizes.inputs and input_bytes are optional.
  const std::string no_inputs = edit("\"input_bytes\": [10, 40],\n", "", edit(", \"inputs\": [1, 4]}", "}"));
  CHECK(load_profile_text(no_inputs, "x").layers[0].input_bytes_per_sample == 10);
}

TEST_CASE("time and memory at measured sizes are the JSON values; in between they interpolate") {
  const Model m = load_profile_text(kMini, "mini.json");
  // Measured sizes 1 and 4: the values as written.
  CHECK(m.time_s(Phase::Fwd, 1, 0) == 0.25);
  CHECK(m.time_s(Phase::Fwd, 4, 0) == 1.75);
  CHECK(m.time_s(Phase::Bwd, 4, 0) == 2.0);
  CHECK(m.peak_bytes(Phase::Fwd, 4, 0) == 201);
  CHECK(m.peak_bytes(Phase::Bwd, 1, 1) == 128);

  // np.interp between (1, y1) and (4, y4): slope = (y4 - y1) / 3, value = slope * (u - 1) + y1.
  // fwd_time [0.25, 1.75]: slope 0.5 -> u=2: 0.75, u=3: 1.25 (all exact in binary).
  CHECK(m.time_s(Phase::Fwd, 2, 0) == 0.75);
  CHECK(m.time_s(Phase::Fwd, 3, 0) == 1.25);
  // bwd_time [0.5, 2.0]: slope 0.5 -> u=2: 1.0, u=3: 1.5.
  CHECK(m.time_s(Phase::Bwd, 2, 0) == 1.0);
  CHECK(m.time_s(Phase::Bwd, 3, 0) == 1.5);
  // criterion bwd_time [0.25, 0.5]: slope 1/12 -> u=3: 2/12 + 0.25 = 0.41666..., not exact: compare loosely.
  CHECK(m.time_s(Phase::Bwd, 3, 1) == doctest::Approx(0.25 + 2.0 / 12.0).epsilon(1e-15));
  // fwd_peak_memory [100, 201]: slope 101/3 = 33.67 -> u=2: 133.67 -> 133, u=3: 167.33 -> 167.
  CHECK(m.peak_bytes(Phase::Fwd, 2, 0) == 133);
  CHECK(m.peak_bytes(Phase::Fwd, 3, 0) == 167);
  // bwd_peak_memory [300, 700]: slope 133.33 -> u=2: 433.33 -> 433, u=3: 566.67 -> 566 (truncated, not 567).
  CHECK(m.peak_bytes(Phase::Bwd, 2, 0) == 433);
  CHECK(m.peak_bytes(Phase::Bwd, 3, 0) == 566);
  // criterion bwd_peak_memory [128, 256]: slope 42.67 -> u=2: 170.67 -> 170.
  CHECK(m.peak_bytes(Phase::Bwd, 2, 1) == 170);
}

TEST_CASE("input bytes are u x input_bytes_per_sample, and 0 after the loss") {
  const Model m = load_profile_text(kMini, "mini.json");
  CHECK(m.input_bytes(1, 0) == 10);
  CHECK(m.input_bytes(3, 0) == 30);  // 3 is not a measured input size: still exact
  CHECK(m.input_bytes(4, 1) == 32);  // 4 x 8
  CHECK(m.input_bytes(3, 2) == 0);   // l == R: after the criterion
}

TEST_CASE("sizes outside the measured range throw ScheduleError") {
  const Model m = load_profile_text(kMini, "mini.json");
  CHECK_THROWS_AS(m.time_s(Phase::Fwd, 0, 0), ScheduleError);
  CHECK_THROWS_AS(m.time_s(Phase::Fwd, 5, 0), ScheduleError);
  CHECK_THROWS_AS(m.peak_bytes(Phase::Bwd, 5, 1), ScheduleError);
  const Model bert = load_profile(profile_path("bert_large.json"));
  CHECK_NOTHROW(bert.time_s(Phase::Fwd, 243, 0));
  CHECK_THROWS_AS(bert.time_s(Phase::Fwd, 244, 0), ScheduleError);
  CHECK_THROWS_AS(bert.time_s(Phase::Bwd, 79, 0), ScheduleError);
  CHECK_THROWS_AS(bert.peak_bytes(Phase::Bwd, 79, 0), ScheduleError);
}

// ---------------------------------------------------------------------------------------------------
// Bad inputs. Positions are counted by hand on kMini's layout (see the comment above it).

TEST_CASE("malformed JSON: a missing comma points at the token after it") {
  // Line 4 loses its comma; the parser then meets line 5's key `  "variant"`: column 3.
  const auto e = error_of(edit("\"model\": \"mini\",", "\"model\": \"mini\""));
  check_error(e, 5, 3, "malformed JSON");
  CHECK(e.message().find("unexpected string literal") != std::string::npos);
}

TEST_CASE("malformed JSON: a trailing comma, an invalid literal, a truncated file") {
  // Line 42 becomes `  "totals": {...},` and line 43 is `}`: the parser wants another key at 43:1.
  check_error(error_of(edit("\"not read by the loader\"}", "\"not read by the loader\"},")), 43, 1, "malformed JSON");
  // Line 5 `  "variant": nul,`: the literal starts at 3 + len("\"variant\"") + 2 = column 14.
  check_error(error_of(edit("\"variant\": null", "\"variant\": nul")), 5, 14, "invalid literal");
  // Cut after line 3's `  "format_version": 1,`: the error is just past the last token, at 3:23.
  const std::string cut = kMini.substr(0, kMini.find("\"format_version\": 1,") + 20);
  check_error(error_of(cut), 3, 23, "end of input");
  // A raw line break inside a string: reported at the break itself, the end of line 4 `  "model": "mi`.
  check_error(error_of(edit("\"mini\"", "\"mi\nni\"")), 4, 15, "invalid string");
  // Empty input.
  check_error(error_of(""), 1, 1, "malformed JSON");
}

TEST_CASE("malformed JSON: a number too large for a double is located by its spelling") {
  // Line 16 `      "param_count": 1e999,`: value at 7 + len("\"param_count\"") + 2 = column 22.
  check_error(error_of(edit("\"param_count\": 250", "\"param_count\": 1e999")), 16, 22, "number overflow");
}

TEST_CASE("missing field: reported at the object that lacks it, with a did-you-mean for a misspelling") {
  // Layer 0's weight_bytes removed: the error points at layer 0's '{' (line 9, column 5).
  const auto e = error_of(edit("      \"weight_bytes\": 1000,\n", ""));
  check_error(e, 9, 5, "missing required field \"weight_bytes\" in layers[0]");
  CHECK(e.hint().find("\"weight_bytes\"") != std::string::npos);
  // Misspelt: the hint suggests the intended name. (Known schema keys are never suggested.)
  const auto typo = error_of(edit("\"weight_bytes\": 1000", "\"wieght_bytes\": 1000"));
  check_error(typo, 9, 5, "weight_bytes");
  CHECK(typo.hint().find("did you mean \"weight_bytes\"") != std::string::npos);
  // A missing top-level field points at the document's '{' (1:1).
  check_error(error_of(edit("  \"num_layers\": 2,\n", "")), 1, 1, "missing required field \"num_layers\"");
  // ubatch_sizes.bwd missing: at the ubatch_sizes object, line 7 column 19.
  check_error(error_of(edit("\"bwd\": [1, 4], ", "")), 7, 19, "\"bwd\"");
}

TEST_CASE("wrong type: reported at the value, saying what was expected") {
  // Line 14 `      "buffer_bytes": "24",`: value at 7 + len("\"buffer_bytes\"") + 2 = column 23.
  const auto e = error_of(edit("\"buffer_bytes\": 24", "\"buffer_bytes\": \"24\""));
  check_error(e, 14, 23, "layers[0].buffer_bytes must be a non-negative integer number of bytes, not the string");
  // A fractional byte count is a wrong type too (line 22 `      "fwd_peak_memory": [100, 201.5],`:
  // '[' at 7 + len("\"fwd_peak_memory\"") + 2 = 26, the second element at 26 + len("[100, ") = 32).
  check_error(error_of(edit("[100, 201]", "[100, 201.5]")), 22, 32, "layers[0].fwd_peak_memory[1] must be");
  // is_criterion as a string (line 12, column 23).
  check_error(error_of(edit("\"is_criterion\": false", "\"is_criterion\": \"no\"")), 12, 23, "must be a boolean");
  // The whole document as an array.
  check_error(error_of("[1, 2]"), 1, 1, "the document must be an object");
}

TEST_CASE("negative weight_bytes is reported at the value") {
  // Line 13 `      "weight_bytes": -1000,`: value at 7 + len("\"weight_bytes\"") + 2 = column 23.
  const auto e = error_of(edit("\"weight_bytes\": 1000", "\"weight_bytes\": -1000"));
  check_error(e, 13, 23, "layers[0].weight_bytes is -1000");
  CHECK(e.hint().find("never negative") != std::string::npos);
  // A negative time (line 20 `      "fwd_time": [0.25, -1.75],`: '[' at 19, element 1 at 19 + 7 = 26).
  check_error(error_of(edit("[0.25, 1.75]", "[0.25, -1.75]")), 20, 26, "layers[0].fwd_time[1] is -1.75");
}

TEST_CASE("times and sizes beyond their documented range are reported at the value (issue 11)") {
  // A 1e300 s layer time printed "internal: an event at -9223371662538665028 ps" before.
  ConfigError e = error_of(edit("[0.25, 1.75]", "[0.25, 1e300]"));
  check_error(e, 20, 26, "layers[0].fwd_time[1] is 1e+300 s, too long");
  CHECK(e.hint().find("0 to 1e6 s") != std::string::npos);
  check_error(error_of(edit("\"update_time_cpu\": 0.5", "\"update_time_cpu\": 1000000.5")), 17, 26,
              "update_time_cpu is 1000000.5 s, too long");
  // Line 13: `      "weight_bytes": 1000,` -> 2^50 + 1, one byte past the bound.
  e = error_of(edit("\"weight_bytes\": 1000", "\"weight_bytes\": 1125899906842625"));
  check_error(e, 13, 23, "layers[0].weight_bytes is 1125899906842625, too large");
  CHECK(e.hint().find("2^50") != std::string::npos);
  check_error(error_of(edit("[100, 201]", "[100, 9223372036854775807]")), 22, 32, "too large");
  // the bounds themselves load
  CHECK_NOTHROW(load_profile_text(edit("[0.25, 1.75]", "[0.25, 1e6]"), "mini.json"));
  CHECK_NOTHROW(load_profile_text(edit("\"weight_bytes\": 1000", "\"weight_bytes\": 1125899906842624"), "mini.json"));
}

TEST_CASE("wrong format or format_version") {
  // Line 2 `  "format": "harmony-profile-json",`: value at 3 + len("\"format\"") + 2 = column 13.
  const auto e = error_of(edit("\"harmony-profile-json\"", "\"harmony-profile-yaml\""));
  check_error(e, 2, 13, "unsupported profile format \"harmony-profile-yaml\"");
  CHECK(e.hint().find("harmony-profile-json") != std::string::npos);
  // Line 3 `  "format_version": 1,`: value at 3 + len("\"format_version\"") + 2 = column 21.
  check_error(error_of(edit("\"format_version\": 1", "\"format_version\": 2")), 3, 21, "format_version 2");
}

TEST_CASE("a fwd_time array not aligned with ubatch_sizes.fwd") {
  // Too short: reported at the array. Line 20 `      "fwd_time": [0.25],`: '[' at 7 + len("\"fwd_time\"") + 2 = 19.
  const auto e = error_of(edit("[0.25, 1.75]", "[0.25]"));
  check_error(e, 20, 19, "layers[0].fwd_time has 1 entries but ubatch_sizes.fwd lists 2 microbatch sizes");
  CHECK(e.hint().find("one value") != std::string::npos);
  // Too long: reported at the first extra entry, 19 + len("[0.25, 1.75, ") = 32.
  check_error(error_of(edit("[0.25, 1.75]", "[0.25, 1.75, 2.0]")), 20, 32, "has 3 entries");
  // input_bytes against ubatch_sizes.inputs (line 19 `      "input_bytes": [10],`: '[' at 7 + 13 + 2 = 22).
  check_error(error_of(edit("[10, 40]", "[10]")), 19, 22, "ubatch_sizes.inputs lists 2");
}

TEST_CASE("saved_activation_memory: optional, aligned with ubatch_sizes.bwd, read as recorded; bad values located") {
  // Inserted after layer 0's bwd_peak_memory as line 24 `      "saved_activation_memory": [40, 160],`: '[' at
  // 7 + len("\"saved_activation_memory\"") + 2 = 34, element 1 at 34 + len("[40, ") = 39.
  const std::string peak = "\"bwd_peak_memory\": [300, 700],";
  const auto with = [&](const std::string& saved) {
    return edit(peak, peak + "\n      \"saved_activation_memory\": " + saved + ",");
  };
  const Model m = load_profile_text(with("[40, 160]"), "mini.json");
  CHECK(m.layers[0].saved_bytes == std::vector<Bytes>{40, 160});
  CHECK(m.recorded_saved_bytes(1, 0) == 40);
  CHECK(m.recorded_saved_bytes(2, 0) == 80);  // interpolated as the peaks are
  CHECK(m.recorded_saved_bytes(1, 1) == -1);  // not recorded: derived from the backward peak by its user
  CHECK(load_profile_text(kMini, "mini.json").layers[0].saved_bytes.empty());
  CHECK_THROWS_AS(m.recorded_saved_bytes(5, 0), ScheduleError);
  check_error(error_of(with("[40, -5]")), 24, 39, "layers[0].saved_activation_memory[1] is -5");
  check_error(error_of(with("[40]")), 24, 34,
              "layers[0].saved_activation_memory has 1 entries but ubatch_sizes.bwd lists 2 microbatch sizes");
  check_error(error_of(with("[40, 1.5]")), 24, 39, "layers[0].saved_activation_memory[1] must be");
  check_error(error_of(with("\"40\"")), 24, 34, "layers[0].saved_activation_memory");
}

TEST_CASE("microbatch sizes that are not strictly ascending, or not positive") {
  // Line 7 `  "ubatch_sizes": {"fwd": [4, 1], ...`: '[' at column 27, element 1 at 27 + len("[4, ") = 31.
  const auto e = error_of(edit("\"fwd\": [1, 4]", "\"fwd\": [4, 1]"));
  check_error(e, 7, 31, "ubatch_sizes.fwd[1] is 1, not larger than the size before it (4)");
  CHECK(e.hint().find("ascending") != std::string::npos);
  // A duplicate in bwd: `"bwd": [1, 1]` starts at 3 + 14 + 2 + 1 + len("\"fwd\": [1, 4], ") = 35, '[' at 42,
  // element 1 at 42 + len("[1, ") = 46.
  check_error(error_of(edit("\"bwd\": [1, 4]", "\"bwd\": [1, 1]")), 7, 46, "ubatch_sizes.bwd[1] is 1");
  // Zero: element 0 of fwd at 28.
  check_error(error_of(edit("\"fwd\": [1, 4]", "\"fwd\": [0, 4]")), 7, 28, "must be a positive integer");
}

TEST_CASE("the criterion must be the last layer and only it") {
  // Layer 0 marked as the criterion: line 12 `      "is_criterion": true,`, value at column 23.
  // (both flags swapped: layer 0 is the first offender)
  const std::string swapped =
      edit("\"criterion\",\n      \"is_criterion\": true", "\"criterion\",\n      \"is_criterion\": false",
           edit("\"is_criterion\": false", "\"is_criterion\": true"));
  const auto e = error_of(swapped);
  check_error(e, 12, 23, "layers[0] (vlayer0) is marked as the criterion but is not the last layer");
  // Layer 0 and layer 1 both criteria: still layer 0.
  check_error(error_of(edit("\"is_criterion\": false", "\"is_criterion\": true")), 12, 23, "is not the last layer");
  // No criterion at all: at the last layer's flag, line 29 `      "is_criterion": false,` -> column 23.
  check_error(error_of(edit("\"is_criterion\": true", "\"is_criterion\": false")), 29, 23,
              "the last layer, layers[1] (criterion), is not marked as the criterion");
}

TEST_CASE("layer count, index order and input_bytes consistency") {
  // Line 6 `  "num_layers": 3,`: value at 3 + len("\"num_layers\"") + 2 = column 17.
  check_error(error_of(edit("\"num_layers\": 2", "\"num_layers\": 3")), 6, 17, "num_layers is 3 but layers has 2");
  // Line 27 `      "index": 7,`: value at 7 + len("\"index\"") + 2 = column 16.
  check_error(error_of(edit("\"index\": 1", "\"index\": 7")), 27, 16, "layers[1] has index 7");
  // input_bytes[1] must be 4 x 10 = 40 (line 19, '[' at 22, element 1 at 22 + len("[10, ") = 27).
  check_error(error_of(edit("[10, 40]", "[10, 41]")), 19, 27, "layers[0].input_bytes[1] is 41, but");
  // An empty layer list (line 8 `  "layers": [],`... reported at the '[' at 3 + len("\"layers\"") + 2 = 13).
  const std::string body_start = "\"layers\": [";
  const std::string no_layers = kMini.substr(0, kMini.find(body_start) + body_start.size()) + "],\n  \"totals\": {}\n}";
  check_error(error_of(no_layers), 8, 13, "layers is empty");
}

TEST_CASE("a nonexistent or unreadable file names the path") {
  const std::string path = source_dir() + "/configs/profiles/no_such_profile.json";
  try {
    load_profile(path);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.loc().file == path);
    CHECK(e.loc().line == 0);
    CHECK(std::string(e.what()).rfind(path + ": error: ", 0) == 0);
    CHECK(e.message().find("No such file") != std::string::npos);
    CHECK(!e.hint().empty());
  }
  // A directory is not a profile either.
  CHECK_THROWS_AS(load_profile(source_dir() + "/configs/profiles"), ConfigError);
}

// ---------------------------------------------------------------------------------------------------
// JsonLocator

TEST_CASE("JsonLocator resolves pointers to the first character of a value or key") {
  // columns:        1234567890123456789012345678901234567890
  const std::string t =
      "{\"a\": {\"b~/c\": [10, {\"d\": \"x]}\\\"y\"}, 30]},\n"
      " \"k\": 1, \"k\": [true, null]}";
  const JsonLocator loc(t);
  const auto at = [&](const std::string& p) {
    const TextPos pos = loc.value_pos(p);
    return std::to_string(pos.line) + ":" + std::to_string(pos.column);
  };
  CHECK(at("") == "1:1");
  CHECK(at("/a") == "1:7");
  CHECK(at("/a/b~0~1c") == "1:16");  // RFC 6901 escapes: "~0" is '~', "~1" is '/'
  CHECK(at("/a/b~0~1c/0") == "1:17");
  CHECK(at("/a/b~0~1c/1") == "1:21");
  CHECK(at("/a/b~0~1c/1/d") == "1:27");  // the string value's opening quote
  CHECK(at("/a/b~0~1c/2") == "1:38");    // skipping a string holding ']', '}' and an escaped quote
  CHECK(at("/k") == "2:15");             // a duplicate key resolves to the last one, as nlohmann keeps
  CHECK(at("/k/1") == "2:22");
  const TextPos key = loc.key_pos("/k");
  CHECK(key.line == 2);
  CHECK(key.column == 10);
  // Missing members and indexes resolve to the deepest existing value.
  CHECK(at("/a/missing") == "1:7");
  CHECK(at("/a/b~0~1c/9") == "1:16");
  CHECK(at("/k/1/x") == "2:22");
  CHECK(loc.contains("/a/b~0~1c/1/d"));
  CHECK(!loc.contains("/a/b~0~1c/3"));
  CHECK(!loc.contains("/nope"));
  CHECK(harmony::core::pointer_to_path("/layers/3/fwd_time/0") == "layers[3].fwd_time[0]");
}

TEST_CASE("JsonLocator columns count code points; escaped keys match; CRLF and a BOM are handled") {
  // "é" is 2 bytes in UTF-8 but one column; the key "\u00e9" decodes to "é".
  const std::string t = "\xEF\xBB\xBF{\"\xC3\xA9\": 1,\r\n \"\\u00e9x\": [2]}";
  const JsonLocator loc(t);
  CHECK(loc.value_pos("/\xC3\xA9").line == 1);
  CHECK(loc.value_pos("/\xC3\xA9").column == 7);  // the BOM takes no column: { " é " : space 1
  CHECK(loc.value_pos("/\xC3\xA9x").line == 2);
  CHECK(loc.value_pos("/\xC3\xA9x").column == 13);
  CHECK(loc.position(t.size()).line == 2);
}

TEST_CASE("json_pointer_token escapes a key so that JsonLocator finds it") {
  CHECK(harmony::core::json_pointer_token("plain") == "plain");
  CHECK(harmony::core::json_pointer_token("b~/c") == "b~0~1c");
  const std::string t = "{\"a/b\": 1, \"~\": 2}";
  const JsonLocator loc(t);
  CHECK(loc.value_pos("/" + harmony::core::json_pointer_token("a/b")).column == 9);
  CHECK(loc.value_pos("/" + harmony::core::json_pointer_token("~")).column == 17);
}

TEST_CASE("parse_json_located: the document, or a ConfigError at the problem with the caller's hint") {
  using harmony::core::JsonParseProblem;
  using harmony::core::parse_json_located;
  std::vector<JsonParseProblem> seen;
  const auto hint = [&](const JsonParseProblem& p) {
    seen.push_back(p);
    return std::string(p.syntax ? "syntax hint" : "number hint");
  };
  CHECK(parse_json_located("{\"a\": [1, 2]}", "ok.json", hint)["a"][1] == 2);
  CHECK(seen.empty());  // the hint is asked for only on failure

  const auto refused = [&](const std::string& text) {
    try {
      parse_json_located(text, "bad.json", hint);
    } catch (const ConfigError& e) {
      return e.loc().str() + " | " + e.message() + " | " + e.hint();
    }
    return std::string("parsed");
  };
  CHECK(refused("{\"a\": 1,\n}") ==
        "bad.json:2:1 | malformed JSON: syntax error while parsing object key - unexpected '}'; expected string "
        "literal | syntax hint");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].syntax);
  CHECK(seen[0].pos.line == 2);
  CHECK(refused("{\"a\":\n  1e999}") == "bad.json:2:3 | malformed JSON: number overflow parsing '1e999' | number hint");
  REQUIRE(seen.size() == 2);
  CHECK(!seen[1].syntax);
  CHECK(seen[1].message == "number overflow parsing '1e999'");  // nlohmann's "[json.exception...]" prefix is gone
}

TEST_CASE("every truncation and single-character deletion of a profile loads or is a located ConfigError") {
  // A cheap robustness sweep over the error paths: nothing else may escape (no nlohmann exception, no
  // ScheduleError from Model::validate), and the position must lie inside the text.
  const int lines = static_cast<int>(std::count(kMini.begin(), kMini.end(), '\n')) + 1;
  int loaded = 0, rejected = 0, escaped = 0, misplaced = 0;
  const auto attempt = [&](const std::string& text) {
    try {
      load_profile_text(text, "mini.json");
      ++loaded;
    } catch (const ConfigError& e) {
      ++rejected;
      misplaced += e.loc().line < 1 || e.loc().line > lines || e.loc().column < 1 || e.hint().empty();
    } catch (...) {
      ++escaped;
    }
  };
  for (std::size_t n = 0; n < kMini.size(); ++n) attempt(kMini.substr(0, n));
  for (std::size_t i = 0; i < kMini.size(); ++i) attempt(kMini.substr(0, i) + kMini.substr(i + 1));
  CHECK(escaped == 0);
  CHECK(misplaced == 0);
  CHECK(rejected > 0);
  CHECK(loaded > 0);  // deleting a space, say, changes nothing
}

TEST_CASE("the simdjson fast path and the located path agree: the same Model or the same message") {
  // load_profile_text walks simdjson's tree and, at any problem, nlohmann's; load_profile_text_located walks
  // only nlohmann's. Both must give the same Model (compared as written-out profile text, so every double
  // bit and the sign of a zero count) or the same error text.
  const auto outcome = [](auto load) -> std::string {
    try {
      return harmony::core::write_profile_json(load());
    } catch (const harmony::core::Error& e) {
      return std::string("error: ") + e.what();
    }
  };
  const auto agree = [&](const std::string& text) {
    const std::string fast = outcome([&] { return load_profile_text(text, "mini.json"); });
    const std::string located = outcome([&] { return harmony::core::load_profile_text_located(text, "mini.json"); });
    CHECK_MESSAGE(fast == located, "text:\n", text);
    return fast.rfind("error: ", 0) != 0;
  };
  CHECK(agree(kMini));
  CHECK(agree(read_text(profile_path("bert_large.json"))));
  CHECK(agree(read_text(profile_path("gpt2_medium.json"))));
  // Where the parsers could differ: a repeated key (the last wins), a negative zero time, integers as times,
  // exponents, a UTF-8 byte order mark, escapes in names.
  CHECK(agree(edit("\"weight_bytes\": 1000,", "\"weight_bytes\": 5, \"weight_bytes\": 1000,")));
  CHECK(agree(edit("\"update_time_cpu\": 0.5,", "\"update_time_cpu\": -0.0,")));
  CHECK(agree(edit("\"update_time_cpu\": 0.5,", "\"update_time_cpu\": -0,")));
  CHECK(agree(edit("\"fwd_time\": [0.25, 1.75],", "\"fwd_time\": [2.5e-1, 175E-2],")));
  CHECK(agree(edit("\"name\": \"vlayer0\",", "\"name\": \"v\\u00e9\\ud83d\\ude00\\n\",")));
  CHECK(agree("\xEF\xBB\xBF" + kMini));
  // Refused by both, with the same message.
  CHECK_FALSE(agree(edit("\"weight_bytes\": 1000,", "\"weight_bytes\": 9223372036854775808,")));
  CHECK_FALSE(agree(edit("\"weight_bytes\": 1000,", "\"weight_bytes\": 18446744073709551616,")));
  CHECK_FALSE(agree(edit("\"weight_bytes\": 1000,", "\"weight_bytes\": 1000.0,")));
  CHECK_FALSE(agree(edit("\"update_time_cpu\": 0.5,", "\"update_time_cpu\": 1e400,")));
  CHECK_FALSE(agree(edit("\"name\": \"vlayer0\",", "\"name\": \"\\udc00\",")));
  CHECK_FALSE(agree(edit("\"is_criterion\": false,", "\"is_criterion\": 0,")));
  CHECK_FALSE(agree(kMini + " x"));
  for (std::size_t i = 0; i < kMini.size(); i += 3) agree(kMini.substr(0, i) + kMini.substr(i + 1));
}
