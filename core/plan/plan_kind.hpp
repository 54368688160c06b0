// The plan-kind registry. A plan kind is a module: one file in core/kinds/ fills a PlanKindSpec (its name and
// description, its role in listings, the properties shared code reads instead of asking which kind it is, its
// knobs, and its functions: validation, candidate enumeration, lowering, a title) and registers it with
// HARMONY_REGISTER_PLAN_KIND. Everything that lists kinds (plan.mode in both tools, compare, sweeps' kinds:,
// --plan auto, the JSON schemas' plan_kind enum, checked by a test) reads this registry. docs/design.md, "Plan kinds".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan/knobs.hpp"

namespace harmony::core {

// The types of the kind functions, declared in the rooms above core/plan/ (model, program, search): a kind's file
// (core/kinds/) defines the functions, and only code that includes those rooms calls them.
class Model;
struct Plan;
struct Program;
struct LowerOptions;
struct Candidate;
struct SearchSpace;

// How a kind is grouped in listings: compare's "speedup over the best baseline" and the report's best-baseline
// column take the Baseline kinds. A role groups rows; it never selects code (properties below do that).
enum class KindRole {
  Harmony,   // Harmony's schedules (the paper's vPP and vDP)
  Baseline,  // the systems Harmony is compared against (the swapping baselines of docs/baselines.md)
  Ceiling,   // the in-memory trainer (resident): what a model that fits costs, the bound Harmony is measured against
};
const char* kind_role_name(KindRole r);  // "harmony", "baseline", "ceiling"

// A kind's file names only the fields that differ from these defaults (designated initializers, in this order).
struct PlanKindSpec {
  const char* name = "";                  // as configs and outputs spell it: "harmony-pp", "dp-swap", ...
  const char* description = "";           // one line, for listings
  std::vector<std::string> aliases = {};  // other spellings plan.mode accepts (the paper's vPP, vDP)
  int listing_order = 0;                  // position in listings, compare's table and sweeps' default kinds (ascending)
  KindRole role = KindRole::Baseline;
  const char* color = "#bcbd22";  // the report's chart colour

  // ---- properties shared code reads (plan rules, search, compare, config, executor) ----
  // Layer packs at two microbatch sizes (plan.u_fwd for the forward packs, plan.u_bwd for the backward ones, the
  // pack keys, search.packing_*, the paper's fit rule), composed into a task graph (the search's lower bound).
  // Without: one microbatch size, plan.u_bwd (u_fwd is set to it), and the pack keys are read but not used.
  bool packs = false;
  bool data_parallel = false;         // splits the minibatch over the GPUs (each GPU takes its share, D/N)
  bool even_split = false;            // data-parallel kinds that need N to divide D (equal shares)
  bool stage_per_gpu = false;         // one contiguous stage of layers per GPU (N <= R; Plan::stages)
  bool one_microbatch = false;        // runs each GPU's share as one microbatch (no gradient accumulation): u = D/N
  bool unequal_microbatches = false;  // may run microbatches that do not divide a share (options.unequal_microbatches)
  bool offload_tiers = false;         // its parameters and optimizer state may live on NVMe (search.offload)
  bool one_gpu = false;               // runs on one GPU only (plan.gpus: 1; split_problem says so otherwise)
  // Weights, gradients and AdamW state live on every GPU for the whole run and its Update ops run there (on the
  // compute stream, `bytes` their HBM traffic): the executor keeps a DeviceState per device across steps.
  bool resident_state = false;
  // harmony-run's executor trains its Programs. false: a kind harmony-sim prices but harmony-run refuses (plan.mode
  // names it; --plan auto never offers it), said in docs/baselines.md.
  bool trains = true;
  // A kind harmony-sim prices and harmony-run refuses (trains false) names the trained kind whose Programs make the
  // same updates (what differs is only where state lives or what host work the system adds): harmony-run's refusal
  // offers it. nullptr for the kinds that train.
  const char* trains_as = nullptr;
  std::vector<Knob> knobs = {};  // the plan.<knob> keys it reads (Plan::knobs)

  // ---- the kind's functions (core/kinds/<kind>.cpp) ----
  // Throws ScheduleError unless the plan is one the kind can run on the model (sizes, its rules, packs or stages,
  // microbatch sizes in the profiled range, knob values).
  void (*validate)(const Plan& plan, const Model& model) = nullptr;
  // The Program of a plan (validated first); `options` are the config's lowering options (Harmony's prefetch, ...).
  Program (*lower)(const Plan& plan, const Model& model, const LowerOptions& options) = nullptr;
  // The search's candidates of this kind, in the kind's enumeration order (the ranking breaks ties by it).
  std::vector<Candidate> (*enumerate)(const Model& model, const SearchSpace& space) = nullptr;
  // A one-line title of the plan as it would run on the model (harmony-run's plan line and checkpoint metadata).
  std::string (*describe)(const Plan& plan, const Model& model) = nullptr;
};

// A registered kind: a handle to its PlanKindSpec (compared by identity, cheap to copy).
class PlanKind {
 public:
  PlanKind();  // the registry's first kind (harmony-pp)
  explicit PlanKind(const PlanKindSpec& spec) : spec_(&spec) {}
  const PlanKindSpec& spec() const { return *spec_; }
  const PlanKindSpec* operator->() const { return spec_; }
  const char* name() const { return spec_->name; }
  bool has_knob(Knob k) const;
  bool operator==(const PlanKind& o) const { return spec_ == o.spec_; }

 private:
  const PlanKindSpec* spec_;
};

// Adds a kind (HARMONY_REGISTER_PLAN_KIND, at static initialization). InternalError for an empty or duplicate name or
// alias, a missing function, or a registration after the registry was first read. Returns true.
bool register_plan_kind(const PlanKindSpec& spec);

// Every registered kind in listing order: harmony-pp, harmony-dp, dp-swap, pp-swap, zero-infinity, zero-offload, l2l,
// lohan, fsdp, resident.
const std::vector<PlanKind>& plan_kinds();
const std::vector<std::string>& plan_kind_names();
// The kind of a name (with_aliases: or one of its aliases); nullopt for an unknown one (use closest_match on
// plan_kind_names()).
std::optional<PlanKind> find_plan_kind(std::string_view name, bool with_aliases = false);
// The kind of a name the code itself spells (tests, tools); InternalError for an unknown one.
PlanKind plan_kind(std::string_view name);
const char* plan_kind_name(PlanKind k);
// The names of the kinds of a role, in listing order.
std::vector<std::string> plan_kind_names(KindRole role);
// The width of a text table's kind column: the longest registered name, at least 14 ("plan kind" and the paper's).
int kind_column_width();
// The names of the kinds that list knob k, in listing order.
std::vector<std::string> plan_kind_names(Knob k);

}  // namespace harmony::core

// Registers a PlanKindSpec defined at namespace scope in a core/kinds/ file (one per file).
#define HARMONY_REGISTER_PLAN_KIND(spec) \
  [[maybe_unused]] static const bool harmony_plan_kind_registered = ::harmony::core::register_plan_kind(spec)
