// The native engine's event loop (FlowEngine): a discrete-event loop over integer picoseconds that starts each op's
// activity when it is ready, queues transfers on FIFO copy engines, runs fluid flows at their max-min fair rates
// (fair_share.hpp), and records the timeline, link statistics, memory (memory_timeline.hpp) and host account.
#include "sim/engine/native_engine.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/program/program_graph.hpp"
#include "sim/engine/activities.hpp"
#include "sim/engine/fair_share.hpp"
#include "sim/engine/memory_timeline.hpp"
#include "sim/engine/search_bounds.hpp"
#include "sim/engine/size_index.hpp"

namespace harmony::sim {

using core::Bytes;
using core::Op;
using core::OpKind;
using core::Program;
using core::TimePs;

namespace {

using native_detail::Activity;
using native_detail::ActivityBuilder;
using native_detail::ActKind;
using native_detail::ChainBound;
using native_detail::coef_of;
using native_detail::CutoffWatch;
using native_detail::MemoryTimeline;
using native_detail::Stage;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPs = 1e12;
using engine_detail::z;

enum class EvKind : std::uint8_t { FixedEnd, LatencyEnd, FlowEnd, WakeEnd };

struct Event {
  TimePs t = 0;
  std::uint64_t seq = 0;
  int act = 0;
  EvKind kind = EvKind::FixedEnd;
  std::uint64_t version = 0;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct CopyEngine {
  int slots = 1;
  int in_use = 0;
  std::deque<int> waiting;
};

// The topology the engine runs on: the machine's, else one derived from its reference keys, wide enough for the plan.
core::Topology engine_topology(const Program& p, const core::MachineSpec& mach) {
  if (mach.topology.valid()) return mach.topology;
  core::MachineSpec wide = mach;
  wide.gpus = std::max(mach.gpus, p.num_devices());
  return derive_topology(wide);
}

// The link graph of `mach` on `topo`.
LinkGraph engine_link_graph(const core::MachineSpec& mach, const core::Topology& topo) {
  core::MachineSpec with_topology = mach;
  with_topology.topology = topo;
  return build_link_graph(with_topology);
}

// Per link, the capacity the engine divides: infinite for a link that is never a bottleneck (unlimited, or a
// bandwidth link under the reference settings); the CPU cores and compute units keep theirs.
std::vector<double> link_capacities(const LinkGraph& g, const NativeOptions& opt) {
  std::vector<double> cap(g.links.size());
  for (std::size_t l = 0; l < g.links.size(); ++l) {
    const bool bytes_link = g.links[l].kind != LinkKind::CpuCores && g.links[l].kind != LinkKind::ComputeUnits;
    cap[l] = (opt.reference_bandwidths && bytes_link) || g.links[l].capacity <= 0 ? kInf : g.links[l].capacity;
  }
  return cap;
}

NativeResult result_on(LinkGraph graph) {
  NativeResult r;
  r.graph = std::move(graph);
  return r;
}

class FlowEngine {
 public:
  FlowEngine(const Program& p, const core::Model& m, const core::MachineSpec& mach, const NativeOptions& opt)
      : p_(p),
        m_(m),
        opt_(opt),
        topo_(engine_topology(p, mach)),
        r_(result_on(engine_link_graph(mach, topo_))),
        cap_(link_capacities(r_.graph, opt)),
        builder_(p, m, mach, opt_, topo_, r_.graph, cap_),
        memory_(z(std::max(p.num_devices(), static_cast<int>(topo_.gpus.size()))), z(std::max(p.num_devices(), 1)),
                mach.gpu_memory_bytes, opt.capacities, opt.record_counters),
        graph_(p) {
    const int ngpu = static_cast<int>(topo_.gpus.size());
    if (p.num_devices() > ngpu)
      throw core::ScheduleError(fmt::format("the plan uses {} GPUs but the machine '{}' has {} in its topology",
                                            p.num_devices(), mach.name, ngpu));
    for (const Op& o : p.ops) {
      if (o.device < 0 || o.device >= ngpu)
        throw core::ScheduleError(fmt::format("an op runs on GPU{}, which the machine's topology lacks", o.device));
    }
    const std::size_t nlinks = r_.graph.links.size();
    load_.assign(nlinks, 0.0);
    last_sample_.assign(nlinks, 0.0);
    r_.link_stats.assign(nlinks, LinkStats{});
    for (const auto& gs : topo_.gpus) {
      engines_.push_back(CopyEngine{std::max(1, gs.copy_engines_h2d), 0, {}});
      engines_.push_back(CopyEngine{std::max(1, gs.copy_engines_d2h), 0, {}});
    }
    init_readiness();
    if (native_detail::on_host_pool(mach, opt)) wake_ps_ = core::seconds_to_ps(mach.compute.wake_s);
    acts_.reserve(p.ops.size());  // at most one activity per op (a rendezvous pair shares one): never moved
  }

  // A time the iteration cannot beat (native_lower_bound_ps, ChainBound). with_tails: also what run_until checks
  // with a cutoff (each op's tail, what each link owes) and the activities the bound built, for the run to take.
  // stop_above (>= 0): a bound found above it is returned at once (the search only asks whether it is).
  TimePs lower_bound(bool with_tails = false, TimePs stop_above = -1) {
    std::vector<int> slots;
    slots.reserve(engines_.size());
    for (const CopyEngine& e : engines_) slots.push_back(e.slots);
    ChainBound bound(p_, graph_, builder_, cap_, std::move(slots), opt_);
    return with_tails ? bound.lower_bound(stop_above, &built_, &watch_)
                      : bound.lower_bound(stop_above, nullptr, nullptr);
  }

  NativeResult run() { return *run_until(-1); }

  // run(), abandoned (nullopt) once the iteration is known to end after `cutoff` ps (-1: never): when an op
  // becomes ready at a time that its tail (lower_bound(true), which must have run) carries past the cutoff, or a
  // link still owes more than the time left (CutoffWatch).
  std::optional<NativeResult> run_until(TimePs cutoff) {
    watch_.arm(cutoff, p_.ops.size());
    const std::size_t n = p_.ops.size();
    for (std::size_t i = 0; i < n; ++i) {
      if (pending_[i] == 0) became_ready(static_cast<int>(i));
    }
    start_pending();
    if (dirty_) recompute();
    while (!heap_.empty() && !watch_.past) {
      const TimePs t = heap_.top().t;
      if (t < now_)
        throw core::InternalError(fmt::format("an event at {} ps is before the current time {} ps", t, now_));
      if (t > now_) {
        advance(t);
        if (watch_.links_checked) watch_.check_links(now_);
      }
      while (!heap_.empty() && heap_.top().t == now_) {
        const Event e = heap_.top();
        heap_.pop();
        handle(e);
      }
      start_pending();
      if (dirty_) recompute();
    }
    if (watch_.past) return std::nullopt;
    finish();
    return std::move(r_);
  }

 private:
  // ---- readiness (the same rule as run_timeline) ----
  void init_readiness() {
    const std::size_t n = p_.ops.size();
    auto& t = r_.timeline;
    t.begin_ps.assign(n, -1);
    t.end_ps.assign(n, -1);
    t.duration_ps.assign(n, 0);
    r_.ready_ps.assign(n, -1);
    pending_.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const Op& o = p_.ops[i];
      if (o.peer >= 0 && (o.peer >= static_cast<int>(n) || p_.ops[z(o.peer)].peer != static_cast<int>(i)))
        throw core::ScheduleError(
            fmt::format("op {} has a rendezvous peer that does not point back", p_.op_id(static_cast<int>(i))));
      pending_[i] = graph_.predecessor_count(static_cast<int>(i));
    }
  }

  void became_ready(int op) {
    r_.ready_ps[z(op)] = now_;
    watch_.op_ready(op, now_);
    const int peer = p_.ops[z(op)].peer;
    if (peer >= 0) {
      if (r_.ready_ps[z(peer)] < 0) return;  // the peer will launch the pair
      launch(make_activity(op, peer));
      return;
    }
    launch(make_activity(op, -1));
  }

  void launch(int act) { to_start_.push_back(act); }

  // The activity of op `a` and its peer `b` (or -1), appended to acts_; its index.
  int make_activity(int a, int b) {
    // the one lower_bound(true) built for the same op and peer, else built in place (it holds its paths inline)
    if (z(a) < built_.size() && built_[z(a)].a == a && built_[z(a)].b == b)
      acts_.push_back(std::move(built_[z(a)]));
    else
      builder_.build(acts_.emplace_back(), a, b);
    return static_cast<int>(acts_.size()) - 1;
  }

  // ---- starting and ending ----
  void start_pending() {
    if (opt_.serial) {
      // one activity at a time, FIFO in the order they became ready (nothing else runs: no engine to wait for)
      serial_wait_.insert(serial_wait_.end(), to_start_.begin(), to_start_.end());
      to_start_.clear();
      if (serial_running_ || serial_wait_.empty()) return;
      serial_running_ = true;
      const int act = serial_wait_.front();
      serial_wait_.pop_front();
      acts_[z(act)].engine = -1;  // alone: no copy engine to hold
      begin(act);
      return;
    }
    // copy-engine slots freed at this time go to the transfers already waiting (FIFO), then new requests. Only an
    // engine that gave back a slot since the last call can have both a free slot and a queue (give_back_engine),
    // so those are visited, in ascending order as a scan of all 2N engines did (O(N) per event was O(N^2) per run).
    std::sort(freed_engines_.begin(), freed_engines_.end());
    freed_engines_.erase(std::unique(freed_engines_.begin(), freed_engines_.end()), freed_engines_.end());
    for (const int e : freed_engines_) {
      auto& ce = engines_[z(e)];
      while (ce.in_use < ce.slots && !ce.waiting.empty()) {
        const int act = ce.waiting.front();
        ce.waiting.pop_front();
        ++ce.in_use;
        begin(act);
      }
    }
    freed_engines_.clear();
    for (std::size_t k = 0; k < to_start_.size(); ++k) {
      const int act = to_start_[k];
      const int e = acts_[z(act)].engine;
      if (e < 0) {
        begin(act);
        continue;
      }
      auto& ce = engines_[z(e)];
      if (ce.waiting.empty() && ce.in_use < ce.slots) {
        ++ce.in_use;
        begin(act);
      } else {
        ce.waiting.push_back(act);
      }
    }
    to_start_.clear();
  }

  void push(TimePs t, int act, EvKind k, std::uint64_t version = 0) { heap_.push(Event{t, seq_++, act, k, version}); }

  void begin(int act) {
    // compute.wake (host cores): the op's stream thread starts it that long after it could begin, a wait that takes
    // no core (the executor's hand-off and the thread's wake-up; docs/machines.md). The op begins then, as the
    // measured trace stamps it where its stream runs it.
    if (wake_ps_ > 0) {
      push(now_ + wake_ps_, act, EvKind::WakeEnd);
      return;
    }
    start_now(act);
  }

  void start_now(int act) {
    Activity& x = acts_[z(act)];
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      r_.timeline.begin_ps[z(op)] = now_;
      memory_.allocate(op, p_.ops[z(op)], now_);
    }
    start_stage(act);
  }

  void start_stage(int act) {
    Activity& x = acts_[z(act)];
    if (x.kind == ActKind::Fixed) {
      if (x.fixed_ps > core::kMaxTimePs - now_)
        throw core::ScheduleError(fmt::format(
            "op {} ({}) starts at {:.6g} s and lasts {:.6g} s: it would end past the simulated time range (about "
            "9.2e6 s); shorten the step: smaller layer times in the profile, a smaller time_del, or faster rates",
            p_.op_label(x.a), p_.op_id(x.a), core::ps_to_seconds(now_), core::ps_to_seconds(x.fixed_ps)));
      push(now_ + x.fixed_ps, act, EvKind::FixedEnd);
    } else if (x.latency_ps > 0) {
      push(now_ + x.latency_ps, act, EvKind::LatencyEnd);
    } else {
      activate(act);
    }
  }

  void activate(int act) {
    acts_[z(act)].active = true;
    active_.push_back(act);
    dirty_ = true;
  }

  void handle(const Event& e) {
    Activity& x = acts_[z(e.act)];
    switch (e.kind) {
      case EvKind::FixedEnd:
        stage_end(e.act);
        break;
      case EvKind::LatencyEnd:
        activate(e.act);
        break;
      case EvKind::WakeEnd:
        start_now(e.act);
        break;
      case EvKind::FlowEnd:
        if (!x.active || x.version != e.version) return;  // superseded by a rate change
        x.active = false;
        active_.erase(std::find(active_.begin(), active_.end(), e.act));
        dirty_ = true;
        stage_end(e.act);
        break;
    }
  }

  // The running stage of `act` is done: count its bytes, give back the copy engine after the DMA stage,
  // then start the next stage or end the activity.
  void stage_end(int act) {
    Activity& x = acts_[z(act)];
    if (x.kind == ActKind::Flow) {
      if (watch_.links_checked) watch_.stage_ended(x, cap_);
      for (std::size_t i = 0; i < x.path.size(); ++i) {
        const int l = x.path[i];
        const LinkKind k = r_.graph.links[z(l)].kind;
        if (k != LinkKind::CpuCores && k != LinkKind::ComputeUnits)
          r_.link_stats[z(l)].bytes += std::llround(x.volume * coef_of(x, i));
      }
    }
    if (x.stage == x.engine_stage && x.engine >= 0) {
      give_back_engine(x.engine);
      x.engine = -1;
    }
    if (x.later.empty()) {
      end(act);
      return;
    }
    static_cast<Stage&>(x) = x.later.front();
    x.later.erase(x.later.begin());
    ++x.stage;
    x.remaining = x.volume;
    x.rate = -1;
    ++x.version;
    start_stage(act);
  }

  // A copy-engine slot is free again; start_pending gives it to the engine's queue.
  void give_back_engine(int e) {
    --engines_[z(e)].in_use;
    if (!engines_[z(e)].waiting.empty()) freed_engines_.push_back(e);
  }

  void end(int act) {
    Activity& x = acts_[z(act)];
    serial_running_ = false;
    if (x.engine >= 0) give_back_engine(x.engine);
    if (x.ledger_bytes > 0) {
      r_.class_bytes[static_cast<int>(x.cls)] += x.ledger_bytes;
      r_.tensor_bytes[static_cast<int>(x.tensor)] += x.ledger_bytes;
    }
    if (x.return_ledger_bytes > 0) {
      r_.class_bytes[static_cast<int>(TransferClass::PcieH2D)] += x.return_ledger_bytes;
      r_.tensor_bytes[static_cast<int>(x.tensor)] += x.return_ledger_bytes;
    }
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      r_.timeline.end_ps[z(op)] = now_;
      r_.timeline.duration_ps[z(op)] = now_ - r_.timeline.begin_ps[z(op)];
      ++r_.timeline.events_processed;
      memory_.release(p_.ops[z(op)], now_);
    }
    for (int op : {x.a, x.b}) {
      if (op < 0) continue;
      for (const int s : graph_.successors(op))
        if (--pending_[z(s)] == 0) became_ready(s);
    }
  }

  // ---- fluid flows ----
  void advance(TimePs t) {
    const TimePs dt = t - now_;
    const double dts = static_cast<double>(dt);
    for (int a : active_) {
      Activity& x = acts_[z(a)];
      if (!std::isfinite(x.rate)) continue;
      x.remaining -= x.rate * dts / kPs;
      if (watch_.links_checked) watch_.flow_moved(x, dts, cap_);
    }
    for (const std::size_t l : loaded_) {
      if (load_[l] > 0) r_.link_stats[l].busy_ps += dt;
    }
    now_ = t;
  }

  // The running flows' max-min fair rates (FairShareSolver); a flow whose rate changed gets a new end event (the
  // old one is superseded by its version), and the links' loads (and, when recorded, bandwidth samples) follow.
  void recompute() {
    dirty_ = false;
    // the running flows, as the solver sees them (spans into the activities, which never move)
    flows_.clear();
    for (const int a : active_) {
      const Activity& x = acts_[z(a)];
      flows_.push_back(FairFlow{{x.path.begin(), x.path.size()}, {x.coef.begin(), x.coef.size()}, x.cap});
    }
    const std::vector<double>& rate = solver_.rates(cap_, flows_, opt_.contention);
    for (const std::size_t l : loaded_) load_[l] = 0.0;
    loaded_.clear();
    for (std::size_t f = 0; f < active_.size(); ++f) {
      const int a = active_[f];
      Activity& x = acts_[z(a)];
      if (rate[f] != x.rate) {
        x.rate = rate[f];
        ++x.version;
        TimePs fin = now_;
        if (std::isfinite(x.rate) && x.remaining > 0) {
          const double ps = std::ceil(x.remaining * kPs / x.rate);
          if (!(ps < static_cast<double>(core::kMaxTimePs - now_)) && p_.ops[z(x.a)].kind == OpKind::Update)
            throw core::ScheduleError(fmt::format(
                "op {} ({}) needs {:.6g} core-seconds of optimizer work: it would end past the simulated time range "
                "(about 9.2e6 s); raise the CPU Adam rate (cpu_adam) or shrink the model",
                p_.op_label(x.a), p_.op_id(x.a), x.remaining));
          if (!(ps < static_cast<double>(core::kMaxTimePs - now_)))
            throw core::ScheduleError(fmt::format(
                "op {} ({}) still has {} to move at {}: it would end past the simulated time range (about 9.2e6 s, "
                "106 days); raise the bandwidth of its links (the topology's link, uplink, nvlink, inter_socket, "
                "host_memcpy; bw_p2p under the reference keys) or shorten the step (a smaller minibatch or model)",
                p_.op_label(x.a), p_.op_id(x.a), core::format_bytes(static_cast<Bytes>(x.remaining)),
                core::format_bandwidth(x.rate)));
          fin = now_ + static_cast<TimePs>(ps);
        }
        push(fin, a, EvKind::FlowEnd, x.version);
      }
      if (std::isfinite(x.rate)) {
        for (std::size_t i = 0; i < x.path.size(); ++i) {
          const std::size_t l = z(x.path[i]);
          const double v = x.rate * coef_of(x, i);
          if (v > 0 && load_[l] == 0.0) loaded_.push_back(l);  // listed once: rates are never negative
          load_[l] += v;
        }
      }
    }
    if (opt_.record_counters) {
      for (std::size_t l = 0; l < load_.size(); ++l) {
        if (load_[l] != last_sample_[l]) {
          r_.bandwidth_samples.push_back(BandwidthSample{now_, static_cast<int>(l), load_[l]});
          last_sample_[l] = load_[l];
        }
      }
    }
  }

  // ---- results ----
  void finish() {
    auto& t = r_.timeline;
    const std::size_t n = p_.ops.size();
    if (t.events_processed < n) mark_deadlock(p_, t, true);
    memory_.move_into(r_);
    const bool staged = topo_.p2p == core::P2PMode::Host;
    r_.host = host_account(p_, m_, staged);
    r_.host.capacity_bytes = topo_.host_memory_bytes;
    r_.host.pinned_limit_bytes = topo_.pinned_limit_bytes;
    r_.host.nvme_capacity_bytes = topo_.nvme.capacity_bytes;
    std::string reason;
    if (r_.overflow.op >= 0) reason = native_detail::overflow_reason(p_, r_.overflow);
    if (opt_.capacities) {
      for (const std::string& s : host_limit_reasons(r_.host, topo_)) reason += (reason.empty() ? "" : "; ") + s;
    }
    r_.feasible = reason.empty();
    r_.infeasible_reason = std::move(reason);
  }

  const Program& p_;
  const core::Model& m_;
  NativeOptions opt_;
  core::Topology topo_;
  NativeResult r_;
  std::vector<double> cap_;  // per link of r_.graph, what the engine divides (infinite: not shared)
  ActivityBuilder builder_;
  MemoryTimeline memory_;
  core::ProgramGraph graph_;
  TimePs now_ = 0;
  std::vector<Activity> built_;  // lower_bound(true): per op, the activity its walk built (taken by make_activity)
  CutoffWatch watch_;            // lower_bound(true) fills it; run_until's cutoff checks
  std::uint64_t seq_ = 0;
  bool dirty_ = false;
  std::vector<double> load_;
  std::vector<std::size_t> loaded_;  // the links whose load_ may be non-zero (advance and recompute visit only them)
  FairShareSolver solver_;
  std::vector<FairFlow> flows_;  // recompute's view of the running flows for solver_ (reused across calls)
  std::vector<double> last_sample_;
  std::vector<CopyEngine> engines_;
  std::vector<int> freed_engines_;  // engines with a queue that gave back a slot since start_pending last ran
  std::vector<int> pending_;
  std::vector<Activity> acts_;
  std::vector<int> active_;
  std::vector<int> to_start_;
  TimePs wake_ps_ = 0;           // compute.wake on the host-core pool (0: none)
  std::deque<int> serial_wait_;  // NativeOptions::serial: ready activities not yet begun
  bool serial_running_ = false;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
};

}  // namespace
NativeResult run_native(const Program& program, const core::Model& model, const core::MachineSpec& machine,
                        const NativeOptions& options) {
  return FlowEngine(program, model, machine, options).run();
}

TimePs native_lower_bound_ps(const Program& program, const core::Model& model, const core::MachineSpec& machine,
                             const NativeOptions& options) {
  return FlowEngine(program, model, machine, options).lower_bound();
}

std::optional<NativeResult> run_native_within(const Program& program, const core::Model& model,
                                              const core::MachineSpec& machine, const NativeOptions& options,
                                              TimePs cutoff_ps) {
  FlowEngine engine(program, model, machine, options);
  if (engine.lower_bound(true, cutoff_ps) > cutoff_ps) return std::nullopt;
  return engine.run_until(cutoff_ps);
}

}  // namespace harmony::sim
