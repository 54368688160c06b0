// What the probe's measurement files share (probe.cpp, device_rates.cpp, nvme.cpp): the clock, timing a run N
// times, test data, and the device and NVMe measurements run_probe calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/probe/probe.hpp"

namespace harmony::backend {
namespace probe_detail {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// run() once untimed (pages faulted in, threads and buffers made), then `repeats` timed runs.
RateSample time_runs(core::Bytes work_bytes, int repeats, const std::function<void()>& run);

// n values in [-scale, scale] (a repeated pseudo-random pattern).
std::vector<float> random_floats(std::int64_t n, float scale, std::uint32_t seed);

}  // namespace probe_detail

// device copies (pinned and pageable, each way) and the bf16 staging end to end, into r (device_rates.cpp)
void measure_device_rates(Device& device, const ProbeSizes& s, ProbeResult& r);
// sequential writes and reads of a test file in `path` (nvme.cpp); check_nvme_path first
NvmeProbe measure_nvme(const std::string& path, const ProbeSizes& s);

}  // namespace harmony::backend
