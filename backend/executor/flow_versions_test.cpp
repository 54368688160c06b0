// FlowVersions (backend/executor/flow_versions.hpp), the interpreter's kind-free version analysis, on hand-made
// Programs: which write each read sees, the reads per version, and the refusals (no producer, a producer the reader
// does not depend on, two unordered producers, a dead later version, a free before a read); FlowStore
// (flow_store.hpp): a version is freed after its last read and updated in place by its last reader; and op_groups.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_device.hpp"
#include "backend/executor/detail.hpp"
#include "backend/executor/flow_store.hpp"
#include "backend/executor/flow_versions.hpp"

namespace {

using namespace harmony::backend;
using namespace harmony::backend::detail;
namespace core = harmony::core;

// A Program of one-op queues (only deps order the ops) over one device tensor, Act of layer 0.
struct Fixture {
  core::Program p;
  int act = -1;
  Fixture() { act = p.dataflow.intern(core::FlowTensor{0, core::FlowKind::Act, 0, 0, 1, -1}); }
  // Adds an op after `deps` that reads and/or writes the tensor (and frees it when `frees`).
  int op(const std::vector<int>& deps, bool reads, bool writes, bool frees = false) {
    const int o = static_cast<int>(p.ops.size());
    core::Op x;
    x.task = o;
    x.kind = core::OpKind::FWD;
    for (const int d : deps) x.deps.push_back(d);
    x.queue = static_cast<int>(p.queues.size());
    x.queue_pos = 0;
    p.ops.push_back(x);
    p.queues.push_back(core::OpQueue{0, core::Stream::Compute, {o}});
    core::OpFlow f;
    if (reads) f.reads.push_back(act);
    if (writes) f.writes.push_back(act);
    if (frees) f.frees.push_back(act);
    p.dataflow.ops.push_back(f);
    return o;
  }
  FlowVersions versions(const Ancestry& anc) const {
    return FlowVersions(
        p, anc, [](const core::FlowTensor&) { return true; },
        [](const core::FlowTensor&) { return std::string("act"); });
  }
};

std::string refusal(const Fixture& f) {
  const Ancestry anc(f.p, {});
  try {
    const FlowVersions v = f.versions(anc);
    v.check_frees(anc);
  } catch (const ScheduleViolation& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("a read sees the latest write among its ancestors; each version counts its reads") {
  Fixture f;
  const int w1 = f.op({}, false, true);
  const int r1 = f.op({w1}, true, false);
  const int acc = f.op({r1}, true, true);  // reads the first version, writes the second
  const int r2 = f.op({acc}, true, false);
  const int r3 = f.op({acc, r2}, true, false);
  const Ancestry anc(f.p, {});
  const FlowVersions v = f.versions(anc);
  CHECK(v.reads(r1).at(0).producer == w1);
  CHECK(v.reads(acc).at(0).producer == w1);
  CHECK(v.reads(r2).at(0).producer == acc);
  CHECK(v.reads(r3).at(0).producer == acc);
  CHECK(v.readers({f.act, w1}) == 2);
  CHECK(v.readers({f.act, acc}) == 2);
  CHECK(v.readers({f.act, r1}) == 0);
  CHECK(v.writes(acc) == std::vector<int>{f.act});
  CHECK(v.writes(r2).empty());
  CHECK_NOTHROW(v.check_frees(anc));
}

TEST_CASE("a free names the version its op writes, else the one it would read, else none") {
  Fixture f;
  const int w1 = f.op({}, false, true);
  const int w2 = f.op({}, false, true);              // unordered with the first free
  const int del1 = f.op({w1}, false, false, true);   // frees the version of w1
  const int both = f.op({del1}, false, true, true);  // writes a version and frees it
  const int del0 = f.op({}, false, false, true);     // no producer among its ancestors
  const Ancestry anc(f.p, {});
  const FlowVersions v = f.versions(anc);
  CHECK(v.freed(del1) == std::vector<FlowVersion>{{f.act, w1}});
  CHECK(v.freed(both) == std::vector<FlowVersion>{{f.act, both}});
  CHECK(v.freed(del0).empty());
  CHECK(v.freed(w2).empty());
}

// A channel (Harmony's host channels) written two samples at a time and read at other sizes: ops in one chain.
struct Ranges {
  core::Program p;
  int add(const std::vector<int>& deps, std::vector<core::FlowTensor> reads, std::vector<core::FlowTensor> writes) {
    const int o = static_cast<int>(p.ops.size());
    core::Op x;
    x.task = o;
    x.kind = core::OpKind::sX;
    for (const int d : deps) x.deps.push_back(d);
    x.queue = static_cast<int>(p.queues.size());
    x.queue_pos = 0;
    p.ops.push_back(x);
    p.queues.push_back(core::OpQueue{0, core::Stream::Cpu, {o}});
    core::OpFlow f;
    for (const auto& t : reads) f.reads.push_back(p.dataflow.intern(t));
    for (const auto& t : writes) f.writes.push_back(p.dataflow.intern(t));
    p.dataflow.ops.push_back(f);
    return o;
  }
  static core::FlowTensor chan(int s0, int n) { return core::FlowTensor{-1, core::FlowKind::HostStash, 3, s0, n, -1}; }
  FlowVersions versions() const {
    const Ancestry anc(p, {});
    return FlowVersions(
        p, anc, [](const core::FlowTensor&) { return false; },
        [](const core::FlowTensor& t) { return fmt::format("stash {}", t.layer); },
        [](const core::FlowTensor& t) { return core::on_host(t.kind); });
  }
  std::string refusal() const {
    try {
      (void)versions();
    } catch (const ScheduleViolation& e) {
      return e.what();
    }
    return "";
  }
};

TEST_CASE("ranged tensors: each sample a read covers resolves to its latest writer among the reader's ancestors") {
  Ranges r;
  const int w0 = r.add({}, {}, {Ranges::chan(0, 2)});
  const int w1 = r.add({w0}, {}, {Ranges::chan(2, 2)});
  const int mid = r.add({w1}, {Ranges::chan(1, 2)}, {});                       // samples 1 and 2: two writers
  const int again = r.add({mid}, {Ranges::chan(2, 2)}, {Ranges::chan(2, 2)});  // reads and rewrites 2, 3 in place
  const int all = r.add({again}, {Ranges::chan(0, 4)}, {});
  const FlowVersions v = r.versions();
  using Run = std::tuple<int, int, int>;  // s0, n, producer
  const auto runs = [&](int o) {
    std::vector<Run> out;
    for (const auto& x : v.sample_reads(o)) out.emplace_back(x.s0, x.n, x.producer);
    return out;
  };
  CHECK(runs(mid) == std::vector<Run>{{1, 1, w0}, {2, 1, w1}});
  CHECK(runs(again) == std::vector<Run>{{2, 2, w1}});
  CHECK(runs(all) == std::vector<Run>{{0, 2, w0}, {2, 2, again}});
  CHECK(v.sample_reads(w0).empty());
  // Each run names the version that holds it (the writer's tensor), and counts as one read of it: the store keeps a
  // ranged version until its last run has been read (FlowStore::finished).
  const core::Dataflow& df = r.p.dataflow;
  CHECK(v.sample_reads(mid)[0].source == df.find(Ranges::chan(0, 2)));
  CHECK(v.sample_reads(mid)[1].source == df.find(Ranges::chan(2, 2)));
  CHECK(v.ranged_writes(w1) == std::vector<int>{df.find(Ranges::chan(2, 2))});
  CHECK(v.readers(FlowVersion{df.find(Ranges::chan(0, 2)), w0}) == 2);     // mid's sample 1, all's 0 and 1
  CHECK(v.readers(FlowVersion{df.find(Ranges::chan(2, 2)), w1}) == 2);     // mid's sample 2, again's 2 and 3
  CHECK(v.readers(FlowVersion{df.find(Ranges::chan(2, 2)), again}) == 1);  // all's 2 and 3
}

TEST_CASE("ranged tensors: a sample nobody writes before the read, or a writer unordered with it, is refused") {
  Ranges none;
  (void)none.add({}, {}, {Ranges::chan(0, 2)});
  (void)none.add({0}, {Ranges::chan(1, 2)}, {});  // sample 2 is never written
  CHECK(none.refusal().find("reads stash 3 sample 2, which no op writes before it") != std::string::npos);
  Ranges race;
  (void)race.add({}, {}, {Ranges::chan(0, 2)});
  (void)race.add({0}, {Ranges::chan(0, 2)}, {});
  (void)race.add({0}, {}, {Ranges::chan(1, 1)});  // rewrites sample 1, unordered with the reader
  CHECK(race.refusal().find("which op") != std::string::npos);
  CHECK(race.refusal().find("may write first") != std::string::npos);
}

TEST_CASE("untracked tensors are left out") {
  Fixture f;
  const int w = f.op({}, false, true);
  const int r = f.op({w}, true, false);
  const Ancestry anc(f.p, {});
  const FlowVersions v(
      f.p, anc, [](const core::FlowTensor&) { return false; }, [](const core::FlowTensor&) { return std::string(); });
  CHECK(v.reads(r).empty());
  CHECK(v.writes(w).empty());
  CHECK(v.reader_counts().empty());
}

TEST_CASE("refusals name the ops") {
  SUBCASE("no producer") {
    Fixture f;
    (void)f.op({}, true, false);
    CHECK(refusal(f).find("reads act, which no op produces") != std::string::npos);
  }
  SUBCASE("a producer the reader does not depend on") {
    Fixture f;
    (void)f.op({}, false, true);
    (void)f.op({}, true, false);
    CHECK(refusal(f).find("on which it does not depend") != std::string::npos);
  }
  SUBCASE("two unordered producers") {
    Fixture f;
    const int a = f.op({}, false, true);
    const int b = f.op({}, false, true);
    (void)f.op({a, b}, true, false);
    CHECK(refusal(f).find("which are not ordered") != std::string::npos);
  }
  SUBCASE("a later version nobody reads, unordered with a reader of the earlier one") {
    Fixture f;
    const int a = f.op({}, false, true);
    (void)f.op({a}, false, true);  // nobody reads its version
    (void)f.op({a}, true, false);  // reads a's: misses its dependency on the later write
    CHECK(refusal(f).find("which no op reads: neither depends on the other") != std::string::npos);
  }
  SUBCASE("a later version read by others, unordered with a reader of the earlier one: two live versions") {
    Fixture f;
    const int a = f.op({}, false, true);
    const int b = f.op({a}, false, true);
    (void)f.op({a}, true, false);
    (void)f.op({b}, true, false);
    CHECK(refusal(f).empty());
  }
  SUBCASE("a free before a read") {
    Fixture f;
    const int w = f.op({}, false, true);
    const int fr = f.op({w}, false, false, true);
    (void)f.op({fr}, true, false);
    CHECK(refusal(f).find("frees before it") != std::string::npos);
  }
  SUBCASE("a free unordered with a read") {
    Fixture f;
    const int w = f.op({}, false, true);
    (void)f.op({w}, false, false, true);
    (void)f.op({w}, true, false);
    CHECK(refusal(f).find("may free first") != std::string::npos);
  }
}

TEST_CASE("the store frees a version after its last read; its last reader updates it in place") {
  Fixture f;
  const int w = f.op({}, false, true);
  const int r1 = f.op({w}, true, false);
  const int acc = f.op({r1}, true, true);  // the last reader of w's version: updates it in place
  const int r2 = f.op({acc}, true, false);
  const int unread = f.op({r2}, false, true);  // a version nobody reads: freed when its writer ends
  f.p.graph.plan.gpus = 1;
  auto dev = cpu::make_cpu_device(0, {.capacity = harmony::core::kMiB});
  const std::vector<Device*> devs{dev.get()};
  QueueResources qr(f.p, devs, ExecutorOptions{});
  const Ancestry anc(f.p, {});
  const FlowVersions v = f.versions(anc);
  FlowStore store(f.p, v, qr);
  qr.begin_step();
  store.begin_step();
  const auto in_use = [&] {
    qr.synchronize();
    return dev->memory().in_use;
  };
  const auto put = [&](int o) -> FlowData& {
    FlowData d;
    d.buf = dev->alloc(1024, "act");
    return store.put(o, f.act, std::move(d));
  };
  const auto done = [&](int o) {
    qr.record(o);
    store.finished(o);
  };
  void* first = put(w).data();
  done(w);
  CHECK(store.get(r1, f.act).data() == first);
  CHECK_FALSE(store.last_reader(acc, f.act));  // r1 has not ended
  done(r1);
  CHECK(store.last_reader(acc, f.act));
  FlowData* same = store.take(acc, f.act);
  REQUIRE(same != nullptr);
  CHECK(same->data() == first);
  done(acc);
  CHECK(in_use() > 0);
  CHECK(store.get(r2, f.act).data() == first);
  CHECK_THROWS_AS(store.put(r2, f.act, FlowData{}), harmony::core::InternalError);  // r2 writes nothing
  done(r2);                                                                         // the last read of acc's version
  CHECK(in_use() == 0);
  (void)put(unread);
  CHECK(in_use() > 0);
  done(unread);
  CHECK(in_use() == 0);
}

TEST_CASE("op_groups: pairs send first, collectives one member per GPU in device order") {
  core::Program p;
  p.graph.plan.gpus = 2;
  const auto add = [&](core::OpKind k, int device, int peer) {
    core::Op x;
    x.kind = k;
    x.device = device;
    x.peer = peer;
    p.ops.push_back(x);
    p.dataflow.ops.emplace_back();
  };
  add(core::OpKind::X, 1, 1);     // 0: receives from op 1
  add(core::OpKind::Y, 0, 0);     // 1: sends to op 0
  add(core::OpKind::ARD, 1, -1);  // 2
  add(core::OpKind::ARD, 0, -1);  // 3
  add(core::OpKind::FWD, 0, -1);  // 4
  const auto g = harmony::backend::detail::op_groups(p);
  CHECK(g[0] == std::vector<int>{1, 0});
  CHECK(g[1] == std::vector<int>{1, 0});
  CHECK(g[2] == std::vector<int>{3, 2});
  CHECK(g[3] == std::vector<int>{3, 2});
  CHECK(g[4] == std::vector<int>{4});
  p.ops[2].layers = core::LayerRange{1, 1};  // now two collectives of one member each
  CHECK_THROWS_WITH_AS(harmony::backend::detail::op_groups(p), doctest::Contains("has 1 members for 2 GPUs"),
                       BackendError);
}

}  // namespace
