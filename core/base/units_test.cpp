// Tests of core/base/units.cpp: the size, bandwidth and duration parsers (accepted forms, case-sensitive
// units, rejection of negatives, garbage and overflow), the human-readable formatters, and core/base/parallel.hpp.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/parallel.hpp"
#include "core/base/units.hpp"

using namespace harmony::core;

TEST_CASE("parse_bytes: plain counts and binary/decimal units") {
  CHECK(parse_bytes("0") == 0);
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("4096B") == 4096);
  CHECK(parse_bytes("4096 B") == 4096);
  CHECK(parse_bytes("1KiB") == 1024);
  CHECK(parse_bytes("512 MiB") == 512 * kMiB);
  CHECK(parse_bytes("10GiB") == 10 * kGiB);
  CHECK(parse_bytes("2TiB") == 2 * 1024 * kGiB);
  CHECK(parse_bytes("1KB") == 1000);
  CHECK(parse_bytes("11GB") == 11'000'000'000);
  CHECK(parse_bytes("1MB") == 1'000'000);
  CHECK(parse_bytes("3TB") == 3'000'000'000'000);
  CHECK(parse_bytes("  10GiB ") == 10 * kGiB);  // surrounding whitespace is trimmed
}

TEST_CASE("parse_bytes: decimals and exponents") {
  CHECK(parse_bytes("1.5KiB") == 1536);
  CHECK(parse_bytes("0.5GiB") == kGiB / 2);
  CHECK(parse_bytes(".5KiB") == 512);
  CHECK(parse_bytes("10.7GB") == 10'700'000'000);
  CHECK(parse_bytes("1e9") == 1'000'000'000);
  CHECK(parse_bytes("1E3B") == 1000);
  CHECK(parse_bytes("2.5e3") == 2500);
  CHECK(parse_bytes("10737418240") == 10 * kGiB);
  CHECK(parse_bytes("9223372036854775807") == INT64_MAX);  // exact, not through a double
}

TEST_CASE("parse_bytes: rejects negatives, garbage, wrong case and overflow") {
  for (const char* bad : {"",
                          " ",
                          "-1",
                          "-1GiB",
                          "+5",
                          "abc",
                          "10 gib",
                          "10gb",
                          "10Gib",
                          "10GIB",
                          "10 GiB/s",
                          "10G",
                          "10 KiBs",
                          "1e",
                          "1e+",
                          "GiB",
                          ".",
                          "1..2",
                          "0x10",
                          "inf",
                          "nan",
                          "10 10",
                          "10\tGiB",
                          "0.5",
                          "0.5B",
                          "1.1",
                          "9223372036854775808",
                          "99999999999999999999",
                          "9000000TiB",
                          "8589934592GiB",
                          "1e30"}) {
    const std::string text = bad;
    CAPTURE(text);
    CHECK_FALSE(parse_bytes(bad).has_value());
  }
}

TEST_CASE("parse_bandwidth: '/s' suffix or a plain number of bytes per second") {
  CHECK(parse_bandwidth("11.5GiB/s") == doctest::Approx(11.5 * 1024 * 1024 * 1024));
  CHECK(parse_bandwidth("8.2GiB/s") == doctest::Approx(8.2 * 1024 * 1024 * 1024));
  CHECK(parse_bandwidth("16 GB/s") == doctest::Approx(16e9));
  CHECK(parse_bandwidth("1e9B/s") == doctest::Approx(1e9));
  CHECK(parse_bandwidth("500MiB/s") == doctest::Approx(500.0 * 1024 * 1024));
  CHECK(parse_bandwidth("12348030976") == doctest::Approx(12348030976.0));
  CHECK(parse_bandwidth("1.5e10") == doctest::Approx(1.5e10));
  CHECK(*parse_bandwidth("11.5GiB/s") == 11.5 * 1024 * 1024 * 1024);  // the reference's exact constant
}

TEST_CASE("parse_bandwidth: rejects zero, negatives, sizes without /s and garbage") {
  for (const char* bad : {"", "0", "0GiB/s", "-1", "-1GiB/s", "11.5GiB", "11.5 gib/s", "1000/s", "/s", "fast",
                          "11.5GiB/h", "11.5GiB /s", "1e999", "inf"}) {
    const std::string text = bad;
    CAPTURE(text);
    CHECK_FALSE(parse_bandwidth(bad).has_value());
  }
}

TEST_CASE("parse_duration_s: s, ms, us, ns or plain seconds") {
  CHECK(parse_duration_s("40ms") == doctest::Approx(0.040));
  CHECK(*parse_duration_s("40ms") == 40 * 1e-3);
  CHECK(parse_duration_s("0.04s") == doctest::Approx(0.04));
  CHECK(parse_duration_s("0.04") == doctest::Approx(0.04));
  CHECK(parse_duration_s("250us") == doctest::Approx(250e-6));
  CHECK(parse_duration_s("10 ns") == doctest::Approx(10e-9));
  CHECK(parse_duration_s("0") == 0.0);
  CHECK(parse_duration_s("2") == 2.0);
  for (const char* bad : {"", "-1", "-40ms", "40 MS", "40m", "40min", "40sec", "abc", "1e999"}) {
    const std::string text = bad;
    CAPTURE(text);
    CHECK_FALSE(parse_duration_s(bad).has_value());
  }
}

TEST_CASE("format_bytes and format_bandwidth pick binary units") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(512 * kMiB) == "512.00 MiB");
  CHECK(format_bytes(10 * kGiB) == "10.00 GiB");
  CHECK(format_bytes(3 * 1024 * kGiB) == "3.00 TiB");
  CHECK(format_bytes(-2 * kGiB) == "-2.00 GiB");
  CHECK(format_bandwidth(11.5 * 1024 * 1024 * 1024) == "11.50 GiB/s");
  CHECK(format_bandwidth(16.0 * 1024 * 1024 * 1024) == "16.00 GiB/s");
  CHECK(format_bandwidth(100.0) == "100.00 B/s");
  CHECK(format_bandwidth(2048.0) == "2.00 KiB/s");
}

TEST_CASE("format_bytes round-trips through parse_bytes") {
  for (Bytes b : {Bytes{1024}, 10 * kGiB, 512 * kMiB, 3 * kKiB}) {
    std::string text = format_bytes(b);
    text.erase(text.find(' '), 1);  // "10.00 GiB" -> "10.00GiB"; a space is accepted too
    CHECK(parse_bytes(text) == b);
    CHECK(parse_bytes(format_bytes(b)) == b);
  }
}

TEST_CASE("parallel_for: every index once, and the lowest failing index's error whatever the thread count") {
  for (unsigned threads : {0u, 1u, 2u, 4u, 16u}) {
    CAPTURE(threads);
    std::vector<std::atomic<int>> calls(1000);
    parallel_for(calls.size(), threads, [&](std::size_t i) { ++calls[i]; });
    for (const auto& c : calls) REQUIRE(c.load() == 1);
    int none = 0;
    parallel_for(0, threads, [&](std::size_t) { ++none; });
    CHECK(none == 0);
    // indices are taken in order, so index 3 always runs and throws; a later failure is never the one reported
    auto failing = [](std::size_t i) {
      if (i == 3 || i == 700) throw std::runtime_error("index " + std::to_string(i));
    };
    std::string what;
    try {
      parallel_for(1000, threads, failing);
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    CHECK(what == "index 3");
  }
}
