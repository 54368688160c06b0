// The native engine's device memory timeline: per GPU, the bytes in use as ops allocate when they begin and free
// when they end, its peak, the first op that overflows the GPU's memory, frees larger than what is in use, and
// (when recorded) a sample at every change. Private to sim/engine.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim::native_detail {

class MemoryTimeline {
 public:
  // `devices`: the GPUs tracked; `reported`: the GPUs whose peak is kept (NativeResult::peak_bytes);
  // `capacity_bytes`: each GPU's memory, checked when `check_capacity`; `record_samples`: keep MemorySamples.
  MemoryTimeline(std::size_t devices, std::size_t reported, core::Bytes capacity_bytes, bool check_capacity,
                 bool record_samples);

  // Op `op` (`o`) begins on its GPU at `now`: its workspace and allocations come into use.
  void allocate(int op, const core::Op& o, core::TimePs now);
  // Op `o` ends at `now`: its workspace and frees go (a free past what is in use counts as an anomaly, clamped to 0).
  void release(const core::Op& o, core::TimePs now);

  const MemoryOverflow& overflow() const { return overflow_; }
  // Moves the peaks, the overflow, the counts and the samples into `r`.
  void move_into(NativeResult& r);

 private:
  void sample(int device, core::TimePs now);

  std::vector<core::Bytes> in_use_;  // per GPU
  std::vector<core::Bytes> peak_bytes_;
  core::Bytes capacity_bytes_ = 0;
  bool check_capacity_ = true;
  bool record_samples_ = false;
  MemoryOverflow overflow_;
  std::size_t overflow_count_ = 0;
  std::size_t anomalies_ = 0;
  std::vector<MemorySample> samples_;
};

// The infeasible reason of a GPU memory overflow: "GPU<d> memory exceeded at op <id> (<label>): ...".
std::string overflow_reason(const core::Program& p, const MemoryOverflow& o);

}  // namespace harmony::sim::native_detail
