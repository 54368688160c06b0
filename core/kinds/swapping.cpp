// The swapping kinds' shared part (swapping.hpp): their rules registry, the swap decisions, validation, candidate
// enumeration and title.
#include "core/kinds/swapping.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/kinds/microbatch_sizes.hpp"
#include "core/kinds/zero3_hooks.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/program_builder.hpp"

namespace harmony::core {

namespace {

struct RulesRegistry {
  std::mutex mutex;
  std::map<const PlanKindSpec*, SwapRules> rules;
};

RulesRegistry& rules_registry() {
  static RulesRegistry r;
  return r;
}

}  // namespace

bool register_swapping_kind(const PlanKindSpec& spec, const SwapRules& rules) {
  register_plan_kind(spec);
  RulesRegistry& r = rules_registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.rules[&spec] = rules;
  return true;
}

bool is_swapping_kind(PlanKind kind) {
  RulesRegistry& r = rules_registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.rules.count(&kind.spec()) > 0;
}

const SwapRules& swap_rules(PlanKind kind) {
  RulesRegistry& r = rules_registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.rules.find(&kind.spec());
  if (it == r.rules.end()) throw InternalError(fmt::format("plan kind {} is not a swapping kind", kind.name()));
  return it->second;
}

namespace {

// Microbatches per GPU: D/N for data-parallel kinds, D otherwise (every stage sees every sample).
int microbatches(const Plan& p) { return (p.kind->data_parallel ? p.minibatch / p.gpus : p.minibatch) / p.u_bwd; }

struct SpanMemory {
  Bytes resident = 0;      // sum of W+B and of W (gradient accumulators)
  Bytes streamed = 0;      // two layers' W+B and gradients in flight
  Bytes stash = 0;         // what every layer of the span keeps for its backward (its input; under keep also its
                           // saved activations) for the microbatches alive at once
  Bytes window = 0;        // four largest stashes (stash out/in, boundary in/out) in flight
  Bytes x_window = 0;      // four largest layer inputs in flight (l2l's boundaries through the host)
  Bytes boundary = 0;      // l2l: all microbatches' activations at the current layer's two boundaries
  Bytes saved_window = 0;  // l2l under keep: four layers' saved activations in flight to and from the host
  Bytes peak = 0;          // the largest per-layer profiled peak (forward or backward) beyond the layer's own
                           // weights and input, which resident/streamed and the stash count
};

SpanMemory span_memory(const Model& m, LayerRange span, int u, int alive, bool keep) {
  SpanMemory s;
  Bytes gw_max = 0;
  Bytes w_max = 0;
  Bytes x_max = m.input_bytes(u, span.last + 1);
  Bytes kept_max = 0;
  Bytes saved_max = 0;
  for (int l = span.first; l <= span.last; ++l) {
    const Bytes w = m.weight_bytes(l, l);
    const Bytes gw = w + m.buffer_bytes(l, l);
    const Bytes saved = keep ? saved_activation_bytes(m, u, l) : 0;
    s.resident += gw + w;
    gw_max = std::max(gw_max, gw);
    w_max = std::max(w_max, w);
    x_max = std::max(x_max, m.input_bytes(u, l));
    kept_max = std::max(kept_max, m.input_bytes(u, l) + saved);
    saved_max = std::max(saved_max, saved);
    s.stash += static_cast<Bytes>(alive) * (m.input_bytes(u, l) + saved);
    s.peak = std::max(s.peak, m.peak_beyond_own_bytes(u, l));
  }
  s.streamed = 2 * gw_max + 2 * w_max;
  s.window = 4 * std::max(x_max, kept_max);
  s.x_window = 4 * x_max;
  s.boundary = 2 * static_cast<Bytes>(alive) * x_max + 2 * x_max;
  s.saved_window = 4 * saved_max;
  return s;
}

// One GPU's shards of the span's W+B (ceil(bytes / N) each, as the kinds allocate them).
Bytes shards(const Model& m, LayerRange span, int gpus) {
  Bytes total = 0;
  for (int l = span.first; l <= span.last; ++l)
    total += shard_bytes(m.weight_bytes(l, l), gpus) + shard_bytes(m.buffer_bytes(l, l), gpus);
  return total;
}

SwapDecision decide(const Plan& p, const SwapRules& rules, const Model& m, LayerRange span) {
  const int mb = microbatches(p);
  const KindKnobs& k = p.knobs;
  const Bytes cap = k.gpu_capacity_bytes;
  const bool keep = k.activation_policy == ActivationPolicy::Keep;
  SwapDecision d;
  if (rules.stash_on_host) {
    // the stash (inputs and, under keep, saved activations) always lives on the host
    const SpanMemory s = span_memory(m, span, p.u_bwd, mb, keep);
    d.weights = true;
    d.activations = k.activations == SwapChoice::Swap ||
                    (k.activations == SwapChoice::Auto && s.streamed + s.boundary + s.saved_window + s.peak > cap);
    d.estimate_bytes = s.streamed + (d.activations ? s.x_window : s.boundary) + s.saved_window + s.peak;
  } else {
    const SpanMemory s = span_memory(m, span, p.u_bwd, rules.all_microbatches_alive ? mb : 1, keep);
    const Bytes window = std::min(s.window, s.stash);  // swapping never holds more than keeping
    if (rules.stream_weights) {
      d.weights = true;
    } else {
      d.weights =
          k.weights == SwapChoice::Swap || (k.weights == SwapChoice::Auto && s.resident + window + s.peak > cap);
    }
    const Bytes w = (d.weights ? s.streamed : s.resident) + (rules.resident_param_shards ? shards(m, span, p.gpus) : 0);
    d.activations = !rules.keep_activations && (rules.swap_activations || k.activations == SwapChoice::Swap ||
                                                (k.activations == SwapChoice::Auto && w + s.stash + s.peak > cap));
    d.estimate_bytes = w + (d.activations ? window : s.stash) + s.peak;
  }
  d.fits = d.estimate_bytes <= cap;
  return d;
}

void check_stages(const char* name, const std::vector<LayerRange>& stages, int gpus, int num_layers) {
  if (static_cast<int>(stages.size()) != gpus)
    throw ScheduleError(fmt::format("{} has {} stages for {} GPUs: give one contiguous layer range per GPU", name,
                                    stages.size(), gpus));
  int next = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].first != next || stages[s].last < stages[s].first)
      throw ScheduleError(
          fmt::format("{} stage {} [{}, {}] does not start at layer {} or is empty: stages must "
                      "be contiguous, ascending and non-empty",
                      name, s, stages[s].first, stages[s].last, next));
    next = stages[s].last + 1;
  }
  if (next != num_layers)
    throw ScheduleError(
        fmt::format("{} stages cover layers 0..{} but must cover 0..{}", name, next - 1, num_layers - 1));
}

}  // namespace

void validate_swapping_plan(const Plan& p, const Model& m) {
  const char* name = p.kind.name();
  (void)swap_rules(p.kind);  // a swapping kind
  validate_microbatch_size(p, m);
  if (p.knobs.swap == SwapTiming::OnDemand && !p.kind.has_knob(Knob::Swap)) {
    std::string kinds;
    for (const std::string& k : plan_kind_names(Knob::Swap)) kinds += (kinds.empty() ? "" : ", ") + k;
    throw ScheduleError(
        fmt::format("{}: on-demand swap applies to {} only (the kind's own swap timing is fixed)", name, kinds));
  }
  detail::validate_zero3_overheads(name, p.knobs.zero3);
  // The kind's rules on N, D and u (core/plan/plan_rules): N divides D and u divides D/N (one-microbatch kinds:
  // u = D/N) for the data-parallel kinds; a layer per stage, u divides D for the kinds with stages.
  const int R = m.num_layers();
  if (const auto problem = stage_problem(p.kind, p.gpus, R)) throw ScheduleError(problem->message);
  if (const auto problem = microbatch_problem(p.kind, p.gpus, p.minibatch, p.u_bwd))
    throw ScheduleError(problem->message);
  if (p.kind->stage_per_gpu && !p.stages.empty()) check_stages(name, p.stages, p.gpus, R);
}

std::vector<SwapDecision> decide_swaps(const Plan& plan, const Model& model) {
  validate_swapping_plan(plan, model);
  const SwapRules& rules = swap_rules(plan.kind);
  std::vector<SwapDecision> out;
  if (plan.kind->stage_per_gpu) {
    const auto stages = plan.stages.empty() ? balanced_stages(model, plan.u_bwd, plan.gpus) : plan.stages;
    for (const LayerRange& s : stages) out.push_back(decide(plan, rules, model, s));
  } else {
    out.push_back(decide(plan, rules, model, LayerRange{0, model.num_layers() - 1}));
  }
  return out;
}

std::vector<Candidate> enumerate_swapping_plans(const Model& model, const SearchSpace& space) {
  const PlanKind kind = space.kind;
  const std::vector<int> sizes = candidate_microbatch_sizes(model, space);
  std::vector<Candidate> out;
  const std::vector<OffloadTier> tiers =
      kind.has_knob(Knob::Offload) ? space.offloads : std::vector<OffloadTier>{OffloadTier::Cpu};
  for (ActivationPolicy policy : space.activation_policies) {
    for (OffloadTier tier : tiers) {
      for (int u : sizes) {
        Candidate c = microbatch_candidate(space, policy, u);
        Plan& p = c.plan;
        p.knobs.offload = tier;
        if (!kind.has_knob(Knob::Swap)) p.knobs.swap = SwapTiming::Scheduled;  // the timing is the kind's own
        if (kind->stage_per_gpu) p.stages = balanced_stages(model, u, space.gpus);
        if (space.drop_infeasible) {
          const auto ds = decide_swaps(p, model);
          if (!std::all_of(ds.begin(), ds.end(), [](const SwapDecision& d) { return d.fits; })) continue;
        }
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

std::string describe_swapping_plan(const Plan& p, const Model& model) {
  const auto d = decide_swaps(p, model);
  return fmt::format("{} N{} D{} u {} (weights {}, activations {}, {}{})", p.kind.name(), p.gpus, p.minibatch, p.u_bwd,
                     d.front().weights ? "swapped" : "kept", d.front().activations ? "swapped" : "kept",
                     activation_policy_name(p.knobs.activation_policy),
                     p.knobs.swap == SwapTiming::OnDemand ? ", on-demand swap" : "");
}

}  // namespace harmony::core
