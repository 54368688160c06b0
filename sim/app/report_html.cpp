// `harmony-sim report`, its page: renders ReportData (sim/app/report_data.cpp) as one self-contained HTML page with
// inline SVG (best kind per (model, machine) with a heatmap, throughput and cost charts, ranked tables, timeline,
// memory over time, swap ledger, bottleneck). Every number has a fixed precision: the page is reproducible.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/output/trace.hpp"
#include "core/plan/plan_kind.hpp"
#include "sim/app/report.hpp"
#include "sim/app/report_internal.hpp"

namespace harmony::sim {

using namespace report_detail;  // NOLINT(google-build-using-namespace): the report's own formatting

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
// Per-GPU parts of the page (timeline lanes, memory lines, the bottleneck's per-GPU rows) show the first kDrawnGpus
// GPUs: a plan over hundreds or thousands of GPUs (Harmony-DP replicas, which differ only by contention) would
// otherwise draw a lane per GPU stream (6 x N lanes, every op) and compare every GPU's memory line with every other.
// The others are counted in a note; every op stays in the trace. The per-link table stops after kMaxLinkRows rows.
constexpr int kDrawnGpus = 64;
constexpr std::size_t kMaxLinkRows = 512;

// "GPU64-4095 (4032 of 4096 GPUs) are not drawn: ..." for a Program on more than kDrawnGpus devices; else empty.
std::string undrawn_note(int devices, const char* what, const char* elsewhere) {
  if (devices <= kDrawnGpus) return {};
  return fmt::format("<p class=\"note\">GPU{}-{} ({} of {} GPUs) are not {}: the page shows the first {}; {}.</p>\n",
                     kDrawnGpus, devices - 1, devices - kDrawnGpus, devices, what, kDrawnGpus, elsewhere);
}

int device_count(const core::Program& p) {
  int n = 0;
  for (const auto& q : p.queues) n = std::max(n, q.device + 1);
  return n;
}

std::string timeline_svg(const BestPlan& b, const std::string& id) {
  const auto& prog = b.program;
  const auto& tl = b.native->timeline;
  core::TimePs end = 0;
  for (std::size_t i = 0; i < prog.ops.size(); ++i)
    if (i < tl.end_ps.size() && tl.begin_ps[i] >= 0) end = std::max(end, tl.end_ps[i]);
  const TimeAxis ax = time_axis(seconds(end), kLabelWidth, kPlotWidth);
  constexpr double kLane = 16, kGap = 4, kTop = 26;
  std::vector<std::size_t> drawn;  // the queues of the first kDrawnGpus devices, in order
  for (std::size_t q = 0; q < prog.queues.size(); ++q)
    if (prog.queues[q].device < kDrawnGpus) drawn.push_back(q);
  const double height = kTop + static_cast<double>(drawn.size()) * (kLane + kGap) + 6;
  std::vector<char> on_path(prog.ops.size(), 0);
  for (const auto& s : b.bottleneck.critical_path)
    if (s.op >= 0 && static_cast<std::size_t>(s.op) < on_path.size()) on_path[static_cast<std::size_t>(s.op)] = 1;

  std::string out = fmt::format(
      R"(<svg id="{}" class="timeline" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" shape-rendering="crispEdges" role="img" aria-label="timeline of the best plan">)",
      id, kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
  axis_ticks(out, ax, kTop - 6, height - 4);
  for (std::size_t lane_no = 0; lane_no < drawn.size(); ++lane_no) {
    const auto& queue = prog.queues[drawn[lane_no]];
    const double y = kTop + static_cast<double>(lane_no) * (kLane + kGap);
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
  out += undrawn_note(device_count(prog), "drawn", "the trace has every op");
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

// The memory chart's vertical scale: bytes from 0 at the bottom of the plot to `top` at its top.
struct MemoryScale {
  static constexpr double kPlotHeight = 240, kTop = 26;
  double top;
  double y(double bytes) const { return kTop + kPlotHeight * (1.0 - bytes / top); }
};

// The memory chart's GiB grid lines and the GPU capacity's line.
void memory_grid(std::string& out, const MemoryScale& scale, double capacity_bytes) {
  const double gstep = nice_step(scale.top / kGiB, 5);
  for (int i = 0;; ++i) {
    const double v = i * gstep;
    if (v * kGiB > scale.top) break;
    const double y = scale.y(v * kGiB);
    out += fmt::format(R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="grid"/>)", kLabelWidth, y,
                       kLabelWidth + kPlotWidth, y);
    out += fmt::format(R"(<text x="{:.0f}" y="{:.1f}" class="tick" text-anchor="end">{:g} GiB</text>)", kLabelWidth - 6,
                       y + 4, v);
  }
  const double cap_y = scale.y(capacity_bytes);
  out += fmt::format(
      R"(<line x1="{:.0f}" y1="{:.1f}" x2="{:.0f}" y2="{:.1f}" class="capacity"/><text x="{:.0f}" y="{:.1f}" class="tick">capacity {:.2f} GiB</text>)",
      kLabelWidth, cap_y, kLabelWidth + kPlotWidth, cap_y, kLabelWidth + 4, cap_y - 4, capacity_bytes / kGiB);
}

// One device's memory as a step line's points, binned to half a pixel: each bin draws the highest value in it and
// ends at its last.
std::string memory_step_points(const std::vector<const MemorySample*>& samples, const TimeAxis& ax,
                               const MemoryScale& scale) {
  struct Bin {
    double x;
    double max;
    double last;
  };
  std::vector<Bin> bins;
  for (const auto* sp : samples) {
    const auto& s = *sp;
    const double x = std::round(ax.x(s.time_ps) * 2) / 2;
    const double v = static_cast<double>(s.bytes);
    if (!bins.empty() && bins.back().x == x) {
      bins.back().max = std::max(bins.back().max, v);
      bins.back().last = v;
    } else {
      bins.push_back({x, v, v});
    }
  }
  std::string pts = fmt::format("{:.1f},{:.1f}", kLabelWidth, scale.y(0));
  double prev = 0;
  for (const auto& bin : bins) {
    pts += fmt::format(" {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}", bin.x, scale.y(prev), bin.x, scale.y(bin.max),
                       bin.x, scale.y(bin.last));
    prev = bin.last;
  }
  pts += fmt::format(" {:.1f},{:.1f}", kLabelWidth + kPlotWidth, scale.y(prev));
  return pts;
}

// The distinct memory lines of the first `shown` devices, in order of their first device, with the devices drawing
// each: devices whose lines are identical (data parallelism: every GPU alike) share one line.
struct MemoryLines {
  std::vector<std::string> curves;       // polylines' points
  std::vector<std::vector<int>> owners;  // the devices drawing each
};

MemoryLines distinct_memory_lines(const std::vector<MemorySample>& samples, int shown, const TimeAxis& ax,
                                  const MemoryScale& scale) {
  MemoryLines lines;
  std::unordered_map<std::string, std::size_t> curve_of;  // polyline -> its index in curves
  std::vector<std::vector<const MemorySample*>> by_device(static_cast<std::size_t>(shown));
  for (const auto& s : samples)  // one pass over the samples (not one per device)
    if (s.device >= 0 && s.device < shown) by_device[static_cast<std::size_t>(s.device)].push_back(&s);
  for (int dev = 0; dev < shown; ++dev) {
    std::string pts = memory_step_points(by_device[static_cast<std::size_t>(dev)], ax, scale);
    const auto [it, fresh] = curve_of.try_emplace(pts, lines.curves.size());
    if (fresh) {
      lines.curves.push_back(std::move(pts));
      lines.owners.push_back({dev});
    } else {
      lines.owners[it->second].push_back(dev);
    }
  }
  return lines;
}

std::string memory_svg(const BestPlan& b, const std::string& id) {
  const auto& samples = b.native->memory_samples;
  int devices = 0;
  for (const auto& s : samples) devices = std::max(devices, s.device + 1);
  devices = std::max<int>(devices, static_cast<int>(b.native->peak_bytes.size()));
  core::TimePs end = 0;
  for (std::size_t i = 0; i < b.native->timeline.end_ps.size(); ++i)
    if (b.native->timeline.begin_ps[i] >= 0) end = std::max(end, b.native->timeline.end_ps[i]);
  double top = b.capacity_bytes_per_gpu;
  for (const auto p : b.native->peak_bytes) top = std::max(top, static_cast<double>(p));
  top = std::max(top, 1.0) * 1.08;
  const MemoryScale scale{top};
  const double height = MemoryScale::kTop + MemoryScale::kPlotHeight + 30;
  const TimeAxis ax = time_axis(seconds(end), kLabelWidth, kPlotWidth);

  std::string out = fmt::format(
      R"(<svg id="{}" class="memory" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" role="img" aria-label="device memory over time">)",
      id, kLabelWidth + kPlotWidth + 40, height, kLabelWidth + kPlotWidth + 40, height);
  axis_ticks(out, ax, MemoryScale::kTop - 6, MemoryScale::kTop + MemoryScale::kPlotHeight);
  memory_grid(out, scale, b.capacity_bytes_per_gpu);
  const int shown = std::min(devices, kDrawnGpus);
  const auto [curves, owners] = distinct_memory_lines(samples, shown, ax, scale);
  const auto peak_of = [&](const std::vector<int>& devs) {
    double peak = 0;
    for (int dev : devs)
      if (static_cast<std::size_t>(dev) < b.native->peak_bytes.size())
        peak = std::max(peak, static_cast<double>(b.native->peak_bytes[static_cast<std::size_t>(dev)]));
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
  if (curves.size() < static_cast<std::size_t>(shown)) out += "<tspan>(identical lines drawn once)</tspan>";
  out += "</text></svg>\n";
  out += undrawn_note(devices, "drawn", "the trace has every GPU's memory as a counter track");
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
  std::size_t more = 0;  // links with traffic past kMaxLinkRows
  core::Bytes more_bytes = 0;
  for (const auto& link : l.links) {
    if (link.bytes == 0 && link.busy_s == 0) continue;
    if (rows.size() == kMaxLinkRows) {
      ++more;
      more_bytes += link.bytes;
      continue;
    }
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
  if (more > 0)
    out += fmt::format(
        "<p class=\"note\">{} more links with traffic ({} GiB in all) are not listed: the table stops "
        "at {} links.</p>\n",
        more, fmt_gib(more_bytes), kMaxLinkRows);
  const auto& h = b.report.host_memory;
  out += "<h3>Host memory</h3>\n";
  table(out, {"account", "GiB"},
        {{"master weights", fmt_gib(h.master_weights_bytes)},
         {"optimizer state", fmt_gib(h.optimizer_state_bytes)},
         {"gradients", fmt_gib(h.gradient_bytes)},
         {"stashes", fmt_gib(h.stash_bytes)},
         {"activations and messages", fmt_gib(h.activation_bytes)},
         {"pinned staging", fmt_gib(h.staging_bytes)},
         {"total needed", fmt_gib(h.total_bytes())},
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
    if (p.gpu >= kDrawnGpus) continue;
    const double t = bn.iteration_time_s;
    g.push_back({fmt::format("GPU{}", p.gpu), pct(p.compute_s, t), pct(p.wait_swap_s, t), pct(p.wait_peer_s, t),
                 pct(p.wait_cpu_s, t), pct(p.idle_s, t)});
  }
  out += "<h3>Where each GPU's compute stream spends the iteration</h3>\n";
  table(out, {"GPU", "compute", "waiting for swaps", "waiting for peers", "waiting for the CPU", "idle"}, g,
        {1, 2, 3, 4, 5});
  out += undrawn_note(device_count(b.program), "listed", "the trace has every GPU's ops");
  out += fmt::format("<p>Critical path: {} ops; compute {}, transfers {}, CPU {}, waits {}, other {}.</p>\n",
                     bn.critical_path.size(), fmt_duration(bn.path_compute_s), fmt_duration(bn.path_transfer_s),
                     fmt_duration(bn.path_cpu_s), fmt_duration(bn.path_wait_s), fmt_duration(bn.path_other_s));
  return out;
}

// Plan kind colours of the sweep charts: each kind's PlanKindSpec::color (disjoint from the op colours, which the
// screenshot test counts); an unregistered name (an old results file) the default's.
const char* kind_color(const std::string& kind) {
  const auto k = core::find_plan_kind(kind);
  return k ? (*k)->color : core::PlanKindSpec{}.color;
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
      "and its speedup over the best baseline ({}): {}. 1.00x: a baseline is the best kind.</p>\n",
      metric_column(by), fmt::join(core::plan_kind_names(core::KindRole::Baseline), ", "),
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
                    kind_n(b.baseline_name, b.baseline_gpus), fmt_metric(b.baseline_value, by),
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
      rows.reserve(front.size());
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
