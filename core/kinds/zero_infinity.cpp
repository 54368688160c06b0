// zero-infinity, zero3-opt-offload and fsdp-offload: fully sharded data parallelism with the optimizer on the CPU.
// zero-infinity (DeepSpeed stage 3 with offload_param and offload_optimizer): parameters, gradients and optimizer state
// are partitioned across the N data-parallel ranks and live in host memory; each layer's parameters are fetched and
// gathered for every forward and backward of every microbatch, gradients are reduce-scattered and their shards sent to
// the host, CPU Adam runs after the backward pass. zero3-opt-offload (offload_optimizer only): the same, but each GPU
// keeps its parameter shard, gathered from the peers' shards, and gets it back from the host after the CPU Adam
// (harmony-run carries it across steps: backend/executor/flow_carried.cpp). fsdp-offload (PyTorch FSDP with
// CPUOffload(offload_params=True)): zero-infinity's data path without DeepSpeed's stage-3 work (below).
#include <algorithm>
#include <cmath>

#include "core/kinds/fsdp.hpp"
#include "core/kinds/microbatch_sizes.hpp"
#include "core/kinds/swapping.hpp"
#include "core/kinds/zero3_hooks.hpp"
#include "core/kinds/zero_updates.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {
namespace {

// Which system's stage-3 offload a lowering prices (the header).
enum class Stage3Flavor { ZeroInfinity, ZeroOptOffload, FsdpOffload };

// Parameter elements of layer l (the profile's count; W+B over 4 bytes when it has none).
double elements(const Model& m, int l) {
  const auto& L = m.layers[static_cast<std::size_t>(l)];
  return L.param_count > 0 ? static_cast<double>(L.param_count)
                           : static_cast<double>(m.weight_bytes(l, l) + m.buffer_bytes(l, l)) / 4.0;
}

// Per iteration, on every GPU g (m = D/(N u) microbatches), for every layer l with parameters:
//   forward of microbatch i, l ascending: X (data, l = 0) | WB(l) of g's shard, ceil(W/N) + ceil(B/N),
//     from the host over PCIe | AG(l) on P2PIn (N > 1): the ring all-gather of the full W+B, waiting
//     for every rank's shard | FWD(l), which releases the gathered parameters | sa: sX out of the
//     stash X_l (1 <= l <= R-2), the data X_0 dropped and re-read
//   backward of microbatch i, l descending: WB(l) shard | AG(l) | sa: sX (or X) in | BWD(l) |
//     RS(l) on P2POut (N > 1): reduce-scatter of the layer's W+B gradient, waiting for every rank's
//     BWD(l) | dWB(l) out of g's gradient shard (the full gradient when N = 1), accumulated over
//     microbatches in a host buffer. ZeRO-3 keeps no full gradient on the GPU, so this happens every microbatch.
//   Update(l) (CPU Adam) after the backward pass: every GPU's last dWB. The reference prices Update
//   by whole layers, so layer l's update runs on the CPU of rank l mod N: the N processes share the
//   same total optimizer work ZeRO spreads over them by shards.
// Native-model extras (the reference ignores them): ZeRO-3's overheads (plan.knobs.zero3) put module_latency per module
// it gathers (Layer::gathered_modules) plus tensor_latency per parameter tensor (Layer::param_tensors) on every
// FWD and BWD of a layer with parameters, and grad_tensor_latency per parameter tensor on every BWD (zero3_hooks.hpp);
// each WB is max(ceil(elements / bucket), tensors) transfers (DeepSpeed copies each parameter's partition to the GPU by
// itself: partition_parameters.py NoGatherCoalescedHandle / all_gather_coalesced, commit 38327e07), each AG
// ceil(elements / bucket), and each dWB one transfer per tensor (stage3.py partition_grads copies each parameter's
// gradient to the host by itself). With offload: nvme the WB first reads g's shard from NVMe, and Update(l) reads the
// layer's optimizer state and FP32 masters from NVMe and writes them back (plus the GPU-dtype parameters when they are
// not FP32: the next fetch reads those). The gradient path and the step's host passes, as DeepSpeed's stage 3 runs them
// with offload_optimizer (deepspeed/runtime/zero/stage3.py at commit 38327e07; docs/baselines.md "ZeRO-3 overheads"):
//   - every dWB copies g's GPU-dtype shard into the pinned host gradient buffer and back to the GPU (partition_grads,
//     lines 1481-1496: `grad_buffer.copy_(grad_partition)` then `.to(device)`; from the second microbatch on the
//     buffer goes up first, is added to on the GPU ("adding directly to cpu is very slow") and comes back down): a
//     return of the shard's bytes host -> GPU, and no host sum;
//   - the last microbatch's dWB also sends the FP32 gradient (line 1515: `fp32_grad_tensor.copy_(grad_buffer
//     .float())`), 4 bytes per parameter of the shard; under offload: nvme those are swapped out to the drives
//     (lines 1505-1526, swap_out_gradients) and read back by the Update (_optimizer_states_and_gradient_swap_in);
//   - Update(l), besides CPU Adam, passes over host memory: unscale_and_clip_grads (lines 2178-2187: `mul_` of the
//     FP32 gradient, 8 bytes read and written per parameter) and _reassign_or_swap_out_partitioned_parameters
//     (lines 2069-2076: the GPU-dtype partition `copy_` of the FP32 masters, 4 bytes read and 2 written per
//     parameter, 4 and 4 when FP32).
// zero3-opt-offload (DeepSpeed stage 3 with offload_optimizer and no offload_param; stage3.py at 38327e07): every
// GPU keeps its shard of every layer's parameters in its own memory (an OptState tensor of ceil(W/N) + ceil(B/N),
// allocated by layer l's first FWD, never freed; the whole layer when N = 1), so there is no WB before a gather: the
// AG(l) reads the resident shards (nothing at all when N = 1) and is windowed and joined like fsdp's. The gradient path
// (RS, the dWB of the shard into the pinned host buffer and back, the FP32 copy at the boundary, NVMe swaps) and the
// CPU Adam are zero-infinity's; after Update(l), every GPU's WB(l) copies its updated GPU-dtype shard up
// (_reassign_or_swap_out_partitioned_parameters: the fp16 partition on the GPU `copy_` of the FP32 master on the host),
// one flat transfer; the host pass of the update keeps its reads, and its GPU-dtype write crosses PCIe instead.
// fsdp-offload (torch/distributed/fsdp at 2.5: _runtime_utils.py _unshard / _post_backward_hook, _flat_param.py): the
// zero-infinity Program with each layer one FSDP unit of one flat parameter, so none of DeepSpeed's stage-3 work: no
// hook, module or per-tensor latency (plan.zero3 is not read), one transfer per WB, AG and dWB (the flat shard, pinned:
// `_local_shard.to(device, non_blocking=True)` up, `_cpu_grad.copy_(..., non_blocking=True)` down); the shard crosses
// in the optimizer's parameter dtype (FP32 under mixed precision with FP32 masters: the transfer's extra bytes, cast on
// the GPU; the GPU dtype in pure 2-byte training); no return of the gradient to the GPU, no FP32 copy at the boundary
// and no host passes: the optimizer steps the flat CPU shard in place (its rate: model.analytic.cpu_optimizer).
// ASSUMED: a later microbatch's gradient shard is added into the host's on the CPU (the host sum), as FSDP does not
// keep it on the GPU under CPU offload. Activations never leave the GPU (FSDP has no activation offload).
// Parameters and gradients are always streamed (the defining trait); activations follow decide_swaps
// (ZeRO-Infinity's activation offload); plan.knobs.activation_policy decides between recomputing each layer
// (checkpoint: REC before BWD, as DeepSpeed's activation checkpointing) and keeping its saved activations.
// Buffers (B) are partitioned with the weights. Swap volume per iteration (all GPUs, GW = W + B):
//   WB = 2 N m sum_l shard(GW_l) (= 2 m GW when N divides every layer's W and B); AG = 2 N m GW;
//   RS = N m GW; dWB = N m sum_l shard(GW_l); sX and X as in dp-swap.
// The phases above, in that order, as members over the lowering's shared state (lower_zero_infinity calls them).
struct ZeroInfinityLowering {
  const Plan& plan;
  const Model& model;
  detail::ProgramBuilder b;
  int R, N, u, m;
  bool sa;                    // activations swapped (decide_swaps)
  bool nvme;                  // offload: nvme
  bool params_on_gpu;         // zero3-opt-offload: every GPU keeps its parameter shard
  bool fsdp;                  // fsdp-offload: one flat parameter per layer, none of stage 3's work
  std::vector<int> last_out;  // per GPU, its last dWB: the updates wait for every rank's

  ZeroInfinityLowering(const Plan& plan_, const Model& model_, const SwapDecision& sd, Stage3Flavor flavor)
      : plan(plan_),
        model(model_),
        b(model_, plan_),
        R(model_.num_layers()),
        N(plan_.gpus),
        u(plan_.u_bwd),
        m(plan_.minibatch / plan_.gpus / plan_.u_bwd),
        sa(sd.activations),
        nvme(plan_.knobs.offload == OffloadTier::Nvme),
        params_on_gpu(flavor == Stage3Flavor::ZeroOptOffload),
        fsdp(flavor == Stage3Flavor::FsdpOffload),
        last_out(static_cast<std::size_t>(plan_.gpus), -1) {}

  int buckets(int l) const {
    if (fsdp) return 1;
    const double e = elements(model, l);
    return std::max(1, static_cast<int>(std::ceil(e / std::max(1.0, plan.knobs.zero3.bucket_elements))));
  }
  int tensors(int l) const { return fsdp ? 1 : model.layers[static_cast<std::size_t>(l)].param_tensors_or_default(); }
  // the host-side stage-3 work before a FWD (backward: true, before a BWD) of layer l (the optimizer is offloaded)
  void charge_module(int op, int l, bool backward) {
    if (fsdp) return;
    b.set_overhead(op, detail::zero3_hook_seconds(plan.knobs.zero3, model.layers[static_cast<std::size_t>(l)], backward,
                                                  /*optimizer_offloaded=*/true));
  }

  // Gathers layer l's parameters for step k of GPU g; returns the op the compute waits for (-1: none, the whole layer
  // is resident).
  int gather(int g, int l, int i, int task, int pass, int k) {
    const LayerRange L{l, l};
    if (params_on_gpu) return gather_resident(g, l, i, task, pass, k);
    const Bytes w = b.wbytes(l);
    const Bytes bb = b.bbytes(l);
    const Bytes sw = shard_bytes(w, N);
    const Bytes sb = shard_bytes(bb, N);
    const int W = b.fetch_weights(g, l, task, i, k, sw, sb, /*windowed=*/true);
    b.set_io(W, std::max(buckets(l), tensors(l)), nvme ? sw + sb : 0, 0);
    if (fsdp) b.set_gradient_path(W, 0, detail::wide_shard_extra_bytes(model, l, N));
    if (N == 1) return W;
    const int A = b.weight_op(g, Stream::P2PIn, OpKind::AG, task, i, L, w, bb);
    b.set_io(A, buckets(l), 0, 0);
    b.dep(A, W);
    b.window(A, g, k);
    b.collective(layer_collective_key(pass, l, i), A, W);
    b.free(A, TensorKind::Weights, L, -1, sw + sb);
    b.alloc(A, TensorKind::Weights, L, -1, w + bb);
    return A;
  }

  // zero3-opt-offload's AG of layer l from the GPUs' resident shards (N > 1), windowed like fsdp's: the members start
  // together, each waiting for the compute step the others' gathers are windowed to.
  int gather_resident(int g, int l, int i, int task, int pass, int k) {
    if (N == 1) return -1;
    const int A = b.gather_resident(g, l, task, i, k, layer_collective_key(pass, l, i));
    b.set_io(A, buckets(l), 0, 0);
    return A;
  }
  // Whether the compute of layer l frees gathered parameters (not when a single GPU keeps the whole layer).
  bool gathered(int l) const { return b.has_params(l) && (!params_on_gpu || N > 1); }

  // Microbatch i's forward on GPU g, layers ascending: X (l = 0), each layer's parameters gathered, FWD.
  void forward(int g, int i) {
    for (int l = 0; l < R; ++l) {
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (l == 0) {
        const int X = b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation);
        ins.push_back(X);
      }
      if (b.has_params(l)) {
        if (const int A = gather(g, l, i, b.fwd_task(g, l), 0, k); A >= 0) ins.push_back(A);
      }
      const int F = b.forward_layer(g, l, i, u, k, sa, ins, /*free_weights=*/gathered(l));
      if (!b.has_params(l)) continue;
      charge_module(F, l, /*backward=*/false);
      if (params_on_gpu && i == 0)
        b.alloc(F, TensorKind::OptState, LayerRange{l, l}, -1,
                shard_bytes(b.wbytes(l), N) + shard_bytes(b.bbytes(l), N));
    }
  }

  // Microbatch i's backward on GPU g, layers descending: the parameters gathered again, BWD, the gradients out.
  void backward(int g, int i) {
    for (int l = R - 1; l >= 0; --l) {
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (b.has_params(l)) {
        if (const int A = gather(g, l, i, b.bwd_task(g, l), 1, k); A >= 0) ins.push_back(A);
      }
      const int Bw = b.backward_layer(g, l, i, u, k, sa, ins);
      if (!b.has_params(l)) continue;
      charge_module(Bw, l, /*backward=*/true);
      gradients_out(g, l, i, k, Bw);
    }
  }

  // Layer l's gradients of microbatch i out of GPU g after its BWD (Bw, step k): RS (N > 1), then dWB of g's shard.
  void gradients_out(int g, int l, int i, int k, int Bw) {
    const LayerRange L{l, l};
    if (gathered(l)) b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
    b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
    const Bytes gw = shard_bytes(b.wbytes(l), N);
    int src = Bw;
    if (N > 1) {
      src = b.weight_op(g, Stream::P2POut, OpKind::RS, b.bwd_task(g, l), i, L, b.wbytes(l), b.bbytes(l));
      b.dep(src, Bw);
      b.collective(layer_collective_key(2, l, i), src, Bw);
      b.free(src, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      b.alloc(src, TensorKind::WeightGrad, L, -1, gw);
      b.output_of(src, g, k);
    }
    const Bytes sw = shard_bytes(b.wbytes(l), N);
    const Bytes sb = shard_bytes(b.bbytes(l), N);
    const int O = b.weight_op(g, Stream::SwapOut, OpKind::dWB, b.bwd_task(g, l), i, L, sw, sb);
    b.dep(O, src);
    if (fsdp) {  // the flat gradient shard into the host's, in the optimizer's dtype; later microbatches add on the CPU
      b.set_gradient_path(O, 0, detail::wide_shard_extra_bytes(model, l, N));
      if (i > 0) b.set_host_sum(O, shard_bytes(model.optimizer_param_bytes(l), N));
    } else {  // the shard into the pinned buffer and back (summed on the GPU); at the boundary its FP32 copy out
      const Bytes fp32 = i == m - 1 ? shard_bytes(model.optimizer_param_bytes(l), N) : 0;
      b.set_io(O, tensors(l), 0, nvme ? fp32 : 0);
      b.set_gradient_path(O, sw + sb, fp32);
    }
    b.free(O, TensorKind::WeightGrad, L, -1, gw);
    b.output_of(O, g, k);
    last_out[static_cast<std::size_t>(g)] = O;
  }

  // CPU Adam after the backward pass of every rank
  void updates() {
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const int U = detail::zero_cpu_update(b, l, N, last_out);
      const Bytes fp32 = model.optimizer_param_bytes(l);
      const Bytes state = model.optimizer_state_bytes(l, l) + model.master_bytes(l, l);
      if (nvme && params_on_gpu) {
        // the optimizer state and FP32 masters in and out, the FP32 gradients in; the GPU-dtype parameters stay on the
        // GPUs, so none of them is written to NVMe (stage3.py 957-976 writes them only under offload_param: nvme)
        b.set_io(U, 1, state + fp32, state);
      } else if (nvme) {
        b.nvme_update_io(U, l, fp32);  // the FP32 gradients the backward swapped out
      }
      // plan.zero3.pipeline_read / pipeline_write: the optimizer swapper's read (state, masters and gradients: one aio
      // batch) and its write of the state and masters overlap the step; the GPU-dtype parameters' write (zero-infinity
      // on narrow weights) is the parameter swapper's, after the step, and stays in series
      const auto& z = plan.knobs.zero3;
      if (nvme && (z.pipeline_read || z.pipeline_write))
        b.set_io_overlap(U, z.pipeline_read ? state + fp32 : 0, z.pipeline_write ? state : 0);
      // unscale (read and write the FP32 gradient), then the GPU-dtype copy of the masters (read 4, write 2 or 4: to
      // host memory, or over PCIe into the GPUs' resident shards)
      const Bytes gpu_dtype = model.narrow_weights(l) ? fp32 / 2 : fp32;
      if (!fsdp) b.set_host_pass(U, 2 * fp32 + fp32 + (params_on_gpu ? 0 : gpu_dtype));
      if (params_on_gpu) shards_up(U, l);
    }
  }

  // zero3-opt-offload: every GPU's updated shard of layer l up after the update U (one flat copy each).
  void shards_up(int U, int l) {
    const LayerRange L{l, l};
    const Bytes sw = shard_bytes(b.wbytes(l), N);
    const Bytes sb = shard_bytes(b.bbytes(l), N);
    for (int g = 0; g < N; ++g) {
      const int W = b.weight_op(g, Stream::SwapIn, OpKind::WB, b.upd_task(g, l), 0, L, sw, sb);
      b.dep(W, U);
    }
  }
};

Program lower_stage3(const Plan& plan, const Model& model, Stage3Flavor flavor) {
  const SwapDecision sd = decide_swaps(plan, model).front();
  ZeroInfinityLowering low(plan, model, sd, flavor);
  for (int g = 0; g < low.N; ++g) {
    for (int i = 0; i < low.m; ++i) {
      low.forward(g, i);
      low.backward(g, i);
    }
  }
  low.updates();
  Program prog = low.b.finish();
  prog.cost.offload_nvme = low.nvme;
  return prog;
}

Program lower_zero_infinity(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  return lower_stage3(plan, model, Stage3Flavor::ZeroInfinity);
}
Program lower_zero3_opt_offload(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  return lower_stage3(plan, model, Stage3Flavor::ZeroOptOffload);
}
Program lower_fsdp_offload(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  return lower_stage3(plan, model, Stage3Flavor::FsdpOffload);
}

const PlanKindSpec kSpec{
    .name = "zero-infinity",
    .description =
        "ZeRO stage 3: parameters, gradients and optimizer state partitioned and offloaded to host (or NVMe)",
    .listing_order = 50,
    .role = KindRole::Baseline,
    .color = "#8c564b",
    .data_parallel = true,
    .even_split = true,
    .offload_tiers = true,
    .knobs = {Knob::Activations, Knob::Offload, Knob::Zero3},
    .validate = validate_swapping_plan,
    .lower = lower_zero_infinity,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kRules{.stream_weights = true};

HARMONY_REGISTER_SWAPPING_KIND(kSpec, kRules);

const PlanKindSpec kOptOffloadSpec{
    .name = "zero3-opt-offload",
    .description =
        "ZeRO stage 3 with only the optimizer offloaded: parameter shards on the GPUs, gathered per layer; gradients "
        "and optimizer state on the host (or NVMe), CPU Adam",
    .listing_order = 52,
    .role = KindRole::Baseline,
    .color = "#c49c94",
    .data_parallel = true,
    .even_split = true,
    .offload_tiers = true,
    .trains = true,
    .knobs = {Knob::Activations, Knob::Offload, Knob::Zero3},
    .validate = validate_swapping_plan,
    .lower = lower_zero3_opt_offload,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kOptOffloadRules{.stream_weights = true, .resident_param_shards = true};

[[maybe_unused]] const bool zero3_opt_offload_registered = register_swapping_kind(kOptOffloadSpec, kOptOffloadRules);

const PlanKindSpec kFsdpOffloadSpec{
    .name = "fsdp-offload",
    .description =
        "PyTorch FSDP with CPUOffload(offload_params=True): flat parameter shards on the host, fetched "
        "and gathered per layer, gradient shards to the host, the optimizer on the CPU",
    .listing_order = 53,
    .role = KindRole::Baseline,
    .color = "#9edae5",
    .data_parallel = true,
    .even_split = true,
    .trains = true,
    .knobs = {Knob::Activations},
    .validate = validate_swapping_plan,
    .lower = lower_fsdp_offload,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kFsdpOffloadRules{.stream_weights = true, .keep_activations = true};

[[maybe_unused]] const bool fsdp_offload_registered = register_swapping_kind(kFsdpOffloadSpec, kFsdpOffloadRules);

}  // namespace
}  // namespace harmony::core
