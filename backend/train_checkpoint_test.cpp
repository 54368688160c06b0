// Tests of the training checkpoint files (backend/train_checkpoint.*): XXH64 against reference values, a
// bit-exact round trip of weights, moments, step counts and meta (a Llama model's whole shape too; version-1 files
// read as GPT-2), keep-N pruning and the file set after each save, latest_checkpoint's choice, every corruption and
// mismatch refused with a message naming the problem, and failed saves that leave the previous checkpoint intact.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/train_checkpoint.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::backend;
using harmony::test::TempDir;
namespace fs = std::filesystem;

namespace {

Gpt2Config tiny_config(int n_layer = 2) {
  Gpt2Config c;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

// A Llama-family model with every field away from its default: grouped-query attention, an untied head, q/k/v
// biases, another rope_theta and rms_norm_eps, a sliding window.
Gpt2Config tiny_llama_config() {
  Gpt2Config c = tiny_config();
  c.arch = Arch::Llama;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 24;
  c.rope_theta = 500000.0f;
  c.ln_eps = 1e-6f;
  c.tie_embeddings = false;
  c.qkv_bias = true;
  c.sliding_window = 16;
  return c;
}

std::string header_text(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 16, 8);
  return {bytes.begin() + 32, bytes.begin() + 32 + static_cast<std::ptrdiff_t>(header_bytes)};
}

// Weights from init_weights, moments and gradients from a seeded generator, with a few special floats (-0, a
// denormal, infinity, a NaN with a payload) that only a raw-bits round trip keeps.
void fill_state(HostState& s, std::uint64_t seed) {
  s.init_weights(seed);
  std::mt19937_64 rng(seed * 7919 + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int l = 0; l < s.model().num_layers(); ++l) {
    for (float& x : s.exp_avg(l)) x = 1e-3f * normal(rng);
    for (float& x : s.exp_avg_sq(l)) x = 1e-6f * std::abs(normal(rng));
    for (float& x : s.grads(l)) x = normal(rng);
    s.set_steps(l, 3 + l);
  }
  auto m = s.exp_avg(1);
  m[0] = -0.0f;
  m[1] = std::numeric_limits<float>::denorm_min();
  m[2] = std::numeric_limits<float>::infinity();
  const std::uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&m[3], &nan_bits, 4);
}

CheckpointMeta make_meta(const Gpt2Config& model, std::int64_t step) {
  CheckpointMeta m;
  m.model = model;
  m.batch = 4;
  m.seq_len = 16;
  m.plan = "harmony-pp N2 u2/1 packs [0-1][2-3]";
  m.data = "synthetic:seed=7";
  m.adamw = {3e-3, 0.9, 0.95, 1e-5, 0.1};
  m.step = step;
  m.data_position = 1234567890123ULL + static_cast<std::uint64_t>(step);
  m.rng_seed = 0xfedcba9876543210ULL;
  m.rng_counter = 42 + static_cast<std::uint64_t>(step);
  for (std::int64_t i = 0; i < step; ++i) m.losses.push_back(0.1 + 0.2 * static_cast<double>(i) / 3.0);
  return m;
}

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Recomputes the trailing checksum after an edit, so that the checks behind it are reached.
void reseal(std::vector<std::uint8_t>& bytes) {
  XxHash64 h;
  h.update(bytes.data(), bytes.size() - 8);
  const std::uint64_t sum = h.digest();
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
}

// Replaces `from` with `to` (same length) in the JSON header.
void edit_header(std::vector<std::uint8_t>& bytes, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  const std::string text(bytes.begin(), bytes.begin() + std::min<std::size_t>(bytes.size(), 4096));
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  std::memcpy(bytes.data() + at, to.data(), to.size());
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

bool same_state(HostState& a, HostState& b) {
  for (int l = 0; l < a.model().num_layers(); ++l) {
    if (!same_bits(a.weights(l), b.weights(l)) || !same_bits(a.exp_avg(l), b.exp_avg(l)) ||
        !same_bits(a.exp_avg_sq(l), b.exp_avg_sq(l)) || a.steps(l) != b.steps(l))
      return false;
  }
  return true;
}

std::set<std::string> names_in(const TempDir& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir.str())) out.insert(e.path().filename().string());
  return out;
}

std::uint64_t xxh64(const std::string& s) {
  XxHash64 h;
  h.update(s.data(), s.size());
  return h.digest();
}

}  // namespace

TEST_CASE("XXH64 matches the reference implementation, in one piece and streamed") {
  CHECK(xxh64("") == 0xef46db3751d8e999ULL);
  CHECK(xxh64("a") == 0xd24ec4f1a98c6e5bULL);
  CHECK(xxh64("abc") == 0x44bc2cf5ad770999ULL);
  CHECK(xxh64("Nobody inspects the spammish repetition") == 0xfbcea83c8a378bf1ULL);
  std::string pattern;  // byte i = (7i + 3) mod 256; reference values from xxhsum -H64
  for (int i = 0; i < 1000; ++i) pattern.push_back(static_cast<char>((i * 7 + 3) & 255));
  CHECK(xxh64(pattern) == 0x5f235fa033f1a3fbULL);
  CHECK(xxh64(pattern.substr(0, 103)) == 0x9ce1e302796dfbc9ULL);
  for (std::size_t piece = 1; piece <= 70; piece += 3) {
    XxHash64 h;
    for (std::size_t at = 0; at < pattern.size(); at += piece)
      h.update(pattern.data() + at, std::min(piece, pattern.size() - at));
    CHECK(h.digest() == 0x5f235fa033f1a3fbULL);
  }
}

TEST_CASE("round trip: weights, moments, step counts and meta come back bit for bit") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState saved(model);
  fill_state(saved, 11);
  const CheckpointMeta meta = make_meta(model.config(), 120);
  const std::string path = save_checkpoint(dir.str(), meta, saved);
  CHECK(path == dir / "step-000120.hckpt");
  CHECK(names_in(dir) == std::set<std::string>{"step-000120.hckpt"});

  HostState loaded(model);
  fill_state(loaded, 99);  // different everything, gradients nonzero
  const CheckpointMeta got = load_checkpoint(path, loaded, &meta);
  CHECK(same_state(saved, loaded));
  for (int l = 0; l < model.num_layers(); ++l)
    for (float g : loaded.grads(l)) REQUIRE(std::bit_cast<std::uint32_t>(g) == 0u);  // zeroed, +0.0f

  CHECK(got.model == meta.model);
  CHECK(got.batch == meta.batch);
  CHECK(got.seq_len == meta.seq_len);
  CHECK(got.plan == meta.plan);
  CHECK(got.data == meta.data);
  CHECK(std::bit_cast<std::uint64_t>(got.adamw.lr) == std::bit_cast<std::uint64_t>(meta.adamw.lr));
  CHECK(std::bit_cast<std::uint64_t>(got.adamw.beta1) == std::bit_cast<std::uint64_t>(meta.adamw.beta1));
  CHECK(std::bit_cast<std::uint64_t>(got.adamw.beta2) == std::bit_cast<std::uint64_t>(meta.adamw.beta2));
  CHECK(std::bit_cast<std::uint64_t>(got.adamw.eps) == std::bit_cast<std::uint64_t>(meta.adamw.eps));
  CHECK(std::bit_cast<std::uint64_t>(got.adamw.weight_decay) == std::bit_cast<std::uint64_t>(meta.adamw.weight_decay));
  CHECK(got.step == 120);
  CHECK(got.data_position == meta.data_position);
  CHECK(got.rng_seed == meta.rng_seed);
  CHECK(got.rng_counter == meta.rng_counter);
  REQUIRE(got.losses.size() == meta.losses.size());
  CHECK(std::memcmp(got.losses.data(), meta.losses.data(), meta.losses.size() * sizeof(double)) == 0);

  const CheckpointMeta only_meta = read_checkpoint_meta(path);
  CHECK(only_meta.step == 120);
  CHECK(only_meta.plan == meta.plan);
  CHECK(only_meta.losses.size() == meta.losses.size());

  // The same meta and state give the same bytes; so does saving the loaded state again.
  const auto bytes = read_bytes(path);
  TempDir again;
  CHECK(read_bytes(save_checkpoint(again.str(), got, loaded)) == bytes);

  // A run that resumes and continues: the loaded state steps exactly as the saved one.
  const AdamWConfig adamw = meta.adamw;
  for (HostState* s : {&saved, &loaded}) {
    for (int l = 0; l < model.num_layers(); ++l)
      for (std::size_t i = 0; i < s->grads(l).size(); ++i) s->grads(l)[i] = 1e-3f * static_cast<float>(i % 7);
    s->update(adamw, 0, model.num_layers() - 1);
  }
  CHECK(same_state(saved, loaded));
}

TEST_CASE("a Llama model: its architecture and every field of its shape round trip, and a mismatch is named") {
  TempDir dir;
  for (const bool tied : {false, true}) {
    Gpt2Config config = tiny_llama_config();
    config.tie_embeddings = tied;
    const Gpt2 model(config);
    HostState saved(model);
    fill_state(saved, 13);
    const CheckpointMeta meta = make_meta(config, tied ? 9 : 8);
    const std::string path = save_checkpoint(dir.str(), meta, saved, 5);
    const std::string header = header_text(read_bytes(path));
    CHECK(header.find("\"arch\":\"llama\"") != std::string::npos);
    CHECK(header.find("\"n_kv_head\":2,\"intermediate_size\":24,\"rope_theta\":500000.0") != std::string::npos);
    CHECK(header.find(std::string("\"tie_embeddings\":") + (tied ? "true" : "false") +
                      ",\"qkv_bias\":true,\"sliding_window\":16") != std::string::npos);
    CHECK(header.find("\"model.rope_theta\":\"48f42400\"") != std::string::npos);  // 500000.0f's bits

    CHECK(read_checkpoint_meta(path).model == config);
    HostState loaded(model);
    fill_state(loaded, 98);
    const CheckpointMeta got = load_checkpoint(path, loaded, &meta);
    CHECK(got.model == config);
    CHECK(got.model.arch == Arch::Llama);
    CHECK(same_state(saved, loaded));
    TempDir again;
    CHECK(read_bytes(save_checkpoint(again.str(), got, loaded)) == read_bytes(path));  // the same bytes
  }

  const Gpt2 model(tiny_llama_config());
  HostState s(model);
  fill_state(s, 4);
  const CheckpointMeta meta = make_meta(model.config(), 3);
  TempDir one;
  const std::string path = save_checkpoint(one.str(), meta, s);
  HostState target(model);
  HostState untouched(model);
  auto refused = [&](void (*change)(Gpt2Config&), const std::string& expected_text) {
    CheckpointMeta expect = meta;
    change(expect.model);
    const std::string e = error_of([&] { load_checkpoint(path, target, &expect); });
    CHECK_MESSAGE(e.find(expected_text) != std::string::npos, e);
    CHECK(e.find("hint: resume with") != std::string::npos);
    CHECK(same_state(target, untouched));
  };
  refused([](Gpt2Config& c) { c.n_kv_head = 4; }, "model.n_kv_head differs: the checkpoint has 2, this run has 4");
  refused([](Gpt2Config& c) { c.intermediate_size = 32; },
          "model.intermediate_size differs: the checkpoint has 24, this run has 32");
  refused([](Gpt2Config& c) { c.rope_theta = 10000.0f; },
          "model.rope_theta differs: the checkpoint has 500000, this run has 10000");
  refused([](Gpt2Config& c) { c.tie_embeddings = true; },
          "model.tie_embeddings differs: the checkpoint has false, this run has true");
  refused([](Gpt2Config& c) { c.qkv_bias = false; },
          "model.qkv_bias differs: the checkpoint has true, this run has false");
  refused([](Gpt2Config& c) { c.sliding_window = 0; },
          "model.sliding_window differs: the checkpoint has 16, this run has 0");
  refused([](Gpt2Config& c) { c.ln_eps = 1e-5f; }, "model.ln_eps differs");
  refused([](Gpt2Config& c) { c = tiny_config(); }, "model.arch differs: the checkpoint has llama, this run has gpt2");

  // n_kv_head 0 means n_head: a run that leaves it unset resumes a checkpoint that records the count explicitly
  // (a config.json with num_key_value_heads = num_attention_heads), and the other way round.
  for (const int saved_kv : {0, 4}) {
    Gpt2Config c = tiny_llama_config();
    c.n_kv_head = saved_kv;
    const Gpt2 m(c);
    HostState from(m);
    fill_state(from, 5);
    TempDir dir;
    const std::string p = save_checkpoint(dir.str(), make_meta(m.config(), 2), from);
    Gpt2Config other = c;
    other.n_kv_head = saved_kv == 0 ? 4 : 0;
    const Gpt2 m2(other);
    HostState into(m2);
    CheckpointMeta expect = make_meta(m2.config(), 2);
    CHECK_NOTHROW(load_checkpoint(p, into, &expect));
    CHECK(same_state(from, into));
  }

  // A GPT-2 state cannot take it even without `expect`: the message names both architectures.
  const Gpt2 gpt2(tiny_config());
  HostState wrong(gpt2);
  const std::string e = error_of([&] { load_checkpoint(path, wrong); });
  CHECK(e.find("the checkpoint holds the model llama vocab_size=64") != std::string::npos);
  CHECK(e.find("n_kv_head=2 intermediate_size=24") != std::string::npos);
  CHECK(e.find("built for gpt2 vocab_size=64") != std::string::npos);
}

TEST_CASE("format version 1 (before the Llama family): no arch, read as GPT-2; version 2 requires it") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 17);
  const CheckpointMeta meta = make_meta(model.config(), 5);
  const std::string path = save_checkpoint(dir.str(), meta, s);
  const std::vector<std::uint8_t> v2 = read_bytes(path);
  CHECK(v2[8] == 2);
  CHECK(header_text(v2).find("\"model\":{\"arch\":\"gpt2\",") != std::string::npos);
  CHECK(header_text(v2).find("n_kv_head") == std::string::npos);  // the Llama fields: a Llama model's only

  // What a version-1 writer wrote: the same header without "arch" (blanked: JSON whitespace), version 1.
  auto v1 = v2;
  edit_header(v1, "\"arch\":\"gpt2\",", "              ");
  v1[8] = 1;
  reseal(v1);
  write_bytes(path, v1);
  HostState loaded(model);
  const CheckpointMeta got = load_checkpoint(path, loaded, &meta);
  CHECK(got.model == meta.model);
  CHECK(got.model.arch == Arch::Gpt2);
  CHECK(same_state(s, loaded));

  // Version 2 without "arch", or with an unknown one: malformed, named.
  auto bad = v1;
  bad[8] = 2;
  reseal(bad);
  write_bytes(path, bad);
  CHECK(error_of([&] { read_checkpoint_meta(path); }).find("malformed header: 'model.arch' is missing") !=
        std::string::npos);
  bad = v2;
  edit_header(bad, "\"arch\":\"gpt2\"", "\"arch\":\"gpt3\"");
  reseal(bad);
  write_bytes(path, bad);
  CHECK(error_of([&] { read_checkpoint_meta(path); }).find("'model.arch' is \"gpt3\", neither") != std::string::npos);
}

TEST_CASE("a Llama header whose fields are missing or mistyped is malformed, named") {
  TempDir dir;
  const Gpt2 model(tiny_llama_config());
  HostState s(model);
  fill_state(s, 3);
  const std::string path = save_checkpoint(dir.str(), make_meta(model.config(), 2), s);
  const std::vector<std::uint8_t> good = read_bytes(path);
  auto error_after = [&](const std::string& from, const std::string& to) {
    auto bad = good;
    edit_header(bad, from, to);
    reseal(bad);
    write_bytes(path, bad);
    return error_of([&] { read_checkpoint_meta(path); });
  };
  CHECK(error_after("\"qkv_bias\":true", "\"qkv_bias\":1   ").find("'model.qkv_bias' is 1, not true or false") !=
        std::string::npos);
  CHECK(error_after("\"intermediate_size\":", "\"intermediate_sizX\":").find("'model.intermediate_size' is missing") !=
        std::string::npos);
  CHECK(error_after("\"n_kv_head\":2", "\"n_kv_head\":3").find("n_kv_head 3 does not divide n_head 4") !=
        std::string::npos);
  CHECK(error_after("\"model.rope_theta\"", "\"model.rope_thetX\"").find("'bits.model.rope_theta' is missing") !=
        std::string::npos);
  // "arch": "gpt2" over a Llama model's layers (read_checkpoint_meta too, which loads no state): GPT-2's embedding
  // also holds the position table, so the listed sizes are not that model's.
  CHECK(error_after("\"arch\":\"llama\"", "\"arch\":\"gpt2\" ")
            .find("malformed header: layer 0 has 1024 floats, the model's embedding has 1280 (gpt2 vocab_size=64") !=
        std::string::npos);
}

TEST_CASE("round trip edge cases: step 0 without losses, seven-digit steps") {
  TempDir dir;
  const Gpt2 model(tiny_config(0));  // no blocks: embedding and head only
  HostState s(model);
  fill_state(s, 5);
  CheckpointMeta meta = make_meta(model.config(), 0);
  CHECK(meta.losses.empty());
  const std::string p0 = save_checkpoint(dir.str(), meta, s, 5);
  CHECK(fs::path(p0).filename() == "step-000000.hckpt");
  HostState t(model);
  CHECK(load_checkpoint(p0, t).losses.empty());
  CHECK(same_state(s, t));

  meta.step = 999999;
  save_checkpoint(dir.str(), meta, s, 5);
  meta.step = 1234567;
  const std::string big = save_checkpoint(dir.str(), meta, s, 5);
  CHECK(fs::path(big).filename() == "step-1234567.hckpt");
  CHECK(latest_checkpoint(dir.str()) == big);  // by number, not by name
  CHECK(checkpoint_file_name(42) == "step-000042.hckpt");
}

TEST_CASE("keep: older checkpoints are deleted only after the new one exists; the previous one is never touched") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 3);
  auto name = [](int step) { return checkpoint_file_name(step); };

  std::vector<std::uint8_t> previous_bytes;
  std::string previous;
  for (int step = 10; step <= 50; step += 10) {
    s.weights(0)[0] = static_cast<float>(step);  // each checkpoint different
    const std::string path = save_checkpoint(dir.str(), make_meta(model.config(), step), s);
    CHECK(fs::exists(path));
    if (step == 10) {
      CHECK(names_in(dir) == std::set<std::string>{name(10)});
    } else {
      CHECK(names_in(dir) == std::set<std::string>{name(step - 10), name(step)});
      CHECK(read_bytes(previous) == previous_bytes);  // the previous file is exactly as it was
    }
    previous = path;
    previous_bytes = read_bytes(path);
  }
  CHECK(latest_checkpoint(dir.str()) == dir / name(50));

  SUBCASE("keep = 1 leaves only the new one") {
    save_checkpoint(dir.str(), make_meta(model.config(), 60), s, 1);
    CHECK(names_in(dir) == std::set<std::string>{name(60)});
  }
  SUBCASE("keep = 3 keeps the three newest") {
    save_checkpoint(dir.str(), make_meta(model.config(), 60), s, 3);
    save_checkpoint(dir.str(), make_meta(model.config(), 70), s, 3);
    CHECK(names_in(dir) == std::set<std::string>{name(50), name(60), name(70)});
  }
  SUBCASE("saving the same step again replaces the file; others stay") {
    s.weights(0)[0] = -1.0f;
    save_checkpoint(dir.str(), make_meta(model.config(), 50), s);
    CHECK(names_in(dir) == std::set<std::string>{name(40), name(50)});
    HostState t(model);
    load_checkpoint(dir / name(50), t);
    CHECK(t.weights(0)[0] == -1.0f);
  }
  SUBCASE("a checkpoint with a larger step is never deleted; stale temp files are") {
    write_bytes(dir / "step-000035.hckpt.tmp", {1, 2, 3});  // a crashed save
    write_bytes(dir / "notes.txt", {1});
    save_checkpoint(dir.str(), make_meta(model.config(), 20), s);  // an older step than the newest
    CHECK(names_in(dir) == std::set<std::string>{name(20), name(40), name(50), "notes.txt"});
  }
  SUBCASE("keep < 1 is refused before anything is written") {
    const std::string e = error_of([&] { save_checkpoint(dir.str(), make_meta(model.config(), 60), s, 0); });
    CHECK(e.find("keep is 0") != std::string::npos);
    CHECK(names_in(dir) == std::set<std::string>{name(40), name(50)});
  }
}

TEST_CASE("latest_checkpoint: the largest step; temp files, odd names and directories ignored") {
  TempDir dir;
  CHECK_FALSE(latest_checkpoint(dir / "missing").has_value());
  CHECK(list_checkpoints(dir / "missing").empty());
  CHECK_FALSE(latest_checkpoint(dir.str()).has_value());

  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 1);
  for (int step : {5, 100, 20}) save_checkpoint(dir.str(), make_meta(model.config(), step), s, 10);
  write_bytes(dir / "step-000200.hckpt.tmp", {0});  // an unfinished save (a later step)
  write_bytes(dir / "step-300.hckpt", {0});         // not the canonical name
  write_bytes(dir / "step-0000400.hckpt", {0});     // not canonical either
  write_bytes(dir / "step-00050x.hckpt", {0});
  write_bytes(dir / "xstep-000500.hckpt", {0});
  fs::create_directories(dir / "step-000600.hckpt");  // a directory
  CHECK(latest_checkpoint(dir.str()) == dir / "step-000100.hckpt");
  const auto all = list_checkpoints(dir.str());
  REQUIRE(all.size() == 3);
  CHECK(all[0].step == 5);
  CHECK(all[1].step == 20);
  CHECK(all[2].step == 100);
  CHECK(all[1].path == dir / "step-000020.hckpt");

  const std::string e = error_of([&] { latest_checkpoint(dir / "step-000005.hckpt"); });
  CHECK(e.find("not a directory") != std::string::npos);
}

TEST_CASE("corrupt files are refused with what is wrong and what to do; the state is untouched") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 21);
  const CheckpointMeta meta = make_meta(model.config(), 7);
  const std::string older = save_checkpoint(dir.str(), make_meta(model.config(), 6), s);
  const std::string path = save_checkpoint(dir.str(), meta, s);
  const std::vector<std::uint8_t> good = read_bytes(path);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data() + 16, 8);
  const std::size_t payload = 32 + static_cast<std::size_t>(header_bytes);

  HostState target(model);
  fill_state(target, 77);
  HostState untouched(model);
  fill_state(untouched, 77);
  auto load_error = [&](const std::vector<std::uint8_t>& bytes) {
    write_bytes(path, bytes);
    std::string e = error_of([&] { load_checkpoint(path, target, &meta); });
    CHECK(same_state(target, untouched));
    CHECK(error_of([&] { read_checkpoint_meta(path); }) == e);
    CHECK(e.rfind(path + ": ", 0) == 0);  // names the file first
    CHECK(e.find("\n  hint: ") != std::string::npos);
    return e;
  };

  SUBCASE("a flipped byte anywhere after the fixed header fails the checksum") {
    for (std::size_t at : {payload - 5, payload, payload + 1000, good.size() / 2, good.size() - 9, good.size() - 1}) {
      CAPTURE(at);
      auto bad = good;
      bad[at] ^= 0x10;
      const std::string e = load_error(bad);
      CHECK(e.find("checksum mismatch") != std::string::npos);
      // The hint names the previous checkpoint in the directory.
      CHECK(e.find("resume from " + older) != std::string::npos);
    }
  }
  SUBCASE("truncated anywhere") {
    for (std::size_t size :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{20}, std::size_t{31},
          std::size_t{32}, payload - 1, payload, payload + 4, good.size() / 2, good.size() - 8, good.size() - 1}) {
      CAPTURE(size);
      const std::string e = load_error({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size)});
      CHECK(e.find("truncated") != std::string::npos);
    }
  }
  SUBCASE("bytes appended") {
    auto bad = good;
    bad.push_back(0);
    CHECK(load_error(bad).find("corrupt: 1 bytes follow the checksum") != std::string::npos);
  }
  SUBCASE("wrong magic") {
    auto bad = good;
    bad[0] = 'X';
    const std::string e = load_error(bad);
    CHECK(e.find("not a harmony checkpoint") != std::string::npos);
    CHECK(e.find("XRMYCKPT") != std::string::npos);
    CHECK(load_error({'P', 'K', 3, 4}).find("not a harmony checkpoint") != std::string::npos);
  }
  SUBCASE("a future format version") {
    auto bad = good;
    bad[8] = 3;
    reseal(bad);
    const std::string e = load_error(bad);
    CHECK(e.find("format version 3 is newer than this build reads (2)") != std::string::npos);
    CHECK(e.find("newer") != std::string::npos);
  }
  SUBCASE("version 0, flags, an impossible length") {
    auto bad = good;
    bad[8] = 0;
    CHECK(load_error(bad).find("version 0") != std::string::npos);
    bad = good;
    bad[12] = 1;
    CHECK(load_error(bad).find("flags") != std::string::npos);
    bad = good;
    bad[31] = 0xff;  // payload length ~2^63
    CHECK(load_error(bad).find("truncated") != std::string::npos);
    bad = good;
    std::memset(bad.data() + 16, 0xff, 16);  // both lengths 2^64-1
    CHECK(load_error(bad).find("impossible") != std::string::npos);
  }
  SUBCASE("a header that passes the checksum but makes no sense") {
    auto bad = good;
    edit_header(bad, "\"batch\":4", "\"batch\":0");
    reseal(bad);
    CHECK(load_error(bad).find("malformed header: 'batch' is 0") != std::string::npos);
    bad = good;
    edit_header(bad, "\"format\"", "[format\"");
    reseal(bad);
    CHECK(load_error(bad).find("malformed header: the JSON does not parse") != std::string::npos);
    bad = good;
    edit_header(bad, "\"n_layer\":2", "\"n_layer\":3");
    reseal(bad);
    CHECK(load_error(bad).find("'layers' has 4 entries, the model has 5 layers") != std::string::npos);
    bad = good;
    edit_header(bad, "\"floats\":1280", "\"floats\":1281");
    reseal(bad);
    CHECK(load_error(bad).find("malformed header") != std::string::npos);
    bad = good;
    edit_header(bad, "\"adamw.lr\":\"3f", "\"adamw.lr\":\"x3");
    reseal(bad);
    CHECK(load_error(bad).find("'bits.adamw.lr'") != std::string::npos);
  }
  SUBCASE("a missing file") {
    const std::string e = error_of([&] { load_checkpoint(dir / "nope.hckpt", target); });
    CHECK(e.find("cannot open") != std::string::npos);
    CHECK(same_state(target, untouched));
  }
  SUBCASE("the only checkpoint: the hint says to start again") {
    fs::remove(older);
    auto bad = good;
    bad[good.size() / 2] ^= 1;
    CHECK(load_error(bad).find("no older checkpoint") != std::string::npos);
  }
}

TEST_CASE("mismatched checkpoints are refused naming the field, the file's value and the expected one") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 4);
  const CheckpointMeta meta = make_meta(model.config(), 3);
  const std::string path = save_checkpoint(dir.str(), meta, s);
  HostState target(model);
  HostState untouched(model);
  auto refused = [&](const CheckpointMeta& expect, const std::string& expected_text) {
    std::string e = error_of([&] { load_checkpoint(path, target, &expect); });
    CHECK(e.find(expected_text) != std::string::npos);
    CHECK(e.find("hint: resume with") != std::string::npos);
    CHECK(same_state(target, untouched));
    return e;
  };

  CheckpointMeta m = meta;
  m.batch = 8;
  refused(m, "batch differs: the checkpoint has 4, this run has 8");
  m = meta;
  m.seq_len = 8;
  refused(m, "seq_len differs: the checkpoint has 16, this run has 8");
  m = meta;
  m.data = "tokens.bin:1000:abcd";
  refused(m, "data differs: the checkpoint has \"synthetic:seed=7\", this run has \"tokens.bin:1000:abcd\"");
  m = meta;
  m.adamw.lr = std::nextafter(meta.adamw.lr, 1.0);  // one ulp
  refused(m, "adamw.lr differs: the checkpoint has 0.003 (bits");
  m = meta;
  m.adamw.weight_decay = 0.0;
  refused(m, "adamw.weight_decay differs: the checkpoint has 0.1");
  m = meta;
  m.model.n_layer = 3;
  refused(m, "model.n_layer differs: the checkpoint has 2, this run has 3");
  m = meta;
  m.model.ln_eps = 1e-6f;
  refused(m, "model.ln_eps differs");
  m = meta;
  m.dtype = DType::BF16;  // the file says fp32 (make_meta's default)
  refused(m, "train.dtype differs: the checkpoint has fp32, this run has bf16");

  // A state built for another model, with or without `expect`.
  const Gpt2 other(tiny_config(3));
  HostState wrong(other);
  const std::string e = error_of([&] { load_checkpoint(path, wrong); });
  CHECK(e.find("the checkpoint holds the model gpt2 vocab_size=64 max_seq_len=16 n_layer=2") != std::string::npos);
  CHECK(e.find("built for gpt2 vocab_size=64 max_seq_len=16 n_layer=3") != std::string::npos);

  // What may differ: the plan, the step, positions, RNG state, losses.
  m = meta;
  m.plan = "harmony-dp N4";
  m.step = 99;
  m.data_position = 0;
  m.rng_counter = 0;
  m.losses.clear();
  const CheckpointMeta got = load_checkpoint(path, target, &m);
  CHECK(got.plan == meta.plan);
  CHECK(same_state(target, s));
}

TEST_CASE("dtype: recorded and compared; a checkpoint that does not record it resumes under either") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 4);
  CheckpointMeta meta = make_meta(model.config(), 3);
  meta.dtype = DType::BF16;
  const std::string path = save_checkpoint(dir.str(), meta, s);
  HostState target(model);
  CHECK(read_checkpoint_meta(path).dtype == DType::BF16);
  CheckpointMeta expect = meta;
  CHECK_NOTHROW(load_checkpoint(path, target, &expect));
  expect.dtype = DType::F32;
  CHECK(error_of([&] {
          load_checkpoint(path, target, &expect);
        }).find("train.dtype differs: the checkpoint has bf16, this run has fp32") != std::string::npos);

  // Written without a dtype (as before harmony-run recorded it): no "dtype" key, read back as nullopt, and a
  // run of either precision may resume it.
  TempDir legacy_dir;
  meta.dtype = std::nullopt;
  const std::string legacy = save_checkpoint(legacy_dir.str(), meta, s);
  CHECK(read_checkpoint_meta(legacy).dtype == std::nullopt);
  for (const DType d : {DType::F32, DType::BF16}) {
    expect.dtype = d;
    CHECK_NOTHROW(load_checkpoint(legacy, target, &expect));
  }
}

TEST_CASE("a failed save throws and leaves the previous checkpoint intact") {
  TempDir dir;
  const Gpt2 model(tiny_config());
  HostState s(model);
  fill_state(s, 8);
  const std::string first = save_checkpoint(dir.str(), make_meta(model.config(), 1), s);
  const auto first_bytes = read_bytes(first);
  auto previous_intact = [&] {
    CHECK(read_bytes(first) == first_bytes);
    HostState t(model);
    load_checkpoint(first, t);
    CHECK(same_state(s, t));
  };

  SUBCASE("the checkpoint directory is a file") {
    write_bytes(dir / "file", {1});
    const std::string e = error_of([&] { save_checkpoint(dir / "file", make_meta(model.config(), 2), s); });
    CHECK(e.find("cannot create the checkpoint directory") != std::string::npos);
    const std::string e2 = error_of([&] { save_checkpoint(dir / "file/sub", make_meta(model.config(), 2), s); });
    CHECK(e2.find("cannot create the checkpoint directory") != std::string::npos);
  }
  SUBCASE("the temp file cannot be created") {
    fs::create_directories(dir / "step-000002.hckpt.tmp");
    const std::string e = error_of([&] { save_checkpoint(dir.str(), make_meta(model.config(), 2), s); });
    CHECK(e.find("cannot create") != std::string::npos);
    CHECK(e.find("the previous checkpoints are untouched") != std::string::npos);
    CHECK(names_in(dir) == std::set<std::string>{"step-000001.hckpt", "step-000002.hckpt.tmp"});
  }
  SUBCASE("a folder where the checkpoint goes is refused, not renamed over") {
    fs::create_directories(dir / "step-000002.hckpt/occupied");
    const std::string e = error_of([&] { save_checkpoint(dir.str(), make_meta(model.config(), 2), s); });
    CHECK(e.find("Is a directory") != std::string::npos);
    CHECK(names_in(dir) == std::set<std::string>{"step-000001.hckpt", "step-000002.hckpt"});  // no temp left
    CHECK(fs::is_directory(dir / "step-000002.hckpt"));
  }
  SUBCASE("a meta that does not fit the state") {
    CheckpointMeta m = make_meta(tiny_config(3), 2);
    CHECK(error_of([&] { save_checkpoint(dir.str(), m, s); }).find("is not the state's") != std::string::npos);
    m = make_meta(model.config(), 2);
    m.batch = 0;
    CHECK(error_of([&] { save_checkpoint(dir.str(), m, s); }).find("must be positive") != std::string::npos);
    m = make_meta(model.config(), 2);
    m.adamw.beta1 = 1.0;
    CHECK(error_of([&] { save_checkpoint(dir.str(), m, s); }).find("beta1") != std::string::npos);
    m = make_meta(model.config(), 2);
    m.data = "\xff\xfe";
    CHECK(error_of([&] { save_checkpoint(dir.str(), m, s); }).find("UTF-8") != std::string::npos);
    CHECK(names_in(dir) == std::set<std::string>{"step-000001.hckpt"});
  }
  previous_intact();
}
