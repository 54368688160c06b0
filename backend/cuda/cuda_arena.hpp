// The CUDA device's memory cap: backend::OffsetAllocator, the CPU arena's allocator (best fit, 256-byte
// granularity, coalescing frees, OutOfMemory with the same message), as pure bookkeeping over one block of device
// memory that it never touches, so it needs no CUDA and frees are safe inside CUDA host callbacks
// (Stream::release_after).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "backend/device.hpp"
#include "backend/offset_allocator.hpp"

namespace harmony::backend::cuda {

inline constexpr Bytes kCudaArenaAlignment = 256;  // cudaMalloc's alignment

class CudaArena final : public DeviceAllocator {
 public:
  // Carves [base, base + capacity); `free_block(base)` runs when the arena is destroyed (after the device and
  // every Buffer from it are gone). capacity is rounded down to the alignment.
  CudaArena(std::string device_name, void* base, Bytes capacity, std::function<void(void*)> free_block);
  ~CudaArena() override;
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  // Rounded up to kCudaArenaAlignment; 0 bytes gives nullptr. Throws OutOfMemory.
  void* allocate(Bytes bytes, std::string_view label);
  void release(void* ptr) noexcept override;
  // Whether [ptr, ptr + bytes) lies inside one live allocation.
  bool contains(const void* ptr, Bytes bytes) const;
  // Whether ptr lies anywhere inside the block (live or not).
  bool in_block(const void* ptr) const;
  // The allocation's rounded size (0 if ptr is not the start of a live allocation).
  Bytes allocation_bytes(const void* ptr) const;
  MemoryStats stats() const { return alloc_.stats(); }
  void reset_peak() { alloc_.reset_peak(); }
  Bytes capacity() const { return alloc_.capacity(); }

 private:
  Bytes offset_of(const void* ptr) const;  // -1 outside the block

  OffsetAllocator alloc_;
  std::byte* base_ = nullptr;
  std::function<void(void*)> free_block_;
};

}  // namespace harmony::backend::cuda
