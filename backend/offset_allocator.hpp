// The one device-memory allocator policy behind the CPU arena and the CUDA arena: best fit over offsets of a
// capped block, fixed granularity, coalescing frees, OutOfMemory with the device's name. Pure bookkeeping: it
// never touches the memory, so the arenas add what is theirs (the CPU block and its poisoning, device memory).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "backend/device.hpp"

namespace harmony::backend {

class OffsetAllocator {
 public:
  struct Allocation {
    Bytes offset = -1;  // -1 for a zero-byte request
    Bytes bytes = 0;    // rounded up to the granularity
  };

  // capacity is rounded down to the granularity (> 0); messages name `device_name`.
  OffsetAllocator(std::string device_name, Bytes capacity, Bytes granularity);

  // Best fit: the smallest free range that holds the rounded request (lowest offset among equals).
  // Throws DeviceError for a negative size and OutOfMemory when no free range is large enough.
  Allocation allocate(Bytes bytes, std::string_view label);
  // Frees the allocation that starts at `offset` and returns its rounded size, or -1 if none starts there
  // (a foreign pointer or a double free: the caller decides how to fail).
  Bytes release(Bytes offset) noexcept;
  // Whether [offset, offset + bytes) lies inside one live allocation's requested bytes (not its rounding: a copy
  // that runs past what was asked for is caught even where the granularity would hide it).
  bool contains(Bytes offset, Bytes bytes) const;
  // The rounded size of the live allocation starting at `offset`; 0 if none.
  Bytes allocation_bytes(Bytes offset) const;
  MemoryStats stats() const;
  void reset_peak();
  Bytes capacity() const { return capacity_; }
  Bytes granularity() const { return granularity_; }
  const std::string& device_name() const { return device_name_; }

 private:
  Bytes largest_free_locked() const;

  std::string device_name_;
  Bytes granularity_ = 1;
  Bytes capacity_ = 0;
  mutable std::mutex mu_;
  std::map<Bytes, Bytes> free_;  // offset -> size, disjoint, coalesced
  struct Used {
    Bytes rounded = 0;    // what the allocation holds of the block
    Bytes requested = 0;  // what was asked for (contains() checks against this)
  };
  std::map<Bytes, Used> used_;  // offset -> sizes
  Bytes in_use_ = 0;
  Bytes peak_ = 0;
};

}  // namespace harmony::backend
