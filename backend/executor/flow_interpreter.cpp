// FlowInterpreter (flow_interpreter.hpp): the issue of a group, the same for every kind.
#include "backend/executor/flow_interpreter.hpp"

#include <memory>

namespace harmony::backend::detail {

void FlowInterpreter::run(const std::vector<int>& g) {
  const std::shared_ptr<void> range = qr.range(g.front());  // NVTX on CUDA, named like the trace's op
  const bool host = program_.ops[static_cast<std::size_t>(g.front())].stream == core::Stream::Cpu;
  qr.await_preds(g, extra, host, [&](auto&& fn) { unlocked(fn); });
  qr.issue(g, times, host, [&] { run_group(g); });
}

}  // namespace harmony::backend::detail
