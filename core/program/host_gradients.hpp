// The one rule for a Program's host weight gradients and host updates, read by harmony-sim and harmony-run's executor
// alike: which dWBs write each layer range's host gradient, which of them copy straight into it, which add to it
// through a pinned bounce buffer, and which (another replica's copy of an all-reduced sum) land there and are dropped;
// how large one chunk of that bounce is; and which Update of a range updates its host masters.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/program/program.hpp"

namespace harmony::core {

using LayerSpan = std::pair<int, int>;  // an op's layers, first and last

// What a dWB does with the host gradient of its layer range.
enum class GradWrite : std::uint8_t {
  None,  // not a dWB
  Copy,  // the range's first writer (per rank, for a sharded range): copies straight into the host gradient
  Add,   // a later writer: lands in its queue's bounce buffer, the CPU adds it into the host gradient
  Drop,  // a replica of an all-reduced range other than the lowest, or a round trip of a gradient a device update
         // reads on the device (host-stream): lands in its bounce buffer, unused
};

struct HostGradients {
  std::map<LayerSpan, std::vector<int>> dwbs;     // per range: every dWB, in (device, queue position) order
  std::map<LayerSpan, std::vector<int>> writers;  // per range: the dWBs that write it, in that order
  std::set<LayerSpan> replicated;                 // ranges all-reduced on the devices (ARD)
  std::set<LayerSpan> sharded;                    // ranges reduce-scattered (RS): each rank writes its own shard
  std::vector<GradWrite> write;                   // per op
};

// A range all-reduced on the devices is written by its lowest replica's dWBs (the others carry the same sum); a
// sharded range's ranks each write their own shard; any other range by every dWB. A Program that updates on the GPUs
// without resident state (host-stream): a dWB after an Update (its dependency) moves no gradient (None, in no list),
// and one that keeps the gradient it reads on the device is a round trip (Drop). The first writer (per rank, sharded)
// copies, the later ones add, in (device, queue position) order.
HostGradients host_gradients(const Program& program);

// The elements of one bounce-buffer chunk of a gradient of `gradient_elements` elements of `element_bytes` each: as
// many whole elements as `chunk_bytes` holds (at least one), at most the gradient's. The bounce holds them widened to
// fp32 (4 bytes each), whatever the gradient's element size.
std::int64_t bounce_chunk_elements(std::int64_t gradient_elements, Bytes element_bytes,
                                   Bytes chunk_bytes = kStagingChunkBytes);

// Per op: 1 for the Update that steps its layer range's host masters, 0 for every other op. A layer range has one
// host master, however many replicas update it: of several Updates of one range (Harmony-DP's and dp-swap's replicas,
// each with its own Update of the all-reduced gradient), the lowest device's (the first in op order among equals) is
// the owner, and the others step nothing. harmony-run's executor runs AdamW for the owner alone; harmony-sim's native
// engine prices the others as free (before session 23 it priced each replica's update on the shared CPU, N times the
// work the executor does). An Update over device state (resident, host-stream) is per device and is not decided here:
// its callers read the flag for host updates only.
std::vector<char> update_owners(const Program& program);

// The same rule before lowering, per task of `graph`: 1 for the UPD task whose lowered Update owns its range (of the
// UPD tasks of `ranks`, core::lowered_ranks, the lowest rank's per layer range; a Harmony Program's Update of task t
// runs on device t.rank). The search's task bound counts those updates alone (sim::native_task_bound_ps).
std::vector<char> update_task_owners(const TaskGraph& graph, const std::vector<int>& ranks);

}  // namespace harmony::core
