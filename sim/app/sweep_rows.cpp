// Sweep points and rows (sim/app/sweep.hpp): a point's index -> plan kind and overrides (odometer order) and id,
// the row's columns, and the evaluation of one point (its config, the best plan of its kind via sim/compare,
// the training budget) into CSV and JSON Lines cells.
#include <cmath>
#include <exception>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/kinds/swapping.hpp"
#include "core/output/report.hpp"
#include "core/plan/plan.hpp"
#include "sim/app/sweep_internal.hpp"
#include "sim/study/compare.hpp"

namespace harmony::sim {

using namespace sweep_detail;  // NOLINT(google-build-using-namespace): the sweep's own internal pieces

// ------------------------------------------------------------------------------------------------
// Points

SweepPoint sweep_point(const Sweep& sweep, std::size_t index) {
  SweepPoint p;
  p.index = index;
  const std::size_t k = sweep.kinds.size();
  p.kind = sweep.kinds[index % k];
  std::size_t combo = index / k;
  p.value_index.assign(sweep.grid.size(), 0);
  for (std::size_t a = sweep.grid.size(); a-- > 0;) {
    const std::size_t n = sweep.grid[a].values.size();
    p.value_index[a] = combo % n;
    combo /= n;
  }
  for (const auto& x : sweep.set) p.overrides.push_back(x.key + "=" + x.value);
  for (std::size_t a = 0; a < sweep.grid.size(); ++a)
    p.overrides.push_back(sweep.grid[a].key + "=" + sweep.grid[a].values[p.value_index[a]]);
  std::vector<std::string> id_overrides = p.overrides;
  id_overrides.push_back(std::string("plan.mode=") + id_mode_for(p.kind));
  p.id = fnv1a_hex(std::string(core::plan_kind_name(p.kind)) + "\n" + join(id_overrides, "\n"));
  p.overrides.push_back(std::string("plan.mode=") + core::plan_kind_name(p.kind));
  return p;
}

namespace {

// A grid key that is also a result column (`cost_model`: the resolved name is the grid's value) gets no column
// of its own.
bool grid_key_is_column(const std::string& key) { return key == "cost_model"; }

}  // namespace

std::vector<std::string> sweep_columns(const Sweep& sweep) {
  std::vector<std::string> c = {"point", "id"};
  for (const auto& a : sweep.grid)
    if (!grid_key_is_column(a.key)) c.push_back(a.key);
  for (const char* name : {"plan_kind",
                           "model_name",
                           "machine_name",
                           "gpus",
                           "minibatch",
                           "cost_model",
                           "status",
                           "feasible",
                           "reason",
                           "num_candidates",
                           "iteration_time_s",
                           "throughput_samples_per_s",
                           "u_fwd",
                           "u_bwd",
                           "packs_fwd",
                           "packs_bwd",
                           "packing_fwd",
                           "packing_bwd",
                           "swap_weights",
                           "swap_activations",
                           "activation_policy",
                           "offload",
                           "swap_in_bytes",
                           "swap_out_bytes",
                           "p2p_bytes",
                           "collective_bytes",
                           "msg_bytes",
                           "peak_memory_bytes",
                           "gpu_capacity_bytes",
                           "fits",
                           "excess_bytes",
                           "host_memory_bytes",
                           "samples",
                           "iterations",
                           "time_to_train_s",
                           "price_per_hour",
                           "cost",
                           "inputs"})
    c.emplace_back(name);
  return c;
}

namespace {

// A cell: null, text, a JSON-ready literal (numbers, booleans, packs' arrays; the CSV gets the same text), or
// a grid value (YAML text).
struct Cell {
  enum class Kind { Null, Text, Literal, Yaml };
  Kind kind = Kind::Null;
  std::string text;
};

Cell null_cell() { return {}; }
Cell text_cell(std::string s) { return {Cell::Kind::Text, std::move(s)}; }
Cell int_cell(std::int64_t v) { return {Cell::Kind::Literal, std::to_string(v)}; }
Cell bool_cell(bool v) { return {Cell::Kind::Literal, v ? "true" : "false"}; }
Cell num_cell(double v) {
  if (!std::isfinite(v)) return null_cell();
  return {Cell::Kind::Literal, fmt::format("{}", v)};  // shortest round-trip
}

bool is_json_number(const std::string& s) {
  std::size_t i = 0;
  const std::size_t n = s.size();
  if (i < n && s[i] == '-') ++i;
  if (i >= n) return false;
  if (s[i] == '0') {
    ++i;
  } else if (s[i] >= '1' && s[i] <= '9') {
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  } else {
    return false;
  }
  if (i < n && s[i] == '.') {
    ++i;
    if (i >= n || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (i >= n || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  }
  return i == n;
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string cell_json(const Cell& c) {
  switch (c.kind) {
    case Cell::Kind::Null:
      return "null";
    case Cell::Kind::Literal:
      return c.text;
    case Cell::Kind::Text:
      return json_string(c.text);
    case Cell::Kind::Yaml:
      if (c.text == "~" || c.text == "null") return "null";
      if (c.text == "true" || c.text == "false" || is_json_number(c.text)) return c.text;
      return json_string(c.text);
  }
  return "null";
}

std::string cell_csv(const Cell& c) { return c.kind == Cell::Kind::Null ? std::string() : csv_field(c.text); }

// Packs as compact JSON-style text: [[0,6],[7,27]].
std::string packs_text(const core::Packs& packs) {
  std::string out = "[";
  for (std::size_t i = 0; i < packs.size(); ++i)
    out += fmt::format("{}[{},{}]", i ? "," : "", packs[i].first, packs[i].last);
  return out + "]";
}

// A config error as a reason: the override or the file's name (not its path, which depends on the working
// folder), line and column, and the message.
std::string config_reason(const core::ConfigError& e) {
  core::SourceLoc loc = e.loc();
  if (!starts_with(loc.file, "--set ")) loc.file = fs::path(loc.file).filename().string();
  return one_line(fmt::format("{}: {}", loc.str(), e.message()));
}

// What a point's row depends on besides the sweep file and the base config (both in the fingerprint): the
// bytes of every file its config read, or the error that kept the config from being built.
std::string inputs_digest(const core::RunConfig* cfg, const std::string& config_error, ModelCache& cache) {
  std::string t = fmt::format("inputs {}\n", kFormatVersion);
  if (cfg) {
    for (const auto& f : cfg->inputs) t += "file " + cache.file_digest(f) + "\n";
  } else {
    t += "error " + config_error + "\n";
  }
  return fnv1a_hex(t);
}

}  // namespace

std::string sweep_point_inputs(const Sweep& sweep, std::size_t index, ModelCache* cache) {
  ModelCache local;
  if (!cache) cache = &local;
  const SweepPoint p = sweep_point(sweep, index);
  try {
    const auto cfg = core::load_config_text(sweep.base_text, sweep.base_path, p.overrides);
    return inputs_digest(&cfg, {}, *cache);
  } catch (const core::ConfigError& e) {
    return inputs_digest(nullptr, config_reason(e), *cache);
  } catch (const core::ScheduleError& e) {
    return inputs_digest(nullptr, one_line(e.what()), *cache);
  }
}

namespace {

// What evaluating a point found: its config (unless it failed to build), model and best plan of its kind, and
// the row's status, reason and inputs digest.
struct PointOutcome {
  std::string status;
  std::string reason;
  std::string inputs;
  std::optional<core::RunConfig> cfg;
  std::shared_ptr<const core::Model> model;
  std::optional<KindResult> kr;
};

// The model cache's key for a point's config: the profile's path, or (analytic models) the point's model and
// machine overrides.
std::string model_cache_key(const core::RunConfig& cfg, const SweepPoint& p) {
  std::string key = "profile " + cfg.model.profile_path;
  if (cfg.model.profile_path.empty()) {
    key = "overrides";
    for (const auto& o : p.overrides) {
      if (starts_with(o, "model") || starts_with(o, "machine")) key += "\n" + o;
    }
  }
  return key;
}

// Builds the point's config and searches the best plan of its kind; a bad config is an invalid row.
PointOutcome evaluate_point(const Sweep& sweep, const SweepPoint& p, ModelCache* cache) {
  PointOutcome o;
  try {
    try {
      o.cfg = core::load_config_text(sweep.base_text, sweep.base_path, p.overrides);
    } catch (const core::ConfigError& e) {
      o.inputs = inputs_digest(nullptr, config_reason(e), *cache);
      throw;
    } catch (const core::ScheduleError& e) {
      o.inputs = inputs_digest(nullptr, one_line(e.what()), *cache);
      throw;
    }
    o.inputs = inputs_digest(&*o.cfg, {}, *cache);
    o.model = cache->get(model_cache_key(*o.cfg, p), *o.cfg);
    o.kr = best_plan_of_kind(p.kind, *o.model, o.cfg->machine, o.cfg->plan.gpus, o.cfg->plan.minibatch,
                             o.cfg->cost_model, o.cfg->search, o.cfg->options);
    if (o.kr->feasible) {
      o.status = "ok";
    } else {
      o.status = !o.kr->applicable                                                ? "invalid"
                 : (o.kr->candidates > 0 && o.kr->deadlocked == o.kr->candidates) ? "deadlock"
                                                                                  : "does_not_fit";
      o.reason = one_line(o.kr->reason);
    }
  } catch (const core::ConfigError& e) {
    o.status = "invalid";
    o.reason = config_reason(e);
  } catch (const core::ScheduleError& e) {
    o.status = "invalid";
    o.reason = one_line(e.what());
  }
  return o;
}

// The point's own cells: its index, id, the grid values (but cost_model's, returned in *grid_cost_model: that
// column comes later) and its plan kind.
std::vector<Cell> point_cells(const Sweep& sweep, const SweepPoint& p, std::size_t columns,
                              std::optional<std::string>* grid_cost_model) {
  std::vector<Cell> cells;
  cells.reserve(columns);
  cells.push_back(int_cell(static_cast<std::int64_t>(p.index)));
  cells.push_back(text_cell(p.id));
  for (std::size_t a = 0; a < sweep.grid.size(); ++a) {
    if (grid_key_is_column(sweep.grid[a].key))
      *grid_cost_model = sweep.grid[a].values[p.value_index[a]];
    else
      cells.push_back(Cell{Cell::Kind::Yaml, sweep.grid[a].values[p.value_index[a]]});
  }
  cells.push_back(text_cell(core::plan_kind_name(p.kind)));
  return cells;
}

// The best plan's 18 cells, from iteration_time_s to peak_memory_bytes (all null without a plan).
void push_plan_cells(std::vector<Cell>& cells, const core::RunReport* r, const PointOutcome& o, core::PlanKind kind) {
  if (!r) {
    for (int i = 0; i < 18; ++i) cells.push_back(null_cell());
    return;
  }
  cells.push_back(num_cell(r->iteration_time_s));
  cells.push_back(num_cell(r->throughput_samples_per_s));
  cells.push_back(int_cell(r->plan.u_fwd));
  cells.push_back(int_cell(r->plan.u_bwd));
  cells.push_back(Cell{Cell::Kind::Literal, packs_text(r->plan.packs_fwd)});
  cells.push_back(Cell{Cell::Kind::Literal, packs_text(r->plan.packs_bwd)});
  cells.push_back(r->method_fwd.empty() ? null_cell() : text_cell(r->method_fwd));
  cells.push_back(r->method_bwd.empty() ? null_cell() : text_cell(r->method_bwd));
  if (o.kr->plan && core::is_swapping_kind(kind)) {  // the swapping kinds' swap decisions (not resident, zero-offload)
    const auto ds = core::decide_swaps(*o.kr->plan, *o.model);
    cells.push_back(bool_cell(std::any_of(ds.begin(), ds.end(), [](const auto& d) { return d.weights; })));
    cells.push_back(bool_cell(std::any_of(ds.begin(), ds.end(), [](const auto& d) { return d.activations; })));
  } else {
    cells.push_back(null_cell());
    cells.push_back(null_cell());
  }
  // What decided the plan besides its shape: the activation policy (Harmony recomputes by design) and, for the
  // kinds with offload tiers, where parameters and optimizer state lived (cpu: host memory, nvme: the drives).
  cells.push_back(text_cell(core::activation_policy_name(r->plan.knobs.activation_policy)));
  cells.push_back(kind->offload_tiers ? text_cell(o.kr->offload.empty() ? "cpu" : o.kr->offload) : null_cell());
  cells.push_back(int_cell(r->swap_in_bytes));
  cells.push_back(int_cell(r->swap_out_bytes));
  cells.push_back(int_cell(r->p2p_bytes));
  cells.push_back(int_cell(r->collective_bytes));
  cells.push_back(int_cell(r->msg_bytes));
  // The reference model estimates no memory for the baselines (0): unknown, not zero.
  cells.push_back(r->peak_memory_bytes > 0 || r->native ? int_cell(r->peak_memory_bytes) : null_cell());
}

// The training budget's cells: samples, iterations, time to train, the machine's price per hour and the cost.
void push_budget_cells(std::vector<Cell>& cells, const Sweep& sweep, const core::RunReport* r,
                       const core::RunConfig* cfg) {
  const core::MachineSpec* m = cfg ? &cfg->machine : nullptr;
  const bool budget = sweep.budget.samples > 0;
  cells.push_back(budget ? int_cell(sweep.budget.samples) : null_cell());
  double time_to_train_s = 0.0;
  if (budget && r && cfg) {
    const std::int64_t d = cfg->plan.minibatch;
    const std::int64_t iterations = (sweep.budget.samples + d - 1) / d;
    time_to_train_s = static_cast<double>(iterations) * r->iteration_time_s;
    cells.push_back(int_cell(iterations));
    cells.push_back(num_cell(time_to_train_s));
  } else {
    cells.push_back(null_cell());
    cells.push_back(null_cell());
  }
  const bool priced = m != nullptr && m->price_per_hour > 0;
  cells.push_back(priced ? num_cell(m->price_per_hour) : null_cell());
  if (budget && r && priced) {
    const double t = time_to_train_s;
    const double share =
        sweep.budget.bill_gpus ? static_cast<double>(cfg->plan.gpus) / static_cast<double>(m->gpus) : 1.0;
    cells.push_back(num_cell(t / 3600.0 * m->price_per_hour * share));
  } else {
    cells.push_back(null_cell());
  }
}

// The row's CSV line and JSON line from its cells, one per column.
SweepRow row_of_cells(std::size_t index, const PointOutcome& o, const std::vector<std::string>& columns,
                      const std::vector<Cell>& cells) {
  if (cells.size() != columns.size())
    throw std::logic_error(fmt::format("sweep row has {} cells for {} columns", cells.size(), columns.size()));
  SweepRow row;
  row.point = index;
  row.status = o.status;
  row.reason = o.reason;
  row.inputs = o.inputs;
  row.json = fmt::format("{{\"schema_version\":{}", core::kOutputSchemaVersion);
  for (std::size_t i = 0; i < cells.size(); ++i) {
    row.csv += (i ? "," : "") + cell_csv(cells[i]);
    row.json += "," + json_string(columns[i]) + ":" + cell_json(cells[i]);
  }
  row.csv += "\n";
  row.json += "}\n";
  return row;
}

}  // namespace

SweepRow evaluate_sweep_point(const Sweep& sweep, std::size_t index, ModelCache* cache) {
  ModelCache local;
  if (!cache) cache = &local;
  const SweepPoint p = sweep_point(sweep, index);
  const auto columns = sweep_columns(sweep);
  std::optional<std::string> grid_cost_model;  // the grid's value of `cost_model`, when it has that key
  std::vector<Cell> cells = point_cells(sweep, p, columns.size(), &grid_cost_model);
  const PointOutcome o = evaluate_point(sweep, p, cache);
  const auto& cfg = o.cfg;

  const bool ok = o.status == "ok";
  const core::RunReport* r = ok ? &o.kr->best : nullptr;
  auto when = [&](bool have, Cell c) { return have ? std::move(c) : null_cell(); };
  cells.push_back(when(o.model != nullptr, text_cell(o.model ? o.model->name : "")));
  cells.push_back(when(cfg.has_value(), text_cell(cfg ? cfg->machine.name : "")));
  cells.push_back(when(cfg.has_value(), int_cell(cfg ? cfg->plan.gpus : 0)));
  cells.push_back(when(cfg.has_value(), int_cell(cfg ? cfg->plan.minibatch : 0)));
  if (cfg)
    cells.push_back(text_cell(core::cost_model_name(cfg->cost_model)));
  else
    cells.push_back(grid_cost_model ? Cell{Cell::Kind::Yaml, *grid_cost_model} : null_cell());
  cells.push_back(text_cell(o.status));
  cells.push_back(bool_cell(ok));
  cells.push_back(ok ? null_cell() : text_cell(o.reason));
  cells.push_back(when(o.kr.has_value(), int_cell(o.kr ? static_cast<std::int64_t>(o.kr->candidates) : 0)));
  push_plan_cells(cells, r, o, p.kind);
  const core::MachineSpec* m = cfg ? &cfg->machine : nullptr;
  cells.push_back(when(m != nullptr, int_cell(m ? m->search_capacity_bytes() : 0)));
  // fits / excess_bytes: whether the best plan's peak fits the GPU capacity (null without a plan or a known
  // peak); the excess is null when it fits.
  const bool fit_known = r != nullptr && r->gpu_capacity_bytes > 0 && (r->peak_memory_bytes > 0 || r->native);
  cells.push_back(fit_known ? bool_cell(r->fits) : null_cell());
  cells.push_back(fit_known && !r->fits ? int_cell(r->excess_bytes) : null_cell());
  cells.push_back(when(r != nullptr && r->native, int_cell(r ? r->host_memory.total_bytes() : 0)));
  push_budget_cells(cells, sweep, r, cfg ? &*cfg : nullptr);
  cells.push_back(text_cell(o.inputs));
  return row_of_cells(index, o, columns, cells);
}

}  // namespace harmony::sim
