// `harmony-sim report`: gathers a sweep's rows (or one config's plan kinds), re-simulates the best plan with
// the native engine recording samples, and renders the page: ranked table, SVG timeline, memory over time,
// swap ledger, bottleneck. Every number is formatted with a fixed precision so the page is reproducible.
#include "sim/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/program/baselines/baselines.hpp"
#include "core/program/lower.hpp"
#include "sim/compare.hpp"
#include "sim/cost_native.hpp"
#include "sim/evaluate.hpp"
#include "sim/sweep.hpp"

namespace harmony::sim {

namespace fs = std::filesystem;

NativeOptions native_options_for(const std::string& cost_model) {
  NativeOptions o;
  if (cost_model == "reference") {
    o.contention = false;
    o.latency = false;
    o.reference_bandwidths = true;
  }
  return o;
}

bool parse_rank_by(const std::string& text, RankBy* out) {
  static const std::pair<const char*, RankBy> kNames[] = {{"throughput", RankBy::Throughput},
                                                          {"iteration_time", RankBy::IterationTime},
                                                          {"time_to_train", RankBy::TimeToTrain},
                                                          {"cost", RankBy::Cost}};
  for (const auto& [name, v] : kNames) {
    if (text == name) {
      *out = v;
      return true;
    }
  }
  return false;
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

constexpr double kGiB = static_cast<double>(core::kGiB);
double gib(core::Bytes b) { return static_cast<double>(b) / kGiB; }
double seconds(core::TimePs t) { return static_cast<double>(t) * 1e-12; }

std::string fmt_gib(core::Bytes b) { return fmt::format("{:.2f}", gib(b)); }

// A duration in the unit that reads best: "812 us", "41.3 ms", "2.481 s", "3.2 h", "12.4 d".
std::string fmt_duration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 3600.0) return fmt::format("{:.3f} s", s);
  if (s < 86400.0 * 2) return fmt::format("{:.1f} h", s / 3600.0);
  return fmt::format("{:.1f} d", s / 86400.0);
}

std::string plan_title(const core::RunReport& r) {
  if (core::parse_plan_kind(r.plan_kind) && core::is_baseline(*core::parse_plan_kind(r.plan_kind)))
    return fmt::format("{} N{} D{} u {} ({})", r.plan_kind, r.plan.gpus, r.plan.minibatch, r.plan.u_bwd,
                       r.activation_policy);
  return fmt::format("{} N{} D{} u {}/{} fwd {} bwd {}",
                     r.plan_kind.empty() ? core::mode_name(r.plan.mode) : r.plan_kind, r.plan.gpus, r.plan.minibatch,
                     r.plan.u_fwd, r.plan.u_bwd, core::packs_to_string(r.plan.packs_fwd),
                     core::packs_to_string(r.plan.packs_bwd));
}

// The best plan of `kr` lowered again and run on the native engine with counters on.
BestPlan make_best(const KindResult& kr, const core::Model& model, const core::RunConfig& cfg, std::string where) {
  BestPlan b;
  b.where = std::move(where);
  if (core::is_baseline(kr.kind)) {
    if (!kr.baseline) throw core::ScheduleError("best baseline plan without its knobs");
    b.program = core::lower_baseline(*kr.baseline, model);
  } else {
    core::LowerOptions lower;
    lower.prefetch = cfg.options.prefetch;
    lower.prefetch_buffers = cfg.options.prefetch_buffers;
    b.program = evaluate_plan(model, cfg.machine, kr.best.plan, lower, cfg.cost_model).program;
  }
  NativeOptions o = native_options_for(cfg.cost_model);
  o.record_counters = true;
  b.report = simulate_native(b.program, model, cfg.machine, o, &b.native);
  b.report.plan_kind = kr.best.plan_kind.empty() ? core::plan_kind_name(kr.kind) : kr.best.plan_kind;
  b.report.activation_policy = kr.best.activation_policy;
  b.report.method_fwd = kr.best.method_fwd;
  b.report.method_bwd = kr.best.method_bwd;
  b.report.cost_model = cfg.cost_model;
  o.record_counters = false;  // the what-if re-simulations need no samples
  b.bottleneck = analyze_bottleneck(b.program, model, cfg.machine, b.native, o);
  b.title = plan_title(kr.best);
  b.capacity_bytes_per_gpu = static_cast<double>(cfg.machine.gpu_memory_bytes) * cfg.machine.memory_cap_scale;
  return b;
}

// ---------------------------------------------------------------------------------------------------------
// Sweep input

core::SourceLoc file_loc(const fs::path& p, int line = 0) { return core::SourceLoc{p.string(), line, 0}; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw core::ConfigError(file_loc(p), "cannot read the file", "check the path and its permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A cell as the table shows it: strings bare, numbers as written, null as "-".
std::string cell_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::optional<double> cell_number(const nlohmann::json& row, const char* key) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

const char* rank_column(RankBy r) {
  switch (r) {
    case RankBy::Throughput:
      return "throughput_samples_per_s";
    case RankBy::IterationTime:
      return "iteration_time_s";
    case RankBy::TimeToTrain:
      return "time_to_train_s";
    case RankBy::Cost:
      return "cost";
  }
  return "throughput_samples_per_s";
}

std::string num_or_dash(const nlohmann::json& row, const char* key, const char* spec, double scale = 1.0) {
  const auto v = cell_number(row, key);
  if (!v) return "-";
  return fmt::format(fmt::runtime(spec), *v * scale);
}

}  // namespace

ReportData report_from_sweep(const std::string& dir_text, const ReportOptions& options) {
  const fs::path dir(dir_text);
  const fs::path meta_path = dir / "sweep.json";
  if (!fs::exists(meta_path))
    throw core::ConfigError(file_loc(dir), "not a sweep output folder (no sweep.json)",
                            "give the --out folder of `harmony-sim sweep` or `merge`, or a config YAML");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_text(meta_path));
    (void)meta.at("columns").get<std::vector<std::string>>();
    (void)meta.at("fingerprint").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw core::ConfigError(file_loc(meta_path), std::string("not a sweep.json written by harmony-sim: ") + e.what(),
                            "rerun the sweep into a fresh --out folder");
  }
  // Rows are read by the names of this output schema (docs/output-schema.md).
  if (meta.value("version", 0) != kSweepFormatVersion || meta.value("schema_version", 0) != core::kOutputSchemaVersion)
    throw core::ConfigError(file_loc(meta_path),
                            fmt::format("the sweep's results are in sweep format {} (output schema {}); this "
                                        "harmony-sim reads format {} (output schema {}, docs/output-schema.md)",
                                        meta.value("version", 0), meta.value("schema_version", 0), kSweepFormatVersion,
                                        core::kOutputSchemaVersion),
                            "rerun the sweep into a new --out folder with this harmony-sim");
  const auto columns = meta.at("columns").get<std::vector<std::string>>();
  const std::size_t total_points = meta.value("points", std::size_t{0});

  // --where filters, checked against the columns before reading the rows.
  std::vector<std::pair<std::string, std::string>> filters;
  for (const auto& w : options.where) {
    const auto eq = w.find('=');
    const std::string key = eq == std::string::npos ? w : w.substr(0, eq);
    if (eq == std::string::npos || std::find(columns.begin(), columns.end(), key) == columns.end()) {
      std::string list;
      for (const auto& c : columns) list += (list.empty() ? "" : ", ") + c;
      throw core::ConfigError(core::SourceLoc{"--where", 0, 0},
                              eq == std::string::npos ? "'" + w + "' is not KEY=VALUE"
                                                      : "'" + key + "' is not a column of " + meta_path.string(),
                              "use one of: " + list);
    }
    filters.emplace_back(key, w.substr(eq + 1));
  }

  const fs::path rows_path = dir / "results.jsonl";
  const std::string text = read_text(rows_path);
  std::vector<nlohmann::json> rows;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    ++line_no;
    if (nl == std::string::npos) break;  // a row being written when the sweep stopped: not a result yet
    try {
      rows.push_back(nlohmann::json::parse(text.substr(pos, nl - pos)));
    } catch (const nlohmann::json::exception& e) {
      throw core::ConfigError(file_loc(rows_path, static_cast<int>(line_no)),
                              std::string("not a JSON row: ") + e.what(),
                              "the folder was edited by hand? rerun the sweep (it recomputes what is missing)");
    }
    pos = nl + 1;
  }
  if (rows.empty())
    throw core::ConfigError(file_loc(rows_path), "the sweep has no results yet",
                            "run `harmony-sim sweep SWEEP.yaml --out " + dir.string() + "` first");

  const auto keep = [&](const nlohmann::json& r) {
    for (const auto& [k, v] : filters) {
      const auto it = r.find(k);
      if (it == r.end() || cell_text(*it) != v) return false;
    }
    return true;
  };
  std::vector<const nlohmann::json*> kept;
  for (const auto& r : rows)
    if (keep(r)) kept.push_back(&r);

  ReportData d;
  const std::string sweep_file = meta.value("sweep_file", std::string());
  d.title = "harmony-sim report: sweep " + (sweep_file.empty() ? dir.filename().string() : sweep_file);
  d.facts.emplace_back("sweep", sweep_file);
  d.facts.emplace_back("fingerprint", meta.at("fingerprint").get<std::string>());
  d.facts.emplace_back("rows", fmt::format("{} of {} points{}", rows.size(), total_points,
                                           rows.size() < total_points ? " (unfinished or a shard)" : ""));
  if (!filters.empty()) {
    std::string f;
    for (const auto& [k, v] : filters) f += (f.empty() ? "" : ", ") + k + " = " + v;
    d.facts.emplace_back("filter", fmt::format("{} ({} rows kept)", f, kept.size()));
  }
  if (meta.contains("budget") && meta["budget"].is_object()) {
    const auto& b = meta["budget"];
    d.facts.emplace_back("budget", b.contains("tokens")
                                       ? fmt::format("{} tokens ({} samples of {} tokens)", b["tokens"].dump(),
                                                     b["samples"].dump(), b["seq_len"].dump())
                                       : fmt::format("{} samples", b["samples"].dump()));
  }

  // Status counts per plan kind (of the kept rows) and the most frequent reason a kind does not fit.
  std::map<std::string, std::map<std::string, std::size_t>> by_kind;
  std::map<std::string, std::map<std::string, std::size_t>> reasons;
  std::vector<std::string> kind_order;
  for (const auto* r : kept) {
    const std::string kind = cell_text(r->value("plan_kind", nlohmann::json()));
    if (!by_kind.count(kind)) kind_order.push_back(kind);
    const std::string status = cell_text(r->value("status", nlohmann::json()));
    ++by_kind[kind][status];
    if (status != "ok") {
      std::string reason = cell_text(r->value("reason", nlohmann::json()));
      if (reason.size() > 160) reason = reason.substr(0, 157) + "...";
      ++reasons[kind][reason];
    }
  }
  for (const auto& kind : kind_order) {
    const auto& s = by_kind[kind];
    const auto count = [&](const char* k) {
      const auto it = s.find(k);
      return it == s.end() ? std::size_t{0} : it->second;
    };
    std::string top_reason = "-";
    std::size_t top_n = 0;
    for (const auto& [reason, n] : reasons[kind])
      if (n > top_n) top_reason = reason, top_n = n;
    d.status_rows.push_back({kind, std::to_string(count("ok")), std::to_string(count("does_not_fit")),
                             std::to_string(count("invalid") + count("deadlock")),
                             top_n ? fmt::format("{} (x{})", top_reason, top_n) : "-"});
  }

  // Rank the feasible rows.
  const char* key = rank_column(options.rank_by);
  const bool descending = options.rank_by == RankBy::Throughput;
  std::vector<const nlohmann::json*> ranked;
  for (const auto* r : kept)
    if (r->value("status", std::string()) == "ok" && cell_number(*r, key)) ranked.push_back(r);
  if (ranked.empty() && options.rank_by == RankBy::Cost)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a cost",
                            "give the machines a price_per_hour (in the sweep grid or the machine file)");
  if (ranked.empty() && options.rank_by == RankBy::TimeToTrain)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a time to train",
                            "add a `budget:` (tokens or samples) to the sweep file");
  std::stable_sort(ranked.begin(), ranked.end(), [&](const nlohmann::json* a, const nlohmann::json* b) {
    const double x = *cell_number(*a, key);
    const double y = *cell_number(*b, key);
    return descending ? x > y : x < y;
  });

  const bool has_budget = meta.contains("budget") && meta["budget"].is_object();
  std::vector<std::string> grid_keys;
  for (const auto& a : meta.value("grid", nlohmann::json::array())) grid_keys.push_back(a.at("key").get<std::string>());
  d.columns = {"rank", "point"};
  for (const auto& g : grid_keys) d.columns.push_back(g);
  for (const char* c : {"kind", "GPUs", "D", "samples/s", "iteration", "u f/b", "peak GiB", "swap GiB", "p2p GiB",
                        "coll GiB", "host GiB"})
    d.columns.emplace_back(c);
  if (has_budget) {
    d.columns.emplace_back("time to train");
    d.columns.emplace_back("cost");
  }
  for (std::size_t c = 0; c < d.columns.size(); ++c) {
    const auto& n = d.columns[c];
    if (n == "rank" || n == "point" || n == "GPUs" || n == "D" || n == "samples/s" || n == "iteration" ||
        n.find("GiB") != std::string::npos || n == "time to train" || n == "cost")
      d.numeric_columns.push_back(static_cast<int>(c));
  }
  const std::size_t shown = options.top == 0 ? ranked.size() : std::min(options.top, ranked.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& r = *ranked[i];
    std::vector<std::string> row = {std::to_string(i + 1), cell_text(r.value("point", nlohmann::json()))};
    for (const auto& g : grid_keys) row.push_back(cell_text(r.value(g, nlohmann::json())));
    row.push_back(cell_text(r.value("plan_kind", nlohmann::json())));
    row.push_back(cell_text(r.value("gpus", nlohmann::json())));
    row.push_back(cell_text(r.value("minibatch", nlohmann::json())));
    row.push_back(num_or_dash(r, "throughput_samples_per_s", "{:.3f}"));
    row.push_back(cell_number(r, "iteration_time_s") ? fmt_duration(*cell_number(r, "iteration_time_s")) : "-");
    row.push_back(cell_text(r.value("u_fwd", nlohmann::json())) + "/" + cell_text(r.value("u_bwd", nlohmann::json())));
    row.push_back(num_or_dash(r, "peak_memory_bytes", "{:.2f}", 1.0 / kGiB));
    const double swap = cell_number(r, "swap_in_bytes").value_or(0) + cell_number(r, "swap_out_bytes").value_or(0);
    row.push_back(fmt::format("{:.2f}", swap / kGiB));
    row.push_back(num_or_dash(r, "p2p_bytes", "{:.2f}", 1.0 / kGiB));
    row.push_back(num_or_dash(r, "collective_bytes", "{:.2f}", 1.0 / kGiB));
    row.push_back(num_or_dash(r, "host_memory_bytes", "{:.2f}", 1.0 / kGiB));
    if (has_budget) {
      row.push_back(cell_number(r, "time_to_train_s") ? fmt_duration(*cell_number(r, "time_to_train_s")) : "-");
      row.push_back(num_or_dash(r, "cost", "{:.0f}"));
    }
    d.rows.push_back(std::move(row));
  }
  d.ranked_note = fmt::format("{} feasible rows of {} ranked by {} ({}); {} shown.", ranked.size(), kept.size(), key,
                              descending ? "highest first" : "lowest first", shown);
  if (ranked.empty()) return d;

  // Re-simulate the best point: its config comes from the sweep file, which must be the one that ran.
  fs::path sweep_path = options.sweep_file.empty() ? fs::path(sweep_file) : fs::path(options.sweep_file);
  if (options.sweep_file.empty() && sweep_path.is_relative() && !fs::exists(sweep_path) &&
      fs::exists(dir / sweep_path.filename()))
    sweep_path = dir / sweep_path.filename();
  if (!fs::exists(sweep_path))
    throw core::ConfigError(
        file_loc(meta_path),
        "the sweep file '" + sweep_path.string() + "' (needed to re-simulate the best point) is not found",
        "give it with --sweep FILE");
  const Sweep sweep = load_sweep(sweep_path.string());
  if (sweep.fingerprint != meta.at("fingerprint").get<std::string>())
    throw core::ConfigError(file_loc(sweep_path),
                            fmt::format("this sweep file (fingerprint {}) is not the one these results came from ({})",
                                        sweep.fingerprint, meta.at("fingerprint").get<std::string>()),
                            "give the sweep file (and base config) as they were when the sweep ran, with --sweep FILE");
  const auto& top = *ranked.front();
  const auto index = top.at("point").get<std::size_t>();
  const SweepPoint p = sweep_point(sweep, index);
  const auto cfg = core::load_config_text(sweep.base_text, sweep.base_path, p.overrides);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto kr = best_plan_of_kind(p.kind, model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model,
                                    cfg.search, cfg.options);
  if (!kr.feasible)
    throw core::ConfigError(file_loc(rows_path),
                            fmt::format("point {} is `ok` in the results but does not fit now: {}", index, kr.reason),
                            "the results are stale (another harmony-sim wrote them): rerun the sweep");
  std::string where = fmt::format("point {}", index);
  for (const auto& o : p.overrides)
    if (o.rfind("plan.mode=", 0) != 0) where += ", " + o;  // the kind is in the title
  d.has_best = true;
  d.best = make_best(kr, model, cfg, where);
  d.facts.emplace_back("model", model.name);
  d.facts.emplace_back("machine", cfg.machine.name + " (" + cfg.machine.gpu_name + ")");
  d.facts.emplace_back("cost model", cfg.cost_model);
  return d;
}

ReportData report_from_config(const std::string& config_path, const ReportOptions& options) {
  if (!options.where.empty())
    throw core::ConfigError(core::SourceLoc{"--where", 0, 0}, "--where filters the rows of a sweep",
                            "give a sweep output folder, or use --set on a config");
  const auto cfg = core::load_config(config_path, options.overrides);
  const auto model = core::load_model(cfg.model, cfg.machine);
  const auto res = compare_plan_kinds(model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model, cfg.search,
                                      cfg.options);
  ReportData d;
  d.title = "harmony-sim report: " + model.name + " on " + cfg.machine.name;
  d.facts = {{"config", cfg.file},
             {"model", model.name},
             {"machine", cfg.machine.name + " (" + cfg.machine.gpu_name + ")"},
             {"GPUs, minibatch", fmt::format("{}, {}", cfg.plan.gpus, cfg.plan.minibatch)},
             {"cost model", cfg.cost_model}};
  if (options.rank_by == RankBy::TimeToTrain || options.rank_by == RankBy::Cost)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "a config has no training budget",
                            "rank by throughput or iteration_time, or report on a sweep with a budget");
  std::vector<const KindResult*> order;
  for (const auto& k : res.kinds) order.push_back(&k);
  std::stable_sort(order.begin(), order.end(), [&](const KindResult* a, const KindResult* b) {
    if (a->feasible != b->feasible) return a->feasible;
    if (!a->feasible) return false;
    return a->best.iteration_time_s < b->best.iteration_time_s;  // == highest throughput first (same D)
  });
  d.columns = {"rank",     "plan kind", "candidates", "samples/s", "iteration", "speedup",      "u f/b",
               "swap GiB", "p2p GiB",   "coll GiB",   "peak GiB",  "host GiB",  "plan / reason"};
  d.numeric_columns = {0, 2, 3, 4, 5, 7, 8, 9, 10, 11};
  std::size_t feasible = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& k = *order[i];
    const std::string name = core::plan_kind_name(k.kind);
    d.status_rows.push_back({name, k.feasible ? "1" : "0", !k.feasible && k.applicable ? "1" : "0",
                             k.applicable ? "0" : "1", k.feasible ? "-" : k.reason});
    if (!k.feasible) {
      d.rows.push_back({"-", name, std::to_string(k.candidates), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                        "does not fit: " + k.reason});
      continue;
    }
    ++feasible;
    const auto& r = k.best;
    std::string plan = core::is_baseline(k.kind)
                           ? fmt::format("u {}, {}", r.plan.u_bwd, r.activation_policy)
                           : fmt::format("fwd {} bwd {}, {}", core::packs_to_string(r.plan.packs_fwd),
                                         core::packs_to_string(r.plan.packs_bwd), r.activation_policy);
    for (const auto& [policy, t] : k.policy_best_time_s)
      if (policy != r.activation_policy) plan += fmt::format(" ({} {})", policy, fmt_duration(t));
    d.rows.push_back({std::to_string(feasible), name, std::to_string(k.candidates),
                      fmt::format("{:.3f}", r.throughput_samples_per_s), fmt_duration(r.iteration_time_s),
                      std::isfinite(res.best_baseline_time_s) ? fmt::format("{:.2f}x", k.speedup_over_best_baseline)
                                                              : std::string("-"),
                      fmt::format("{}/{}", r.plan.u_fwd, r.plan.u_bwd), fmt_gib(r.swap_in_bytes + r.swap_out_bytes),
                      fmt_gib(r.p2p_bytes), fmt_gib(r.collective_bytes), fmt_gib(r.peak_memory_bytes),
                      r.native ? fmt_gib(r.host_memory.total_bytes) : std::string("-"), plan});
  }
  d.ranked_note = fmt::format(
      "{} of {} plan kinds fit; ranked by iteration time (lowest first). Speedup: the best "
      "baseline's time / this kind's.",
      feasible, order.size());
  if (feasible == 0) return d;
  d.has_best = true;
  d.best = make_best(*order.front(), model, cfg, cfg.file);
  return d;
}

// ---------------------------------------------------------------------------------------------------------
// Rendering

namespace {

struct KindStyle {
  const char* fill;
  const char* what;
};
// One colour per op kind; the screenshot test looks for FWD's and BWD's colours in the timeline.
KindStyle kind_style(core::OpKind k) {
  using K = core::OpKind;
  switch (k) {
    case K::FWD:
      return {"#4e79a7", "forward"};
    case K::REC:
      return {"#a0cbe8", "recompute"};
    case K::BWD:
      return {"#f28e2b", "backward"};
    case K::WB:
      return {"#59a14f", "weights in"};
    case K::dWB:
      return {"#8cd17d", "weight grads out"};
    case K::X:
      return {"#b6992d", "activation in"};
    case K::Y:
      return {"#f1ce63", "activation out"};
    case K::sX:
      return {"#9c755f", "stash"};
    case K::dY:
      return {"#d37295", "output grad in"};
    case K::dX:
      return {"#fabfd2", "input grad out"};
    case K::ARD:
      return {"#e15759", "all-reduce"};
    case K::AG:
      return {"#ff9d9a", "all-gather"};
    case K::RS:
      return {"#c0392b", "reduce-scatter"};
    case K::MSGsX:
      return {"#79706e", "CPU msg (stash)"};
    case K::MSGY:
      return {"#79706e", "CPU msg (Y)"};
    case K::Update:
      return {"#b07aa1", "CPU update"};
    case K::DEL:
      return {"#bab0ac", "free"};
  }
  return {"#888888", "op"};
}

// Memory lines: a palette disjoint from the op colours (the screenshot test counts those).
const char* kGpuColors[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#444444"};

// Axis ticks: a 1-2-5 step giving about `want` ticks over [0, span].
double nice_step(double span, int want) {
  if (span <= 0) return 1;
  const double raw = span / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

struct TimeAxis {
  double end_s = 1;
  double unit = 1;  // seconds per displayed unit
  const char* name = "s";
  double x0 = 0, width = 1;
  double x(core::TimePs t) const { return x0 + width * seconds(t) / end_s; }
};

TimeAxis time_axis(double end_s, double x0, double width) {
  TimeAxis a;
  a.end_s = end_s > 0 ? end_s : 1e-9;
  a.x0 = x0;
  a.width = width;
  if (a.end_s < 2e-3) {
    a.unit = 1e-6;
    a.name = "us";
  } else if (a.end_s < 2.0) {
    a.unit = 1e-3;
    a.name = "ms";
  }
  return a;
}

void axis_ticks(std::string& out, const TimeAxis& a, double y, double tick_to_y) {
  const double span = a.end_s / a.unit;
  const double step = nice_step(span, 10);
  for (int i = 0;; ++i) {
    const double v = i * step;
    if (v > span * 1.0001) break;
    const double x = a.x0 + a.width * v / span;
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" class="grid"/>)", x, y, tick_to_y);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="tick" text-anchor="middle">{:g}</text>)", x, y - 4, v);
  }
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="tick" text-anchor="start">{}</text>)", a.x0 + a.width + 6,
                     y - 4, a.name);
}

constexpr double kLabelWidth = 130;
constexpr double kPlotWidth = 1080;

std::string timeline_svg(const BestPlan& b) {
  const auto& prog = b.program;
  const auto& tl = b.native.timeline;
  core::TimePs end = 0;
  for (std::size_t i = 0; i < prog.ops.size(); ++i)
    if (i < tl.end_ps.size() && tl.begin_ps[i] >= 0) end = std::max(end, tl.end_ps[i]);
  const TimeAxis ax = time_axis(seconds(end), kLabelWidth, kPlotWidth);
  constexpr double kLane = 16, kGap = 4, kTop = 26;
  const double height = kTop + static_cast<double>(prog.queues.size()) * (kLane + kGap) + 6;
  std::vector<char> on_path(prog.ops.size(), 0);
  for (const auto& s : b.bottleneck.critical_path)
    if (s.op >= 0 && static_cast<std::size_t>(s.op) < on_path.size()) on_path[static_cast<std::size_t>(s.op)] = 1;

  std::string out = fmt::format(
      R"(<svg id="timeline-svg" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" shape-rendering="crispEdges" role="img" aria-label="timeline of the best plan">)",
      kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
  axis_ticks(out, ax, kTop - 6, height - 4);
  for (std::size_t q = 0; q < prog.queues.size(); ++q) {
    const auto& queue = prog.queues[q];
    const double y = kTop + static_cast<double>(q) * (kLane + kGap);
    const std::string lane = queue.stream == core::Stream::Cpu
                                 ? fmt::format("CPU (GPU{})", queue.device)
                                 : fmt::format("GPU{} {}", queue.device, core::stream_name(queue.stream));
    out += fmt::format(R"(<rect x="{:.0f}" y="{:.1f}" width="{:.0f}" height="{:.0f}" class="lane"/>)", kLabelWidth, y,
                       kPlotWidth, kLane);
    out += fmt::format(R"(<text x="{:.0f}" y="{:.1f}" class="label" text-anchor="end">{}</text>)", kLabelWidth - 6,
                       y + kLane - 4, html_escape(lane));
    for (int op : queue.ops) {
      const auto i = static_cast<std::size_t>(op);
      if (i >= tl.begin_ps.size() || tl.begin_ps[i] < 0) continue;
      const auto& o = prog.ops[i];
      const double x0 = ax.x(tl.begin_ps[i]);
      const double w = std::max(0.6, ax.x(tl.end_ps[i]) - x0);
      const auto st = kind_style(o.kind);
      out += fmt::format(
          R"(<rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{:.0f}" fill="{}" class="op{}"><title>{} ({}): {} to {}{}</title></rect>)",
          x0, y + 1, w, kLane - 2, st.fill, on_path[i] ? " crit" : "", html_escape(prog.op_label(op)), st.what,
          fmt_duration(seconds(tl.begin_ps[i])), fmt_duration(seconds(tl.end_ps[i])),
          o.bytes > 0 ? fmt::format(", {:.1f} MiB", static_cast<double>(o.bytes) / static_cast<double>(core::kMiB))
                      : std::string());
    }
  }
  out += "</svg>\n";
  // Legend: the kinds present, in enum order.
  std::vector<char> present(core::kNumOpKinds, 0);
  for (const auto& o : prog.ops) present[static_cast<std::size_t>(o.kind)] = 1;
  out += R"(<p class="legend">)";
  for (int k = 0; k < core::kNumOpKinds; ++k) {
    if (!present[static_cast<std::size_t>(k)]) continue;
    const auto kind = static_cast<core::OpKind>(k);
    const auto st = kind_style(kind);
    out += fmt::format(R"(<span><i style="background:{}"></i>{} ({})</span> )", st.fill, core::op_kind_name(kind),
                       st.what);
  }
  out += R"(<span><i class="critkey"></i>critical path</span></p>)";
  out += "\n";
  return out;
}

std::string memory_svg(const BestPlan& b) {
  const auto& samples = b.native.memory_samples;
  int devices = 0;
  for (const auto& s : samples) devices = std::max(devices, s.device + 1);
  devices = std::max<int>(devices, static_cast<int>(b.native.peak_bytes.size()));
  core::TimePs end = 0;
  for (std::size_t i = 0; i < b.native.timeline.end_ps.size(); ++i)
    if (b.native.timeline.begin_ps[i] >= 0) end = std::max(end, b.native.timeline.end_ps[i]);
  double top = b.capacity_bytes_per_gpu;
  for (const auto p : b.native.peak_bytes) top = std::max(top, static_cast<double>(p));
  top = std::max(top, 1.0) * 1.08;
  constexpr double kPlotHeight = 240, kTop = 26;
  const double height = kTop + kPlotHeight + 30;
  const TimeAxis ax = time_axis(seconds(end), kLabelWidth, kPlotWidth);
  const auto y_of = [&](double bytes) { return kTop + kPlotHeight * (1.0 - bytes / top); };

  std::string out = fmt::format(
      R"(<svg id="memory-svg" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" role="img" aria-label="device memory over time">)",
      kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
  axis_ticks(out, ax, kTop - 6, kTop + kPlotHeight);
  const double gstep = nice_step(top / kGiB, 5);
  for (int i = 0;; ++i) {
    const double v = i * gstep;
    if (v * kGiB > top) break;
    const double y = y_of(v * kGiB);
    out += fmt::format(R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="grid"/>)", kLabelWidth, y,
                       kLabelWidth + kPlotWidth, y);
    out += fmt::format(R"(<text x="{:.0f}" y="{:.1f}" class="tick" text-anchor="end">{:g} GiB</text>)", kLabelWidth - 6,
                       y + 4, v);
  }
  const double cap_y = y_of(b.capacity_bytes_per_gpu);
  out += fmt::format(
      R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="capacity"/><text x="{:.0f}" y="{:.1f}" class="tick">capacity {:.2f} GiB</text>)",
      kLabelWidth, cap_y, kLabelWidth + kPlotWidth, cap_y, kLabelWidth + 4, cap_y - 4, b.capacity_bytes_per_gpu / kGiB);
  // Per device a step line, binned to half a pixel: each bin draws the highest value in it and ends at its last.
  for (int dev = 0; dev < devices; ++dev) {
    struct Bin {
      double x;
      double max;
      double last;
    };
    std::vector<Bin> bins;
    for (const auto& s : samples) {
      if (s.device != dev) continue;
      const double x = std::round(ax.x(s.time_ps) * 2) / 2;
      const double v = static_cast<double>(s.bytes);
      if (!bins.empty() && bins.back().x == x) {
        bins.back().max = std::max(bins.back().max, v);
        bins.back().last = v;
      } else {
        bins.push_back({x, v, v});
      }
    }
    std::string pts = fmt::format("{:.1f},{:.1f}", kLabelWidth, y_of(0));
    double prev = 0;
    for (const auto& bin : bins) {
      pts += fmt::format(" {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}", bin.x, y_of(prev), bin.x, y_of(bin.max), bin.x,
                         y_of(bin.last));
      prev = bin.last;
    }
    pts += fmt::format(" {:.1f},{:.1f}", kLabelWidth + kPlotWidth, y_of(prev));
    out += fmt::format(
        R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5" class="mem"><title>GPU{}</title></polyline>)",
        pts, kGpuColors[dev % 8], dev);
  }
  out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" class="tick">)", kLabelWidth, height - 6);
  for (int dev = 0; dev < devices; ++dev) {
    const double peak = static_cast<std::size_t>(dev) < b.native.peak_bytes.size()
                            ? static_cast<double>(b.native.peak_bytes[static_cast<std::size_t>(dev)])
                            : 0.0;
    out += fmt::format(R"(<tspan fill="{}">&#9632; GPU{} (peak {:.2f} GiB)</tspan>  )", kGpuColors[dev % 8], dev,
                       peak / kGiB);
  }
  out += "</text></svg>\n";
  return out;
}

void table(std::string& out, const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
           const std::vector<int>& numeric, const char* id = nullptr) {
  const auto is_num = [&](std::size_t c) {
    return std::find(numeric.begin(), numeric.end(), static_cast<int>(c)) != numeric.end();
  };
  out += id ? fmt::format(R"(<table id="{}">)", id) : std::string("<table>");
  out += "<thead><tr>";
  for (std::size_t c = 0; c < head.size(); ++c)
    out += fmt::format("<th{}>{}</th>", is_num(c) ? R"( class="num")" : "", html_escape(head[c]));
  out += "</tr></thead><tbody>\n";
  for (const auto& r : rows) {
    out += "<tr>";
    for (std::size_t c = 0; c < r.size(); ++c)
      out += fmt::format("<td{}>{}</td>", is_num(c) ? R"( class="num")" : "", html_escape(r[c]));
    out += "</tr>\n";
  }
  out += "</tbody></table>\n";
}

std::string pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-"; }

std::string ledger_html(const BestPlan& b) {
  const auto& l = b.report.ledger;
  std::string out;
  out += "<h3>Bytes moved in one iteration, by path</h3>\n";
  table(out, {"path", "GiB"},
        {{"PCIe host to GPU (swap in)", fmt_gib(l.pcie_h2d_bytes)},
         {"PCIe GPU to host (swap out)", fmt_gib(l.pcie_d2h_bytes)},
         {"GPU to GPU over PCIe", fmt_gib(l.p2p_pcie_bytes)},
         {"GPU to GPU over NVLink", fmt_gib(l.nvlink_bytes)},
         {"GPU to GPU staged in host memory", fmt_gib(l.host_staging_bytes)},
         {"CPU messages", fmt_gib(l.cpu_msg_bytes)}},
        {1});
  out += "<h3>... by tensor</h3>\n";
  table(out, {"tensor", "GiB"},
        {{"weights", fmt_gib(l.weights_bytes)},
         {"weight gradients", fmt_gib(l.weight_grad_bytes)},
         {"optimizer state", fmt_gib(l.optimizer_state_bytes)},
         {"activations", fmt_gib(l.activation_bytes)},
         {"stashed inputs", fmt_gib(l.stash_bytes)},
         {"activation gradients", fmt_gib(l.act_grad_bytes)}},
        {1});
  out += "<h3>... by link</h3>\n";
  std::vector<std::vector<std::string>> rows;
  const double iter = b.report.iteration_time_s;
  for (const auto& link : l.links) {
    if (link.bytes == 0 && link.busy_s == 0) continue;
    const bool cpu = link.kind == "cpu_cores";
    rows.push_back({link.name, link.kind,
                    link.capacity_bytes_per_s <= 0 ? "unlimited"
                    : cpu                          ? fmt::format("{:.0f} cores", link.capacity_bytes_per_s)
                                                   : fmt::format("{:.2f}", link.capacity_bytes_per_s / kGiB),
                    cpu ? "-" : fmt_gib(link.bytes), fmt::format("{:.4f}", link.busy_s), pct(link.busy_s, iter),
                    !cpu && link.busy_s > 0
                        ? fmt::format("{:.2f}", static_cast<double>(link.bytes) / link.busy_s / kGiB)
                        : std::string("-")});
  }
  table(out, {"link", "kind", "capacity GiB/s", "GiB", "busy s", "busy % of iteration", "GiB/s while busy"}, rows,
        {2, 3, 4, 5, 6});
  const auto& h = b.report.host_memory;
  out += "<h3>Host memory</h3>\n";
  table(out, {"account", "GiB"},
        {{"master weights", fmt_gib(h.master_weights_bytes)},
         {"optimizer state", fmt_gib(h.optimizer_state_bytes)},
         {"gradients", fmt_gib(h.gradient_bytes)},
         {"stashes", fmt_gib(h.stash_bytes)},
         {"activations and messages", fmt_gib(h.activation_bytes)},
         {"pinned staging", fmt_gib(h.pinned_staging_bytes)},
         {"total needed", fmt_gib(h.total_bytes)},
         {"capacity", h.capacity_bytes > 0 ? fmt_gib(h.capacity_bytes) : "unlimited"}},
        {1});
  return out;
}

std::string bottleneck_html(const BestPlan& b) {
  const auto& bn = b.bottleneck;
  std::string out = fmt::format("<p>Binding resource: <b>{}</b>.</p>\n", html_escape(bn.binding));
  std::vector<std::vector<std::string>> wi;
  for (const auto& w : bn.what_if)
    wi.push_back({w.resource, w.change, w.feasible ? fmt_duration(w.iteration_time_s) : "does not fit",
                  fmt::format("{:.3f}x", w.speedup)});
  table(out, {"resource 2x", "change", "iteration", "speedup"}, wi, {2, 3});
  std::vector<std::vector<std::string>> g;
  for (const auto& p : bn.per_gpu) {
    const double t = bn.iteration_time_s;
    g.push_back({fmt::format("GPU{}", p.gpu), pct(p.compute_s, t), pct(p.wait_swap_s, t), pct(p.wait_peer_s, t),
                 pct(p.wait_cpu_s, t), pct(p.idle_s, t)});
  }
  out += "<h3>Where each GPU's compute stream spends the iteration</h3>\n";
  table(out, {"GPU", "compute", "waiting for swaps", "waiting for peers", "waiting for the CPU", "idle"}, g,
        {1, 2, 3, 4, 5});
  out += fmt::format("<p>Critical path: {} ops; compute {}, transfers {}, CPU {}, waits {}, other {}.</p>\n",
                     bn.critical_path.size(), fmt_duration(bn.path_compute_s), fmt_duration(bn.path_transfer_s),
                     fmt_duration(bn.path_cpu_s), fmt_duration(bn.path_wait_s), fmt_duration(bn.path_other_s));
  return out;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;max-width:1320px}
h1{font-size:22px;margin:0 0 8px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd} h3{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px} th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums} tbody tr:nth-child(1) td{font-weight:600}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:8px 0} dl.facts dt{color:#666} dl.facts dd{margin:0}
nav a{margin-right:14px} .note{color:#555;font-size:13px}
svg text{font:11px system-ui,sans-serif;fill:#333} svg .label{font-size:11px} svg .tick{fill:#555}
svg .grid{stroke:#e6e6e6;stroke-width:1} svg .lane{fill:#f7f7f7} svg .capacity{stroke:#c00;stroke-dasharray:6 4;stroke-width:1.2}
svg rect.crit{stroke:#000;stroke-width:1}
.legend span{display:inline-block;margin:2px 12px 2px 0;font-size:12px} .legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.legend i.critkey{border:1.5px solid #000;box-sizing:border-box;background:#fff}
.scroll{overflow-x:auto}
)";

}  // namespace

std::string render_report_html(const ReportData& d) {
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"generator\" content=\"harmony-sim report\">\n";
  out += fmt::format("<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n", html_escape(d.title), kStyle);
  out += fmt::format("<h1>{}</h1>\n<dl class=\"facts\">", html_escape(d.title));
  for (const auto& [k, v] : d.facts) out += fmt::format("<dt>{}</dt><dd>{}</dd>", html_escape(k), html_escape(v));
  out +=
      "</dl>\n<nav><a href=\"#ranked\">ranked table</a><a href=\"#best\">best plan</a><a "
      "href=\"#timeline\">timeline</a><a href=\"#memory\">memory</a><a href=\"#ledger\">swap ledger</a><a "
      "href=\"#bottleneck\">bottleneck</a><a href=\"#status\">feasibility</a></nav>\n";

  out += "<section id=\"ranked\"><h2>Ranked results</h2>\n<div class=\"scroll\">";
  table(out, d.columns, d.rows, d.numeric_columns, "ranked-table");
  out += fmt::format("</div><p class=\"note\">{}</p></section>\n", html_escape(d.ranked_note));

  if (d.has_best) {
    const auto& b = d.best;
    const auto& r = b.report;
    out += fmt::format("<section id=\"best\"><h2>Best plan: {}</h2>\n<dl class=\"facts\">", html_escape(b.title));
    const std::vector<std::pair<std::string, std::string>> facts = {
        {"from", b.where},
        {"iteration time", fmt_duration(r.iteration_time_s)},
        {"throughput", fmt::format("{:.3f} samples/s", r.throughput_samples_per_s)},
        {"peak GPU memory",
         fmt::format("{} GiB of {:.2f} GiB", fmt_gib(r.peak_memory_bytes), b.capacity_bytes_per_gpu / kGiB)},
        {"ops, queues", fmt::format("{}, {}", b.program.ops.size(), b.program.queues.size())},
        {"binding resource", b.bottleneck.binding},
        {"simulated by",
         "the native engine" + std::string(r.cost_model == "reference" ? " with the reference's bandwidths (reproduces "
                                                                         "the reference cost model's times)"
                                                                       : "")}};
    for (const auto& [k, v] : facts) out += fmt::format("<dt>{}</dt><dd>{}</dd>", html_escape(k), html_escape(v));
    if (!r.feasible)
      out += fmt::format("<dt>note</dt><dd>re-simulated, it does not fit: {}</dd>", html_escape(r.infeasible_reason));
    out += "</dl></section>\n";
    out +=
        "<section id=\"timeline\"><h2>Timeline of the best plan</h2>\n<p class=\"note\">One lane per GPU stream; "
        "hover an op for its name and times. Outlined ops lie on the critical path.</p>\n<div class=\"scroll\">";
    out += timeline_svg(b);
    out += "</div></section>\n";
    out += "<section id=\"memory\"><h2>Device memory over time</h2>\n<div class=\"scroll\">";
    out += memory_svg(b);
    out += "</div></section>\n";
    out += "<section id=\"ledger\"><h2>Swap ledger</h2>\n";
    out += ledger_html(b);
    out += "</section>\n<section id=\"bottleneck\"><h2>Bottleneck</h2>\n";
    out += bottleneck_html(b);
    out += "</section>\n";
  } else {
    out += "<section id=\"best\"><h2>Best plan</h2><p>No row fits: there is no plan to show.</p></section>\n";
  }
  out += "<section id=\"status\"><h2>Feasibility by plan kind</h2>\n";
  table(out, {"plan kind", "ok", "does not fit", "invalid", "most frequent reason"}, d.status_rows, {1, 2, 3},
        "status-table");
  out +=
      "</section>\n<footer class=\"note\">Written by harmony-sim report. Self-contained: no scripts, no network. "
      "Units: GiB = 2^30 bytes.</footer>\n</body>\n</html>\n";
  return out;
}

}  // namespace harmony::sim
