// lohan: LoHan (ICDE 2025; first published as Fuyou, arXiv 2403.06504), as its artifact (github.com/RC4ML/LoHan)
// runs: one GPU streams every layer's fp16 parameters in from host memory or NVMe for the forward and again for
// the backward, keeps each checkpointed layer input in pinned host memory and recomputes the layer in the
// backward, and runs each layer's CPU Adam (state on the same tier) as soon as its gradient lands.
#include "core/kinds/swapping.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {
namespace {

// Per iteration, on every GPU g (each GPU's share D/N is one microbatch: the artifact does not accumulate):
//   forward, l ascending: X (data, l = 0) | WB(l) (from NVMe first under offload: nvme) | FWD(l) |
//     sX out of the layer input (1 <= l <= R-2: torch.utils.checkpoint inside save_on_cpu(pin_memory=True))
//   backward, l descending: WB(l) again | sX in (X re-read for l = 0) | REC(l) (checkpoint) | BWD(l) |
//     [ARD(l) if N > 1: the replicas' all-reduce] | dWB(l): the fp16 gradient to the host
//   Update(l) on the CPU depending only on that dWB(l): the queue runs it while the GPU goes on with layer l-1,
//     which is LoHan's "optimizer overlapped with the backward"; under offload: nvme it reads the layer's optimizer
//     state and fp32 masters from the drives and writes them back with the fp16 parameters the next fetch reads.
//     With N GPUs the replicas share ONE optimizer pass per iteration: Update(l) runs once, on rank 0's CPU queue
//     (LoHan's one optimizer process, as on one GPU), after rank 0's dWB(l) (the gradient is all-reduced, so every
//     replica's copy is the sum).
//     The N processes live on one host with one copy of the fp32 masters and optimizer state (one drive array
//     under nvme): the artifact's optimizer is adapted from DeepSpeed ZeRO-3's partitioned one (ratel_optimizer.py's
//     SB_optimizer keeps stage3.py's `__avg_scatter_grads`, "average gradients and scatter partitions across
//     ranks"; nvme_ds/partitioned_optimizer_swapper.py), which steps each parameter once per
//     iteration whatever N is. Repeating the whole pass per replica (the kind before issue 35) made the host
//     Adam and the NVMe state traffic grow N-fold. One queue, not layer l on rank l mod N: a CPU queue runs each
//     update's NVMe read, step and write in series, so N queues would overlap one update's I/O with another's step
//     and price the shared pass faster than the one-GPU pass it is (ASSUMPTION: the public code has no multi-GPU
//     optimizer to read; docs/baselines.md).
// Under keep (the artifact's swap mode) the FWD's saved activations go out to the host beside the input and
// come back for the BWD instead of a REC. ZeRO-3's hook and bucket terms do not apply (LoHan fetches whole layers).
// Swap volume per iteration (all GPUs, GW = W + B): WB = 2 N GW; dWB = N GW; sX out = sX in =
// N sum_{l=1}^{R-2} X_l; X = 2 N X_0; NVMe (offload: nvme) reads 2 N GW + state + masters, writes state + masters
// (+ GW when the GPU weights are 2-byte): the state once, not once per replica.
Program lower_lohan(const Plan& plan, const Model& model, const LowerOptions& /*options*/) {
  const SwapDecision sd = decide_swaps(plan, model).front();
  detail::ProgramBuilder b(model, plan);
  const int R = model.num_layers();
  const int N = plan.gpus;
  const int u = plan.u_bwd;  // == D/N (validate_baseline_plan)
  const bool sa = sd.activations;
  const bool nvme = plan.knobs.offload == OffloadTier::Nvme;
  constexpr int i = 0;  // the one microbatch

  auto fetch = [&](int g, int l, int task, int k) {
    const int W = b.fetch_weights(g, l, task, i, k, b.wbytes(l), b.bbytes(l), /*windowed=*/true);
    if (nvme) b.set_io(W, 1, b.wbytes(l) + b.bbytes(l), 0);
    return W;
  };

  for (int g = 0; g < N; ++g) {
    for (int l = 0; l < R; ++l) {
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (l == 0)
        ins.push_back(b.input_in(g, Stream::SwapIn, OpKind::X, b.fwd_task(g, 0), 0, i, u, k, TensorKind::Activation));
      if (b.has_params(l)) ins.push_back(fetch(g, l, b.fwd_task(g, l), k));
      b.forward_layer(g, l, i, u, k, sa, ins, /*free_weights=*/true);
    }
    for (int l = R - 1; l >= 0; --l) {
      const LayerRange L{l, l};
      const int k = b.next_step(g);
      std::vector<int> ins;
      if (b.has_params(l)) ins.push_back(fetch(g, l, b.bwd_task(g, l), k));
      const int Bw = b.backward_layer(g, l, i, u, k, sa, ins);
      if (!b.has_params(l)) continue;
      b.alloc(Bw, TensorKind::WeightGrad, L, -1, b.wbytes(l));
      b.free(Bw, TensorKind::Weights, L, -1, b.wbytes(l) + b.bbytes(l));
      const int O = b.gradient_out(g, l, i, Bw, k, static_cast<std::uint64_t>(l), /*host_sum=*/0);
      if (g != 0) continue;  // the shared optimizer pass runs on rank 0's CPU queue
      const int U = b.op(g, Stream::Cpu, OpKind::Update, b.upd_task(g, l), 0, L, 0, 0);
      b.dep(U, O);
      if (nvme) b.nvme_update_io(U, l);
    }
  }
  Program prog = b.finish();
  prog.cost.offload_nvme = nvme;
  return prog;
}

const PlanKindSpec kSpec{
    .name = "lohan",
    .description =
        "LoHan (Fuyou): each layer's parameters streamed from host or NVMe, checkpoints on the host, each layer's CPU "
        "Adam overlapped with the rest of the backward",
    .listing_order = 70,
    .role = KindRole::Baseline,
    .color = "#bcbd22",
    .data_parallel = true,
    .even_split = true,
    .one_microbatch = true,
    .offload_tiers = true,
    .knobs = {Knob::Activations, Knob::Offload},
    .validate = validate_swapping_plan,
    .lower = lower_lohan,
    .enumerate = enumerate_swapping_plans,
    .describe = describe_swapping_plan,
};

const SwapRules kRules{.stream_weights = true, .swap_activations = true};

HARMONY_REGISTER_SWAPPING_KIND(kSpec, kRules);

}  // namespace
}  // namespace harmony::core
