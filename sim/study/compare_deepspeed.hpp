// `harmony-sim compare CONFIG --deepspeed ds_config.json`: the DeepSpeed run a config describes, as `--set`
// overrides on the harmony config (plan.minibatch, the model's dtype; search.u_bwd and search.offload for its own
// row), priced as its closest plan kind beside the compare table (docs/comparison.md, "A DeepSpeed config").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/config/config_deepspeed.hpp"
#include "core/model/model.hpp"
#include "sim/study/compare.hpp"

namespace harmony::sim {

struct DeepSpeedSetup {
  core::DeepSpeedRun run;
  std::vector<std::string> overrides;      // after the user's --set: the minibatch and dtype compare runs at
  std::vector<std::string> row_overrides;  // after those, for the DeepSpeed row only: its microbatch and offload tier
};

// Reads the harmony config with the user's overrides (for plan.gpus and the "auto" values), then the DeepSpeed config,
// and returns the overrides that make the harmony config run what the DeepSpeed config runs. ConfigError on a bad file.
DeepSpeedSetup setup_deepspeed(const std::string& config, const std::vector<std::string>& sets,
                               const std::string& deepspeed_path);

// The DeepSpeed row: its kind's best plan at its microbatch and offload tier (every config the reader accepts maps to a
// kind; one it cannot is a ConfigError there).
KindResult price_deepspeed(const DeepSpeedSetup& setup, const std::string& config, const std::vector<std::string>& sets,
                           const core::Model& model);

// The fastest Harmony kind's result in a compare (nullptr when none fits).
const KindResult* harmony_best(const CompareResult& res);

// The `deepspeed` object of compare --format json (schemas/compare.schema.json).
nlohmann::json deepspeed_json(const DeepSpeedSetup& setup, const KindResult& row, const CompareResult& res);

// The lines printed under the compare table: what the config is, why this kind, how it differs, the ratio.
std::vector<std::string> deepspeed_lines(const DeepSpeedSetup& setup, const KindResult& row, const CompareResult& res);

}  // namespace harmony::sim
