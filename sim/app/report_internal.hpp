// Formatting the report's data and its page share (sim/app/report_data.cpp, sim/app/report_html.cpp): byte and time
// units as the page prints them, and the ranking metric's column, direction and text. Internal to the report.
#pragma once

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/base/units.hpp"
#include "sim/app/report.hpp"

namespace harmony::sim::report_detail {

inline constexpr double kGiB = static_cast<double>(core::kGiB);
inline double gib(core::Bytes b) { return static_cast<double>(b) / kGiB; }
inline double seconds(core::TimePs t) { return static_cast<double>(t) * 1e-12; }

inline std::string fmt_gib(core::Bytes b) { return fmt::format("{:.2f}", gib(b)); }

// A duration in the unit that reads best: "812 us", "41.3 ms", "2.481 s", "3.2 h", "12.4 d".
inline std::string fmt_duration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 3600.0) return fmt::format("{:.3f} s", s);
  if (s < 86400.0 * 2) return fmt::format("{:.1f} h", s / 3600.0);
  return fmt::format("{:.1f} d", s / 86400.0);
}

inline const char* metric_column(RankBy r) {
  switch (r) {
    case RankBy::Throughput:
      return "throughput_samples_per_s";
    case RankBy::IterationTime:
      return "iteration_time_s";
    case RankBy::TimeToTrain:
      return "time_to_train_s";
    case RankBy::Cost:
      return "cost";
  }
  return "throughput_samples_per_s";
}

inline bool higher_is_better(RankBy r) { return r == RankBy::Throughput; }
inline bool better(double a, double b, RankBy r) { return higher_is_better(r) ? a > b : a < b; }
// How many times better `a` is than `b` (>= 1 when a is at least as good).
inline double ratio(double a, double b, RankBy r) { return higher_is_better(r) ? a / b : b / a; }

inline std::string fmt_metric(double v, RankBy r) {
  if (!std::isfinite(v)) return "-";
  switch (r) {
    case RankBy::Throughput:
      return fmt::format("{:.3f}", v);
    case RankBy::IterationTime:
    case RankBy::TimeToTrain:
      return fmt_duration(v);
    case RankBy::Cost:
      return fmt::format("{:.2f}", v);
  }
  return fmt::format("{}", v);
}

inline const char* metric_title(RankBy r) {
  switch (r) {
    case RankBy::Throughput:
      return "samples/s";
    case RankBy::IterationTime:
      return "iteration";
    case RankBy::TimeToTrain:
      return "time to train";
    case RankBy::Cost:
      return "cost";
  }
  return "samples/s";
}

}  // namespace harmony::sim::report_detail
