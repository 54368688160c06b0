// Units used across harmony: byte counts, integer simulation time and rates.
// Time in the simulator is an integer count of picoseconds (see docs/design.md:
// rounding every op to whole nanoseconds drifts by >10 ns over a 544-op schedule).
// Parsers for human-written quantities ("10GiB", "11.5GiB/s", "40ms") live here too.
#pragma once

#include <cmath>
#include <cstdint>
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

// Seconds (double) to integer picoseconds, rounded to nearest.
inline TimePs seconds_to_ps(double seconds) { return static_cast<TimePs>(std::llround(seconds * 1e12)); }
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
