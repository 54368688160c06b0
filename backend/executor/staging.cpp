// bf16 staging (Interpreter::stage_up / stage_down, detail.hpp): fp32 host masters rounded to bf16 on their way to a
// device and bf16 device gradients widened into fp32 on their way back, chunk by chunk through two pinned host
// buffers per queue, and the bound on what that staging allocates (Interpreter::staging_bytes, for the pre-flight).
#include <algorithm>
#include <memory>
#include <span>

#include "backend/bf16_convert.hpp"
#include "backend/executor/detail.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail {

Interpreter::StagingSlot& Interpreter::staging_slot(std::size_t queue, Device& device, Bytes bytes) {
  StagingRing& ring = staging_[queue];
  StagingSlot& slot = ring.slots[static_cast<std::size_t>(ring.next)];
  ring.next ^= 1;
  if (slot.done) unlocked([&] { slot.done->synchronize(); });  // the copy that used it last has run
  if (slot.buf.bytes() < bytes) {
    slot.metered.reset();
    slot.buf = device.alloc_host(bytes, fmt::format("bf16 staging of queue {}", queue));
    slot.metered = MeteredBytes(host_meter, HostUse::Staging, bytes);
  }
  if (!slot.done) slot.done = device.create_event();
  return slot;
}

namespace {

std::int64_t total_size(auto spans) {
  std::int64_t n = 0;
  for (const auto& sp : spans) n += static_cast<std::int64_t>(sp.size());
  return n;
}

// fn(span_index, offset in that span, offset in the concatenation, count) over the pieces of the concatenated
// spans that [begin, begin + n) covers, in order.
template <class Spans, class F>
void for_pieces(const Spans& spans, std::int64_t begin, std::int64_t n, F&& fn) {
  std::int64_t base = 0;
  for (std::size_t k = 0; k < spans.size() && n > 0; ++k) {
    const auto size = static_cast<std::int64_t>(spans[k].size());
    if (begin < base + size) {
      const std::int64_t off = begin - base, take = std::min(n, size - off);
      fn(k, off, begin, take);
      begin += take;
      n -= take;
    }
    base += size;
  }
}

std::int64_t chunk_elems(Bytes chunk_bytes) {
  return std::max<std::int64_t>(1, chunk_bytes / static_cast<Bytes>(sizeof(Bf16)));
}

}  // namespace

Bytes Interpreter::staging_bytes(const core::Program& program, const ExecutorOptions& options) {
  // the rule harmony-sim's host account counts too (core::staging_ring_bytes); chunk_elems' rounding is its own
  return options.dtype == DType::BF16 ? core::staging_ring_bytes(program, true, options.staging_chunk_bytes) : 0;
}

void Interpreter::stage_up(std::size_t queue, Device& device, Stream& stream, void* dst,
                           std::span<const std::span<const float>> src) {
  const std::int64_t total = total_size(src), chunk = chunk_elems(staging_chunk_bytes);
  for (std::int64_t b = 0; b < total; b += chunk) {
    const std::int64_t n = std::min(chunk, total - b);
    StagingSlot& slot = staging_slot(queue, device, n * static_cast<Bytes>(sizeof(Bf16)));
    Bf16* out = slot.buf.as<Bf16>();
    // The rounding runs with mutex() released: it touches only this queue's slot and the op's own source, so the
    // other queues' workers issue their work meanwhile (the compute queue above all).
    unlocked([&] {
      for_pieces(src, b, n, [&](std::size_t k, std::int64_t off, std::int64_t at, std::int64_t count) {
        const float* in = src[k].data() + off;
        round_to_bf16(in, out + (at - b), count);  // on up to 16 threads (bf16_convert.hpp)
      });
    });
    device.copy_h2d(stream, static_cast<Bf16*>(dst) + b, out, n * static_cast<Bytes>(sizeof(Bf16)));
    stream.record(*slot.done);
  }
}

void Interpreter::stage_down(std::size_t queue, Device& device, Stream& stream, std::span<const std::span<float>> dst,
                             const void* src) {
  const std::int64_t total = total_size(dst), chunk = chunk_elems(staging_chunk_bytes);
  const auto* from = static_cast<const Bf16*>(src);
  const auto issue = [&](std::int64_t b) -> StagingSlot* {
    if (b >= total) return nullptr;
    const std::int64_t n = std::min(chunk, total - b);
    StagingSlot& slot = staging_slot(queue, device, n * static_cast<Bytes>(sizeof(Bf16)));
    device.copy_d2h(stream, slot.buf.data(), from + b, n * static_cast<Bytes>(sizeof(Bf16)));
    stream.record(*slot.done);
    return &slot;
  };
  StagingSlot* cur = issue(0);
  for (std::int64_t b = 0; b < total; b += chunk) {
    StagingSlot* next = issue(b + chunk);  // the link brings the next chunk while the host widens this one
    // The wait and the widening run with mutex() released (only this queue's slot and the op's own destination are
    // touched), so the other queues' workers issue their work meanwhile.
    unlocked([&] {
      cur->done->synchronize();
      const Bf16* in = cur->buf.as<Bf16>();
      for_pieces(dst, b, std::min(chunk, total - b),
                 [&](std::size_t k, std::int64_t off, std::int64_t at, std::int64_t count) {
                   widen_from_bf16(in + (at - b), dst[k].data() + off, count);  // on up to 16 threads
                 });
    });
    cur = next;
  }
}

}  // namespace harmony::backend::detail
