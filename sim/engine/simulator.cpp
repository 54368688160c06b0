// Event loop of the simulator: a min-heap of op completions keyed by (time, sequence number),
// readiness counters over dependencies and stream order, and the RunReport derived from the result.
#include "sim/engine/simulator.hpp"

#include <algorithm>
#include <limits>
#include <queue>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::sim {

using core::Program;
using core::TimePs;

Timeline run_timeline(const Program& p, std::vector<TimePs> durations) {
  const std::size_t n = p.ops.size();
  Timeline t;
  t.duration_ps = std::move(durations);
  t.begin_ps.assign(n, -1);
  t.end_ps.assign(n, -1);
  // readiness: an op starts once all its predecessors (deps, then its stream predecessor) have ended
  const core::ProgramGraph g(p);
  std::vector<int> pending(n, 0);
  for (std::size_t i = 0; i < n; ++i) pending[i] = g.predecessor_count(static_cast<int>(i));
  // completion heap ordered by (end time, sequence of start)
  using Entry = std::pair<TimePs, std::uint64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  std::vector<int> seq_op;
  seq_op.reserve(n);
  std::vector<TimePs> ready(n, 0);
  auto start = [&](int op, TimePs now) {
    const TimePs d = t.duration_ps[static_cast<std::size_t>(op)];
    if (d > core::kMaxTimePs - now)
      throw core::ScheduleError(fmt::format(
          "op {} ({}) starts at {:.6g} s and lasts {:.6g} s: it would end past the simulated time range (about "
          "9.2e6 s); shorten the step: smaller layer times in the profile, a smaller time_del, or faster rates",
          p.op_label(op), p.op_id(op), core::ps_to_seconds(now), core::ps_to_seconds(d)));
    t.begin_ps[static_cast<std::size_t>(op)] = now;
    t.end_ps[static_cast<std::size_t>(op)] = now + d;
    heap.emplace(t.end_ps[static_cast<std::size_t>(op)], seq_op.size());
    seq_op.push_back(op);
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) start(static_cast<int>(i), 0);
  }
  while (!heap.empty()) {
    const auto [now, seq] = heap.top();
    heap.pop();
    const int op = seq_op[static_cast<std::size_t>(seq)];
    ++t.events_processed;
    for (const int succ : g.successors(op)) {
      const auto s = static_cast<std::size_t>(succ);
      ready[s] = std::max(ready[s], now);
      if (--pending[s] == 0) start(static_cast<int>(s), ready[s]);
    }
  }
  if (t.events_processed < n) mark_deadlock(p, t, false);
  return t;
}

void mark_deadlock(const Program& p, Timeline& t, bool rendezvous) {
  t.deadlock = true;
  for (const auto& q : p.queues) {
    for (int op : q.ops) {
      if (t.begin_ps[static_cast<std::size_t>(op)] >= 0) continue;
      BlockedOp b{op, {}};
      for (int d : p.ops[static_cast<std::size_t>(op)].deps) {
        if (t.end_ps[static_cast<std::size_t>(d)] < 0) b.waiting_for.push_back(d);
      }
      const int peer = p.ops[static_cast<std::size_t>(op)].peer;
      if (rendezvous && peer >= 0 && t.begin_ps[static_cast<std::size_t>(peer)] < 0 &&
          std::find(b.waiting_for.begin(), b.waiting_for.end(), peer) == b.waiting_for.end())
        b.waiting_for.push_back(peer);
      t.blocked.push_back(std::move(b));
      break;  // only the head of each stuck stream
    }
  }
}

std::string deadlock_report(const Program& p, const Timeline& t) {
  std::string s;
  for (const auto& b : t.blocked) {
    const auto& o = p.ops[static_cast<std::size_t>(b.op)];
    s += fmt::format("GPU{} {}: {} ({}) waits for", o.device, core::stream_name(o.stream), p.op_label(b.op),
                     p.op_id(b.op));
    if (b.waiting_for.empty()) s += " its stream predecessor";
    for (std::size_t k = 0; k < b.waiting_for.size(); ++k) {
      const int d = b.waiting_for[k];
      const auto& od = p.ops[static_cast<std::size_t>(d)];
      s += fmt::format("{} {} (GPU{} {}, not {})", k ? "," : "", p.op_label(d), od.device, core::stream_name(od.stream),
                       t.begin_ps[static_cast<std::size_t>(d)] >= 0 ? "finished" : "started");
    }
    s += "\n";
  }
  return s;
}

std::vector<int> reported_devices(const core::Program& p) {
  if (!p.cost.pp_rules) return p.devices;
  std::vector<int> all(static_cast<std::size_t>(p.num_devices()));
  for (int d = 0; d < p.num_devices(); ++d) all[static_cast<std::size_t>(d)] = d;
  return all;
}

core::RunReport make_report(const Program& p, const Timeline& t, core::CostModelKind kind,
                            const std::vector<core::Bytes>& mem) {
  core::RunReport r;
  r.plan = p.graph.plan;
  r.cost_model = core::cost_model_name(kind);
  r.num_ops = p.ops.size();
  r.num_streams = p.queues.size();
  const bool native = kind == core::CostModelKind::Native;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const core::Op& o = p.ops[i];
    // what the native model prices beyond an op's own bytes (core::NativeOpCosts): the extra its transfer carries (a
    // dWB's FP32 copy, host-stream's moments) and a dWB's copy back to its device
    const core::NativeOpCosts& c = p.cost.op(static_cast<int>(i));
    const core::Bytes extra = native ? c.extra_out_bytes : 0;
    if (native) r.swap_in_bytes += c.return_bytes;
    switch (o.stream) {
      case core::Stream::SwapIn:
        r.swap_in_bytes += o.bytes + extra;
        break;
      case core::Stream::SwapOut:
        r.swap_out_bytes += o.bytes + extra;
        break;
      case core::Stream::P2POut:
        r.p2p_bytes += o.bytes;
        break;
      case core::Stream::Cpu:
        r.msg_bytes += o.bytes;
        break;
      default:
        break;
    }
    if (o.kind == core::OpKind::ARD || o.kind == core::OpKind::AG || o.kind == core::OpKind::RS) {
      r.collective_bytes += o.bytes;
    }
  }
  if (t.deadlock) {
    r.deadlock = true;
    r.deadlock_report = deadlock_report(p, t);
    const double inf = std::numeric_limits<double>::infinity();
    r.iteration_time_s = inf;
    r.throughput_samples_per_s = 0.0;
    r.max_end_idle = r.avg_end_idle = r.compute_to_global = r.compute_to_rank = inf;
    for (int d : p.devices) r.per_gpu.push_back({d, inf, 0.0, mem[static_cast<std::size_t>(d)], inf});
    return r;
  }
  const std::vector<int> devices = reported_devices(p);
  std::vector<TimePs> end(static_cast<std::size_t>(p.num_devices()), 0);
  std::vector<TimePs> compute(static_cast<std::size_t>(p.num_devices()), 0);
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const auto& o = p.ops[i];
    const auto d = static_cast<std::size_t>(o.device);
    end[d] = std::max(end[d], t.end_ps[i]);
    if (core::is_compute(o.kind)) compute[d] += t.duration_ps[i];
  }
  for (int d : devices) {
    if (end[static_cast<std::size_t>(d)] == 0) end[static_cast<std::size_t>(d)] = 100;  // 1e-10 s
  }
  TimePs global = 0;
  for (int d : devices) global = std::max(global, end[static_cast<std::size_t>(d)]);
  const double g = core::ps_to_seconds(global);
  r.iteration_time_s = g;
  r.throughput_samples_per_s = g > 0 ? r.plan.minibatch / g : 0.0;
  double c2g = 0.0;
  double c2r = 0.0;
  for (int d : devices) {
    core::GpuReport gr;
    gr.gpu = d;
    gr.end_time_s = core::ps_to_seconds(end[static_cast<std::size_t>(d)]);
    gr.compute_time_s = core::ps_to_seconds(compute[static_cast<std::size_t>(d)]);
    gr.peak_memory_bytes = mem[static_cast<std::size_t>(d)];
    gr.end_idle = g > 0 ? (g - gr.end_time_s) / g : 0.0;
    r.max_end_idle = std::max(r.max_end_idle, gr.end_idle);
    r.avg_end_idle += gr.end_idle;
    c2g += g > 0 ? gr.compute_time_s / g : 0.0;
    c2r += gr.end_time_s > 0 ? gr.compute_time_s / gr.end_time_s : 0.0;
    r.peak_memory_bytes = std::max(r.peak_memory_bytes, gr.peak_memory_bytes);
    r.per_gpu.push_back(gr);
  }
  const double k = static_cast<double>(std::max<std::size_t>(1, devices.size()));
  r.avg_end_idle /= k;
  r.compute_to_global = c2g / k;
  r.compute_to_rank = c2r / k;
  return r;
}

}  // namespace harmony::sim
