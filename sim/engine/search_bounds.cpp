// The native engine's bounds for the search: Jackson's schedule, the chain bound of a lowered Program
// (native_lower_bound_ps and run_native_within's tails), the cutoff watch of a run, and the task-graph bound
// (native_task_bound_ps) the search asks before lowering.
#include "sim/engine/search_bounds.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/program/host_gradients.hpp"
#include "core/program/lower.hpp"
#include "sim/engine/simulator.hpp"
#include "sim/engine/size_index.hpp"

namespace harmony::sim {

using core::Op;
using core::OpKind;
using core::TimePs;

namespace native_detail {

namespace {
constexpr double kPs = 1e12;
using engine_detail::z;
}  // namespace

double jackson_bound(std::vector<ResourceJob>& jobs, std::vector<std::pair<double, double>>& heap) {
  std::sort(jobs.begin(), jobs.end(), [](const ResourceJob& a, const ResourceJob& b) { return a.r < b.r; });
  double best = 0.0;
  heap.clear();  // (q, remaining p), largest q on top
  std::size_t i = 0;
  double t = 0.0;
  while (i < jobs.size() || !heap.empty()) {
    if (heap.empty()) t = std::max(t, jobs[i].r);
    while (i < jobs.size() && jobs[i].r <= t) {
      heap.emplace_back(jobs[i].q, jobs[i].p);
      std::push_heap(heap.begin(), heap.end());
      ++i;
    }
    const double next = i < jobs.size() ? jobs[i].r : std::numeric_limits<double>::infinity();
    auto& top = heap.front();
    const double run = std::min(top.second, next - t);
    t += run;
    top.second -= run;
    if (top.second <= 0) {
      best = std::max(best, t + top.first);
      std::pop_heap(heap.begin(), heap.end());
      heap.pop_back();
    }
  }
  return best;
}

// ---- the cutoff watch ----

void CutoffWatch::arm(TimePs cutoff_ps, std::size_t ops) {
  cutoff = cutoff_ps >= 0 && tail.size() == ops ? cutoff_ps : -1;
  links_checked = cutoff >= 0 && !owing_links.empty() && counted_op.size() == ops;
}

void CutoffWatch::op_ready(int op, TimePs now) {
  if (cutoff >= 0 && (static_cast<double>(now) + tail[z(op)]) * (1.0 - 1e-9) > static_cast<double>(cutoff) + 1.0)
    past = true;
}

void CutoffWatch::check_links(TimePs now) {
  for (const std::size_t l : owing_links) {
    if (link_jobs_left[l] > 0 && (static_cast<double>(now) + std::max(0.0, link_owed_ps[l])) * (1.0 - 1e-9) >
                                     static_cast<double>(cutoff) + 1.0) {
      past = true;
      return;
    }
  }
}

void CutoffWatch::flow_moved(const Activity& x, double dt_ps, const std::vector<double>& capacity) {
  if (!counted_op[z(x.a)]) return;
  for (std::size_t i = 0; i < x.path.size(); ++i) {
    const std::size_t l = z(x.path[i]);
    if (std::isfinite(capacity[l])) link_owed_ps[l] -= x.rate * coef_of(x, i) * dt_ps / capacity[l];
  }
}

void CutoffWatch::stage_ended(const Activity& x, const std::vector<double>& capacity) {
  if (!counted_op[z(x.a)] || !(x.volume > 0)) return;
  for (const int l : x.path) {
    if (std::isfinite(capacity[z(l)])) --link_jobs_left[z(l)];
  }
}

// ---- the chain bound ----

ChainBound::ChainBound(const core::Program& p, const core::ProgramGraph& graph, const ActivityBuilder& builder,
                       const std::vector<double>& capacity, std::vector<int> engine_slots, const NativeOptions& opt)
    : p_(p), graph_(graph), builder_(builder), cap_(capacity), engine_slots_(std::move(engine_slots)), opt_(opt) {
  counted_.assign(z(std::max(p_.num_devices(), 1)), 0);
  for (int d : reported_devices(p_)) {
    if (d >= 0 && z(d) < counted_.size()) counted_[z(d)] = 1;
  }
}

bool ChainBound::reported(int op) const {
  const int d = p_.ops[z(op)].device;
  return d >= 0 && z(d) < counted_.size() && counted_[z(d)] != 0;
}

// visit(op, peer) for every op once its predecessors were visited, a rendezvous pair once, when its second op is
// reached (peer -1 for an op alone). Ops on a cycle (a deadlock) are never visited.
template <class F>
void ChainBound::walk_chain(F visit) const {
  const std::size_t n = p_.ops.size();
  std::vector<int> pending(n, 0);
  for (std::size_t i = 0; i < n; ++i) pending[i] = graph_.predecessor_count(static_cast<int>(i));
  std::vector<char> reached(n, 0);
  std::vector<int> stack;
  for (std::size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) stack.push_back(static_cast<int>(i));
  }
  while (!stack.empty()) {
    const int op = stack.back();
    stack.pop_back();
    reached[z(op)] = 1;
    const int peer = p_.ops[z(op)].peer;
    if (peer >= 0 && !reached[z(peer)]) continue;  // the pair starts when its second op is ready
    visit(op, peer);
    for (int o : {op, peer}) {
      if (o < 0) continue;
      for (const int s : graph_.successors(o)) {
        if (--pending[z(s)] == 0) stack.push_back(s);
      }
    }
  }
}

// The chain with every activity alone: the end of the iteration it gives (the latest end of an op of a reported
// GPU), each visit's time in `order`, and (`shared`) the jobs for the resource bounds: what each flow stage asks of
// each link it crosses, what each activity holds a copy engine for, with the chain's earliest start and the rest of
// its activity after it.
double ChainBound::price_chain(bool shared, std::vector<Activity>* built, std::vector<Visit>& order) {
  const std::size_t n = p_.ops.size();
  std::vector<double> ready(n, 0.0);  // picoseconds, the latest end of a predecessor
  const std::size_t nlinks = cap_.size();
  jobs_.resize(nlinks + engine_slots_.size());
  for (auto& v : jobs_) v.clear();
  order.reserve(n);
  double end = 0.0;
  if (built) built->assign(n, Activity{});  // the run takes them instead of building them again
  Activity scratch;
  walk_chain([&](int op, int peer) {
    Activity& x = built ? (*built)[z(op)] : scratch;
    if (!built) x = Activity{};
    builder_.build(x, op, peer);
    const double start = std::max(ready[z(op)], peer >= 0 ? ready[z(peer)] : 0.0);
    double t = 0;
    for (int k = 0; k <= static_cast<int>(x.later.size()); ++k) {
      const Stage& st = k == 0 ? static_cast<const Stage&>(x) : x.later[z(k - 1)];
      const double a = builder_.alone_ps(st);
      if (shared && st.kind == ActKind::Flow) {
        // the volume flows after the stage's latency
        const double r = start + t + static_cast<double>(st.latency_ps);
        for (std::size_t i = 0; i < st.path.size(); ++i) {
          const std::size_t l = z(st.path[i]);
          if (std::isfinite(cap_[l]) && cap_[l] > 0 && st.volume > 0)
            jobs_[l].push_back({r, st.volume * coef_of(st, i) / cap_[l] * kPs, -(t + a), op});
        }
      }
      t += a;
      if (shared && k == x.engine_stage && x.engine >= 0)
        jobs_[nlinks + z(x.engine)].push_back({start, t / static_cast<double>(engine_slots_[z(x.engine)]), -t, op});
    }
    const double fin = start + t;
    for (int o : {op, peer}) {
      if (o < 0) continue;
      if (reported(o)) end = std::max(end, fin);
      for (const int s : graph_.successors(o)) ready[z(s)] = std::max(ready[z(s)], fin);
    }
    order.push_back({op, peer, t});
  });
  return end;
}

// Per op, its tail: its visit's time, then the longest tail among its successors, or 0 when it (or its peer) is on a
// reported GPU and nothing longer follows; -inf where no reported op follows.
std::vector<double> ChainBound::chain_tails(const std::vector<Visit>& order) const {
  const double none = -std::numeric_limits<double>::infinity();
  std::vector<double> tail(p_.ops.size(), none);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    double after = none;          // the longest tail among the pair's successors
    bool ends_iteration = false;  // the pair has an op on a reported GPU
    for (int o : {it->op, it->peer}) {
      if (o < 0) continue;
      ends_iteration = ends_iteration || reported(o);
      for (const int s : graph_.successors(o)) after = std::max(after, tail[z(s)]);
    }
    const double r = std::max(ends_iteration ? 0.0 : none, after);
    for (int o : {it->op, it->peer}) {
      if (o < 0) continue;
      tail[z(o)] = it->t + r;
    }
  }
  return tail;
}

namespace {
// The engine rounds each flow's end up to a picosecond and integrates rates in floating point: a relative margin
// far below any difference a search ranks on keeps the bound below every run.
TimePs floor_bound(double end) { return static_cast<TimePs>(std::floor(end * (1.0 - 1e-9))); }
}  // namespace

// Each shared resource's Jackson schedule raises `end`. A job's q so far is minus its activity's time up to the
// job's end: its op's tail (the activity's time, then the rest of its chain) completes it; a job that nothing
// reported follows (tail -inf) does not bound the iteration. The most loaded resources first: they bind most often,
// and a bound past stop_above ends the walk.
void ChainBound::resource_bounds(double& end, TimePs stop_above, const std::vector<double>& tails, CutoffWatch* watch) {
  const double none = -std::numeric_limits<double>::infinity();
  const std::size_t nlinks = cap_.size();
  std::vector<std::pair<double, std::size_t>> by_work;
  std::vector<double> most(jobs_.size(), 0.0);  // per resource, at least its schedule's end (see below)
  for (std::size_t k = 0; k < jobs_.size(); ++k) {
    auto& v = jobs_[k];
    std::erase_if(v, [&](const ResourceJob& j) { return !(tails[z(j.op)] > none); });
    double work = 0;
    double last_r = 0;
    double most_q = 0;
    for (auto& j : v) {
      j.q += tails[z(j.op)];
      work += j.p;
      last_r = std::max(last_r, j.r);
      most_q = std::max(most_q, j.q);
    }
    // Jackson's schedule never idles while a job is released, so it ends its jobs by the last release plus all
    // the work, each followed by at most the largest q
    most[k] = last_r + work + most_q;
    if (!v.empty()) by_work.emplace_back(-work, k);
  }
  std::sort(by_work.begin(), by_work.end());
  if (watch) {
    // run_until's check: what each link still owes the counted ops (CutoffWatch::check_links)
    const std::size_t n = p_.ops.size();
    watch->link_owed_ps.assign(nlinks, 0.0);
    watch->link_jobs_left.assign(nlinks, 0);
    watch->owing_links.clear();
    watch->counted_op.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) watch->counted_op[i] = tails[i] > none ? 1 : 0;
    for (const auto& [work, k] : by_work) {
      if (k < nlinks) {
        watch->link_owed_ps[k] = -work;
        watch->link_jobs_left[k] = static_cast<int>(jobs_[k].size());
        watch->owing_links.push_back(k);
      }
    }
  }
  for (const auto& [work, k] : by_work) {
    // a resource whose schedule cannot end past the bound so far (nor past stop_above, when that is all the
    // caller asks) changes nothing: not scheduled
    if (most[k] * (1.0 - 1e-9) <= std::max(end, static_cast<double>(stop_above))) continue;
    end = std::max(end, jackson_bound(jobs_[k], jackson_heap_));
    if (stop_above >= 0 && floor_bound(end) > stop_above) break;
  }
}

TimePs ChainBound::lower_bound(TimePs stop_above, std::vector<Activity>* built, CutoffWatch* watch) {
  const bool shared = !opt_.serial && opt_.contention;
  std::vector<Visit> order;
  double end = price_chain(shared, watch ? built : nullptr, order);
  std::vector<double> tail = chain_tails(order);
  if (watch) watch->tail.swap(tail);  // the run's; read below as `tails` either way
  const std::vector<double>& tails = watch ? watch->tail : tail;
  if (!shared || (stop_above >= 0 && floor_bound(end) > stop_above)) return floor_bound(end);
  resource_bounds(end, stop_above, tails, watch);
  return floor_bound(end);
}

}  // namespace native_detail

using native_detail::z;

TimePs native_task_bound_ps(const core::TaskGraph& graph, const std::vector<int>& ranks, const core::Model& model,
                            const core::MachineSpec& machine, const NativeOptions& options) {
  // set_compute_stage's price: a compute op alone takes at least its scaled profiled time (a fixed stage of that
  // time, or a flow of units_per_op x s work on the shared pool capped at units_per_op)
  const double scale = native_detail::compute_time_scale(machine, options);
  const core::ComputeChain chain =
      core::compute_chain(graph, ranks, [&](const Op& o) { return profiled_compute_s(o, model) * scale * 1e12; });
  double end = chain.end_ps;
  // The CPU updates, when they share one pool (the CPU cores, or compute.host_cores' units) of finite capacity:
  // the Update op of an UPD task waits for its BWD task's gradients (the dW swap-out after the last BWD), and with
  // the whole pool takes update_s x update_time_scale (an update alone uses every core or unit; its DRAM traffic
  // and NVMe stages only add). As jobs on the pool (q = 0: the update's end counts), no run beats their Jackson
  // schedule, nor each rank's updates in its CPU queue's order (the task order) one after another. A range several
  // replicas update is one job, its owner's (the native engine prices the others' Updates as free).
  const bool finite = native_detail::on_host_pool(machine, options)
                          ? machine.compute.units > 0
                          : !machine.topology.valid() || machine.topology.cpu_cores > 0;
  if (options.contention && !options.serial && !options.reference_bandwidths && finite) {
    std::vector<native_detail::ResourceJob> jobs;
    std::vector<double> queue_free(graph.rank_tasks.size(), 0.0);
    // one update per layer range: the replicas of a range (Harmony-DP) step one host master, by the lowest rank's UPD
    // (core::update_task_owners, the task graph's view of core::update_owners); the others cost nothing
    const std::vector<char> owner = core::update_task_owners(graph, ranks);
    Op u;
    u.kind = OpKind::Update;
    for (std::size_t i = 0; i < graph.tasks.size(); ++i) {
      if (owner[i] == 0) continue;
      const core::Task& t = graph.tasks[i];
      u.layers = t.layers;
      const double p = native_detail::update_work_s(u, model, machine) * 1e12;
      const double r = chain.task_end_ps[z(t.updates_task)];
      if (p <= 0) continue;
      jobs.push_back({r, p, 0.0, t.idx});
      double& free = queue_free[z(t.rank)];
      free = std::max(free, r) + p;
      end = std::max(end, free);
    }
    std::vector<std::pair<double, double>> heap;
    if (!jobs.empty()) end = std::max(end, native_detail::jackson_bound(jobs, heap));
  }
  return chain.bound_ps(end);
}

}  // namespace harmony::sim
