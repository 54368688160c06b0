// `harmony-run probe`: measures this machine's host rates for its machine file (docs/machines.md, "Measuring a
// machine"): the executor's host AdamW (fp32 on its threads and on one; with bf16 and fp16 casts fused), memcpy,
// the bf16 staging's rounding and widening, how much host memory may be pinned, a device's copies (pinned and
// pageable) and the bf16 staging end to end, and sequential NVMe reads and writes on a folder. Each rate is the best
// of N timed runs, with the spread. The results become a JSON document, a table and a machine YAML (probe_output.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/units.hpp"

namespace harmony::backend {

class Device;

// One rate: N timed runs of the same work, after one untimed warm-up.
struct RateSample {
  double best_bytes_per_s = 0;    // the fastest run
  double median_bytes_per_s = 0;  // the median run
  double worst_bytes_per_s = 0;   // the slowest run
  int samples = 0;                // timed runs
  core::Bytes work_bytes = 0;     // bytes one run counts (what the rate divides)
  bool measured() const { return samples > 0; }
  // (best - worst) / best: 0 when every run took the same time.
  double spread() const { return best_bytes_per_s > 0 ? (best_bytes_per_s - worst_bytes_per_s) / best_bytes_per_s : 0; }
};

// Rates from run times: bytes / seconds of each run, best, median and worst. `seconds` must be non-empty and
// positive (a run below the clock's resolution counts as 1 ns).
RateSample rate_from_times(core::Bytes work_bytes, std::vector<double> seconds);

struct ProbeOptions {
  bool quick = true;         // small sizes and 3 runs (a few seconds; the default); false (--long): about 30 s
  bool device_pins = false;  // the device's alloc_host pins (CUDA): its copies are a host link's; else a CPU device
  std::string device_note;   // why the device's copies are no host link's (no GPU here, and why), for the output
  std::string nvme_path;     // a folder on the drive to measure; empty: no NVMe measurement
  core::Bytes nvme_file_bytes = 0;  // the test file's size; 0: probe_sizes(quick)'s
};

// The sizes a probe works on (ProbeOptions::quick or not); documented in docs/machines.md.
struct ProbeSizes {
  int repeats = 5;                       // timed runs per rate (plus one warm-up)
  std::int64_t adamw_params = 16 << 20;  // parameters of each AdamW run (4 fp32 arrays of them)
  core::Bytes memcpy_bytes = core::Bytes{256} << 20;
  std::int64_t convert_elements = 64 << 20;                 // elements rounded or widened (fp32 in, bf16 out)
  core::Bytes copy_bytes = core::Bytes{256} << 20;          // each device copy run
  core::Bytes copy_piece_bytes = core::Bytes{64} << 20;     // one copy_h2d / copy_d2h call (a pack's tensor)
  std::int64_t stage_elements = 64 << 20;                   // elements staged up or down end to end
  core::Bytes staging_chunk_bytes = core::Bytes{32} << 20;  // the executor's default staging_chunk_bytes
  core::Bytes pin_cap_bytes = core::Bytes{1} << 30;         // never pin more than this (nor 1/4 of what is free)
  core::Bytes pin_chunk_bytes = core::Bytes{64} << 20;
  core::Bytes nvme_file_bytes = core::Bytes{512} << 20;
  int nvme_repeats = 3;
  int nvme_latency_reads = 64;
};
ProbeSizes probe_sizes(bool quick);
// Device memory the probe's copies and staging use (the CPU device's arena is created this large).
core::Bytes probe_device_bytes(bool quick);

// How much host memory may be pinned, up to a cap.
struct PinnedProbe {
  std::optional<core::Bytes> rlimit_memlock_bytes;       // soft RLIMIT_MEMLOCK; nullopt: unlimited
  std::optional<core::Bytes> rlimit_memlock_hard_bytes;  // hard limit; nullopt: unlimited
  bool cap_ipc_lock = false;    // the process has CAP_IPC_LOCK (root): RLIMIT_MEMLOCK does not bind mlock
  std::string method;           // "mlock" (a device that pins nothing) or "Device::alloc_host" (cudaHostAlloc)
  core::Bytes cap_bytes = 0;    // the most the probe tried to pin
  core::Bytes chunk_bytes = 0;  // pinned one chunk at a time
  core::Bytes granted_bytes = 0;
  bool limit_reached = false;  // a pin failed below the cap: granted_bytes is the limit (to a chunk)
  std::string failure;         // why the pin that failed did ("" when none did)
};

struct NvmeProbe {
  std::string path;        // the folder, as given
  std::string filesystem;  // "ext4", "xfs", ... or the magic number in hex
  bool direct_io = false;  // O_DIRECT worked; else buffered I/O with fdatasync and the pages dropped before reads
  core::Bytes file_bytes = 0;
  core::Bytes free_bytes = 0;       // free space (for an unprivileged user) before the test file was written
  std::optional<double> latency_s;  // median of random 4 KiB reads (O_DIRECT only)
  RateSample read, write;
};

struct ProbeResult {
  std::string host;         // gethostname
  std::string date_utc;     // "2025-06-01T12:00:00Z", when the probe started
  std::string device_name;  // "cpu:0", "cuda:0"
  bool device_pins = false;
  std::string device_note;  // ProbeOptions::device_note
  int threads = 1;          // the executor's AdamW threads (std::thread::hardware_concurrency)
  bool quick = false;
  std::string adamw_isa;  // adamw_vector_isa(): "avx2", "sse2", "scalar"
  std::string fp16_isa;   // "f16c" or "scalar"
  // Host rates (every probe)
  RateSample adamw_fp32, adamw_fp32_one_thread;   // fp32 parameter bytes (4 per parameter) per second
  RateSample adamw_bf16, adamw_fp16;              // the same, with 2-byte gradients in and 2-byte weights out
  RateSample memcpy_threaded, memcpy_one_thread;  // bytes copied per second
  RateSample bf16_round, bf16_widen;              // bf16 bytes written (round) or read (widen) per second
  // Through the Device interface (every probe; a host link's only when device_pins)
  RateSample h2d, d2h;                        // from / to Device::alloc_host memory
  RateSample pageable_h2d, pageable_d2h;      // from / to malloc'd memory
  RateSample bf16_stage_up, bf16_stage_down;  // the executor's stage_up / stage_down, bf16 bytes on the device
  PinnedProbe pinned;
  std::optional<NvmeProbe> nvme;
  double wall_time_s = 0;
};

// FileError unless `path` is a folder on a drive with room for the probe's test file of `file_bytes`: it exists, is
// a folder, is writable, is not in memory (tmpfs, ramfs) and has at least twice the test file free.
void check_nvme_path(const std::string& path, core::Bytes file_bytes);
// The test file's size for `options` (nvme_file_bytes, else the sizes').
core::Bytes nvme_file_bytes(const ProbeOptions& options);

// Runs every measurement on `device` (its streams, host buffers and copies; device memory probe_device_bytes).
// `progress` is told the name of each measurement before it runs. Throws FileError for a bad NVMe path (before
// measuring anything), DeviceError when the device fails.
ProbeResult run_probe(Device& device, const ProbeOptions& options,
                      const std::function<void(std::string_view)>& progress = {});

// --- pieces the measurements are built of (exposed for tests) ---

// IEEE half precision, round to nearest even (NaN stays a quiet NaN, overflow to inf, subnormals kept), and back
// (exact); the arrays with F16C where the CPU has it (fp16_isa()), else these.
std::uint16_t to_fp16(float f);
float from_fp16(std::uint16_t h);
void to_fp16_array(const float* in, std::uint16_t* out, std::int64_t n);
void from_fp16_array(const std::uint16_t* in, float* out, std::int64_t n);
const char* fp16_isa();

}  // namespace harmony::backend
