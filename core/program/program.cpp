// Program naming (reference ids, trace labels) and structural validation: dependency and peer consistency,
// and acyclicity of dependencies plus queue order (over the ProgramGraph).
#include "core/program/program.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::core {

const char* stream_name(Stream s) {
  static const char* const names[] = {"SwapIn", "P2PIn", "Compute", "P2POut", "SwapOut", "CPU"};
  return names[static_cast<int>(s)];
}

const char* op_kind_name(OpKind k) {
  static const char* const names[] = {"WB", "X",  "sX",  "dY",    "FWD",  "REC",    "BWD", "ARD", "DEL",
                                      "Y",  "dX", "dWB", "MSGsX", "MSGY", "Update", "AG",  "RS"};
  return names[static_cast<int>(k)];
}

bool is_compute(OpKind k) { return k == OpKind::FWD || k == OpKind::REC || k == OpKind::BWD; }

bool is_transfer(OpKind k) {
  switch (k) {
    case OpKind::WB:
    case OpKind::X:
    case OpKind::sX:
    case OpKind::dY:
    case OpKind::Y:
    case OpKind::dX:
    case OpKind::dWB:
    case OpKind::MSGsX:
    case OpKind::MSGY:
    case OpKind::AG:
    case OpKind::RS:
      return true;
    default:
      return false;
  }
}

const char* tensor_kind_name(TensorKind k) {
  static const char* const names[] = {"weights",  "weight_grad", "optimizer_state", "activation", "stash",
                                      "act_grad", "saved"};
  return names[static_cast<int>(k)];
}

TensorKind moved_tensor(OpKind k) {
  switch (k) {
    case OpKind::WB:
    case OpKind::AG:
      return TensorKind::Weights;
    case OpKind::dWB:
    case OpKind::RS:
    case OpKind::ARD:
      return TensorKind::WeightGrad;
    case OpKind::sX:
    case OpKind::MSGsX:
      return TensorKind::Stash;
    case OpKind::dX:
    case OpKind::dY:
      return TensorKind::ActGrad;
    default:
      return TensorKind::Activation;
  }
}

std::string Program::op_id(int op) const {
  const Op& o = ops[static_cast<std::size_t>(op)];
  return fmt::format("{}.{}.{}.{}.{}", o.task, o.ui, o.spi, stream_name(o.stream), op_kind_name(o.kind));
}

bool updates_on_device_over_host_state(const Program& p) {
  return !p.graph.plan.kind->resident_state && std::any_of(p.ops.begin(), p.ops.end(), [](const Op& op) {
    return op.kind == OpKind::Update && !host_update(op);
  });
}

std::string Program::op_label(int op) const {
  const Op& o = ops[static_cast<std::size_t>(op)];
  std::string layers = o.layers.first == o.layers.last ? fmt::format("L{}", o.layers.first)
                                                       : fmt::format("L{}-{}", o.layers.first, o.layers.last);
  if (o.ubs > 0) return fmt::format("t{} {} {} mb{} u{}", o.task, op_kind_name(o.kind), layers, o.ui, o.ubs);
  return fmt::format("t{} {} {}", o.task, op_kind_name(o.kind), layers);
}

std::vector<int> topological_order(const Program& p) {
  std::vector<int> order = ProgramGraph(p).topological_order();
  if (order.size() != p.ops.size())
    throw ScheduleError("the program has a dependency cycle (through dependencies and stream order)");
  return order;
}

void validate_program(const Program& p) {
  const int n = static_cast<int>(p.ops.size());
  for (int i = 0; i < n; ++i) {
    const Op& o = p.ops[static_cast<std::size_t>(i)];
    for (int d : o.deps) {
      if (d < 0 || d >= n || d == i)
        throw ScheduleError(fmt::format("op {} ({}) has an invalid dependency {}", p.op_id(i), p.op_label(i), d));
    }
    if (o.peer >= 0) {
      if (o.peer >= n || p.ops[static_cast<std::size_t>(o.peer)].peer != i)
        throw ScheduleError(fmt::format("op {} has a rendezvous peer that does not point back", p.op_id(i)));
    }
    if (o.queue < 0 || o.queue >= static_cast<int>(p.queues.size()) ||
        p.queues[static_cast<std::size_t>(o.queue)].ops[static_cast<std::size_t>(o.queue_pos)] != i)
      throw ScheduleError(fmt::format("op {} is not in its stream queue", p.op_id(i)));
  }
  (void)topological_order(p);
}

Bytes staging_ring_bytes(const Program& program, bool host_sums, Bytes chunk_bytes) {
  std::map<int, Bytes> largest;  // per queue
  for (const Op& op : program.ops) {
    const bool sum = op.kind == OpKind::ARD || op.kind == OpKind::RS;
    if (op.kind != OpKind::WB && op.kind != OpKind::dWB && !(sum && host_sums)) continue;
    Bytes& b = largest[op.queue];
    b = std::max(b, op.bytes);
  }
  const Bytes chunk = std::max<Bytes>(2, chunk_bytes / 2 * 2);  // whole 2-byte elements, at least one
  Bytes total = 0;
  for (const auto& [queue, bytes] : largest) total += 2 * std::min(chunk, bytes);
  return total;
}

}  // namespace harmony::core
