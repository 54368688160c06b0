// The Harmony interpreter's class (Harmony-PP / Harmony-DP Programs, core::lower_harmony), private to
// harmony_interpreter.cpp: its tensors' names and the step's lifecycle; every op and every tensor (its host channels
// included) is FlowInterpreter's.
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

class HarmonyInterpreter final : public FlowInterpreter {
 public:
  HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o);

  const core::FlowTensor& tensor(int id) const { return p.dataflow.tensor(id); }
  std::string tname(const core::FlowTensor& t) const;

  // The device tensors are versions in FlowInterpreter's store; so are the host channels' (ranged tensors: views of
  // one buffer per channel, their reads resolved per sample by the same analysis, FlowVersions::sample_reads). A
  // version is freed once its last reader has run, so a device holds what the Program's allocs/frees say it holds
  // (docs/backend.md, "Executor memory").

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override;

  double end_step() override;
};

}  // namespace harmony::backend::detail::harmony_impl
