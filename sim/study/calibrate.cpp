// `harmony-sim calibrate`'s library side: reading a measured trace against its Program, the per-class least
// squares fits, the whole-step search over shared compute, the residuals, and the calibrated machine file text.
#include "sim/study/calibrate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/index.hpp"
#include "core/program/program_graph.hpp"
#include "sim/engine/engine.hpp"
#include "sim/engine/native_engine.hpp"  // profiled_compute_s, profiled_update_s

namespace harmony::sim {

using core::OpKind;
using core::Program;
using core::Stream;

namespace {

using core::ix;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

constexpr const char* kTraceHint =
    "give the Chrome trace harmony-run writes of the Program the config describes: harmony-run train CONFIG "
    "--trace FILE (same model, plan, gpu_memory and options as the config)";

// line:column of byte `pos` in `text` (1-based).
core::SourceLoc loc_at(const std::string& path, const std::string& text, std::size_t pos) {
  int line = 1;
  int col = 1;
  for (std::size_t i = 0; i < std::min(pos, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return core::SourceLoc{path, line, col};
}

[[noreturn]] void fail(const core::SourceLoc& loc, const std::string& msg, const std::string& hint) {
  throw core::ConfigError(loc, msg, hint);
}

}  // namespace

const char* op_class_name(OpClass c) {
  static const char* const names[] = {"compute", "copy", "p2p", "update", "del"};
  return names[static_cast<int>(c)];
}

OpClass op_class(const Program& p, int op) {
  const core::Op& o = p.ops[ix(op)];
  switch (o.kind) {
    case OpKind::FWD:
    case OpKind::REC:
    case OpKind::BWD:
      return OpClass::Compute;
    case OpKind::Update:  // a device Update (resident state) is GPU work, timed with the compute ops
      return core::host_update(o) ? OpClass::Update : OpClass::Compute;
    case OpKind::DEL:
      return OpClass::Del;
    case OpKind::ARD:
    case OpKind::AG:
    case OpKind::RS:
      return OpClass::P2P;
    default:
      return o.peer >= 0 ? OpClass::P2P : OpClass::Copy;
  }
}

namespace {

// A measured trace's JSON: a Chrome trace with a traceEvents array, not one of harmony-sim's predictions.
nlohmann::json parse_measured_trace(const std::string& path, const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(loc_at(path, text, e.byte > 0 ? e.byte - 1 : 0), fmt::format("the trace is not JSON: {}", e.what()),
         kTraceHint);
  }
  const core::SourceLoc top{path, 1, 1};
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    fail(top, "not a Chrome trace: no traceEvents array", kTraceHint);
  if (doc.contains("otherData") && doc["otherData"].is_object()) {
    const auto& od = doc["otherData"];
    if (od.contains("source") && od["source"].is_string() &&
        od["source"].get<std::string>().rfind("harmony-sim", 0) == 0)
      fail(top, fmt::format("the trace is a prediction ({}), not a measurement", od["source"].get<std::string>()),
           kTraceHint);
  }
  return doc;
}

// The Program's op that complete event `e` (named `name`, at `loc`) measured: found by its device (pid) and op id
// (args.id), and the same op (kind, layers, bytes), else a located error.
int measured_op(const nlohmann::json& e, const std::string& name, const core::SourceLoc& loc,
                const std::map<std::pair<int, std::string>, int>& index, const Program& program) {
  const nlohmann::json args = e.contains("args") && e["args"].is_object() ? e["args"] : nlohmann::json::object();
  if (!args.contains("id") || !args["id"].is_string() || !e.contains("pid") || !e["pid"].is_number_integer())
    fail(loc, fmt::format("op '{}' has no device (pid) or op id (args.id)", name), kTraceHint);
  const int device = e["pid"].get<int>();
  const std::string id = args["id"].get<std::string>();
  const auto it = index.find({device, id});
  if (it == index.end())
    fail(
        loc,
        fmt::format("op {} ('{}') on GPU{} is not in the config's Program: a run of another Program", id, name, device),
        kTraceHint);
  const int op = it->second;
  const core::Op& o = program.ops[ix(op)];
  const auto bytes =
      args.contains("bytes") && args["bytes"].is_number_integer() ? args["bytes"].get<core::Bytes>() : core::Bytes{0};
  const bool layers_ok = args.contains("layers") && args["layers"].is_array() && args["layers"].size() == 2 &&
                         args["layers"][0] == o.layers.first && args["layers"][1] == o.layers.last;
  if (!layers_ok || bytes != o.bytes || !args.contains("kind") || args["kind"] != core::op_kind_name(o.kind))
    fail(loc,
         fmt::format("op {} ('{}') on GPU{} does not match the config's Program ({}, {} bytes): a run of another "
                     "model or plan",
                     id, name, device, program.op_label(op), o.bytes),
         kTraceHint);
  return op;
}

}  // namespace

MeasuredOps read_measured_trace(const std::string& path, const std::string& text, const Program& program) {
  const nlohmann::json doc = parse_measured_trace(path, text);
  const core::SourceLoc top{path, 1, 1};
  // where each complete ("X") event starts, for located errors: the n-th `"ph": "X"` of the text
  std::vector<std::size_t> x_pos;
  for (std::size_t at = text.find("\"ph\": \"X\""); at != std::string::npos; at = text.find("\"ph\": \"X\"", at + 1))
    x_pos.push_back(at);
  std::map<std::pair<int, std::string>, int> index;
  for (int i = 0; i < static_cast<int>(program.ops.size()); ++i)
    index.emplace(std::pair{program.ops[ix(i)].device, program.op_id(i)}, i);
  MeasuredOps m;
  m.begin_s.assign(program.ops.size(), -1.0);
  m.dur_s.assign(program.ops.size(), -1.0);
  std::size_t k = 0;
  bool any = false;
  double first = 0;
  double last = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (!e.is_object() || !e.contains("ph") || e["ph"] != "X") continue;
    const core::SourceLoc loc = k < x_pos.size() ? loc_at(path, text, x_pos[k]) : top;
    ++k;
    const std::string name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "?";
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number())
      fail(loc, fmt::format("op '{}' has no timing (ts and dur): a trace without timings cannot be fitted", name),
           kTraceHint);
    const int op = measured_op(e, name, loc, index, program);
    const std::string id = program.op_id(op);       // the event's args.id
    const int device = program.ops[ix(op)].device;  // the event's pid
    if (m.dur_s[ix(op)] >= 0) fail(loc, fmt::format("op {} on GPU{} appears twice", id, device), kTraceHint);
    const double ts = e["ts"].get<double>() * 1e-6;
    const double dur = e["dur"].get<double>() * 1e-6;
    if (!std::isfinite(ts) || !std::isfinite(dur) || dur < 0)
      fail(loc, fmt::format("op {} has an invalid timing (ts {}, dur {})", id, ts, dur), kTraceHint);
    m.begin_s[ix(op)] = ts;
    m.dur_s[ix(op)] = dur;
    first = any ? std::min(first, ts) : ts;
    last = any ? std::max(last, ts + dur) : ts + dur;
    any = true;
  }
  if (!any) fail(top, "the trace has no timed ops (no \"X\" events)", kTraceHint);
  for (int i = 0; i < static_cast<int>(program.ops.size()); ++i) {
    if (m.dur_s[ix(i)] < 0)
      fail(top,
           fmt::format("the trace lacks op {} ({}) on GPU{} of the config's Program: a run of another Program",
                       program.op_id(i), program.op_label(i), program.ops[ix(i)].device),
           kTraceHint);
    m.begin_s[ix(i)] -= first;
  }
  m.span_s = last - first;
  return m;
}

// ---- the fit ----

namespace {

struct Sample {
  double x = 0;  // the regressor (profiled seconds x slowdown, or bytes)
  double y = 0;  // measured seconds
};

// y = a + b x by least squares with a >= 0 (then b = Σxy / Σxx); a degenerate x gives a = 0.
std::pair<double, double> fit_line(const std::vector<Sample>& s) {
  if (s.empty()) return {0.0, 0.0};
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& p : s) {
    n += 1;
    sx += p.x;
    sy += p.y;
    sxx += p.x * p.x;
    sxy += p.x * p.y;
  }
  const double det = n * sxx - sx * sx;
  if (det > 1e-12 * std::max(1.0, n * sxx)) {
    const double b = (n * sxy - sx * sy) / det;
    const double a = (sy - b * sx) / n;
    if (a >= 0) return {a, b};
  }
  return {0.0, sxx > 0 ? sxy / sxx : 0.0};
}

// The time-averaged max(1, n(t) x per_op / units) over op i's measured interval, n(t) = ops of `set` running
// (i included); units <= 0: the plain count n(t) (uncapped processor sharing, as CPU updates).
double slowdown(const MeasuredOps& m, const std::vector<int>& set, int i, double units, double per_op) {
  const double b = m.begin_s[ix(i)];
  const double e = b + m.dur_s[ix(i)];
  if (!(e > b)) return 1.0;
  std::vector<double> cuts{b, e};
  for (int j : set) {
    const double bj = m.begin_s[ix(j)];
    const double ej = bj + m.dur_s[ix(j)];
    if (ej <= b || bj >= e) continue;
    if (bj > b) cuts.push_back(bj);
    if (ej < e) cuts.push_back(ej);
  }
  std::sort(cuts.begin(), cuts.end());
  double acc = 0;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const double lo = cuts[c];
    const double hi = cuts[c + 1];
    if (!(hi > lo)) continue;
    const double mid = 0.5 * (lo + hi);
    int n = 0;
    for (int j : set) {
      const double bj = m.begin_s[ix(j)];
      if (bj <= mid && mid < bj + m.dur_s[ix(j)]) ++n;
    }
    n = std::max(n, 1);
    const double f = units > 0 ? std::max(1.0, n * per_op / units) : static_cast<double>(n);
    acc += f * (hi - lo);
  }
  return acc / (e - b);
}

// Ops counted once: a P2P pair by its sender.
bool counted(const Program& p, int op) { return !(p.ops[ix(op)].peer >= 0 && p.ops[ix(op)].stream == Stream::P2PIn); }

}  // namespace

// As the engine shares its pool; one sweep over the run's op boundaries.
std::vector<double> host_slowdowns(const Program& p, const MeasuredOps& m, double units) {
  const int n = static_cast<int>(p.ops.size());
  std::vector<double> want(ix(n), 0.0);
  std::vector<double> cuts;
  for (int i = 0; i < n; ++i) {
    const OpClass c = op_class(p, i);
    if (c == OpClass::Del || !counted(p, i) || !(m.dur_s[ix(i)] > 0)) continue;
    want[ix(i)] = c == OpClass::Update ? units : 1.0;
    cuts.push_back(m.begin_s[ix(i)]);
    cuts.push_back(m.begin_s[ix(i)] + m.dur_s[ix(i)]);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // ops sorted by begin; `running` holds those begun and not yet ended at a segment's midpoint
  std::vector<int> order;
  for (int i = 0; i < n; ++i) {
    if (want[ix(i)] > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return m.begin_s[ix(a)] < m.begin_s[ix(b)]; });
  std::vector<double> acc(ix(n), 0.0);
  std::vector<int> running;
  std::vector<double> wants;
  std::size_t next = 0;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const double lo = cuts[c];
    const double hi = cuts[c + 1];
    const double mid = 0.5 * (lo + hi);
    while (next < order.size() && m.begin_s[ix(order[next])] <= mid) running.push_back(order[next++]);
    running.erase(
        std::remove_if(running.begin(), running.end(), [&](int j) { return m.begin_s[ix(j)] + m.dur_s[ix(j)] <= mid; }),
        running.end());
    if (running.empty()) continue;
    // water-filling: the level L with sum min(want, L) = units (no level while the wants fit)
    wants.clear();
    double total = 0;
    for (int j : running) {
      wants.push_back(want[ix(j)]);
      total += want[ix(j)];
    }
    double level = kInfinity;
    if (total > units) {
      std::sort(wants.begin(), wants.end());
      double left = units;
      for (std::size_t k = 0; k < wants.size(); ++k) {
        const double share = left / static_cast<double>(wants.size() - k);
        if (wants[k] > share) {
          level = share;
          break;
        }
        left -= wants[k];
      }
    }
    for (int j : running) acc[ix(j)] += want[ix(j)] / std::min(want[ix(j)], level) * (hi - lo);
  }
  std::vector<double> k(ix(n), 1.0);
  for (int i = 0; i < n; ++i) {
    if (want[ix(i)] > 0) k[ix(i)] = std::max(1.0, acc[ix(i)] / m.dur_s[ix(i)]);
  }
  return k;
}

namespace {

// The bytes an op's transfer moves through the engine (what its bandwidth term divides).
double moved_bytes(const Program& p, int op) {
  const core::Op& o = p.ops[ix(op)];
  const double bytes = static_cast<double>(o.bytes);
  if (o.kind == OpKind::ARD || o.kind == OpKind::AG || o.kind == OpKind::RS) {
    const double k = std::max(1, p.cost.bandwidth_sharers);
    return o.kind == OpKind::ARD ? 2. * (k - 1) / k * bytes : (k - 1) / k * bytes;
  }
  if (o.kind == OpKind::MSGsX || o.kind == OpKind::MSGY || (o.stream == Stream::Cpu && o.peer < 0)) return 2. * bytes;
  return bytes;
}

// compute.wake from measured runs: per op with predecessors, the gap from the last one's measured end to its own
// measured begin (the executor's hand-off to the op's stream thread and that thread's wait for a core); their mean
// over every run. Ops begun before their last predecessor's end (the stamps' rounding) say nothing and are left out.
double measured_wake_s(const std::vector<CalibrationRun>& runs) {
  double sum = 0;
  int count = 0;
  for (const CalibrationRun& r : runs) {
    const Program& p = *r.program;
    const MeasuredOps& m = r.measured;
    const core::ProgramGraph g(p);
    for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
      if (!counted(p, i) || g.predecessor_count(i) == 0) continue;
      double ready = -kInfinity;
      for (const int j : g.predecessors(i)) ready = std::max(ready, m.begin_s[ix(j)] + m.dur_s[ix(j)]);
      const double gap = m.begin_s[ix(i)] - ready;
      if (!(gap >= 0)) continue;
      sum += gap;
      ++count;
    }
  }
  return count > 0 ? sum / count : 0.0;
}

// The sharing a candidate fit assumes: compute units (0: not shared) and whether they are the host's cores,
// with each run's measured host slowdowns in that case (host_slowdowns; empty otherwise).
struct Sharing {
  double units = 0;
  bool host = false;
  std::vector<std::vector<double>> slow;  // per run, per op
  double k(std::size_t run, int op) const { return host ? slow[run][ix(op)] : 1.0; }
};

struct Fitted {
  core::ComputeSharing compute;
  core::DispatchOverheads dispatch;
  bool bandwidth = false;
  double bytes_per_s = 0;
};

core::MachineSpec with(core::MachineSpec m, const Fitted& f) {
  m.compute = f.compute;
  m.dispatch = f.dispatch;
  if (f.bandwidth) m.bw_swap_bytes_per_s = m.bw_p2p_bytes_per_s = m.bw_msg_bytes_per_s = f.bytes_per_s;
  return m;
}

// One measured copy or P2P op for the transfer fit: its class, the bytes it moved and its duration (with host cores,
// divided by its measured slowdown).
struct TransferRow {
  bool p2p;
  double bytes, y;
};

// The counted copy and P2P ops of every run; *topology: some run's machine has a topology.
std::vector<TransferRow> transfer_rows(const std::vector<CalibrationRun>& runs, const Sharing& sh, bool* topology) {
  std::vector<TransferRow> rows;
  for (std::size_t ri = 0; ri < runs.size(); ++ri) {
    const auto& r = runs[ri];
    *topology = *topology || r.machine.topology.valid();
    for (int i = 0; i < static_cast<int>(r.program->ops.size()); ++i) {
      const OpClass c = op_class(*r.program, i);
      if ((c != OpClass::Copy && c != OpClass::P2P) || !counted(*r.program, i)) continue;
      rows.push_back({c == OpClass::P2P, moved_bytes(*r.program, i), r.measured.dur_s[ix(i)] / sh.k(ri, i)});
    }
  }
  return rows;
}

// Solves the 3 x 3 system a (its 4th column the right-hand side) in place, by Gaussian elimination with partial
// pivoting: afterwards row i holds x_i's coefficient and its right-hand side alone.
void eliminate_3x3(std::array<std::array<double, 4>, 3>& a) {
  for (int c = 0; c < 3; ++c) {
    int piv = c;
    for (int r = c + 1; r < 3; ++r) {
      if (std::abs(a[ix(r)][ix(c)]) > std::abs(a[ix(piv)][ix(c)])) piv = r;
    }
    std::swap(a[ix(c)], a[ix(piv)]);
    if (std::abs(a[ix(c)][ix(c)]) < 1e-300) continue;
    for (int r = 0; r < 3; ++r) {
      if (r == c) continue;
      const double q = a[ix(r)][ix(c)] / a[ix(c)][ix(c)];
      for (int j = c; j < 4; ++j) a[ix(r)][ix(j)] -= q * a[ix(c)][ix(j)];
    }
  }
}

// The transfer fit's coefficients over the columns [copy, p2p, bytes]: on[i] whether column i is fitted.
struct TransferFit {
  std::array<bool, 3> on{};
  std::array<double, 3> beta{};
  double at(const TransferRow& r) const { return (r.p2p ? beta[1] : beta[0]) + (on[2] ? beta[2] * r.bytes : 0.0); }
};

// Least squares by the normal equations over the columns that have data (has[0]: copies, has[1]: P2P; bytes
// without a topology); a column whose coefficient comes out not positive is dropped and the rest refitted.
TransferFit solve_transfers(const std::vector<TransferRow>& rows, const bool (&has)[2], bool topology) {
  TransferFit f;
  auto& on = f.on;
  auto& beta = f.beta;
  on = {has[0], has[1], !topology};
  beta = {0, 0, 0};
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::array<std::array<double, 4>, 3> a{};
    for (const auto& r : rows) {
      const std::array<double, 3> x = {r.p2p ? 0.0 : 1.0, r.p2p ? 1.0 : 0.0, r.bytes};
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) a[ix(i)][ix(j)] += x[ix(i)] * x[ix(j)];
        a[ix(i)][3] += x[ix(i)] * r.y;
      }
    }
    for (int i = 0; i < 3; ++i) {
      if (on[ix(i)] && a[ix(i)][ix(i)] > 0) continue;
      on[ix(i)] = false;
      for (int j = 0; j < 4; ++j) a[ix(i)][ix(j)] = 0;
      for (int j = 0; j < 3; ++j) a[ix(j)][ix(i)] = 0;
      a[ix(i)][ix(i)] = 1;
    }
    eliminate_3x3(a);
    for (int i = 0; i < 3; ++i) beta[ix(i)] = on[ix(i)] && a[ix(i)][ix(i)] != 0 ? a[ix(i)][3] / a[ix(i)][ix(i)] : 0.0;
    bool changed = false;
    for (int i = 0; i < 3; ++i) {
      if (on[ix(i)] && !(beta[ix(i)] > 0)) {
        on[ix(i)] = false;
        changed = true;
      }
    }
    if (!changed) break;
  }
  return f;
}

// The rows at most 3 median absolute residuals above the fit.
std::vector<TransferRow> rows_near_fit(const std::vector<TransferRow>& rows, const TransferFit& fit) {
  std::vector<double> res;
  res.reserve(rows.size());
  for (const auto& r : rows)
    res.push_back(std::abs(r.y - (r.p2p ? fit.beta[1] : fit.beta[0]) - (fit.on[2] ? fit.beta[2] * r.bytes : 0.0)));
  std::vector<double> sorted = res;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  const double mad = sorted[sorted.size() / 2];
  std::vector<TransferRow> kept;
  for (const auto& r : rows) {
    if (r.y - fit.at(r) <= 3.0 * mad) kept.push_back(r);
  }
  return kept;
}

// Copy and P2P: y = o_copy [copy] + o_p2p [p2p] + bytes / bw, least squares with o >= 0 and 1/bw > 0 (else
// the bandwidth is not fitted and each class's overhead is its mean).
// With host cores, each duration is first divided by its measured slowdown (the fit is of the op's work alone).
void fit_transfers(const std::vector<CalibrationRun>& runs, const Sharing& sh, Fitted& f,
                   std::vector<std::string>& notes) {
  bool topology = false;
  std::vector<TransferRow> rows = transfer_rows(runs, sh, &topology);
  bool has[2] = {false, false};
  for (const auto& r : rows) has[r.p2p ? 1 : 0] = true;
  // normal equations over the columns [copy, p2p, bytes] that have data; drop a negative intercept and refit
  TransferFit fit = solve_transfers(rows, has, topology);
  // With host cores a copy's measured time also holds the wait for a core when every core is busy, a delay of
  // scheduler time slices that processor sharing does not describe: the few ops it hit (a tail 10-50x the
  // median) would set the bandwidth. Drop the rows more than 3 median absolute residuals above the fit, twice.
  for (int pass = 0; pass < (sh.host ? 2 : 0) && rows.size() > 3; ++pass) {
    std::vector<TransferRow> kept = rows_near_fit(rows, fit);
    if (kept.size() == rows.size() || kept.size() < 3) break;
    rows = std::move(kept);
    fit = solve_transfers(rows, has, topology);
  }
  const auto& [on, beta] = fit;
  f.dispatch.copy_s = std::max(0.0, beta[0]);
  f.dispatch.p2p_s = std::max(0.0, beta[1]);
  f.bandwidth = on[2] && beta[2] > 0;
  f.bytes_per_s = f.bandwidth ? 1.0 / beta[2] : 0.0;
  if (topology)
    notes.push_back(
        "the machine has a topology: its link bandwidths are kept (only the reference keys' bandwidth "
        "of a topology-less machine is fitted)");
  else if (!f.bandwidth && !rows.empty())
    notes.push_back("copy times do not grow with the bytes moved: the copy bandwidth is kept, only overheads fitted");
  if (!has[0]) notes.push_back("no copy ops measured: dispatch.copy is 0");
  if (!has[1]) notes.push_back("no P2P ops measured: dispatch.p2p is 0");
}

void fit_updates(const std::vector<CalibrationRun>& runs, const Sharing& sh, Fitted& f,
                 std::vector<std::string>& notes) {
  std::vector<Sample> s;
  for (std::size_t ri = 0; ri < runs.size(); ++ri) {
    const auto& r = runs[ri];
    std::vector<int> ups;
    for (int i = 0; i < static_cast<int>(r.program->ops.size()); ++i) {
      if (op_class(*r.program, i) == OpClass::Update) ups.push_back(i);
    }
    for (int i : ups) {
      const double w = profiled_update_s(r.program->ops[ix(i)], *r.model);
      if (sh.host) {
        s.push_back({w, r.measured.dur_s[ix(i)] / sh.k(ri, i)});
      } else {
        s.push_back({w * slowdown(r.measured, ups, i, 0.0, 1.0), r.measured.dur_s[ix(i)]});
      }
    }
  }
  if (s.empty()) {
    notes.push_back("no updates measured: update_time_scale stays 1, dispatch.update 0");
    return;
  }
  const auto [a, b] = fit_line(s);
  f.dispatch.update_s = a;
  f.compute.update_time_scale = std::clamp(b, 0.01, 100.0);
}

// Compute for a pool of `units` (0: not shared): y = o + scale x profiled x measured slowdown among the compute
// ops; with host cores y / (measured slowdown among all host work) = o + scale x profiled.
void fit_compute(const std::vector<CalibrationRun>& runs, const Sharing& sh, Fitted& f) {
  std::vector<Sample> s;
  for (std::size_t ri = 0; ri < runs.size(); ++ri) {
    const auto& r = runs[ri];
    std::vector<int> ops;
    for (int i = 0; i < static_cast<int>(r.program->ops.size()); ++i) {
      if (op_class(*r.program, i) == OpClass::Compute) ops.push_back(i);
    }
    for (int i : ops) {
      const double t = profiled_compute_s(r.program->ops[ix(i)], *r.model);
      if (sh.host) {
        s.push_back({t, r.measured.dur_s[ix(i)] / sh.k(ri, i)});
      } else {
        const double k = sh.units > 0 ? slowdown(r.measured, ops, i, sh.units, 1.0) : 1.0;
        s.push_back({t * k, r.measured.dur_s[ix(i)]});
      }
    }
  }
  const auto [a, b] = fit_line(s);
  f.dispatch.compute_s = a;
  f.compute.units = sh.units;
  f.compute.units_per_op = 1;
  f.compute.host_cores = sh.host;
  f.compute.time_scale = std::clamp(b > 0 ? b : 1.0, 0.01, 100.0);
}

// One run of `r`'s Program on the native engine (its default settings) on the machine with `f`: the predicted
// step is report.iteration_time_s, the per-op durations are in timeline.
EngineResult predict(const CalibrationRun& r, const Fitted& f) {
  return make_engine(core::CostModelKind::Native, *r.model, with(r.machine, f))->run(*r.program);
}

double step_objective(const std::vector<CalibrationRun>& runs, const Fitted& f) {
  double sum = 0;
  for (const auto& r : runs) {
    const double e = predict(r, f).report.iteration_time_s / r.measured_step_s - 1.0;
    sum += e * e;
  }
  return sum;
}

void add_to(ClassResidual& c, double measured, double predicted) {
  ++c.ops;
  c.measured_s += measured;
  c.predicted_s += predicted;
  c.rms_op_s += (measured - predicted) * (measured - predicted);  // a sum of squares until finished
}

// Per run and per class: the measured against the engine's durations on the machine with `f`.
void fill_residuals(const std::vector<CalibrationRun>& runs, const Fitted& f, Calibration& c) {
  c.classes.assign(kNumOpClasses, ClassResidual{});
  for (int k = 0; k < kNumOpClasses; ++k) c.classes[ix(k)].cls = static_cast<OpClass>(k);
  for (const auto& r : runs) {
    const EngineResult res = predict(r, f);
    RunResidual rr;
    rr.name = r.name;
    rr.ops = static_cast<int>(r.program->ops.size());
    rr.measured_step_s = r.measured_step_s;
    rr.predicted_step_s = res.report.iteration_time_s;
    std::vector<ClassResidual> per(kNumOpClasses);
    for (int k = 0; k < kNumOpClasses; ++k) per[ix(k)].cls = static_cast<OpClass>(k);
    for (int i = 0; i < rr.ops; ++i) {
      if (!counted(*r.program, i)) continue;
      const auto k = ix(static_cast<int>(op_class(*r.program, i)));
      const double predicted = core::ps_to_seconds(res.timeline.duration_ps[ix(i)]);
      add_to(per[k], r.measured.dur_s[ix(i)], predicted);
      add_to(c.classes[k], r.measured.dur_s[ix(i)], predicted);
    }
    for (auto& p : per) {
      if (p.ops == 0) continue;
      p.rms_op_s = std::sqrt(p.rms_op_s / p.ops);
      rr.classes.push_back(p);
    }
    c.runs.push_back(std::move(rr));
  }
  std::vector<ClassResidual> all;
  for (auto& p : c.classes) {
    if (p.ops == 0) continue;
    p.rms_op_s = std::sqrt(p.rms_op_s / p.ops);
    all.push_back(p);
  }
  c.classes = std::move(all);
}

}  // namespace

Calibration calibrate(const std::vector<CalibrationRun>& runs) {
  if (runs.empty())
    throw core::ConfigError(core::SourceLoc{}, "calibrate needs at least one measured run",
                            "give --run CONFIG,TRACE[,RUN_JSON] at least once");
  Calibration c;
  int max_devices = 1;
  for (const auto& r : runs) max_devices = std::max(max_devices, r.program->num_devices());
  // candidates: a machine with compute.host_cores keeps its units (the host's core count); else not shared,
  // then 1 .. max_devices - 1 units of one-op width (max_devices units or more never slow a compute op: the
  // same as not shared), then host cores, 1 .. max(2, max_devices) units (copies and updates share them too,
  // so more units than devices still matter)
  std::vector<Sharing> candidates;
  const core::ComputeSharing& given = runs.front().machine.compute;
  const double wake_s = measured_wake_s(runs);  // the runs' own hand-off waits (host cores only)
  auto add_host = [&](double units) {
    Sharing sh{units, true, {}};
    for (const auto& r : runs) sh.slow.push_back(host_slowdowns(*r.program, r.measured, units));
    candidates.push_back(std::move(sh));
  };
  if (given.host_cores && given.shared()) {
    add_host(given.units);  // the machine says how many cores: a fact, not a free parameter
  } else {
    for (int units = 0; units < max_devices; ++units)
      candidates.push_back(Sharing{static_cast<double>(units), false, {}});
    for (int units = 1; units <= std::max(2, max_devices); ++units) add_host(units);
  }
  Fitted best;
  double best_obj = 0;
  bool have = false;
  std::vector<std::string> best_notes;
  for (const Sharing& sh : candidates) {
    Fitted f;
    std::vector<std::string> notes;
    fit_transfers(runs, sh, f, notes);
    fit_updates(runs, sh, f, notes);
    fit_compute(runs, sh, f);
    if (sh.host) f.compute.wake_s = wake_s;  // measured, the same for every host candidate
    const double scale = f.compute.time_scale;
    const double launch = f.dispatch.compute_s;
    // the whole step: time_scale x 2^(g/20), g = -20..20 (x0.5..x2), and dispatch.compute x {0, 0.5, .., 3}
    for (int d = 0; d <= 6; ++d) {
      for (int g = -20; g <= 20; ++g) {
        Fitted h = f;
        h.compute.time_scale = std::clamp(scale * std::exp2(g / 20.0), 0.01, 100.0);
        h.dispatch.compute_s = std::min(1.0, launch * d / 2.0);
        const double obj = step_objective(runs, h);
        if (!have || obj < best_obj) {
          best = h;
          best_obj = obj;
          best_notes = notes;
          have = true;
        }
      }
    }
  }
  c.notes = std::move(best_notes);
  c.compute = best.compute;
  c.dispatch = best.dispatch;
  c.bandwidth_fitted = best.bandwidth;
  c.copy_bytes_per_s = best.bytes_per_s;
  fill_residuals(runs, best, c);
  return c;
}

Calibration check_machine(const std::vector<CalibrationRun>& runs) {
  if (runs.empty())
    throw core::ConfigError(core::SourceLoc{}, "calibrate needs at least one measured run",
                            "give --run CONFIG,TRACE[,RUN_JSON] at least once");
  Calibration c;
  Fitted f;
  f.compute = c.compute = runs.front().machine.compute;
  f.dispatch = c.dispatch = runs.front().machine.dispatch;
  fill_residuals(runs, f, c);
  return c;
}

core::MachineSpec apply_calibration(core::MachineSpec machine, const Calibration& c) {
  Fitted f;
  f.compute = c.compute;
  f.dispatch = c.dispatch;
  f.bandwidth = c.bandwidth_fitted;
  f.bytes_per_s = c.copy_bytes_per_s;
  return with(std::move(machine), f);
}

std::string calibrated_machine_text(const std::string& original, const Calibration& c,
                                    const std::vector<std::string>& provenance) {
  std::vector<std::string> replaced = {"compute", "dispatch"};
  if (c.bandwidth_fitted) replaced.insert(replaced.end(), {"bw_swap", "bw_p2p", "bw_msg"});
  std::istringstream in(original);
  std::string out;
  std::string line;
  bool skipping = false;  // inside a replaced top-level entry (its indented continuation lines)
  while (std::getline(in, line)) {
    if (line.rfind("# calibrate:", 0) == 0) continue;
    const bool top = !line.empty() && line[0] != ' ' && line[0] != '\t' && line[0] != '#';
    if (top) {
      skipping = false;
      for (const auto& k : replaced) {
        if (line.rfind(k + ":", 0) == 0) skipping = true;
      }
    } else if (skipping && !line.empty() && line[0] == '#') {
      skipping = false;  // a column-0 comment ends the entry
    }
    if (!skipping) out += line + "\n";
  }
  while (out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  if (!out.empty() && out.back() != '\n') out += "\n";
  out += "\n";
  for (const auto& p : provenance) out += "# calibrate: " + p + "\n";
  auto us = [](double s) { return fmt::format("{:.1f}us", s * 1e6); };
  out += fmt::format("compute: {{units: {}, units_per_op: {}, time_scale: {:.4f}, update_time_scale: {:.4f}{}{}}}\n",
                     c.compute.units, c.compute.units_per_op, c.compute.time_scale, c.compute.update_time_scale,
                     c.compute.host_cores ? ", host_cores: true" : "",
                     c.compute.wake_s > 0 ? ", wake: " + us(c.compute.wake_s) : "");
  out += fmt::format("dispatch: {{compute: {}, copy: {}, p2p: {}, update: {}}}\n", us(c.dispatch.compute_s),
                     us(c.dispatch.copy_s), us(c.dispatch.p2p_s), us(c.dispatch.update_s));
  if (c.bandwidth_fitted) {
    const std::string bw = fmt::format("{:.4f}GB/s", c.copy_bytes_per_s / 1e9);
    out += fmt::format("bw_swap: {}\nbw_p2p: {}\nbw_msg: {}\n", bw, bw, bw);
  }
  return out;
}

std::string fingerprint(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace harmony::sim
