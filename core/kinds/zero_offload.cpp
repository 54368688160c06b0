// zero-offload: ZeRO stage 2 with the optimizer on the CPU (DeepSpeed ZeRO-Offload, offload_optimizer: cpu).
// Every GPU keeps the whole model's parameters in the GPU dtype for the whole step; gradients are reduce-scattered
// and each rank's FP32 shard goes to the host, where CPU Adam updates that rank's FP32 masters; the updated shard
// comes back up in FP32 and the ranks all-gather the parameters before the next forward.
#include <algorithm>

#include <fmt/format.h>

#include "core/kinds/microbatch_sizes.hpp"
#include "core/kinds/zero_updates.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/search/search.hpp"

namespace harmony::core {
namespace {

// One GPU's peak estimate: every layer's parameters in the GPU dtype, the gradients (every layer's when they
// accumulate over microbatches, else the largest one's), every layer's input for one microbatch (under keep also its
// saved activations), and the largest layer peak beyond its own parameters and input.
Bytes estimate_bytes(const Plan& p, const Model& m) {
  const int u = p.u_bwd;
  const bool keep = p.knobs.activation_policy == ActivationPolicy::Keep;
  const bool accumulate = p.minibatch / p.gpus / u > 1;
  Bytes params = 0, grads = 0, stash = 0, peak = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    params += m.weight_bytes(l, l) + m.buffer_bytes(l, l);
    grads = accumulate ? grads + m.weight_bytes(l, l) : std::max(grads, m.weight_bytes(l, l));
    stash += m.input_bytes(u, l) + (keep ? saved_activation_bytes(m, u, l) : 0);
    peak = std::max(peak, m.peak_beyond_own_bytes(u, l));
  }
  return params + grads + stash + std::max<Bytes>(0, peak);
}

// Per iteration, on every GPU g (m = D/(N u) microbatches; DeepSpeed's stage_1_and_2.py at commit 38327e07):
//   the parameters, before the first forward (the previous step's tail: step() copies each rank's updated FP32
//   partition to the GPU, `fp32_partition.to(device)`, lines 1880-1882, then all_gather_dp_groups, line 1930):
//   WB(l) of g's FP32 shard (the transfer's bytes; it lands as the GPU-dtype shard) | AG(l) (N > 1) of the
//   GPU-dtype parameters. FWD(0) waits for every layer's: step() returns after the gather.
//   for each microbatch i: X (data) | FWD(l) ascending | [REC(l)] BWD(l) descending; the parameters stay until the
//   last microbatch's BWD(l). After every microbatch's BWD(l) (reduce_ipg_grads runs in every backward:
//   stage 2 reduces every micro-step): RS(l) (N > 1) | dWB(l) of g's gradient shard S (copy_grads_in_partition).
//   With gradient accumulation (m > 1) the running sum lives in host memory in the GPU dtype and is summed on the
//   GPU (async_accumulate_grad_in_cpu_via_gpu): microbatch i > 0 first brings it up (the dWB's return, S bytes up)
//   and adds it in, and every microbatch but the last sends the sum down (the dWB's S bytes); the last, at the
//   accumulation boundary, sends it as FP32 instead (async_inplace_copy_grad_to_fp32_buffer_from_gpu, lines
//   1268-1284: `.float()` on the GPU, then the copy into the pinned FP32 buffer; 4 bytes per parameter of the
//   shard: the dWB's S plus the extra FP32 bytes). One microbatch: that FP32 copy alone. The gradient leaves the GPU
//   with every microbatch's dWB (zero_grad(set_to_none) ends every backward).
//   Update(l) (CPU Adam) after every rank's backward, on the CPU of rank l mod N (the N processes share the total
//   ZeRO spreads over them by shards, as zero-infinity), with one host pass: unscale_and_clip_grads over the FP32
//   gradient (lines 1865-1866, 8 bytes read and written per parameter). The narrowing to the GPU dtype runs on
//   the GPU after the upload.
// Activations stay on the GPU (DeepSpeed's cpu_checkpointing is off by default); plan.knobs.activation_policy picks
// recompute (checkpoint) or keep.
// Swap volume per iteration (all GPUs; S_l = shard_bytes(W_l + B_l), F_l = shard_bytes(FP32_l)): WB = N sum_l F_l;
// AG = N GW; RS = N m GW; dWB = N sum_l ((m - 1) S_l + F_l) down and N (m - 1) sum_l S_l back up (GW = W + B in the
// GPU dtype; with N = 1 no AG or RS and the shards are whole layers).
// The phases below are ZeroOffloadLowering's members, called in this order by lower_zero_offload.
struct ZeroOffloadLowering {
  const Model& model;
  detail::ProgramBuilder b;
  int R, N, u, m;
  std::vector<int> last_out;  // per GPU, its last gradient transfer (dWB): the updates wait for every rank's

  ZeroOffloadLowering(const Plan& plan, const Model& model_)
      : model(model_),
        b(model_, plan),
        R(model_.num_layers()),
        N(plan.gpus),
        u(plan.u_bwd),
        m(plan.minibatch / plan.gpus / plan.u_bwd),
        last_out(static_cast<std::size_t>(plan.gpus), -1) {}

  // a collective's key: the pass (0 the parameters' all-gather, 2 the gradients' reduce-scatter), the microbatch and
  // the layer
  static std::uint64_t key(int pass, int l, int i = 0) {
    return (static_cast<std::uint64_t>(pass) << 60) | (static_cast<std::uint64_t>(i) << 32) |
           static_cast<std::uint64_t>(l);
  }

  // The parameters up on GPU g, every layer before the first forward: WB of the FP32 shard, then AG (N > 1).
  // Returns per layer the op its parameters are ready after (-1: a layer without parameters).
  std::vector<int> parameters_up(int g) {
    std::vector<int> ready(static_cast<std::size_t>(R), -1);
    for (int l = 0; l < R; ++l) {
      if (!b.has_params(l)) continue;
      const LayerRange L{l, l};
      const Bytes w = b.wbytes(l), bb = b.bbytes(l);
      const Bytes sw = shard_bytes(w, N), sb = shard_bytes(bb, N);
      const int W = b.weight_op(g, Stream::SwapIn, OpKind::WB, b.fwd_task(g, l), 0, L, sw, sb);
      b.alloc(W, TensorKind::Weights, L, -1, sw + sb);
      // the FP32 shard crosses the link; it is narrowed on the GPU (the transfer's extra bytes)
      b.set_gradient_path(W, 0, detail::wide_shard_extra_bytes(model, l, N));
      ready[static_cast<std::size_t>(l)] = W;
      if (N == 1) continue;
      const int A = b.weight_op(g, Stream::P2PIn, OpKind::AG, b.fwd_task(g, l), 0, L, w, bb);
      b.dep(A, W);
      b.collective(key(0, l), A, W);
      b.free(A, TensorKind::Weights, L, -1, sw + sb);
      b.alloc(A, TensorKind::Weights, L, -1, w + bb);
      ready[static_cast<std::size_t>(l)] = A;
    }
    return ready;
  }

  // Microbatch i's forward on GPU g, layers ascending; the first microbatch's FWD(0) waits for every layer's
  // parameters (step() returns after the gather), a later layer's first FWD for its own.
  void forward(int g, int i, const std::vector<int>& ready) {
    for (int l = 0; l < R; ++l) {
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (l == 0) {
        ins.push_back(b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation));
        if (i == 0)
          for (const int r : ready)
            if (r >= 0) ins.push_back(r);
      } else if (i == 0 && ready[static_cast<std::size_t>(l)] >= 0) {
        ins.push_back(ready[static_cast<std::size_t>(l)]);
      }
      b.forward_layer(g, l, i, u, k, /*stash_activations=*/false, ins, /*free_weights=*/false);
    }
  }

  // Microbatch i's backward on GPU g, layers descending; after each BWD(l) the gradient goes out (gradients_out).
  void backward(int g, int i) {
    for (int l = R - 1; l >= 0; --l) {
      const int k = b.next_step(g);
      const int Bw = b.backward_layer(g, l, i, u, k, /*stash_activations=*/false, {});
      if (!b.has_params(l)) continue;
      b.alloc(Bw, TensorKind::WeightGrad, LayerRange{l, l}, -1, b.wbytes(l));
      gradients_out(g, l, i, k, Bw);
    }
  }

  // Layer l's gradient of microbatch i out of GPU g after its BWD (Bw, step k): RS (N > 1), then dWB of g's shard:
  // the running sum brought up first (i > 0) and sent down in the GPU dtype, or, at the boundary (the last
  // microbatch), as FP32. The last microbatch also frees the parameters.
  void gradients_out(int g, int l, int i, int k, int Bw) {
    const LayerRange L{l, l};
    const Bytes w = b.wbytes(l), bb = b.bbytes(l);
    if (i == m - 1) b.free(Bw, TensorKind::Weights, L, -1, w + bb);
    const Bytes sw = shard_bytes(w, N), sb = shard_bytes(bb, N);
    int src = Bw;
    if (N > 1) {
      src = b.weight_op(g, Stream::P2POut, OpKind::RS, b.bwd_task(g, l), i, L, w, bb);
      b.dep(src, Bw);
      b.collective(key(2, l, i), src, Bw);
      b.free(src, TensorKind::WeightGrad, L, -1, w);
      b.alloc(src, TensorKind::WeightGrad, L, -1, sw);
      b.output_of(src, g, k);
    }
    const int O = b.weight_op(g, Stream::SwapOut, OpKind::dWB, b.bwd_task(g, l), i, L, sw, sb);
    b.dep(O, src);
    b.set_gradient_path(O, i > 0 ? sw + sb : 0, i == m - 1 ? detail::wide_shard_extra_bytes(model, l, N) : 0);
    b.free(O, TensorKind::WeightGrad, L, -1, sw);
    b.output_of(O, g, k);
    if (i == m - 1) last_out[static_cast<std::size_t>(g)] = O;
  }

  // CPU Adam after the backward pass of every rank, with the unscale pass over the FP32 gradient
  void updates() {
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const int U = detail::zero_cpu_update(b, l, N, last_out);
      b.set_host_pass(U, 2 * model.optimizer_param_bytes(l));
    }
  }
};

Program lower_zero_offload(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_microbatch_plan(plan, model);
  ZeroOffloadLowering low(plan, model);
  for (int g = 0; g < low.N; ++g) {
    const std::vector<int> ready = low.parameters_up(g);
    for (int i = 0; i < low.m; ++i) {
      low.forward(g, i, ready);
      low.backward(g, i);
    }
  }
  low.updates();
  return low.b.finish();
}

// Per activation policy, ascending u; with space.drop_infeasible only the plans whose estimate (estimate_bytes) fits.
std::vector<Candidate> enumerate_zero_offload(const Model& model, const SearchSpace& space) {
  return enumerate_microbatch_plans(model, space, estimate_bytes);
}

std::string describe_zero_offload(const Plan& p, const Model& /*model*/) {
  return fmt::format("zero-offload N{} D{} u {} (parameters on every GPU, optimizer on the CPU, {})", p.gpus,
                     p.minibatch, p.u_bwd, activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "zero-offload",
    .description = "ZeRO stage 2 with CPU Adam: parameters on every GPU, gradients sharded to the host, updated there",
    .listing_order = 55,
    .role = KindRole::Baseline,
    .color = "#bcbd22",
    .data_parallel = true,
    .even_split = true,
    .knobs = {Knob::Activations},
    .validate = validate_microbatch_plan,
    .lower = lower_zero_offload,
    .enumerate = enumerate_zero_offload,
    .describe = describe_zero_offload,
};

// Not a swapping kind: its parameters never stream and its activations never leave the GPU (no decide_swaps).
HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
