// GPT-2 and Llama-family weights in Hugging Face's layout, as the Hub ships them: a model folder holding
// model.safetensors or model.safetensors.index.json and its shards (GPT-2: wte.weight, wpe.weight, h.{i}.ln_1.weight,
// ..., h.{i}.attn.c_attn.weight as Conv1D [in, out], ..., ln_f.bias, optionally under "transformer.", the LM head tied
// to wte: an lm_head.weight present must equal it; causal-mask buffers h.{i}.attn.bias / masked_bias ignored; F32,
// F16 or BF16 tensors, loaded into the fp32 master copy) and config.json (GPT-2: n_head, checked against the tensors'
// n_layer, n_embd, vocab_size, n_positions; Llama: the whole shape), written back by save_hf_folder.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "backend/model/state.hpp"
#include "backend/safetensors.hpp"

namespace harmony::backend {

// The weights of one model: a single safetensors file, or the shards a Hugging Face model.safetensors.index.json
// names (its "weight_map": tensor name -> shard file in the index's folder). open() validates the whole set up front:
// every shard present and well-formed, every tensor of the index in the shard it is mapped to, and every shard's
// tensor listed in the index once and held by one shard only; a failure names the index (file:line:column) or the
// shard and says what to do.
class WeightFiles {
 public:
  // PATH a file ending in ".index.json": the sharded set it names; else the one safetensors file.
  static WeightFiles open(const std::string& path);
  // A view of one already-open file (not owned: it must outlive this).
  explicit WeightFiles(const SafetensorsReader& one);

  struct Found {
    const SafetensorsReader* file = nullptr;  // null when no file holds the tensor
    const TensorInfo* info = nullptr;
  };
  const std::string& name() const { return name_; }  // the file, or the index, for messages
  bool sharded() const { return !index_.empty(); }
  std::size_t file_count() const { return view_ != nullptr ? 1 : owned_.size(); }
  const SafetensorsReader& file(std::size_t i) const { return view_ != nullptr ? *view_ : owned_.at(i); }
  Found find(std::string_view tensor) const;
  std::vector<Found> tensors() const;  // every tensor, file by file in data order

 private:
  WeightFiles() = default;
  std::string name_;
  std::string index_;
  const SafetensorsReader* view_ = nullptr;
  std::vector<SafetensorsReader> owned_;
};

// The architecture from the tensor shapes; n_head from the argument (> 0, an explicit setting: it wins) or
// else the metadata key "n_head" (which the files written here and by scripts/make_gpt2_oracle.py carry; the
// Hub's carry only {"format": "pt"}). FormatError when tensors are missing or inconsistent, or n_head is
// known from neither.
Gpt2Config gpt2_config_from(const SafetensorsReader& file, int n_head = 0);
Gpt2Config gpt2_config_from(const WeightFiles& files, int n_head = 0);

// Where a model.weights PATH's files are: a folder means PATH/model.safetensors, else its sharded
// PATH/model.safetensors.index.json (FormatError naming the folder when it has neither: pytorch_model.bin alone is
// named in the message); a file is the weights itself (a safetensors file or an index). config_json: the
// config.json in that folder (or beside the file), empty if none.
struct Gpt2Files {
  std::string weights;
  std::string config_json;
};
Gpt2Files locate_gpt2_files(const std::string& path);

// The architecture of the model at PATH (locate_gpt2_files): the tensor shapes, with n_head from the
// argument (> 0 wins), else config.json, else the file's metadata. config.json's n_layer, n_embd,
// vocab_size and n_positions must match the tensors, model_type be gpt2, activation_function gelu_new, n_inner
// null or 4 * n_embd; layer_norm_epsilon sets ln_eps. BackendError "config.json:LINE:COL: ..." on a mismatch.
Gpt2Config gpt2_config_at(const std::string& path, int n_head = 0);

// Copies every parameter into state's weights (and the tie into the head's block), F16/BF16 widened to
// fp32. FormatError naming the tensor for a missing, unknown, non-float or misshapen one.
void load_gpt2_weights(const SafetensorsReader& file, HostState& state);
void load_gpt2_weights(const WeightFiles& files, HostState& state);
// The same for the model at PATH (locate_gpt2_files).
void load_gpt2_weights_at(const std::string& path, HostState& state);

// Writes state's weights with HF names (no prefix, no lm_head) and metadata {"format": "pt", "n_head": H}.
void save_gpt2_weights(const std::string& path, const HostState& state);

// The config.json Hugging Face's transformers reads for this model (GPT2Config: model_type gpt2, n_layer, n_embd,
// n_head, n_positions, vocab_size, layer_norm_epsilon, gelu_new; LlamaConfig: model_type llama and every key
// llama_config_from reads), which gpt2_config_at reads back to the same Gpt2Config.
std::string hf_config_json(const Gpt2Config& config);
// The model as a Hugging Face folder: save_gpt2_weights(PATH) and then hf_config_json as config.json in PATH's
// folder (replacing one there), so that FOLDER/model.safetensors makes FOLDER loadable by harmony-run's model.weights
// and by transformers' from_pretrained. core::FileError names the file that could not be written (the weights are
// written first: a failed config.json leaves them written).
void save_hf_model(const std::string& path, const HostState& state);
// Where save_hf_model writes config.json for weights at PATH.
std::string hf_config_path_for(const std::string& path);

}  // namespace harmony::backend
