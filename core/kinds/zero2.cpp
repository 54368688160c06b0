// zero2: data parallelism with the gradients and optimizer state partitioned over the GPUs (DeepSpeed ZeRO stage 2
// without offload; ZeRO-1 and PyTorch's ZeroRedundancyOptimizer partition only the optimizer state). Every GPU keeps
// the whole model's weights, runs its share of the minibatch, reduce-scatters each layer's gradient into its partition,
// steps AdamW on its partition on the GPU and all-gathers the updated weights. harmony-sim prices it; harmony-run
// trains it (the executor's ShardState with whole weights: backend/executor/flow_shard.hpp).
#include <algorithm>

#include <fmt/format.h>

#include "core/kinds/fsdp.hpp"
#include "core/kinds/microbatch_sizes.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/search/search.hpp"

namespace harmony::core {
namespace {

// What one GPU keeps of layer l for the whole run: the whole weights and buffers, 1/N of the gradient and of the
// optimizer state.
Bytes state_bytes(const Model& model, int l, int N) {
  return model.weight_bytes(l, l) + model.buffer_bytes(l, l) + shard_bytes(model.weight_bytes(l, l), N) +
         shard_bytes(model.optimizer_state_bytes(l, l), N);
}

// One GPU's peak estimate at plan.u_bwd (the search's drop_infeasible): every layer's state_bytes, one microbatch's
// working memory (microbatch_working_bytes) and, with several GPUs, one layer's full gradient before its
// reduce-scatter.
Bytes estimate_bytes(const Plan& plan, const Model& model) {
  const int N = plan.gpus;
  Bytes state = 0, grad = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    state += state_bytes(model, l, N);
    grad = std::max(grad, model.weight_bytes(l, l));
  }
  return state + microbatch_working_bytes(plan, model) + (N > 1 ? grad : 0);
}

// Per iteration, on every GPU g (m = D/(N u) microbatches, layers l = 0..R-1):
//   FWD(l, i = 0) allocates layer l's persistent state (the whole W+B, ceil(W/N) of gradient partition and
//   ceil(state/N) of AdamW state and masters), never freed.
//   for each microbatch i: X (data) | FWD(l) ascending | [REC(l) under checkpoint] BWD(l) descending, which allocates
//   the layer's full gradient | RS(l) on P2POut (N > 1): the gradient reduce-scattered into the rank's partition
//   (DeepSpeed stage 2 reduces every micro-step's gradient as the backward produces it), freeing it.
//   Update(l), l descending, on the compute stream after the whole backward: AdamW on the GPU over the rank's
//   partition, its `bytes` the HBM traffic (28 per parameter of the partition) | AG(l) on P2PIn (N > 1): the updated
//   weights all-gathered from the partitions into every GPU's whole copy (in place: nothing allocated).
// With one GPU there is nothing to reduce or gather: the state is resident's.
Program lower_zero2(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_microbatch_plan(plan, model);
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int N = plan.gpus;
  const int u = plan.u_bwd;
  const int m = plan.minibatch / N / u;
  for (int g = 0; g < N; ++g) {
    std::vector<int> last(static_cast<std::size_t>(R), -1);  // per layer: the op its Update follows
    for (int i = 0; i < m; ++i) {
      for (int l = 0; l < R; ++l) {
        const int F = b.forward_resident(g, l, i, u);
        if (i == 0) {
          const LayerRange L{l, l};
          b.alloc(F, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
          // the gradient partition with the optimizer state (one GPU: the whole gradient, kept, as resident's)
          b.alloc(F, TensorKind::OptState, L, -1,
                  (N > 1 ? shard_bytes(b.wbytes(l), N) : 0) + shard_bytes(model.optimizer_state_bytes(l, l), N));
          if (N == 1) b.alloc(F, TensorKind::WeightGrad, L, -1, b.wbytes(l));
        }
      }
      for (int l = R - 1; l >= 0; --l) {
        const int k = b.next_step(g);
        const int Bw = b.backward_layer(g, l, i, u, k, /*stash_activations=*/false, {});
        last[static_cast<std::size_t>(l)] = Bw;
        if (N == 1 || !b.has_params(l)) continue;
        last[static_cast<std::size_t>(l)] = reduce_scatter_gradient(b, g, l, i, k, Bw);
      }
    }
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const LayerRange L{l, l};
      const int U = b.compute(g, OpKind::Update, b.upd_task(g, l), 0, L, 0);
      b.dep(U, last[static_cast<std::size_t>(l)]);
      if (N == 1) continue;
      const int A = b.weight_op(g, Stream::P2PIn, OpKind::AG, b.upd_task(g, l), 0, L, b.wbytes(l), b.bbytes(l));
      b.dep(A, U);
      b.collective(layer_collective_key(3, l, 0), A, U);
    }
  }
  Program prog = b.finish();
  price_device_adamw(prog, model, N);
  return prog;
}

// Per activation policy, ascending u; with space.drop_infeasible only the plans whose estimate (estimate_bytes) fits.
std::vector<Candidate> enumerate_zero2(const Model& model, const SearchSpace& space) {
  return enumerate_microbatch_plans(model, space, estimate_bytes);
}

std::string describe_zero2(const Plan& p, const Model& model) {
  Bytes state = 0;
  for (int l = 0; l < model.num_layers(); ++l) state += state_bytes(model, l, p.gpus);
  return fmt::format(
      "zero2 N{} D{} u {} (weights on every GPU, gradients and AdamW state partitioned: {} on each; gradients "
      "reduce-scattered, updated weights all-gathered; {})",
      p.gpus, p.minibatch, p.u_bwd, format_bytes(state), activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "zero2",
    .description =
        "data parallel with gradients and optimizer state partitioned over the GPUs (DeepSpeed ZeRO-2 without "
        "offload): reduce-scatter, AdamW on each GPU's partition, all-gather of the updated weights",
    .listing_order = 84,
    .role = KindRole::Baseline,
    .color = "#9edae5",
    .data_parallel = true,
    .even_split = true,
    .resident_state = true,
    .trains = true,
    .knobs = {Knob::Activations},
    .validate = validate_microbatch_plan,
    .lower = lower_zero2,
    .enumerate = enumerate_zero2,
    .describe = describe_zero2,
};

HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
