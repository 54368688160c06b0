// FlatTable: an open-addressing hash table from 64-bit keys to small values, no allocation per entry. The
// lowering's op index and workspace memo and the native engine's per-run price memo use it: each is filled and
// probed thousands of times per search candidate, where a node-based map's allocations dominated.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace harmony::core {

// Keys are never kNoKey; values are copied in and out.
template <typename Value>
class FlatTable {
 public:
  static constexpr std::uint64_t kNoKey = ~std::uint64_t{0};

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (3 * cap < 4 * n) cap *= 2;  // at most 3/4 full: small enough to stay in cache
    if (cap > slots_.size()) rehash(cap);
  }
  // Adds key -> value; false (and no change) when the key is present.
  bool insert(std::uint64_t key, Value value) {
    if (4 * (size_ + 1) > 3 * slots_.size()) rehash(std::max<std::size_t>(16, 2 * slots_.size()));
    std::size_t i = slot(key);
    while (slots_[i].key != kNoKey) {
      if (slots_[i].key == key) return false;
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = Slot{key, value};
    ++size_;
    return true;
  }
  const Value* find(std::uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kNoKey) return nullptr;
    }
  }

 private:
  struct Slot {
    std::uint64_t key = kNoKey;
    Value value{};
  };
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & (slots_.size() - 1);
  }
  void rehash(std::size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    size_ = 0;
    for (const Slot& e : old) {
      if (e.key != kNoKey) insert(e.key, e.value);
    }
  }

  std::vector<Slot> slots_;  // key and value side by side: one cache line per probe
  std::size_t size_ = 0;
};

}  // namespace harmony::core
