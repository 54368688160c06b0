// The memory answer (sim/study/memory_answer.hpp): each kind's candidates in order of promise, the first whose
// Program's serial allocation replay and host account fit the machine, and the tier that binds.
#include "sim/study/memory_answer.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/index.hpp"
#include "core/kinds/kinds.hpp"
#include "core/output/host_memory.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"

namespace harmony::sim {

namespace {

using core::ix;

// At most this many candidates of a kind (per offload tier) are lowered and replayed: the packers and swap
// decisions already fit their estimates to the GPU, so the first almost always fits; a kind none of whose first
// candidates fits is answered with the one nearest to fitting.
constexpr std::size_t kMaxLowered = 8;

}  // namespace

std::vector<core::Candidate> nearest_plans(const core::Model& model, core::SearchSpace space) {
  space.drop_infeasible = false;
  std::vector<core::Candidate> nearest;
  for (core::Candidate& c : core::enumerate_plans(model, space)) {
    const bool later = std::any_of(nearest.begin(), nearest.end(), [&](const core::Candidate& n) {
      return n.plan.knobs.activation_policy == c.plan.knobs.activation_policy &&
             n.plan.knobs.offload == c.plan.knobs.offload && n.plan.u_bwd <= c.plan.u_bwd;
    });
    if (!later) nearest.push_back(std::move(c));
  }
  return nearest;
}

std::optional<std::vector<core::Bytes>> serial_peak_bytes(const core::Program& p) {
  int devices = std::max(p.num_devices(), 1);
  for (const core::Op& op : p.ops) devices = std::max(devices, op.device + 1);
  std::vector<core::Bytes> mem(ix(devices), 0), peak(ix(devices), 0);
  const std::vector<std::vector<int>> groups = core::op_groups(p);  // as harmony-run's executor groups them
  std::vector<char> done(p.ops.size(), 0);
  std::vector<std::size_t> head(p.queues.size(), 0);
  auto ready = [&](int o) {
    const core::Op& op = p.ops[ix(o)];
    if (op.queue < 0 || head[ix(op.queue)] != ix(op.queue_pos)) return false;
    return std::all_of(op.deps.begin(), op.deps.end(), [&](int d) { return done[ix(d)] != 0; });
  };
  std::size_t left = p.ops.size();
  while (left > 0) {
    bool progress = false;
    for (std::size_t q = 0; q < p.queues.size(); ++q) {
      if (head[q] >= p.queues[q].ops.size()) continue;
      const int o = p.queues[q].ops[head[q]];
      const std::vector<int>& group = groups[ix(o)];
      if (!std::all_of(group.begin(), group.end(), ready)) continue;
      for (int g : group) {  // allocations and workspace when the op begins
        const core::Op& op = p.ops[ix(g)];
        core::Bytes b = op.workspace_bytes;
        for (const auto& t : op.allocs) b += t.bytes;
        mem[ix(op.device)] += b;
        peak[ix(op.device)] = std::max(peak[ix(op.device)], mem[ix(op.device)]);
      }
      for (int g : group) {  // frees and workspace back when it ends (clamped at 0, as the engine does)
        const core::Op& op = p.ops[ix(g)];
        core::Bytes b = op.workspace_bytes;
        for (const auto& t : op.frees) b += t.bytes;
        core::Bytes& m = mem[ix(op.device)];
        m = b > m ? 0 : m - b;
        done[ix(g)] = 1;
        ++head[ix(op.queue)];
      }
      left -= group.size();
      progress = true;
    }
    if (!progress) return std::nullopt;
  }
  peak.resize(ix(std::max(p.num_devices(), 1)));
  return peak;
}

const char* memory_tier_name(MemoryTier t) {
  switch (t) {
    case MemoryTier::Gpu:
      return "gpu_memory";
    case MemoryTier::Pinned:
      return "pinned_host_memory";
    case MemoryTier::Host:
      return "host_memory";
    case MemoryTier::Nvme:
      return "nvme";
  }
  return "?";
}

core::Bytes MemoryNeeds::need(MemoryTier t) const {
  switch (t) {
    case MemoryTier::Gpu:
      return gpu_max_bytes;
    case MemoryTier::Pinned:
      return pinned_bytes;
    case MemoryTier::Host:
      return host.total_bytes();
    case MemoryTier::Nvme:
      return host.nvme_bytes;
  }
  return 0;
}

core::Bytes MemoryLimits::limit(MemoryTier t) const {
  switch (t) {
    case MemoryTier::Gpu:
      return gpu_bytes;
    case MemoryTier::Pinned:
      return pinned_bytes;
    case MemoryTier::Host:
      return host_bytes;
    case MemoryTier::Nvme:
      return nvme_bytes;
  }
  return 0;
}

namespace {

constexpr MemoryTier kTiers[] = {MemoryTier::Gpu, MemoryTier::Pinned, MemoryTier::Host, MemoryTier::Nvme};

std::string gib(core::Bytes b) {
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / static_cast<double>(core::kGiB));
}
std::string size_text(core::Bytes b) {
  return b >= core::kGiB ? gib(b) : fmt::format("{:.2f} MiB", static_cast<double>(b) / static_cast<double>(core::kMiB));
}

// The verdict on one plan's needs: fits, the binding tier and its use, the reason when over.
struct Verdict {
  bool fits = true;
  MemoryTier binding = MemoryTier::Gpu;
  double use = 0;
  std::string reason;
};

Verdict judge(const MemoryNeeds& n, const MemoryLimits& l) {
  Verdict v;
  v.use = -1;
  for (MemoryTier t : kTiers) {
    const core::Bytes need = n.need(t), limit = l.limit(t);
    if (t == MemoryTier::Nvme && need > 0 && !l.nvme_present) {
      v.fits = false;
      v.binding = t;
      v.use = std::numeric_limits<double>::infinity();
      v.reason = "the plan keeps parameters and optimizer state on NVMe, but the machine has no topology.nvme";
      continue;
    }
    if (limit == 0) continue;
    const double use = static_cast<double>(need) / static_cast<double>(limit);
    if (need > limit) {
      v.fits = false;
      v.reason += fmt::format("{}{} needs {} > {} by {} bytes", v.reason.empty() ? "" : "; ", memory_tier_name(t),
                              size_text(need), size_text(limit), need - limit);
    }
    if (use > v.use) {
      v.use = use;
      v.binding = t;
    }
  }
  v.use = std::max(v.use, 0.0);
  return v;
}

// Plan-independent: the machine's limits (its topology's, else the derived one: host memory unlimited).
MemoryLimits limits_of(const core::MachineSpec& machine) {
  MemoryLimits l;
  l.gpu_bytes = machine.gpu_memory_bytes;
  if (machine.topology.valid()) {
    const core::Topology& t = machine.topology;
    l.host_bytes = t.host_memory_bytes;
    l.pinned_bytes = t.pinned_limit_bytes;
    l.nvme_present = t.nvme.present();
    l.nvme_bytes = t.nvme.capacity_bytes;
  }
  return l;
}

bool p2p_staged(const core::MachineSpec& machine) {
  return machine.topology.valid() && machine.topology.p2p == core::P2PMode::Host;
}

// The Program's needs; nullopt when its serial order deadlocks.
std::optional<MemoryNeeds> needs_of(const core::Program& program, const core::Model& model,
                                    const core::MachineSpec& machine) {
  auto peaks = serial_peak_bytes(program);
  if (!peaks) return std::nullopt;
  MemoryNeeds n;
  n.gpu_peak_bytes = std::move(*peaks);
  n.gpu_max_bytes = n.gpu_peak_bytes.empty() ? 0 : *std::max_element(n.gpu_peak_bytes.begin(), n.gpu_peak_bytes.end());
  n.host = host_account(program, model, p2p_staged(machine));
  n.pinned_bytes = n.host.pinned_bytes();
  return n;
}

// One candidate of a kind, lowered lazily.
struct Cand {
  double estimate_s = 0;
  int u = 0;  // tie-break: the larger microbatch first
  std::size_t index = 0;
};

// Tries candidates in order (at most kMaxLowered; one when the host floor is over a limit): the first that fits is
// the answer, else the one nearest to fitting (least need / limit on its binding tier).
// `lower(i)` lowers candidate i and sets the plan fields of `kr` for it (returns false when it cannot be lowered).
template <class Lower>
void try_candidates(KindMemory& kr, std::vector<Cand> cands, const MemoryLimits& limits, const core::Model& model,
                    const core::MachineSpec& machine, bool nvme, Lower lower) {
  // when the part of the host account every plan of the kind needs (sim::host_floor) is over a limit, no plan can
  // fit: the first candidate lowered names the miss
  const HostAccount floor = host_floor(model, kr.kind, nvme);
  const bool unfit = host_limits_exceeded(floor, limits.host_bytes, limits.pinned_bytes);
  const std::size_t max_lowered = unfit ? 1 : kMaxLowered;
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.estimate_s != b.estimate_s ? a.estimate_s < b.estimate_s : a.u > b.u;
  });
  std::optional<KindMemory> least;
  std::size_t deadlocked = 0;
  for (std::size_t i = 0; i < cands.size() && kr.lowered < max_lowered; ++i) {
    KindMemory k = kr;
    std::optional<core::Program> program;
    try {
      program = lower(cands[i].index, k);
    } catch (const core::ScheduleError&) {
      continue;  // not a plan this model can run: not a candidate
    }
    ++kr.lowered;
    auto needs = needs_of(*program, model, machine);
    if (!needs) {
      ++deadlocked;
      continue;
    }
    k.needs = std::move(*needs);
    k.has_plan = true;
    const Verdict v = judge(k.needs, limits);
    k.fits = v.fits;
    k.binding = memory_tier_name(v.binding);
    k.binding_use = v.use;
    k.reason = v.reason;
    k.lowered = kr.lowered;
    if (v.fits) {
      kr = std::move(k);
      return;
    }
    if (!least || k.binding_use < least->binding_use) least = std::move(k);
  }
  if (least) {
    const std::size_t lowered = kr.lowered;
    kr = std::move(*least);
    kr.lowered = lowered;
    const std::string which =
        kr.candidates == 1
            ? (kr.kind->one_microbatch
                   ? fmt::format("{} runs each GPU's share as one microbatch (u {}), and that plan does not fit",
                                 kr.kind.name(), kr.plan ? kr.plan->u_bwd : 0)
                   : std::string("the plan does not fit"))
            : fmt::format("none of the {} most promising of {} plans fits; the nearest", lowered, kr.candidates);
    kr.reason = unfit ? fmt::format(
                            "the masters, optimizer state and gradients alone ({}) are over the host's limit, "
                            "so no plan fits; the first: {}",
                            size_text(floor.total_bytes()), kr.reason)
                      : fmt::format("{}: {}", which, kr.reason);
  } else if (deadlocked > 0) {
    kr.reason = fmt::format("all {} plans lowered deadlock", deadlocked);
  }
}

// The profile's compute per GPU of a plan, the order its kind's candidates are tried in. Kinds with packs: the
// search's own estimate (forward packs at u_fwd, recompute and backward at u_bwd). The others: their microbatches, each
// a forward and a backward of every layer (the profile's backward includes the recompute's forward; keep does not
// recompute), over the stages of a kind that is not data parallel.
double estimate_s(const core::Candidate& c, const core::Model& model, const core::SearchSpace& space) {
  const core::Plan& p = c.plan;
  if (p.kind->packs) return core::compute_estimate_s(model, c, space);
  const int share = p.kind->data_parallel ? p.minibatch / p.gpus : p.minibatch;
  double per = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    per += model.time_s(core::Phase::Bwd, p.u_bwd, l);
    if (p.knobs.activation_policy == core::ActivationPolicy::Checkpoint)
      per += model.time_s(core::Phase::Fwd, p.u_bwd, l);
  }
  if (!p.kind->data_parallel) per /= p.gpus;
  const int microbatches = share / std::max(p.u_bwd, 1);  // u divides the share (the kind's enumeration)
  return static_cast<double>(microbatches) * per;
}

// One kind's candidates on one offload tier: the kind's own enumeration (or the config's plan), tried in order of
// promise until one fits (try_candidates).
void answer_tier(KindMemory& kr, const core::Model& model, const core::MachineSpec& machine, core::SearchSpace space,
                 const core::Options& options, bool nvme, const MemoryLimits& limits, const core::Plan* config_plan) {
  const core::PlanKind kind = kr.kind;
  space.offloads = {nvme ? core::OffloadTier::Nvme : core::OffloadTier::Cpu};
  std::vector<core::Candidate> cands;
  if (config_plan) {
    core::Candidate c{*config_plan, "", ""};
    c.plan.kind = kind;
    c.plan.knobs = space.knobs;
    c.plan.knobs.offload = space.offloads.front();
    // the config's activation policy (plan.activations) for every kind that takes one: the plan asked about
    if (kind.has_knob(core::Knob::Activations)) c.plan.knobs.activation_policy = config_plan->knobs.activation_policy;
    if (!kind->packs) {  // one microbatch size (u_bwd), as harmony-run runs such a kind
      c.plan.u_fwd = c.plan.u_bwd;
      c.plan.packs_fwd.clear();
      c.plan.packs_bwd.clear();
    }
    cands.push_back(std::move(c));
  } else {
    cands = core::enumerate_plans(model, space);
    // none fits the swap decisions' estimate: the nearest of them (compare judges the same ones), and why
    if (cands.empty() && !kind->packs) cands = nearest_plans(model, space);
  }
  kr.candidates += cands.size();
  std::vector<Cand> order;
  order.reserve(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i)
    order.push_back({estimate_s(cands[i], model, space), cands[i].plan.u_bwd, i});
  core::LowerOptions lower = core::lower_options(options);
  lower.dp_first_gpu_only = false;  // every replica: each holds its own stashes on the host
  lower.offload_nvme = nvme;
  try_candidates(kr, std::move(order), limits, model, machine, nvme, [&](std::size_t i, KindMemory& k) {
    const core::Plan& plan = cands[i].plan;
    core::validate_plan(plan, model);
    k.plan = plan;
    k.title = core::describe_plan(plan, model);
    k.offload = kind->offload_tiers ? (nvme ? "nvme" : "cpu") : "";
    return core::lower_plan(plan, model, lower);
  });
  if (!kr.has_plan && kr.reason.empty()) {
    if (kind->packs) {  // the packers found nothing within the GPU: it binds
      kr.reason =
          fmt::format("no layer packing fits {} per GPU at any microbatch size", size_text(space.capacity_bytes));
      kr.binding = memory_tier_name(MemoryTier::Gpu);
    } else {
      const int share = kind->data_parallel ? space.minibatch / space.gpus : space.minibatch;
      kr.reason =
          kind->one_microbatch
              ? fmt::format("{} runs each GPU's {} samples as one microbatch, outside the profiled sizes (up to {})",
                            kind.name(), share,
                            std::min(model.ubatch_max(core::Phase::Fwd), model.ubatch_max(core::Phase::Bwd)))
              : "no microbatch size of the profile divides each GPU's share of the minibatch";
    }
  }
}

// host memory (or pinned memory) is what keeps the answer from fitting
bool host_bound(const KindMemory& k) {
  return k.has_plan && !k.fits &&
         (k.binding == memory_tier_name(MemoryTier::Host) || k.binding == memory_tier_name(MemoryTier::Pinned));
}

// search.offload, as compare applies it: nvme only the drives, cpu only host memory, auto host memory then the
// drives when host memory binds and the machine has them. `tier(nvme)` answers into a fresh KindMemory.
template <class Tier>
KindMemory offload_tiers(core::PlanKind kind, core::SearchSpec::Offload offload, const MemoryLimits& limits,
                         const core::MachineSpec& machine, Tier tier) {
  using Offload = core::SearchSpec::Offload;
  auto fresh = [&] {
    KindMemory k;
    k.kind = kind;
    return k;
  };
  if (!kind->offload_tiers) return tier(fresh(), false);
  if (offload == Offload::Nvme) {
    if (!limits.nvme_present) {
      KindMemory k = fresh();
      k.applicable = false;
      k.reason = fmt::format("search.offload: nvme, but machine '{}' has no topology.nvme", machine.name);
      return k;
    }
    return tier(fresh(), true);
  }
  KindMemory cpu = tier(fresh(), false);
  if (offload == Offload::Cpu || cpu.fits || !limits.nvme_present || !host_bound(cpu)) return cpu;
  KindMemory drives = tier(fresh(), true);
  drives.candidates += cpu.candidates;
  drives.lowered += cpu.lowered;
  if (!drives.fits) drives.reason = fmt::format("offload cpu: {}; offload nvme: {}", cpu.reason, drives.reason);
  return drives;
}

KindMemory answer_kind(core::PlanKind kind, const core::Model& model, const core::MachineSpec& machine, int gpus,
                       int minibatch, const core::SearchSpec& search, const core::Options& options,
                       const MemoryLimits& limits, const core::Plan* config_plan) {
  std::optional<core::PlanProblem> problem = core::split_problem(kind, gpus, minibatch);
  if (!problem) problem = core::stage_problem(kind, gpus, model.num_layers());  // kinds with a stage per GPU
  if (!problem && config_plan) {  // the config's plan under this kind's rules (a kind without packs reads u_bwd alone)
    std::vector<std::pair<std::string, int>> us = {{"plan.u_bwd", config_plan->u_bwd}};
    if (kind->packs && !config_plan->packs_fwd.empty()) us.insert(us.begin(), {"plan.u_fwd", config_plan->u_fwd});
    const auto problems = core::plan_problems(kind, gpus, minibatch, us);
    if (!problems.empty()) problem = problems.front();
  }
  if (problem) {
    KindMemory k;
    k.kind = kind;
    k.applicable = false;
    k.reason = problem->message;
    return k;
  }
  core::SearchSpec spec = search;
  spec.threads = 1;
  core::SearchSpace space = core::search_space_for(kind, gpus, minibatch, machine.search_capacity_bytes(), spec,
                                                   options.unequal_microbatches);
  // search.swap is for the tools that search (docs/config.md): the answer prices the scheduled swappers.
  space.knobs.swap = core::SwapTiming::Scheduled;
  // Activation checkpointing only (the factory's default): the swapping runtimes' default and harmony-run's; keep
  // holds more at every u. With --plan config, the config's plan.activations (answer_tier).
  return offload_tiers(kind, search.offload, limits, machine, [&](KindMemory k, bool nvme) {
    answer_tier(k, model, machine, space, options, nvme, limits, config_plan);
    return k;
  });
}

}  // namespace

MemoryAnswer answer_memory(const core::Model& model, const core::MachineSpec& machine, int gpus, int minibatch,
                           const core::SearchSpec& search, const core::Options& options,
                           const core::Plan* config_plan) {
  MemoryAnswer a;
  a.gpus = gpus;
  a.minibatch = minibatch;
  a.limits = limits_of(machine);
  for (const core::PlanKind kind : core::plan_kinds())
    a.kinds.push_back(answer_kind(kind, model, machine, gpus, minibatch, search, options, a.limits, config_plan));
  return a;
}

namespace {

nlohmann::json bytes_or_null(core::Bytes b) { return b > 0 ? nlohmann::json(b) : nlohmann::json(nullptr); }

nlohmann::json plan_json(const KindMemory& k) {
  using nlohmann::json;
  if (!k.has_plan) return nullptr;
  json p = {{"title", k.title}, {"offload", k.offload.empty() ? json(nullptr) : json(k.offload)}};
  const core::Plan& plan = *k.plan;
  p["u_fwd"] = plan.u_fwd;
  p["u_bwd"] = plan.u_bwd;
  if (plan.kind->packs) {
    p["packs_fwd"] = core::packs_to_json(plan.packs_fwd);
    p["packs_bwd"] = core::packs_to_json(plan.packs_bwd);
    p["activation_policy"] = "checkpoint";  // Harmony's plans always recompute
  } else {
    p["packs_fwd"] = nullptr;
    p["packs_bwd"] = nullptr;
    p["activation_policy"] = core::activation_policy_name(plan.knobs.activation_policy);
  }
  return p;
}

nlohmann::json needs_json(const KindMemory& k) {
  using nlohmann::json;
  if (!k.has_plan) return nullptr;
  const MemoryNeeds& n = k.needs;
  const HostAccount& h = n.host;
  return {{"gpu_peak_bytes", n.gpu_max_bytes},   {"per_gpu_peak_bytes", n.gpu_peak_bytes},
          {"pinned_host_bytes", n.pinned_bytes}, {"host_bytes", h.total_bytes()},
          {"nvme_bytes", h.nvme_bytes},          {"host", core::host_breakdown_json(h, core::kPinnedStagingKey)}};
}

}  // namespace

void memory_json(const MemoryAnswer& a, nlohmann::json& doc) {
  using nlohmann::json;
  doc["gpus"] = a.gpus;
  doc["minibatch"] = a.minibatch;
  doc["limits"] = {{"gpu_memory_bytes", a.limits.gpu_bytes},
                   {"pinned_host_bytes", bytes_or_null(a.limits.pinned_bytes)},
                   {"host_bytes", bytes_or_null(a.limits.host_bytes)},
                   {"nvme_bytes", a.limits.nvme_present ? bytes_or_null(a.limits.nvme_bytes) : json(nullptr)},
                   {"nvme_present", a.limits.nvme_present}};
  json results = json::array();
  for (const KindMemory& k : a.kinds) {
    results.push_back({{"plan_kind", core::plan_kind_name(k.kind)},
                       {"applicable", k.applicable},
                       {"fits", k.fits},
                       {"binding", k.binding.empty() ? json(nullptr) : json(k.binding)},
                       {"binding_use", k.has_plan ? json(k.binding_use) : json(nullptr)},
                       {"reason", k.reason.empty() ? json(nullptr) : json(k.reason)},
                       {"num_candidates", k.candidates},
                       {"num_lowered", k.lowered},
                       {"plan", plan_json(k)},
                       {"needs", needs_json(k)}});
  }
  doc["results"] = std::move(results);
}

void print_memory_table(const MemoryAnswer& a, const std::string& model_name, const std::string& machine_name,
                        double wall_s) {
  const MemoryLimits& l = a.limits;
  auto lim = [](core::Bytes b) { return b > 0 ? size_text(b) : std::string("unlimited"); };
  fmt::print("memory: {} on {} ({} GPUs used), minibatch {}; {:.1f} ms\n", model_name, machine_name, a.gpus,
             a.minibatch, wall_s * 1e3);
  fmt::print("limits: GPU {} each, pinned host {}, host RAM {}, NVMe {}\n\n", size_text(l.gpu_bytes),
             lim(l.pinned_bytes), lim(l.host_bytes), l.nvme_present ? lim(l.nvme_bytes) : std::string("none"));
  fmt::print("{:<{}} {:>5} {:>12} {:>12} {:>12} {:>12}  {:<26} {}\n", "plan kind", core::kind_column_width(), "fits",
             "GPU peak", "pinned", "host RAM", "NVMe", "binds", "plan / reason");
  for (const KindMemory& k : a.kinds) {
    const std::string name = core::plan_kind_name(k.kind);
    if (!k.has_plan) {
      fmt::print("{:<{}} {:>5} {:>12} {:>12} {:>12} {:>12}  {:<26} {}\n", name, core::kind_column_width(), "-", "-",
                 "-", "-", "-",
                 !k.applicable       ? "not applicable"
                 : k.binding.empty() ? "no plan"
                                     : k.binding + " (no plan)",
                 k.reason);
      continue;
    }
    const MemoryNeeds& n = k.needs;
    const std::string binds = fmt::format("{} {:.0f}%", k.binding, 100.0 * k.binding_use);
    // the packs themselves are in --format json; a line says how many
    const core::Plan& p = *k.plan;
    std::string plan = p.kind->packs
                           ? fmt::format("{} N{} D{} u {}/{}, {} fwd / {} bwd packs", name, p.gpus, p.minibatch,
                                         p.u_fwd, p.u_bwd, p.packs_fwd.size(), p.packs_bwd.size())
                           : k.title;
    if (!k.offload.empty()) plan += ", offload " + k.offload;
    fmt::print("{:<{}} {:>5} {:>12} {:>12} {:>12} {:>12}  {:<26} {}{}\n", name, core::kind_column_width(),
               k.fits ? "yes" : "NO", size_text(n.gpu_max_bytes), size_text(n.pinned_bytes),
               size_text(n.host.total_bytes()), n.host.nvme_bytes > 0 ? size_text(n.host.nvme_bytes) : std::string("-"),
               binds, plan,
               k.fits ? std::string()
                      : "\n" + std::string(static_cast<std::size_t>(core::kind_column_width()) + 2, ' ') +
                            "does not fit: " + k.reason);
  }
  fmt::print(
      "\nGPU peak: the most any GPU holds with the plan's ops issued one at a time (harmony-run's serial order); "
      "pinned: the host tensors DMA copies read or write;\nhost RAM: masters, optimizer state, gradients, stashes and "
      "staging; binds: the tier nearest its limit (or furthest over it). Plans: each kind's most promising\ncandidate "
      "that fits, by the profile's compute estimate, not timed: `harmony-sim compare` times them.\n");
}

}  // namespace harmony::sim
