// Best-fit carving of one device block with coalescing frees (cuda_arena.hpp); the same policy and messages
// as backend/cpu/arena.cpp, on offsets only.
#include "backend/cuda/cuda_arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>

namespace harmony::backend::cuda {

CudaArena::CudaArena(std::string device_name, void* base, Bytes capacity, std::function<void(void*)> free_block)
    : device_name_(std::move(device_name)), base_(static_cast<std::byte*>(base)), free_block_(std::move(free_block)) {
  if (capacity < 0) throw DeviceError(fmt::format("{}: negative memory capacity {}", device_name_, capacity));
  if (base == nullptr && capacity > 0) throw DeviceError(fmt::format("{}: arena without memory", device_name_));
  capacity_ = capacity / kCudaArenaAlignment * kCudaArenaAlignment;
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

CudaArena::~CudaArena() {
  if (free_block_ && base_ != nullptr) free_block_(base_);
}

Bytes CudaArena::offset_of(const void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  const auto b = reinterpret_cast<std::uintptr_t>(base_);
  if (base_ == nullptr || p < b || p >= b + static_cast<std::uintptr_t>(capacity_)) return -1;
  return static_cast<Bytes>(p - b);
}

Bytes CudaArena::largest_free_locked() const {
  Bytes best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

void* CudaArena::allocate(Bytes bytes, std::string_view label) {
  if (bytes < 0) throw DeviceError(fmt::format("{}: allocation of negative size {}", device_name_, bytes));
  if (bytes == 0) return nullptr;
  const Bytes rounded = (bytes + kCudaArenaAlignment - 1) / kCudaArenaAlignment * kCudaArenaAlignment;
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
  used_.emplace(off, rounded);
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return base_ + off;  // device memory: never dereferenced here
}

void CudaArena::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const Bytes off = offset_of(ptr);
  auto it = off < 0 ? used_.end() : used_.find(off);
  if (it == used_.end()) std::abort();  // not ours or freed twice: a bug in the caller, never recoverable
  const Bytes freed = it->second;
  used_.erase(it);
  in_use_ -= freed;
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

bool CudaArena::contains(const void* ptr, Bytes bytes) const {
  const Bytes off = offset_of(ptr);
  if (off < 0 || bytes < 0) return false;
  std::lock_guard lock(mu_);
  auto it = used_.upper_bound(off);
  if (it == used_.begin()) return false;
  --it;
  return off + bytes <= it->first + it->second;
}

bool CudaArena::in_block(const void* ptr) const { return offset_of(ptr) >= 0; }

Bytes CudaArena::allocation_bytes(const void* ptr) const {
  const Bytes off = offset_of(ptr);
  if (off < 0) return 0;
  std::lock_guard lock(mu_);
  auto it = used_.find(off);
  return it == used_.end() ? 0 : it->second;
}

MemoryStats CudaArena::stats() const {
  std::lock_guard lock(mu_);
  return {capacity_, in_use_, peak_, largest_free_locked(), static_cast<std::int64_t>(used_.size())};
}

void CudaArena::reset_peak() {
  std::lock_guard lock(mu_);
  peak_ = in_use_;
}

}  // namespace harmony::backend::cuda
