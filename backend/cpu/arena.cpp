// The CPU device's memory: best-fit allocation inside one capped block, coalescing on free, and NaN
// poisoning of fresh and freed memory (see arena.hpp).
#include "backend/cpu/arena.hpp"

#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

namespace harmony::backend::cpu {

Arena::Arena(std::string device_name, Bytes capacity, bool poison)
    : device_name_(std::move(device_name)), poison_(poison) {
  if (capacity < 0) throw DeviceError(fmt::format("{}: negative memory capacity {}", device_name_, capacity));
  capacity_ = capacity / kArenaAlignment * kArenaAlignment;
  if (capacity_ == 0) return;
  base_ = static_cast<std::byte*>(std::aligned_alloc(kArenaAlignment, static_cast<std::size_t>(capacity_)));
  if (base_ == nullptr)
    throw DeviceError(fmt::format("{}: cannot reserve {} of host memory for the device arena", device_name_,
                                  core::format_bytes(capacity_)));
  free_.emplace(0, capacity_);
}

Arena::~Arena() { std::free(base_); }

Bytes Arena::largest_free_locked() const {
  Bytes best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

void* Arena::allocate(Bytes bytes, std::string_view label) {
  if (bytes < 0) throw DeviceError(fmt::format("{}: allocation of negative size {}", device_name_, bytes));
  if (bytes == 0) return nullptr;
  const Bytes rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  std::unique_lock lock(mu_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= rounded && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) {
    throw OutOfMemory(device_name_, label, rounded, in_use_, capacity_, largest_free_locked());
  }
  const Bytes off = best->first;
  const Bytes size = best->second;
  free_.erase(best);
  if (size > rounded) free_.emplace(off + rounded, size - rounded);
  used_.emplace(off, rounded);
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  lock.unlock();
  std::byte* p = base_ + off;
  if (poison_) std::memset(p, kPoisonByte, static_cast<std::size_t>(rounded));
  return p;
}

void Arena::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const Bytes off = static_cast<std::byte*>(ptr) - base_;
  auto it = used_.find(off);
  if (it == used_.end()) std::abort();  // not ours or freed twice: a bug in the caller, never recoverable
  const Bytes freed = it->second;
  used_.erase(it);
  in_use_ -= freed;
  if (poison_) std::memset(base_ + off, kPoisonByte, static_cast<std::size_t>(freed));
  Bytes size = freed;
  Bytes start = off;
  auto next = free_.lower_bound(off);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == off + freed) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(start, size);
}

bool Arena::contains(const void* ptr, Bytes bytes) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  if (base_ == nullptr || p < base_ || p >= base_ + capacity_) return false;
  const Bytes off = p - base_;
  std::lock_guard lock(mu_);
  auto it = used_.upper_bound(off);
  if (it == used_.begin()) return false;
  --it;
  return off + bytes <= it->first + it->second;
}

bool Arena::in_block(const void* ptr) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  return base_ != nullptr && p >= base_ && p < base_ + capacity_;
}

MemoryStats Arena::stats() const {
  std::lock_guard lock(mu_);
  return {capacity_, in_use_, peak_, largest_free_locked(), static_cast<std::int64_t>(used_.size())};
}

void Arena::reset_peak() {
  std::lock_guard lock(mu_);
  peak_ = in_use_;
}

}  // namespace harmony::backend::cpu
