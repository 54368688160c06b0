// The probe's host measurements (host AdamW, memcpy, the bf16 staging's rounding and widening, the pinned-memory
// limit) and run_probe, which runs them, the device's (device_rates.cpp) and the NVMe's (nvme.cpp) in turn.
#include "backend/probe/probe.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/adamw_parallel.hpp"
#include "backend/bf16_convert.hpp"
#include "backend/device.hpp"
#include "backend/host_memory.hpp"
#include "backend/probe/probe_internal.hpp"
#include "core/base/parallel.hpp"

namespace harmony::backend {

using core::Bytes;

RateSample rate_from_times(Bytes work_bytes, std::vector<double> seconds) {
  if (seconds.empty()) throw core::InternalError("rate_from_times: no runs");
  for (double& s : seconds) s = std::max(s, 1e-9);
  std::sort(seconds.begin(), seconds.end());
  const auto w = static_cast<double>(work_bytes);
  RateSample r;
  r.samples = static_cast<int>(seconds.size());
  r.work_bytes = work_bytes;
  r.best_bytes_per_s = w / seconds.front();
  r.median_bytes_per_s = w / seconds[seconds.size() / 2];
  r.worst_bytes_per_s = w / seconds.back();
  return r;
}

ProbeSizes probe_sizes(bool quick) {
  ProbeSizes s;
  if (!quick) return s;
  s.repeats = 3;
  s.adamw_params = 1 << 20;
  s.memcpy_bytes = Bytes{16} << 20;
  s.convert_elements = 4 << 20;
  s.copy_bytes = Bytes{16} << 20;
  s.copy_piece_bytes = Bytes{8} << 20;
  s.stage_elements = 4 << 20;
  s.staging_chunk_bytes = Bytes{2} << 20;
  s.pin_cap_bytes = Bytes{32} << 20;
  s.pin_chunk_bytes = Bytes{8} << 20;
  s.nvme_file_bytes = Bytes{16} << 20;
  s.nvme_repeats = 2;
  s.nvme_latency_reads = 16;
  return s;
}

Bytes nvme_file_bytes(const ProbeOptions& options) {
  return options.nvme_file_bytes > 0 ? options.nvme_file_bytes : probe_sizes(options.quick).nvme_file_bytes;
}

Bytes probe_device_bytes(bool quick) {
  const ProbeSizes s = probe_sizes(quick);
  // the copy target, and the staging's bf16 destination; plus the allocator's rounding
  return s.copy_bytes + s.stage_elements * static_cast<Bytes>(sizeof(Bf16)) + (Bytes{16} << 20);
}

namespace probe_detail {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

RateSample time_runs(Bytes work_bytes, int repeats, const std::function<void()>& run) {
  run();  // warm-up: pages faulted in, threads and buffers made
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    run();
    t.push_back(seconds_since(t0));
  }
  return rate_from_times(work_bytes, std::move(t));
}

std::vector<float> random_floats(std::int64_t n, float scale, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  // a few thousand random values repeated: filling 16M elements one draw each would take longer than measuring
  std::vector<float> pattern(4093);
  for (float& x : pattern) x = d(rng);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = pattern[i % pattern.size()];
  return v;
}

}  // namespace probe_detail

namespace {

using namespace probe_detail;

unsigned hw_threads() { return std::max(1U, std::thread::hardware_concurrency()); }

// AdamW over `params` fp32 parameters on `threads` threads (ParallelAdamW, the executor's Update), fp32 parameter
// bytes per second.
RateSample measure_adamw_fp32(const ProbeSizes& s, int threads) {
  const std::int64_t n = s.adamw_params;
  std::vector<float> p = random_floats(n, 0.1F, 1), g = random_floats(n, 0.01F, 2);
  std::vector<float> m(static_cast<std::size_t>(n), 0.0F), v(static_cast<std::size_t>(n), 0.0F);
  ParallelAdamW pool(threads);
  const AdamWConfig config;
  std::int64_t step = 0;
  return time_runs(n * 4, s.repeats, [&] { pool.update(config, ++step, p.data(), g.data(), m.data(), v.data(), n); });
}

// AdamW with the casts of a mixed-precision step fused into it, as DeepSpeed's CPU Adam does: per block of 16K
// elements (in cache), the 2-byte gradients widened, the fp32 step (adamw_update_vectorized, the executor's
// element loop), the updated fp32 masters rounded into the 2-byte copy the device gets; blocks split over the
// executor's AdamW threads. fp32 parameter bytes per second, as cpu_adam.bandwidth.
template <class Half, class Widen, class Round>
RateSample measure_adamw_mixed(const ProbeSizes& s, Widen widen, Round round) {
  const std::int64_t n = s.adamw_params;
  constexpr std::int64_t kBlock = 16 * 1024;
  std::vector<float> p = random_floats(n, 0.1F, 3), g32 = random_floats(n, 0.01F, 4);
  std::vector<float> m(static_cast<std::size_t>(n), 0.0F), v(static_cast<std::size_t>(n), 0.0F);
  std::vector<Half> g(static_cast<std::size_t>(n)), w(static_cast<std::size_t>(n));
  round(g32.data(), g.data(), n);
  g32 = {};
  const unsigned threads = hw_threads();
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::int64_t per = (blocks + threads - 1) / threads;
  std::vector<std::vector<float>> scratch(threads, std::vector<float>(kBlock));
  const AdamWConfig config;
  std::int64_t step = 0;
  return time_runs(n * 4, s.repeats, [&] {
    ++step;
    core::parallel_for(threads, threads, [&](std::size_t t) {
      float* tmp = scratch[t].data();
      const std::int64_t b0 = static_cast<std::int64_t>(t) * per, b1 = std::min(blocks, b0 + per);
      for (std::int64_t b = b0; b < b1; ++b) {
        const std::int64_t i = b * kBlock, len = std::min(kBlock, n - i);
        widen(g.data() + i, tmp, len);
        adamw_update_vectorized(config, step, p.data() + i, tmp, m.data() + i, v.data() + i, len);
        round(p.data() + i, w.data() + i, len);
      }
    });
  });
}

void round_bf16_serial(const float* in, Bf16* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}
void widen_bf16_serial(const Bf16* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_f32(in[i]);
}

// memcpy of `bytes` between two buffers on `threads` threads (contiguous ranges), bytes copied per second.
RateSample measure_memcpy(const ProbeSizes& s, unsigned threads) {
  const auto n = static_cast<std::size_t>(s.memcpy_bytes);
  std::vector<char> a(n, 1), b(n, 0);
  const std::size_t per = (n / threads + 63) / 64 * 64;
  return time_runs(s.memcpy_bytes, s.repeats, [&] {
    core::parallel_for(threads, threads, [&](std::size_t t) {
      const std::size_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    });
  });
}

// The executor's rounding (round_to_bf16: stage_up's host part) and widening (stage_down's), bf16 bytes per second.
std::pair<RateSample, RateSample> measure_bf16_convert(const ProbeSizes& s) {
  const std::int64_t n = s.convert_elements;
  std::vector<float> f = random_floats(n, 1.0F, 5), back(static_cast<std::size_t>(n));
  std::vector<Bf16> h(static_cast<std::size_t>(n));
  const Bytes bf16_bytes = n * static_cast<Bytes>(sizeof(Bf16));
  RateSample round = time_runs(bf16_bytes, s.repeats, [&] { round_to_bf16(f.data(), h.data(), n); });
  RateSample widen = time_runs(bf16_bytes, s.repeats, [&] { widen_from_bf16(h.data(), back.data(), n); });
  return {round, widen};
}

// CAP_IPC_LOCK (bit 14) in /proc/self/status's CapEff.
bool has_cap_ipc_lock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      return ((std::stoull(line.substr(7), nullptr, 16) >> 14) & 1U) != 0;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

std::optional<Bytes> limit_bytes(rlim_t v) {
  if (v == RLIM_INFINITY) return std::nullopt;
  return static_cast<Bytes>(std::min<rlim_t>(v, static_cast<rlim_t>(core::kMaxInputBytes)));
}

// An anonymous mapping locked with mlock, unlocked and unmapped when destroyed.
struct LockedRegion {
  void* ptr = MAP_FAILED;
  std::size_t bytes = 0;
  bool locked = false;
  LockedRegion() = default;
  LockedRegion(const LockedRegion&) = delete;
  LockedRegion& operator=(const LockedRegion&) = delete;
  ~LockedRegion() {
    if (locked) munlock(ptr, bytes);
    if (ptr != MAP_FAILED) munmap(ptr, bytes);
  }
};

// Pins chunks of host memory until the cap (or a quarter of what this process may still allocate) or a failure:
// with mlock for a device that pins nothing, with the device's alloc_host (cudaHostAlloc) for one that pins.
PinnedProbe measure_pinned(Device& device, const ProbeOptions& o, const ProbeSizes& s) {
  PinnedProbe p;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    p.rlimit_memlock_bytes = limit_bytes(rl.rlim_cur);
    p.rlimit_memlock_hard_bytes = limit_bytes(rl.rlim_max);
  }
  p.cap_ipc_lock = has_cap_ipc_lock();
  p.cap_bytes = s.pin_cap_bytes;
  p.chunk_bytes = s.pin_chunk_bytes;
  const HostMemoryProbe host = probe_host_memory();
  if (const HostMemoryLimit* tight = host.tightest())
    p.cap_bytes = std::min(p.cap_bytes, tight->headroom_bytes() / 4 / s.pin_chunk_bytes * s.pin_chunk_bytes);
  p.method = o.device_pins ? "Device::alloc_host" : "mlock";
  std::vector<HostBuffer> pinned;
  std::vector<std::unique_ptr<LockedRegion>> locked;
  while (p.granted_bytes + s.pin_chunk_bytes <= p.cap_bytes) {
    if (o.device_pins) {
      try {
        pinned.push_back(device.alloc_host(s.pin_chunk_bytes, "the probe's pinned-memory limit"));
      } catch (const BackendError& e) {
        p.failure = e.what();
        break;
      }
    } else {
      auto r = std::make_unique<LockedRegion>();
      r->bytes = static_cast<std::size_t>(s.pin_chunk_bytes);
      r->ptr = mmap(nullptr, r->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (r->ptr == MAP_FAILED) {
        p.failure = fmt::format("mmap: {}", std::strerror(errno));
        break;
      }
      if (mlock(r->ptr, r->bytes) != 0) {
        p.failure = fmt::format("mlock: {}", std::strerror(errno));
        break;
      }
      r->locked = true;
      locked.push_back(std::move(r));
    }
    p.granted_bytes += s.pin_chunk_bytes;
  }
  p.limit_reached = !p.failure.empty();
  return p;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

ProbeResult run_probe(Device& device, const ProbeOptions& options,
                      const std::function<void(std::string_view)>& progress) {
  const auto t0 = Clock::now();
  ProbeSizes s = probe_sizes(options.quick);
  s.nvme_file_bytes = nvme_file_bytes(options);
  if (!options.nvme_path.empty()) check_nvme_path(options.nvme_path, s.nvme_file_bytes);
  const auto step = [&](std::string_view what) {
    if (progress) progress(what);
  };
  ProbeResult r;
  r.host = host_name();
  r.date_utc = utc_now();
  r.device_name = device.name();
  r.device_pins = options.device_pins;
  r.device_note = options.device_note;
  r.threads = static_cast<int>(hw_threads());
  r.quick = options.quick;
  r.adamw_isa = adamw_vector_isa();
  r.fp16_isa = fp16_isa();
  step("host AdamW fp32");
  r.adamw_fp32 = measure_adamw_fp32(s, 0);
  r.adamw_fp32_one_thread = measure_adamw_fp32(s, 1);
  step("host AdamW with bf16 and fp16 casts");
  r.adamw_bf16 = measure_adamw_mixed<Bf16>(s, widen_bf16_serial, round_bf16_serial);
  r.adamw_fp16 = measure_adamw_mixed<std::uint16_t>(s, from_fp16_array, to_fp16_array);
  step("memcpy");
  r.memcpy_threaded = measure_memcpy(s, std::min(16U, hw_threads()));
  r.memcpy_one_thread = measure_memcpy(s, 1);
  step("bf16 rounding and widening");
  std::tie(r.bf16_round, r.bf16_widen) = measure_bf16_convert(s);
  step("pinned host memory");
  r.pinned = measure_pinned(device, options, s);
  step(fmt::format("{} copies and bf16 staging", device.name()));
  measure_device_rates(device, s, r);
  if (!options.nvme_path.empty()) {
    step(fmt::format("NVMe at {}", options.nvme_path));
    r.nvme = measure_nvme(options.nvme_path, s);
  }
  r.wall_time_s = seconds_since(t0);
  return r;
}

}  // namespace harmony::backend
