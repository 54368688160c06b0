// fsdp: fully sharded data parallelism with the state on the GPUs (PyTorch FSDP FULL_SHARD, Colossal-AI Gemini with
// cuda placement; DeepSpeed ZeRO-3 without offload is the zero3 kind: this Program plus stage 3's hook work). Each GPU
// keeps 1/N of every layer's parameters, gradient and AdamW state; a layer's parameters are all-gathered before each
// forward and each backward, its gradient is reduce-scattered after each backward, and every GPU steps AdamW on its own
// shard on the GPU. Nothing crosses the host link but data.
#include <algorithm>

#include <fmt/format.h>

#include "core/kinds/fsdp.hpp"
#include "core/kinds/microbatch_sizes.hpp"
#include "core/kinds/zero3_hooks.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/search/search.hpp"

namespace harmony::core {

Bytes sharded_estimate_bytes(const Plan& p, const Model& m) {
  return device_state_estimate_bytes(p, m, /*sharded=*/true);
}

std::vector<Candidate> enumerate_sharded(const Model& model, const SearchSpace& space) {
  return enumerate_microbatch_plans(model, space, sharded_estimate_bytes);
}

Bytes sharded_state_bytes(const Plan& plan, const Model& model) {
  Bytes state = 0;
  for (int l = 0; l < model.num_layers(); ++l) state += device_state_bytes(model, l, plan.gpus);
  return state;
}

int reduce_scatter_gradient(detail::ProgramBuilder& b, int g, int l, int i, int k, int after) {
  const LayerRange L{l, l};
  b.alloc(after, TensorKind::WeightGrad, L, -1, b.wbytes(l));
  const int S = b.weight_op(g, Stream::P2POut, OpKind::RS, b.bwd_task(g, l), i, L, b.wbytes(l), b.bbytes(l));
  b.dep(S, after);
  b.collective(layer_collective_key(2, l, i), S, after);
  b.free(S, TensorKind::WeightGrad, L, -1, b.wbytes(l));
  b.output_of(S, g, k);
  return S;
}

namespace {

// Per iteration, on every GPU g (m = D/(N u) microbatches, layers l = 0..R-1):
//   FWD(l, i = 0) allocates layer l's persistent shard (OptState: W+B, gradient and AdamW state, each ceil(bytes / N)),
//   never freed.
//   for each microbatch i, l ascending: X (data, l = 0) | AG(l) on P2PIn (N > 1): the ring all-gather of the full W+B,
//   prefetched at most two compute steps ahead (FSDP's forward prefetch, DeepSpeed's prefetch bucket), the members
//   waiting for each other | FWD(l), which frees the gathered parameters.
//   l descending: AG(l) again | [REC(l) under checkpoint] BWD(l), which allocates the full gradient and frees the
//   gathered parameters | RS(l) on P2POut (N > 1): the reduce-scatter of the gradient into the rank's shard (added to
//   the persistent shard: FSDP and ZeRO-3 reduce every microbatch's gradient; neither keeps a full one), freeing it.
//   Update(l), l descending, on the compute stream after the whole backward: AdamW on the GPU over the rank's shard,
//   its `bytes` the HBM traffic (28 per parameter of the shard).
// With one GPU there is nothing to gather or reduce: the parameters and the gradient stay whole in the state, as
// resident's. With stage3_hooks (the zero3 kind) every FWD and BWD of a layer with parameters also carries DeepSpeed
// stage 3's hook work (zero3_hooks.hpp, the optimizer on the GPUs), with any number of GPUs.
}  // namespace

Program lower_sharded(const Plan& plan, const Model& model, bool stage3_hooks) {
  validate_microbatch_plan(plan, model);
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int N = plan.gpus;
  const int u = plan.u_bwd;
  const int m = plan.minibatch / N / u;
  // The all-gather of layer l for step k of GPU g (pass 0 forward, 1 backward); -1 with one GPU.
  auto gather = [&](int g, int l, int i, int task, int pass, int k) {
    if (N == 1 || !b.has_params(l)) return -1;
    return b.gather_resident(g, l, task, i, k, layer_collective_key(pass, l, i));
  };
  // stage 3's hooks before op (a FWD or BWD of layer l)
  auto charge = [&](int op, int l, bool backward) {
    if (!stage3_hooks || !b.has_params(l)) return;
    b.set_overhead(op, detail::zero3_hook_seconds(plan.knobs.zero3, model.layers[static_cast<std::size_t>(l)], backward,
                                                  /*optimizer_offloaded=*/false));
  };
  for (int g = 0; g < N; ++g) {
    std::vector<int> last(static_cast<std::size_t>(R), -1);  // per layer: the op its Update follows
    for (int i = 0; i < m; ++i) {
      for (int l = 0; l < R; ++l) {
        const int k = b.next_step(g);
        std::vector<int> ins;
        if (l == 0)
          ins.push_back(b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation));
        if (const int A = gather(g, l, i, b.fwd_task(g, l), 0, k); A >= 0) ins.push_back(A);
        const int F = b.forward_layer(g, l, i, u, k, /*stash_activations=*/false, ins, /*free_weights=*/N > 1);
        charge(F, l, /*backward=*/false);
        if (i == 0) b.alloc(F, TensorKind::OptState, LayerRange{l, l}, -1, device_state_bytes(model, l, N));
      }
      for (int l = R - 1; l >= 0; --l) {
        const LayerRange L{l, l};
        const int k = b.next_step(g);
        std::vector<int> ins;
        if (const int A = gather(g, l, i, b.bwd_task(g, l), 1, k); A >= 0) ins.push_back(A);
        const int Bw = b.backward_layer(g, l, i, u, k, /*stash_activations=*/false, ins);
        charge(Bw, l, /*backward=*/true);
        last[static_cast<std::size_t>(l)] = Bw;
        if (N == 1 || !b.has_params(l)) continue;
        b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
        last[static_cast<std::size_t>(l)] = reduce_scatter_gradient(b, g, l, i, k, Bw);
      }
    }
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const int U = b.compute(g, OpKind::Update, b.upd_task(g, l), 0, LayerRange{l, l}, 0);
      b.dep(U, last[static_cast<std::size_t>(l)]);
    }
  }
  Program prog = b.finish();
  price_device_adamw(prog, model, N);
  return prog;
}

namespace {

Program lower_fsdp(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  return lower_sharded(plan, model, /*stage3_hooks=*/false);
}

std::string describe_fsdp(const Plan& p, const Model& model) {
  return fmt::format(
      "fsdp N{} D{} u {} (weights, gradients and AdamW state sharded over the GPUs: {} on each; layers all-gathered "
      "for forward and backward, gradients reduce-scattered; {})",
      p.gpus, p.minibatch, p.u_bwd, format_bytes(sharded_state_bytes(p, model)),
      activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "fsdp",
    .description =
        "fully sharded data parallel on the GPUs (PyTorch FSDP, Colossal-AI Gemini on cuda): all-gather per "
        "layer, reduce-scatter, AdamW on each GPU's shard",
    .listing_order = 85,
    .role = KindRole::Baseline,
    .color = "#17becf",
    .data_parallel = true,
    .even_split = true,
    .resident_state = true,
    .trains = true,
    .knobs = {Knob::Activations},
    .validate = validate_microbatch_plan,
    .lower = lower_fsdp,
    .enumerate = enumerate_sharded,
    .describe = describe_fsdp,
};

HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
