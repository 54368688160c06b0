// XXH64 (https://github.com/Cyan4973/xxHash, the 64-bit variant), streaming, and the little-endian loads it and the
// training checkpoint reader share. The checkpoint format's checksum (backend/train_checkpoint.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace harmony::backend {

// update() in any pieces gives the same digest as one call over the concatenation.
class XxHash64 {
 public:
  explicit XxHash64(std::uint64_t seed = 0);
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  std::uint64_t v_[4];
  std::uint64_t seed_;
  std::uint64_t total_bytes_ = 0;
  unsigned char buffer_[32] = {};
  std::size_t buffered_bytes_ = 0;
};

// Unaligned little-endian loads (the host is little-endian: train_checkpoint.cpp asserts it).
inline std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint32_t load_le32(const unsigned char* p) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace harmony::backend
