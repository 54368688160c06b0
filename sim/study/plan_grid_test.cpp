// Property test over a grid of Harmony plans on bert_large: every plan lowers to a Program whose
// queues and dependencies are consistent and acyclic, never deadlocks, charges every GPU's weights
// exactly once per pack and pass (the JIT pin is not credited, as in the reference), and moves the
// same total activation bytes out as in.
#include <doctest/doctest.h>

#include "core/model/profile.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;

TEST_CASE("a grid of 3,000+ plans lowers, validates and simulates without deadlock") {
  const auto model = core::load_profile(test::source_path("configs/profiles/bert_large.json"));
  int plans = 0;
  for (auto mode : {core::plan_kind("harmony-pp"), core::plan_kind("harmony-dp")}) {
    for (int n : {1, 2, 3, 4}) {
      for (int d : {6, 8}) {
        for (int uf = 1; uf <= d; ++uf) {
          for (int ub = 1; ub <= d; ++ub) {
            for (int pack : {1, 5, 13, 28}) {
              for (bool pf : {false, true}) {
                core::Plan p;
                p.kind = mode;
                p.gpus = n;
                p.minibatch = d;
                p.u_fwd = uf;
                p.u_bwd = ub;
                core::manual_packs(28, pack, p.packs_fwd, p.packs_bwd);
                core::LowerOptions o;
                o.prefetch = pf;
                const auto e = sim::evaluate_plan(model, core::MachineSpec{}, p, o);
                CAPTURE(core::plan_kind_name(mode));
                CAPTURE(n);
                CAPTURE(d);
                CAPTURE(uf);
                CAPTURE(ub);
                CAPTURE(pack);
                CAPTURE(pf);
                REQUIRE_FALSE(e.report.deadlock);
                REQUIRE_NOTHROW(core::validate_program(e.program));
                // weights: one WB per FWD and BWD task of the simulated GPUs, W+B of its pack
                core::Bytes wb = 0;
                core::Bytes want = 0;
                for (const auto& op : e.program.ops) {
                  if (op.kind == core::OpKind::WB) wb += op.bytes;
                }
                for (int r : e.program.devices) {
                  for (int idx : e.program.graph.rank_tasks[static_cast<std::size_t>(r)]) {
                    const auto& t = e.program.graph.tasks[static_cast<std::size_t>(idx)];
                    if (t.type == core::TaskType::Upd) continue;
                    want += model.weight_bytes(t.layers.first, t.layers.last) +
                            model.buffer_bytes(t.layers.first, t.layers.last);
                  }
                }
                REQUIRE(wb == want);
                ++plans;
              }
            }
          }
        }
      }
    }
  }
  CHECK(plans == 2 * 4 * (36 + 64) * 4 * 2);
}
