// `harmony-sim report`: gathers a sweep's rows (or one config's plan kinds), groups them by model and machine,
// re-simulates each model's best plan with the native engine recording samples, and renders the page: best kind
// per (model, machine) with a heatmap, throughput and cost charts, ranked tables, SVG timeline, memory over time,
// swap ledger, bottleneck, and the Chrome traces. Every number has a fixed precision: the page is reproducible.
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
#include "core/base/input_file.hpp"
#include "core/output/trace.hpp"
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
  return core::read_input_file(p.string(), "the file", "check the path and its permissions");
}

// A cell as the table shows it: strings bare, numbers as written, null as "-".
std::string cell_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// One results row as the report reads it. This function is the only place that knows the results' column
// names (docs/sweeps.md; docs/output-schema.md): of two names for one concept the first present wins
// (`plan_kind` before the older `kind`); a missing or null cell is unknown (nullopt / empty).
struct RowView {
  std::size_t point = 0;
  std::string kind;
  std::string model_name;
  std::string machine_name;
  std::string status;
  std::string reason;
  std::optional<bool> fits;
  std::optional<double> gpus, minibatch, throughput, iteration_s, time_to_train_s, cost, u_fwd, u_bwd, peak_bytes,
      swap_bytes, p2p_bytes, collective_bytes, host_bytes;
  std::vector<std::string> grid;  // the grid values as written (YAML text), in sweep.json's grid order
};

RowView read_row(const nlohmann::json& r, const std::vector<std::string>& grid_keys) {
  const auto text = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      const auto it = r.find(k);
      if (it != r.end() && !it->is_null()) return cell_text(*it);
    }
    return std::string();
  };
  // Numbers beyond +-1e300 are unknown: every later product, log and cast stays finite and defined.
  const auto number = [&](std::initializer_list<const char*> keys) -> std::optional<double> {
    for (const char* k : keys) {
      const auto it = r.find(k);
      if (it != r.end() && it->is_number()) {
        const double x = it->get<double>();
        return std::isfinite(x) && std::fabs(x) < 1e300 ? std::optional<double>(x) : std::nullopt;
      }
    }
    return std::nullopt;
  };
  // Counts (point, GPUs, minibatch, u): whole numbers in [0, 2^53], else unknown.
  const auto count = [&](std::initializer_list<const char*> keys) -> std::optional<double> {
    const auto x = number(keys);
    return x && *x >= 0 && *x <= 9007199254740992.0 && std::floor(*x) == *x ? x : std::nullopt;
  };
  RowView v;
  const auto point = count({"point"});
  v.point = point ? static_cast<std::size_t>(*point) : std::numeric_limits<std::size_t>::max();
  v.kind = text({"plan_kind", "kind"});
  v.model_name = text({"model_name"});
  v.machine_name = text({"machine_name"});
  v.status = text({"status"});
  v.reason = text({"reason"});
  if (const auto it = r.find("fits"); it != r.end() && it->is_boolean()) v.fits = it->get<bool>();
  v.gpus = count({"gpus"});
  v.minibatch = count({"minibatch"});
  v.throughput = number({"throughput_samples_per_s"});
  v.iteration_s = number({"iteration_time_s"});
  v.time_to_train_s = number({"time_to_train_s"});
  v.cost = number({"cost"});
  v.u_fwd = count({"u_fwd"});
  v.u_bwd = count({"u_bwd"});
  v.peak_bytes = number({"peak_memory_bytes"});
  const auto in = number({"swap_in_bytes"});
  const auto out = number({"swap_out_bytes"});
  if (in || out) v.swap_bytes = in.value_or(0) + out.value_or(0);
  v.p2p_bytes = number({"p2p_bytes"});
  v.collective_bytes = number({"collective_bytes"});
  v.host_bytes = number({"host_memory_bytes"});
  for (const auto& k : grid_keys) {
    const auto it = r.find(k);
    v.grid.push_back(it == r.end() ? std::string("-") : cell_text(*it));
  }
  return v;
}

bool is_ok(const RowView& r) { return r.status == "ok"; }

std::optional<double> metric_of(const RowView& r, RankBy by) {
  switch (by) {
    case RankBy::Throughput:
      return r.throughput;
    case RankBy::IterationTime:
      return r.iteration_s;
    case RankBy::TimeToTrain:
      return r.time_to_train_s;
    case RankBy::Cost:
      return r.cost;
  }
  return r.throughput;
}

const char* metric_column(RankBy r) {
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

bool higher_is_better(RankBy r) { return r == RankBy::Throughput; }
bool better(double a, double b, RankBy r) { return higher_is_better(r) ? a > b : a < b; }
// How many times better `a` is than `b` (>= 1 when a is at least as good).
double ratio(double a, double b, RankBy r) { return higher_is_better(r) ? a / b : b / a; }

std::string fmt_metric(double v, RankBy r) {
  if (!std::isfinite(v)) return "-";
  switch (r) {
    case RankBy::Throughput:
      return fmt::format("{:.3f}", v);
    case RankBy::IterationTime:
    case RankBy::TimeToTrain:
      return fmt_duration(v);
    case RankBy::Cost:
      return fmt::format("{:.2f}", v);
  }
  return fmt::format("{}", v);
}

const char* metric_title(RankBy r) {
  switch (r) {
    case RankBy::Throughput:
      return "samples/s";
    case RankBy::IterationTime:
      return "iteration";
    case RankBy::TimeToTrain:
      return "time to train";
    case RankBy::Cost:
      return "cost";
  }
  return "samples/s";
}

bool is_baseline_kind(const std::string& kind) {
  const auto k = core::parse_plan_kind(kind);
  return k && core::is_baseline(*k);
}

bool key_in(const std::string& key, const char* prefix) {
  const std::string p(prefix);
  return key == p || key.rfind(p + ".", 0) == 0;
}

std::string num_or_dash(const std::optional<double>& v, const char* spec, double scale = 1.0) {
  if (!v) return "-";
  return fmt::format(fmt::runtime(spec), *v * scale);
}

// Models (or machines) of a sweep: a row's group is its name plus the grid values that configure it (keys
// `model...` or `machine...`), so two grid values naming one preset with other prices stay apart. A group is
// labelled by its name; names shared by several groups get their grid values in parentheses.
struct Groups {
  std::vector<std::string> order;  // group keys, in order of first appearance
  std::map<std::string, std::string> label;
};

std::string group_key(const RowView& r, const std::vector<std::string>& grid_keys, const char* prefix) {
  const bool model = std::string(prefix) == "model";
  const std::string& name = model ? r.model_name : r.machine_name;
  if (name.empty()) return {};
  std::string extra;
  for (std::size_t a = 0; a < grid_keys.size(); ++a)
    if (key_in(grid_keys[a], prefix)) extra += (extra.empty() ? "" : ", ") + r.grid[a];
  return name + '\x1f' + extra;
}

Groups make_groups(const std::vector<RowView>& rows, const std::vector<std::string>& grid_keys, const char* prefix) {
  Groups g;
  std::map<std::string, std::string> name_of, extra_of;
  std::map<std::string, int> name_count;
  const bool model = std::string(prefix) == "model";
  for (const auto& r : rows) {
    const std::string& name = model ? r.model_name : r.machine_name;
    if (name.empty()) continue;
    std::string extra;
    for (std::size_t a = 0; a < grid_keys.size(); ++a) {
      if (!key_in(grid_keys[a], prefix)) continue;
      std::string v = r.grid[a];  // a flow map's braces are noise in a label: "preset: x, price_per_hour: 2"
      if (v.size() >= 2 && v.front() == '{' && v.back() == '}') v = v.substr(1, v.size() - 2);
      extra += (extra.empty() ? "" : ", ") + v;
    }
    const std::string key = group_key(r, grid_keys, prefix);
    if (name_of.count(key)) continue;
    g.order.push_back(key);
    name_of[key] = name;
    extra_of[key] = extra;
    ++name_count[name];
  }
  for (const auto& key : g.order)
    g.label[key] = name_count[name_of[key]] > 1 && !extra_of[key].empty() && extra_of[key] != name_of[key]
                       ? fmt::format("{} ({})", name_of[key], extra_of[key])
                       : name_of[key];
  return g;
}

// Marks the rows no other row beats on both time to train and cost (ties: the first of equal points).
void mark_pareto(std::vector<CostPoint>& pts) {
  std::vector<std::size_t> order(pts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (pts[a].time_to_train_s != pts[b].time_to_train_s) return pts[a].time_to_train_s < pts[b].time_to_train_s;
    return pts[a].cost < pts[b].cost;
  });
  double best_cost = std::numeric_limits<double>::infinity();
  for (const auto i : order) {
    if (pts[i].cost < best_cost) {
      pts[i].pareto = true;
      best_cost = pts[i].cost;
    }
  }
}

// The sweep file the results came from: --sweep FILE, else the path sweep.json records: its absolute form when
// it has one (`sweep_file_absolute`), as given (absolute, or relative to the working folder), then relative to the
// results folder and each folder above it, then beside the results. The first with the results' fingerprint wins; a
// file found with another fingerprint is an error (its points are other plans). nullopt: none found (`tried` lists
// where it looked).
std::optional<Sweep> find_sweep(const fs::path& dir, const fs::path& meta_path, const std::string& recorded,
                                const std::string& recorded_absolute, const std::string& fingerprint,
                                const std::string& given, std::string* tried) {
  std::vector<fs::path> candidates;
  if (!given.empty()) {
    if (!fs::exists(given))
      throw core::ConfigError(file_loc(meta_path),
                              "the sweep file '" + given + "' (needed to re-simulate the best point) is not found",
                              "give it with --sweep FILE");
    candidates.emplace_back(given);
  } else if (!recorded.empty()) {
    const fs::path rec(recorded);
    if (!recorded_absolute.empty()) candidates.emplace_back(recorded_absolute);
    candidates.push_back(rec);
    if (rec.is_relative()) {
      std::error_code ec;
      fs::path up = fs::absolute(dir, ec);
      while (!ec && !up.empty()) {
        candidates.push_back(up / rec);
        if (up == up.parent_path()) break;
        up = up.parent_path();
      }
    }
    candidates.push_back(dir / rec.filename());
  }
  std::optional<fs::path> mismatch;
  std::string mismatch_fp;
  std::vector<std::string> seen;
  for (const auto& c : candidates) {
    const std::string norm = c.lexically_normal().string();
    if (std::find(seen.begin(), seen.end(), norm) != seen.end()) continue;
    seen.push_back(norm);
    if (tried) *tried += (tried->empty() ? "" : ", ") + norm;
    std::error_code ec;
    if (!fs::is_regular_file(c, ec)) continue;
    Sweep s = load_sweep(c.string());
    if (s.fingerprint == fingerprint) return s;
    if (!mismatch) {
      mismatch = c;
      mismatch_fp = s.fingerprint;
    }
  }
  if (mismatch)
    throw core::ConfigError(file_loc(*mismatch),
                            fmt::format("this sweep file (fingerprint {}) is not the one these results came from ({})",
                                        mismatch_fp, fingerprint),
                            "give the sweep file (and base config) as they were when the sweep ran, with --sweep FILE");
  return std::nullopt;
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
  const std::string fingerprint = meta.at("fingerprint").get<std::string>();

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
      if (!rows.back().is_object()) throw nlohmann::json::type_error::create(302, "a row is a JSON object", nullptr);
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

  std::vector<std::string> grid_keys;
  for (const auto& a : meta.value("grid", nlohmann::json::array())) grid_keys.push_back(a.at("key").get<std::string>());
  const auto keep = [&](const nlohmann::json& r) {
    for (const auto& [k, v] : filters) {
      const auto it = r.find(k);
      if (it == r.end() || cell_text(*it) != v) return false;
    }
    return true;
  };
  std::vector<RowView> kept;
  for (const auto& r : rows)
    if (keep(r)) kept.push_back(read_row(r, grid_keys));

  const Groups models = make_groups(kept, grid_keys, "model");
  const Groups machines = make_groups(kept, grid_keys, "machine");
  std::vector<std::string> model_keys = models.order;
  if (!options.model.empty()) {
    std::vector<std::string> chosen;
    for (const auto& k : models.order)
      if (models.label.at(k) == options.model || k.substr(0, k.find('\x1f')) == options.model) chosen.push_back(k);
    if (chosen.empty()) {
      std::string list;
      for (const auto& k : models.order) list += (list.empty() ? "" : ", ") + models.label.at(k);
      throw core::ConfigError(core::SourceLoc{"--model", 0, 0},
                              "no row of " + rows_path.string() + " is of model '" + options.model + "'",
                              list.empty() ? "no row names a model: check --where" : "use one of: " + list);
    }
    model_keys = chosen;
  }

  ReportData d;
  d.from_sweep = true;
  d.rank_by = options.rank_by;
  const std::string sweep_file = meta.value("sweep_file", std::string());
  d.title = "harmony-sim report: sweep " + (sweep_file.empty() ? dir.filename().string() : sweep_file);
  if (!options.model.empty()) d.title += ", model " + options.model;
  d.facts.emplace_back("sweep", sweep_file);
  d.facts.emplace_back("fingerprint", fingerprint);
  d.facts.emplace_back("rows", fmt::format("{} of {} points{}", rows.size(), total_points,
                                           rows.size() < total_points ? " (unfinished or a shard)" : ""));
  if (!filters.empty()) {
    std::string f;
    for (const auto& [k, v] : filters) f += (f.empty() ? "" : ", ") + k + " = " + v;
    d.facts.emplace_back("filter", fmt::format("{} ({} rows kept)", f, kept.size()));
  }
  const bool has_budget = meta.contains("budget") && meta["budget"].is_object();
  if (has_budget) {
    const auto& b = meta["budget"];
    d.facts.emplace_back("budget", b.contains("tokens")
                                       ? fmt::format("{} tokens ({} samples of {} tokens)", b["tokens"].dump(),
                                                     b["samples"].dump(), b["seq_len"].dump())
                                       : fmt::format("{} samples", b["samples"].dump()));
  }
  {
    std::string list;
    for (const auto& k : models.order) list += (list.empty() ? "" : ", ") + models.label.at(k);
    d.facts.emplace_back(options.model.empty() ? "models" : "models in the sweep", list.empty() ? "-" : list);
    list.clear();
    for (const auto& k : machines.order) list += (list.empty() ? "" : ", ") + machines.label.at(k);
    d.facts.emplace_back("machines", list.empty() ? "-" : list);
  }
  d.facts.emplace_back("ranked by", fmt::format("{} ({}), within each model", metric_column(options.rank_by),
                                                higher_is_better(options.rank_by) ? "highest first" : "lowest first"));

  // Status counts per plan kind (of the kept rows) and the most frequent reason a kind does not fit.
  std::map<std::string, std::map<std::string, std::size_t>> by_kind;
  std::map<std::string, std::map<std::string, std::size_t>> reasons;
  std::vector<std::string> kind_order;
  for (const auto& r : kept) {
    const std::string kind = r.kind.empty() ? "-" : r.kind;
    if (!by_kind.count(kind)) kind_order.push_back(kind);
    ++by_kind[kind][r.status];
    if (!is_ok(r)) {
      std::string reason = r.reason.empty() ? "-" : r.reason;
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

  const RankBy by = options.rank_by;
  std::size_t with_metric = 0;
  for (const auto& r : kept)
    if (is_ok(r) && metric_of(r, by)) ++with_metric;
  if (with_metric == 0 && by == RankBy::Cost)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a cost",
                            "give the machines a price_per_hour (in the sweep grid or the machine file)");
  if (with_metric == 0 && by == RankBy::TimeToTrain)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a time to train",
                            "add a `budget:` (tokens or samples) to the sweep file");

  // Per (model, machine): the best kind, the best baseline, the best Harmony kind.
  for (const auto& mk : model_keys) {
    for (const auto& hk : machines.order) {
      BestKindRow b;
      b.model = models.label.at(mk);
      b.machine = machines.label.at(hk);
      b.best_value = b.baseline_value = b.harmony_value = std::numeric_limits<double>::quiet_NaN();
      bool any = false;
      for (const auto& r : kept) {
        if (group_key(r, grid_keys, "model") != mk || group_key(r, grid_keys, "machine") != hk) continue;
        any = true;
        const auto v = metric_of(r, by);
        if (!is_ok(r) || !v) continue;
        const auto take = [&](std::string& kind, std::int64_t& gpus, double& value) {
          if (std::isnan(value) || better(*v, value, by)) {
            kind = r.kind;
            gpus = static_cast<std::int64_t>(r.gpus.value_or(0));
            value = *v;
          }
        };
        take(b.best_kind, b.best_gpus, b.best_value);
        if (is_baseline_kind(r.kind))
          take(b.baseline_kind, b.baseline_gpus, b.baseline_value);
        else
          take(b.harmony_kind, b.harmony_gpus, b.harmony_value);
      }
      if (any) d.best_kinds.push_back(std::move(b));
    }
  }

  // The grid columns the ranked table shows: model and machine keys are the section and the machine column;
  // plan.gpus and plan.minibatch are the GPUs and D columns.
  std::vector<std::size_t> shown_grid;
  for (std::size_t a = 0; a < grid_keys.size(); ++a)
    if (!key_in(grid_keys[a], "model") && !key_in(grid_keys[a], "machine") && grid_keys[a] != "plan.gpus" &&
        grid_keys[a] != "plan.minibatch")
      shown_grid.push_back(a);
  std::vector<std::string> kinds_in_order;
  for (const auto& k : meta.value("kinds", nlohmann::json::array()))
    if (k.is_string()) kinds_in_order.push_back(k.get<std::string>());
  for (const auto& r : kept)
    if (!r.kind.empty() && std::find(kinds_in_order.begin(), kinds_in_order.end(), r.kind) == kinds_in_order.end())
      kinds_in_order.push_back(r.kind);

  std::vector<std::vector<const RowView*>> ranked_of;
  for (const auto& mk : model_keys) {
    ModelSection s;
    s.name = models.label.at(mk);
    std::vector<const RowView*> mine;
    for (const auto& r : kept)
      if (group_key(r, grid_keys, "model") == mk) mine.push_back(&r);
    std::vector<const RowView*> ranked;
    for (const auto* r : mine)
      if (is_ok(*r) && metric_of(*r, by)) ranked.push_back(r);
    std::stable_sort(ranked.begin(), ranked.end(), [&](const RowView* a, const RowView* b) {
      return better(*metric_of(*a, by), *metric_of(*b, by), by);
    });
    std::size_t ok = 0;
    for (const auto* r : mine) ok += is_ok(*r) ? 1 : 0;
    s.facts.emplace_back("rows", fmt::format("{} fit of {}", ok, mine.size()));

    s.columns = {"rank", "point", "machine"};
    for (const auto a : shown_grid) s.columns.push_back(grid_keys[a]);
    for (const char* c : {"kind", "GPUs", "D", "samples/s", "iteration", "u f/b", "peak GiB", "swap GiB", "p2p GiB",
                          "coll GiB", "host GiB"})
      s.columns.emplace_back(c);
    if (has_budget) {
      s.columns.emplace_back("time to train");
      s.columns.emplace_back("cost");
    }
    for (std::size_t c = 0; c < s.columns.size(); ++c) {
      const auto& n = s.columns[c];
      if (n == "rank" || n == "point" || n == "GPUs" || n == "D" || n == "samples/s" || n == "iteration" ||
          n.find("GiB") != std::string::npos || n == "time to train" || n == "cost")
        s.numeric_columns.push_back(static_cast<int>(c));
    }
    const std::size_t shown = options.top == 0 ? ranked.size() : std::min(options.top, ranked.size());
    for (std::size_t i = 0; i < shown; ++i) {
      const auto& r = *ranked[i];
      std::vector<std::string> row = {std::to_string(i + 1), std::to_string(r.point)};
      const std::string hk = group_key(r, grid_keys, "machine");
      row.push_back(machines.label.count(hk) ? machines.label.at(hk) : "-");
      for (const auto a : shown_grid) row.push_back(r.grid[a]);
      row.push_back(r.kind);
      row.push_back(num_or_dash(r.gpus, "{:.0f}"));
      row.push_back(num_or_dash(r.minibatch, "{:.0f}"));
      row.push_back(num_or_dash(r.throughput, "{:.3f}"));
      row.push_back(r.iteration_s ? fmt_duration(*r.iteration_s) : "-");
      row.push_back(num_or_dash(r.u_fwd, "{:.0f}") + "/" + num_or_dash(r.u_bwd, "{:.0f}"));
      row.push_back(num_or_dash(r.peak_bytes, "{:.2f}", 1.0 / kGiB) + (r.fits && !*r.fits ? " (over capacity)" : ""));
      row.push_back(num_or_dash(r.swap_bytes, "{:.2f}", 1.0 / kGiB));
      row.push_back(num_or_dash(r.p2p_bytes, "{:.2f}", 1.0 / kGiB));
      row.push_back(num_or_dash(r.collective_bytes, "{:.2f}", 1.0 / kGiB));
      row.push_back(num_or_dash(r.host_bytes, "{:.2f}", 1.0 / kGiB));
      if (has_budget) {
        row.push_back(r.time_to_train_s ? fmt_duration(*r.time_to_train_s) : "-");
        row.push_back(num_or_dash(r.cost, "{:.0f}"));
      }
      s.rows.push_back(std::move(row));
    }
    s.ranked_note =
        fmt::format("{} feasible rows of {} for this model ranked by {} ({}); {} shown.", ranked.size(), mine.size(),
                    metric_column(by), higher_is_better(by) ? "highest first" : "lowest first", shown);

    // Throughput vs GPUs, one chart per machine: per kind the best samples/s at each GPU count.
    for (const auto& hk : machines.order) {
      ThroughputChart chart;
      chart.machine = machines.label.at(hk);
      for (const auto& kind : kinds_in_order) {
        std::map<std::int64_t, double> best;
        for (const auto* r : mine) {
          if (!is_ok(*r) || r->kind != kind || !r->throughput || !r->gpus || group_key(*r, grid_keys, "machine") != hk)
            continue;
          const auto n = static_cast<std::int64_t>(*r->gpus);
          if (!best.count(n) || *r->throughput > best[n]) best[n] = *r->throughput;
        }
        if (!best.empty()) chart.series.push_back({kind, {best.begin(), best.end()}});
      }
      if (!chart.series.empty()) s.throughput.push_back(std::move(chart));
    }

    // Cost vs time to train.
    for (const auto* r : mine) {
      if (!is_ok(*r) || !r->time_to_train_s || !r->cost || *r->time_to_train_s <= 0 || *r->cost <= 0) continue;
      const std::string hk = group_key(*r, grid_keys, "machine");
      s.cost_points.push_back(CostPoint{r->kind, machines.label.count(hk) ? machines.label.at(hk) : "-",
                                        static_cast<std::int64_t>(r->gpus.value_or(0)), r->point, *r->time_to_train_s,
                                        *r->cost, false});
    }
    mark_pareto(s.cost_points);
    if (s.cost_points.empty())
      s.cost_note = !has_budget ? "The sweep has no `budget:`, so no time to train or cost: no cost chart."
                                : "No feasible row of this model has a cost (no price_per_hour): no cost chart.";
    d.models.push_back(std::move(s));
    ranked_of.push_back(std::move(ranked));
  }

  // Re-simulate each model's best point: its config comes from the sweep file, which must be the one that ran.
  bool any_ranked = false;
  for (const auto& r : ranked_of) any_ranked = any_ranked || !r.empty();
  if (!any_ranked) return d;
  std::string tried;
  const auto sweep = find_sweep(dir, meta_path, sweep_file,
                                meta.contains("sweep_file_absolute") && meta["sweep_file_absolute"].is_string()
                                    ? meta["sweep_file_absolute"].get<std::string>()
                                    : std::string(),
                                fingerprint, options.sweep_file, &tried);
  if (!sweep) {
    // The page names the recorded path only (no paths of this machine); stderr says where it looked.
    const std::string why = fmt::format(
        "the sweep file '{}' is not found from here, so the best plans are not re-simulated (no timeline, memory, "
        "ledger, bottleneck or trace)",
        sweep_file);
    d.warnings.push_back(why + "; tried " + tried + "; give the sweep file with --sweep FILE");
    for (auto& s : d.models) s.best_note = why + ". Rerun with --sweep FILE.";
  }
  for (std::size_t m = 0; m < d.models.size(); ++m) {
    auto& s = d.models[m];
    if (ranked_of[m].empty()) {
      s.best_note = "No row of this model fits: there is no plan to show.";
      continue;
    }
    if (!sweep) continue;
    const auto index = ranked_of[m].front()->point;
    if (index >= sweep->num_points())
      throw core::ConfigError(file_loc(rows_path),
                              fmt::format("point {} is beyond the sweep's {} points", index, sweep->num_points()),
                              "the results are stale (another harmony-sim wrote them): rerun the sweep");
    const SweepPoint p = sweep_point(*sweep, index);
    const auto cfg = core::load_config_text(sweep->base_text, sweep->base_path, p.overrides);
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
    s.has_best = true;
    s.best = make_best(kr, model, cfg, where);
    s.facts.emplace_back("best plan on",
                         cfg.machine.name + " (" + cfg.machine.gpu_name + "), cost model " + cfg.cost_model);
  }
  return d;
}

ReportData report_from_config(const std::string& config_path, const ReportOptions& options) {
  if (!options.where.empty())
    throw core::ConfigError(core::SourceLoc{"--where", 0, 0}, "--where filters the rows of a sweep",
                            "give a sweep output folder, or use --set on a config");
  if (!options.model.empty())
    throw core::ConfigError(core::SourceLoc{"--model", 0, 0}, "--model picks a model of a sweep",
                            "give a sweep output folder; a config has one model");
  const auto cfg = core::load_config(config_path, options.overrides);
  const auto model = core::load_model(cfg.model, cfg.machine);
  if (options.rank_by == RankBy::TimeToTrain || options.rank_by == RankBy::Cost)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "a config has no training budget",
                            "rank by throughput or iteration_time, or report on a sweep with a budget");
  const auto res = compare_plan_kinds(model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model, cfg.search,
                                      cfg.options);
  ReportData d;
  d.rank_by = options.rank_by;
  d.title = "harmony-sim report: " + model.name + " on " + cfg.machine.name;
  d.facts = {{"config", cfg.file},
             {"model", model.name},
             {"machine", cfg.machine.name + " (" + cfg.machine.gpu_name + ")"},
             {"GPUs, minibatch", fmt::format("{}, {}", cfg.plan.gpus, cfg.plan.minibatch)},
             {"cost model", cfg.cost_model}};
  std::vector<const KindResult*> order;
  for (const auto& k : res.kinds) order.push_back(&k);
  std::stable_sort(order.begin(), order.end(), [&](const KindResult* a, const KindResult* b) {
    if (a->feasible != b->feasible) return a->feasible;
    if (!a->feasible) return false;
    return a->best.iteration_time_s < b->best.iteration_time_s;  // == highest throughput first (same D)
  });
  ModelSection s;
  s.name = model.name;
  s.columns = {"rank",     "plan kind", "candidates", "samples/s", "iteration", "speedup",      "u f/b",
               "swap GiB", "p2p GiB",   "coll GiB",   "peak GiB",  "host GiB",  "plan / reason"};
  s.numeric_columns = {0, 2, 3, 4, 5, 7, 8, 9, 10, 11};
  std::size_t feasible = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& k = *order[i];
    const std::string name = core::plan_kind_name(k.kind);
    d.status_rows.push_back({name, k.feasible ? "1" : "0", !k.feasible && k.applicable ? "1" : "0",
                             k.applicable ? "0" : "1", k.feasible ? "-" : k.reason});
    if (!k.feasible) {
      s.rows.push_back({"-", name, std::to_string(k.candidates), "-", "-", "-", "-", "-", "-", "-", "-", "-",
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
    s.rows.push_back({std::to_string(feasible), name, std::to_string(k.candidates),
                      fmt::format("{:.3f}", r.throughput_samples_per_s), fmt_duration(r.iteration_time_s),
                      std::isfinite(res.best_baseline_time_s) ? fmt::format("{:.2f}x", k.speedup_over_best_baseline)
                                                              : std::string("-"),
                      fmt::format("{}/{}", r.plan.u_fwd, r.plan.u_bwd), fmt_gib(r.swap_in_bytes + r.swap_out_bytes),
                      fmt_gib(r.p2p_bytes), fmt_gib(r.collective_bytes),
                      fmt_gib(r.peak_memory_bytes) + (r.fits ? "" : " (over capacity)"),
                      r.native ? fmt_gib(r.host_memory.total_bytes) : std::string("-"), plan});
  }
  s.ranked_note = fmt::format(
      "{} of {} plan kinds fit; ranked by iteration time (lowest first). Speedup: the best "
      "baseline's time / this kind's.",
      feasible, order.size());
  if (feasible == 0) {
    s.best_note = "No plan kind fits: there is no plan to show.";
  } else {
    s.has_best = true;
    s.best = make_best(*order.front(), model, cfg, cfg.file);
  }
  d.models.push_back(std::move(s));
  return d;
}

namespace {

std::string slug(const std::string& name) {
  std::string out;
  for (char c : name)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '-';
  return out.empty() ? std::string("model") : out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> report_traces(ReportData& d, const std::string& html_path) {
  const fs::path page(html_path);
  std::string stem = page.filename().string();
  if (const auto dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> used;
  for (auto& s : d.models) {
    if (!s.has_best) continue;
    std::string name = d.from_sweep ? stem + "." + slug(s.name) : stem;
    for (int n = 2; std::find(used.begin(), used.end(), name) != used.end(); ++n)
      name = fmt::format("{}.{}-{}", stem, slug(s.name), n);
    used.push_back(name);
    s.trace_file = name + ".trace.json";
    const auto& b = s.best;
    auto doc = core::chrome_trace_json(b.program, b.native.timeline.begin_ps, b.native.timeline.end_ps,
                                       core::TraceMeta{"harmony-sim (" + b.report.cost_model + ")", b.title});
    append_native_counters(doc["traceEvents"], b.native);
    out.emplace_back((page.parent_path() / s.trace_file).string(), doc.dump(1) + "\n");
  }
  return out;
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

std::string timeline_svg(const BestPlan& b, const std::string& id) {
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
      R"(<svg id="{}" class="timeline" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" shape-rendering="crispEdges" role="img" aria-label="timeline of the best plan">)",
      id, kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
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

// "GPU0-3, GPU6" for devices {0,1,2,3,6}.
std::string device_list(const std::vector<int>& devs) {
  std::string out;
  for (std::size_t i = 0; i < devs.size();) {
    std::size_t j = i;
    while (j + 1 < devs.size() && devs[j + 1] == devs[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") +
           (j == i ? fmt::format("GPU{}", devs[i]) : fmt::format("GPU{}-{}", devs[i], devs[j]));
    i = j + 1;
  }
  return out;
}

std::string memory_svg(const BestPlan& b, const std::string& id) {
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
      R"(<svg id="{}" class="memory" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" role="img" aria-label="device memory over time">)",
      id, kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
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
  // Devices whose lines are identical (data parallelism: every GPU alike) share one line, labelled with all.
  std::vector<std::string> curves;       // distinct polylines, in order of their first device
  std::vector<std::vector<int>> owners;  // the devices drawing each
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
    const auto it = std::find(curves.begin(), curves.end(), pts);
    if (it == curves.end()) {
      curves.push_back(std::move(pts));
      owners.push_back({dev});
    } else {
      owners[static_cast<std::size_t>(it - curves.begin())].push_back(dev);
    }
  }
  const auto peak_of = [&](const std::vector<int>& devs) {
    double peak = 0;
    for (int dev : devs)
      if (static_cast<std::size_t>(dev) < b.native.peak_bytes.size())
        peak = std::max(peak, static_cast<double>(b.native.peak_bytes[static_cast<std::size_t>(dev)]));
    return peak;
  };
  for (std::size_t c = 0; c < curves.size(); ++c)
    out += fmt::format(
        R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5" class="mem" data-gpus="{}"><title>{} (peak {:.2f} GiB)</title></polyline>)",
        curves[c], kGpuColors[c % 8], device_list(owners[c]), device_list(owners[c]), peak_of(owners[c]) / kGiB);
  out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" class="tick">)", kLabelWidth, height - 6);
  for (std::size_t c = 0; c < curves.size(); ++c)
    out += fmt::format(R"(<tspan fill="{}">&#9632; {} (peak {:.2f} GiB)</tspan>  )", kGpuColors[c % 8],
                       device_list(owners[c]), peak_of(owners[c]) / kGiB);
  if (curves.size() < static_cast<std::size_t>(devices)) out += "<tspan>(identical lines drawn once)</tspan>";
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

// Plan kind colours of the sweep charts: disjoint from the op colours (the screenshot test counts those).
const char* kind_color(const std::string& kind) {
  static const std::pair<const char*, const char*> kColors[] = {{"harmony-pp", "#1f77b4"},    {"harmony-dp", "#17becf"},
                                                                {"dp-swap", "#d62728"},       {"pp-swap", "#9467bd"},
                                                                {"zero-infinity", "#8c564b"}, {"l2l", "#7f7f7f"}};
  for (const auto& [k, c] : kColors)
    if (kind == k) return c;
  return "#bcbd22";
}

void kind_legend(std::string& out, const std::vector<std::string>& kinds) {
  out += R"(<p class="legend">)";
  for (const auto& k : kinds)
    out += fmt::format(R"(<span><i style="background:{}"></i>{}</span> )", kind_color(k), html_escape(k));
  out += "</p>\n";
}

constexpr double kChartW = 560, kChartH = 300, kChartL = 64, kChartR = 16, kChartT = 16, kChartB = 44;

std::string chart_open(const std::string& id, const char* cls, const std::string& label) {
  return fmt::format(
      R"(<svg id="{}" class="chart {}" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" role="img" aria-label="{}">)",
      id, cls, kChartW, kChartH, kChartW, kChartH, html_escape(label));
}

// Throughput vs GPUs of one machine: GPU counts evenly spaced (they are usually powers of two), a linear axis of
// samples/s from 0, one line per plan kind.
std::string throughput_svg(const ThroughputChart& c, const std::string& id) {
  std::vector<std::int64_t> xs;
  double ymax = 0;
  for (const auto& s : c.series)
    for (const auto& [n, v] : s.points) {
      if (std::find(xs.begin(), xs.end(), n) == xs.end()) xs.push_back(n);
      ymax = std::max(ymax, v);
    }
  std::sort(xs.begin(), xs.end());
  const double pw = kChartW - kChartL - kChartR, ph = kChartH - kChartT - kChartB;
  const double step = nice_step(ymax > 0 ? ymax : 1, 5);
  const double top = std::ceil((ymax > 0 ? ymax : 1) * 1.05 / step) * step;
  const auto x_of = [&](std::int64_t n) {
    const auto i = static_cast<double>(std::find(xs.begin(), xs.end(), n) - xs.begin());
    return kChartL + pw * (i + 0.5) / static_cast<double>(xs.size());
  };
  const auto y_of = [&](double v) { return kChartT + ph * (1.0 - v / top); };
  std::string out = chart_open(id, "throughput", "throughput vs GPUs on " + c.machine);
  for (int i = 0;; ++i) {
    const double v = i * step;
    if (v > top * 1.0001) break;
    out += fmt::format(R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="grid"/>)", kChartL, y_of(v),
                       kChartW - kChartR, y_of(v));
    out += fmt::format(R"(<text x="{:.0f}" y="{:.1f}" class="tick" text-anchor="end">{:g}</text>)", kChartL - 6,
                       y_of(v) + 4, v);
  }
  for (const auto n : xs)
    out += fmt::format(R"(<text x="{:.1f}" y="{:.0f}" class="tick" text-anchor="middle">{}</text>)", x_of(n),
                       kChartH - kChartB + 16, n);
  out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" class="tick" text-anchor="middle">GPUs</text>)", kChartL + pw / 2,
                     kChartH - 6);
  out += fmt::format(
      R"svg(<text x="14" y="{:.0f}" class="tick" text-anchor="middle" transform="rotate(-90 14 {:.0f})">samples/s</text>)svg",
      kChartT + ph / 2, kChartT + ph / 2);
  for (const auto& s : c.series) {
    std::string pts;
    for (const auto& [n, v] : s.points) pts += fmt::format("{}{:.1f},{:.1f}", pts.empty() ? "" : " ", x_of(n), y_of(v));
    out += fmt::format(
        R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2" class="series" data-series="{}"><title>{}</title></polyline>)",
        pts, kind_color(s.kind), html_escape(s.kind), html_escape(s.kind));
    for (const auto& [n, v] : s.points)
      out += fmt::format(
          R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}" class="pt" data-series="{}"><title>{}, {} GPUs: {:.3f} samples/s</title></circle>)",
          x_of(n), y_of(v), kind_color(s.kind), html_escape(s.kind), html_escape(s.kind), n, v);
  }
  out += "</svg>";
  return out;
}

// Ticks of a log axis over [lo, hi]: 1-2-5 steps, or only powers of ten when those are too many.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> all, decades;
  for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, e);
      if (v < lo * 0.9999 || v > hi * 1.0001) continue;
      all.push_back(v);
      if (m == 1.0) decades.push_back(v);
    }
  return all.size() <= 8 || decades.size() < 2 ? all : decades;
}

// Cost vs time to train, both on log axes: one dot per feasible row, the Pareto front as a staircase through the
// rows no other row beats on both.
std::string cost_svg(const std::vector<CostPoint>& pts, const std::string& id) {
  double tlo = pts.front().time_to_train_s, thi = tlo, clo = pts.front().cost, chi = clo;
  for (const auto& p : pts) {
    tlo = std::min(tlo, p.time_to_train_s);
    thi = std::max(thi, p.time_to_train_s);
    clo = std::min(clo, p.cost);
    chi = std::max(chi, p.cost);
  }
  tlo /= 1.25, thi *= 1.25, clo /= 1.25, chi *= 1.25;
  const double pw = kChartW - kChartL - kChartR, ph = kChartH - kChartT - kChartB;
  const auto x_of = [&](double t) { return kChartL + pw * std::log(t / tlo) / std::log(thi / tlo); };
  const auto y_of = [&](double c) { return kChartT + ph * (1.0 - std::log(c / clo) / std::log(chi / clo)); };
  std::string out = chart_open(id, "cost", "cost vs time to train");
  for (const double t : log_ticks(tlo, thi)) {
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.0f}" x2="{0:.1f}" y2="{2:.0f}" class="grid"/>)", x_of(t), kChartT,
                       kChartT + ph);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.0f}" class="tick" text-anchor="middle">{}</text>)", x_of(t),
                       kChartH - kChartB + 16, fmt_duration(t));
  }
  for (const double c : log_ticks(clo, chi)) {
    out += fmt::format(R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="grid"/>)", kChartL, y_of(c),
                       kChartW - kChartR, y_of(c));
    out += fmt::format(R"(<text x="{:.0f}" y="{:.1f}" class="tick" text-anchor="end">{:g}</text>)", kChartL - 6,
                       y_of(c) + 4, c);
  }
  out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" class="tick" text-anchor="middle">time to train (log)</text>)",
                     kChartL + pw / 2, kChartH - 6);
  out += fmt::format(
      R"svg(<text x="14" y="{:.0f}" class="tick" text-anchor="middle" transform="rotate(-90 14 {:.0f})">cost (log)</text>)svg",
      kChartT + ph / 2, kChartT + ph / 2);
  std::vector<const CostPoint*> front;
  for (const auto& p : pts)
    if (p.pareto) front.push_back(&p);
  std::sort(front.begin(), front.end(),
            [](const CostPoint* a, const CostPoint* b) { return a->time_to_train_s < b->time_to_train_s; });
  std::string stair;
  for (std::size_t i = 0; i < front.size(); ++i) {
    const double x = x_of(front[i]->time_to_train_s), y = y_of(front[i]->cost);
    if (i > 0) stair += fmt::format(" {:.1f},{:.1f}", x, y_of(front[i - 1]->cost));
    stair += fmt::format("{}{:.1f},{:.1f}", stair.empty() ? "" : " ", x, y);
  }
  out += fmt::format(R"(<polyline points="{}" class="pareto"><title>Pareto front ({} plans)</title></polyline>)", stair,
                     front.size());
  for (const auto& p : pts)
    out += fmt::format(
        R"(<circle cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}" class="pt{}" data-series="{}"><title>{} on {}, {} GPUs (point {}): {}, cost {:.2f}{}</title></circle>)",
        x_of(p.time_to_train_s), y_of(p.cost), p.pareto ? 5 : 3.5, kind_color(p.kind), p.pareto ? " front" : "",
        html_escape(p.kind), html_escape(p.kind), html_escape(p.machine), p.gpus, p.point,
        fmt_duration(p.time_to_train_s), p.cost, p.pareto ? " (Pareto front)" : "");
  out += "</svg>";
  return out;
}

// The heatmap's colour for a speedup s >= 1: white at 1x to dark green at 4x and beyond (log scale).
std::string heat_color(double s) {
  const double t = std::clamp(std::log(std::max(s, 1.0)) / std::log(4.0), 0.0, 1.0);
  const auto mix = [&](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(0xff, 0x1a), mix(0xff, 0x7a), mix(0xff, 0x3c));
}

std::string overview_html(const ReportData& d) {
  const RankBy by = d.rank_by;
  std::string out;
  out += fmt::format(
      "<p class=\"note\">Per model and machine, over every GPU count and grid value, the best feasible row by {} "
      "and its speedup over the best baseline (dp-swap, pp-swap, zero-infinity, l2l): {}. 1.00x: a baseline is "
      "the best kind.</p>\n",
      metric_column(by),
      higher_is_better(by) ? "its samples/s / the baseline's" : "the baseline's value / its value (lower is better)");
  std::vector<std::vector<std::string>> rows;
  const auto speed = [&](double a, double b) {
    if (std::isnan(a)) return std::string("-");
    if (std::isnan(b)) return std::string("no baseline fits");
    return fmt::format("{:.2f}x", ratio(a, b, by));
  };
  const auto kind_n = [](const std::string& kind, std::int64_t n) {
    return kind.empty() ? std::string("-") : fmt::format("{} (N={})", kind, n);
  };
  for (const auto& b : d.best_kinds)
    rows.push_back({b.model, b.machine, b.best_kind.empty() ? "nothing fits" : kind_n(b.best_kind, b.best_gpus),
                    fmt_metric(b.best_value, by), speed(b.best_value, b.baseline_value),
                    kind_n(b.baseline_kind, b.baseline_gpus), fmt_metric(b.baseline_value, by),
                    kind_n(b.harmony_kind, b.harmony_gpus), fmt_metric(b.harmony_value, by),
                    speed(b.harmony_value, b.baseline_value)});
  const std::string m = metric_title(by);
  table(out,
        {"model", "machine", "best kind", m, "speedup over best baseline", "best baseline", m, "best Harmony kind", m,
         "Harmony over best baseline"},
        rows, {3, 4, 6, 8, 9}, "best-kinds-table");

  // Heatmap: models down, machines across.
  std::vector<std::string> model_order, machine_order;
  for (const auto& b : d.best_kinds) {
    if (std::find(model_order.begin(), model_order.end(), b.model) == model_order.end()) model_order.push_back(b.model);
    if (std::find(machine_order.begin(), machine_order.end(), b.machine) == machine_order.end())
      machine_order.push_back(b.machine);
  }
  out += "<h3>Heatmap: best kind and its speedup over the best baseline</h3>\n<table id=\"heatmap\" class=\"heat\">";
  out += "<thead><tr><th>model \\ machine</th>";
  for (const auto& h : machine_order) out += "<th>" + html_escape(h) + "</th>";
  out += "</tr></thead><tbody>\n";
  for (const auto& mo : model_order) {
    out += "<tr><th>" + html_escape(mo) + "</th>";
    for (const auto& h : machine_order) {
      const auto it = std::find_if(d.best_kinds.begin(), d.best_kinds.end(),
                                   [&](const BestKindRow& b) { return b.model == mo && b.machine == h; });
      if (it == d.best_kinds.end()) {
        out += "<td class=\"cell\">no rows</td>";
        continue;
      }
      if (it->best_kind.empty()) {
        out += R"(<td class="cell" style="background:#e8e8e8">nothing fits</td>)";
        continue;
      }
      const double s = std::isnan(it->baseline_value) ? 4.0 : ratio(it->best_value, it->baseline_value, by);
      const double t = std::log(std::max(s, 1.0)) / std::log(4.0);
      out += fmt::format(R"(<td class="cell" style="background:{};color:{}" title="{} {}">{}<br>{}</td>)",
                         heat_color(s), t > 0.55 ? "#fff" : "#111", html_escape(it->best_kind),
                         html_escape(fmt_metric(it->best_value, by)), html_escape(it->best_kind),
                         html_escape(speed(it->best_value, it->baseline_value)));
    }
    out += "</tr>\n";
  }
  out += "</tbody></table>\n<p class=\"legend\">";
  for (double s : {1.0, 1.25, 1.5, 2.0, 3.0, 4.0})
    out += fmt::format(R"(<span><i style="background:{};border:1px solid #ccc"></i>{}{:g}x</span> )", heat_color(s),
                       s >= 4.0 ? "&ge; " : "", s);
  out += "</p>\n";
  return out;
}

std::string best_plan_html(const ModelSection& s, std::size_t i) {
  const auto& b = s.best;
  const auto& r = b.report;
  std::string out = fmt::format("<h3 id=\"best-{}\">Best plan: {}</h3>\n<dl class=\"facts\">", i, html_escape(b.title));
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
  if (!s.trace_file.empty())
    out += fmt::format(
        "<dt>trace</dt><dd><a id=\"trace-link-{}\" class=\"trace\" href=\"{}\">{}</a> (Chrome trace JSON beside "
        "this page: open it in ui.perfetto.dev or chrome://tracing)</dd>",
        i, html_escape(s.trace_file), html_escape(s.trace_file));
  if (!r.feasible)
    out += fmt::format("<dt>note</dt><dd>re-simulated, it does not fit: {}</dd>", html_escape(r.infeasible_reason));
  out += "</dl>\n";
  out += fmt::format(
      "<h4 id=\"timeline-{}\">Timeline</h4>\n<p class=\"note\">One lane per GPU stream; hover an op for its name "
      "and times. Outlined ops lie on the critical path.</p>\n<div class=\"scroll\">",
      i);
  out += timeline_svg(b, fmt::format("timeline-svg-{}", i));
  out += fmt::format("</div>\n<h4 id=\"memory-{}\">Device memory over time</h4>\n<div class=\"scroll\">", i);
  out += memory_svg(b, fmt::format("memory-svg-{}", i));
  out += fmt::format("</div>\n<h4 id=\"ledger-{}\">Swap ledger</h4>\n", i);
  out += ledger_html(b);
  out += fmt::format("<h4 id=\"bottleneck-{}\">Bottleneck</h4>\n", i);
  out += bottleneck_html(b);
  return out;
}

std::string model_html(const ReportData& d, const ModelSection& s, std::size_t i) {
  std::string out = fmt::format("<section id=\"model-{}\" class=\"model\"><h2 class=\"model-title\">Model: {}</h2>\n",
                                i, html_escape(s.name));
  if (!s.facts.empty()) {
    out += "<dl class=\"facts\">";
    for (const auto& [k, v] : s.facts) out += fmt::format("<dt>{}</dt><dd>{}</dd>", html_escape(k), html_escape(v));
    out += "</dl>\n";
  }
  if (d.from_sweep) {
    out += fmt::format("<h3 id=\"throughput-{}\">Throughput vs GPUs</h3>\n", i);
    if (s.throughput.empty()) {
      out += "<p class=\"note\">No row of this model fits: no chart.</p>\n";
    } else {
      out += "<div class=\"charts\">";
      std::vector<std::string> kinds;
      for (std::size_t c = 0; c < s.throughput.size(); ++c) {
        const auto& chart = s.throughput[c];
        out += "<figure>" + throughput_svg(chart, fmt::format("throughput-svg-{}-{}", i, c)) + "<figcaption>" +
               html_escape(chart.machine) + "</figcaption></figure>";
        for (const auto& ser : chart.series)
          if (std::find(kinds.begin(), kinds.end(), ser.kind) == kinds.end()) kinds.push_back(ser.kind);
      }
      out += "</div>\n";
      kind_legend(out, kinds);
    }
    out += fmt::format("<h3 id=\"cost-{}\">Cost vs time to train</h3>\n", i);
    if (s.cost_points.empty()) {
      out += "<p class=\"note\">" + html_escape(s.cost_note) + "</p>\n";
    } else {
      out += "<div class=\"charts\"><figure>" + cost_svg(s.cost_points, fmt::format("cost-svg-{}", i)) +
             "<figcaption>every feasible row; large outlined dots and the line: the Pareto front</figcaption>"
             "</figure></div>\n";
      std::vector<const CostPoint*> front;
      for (const auto& p : s.cost_points)
        if (p.pareto) front.push_back(&p);
      std::sort(front.begin(), front.end(),
                [](const CostPoint* a, const CostPoint* b) { return a->time_to_train_s < b->time_to_train_s; });
      std::vector<std::vector<std::string>> rows;
      for (const auto* p : front)
        rows.push_back({fmt_duration(p->time_to_train_s), fmt::format("{:.2f}", p->cost), p->kind, p->machine,
                        std::to_string(p->gpus), std::to_string(p->point)});
      out += "<p class=\"note\">The Pareto front: no other plan is both faster to train and cheaper.</p>\n";
      table(out, {"time to train", "cost", "kind", "machine", "GPUs", "point"}, rows, {0, 1, 4, 5},
            fmt::format("pareto-table-{}", i).c_str());
    }
  }
  out += fmt::format("<h3 id=\"ranked-{}\">Ranked plans of {}</h3>\n<div class=\"scroll\">", i, html_escape(s.name));
  table(out, s.columns, s.rows, s.numeric_columns, fmt::format("ranked-table-{}", i).c_str());
  out += fmt::format("</div><p class=\"note\">{}</p>\n", html_escape(s.ranked_note));
  if (s.has_best)
    out += best_plan_html(s, i);
  else
    out += fmt::format("<h3 id=\"best-{}\">Best plan</h3><p>{}</p>\n", i, html_escape(s.best_note));
  out += "</section>\n";
  return out;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;max-width:1320px}
h1{font-size:22px;margin:0 0 8px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd} h3{font-size:15px;margin:16px 0 6px} h4{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px} th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums} table[id^="ranked-table"] tbody tr:nth-child(1) td{font-weight:600}
table.heat td.cell{text-align:center;min-width:120px;border:1px solid #d8d8d8}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:8px 0} dl.facts dt{color:#666} dl.facts dd{margin:0}
nav a{margin-right:14px} .note{color:#555;font-size:13px}
.charts{display:flex;flex-wrap:wrap;gap:8px} figure{margin:0} figcaption{font-size:12px;color:#555;text-align:center}
svg text{font:11px system-ui,sans-serif;fill:#333} svg .label{font-size:11px} svg .tick{fill:#555}
svg .grid{stroke:#e6e6e6;stroke-width:1} svg .lane{fill:#f7f7f7} svg .capacity{stroke:#c00;stroke-dasharray:6 4;stroke-width:1.2}
svg rect.crit{stroke:#000;stroke-width:1} svg .pareto{fill:none;stroke:#222;stroke-width:1.5;stroke-dasharray:5 3} svg circle.front{stroke:#000;stroke-width:1.5}
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
  out += "</dl>\n<nav>";
  if (d.from_sweep) out += "<a href=\"#overview\">best kind per model and machine</a>";
  for (std::size_t i = 0; i < d.models.size(); ++i)
    out += fmt::format("<a href=\"#model-{}\">{}</a>", i, html_escape(d.models[i].name));
  out += "<a href=\"#status\">feasibility</a></nav>\n";
  if (d.from_sweep) {
    out += "<section id=\"overview\"><h2>Best plan kind per model and machine</h2>\n";
    out += overview_html(d);
    out += "</section>\n";
  }
  for (std::size_t i = 0; i < d.models.size(); ++i) out += model_html(d, d.models[i], i);
  out += "<section id=\"status\"><h2>Feasibility by plan kind</h2>\n";
  table(out, {"plan kind", "ok", "does not fit", "invalid", "most frequent reason"}, d.status_rows, {1, 2, 3},
        "status-table");
  out +=
      "</section>\n<footer class=\"note\">Written by harmony-sim report. Self-contained: no scripts, no network "
      "(the trace is a separate file beside the page). Units: GiB = 2^30 bytes.</footer>\n</body>\n</html>\n";
  return out;
}

}  // namespace harmony::sim
