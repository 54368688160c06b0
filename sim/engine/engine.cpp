// make_engine (the engine of a cost model kind) and the capacity verdict every engine's report carries.
#include "sim/engine/engine.hpp"

#include <fmt/format.h>

#include "sim/engine/cost_native.hpp"
#include "sim/engine/cost_reference.hpp"

namespace harmony::sim {

std::unique_ptr<Engine> make_engine(core::CostModelKind kind, const core::Model& model,
                                    const core::MachineSpec& machine, bool record_counters) {
  if (kind == core::CostModelKind::Native) {
    NativeOptions o;
    o.record_counters = record_counters;
    return std::make_unique<NativeEngine>(model, machine, o);
  }
  return std::make_unique<ReferenceEngine>(model, machine);
}

void apply_capacity(core::RunReport& r, core::Bytes capacity_bytes, bool demote) {
  r.gpu_capacity_bytes = capacity_bytes;
  r.fits = r.gpu_capacity_bytes <= 0 || r.peak_memory_bytes <= r.gpu_capacity_bytes;
  r.excess_bytes = r.fits ? 0 : r.peak_memory_bytes - r.gpu_capacity_bytes;
  if (demote && !r.fits && r.feasible) {
    r.feasible = false;  // never ranked above a plan that fits
    r.infeasible_reason = fmt::format("peak {} bytes exceeds the GPU memory {} bytes by {} bytes", r.peak_memory_bytes,
                                      r.gpu_capacity_bytes, r.excess_bytes);
  }
}

}  // namespace harmony::sim
