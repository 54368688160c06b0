// ProgramGraph on a hand-built Program: predecessor order (deps, queue predecessor, extra edges), successor
// order (ascending op, then predecessor order: the order both simulators rely on to be bit-identical),
// queue_predecessor, the topological order, and the cycle verdicts of the graph and of validate_program.
#include <doctest/doctest.h>

#include <vector>

#include "core/base/error.hpp"
#include "core/program/program_graph.hpp"

using namespace harmony::core;

namespace {
std::vector<int> v(std::span<const int> s) { return {s.begin(), s.end()}; }

// Two queues: q0 = [0, 1] (Compute), q1 = [2, 3] (SwapOut); 2 waits for 0, 3 for 1 and 0.
Program two_queues() {
  Program p;
  p.ops.resize(4);
  p.queues = {OpQueue{0, Stream::Compute, {0, 1}}, OpQueue{0, Stream::SwapOut, {2, 3}}};
  for (int q = 0; q < 2; ++q)
    for (int k = 0; k < 2; ++k) {
      Op& o = p.ops[static_cast<std::size_t>(p.queues[static_cast<std::size_t>(q)].ops[static_cast<std::size_t>(k)])];
      o.queue = q;
      o.queue_pos = k;
      o.stream = p.queues[static_cast<std::size_t>(q)].stream;
    }
  p.ops[2].deps = {0};
  p.ops[3].deps = {1, 0};
  return p;
}
}  // namespace

TEST_CASE("queue_predecessor: the op before in its queue, -1 at the head") {
  const Program p = two_queues();
  CHECK(queue_predecessor(p, 0) == -1);
  CHECK(queue_predecessor(p, 1) == 0);
  CHECK(queue_predecessor(p, 2) == -1);
  CHECK(queue_predecessor(p, 3) == 2);
}

TEST_CASE("predecessors: deps in their order, then the queue predecessor, then the extra edges") {
  const Program p = two_queues();
  const ProgramGraph g(p);
  REQUIRE(g.size() == 4);
  CHECK(v(g.predecessors(0)).empty());
  CHECK(v(g.predecessors(1)) == std::vector<int>{0});
  CHECK(v(g.predecessors(2)) == std::vector<int>{0});
  CHECK(v(g.predecessors(3)) == std::vector<int>{1, 0, 2});
  CHECK(g.predecessor_count(3) == 3);
  const ProgramGraph e(p, {{}, {2}});  // op 1 must also wait for op 2
  CHECK(v(e.predecessors(1)) == std::vector<int>{0, 2});
  CHECK(v(e.predecessors(3)) == std::vector<int>{1, 0, 2});
}

TEST_CASE("successors: ascending op, each in its predecessors' order") {
  const ProgramGraph g(two_queues());
  CHECK(v(g.successors(0)) == std::vector<int>{1, 2, 3});
  CHECK(v(g.successors(1)) == std::vector<int>{3});
  CHECK(v(g.successors(2)) == std::vector<int>{3});
  CHECK(v(g.successors(3)).empty());
  const ProgramGraph e(two_queues(), {{}, {2}});
  CHECK(v(e.successors(2)) == std::vector<int>{1, 3});
}

TEST_CASE("topological order: every op after its predecessors; a cycle leaves ops out") {
  const Program p = two_queues();
  CHECK(ProgramGraph(p).topological_order() == std::vector<int>{0, 1, 2, 3});
  CHECK(ProgramGraph(p, {{}, {2}}).topological_order() == std::vector<int>{0, 2, 1, 3});
  CHECK(topological_order(p) == std::vector<int>{0, 1, 2, 3});
  // 0 waits for 3, which waits (through its queue and deps) for 0
  CHECK(ProgramGraph(p, {{3}}).topological_order().empty());
  Program cyc = p;
  cyc.ops[0].deps = {3};
  CHECK(ProgramGraph(cyc).topological_order().empty());
  CHECK_THROWS_WITH_AS(validate_program(cyc), doctest::Contains("cycle"), ScheduleError);
  CHECK_THROWS_WITH_AS(topological_order(cyc), doctest::Contains("cycle"), ScheduleError);
  CHECK_NOTHROW(validate_program(p));
}

TEST_CASE("an empty Program has an empty graph") {
  const ProgramGraph g(Program{});
  CHECK(g.size() == 0);
  CHECK(g.topological_order().empty());
}
