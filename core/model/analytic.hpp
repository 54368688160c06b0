// Analytic models: a core::Model built from a model's shape (transformer decoder or encoder, ResNet) and a
// GPU's rates instead of a measured profile. Per-layer FLOPs, bytes moved, kernels and tensor lifetimes come
// from formulas; times from the rates (GEMM efficiency curve, memory roofline); memory from a liveness walk.
// The model and its calibration against the bundled profiles are documented in docs/validation.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"

namespace harmony::core {

enum class ModelFamily {
  Gpt,     // decoder: embeddings, blocks (causal attention), final norm, LM head (or none), loss
  Bert,    // encoder: embeddings, blocks, head (masked-LM, or pooler + classifier), loss
  Resnet,  // ResNet v1.5: stem, one layer per bottleneck block, pool + FC head, loss
  Llama,   // decoder as Llama, Mistral, Qwen2: token embedding, blocks (RMSNorm, rotary positions, grouped-query
           // attention, SwiGLU MLP), final RMSNorm, LM head, loss
  Neox,    // GPT-NeoX (Pythia): token embedding, blocks (LayerNorm, partial rotary positions, attention and a GELU
           // MLP in parallel or in sequence), final LayerNorm, LM head, loss
};
enum class DType { Fp32, Fp16, Bf16 };
enum class OptimizerKind {
  Adam,      // 2 FP32 moments per parameter
  Sgd,       // no state
  Momentum,  // SGD with momentum: 1 FP32 buffer per parameter
};
// Which implementation runs the CPU optimizer step (docs/config.md, `cpu_optimizer`): the machine's cpu_adam rates
// are those of a vectorised, multi-threaded, one-pass CPU Adam; PyTorch's own torch.optim.AdamW on CPU tensors (FSDP's
// CPUOffload(offload_params=True), torchtune's and Accelerate's FSDP CPU offload) is several times slower.
enum class CpuOptimizerImpl {
  Deepspeed,  // DeepSpeedCPUAdam, Colossal-AI's HybridAdam / CPUAdam, harmony-run's ParallelAdamW: cpu_adam.bandwidth
  Torch,      // torch.optim.AdamW / Adam / SGD stepping CPU tensors (foreach or for-loop): cpu_adam.bandwidth_torch
};
// Which implementation runs the GPU optimizer step of the kinds that keep their state on the GPUs (resident, fsdp,
// zero2, zero3; docs/config.md, `gpu_optimizer`): a fused one-pass AdamW (torch's fused=True, Apex/DeepSpeed FusedAdam,
// harmony-run's kernel), or torch.optim.AdamW's default on CUDA tensors, the foreach implementation, whose eight
// _foreach_ passes move about three times the bytes (Model::device_adamw_bytes_per_param).
enum class GpuOptimizerImpl {
  Fused,    // one pass: 28 bytes a parameter with FP32 state, 14 in pure 2-byte training
  Foreach,  // torch.optim.Adam(W) foreach (torch >= 2.0's CUDA default) or for-loop: 80 bytes (+6 with 2-byte weights),
            // 40
};
// cpu_adam.bandwidth_torch's default: cpu_adam.bandwidth divided by this. DeepSpeed documents its CPU Adam as "between
// 5x to 7x" faster than torch.optim.Adam(W) (deepspeed/ops/adam/cpu_adam.py, DeepSpeedCPUAdam's docstring; the
// ZeRO-Offload tutorial: "5X-7X faster than the standard PyTorch implementation"); the low end, as
// scripts/torch-adamw-vs-host.py measured a smaller gap on a 2-vCPU VM (docs/benchmarks.md).
inline constexpr double kTorchCpuAdamSlowdown = 5.0;
enum class KernelStyle {
  Eager,  // op by op as PyTorch eager runs the Hugging Face code the bundled profiles measured
  Fused,  // fused scale-mask-softmax, GELU and bias-dropout-residual kernels (Megatron style); no flash attention
  Flash,  // as Fused, with the attention core (q k^T, softmax, dropout, p v) one FlashAttention (v1) kernel
  Sdpa,   // as Eager, with the attention core one torch.nn.functional.scaled_dot_product_attention kernel (Hugging
          // Face attn_implementation="sdpa", transformers' default since 4.36): no T x T tensor, a recomputing backward
};
// llama: how the code lays out the q/k/v and the MLP's gate/up projections. Auto follows the kernel style: eager and
// sdpa separate (Hugging Face's modelling code), fused and flash packed (one qkv and one gate_up GEMM, the fused
// kernels' layout). Separate and Packed say what the model's code does whatever its kernels: Hugging Face's Llama,
// Mistral and Qwen with FlashAttention-2 or Liger, torchtitan and torchtune keep q, k, v, gate and up apart; Phi-3 and
// Megatron pack them. The GEMMs' shapes and the modules ZeRO-3 gathers (Layer::gathered_modules) follow it.
enum class Projections { Auto, Separate, Packed };
// What runs the training step (docs/config.md, `trainer`): a Python framework (PyTorch eager or compiled, DeepSpeed,
// FSDP, Megatron), whose GEMMs the machine's gemm_efficiency prices (calibrated on framework runs) and whose layers pay
// the per-call dispatch overheads (gpu_rates.overhead forward/backward); or a hand-written C/C++/CUDA engine calling
// cuBLAS(Lt)/cuDNN directly (llm.c, llm.q, ml_dataflow), whose GEMMs reach the machine's measured ceiling
// (gpu_rates.gemm_ceiling) and whose layers pay no dispatch overhead (the kernel floor stays).
enum class Trainer { Framework, Engine };
enum class BertHead { Mlm, Classifier };
enum class AttnBias {
  None,
  Qkv,  // biases on the q, k and v projections (Qwen2)
  All,  // biases on q, k, v and the output projection (Llama's attention_bias, GPT-NeoX)
};
enum class MlpActivation {
  Gelu,     // one GELU kernel in every kernel style (PyTorch's gelu, exact or tanh)
  GeluNew,  // eager and sdpa: GPT-2's Python tanh formula, 8 elementwise kernels; fused and flash: one kernel
};
enum class GptHead {
  Lm,    // LM head (vocabulary projection) and cross-entropy over the vocabulary
  None,  // no head: an MSE loss between the final norm's output and a target of its shape (LoHan/Fuyou's GPT)
};

struct AnalyticSpec {
  ModelFamily family = ModelFamily::Gpt;
  std::string name;  // shown in reports; empty: derived from the shape
  int layers = 0;    // transformer blocks; resnet: the depth (50, 101 or 152)
  int hidden = 0;
  int heads = 0;
  int ffn = 0;  // MLP width (llama: the SwiGLU intermediate size, required); 0: 4 x hidden
  int seq_len = 0;
  int vocab = 0;
  bool tied_head = true;  // gpt (head lm), bert mlm, llama, neox: the output projection is the token embedding
                          // (the config loader's default for llama and neox is false, as their configs')
  BertHead bert_head = BertHead::Mlm;  // bert
  GptHead gpt_head = GptHead::Lm;      // gpt; with None, tied_head has no meaning and is ignored
  int labels = 2;                      // bert classifier
  int image_size = 224;                // resnet
  int classes = 1000;                  // resnet
  DType dtype = DType::Fp32;           // activations and GPU weights; fp16/bf16 keep FP32 masters on the CPU
  // fp16/bf16: FP32 masters and moments on the optimizer's side (mixed precision); false: pure 2-byte training, no
  // master and the moments in dtype (Model::fp32_optimizer). Must be true for fp32.
  bool master_weights = true;
  // fp16/bf16 under torch.autocast (docs/config.md, `autocast`): the parameters, their gradients and the optimizer
  // stay FP32 on the GPU (4 bytes each, no separate master), and every GEMM casts its FP32 weight (and bias) to dtype
  // on each forward call (autocast caches the cast within one forward region only: a recompute casts again) and keeps
  // that copy for its backward, whose 2-byte weight gradient is cast back to FP32. gpt, bert and resnet activations
  // follow autocast's op rules (Builder::autocast_to: GEMM inputs cast to dtype, FP32-list ops' inputs to FP32, others
  // in their widest input's type); llama and neox keep mixed precision's. Needs dtype fp16/bf16, master_weights true.
  bool autocast = false;
  OptimizerKind optimizer = OptimizerKind::Adam;
  CpuOptimizerImpl cpu_optimizer = CpuOptimizerImpl::Deepspeed;  // which implementation prices the CPU step
  GpuOptimizerImpl gpu_optimizer = GpuOptimizerImpl::Fused;      // which implementation prices the GPU step
  KernelStyle kernels = KernelStyle::Eager;
  Trainer trainer = Trainer::Framework;  // what runs the step: the GEMM rate and dispatch overheads it reaches
  // dtype fp32 with TF32 allowed (docs/config.md, `tf32`: torch.backends.cuda.matmul.allow_tf32,
  // set_float32_matmul_precision('high'), CUBLAS_COMPUTE_32F_FAST_TF32, harmony-run --tf32): the GEMMs run on the
  // tensor cores at GpuRates::matrix_tf32 with the tensor-core efficiency (or the ceiling, for an engine); storage,
  // memory and every other kernel stay FP32. Needs dtype fp32 and a machine with matrix_tf32.
  bool tf32 = false;
  Projections projections = Projections::Auto;  // llama only
  bool dropout = true;                          // dropout layers are present (training mode)
  int layers_per_block = 1;  // gpt: 1, one layer a block; 2, its attention and MLP halves (block{i}.attn, .mlp)
  int positions = 0;         // gpt: rows of the position table (Hugging Face n_positions), >= seq_len; 0: seq_len
  // llama and neox (the config loader's defaults for neox: attn_bias All, mlp_bias true)
  int kv_heads = 0;  // llama: key/value heads (grouped-query attention), dividing heads; 0: heads
  int head_dim = 0;  // llama: each head's width when it is not hidden / heads (Qwen3, Mistral Nemo); 0: hidden / heads
  bool qk_norm = false;  // llama: an RMSNorm over each head's q and k before RoPE (Qwen3's q_norm and k_norm)
  AttnBias attn_bias = AttnBias::None;  // llama: None, Qkv or All; neox: None or All
  bool mlp_bias = false;                // llama, neox: biases on the MLP projections
  int sliding_window = 0;  // llama: each query attends to the last sliding_window tokens (Mistral); 0: all earlier
  bool rope = true;        // llama, neox: rotary position embeddings on q and k; false: no position information
  int rope_dims = 0;       // neox: rotated dimensions per head (rotary_pct x head size), even; 0: the whole head
  bool parallel_residual = true;            // neox: x + attn(ln_1 x) + mlp(ln_2 x); false: one after the other
  MlpActivation act = MlpActivation::Gelu;  // neox
  std::vector<int> ubatch_sizes = {1, 2, 4, 8, 16, 32};  // the sizes costs are computed at, ascending
  // gpt (head lm), llama and neox: the LM head and its loss run over loss_chunks chunks of the tokens (Liger's fused
  // linear cross-entropy, torchtune's CEWithChunkedOutputLoss, llm.q's --lmhead-chunks): one chunk's logits, their
  // copies and their gradient are alive at a time. FLOPs and bytes moved are the whole head's; only memory shrinks.
  int loss_chunks = 1;
};

// Named shapes (gpt2-small..xl, gpt3-1.3b..175b, bert-base, bert-large, resnet50/101/152, llama2-7b/13b/70b,
// llama3-8b/70b, mistral-7b, qwen2-7b, qwen3-8b); nullopt if unknown.
std::optional<AnalyticSpec> analytic_preset(std::string_view name);
std::vector<std::string> analytic_preset_names();

// Why `spec` cannot be built ("heads (16) must divide hidden (1000)"), or "" when it can.
std::string analytic_spec_problem(const AnalyticSpec& spec);

// The model: one Layer per embedding / block (or GPT block half) / head / loss, costed at spec.ubatch_sizes for both
// phases. Throws ScheduleError when analytic_spec_problem(spec) is not empty or `gpu` is not valid(). `cpu` zeros take
// the documented defaults (the paper testbed's measured Adam step).
Model analytic_model(const AnalyticSpec& spec, const GpuRates& gpu, const CpuAdam& cpu = {});

// What each layer of the analytic model is, for tests and the validation table.
struct AnalyticLayerInfo {
  std::string kind;                   // embedding, block (block_attn, block_mlp), final_norm, lm_head, mlm_head,
                                      // pooler, classifier, stem, bottleneck, head, criterion
  double fwd_flops_per_sample = 0;    // 2 x multiply-adds of its GEMMs and convolutions, per sample
  std::int64_t param_count = 0;       // parameters it owns (a tied head owns none)
  double saved_bytes_per_sample = 0;  // bytes per sample of the tensors autograd keeps from the forward for the
                                      // backward (each counted once; the layer's input too when an op saves it)
};
std::vector<AnalyticLayerInfo> analytic_layer_info(const AnalyticSpec& spec);

// "11.3TFLOP/s", "312 TFLOP/s", "1e12" -> FLOP/s (prefixes k M G T P); nullopt when malformed or not positive.
std::optional<double> parse_flops_per_s(std::string_view text);
// "2GFLOP", "500 MFLOP", "1e9" -> FLOPs; nullopt when malformed or not positive.
std::optional<double> parse_flop_count(std::string_view text);

}  // namespace harmony::core
