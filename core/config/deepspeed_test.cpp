// Tests of the DeepSpeed config reader (core/config/config_deepspeed.cpp, compare --deepspeed): every mapping from
// ZeRO stage and offload devices to a plan kind and status, DeepSpeed's batch inference and its consistency error
// (naming all three values, at train_batch_size's line:column), "auto" from the harmony config, the keys listed as
// not priced, and every refused key at its line:column; the shipped examples in configs/deepspeed/.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/config/config_deepspeed.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_dir;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool has(const std::vector<std::string>& v, const std::string& item) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return contains(s, item); });
}

struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& text) {
    path = std::filesystem::temp_directory_path() /
           ("harmony_test_ds_" + std::to_string(std::random_device{}()) + ".json");
    std::ofstream(path) << text;
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

DeepSpeedContext ctx(int gpus = 2, int minibatch = 16) {
  DeepSpeedContext c;
  c.gpus = gpus;
  c.minibatch = minibatch;
  c.dtype = "bf16";
  return c;
}

DeepSpeedRun read(const std::string& text, const DeepSpeedContext& c = ctx()) {
  const TempFile f(text);
  return read_deepspeed_config(f.path.string(), c);
}

// The error a file gives, checked to be at line:column of that file with a hint.
std::string error_at(const std::string& text, int line, int column, const DeepSpeedContext& c = ctx()) {
  const TempFile f(text);
  try {
    read_deepspeed_config(f.path.string(), c);
  } catch (const ConfigError& e) {
    INFO(std::string(e.what()));
    CHECK(e.loc().file == f.path.string());
    CHECK(e.loc().line == line);
    CHECK(e.loc().column == column);
    CHECK_FALSE(e.hint().empty());
    return e.what();
  }
  FAIL("expected a ConfigError for:\n" << text);
  return "";
}

}  // namespace

TEST_CASE("ZeRO-3 with parameter offload is zero-infinity on the parameters' tier, priced") {
  for (const std::string dev : {"cpu", "nvme"}) {
    const std::string path = dev == "nvme" ? R"(, "nvme_path": "/nvme")" : "";
    const auto r = read(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
      "offload_param": {"device": ")" +
                        dev + "\"" + path + R"(}, "offload_optimizer": {"device": ")" + dev + "\"" + path + "}}}");
    CHECK(r.plan_kind == "zero-infinity");
    CHECK(r.offload == dev);
    CHECK(r.status == "priced");
    CHECK(r.approximation.empty());
    CHECK(r.stage == 3);
    CHECK(r.offload_param == dev);
    CHECK(r.offload_optimizer == dev);
    CHECK(contains(r.reasoning, "zero-infinity"));
  }
  // the two devices differ: the nvme tier, approximate
  const auto mixed = read(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
    "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}}})");
  CHECK(mixed.offload == "nvme");
  CHECK(mixed.status == "approximate");
  CHECK(contains(mixed.approximation, "offload_optimizer is nvme where offload_param is cpu"));
}

TEST_CASE(
    "ZeRO-Offload (stages 1-2, optimizer offload only) is zero-offload; ZeRO-3 with it approximate zero-infinity") {
  const auto read_stage = [](int stage, const std::string& extra = "") {
    return read(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": )" + std::to_string(stage) +
                R"(, "offload_optimizer": {"device": "cpu"}})" + extra + "}");
  };
  const auto z2 = read_stage(2);
  CHECK(z2.plan_kind == "zero-offload");
  CHECK(z2.offload.empty());
  CHECK(z2.status == "priced");
  CHECK(contains(z2.reasoning, "zero-offload"));
  const auto z1 = read_stage(1);  // stage 1 all-reduces where the kind reduce-scatters
  CHECK(z1.plan_kind == "zero-offload");
  CHECK(z1.status == "approximate");
  CHECK(contains(z1.approximation, "ZeRO-1 all-reduces"));
  const auto z3 = read_stage(3);  // the parameters stay partitioned on the GPUs, the optimizer on the CPU
  CHECK(z3.plan_kind == "zero3-opt-offload");
  CHECK(z3.offload == "cpu");
  CHECK(z3.status == "priced");
  CHECK(contains(z3.reasoning, "copied back up"));
  // gradient accumulation: DeepSpeed moves every micro-step's gradients through the host; the kind does not
  const auto acc = read(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  CHECK(acc.plan_kind == "zero-offload");
  CHECK(acc.status == "approximate");
  CHECK(contains(acc.approximation, "4 micro-steps"));
  const auto acc3 = read(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})");
  // ZeRO-3 moves every micro-step's gradient shard through the host, as zero3-opt-offload does: priced
  CHECK(acc3.plan_kind == "zero3-opt-offload");
  CHECK(acc3.status == "priced");
  CHECK(acc3.approximation.empty());
  const auto nvme3 = read(R"({"train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  CHECK(nvme3.plan_kind == "zero3-opt-offload");
  CHECK(nvme3.offload == "nvme");
  CHECK_FALSE(nvme3.pipeline_read);  // DeepSpeed's default
  CHECK_FALSE(nvme3.pipeline_write);
}

TEST_CASE("offload_optimizer pipeline_read / pipeline_write: read under nvme, listed as not priced otherwise") {
  const auto piped = read(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "pipeline_read": true, "pipeline_write": true,
                          "pipeline": true}}})");
  CHECK(piped.pipeline_read);
  CHECK(piped.pipeline_write);
  CHECK(has(piped.notes, "offload_optimizer.pipeline_read: the update's NVMe read overlaps its CPU Adam"));
  CHECK(has(piped.notes, "offload_optimizer.pipeline_write: the update's NVMe write overlaps its CPU Adam"));
  CHECK_FALSE(has(piped.not_priced, "offload_optimizer.pipeline_read"));
  CHECK(has(piped.not_priced, "offload_optimizer.pipeline (DeepSpeed derives it"));
  CHECK(contains(piped.summary, "offload_optimizer nvme (pipelined read and write)"));
  const auto one = read(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "/n"},
    "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "pipeline_read": false, "pipeline_write": true}}})");
  CHECK(one.plan_kind == "zero-infinity");
  CHECK_FALSE(one.pipeline_read);
  CHECK(one.pipeline_write);
  CHECK(contains(one.summary, "offload_optimizer nvme (pipelined write)"));
  // on the host tier DeepSpeed swaps nothing: not priced, and off
  const auto cpu = read(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu", "pipeline_read": true}}})");
  CHECK_FALSE(cpu.pipeline_read);
  CHECK(has(cpu.not_priced, "offload_optimizer.pipeline_read (true: used with the nvme device only"));
  // a boolean, at its line:column
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "pipeline_read": "yes"}}})",
                          2, 81),
                 "must be true or false"));
}

TEST_CASE("without offload: ZeRO-3 is zero3, ZeRO-0 resident, ZeRO-2 zero2, ZeRO-1 approximate zero2") {
  const auto z3 = read(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})");
  CHECK(z3.plan_kind == "zero3");
  CHECK(contains(z3.reasoning, "hooks on every module"));
  CHECK(z3.offload.empty());
  CHECK(z3.status == "priced");
  CHECK(contains(z3.reasoning, "reduce-scattered every micro-step"));
  for (const std::string zero : {"", R"(, "zero_optimization": {"stage": 0})"}) {
    const auto r = read(R"({"train_micro_batch_size_per_gpu": 4)" + zero + "}");
    CAPTURE(zero);
    CHECK(r.plan_kind == "resident");
    CHECK(r.offload.empty());
    CHECK(r.status == "priced");
    CHECK(contains(r.reasoning, "stage 0"));
  }
  const auto z2 = read(
      R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}})");
  CHECK(z2.plan_kind == "zero2");
  CHECK(z2.status == "priced");
  CHECK(contains(z2.reasoning, "optimizer state and gradients partitioned"));
  const auto z1 = read(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})");
  CHECK(z1.plan_kind == "zero2");
  CHECK(z1.status == "approximate");
  CHECK(contains(z1.approximation, "its memory is a lower bound"));
}

TEST_CASE("batch sizes: DeepSpeed's inference over plan.gpus, and the consistency error naming all three") {
  auto r = read(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  CHECK(r.accumulation == 4);
  CHECK(r.micro_batch == 4);
  CHECK(r.train_batch == 32);
  CHECK(r.gpus == 2);
  r = read(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})");
  CHECK(r.micro_batch == 8);
  r = read(R"({"train_batch_size": 32})");
  CHECK(r.micro_batch == 16);
  CHECK(r.accumulation == 1);
  r = read(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", ctx(4));
  CHECK(r.train_batch == 60);
  r = read(R"({"train_micro_batch_size_per_gpu": 3})");
  CHECK(r.train_batch == 6);
  CHECK(r.accumulation == 1);
  const std::string msg = error_at(R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "train_batch_size": 32
})",
                                   4, 23);
  CHECK(contains(msg,
                 "train_batch_size 32 is not train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x "
                 "2 GPUs (plan.gpus) = 16"));
  CHECK(
      contains(error_at(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 1, 22), "does not split"));
  CHECK(contains(error_at(R"({"steps_per_print": 1})", 1, 1), "neither train_batch_size nor"));
  error_at(R"({"train_micro_batch_size_per_gpu": 0})", 1, 36);
  error_at(R"({"train_micro_batch_size_per_gpu": "4"})", 1, 36);
}

TEST_CASE("\"auto\" takes the harmony config's values and says so") {
  DeepSpeedContext c = ctx(2, 24);
  auto r = read(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}})",
                c);
  CHECK(r.train_batch == 24);
  CHECK(r.accumulation == 3);
  CHECK(r.dtype.empty());
  CHECK(has(r.notes, "train_batch_size: auto -> 24 (plan.minibatch"));
  CHECK(has(r.notes, "auto -> the harmony config's dtype (bf16)"));
  c.u_bwd = 6;
  r = read(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})", c);
  CHECK(r.micro_batch == 6);
  CHECK(r.accumulation == 2);
  CHECK(has(r.notes, "plan.u_bwd"));
  // an auto in a key that is not priced is listed as such
  r = read(R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})");
  CHECK(has(r.not_priced, "zero_optimization.reduce_bucket_size (auto)"));
  CHECK(has(r.not_priced, "optimizer"));
}

TEST_CASE("precision and activation checkpointing") {
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true, "loss_scale": 0}})").dtype == "fp16");
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}})").dtype == "bf16");
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4, "bfloat16": {"enabled": true}})").dtype == "bf16");
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": false}})").dtype == "fp32");
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4})").activations.empty());
  const auto r =
      read(R"({"train_micro_batch_size_per_gpu": 4, "activation_checkpointing": {"cpu_checkpointing": true}})");
  CHECK(r.activations == "checkpoint");
  CHECK(has(r.not_priced, "activation_checkpointing.cpu_checkpointing"));
  error_at(R"({"train_micro_batch_size_per_gpu": 4,
 "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
           2, 49);
}

TEST_CASE("DeepSpeed 0.16-0.18 keys: read as not priced, or refused where they change the step") {
  // a current ZeRO-3 config (the keys of deepspeed/runtime/zero/config.py and offload_config.py at 0.18) reads
  const auto r = read(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "stage3_use_all_reduce_for_fetch_params": false, "stage3_module_granularity_threshold": 0,
    "stage3_allgather_sequential": false, "stage3_partition_stream_chunk_size": 0, "max_live_parameters": 1e9,
    "prefetch_bucket_size": 5e7, "param_persistence_threshold": 1e5, "override_module_apply": true,
    "enable_sanity_checks": false, "save_muon_momentum_buffer_in_memory": false, "leaf_module": {},
    "zenflow": null, "pipeline_loading_checkpoint": false,
    "offload_optimizer": {"device": "cpu", "pin_memory": true, "super_offload": false, "cpuadam_cores_perc": 0.9}}})");
  CHECK(r.plan_kind == "zero3-opt-offload");
  CHECK(r.status == "priced");
  for (const char* key : {"stage3_module_granularity_threshold", "prefetch_bucket_size", "leaf_module",
                          "offload_optimizer.super_offload", "offload_optimizer.cpuadam_cores_perc"})
    CHECK(has(r.not_priced, key));
  // SuperOffload and ZenFlow step the optimizer in ways no kind prices: refused at the key
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu", "super_offload": true}}})",
                          2, 44),
                 "super_offload = true is not modelled"));
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
    "zenflow": {"topk_ratio": 0.1}}})",
                          2, 5),
                 "zenflow is not modelled"));
  // the deprecated spellings point to the current ones
  CHECK(contains(
      error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"cpu_offload_param": true}})", 1, 61),
      "cpu_offload_param is DeepSpeed's deprecated spelling"));
}

TEST_CASE("refused keys, each at its line:column") {
  // unknown top-level key, with the closest known key
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 4,
  "steps_per_prnt": 10})",
                          2, 3),
                 "did you mean 'steps_per_print'?"));
  // unknown key inside a section
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "overlap_com": true}})", 1, 73);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"offload_param": {"devise": "cpu"}}})", 1,
           79);
  // features no plan kind models, when on
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 4, "pipeline": {"stages": 2}})", 1, 39),
                 "pipeline is not modelled"));
  CHECK(read(R"({"train_micro_batch_size_per_gpu": 4, "moe": {"enabled": false}})").not_priced.front() == "moe (off)");
  error_at(
      R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "zero_quantized_weights": true}})", 1,
      73);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
           2, 44);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"cpu_offload": true}})", 1, 61);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD"}})", 1, 61);
  // values
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 4}})", 1, 70);
  error_at(
      R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
      1, 101);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2,
  "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}}})",
           2, 35);
  // stage 0 turns ZeRO off: DeepSpeed would silently offload nothing
  CHECK(contains(error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0,
  "offload_optimizer": {"device": "cpu"}}})",
                          2, 35),
                 "optimizer offload needs ZeRO"));
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
  "offload_param": {"device": "disk"}}})",
           2, 31);
  error_at(R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
  "offload_param": {"device": "nvme"}}})",
           2, 20);
  // malformed JSON, not an object
  CHECK(contains(error_at("{\"train_micro_batch_size_per_gpu\": 4,\n  }", 2, 3), "malformed JSON"));
  error_at("[1, 2]", 1, 1);
}

TEST_CASE("the shipped examples read") {
  const std::string dir = source_dir() + "/configs/deepspeed/";
  auto r = read_deepspeed_config(dir + "zero3_offload_cpu.json", ctx());
  CHECK(r.plan_kind == "zero-infinity");
  CHECK(r.status == "priced");
  CHECK(r.micro_batch * r.accumulation * r.gpus == r.train_batch);
  r = read_deepspeed_config(dir + "zero3_offload_nvme.json", ctx());
  CHECK(r.offload == "nvme");
  CHECK(r.status == "priced");
  r = read_deepspeed_config(dir + "zero2_offload_optimizer.json", ctx());
  CHECK(r.plan_kind == "zero-offload");
  CHECK(r.stage == 2);
}
