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
// The lowering's shared state and its phases above as members; lower_pp_swap runs them stage by stage.
struct PpSwapLowering {
  // one stage's layers [a, z] on GPU s, its decisions, and what its tail needs
  struct Stage {
    int s, a, z;
    bool sw, sa;            // stream the weights; swap the stash
    bool resident = false;  // some weights stay resident (sw off): DEL frees them at the end
    std::vector<int> last_dwb;
  };

  Plan p;  // the plan with its stages (balanced_stages when it names none)
  std::vector<SwapDecision> decisions;
  detail::ProgramBuilder b;
  int R, N, u, m;
  // per stage and microbatch, the boundary transfers paired as rendezvous at the end (pair_boundaries)
  std::vector<std::vector<int>> y, xin, dx, dy;

  static Plan with_stages(const Plan& plan, const Model& model) {
    Plan staged = plan;
    if (staged.stages.empty()) staged.stages = balanced_stages(model, staged.u_bwd, staged.gpus);
    return staged;
  }
  static std::vector<std::vector<int>> per_stage_microbatch(int stages, int microbatches) {
    return std::vector<std::vector<int>>(static_cast<std::size_t>(stages),
                                         std::vector<int>(static_cast<std::size_t>(microbatches), -1));
  }

  PpSwapLowering(const Plan& plan, const Model& model)
      : p(with_stages(plan, model)),
        decisions(decide_swaps(p, model)),
        b(model, p),
        R(model.num_layers()),
        N(p.gpus),
        u(p.u_bwd),
        m(p.minibatch / p.u_bwd),
        y(per_stage_microbatch(N, m)),
        xin(per_stage_microbatch(N, m)),
        dx(per_stage_microbatch(N, m)),
        dy(per_stage_microbatch(N, m)) {}

  Stage stage(int s) const {
    const auto su = static_cast<std::size_t>(s);
    return Stage{.s = s,
                 .a = p.stages[su].first,
                 .z = p.stages[su].last,
                 .sw = decisions[su].weights,
                 .sa = decisions[su].activations,
                 .resident = false,
                 .last_dwb = std::vector<int>(static_cast<std::size_t>(R), -1)};
  }

  void lower_stage(int s) {
    Stage st = stage(s);
    // ---- all forwards ----
    for (int i = 0; i < m; ++i)
      for (int l = st.a; l <= st.z; ++l) forward_step(st, i, l);
    // ---- all backwards ----
    for (int i = 0; i < m; ++i)
      for (int l = st.z; l >= st.a; --l) backward_step(st, i, l);
    stage_tail(st);
  }

  // What FWD(l, i) waits for: its input at the stage's first layer (X data in, or X on P2PIn), WB(l) if sw (sw off:
  // once, before the first microbatch)
  std::vector<int> forward_inputs(Stage& st, int i, int l, int k) {
    const int s = st.s;
    const LayerRange L{l, l};
    std::vector<int> ins;
    if (l == st.a) {
      const int X = b.input_in(s, s == 0 ? Stream::SwapIn : Stream::P2PIn, OpKind::X, b.fwd_task(s, st.a), st.a, i, u,
                               k, TensorKind::Activation);
      ins.push_back(X);
      if (s > 0) xin[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = X;
    }
    if (b.has_params(l) && (st.sw || i == 0)) {
      const int W = b.weight_op(s, Stream::SwapIn, OpKind::WB, b.fwd_task(s, l), i, L, b.wbytes(l), b.bbytes(l));
      b.alloc(W, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
      if (st.sw || b.on_demand()) b.window(W, s, k);  // on demand, resident weights too move when first read
      st.resident = st.resident || !st.sw;
      ins.push_back(W);
    }
    return ins;
  }

  // FWD(l, i) on stage s, then sa: sX out of the stash; at the stage's last layer Y on P2POut
  void forward_step(Stage& st, int i, int l) {
    const int s = st.s, z = st.z;
    const bool sa = st.sa;
    const LayerRange L{l, l};
    const int k = b.next_step(s);
    const std::vector<int> ins = forward_inputs(st, i, l, k);
    const int F = b.compute(s, OpKind::FWD, b.fwd_task(s, l), i, L, u);
    for (int in : ins) b.dep(F, in);
    b.alloc(F, TensorKind::Activation, LayerRange{l + 1, l + 1}, i, b.xbytes(u, l + 1));
    if (b.keep()) b.alloc_saved(F, l, i, u);
    if (st.sw) b.free(F, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
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
      y[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = Y;
    }
  }

  // What BWD(l, i) waits for: dY on P2PIn at the stage's last layer (s < N-1), WB(l) if sw, sa: the stash in (X
  // re-read for l = 0), the saved activations (keep, sa) or the recompute (checkpoint)
  std::vector<int> backward_inputs(const Stage& st, int i, int l, int k) {
    const int s = st.s, z = st.z;
    const LayerRange L{l, l};
    std::vector<int> ins;
    if (l == z && s < N - 1) {
      const int G = b.op(s, Stream::P2PIn, OpKind::dY, b.bwd_task(s, z), i, L, u, b.xbytes(u, z + 1));
      b.alloc(G, TensorKind::ActGrad, LayerRange{z + 1, z + 1}, i, b.xbytes(u, z + 1));
      b.window(G, s, k);
      ins.push_back(G);
      dy[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = G;
    }
    if (b.has_params(l) && st.sw) {
      const int W = b.weight_op(s, Stream::SwapIn, OpKind::WB, b.bwd_task(s, l), i, L, b.wbytes(l), b.bbytes(l));
      b.alloc(W, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
      b.window(W, s, k);
      ins.push_back(W);
    }
    if (st.sa && l == 0) {
      const int X = b.input_in(s, Stream::SwapIn, OpKind::X, b.bwd_task(s, 0), 0, i, u, k, TensorKind::Stash);
      ins.push_back(X);
    } else if (st.sa) {
      const int S = b.input_in(s, Stream::SwapIn, OpKind::sX, b.bwd_task(s, l), l, i, u, k, TensorKind::Stash,
                               b.stash_of(s, l, i));
      ins.push_back(S);
    }
    if (b.keep() && st.sa) ins.push_back(b.swap_in_saved(s, l, i, u, k));
    if (const int Rc = b.recompute(s, l, i, u, ins); Rc >= 0) ins.push_back(Rc);
    return ins;
  }

  // BWD(l, i) on stage s, its gradients (weight_gradients) and, at the stage's first layer, dX on P2POut (s > 0)
  void backward_step(Stage& st, int i, int l) {
    const int s = st.s, a = st.a;
    const LayerRange L{l, l};
    const int k = b.next_step(s);
    const std::vector<int> ins = backward_inputs(st, i, l, k);
    const int Bw = b.compute(s, OpKind::BWD, b.bwd_task(s, l), i, L, u);
    for (int in : ins) b.dep(Bw, in);
    b.free_saved(Bw, l, i, u);
    if (l > 0) b.alloc(Bw, TensorKind::ActGrad, L, i, b.xbytes(u, l));
    if (l < R - 1) b.free(Bw, TensorKind::ActGrad, LayerRange{l + 1, l + 1}, i, b.xbytes(u, l + 1));
    b.free(Bw, st.sa ? TensorKind::Stash : TensorKind::Activation, L, i, b.xbytes(u, l));
    if (b.has_params(l)) weight_gradients(st, i, l, k, Bw);
    if (l == a && s > 0) {
      const int O = b.op(s, Stream::P2POut, OpKind::dX, b.bwd_task(s, a), i, L, u, b.xbytes(u, a));
      b.dep(O, Bw);
      b.free(O, TensorKind::ActGrad, L, i, b.xbytes(u, a));
      b.output_of(O, s, k);
      dx[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = O;
    }
  }

  // Layer l's weight gradient after BWD(l, i) (Bw, step k): sw: dWB out per microbatch, summed on the host; sw off:
  // accumulated on the GPU, dWB out after the last microbatch
  void weight_gradients(Stage& st, int i, int l, int k, int Bw) {
    const int s = st.s;
    const bool sw = st.sw;
    const LayerRange L{l, l};
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
      st.last_dwb[static_cast<std::size_t>(l)] = O;
    }
  }

  // Update(l) on stage s's CPU after its last dWB(l); DEL frees the resident weights
  void stage_tail(const Stage& st) {
    const int s = st.s, a = st.a, z = st.z;
    for (int l = z; l >= a; --l) {
      if (st.last_dwb[static_cast<std::size_t>(l)] < 0) continue;
      const int U = b.op(s, Stream::Cpu, OpKind::Update, b.upd_task(s, l), 0, LayerRange{l, l}, 0, 0);
      b.dep(U, st.last_dwb[static_cast<std::size_t>(l)]);
    }
    if (st.resident) {
      const int D = b.compute(s, OpKind::DEL, b.bwd_task(s, a), 0, LayerRange{a, z}, 0);
      for (int l = a; l <= z; ++l) b.free(D, TensorKind::Weights, LayerRange{l, l}, -1, b.wbytes(l) + b.bbytes(l));
    }
  }

  // the stage boundaries' sends and receives paired as rendezvous: Y with the next stage's X, its dX with our dY
  void pair_boundaries() {
    for (std::size_t s = 0; s + 1 < static_cast<std::size_t>(N); ++s) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(m); ++i) {
        b.peer(y[s][i], xin[s + 1][i]);
        b.peer(dx[s + 1][i], dy[s][i]);
      }
    }
  }
};

Program lower_pp_swap(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_swapping_plan(plan, model);  // before balanced_stages: the kind's own message for N > R
  PpSwapLowering low(plan, model);
  for (int s = 0; s < low.N; ++s) low.lower_stage(s);
  low.pair_boundaries();
  return low.b.finish();
}

const PlanKindSpec kSpec{
    .name = "pp-swap",
    .description = "GPipe-style pipeline over time-balanced contiguous stages, each swapping like dp-swap",
    .listing_order = 40,
    .role = KindRole::Baseline,
    .color = "#9467bd",
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
