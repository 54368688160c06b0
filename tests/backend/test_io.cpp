// Tests of the file formats: safetensors (round trip, every truncation and many malformed headers give a
// FormatError with file and byte offset, never a crash; F16/BF16 widened exactly), GPT-2 weights under HF names (config
// inference, the transformer. prefix, the tied lm_head, ignored mask buffers, save/load round trip) and llm.c token
// files (with and without the 1024-byte header, odd sizes, bad headers, step slicing and wrap-around).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "backend/model/hf_weights.hpp"
#include "backend/tokens.hpp"

using namespace harmony::backend;

namespace {

std::string data_dir() {
  const char* root = std::getenv("HARMONY_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/gpt2_tiny/";
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("harmony_test_io_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A file with the given header text (padded to 8 bytes) and `data` bytes of payload.
std::vector<std::uint8_t> with_header(const std::string& header, std::size_t data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> out(8 + h.size() + data, 0);
  const std::uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  return out;
}

std::string error_of(std::vector<std::uint8_t> bytes) {
  try {
    SafetensorsReader::from_bytes(std::move(bytes), "bad.safetensors");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<std::uint8_t> token_bytes(const std::vector<std::uint16_t>& toks, bool header, int version = 1,
                                      int count = -1) {
  std::vector<std::uint8_t> out;
  if (header) {
    std::vector<std::int32_t> h(256, 0);
    h[0] = kTokenMagic;
    h[1] = version;
    h[2] = count >= 0 ? count : static_cast<int>(toks.size());
    out.resize(1024);
    std::memcpy(out.data(), h.data(), 1024);
  }
  for (std::uint16_t t : toks) {
    out.push_back(static_cast<std::uint8_t>(t & 0xFF));
    out.push_back(static_cast<std::uint8_t>(t >> 8));
  }
  return out;
}

}  // namespace

TEST_CASE("safetensors: round trip of F32 tensors and metadata") {
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 7.0f};
  const std::vector<float> b = {42.0f};
  const auto bytes = encode_safetensors({{"layer.a", {2, 3}, a}, {"b", {}, b}, {"empty", {0, 4}, {}}},
                                        {{"format", "pt"}, {"n_head", "2"}});
  CHECK((bytes.size() - 8) % 4 == 0);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  const auto r = SafetensorsReader::from_bytes(bytes, "mem");
  REQUIRE(r.tensors().size() == 3);
  CHECK(r.metadata().at("n_head") == "2");
  const TensorInfo* t = r.find("layer.a");
  REQUIRE(t != nullptr);
  CHECK(t->dtype == "F32");
  CHECK(t->shape == std::vector<std::int64_t>{2, 3});
  CHECK(r.read_f32("layer.a") == a);
  CHECK(r.read_f32("b") == b);
  CHECK(r.read_f32("empty").empty());
  CHECK(std::signbit(r.read_f32("layer.a")[4]));

  const std::string path = temp_path("rt.safetensors");
  write_safetensors(path, {{"layer.a", {2, 3}, a}});
  const auto f = SafetensorsReader::open(path);
  CHECK(f.read_f32("layer.a") == a);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(encode_safetensors({{"x", {2, 2}, a}}), doctest::Contains("shape [2,2] (4 elements) but 6"),
                       BackendError);
  CHECK_THROWS_AS(encode_safetensors({{"x", {6}, a}, {"x", {6}, a}}), BackendError);
}

TEST_CASE("safetensors: every truncation of a valid file is a FormatError") {
  const std::vector<float> a(37, 0.5f);
  const auto good = encode_safetensors({{"a", {37}, a}, {"b", {1}, std::vector<float>{1.0f}}}, {{"k", "v"}});
  int errors = 0;
  for (std::size_t len = 0; len < good.size(); ++len) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    try {
      SafetensorsReader::from_bytes(std::move(cut), "cut.safetensors");
    } catch (const FormatError& e) {
      ++errors;
      CHECK(std::string(e.what()).starts_with("cut.safetensors: byte "));
    }
  }
  CHECK(errors == static_cast<int>(good.size()));
  // The same from a file on disk, cut inside the data.
  const std::string path = temp_path("cut.safetensors");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(good.data(), 1, good.size() - 3, f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH_AS(SafetensorsReader::open(path), doctest::Contains("ends past the end of the file"), FormatError);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(SafetensorsReader::open(path), doctest::Contains("cannot open"), FormatError);
}

TEST_CASE("safetensors: malformed headers name the problem and the byte") {
  CHECK(error_of({1, 2, 3}) == "bad.safetensors: byte 3: file of 3 bytes is too short for the 8-byte header length");
  CHECK(error_of(with_header("{}", 0)) == "(no error)");
  {
    auto b = with_header("{}", 0);
    b[0] = 0xFF;  // length 255 > 8 bytes remaining
    CHECK(error_of(b) == "bad.safetensors: byte 0: header length 255 exceeds the 8 bytes after it (truncated file?)");
  }
  CHECK(error_of(with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},})", 8))
            .starts_with("bad.safetensors: byte 69: header is not valid JSON"));
  CHECK(error_of(with_header("[1, 2]", 0)) == "bad.safetensors: byte 8: header must be a JSON object");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4)) ==
        "bad.safetensors: byte 9: tensor 'w': unknown dtype 'F33'");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)) ==
        "bad.safetensors: byte 9: tensor 'w': shape entries must be non-negative integers");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)) ==
        "bad.safetensors: byte 9: tensor 'w': data_offsets [0, 8] hold 8 bytes but 3 F32 of shape [3] need 12");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)) ==
        "bad.safetensors: byte 9: tensor 'w': data_offsets [8, 0] run backwards");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8)) ==
        "bad.safetensors: byte 9: tensor 'w': 'data_offsets' must be [begin, end] with non-negative integers");
  CHECK(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296]}})", 8)) ==
        "bad.safetensors: byte 9: tensor 'w': shape has too many elements");
  CHECK(error_of(with_header(R"({"w": 3})", 0)) ==
        "bad.safetensors: byte 9: tensor 'w': entry must be an object with dtype, shape and data_offsets");
  CHECK(
      error_of(
          with_header(
              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              12))
          .find("tensors 'a' [0, 8) and 'b' [4, 12) overlap") != std::string::npos);
  CHECK(error_of(with_header(R"({"__metadata__": {"n": 3}})", 0)) ==
        "bad.safetensors: byte 26: __metadata__ value of 'n' is not a string");
  // A non-float tensor is listed but cannot be read as floats.
  const auto r = SafetensorsReader::from_bytes(
      with_header(R"({"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16), "int.safetensors");
  CHECK(r.find("i")->dtype == "I64");
  CHECK_THROWS_WITH_AS(r.read_f32("i"), doctest::Contains("tensor 'i' is I64; only F32, F16 and BF16"), FormatError);
  CHECK_THROWS_WITH_AS(r.read_f32("nope"), doctest::Contains("no tensor named 'nope'"), FormatError);
}

TEST_CASE("safetensors: F16 and BF16 widen to F32 exactly (subnormals, infinities, NaN)") {
  const float inf = std::numeric_limits<float>::infinity();
  // binary16: 1, -2, the largest normal, the smallest normal, the smallest and largest subnormal, +-0, +-inf.
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(f16_to_f32(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x3555) == 0.333251953125f);  // 2^-2 * (1 + 341/1024)
  CHECK(f16_to_f32(0x0000) == 0.0f);
  CHECK_FALSE(std::signbit(f16_to_f32(0x0000)));
  CHECK(std::signbit(f16_to_f32(0x8000)));
  CHECK(f16_to_f32(0x7c00) == inf);
  CHECK(f16_to_f32(0xfc00) == -inf);
  CHECK(std::isnan(f16_to_f32(0x7e00)));
  CHECK(std::isnan(f16_to_f32(0x7c01)));  // a signalling NaN stays a NaN, not inf
  // Every binary16 value round-trips through float and back (the inverse, by exhaustive search below 2^16).
  int mismatches = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    const float back = f16_to_f32(static_cast<std::uint16_t>(h ^ 0x8000));
    if (back != -f) ++mismatches;  // symmetric in the sign
    if ((h & 0x7fff) < 0x7c00 && (h & 0x7fff) > 0 && (h & 0x3ff) != 0x3ff) {
      // the next binary16 up in magnitude is strictly larger: conversion is monotonic
      if (!(std::fabs(f16_to_f32(static_cast<std::uint16_t>(h + 1))) > std::fabs(f))) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
  // bfloat16 is the upper half of a float.
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  CHECK(bf16_to_f32(0xc040) == -3.0f);
  CHECK(bf16_to_f32(0x7f80) == inf);
  CHECK(bf16_to_f32(0xff80) == -inf);
  CHECK(std::isnan(bf16_to_f32(0x7fc0)));
  CHECK(bf16_to_f32(0x0001) == std::ldexp(1.0f, -133));  // a float subnormal
  CHECK(bf16_to_f32(0x3eab) == std::bit_cast<float>(0x3eab0000u));

  // read_f32 widens F16 and BF16 tensors in place, every element in order.
  const std::uint16_t half[5] = {0x3c00, 0x0001, 0xfc00, 0xc000, 0x7bff};
  const std::uint16_t bhalf[5] = {0x3f80, 0x0001, 0xff80, 0xc040, 0x4000};
  auto file = with_header(R"({"h": {"dtype": "F16", "shape": [5], "data_offsets": [0, 10]},)"
                          R"( "b": {"dtype": "BF16", "shape": [5], "data_offsets": [10, 20]}})",
                          20);
  std::memcpy(file.data() + file.size() - 20, half, 10);
  std::memcpy(file.data() + file.size() - 10, bhalf, 10);
  const auto r = SafetensorsReader::from_bytes(file, "half.safetensors");
  CHECK(r.read_f32("h") == std::vector<float>{1.0f, std::ldexp(1.0f, -24), -inf, -2.0f, 65504.0f});
  CHECK(r.read_f32("b") == std::vector<float>{1.0f, std::ldexp(1.0f, -133), -inf, -3.0f, 2.0f});
}

TEST_CASE("GPT-2 weights: config from shapes, load, save and reload bit-exact") {
  const auto file = SafetensorsReader::open(data_dir() + "model.safetensors");
  const Gpt2Config cfg = gpt2_config_from(file);
  CHECK(cfg == Gpt2Config{.vocab_size = 128, .max_seq_len = 32, .n_layer = 2, .n_head = 2, .n_embd = 32});
  CHECK(gpt2_config_from(file, 4).n_head == 4);  // an explicit n_head overrides the metadata
  const Gpt2 model(cfg);
  HostState state(model);
  load_gpt2_weights(file, state);
  CHECK(std::equal(state.weight(3, "lm_head.weight").begin(), state.weight(3, "lm_head.weight").end(),
                   state.weight(0, "wte.weight").begin()));
  CHECK(state.weight(1, "h.0.attn.c_attn.weight")[5] == file.read_f32("h.0.attn.c_attn.weight")[5]);

  const std::string path = temp_path("gpt2.safetensors");
  save_gpt2_weights(path, state);
  const auto again = SafetensorsReader::open(path);
  CHECK(again.tensors().size() == 2 + 12 * 2 + 2);
  CHECK(again.find("lm_head.weight") == nullptr);
  CHECK(gpt2_config_from(again) == cfg);
  HostState state2(model);
  load_gpt2_weights(again, state2);
  for (int l = 0; l < model.num_layers(); ++l) {
    CHECK(std::memcmp(state.weights(l).data(), state2.weights(l).data(), state.weights(l).size_bytes()) == 0);
  }
  std::filesystem::remove(path);
}

TEST_CASE("GPT-2 weights: HF variants (transformer. prefix, tied lm_head, mask buffers) and errors") {
  const Gpt2Config cfg{.vocab_size = 5, .max_seq_len = 4, .n_layer = 1, .n_head = 2, .n_embd = 4};
  const Gpt2 model(cfg);
  HostState src(model);
  src.init_weights(1);
  // Build the file GPT2LMHeadModel.save_pretrained would write: prefixed names, lm_head, attn.bias buffers.
  std::vector<std::vector<float>> keep;
  std::vector<TensorView> views;
  for (int l = 0; l < model.num_layers(); ++l) {
    for (const ParamSpec& p : model.params(l)) {
      if (!p.tied_to.empty()) continue;
      views.push_back({"transformer." + p.name, p.shape, src.weight(l, p.name)});
    }
  }
  keep.emplace_back(16, 1.0f);
  views.push_back({"transformer.h.0.attn.bias", {1, 1, 4, 4}, keep.back()});
  views.push_back({"lm_head.weight", {5, 4}, src.weight(0, "wte.weight")});
  const auto bytes = encode_safetensors(views);  // no n_head metadata, as on the Hub
  const auto file = SafetensorsReader::from_bytes(bytes, "hf.safetensors");
  CHECK_THROWS_WITH_AS(gpt2_config_from(file), doctest::Contains("n_head is not in the file's metadata"), FormatError);
  CHECK_THROWS_WITH_AS(gpt2_config_from(file), doctest::Contains("or set model.n_head"), FormatError);
  CHECK(gpt2_config_from(file, 2) == cfg);
  HostState dst(model);
  load_gpt2_weights(file, dst);
  for (int l = 0; l < model.num_layers(); ++l) {
    CHECK(std::memcmp(src.weights(l).data(), dst.weights(l).data(), src.weights(l).size_bytes()) == 0);
  }

  // An untied head.
  std::vector<float> other(20, 0.25f);
  views.back().data = other;
  CHECK_THROWS_WITH_AS(
      load_gpt2_weights(SafetensorsReader::from_bytes(encode_safetensors(views), "u.safetensors"), dst),
      doctest::Contains("lm_head.weight differs from wte.weight"), FormatError);
  views.pop_back();
  // An unknown tensor, a missing one, a wrong shape.
  views.push_back({"transformer.h.0.attn.extra", {1}, std::span<const float>(other.data(), 1)});
  CHECK_THROWS_WITH_AS(
      load_gpt2_weights(SafetensorsReader::from_bytes(encode_safetensors(views), "x.safetensors"), dst),
      doctest::Contains("tensors the GPT-2 model does not have: transformer.h.0.attn.extra"), FormatError);
  views.pop_back();
  auto missing = views;
  missing.erase(missing.begin() + 3);  // h.0.ln_1.bias
  CHECK_THROWS_WITH_AS(
      load_gpt2_weights(SafetensorsReader::from_bytes(encode_safetensors(missing), "m.safetensors"), dst),
      doctest::Contains("missing tensor 'transformer.h.0.ln_1.bias'"), FormatError);
  auto misshapen = views;
  misshapen[4].shape = {12, 4};  // c_attn.weight stored [out, in]
  CHECK_THROWS_WITH_AS(
      load_gpt2_weights(SafetensorsReader::from_bytes(encode_safetensors(misshapen), "s.safetensors"), dst),
      doctest::Contains("tensor 'transformer.h.0.attn.c_attn.weight' has shape [12, 4], the model expects [4, 12]"),
      FormatError);
  CHECK_THROWS_WITH_AS(gpt2_config_from(SafetensorsReader::from_bytes(encode_safetensors({}), "e.safetensors")),
                       doctest::Contains("not a GPT-2 checkpoint"), FormatError);
}

TEST_CASE("tokens: llm.c files with and without the header") {
  const TokenFile hdr = TokenFile::load(data_dir() + "tokens.bin");
  const TokenFile raw = TokenFile::load(data_dir() + "tokens_raw.bin");
  CHECK(hdr.has_header());
  CHECK_FALSE(raw.has_header());
  REQUIRE(hdr.size() == raw.size());
  CHECK(std::equal(hdr.tokens().begin(), hdr.tokens().end(), raw.tokens().begin()));
  CHECK(hdr.max_token() < 128);

  const std::vector<std::uint16_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 65535};
  const TokenFile a = TokenFile::from_bytes(token_bytes(toks, true), "a.bin");
  const TokenFile b = TokenFile::from_bytes(token_bytes(toks, false), "b.bin");
  CHECK(a.has_header());
  CHECK(std::vector<std::uint16_t>(a.tokens().begin(), a.tokens().end()) == toks);
  CHECK(std::vector<std::uint16_t>(b.tokens().begin(), b.tokens().end()) == toks);
  CHECK(b.max_token() == 65535);
}

TEST_CASE("tokens: step k reads B*T+1 tokens from k*B*T and wraps like llm.c") {
  std::vector<std::uint16_t> toks(30);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint16_t>(100 + i);
  const TokenFile f = TokenFile::from_bytes(token_bytes(toks, false), "t.bin");
  std::vector<std::int32_t> in, tgt;
  CHECK(f.steps_per_epoch(2, 3) == 4);  // (30 - 1) / 6
  f.batch(1, 2, 3, in, tgt);
  CHECK(in == std::vector<std::int32_t>{106, 107, 108, 109, 110, 111});
  CHECK(tgt == std::vector<std::int32_t>{107, 108, 109, 110, 111, 112});
  f.batch(3, 2, 3, in, tgt);  // the last whole batch: tokens 18..24
  CHECK(tgt.back() == 124);
  f.batch(4, 2, 3, in, tgt);  // wraps to the start
  CHECK(in.front() == 100);
  CHECK_THROWS_WITH_AS(f.batch(0, 5, 6, in, tgt), doctest::Contains("a 5x6 batch needs 31 tokens, the file has 30"),
                       BackendError);
}

TEST_CASE("tokens: errors for odd sizes and bad headers") {
  std::vector<std::uint8_t> odd = token_bytes({1, 2, 3}, false);
  odd.push_back(7);
  CHECK_THROWS_WITH_AS(TokenFile::from_bytes(odd, "odd.bin"),
                       "odd.bin: byte 7: 7 bytes is not a whole number of uint16 tokens", FormatError);
  std::vector<std::uint8_t> odd_hdr = token_bytes({1, 2, 3}, true);
  odd_hdr.push_back(7);
  CHECK_THROWS_WITH_AS(TokenFile::from_bytes(odd_hdr, "oddh.bin"),
                       doctest::Contains("7 bytes after the 1024-byte header is not a whole number"), FormatError);
  CHECK_THROWS_WITH_AS(TokenFile::from_bytes(token_bytes({1, 2, 3}, true, 2), "v2.bin"),
                       "v2.bin: byte 4: llm.c header version 2 is not supported (version 1: uint16 tokens; version 2 "
                       "holds uint32 tokens)",
                       FormatError);
  CHECK_THROWS_WITH_AS(TokenFile::from_bytes(token_bytes({1, 2, 3}, true, 1, 5), "n.bin"),
                       "n.bin: byte 8: header says 5 tokens but the file holds 3 (truncated file?)", FormatError);
  CHECK_THROWS_WITH_AS(TokenFile::load("/nonexistent/tokens.bin"), doctest::Contains("cannot open"), FormatError);
  const TokenFile empty = TokenFile::from_bytes({}, "empty.bin");
  CHECK(empty.size() == 0);
  CHECK(empty.max_token() == -1);
}
