// HostBreakdown: host memory by the six categories every layer reports it in (master weights, optimizer state,
// gradients, stashes, activations, staging buffers) — harmony-sim's host account (sim::HostAccount), a plan result's
// host_memory (HostMemoryReport) and harmony-run's metered executor (backend::ExecutorHostMemory) — and its JSON.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "core/base/units.hpp"

namespace harmony::core {

enum class HostCategory : std::uint8_t { MasterWeights, OptimizerState, Gradients, Stash, Activations, Staging };
inline constexpr std::array<HostCategory, 6> kHostCategories = {
    HostCategory::MasterWeights, HostCategory::OptimizerState, HostCategory::Gradients,
    HostCategory::Stash,         HostCategory::Activations,    HostCategory::Staging};

struct HostBreakdown {
  Bytes master_weights_bytes = 0;   // fp32 master weights (and buffers)
  Bytes optimizer_state_bytes = 0;  // AdamW moments; the one category that need not be page-locked
  Bytes gradient_bytes = 0;         // host gradients (the dW the swap-out writes into)
  Bytes stash_bytes = 0;            // stashed inputs swapped out
  Bytes activation_bytes = 0;       // Y / dX swapped out, CPU-message copies
  Bytes staging_bytes = 0;          // pinned staging and bounce buffers

  Bytes& at(HostCategory c);
  Bytes at(HostCategory c) const { return const_cast<HostBreakdown*>(this)->at(c); }
  // The six categories summed.
  Bytes total_bytes() const;
  // The page-locked part: everything but the optimizer state is a DMA source or target.
  Bytes pinned_bytes() const { return total_bytes() - optimizer_state_bytes; }
};

// The six categories as a JSON object of byte counts, keyed "<category>_bytes" ("master_weights_bytes", ...,
// "activation_bytes"); the staging buffers under `staging_key`, the name each document has had since its schema's
// version 1: "pinned_staging_bytes" in a plan result and the memory answer, "staging_bytes" in harmony-run's
// summary.host_memory.
inline constexpr std::string_view kPinnedStagingKey = "pinned_staging_bytes";
inline constexpr std::string_view kStagingKey = "staging_bytes";
nlohmann::json host_breakdown_json(const HostBreakdown& b, std::string_view staging_key);

}  // namespace harmony::core
