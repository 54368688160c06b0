// `harmony-sim report`, its data: gathers a sweep's rows (or one config's plan kinds), groups them by model and
// machine, ranks them, picks the best kind per (model, machine) and re-simulates each model's best plan with the
// native engine recording samples, and writes the best plans' Chrome traces. The page is sim/app/report_html.cpp.
#include "sim/app/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/input_file.hpp"
#include "core/output/trace.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/program/lower.hpp"
#include "sim/app/file_loc.hpp"
#include "sim/app/report_internal.hpp"
#include "sim/app/sweep.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::sim {

namespace fs = std::filesystem;
using namespace report_detail;  // NOLINT(google-build-using-namespace): the report's own formatting

NativeOptions native_options_for(core::CostModelKind cost_model) {
  NativeOptions o;
  if (cost_model == core::CostModelKind::Reference) {
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

// The best plan of `kr` lowered again and run once through the Engine seam on the native engine with the cost
// model's settings (native_options_for) and counters on.
BestPlan make_best(const KindResult& kr, const core::Model& model, const core::RunConfig& cfg, std::string where) {
  BestPlan b;
  b.where = std::move(where);
  NativeOptions o = native_options_for(cfg.cost_model);
  o.record_counters = true;
  const NativeEngine engine(model, cfg.machine, o);
  Evaluation e;
  if (!kr.plan) throw core::ScheduleError(fmt::format("best {} plan without its plan", kr.kind.name()));
  core::LowerOptions lower = core::lower_options(cfg.options);
  lower.offload_nvme = kr.offload == "nvme";  // the tier the search chose (compare.hpp)
  // lowered as the search's engine (cfg.cost_model's) lowers it, then run once on `engine`
  e = evaluate_program(engine,
                       lower_plan_for(*make_engine(cfg.cost_model, model, cfg.machine), model, *kr.plan, lower));
  b.program = std::move(e.program);
  b.native = std::move(e.native);
  b.report = std::move(e.report);
  b.report.method_fwd = kr.best.method_fwd;
  b.report.method_bwd = kr.best.method_bwd;
  b.report.cost_model = core::cost_model_name(cfg.cost_model);
  o.record_counters = false;  // the what-if re-simulations need no samples
  b.bottleneck = analyze_bottleneck(b.program, model, cfg.machine, *b.native, o);
  b.title = core::report_title(kr.best);
  b.capacity_bytes_per_gpu = static_cast<double>(cfg.machine.search_capacity_bytes());
  return b;
}

// ---------------------------------------------------------------------------------------------------------
// Sweep input

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

// A row's plan_kind names a registered kind of `role`.
bool kind_in_role(const std::string& kind, core::KindRole role) {
  const auto k = core::find_plan_kind(kind);
  return k && (*k)->role == role;
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

// The one recovery from a broken row, shared with `sweep` (docs/sweeps.md, "Resume"): the sweep again on the same
// folder with --repair, which keeps the good rows and computes only the broken ones again.
std::string repair_hint(const nlohmann::json& meta, const std::string& dir) {
  std::string file = "SWEEP.yaml";
  for (const char* key : {"sweep_file_absolute", "sweep_file"})
    if (meta.contains(key) && meta[key].is_string()) {
      file = meta[key].get<std::string>();
      break;
    }
  std::string shard;
  if (meta.contains("shard") && meta["shard"].is_object() && meta["shard"].value("count", 1) > 1)
    shard = fmt::format(" --shard {}/{}", meta["shard"].value("index", 0), meta["shard"].value("count", 1));
  return fmt::format(
      "repair the folder with `harmony-sim sweep {} --out {}{} --repair`: it keeps the good rows and computes only the "
      "broken ones again",
      file, dir, shard);
}

}  // namespace

namespace {

// A sweep output folder as the report reads it: sweep.json's metadata and every finished row.
struct SweepInput {
  explicit SweepInput(fs::path folder) : dir(std::move(folder)) {}
  fs::path dir;
  fs::path meta_path;
  fs::path rows_path;
  nlohmann::json meta;
  std::vector<std::string> columns;
  std::size_t total_points = 0;
  std::string fingerprint;
  std::string sweep_file;
  std::vector<nlohmann::json> rows;
  std::vector<std::string> grid_keys;
};

// sweep.json, checked: written by harmony-sim, in this harmony-sim's sweep format and output schema.
void read_meta(SweepInput& in) {
  in.meta_path = in.dir / "sweep.json";
  if (!fs::exists(in.meta_path))
    throw core::ConfigError(file_loc(in.dir), "not a sweep output folder (no sweep.json)",
                            "give the --out folder of `harmony-sim sweep` or `merge`, or a config YAML");
  try {
    in.meta = nlohmann::json::parse(read_text(in.meta_path));
    (void)in.meta.at("columns").get<std::vector<std::string>>();
    (void)in.meta.at("fingerprint").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw core::ConfigError(file_loc(in.meta_path), std::string("not a sweep.json written by harmony-sim: ") + e.what(),
                            "rerun the sweep into a fresh --out folder");
  }
  const nlohmann::json& meta = in.meta;
  // Rows are read by the names of this output schema (docs/output-schema.md).
  if (meta.value("version", 0) != kSweepFormatVersion || meta.value("schema_version", 0) != core::kOutputSchemaVersion)
    throw core::ConfigError(file_loc(in.meta_path),
                            fmt::format("the sweep's results are in sweep format {} (output schema {}); this "
                                        "harmony-sim reads format {} (output schema {}, docs/output-schema.md)",
                                        meta.value("version", 0), meta.value("schema_version", 0), kSweepFormatVersion,
                                        core::kOutputSchemaVersion),
                            "rerun the sweep into a new --out folder with this harmony-sim");
  in.columns = meta.at("columns").get<std::vector<std::string>>();
  in.total_points = meta.value("points", std::size_t{0});
  in.fingerprint = meta.at("fingerprint").get<std::string>();
  in.sweep_file = meta.value("sweep_file", std::string());
  for (const auto& a : meta.value("grid", nlohmann::json::array()))
    in.grid_keys.push_back(a.at("key").get<std::string>());
}

// --where filters, checked against the columns before reading the rows.
std::vector<std::pair<std::string, std::string>> parse_where(const SweepInput& in, const ReportOptions& options) {
  std::vector<std::pair<std::string, std::string>> filters;
  for (const auto& w : options.where) {
    const auto eq = w.find('=');
    const std::string key = eq == std::string::npos ? w : w.substr(0, eq);
    if (eq == std::string::npos || std::find(in.columns.begin(), in.columns.end(), key) == in.columns.end()) {
      std::string list;
      for (const auto& c : in.columns) list += (list.empty() ? "" : ", ") + c;
      throw core::ConfigError(core::SourceLoc{"--where", 0, 0},
                              eq == std::string::npos ? "'" + w + "' is not KEY=VALUE"
                                                      : "'" + key + "' is not a column of " + in.meta_path.string(),
                              "use one of: " + list);
    }
    filters.emplace_back(key, w.substr(eq + 1));
  }
  return filters;
}

// results.jsonl's finished rows (a last line without its newline was being written when the sweep stopped).
void read_rows(SweepInput& in, const std::string& dir_text) {
  in.rows_path = in.dir / "results.jsonl";
  const std::string text = read_text(in.rows_path);
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    ++line_no;
    if (nl == std::string::npos) break;  // a row being written when the sweep stopped: not a result yet
    try {
      in.rows.push_back(nlohmann::json::parse(text.substr(pos, nl - pos)));
      if (!in.rows.back().is_object()) throw nlohmann::json::type_error::create(302, "a row is a JSON object", nullptr);
    } catch (const nlohmann::json::exception& e) {
      throw core::ConfigError(file_loc(in.rows_path, static_cast<int>(line_no)),
                              std::string("not a JSON row: ") + e.what(), repair_hint(in.meta, dir_text));
    }
    pos = nl + 1;
  }
  if (in.rows.empty())
    throw core::ConfigError(file_loc(in.rows_path), "the sweep has no results yet",
                            "run `harmony-sim sweep SWEEP.yaml --out " + in.dir.string() + "` first");
}

// The model groups the report has a section for: every one, or --model's.
std::vector<std::string> chosen_models(const Groups& models, const SweepInput& in, const ReportOptions& options) {
  if (options.model.empty()) return models.order;
  std::vector<std::string> chosen;
  for (const auto& k : models.order)
    if (models.label.at(k) == options.model || k.substr(0, k.find('\x1f')) == options.model) chosen.push_back(k);
  if (chosen.empty()) {
    std::string list;
    for (const auto& k : models.order) list += (list.empty() ? "" : ", ") + models.label.at(k);
    throw core::ConfigError(core::SourceLoc{"--model", 0, 0},
                            "no row of " + in.rows_path.string() + " is of model '" + options.model + "'",
                            list.empty() ? "no row names a model: check --where" : "use one of: " + list);
  }
  return chosen;
}

// The page's facts about the sweep: its file, fingerprint, rows, filter, budget, models, machines and ranking.
void add_sweep_facts(ReportData& d, const SweepInput& in, const ReportOptions& options,
                     const std::vector<std::pair<std::string, std::string>>& filters, std::size_t kept,
                     const Groups& models, const Groups& machines) {
  d.facts.emplace_back("sweep", in.sweep_file);
  d.facts.emplace_back("fingerprint", in.fingerprint);
  d.facts.emplace_back("rows", fmt::format("{} of {} points{}", in.rows.size(), in.total_points,
                                           in.rows.size() < in.total_points ? " (unfinished or a shard)" : ""));
  if (!filters.empty()) {
    std::string f;
    for (const auto& [k, v] : filters) f += fmt::format("{}{} = {}", f.empty() ? "" : ", ", k, v);
    d.facts.emplace_back("filter", fmt::format("{} ({} rows kept)", f, kept));
  }
  if (in.meta.contains("budget") && in.meta["budget"].is_object()) {
    const auto& b = in.meta["budget"];
    d.facts.emplace_back("budget", b.contains("tokens")
                                       ? fmt::format("{} tokens ({} samples of {} tokens)", b["tokens"].dump(),
                                                     b["samples"].dump(), b["seq_len"].dump())
                                       : fmt::format("{} samples", b["samples"].dump()));
  }
  std::string list;
  for (const auto& k : models.order) list += (list.empty() ? "" : ", ") + models.label.at(k);
  d.facts.emplace_back(options.model.empty() ? "models" : "models in the sweep", list.empty() ? "-" : list);
  list.clear();
  for (const auto& k : machines.order) list += (list.empty() ? "" : ", ") + machines.label.at(k);
  d.facts.emplace_back("machines", list.empty() ? "-" : list);
  d.facts.emplace_back("ranked by", fmt::format("{} ({}), within each model", metric_column(options.rank_by),
                                                higher_is_better(options.rank_by) ? "highest first" : "lowest first"));
}

// Status counts per plan kind (of the kept rows) and the most frequent reason a kind does not fit.
void add_status_rows(ReportData& d, const std::vector<RowView>& kept) {
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
}

// A --rank-by metric no feasible row has is refused, naming what the sweep lacks.
void check_rankable(const std::vector<RowView>& kept, RankBy by) {
  std::size_t with_metric = 0;
  for (const auto& r : kept)
    if (is_ok(r) && metric_of(r, by)) ++with_metric;
  if (with_metric == 0 && by == RankBy::Cost)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a cost",
                            "give the machines a price_per_hour (in the sweep grid or the machine file)");
  if (with_metric == 0 && by == RankBy::TimeToTrain)
    throw core::ConfigError(core::SourceLoc{"--rank-by", 0, 0}, "no feasible row has a time to train",
                            "add a `budget:` (tokens or samples) to the sweep file");
}

// Per (model, machine): the best kind (any role), the best baseline, the best Harmony kind.
void add_best_kinds(ReportData& d, const std::vector<RowView>& kept, const std::vector<std::string>& grid_keys,
                    const std::vector<std::string>& model_keys, const Groups& models, const Groups& machines,
                    RankBy by) {
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
        if (kind_in_role(r.kind, core::KindRole::Baseline))
          take(b.baseline_name, b.baseline_gpus, b.baseline_value);
        else if (kind_in_role(r.kind, core::KindRole::Harmony))  // not the ceiling (resident): the best kind only
          take(b.harmony_kind, b.harmony_gpus, b.harmony_value);
      }
      if (any) d.best_kinds.push_back(std::move(b));
    }
  }
}

// What every model section shares: the grid columns its ranked table shows (model and machine keys are the section
// and the machine column; plan.gpus and plan.minibatch the GPUs and D columns), the kinds in the sweep's order.
struct SectionLayout {
  std::vector<std::size_t> shown_grid;
  std::vector<std::string> kinds_in_order;
  bool has_budget = false;
};

SectionLayout section_layout(const SweepInput& in, const std::vector<RowView>& kept) {
  SectionLayout l;
  const auto& grid_keys = in.grid_keys;
  for (std::size_t a = 0; a < grid_keys.size(); ++a)
    if (!key_in(grid_keys[a], "model") && !key_in(grid_keys[a], "machine") && grid_keys[a] != "plan.gpus" &&
        grid_keys[a] != "plan.minibatch")
      l.shown_grid.push_back(a);
  for (const auto& k : in.meta.value("kinds", nlohmann::json::array()))
    if (k.is_string()) l.kinds_in_order.push_back(k.get<std::string>());
  for (const auto& r : kept)
    if (!r.kind.empty() &&
        std::find(l.kinds_in_order.begin(), l.kinds_in_order.end(), r.kind) == l.kinds_in_order.end())
      l.kinds_in_order.push_back(r.kind);
  l.has_budget = in.meta.contains("budget") && in.meta["budget"].is_object();
  return l;
}

// The ranked table's columns and which of them are numbers (right-aligned).
void ranked_columns(ModelSection& s, const std::vector<std::string>& grid_keys, const SectionLayout& l) {
  s.columns = {"rank", "point", "machine"};
  for (const auto a : l.shown_grid) s.columns.push_back(grid_keys[a]);
  for (const char* c : {"kind", "GPUs", "D", "samples/s", "iteration", "u f/b", "peak GiB", "swap GiB", "p2p GiB",
                        "coll GiB", "host GiB"})
    s.columns.emplace_back(c);
  if (l.has_budget) {
    s.columns.emplace_back("time to train");
    s.columns.emplace_back("cost");
  }
  for (std::size_t c = 0; c < s.columns.size(); ++c) {
    const auto& n = s.columns[c];
    if (n == "rank" || n == "point" || n == "GPUs" || n == "D" || n == "samples/s" || n == "iteration" ||
        n.find("GiB") != std::string::npos || n == "time to train" || n == "cost")
      s.numeric_columns.push_back(static_cast<int>(c));
  }
}

// One ranked row of the table: rank i + 1.
std::vector<std::string> ranked_row(std::size_t i, const RowView& r, const std::vector<std::string>& grid_keys,
                                    const Groups& machines, const SectionLayout& l) {
  std::vector<std::string> row = {std::to_string(i + 1), std::to_string(r.point)};
  const std::string hk = group_key(r, grid_keys, "machine");
  row.push_back(machines.label.count(hk) ? machines.label.at(hk) : "-");
  for (const auto a : l.shown_grid) row.push_back(r.grid[a]);
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
  if (l.has_budget) {
    row.push_back(r.time_to_train_s ? fmt_duration(*r.time_to_train_s) : "-");
    row.push_back(num_or_dash(r.cost, "{:.0f}"));
  }
  return row;
}

// A model's charts: throughput vs GPUs, one chart per machine (per kind the best samples/s at each GPU count), and
// cost vs time to train.
void add_charts(ModelSection& s, const std::vector<const RowView*>& mine, const std::vector<std::string>& grid_keys,
                const Groups& machines, const SectionLayout& l) {
  for (const auto& hk : machines.order) {
    ThroughputChart chart;
    chart.machine = machines.label.at(hk);
    for (const auto& kind : l.kinds_in_order) {
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
  for (const auto* r : mine) {
    if (!is_ok(*r) || !r->time_to_train_s || !r->cost || *r->time_to_train_s <= 0 || *r->cost <= 0) continue;
    const std::string hk = group_key(*r, grid_keys, "machine");
    s.cost_points.push_back(CostPoint{r->kind, machines.label.count(hk) ? machines.label.at(hk) : "-",
                                      static_cast<std::int64_t>(r->gpus.value_or(0)), r->point, *r->time_to_train_s,
                                      *r->cost, false});
  }
  mark_pareto(s.cost_points);
  if (s.cost_points.empty())
    s.cost_note = !l.has_budget ? "The sweep has no `budget:`, so no time to train or cost: no cost chart."
                                : "No feasible row of this model has a cost (no price_per_hour): no cost chart.";
}

// The section of model group `mk`: its ranked table (its feasible rows, best first, into *ranked) and charts.
ModelSection model_section(const std::string& mk, const std::vector<RowView>& kept, const SweepInput& in,
                           const Groups& models, const Groups& machines, const SectionLayout& l,
                           const ReportOptions& options, std::vector<const RowView*>* ranked) {
  const RankBy by = options.rank_by;
  ModelSection s;
  s.name = models.label.at(mk);
  std::vector<const RowView*> mine;
  for (const auto& r : kept)
    if (group_key(r, in.grid_keys, "model") == mk) mine.push_back(&r);
  for (const auto* r : mine)
    if (is_ok(*r) && metric_of(*r, by)) ranked->push_back(r);
  std::stable_sort(ranked->begin(), ranked->end(), [&](const RowView* a, const RowView* b) {
    return better(*metric_of(*a, by), *metric_of(*b, by), by);
  });
  std::size_t ok = 0;
  for (const auto* r : mine) ok += is_ok(*r) ? 1 : 0;
  s.facts.emplace_back("rows", fmt::format("{} fit of {}", ok, mine.size()));
  ranked_columns(s, in.grid_keys, l);
  const std::size_t shown = options.top == 0 ? ranked->size() : std::min(options.top, ranked->size());
  for (std::size_t i = 0; i < shown; ++i) s.rows.push_back(ranked_row(i, *(*ranked)[i], in.grid_keys, machines, l));
  s.ranked_note =
      fmt::format("{} feasible rows of {} for this model ranked by {} ({}); {} shown.", ranked->size(), mine.size(),
                  metric_column(by), higher_is_better(by) ? "highest first" : "lowest first", shown);
  add_charts(s, mine, in.grid_keys, machines, l);
  return s;
}

// Re-simulates each model's best point: its config comes from the sweep file, which must be the one that ran.
void resimulate_best(ReportData& d, const SweepInput& in, const ReportOptions& options,
                     const std::vector<std::vector<const RowView*>>& ranked_of) {
  bool any_ranked = false;
  for (const auto& r : ranked_of) any_ranked = any_ranked || !r.empty();
  if (!any_ranked) return;
  std::string tried;
  const nlohmann::json& meta = in.meta;
  const auto sweep = find_sweep(in.dir, in.meta_path, in.sweep_file,
                                meta.contains("sweep_file_absolute") && meta["sweep_file_absolute"].is_string()
                                    ? meta["sweep_file_absolute"].get<std::string>()
                                    : std::string(),
                                in.fingerprint, options.sweep_file, &tried);
  if (!sweep) {
    // The page names the recorded path only (no paths of this machine); stderr says where it looked.
    const std::string why = fmt::format(
        "the sweep file '{}' is not found from here, so the best plans are not re-simulated (no timeline, memory, "
        "ledger, bottleneck or trace)",
        in.sweep_file);
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
      throw core::ConfigError(file_loc(in.rows_path),
                              fmt::format("point {} is beyond the sweep's {} points", index, sweep->num_points()),
                              "the results are stale (another harmony-sim wrote them): rerun the sweep");
    const SweepPoint p = sweep_point(*sweep, index);
    const auto cfg = core::load_config_text(sweep->base_text, sweep->base_path, p.overrides);
    const auto model = core::load_model(cfg.model, cfg.machine);
    const auto kr = best_plan_of_kind(p.kind, model, cfg.machine, cfg.plan.gpus, cfg.plan.minibatch, cfg.cost_model,
                                      cfg.search, cfg.options);
    if (!kr.feasible)
      throw core::ConfigError(file_loc(in.rows_path),
                              fmt::format("point {} is `ok` in the results but does not fit now: {}", index, kr.reason),
                              "the results are stale (another harmony-sim wrote them): rerun the sweep");
    std::string where = fmt::format("point {}", index);
    for (const auto& o : p.overrides)
      if (o.rfind("plan.mode=", 0) != 0) where += ", " + o;  // the kind is in the title
    s.has_best = true;
    s.best = make_best(kr, model, cfg, where);
    s.facts.emplace_back("best plan on", cfg.machine.name + " (" + cfg.machine.gpu_name + "), cost model " +
                                             core::cost_model_name(cfg.cost_model));
  }
}

}  // namespace

ReportData report_from_sweep(const std::string& dir_text, const ReportOptions& options) {
  SweepInput in{fs::path(dir_text)};
  read_meta(in);
  const auto filters = parse_where(in, options);
  read_rows(in, dir_text);
  const auto keep = [&](const nlohmann::json& r) {
    for (const auto& [k, v] : filters) {
      const auto it = r.find(k);
      if (it == r.end() || cell_text(*it) != v) return false;
    }
    return true;
  };
  std::vector<RowView> kept;
  for (const auto& r : in.rows)
    if (keep(r)) kept.push_back(read_row(r, in.grid_keys));
  const Groups models = make_groups(kept, in.grid_keys, "model");
  const Groups machines = make_groups(kept, in.grid_keys, "machine");
  const std::vector<std::string> model_keys = chosen_models(models, in, options);

  ReportData d;
  d.from_sweep = true;
  d.rank_by = options.rank_by;
  d.title = "harmony-sim report: sweep " + (in.sweep_file.empty() ? in.dir.filename().string() : in.sweep_file);
  if (!options.model.empty()) d.title += ", model " + options.model;
  add_sweep_facts(d, in, options, filters, kept.size(), models, machines);
  add_status_rows(d, kept);
  check_rankable(kept, options.rank_by);
  add_best_kinds(d, kept, in.grid_keys, model_keys, models, machines, options.rank_by);
  const SectionLayout layout = section_layout(in, kept);
  std::vector<std::vector<const RowView*>> ranked_of;
  for (const auto& mk : model_keys) {
    std::vector<const RowView*> ranked;
    d.models.push_back(model_section(mk, kept, in, models, machines, layout, options, &ranked));
    ranked_of.push_back(std::move(ranked));
  }
  resimulate_best(d, in, options, ranked_of);
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
             {"cost model", core::cost_model_name(cfg.cost_model)}};
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
    const std::string r_policy = core::activation_policy_name(r.plan.knobs.activation_policy);
    std::string plan = !k.kind->packs ? fmt::format("u {}, {}", r.plan.u_bwd, r_policy)
                                      : fmt::format("fwd {} bwd {}, {}", core::packs_to_string(r.plan.packs_fwd),
                                                    core::packs_to_string(r.plan.packs_bwd), r_policy);
    for (const auto& [policy, t] : k.policy_best_time_s)
      if (policy != r_policy) plan += fmt::format(" ({} {})", policy, fmt_duration(t));
    s.rows.push_back({std::to_string(feasible), name, std::to_string(k.candidates),
                      fmt::format("{:.3f}", r.throughput_samples_per_s), fmt_duration(r.iteration_time_s),
                      std::isfinite(res.best_baseline_time_s) ? fmt::format("{:.2f}x", k.speedup_over_best_baseline)
                                                              : std::string("-"),
                      fmt::format("{}/{}", r.plan.u_fwd, r.plan.u_bwd), fmt_gib(r.swap_in_bytes + r.swap_out_bytes),
                      fmt_gib(r.p2p_bytes), fmt_gib(r.collective_bytes),
                      fmt_gib(r.peak_memory_bytes) + (r.fits ? "" : " (over capacity)"),
                      r.native ? fmt_gib(r.host_memory.total_bytes()) : std::string("-"), plan});
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
    auto doc = core::chrome_trace_json(b.program, b.native->timeline.begin_ps, b.native->timeline.end_ps,
                                       core::TraceMeta{"harmony-sim (" + b.report.cost_model + ")", b.title});
    append_native_counters(doc["traceEvents"], *b.native);
    out.emplace_back((page.parent_path() / s.trace_file).string(), doc.dump(1) + "\n");
  }
  return out;
}

}  // namespace harmony::sim
