// Event-level agreement with the paper's simulator: the four vectors in tests/data/reference/vectors
// (bert_large; vPP and vDP, prefetch on and off, u_fwd == u_bwd and !=). Same events on the same
// streams in the same order, same dependencies and bytes, begin and duration within 1 ns.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/model/profile.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/study/evaluate.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony;
using harmony::test::source_dir;

namespace {

const core::Model& bert() {
  static const core::Model m = core::load_profile(source_dir() + "/configs/profiles/bert_large.json");
  return m;
}

nlohmann::json load(const std::string& name) {
  std::ifstream in(source_dir() + "/tests/data/reference/vectors/" + name);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

core::Packs packs(const nlohmann::json& a) {
  core::Packs p;
  for (const auto& r : a) p.push_back({r[0].get<int>(), r[1].get<int>()});
  return p;
}

void check_vector(const std::string& file) {
  CAPTURE(file);
  const auto v = load(file);
  const auto& c = v["config"];
  core::Plan plan;
  plan.kind = c["mode"] == "vPP" ? core::plan_kind("harmony-pp") : core::plan_kind("harmony-dp");
  plan.gpus = c["num_gpus"];
  plan.minibatch = c["minibatchsize"];
  plan.u_fwd = c["u_fwd"];
  plan.u_bwd = c["u_bwd"];
  plan.packs_fwd = packs(c["pack_fwd"]);
  plan.packs_bwd = packs(c["pack_bwd"]);
  // the manual packing of P layers counted from the end gives the same packs
  core::Packs mf, mb;
  core::manual_packs(c["R"].get<int>(), c["packsize"].get<int>(), mf, mb);
  CHECK(mf == plan.packs_fwd);
  CHECK(mb == plan.packs_bwd);

  core::MachineSpec machine;
  machine.bw_swap_bytes_per_s = c["bw_swap"];
  machine.bw_p2p_bytes_per_s = c["bw_p2p"];
  machine.bw_msg_bytes_per_s = c["bw_msg"];
  machine.time_del_s = c["time_del"];
  core::LowerOptions opt;
  opt.prefetch = c["prefetch_offload"];
  const auto e = sim::evaluate_plan(bert(), machine, plan, opt);
  const auto& p = e.program;

  CHECK(p.graph.last_fwd_msg == c["last_fwd_msg"].get<bool>());
  CHECK(p.cost.bandwidth_sharers == c["Nsim"].get<int>());
  CHECK(p.cost.pp_rules == (c["sim_mode"] == "vPP"));

  // tasks: placement and memory estimate
  sim::ReferenceCostModel cost(bert(), machine);
  for (const auto& t : v["tasks"]) {
    const auto& task = p.graph.tasks.at(t["idx"].get<std::size_t>());
    CAPTURE(t["idx"].get<int>());
    CHECK(task.rank == t["rank"].get<int>());
    CHECK(task.layers.first == t["layers"][0].get<int>());
    CHECK(task.layers.last == t["layers"][1].get<int>());
    CHECK(std::string(core::task_type_name(task.type)) == t["type"].get<std::string>());
    CHECK(static_cast<double>(cost.task_memory(p.graph, task)) == t["mem_bytes"].get<double>());
  }

  // events: one op per event, same identity, stream, deps, bytes, timing
  REQUIRE(p.ops.size() == v["events"].size());
  std::map<std::string, int> by_id;
  for (std::size_t i = 0; i < p.ops.size(); ++i) by_id[p.op_id(static_cast<int>(i))] = static_cast<int>(i);
  REQUIRE(by_id.size() == p.ops.size());
  double max_begin_err_ns = 0;
  double max_dur_err_ns = 0;
  for (const auto& ev : v["events"]) {
    const std::string id = ev["id"];
    CAPTURE(id);
    REQUIRE(by_id.count(id) == 1);
    const int i = by_id[id];
    const auto& op = p.ops[static_cast<std::size_t>(i)];
    CHECK(op.device == ev["rank"].get<int>());
    CHECK(std::string(core::stream_name(op.stream)) == ev["stream"].get<std::string>());
    CHECK(op.queue_pos == ev["stream_pos"].get<int>());
    CHECK(op.layers.first == ev["layers"][0].get<int>());
    CHECK(op.layers.last == ev["layers"][1].get<int>());
    if (ev["ubs"].is_null()) {
      CHECK(op.ubs == 0);
    } else {
      CHECK(op.ubs == ev["ubs"].get<int>());
    }
    if (!ev["bytes"].is_null()) CHECK(op.bytes == ev["bytes"].get<std::int64_t>());
    std::set<std::string> want, got;
    for (const auto& d : ev["inputs"]) want.insert(d.get<std::string>());
    for (int d : op.deps) got.insert(p.op_id(d));
    CHECK(got == want);
    if (!ev["peer"].is_null()) {
      REQUIRE(op.peer >= 0);
      CHECK(p.op_id(op.peer) == ev["peer"].get<std::string>());
    }
    const double begin_ns = static_cast<double>(e.timeline.begin_ps[static_cast<std::size_t>(i)]) / 1e3;
    const double dur_ns = static_cast<double>(e.timeline.duration_ps[static_cast<std::size_t>(i)]) / 1e3;
    max_begin_err_ns = std::max(max_begin_err_ns, std::abs(begin_ns - ev["begin_s"].get<double>() * 1e9));
    max_dur_err_ns = std::max(max_dur_err_ns, std::abs(dur_ns - ev["dur_s"].get<double>() * 1e9));
  }
  CHECK(max_begin_err_ns <= 1.0);
  CHECK(max_dur_err_ns <= 1.0);
  MESSAGE(file << ": max |begin - reference| = " << max_begin_err_ns
               << " ns, max |dur - reference| = " << max_dur_err_ns << " ns");

  // stream FIFOs: same order on every (rank, stream)
  std::size_t nq = 0;
  for (const auto& [rank, streams] : v["stream_order"].items()) {
    for (const auto& [stream, ids] : streams.items()) {
      ++nq;
      bool found = false;
      for (const auto& q : p.queues) {
        if (q.device != std::stoi(rank) || std::string(core::stream_name(q.stream)) != stream) continue;
        found = true;
        REQUIRE(q.ops.size() == ids.size());
        for (std::size_t k = 0; k < ids.size(); ++k) CHECK(p.op_id(q.ops[k]) == ids[k].get<std::string>());
      }
      CHECK(found);
    }
  }
  CHECK(nq == p.queues.size());
  CHECK(p.queues.size() == v["results"]["num_streams"].get<std::size_t>());

  // results
  const auto& res = v["results"];
  const auto& r = e.report;
  CHECK(r.iteration_time_s == doctest::Approx(res["global_endtime"].get<double>()).epsilon(1e-9));
  REQUIRE(r.per_gpu.size() == res["per_rank_endtime"].size());
  for (std::size_t k = 0; k < r.per_gpu.size(); ++k) {
    CHECK(r.per_gpu[k].end_time_s == doctest::Approx(res["per_rank_endtime"][k].get<double>()).epsilon(1e-9));
    CHECK(static_cast<double>(r.per_gpu[k].peak_memory_bytes) == res["per_rank_memory"][k].get<double>());
    CHECK(r.per_gpu[k].compute_time_s == doctest::Approx(res["per_rank_compute_s"][k].get<double>()).epsilon(1e-9));
  }
  CHECK(r.max_end_idle == doctest::Approx(res["max_endidle"].get<double>()).epsilon(1e-6));
  CHECK(r.avg_end_idle == doctest::Approx(res["avg_endidle"].get<double>()).epsilon(1e-6));
  CHECK(r.compute_to_global == doctest::Approx(res["avg_compute_to_globaltime"].get<double>()).epsilon(1e-9));
  CHECK(r.compute_to_rank == doctest::Approx(res["avg_compute_to_ranktime"].get<double>()).epsilon(1e-9));
  // The reference prints "MB" for sizes divided by 1024^2; harmony labels them MiB, the numbers are the same.
  std::string expected = res["summary_line"].get<std::string>();
  expected = expected.substr(expected.find(" : "));
  const auto label = expected.rfind(" MB (");
  REQUIRE(label != std::string::npos);
  expected.replace(label, 5, " MiB (");
  CHECK(core::summary_line(r, "x").substr(5) == expected);
}

}  // namespace

TEST_CASE("vector vPP N2 D16 u8/8 P7, no prefetch") { check_vector("bert_large_vPP_N2_D16_u8-8_P7_nopf.json"); }
TEST_CASE("vector vDP N2 D32 u16/8 P7, no prefetch") { check_vector("bert_large_vDP_N2_D32_u16-8_P7_nopf.json"); }
TEST_CASE("vector vPP N2 D32 u16/8 P7, prefetch, last_fwd_msg") {
  check_vector("bert_large_vPP_N2_D32_u16-8_P7_pf.json");
}
TEST_CASE("vector vPP N4 D32 u4/4 P4, prefetch") { check_vector("bert_large_vPP_N4_D32_u4-4_P4_pf.json"); }
