// Parsers and formatters for human-written quantities: byte sizes ("10GiB", "11GB", "4096"),
// bandwidths ("11.5GiB/s", "1e9" bytes/s) and durations ("40ms", "0.04"). Units are case-sensitive;
// binary (KiB..TiB) and decimal (KB..TB) prefixes are distinct. Every parser returns nullopt on bad input.
#include "core/base/units.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include <fmt/format.h>

namespace harmony::core {

namespace {

struct Unit {
  std::string_view name;
  double scale;
};

// Size units; lookups are exact and case-sensitive ("gib" is not a unit).
constexpr Unit kByteUnits[] = {
    {"", 1.0},
    {"B", 1.0},
    {"KiB", 1024.0},
    {"MiB", 1024.0 * 1024.0},
    {"GiB", 1024.0 * 1024.0 * 1024.0},
    {"TiB", 1024.0 * 1024.0 * 1024.0 * 1024.0},
    {"KB", 1e3},
    {"MB", 1e6},
    {"GB", 1e9},
    {"TB", 1e12},
};

constexpr Unit kDurationUnits[] = {
    {"", 1.0}, {"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9},
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A non-negative decimal number at the start of `text`: digits [. digits] [e[+-]digits] (or .digits).
// No sign, no inf/nan, no hex.
struct NumberPrefix {
  std::string_view number;  // the numeric text
  std::string_view rest;    // what follows (the unit), leading spaces removed
  bool is_integer = false;  // only digits: parse exactly, not through double
};

std::optional<NumberPrefix> split_number(std::string_view text) {
  std::size_t i = 0;
  std::size_t mantissa_digits = 0;
  while (i < text.size() && is_digit(text[i])) ++i, ++mantissa_digits;
  bool is_integer = true;
  if (i < text.size() && text[i] == '.') {
    is_integer = false;
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    std::size_t j = i + 1;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    std::size_t exp_digits = 0;
    while (j < text.size() && is_digit(text[j])) ++j, ++exp_digits;
    if (exp_digits == 0) return std::nullopt;  // "1e", "1e+": not a number
    is_integer = false;
    i = j;
  }
  NumberPrefix out;
  out.number = text.substr(0, i);
  out.is_integer = is_integer;
  std::string_view rest = text.substr(i);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  out.rest = rest;
  return out;
}

std::optional<double> to_double(std::string_view number) {
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || ptr != number.data() + number.size()) return std::nullopt;
  if (!std::isfinite(value) || value < 0.0) return std::nullopt;
  return value;
}

template <std::size_t N>
std::optional<double> unit_scale(const Unit (&units)[N], std::string_view name) {
  for (const Unit& u : units) {
    if (u.name == name) return u.scale;
  }
  return std::nullopt;
}

// "<number>[ ]<unit>" with a unit from `units`; the scaled value, non-negative and finite.
template <std::size_t N>
std::optional<double> parse_scaled(std::string_view text, const Unit (&units)[N]) {
  const auto prefix = split_number(trim(text));
  if (!prefix) return std::nullopt;
  const auto scale = unit_scale(units, prefix->rest);
  if (!scale) return std::nullopt;
  const auto value = to_double(prefix->number);
  if (!value) return std::nullopt;
  const double scaled = *value * *scale;
  if (!std::isfinite(scaled)) return std::nullopt;
  return scaled;
}

std::string format_binary(double value, std::string_view suffix) {
  static constexpr std::string_view kNames[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const double magnitude = std::fabs(value);
  if (magnitude < 1024.0) return fmt::format("{:.2f} B{}", value, suffix);
  double scaled = value / 1024.0;
  std::size_t unit = 0;
  while (std::fabs(scaled) >= 1024.0 && unit + 1 < std::size(kNames)) {
    scaled /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}{}", scaled, kNames[unit], suffix);
}

}  // namespace

std::optional<Bytes> parse_bytes(std::string_view text) {
  const auto prefix = split_number(trim(text));
  if (!prefix) return std::nullopt;
  const auto scale = unit_scale(kByteUnits, prefix->rest);
  if (!scale) return std::nullopt;
  constexpr Bytes kMax = std::numeric_limits<Bytes>::max();
  if (prefix->is_integer) {
    // Exact integer arithmetic: "9223372036854775807" must not round through a double.
    Bytes count = 0;
    const std::string_view n = prefix->number;
    const auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), count);
    if (ec != std::errc() || ptr != n.data() + n.size()) return std::nullopt;  // overflow
    const auto multiplier = static_cast<Bytes>(*scale);
    if (count > kMax / multiplier) return std::nullopt;
    return count * multiplier;
  }
  const auto value = to_double(prefix->number);
  if (!value) return std::nullopt;
  const double scaled = *value * *scale;
  // A fraction of a byte only makes sense once a prefix scales it ("1.5KiB"); "0.5" or "0.5B" is an error.
  if (*scale == 1.0 && scaled != std::floor(scaled)) return std::nullopt;
  if (!(scaled < 9223372036854775808.0)) return std::nullopt;  // 2^63: does not fit in Bytes
  return static_cast<Bytes>(std::llround(scaled));
}

std::optional<double> parse_bandwidth(std::string_view text) {
  std::string_view t = trim(text);
  std::optional<double> value;
  if (t.size() >= 2 && t.substr(t.size() - 2) == "/s") {
    t.remove_suffix(2);
    if (!t.empty() && t.back() == ' ') return std::nullopt;  // "11.5GiB /s"
    const auto prefix = split_number(t);
    if (!prefix || prefix->rest.empty()) return std::nullopt;  // "1000/s": write "1000B/s" or "1000"
    value = parse_scaled(t, kByteUnits);
  } else {
    const auto prefix = split_number(t);
    if (!prefix || !prefix->rest.empty()) return std::nullopt;  // "11.5GiB" without "/s" is a size
    value = to_double(prefix->number);
  }
  if (!value || !(*value > 0.0)) return std::nullopt;
  return value;
}

std::optional<double> parse_duration_s(std::string_view text) { return parse_scaled(text, kDurationUnits); }

std::string format_bytes(Bytes bytes) {
  if (bytes > -1024 && bytes < 1024) return fmt::format("{} B", bytes);
  return format_binary(static_cast<double>(bytes), "");
}

std::string format_bandwidth(double bytes_per_s) { return format_binary(bytes_per_s, "/s"); }

}  // namespace harmony::core
