// GPT-2 weights in Hugging Face's safetensors layout: wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
// h.{i}.attn.c_attn.weight as Conv1D [in, out], ..., ln_f.bias, optionally under "transformer.", with the LM
// head tied to wte (an lm_head.weight present in the file must equal wte). Causal-mask buffers
// (h.{i}.attn.bias, h.{i}.attn.masked_bias) are ignored. Only F32 tensors.
#pragma once

#include <string>

#include "backend/model/state.hpp"
#include "backend/safetensors.hpp"

namespace harmony::backend {

// The architecture from the tensor shapes; n_head from the argument (> 0) or else the metadata key
// "n_head" (which the files written here and by scripts/make_gpt2_oracle.py carry). FormatError when
// tensors are missing or inconsistent, or n_head is known from neither.
Gpt2Config gpt2_config_from(const SafetensorsReader& file, int n_head = 0);

// Copies every parameter into state's weights (and the tie into the head's block). FormatError naming the
// tensor for a missing, unknown, non-F32 or misshapen one.
void load_gpt2_weights(const SafetensorsReader& file, HostState& state);

// Writes state's weights with HF names (no prefix, no lm_head) and metadata {"format": "pt", "n_head": H}.
void save_gpt2_weights(const std::string& path, const HostState& state);

}  // namespace harmony::backend
