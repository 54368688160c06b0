// The plan-side sections of a config: `plan:` (mode: every registered kind, sizes, packs, the kind's knobs),
// `options:` and `search:`, each key located and checked; the cross-section plan-rule checks (plan.gpus against the
// machine, core/plan/plan_rules on the plan and search sizes); and plan_from_spec, the public PlanSpec -> Plan step.
// Shared with config.cpp and config_train.cpp through config_internal.hpp.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/config/config_internal.hpp"
#include "core/plan/packing.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core {
namespace config_detail {

namespace {

// ------------------------------------------------------------------------------------------------
// plan, options and search sections

const std::vector<std::string> kPlanKeys = {"mode",  "gpus",      "minibatch", "u_fwd",
                                            "u_bwd", "pack_size", "packs_fwd", "packs_bwd"};

// Every plan key: the sizes and packs, then each knob (core/plan/knobs.hpp).
std::vector<std::string> plan_keys() {
  std::vector<std::string> keys = kPlanKeys;
  for (Knob k : all_knobs()) keys.emplace_back(knob_name(k));
  return keys;
}
const std::vector<std::string> kOptionKeys = {"prefetch", "prefetch_buffers", "unequal_microbatches"};
const std::vector<std::string> kSearchKeys = {"packing_fwd",   "packing_bwd", "top_k", "ubatch_step", "smaller_ufwd",
                                              "fit_rule",      "u_fwd",       "u_bwd", "threads",     "pack_counts",
                                              "packs_per_gpu", "offload",     "swap",  "zero3"};
// "a, b or c"
std::string join_or(const std::vector<std::string>& names) {
  if (names.size() < 2) return join(names);
  return join(std::vector<std::string>(names.begin(), names.end() - 1)) + " or " + names.back();
}

// Every registered kind, and the aliases (the paper's vPP, vDP).
PlanKind parse_mode(const Node& v) {
  std::vector<std::string> names = plan_kind_names();
  std::vector<std::string> aliases;
  for (const PlanKind& k : plan_kinds())
    for (const std::string& a : k->aliases) aliases.push_back(a);
  const std::string hint_tail =
      fmt::format("modes: {}{}", join(names),
                  aliases.empty() ? std::string() : fmt::format(" (the paper's aliases {})", join(aliases)));
  const std::string& s = expect_scalar(v, "plan.mode", "a mode name", hint_tail);
  if (const auto kind = find_plan_kind(s, /*with_aliases=*/true)) return *kind;
  names.insert(names.end(), aliases.begin(), aliases.end());
  const std::string best = closest_match(s, names);
  fail(v.loc, fmt::format("unknown plan.mode '{}'", s),
       (best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best)) + hint_tail);
}

// A key whose value is one name of an enumeration (a knob's values: knobs.hpp): the value, or a located error naming
// the closest name. `noun` says what a value is ("an activation policy"), `plural` what the names are.
template <class E>
E parse_enum_key(const Node& value, const std::string& key, const char* noun, const std::string& hint,
                 std::optional<E> (*parse)(const std::string&), const std::vector<std::string>& names,
                 const char* plural) {
  const std::string& v = expect_scalar(value, key, noun, hint);
  const auto parsed = parse(v);
  if (!parsed) fail(value.loc, fmt::format("unknown {} '{}'", key, v), suggestion_hint(v, names, plural));
  return *parsed;
}

// plan.activations: checkpoint | keep.
void parse_activations(const Entry& e, KindKnobs& knobs, const MachineSpec& /*machine*/) {
  const std::string hint =
      "activation policies: checkpoint (recompute each layer's forward in the backward), "
      "keep (hold or swap the saved activations)";
  knobs.activation_policy = parse_enum_key(e.value, "plan.activations", "an activation policy", hint,
                                           parse_activation_policy, activation_policy_names(), "activation policies");
}

// plan.offload: cpu | nvme (the machine's NVMe tier).
void parse_offload(const Entry& e, KindKnobs& knobs, const MachineSpec& machine) {
  const std::string what = "plan.offload";
  const std::string hint =
      "offload tiers: cpu (parameters and optimizer state in host memory) or nvme (on the machine's "
      "topology.nvme drives, as DeepSpeed's offload_param/offload_optimizer device: nvme)";
  const OffloadTier tier =
      parse_enum_key(e.value, what, "an offload tier", hint, parse_offload_tier, offload_tier_names(), "tiers");
  if (tier == OffloadTier::Nvme && !machine.topology.nvme.present())
    fail(e.value.loc, "plan.offload: nvme needs a machine with an NVMe tier",
         "add topology.nvme: {read: 25GB/s, write: 20GB/s, capacity: 7.6TB, latency: 100us} to the machine, or "
         "use plan.offload: cpu");
  knobs.offload = tier;
}

// A zero3 mapping (plan.zero3, search.zero3): {module_latency: DURATION, bucket: ELEMENTS, tensor_latency: DURATION,
// grad_tensor_latency: DURATION, pipeline_read: BOOL, pipeline_write: BOOL} over `z` (ZeRO-3's overheads and
// DeepSpeed's pipelined optimizer swap, docs/baselines.md).
Zero3Overheads parse_zero3_map(const Node& v, const std::string& what, Zero3Overheads z) {
  const std::string hint =
      "write " + what.substr(what.find('.') + 1) +
      ": {module_latency: 200us, bucket: 5e7, tensor_latency: 20us, grad_tensor_latency: 45us, pipeline_read: false, "
      "pipeline_write: false} (the per-module hook cost, the prefetch bucket in parameter elements (DeepSpeed's "
      "stage3_prefetch_bucket_size), the per-parameter-tensor fetch/release cost, the per-parameter-tensor gradient "
      "cost, and DeepSpeed's offload_optimizer pipeline_read / pipeline_write)";
  if (v.kind != Node::Kind::Map) fail(v.loc, fmt::format("{} must be a mapping", what), hint);
  check_keys(v, what,
             {"module_latency", "bucket", "tensor_latency", "grad_tensor_latency", "pipeline_read", "pipeline_write"});
  if (const Entry* m = find(v, "module_latency"))
    z.module_latency_s = get_topology_duration(m->value, what + ".module_latency", "us");
  if (const Entry* b = find(v, "bucket")) {
    const double x = get_positive_double(b->value, what + ".bucket");
    if (x < 1) fail(b->value.loc, fmt::format("{}.bucket must be at least 1 element, got {}", what, x), hint);
    z.bucket_elements = x;
  }
  if (const Entry* t = find(v, "tensor_latency"))
    z.tensor_latency_s = get_topology_duration(t->value, what + ".tensor_latency", "us");
  if (const Entry* g = find(v, "grad_tensor_latency"))
    z.grad_tensor_latency_s = get_topology_duration(g->value, what + ".grad_tensor_latency", "us");
  if (const Entry* r = find(v, "pipeline_read")) z.pipeline_read = get_bool(r->value, what + ".pipeline_read");
  if (const Entry* w = find(v, "pipeline_write")) z.pipeline_write = get_bool(w->value, what + ".pipeline_write");
  return z;
}

// plan.zero3 (ZeRO-3's overheads and pipelined optimizer swap; after plan.offload, which all_knobs() parses first).
void parse_zero3(const Entry& e, PlanKind kind, KindKnobs& knobs) {
  knobs.zero3 = parse_zero3_map(e.value, "plan.zero3", knobs.zero3);
  if (!knobs.zero3.pipeline_read && !knobs.zero3.pipeline_write) return;
  const Entry* key = find(e.value, knobs.zero3.pipeline_read ? "pipeline_read" : "pipeline_write");
  if (!kind.has_knob(Knob::Offload))
    fail(key->value.loc,
         fmt::format("plan.zero3.{} swaps the optimizer state with the NVMe tier, but {} keeps it on the GPUs",
                     key->key, kind.name()),
         fmt::format("remove the key, or set plan.mode to a kind with plan.offload ({})",
                     join_or(plan_kind_names(Knob::Offload))));
  if (knobs.offload != OffloadTier::Nvme)
    fail(key->value.loc,
         fmt::format("plan.zero3.{} swaps the optimizer state with the NVMe tier, but plan.offload is cpu", key->key),
         "set plan.offload: nvme (DeepSpeed reads pipeline_read / pipeline_write only with offload_optimizer on "
         "nvme), or remove the key");
}

// plan.swap: scheduled | on-demand (dp-swap's and pp-swap's swap timing, docs/baselines.md "Swap timing").
void parse_swap(const Entry& e, KindKnobs& knobs, const MachineSpec& /*machine*/) {
  const std::string hint =
      "swap timings: scheduled (each input prefetched one step ahead, overlapped with compute) or on-demand "
      "(virtualized memory: each input moves when its op is reached, each eviction before the next op)";
  knobs.swap = parse_enum_key(e.value, "plan.swap", "a swap timing", hint, parse_swap_timing, swap_timing_names(),
                              "swap timings");
}

// The parser of each knob's `plan.<knob>` key.
void parse_knob(Knob k, const Entry& e, PlanKind kind, KindKnobs& knobs, const MachineSpec& machine) {
  switch (k) {
    case Knob::Activations:
      return parse_activations(e, knobs, machine);
    case Knob::Offload:
      return parse_offload(e, knobs, machine);
    case Knob::Zero3:
      return parse_zero3(e, kind, knobs);
    case Knob::Swap:
      return parse_swap(e, knobs, machine);
  }
}

// The plan.<knob> keys given: each parsed when plan.mode's kind lists the knob, refused (at the key) otherwise.
void parse_knobs(const Node& map, PlanKind kind, KindKnobs& knobs, const MachineSpec& machine) {
  for (Knob k : all_knobs()) {
    const Entry* e = find(map, knob_name(k));
    if (!e) continue;
    if (!kind.has_knob(k)) {
      const std::string kinds = join_or(plan_kind_names(k));
      fail(e->key_loc, fmt::format("plan.{} applies to plan.mode: {} only", knob_name(k), kinds),
           fmt::format("remove the key, or set mode: {}", kinds));
    }
    parse_knob(k, *e, kind, knobs, machine);
  }
}

constexpr const char* kPacksHint =
    "packs are inclusive [first, last] layer ranges, contiguous and ascending from layer 0, e.g. "
    "packs_bwd: [[0, 6], [7, 13], [14, 27]]";

Packs parse_packs(const Node& v, const std::string& what, bool allow_empty) {
  if (v.kind != Node::Kind::Seq)
    fail(v.loc, fmt::format("{} must be a list of packs, got {}", what, describe(v)), kPacksHint);
  if (v.items.empty() && !allow_empty) fail(v.loc, fmt::format("{} must list at least one pack", what), kPacksHint);
  Packs packs;
  for (std::size_t i = 0; i < v.items.size(); ++i) {
    const Node& item = v.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Seq || item.items.empty() || item.items.size() > 2)
      fail(item.loc, fmt::format("{} must be [first, last] (an inclusive layer range), got {}", name, describe(item)),
           kPacksHint);
    LayerRange r;
    r.first = get_int(item.items.front(), name + " first layer", 0);
    r.last = get_int(item.items.back(), name + " last layer", 0);
    if (r.first > r.last)
      fail(item.loc, fmt::format("{} = [{}, {}] is reversed", name, r.first, r.last),
           "write [first, last] with first <= last");
    const int expected = packs.empty() ? 0 : packs.back().last + 1;
    if (r.first != expected) {
      const std::string what_wrong =
          r.first > expected ? (r.first - 1 == expected ? fmt::format("skips layer {}", expected)
                                                        : fmt::format("skips layers {}..{}", expected, r.first - 1))
                             : fmt::format("overlaps the previous pack at layer {}", r.first);
      fail(item.loc,
           fmt::format("{} = [{}, {}] {}: packs must be contiguous and ascending, so it must start at layer {}", name,
                       r.first, r.last, what_wrong, expected),
           kPacksHint);
    }
    packs.push_back(r);
  }
  return packs;
}

std::vector<std::string> parse_methods(const Entry& e, const std::string& what, bool forward) {
  std::vector<std::string> valid;
  for (const std::string& name : packing_method_names()) {
    if (forward || name != "reuse") valid.push_back(name);
  }
  const std::string example = forward ? "[balanced_time, reuse]" : "[balanced_time]";
  std::vector<std::string> methods;
  for (const Node* item : get_list(e.value, what, fmt::format("{}: {}", what.substr(what.rfind('.') + 1), example))) {
    const std::string& name =
        expect_scalar(*item, what + " entries", "a packing method name", fmt::format("methods: {}", join(valid)));
    if (!forward && name == "reuse")
      fail(item->loc, fmt::format("'reuse' in {} is a forward-only packing method", what),
           fmt::format("backward methods: {}", join(valid)));
    if (!is_packing_method(name))
      fail(item->loc, fmt::format("unknown packing method '{}' in {}", name, what),
           suggestion_hint(name, valid, "methods"));
    if (std::find(methods.begin(), methods.end(), name) != methods.end())
      fail(item->loc, fmt::format("packing method '{}' is listed twice in {}", name, what), "list each method once");
    methods.push_back(name);
  }
  if (methods.empty())
    fail(e.key_loc, fmt::format("{} must list at least one packing method", what),
         fmt::format("e.g. {}, or remove the key for the default methods", example));
  return methods;
}

std::vector<int> parse_sizes(const Entry& e, const std::string& what, std::vector<SourceLoc>& locs) {
  std::vector<int> sizes;
  for (const Node* item : get_list(e.value, what, fmt::format("{}: [4, 8, 16]", what.substr(what.rfind('.') + 1)))) {
    sizes.push_back(get_int(*item, what + " entries", 1));
    locs.push_back(item->loc);
  }
  return sizes;
}

[[noreturn]] void fail_problem(const PlanProblem& p, const PlanLocs& plan_locs, const SourceLoc& u_loc) {
  fail(p.field == PlanField::Gpus        ? plan_locs.gpus
       : p.field == PlanField::Minibatch ? plan_locs.minibatch
                                         : u_loc,
       p.message, p.hint);
}

}  // namespace

PlanSpec parse_plan(const Node& map, const SourceLoc& plan_key_loc, PlanLocs& locs, const MachineSpec& machine) {
  check_keys(map, "plan", plan_keys());
  PlanSpec plan;
  plan.loc = plan_key_loc;
  const Entry& mode = require(map, "mode", "plan", plan_key_loc,
                              fmt::format("add `mode: KIND` under plan: (kinds: {})", join(plan_kind_names())));
  plan.kind = parse_mode(mode.value);
  plan.mode_loc = mode.value.loc;
  parse_knobs(map, plan.kind, plan.knobs, machine);
  const Entry& gpus = require(map, "gpus", "plan", plan_key_loc, "add `gpus: N` (GPUs the plan uses) under plan:");
  plan.gpus = get_int(gpus.value, "plan.gpus", 1);
  locs.gpus = gpus.value.loc;
  const Entry& minibatch =
      require(map, "minibatch", "plan", plan_key_loc, "add `minibatch: D` (samples per iteration) under plan:");
  plan.minibatch = get_int(minibatch.value, "plan.minibatch", 1);
  locs.minibatch = minibatch.value.loc;

  const Entry* u_fwd = find(map, "u_fwd");
  const Entry* u_bwd = find(map, "u_bwd");
  if (u_fwd && !u_bwd)
    fail(u_fwd->key_loc, "plan.u_fwd is given without plan.u_bwd",
         "give both microbatch sizes (e.g. u_fwd: 8 and u_bwd: 8), or neither for a search");
  if (u_bwd && !u_fwd)
    fail(u_bwd->key_loc, "plan.u_bwd is given without plan.u_fwd",
         "give both microbatch sizes (e.g. u_fwd: 8 and u_bwd: 8), or neither for a search");
  if (u_fwd) {
    plan.u_fwd = get_int(u_fwd->value, "plan.u_fwd", 1);
    plan.u_bwd = get_int(u_bwd->value, "plan.u_bwd", 1);
    locs.u_fwd = u_fwd->value.loc;
    locs.u_bwd = u_bwd->value.loc;
  }

  const Entry* pack_size = find(map, "pack_size");
  const Entry* packs_fwd = find(map, "packs_fwd");
  const Entry* packs_bwd = find(map, "packs_bwd");
  if (pack_size && packs_bwd)
    fail(packs_bwd->key_loc, "plan.pack_size and plan.packs_bwd are both given",
         fmt::format("give exactly one: pack_size: P (backward packs of P layers counted from the end) or "
                     "packs_bwd: [[first, last], ...]; pack_size is at {}",
                     pack_size->key_loc.str()));
  if (packs_fwd && !packs_bwd)
    fail(packs_fwd->key_loc, "plan.packs_fwd needs plan.packs_bwd",
         "give packs_bwd too (packs_fwd covers the layers before the last backward pack), or drop packs_fwd");
  if (pack_size) plan.pack_size = get_int(pack_size->value, "plan.pack_size", 1);
  if (packs_bwd) {
    plan.packs_bwd = parse_packs(packs_bwd->value, "plan.packs_bwd", false);
    const int fwd_end = plan.packs_bwd->back().first;  // forward packs cover layers [0, fwd_end)
    if (packs_fwd) {
      plan.packs_fwd = parse_packs(packs_fwd->value, "plan.packs_fwd", true);
      const int covered = plan.packs_fwd->empty() ? 0 : plan.packs_fwd->back().last + 1;
      if (covered != fwd_end) {
        const std::string expected = fwd_end == 0 ? std::string("no layers ([]), as packs_bwd has a single pack")
                                                  : fmt::format("layers 0..{}", fwd_end - 1);
        fail(packs_fwd->value.loc,
             fmt::format("plan.packs_fwd must cover {}: the layers before the last backward pack", expected),
             "the last backward pack runs forward and backward in one task, so forward packs stop before it");
      }
    } else {
      plan.packs_fwd = Packs(plan.packs_bwd->begin(), plan.packs_bwd->end() - 1);
    }
  }
  return plan;
}

// `prefetch_default`: the value when options.prefetch is not given (harmony-sim: on with the native cost model,
// off with the paper's reference model; harmony-run: off).
Options parse_options(const Node* map, bool prefetch_default) {
  Options o;
  o.prefetch = prefetch_default;
  if (!map) return o;
  check_keys(*map, "options", kOptionKeys);
  if (const Entry* e = find(*map, "prefetch")) o.prefetch = get_bool(e->value, "options.prefetch");
  if (const Entry* e = find(*map, "prefetch_buffers"))
    o.prefetch_buffers = get_int(e->value, "options.prefetch_buffers", 2);
  if (const Entry* e = find(*map, "unequal_microbatches"))
    o.unequal_microbatches = get_bool(e->value, "options.unequal_microbatches");
  return o;
}

// `pack_counts_default`: the value when search.pack_counts is not given (harmony-sim: wide with the native cost
// model, the paper's minimum with the reference model; harmony-run: minimum).
SearchSpec parse_search(const Node* map, SearchLocs& locs, PackCounts pack_counts_default, SwapTiming swap_default,
                        const Zero3Overheads& zero3_default) {
  SearchSpec s;
  s.pack_counts = pack_counts_default;
  s.swap = swap_default;
  s.zero3 = zero3_default;
  if (!map) return s;
  check_keys(*map, "search", kSearchKeys);
  if (const Entry* e = find(*map, "pack_counts")) {
    const std::string& v =
        expect_scalar(e->value, "search.pack_counts", "a pack-count rule", "pack_counts: minimum or wide");
    if (v == "minimum") {
      s.pack_counts = PackCounts::Minimum;
    } else if (v == "wide") {
      s.pack_counts = PackCounts::Wide;
    } else {
      fail(e->value.loc, fmt::format("unknown search.pack_counts '{}'", v),
           suggestion_hint(v, {"minimum", "wide"}, "pack-count rules"));
    }
  }
  if (const Entry* e = find(*map, "offload")) {
    const std::string& v = expect_scalar(e->value, "search.offload", "an offload tier", "offload: auto, cpu or nvme");
    const std::vector<std::string> names = {"auto", "cpu", "nvme"};
    const auto it = std::find(names.begin(), names.end(), v);
    if (it == names.end())
      fail(e->value.loc, fmt::format("unknown search.offload '{}'", v), suggestion_hint(v, names, "offload tiers"));
    s.offload = static_cast<SearchSpec::Offload>(it - names.begin());
  }
  if (const Entry* e = find(*map, "swap")) {
    s.swap = parse_enum_key(e->value, "search.swap", "a swap timing", "swap: scheduled or on-demand", parse_swap_timing,
                            swap_timing_names(), "swap timings");
  }
  if (const Entry* e = find(*map, "zero3")) s.zero3 = parse_zero3_map(e->value, "search.zero3", s.zero3);
  if (const Entry* e = find(*map, "packs_per_gpu")) s.packs_per_gpu = get_int(e->value, "search.packs_per_gpu", 0);
  if (const Entry* e = find(*map, "packing_fwd")) s.packing_fwd = parse_methods(*e, "search.packing_fwd", true);
  if (const Entry* e = find(*map, "packing_bwd")) s.packing_bwd = parse_methods(*e, "search.packing_bwd", false);
  if (const Entry* e = find(*map, "top_k")) {
    s.top_k = get_int(e->value, "search.top_k", -1);
    if (s.top_k == 0)
      fail(e->value.loc, "search.top_k must be -1 (keep every candidate) or at least 1, got 0",
           "e.g. top_k: 5, or top_k: -1 to keep all");
  }
  if (const Entry* e = find(*map, "ubatch_step")) s.ubatch_step = get_int(e->value, "search.ubatch_step", 1);
  if (const Entry* e = find(*map, "smaller_ufwd")) s.smaller_ufwd = get_bool(e->value, "search.smaller_ufwd");
  if (const Entry* e = find(*map, "fit_rule")) s.fit_rule = get_bool(e->value, "search.fit_rule");
  if (const Entry* e = find(*map, "u_fwd")) s.u_fwd = parse_sizes(*e, "search.u_fwd", locs.u_fwd);
  if (const Entry* e = find(*map, "u_bwd")) s.u_bwd = parse_sizes(*e, "search.u_bwd", locs.u_bwd);
  if (const Entry* e = find(*map, "threads")) s.threads = get_int(e->value, "search.threads", 0);
  return s;
}

// ------------------------------------------------------------------------------------------------
// Cross-section checks

void check_plan(const RunConfig& cfg, UnequalMicrobatches unequal, const PlanLocs& plan_locs,
                const SearchLocs& search_locs) {
  const PlanSpec& plan = cfg.plan;
  const PlanKind kind = plan.kind;
  const bool uses_u_fwd = kind->packs;
  if (plan.gpus > cfg.machine.gpus)
    fail(plan_locs.gpus,
         fmt::format("plan.gpus = {} exceeds machine.gpus = {} (machine '{}')", plan.gpus, cfg.machine.gpus,
                     cfg.machine.name),
         fmt::format("use plan.gpus <= {}, or raise machine.gpus", cfg.machine.gpus));
  if (const auto p = split_problem(kind, plan.gpus, plan.minibatch)) fail_problem(*p, plan_locs, plan.loc);
  auto check = [&](int u, const std::string& what, const SourceLoc& loc) {
    if (const auto p = microbatch_problem(kind, plan.gpus, plan.minibatch, u, what, unequal))
      fail_problem(*p, plan_locs, loc);
  };
  if (plan.u_fwd && uses_u_fwd) check(*plan.u_fwd, "plan.u_fwd", plan_locs.u_fwd);
  if (plan.u_bwd) check(*plan.u_bwd, "plan.u_bwd", plan_locs.u_bwd);
  for (std::size_t i = 0; uses_u_fwd && i < cfg.search.u_fwd.size(); ++i)
    check(cfg.search.u_fwd[i], "search.u_fwd entry", search_locs.u_fwd[i]);
  for (std::size_t i = 0; i < cfg.search.u_bwd.size(); ++i)
    check(cfg.search.u_bwd[i], "search.u_bwd entry", search_locs.u_bwd[i]);
}

}  // namespace config_detail

using namespace config_detail;  // NOLINT(google-build-using-namespace): the loader's own internals

// ------------------------------------------------------------------------------------------------

namespace {

// Plan problems are input errors: point at the config's `plan:` section.
[[noreturn]] void plan_error(const PlanSpec& ps, const std::string& file, const std::string& msg,
                             const std::string& hint) {
  throw ConfigError(ps.loc.file.empty() ? SourceLoc{file, 0, 0} : ps.loc, msg, hint);
}

}  // namespace

Plan plan_from_spec(const PlanSpec& ps, const Model& model, Bytes gpu_capacity_bytes, const std::string& file,
                    std::string_view who, const std::string& hint) {
  Plan p;
  p.kind = ps.kind;
  p.gpus = ps.gpus;
  p.minibatch = ps.minibatch;
  p.knobs = ps.knobs;
  p.knobs.gpu_capacity_bytes = gpu_capacity_bytes;
  if (!p.kind->packs) {  // one microbatch size, plan.u_bwd; the pack keys are not read
    if (!ps.u_bwd) plan_error(ps, file, fmt::format("{} needs plan.u_bwd (its microbatch size)", p.kind.name()), hint);
    p.u_fwd = p.u_bwd = *ps.u_bwd;
    try {
      p.kind->validate(p, model);
    } catch (const ScheduleError& e) {  // located at the plan, as a plan with packs' problems are
      plan_error(ps, file, e.what(), hint);
    }
    return p;
  }
  if (!ps.u_fwd || !ps.u_bwd) {
    plan_error(ps, file, fmt::format("{} needs plan.u_fwd and plan.u_bwd", who),
               "add e.g. `u_fwd: 8` and `u_bwd: 8` to `plan:`");
  }
  p.u_fwd = *ps.u_fwd;
  p.u_bwd = *ps.u_bwd;
  if (ps.pack_size) {
    manual_packs(model.num_layers(), *ps.pack_size, p.packs_fwd, p.packs_bwd);
  } else if (ps.packs_bwd) {
    p.packs_bwd = *ps.packs_bwd;
    if (ps.packs_fwd) {
      p.packs_fwd = *ps.packs_fwd;
    } else {
      p.packs_fwd.assign(p.packs_bwd.begin(), p.packs_bwd.end() - 1);
    }
  } else {
    plan_error(ps, file, fmt::format("{} needs packs: plan.pack_size or plan.packs_bwd", who),
               "add `pack_size: 7`, or `packs_bwd: [[0, 13], [14, 27]]` (inclusive layer ranges)");
  }
  try {
    validate_packs(p, model.num_layers());
  } catch (const ScheduleError& e) {
    plan_error(ps, file, e.what(),
               fmt::format("the model has {} layers (0..{}); backward packs cover all of them, forward packs cover the "
                           "layers before the last backward pack",
                           model.num_layers(), model.num_layers() - 1));
  }
  for (Phase ph : {Phase::Fwd, Phase::Bwd}) {
    const int u = ph == Phase::Fwd ? p.u_fwd : p.u_bwd;
    if (ph == Phase::Fwd && p.packs_fwd.empty()) continue;
    if (!model.ubatch_in_range(ph, u)) {
      plan_error(
          ps, file,
          fmt::format("{} microbatch size {} is outside the profiled range {}..{} of {}",
                      ph == Phase::Fwd ? "u_fwd" : "u_bwd", u, model.ubatch_min(ph), model.ubatch_max(ph), model.name),
          "profiles cannot be extrapolated: pick a size inside the profiled range");
    }
  }
  return p;
}

}  // namespace harmony::core
