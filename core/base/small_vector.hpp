// SmallVector<T, N>: a vector of trivially copyable T that keeps up to N elements inside the object and moves to
// the heap beyond. An op's dependencies and tensor lists are a few elements each, on thousands of ops per Program,
// and a search lowers a Program per candidate: held inline, they cost no allocation.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <type_traits>

namespace harmony::core {

template <class T, std::size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector copies its elements as bytes");
  static_assert(N > 0);

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> v) { assign(v.begin(), v.end()); }
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { take(o); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      heap_.reset();
      take(o);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> v) {
    assign(v.begin(), v.end());
    return *this;
  }
  ~SmallVector() = default;

  template <class It>
  void assign(It first, It last) {
    size_ = 0;
    insert(end(), first, last);
  }

  T* data() { return heap_ ? heap_.get() : inline_.data(); }
  const T* data() const { return heap_ ? heap_.get() : inline_.data(); }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return cap_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void reserve(std::size_t n) {
    if (n > cap_) grow(n);
  }
  void push_back(const T& x) {
    const T v = x;  // x may live in this vector
    if (size_ == cap_) grow(2 * std::size_t{cap_});
    data()[size_++] = v;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    push_back(T{std::forward<Args>(args)...});
    return back();
  }
  void pop_back() { --size_; }
  void resize(std::size_t n) {
    reserve(n);
    for (std::size_t i = size_; i < n; ++i) data()[i] = T{};
    size_ = static_cast<std::uint32_t>(n);
  }
  // [first, last) must not be in this vector
  template <class It>
  iterator insert(const_iterator pos, It first, It last) {
    const auto at = static_cast<std::size_t>(pos - begin());
    const auto k = static_cast<std::size_t>(std::distance(first, last));
    if (size_ + k > cap_) grow(std::max<std::size_t>(size_ + k, 2 * cap_));
    T* d = data();
    std::memmove(d + at + k, d + at, (size_ - at) * sizeof(T));
    std::copy(first, last, d + at);
    size_ += static_cast<std::uint32_t>(k);
    return d + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    T* d = data();
    const auto at = static_cast<std::size_t>(first - d);
    const auto k = static_cast<std::size_t>(last - first);
    std::memmove(d + at, d + at + k, (size_ - at - k) * sizeof(T));
    size_ -= static_cast<std::uint32_t>(k);
    return d + at;
  }

 private:
  void grow(std::size_t n) {
    auto h = std::make_unique_for_overwrite<T[]>(n);
    std::memcpy(h.get(), data(), size_ * sizeof(T));
    heap_ = std::move(h);
    cap_ = static_cast<std::uint32_t>(n);
  }
  void take(SmallVector& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.heap_) {
      heap_ = std::move(o.heap_);
    } else {
      std::memcpy(inline_.data(), o.inline_.data(), size_ * sizeof(T));
    }
    o.size_ = 0;
    o.cap_ = N;
  }

  std::unique_ptr<T[]> heap_;  // null while the elements fit inline_
  std::uint32_t size_ = 0;
  std::uint32_t cap_ = N;
  std::array<T, N> inline_;
};

}  // namespace harmony::core
