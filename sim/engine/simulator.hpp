// The discrete-event engine: runs a Program with op durations from a cost model. An op starts when
// its dependencies and its stream predecessor have ended; same-time completions are handled in a
// fixed (time, sequence) order. When ops remain that can never start, it reports a deadlock.
#pragma once

#include <string>
#include <vector>

#include "core/base/cost_model_kind.hpp"
#include "core/output/report.hpp"
#include "core/program/program.hpp"

namespace harmony::sim {

struct BlockedOp {
  int op = 0;
  std::vector<int> waiting_for;  // unfinished dependencies (and the stream predecessor)
};

struct Timeline {
  std::vector<core::TimePs> begin_ps;  // per op; -1 if never started
  std::vector<core::TimePs> end_ps;
  std::vector<core::TimePs> duration_ps;
  bool deadlock = false;
  std::vector<BlockedOp> blocked;  // head op of every stuck stream
  std::size_t events_processed = 0;
};

// Runs the program. Never throws for a deadlock: the Timeline says so.
Timeline run_timeline(const core::Program& program, std::vector<core::TimePs> durations);

// Some ops never started: sets t.deadlock and lists the head of every stuck queue with its unfinished
// dependencies (with `rendezvous`, also its P2P peer when that has not started: the native engine's pairs).
void mark_deadlock(const core::Program& program, Timeline& t, bool rendezvous);

// "GPU1 P2PIn: t5 dY L13 mb0 u8 waits for t7 dX L14 mb0 u8 (GPU0 P2POut, not started)\n..."
std::string deadlock_report(const core::Program& program, const Timeline& t);

// The GPUs whose end times make the iteration's time (make_report; the native lower bound): every GPU under the
// Harmony-PP rules (the reference's simulator reports an idle one as ending at 1e-10 s), else the Program's
// devices (Harmony-DP under the reference simulates one replica, GPU 0).
std::vector<int> reported_devices(const core::Program& program);

// Timeline + per-GPU peak memory (indexed by GPU id) -> RunReport (the reference's result fields), for `kind`.
core::RunReport make_report(const core::Program& program, const Timeline& t, core::CostModelKind kind,
                            const std::vector<core::Bytes>& peak_bytes);

}  // namespace harmony::sim
