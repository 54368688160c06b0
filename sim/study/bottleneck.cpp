// The bottleneck report: gates (the predecessor of an op that ended last), the critical path walked back
// from the last op, the compute-stream breakdown per GPU, and the what-if re-simulations (docs/bottleneck.md).
#include "sim/study/bottleneck.hpp"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/index.hpp"
#include "core/base/parallel.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::sim {

namespace {

using core::Op;
using core::OpKind;
using core::Stream;

using core::ix;
double secs(core::TimePs ps) { return static_cast<double>(ps) / static_cast<double>(core::kPsPerSecond); }

// The ops that must end before `o` may begin: its deps, its stream predecessor and, for one side of a P2P
// rendezvous, the other side's deps and predecessor too (the two start together).
std::vector<int> gates_of(const core::Program& p, int o) {
  std::vector<int> g;
  auto add = [&](int x) {
    const Op& op = p.ops[ix(x)];
    g.insert(g.end(), op.deps.begin(), op.deps.end());
    if (const int pred = core::queue_predecessor(p, x); pred >= 0) g.push_back(pred);
  };
  add(o);
  if (p.ops[ix(o)].peer >= 0) add(p.ops[ix(o)].peer);
  g.erase(std::remove(g.begin(), g.end(), o), g.end());
  return g;
}

// The gate that ended last (ties: the lower op id); -1 when none ran.
int last_gate(const core::Program& p, const Timeline& t, int o) {
  int best = -1;
  for (int g : gates_of(p, o)) {
    if (t.end_ps[ix(g)] < 0) continue;
    if (best < 0 || t.end_ps[ix(g)] > t.end_ps[ix(best)] || (t.end_ps[ix(g)] == t.end_ps[ix(best)] && g < best))
      best = g;
  }
  return best;
}

bool is_collective(OpKind k) { return k == OpKind::ARD || k == OpKind::AG || k == OpKind::RS; }
bool on_peer_stream(const Op& o) { return o.stream == Stream::P2PIn || o.stream == Stream::P2POut; }

core::TimePs iteration_end(const Timeline& t) {
  core::TimePs e = 0;
  for (core::TimePs x : t.end_ps) e = std::max(e, x);
  return e;
}

core::MachineSpec scaled_links(core::MachineSpec m, bool host, bool peer, bool memcpy) {
  if (host) {
    m.bw_swap_bytes_per_s *= 2;
    for (auto& g : m.topology.gpus) g.link_bytes_per_s *= 2;
    for (auto& s : m.topology.switches) s.uplink_bytes_per_s *= 2;
    m.topology.inter_socket_bytes_per_s *= 2;
  }
  if (peer) {
    m.bw_p2p_bytes_per_s *= 2;
    for (auto& l : m.topology.nvlinks) l.bytes_per_s *= 2;
  }
  if (memcpy) {
    m.bw_msg_bytes_per_s *= 2;
    m.topology.host_memcpy_bytes_per_s *= 2;
  }
  return m;
}

}  // namespace

namespace {

// The critical path and per-GPU breakdown of `result`; what_if and binding left empty.
Bottleneck analyze_run(const core::Program& program, const NativeResult& result) {
  const Timeline& t = result.timeline;
  Bottleneck b;
  const core::TimePs end = iteration_end(t);
  b.iteration_time_s = secs(end);
  b.feasible = result.feasible;
  if (t.deadlock || program.ops.empty()) return b;

  // Critical path: from the op that ends last, back through the gate that ended last.
  int cur = -1;
  for (std::size_t o = 0; o < program.ops.size(); ++o)
    if (cur < 0 || t.end_ps[o] > t.end_ps[ix(cur)]) cur = static_cast<int>(o);
  std::vector<CriticalStep> path;
  while (cur >= 0) {
    const int gate = last_gate(program, t, cur);
    const core::TimePs ready = gate >= 0 ? t.end_ps[ix(gate)] : 0;
    path.push_back({cur, secs(std::max<core::TimePs>(0, t.begin_ps[ix(cur)] - ready)), secs(t.duration_ps[ix(cur)])});
    cur = gate;
  }
  std::reverse(path.begin(), path.end());
  for (const CriticalStep& s : path) {
    const Op& op = program.ops[ix(s.op)];
    b.path_wait_s += s.wait_s;
    if (core::is_compute(op.kind)) {
      b.path_compute_s += s.run_s;
    } else if (op.stream == Stream::Cpu) {
      b.path_cpu_s += s.run_s;
    } else if (core::is_transfer(op.kind)) {
      b.path_transfer_s += s.run_s;
    } else {
      b.path_other_s += s.run_s;
    }
  }
  b.critical_path = std::move(path);

  // Per GPU: walk its Compute queue(s) in order; a gap before an op is charged to what its last gate was.
  for (int g = 0; g < program.num_devices(); ++g) {
    GpuBreakdown gb;
    gb.gpu = g;
    core::TimePs cursor = 0;
    for (const core::OpQueue& q : program.queues) {
      if (q.device != g || q.stream != Stream::Compute) continue;
      for (int o : q.ops) {
        if (t.begin_ps[ix(o)] < 0) continue;
        const Op& op = program.ops[ix(o)];
        const double gap = secs(std::max<core::TimePs>(0, t.begin_ps[ix(o)] - cursor));
        if (gap > 0) {
          const int gate = last_gate(program, t, o);
          const Op* go = gate >= 0 ? &program.ops[ix(gate)] : nullptr;
          if (go == nullptr || core::is_compute(go->kind) || go->kind == OpKind::DEL) {
            gb.idle_s += gap;
          } else if (go->stream == Stream::Cpu) {
            gb.wait_cpu_s += gap;
          } else if (on_peer_stream(*go) || is_collective(go->kind)) {
            gb.wait_peer_s += gap;
          } else {
            gb.wait_swap_s += gap;
          }
        }
        const double run = secs(t.duration_ps[ix(o)]);
        if (core::is_compute(op.kind)) {
          gb.compute_s += run;
        } else if (is_collective(op.kind)) {
          gb.wait_peer_s += run;
        } else {
          gb.idle_s += run;
        }
        cursor = std::max(cursor, t.end_ps[ix(o)]);
      }
    }
    gb.idle_s += secs(std::max<core::TimePs>(0, end - cursor));
    b.per_gpu.push_back(gb);
  }
  return b;
}

// One what-if: a resource twice as fast (docs/bottleneck.md); `apply` makes the variant from copies of the model
// and machine, on the thread that runs it.
struct Variant {
  const char* resource;
  const char* change;
  void (*apply)(core::Model& model, core::MachineSpec& machine);
};

Variant memory_variant() {
  return {"memory", "GPU memory doubled", [](core::Model&, core::MachineSpec& m) { m.gpu_memory_bytes *= 2; }};
}

// The five what-ifs, plus "memory" for a plan that does not fit, in the report's order before sorting.
std::vector<Variant> what_if_variants(bool infeasible) {
  std::vector<Variant> v{
      {"compute", "every layer's forward and backward time halved",
       [](core::Model& m, core::MachineSpec&) {
         for (auto& l : m.layers) {
           for (double& x : l.fwd_time_s) x /= 2;
           for (double& x : l.bwd_time_s) x /= 2;
         }
       }},
      {"host links", "PCIe host<->GPU bandwidth doubled (GPU links, switch uplinks, inter-socket, bw_swap)",
       [](core::Model&, core::MachineSpec& m) { m = scaled_links(m, true, false, false); }},
      {"gpu-gpu links", "GPU-to-GPU bandwidth doubled (NVLink, bw_p2p)",
       [](core::Model&, core::MachineSpec& m) { m = scaled_links(m, false, true, false); }},
      {"cpu optimizer", "every layer's CPU update time halved",
       [](core::Model& m, core::MachineSpec&) {
         for (auto& l : m.layers) l.update_time_cpu_s /= 2;
       }},
      {"host memcpy", "host memory copies doubled (CPU messages, staging, bw_msg)",
       [](core::Model&, core::MachineSpec& m) { m = scaled_links(m, false, false, true); }},
  };
  if (infeasible) v.push_back(memory_variant());
  return v;
}

// The iteration time and feasibility of one what-if run.
WhatIf what_if_of(const Variant& v, const NativeResult& r) {
  WhatIf w;
  w.resource = v.resource;
  w.change = v.change;
  w.iteration_time_s = secs(iteration_end(r.timeline));
  w.feasible = r.feasible && !r.timeline.deadlock;
  return w;
}

NativeResult run_variant(const Variant& v, const core::Program& program, const core::Model& model,
                         const core::MachineSpec& machine, const NativeOptions& options) {
  core::Model m = model;
  core::MachineSpec mach = machine;
  v.apply(m, mach);
  return run_native(program, m, mach, options);
}

// Speedups against the base run, the list sorted (feasible first, largest speedup first, ties in order) and the
// binding resource.
void finish(Bottleneck& b, std::vector<WhatIf> what_if) {
  for (WhatIf& w : what_if) w.speedup = w.iteration_time_s > 0 ? b.iteration_time_s / w.iteration_time_s : 1.0;
  std::stable_sort(what_if.begin(), what_if.end(), [](const WhatIf& x, const WhatIf& y) {
    if (x.feasible != y.feasible) return x.feasible;
    return x.speedup > y.speedup;
  });
  b.what_if = std::move(what_if);
  if (!b.feasible) {
    b.binding = "memory";
  } else if (!b.what_if.empty() && b.what_if.front().speedup > 1.0 + 1e-9) {
    b.binding = b.what_if.front().resource;
  } else {
    b.binding = "none (no single resource doubled helps)";
  }
}

}  // namespace

// The variants are independent runs of the same Program: they run on the machine's cores at once and are listed in
// the same order as one after another.
Bottleneck analyze_bottleneck(const core::Program& program, const core::Model& model, const core::MachineSpec& machine,
                              const NativeResult& result, const NativeOptions& options) {
  Bottleneck b = analyze_run(program, result);
  if (result.timeline.deadlock || program.ops.empty()) return b;
  const std::vector<Variant> variants = what_if_variants(!result.feasible);
  std::vector<WhatIf> what_if(variants.size());
  core::parallel_for(variants.size(), std::thread::hardware_concurrency(), [&](std::size_t i) {
    what_if[i] = what_if_of(variants[i], run_variant(variants[i], program, model, machine, options));
  });
  finish(b, std::move(what_if));
  return b;
}

Bottleneck simulate_bottleneck(const core::Program& program, const core::Model& model, const core::MachineSpec& machine,
                               const NativeOptions& options) {
  // the base run alongside the five what-ifs; "memory" only once the base run shows the plan does not fit
  const std::vector<Variant> variants = what_if_variants(false);
  NativeResult base;
  std::vector<WhatIf> what_if(variants.size());
  core::parallel_for(variants.size() + 1, std::thread::hardware_concurrency(), [&](std::size_t i) {
    if (i == 0) {
      base = run_native(program, model, machine, options);
    } else {
      what_if[i - 1] = what_if_of(variants[i - 1], run_variant(variants[i - 1], program, model, machine, options));
    }
  });
  Bottleneck b = analyze_run(program, base);
  if (base.timeline.deadlock || program.ops.empty()) return b;
  if (!base.feasible) {
    const Variant memory = memory_variant();
    what_if.push_back(what_if_of(memory, run_variant(memory, program, model, machine, options)));
  }
  finish(b, std::move(what_if));
  return b;
}

nlohmann::json bottleneck_json(const core::Program& program, const Bottleneck& b) {
  nlohmann::json j;
  j["binding"] = b.binding;
  j["iteration_time_s"] = b.iteration_time_s;
  j["feasible"] = b.feasible;
  j["what_if"] = nlohmann::json::array();
  for (const WhatIf& w : b.what_if)
    j["what_if"].push_back({{"resource", w.resource},
                            {"change", w.change},
                            {"iteration_time_s", w.iteration_time_s},
                            {"feasible", w.feasible},
                            {"speedup", w.speedup}});
  j["per_gpu"] = nlohmann::json::array();
  for (const GpuBreakdown& g : b.per_gpu)
    j["per_gpu"].push_back({{"gpu", g.gpu},
                            {"compute_s", g.compute_s},
                            {"wait_swap_s", g.wait_swap_s},
                            {"wait_peer_s", g.wait_peer_s},
                            {"wait_cpu_s", g.wait_cpu_s},
                            {"idle_s", g.idle_s}});
  j["critical_path"] = {{"compute_s", b.path_compute_s}, {"transfer_s", b.path_transfer_s},
                        {"cpu_s", b.path_cpu_s},         {"wait_s", b.path_wait_s},
                        {"other_s", b.path_other_s},     {"ops", nlohmann::json::array()}};
  for (const CriticalStep& s : b.critical_path)
    j["critical_path"]["ops"].push_back({{"op", program.op_label(s.op)},
                                         {"gpu", program.ops[ix(s.op)].device},
                                         {"stream", core::stream_name(program.ops[ix(s.op)].stream)},
                                         {"wait_s", s.wait_s},
                                         {"run_s", s.run_s}});
  return j;
}

std::string bottleneck_text(const core::Program& program, const Bottleneck& b) {
  (void)program;
  std::string s = fmt::format("bottleneck: {}\n", b.binding);
  s += fmt::format("  {:<14} {:>12} {:>9}  {}\n", "2x resource", "time (s)", "speedup", "change");
  for (const WhatIf& w : b.what_if)
    s += fmt::format("  {:<14} {:>12.6f} {:>8.3f}x  {}{}\n", w.resource, w.iteration_time_s, w.speedup, w.change,
                     w.feasible ? "" : " (still does not fit)");
  s += fmt::format("  {:>4} {:>9} {:>10} {:>10} {:>10} {:>9}   (compute stream, % of the iteration)\n", "gpu",
                   "compute", "wait swap", "wait peer", "wait cpu", "idle");
  for (const GpuBreakdown& g : b.per_gpu) {
    const double T = b.iteration_time_s > 0 ? b.iteration_time_s : 1.0;
    s += fmt::format("  {:>4} {:>8.1f}% {:>9.1f}% {:>9.1f}% {:>9.1f}% {:>8.1f}%\n", g.gpu, 100 * g.compute_s / T,
                     100 * g.wait_swap_s / T, 100 * g.wait_peer_s / T, 100 * g.wait_cpu_s / T, 100 * g.idle_s / T);
  }
  s += fmt::format(
      "  critical path: {} ops; compute {:.6f} s, transfers {:.6f} s, cpu {:.6f} s, other {:.6f} s, waiting "
      "{:.6f} s\n",
      b.critical_path.size(), b.path_compute_s, b.path_transfer_s, b.path_cpu_s, b.path_other_s, b.path_wait_s);
  return s;
}

}  // namespace harmony::sim
