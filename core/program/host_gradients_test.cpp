// core::host_gradients on hand-built Programs: the writers of a layer range's host gradient in (device, queue)
// order whatever the ops' order, the first copying and the later adding; an all-reduced range's other replicas
// dropped; a sharded range's ranks each copying their own shard first. And the bounce's chunk in whole elements, and
// which Update of a range steps its host masters.
#include <doctest/doctest.h>

#include <vector>

#include "core/program/host_gradients.hpp"

namespace {

using harmony::core::GradWrite;
using harmony::core::LayerRange;
using harmony::core::LayerSpan;
using harmony::core::Op;
using harmony::core::OpKind;
using harmony::core::Program;

int add(Program& p, OpKind k, int device, int queue_pos, LayerRange layers) {
  Op x;
  x.kind = k;
  x.device = device;
  x.queue_pos = queue_pos;
  x.layers = layers;
  p.ops.push_back(x);
  return static_cast<int>(p.ops.size()) - 1;
}

// Two GPUs, layers 0-1 as one range: GPU 1's dWB first in the Program, then GPU 0's two (queue order reversed).
Program two_gpus(std::vector<OpKind> collectives) {
  Program p;
  p.graph.plan.gpus = 2;
  add(p, OpKind::dWB, 1, 4, {0, 1});  // 0
  add(p, OpKind::dWB, 0, 9, {0, 1});  // 1: GPU 0's second in its queue
  add(p, OpKind::dWB, 0, 3, {0, 1});  // 2: GPU 0's first
  add(p, OpKind::FWD, 0, 0, {0, 1});  // 3: not a dWB
  add(p, OpKind::dWB, 1, 5, {2, 2});  // 4: another range, alone
  for (const OpKind k : collectives)
    for (int g = 0; g < 2; ++g) add(p, k, g, 6, {0, 1});
  return p;
}

TEST_CASE("host_gradients: writers in (device, queue) order; the first copies, the later add") {
  const auto h = harmony::core::host_gradients(two_gpus({}));
  CHECK(h.dwbs.at(LayerSpan{0, 1}) == std::vector<int>{2, 1, 0});
  CHECK(h.writers.at(LayerSpan{0, 1}) == std::vector<int>{2, 1, 0});
  CHECK(h.write[2] == GradWrite::Copy);
  CHECK(h.write[1] == GradWrite::Add);
  CHECK(h.write[0] == GradWrite::Add);
  CHECK(h.write[3] == GradWrite::None);
  CHECK(h.write[4] == GradWrite::Copy);
  CHECK(h.replicated.empty());
  CHECK(h.sharded.empty());
}

TEST_CASE("host_gradients: an all-reduced range is written by its lowest replica; the others' copies dropped") {
  const auto h = harmony::core::host_gradients(two_gpus({OpKind::ARD}));
  CHECK(h.replicated.count(LayerSpan{0, 1}) == 1);
  CHECK(h.writers.at(LayerSpan{0, 1}) == std::vector<int>{2, 1});
  CHECK(h.write[2] == GradWrite::Copy);
  CHECK(h.write[1] == GradWrite::Add);
  CHECK(h.write[0] == GradWrite::Drop);
  CHECK(h.write[4] == GradWrite::Copy);  // the other range is not all-reduced: GPU 1 writes it
}

TEST_CASE("host_gradients: a sharded range's ranks each copy their own shard first") {
  const auto h = harmony::core::host_gradients(two_gpus({OpKind::RS}));
  CHECK(h.sharded.count(LayerSpan{0, 1}) == 1);
  CHECK(h.writers.at(LayerSpan{0, 1}) == std::vector<int>{2, 1, 0});
  CHECK(h.write[2] == GradWrite::Copy);
  CHECK(h.write[1] == GradWrite::Add);
  CHECK(h.write[0] == GradWrite::Copy);  // GPU 1's shard: its first
}

TEST_CASE("bounce_chunk_elements: whole elements of the chunk, at least one, at most the gradient's") {
  using harmony::core::bounce_chunk_elements;
  CHECK(bounce_chunk_elements(1000, 4, 130) == 32);
  CHECK(bounce_chunk_elements(1000, 2, 131) == 65);
  CHECK(bounce_chunk_elements(10, 4, 4096) == 10);
  CHECK(bounce_chunk_elements(1000, 4, 3) == 1);
  CHECK(bounce_chunk_elements(100 << 20, 4) == (32 << 20) / 4);  // the executor's default chunk
}

TEST_CASE("update_owners: one Update per layer range steps the masters, the lowest device's, whatever the op order") {
  Program p;
  add(p, OpKind::Update, 2, 0, {0, 1});  // 0: a replica of range 0-1
  add(p, OpKind::Update, 0, 0, {2, 3});  // 1: range 2-3, alone
  add(p, OpKind::Update, 1, 0, {0, 1});  // 2: the lowest device of range 0-1 so far
  add(p, OpKind::dWB, 0, 1, {0, 1});     // 3: not an Update
  add(p, OpKind::Update, 1, 1, {0, 1});  // 4: the same device again: the first one in op order stays
  add(p, OpKind::Update, 3, 0, {0, 0});  // 5: a different range (a shard of layer 0 alone)
  CHECK(harmony::core::update_owners(p) == std::vector<char>{0, 1, 1, 0, 0, 1});
  CHECK(harmony::core::update_owners(Program{}).empty());
}

}  // namespace
