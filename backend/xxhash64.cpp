// XXH64, streaming (see xxhash64.hpp): the four-lane round, merge and avalanche of the reference
// implementation; checked against its published digests in backend/train_checkpoint_test.cpp.
#include "backend/xxhash64.hpp"

#include <algorithm>
#include <bit>

namespace harmony::backend {

namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ULL;

std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}

std::uint64_t xxh_merge(std::uint64_t acc, std::uint64_t v) {
  acc ^= xxh_round(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

XxHash64::XxHash64(std::uint64_t seed) : v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed) {}

void XxHash64::update(const void* data, std::size_t bytes) {
  if (bytes == 0) return;  // data may be null
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += bytes;
  if (buffered_bytes_ > 0) {
    const std::size_t take = std::min(bytes, sizeof buffer_ - buffered_bytes_);
    std::memcpy(buffer_ + buffered_bytes_, p, take);
    buffered_bytes_ += take;
    p += take;
    bytes -= take;
    if (buffered_bytes_ < sizeof buffer_) return;
    for (int i = 0; i < 4; ++i) v_[i] = xxh_round(v_[i], load_le64(buffer_ + 8 * i));
    buffered_bytes_ = 0;
  }
  std::uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  for (; bytes >= 32; p += 32, bytes -= 32) {
    v0 = xxh_round(v0, load_le64(p));
    v1 = xxh_round(v1, load_le64(p + 8));
    v2 = xxh_round(v2, load_le64(p + 16));
    v3 = xxh_round(v3, load_le64(p + 24));
  }
  v_[0] = v0;
  v_[1] = v1;
  v_[2] = v2;
  v_[3] = v3;
  if (bytes > 0) std::memcpy(buffer_, p, bytes);
  buffered_bytes_ = bytes;
}

std::uint64_t XxHash64::digest() const {
  std::uint64_t h = 0;
  if (total_bytes_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (const std::uint64_t v : v_) h = xxh_merge(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_bytes_;
  const unsigned char* p = buffer_;
  std::size_t n = buffered_bytes_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ xxh_round(0, load_le64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(load_le32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace harmony::backend
