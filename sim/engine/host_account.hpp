// The native engine's static host-memory account: what one iteration of a Program keeps in host memory (masters,
// optimizer state, gradients, stashes, activations, pinned staging) and on the NVMe tier, and the verdicts that
// compare an account with the machine's host, pinned and NVMe limits.
#pragma once

#include <string>
#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"

namespace harmony::sim {

// Host memory needed by one iteration (static upper bound, see docs/native-model.md): the plan result's
// host_memory (its six categories, core::HostBreakdown, and the machine's limits) and the NVMe tier. The categories:
//   master_weights_bytes   W + B of every layer
//   optimizer_state_bytes  every layer's optimizer state
//   gradient_bytes         W of every layer (dW buffers the swap-out writes into)
//   stash_bytes            every stashed X swapped out in the iteration
//   activation_bytes       Y / dX swapped out, CPU-message copies
//   staging_bytes          pinned: p2p: host only: per GPU, a double buffer of its largest P2P send; offload: nvme:
//                          also the NVMe swap buffers (two largest reads); per GPU, a bounce for its largest dWB
//                          that adds to a host gradient or is a replica's that does not write it
//                          (accumulate_bounce_bytes); mixed precision: the staging rings (core::staging_ring_bytes)
struct HostAccount : core::HostMemoryReport {
  core::Bytes nvme_bytes = 0;           // offload: nvme: master weights and optimizer state on the NVMe tier
  core::Bytes nvme_capacity_bytes = 0;  // topology.nvme.capacity (0: unlimited)
};

// The static host-memory account of one iteration of `program`. Swaps copy straight from and into the host
// tensors (pinned; no staging buffers); `p2p_staged`: P2P copies go through pinned host buffers
// (P2PMode::Host without NVLink), which count as staging buffers.
HostAccount host_account(const core::Program& program, const core::Model& model, bool p2p_staged = false);
// The most stash bytes (sX swapped out and not yet read back) the host holds at once: per device in Program order,
// a stash released by the last of the same device's swap-ins that depend on it, summed over the devices.
core::Bytes live_stash_peak_bytes(const core::Program& program);

// Per GPU, the pinned buffer where a dWB that does not copy straight into a layer's host gradient lands, chunk by
// chunk, before the CPU adds it (one that adds to what an earlier dWB of the step wrote: a later microbatch's, or
// another GPU's under l2l) or drops it (a replica of an all-reduced gradient that the lowest replica writes): its
// largest such dWB, at most chunk_bytes of its whole elements (the executor's staging chunk), widened to fp32 (twice
// a 2-byte gradient's bytes when `mixed`). Summed over the GPUs.
core::Bytes accumulate_bounce_bytes(const core::Program& program, bool mixed,
                                    core::Bytes chunk_bytes = core::kStagingChunkBytes);

// Whether `model` trains in mixed precision: a bf16 profile, or 2-byte device weights (Model::narrow_weights).
bool mixed_precision(const core::Model& model);

// The whole model's training state in host memory: the masters, the optimizer state and the gradients
// (`offload_nvme`: the gradients, the masters and optimizer state in nvme_bytes). Mixed precision: fp32 masters and
// gradients (twice the 2-byte weights), and the optimizer state less the fp32 masters its figure includes.
HostAccount host_state(const core::Model& model, bool offload_nvme);

// The part of host_account every Program of `kind` on `model` needs whatever its plan: host_state, or nothing for a
// kind whose state lives on its GPUs (PlanKindSpec::resident_state). host_account adds the plan's stashes,
// activations and staging buffers to it, so a floor over a limit puts every plan of the kind over it.
HostAccount host_floor(const core::Model& model, core::PlanKind kind, bool offload_nvme);

// The engine's host verdicts, one rule for its runs, its host floor and the searches that read a report's host
// account (a limit of 0 is unlimited): the total over the host memory; the page-locked part (the total less the
// optimizer state) over the pinned limit.
bool host_memory_exceeded(core::Bytes total_bytes, core::Bytes host_memory_bytes);
bool pinned_memory_exceeded(core::Bytes total_bytes, core::Bytes optimizer_state_bytes, core::Bytes pinned_limit_bytes);
// Either verdict on an account `h` (a host floor over them: no plan of its kind fits).
bool host_limits_exceeded(const HostAccount& h, core::Bytes host_memory_bytes, core::Bytes pinned_limit_bytes);
// Why the account `h` of a run breaks `topology`'s limits (host memory, the NVMe tier and its capacity, pinned
// memory), one sentence each in that order (the run's infeasible_reason); empty when it fits.
std::vector<std::string> host_limit_reasons(const HostAccount& h, const core::Topology& topology);

}  // namespace harmony::sim
