// The executor's one interpreter, over a Program's dataflow, whatever its kind: the per-queue streams and events
// (QueueResources), the executor's added edges, the version analysis (FlowVersions), the step's tensor store
// (FlowStore), the groups (op_groups), the issue of a group (ordered after its preds; a host group, its ops on the
// CPU stream, waited for on the host), and every op, for every kind: weights up, moves (host channels included),
// P2P pairs, compute, collectives, gradients down, Updates, deletes, a resident kind's device state. Its parts:
// flow_interpreter.cpp, flow_compute.cpp, flow_moves.cpp, flow_collectives.cpp, flow_state.cpp, flow_update.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_shard.hpp"
#include "backend/executor/flow_store.hpp"
#include "backend/executor/flow_versions.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/device_state.hpp"
#include "core/program/host_gradients.hpp"
#include "core/program/state_layout.hpp"

namespace harmony::backend::detail {

// The executor's one interpreter: it runs every kind's Program from the Program's dataflow (what each op reads,
// writes and frees, its samples), which it resolves to versions and checks when it is built, so a missing dependency
// is refused before any step. Ops of different queues run on their own streams and worker threads (detail.hpp's lock
// discipline). A kind with resident state (PlanKindSpec::resident_state) keeps its weights, gradients and AdamW state
// in one DeviceState per device across steps: its FWD/BWD read them there, its ARD sums them in place, its Update runs
// AdamW on the device; sync_host_state() copies them back into the HostState. A resident kind that shards its state
// (fsdp and zero3 over N > 1 GPUs: its Program all-gathers and reduce-scatters) keeps one ShardState per device
// instead; one that gathers after its Updates (zero2) keeps the whole working weights in it too.
class FlowInterpreter final : public Interpreter {
 public:
  // The Program, its devices (one per GPU), the HostState the steps read and write, the options; refuses bf16 on a
  // device without bf16 kernels, a Program without its dataflow, and a data-parallel Program lowered for GPU 0 only;
  // analyses the dataflow (analyse) and makes a resident kind's DeviceStates.
  FlowInterpreter(const core::Program& program, std::vector<Device*> devices, HostState& state,
                  const ExecutorOptions& options);

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override;
  // Waits for every stream (the losses' copies, the last updates' inputs, every stream-ordered free), releases the
  // step's tensors, reports a resident kind's non-finite updates; the step's mean loss.
  double end_step() override;

  const std::vector<std::vector<int>>& extra_deps() const override { return extra; }
  std::vector<int> group(int o) const override { return groups[static_cast<std::size_t>(o)]; }
  // Event ordering (QueueResources): the host issues a group once its queues are at most run_ahead ops ahead of their
  // devices; a host group (its ops on the CPU stream: host Updates, copies between host channels) waits on the host
  // for its preds' events, the others make their streams wait for them; each member's event is recorded after the
  // group's work.
  void run(const std::vector<int>& g) override;
  void finished(int o) override { store.finished(o); }
  void abandon_step() override { store.clear(); }
  void synchronize() override { qr.synchronize(); }

 private:
  // The group's work, enqueued on its members' streams: a P2P pair (run_pair), a collective (run_ard, run_ag, run_rs:
  // its members in device order), a move (run_move), a DEL (the versions it frees dropped) or one op (run_op).
  void run_group(const std::vector<int>& g);
  // One op of no group: WB (run_wb), FWD and REC (forward), BWD (backward), dWB (run_dwb), Update (run_update).
  void run_op(int o);
  // A tensor's name, for messages and allocations: a host channel's ("host stash 3"), else its device (or the host
  // of it), kind and layer, a task's own (W, DW of a Harmony task) and its samples where it has some.
  std::string tname(const core::FlowTensor& t) const;
  // What the analysis follows as versions: every tensor but a ranged one (resolved per sample) and a resident kind's
  // W and DW (its DeviceState's), or a sharded resident kind's WShard and DWShard (its ShardState's; its gathered W
  // and full DW are versions).
  bool tracked(const core::FlowTensor& t) const {
    const bool in_state = layout.sharded
                              ? (t.kind == core::FlowKind::WShard || t.kind == core::FlowKind::DWShard ||
                                 (layout.whole_weights && t.kind == core::FlowKind::W))
                              : layout.resident && (t.kind == core::FlowKind::W || t.kind == core::FlowKind::DW);
    return !ranged(t) && !in_state && !(layout.carried && t.kind == *layout.carried && carries(t.device, t.layer));
  }
  // Whether device d carries its tensor of kind `carried` for layer l (core::StateLayout::carried_layers).
  bool carries(int d, int l) const {
    if (!layout.carried || d < 0 || static_cast<std::size_t>(d) >= layout.carried_layers.size()) return false;
    const std::vector<int>& ls = layout.carried_layers[static_cast<std::size_t>(d)];
    return std::binary_search(ls.begin(), ls.end(), l);
  }
  // X of layer 0 (op o): samples [s0, s0 + n) of the step's token ids into op o's version of tensor `id`.
  void tokens_in(int o, int id, int s0, int n);
  bool frees_pending(const Device& device) override { return qr.frees_pending(device); }
  // The version analysis over the Program's dataflow and the happens-before order `anc` (its deps, queue order and
  // `extra`): tracked tensors as versions, ranged ones per sample; and the store over it.
  void analyse_versions(const Ancestry& anc) {
    versions = FlowVersions(
        p, anc, [this](const core::FlowTensor& t) { return tracked(t); },
        [this](const core::FlowTensor& t) { return tname(t); }, [](const core::FlowTensor& t) { return ranged(t); });
    store = FlowStore(p, versions, qr);
  }

  // ---- tensors (versions in `store`) ----
  // Op o's version of tensor `id`: device memory on the tensor's device, or host memory on the host meter (a
  // swapped-out input gradient as activations, the other host tensors as stash).
  FlowData& make(int o, int id, Bytes bytes);
  // Op o reads `id` and writes its next version: in place where o is the last reader of the old one, else a copy.
  FlowData& update(int o, int id, Bytes bytes);
  // A P2P pair (send first): what the sender reads (Y: the activation, dX: the input gradient) copied device to
  // device, on the sender's stream, into the version the receiver writes; ScheduleViolation where the receiver
  // writes another tensor.
  void run_pair(int send, int recv);

  // ---- weight gradients (what ARD, RS and dWB move) ----
  // The weight gradient op o reads, as its dataflow names it (the first DW it reads: a Harmony task's, a layer's): in
  // `store`, or where the interpreter keeps it outside (state_grads).
  int dw_id(int o) const;
  void* dw_data(int o);
  // A resident kind's weight gradient of op o's device and layer (its DeviceState), else nullptr (the gradient is a
  // version in `store`).
  void* state_grads(int o);
  // Copies `count` gradient elements of device memory to fp32 host memory (bf16: staged down and widened exactly,
  // Interpreter::stage_down), then returns: the host reads the result.
  void grads_down(int o, int d, float* dst, const void* src, std::int64_t count);
  // Copies `count` fp32 host gradient elements from (*sum)[first...] to device memory (bf16: rounded once, staged
  // up), asynchronously: an fp32 copy reads the sum, which lives until o's stream has run it.
  void grads_up(int o, int d, void* dst, const std::shared_ptr<std::vector<float>>& sum, std::int64_t first,
                std::int64_t count);
  // The group's weight gradients (dw_data) brought down (widened from bf16 when stored so) and summed in fp32 in rank
  // order, as Communicator::all_reduce_sum adds: what ARD writes back to every replica and RS shards.
  std::shared_ptr<std::vector<float>> summed_dw(const std::vector<int>& g, std::int64_t count);
  // ARD, for every kind: the replicas' weight gradients (each member reads and writes one: a Harmony task's, a layer's,
  // or a resident kind's in its DeviceState) summed in rank order (as Communicator::all_reduce_sum) and written back
  // to all. With ExecutorOptions::communicator, on the devices: each member's gradient all-reduced in place on its
  // own stream; otherwise through the host.
  void run_ard(const std::vector<int>& g);

  // ---- moves (flow_moves.cpp) ----
  // X, sX, Y, dX, dY, MSGsX, MSGY (not of a P2P pair): the op's one read copied into its one write, host to device,
  // device to host, or host to host (nothing to copy where both are the same memory: a Harmony message within one
  // rank); an input that reads nothing takes the step's tokens (layer 0).
  static bool is_move(core::OpKind k);
  void run_move(int o);
  // A tensor's bytes: a forward's saved activations, or a layer's input (or its gradient) over its samples.
  Bytes tensor_bytes(int id) const;
  // Where a host tensor op o reads lives, and where one it writes goes: a version in `store` — made on the host meter,
  // or, for a ranged tensor, a view of its samples in its channel's buffer; a ranged read's samples come from the
  // versions its sample runs name (FlowVersions::sample_reads), each checked to be still stored.
  const void* host_src(int o, int id);
  void* host_dst(int o, int id, Bytes bytes);

  // ---- ranged host tensors (flow_moves.cpp) ----
  // A host tensor of no device (Harmony's host channels: activations and stashes swapped out, the copies messages
  // make) is ranged: written a microbatch at a time and read at other microbatch sizes, its reads resolved per sample
  // (FlowVersions::sample_reads). Its versions view one buffer per channel (device, kind, layer, owner) for the whole
  // minibatch, kept across steps (pinned where the devices pin) and on the host meter as harmony-sim's host account
  // has them: the stashes swapped out as stash, the rest as activations.
  static bool ranged(const core::FlowTensor& t) { return core::on_host(t.kind) && t.device < 0; }
  using Channel = std::tuple<int, core::FlowKind, int, int>;
  static Channel channel_of(const core::FlowTensor& t) { return Channel{t.device, t.kind, t.layer, t.owner}; }
  // A channel's name by its kind ("host stash", "host dX", ...), for allocations and messages.
  static const char* channel_name(core::FlowKind k);
  // The channels the Program's ranged tensors use, and their bytes (the whole minibatch each).
  std::set<Channel> channels() const;
  Bytes channel_bytes(const Channel& c) const { return Bytes(B) * per_sample(std::get<2>(c)); }
  Bytes host_bytes() const override;
  void allocate_host() override;
  // Sample s0 of tensor t's channel (allocated here if allocate_host did not foresee it).
  std::byte* channel_at(const core::FlowTensor& t, int s0);

  // ---- compute (flow_compute.cpp) ----
  // FWD or REC over op o's layers, for every kind: from its input (the dataflow's second read: the activation, or a
  // REC's stash) with its pack's weights (the first read, or a resident kind's state_weights), layer after layer;
  // writes what the dataflow says it writes (the next input Act, the saved activations Saved or RecAct, a REC's
  // inputs RecX), the rest temporaries; the head's losses into `losses` where copies_losses.
  void forward(int o);
  template <class E>
  void forward_as(int o);
  // BWD over op o's layers (last to first), for every kind: from its input (the dataflow's second read) and the
  // forward's activations it reads (Saved, or a REC's RecAct and RecX), the output gradient it reads (none where the
  // op runs the head); adds into its weight gradient (backward_dw) and writes its input gradient Grad (layer > 0).
  void backward(int o);
  template <class E>
  void backward_as(int o);
  // The weight gradient op o (a BWD) adds to: a resident kind's state_grads, else the DW the dataflow says it
  // writes — started at zero where it reads none (the step's first), else updated.
  void* backward_dw(int o);
  // The tensor of kind k and layer `layer` op o reads (its dataflow's id), or -1.
  int read_of(int o, core::FlowKind k, int layer) const;
  // A resident kind's weights of op o's device and layer (its DeviceState), else nullptr (a version in `store`).
  const void* state_weights(int o);
  // The tensor of kind k and layer `layer` op o writes (its dataflow's id), or -1.
  int written(int o, core::FlowKind k, int layer) const;
  // Whether op o (running the head) writes the step's losses: every FWD; a REC where no FWD of the Program runs the
  // head (Harmony's criterion task recomputes its forward in the backward).
  bool copies_losses(int o) const;
  // The step's mean loss; BackendError where a sample's loss was not written exactly once.
  double mean_loss() const;
  // The offset of layer l's parameters in the weights of layer range r (a pack's, one layer's: 0).
  std::int64_t w_offset(const core::LayerRange& r, int l) const {
    std::int64_t off = 0;
    for (int k = r.first; k < l; ++k) off += m.param_floats(k);
    return off;
  }

  // WB, for every kind: the host master weights of the op's layers up (bf16: rounded, staged) into what its dataflow
  // says it writes: the weights of its pack or layer (W), or this rank's shard of its layer (WShard).
  void run_wb(int o);
  // A sharded layer (zero-infinity): rank r's shard is floats [r S, min(F, (r+1) S)), S = ceil(F / N) (ZeRO pads the
  // partitions to equal sizes; the Program's shard bytes ceil(bytes / N) round the same sizes in bytes).
  std::int64_t shard_floats(int l) const { return (m.param_floats(l) + p.num_devices() - 1) / p.num_devices(); }
  std::int64_t shard_first(int l, int r) const { return std::min(m.param_floats(l), r * shard_floats(l)); }
  std::int64_t shard_len(int l, int r) const {
    return std::min(m.param_floats(l), (r + 1) * shard_floats(l)) - shard_first(l, r);
  }

  // AG (zero-infinity): every rank's shard (what each member reads) copied into every rank's full copy of the layer
  // (what each writes). RS: the ranks' full gradients (dw_id) summed in rank order; rank q keeps shard q (what it
  // writes). With ExecutorOptions::communicator, on the devices: the full gradient all-reduced in place on every rank,
  // then each rank's stream copies its shard of the sum (exact, but N times a reduce-scatter's bytes); in place needs
  // the RS to be the last reader of every member's gradient, otherwise (a later BWD would add into the sum) the host.
  // A sharded resident kind (fsdp): AG reads each rank's ShardState, and the head's tied lm_head comes from the ranks'
  // wte (gather_twin); RS writes each rank's ShardState gradient (reduced_into_shard). With whole weights (zero2) AG
  // copies each rank's updated slice into the other ranks' whole copies (gather_whole).
  void run_ag(const std::vector<int>& g);
  void run_rs(const std::vector<int>& g);

  // ---- sharded resident state (flow_shard_ops.cpp) ----
  // AG op a of layer l with whole weights: rank r's updated slice of its whole copy into every other member's whole
  // copy; for layer 0 of a tied model also the rank's part of wte into every member's (its own too) head lm_head,
  // which the head's AG leaves alone (it gathers before layer 0's update).
  void gather_whole(int a, int l, int r, const std::vector<int>& g);
  // The whole-weights order (zero2): every AG of a layer after its own device's Update of the layer and after every
  // op on any device that reads the layer's weights (layer 0's of a tied model: also the head's readers).
  void check_whole_gathers(const Ancestry& anc) const;
  // Makes one ShardState per device (state_op filled) and uploads each rank's part of the HostState.
  void make_shards();
  // How many elements of rank r's shard of layer l the all-gather copies from the shard itself: all of it, but where
  // the head's tied lm_head starts (gather_twin brings that part).
  std::int64_t gathered_len(int l, int r) const;
  // AG op a of the head (a tied model): rank r's part of wte, from its layer-0 shard, into every member's copy of
  // the head's lm_head (`full`, of group g's members in order).
  void gather_twin(int a, int r, const std::vector<int>& g, const std::vector<FlowData*>& full);
  // RS op a of layer l on device d: the reduced gradient — `full` (device memory of d, the whole sum) or, when null,
  // `sum` (fp32 host) — copied into the rank's shard gradient (the step's first RS of the layer) or added to it; for
  // the head of a tied model, its lm_head over the rank's wte range into the tie's gradient likewise.
  void reduced_into_shard(int a, int l, int d, const void* full, const std::shared_ptr<std::vector<float>>& sum);
  // dst (n elements of device d) = its own value + [from, from + n) of the sum (copied when fresh).
  void shard_put(int a, int d, void* dst, std::int64_t from, std::int64_t n, bool fresh, const void* full,
                 const std::shared_ptr<std::vector<float>>& sum);
  // A sharded Program moves no weights or gradients to or from the host and all-reduces none; on every device it
  // updates each layer with parameters once, on the device, after every AG (which reads the shard) and RS (which
  // writes its gradient) of the layer on that device (layer 0 of a tied model: also the head's).
  void check_shard_updates(const Ancestry& anc) const;

  // ---- carried parameters (flow_carried.cpp) ----
  // A kind without resident state whose Program sends the updated weights up in the update pass, for the next step
  // (zero3-opt-offload: every GPU keeps its parameter shard, WShard, or over one GPU the whole layer, W), carries
  // those weights across steps: per device and layer one buffer (`carried_w`), filled from the host masters when the
  // executor is built (bf16: rounded, as a WB does) and by the update pass's WBs; the AGs (WShard) or the compute ops
  // (W) read it. core::state_layout says which Program does.
  // Allocates and fills the carried buffers (one per device and layer with parameters), each from its update-pass WB's
  // op (its stream), and waits for them.
  void make_carried();
  // The carried buffer of device d and layer l, or nullptr.
  void* carried_at(int d, int l);
  // An update-pass WB (o): the host masters of its layer (its rank's shard) up into the carried buffer; with a tied
  // model layer 0's WB also refreshes the device's carried part of the head's lm_head, which the host update of layer
  // 0 rewrote after the head's WB ran.
  void carried_up(int o);
  // The carried order, checked when the executor is built: every update-pass WB after its layer's Update and after
  // every op on any device that reads the layer's carried weights (an AG of the layer, or over one GPU a FWD, REC or
  // BWD of it; layer 0's also after the head's).
  void check_carried(const Ancestry& anc) const;

  // ---- device updates over host state (flow_streamed.cpp; host-stream) ----
  // A Program without resident state whose Updates run on the GPUs (core::StateLayout::device_update): the update
  // pass's WB brings layer l's AdamW state into a device block (Opt: exp_avg, exp_avg_sq, bf16's fp32 masters, one
  // non-finite flag per parameter tensor, and for layer 0 of a tied model whose head streams, the head's lm_head
  // gradient from the host) and, for a layer whose weights stream, its masters (W) and summed host gradient (DW); the
  // Update runs Kernels<S>::adamw over them (a carried layer's weights in place, layer 0's tie with the head's
  // gradient and carried lm_head on the GPU); the update pass's dWB takes the masters and moments home (the head's
  // tied lm_head left to layer 0's, which makes it wte's again on the host, HostState::sync_tied).
  struct OptBlock {
    Bytes m = 0, v = 0, master = 0, flags = 0, tie = 0, total = 0;  // byte offsets in the block, and its size
    std::int64_t tie_numel = 0;                                     // the tie's gradient elements (0: none)
  };
  OptBlock opt_block(int d, int l) const;
  int written_or_throw(int o, core::FlowKind k) const;
  void stream_state_in(int o);
  void device_update(int o);
  template <class E>
  void device_update_as(int o);
  void stream_state_out(int o);
  // Checked when the executor is built: every layer with parameters updated once on its GPU between an update-pass
  // WB and dWB; the update after every op of its GPU that reads the carried weights it rewrites (layer 0's: the head's
  // too); the dWB after every WB of the forward and backward that reads the host masters it overwrites; the WB after
  // every writer of the host gradient it brings; layer 0's update of a tied model whose head is carried reads the
  // head's gradient as its last BWD left it, before the head's update (`tie_grad`).
  void check_streamed_updates(const Ancestry& anc);

  // ---- gradients out and Updates (flow_update.cpp) ----
  // The analysis every kind runs when the executor is built: the Program's dataflow present, the groups, the host
  // gradients' writers and the Updates' edges (plan_updates), the versions over the Program's order and the tie (the
  // edges that order the writers would hide a missing dependency), the Program's frees and Updates checked, then the
  // writers' edges joined (ScheduleViolation on a cycle).
  void analyse();
  // The host gradient policy, one for every kind: a layer has one host gradient (HostState::grads), written by the
  // dWBs of its layer range (a pack's layers, or a rank's shard: what the dWB reads, DW or DWShard). An all-reduced
  // range (ARD: every replica brings the same sum) is written by its lowest replica's dWBs alone; the other replicas'
  // land in their queue's bounce buffer, unused, and wait for nobody (ordering them after each other would hold their
  // device gradients longer). A sharded range's (RS) ranks write their own shards. The first writer of a range (per
  // rank, sharded) copies straight into it; the later ones add through their queue's bounce buffer, each after the
  // previous writer (writers in (device, queue) order; a sharded range's ranks write disjoint shards and do not wait
  // for each other). Each range is updated once, by its lowest device's Update (the owner), after every writer of the
  // range; the tie: the Update of layer 0 also reads the head's lm_head gradient (HostState::update), so it waits for
  // the head's writers too (core::Model cannot express it). A resident kind's Update of layer 0 waits for the head's
  // BWD and ARD on its device instead. The writers and the bounces are core::host_gradients, the rule harmony-sim's
  // host account counts the same bounce buffers by (sim::accumulate_bounce_bytes).
  void plan_updates();
  // The dWBs whose gradient Update u needs, the tie's included: its own device's for an all-reduced range
  // (the Program orders them), else every one of the range.
  std::vector<int> update_sources(int u) const;
  // Every Update comes after the dWBs of update_sources and every WB that reads the host weights it overwrites
  // (its layers; layer 0 also the head's tied lm_head); every layer with parameters is updated.
  void check_updates(const Ancestry& anc) const;
  // A resident Program moves no weights or gradients to or from the host, and on every device updates each layer with
  // parameters exactly once, on the device, after every op of that device that reads the layer's weights or adds to
  // its gradient (layer 0's also after the head's: the tied lm_head gradient joins wte's update).
  void check_resident_updates(const Ancestry& anc) const;
  // A resident or sharded Program's Updates per (device, layer): each layer with parameters updated exactly once on
  // every device (BackendError naming the op updating a second time, or the layer and GPU never updated).
  std::map<std::pair<int, int>, int> device_updates() const;
  // dWB: the gradient op o reads into its part of the host gradient (plan_updates' policy).
  void run_dwb(int o);
  // Update: AdamW on the host masters of the op's layers, by the range's owner once its sources brought this step's
  // gradients (the others do nothing: the replicas' Updates see the same sum); a resident kind's on the device.
  void run_update(int o);
  // The tensor of weight gradient op o (a dWB) reads: DW, or a rank's DWShard.
  int grad_read(int o) const;
  // Per step: nothing brought to the host yet.
  void begin_updates() { brought.assign(p.ops.size(), 0); }

  // ---- resident state (flow_state.cpp) ----
  // A kind with resident state (PlanKindSpec::resident_state) keeps its weights, gradients and AdamW state in one
  // DeviceState per device across steps (`states`, empty otherwise): make_states fills them from the HostState
  // (bf16: masters exact, working copies rounded); the compute ops and ARD read them (state_weights, state_grads);
  // each step zeroes the gradients first (zero_state_grads) and reports non-finite updates last (note_state_nonfinite);
  // an Update on a device runs AdamW there (state_update); sync_host_state copies device 0's back to the HostState.
  // Sharded (layout.sharded): one ShardState per device in `shards` instead (make_shards), the same entry points
  // clearing its reduce-scatters' first-of-step marks, ORing every rank's non-finite flags, updating the rank's shard
  // and copying every rank's part back.
  void make_states();
  // The stream a device's state work runs on: its compute queue's (every FWD, BWD, ARD and Update of a resident
  // Program is there), so zeroing the gradients, accumulating, summing and updating follow each other in stream order.
  Stream& state_stream(int d) { return S(state_op[static_cast<std::size_t>(d)]); }
  void zero_state_grads();
  void note_state_nonfinite();
  void state_update(int o);

 public:
  void sync_host_state() override;

 private:
  // Host master weights up for op o (WB): `src` (fp32 spans of HostState::weights, concatenated) into device memory
  // `dst` on o's stream — bf16: rounded to nearest even on the host and staged up; fp32: copied, read when the copy
  // runs (the Updates that overwrite the masters wait for o's event).
  void weights_up(int o, void* dst, std::span<const std::span<const float>> src);

  // ---- helpers ----
  const core::Op& at(int o) const { return p.ops[static_cast<std::size_t>(o)]; }
  // Op o's dataflow (Program::dataflow): its pass, layers, samples and tensors.
  const core::OpFlow& flow(int o) const { return p.dataflow.ops[static_cast<std::size_t>(o)]; }
  std::string label(int o) const { return op_name(p, o); }
  Device& D(int d) { return *devs[static_cast<std::size_t>(d)]; }
  Stream& S(int o) { return qr.stream(o); }  // the stream of op o's queue
  // Waits for op o's stream with the interpreter's lock released, so other queues' ops proceed meanwhile: only
  // where the host reads what o's work brought down.
  void sync(int o) { wait_unlocked(S(o)); }
  // A temporary of op o's work, freed when o's stream has run past it.
  void release_after(int o, Buffer& b) { qr.release_after(o, std::move(b)); }
  // Host memory an async copy of op o reads (a bf16 staging buffer, a host sum): kept until o's stream has run past
  // the copy.
  void keep_until_done(int o, std::shared_ptr<void> held) { qr.release_after(S(o), at(o).device, std::move(held)); }
  Bytes per_sample(int l) const { return m.input_bytes(l, 1, T, dt); }  // a layer's input, one sample

  const core::Program& p;
  std::vector<Device*> devs;
  HostState& st;
  ExecutorOptions opt;
  const Gpt2& m;
  int B = 0, T = 0;       // minibatch, sequence length
  DType dt = DType::F32;  // device storage; bf16: the host rounds weights on their way up, widens gradients back
  Bytes es = 4;           // bytes per device element
  // what the Program keeps between steps (core::state_layout): resident (W, DW and AdamW state in `states`, or
  // sharded in `shards`), whole weights (W in the ShardStates, gathered after the Updates), carried (W or WShard kept
  // across steps in `carried_w`), device updates over host state
  const core::StateLayout layout;
  std::vector<std::vector<Buffer>> carried_w;  // carried: per device, per layer (empty where it carries none)
  std::vector<FlowVersion> tie_grad;           // device updates: per layer 0's Update, the head's gradient it adds
  QueueResources qr;                           // per queue: its stream, events, AdamW pool
  std::vector<std::vector<int>> extra;         // per op: the executor's added edges (extra_deps)
  FlowVersions versions;                       // which version each read sees, the reads per version
  FlowStore store;                             // the step's tensor versions
  std::vector<std::vector<int>> groups;        // per op: the ops run with it (op_groups)
  std::vector<int> state_op;                   // resident: per device, an op of its compute queue (state_stream)
  std::vector<std::unique_ptr<DeviceState>> states;  // resident: per device; after qr, whose streams they use
  std::vector<std::unique_ptr<ShardState>> shards;   // sharded resident: per device (rank), likewise
  core::HostGradients hg;                            // plan_updates: which dWBs write the host gradients, and how
  std::vector<char> owner;                           // per op: an Update that runs AdamW (its range's lowest device's)
  std::vector<std::vector<int>> write_edges;         // per op: the edges ordering the writers (joined into extra last)
  // Per queue: where a dWB that adds to a host gradient (or a replica's that does not write) lands first, chunk by
  // chunk: as large as its largest such dWB in fp32, at most staging_chunk_bytes; kept across steps (pinned in a real
  // system), metered as staging.
  struct Bounce {
    std::vector<float> floats;
    MeteredBytes metered;
  };
  std::map<std::size_t, Bounce> bounce;
  struct ChannelMemory {
    HostBuffer data;       // the whole minibatch; kept across steps
    MeteredBytes metered;  // on the host meter
  };
  std::map<Channel, ChannelMemory> channel_mem;  // per channel of the ranged tensors
  // per step
  std::span<const std::int32_t> in, tgt;   // the step's inputs and targets
  std::vector<float> losses;               // per token: the head's losses
  std::vector<std::uint8_t> loss_written;  // per sample: how many ops wrote its losses
  std::vector<char> brought;               // per op: the dWB ran this step
};

}  // namespace harmony::backend::detail
