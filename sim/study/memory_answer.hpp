// `harmony-sim memory`: for one model, machine, GPU count and minibatch, what each plan kind's most promising plan
// needs of every memory tier (peak GPU memory, pinned host memory, host RAM, NVMe), whether it fits and which
// resource binds — from the Programs' own allocations and the native model's host account, with no timed search and
// no simulation (docs/config.md, "harmony-sim memory").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/plan/plan.hpp"
#include "core/program/program.hpp"
#include "core/search/search.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim {

// Per GPU, the most device memory `program` has in use when its ops run one at a time in the order harmony-run's
// serial executor issues them (round robin over the queues, a P2P pair or a collective's members together; an op's
// allocations and workspace at its start, its frees and workspace back at its end) — the account the native engine
// keeps, without its clock. nullopt when the order deadlocks.
std::optional<std::vector<core::Bytes>> serial_peak_bytes(const core::Program& program);

// The plans of a kind without packs nearest to fitting, for when its memory estimate drops every plan
// (core::enumerate_plans with drop_infeasible off): per activation policy and offload tier, its smallest microbatch
// (the least memory of that policy and tier). `compare` simulates those whose serial peak fits and `memory` answers
// from them, so the two commands judge the same plans.
std::vector<core::Candidate> nearest_plans(const core::Model& model, core::SearchSpace space);

// The memory tiers, in the order a verdict names them.
enum class MemoryTier { Gpu, Pinned, Host, Nvme };
const char* memory_tier_name(MemoryTier t);  // "gpu_memory", "pinned_host_memory", "host_memory", "nvme"

// What one plan needs of each tier, and the machine's limits (0 = unlimited).
struct MemoryNeeds {
  std::vector<core::Bytes> gpu_peak_bytes;  // per GPU (serial_peak_bytes)
  core::Bytes gpu_max_bytes = 0;            // the largest of them
  HostAccount host;                         // host_account of the Program (host.total_bytes(): host RAM)
  core::Bytes pinned_bytes = 0;             // host.pinned_bytes(): every host tensor a DMA copies from or into
  core::Bytes need(MemoryTier t) const;
};

struct MemoryLimits {
  core::Bytes gpu_bytes = 0;     // machine.gpu_memory (what the native engine checks)
  core::Bytes pinned_bytes = 0;  // topology.pinned_limit (0: unlimited)
  core::Bytes host_bytes = 0;    // topology.host_memory (0: unlimited)
  core::Bytes nvme_bytes = 0;    // topology.nvme.capacity (0: unlimited, or no tier: see nvme_present)
  bool nvme_present = false;
  core::Bytes limit(MemoryTier t) const;
};

// The answer for one plan kind.
struct KindMemory {
  core::PlanKind kind;     // (default: the registry's first)
  bool applicable = true;  // false: the kind cannot run this N and D at all (reason says why)
  bool has_plan = false;   // a plan was lowered and measured (needs, plan fields valid)
  bool fits = false;       // has_plan and every tier within its limit
  // the tier nearest its limit (fits) or furthest over it; without a plan, gpu_memory when no packing fits the GPU,
  // else ""
  std::string binding;
  double binding_use = 0;          // that tier's need / limit (0 when every tier is unlimited but the GPU)
  std::string reason;              // why it does not fit (or is not applicable); "" when it fits
  std::string title;               // the plan's one-line title
  std::optional<core::Plan> plan;  // the plan (has_plan)
  std::string offload;             // "cpu" / "nvme" for kinds with offload tiers, else ""
  MemoryNeeds needs;
  std::size_t candidates = 0;  // plans enumerated (every tier searched)
  std::size_t lowered = 0;     // of them, lowered and measured
};

struct MemoryAnswer {
  int gpus = 1;
  int minibatch = 1;
  MemoryLimits limits;
  std::vector<KindMemory> kinds;  // in core::plan_kinds() order
};

// Every registered plan kind: its candidates (core::enumerate_plans: the ones the packers' and
// swap decisions' estimates fit) in order of promise (core::compute_estimate_s; for baselines the
// profile's compute per GPU), the first whose Program fits every tier is its answer (at most a few are lowered);
// when none does, the one nearest to fitting among those lowered, with why. Offload tiers follow search.offload as
// `compare` does (auto: host memory, the NVMe tier when host memory binds and the machine has one).
// With `config_plan` (`--plan config`): every kind answers for that one plan instead (Harmony kinds: its
// microbatches and packs under the kind; baselines: microbatch u_bwd, activations checkpointed, as harmony-run runs a
// baseline), or is not applicable when the kind's plan rules refuse it.
MemoryAnswer answer_memory(const core::Model& model, const core::MachineSpec& machine, int gpus, int minibatch,
                           const core::SearchSpec& search, const core::Options& options,
                           const core::Plan* config_plan = nullptr);

// The answer's fields of `harmony-sim memory --format json` (schemas/memory.schema.json), added to `doc` (which holds
// the document head).
void memory_json(const MemoryAnswer& answer, nlohmann::json& doc);

// The human table (one row per kind, then the limits and a key).
void print_memory_table(const MemoryAnswer& answer, const std::string& model_name, const std::string& machine_name,
                        double wall_s);

}  // namespace harmony::sim
