// The plan-kind registry (core/plan/plan_kind.hpp) against every list of kinds kept outside it: the JSON schemas'
// plan_kind enums, docs/config.md's plan.mode lists, and the choices each tool's plan.mode offers in its errors. A new
// kind is a registry row and its own code; this test names each list that was not brought along.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/plan/plan_kind.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_path;

namespace {

std::string source_text(const std::string& relative) {
  const std::string path = source_path(relative);
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The enum of the first "plan_kind" property or definition found in a schema (depth first).
const nlohmann::json* find_plan_kind_enum(const nlohmann::json& j) {
  if (!j.is_object() && !j.is_array()) return nullptr;
  if (j.is_object()) {
    const auto it = j.find("plan_kind");
    if (it != j.end() && it->is_object() && it->contains("enum")) return &(*it)["enum"];
  }
  for (const auto& child : j) {
    if (const nlohmann::json* e = find_plan_kind_enum(child)) return e;
  }
  return nullptr;
}

std::vector<std::string> schema_plan_kinds(const std::string& schema) {
  const nlohmann::json j = nlohmann::json::parse(source_text(schema));
  const nlohmann::json* e = find_plan_kind_enum(j);
  REQUIRE_MESSAGE(e != nullptr, schema << " has no plan_kind enum");
  return e->get<std::vector<std::string>>();
}

std::vector<std::string> harmony_kind_names() { return plan_kind_names(KindRole::Harmony); }

// The kinds with offload tiers (search.offload); with_knob: those that take plan.offload.
std::vector<std::string> offload_kind_names(bool with_knob) {
  if (with_knob) return plan_kind_names(Knob::Offload);
  std::vector<std::string> v;
  for (const PlanKind& k : plan_kinds())
    if (k->offload_tiers) v.emplace_back(k.name());
  return v;
}

std::string join(const std::vector<std::string>& items, const std::string& sep, const std::string& quote = "") {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : sep) + quote + i + quote;
  return s;
}

// The one line of a text that contains `marker` (exactly one).
std::string line_with(const std::string& text, const std::string& marker) {
  std::istringstream in(text);
  std::string line, found;
  int count = 0;
  while (std::getline(in, line)) {
    if (line.find(marker) != std::string::npos) {
      found = line;
      ++count;
    }
  }
  REQUIRE_MESSAGE(count == 1, "expected one line with '" << marker << "', found " << count);
  return found;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class Load>
ConfigError config_error(Load load) {
  try {
    load();
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return ConfigError(SourceLoc{}, "unreachable");
}

const std::string kTrainModel =
    "model:\n"
    "  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 2, n_head: 4, n_embd: 64}\n"
    "  seq_len: 32\n"
    "train: {steps: 5}\n";

}  // namespace

TEST_CASE("the registry generates the fifteen kinds in listing order, each a complete module") {
  CHECK(plan_kind_names() == std::vector<std::string>{"harmony-pp", "harmony-dp", "dp-swap", "pp-swap", "zero-infinity",
                                                      "zero3-opt-offload", "fsdp-offload", "zero-offload", "l2l",
                                                      "lohan", "zero2", "fsdp", "zero3", "host-stream", "resident"});
  CHECK(harmony_kind_names() == std::vector<std::string>{"harmony-pp", "harmony-dp"});
  CHECK(plan_kind_names(KindRole::Baseline) ==
        std::vector<std::string>{"dp-swap", "pp-swap", "zero-infinity", "zero3-opt-offload", "fsdp-offload",
                                 "zero-offload", "l2l", "lohan", "zero2", "fsdp", "zero3", "host-stream"});
  CHECK(plan_kind_names(KindRole::Ceiling) == std::vector<std::string>{"resident"});
  CHECK(plan_kind_names(Knob::Activations) ==
        std::vector<std::string>{"dp-swap", "pp-swap", "zero-infinity", "zero3-opt-offload", "fsdp-offload",
                                 "zero-offload", "l2l", "lohan", "zero2", "fsdp", "zero3", "host-stream", "resident"});
  CHECK(plan_kind_names(Knob::Offload) == std::vector<std::string>{"zero-infinity", "zero3-opt-offload", "lohan"});
  CHECK(plan_kind_names(Knob::Zero3) == std::vector<std::string>{"zero-infinity", "zero3-opt-offload", "zero3"});
  CHECK(plan_kind_names(Knob::Swap) == std::vector<std::string>{"dp-swap", "pp-swap"});
  CHECK(PlanKind() == plan_kind("harmony-pp"));  // a default Plan's kind
  std::set<std::string> names;
  int last_order = -1;
  for (const PlanKind& k : plan_kinds()) {
    INFO(k.name());
    CHECK(names.insert(k.name()).second);
    CHECK(std::string(k->description).size() > 10);
    CHECK(k->listing_order > last_order);
    last_order = k->listing_order;
    CHECK((k->validate != nullptr));
    CHECK((k->lower != nullptr));
    CHECK((k->enumerate != nullptr));
    CHECK((k->describe != nullptr));
    // only Harmony's kinds have packs (and a task graph: the executor checks a Program's against its kind's packs)
    CHECK((k->role == KindRole::Harmony) == k->packs);
    REQUIRE(find_plan_kind(k.name()).has_value());
    CHECK(*find_plan_kind(k.name()) == k);
    CHECK(std::string(plan_kind_name(k)) == k.name());
  }
  CHECK(plan_kind_names().size() == plan_kinds().size());
  CHECK(harmony_kind_names().size() + plan_kind_names(KindRole::Baseline).size() +
            plan_kind_names(KindRole::Ceiling).size() ==
        plan_kinds().size());
  // the ceiling keeps its state on the devices; so do fsdp, zero2 and zero3 (partitioned); harmony-run trains every
  // kind (host-stream's GPU update over state streamed from the host: backend/executor/flow_streamed.cpp), and
  // host-stream alone runs on one GPU only
  for (const PlanKind& k : plan_kinds()) {
    INFO(k.name());
    if (k->role == KindRole::Ceiling) CHECK(k->resident_state);
    const std::string n = k.name();
    CHECK(k->resident_state == (n == "resident" || n == "fsdp" || n == "zero2" || n == "zero3"));
    CHECK(k->trains);
    CHECK(k->one_gpu == (n == "host-stream"));
    // a refused kind names the trained kind that makes its updates; a trained kind names none
    CHECK((k->trains_as == nullptr) == k->trains);
    if (k->trains_as != nullptr) {
      REQUIRE(find_plan_kind(k->trains_as).has_value());
      CHECK((*find_plan_kind(k->trains_as))->trains);
    }
  }
  CHECK_FALSE(find_plan_kind("vPP").has_value());  // an alias of plan.mode, not a kind's name
  CHECK(find_plan_kind("vPP", /*with_aliases=*/true) == plan_kind("harmony-pp"));
  CHECK(find_plan_kind("vDP", /*with_aliases=*/true) == plan_kind("harmony-dp"));
}

TEST_CASE("schemas: every output's plan_kind enum is the registry's kinds in listing order") {
  // compare, sweep rows, reports and search name any kind
  CHECK(schema_plan_kinds("schemas/common.schema.json") == plan_kind_names());
  CHECK(schema_plan_kinds("schemas/search.schema.json") == plan_kind_names());
  // the sweep row's offload column: the kinds with offload tiers, named in its description
  const std::string row = source_text("schemas/sweep-row.schema.json");
  CHECK_MESSAGE(
      contains(row, "kinds with offload tiers (" + join(offload_kind_names(false), ", ") + ")"),
      "schemas/sweep-row.schema.json's offload description should name " << join(offload_kind_names(false), ", "));
}

TEST_CASE("docs/config.md: plan.mode's rows list the kinds each tool takes") {
  const std::string doc = source_text("docs/config.md");
  const std::string sim_row = line_with(doc, "| `mode` |");
  for (const std::string& name : plan_kind_names()) {
    INFO(name);
    CHECK(contains(sim_row, "`" + name + "`"));
  }
  const std::string run_row = line_with(doc, "`plan.mode` may also name a baseline (");
  std::vector<std::string> trained, refused;  // harmony-run's baselines, and the kinds it refuses
  for (const PlanKind& k : plan_kinds()) {
    if (k->role == KindRole::Baseline && k->trains) trained.push_back(k.name());
    if (!k->trains) refused.push_back(k.name());
  }
  CHECK(contains(run_row, "name a baseline (" + join(trained, ", ", "`") + ","));
  for (const std::string& name : refused) CHECK(contains(run_row, "not `" + name + "`"));
  CHECK(contains(run_row, join(offload_kind_names(true), " and ") + " also take `plan.offload"));
}

TEST_CASE("plan.mode's choices: both tools offer every registered kind") {
  const std::string modes_tail = " (the paper's aliases vPP, vDP)";
  const ConfigError sim = config_error([] {
    load_config_text("model:\n  profile: model.json\nplan: {mode: harmony-qq, gpus: 1, minibatch: 8}\n", "s.yaml");
  });
  CHECK(sim.message() == "unknown plan.mode 'harmony-qq'");
  CHECK(sim.hint() == "did you mean 'harmony-pp'? modes: " + join(plan_kind_names(), ", ") + modes_tail);
  CHECK(sim.loc().line == 3);

  // harmony-run: the closest of every kind (before, only Harmony's were offered: no "did you mean 'dp-swap'")
  const ConfigError run = config_error([] {
    load_train_config_text(kTrainModel + "plan: {mode: dp-swp, gpus: 2, minibatch: 8, u_bwd: 4}\n", "r.yaml");
  });
  CHECK(run.message() == "unknown plan.mode 'dp-swp'");
  CHECK(run.hint() == "did you mean 'dp-swap'? modes: " + join(plan_kind_names(), ", ") + modes_tail);
  CHECK(run.loc().file == "r.yaml");
  CHECK(run.loc().line == 5);
  // the aliases still name Harmony's kinds in harmony-run
  CHECK(load_train_config_text(kTrainModel + "plan: {mode: vDP, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, "
                                             "pack_size: 1}\n",
                               "r.yaml")
            .plan.kind == plan_kind("harmony-dp"));

  // plan.offload on a baseline without tiers names the baselines that have them
  const ConfigError offload = config_error([] {
    load_train_config_text(kTrainModel + "plan: {mode: dp-swap, gpus: 2, minibatch: 8, u_bwd: 4, offload: cpu}\n",
                           "r.yaml");
  });
  std::vector<std::string> tiers = offload_kind_names(true);  // "a, b or c"
  const std::string last = tiers.back();
  tiers.pop_back();
  CHECK(offload.message() == "plan.offload applies to plan.mode: " + join(tiers, ", ") + " or " + last + " only");
}
