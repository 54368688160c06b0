// resident: the in-memory trainer a user would otherwise run (PyTorch DDP with AdamW on the GPU), and the ceiling
// Harmony is measured against. Every GPU holds the whole model's weights, gradients and AdamW state (and, in bf16,
// the fp32 masters) for the whole run, runs its share of the minibatch microbatch by microbatch, all-reduces the
// gradients with the other replicas and updates its own copy on the GPU: nothing crosses the host link but the data.
#include <algorithm>

#include <fmt/format.h>

#include "core/kinds/microbatch_sizes.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/search/search.hpp"

namespace harmony::core {
namespace {

// One GPU's peak estimate (microbatch_sizes.hpp): the whole state on every GPU.
Bytes estimate_bytes(const Plan& p, const Model& m) { return device_state_estimate_bytes(p, m, /*sharded=*/false); }

// Per iteration, on every GPU g (m = D/(N u) microbatches, layers l = 0..R-1), all on the compute stream but the data:
//   FWD(l, i = 0) allocates layer l's resident state (W+B, dW, AdamW moments, masters), never freed: it lives on the
//   GPU from the first step to the last.
//   for each microbatch i: X (data) | FWD(l) ascending | [REC(l) under checkpoint] BWD(l) descending, each BWD adding
//   into the layer's gradient; inputs (and, under keep, saved activations) stay on the GPU.
//   after the last microbatch's BWD(l): ARD(l) with the other replicas when N > 1 (in place, on the GPU).
//   Update(l), l descending, on the compute stream after the whole backward (optimizer.step()): AdamW on the GPU,
//   its `bytes` the HBM traffic it reads and writes (28 per parameter).
Program lower_resident(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_microbatch_plan(plan, model);
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int N = plan.gpus;
  const int u = plan.u_bwd;
  const int m = plan.minibatch / N / u;
  for (int g = 0; g < N; ++g) {
    std::vector<int> last(static_cast<std::size_t>(R), -1);  // per layer: the op the Update follows
    for (int i = 0; i < m; ++i) {
      for (int l = 0; l < R; ++l) {
        const int F = b.forward_resident(g, l, i, u);
        if (i == 0) {
          const LayerRange L{l, l};
          b.alloc(F, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
          b.alloc(F, TensorKind::WeightGrad, L, -1, b.wbytes(l));
          b.alloc(F, TensorKind::OptState, L, -1, model.optimizer_state_bytes(l, l));
        }
      }
      for (int l = R - 1; l >= 0; --l) {
        const int k = b.next_step(g);
        const int Bw = b.backward_layer(g, l, i, u, k, /*stash_activations=*/false, {});
        last[static_cast<std::size_t>(l)] = Bw;
        if (i != m - 1 || N == 1 || !b.has_params(l)) continue;
        const int A = b.compute(g, OpKind::ARD, b.bwd_task(g, l), 0, LayerRange{l, l}, 0, b.wbytes(l), b.bbytes(l));
        b.dep(A, Bw);
        b.collective((static_cast<std::uint64_t>(l) << 32), A, Bw);
        last[static_cast<std::size_t>(l)] = A;
      }
    }
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const int U = b.compute(g, OpKind::Update, b.upd_task(g, l), 0, LayerRange{l, l}, 0);
      b.dep(U, last[static_cast<std::size_t>(l)]);
    }
  }
  Program prog = b.finish();
  price_device_adamw(prog, model, 1);
  return prog;
}

// Per activation policy, ascending u; with space.drop_infeasible only the plans whose estimate (estimate_bytes) fits.
std::vector<Candidate> enumerate_resident(const Model& model, const SearchSpace& space) {
  return enumerate_microbatch_plans(model, space, estimate_bytes);
}

std::string describe_resident(const Plan& p, const Model& model) {
  Bytes state = 0;
  for (int l = 0; l < model.num_layers(); ++l) state += device_state_bytes(model, l, 1);
  return fmt::format("resident N{} D{} u {} (weights, gradients and AdamW state on every GPU: {}; {})", p.gpus,
                     p.minibatch, p.u_bwd, format_bytes(state), activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "resident",
    .description = "the in-memory trainer: weights, gradients and AdamW state on every GPU, updated there (DDP)",
    .listing_order = 90,
    .role = KindRole::Ceiling,
    .color = "#7f7f7f",
    .data_parallel = true,
    .even_split = true,
    .resident_state = true,
    .knobs = {Knob::Activations},
    .validate = validate_microbatch_plan,
    .lower = lower_resident,
    .enumerate = enumerate_resident,
    .describe = describe_resident,
};

HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
