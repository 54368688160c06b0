// The CPU device's memory: one block of `capacity` bytes carved by the shared best-fit OffsetAllocator
// (coalescing free lists), so a "GPU" of 64 MiB really holds 64 MiB, fragmentation included. Allocations beyond it
// throw OutOfMemory; freed (and fresh) memory is filled with 0xFF (a float NaN) when poisoning is on.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "backend/device.hpp"
#include "backend/offset_allocator.hpp"

namespace harmony::backend::cpu {

// Poisoning is on by default in debug builds (!NDEBUG) and under AddressSanitizer.
#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPoisonByDefault = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kPoisonByDefault = true;
#else
inline constexpr bool kPoisonByDefault = false;
#endif
#else
inline constexpr bool kPoisonByDefault = false;
#endif

inline constexpr Bytes kArenaAlignment = 256;  // as cudaMalloc
inline constexpr unsigned char kPoisonByte = 0xFF;

class Arena final : public DeviceAllocator {
 public:
  Arena(std::string device_name, Bytes capacity, bool poison);
  ~Arena() override;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Rounded up to kArenaAlignment; 0 bytes gives nullptr. Throws OutOfMemory.
  void* allocate(Bytes bytes, std::string_view label);
  void release(void* ptr) noexcept override;
  // Whether [ptr, ptr + bytes) lies inside one live allocation.
  bool contains(const void* ptr, Bytes bytes) const;
  // Whether ptr lies anywhere inside the arena's block (live or not).
  bool in_block(const void* ptr) const;
  MemoryStats stats() const { return alloc_.stats(); }
  void reset_peak() { alloc_.reset_peak(); }
  bool poison() const { return poison_; }

 private:
  OffsetAllocator alloc_;  // the policy shared with the CUDA arena
  bool poison_ = false;
  std::byte* base_ = nullptr;
};

}  // namespace harmony::backend::cpu
