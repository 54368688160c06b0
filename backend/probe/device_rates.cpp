// The probe's measurements through the Device interface: copies host -> device and back from the device's host
// buffers (Device::alloc_host: pinned on CUDA) and from malloc'd memory, as the executor swaps a pack's tensors;
// and the bf16 staging end to end through the executor's own Interpreter::stage_up / stage_down (rounding into
// the staging chunks while the link moves the other, copying down while the host widens).
#include <algorithm>
#include <array>
#include <mutex>
#include <span>
#include <vector>

#include "backend/device.hpp"
#include "backend/executor/detail.hpp"
#include "backend/probe/probe_internal.hpp"

namespace harmony::backend {
namespace {

using core::Bytes;
using namespace probe_detail;

// The executor's staging (detail::Interpreter's stage_up / stage_down, its buffers and events) with no Program: an
// interpreter of nothing, so that the probe times the very code a bf16 step runs.
class StagingBench final : public detail::Interpreter {
 public:
  explicit StagingBench(Bytes chunk_bytes) { staging_chunk_bytes = chunk_bytes; }
  const std::vector<std::vector<int>>& extra_deps() const override { return none_; }
  void begin_step(std::span<const std::int32_t> /*inputs*/, std::span<const std::int32_t> /*targets*/) override {}
  std::vector<int> group(int op) const override { return {op}; }
  void run(const std::vector<int>& /*group*/) override {}
  void finished(int /*op*/) override {}
  double end_step() override { return 0; }
  void abandon_step() override {}
  void synchronize() override {}

  // stage_up / stage_down hold mutex() while they run and release it around their host work, as in a step.
  void up(Device& device, Stream& stream, void* dst, std::span<const float> src) {
    const std::array<std::span<const float>, 1> spans{src};
    const std::lock_guard lock(mutex());
    stage_up(0, device, stream, dst, spans);
  }
  void down(Device& device, Stream& stream, std::span<float> dst, const void* src) {
    const std::array<std::span<float>, 1> spans{dst};
    const std::lock_guard lock(mutex());
    stage_down(0, device, stream, spans, src);
  }

 private:
  std::vector<std::vector<int>> none_;
};

// `bytes` copied in pieces of `piece` bytes, enqueued on one stream, then one synchronize.
void copy_pieces(Device& device, Stream& stream, bool h2d, char* dev, char* host, Bytes bytes, Bytes piece) {
  for (Bytes off = 0; off < bytes; off += piece) {
    const Bytes n = std::min(piece, bytes - off);
    if (h2d) {
      device.copy_h2d(stream, dev + off, host + off, n);
    } else {
      device.copy_d2h(stream, host + off, dev + off, n);
    }
  }
  stream.synchronize();
}

}  // namespace

void measure_device_rates(Device& device, const ProbeSizes& s, ProbeResult& r) {
  auto stream = device.create_stream("probe");
  {
    Buffer dev = device.alloc(s.copy_bytes, "the probe's copies");
    HostBuffer host = device.alloc_host(s.copy_bytes, "the probe's copies");
    std::vector<char> pageable(static_cast<std::size_t>(s.copy_bytes), 1);
    const auto copies = [&](bool h2d, char* from) {
      return time_runs(s.copy_bytes, s.repeats, [&] {
        copy_pieces(device, *stream, h2d, dev.as<char>(), from, s.copy_bytes, s.copy_piece_bytes);
      });
    };
    r.h2d = copies(true, host.as<char>());
    r.d2h = copies(false, host.as<char>());
    r.pageable_h2d = copies(true, pageable.data());
    r.pageable_d2h = copies(false, pageable.data());
  }
  const std::int64_t n = s.stage_elements;
  const Bytes bf16_bytes = n * static_cast<Bytes>(sizeof(Bf16));
  Buffer dev = device.alloc(bf16_bytes, "the probe's bf16 staging");
  std::vector<float> src = random_floats(n, 1.0F, 6), dst(static_cast<std::size_t>(n));
  StagingBench bench(s.staging_chunk_bytes);
  r.bf16_stage_up = time_runs(bf16_bytes, s.repeats, [&] {
    bench.up(device, *stream, dev.data(), src);
    stream->synchronize();  // stage_up returns once the host filled its last chunk; its copy may still run
  });
  r.bf16_stage_down = time_runs(bf16_bytes, s.repeats, [&] { bench.down(device, *stream, dst, dev.data()); });
  stream->synchronize();
}

}  // namespace harmony::backend
