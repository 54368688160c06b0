// harmony-sim's progress display on stderr (sim/app/progress_cli.hpp): the bar on a terminal, a line every 10 s when
// stderr is a file or pipe, shared by sweep, search and compare.
#include "sim/app/progress_cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include <fmt/format.h>

namespace harmony::sim {

std::string duration_text(double s) {
  if (s < 0) return "?";
  const auto t = static_cast<long long>(s);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

ProgressPrinter::ProgressPrinter(std::string label, std::string unit, bool quiet, double delay_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      quiet_(quiet),
      tty_(isatty(fileno(stderr)) != 0),
      delay_s_(delay_s),
      start_(std::chrono::steady_clock::now()) {}

double ProgressPrinter::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressPrinter::update(std::size_t done, std::size_t total, bool finished, const std::string& note) {
  const double t = elapsed_s();
  const double rate = t > 0 ? static_cast<double>(done) / t : 0.0;
  const double eta = rate > 0 && total >= done ? static_cast<double>(total - done) / rate : -1.0;
  update(done, total, rate, eta, finished, note);
}

void ProgressPrinter::update(std::size_t done, std::size_t total, double rate, double eta_s, bool finished,
                             const std::string& note) {
  if (quiet_) return;
  const double t = elapsed_s();
  if (!shown_ && (t < delay_s_ || (finished && delay_s_ > 0))) return;  // quick runs stay silent
  const double pct = total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  const std::string stats = fmt::format("{}/{} {} {:5.1f}%  {:.1f} {}/s  elapsed {}  ETA {}{}", done, total, unit_, pct,
                                        rate, unit_, duration_text(t), finished ? "0:00" : duration_text(eta_s),
                                        note.empty() ? std::string() : "  " + note);
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    constexpr int kWidth = 30;
    const int fill = std::min(kWidth, static_cast<int>(pct / 100.0 * kWidth));
    fmt::print(stderr, "\r[{}{}] {}\033[K", std::string(static_cast<std::size_t>(fill), '#'),
               std::string(static_cast<std::size_t>(kWidth - fill), '.'), stats);
    if (finished) fmt::print(stderr, "\n");
    std::fflush(stderr);
    shown_ = true;
    return;
  }
  if (!finished && shown_ && now - last_ < std::chrono::seconds(10)) return;
  shown_ = true;
  last_ = now;
  fmt::print(stderr, "{}: {}\n", label_, stats);
}

}  // namespace harmony::sim
