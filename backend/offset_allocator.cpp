// Best-fit carving of a capped block by offsets with coalescing frees (offset_allocator.hpp): the policy both
// device arenas share, so the CPU device's fragmentation is the CUDA device's.
#include "backend/offset_allocator.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

namespace harmony::backend {

OffsetAllocator::OffsetAllocator(std::string device_name, Bytes capacity, Bytes granularity)
    : device_name_(std::move(device_name)), granularity_(granularity) {
  if (granularity_ <= 0)
    throw DeviceError(fmt::format("{}: allocation granularity must be positive, got {}", device_name_, granularity));
  if (capacity < 0) throw DeviceError(fmt::format("{}: negative memory capacity {}", device_name_, capacity));
  capacity_ = capacity / granularity_ * granularity_;
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

Bytes OffsetAllocator::largest_free_locked() const {
  Bytes best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

OffsetAllocator::Allocation OffsetAllocator::allocate(Bytes bytes, std::string_view label) {
  if (bytes < 0) throw DeviceError(fmt::format("{}: allocation of negative size {}", device_name_, bytes));
  if (bytes == 0) return {};
  const Bytes rounded = (bytes + granularity_ - 1) / granularity_ * granularity_;
  std::lock_guard lock(mu_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= rounded && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) throw OutOfMemory(device_name_, label, rounded, in_use_, capacity_, largest_free_locked());
  const Bytes off = best->first;
  const Bytes size = best->second;
  free_.erase(best);
  if (size > rounded) free_.emplace(off + rounded, size - rounded);
  used_.emplace(off, Used{rounded, bytes});
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return {off, rounded};
}

Bytes OffsetAllocator::release(Bytes offset) noexcept {
  std::lock_guard lock(mu_);
  auto it = used_.find(offset);
  if (it == used_.end()) return -1;
  const Bytes freed = it->second.rounded;
  used_.erase(it);
  in_use_ -= freed;
  Bytes size = freed;
  Bytes start = offset;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + freed) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(start, size);
  return freed;
}

bool OffsetAllocator::contains(Bytes offset, Bytes bytes) const {
  if (offset < 0 || bytes < 0 || offset >= capacity_) return false;
  std::lock_guard lock(mu_);
  auto it = used_.upper_bound(offset);
  if (it == used_.begin()) return false;
  --it;
  return offset + bytes <= it->first + it->second.requested;
}

Bytes OffsetAllocator::allocation_bytes(Bytes offset) const {
  std::lock_guard lock(mu_);
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second.rounded;
}

MemoryStats OffsetAllocator::stats() const {
  std::lock_guard lock(mu_);
  return {capacity_, in_use_, peak_, largest_free_locked(), static_cast<std::int64_t>(used_.size())};
}

void OffsetAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  peak_ = in_use_;
}

}  // namespace harmony::backend
