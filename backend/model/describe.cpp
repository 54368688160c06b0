// The GPT-2 layer chain as a core::Model: exact byte sizes from the Gpt2 layouts and times estimated
// from FLOP and parameter counts (see describe.hpp).
#include "backend/model/describe.hpp"

#include <fmt/format.h>

namespace harmony::backend {

double forward_flops(const Gpt2& model, int layer, int B, int T) {
  const double N = double(B) * T, C = model.config().n_embd, V = model.config().vocab_size;
  switch (model.kind(layer)) {
    case LayerKind::Embedding:
      return N * C;
    case LayerKind::Block:
      if (model.is_llama()) {
        // q|k|v, o_proj, gate|up, down_proj, then scores and the weighted sum over T keys.
        const auto& c = model.config();
        const int head_dim = c.n_embd / c.n_head;  // whole: n_head divides n_embd
        const double KV = double(c.kv_heads()) * head_dim, I = c.intermediate_size;
        return 2 * N * (C * (C + 2 * KV) + C * C + 3 * C * I) + 4 * double(B) * T * T * C;
      }
      // c_attn, c_proj, c_fc, mlp c_proj, then scores and the weighted sum over T keys.
      return 2 * N * (3 * C * C + C * C + 8 * C * C) + 4 * double(B) * T * T * C;
    case LayerKind::Head:
      return 2 * N * C * V + 5 * N * V;
  }
  return 0;
}

core::Model describe_gpt2(const Gpt2& model, int seq_len, const std::vector<int>& ubatch_sizes,
                          const DescribeOptions& options) {
  if (seq_len <= 0 || seq_len > model.config().max_seq_len)
    throw BackendError(fmt::format("describe_gpt2: T = {} outside 1..{}", seq_len, model.config().max_seq_len));
  core::Model m;
  m.name = fmt::format("{}_L{}_C{}_H{}_V{}_T{}{}", arch_name(model.config().arch), model.config().n_layer,
                       model.config().n_embd, model.config().n_head, model.config().vocab_size, seq_len,
                       options.dtype == DType::F32 ? "" : "_bf16");
  const DType dt = options.dtype;
  const Bytes es = dtype_bytes(dt);
  m.source = "backend::describe_gpt2";
  m.dtype = std::string(dtype_name(options.dtype));
  m.ubatch_fwd = ubatch_sizes;
  m.ubatch_bwd = ubatch_sizes;
  const int T = seq_len;
  for (int l = 0; l < model.num_layers(); ++l) {
    core::Layer layer;
    layer.name = model.layer_name(l);
    layer.is_criterion = model.kind(l) == LayerKind::Head;
    layer.weight_bytes = model.param_floats(l) * es;
    std::int64_t owned = 0;
    for (const ParamSpec& p : model.params(l)) {
      if (p.tied_to.empty()) owned += p.numel;
    }
    layer.param_count = owned;
    layer.optimizer_state_bytes = (options.dtype == DType::BF16 ? 3 : 2) * owned * kF;  // m, v (+ masters)
    layer.update_time_cpu_s = double(owned) * options.update_seconds_per_param;
    layer.input_bytes_per_sample = model.input_bytes(l, 1, T, dt);
    for (int u : ubatch_sizes) {
      const double fwd = forward_flops(model, l, u, T) * options.seconds_per_flop;
      const Bytes x = model.input_bytes(l, u, T, dt), y = model.output_bytes(l, u, T, dt);
      const Bytes act = model.act_floats(l, u, T, dt) * es, scratch = model.scratch_floats(l, u, T) * es;
      const Bytes dx = l == 0 ? 0 : x, dy = layer.is_criterion ? 0 : y;
      layer.fwd_time_s.push_back(fwd);
      layer.bwd_time_s.push_back(3 * fwd);
      // The peaks in core's (the paper's) convention: everything the layer's pass holds, its weights included and,
      // backward, its whole weight gradient (core subtracts both to find the workspace).
      layer.fwd_peak_bytes.push_back(layer.weight_bytes + x + y + act);
      layer.bwd_peak_bytes.push_back(2 * layer.weight_bytes + x + act + scratch + dy + dx);
      layer.saved_bytes.push_back(act);  // what the executor keeps from a forward with grad for the backward
      layer.bwd_transient_bytes.push_back(scratch + dy + dx);  // live only while this layer's backward runs
    }
    m.layers.push_back(std::move(layer));
  }
  m.validate();
  return m;
}

}  // namespace harmony::backend
