// The baseline interpreter's class (the swapping kinds' Programs, ExecutorDialect::Swapping: dp-swap, pp-swap,
// zero-infinity, l2l, lohan), private to baseline.cpp (construction, the step's lifecycle, its tensors' names).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor/detail.hpp"
#include "backend/executor/flow_interpreter.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/device_state.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail::baseline_impl {

// Tensors as the Program's dataflow names them (core/program/dataflow.hpp): a kind (TK), and a Key per device, kind,
// layer and samples.
using TK = core::FlowKind;
using Key = core::FlowTensor;
using core::on_host;
inline const char* tk_name(TK k) { return core::flow_kind_name(k); }

using Tensor = FlowData;  // one version of a tensor (flow_store.hpp)

// The executor's interpreter of the swapping kinds' Programs (ExecutorDialect::Swapping: dp-swap, pp-swap,
// zero-infinity, l2l, lohan): per-layer ops with pseudo task ids and no Harmony tasks. What it still keeps of its own:
// the step's lifecycle and the names of its tensors; a resident kind's W and DW are left to FlowInterpreter's
// DeviceStates. Everything else (the analysis, every op) is FlowInterpreter's.
class BaselineInterpreter final : public FlowInterpreter {
 public:
  BaselineInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o);

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override;

  double end_step() override;

 private:
  std::string tname(const Key& k) const;

  // W and DW of a resident kind live in the DeviceState, not in the store (no versions, no producers).
  static bool in_state(TK k) { return k == TK::W || k == TK::DW; }
};

}  // namespace harmony::backend::detail::baseline_impl
