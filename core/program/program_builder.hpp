// The op-building kit the swapping kinds' lowerings share (core/kinds/dp_swap.cpp, pp_swap.cpp, zero_infinity.cpp,
// l2l.cpp, lohan.cpp): detail::ProgramBuilder, the keep policy's saved activations and GPipe's balanced stage split.
// What each kind swaps is decided in core/kinds/swapping.hpp; docs/baselines.md describes every baseline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"

namespace harmony::core {

// The bytes a keep-policy forward holds for layer l's backward at microbatch u: the model's recorded saved
// activations (Layer::saved_bytes: harmony-run's description and profiler, the analytic models), else, as the
// paper's scheduler derives them, the layer's profiled backward peak less its weights, weight gradient, input,
// output (= dY) and input gradient — the part of the backward's memory the ledger otherwise charges as the BWD's
// transient workspace. A paper profile does not separate the saved tensors from the backward's own temporaries
// (and its peak may fall before every weight gradient exists), so for it that is an estimate.
Bytes saved_activation_bytes(const Model& model, int u, int layer);

// GPipe's time-balanced contiguous split of the R layers into `stages` ranges, minimizing the largest
// stage's compute time at u (per layer: the profile's bwd time, which includes a forward). Ties go to
// the split with the earliest boundaries. Throws ScheduleError if stages < 1 or stages > R.
std::vector<LayerRange> balanced_stages(const Model& model, int u, int stages);

namespace detail {

// The op-building kit the baseline lowerings share. Ops go to (device, stream) queues in creation
// order; queues are laid out at finish() (devices ascending, streams in order of first use).
// Flow control is by compute "steps" (every Compute-stream op is one): an input transfer windowed
// to step k waits for step k-2 to end (double buffering), and step k waits for the output
// transfers registered to step k-2 (bounded in-flight swap-outs). Under plan.knobs.swap on-demand the host swaps
// (SwapIn, SwapOut) lead by one step instead of two: an input windowed to step k waits for step k-1 (it moves when
// its reader is reached) and step k waits for the swap-outs of step k-1 (evictions before the next op); P2P keeps two.
class ProgramBuilder {
 public:
  // The Program's plan is `plan` with u_fwd = u_bwd (the one microbatch size), packs_bwd its stages (a kind with
  // one stage per GPU) or one pack of every layer, packs_fwd all but the last.
  ProgramBuilder(const Model& model, const Plan& plan);

  const Model& model() const { return model_; }
  int num_layers() const { return model_.num_layers(); }
  // Pseudo task ids (unique per GPU): forward of layer l, backward of layer l, update of layer l.
  int fwd_task(int device, int layer) const { return device * 3 * num_layers() + layer; }
  int bwd_task(int device, int layer) const { return device * 3 * num_layers() + 2 * num_layers() - 1 - layer; }
  int upd_task(int device, int layer) const { return device * 3 * num_layers() + 3 * num_layers() - 1 - layer; }

  // A non-compute op appended to (device, stream).
  int op(int device, Stream stream, OpKind kind, int task, int ui, LayerRange layers, int ubs, Bytes bytes);
  // WB / dWB / ARD / AG / RS: bytes = w + b, bytes_w = w, bytes_b = b.
  int weight_op(int device, Stream stream, OpKind kind, int task, int ui, LayerRange layers, Bytes w, Bytes b);
  // A Compute-stream op (FWD, BWD, ARD, DEL) = the next step of `device`. FWD/BWD get the workspace
  // of their layers; ARD is priced by bytes (w + b). Step k depends on outputs registered to step k-2.
  int compute(int device, OpKind kind, int task, int ui, LayerRange layers, int ubs, Bytes w = 0, Bytes b = 0);
  int next_step(int device) const;  // the step index the next compute op of `device` gets
  // Layer l's parameters all-gathered from the GPUs' resident shards for step k of GPU `device` (fsdp,
  // zero3-opt-offload; more than one GPU): an AG of the whole W+B on P2PIn, windowed to step k (prefetched at most
  // two compute steps ahead) and joined as collective `key`, whose members start together (each waits for the compute
  // step the others' gathers are windowed to); it allocates the gathered weights. Returns the AG.
  int gather_resident(int device, int l, int task, int ui, int k, std::uint64_t key);
  int step_op(int device, int k) const { return steps_[static_cast<std::size_t>(device)][static_cast<std::size_t>(k)]; }

  // The per-layer streaming blocks dp-swap, zero-infinity and lohan share:
  // layer l's weights (w + b bytes: the whole layer or a shard) in to `device` on SwapIn for microbatch ui of
  // `task`, allocated as Weights and, when `windowed`, made to wait for step k - 2 (window). Returns the WB op.
  int fetch_weights(int device, int l, int task, int ui, int k, Bytes w, Bytes b, bool windowed);
  // Layer l's weight gradient out after its BWD `bwd` (step k, which allocated it): with more than one GPU an
  // ARD all-reduce of the replicas (collective `key`, its own step) first; then dWB to the host (a host sum of
  // `host_sum` bytes when > 0), which frees the gradient and is the output of the last step. Returns the dWB op.
  int gradient_out(int device, int l, int ui, int bwd, int k, std::uint64_t key, Bytes host_sum);
  // offload: nvme: layer l's CPU update reads its optimizer state and FP32 masters from the drives and writes
  // them back, plus the GPU-dtype parameters when those are narrower than FP32 (the next fetch reads them), and
  // `extra_read` bytes more (ZeRO-3's FP32 gradients, swapped out by the backward).
  void nvme_update_io(int update, int l, Bytes extra_read = 0);

  void dep(int op, int on);
  // Layer l's input for microbatch i coming in to `device` (the data X, a stashed sX, a peer's X) on `stream`:
  // the op, its alloc as `as`, a dependency on `after` when >= 0, windowed to step k. Returns the op.
  int input_in(int device, Stream stream, OpKind kind, int task, int l, int i, int u, int k, TensorKind as,
               int after = -1);
  // `op` waits for step consumer_step - lead_steps(op): it is prefetched at most that many steps ahead.
  void window(int op, int device, int consumer_step);
  // Backward of layer l for microbatch i at step k on `device`: brings the stashed input back from the
  // host when `stash_activations` (the data X for layer 0, else the sX swapped out at `stash_out`), and
  // under keep the saved activations (the sX swapped out at `saved_out`, when not -1); then, under
  // checkpoint, the REC op; then the BWD op depending on `ins` and the stash, with its
  // activation-gradient, stash and saved allocs/frees.
  int backward_layer(int device, int l, int i, int u, int k, bool stash_activations, std::vector<int> ins);
  // Forward of layer l for microbatch i at step k: the FWD op after `ins`, its output, the weights freed
  // when `free_weights`, and with `stash_activations` the layer's input swapped out (its op id written
  // to `stash_out`; the data of layer 0 stays on the host). Under keep the FWD also allocates the
  // layer's saved activations, swapped out by their own sX (id to `saved_out`) when `stash_activations`
  // and l < R-1 (the criterion's backward follows its forward at once). Returns the FWD op.
  // Layer l's forward for microbatch i on `device` over weights that stay on it (resident, zero2): its own step, the
  // data X in before layer 0, then forward_layer keeping the weights. Returns the FWD op.
  int forward_resident(int device, int l, int i, int u);
  int forward_layer(int device, int l, int i, int u, int k, bool stash_activations, const std::vector<int>& ins,
                    bool free_weights);
  // keep: the sX pair of layer l's saved activations for microbatch i, out after `fwd` (registered as an
  // output of step k_fwd) and, by swap_in_saved, in before the backward at step k_bwd (the in op waits
  // for the out op). swap_out_saved returns the out op; swap_in_saved the in op.
  int swap_out_saved(int device, int l, int i, int u, int fwd, int k_fwd);
  int swap_in_saved(int device, int l, int i, int u, int k_bwd);
  // The op that took layer l's input of microbatch i off `device` (a stash sX), set by forward_layer or
  // by a lowering's own swap-out; -1 when none. The saved-activation sX the same way (swap_out_saved).
  void record_stash(int device, int l, int i, int op) { stash_[slot(device, l, i)] = op; }
  int stash_of(int device, int l, int i) const { return find_slot(stash_, device, l, i); }
  int saved_of(int device, int l, int i) const { return find_slot(saved_, device, l, i); }
  // The REC (checkpoint) or nothing (keep) before the BWD of layer l, microbatch i: REC depends on `ins`
  // but an output gradient (dY: only the BWD reads it) and on the outputs of step next_step - 2, allocates the saved
  // activations the BWD frees. Returns the REC op, or -1.
  int recompute(int device, int l, int i, int u, const std::vector<int>& ins);
  bool keep() const { return policy_ == ActivationPolicy::Keep; }
  bool on_demand() const { return on_demand_; }  // plan.knobs.swap: on-demand (virtualized memory)
  Bytes sbytes(int u, int layer) const { return saved_activation_bytes(model_, u, layer); }
  // Saved-activation refs are recorded even at 0 bytes: they name the tensor the executor moves.
  void alloc_saved(int op, int l, int mb, int u);
  void free_saved(int op, int l, int mb, int u);
  // `op`, an output of step producer_step, is waited for by step producer_step + lead_steps(op).
  void output_of(int op, int device, int producer_step);
  void peer(int a, int b);  // P2P rendezvous pair (resolved at finish)
  // Collective `key`: every member waits for every other member's `ready` op (resolved at finish).
  void collective(std::uint64_t key, int op, int ready);
  // Native-model costs of an op (core::NativeOpCosts, in Program::cost): its I/O count and NVMe bytes, its host
  // gradient sum and passes, its overhead.
  void set_io(int op, int io_count, Bytes nvme_read, Bytes nvme_write);
  // Of the op's NVMe bytes, `read` and `write` overlap its host work (a pipelined optimizer swapper; at most the
  // op's own NVMe bytes).
  void set_io_overlap(int op, Bytes read, Bytes write);
  void set_host_sum(int op, Bytes bytes) { prog_.cost.edit(op).host_sum_bytes = bytes; }
  void set_host_pass(int op, Bytes bytes) { prog_.cost.edit(op).host_pass_bytes = bytes; }
  // A dWB's round trip: `return_bytes` copied back to the device after it, `extra_out_bytes` more to the host.
  void set_gradient_path(int op, Bytes return_bytes, Bytes extra_out_bytes) {
    NativeOpCosts& o = prog_.cost.edit(op);
    o.return_bytes = return_bytes;
    o.extra_out_bytes = extra_out_bytes;
  }
  void set_overhead(int op, double s) { prog_.cost.edit(op).overhead_s = s; }
  void alloc(int op, TensorKind kind, LayerRange layers, int mb, Bytes bytes);  // skipped when bytes == 0
  void free(int op, TensorKind kind, LayerRange layers, int mb, Bytes bytes);   // skipped when bytes == 0

  Bytes xbytes(int u, int layer) const { return model_.input_bytes(u, layer); }
  Bytes wbytes(int layer) const { return model_.weight_bytes(layer, layer); }
  Bytes bbytes(int layer) const { return model_.buffer_bytes(layer, layer); }
  bool has_params(int layer) const { return wbytes(layer) + bbytes(layer) > 0; }
  const Op& at(int op) const { return prog_.ops[static_cast<std::size_t>(op)]; }

  // Lays out the queues, resolves collectives and rendezvous (each side gets both sides' deps and
  // the op before its peer in the peer's queue), fills Program::devices. The builder is spent. (lower_plan adds the
  // Program's dataflow: swapping_dataflow.)
  Program finish();

 private:
  Bytes workspace(Phase ph, int u, int layer) const;
  int lead_steps(int op) const;  // 2, or 1 for a host swap (SwapIn, SwapOut) on demand
  static std::uint64_t slot(int device, int l, int i) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(device)) << 42) |
           (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 21) | static_cast<std::uint32_t>(i);
  }
  static int find_slot(const std::unordered_map<std::uint64_t, int>& m, int device, int l, int i) {
    const auto it = m.find(slot(device, l, i));
    return it == m.end() ? -1 : it->second;
  }

  const Model& model_;
  ActivationPolicy policy_;
  bool on_demand_;
  Program prog_;
  std::vector<std::vector<int>> steps_;                   // per device: compute ops in order
  std::vector<std::map<int, std::vector<int>>> waiters_;  // per device: step -> output transfers it waits for
  std::vector<std::pair<int, int>> peers_;
  std::map<std::uint64_t, std::vector<std::pair<int, int>>> collectives_;
  std::unordered_map<std::uint64_t, int> stash_;  // (device, layer, microbatch) -> its stash sX out
  std::unordered_map<std::uint64_t, int> saved_;  // (device, layer, microbatch) -> its saved sX out
};

}  // namespace detail

}  // namespace harmony::core
