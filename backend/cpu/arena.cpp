// The CPU device's memory: one capped host block carved by backend::OffsetAllocator, and NaN poisoning of
// fresh and freed memory (see arena.hpp).
#include "backend/cpu/arena.hpp"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace harmony::backend::cpu {

Arena::Arena(std::string device_name, Bytes capacity, bool poison)
    : alloc_(std::move(device_name), capacity, kArenaAlignment), poison_(poison) {
  if (alloc_.capacity() == 0) return;
  base_ = static_cast<std::byte*>(std::aligned_alloc(kArenaAlignment, static_cast<std::size_t>(alloc_.capacity())));
  if (base_ == nullptr)
    throw DeviceError(fmt::format("{}: cannot reserve {} of host memory for the device arena", alloc_.device_name(),
                                  core::format_bytes(alloc_.capacity())));
}

Arena::~Arena() { std::free(base_); }

void* Arena::allocate(Bytes bytes, std::string_view label) {
  const OffsetAllocator::Allocation a = alloc_.allocate(bytes, label);
  if (a.offset < 0) return nullptr;
  std::byte* p = base_ + a.offset;
  if (poison_) std::memset(p, kPoisonByte, static_cast<std::size_t>(a.bytes));
  return p;
}

void Arena::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  if (!in_block(ptr)) std::abort();  // not ours: a bug in the caller, never recoverable
  const Bytes off = static_cast<std::byte*>(ptr) - base_;
  // Poison while the range is still allocated, so no other thread can have been handed it yet.
  const Bytes bytes = alloc_.allocation_bytes(off);
  if (bytes == 0) std::abort();  // freed twice or not an allocation's start
  if (poison_) std::memset(base_ + off, kPoisonByte, static_cast<std::size_t>(bytes));
  if (alloc_.release(off) < 0) std::abort();
}

bool Arena::contains(const void* ptr, Bytes bytes) const {
  if (!in_block(ptr)) return false;
  return alloc_.contains(static_cast<const std::byte*>(ptr) - base_, bytes);
}

bool Arena::in_block(const void* ptr) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  return base_ != nullptr && p >= base_ && p < base_ + alloc_.capacity();
}

}  // namespace harmony::backend::cpu
