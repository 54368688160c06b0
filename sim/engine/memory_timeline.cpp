// The native engine's device memory timeline: bytes in use per GPU as ops begin (allocations) and end (frees),
// peaks, the first overflow of a GPU's memory, anomalies, and the samples of the Chrome trace's memory counters.
#include "sim/engine/memory_timeline.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace harmony::sim::native_detail {

using core::Bytes;

MemoryTimeline::MemoryTimeline(std::size_t devices, std::size_t reported, Bytes capacity_bytes, bool check_capacity,
                               bool record_samples)
    : in_use_(devices, 0),
      peak_bytes_(reported, 0),
      capacity_bytes_(capacity_bytes),
      check_capacity_(check_capacity),
      record_samples_(record_samples) {}

void MemoryTimeline::sample(int device, core::TimePs now) {
  if (record_samples_) samples_.push_back(MemorySample{now, device, in_use_[static_cast<std::size_t>(device)]});
}

void MemoryTimeline::allocate(int op, const core::Op& o, core::TimePs now) {
  Bytes b = o.workspace_bytes;
  for (const auto& t : o.allocs) b += t.bytes;
  if (b == 0) return;
  const auto d = static_cast<std::size_t>(o.device);
  in_use_[d] += b;
  if (d < peak_bytes_.size()) peak_bytes_[d] = std::max(peak_bytes_[d], in_use_[d]);
  sample(o.device, now);
  if (check_capacity_ && in_use_[d] > capacity_bytes_) {
    ++overflow_count_;
    if (overflow_.op < 0)
      overflow_ = MemoryOverflow{op, o.device, in_use_[d] - capacity_bytes_, in_use_[d], capacity_bytes_, now};
  }
}

void MemoryTimeline::release(const core::Op& o, core::TimePs now) {
  Bytes b = o.workspace_bytes;
  for (const auto& t : o.frees) b += t.bytes;
  if (b == 0) return;
  const auto d = static_cast<std::size_t>(o.device);
  if (b > in_use_[d]) {
    ++anomalies_;
    in_use_[d] = 0;
  } else {
    in_use_[d] -= b;
  }
  sample(o.device, now);
}

void MemoryTimeline::move_into(NativeResult& r) {
  r.peak_bytes = std::move(peak_bytes_);
  r.overflow = overflow_;
  r.overflow_count = overflow_count_;
  r.memory_anomalies = anomalies_;
  r.memory_samples = std::move(samples_);
}

std::string overflow_reason(const core::Program& p, const MemoryOverflow& o) {
  return fmt::format("GPU{} memory exceeded at op {} ({}): {} in use > capacity {} by {} bytes", o.device,
                     p.op_id(o.op), p.op_label(o.op), core::format_bytes(o.in_use_bytes),
                     core::format_bytes(o.capacity_bytes), o.bytes_over);
}

}  // namespace harmony::sim::native_detail
