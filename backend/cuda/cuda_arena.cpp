// Carving of one device block by backend::OffsetAllocator (cuda_arena.hpp): the CPU arena's policy and
// messages, on device addresses it never dereferences.
#include "backend/cuda/cuda_arena.hpp"

#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

namespace harmony::backend::cuda {

CudaArena::CudaArena(std::string device_name, void* base, Bytes capacity, std::function<void(void*)> free_block)
    : alloc_(std::move(device_name), capacity, kCudaArenaAlignment),
      base_(static_cast<std::byte*>(base)),
      free_block_(std::move(free_block)) {
  if (base == nullptr && capacity > 0) throw DeviceError(fmt::format("{}: arena without memory", alloc_.device_name()));
}

CudaArena::~CudaArena() {
  if (free_block_ && base_ != nullptr) free_block_(base_);
}

Bytes CudaArena::offset_of(const void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  const auto b = reinterpret_cast<std::uintptr_t>(base_);
  if (base_ == nullptr || p < b || p >= b + static_cast<std::uintptr_t>(alloc_.capacity())) return -1;
  return static_cast<Bytes>(p - b);
}

void* CudaArena::allocate(Bytes bytes, std::string_view label) {
  const OffsetAllocator::Allocation a = alloc_.allocate(bytes, label);
  return a.offset < 0 ? nullptr : base_ + a.offset;  // device memory: never dereferenced here
}

void CudaArena::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  const Bytes off = offset_of(ptr);
  if (off < 0 || alloc_.release(off) < 0) std::abort();  // not ours or freed twice: a caller's bug
}

bool CudaArena::contains(const void* ptr, Bytes bytes) const {
  const Bytes off = offset_of(ptr);
  return off >= 0 && alloc_.contains(off, bytes);
}

bool CudaArena::in_block(const void* ptr) const { return offset_of(ptr) >= 0; }

Bytes CudaArena::allocation_bytes(const void* ptr) const {
  const Bytes off = offset_of(ptr);
  return off < 0 ? 0 : alloc_.allocation_bytes(off);
}

}  // namespace harmony::backend::cuda
