// Hugging Face model folders beyond one file (issue 36): the tiny Llama (tests/data/llama_tiny) split into shards with
// a model.safetensors.index.json loads bit for bit as the single model.safetensors does, and every way a sharded set
// can be broken (a missing shard, a tensor the index puts in a shard that lacks it, a tensor stored twice or listed
// twice, a tensor the index does not list, a malformed index) is an error naming the file and the fix.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/model/hf_weights.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::backend;
namespace fs = std::filesystem;

namespace {

std::string tiny_dir() { return harmony::test::source_path("tests/data/llama_tiny/"); }

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// The tiny model's tensors, split into `parts` shards in file order (model-0000i-of-0000n.safetensors) in DIR with the
// index save_pretrained writes, and its config.json copied beside them. Returns the index (weight_map) as written.
nlohmann::json write_shards(const fs::path& dir, int parts) {
  const SafetensorsReader src = SafetensorsReader::open(tiny_dir() + "model.safetensors");
  const auto& all = src.tensors();
  std::vector<std::vector<float>> data;
  for (const TensorInfo& t : all) data.push_back(src.read_f32(t.name));
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  const std::size_t per = (all.size() + parts - 1) / static_cast<std::size_t>(parts);
  for (int s = 0; s < parts; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, parts);
    std::vector<TensorView> views;
    for (std::size_t i = s * per; i < std::min(all.size(), (s + 1) * per); ++i) {
      views.push_back({all[i].name, all[i].shape, data[i]});
      index["weight_map"][all[i].name] = file;
    }
    write_safetensors((dir / file).string(), views, {{"format", "pt"}});
  }
  write_text(dir / "model.safetensors.index.json", index.dump(2));
  fs::copy_file(tiny_dir() + "config.json", dir / "config.json");
  return index;
}

std::string error_of(const std::string& path) {
  try {
    const Gpt2Config c = gpt2_config_at(path);
    HostState state{Gpt2(c)};
    load_gpt2_weights_at(path, state);
  } catch (const BackendError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("sharded folder: loads bit for bit as the single file") {
  const Gpt2Config one = gpt2_config_at(tiny_dir());
  HostState want{Gpt2(one)};
  load_gpt2_weights_at(tiny_dir(), want);
  for (const int parts : {1, 3}) {
    const harmony::test::TempDir tmp_dir;
    const fs::path tmp = tmp_dir.str();
    write_shards(tmp, parts);
    CHECK(gpt2_config_at(tmp.string()) == one);
    // the folder, and model.weights naming the index itself
    for (const std::string& path : {tmp.string(), (tmp / "model.safetensors.index.json").string()}) {
      const WeightFiles files = WeightFiles::open(locate_gpt2_files(path).weights);
      CHECK(files.sharded());
      CHECK(files.file_count() == static_cast<std::size_t>(parts));
      HostState got{Gpt2(gpt2_config_at(path))};
      load_gpt2_weights_at(path, got);
      for (int l = 0; l < want.model().num_layers(); ++l) {
        REQUIRE(got.weights(l).size() == want.weights(l).size());
        CHECK(std::memcmp(got.weights(l).data(), want.weights(l).data(), want.weights(l).size() * sizeof(float)) == 0);
      }
    }
  }
  // model.safetensors wins when a folder has both (as transformers' from_pretrained)
  const harmony::test::TempDir both_dir;
  const fs::path both = both_dir.str();
  write_shards(both, 2);
  fs::remove(both / "model-00002-of-00002.safetensors");  // a broken shard set that is never read
  fs::copy_file(tiny_dir() + "model.safetensors", both / "model.safetensors");
  CHECK(locate_gpt2_files(both.string()).weights == (both / "model.safetensors").string());
  CHECK(error_of(both.string()).empty());
}

TEST_CASE("sharded folder: every broken set is a located error with the fix") {
  const harmony::test::TempDir tmp_dir;
  const fs::path tmp = tmp_dir.str();
  const nlohmann::json good = write_shards(tmp, 2);
  const fs::path index = tmp / "model.safetensors.index.json";
  const std::string dir = tmp.string();
  const std::string first_tensor = "model.embed_tokens.weight";  // the first in data order: in shard 1
  REQUIRE(good["weight_map"][first_tensor] == "model-00001-of-00002.safetensors");
  REQUIRE(error_of(dir).empty());

  SUBCASE("a missing shard names the index, the tensor, the shard and what to do") {
    fs::remove(tmp / "model-00002-of-00002.safetensors");
    const std::string e = error_of(dir);
    CHECK(e.find(index.string() + ":") == 0);
    CHECK(e.find("model-00002-of-00002.safetensors") != std::string::npos);
    CHECK(e.find("No such file or directory") != std::string::npos);
    CHECK(e.find("download every shard the index names") != std::string::npos);
  }
  SUBCASE("a tensor the index puts in a shard that does not hold it") {
    nlohmann::json bad = good;
    bad["weight_map"][first_tensor] = "model-00002-of-00002.safetensors";
    write_text(index, bad.dump(2));
    const std::string e = error_of(dir);
    CHECK(e.find(index.string() + ":") == 0);
    CHECK(e.find("\"" + first_tensor + "\" is mapped to") != std::string::npos);
    CHECK(e.find("which does not hold it") != std::string::npos);
  }
  SUBCASE("a tensor stored in two shards is a duplicate") {
    const SafetensorsReader src = SafetensorsReader::open(tiny_dir() + "model.safetensors");
    const std::vector<float> first = src.read_f32(first_tensor);
    // shard 2 (which holds model.norm.weight) gets a copy of shard 1's first tensor too
    const SafetensorsReader s2 = SafetensorsReader::open(dir + "/model-00002-of-00002.safetensors");
    std::vector<std::vector<float>> data;
    std::vector<TensorView> views;
    for (const TensorInfo& t : s2.tensors()) data.push_back(s2.read_f32(t.name));
    for (std::size_t i = 0; i < s2.tensors().size(); ++i)
      views.push_back({s2.tensors()[i].name, s2.tensors()[i].shape, data[i]});
    views.push_back({first_tensor, src.find(first_tensor)->shape, first});
    write_safetensors(dir + "/model-00002-of-00002.safetensors", views);
    const std::string e = error_of(dir);
    CHECK(e.find(dir + "/model-00002-of-00002.safetensors: byte") == 0);
    CHECK(e.find("'" + first_tensor + "' is stored twice") != std::string::npos);
    CHECK(e.find("model-00001-of-00002.safetensors") != std::string::npos);
  }
  SUBCASE("a tensor listed twice in the index is a duplicate, located at the second") {
    const std::string text = good.dump(2);
    const std::string entry = nlohmann::json(first_tensor).dump() + ": \"model-00001-of-00002.safetensors\"";
    const auto at = text.find(entry);
    REQUIRE(at != std::string::npos);
    std::string twice = text;
    twice.insert(at, entry + ",\n    ");
    write_text(index, twice);
    const std::string e = error_of(dir);
    CHECK(e.find(index.string() + ":") == 0);
    CHECK(e.find("appears twice in the index") != std::string::npos);
    // dump(2) sorts the keys: "{", 3 lines of "metadata", "weight_map" on line 5, lm_head.weight on 6, the inserted
    // copy on 7 and the original, the second occurrence, on 8
    CHECK(e.find(index.string() + ":8:5: \"" + first_tensor + "\" appears twice") == 0);
  }
  SUBCASE("a shard's tensor the index does not list") {
    nlohmann::json bad = good;
    bad["weight_map"].erase("model.norm.weight");
    write_text(index, bad.dump(2));
    const std::string e = error_of(dir);
    CHECK(e.find("'model.norm.weight' is not in") != std::string::npos);
    CHECK(e.find("weight_map") != std::string::npos);
  }
  SUBCASE("a malformed index") {
    write_text(index, "{\"weight_map\": {");
    CHECK(error_of(dir).find("not valid JSON") != std::string::npos);
    write_text(index, "{\"metadata\": {}}");
    CHECK(error_of(dir).find("needs a \"weight_map\" object") != std::string::npos);
    nlohmann::json bad = good;
    bad["weight_map"][first_tensor] = "../model-00001-of-00002.safetensors";
    write_text(index, bad.dump(2));
    CHECK(error_of(dir).find("must name a shard file in the index's folder") != std::string::npos);
    bad["weight_map"][first_tensor] = 7;
    write_text(index, bad.dump(2));
    CHECK(error_of(dir).find("must name a shard file in the index's folder") != std::string::npos);
  }
}

namespace {

// Saves STATE as a Hugging Face folder (save_hf_model into DIR/model.safetensors) and checks that the folder reads
// back to the same config and the same weights bit for bit.
void check_round_trip(const HostState& state, const fs::path& dir) {
  save_hf_model((dir / "model.safetensors").string(), state);
  REQUIRE(fs::exists(dir / "config.json"));
  const Gpt2Config back = gpt2_config_at(dir.string());
  CHECK(back == state.model().config());
  HostState got{Gpt2(back)};
  load_gpt2_weights_at(dir.string(), got);
  for (int l = 0; l < state.model().num_layers(); ++l)
    CHECK(std::memcmp(got.weights(l).data(), state.weights(l).data(), state.weights(l).size() * sizeof(float)) == 0);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("save_hf_model: config.json beside the weights, the folder loads back") {
  SUBCASE("Llama (the oracle's folder): the keys transformers' LlamaConfig reads") {
    const harmony::test::TempDir tmp_dir;
    const fs::path tmp = tmp_dir.str();
    const Gpt2Config c = gpt2_config_at(tiny_dir());
    HostState state{Gpt2(c)};
    load_gpt2_weights_at(tiny_dir(), state);
    check_round_trip(state, tmp);
    const nlohmann::json j = read_json(tmp / "config.json");
    const nlohmann::json want = read_json(tiny_dir() + "config.json");  // written by make_llama_oracle.py
    for (const auto& [key, value] : want.items()) CHECK_MESSAGE(j.at(key) == value, key);
    CHECK(j.at("rms_norm_eps").dump() == "1e-05");  // the float's shortest form, not 9.99999974e-06
    CHECK(j.at("torch_dtype") == "float32");
  }
  SUBCASE("Llama, tied head, rope_theta 500000, rms_norm_eps 1e-6") {
    const harmony::test::TempDir tmp_dir;
    const fs::path tmp = tmp_dir.str();
    Gpt2Config c = gpt2_config_at(tiny_dir());
    c.tie_embeddings = true;
    c.rope_theta = 500000.0f;
    c.ln_eps = 1e-6f;
    c.n_kv_head = 1;
    HostState state{Gpt2(c)};
    state.init_weights(7);
    check_round_trip(state, tmp);
    const nlohmann::json j = read_json(tmp / "config.json");
    CHECK(j.at("tie_word_embeddings") == true);
    CHECK(j.at("num_key_value_heads") == 1);
    CHECK(j.at("rope_theta").dump() == "500000.0");
  }
  SUBCASE("Qwen2 (q/k/v biases) and Mistral (a sliding window) keep their model_type") {
    const harmony::test::TempDir tmp_dir;
    const fs::path tmp = tmp_dir.str();
    const std::string qwen2 = tiny_dir() + "../qwen2_tiny/";
    const Gpt2Config c = gpt2_config_at(qwen2);
    REQUIRE(c.qkv_bias);
    HostState state{Gpt2(c)};
    load_gpt2_weights_at(qwen2, state);
    check_round_trip(state, tmp);
    CHECK(read_json(tmp / "config.json").at("model_type") == "qwen2");
    const harmony::test::TempDir tmp2_dir;
    const fs::path tmp2 = tmp2_dir.str();
    Gpt2Config m = gpt2_config_at(tiny_dir());
    m.sliding_window = 16;
    HostState ms{Gpt2(m)};
    ms.init_weights(3);
    check_round_trip(ms, tmp2);
    CHECK(read_json(tmp2 / "config.json").at("model_type") == "mistral");
  }
  SUBCASE("GPT-2 (gpt2_tiny, whose file has no config.json): GPT2Config's keys") {
    const harmony::test::TempDir tmp_dir;
    const fs::path tmp = tmp_dir.str();
    const std::string src = harmony::test::source_path("tests/data/gpt2_tiny/model.safetensors");
    const Gpt2Config c = gpt2_config_at(src);
    HostState state{Gpt2(c)};
    load_gpt2_weights_at(src, state);
    check_round_trip(state, tmp);
    const nlohmann::json j = read_json(tmp / "config.json");
    CHECK(j.at("model_type") == "gpt2");
    CHECK(j.at("n_head") == c.n_head);
    CHECK(j.at("n_positions") == c.max_seq_len);
    CHECK(j.at("activation_function") == "gelu_new");
  }
}
