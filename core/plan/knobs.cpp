// Names of the knob values (knobs.hpp): one table per enumeration, read by its name, names and parse functions.
#include "core/plan/knobs.hpp"

#include <array>
#include <utility>

namespace harmony::core {

namespace {

// An enumeration's values and their names, in listing order.
template <class E, std::size_t N>
struct NameTable {
  std::array<std::pair<E, const char*>, N> rows;

  const char* name(E e) const {
    for (const auto& [value, name] : rows)
      if (value == e) return name;
    return "?";
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& row : rows) out.emplace_back(row.second);
    return out;
  }
  std::optional<E> parse(const std::string& name) const {
    for (const auto& [value, n] : rows)
      if (name == n) return value;
    return std::nullopt;
  }
};

constexpr NameTable<ActivationPolicy, 2> kActivationPolicies{
    {{{ActivationPolicy::Checkpoint, "checkpoint"}, {ActivationPolicy::Keep, "keep"}}}};
constexpr NameTable<OffloadTier, 2> kOffloadTiers{{{{OffloadTier::Cpu, "cpu"}, {OffloadTier::Nvme, "nvme"}}}};
constexpr NameTable<SwapTiming, 2> kSwapTimings{
    {{{SwapTiming::Scheduled, "scheduled"}, {SwapTiming::OnDemand, "on-demand"}}}};
constexpr NameTable<Knob, 4> kKnobs{
    {{{Knob::Activations, "activations"}, {Knob::Offload, "offload"}, {Knob::Zero3, "zero3"}, {Knob::Swap, "swap"}}}};

}  // namespace

const char* activation_policy_name(ActivationPolicy p) { return kActivationPolicies.name(p); }

const std::vector<std::string>& activation_policy_names() {
  static const std::vector<std::string> names = kActivationPolicies.names();
  return names;
}

std::optional<ActivationPolicy> parse_activation_policy(const std::string& name) {
  return kActivationPolicies.parse(name);
}

const char* offload_tier_name(OffloadTier t) { return kOffloadTiers.name(t); }

const std::vector<std::string>& offload_tier_names() {
  static const std::vector<std::string> names = kOffloadTiers.names();
  return names;
}

std::optional<OffloadTier> parse_offload_tier(const std::string& name) { return kOffloadTiers.parse(name); }

const char* swap_timing_name(SwapTiming t) { return kSwapTimings.name(t); }

const std::vector<std::string>& swap_timing_names() {
  static const std::vector<std::string> names = kSwapTimings.names();
  return names;
}

std::optional<SwapTiming> parse_swap_timing(const std::string& name) { return kSwapTimings.parse(name); }

const char* knob_name(Knob k) { return kKnobs.name(k); }

const std::vector<Knob>& all_knobs() {
  static const std::vector<Knob> knobs = [] {
    std::vector<Knob> out;
    for (const auto& row : kKnobs.rows) out.push_back(row.first);
    return out;
  }();
  return knobs;
}

}  // namespace harmony::core
