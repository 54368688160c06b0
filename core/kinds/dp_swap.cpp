// dp-swap: data parallelism over virtualized GPU memory (vDNN, IBM Large Model Support, CUDA unified
// memory). Each of the N GPUs runs the whole model on D/N samples, microbatch by microbatch, swapping
// each layer's weights in on demand and activations out and in as memory requires; gradients
// accumulate, are all-reduced across the replicas, and the optimizer runs on the CPU.
#include "core/kinds/swapping.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {
namespace {

// Per iteration, on every GPU g (m = D/(N u) microbatches, layers l = 0..R-1), with the decisions of
// decide_swaps (weights streamed: sw; stash swapped: sa):
//   sw off: WB(l) once, before the first forward of l; the weights stay until the closing DEL.
//   for each microbatch i:
//     forward, l ascending: X (data, l = 0) | WB(l) if sw | FWD(l) | sa: sX out of the stash X_l
//       (1 <= l <= R-2; the data X_0 is dropped and re-read, the criterion's input is used at once)
//     backward, l descending: WB(l) if sw | sa: sX in of X_l (X re-read for l = 0) | BWD(l) |
//       sw: [ARD(l) if N > 1] dWB(l) out — the gradient cannot stay, so every microbatch's gradient
//       is all-reduced (DDP without no_sync) and summed on the host (host_sum on microbatches 1..m-1);
//       sw off, last microbatch: [ARD(l) if N > 1] dWB(l) out once (accumulated on the GPU).
//   Update(l) on every GPU's CPU after its last dWB(l) (each replica's process updates its own copy,
//   as Harmony-DP does), and, sw off, one DEL freeing the resident weights.
// Activations follow plan.knobs.activation_policy (docs/baselines.md): FWD is priced at the profile's fwd time and
// BWD at bwd - fwd; checkpoint adds a REC (fwd time) before each BWD, so a layer costs fwd + bwd per
// microbatch like Harmony's; keep holds the saved activations from FWD to BWD instead (swapped out and in
// beside the stash with sa, except the criterion's), a layer then costing the profile's bwd.
// Swap volume per iteration (all GPUs, GW = W + B summed over layers, X_l = input bytes at u):
//   WB = N m 2 GW (sw) or N GW; dWB = N m GW (sw) or N GW; ARD = the same as dWB when N > 1;
//   sX out = sX in = N m sum_{l=1}^{R-2} X_l (sa); X in = N m X_0 (2 N m X_0 with sa).
Program lower_dp_swap(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  const SwapDecision sd = decide_swaps(plan, model).front();
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int N = plan.gpus;
  const int u = plan.u_bwd;
  const int m = plan.minibatch / N / u;
  const bool sw = sd.weights;
  const bool sa = sd.activations;
  auto collective_key = [](int l, int i) {
    return (static_cast<std::uint64_t>(l) << 32) | static_cast<std::uint32_t>(i);
  };

  for (int g = 0; g < N; ++g) {
    std::vector<int> last_dwb(static_cast<std::size_t>(R), -1);
    bool resident = false;
    for (int i = 0; i < m; ++i) {
      // ---- forward ----
      for (int l = 0; l < R; ++l) {
        const int k = b.next_step(g);
        std::vector<int> ins;
        if (l == 0) {
          const int X = b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation);
          ins.push_back(X);
        }
        if (b.has_params(l) && (sw || i == 0)) {
          ins.push_back(b.fetch_weights(g, l, b.fwd_task(g, l), i, k, b.wbytes(l), b.bbytes(l), /*windowed=*/sw));
          resident = resident || !sw;
        }
        b.forward_layer(g, l, i, u, k, sa, ins, /*free_weights=*/sw);
      }
      // ---- backward ----
      for (int l = R - 1; l >= 0; --l) {
        const LayerRange L{l, l};
        const int k = b.next_step(g);
        std::vector<int> ins;
        if (b.has_params(l) && sw)
          ins.push_back(b.fetch_weights(g, l, b.bwd_task(g, l), i, k, b.wbytes(l), b.bbytes(l), /*windowed=*/true));
        const int Bw = b.backward_layer(g, l, i, u, k, sa, ins);
        if (!b.has_params(l)) continue;
        if (sw) {
          b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
          b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
        } else if (i == 0) {
          b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
        }
        if (!sw && i != m - 1) continue;
        // gradient out: every microbatch (sw; the host sums the microbatches' gradients) or once after the last
        const int ui = sw ? i : 0;
        last_dwb[static_cast<std::size_t>(l)] =
            b.gradient_out(g, l, ui, Bw, k, collective_key(l, ui), sw && i > 0 ? b.wbytes(l) : 0);
      }
    }
    for (int l = R - 1; l >= 0; --l) {
      if (last_dwb[static_cast<std::size_t>(l)] < 0) continue;
      const int U = b.op(g, Stream::Cpu, OpKind::Update, b.upd_task(g, l), 0, LayerRange{l, l}, 0, 0);
      b.dep(U, last_dwb[static_cast<std::size_t>(l)]);
    }
    if (resident) {
      const int D = b.compute(g, OpKind::DEL, b.bwd_task(g, 0), 0, LayerRange{0, R - 1}, 0);
      for (int l = 0; l < R; ++l) b.free(D, TensorKind::Weights, LayerRange{l, l}, -1, b.wbytes(l) + b.bbytes(l));
    }
  }
  return b.finish();
}

const PlanKindSpec kSpec{
    .name = "dp-swap",
    .description =
        "data parallelism over virtualized GPU memory: weights swapped in per layer, activations as memory requires",
    .listing_order = 30,
    .role = KindRole::Baseline,
    .color = "#d62728",
    .data_parallel = true,
    .even_split = true,
    .knobs = {Knob::Activations, Knob::Swap},
    .validate = validate_swapping_plan,
    .lower = lower_dp_swap,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kRules{};

HARMONY_REGISTER_SWAPPING_KIND(kSpec, kRules);

}  // namespace
}  // namespace harmony::core
