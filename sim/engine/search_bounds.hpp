// The native engine's bounds for the search's branch and bound: Jackson's preemptive schedule on one resource, the
// chain bound of a Program (every activity priced alone, plus each shared link's and copy engine's schedule), and
// the cutoff watch run_native_within keeps while it runs (docs/native-model.md "Bounds"). Private to sim/engine.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "core/program/program.hpp"
#include "core/program/program_graph.hpp"
#include "sim/engine/activities.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim::native_detail {

// A job on one shared resource (a link, a copy engine) for the resource bounds: its work in ps at the resource's
// full capacity, the earliest time it can start, and q, the time after its work ends that the iteration still
// needs at least (the activity's later stages; the op's chain rest is added once known).
struct ResourceJob {
  double r, p, q;
  int op;
};

// The iteration's lower bound from one resource alone: its jobs, released at r, each followed by q, on one
// machine that may switch jobs at any time (a fluid share is such a schedule) end no earlier than Jackson's
// preemptive schedule (largest q first), which is optimal for that relaxation (Horn 1974). Sorts `jobs` by r;
// `heap` is a working buffer.
double jackson_bound(std::vector<ResourceJob>& jobs, std::vector<std::pair<double, double>>& heap);

// What ChainBound leaves for a run with a cutoff (run_until), and that run's checks: an op ready too late for its
// tail, a link still owing more counted work than the time left.
struct CutoffWatch {
  std::vector<double> tail;  // per op, ps from its ready time to the iteration's end, at least (-inf: no reported op)
  std::vector<double> link_owed_ps;      // per link, the counted work not yet moved
  std::vector<int> link_jobs_left;       // per link, the counted flow stages over it not yet ended
  std::vector<std::size_t> owing_links;  // the links with such work, most first
  std::vector<char> counted_op;          // per op, 1 when a reported op follows it (or it is one)
  core::TimePs cutoff = -1;              // the run's (-1: none)
  bool links_checked = false;            // the run checks the links (check_links)
  bool past = false;                     // the iteration cannot end by the cutoff

  // The run starts with `cutoff` (-1: none) over a Program of `ops` ops; without the bound's tails, no cutoff.
  void arm(core::TimePs cutoff_ps, std::size_t ops);
  // Op `op` became ready at `now`: past when its tail carries the iteration beyond the cutoff. The bound's relative
  // margin and a picosecond keep a tie (an iteration ending exactly at the cutoff) running.
  void op_ready(int op, core::TimePs now);
  // While one of the counted flows over a link has not ended, the iteration cannot end before now plus what the
  // link still owes them at its full capacity. Where contention has delayed that work (a link idle while its flows
  // waited elsewhere), this shows it when it happens, not when the delayed ops become ready.
  void check_links(core::TimePs now);
  // The flow stage of `x` moved at its rate for `dt_ps` (links_checked only).
  void flow_moved(const Activity& x, double dt_ps, const std::vector<double>& capacity);
  // The flow stage of `x` ended (links_checked only).
  void stage_ended(const Activity& x, const std::vector<double>& capacity);
};

// A time the iteration cannot beat (native_lower_bound_ps): the longest chain of dependencies, queue order and
// rendezvous pairs with every activity priced alone, and, with contention, each shared link's and copy engine's
// Jackson schedule of the chain's jobs on it.
class ChainBound {
 public:
  // `capacity`: per link (infinite: not shared); `engine_slots`: per copy engine, its slots.
  ChainBound(const core::Program& p, const core::ProgramGraph& graph, const ActivityBuilder& builder,
             const std::vector<double>& capacity, std::vector<int> engine_slots, const NativeOptions& opt);

  // A running flow's max-min fair rate never exceeds its rate alone (its own cap and each link's capacity over its
  // coefficient), copy-engine waits and hand-offs only add, so no op ends before the chain's bound on it. Ops never
  // reached (a deadlock) do not count.
  //
  // `built` (with `watch`): per op, the activity the walk built, for the run to take. `watch`: also each op's tail
  // (the time from its becoming ready to the end of the iteration that the same pricing cannot beat: its own
  // activity alone, then its longest chain of successors to an op of a reported GPU; -inf where no such op follows)
  // and what each link owes the counted ops, for run_until's checks.
  //
  // stop_above (>= 0): a bound found above it is returned at once (the search only asks whether it is).
  core::TimePs lower_bound(core::TimePs stop_above, std::vector<Activity>* built, CutoffWatch* watch);

 private:
  struct Visit {
    int op, peer;
    double t;
  };
  template <class F>
  void walk_chain(F visit) const;
  bool reported(int op) const;
  double price_chain(bool shared, std::vector<Activity>* built, std::vector<Visit>& order);
  std::vector<double> chain_tails(const std::vector<Visit>& order) const;
  void resource_bounds(double& end, core::TimePs stop_above, const std::vector<double>& tails, CutoffWatch* watch);

  const core::Program& p_;
  const core::ProgramGraph& graph_;
  const ActivityBuilder& builder_;
  const std::vector<double>& cap_;
  std::vector<int> engine_slots_;  // per copy engine, its slots
  NativeOptions opt_;
  std::vector<char> counted_;                   // per device, 1 when the report counts its end (reported_devices)
  std::vector<std::vector<ResourceJob>> jobs_;  // per resource (links, then copy engines)
  std::vector<std::pair<double, double>> jackson_heap_;
};

}  // namespace harmony::sim::native_detail
