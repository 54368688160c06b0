// The task graph against the paper's composer: placement and order of §5.3's worked example, the
// channels and patches of §5.4 (JIT pin, last-forward message), Harmony-DP replication, the
// microbatch converter examples of §6.1, manual packing and plan validation errors.
#include <doctest/doctest.h>

#include "core/base/error.hpp"
#include "core/program/task_graph.hpp"

using namespace harmony::core;

namespace {
Plan bert_plan(PlanKind mode, int gpus, int d, int uf, int ub, int pack) {
  Plan p;
  p.kind = mode;
  p.gpus = gpus;
  p.minibatch = d;
  p.u_fwd = uf;
  p.u_bwd = ub;
  manual_packs(28, pack, p.packs_fwd, p.packs_bwd);
  return p;
}
}  // namespace

TEST_CASE("manual packs: P layers counted from the end, the first pack takes the remainder") {
  Packs f, b;
  manual_packs(28, 7, f, b);
  CHECK(b == Packs{{0, 6}, {7, 13}, {14, 20}, {21, 27}});
  CHECK(f == Packs{{0, 6}, {7, 13}, {14, 20}});
  manual_packs(28, 5, f, b);  // 28 = 3 + 5*5
  CHECK(b.front() == LayerRange{0, 2});
  CHECK(b.size() == 6);
  manual_packs(28, 28, f, b);
  CHECK(b == Packs{{0, 27}});
  CHECK(f.empty());
}

TEST_CASE("§5.3 example: bert_large R=28 P=7 N=2 harmony-pp, round-robin wraps from forward into backward") {
  const auto g = compose_task_graph(bert_plan(plan_kind("harmony-pp"), 2, 16, 8, 8, 7), 28);
  // idx0 F[0-6]@G0, 1 F[7-13]@G1, 2 F[14-20]@G0, 3 B[21-27]@G1, 4 U@CPU1, 5 B[14-20]@G0, 6 U@CPU0,
  // 7 B[7-13]@G1, 8 U@CPU1, 9 B[0-6]@G0, 10 U@CPU0
  struct E {
    TaskType t;
    int first, last, rank;
  };
  const E want[] = {{TaskType::Fwd, 0, 6, 0},   {TaskType::Fwd, 7, 13, 1},  {TaskType::Fwd, 14, 20, 0},
                    {TaskType::Bwd, 21, 27, 1}, {TaskType::Upd, 21, 27, 1}, {TaskType::Bwd, 14, 20, 0},
                    {TaskType::Upd, 14, 20, 0}, {TaskType::Bwd, 7, 13, 1},  {TaskType::Upd, 7, 13, 1},
                    {TaskType::Bwd, 0, 6, 0},   {TaskType::Upd, 0, 6, 0}};
  REQUIRE(g.tasks.size() == 11);
  for (std::size_t i = 0; i < 11; ++i) {
    CAPTURE(i);
    CHECK(g.tasks[i].type == want[i].t);
    CHECK(g.tasks[i].layers == LayerRange{want[i].first, want[i].last});
    CHECK(g.tasks[i].rank == want[i].rank);
  }
  CHECK(g.loss_rank == 1);
  // channels: F0 gets data, sends Y by P2P to F1; the criterion gets X from F2 by P2P
  CHECK(g.tasks[0].in_x.medium == Medium::Data);
  CHECK(g.tasks[0].out_y.medium == Medium::P2P);
  CHECK(g.tasks[0].out_y.peer_task == 1);
  CHECK(g.tasks[3].in_x.medium == Medium::P2P);
  CHECK(g.tasks[3].in_x.peer_task == 2);
  // stashes: F0 stashes X[0] for B9, F1 X[7] for B7, F2 X[14] for B5
  REQUIRE(g.tasks[0].stashes.size() == 1);
  CHECK(g.tasks[0].stashes[0].layer == 0);
  CHECK(g.tasks[0].stashes[0].bwd_task == 9);
  CHECK(g.tasks[2].stashes[0].bwd_task == 5);
  CHECK(g.tasks[5].in_x.medium == Medium::Msg);
  CHECK(g.tasks[5].in_x.peer_task == 2);
  CHECK(g.tasks[5].in_dy.medium == Medium::P2P);
  CHECK(g.tasks[5].in_dy.peer_task == 3);
  CHECK(g.tasks[9].out_dx.medium == Medium::None);  // has the data layer: no dX
  // JIT pin: GPU0 runs F[14-20] then B[14-20]
  CHECK(g.tasks[2].w_pinned_to == 5);
  CHECK(g.tasks[5].w_pinned_from == 2);
  CHECK(g.tasks[1].w_pinned_to == -1);  // GPU1: F[7-13] then B[21-27] share no layers
  CHECK_FALSE(g.last_fwd_msg);
  CHECK(g.non_empty_ranks() == 2);
}

TEST_CASE("last-forward message: harmony-pp, N > 1, u_fwd != u_bwd") {
  const auto g = compose_task_graph(bert_plan(plan_kind("harmony-pp"), 2, 32, 16, 8, 7), 28);
  CHECK(g.last_fwd_msg);
  CHECK(g.tasks[2].out_y.medium == Medium::Msg);
  CHECK(g.tasks[3].in_x.medium == Medium::Msg);
  const auto g1 = compose_task_graph(bert_plan(plan_kind("harmony-pp"), 1, 32, 16, 8, 7), 28);
  CHECK_FALSE(g1.last_fwd_msg);  // one GPU: swap instead
  CHECK(g1.tasks[3].in_x.medium == Medium::Swap);
}

TEST_CASE("harmony-dp replicates the task list per GPU; D % N samples go to the first GPUs") {
  const auto g = compose_task_graph(bert_plan(plan_kind("harmony-dp"), 3, 32, 2, 2, 7), 28);
  REQUIRE(g.tasks.size() == 33);
  CHECK(g.tasks[11].rank == 1);
  CHECK(g.tasks[11].idx == 11);
  // 32 = 11 + 11 + 10
  CHECK(g.ubatch_fwd[0] == std::vector<int>{2, 2, 2, 2, 2, 1});
  CHECK(g.ubatch_fwd[2] == std::vector<int>{2, 2, 2, 2, 2});
  for (const auto& t : g.tasks) {
    if (t.type == TaskType::Fwd && !t.has_data) CHECK(t.in_x.medium == Medium::Swap);
    CHECK(t.w_pinned_to == -1);  // the JIT pin never triggers in DP
  }
}

TEST_CASE("§6.1 microbatch converter examples") {
  auto c = make_ubatch_converter({16, 16}, {8, 8, 8, 8}, 8);
  CHECK(c.bwd_idx == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(c.fwd_of_bwd == std::vector<int>{0, 0, 1, 1});
  c = make_ubatch_converter({4, 4, 1}, {2, 2, 2, 2, 1}, 2);
  CHECK(c.bwd_idx == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4}});
  // a residual carried over: two forward microbatches of 4 make one backward microbatch of 8
  c = make_ubatch_converter({4, 4}, {8}, 8);
  CHECK(c.bwd_idx == std::vector<std::vector<int>>{{}, {0}});
  CHECK(c.fwd_of_bwd == std::vector<int>{1});
}

TEST_CASE("plan validation names the problem") {
  Plan p = bert_plan(plan_kind("harmony-pp"), 2, 16, 8, 8, 7);
  CHECK_NOTHROW(validate_packs(p, 28));
  Plan skip = p;
  skip.packs_bwd = {{0, 6}, {8, 27}};
  skip.packs_fwd = {{0, 6}};
  CHECK_THROWS_WITH_AS(validate_packs(skip, 28), doctest::Contains("skips"), ScheduleError);
  Plan overlap = p;
  overlap.packs_bwd = {{0, 6}, {6, 27}};
  overlap.packs_fwd = {{0, 5}};
  CHECK_THROWS_WITH_AS(validate_packs(overlap, 28), doctest::Contains("overlaps"), ScheduleError);
  Plan short_fwd = p;
  short_fwd.packs_fwd = {{0, 6}};
  CHECK_THROWS_WITH_AS(validate_packs(short_fwd, 28), doctest::Contains("forward packs cover"), ScheduleError);
  Plan neg = p;
  neg.u_fwd = -1;
  CHECK_THROWS_AS(validate_packs(neg, 28), ScheduleError);
  Plan dp = p;
  dp.kind = plan_kind("harmony-dp");
  dp.gpus = 32;
  CHECK_THROWS_WITH_AS(validate_packs(dp, 28), doctest::Contains("no samples"), ScheduleError);
  for (PlanKind k : plan_kinds()) {  // every kind without packs
    if (k->packs) continue;
    Plan b = p;
    b.kind = k;
    CHECK_THROWS_WITH_AS(validate_packs(b, 28), doctest::Contains("plans have no layer packs"), ScheduleError);
  }
}
