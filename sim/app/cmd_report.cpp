// harmony-sim `report`: a sweep folder or a config -> one self-contained HTML page and its best plans' traces
// (docs/report.md), written atomically.
#include "sim/app/commands.hpp"

#include <chrono>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/error.hpp"
#include "sim/app/report.hpp"

namespace harmony::sim::app {

// `report`: a sweep folder or a config -> one HTML file, written atomically (core::AtomicFile), so an
// interrupted run never leaves half a page where a good one was.
int cmd_report(ReportCli& cli) {
  namespace fs = std::filesystem;
  if (!sim::parse_rank_by(cli.rank_by, &cli.options.rank_by))
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "unknown ranking '" + cli.rank_by + "'",
                            "use throughput, iteration_time, time_to_train or cost");
  const bool is_dir = fs::is_directory(cli.results);
  if (!is_dir && !fs::exists(cli.results))
    throw core::ConfigError(core::SourceLoc{cli.results, 0, 0}, "no such file or folder",
                            "give a sweep's --out folder or a config YAML");
  std::string out = cli.out;
  if (out.empty()) {
    if (!is_dir)
      throw core::ConfigError(core::SourceLoc{"--out", 0, 0}, "a report of a config needs --out FILE.html",
                              "e.g. --out /tmp/report.html (a sweep folder's report defaults to DIR/report.html)");
    out = (fs::path(cli.results) / "report.html").string();
  }
  core::check_output_file(out, "the report (--out)");
  const auto t0 = std::chrono::steady_clock::now();
  auto data =
      is_dir ? sim::report_from_sweep(cli.results, cli.options) : sim::report_from_config(cli.results, cli.options);
  for (const auto& w : data.warnings) fmt::print(stderr, "warning: {}\n", w);
  // Each model's best-plan trace beside the page (the page links them), written before the page.
  const auto traces = sim::report_traces(data, out);
  for (const auto& [path, json] : traces) {
    core::check_output_file(path, "the trace");
    core::write_file_atomic(path, json, "the trace");
  }
  const std::string html = sim::render_report_html(data);
  core::write_file_atomic(out, html, "the report");
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const fs::path dir = fs::path(out).parent_path();
  if (cli.format == "json") {
    // docs/output-schema.md, "report": what was written and each model's best plan (a plan result).
    nlohmann::json models = nlohmann::json::array();
    for (const auto& m : data.models) {
      const nlohmann::json none(nullptr);
      models.push_back({{"model_name", m.name},
                        {"ranked_rows", m.rows.size()},
                        {"best_title", m.has_best ? nlohmann::json(m.best.title) : none},
                        {"best", m.has_best ? core::report_to_json(m.best.report) : none},
                        {"best_note", m.has_best || m.best_note.empty() ? none : nlohmann::json(m.best_note)},
                        {"trace_path", m.has_best ? nlohmann::json((dir / m.trace_file).string()) : none}});
    }
    const nlohmann::json j = {{"schema_version", core::kOutputSchemaVersion},
                              {"command", "report"},
                              {"results_path", cli.results},
                              {"input", is_dir ? "sweep" : "config"},
                              {"out_path", out},
                              {"page_bytes", html.size()},
                              {"rank_by", cli.rank_by},
                              {"models", std::move(models)},
                              {"warnings", data.warnings},
                              {"wall_time_s", dt}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("report written to {} ({:.0f} KiB, {:.2f} s): {} model{}\n", out,
             static_cast<double>(html.size()) / 1024.0, dt, data.models.size(), data.models.size() == 1 ? "" : "s");
  for (const auto& m : data.models) {
    if (m.has_best)
      fmt::print("  {}: {} ranked rows, best plan {} ({:.3f} samples/s, {} ops), trace {}\n", m.name, m.rows.size(),
                 m.best.title, m.best.report.throughput_samples_per_s, m.best.program.ops.size(),
                 (dir / m.trace_file).string());
    else
      fmt::print("  {}: {} ranked rows, no best plan shown\n", m.name, m.rows.size());
  }
  return 0;
}

}  // namespace harmony::sim::app
