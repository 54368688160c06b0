// The discrete-event engine on hand-built Programs (timing rule, rendezvous, deadlock report,
// cycle detection), cross-checked against a one-pass topological evaluation on real plans, and
// the Chrome trace export (valid JSON, one complete event per op, pid = GPU, tid = stream).
#include <doctest/doctest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/model/profile.hpp"
#include "core/output/trace.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using core::OpKind;
using core::Stream;
using harmony::test::source_dir;

namespace {

// A small program builder: ops appended to (device, stream) queues in call order.
struct Builder {
  core::Program p;
  int add(int device, Stream s, std::vector<int> deps = {}) {
    core::Op o;
    o.device = device;
    o.stream = s;
    o.kind = s == Stream::Compute ? OpKind::FWD : OpKind::X;
    o.task = static_cast<int>(p.ops.size());
    o.deps.assign(deps.begin(), deps.end());
    int q = -1;
    for (std::size_t i = 0; i < p.queues.size(); ++i) {
      if (p.queues[i].device == device && p.queues[i].stream == s) q = static_cast<int>(i);
    }
    if (q < 0) {
      q = static_cast<int>(p.queues.size());
      p.queues.push_back({device, s, {}});
    }
    o.queue = q;
    o.queue_pos = static_cast<int>(p.queues[static_cast<std::size_t>(q)].ops.size());
    const int id = static_cast<int>(p.ops.size());
    p.queues[static_cast<std::size_t>(q)].ops.push_back(id);
    p.ops.push_back(o);
    return id;
  }
};

}  // namespace

TEST_CASE("an op begins at the latest end of its dependencies and its stream predecessor") {
  Builder b;
  b.p.graph.plan.gpus = 1;
  const int a = b.add(0, Stream::Compute);       // [0, 10)
  const int x = b.add(0, Stream::SwapIn);        // [0, 5)
  const int c = b.add(0, Stream::Compute, {x});  // after a (stream) and x: [10, 17)
  const int y = b.add(0, Stream::SwapIn, {a});   // after x (stream) and a: [10, 13)
  const auto t = sim::run_timeline(b.p, {10, 5, 7, 3});
  CHECK_FALSE(t.deadlock);
  CHECK(t.begin_ps[static_cast<std::size_t>(a)] == 0);
  CHECK(t.begin_ps[static_cast<std::size_t>(x)] == 0);
  CHECK(t.begin_ps[static_cast<std::size_t>(c)] == 10);
  CHECK(t.end_ps[static_cast<std::size_t>(c)] == 17);
  CHECK(t.begin_ps[static_cast<std::size_t>(y)] == 10);
  CHECK(t.events_processed == 4);
}

TEST_CASE("a deadlock names each blocked op and what it waits for") {
  Builder b;
  b.p.graph.plan.gpus = 2;
  // GPU0 Compute: s waits for r2 (GPU1 P2PIn), GPU1 P2PIn: r1 waits for s, r2 after r1: a cycle
  const int r1 = 1;
  const int r2 = 2;
  const int s = b.add(0, Stream::Compute, {r2});
  b.add(1, Stream::P2PIn, {s});
  b.add(1, Stream::P2PIn);
  const auto t = sim::run_timeline(b.p, {1, 1, 1});
  REQUIRE(t.deadlock);
  REQUIRE(t.blocked.size() == 2);
  CHECK(t.blocked[0].op == s);
  CHECK(t.blocked[0].waiting_for == std::vector<int>{r2});
  CHECK(t.blocked[1].op == r1);
  const std::string report = sim::deadlock_report(b.p, t);
  CHECK(report.find("GPU0 Compute") != std::string::npos);
  CHECK(report.find("GPU1 P2PIn") != std::string::npos);
  CHECK(report.find("not started") != std::string::npos);
  CHECK_THROWS_WITH_AS(core::validate_program(b.p), doctest::Contains("cycle"), core::ScheduleError);
}

TEST_CASE("same-time completions are deterministic and the engine equals a topological one-pass evaluation") {
  const auto model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  const core::MachineSpec machine;
  for (bool pf : {false, true}) {
    for (auto mode : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")}) {
      core::Plan p;
      p.kind = mode;
      p.gpus = 2;
      p.minibatch = 32;
      p.u_fwd = 8;
      p.u_bwd = 4;
      core::manual_packs(28, 5, p.packs_fwd, p.packs_bwd);
      core::LowerOptions o;
      o.prefetch = pf;
      const auto e1 = sim::evaluate_plan(model, machine, p, o);
      const auto e2 = sim::evaluate_plan(model, machine, p, o);
      CHECK(e1.timeline.begin_ps == e2.timeline.begin_ps);
      CHECK_NOTHROW(core::validate_program(e1.program));
      // begin(e) = max(end(deps) U end(stream predecessor)), evaluated in topological order
      const auto order = core::topological_order(e1.program);
      std::vector<core::TimePs> end(e1.program.ops.size(), 0);
      for (int i : order) {
        const auto& op = e1.program.ops[static_cast<std::size_t>(i)];
        core::TimePs begin = 0;
        for (int d : op.deps) begin = std::max(begin, end[static_cast<std::size_t>(d)]);
        if (op.queue_pos > 0) {
          const int pred =
              e1.program.queues[static_cast<std::size_t>(op.queue)].ops[static_cast<std::size_t>(op.queue_pos - 1)];
          begin = std::max(begin, end[static_cast<std::size_t>(pred)]);
        }
        CHECK(begin == e1.timeline.begin_ps[static_cast<std::size_t>(i)]);
        end[static_cast<std::size_t>(i)] = begin + e1.timeline.duration_ps[static_cast<std::size_t>(i)];
      }
      // P2P rendezvous: a send and its receive start together and last as long
      for (std::size_t i = 0; i < e1.program.ops.size(); ++i) {
        const int peer = e1.program.ops[i].peer;
        if (peer < 0) continue;
        CHECK(e1.timeline.begin_ps[i] == e1.timeline.begin_ps[static_cast<std::size_t>(peer)]);
        CHECK(e1.timeline.duration_ps[i] == e1.timeline.duration_ps[static_cast<std::size_t>(peer)]);
      }
    }
  }
}

TEST_CASE("the Chrome trace has one complete event per op, pid = GPU, tid = stream, names with layers and mb") {
  const auto model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  core::Plan p;
  p.gpus = 2;
  p.minibatch = 16;
  p.u_fwd = 8;
  p.u_bwd = 8;
  core::manual_packs(28, 7, p.packs_fwd, p.packs_bwd);
  const auto e = sim::evaluate_plan(model, core::MachineSpec{}, p, core::LowerOptions{});
  std::ostringstream out;
  core::write_chrome_trace(out, e.program, e.timeline.begin_ps, e.timeline.end_ps, {"test", "t"});
  const auto j = nlohmann::json::parse(out.str());
  REQUIRE(j.contains("traceEvents"));
  std::size_t complete = 0;
  bool saw_fwd = false;
  for (const auto& ev : j["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    ++complete;
    CHECK(ev["pid"].get<int>() >= 0);
    CHECK(ev["pid"].get<int>() < 2);
    CHECK(ev["tid"].get<int>() < core::kNumStreams);
    CHECK(ev["dur"].get<double>() >= 0);
    if (ev["name"] == "t0 FWD L0-6 mb1 u8") saw_fwd = true;
  }
  CHECK(complete == e.program.ops.size());
  CHECK(complete == 88);  // the reference's event count for this plan (§6.8)
  CHECK(saw_fwd);
}

TEST_CASE("prefetch buffers: input i waits for microbatch i - K; K = 2 is the paper's double buffer") {
  const auto model = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  core::Plan p;
  p.gpus = 2;
  p.minibatch = 32;
  p.u_fwd = 4;
  p.u_bwd = 4;
  core::manual_packs(28, 7, p.packs_fwd, p.packs_bwd);
  const auto graph = core::compose_task_graph(p, 28);
  core::LowerOptions two;
  two.prefetch = true;
  core::LowerOptions three = two;
  three.prefetch_buffers = 3;
  const auto a = core::lower_harmony(graph, model, two);
  const auto b = core::lower_harmony(graph, model, three);
  REQUIRE(a.ops.size() == b.ops.size());
  // the FWD task t1 (layers 7-13) receives X by P2P: with K buffers, X of microbatch i >= K depends on
  // the compute of microbatch i - K of the same task, and on no later one
  for (const auto* prog : {&a, &b}) {
    const int k = prog == &a ? 2 : 3;
    for (std::size_t i = 0; i < prog->ops.size(); ++i) {
      const auto& op = prog->ops[i];
      if (op.task != 1 || op.kind != core::OpKind::X || op.ui < k) continue;
      bool waits = false;
      for (int d : op.deps) {
        const auto& dop = prog->ops[static_cast<std::size_t>(d)];
        if (dop.task == 1 && dop.kind == core::OpKind::FWD) {
          CHECK(dop.ui <= op.ui - k);
          waits = waits || dop.ui == op.ui - k;
        }
      }
      CHECK(waits);
    }
  }
  // one more buffer never makes the simulated iteration slower under the reference model
  const core::MachineSpec machine;
  sim::ReferenceCostModel cost(model, machine);
  const auto ra = sim::simulate(a, cost);
  const auto rb = sim::simulate(b, cost);
  CHECK(rb.iteration_time_s <= ra.iteration_time_s);
}
