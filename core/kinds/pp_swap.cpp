// pp-swap: GPipe-style pipeline parallelism (Huang et al. 2019) over N GPUs with time-balanced
// contiguous stages, all microbatch forwards then all backwards per minibatch, each stage swapping
// like dp-swap where it does not fit (weights per layer per microbatch, stashed activations out and in).
// Stage boundaries are P2P sends and receives paired as rendezvous.
#include "core/kinds/swapping.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {
namespace {

// Per iteration, on the GPU s of stage [a, b] (m = D/u microbatches, every stage sees all of them),
// with stage s's decisions from decide_swaps (sw: stream weights; sa: swap the stash):
//   sw off: WB(l) once before the first forward of l; DEL at the end frees the stage's weights.
//   forward, microbatch i = 0..m-1, l = a..b: input (s = 0: X data in over PCIe; else X on P2PIn,
//     the rendezvous of stage s-1's Y) | WB(l) if sw | FWD(l) | sa: sX out of the stash X_l (the data
//     X_0 is dropped and re-read) — GPipe keeps every microbatch's stash until the backward phase, so
//     the stash of all m microbatches is what has to fit | l = b, s < N-1: Y on P2POut
//   backward, microbatch i = 0..m-1, l = b..a: dY on P2PIn (s < N-1; the rendezvous of stage s+1's dX)
//     | WB(l) if sw | sa: sX in of X_l (X re-read for l = 0) | BWD(l) | sw: dWB(l) out per microbatch,
//     summed on the host (host_sum on microbatches 1..m-1); sw off: dWB(l) out after the last microbatch | l = a, s >
//     0: dX on P2POut
//   Update(l) on stage s's CPU after its last dWB(l). No all-reduce: every stage owns its layers.
// Activations follow plan.knobs.activation_policy (docs/baselines.md): checkpoint adds a REC (at fwd time) before
// every BWD (at bwd - fwd); keep allocates the saved activations in the FWD and, sa, swaps them out and in
// beside the stash (sX of saved_activation_bytes). Swap volume per iteration (GW_s = W + B of stage
// s, S_s = sum of X_l over its layers but layer 0):
//   WB = sum_s (2 m GW_s if sw_s else GW_s); dWB = sum_s (m GW_s if sw_s else GW_s);
//   sX out = sX in = m sum_{s: sa_s} S_s; X in = m X_0 (2 m X_0 if stage 0 swaps);
//   P2P: Y = dX = m sum_{s < N-1} X_{b_s + 1}.
// NOLINTNEXTLINE(readability-function-size): 149 lines, over the 80 the house holds; to split
Program lower_pp_swap(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_swapping_plan(plan, model);  // before balanced_stages: the kind's own message for N > R
  Plan p = plan;
  if (p.stages.empty()) p.stages = balanced_stages(model, p.u_bwd, p.gpus);
  const auto decisions = decide_swaps(p, model);
  detail::ProgramBuilder b(model, p);
  const int R = model.num_layers();
  const int N = p.gpus;
  const int u = p.u_bwd;
  const int m = p.minibatch / u;
  const auto M = static_cast<std::size_t>(m);
  const auto NN = static_cast<std::size_t>(N);
  std::vector<std::vector<int>> y(NN, std::vector<int>(M, -1));
  std::vector<std::vector<int>> xin(NN, std::vector<int>(M, -1));
  std::vector<std::vector<int>> dx(NN, std::vector<int>(M, -1));
  std::vector<std::vector<int>> dy(NN, std::vector<int>(M, -1));

  for (int s = 0; s < N; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const int a = p.stages[su].first;
    const int z = p.stages[su].last;
    const bool sw = decisions[su].weights;
    const bool sa = decisions[su].activations;
    bool resident = false;
    std::vector<int> last_dwb(static_cast<std::size_t>(R), -1);
    // ---- all forwards ----
    for (int i = 0; i < m; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      for (int l = a; l <= z; ++l) {
        const LayerRange L{l, l};
        const int k = b.next_step(s);
        std::vector<int> ins;
        if (l == a) {
          const int X = b.input_in(s, s == 0 ? Stream::SwapIn : Stream::P2PIn, OpKind::X, b.fwd_task(s, a), a, i, u, k,
                                   TensorKind::Activation);
          ins.push_back(X);
          if (s > 0) xin[su][iu] = X;
        }
        if (b.has_params(l) && (sw || i == 0)) {
          const int W = b.weight_op(s, Stream::SwapIn, OpKind::WB, b.fwd_task(s, l), i, L, b.wbytes(l), b.bbytes(l));
          b.alloc(W, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
          if (sw || b.on_demand()) b.window(W, s, k);  // on demand, resident weights too move when first read
          resident = resident || !sw;
          ins.push_back(W);
        }
        const int F = b.compute(s, OpKind::FWD, b.fwd_task(s, l), i, L, u);
        for (int in : ins) b.dep(F, in);
        b.alloc(F, TensorKind::Activation, LayerRange{l + 1, l + 1}, i, b.xbytes(u, l + 1));
        if (b.keep()) b.alloc_saved(F, l, i, u);
        if (sw) b.free(F, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
        if (sa && l == 0) {
          b.free(F, TensorKind::Activation, L, i, b.xbytes(u, 0));
        } else if (sa) {
          const int O = b.op(s, Stream::SwapOut, OpKind::sX, b.fwd_task(s, l), i, L, u, b.xbytes(u, l));
          b.dep(O, F);
          b.free(O, TensorKind::Activation, L, i, b.xbytes(u, l));
          b.output_of(O, s, k);
          b.record_stash(s, l, i, O);
        }
        if (b.keep() && sa) b.swap_out_saved(s, l, i, u, F, k);
        if (l == z && s < N - 1) {
          const LayerRange L1{z + 1, z + 1};
          const int Y = b.op(s, Stream::P2POut, OpKind::Y, b.fwd_task(s, z), i, L, u, b.xbytes(u, z + 1));
          b.dep(Y, F);
          b.free(Y, TensorKind::Activation, L1, i, b.xbytes(u, z + 1));
          b.output_of(Y, s, k);
          y[su][iu] = Y;
        }
      }
    }
    // ---- all backwards ----
    for (int i = 0; i < m; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      for (int l = z; l >= a; --l) {
        const LayerRange L{l, l};
        const int k = b.next_step(s);
        std::vector<int> ins;
        if (l == z && s < N - 1) {
          const int G = b.op(s, Stream::P2PIn, OpKind::dY, b.bwd_task(s, z), i, L, u, b.xbytes(u, z + 1));
          b.alloc(G, TensorKind::ActGrad, LayerRange{z + 1, z + 1}, i, b.xbytes(u, z + 1));
          b.window(G, s, k);
          ins.push_back(G);
          dy[su][iu] = G;
        }
        if (b.has_params(l) && sw) {
          const int W = b.weight_op(s, Stream::SwapIn, OpKind::WB, b.bwd_task(s, l), i, L, b.wbytes(l), b.bbytes(l));
          b.alloc(W, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
          b.window(W, s, k);
          ins.push_back(W);
        }
        if (sa && l == 0) {
          const int X = b.input_in(s, Stream::SwapIn, OpKind::X, b.bwd_task(s, 0), 0, i, u, k, TensorKind::Stash);
          ins.push_back(X);
        } else if (sa) {
          const int S = b.input_in(s, Stream::SwapIn, OpKind::sX, b.bwd_task(s, l), l, i, u, k, TensorKind::Stash,
                                   b.stash_of(s, l, i));
          ins.push_back(S);
        }
        if (b.keep() && sa) ins.push_back(b.swap_in_saved(s, l, i, u, k));
        if (const int Rc = b.recompute(s, l, i, u, ins); Rc >= 0) ins.push_back(Rc);
        const int Bw = b.compute(s, OpKind::BWD, b.bwd_task(s, l), i, L, u);
        for (int in : ins) b.dep(Bw, in);
        b.free_saved(Bw, l, i, u);
        if (l > 0) b.alloc(Bw, TensorKind::ActGrad, L, i, b.xbytes(u, l));
        if (l < R - 1) b.free(Bw, TensorKind::ActGrad, LayerRange{l + 1, l + 1}, i, b.xbytes(u, l + 1));
        b.free(Bw, sa ? TensorKind::Stash : TensorKind::Activation, L, i, b.xbytes(u, l));
        if (b.has_params(l)) {
          if (sw) {
            b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
            b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
          } else if (i == 0) {
            b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
          }
          if (sw || i == m - 1) {
            const int O =
                b.weight_op(s, Stream::SwapOut, OpKind::dWB, b.bwd_task(s, l), sw ? i : 0, L, b.wbytes(l), b.bbytes(l));
            b.dep(O, Bw);
            if (sw && i > 0) b.set_host_sum(O, b.wbytes(l));  // the host sums the microbatches' gradients
            b.free(O, TensorKind::WeightGrad, L, -1, b.wbytes(l));
            b.output_of(O, s, k);
            last_dwb[static_cast<std::size_t>(l)] = O;
          }
        }
        if (l == a && s > 0) {
          const int O = b.op(s, Stream::P2POut, OpKind::dX, b.bwd_task(s, a), i, L, u, b.xbytes(u, a));
          b.dep(O, Bw);
          b.free(O, TensorKind::ActGrad, L, i, b.xbytes(u, a));
          b.output_of(O, s, k);
          dx[su][iu] = O;
        }
      }
    }
    for (int l = z; l >= a; --l) {
      if (last_dwb[static_cast<std::size_t>(l)] < 0) continue;
      const int U = b.op(s, Stream::Cpu, OpKind::Update, b.upd_task(s, l), 0, LayerRange{l, l}, 0, 0);
      b.dep(U, last_dwb[static_cast<std::size_t>(l)]);
    }
    if (resident) {
      const int D = b.compute(s, OpKind::DEL, b.bwd_task(s, a), 0, LayerRange{a, z}, 0);
      for (int l = a; l <= z; ++l) b.free(D, TensorKind::Weights, LayerRange{l, l}, -1, b.wbytes(l) + b.bbytes(l));
    }
  }
  for (std::size_t s = 0; s + 1 < NN; ++s) {
    for (std::size_t i = 0; i < M; ++i) {
      b.peer(y[s][i], xin[s + 1][i]);
      b.peer(dx[s + 1][i], dy[s][i]);
    }
  }
  return b.finish();
}

const PlanKindSpec kSpec{
    .name = "pp-swap",
    .description = "GPipe-style pipeline over time-balanced contiguous stages, each swapping like dp-swap",
    .listing_order = 40,
    .role = KindRole::Baseline,
    .color = "#9467bd",
    .dialect = ExecutorDialect::Swapping,
    .stage_per_gpu = true,
    .knobs = {Knob::Activations, Knob::Swap},
    .validate = validate_swapping_plan,
    .lower = lower_pp_swap,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kRules{.all_microbatches_alive = true};

HARMONY_REGISTER_SWAPPING_KIND(kSpec, kRules);

}  // namespace
}  // namespace harmony::core
