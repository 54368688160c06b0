// The Harmony interpreter's class (Harmony-PP / Harmony-DP Programs, core::lower_harmony), private to
// harmony_interpreter.cpp: its host channels and the step's lifecycle; every op is FlowInterpreter's.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_interpreter.hpp"
#include "backend/model/describe.hpp"
#include "core/program/dataflow.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail::harmony_impl {

// Host channels (per boundary layer, the whole minibatch; who writes which samples is resolved when the executor is
// built: FlowVersions::sample_reads).
enum class HC : std::uint8_t { YSwap, YMsg, Stash, StashMsg, DXSwap };
inline const char* hc_name(HC k) {
  constexpr const char* n[] = {"host Y", "host Y msg", "host stash", "host stash msg", "host dX"};
  return n[static_cast<int>(k)];
}

struct HostChan {
  HostBuffer data;       // the whole minibatch; kept across steps (pinned where the devices pin)
  MeteredBytes metered;  // on the host meter (stash or activations)
};
// The Program's host tensors (core/program/dataflow.hpp) as the interpreter keeps them: a host channel (Harmony's
// host tensors: device -1). Its device tensors are versions in the shared FlowStore.
HC host_chan(core::FlowKind k);

class HarmonyInterpreter final : public FlowInterpreter {
 public:
  HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o);

  std::map<std::pair<HC, int>, HostChan> host;  // per channel and boundary layer

  const core::FlowTensor& tensor(int id) const { return p.dataflow.tensor(id); }
  // The host channel op o reads (or writes), as the dataflow names it; nullptr when none. A message between tasks
  // of one rank (core::lower_harmony gives its MSGsX / MSGY no bytes: the backward task reads the stash or activation
  // where its own process put it) needs no copy: the dataflow names the channel it copies from on both sides.
  const core::FlowTensor* host_in(int o) const;
  const core::FlowTensor* host_out(int o) const;

  // The host channels op o reads or writes (layer of the boundary).
  std::vector<std::pair<HC, int>> chans_of(int o) const;
  // On the host meter as harmony-sim's host account has them: the stashes swapped out (stash), the rest (activations
  // swapped out, the copies messages make) as activations.
  static HostUse chan_use(HC c) { return c == HC::Stash ? HostUse::Stash : HostUse::Activations; }
  std::set<std::pair<HC, int>> all_chans() const;
  Bytes chan_bytes(int l) const { return Bytes(B) * per_sample(l); }
  Bytes host_bytes() const override;
  void allocate_host() override;

  // Samples [first, first + n) of an op's microbatch (its dataflow's).
  std::pair<int, int> samples(int o) const { return {flow(o).s0, flow(o).n}; }

  // ---- device tensors (versions in `store`) ----
  // The dataflow id of a device tensor of op o's device: kind, layer and samples; a task's weights or gradient (W,
  // DW: the pack's first layer and op o's task).
  int tid(int o, core::FlowKind k, int l, int s0, int n) const;
  int task_tid(int o, core::FlowKind k) const;
  std::string tname(const core::FlowTensor& t) const;

  // ---- host channels ----
  HostChan& chan(HC c, int l);
  // Sample s0 of host channel (c, l).
  std::byte* chan_at(HC c, int l, int s0);
  // The moves' host side (FlowInterpreter::run_move): the host channel of the tensor, at its samples.
  const void* host_src(int o, int id) override;
  void* host_dst(int o, int id, Bytes bytes) override;

  // The versions (FlowInterpreter::versions, store) are the device tensors'; the host channels' reads are resolved per
  // sample by the same analysis (FlowVersions::sample_reads), their memory one buffer per channel. A version is freed
  // once its last reader has run, so a device holds what the Program's allocs/frees say it holds (docs/backend.md,
  // "Executor memory").

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override;

  double end_step() override;
};

}  // namespace harmony::backend::detail::harmony_impl
