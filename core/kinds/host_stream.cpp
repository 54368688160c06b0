// host-stream: one GPU training a model whose weights, gradients and AdamW state live in pinned host memory and
// stream over the host link, with AdamW run on the GPU over state streamed in and back (ml_dataflow's engine; llmq's
// offloaded optimizer). As many layers as fit stay on the GPU; the rest stream in for every microbatch's forward and
// backward; gradients accumulate through the host. harmony-sim prices it; harmony-run trains it (its device updates:
// backend/executor/flow_streamed.cpp).
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/kinds/microbatch_sizes.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"
#include "core/search/search.hpp"

namespace harmony::core {
namespace {

// Where one GPU keeps what (decide_layout): per layer, whether its W+B (with its gradient) stays on the GPU across
// the step and whether its activations stay there between its forward and its backward (else they go to host memory
// and come back).
struct Layout {
  std::vector<char> weights_on_gpu;
  std::vector<char> activations_on_gpu;
  int resident_layers = 0;
  int resident_activations = 0;
  Bytes estimate_bytes = 0;  // one GPU's peak under this layout
  bool fits = false;         // estimate_bytes <= knobs.gpu_capacity_bytes
};

// What the update of layer l brings in beside its weights and gradient: AdamW's moments and, under mixed precision,
// the FP32 masters (the profile's optimizer state holds them; FP32 and pure 2-byte training step the weights
// themselves).
Bytes state_bytes(const Model& m, int l) { return m.optimizer_state_bytes(l, l); }

// Layer l's sizes at plan.u_bwd, read from the model once per decision (decide_layout tries a layout per layer).
struct LayerSizes {
  Bytes wbg = 0;         // W+B and the gradient
  Bytes activation = 0;  // what its backward needs of one microbatch: its input, under keep its saved activations
  Bytes state = 0;       // state_bytes
};

std::vector<LayerSizes> layer_sizes(const Plan& p, const Model& m) {
  const bool keep = p.knobs.activation_policy == ActivationPolicy::Keep;
  std::vector<LayerSizes> sizes(static_cast<std::size_t>(m.num_layers()));
  for (int l = 0; l < m.num_layers(); ++l) {
    LayerSizes& s = sizes[static_cast<std::size_t>(l)];
    s.wbg = 2 * m.weight_bytes(l, l) + m.buffer_bytes(l, l);
    s.activation = m.input_bytes(p.u_bwd, l) + (keep ? saved_activation_bytes(m, p.u_bwd, l) : 0);
    s.state = state_bytes(m, l);
  }
  return sizes;
}

// The largest layer peak beyond the layer's own weights and input (forward or backward), whatever the layout.
Bytes working_bytes(const Plan& p, const Model& m) {
  Bytes working = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    working = std::max(working, m.peak_beyond_own_bytes(p.u_bwd, l));
  }
  return working;
}

// The peak of a layout: the training phase holds the resident layers' W+B and gradients, the activations kept on the
// GPU, one streamed layer's W+B and gradient, one activation transfer in flight and the largest layer peak beyond its
// own weights and input (`working`; the Program's transfers are windowed to the steps that use them, so a second
// streamed layer overlaps a working set already freed); the update phase (after the backward, the activations gone)
// holds the resident layers' W+B and gradients and two layers' streamed update inputs.
Bytes layout_peak(const std::vector<LayerSizes>& sizes, Bytes working, const Layout& lay) {
  Bytes resident = 0, kept = 0, stream = 0, act_window = 0, update = 0;
  for (std::size_t z = 0; z < sizes.size(); ++z) {
    const LayerSizes& s = sizes[z];
    const bool on_gpu = lay.weights_on_gpu[z] != 0;
    if (on_gpu)
      resident += s.wbg;
    else
      stream = std::max(stream, s.wbg);
    if (lay.activations_on_gpu[z] != 0)
      kept += s.activation;
    else
      act_window = std::max(act_window, s.activation);
    update = std::max(update, s.state + (on_gpu ? 0 : s.wbg));
  }
  const Bytes train = resident + kept + stream + act_window + std::max<Bytes>(0, working);
  return std::max(train, resident + 2 * update);
}

// The layout one GPU runs (docs/baselines.md#host-stream; ml_dataflow's memory partition,
// transformer_record_throughput.c at d6f941d0, lines 1060-1120): layers become resident, with their activations,
// each that fits under knobs.gpu_capacity_bytes beside those before it — the first and the last layer first (the
// embedding and the head, used at every turn of a pass), then upward from layer 1; then the activations of further
// layers, from the top down (the last forward is the first backward), each that fits. A layout that does not fit with
// every layer streaming has fits = false.
Layout decide_layout(const Plan& p, const Model& m) {
  const int R = m.num_layers();
  Layout lay;
  lay.weights_on_gpu.assign(static_cast<std::size_t>(R), 0);
  lay.activations_on_gpu.assign(static_cast<std::size_t>(R), 0);
  const Bytes cap = p.knobs.gpu_capacity_bytes;
  const std::vector<LayerSizes> sizes = layer_sizes(p, m);
  const Bytes working = working_bytes(p, m);
  std::vector<int> order{0};
  if (R > 1) order.push_back(R - 1);
  for (int l = 1; l < R - 1; ++l) order.push_back(l);
  for (const int l : order) {
    const auto z = static_cast<std::size_t>(l);
    lay.weights_on_gpu[z] = lay.activations_on_gpu[z] = 1;
    if (layout_peak(sizes, working, lay) > cap) {  // a layer that does not fit streams; a smaller one after it may fit
      lay.weights_on_gpu[z] = lay.activations_on_gpu[z] = 0;
      continue;
    }
    ++lay.resident_layers;
    ++lay.resident_activations;
  }
  for (int l = R - 1; l >= 0; --l) {
    const auto z = static_cast<std::size_t>(l);
    if (lay.activations_on_gpu[z] != 0) continue;
    lay.activations_on_gpu[z] = 1;
    if (layout_peak(sizes, working, lay) > cap) {
      lay.activations_on_gpu[z] = 0;
      continue;
    }
    ++lay.resident_activations;
  }
  lay.estimate_bytes = layout_peak(sizes, working, lay);
  lay.fits = lay.estimate_bytes <= cap;
  return lay;
}

// Per iteration on the GPU (m = D/u microbatches, layers l = 0..R-1; decide_layout's layers resident, the rest
// streamed; ml_dataflow's schedule, transformer_record_throughput.c at d6f941d0):
//   for each microbatch i:
//     forward, l ascending: X (data, l = 0) | WB(l) if streamed (windowed two steps ahead) | FWD(l), freeing a
//       streamed layer's weights | its input (under keep also its saved activations) out to the host when its
//       activations do not stay on the GPU (sX, l <= R-2).
//     backward, l descending: WB(l) if streamed | the stash in | [REC(l)] BWD(l), adding into the layer's gradient.
//       The gradient goes out after every microbatch's BWD but the last (dWB) and comes back for the next
//       (return_bytes: the engine accumulates on the GPU through its host copy, lines 4196-4230 and 3529-3611);
//       after the last microbatch a streamed layer's gradient goes home and a resident layer's stays.
//   then for each layer l ascending, the update (lines 4740-4830): in (WB): AdamW's moments (and masters), and for a
//   streamed layer its W+B and gradient | Update(l) on the GPU (its HBM traffic, device_adamw_bytes) | out (dWB): the
//   updated W+B and the moments, home; a resident layer's W+B stays on the GPU.
// Swap volume per iteration (GW = W+B, G = W, S = moments + masters over the layers): WB = 2 m GW(streamed) +
// GW(streamed) + S; dWB = m G + GW + S (every layer's gradient out m - 1 times, a streamed one once more); gradients
// back = (m - 1) G; sX and saved activations out and in for the layers whose activations go home.
Program lower_host_stream(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  validate_microbatch_plan(plan, model);
  const Layout lay = decide_layout(plan, model);
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int u = plan.u_bwd;
  const int m = plan.minibatch / u;
  const int g = 0;
  auto resident = [&](int l) { return lay.weights_on_gpu[static_cast<std::size_t>(l)] != 0; };
  auto acts_home = [&](int l) { return lay.activations_on_gpu[static_cast<std::size_t>(l)] == 0; };
  std::vector<int> grad_home(static_cast<std::size_t>(R), -1);  // per layer: its last gradient transfer
  for (int i = 0; i < m; ++i) {
    for (int l = 0; l < R; ++l) {
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (l == 0)
        ins.push_back(b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation));
      if (b.has_params(l) && !resident(l))
        ins.push_back(b.fetch_weights(g, l, b.fwd_task(g, l), i, k, b.wbytes(l), b.bbytes(l), /*windowed=*/true));
      const int F = b.forward_layer(g, l, i, u, k, acts_home(l), ins, /*free_weights=*/!resident(l));
      if (i == 0 && resident(l)) b.alloc(F, TensorKind::Weights, LayerRange{l, l}, -1, b.wbytes(l) + b.bbytes(l));
    }
    for (int l = R - 1; l >= 0; --l) {
      const LayerRange L{l, l};
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (b.has_params(l) && !resident(l))
        ins.push_back(b.fetch_weights(g, l, b.bwd_task(g, l), i, k, b.wbytes(l), b.bbytes(l), /*windowed=*/true));
      const int Bw = b.backward_layer(g, l, i, u, k, acts_home(l), ins);
      if (!b.has_params(l)) continue;
      if (!resident(l)) b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
      if (i == 0 || !resident(l)) b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      if (i == m - 1 && resident(l)) continue;  // the last microbatch's gradient stays for the update
      const int O = b.weight_op(g, Stream::SwapOut, OpKind::dWB, b.bwd_task(g, l), i, L, b.wbytes(l), 0);
      b.dep(O, Bw);
      if (i < m - 1) b.set_gradient_path(O, b.wbytes(l), 0);  // back before the next microbatch's backward
      if (!resident(l)) b.free(O, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      b.output_of(O, g, k);
      grad_home[static_cast<std::size_t>(l)] = O;
    }
  }
  for (int l = 0; l < R; ++l) {
    if (!b.has_params(l)) continue;
    const LayerRange L{l, l};
    const int k = b.next_step(g);
    const Bytes w = resident(l) ? 0 : b.wbytes(l);
    const Bytes bb = resident(l) ? 0 : b.bbytes(l);
    const Bytes extra = state_bytes(model, l) + (resident(l) ? 0 : b.wbytes(l));
    const int In = b.weight_op(g, Stream::SwapIn, OpKind::WB, b.upd_task(g, l), 0, L, w, bb);
    b.set_gradient_path(In, 0, extra);
    b.alloc(In, TensorKind::OptState, L, -1, extra + w + bb);
    if (grad_home[static_cast<std::size_t>(l)] >= 0) b.dep(In, grad_home[static_cast<std::size_t>(l)]);
    b.window(In, g, k);
    const int U = b.compute(g, OpKind::Update, b.upd_task(g, l), 0, L, 0);
    b.dep(U, In);
    const int Out = b.weight_op(g, Stream::SwapOut, OpKind::dWB, b.upd_task(g, l), 0, L, b.wbytes(l), b.bbytes(l));
    b.set_gradient_path(Out, 0, state_bytes(model, l));
    b.dep(Out, U);
    b.free(Out, TensorKind::OptState, L, -1, extra + w + bb);
    if (resident(l)) b.free(Out, TensorKind::WeightGrad, L, -1, b.wbytes(l));
    b.output_of(Out, g, k);
  }
  Program prog = b.finish();
  price_device_adamw(prog, model, 1);
  return prog;
}

Bytes estimate_bytes(const Plan& p, const Model& m) { return decide_layout(p, m).estimate_bytes; }

// Per activation policy, ascending u; with space.drop_infeasible only the plans whose layout fits (none on several
// GPUs: split_problem).
std::vector<Candidate> enumerate_host_stream(const Model& model, const SearchSpace& space) {
  return enumerate_microbatch_plans(model, space, estimate_bytes);
}

std::string describe_host_stream(const Plan& p, const Model& model) {
  const Layout lay = decide_layout(p, model);
  return fmt::format(
      "host-stream N{} D{} u {} (state in host memory, AdamW on the GPU over streamed state; {} of {} layers "
      "resident, activations of {} on the GPU; {})",
      p.gpus, p.minibatch, p.u_bwd, lay.resident_layers, model.num_layers(), lay.resident_activations,
      activation_policy_name(p.knobs.activation_policy));
}

const PlanKindSpec kSpec{
    .name = "host-stream",
    .description =
        "one GPU streaming every layer's weights, gradients and AdamW state from pinned host memory, AdamW on the GPU "
        "(ml_dataflow; llmq's offloaded optimizer)",
    .listing_order = 87,
    .role = KindRole::Baseline,
    .color = "#f7b6d2",
    .data_parallel = true,
    .even_split = true,
    .one_gpu = true,  // the systems it prices stream one GPU's state (ml_dataflow; llmq's offloaded optimizer)
    .trains = true,   // backend/executor/flow_streamed.cpp: AdamW on the GPU over state streamed from the host
    .knobs = {Knob::Activations},
    .validate = validate_microbatch_plan,
    .lower = lower_host_stream,
    .enumerate = enumerate_host_stream,
    .describe = describe_host_stream,
};

HARMONY_REGISTER_PLAN_KIND(kSpec);

}  // namespace
}  // namespace harmony::core
