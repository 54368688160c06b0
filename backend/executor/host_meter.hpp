// The executor's host-memory meter: what its interpreters and the HostState they train hold on the host, by
// category (core::HostCategory; ExecutorHostMemory, executor.hpp), in use now and at its peak; MeteredBytes counts one
// allocation for as long as it lives. Thread-safe: host buffers come and go on the queues' worker threads.
#pragma once

#include <mutex>
#include <utility>

#include "backend/executor/executor.hpp"

namespace harmony::backend::detail {

using HostUse = core::HostCategory;

class HostMeter {
 public:
  void add(HostUse u, Bytes bytes) {
    const std::lock_guard lock(mu_);
    Bytes& c = now_.at(u);
    c += bytes;
    if (c > peak_.at(u)) peak_.at(u) = c;
    total_ += bytes;
    if (total_ > total_peak_) {
      total_peak_ = total_;
      at_total_peak_ = now_;
    }
  }
  void sub(HostUse u, Bytes bytes) {
    const std::lock_guard lock(mu_);
    now_.at(u) -= bytes;
    total_ -= bytes;
  }
  ExecutorHostMemory read() const {
    const std::lock_guard lock(mu_);
    return ExecutorHostMemory{peak_, at_total_peak_, total_};
  }

 private:
  mutable std::mutex mu_;
  core::HostBreakdown now_, peak_, at_total_peak_;
  Bytes total_ = 0, total_peak_ = 0;
};

// One host allocation on the meter while it lives (move-only; a default one counts nothing).
class MeteredBytes {
 public:
  MeteredBytes() = default;
  MeteredBytes(HostMeter& meter, HostUse use, Bytes bytes) : meter_(&meter), use_(use), bytes_(bytes) {
    meter_->add(use_, bytes_);
  }
  MeteredBytes(MeteredBytes&& o) noexcept
      : meter_(std::exchange(o.meter_, nullptr)), use_(o.use_), bytes_(std::exchange(o.bytes_, 0)) {}
  MeteredBytes& operator=(MeteredBytes&& o) noexcept {
    if (this != &o) {
      reset();
      meter_ = std::exchange(o.meter_, nullptr);
      use_ = o.use_;
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  MeteredBytes(const MeteredBytes&) = delete;
  MeteredBytes& operator=(const MeteredBytes&) = delete;
  ~MeteredBytes() { reset(); }
  void reset() {
    if (meter_ != nullptr) meter_->sub(use_, bytes_);
    meter_ = nullptr;
    bytes_ = 0;
  }

 private:
  HostMeter* meter_ = nullptr;
  HostUse use_ = HostUse::Staging;
  Bytes bytes_ = 0;
};

}  // namespace harmony::backend::detail
