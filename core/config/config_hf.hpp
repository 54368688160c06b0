// A Hugging Face config.json as an analytic model's shape (`model: {hf_config: PATH}`, docs/config.md,
// "model.hf_config"): model_type gpt2, gpt_neox, llama, mistral or qwen2 and the keys of its family, every
// problem a ConfigError at the file's line:column with a hint.
#pragma once

#include <string>

#include "core/base/error.hpp"
#include "core/model/analytic.hpp"

namespace harmony::core {

// The shape config.json at `path` describes, in transformers' terms: its family's keys read (absent optional keys
// take transformers' defaults), the keys known not to change the model's FLOPs, bytes or memory (token ids,
// generation settings, the norms' epsilon, the rotary base) ignored, and anything else refused at its line:column:
// another model_type, a value the analytic models do not follow (a hidden_act other than silu in the Llama family, a
// head_dim other than hidden_size / num_attention_heads, mixture-of-experts or quantization keys, ...), a key
// harmony does not know. `ref` locates the config's `hf_config:` value for a file that cannot be read. The sequence
// length is max_position_embeddings (gpt2: n_positions) unless `seq_len_given` (the caller sets it; then the file
// need not have it). The name is the file's folder for `.../NAME/config.json`, else its stem. Relative `path`s are
// the caller's to resolve. The file is recorded among the config's inputs (RunConfig::inputs).
AnalyticSpec read_hf_config(const std::string& path, const SourceLoc& ref, bool seq_len_given);

}  // namespace harmony::core
