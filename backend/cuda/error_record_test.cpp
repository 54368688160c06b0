// The CUDA kernels' error record protocol (backend/cuda/error_record.hpp) on the CPU: writer threads stand in for
// kernels, the consumer for the stream's check. Runs in every build (no CUDA needed).
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "backend/cuda/error_record.hpp"

namespace kern = harmony::backend::cuda::kern;

namespace {
kern::ErrorRecord fresh() {
  kern::ErrorRecord r;
  std::memset(&r, 0, sizeof r);
  return r;
}
}  // namespace

TEST_CASE("the first report wins and is consumed once") {
  kern::ErrorRecord rec = fresh();
  CHECK_FALSE(kern::consume_error(&rec).has_value());
  kern::report_error(&rec, kern::kErrTargetId, 70000, 12, -1, 50257);
  kern::report_error(&rec, kern::kErrEmbeddingId, 9, 1, 1, 5);  // dropped: the record holds an unread report
  const std::optional<kern::ErrorReport> r = kern::consume_error(&rec);
  REQUIRE(r.has_value());
  CHECK(r->code == kern::kErrTargetId);
  CHECK(r->value == 70000);
  CHECK(r->a == 12);
  CHECK(r->b == -1);
  CHECK(r->limit == 50257);
  CHECK_FALSE(kern::consume_error(&rec).has_value());           // once
  kern::report_error(&rec, kern::kErrEmbeddingId, 9, 1, 1, 5);  // the record is free again
  const auto again = kern::consume_error(&rec);
  REQUIRE(again.has_value());
  CHECK(again->code == kern::kErrEmbeddingId);
}

TEST_CASE("a record a writer is still filling is not consumed (it surfaces complete on a later check)") {
  // The old host check read a claimed record (code -1) as a report: it threw "error code -1" with torn fields,
  // reset the record under the writer, and the writer's code then surfaced a second time.
  kern::ErrorRecord rec = fresh();
  rec.code = kern::kErrBusy;
  rec.value = 123;  // half written
  CHECK_FALSE(kern::consume_error(&rec).has_value());
  CHECK(rec.code == kern::kErrBusy);  // not reset under the writer
  // The writer finishes: publishes its code last.
  rec.a = 4;
  rec.b = 5;
  rec.limit = 6;
  __atomic_store_n(&rec.code, static_cast<int>(kern::kErrEmbeddingId), __ATOMIC_RELEASE);
  const auto r = kern::consume_error(&rec);
  REQUIRE(r.has_value());
  CHECK(r->code == kern::kErrEmbeddingId);
  CHECK(r->value == 123);
  CHECK(r->limit == 6);
}

TEST_CASE("concurrent writers and a polling consumer: every consumed report is whole, none twice") {
  kern::ErrorRecord rec = fresh();
  constexpr int kWriters = 4, kPerWriter = 20000;
  std::atomic<bool> stop{false};
  std::vector<kern::ErrorReport> seen;
  std::thread consumer([&] {
    while (!stop.load(std::memory_order_acquire)) {
      if (auto r = kern::consume_error(&rec)) seen.push_back(*r);
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&rec, w] {
      for (int i = 0; i < kPerWriter; ++i) {
        const long long id = static_cast<long long>(w) * kPerWriter + i + 1;
        // Every field derives from the id, so a torn read (fields of two reports) is visible.
        kern::report_error(&rec, kern::kErrTargetId, id, id * 3, id * 5, id * 7);
      }
    });
  }
  for (auto& t : writers) t.join();
  stop.store(true, std::memory_order_release);
  consumer.join();
  if (auto r = kern::consume_error(&rec)) seen.push_back(*r);  // the last one, after every writer finished
  CHECK(rec.code == kern::kErrNone);
  REQUIRE_FALSE(seen.empty());
  std::set<long long> ids;
  for (const auto& r : seen) {
    CHECK(r.code == kern::kErrTargetId);
    CHECK(r.a == r.value * 3);
    CHECK(r.b == r.value * 5);
    CHECK(r.limit == r.value * 7);
    CHECK(ids.insert(r.value).second);  // consumed once
  }
}
