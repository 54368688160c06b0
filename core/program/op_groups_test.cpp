// core::op_groups on hand-built Programs without a dataflow (as harmony-sim lowers them): a P2P pair send first, the
// collectives grouped by occurrence (the k-th of each device per kind, layers and microbatch, in device order), and
// collectives of other layers or microbatches apart.
#include <doctest/doctest.h>

#include <vector>

#include "core/program/program.hpp"

namespace {

using harmony::core::LayerRange;
using harmony::core::Op;
using harmony::core::OpKind;
using harmony::core::Program;

int add(Program& p, OpKind k, int device, LayerRange layers = {0, 0}, int ui = 0, int peer = -1) {
  Op x;
  x.kind = k;
  x.device = device;
  x.layers = layers;
  x.ui = ui;
  x.peer = peer;
  p.ops.push_back(x);
  return static_cast<int>(p.ops.size()) - 1;
}

TEST_CASE("op_groups: a P2P pair runs send first, other ops alone") {
  Program p;
  p.graph.plan.gpus = 2;
  add(p, OpKind::X, 1, {1, 1}, 0, 1);   // 0: receives from op 1
  add(p, OpKind::Y, 0, {0, 0}, 0, 0);   // 1: sends to op 0
  add(p, OpKind::dY, 0, {0, 0}, 0, 3);  // 2: receives from op 3
  add(p, OpKind::dX, 1, {1, 1}, 0, 2);  // 3: sends to op 2
  add(p, OpKind::FWD, 0);               // 4
  const auto g = harmony::core::op_groups(p);
  CHECK(p.dataflow.ops.empty());
  CHECK(g[0] == std::vector<int>{1, 0});
  CHECK(g[1] == std::vector<int>{1, 0});
  CHECK(g[2] == std::vector<int>{3, 2});
  CHECK(g[3] == std::vector<int>{3, 2});
  CHECK(g[4] == std::vector<int>{4});
}

TEST_CASE("op_groups: the k-th collective of each device per kind, layers and microbatch, in device order") {
  Program p;
  p.graph.plan.gpus = 2;
  // an all-gather of layer 2 in each pass (no dataflow says which): the first of each device together, then the second
  const int f1 = add(p, OpKind::AG, 1, {2, 2});
  const int f0 = add(p, OpKind::AG, 0, {2, 2});
  const int b0 = add(p, OpKind::AG, 0, {2, 2});
  const int b1 = add(p, OpKind::AG, 1, {2, 2});
  // the same layers under another kind or microbatch, and other layers, are other collectives
  const int r0 = add(p, OpKind::RS, 0, {2, 2});
  const int u1 = add(p, OpKind::ARD, 1, {2, 2}, 1);
  const int u0 = add(p, OpKind::ARD, 0, {2, 2}, 1);
  const int w0 = add(p, OpKind::ARD, 0, {2, 3}, 1);
  const auto g = harmony::core::op_groups(p);
  CHECK(g[static_cast<std::size_t>(f1)] == std::vector<int>{f0, f1});
  CHECK(g[static_cast<std::size_t>(f0)] == std::vector<int>{f0, f1});
  CHECK(g[static_cast<std::size_t>(b0)] == std::vector<int>{b0, b1});
  CHECK(g[static_cast<std::size_t>(b1)] == std::vector<int>{b0, b1});
  CHECK(g[static_cast<std::size_t>(r0)] == std::vector<int>{r0});
  CHECK(g[static_cast<std::size_t>(u1)] == std::vector<int>{u0, u1});
  CHECK(g[static_cast<std::size_t>(w0)] == std::vector<int>{w0});
}

}  // namespace
