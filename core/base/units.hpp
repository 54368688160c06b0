// Units used across harmony: byte counts, integer simulation time and rates.
// Time in the simulator is an integer count of picoseconds (see docs/design.md:
// rounding every op to whole nanoseconds drifts by >10 ns over a 544-op schedule).
// Parsers for human-written quantities ("10GiB", "11.5GiB/s", "40ms") live here too.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace harmony::core {

using Bytes = std::int64_t;   // a byte count; variables carry a `_bytes` suffix
using TimePs = std::int64_t;  // simulated time in picoseconds; variables carry `_ps`

inline constexpr TimePs kPsPerSecond = 1'000'000'000'000;
inline constexpr TimePs kPsPerNs = 1'000;
inline constexpr Bytes kKiB = 1024;
inline constexpr Bytes kMiB = 1024 * kKiB;
inline constexpr Bytes kGiB = 1024 * kMiB;

// The simulated time range: int64 picoseconds reach 9.22e18 ps, about 9.2e6 s (106 days).
inline constexpr TimePs kMaxTimePs = std::numeric_limits<TimePs>::max();

// Valid ranges of every quantity read from a config, a profile or a flag (docs/config.md, "Valid ranges").
// - A time is at most 1e6 s (11.6 days): one op then fits the simulated range 9x over, so a step's critical
//   path (sums of such terms) stays inside it for realistic programs; a longer total is a located
//   ScheduleError from the simulator, never a wrapped-around time.
// - A size is at most 2^50 bytes (1 PiB): 8192 of them still sum below 2^63.
// - A bandwidth is in [1 KB/s, 1 EB/s]: at the floor a 1 GB transfer takes 1e6 s, the time bound.
// - A FLOP rate is in [1 MFLOP/s, 1000 PFLOP/s]; a FLOP count is at most 1000 PFLOP.
inline constexpr double kMaxInputSeconds = 1e6;
inline constexpr Bytes kMaxInputBytes = Bytes{1} << 50;
inline constexpr double kMinInputBytesPerS = 1e3;
inline constexpr double kMaxInputBytesPerS = 1e18;
inline constexpr double kMinInputFlopsPerS = 1e6;
inline constexpr double kMaxInputFlopsPerS = 1e18;
inline constexpr double kMaxInputFlops = 1e18;

// Seconds (double) to integer picoseconds, rounded to nearest. A time past the simulated range (or NaN)
// saturates to kMaxTimePs, which the simulators report as leaving the range.
inline TimePs seconds_to_ps(double seconds) {
  const double ps = seconds * 1e12;
  if (!(ps < 9.2e18)) return kMaxTimePs;
  if (!(ps > -9.2e18)) return -kMaxTimePs;
  return static_cast<TimePs>(std::llround(ps));
}
inline double ps_to_seconds(TimePs ps) { return static_cast<double>(ps) / 1e12; }

// "10GiB", "512 MiB", "11GB", "1e9", "4096B". Binary (KiB/MiB/GiB/TiB) and decimal (KB/MB/GB/TB)
// prefixes are distinct. Returns nullopt when the text is not a non-negative size.
std::optional<Bytes> parse_bytes(std::string_view text);
// "11.5GiB/s", "16 GB/s", "1e9B/s" -> bytes per second; nullopt when malformed or not positive.
std::optional<double> parse_bandwidth(std::string_view text);
// "40ms", "0.04s", "250us", "10ns" -> seconds; nullopt when malformed or negative.
std::optional<double> parse_duration_s(std::string_view text);

// Human-readable renderings used in tables: "10.00 GiB", "11.50 GiB/s".
std::string format_bytes(Bytes bytes);
std::string format_bandwidth(double bytes_per_s);

}  // namespace harmony::core
