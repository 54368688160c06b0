// The helpers harmony-sim's commands share (sim/app/commands.hpp): the JSON document head, the lowering options, the
// bottleneck report and the Chrome trace of an evaluated plan.
#include "sim/app/commands.hpp"

#include <string>

#include "core/base/atomic_file.hpp"
#include "core/output/trace.hpp"
#include "sim/engine/cost_native.hpp"

namespace harmony::sim::app {

double mib(core::Bytes b) { return static_cast<double>(b) / static_cast<double>(core::kMiB); }

// The fields every harmony-sim document of a config opens with (docs/output-schema.md).
nlohmann::json document_head(const char* command, const core::RunConfig& cfg, const core::Model& model) {
  return {{"schema_version", core::kOutputSchemaVersion},
          {"command", command},
          {"config_path", cfg.file},
          {"profile_path",
           cfg.model.profile_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(cfg.model.profile_path)},
          {"model_name", model.name},
          {"machine_name", cfg.machine.name},
          {"cost_model", core::cost_model_name(cfg.cost_model)}};
}

core::LowerOptions lower_options(const core::RunConfig& cfg) { return core::lower_options(cfg.options); }

sim::Bottleneck bottleneck_of(const core::Program& program, const core::Model& model, const core::RunConfig& cfg) {
  const sim::NativeOptions o = sim::native_options_for(cfg.cost_model);
  return sim::simulate_bottleneck(program, model, cfg.machine, o);
}

void write_trace(const std::string& path, const sim::Evaluation& e, const std::string& title) {
  auto doc = core::chrome_trace_json(e.program, e.timeline.begin_ps, e.timeline.end_ps,
                                     core::TraceMeta{"harmony-sim (" + e.report.cost_model + ")", title});
  if (e.native) sim::append_native_counters(doc["traceEvents"], *e.native);
  core::write_file_atomic(path, doc.dump(1) + "\n", "the trace");
}

}  // namespace harmony::sim::app
