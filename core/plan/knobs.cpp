// Names of the knob values (knobs.hpp).
#include "core/plan/knobs.hpp"

namespace harmony::core {

const char* activation_policy_name(ActivationPolicy p) { return p == ActivationPolicy::Keep ? "keep" : "checkpoint"; }

const std::vector<std::string>& activation_policy_names() {
  static const std::vector<std::string> names = {"checkpoint", "keep"};
  return names;
}

std::optional<ActivationPolicy> parse_activation_policy(const std::string& name) {
  if (name == "checkpoint") return ActivationPolicy::Checkpoint;
  if (name == "keep") return ActivationPolicy::Keep;
  return std::nullopt;
}

const char* offload_tier_name(OffloadTier t) { return t == OffloadTier::Nvme ? "nvme" : "cpu"; }

const std::vector<std::string>& offload_tier_names() {
  static const std::vector<std::string> names = {"cpu", "nvme"};
  return names;
}

std::optional<OffloadTier> parse_offload_tier(const std::string& name) {
  if (name == "cpu") return OffloadTier::Cpu;
  if (name == "nvme") return OffloadTier::Nvme;
  return std::nullopt;
}

const char* swap_timing_name(SwapTiming t) { return t == SwapTiming::OnDemand ? "on-demand" : "scheduled"; }

const std::vector<std::string>& swap_timing_names() {
  static const std::vector<std::string> names = {"scheduled", "on-demand"};
  return names;
}

std::optional<SwapTiming> parse_swap_timing(const std::string& name) {
  if (name == "scheduled") return SwapTiming::Scheduled;
  if (name == "on-demand") return SwapTiming::OnDemand;
  return std::nullopt;
}

const char* knob_name(Knob k) {
  switch (k) {
    case Knob::Activations:
      return "activations";
    case Knob::Offload:
      return "offload";
    case Knob::Zero3:
      return "zero3";
    case Knob::Swap:
      return "swap";
  }
  return "?";
}

const std::vector<Knob>& all_knobs() {
  static const std::vector<Knob> knobs = {Knob::Activations, Knob::Offload, Knob::Zero3, Knob::Swap};
  return knobs;
}

}  // namespace harmony::core
