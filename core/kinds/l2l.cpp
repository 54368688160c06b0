// l2l: layer-to-layer training (Pudipeddi et al. 2020, "Training Large Neural Networks with Constant
// Memory using a New Execution Algorithm"). One layer is resident at a time and runs every microbatch
// before the next layer is loaded; activations are stashed on the host, and the host-side eager
// parameter server (EPS) reduces gradients and runs the optimizer while the GPUs move on.
#include "core/kinds/swapping.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {
namespace {

// Per iteration, on every GPU g (data parallel over D/N samples, m = D/(N u) microbatches):
//   forward, l ascending: WB(l) once | for each microbatch i: its input (l = 0: X data in; else the
//     previous layer's output: kept on the GPU, or, sa, sX in from the host) | FWD(l, i) | sX out of
//     its output X_{l+1} to the host (the stash of BWD(l+1); with sa it also frees the GPU copy)
//   backward, l descending: WB(l) once | for each microbatch i: the stash X_l in from the host (sX;
//     l = 0: the data X re-read) | dY: the gradient from BWD(l+1, i), kept on the GPU, or, sa, dX out
//     after BWD(l+1, i) and dY in before BWD(l, i) | BWD(l, i), accumulating dW on the GPU |
//     after the last microbatch: dWB(l) out once
//   Update(l) on the EPS (GPU 0's CPU) once every GPU's dWB(l) is on the host: the EPS sums the N (host_sum on the dWB
//   of GPUs 1..N-1)
//     gradients (no GPU all-reduce) and updates layer l while the GPUs run layer l-1.
// The weights of the current and the next layer are resident (prefetch); no DEL is needed (the last
// compute of a layer frees it). sa = decide_swaps' activations: all microbatches' activations at the
// current layer's boundaries do not fit beside the layer. Activations follow plan.knobs.activation_policy:
// checkpoint adds a REC (fwd time) before each BWD (bwd - fwd); keep swaps every layer's saved activations
// out after its FWD and in before its BWD (sX of saved_activation_bytes; the stash lives on the host).
// Swap volume per iteration (all GPUs; S = sum_{l=1}^{R-1} X_l, GW = W + B summed over layers):
//   WB = 2 N GW; dWB = N GW; X in = 2 N m X_0; sX out = N m S; sX in = N m S (2 N m S with sa);
//   with sa also dX out = dY in = N m S.
// The phases above as members over the lowering's shared state, called in that order by lower_l2l.
struct L2lLowering {
  detail::ProgramBuilder b;
  int R, N, u, m;
  bool sa;  // activations swapped (decide_swaps)
  // per GPU and layer, its dWB (-1: none): the EPS's update of layer l waits for every GPU's
  std::vector<std::vector<int>> dwb;
  // per microbatch: the last boundary transfer of the previous layer (the stash sX out of X_l is the
  // builder's stash_of(g, l, i))
  std::vector<int> dx_out;

  L2lLowering(const Plan& plan, const Model& model, const SwapDecision& sd)
      : b(model, plan),
        R(model.num_layers()),
        N(plan.gpus),
        u(plan.u_bwd),
        m(plan.minibatch / plan.gpus / plan.u_bwd),
        sa(sd.activations),
        dwb(static_cast<std::size_t>(N), std::vector<int>(static_cast<std::size_t>(R), -1)) {}

  // WB(l) once per pass (task: its forward or backward task), for step k of GPU g
  int weights_in(int g, int l, int task, int k) {
    const LayerRange L{l, l};
    const int W = b.weight_op(g, Stream::SwapIn, OpKind::WB, task, 0, L, b.wbytes(l), b.bbytes(l));
    b.alloc(W, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
    b.window(W, g, k);
    return W;
  }

  // ---- forward, layer by layer: every microbatch through layer l before layer l+1 ----
  void forward(int g) {
    for (int l = 0; l < R; ++l)
      for (int i = 0; i < m; ++i) forward_step(g, l, i);
  }

  // FWD(l, i) on GPU g with its inputs: WB (first microbatch), X (l = 0), or the previous layer's output
  void forward_step(int g, int l, int i) {
    const LayerRange L{l, l};
    const int k = b.next_step(g);
    std::vector<int> ins;
    if (i == 0 && b.has_params(l)) ins.push_back(weights_in(g, l, b.fwd_task(g, l), k));
    if (l == 0) {
      const int X = b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation);
      ins.push_back(X);
    } else if (b.xbytes(u, l) > 0 && sa) {
      const int S = b.input_in(g, Stream::SwapIn, OpKind::sX, b.fwd_task(g, l), l, i, u, k, TensorKind::Activation,
                               b.stash_of(g, l, i));
      ins.push_back(S);
    } else if (b.xbytes(u, l) > 0) {
      ins.push_back(b.stash_of(g, l, i));  // the copy must be out before the free
    }
    const int F = b.compute(g, OpKind::FWD, b.fwd_task(g, l), i, L, u);
    for (int in : ins) b.dep(F, in);
    b.free(F, TensorKind::Activation, L, i, b.xbytes(u, l));
    if (b.keep()) {  // the saved activations go to the host with the stash
      b.alloc_saved(F, l, i, u);
      b.swap_out_saved(g, l, i, u, F, k);
    }
    if (i == m - 1 && b.has_params(l)) b.free(F, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
    const Bytes y = b.xbytes(u, l + 1);
    if (y > 0) {  // sX out of the output X_{l+1}: BWD(l+1)'s stash (with sa it also frees the GPU copy)
      const LayerRange L1{l + 1, l + 1};
      b.alloc(F, TensorKind::Activation, L1, i, y);
      const int O = b.op(g, Stream::SwapOut, OpKind::sX, b.fwd_task(g, l), i, L1, u, y);
      b.dep(O, F);
      if (sa) b.free(O, TensorKind::Activation, L1, i, y);
      b.output_of(O, g, k);
      b.record_stash(g, l + 1, i, O);
    }
  }

  // ---- backward, layer by layer ----
  void backward(int g) {
    dx_out.assign(static_cast<std::size_t>(m), -1);
    for (int l = R - 1; l >= 0; --l)
      for (int i = 0; i < m; ++i) backward_step(g, l, i);
  }

  // What BWD(l, i) on GPU g waits for: WB (first microbatch), the stash (X for l = 0, else sX), dY in (sa), the
  // saved activations (keep) or the recompute (checkpoint).
  std::vector<int> backward_inputs(int g, int l, int i, int k) {
    const LayerRange L{l, l};
    std::vector<int> ins;
    if (i == 0 && b.has_params(l)) ins.push_back(weights_in(g, l, b.bwd_task(g, l), k));
    if (l == 0) {
      const int X = b.input_in(g, Stream::SwapIn, OpKind::X, b.bwd_task(g, 0), 0, i, u, k, TensorKind::Stash);
      ins.push_back(X);
    } else if (b.xbytes(u, l) > 0) {
      const int S = b.input_in(g, Stream::SwapIn, OpKind::sX, b.bwd_task(g, l), l, i, u, k, TensorKind::Stash,
                               b.stash_of(g, l, i));
      ins.push_back(S);
    }
    const Bytes dy = b.xbytes(u, l + 1);
    if (l < R - 1 && sa && dy > 0) {
      const int G = b.op(g, Stream::SwapIn, OpKind::dY, b.bwd_task(g, l), i, L, u, dy);
      b.alloc(G, TensorKind::ActGrad, LayerRange{l + 1, l + 1}, i, dy);
      b.dep(G, dx_out[static_cast<std::size_t>(i)]);
      b.window(G, g, k);
      ins.push_back(G);
    }
    if (b.keep()) ins.push_back(b.swap_in_saved(g, l, i, u, k));
    if (const int Rc = b.recompute(g, l, i, u, ins); Rc >= 0) ins.push_back(Rc);
    return ins;
  }

  // BWD(l, i) on GPU g, accumulating dW on the GPU; then dX out (sa) and, after the last microbatch, dWB(l) out
  void backward_step(int g, int l, int i) {
    const LayerRange L{l, l};
    const int k = b.next_step(g);
    const std::vector<int> ins = backward_inputs(g, l, i, k);
    const Bytes dy = b.xbytes(u, l + 1);
    const int Bw = b.compute(g, OpKind::BWD, b.bwd_task(g, l), i, L, u);
    for (int in : ins) b.dep(Bw, in);
    b.free_saved(Bw, l, i, u);
    b.free(Bw, TensorKind::Stash, L, i, b.xbytes(u, l));
    if (l < R - 1) b.free(Bw, TensorKind::ActGrad, LayerRange{l + 1, l + 1}, i, dy);
    if (b.has_params(l)) {
      if (i == 0) b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      if (i == m - 1) b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
    }
    if (l > 0) {
      b.alloc(Bw, TensorKind::ActGrad, L, i, b.xbytes(u, l));
      if (sa && b.xbytes(u, l) > 0) {
        const int O = b.op(g, Stream::SwapOut, OpKind::dX, b.bwd_task(g, l), i, L, u, b.xbytes(u, l));
        b.dep(O, Bw);
        b.free(O, TensorKind::ActGrad, L, i, b.xbytes(u, l));
        b.output_of(O, g, k);
        dx_out[static_cast<std::size_t>(i)] = O;
      }
    }
    if (i == m - 1 && b.has_params(l)) {
      const int O = b.weight_op(g, Stream::SwapOut, OpKind::dWB, b.bwd_task(g, l), 0, L, b.wbytes(l), b.bbytes(l));
      b.dep(O, Bw);
      if (g > 0) b.set_host_sum(O, b.wbytes(l));  // the EPS adds replica g's gradient into replica 0's
      b.free(O, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      b.output_of(O, g, k);
      dwb[static_cast<std::size_t>(g)][static_cast<std::size_t>(l)] = O;
    }
  }

  // the eager parameter server: GPU 0's process, one update per layer once every GPU's gradient is in
  void updates() {
    for (int l = R - 1; l >= 0; --l) {
      if (!b.has_params(l)) continue;
      const int U = b.op(0, Stream::Cpu, OpKind::Update, b.upd_task(0, l), 0, LayerRange{l, l}, 0, 0);
      for (int g = 0; g < N; ++g) b.dep(U, dwb[static_cast<std::size_t>(g)][static_cast<std::size_t>(l)]);
    }
  }
};

Program lower_l2l(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  const SwapDecision sd = decide_swaps(plan, model).front();
  L2lLowering low(plan, model, sd);
  for (int g = 0; g < low.N; ++g) {
    low.forward(g);
    low.backward(g);
  }
  low.updates();
  return low.b.finish();
}

const PlanKindSpec kSpec{
    .name = "l2l",
    .description =
        "layer-to-layer: one layer resident at a time over all microbatches, activations stashed on the host",
    .listing_order = 60,
    .role = KindRole::Baseline,
    .color = "#7f7f7f",
    .data_parallel = true,
    .even_split = true,
    .knobs = {Knob::Activations},
    .validate = validate_swapping_plan,
    .lower = lower_l2l,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kRules{.stash_on_host = true};

HARMONY_REGISTER_SWAPPING_KIND(kSpec, kRules);

}  // namespace
}  // namespace harmony::core
