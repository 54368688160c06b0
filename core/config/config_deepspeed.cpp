// --deepspeed: a DeepSpeed config.json read key by key (read, known but not priced, or refused at its line:column),
// its batch sizes resolved with DeepSpeed's own inference rule, and the run mapped to the closest plan kind with the
// reasoning (docs/config.md, "DeepSpeed configs"; the same rule as configs/validation/unseen/pricing.json's
// rules.zero_offload).
#include "core/config/config_deepspeed.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/config/config_internal.hpp"
#include "core/config/json_located.hpp"

namespace harmony::core {

using config_detail::fail;
using config_detail::join;
using config_detail::suggestion_hint;
using nlohmann::json;

namespace {

constexpr const char* kDocs = "docs/config.md, \"DeepSpeed configs\"";

// Top-level keys, by what harmony does with them.
const std::vector<std::string> kTopRead = {"train_batch_size",
                                           "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps",
                                           "zero_optimization",
                                           "fp16",
                                           "bf16",
                                           "bfloat16",
                                           "activation_checkpointing"};
// Settings that change nothing a plan kind prices: the optimizer's hyperparameters (every kind runs Adam on the CPU),
// the learning-rate schedule, logging, monitoring, checkpoint files, I/O tuning.
const std::vector<std::string> kTopNotPriced = {"optimizer",
                                                "scheduler",
                                                "steps_per_print",
                                                "wall_clock_breakdown",
                                                "memory_breakdown",
                                                "dump_state",
                                                "gradient_clipping",
                                                "prescale_gradients",
                                                "gradient_predivide_factor",
                                                "zero_allow_untested_optimizer",
                                                "zero_force_ds_cpu_optimizer",
                                                "communication_data_type",
                                                "data_types",
                                                "sparse_gradients",
                                                "disable_allgather",
                                                "dataloader_drop_last",
                                                "tensorboard",
                                                "wandb",
                                                "csv_monitor",
                                                "comet",
                                                "flops_profiler",
                                                "comms_logger",
                                                "checkpoint",
                                                "aio",
                                                "load_universal_checkpoint",
                                                "use_node_local_storage"};
// Features that change what a step computes or moves in ways no plan kind models: refused when on.
const std::vector<std::string> kTopUnmodelled = {"pipeline",
                                                 "tensor_parallel",
                                                 "sequence_parallel_size",
                                                 "moe",
                                                 "sparse_attention",
                                                 "compression_training",
                                                 "curriculum_learning",
                                                 "data_efficiency",
                                                 "progressive_layer_drop",
                                                 "elasticity",
                                                 "hybrid_engine",
                                                 "autotuning",
                                                 "amp",
                                                 "quantize_training",
                                                 "eigenvalue",
                                                 "weight_quantization"};

const std::vector<std::string> kZeroRead = {"stage", "offload_param", "offload_optimizer"};
const std::vector<std::string> kZeroNotPriced = {
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
    "contiguous_gradients", "load_from_fp32_weights", "elastic_checkpoint", "grad_hooks", "round_robin_gradients",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", "sub_group_size",
    "ignore_unused_parameters", "legacy_stage1", "memory_efficient_linear", "use_multi_rank_bucket_allreduce",
    "log_trace_cache_warnings", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "zero_hpz_partition_size", "mics_shard_size", "mics_hierarchical_params_gather",
    // DeepSpeed 0.16-0.18 (deepspeed/runtime/zero/config.py): fetch and partition variants, checks, and the stage-3
    // names without their "stage3_" prefix (pydantic aliases, accepted either way)
    "stage3_use_all_reduce_for_fetch_params", "stage3_module_granularity_threshold", "stage3_allgather_sequential",
    "stage3_partition_stream_chunk_size", "use_all_reduce_for_fetch_params", "module_granularity_threshold",
    "allgather_sequential", "partition_stream_chunk_size", "prefetch_bucket_size", "param_persistence_threshold",
    "model_persistence_threshold", "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "zeropp_loco_param", "pipeline_loading_checkpoint", "override_module_apply", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module", "zenflow"};
const std::vector<std::string> kOffloadParamKeys = {"device",       "nvme_path",   "pin_memory",
                                                    "buffer_count", "buffer_size", "max_in_cpu"};
const std::vector<std::string> kOffloadOptimizerKeys = {
    "device",        "nvme_path",      "pin_memory", "buffer_count",  "fast_init",         "ratio",
    "pipeline_read", "pipeline_write", "pipeline",   "super_offload", "cpuadam_cores_perc"};
const std::vector<std::string> kFp16Keys = {"enabled",
                                            "auto_cast",
                                            "loss_scale",
                                            "initial_scale_power",
                                            "loss_scale_window",
                                            "hysteresis",
                                            "consecutive_hysteresis",
                                            "min_loss_scale",
                                            "fp16_master_weights_and_grads"};
const std::vector<std::string> kBf16Keys = {"enabled", "immediate_grad_update", "check_grad_overflow"};
const std::vector<std::string> kCheckpointingKeys = {"partition_activations",           "cpu_checkpointing",
                                                     "contiguous_memory_optimization",  "number_checkpoints",
                                                     "synchronize_checkpoint_boundary", "profile"};
const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};

// "parent" + sep + "key", built in place: a child's JSON pointer ('/', the key escaped) or dotted name ('.').
std::string child(const std::string& parent, char sep, const std::string& key) {
  std::string out = parent;
  out += sep;
  out += sep == '/' ? json_pointer_token(key) : key;
  return out;
}

bool listed(const std::vector<std::string>& v, const std::string& key) {
  return std::find(v.begin(), v.end(), key) != v.end();
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// One DeepSpeed config: located failures and typed getters over JSON pointers.
class DsFile {
 public:
  DsFile(std::string path, std::string text) : file_(std::move(path), std::move(text)) {}

  const json& parse() {
    return file_.parse_object({"a DeepSpeed config", "",
                               "pass the file given to deepspeed.initialize(config=...) or the Trainer's --deepspeed"});
  }

  SourceLoc value_at(const std::string& ptr) const { return file_.value_at(ptr); }
  SourceLoc key_at(const std::string& ptr) const { return file_.key_at(ptr); }
  const std::string& path() const { return file_.path(); }

  // An integer >= min at `ptr` (a dotted `name` for messages).
  int integer(const json& v, const std::string& ptr, const std::string& name, int min) const {
    const std::string range = fmt::format("{} is a whole number from {} to 2147483647", name, min);
    if (!v.is_number_integer())
      fail(value_at(ptr), fmt::format("{} must be an integer, got {}", name, v.dump()),
           v.is_string() ? range + " (or \"auto\" where DeepSpeed's Hugging Face integration takes it)" : range);
    const auto x = v.get<std::int64_t>();
    if (x < min || x > 2147483647) fail(value_at(ptr), fmt::format("{} = {} is out of range", name, x), range);
    return static_cast<int>(x);
  }
  bool boolean(const json& v, const std::string& ptr, const std::string& name) const {
    if (!v.is_boolean())
      fail(value_at(ptr), fmt::format("{} must be true or false, got {}", name, v.dump()), "write true or false");
    return v.get<bool>();
  }
  const json& object(const json& v, const std::string& ptr, const std::string& name) const {
    if (!v.is_object())
      fail(value_at(ptr), fmt::format("{} must be a JSON object, got {}", name, v.dump()),
           fmt::format("see https://www.deepspeed.ai/docs/config-json/ for the keys of {}", name));
    return v;
  }
  [[noreturn]] void unknown(const std::string& ptr, const std::string& name, const std::string& key,
                            const std::vector<std::string>& valid) const {
    fail(key_at(ptr), fmt::format("DeepSpeed key '{}' is not one harmony reads or knows not to change the price", name),
         suggestion_hint(key, valid, fmt::format("keys known here ({})", kDocs)) +
             "; if DeepSpeed ignores it, delete it from a copy of the file");
  }
  [[noreturn]] void unmodelled(const std::string& ptr, const std::string& name, const std::string& why) const {
    fail(key_at(ptr), fmt::format("{} is not modelled: {}", name, why),
         "harmony prices data-parallel ZeRO runs (stage 0-3, CPU/NVMe offload) of one dense model; remove it from "
         "a copy of the file to price the run without it");
  }

 private:
  JsonConfigFile file_;
};

// A feature that is on: true, a number above 1 (sequence_parallel_size), or a section unless its "enabled" is false.
bool feature_on(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_object()) {
    const auto it = v.find("enabled");
    return it == v.end() || !(it->is_boolean() && !it->get<bool>());
  }
  if (v.is_number_integer()) return v.get<std::int64_t>() > 1;
  return !v.is_null();
}

// offload_param / offload_optimizer: the device, nvme_path required with nvme, the rest listed as not priced.
std::string read_offload(const DsFile& f, const json& zero, const std::string& name,
                         const std::vector<std::string>& keys, DeepSpeedRun& run) {
  const auto it = zero.find(name);
  if (it == zero.end() || it->is_null()) return "none";
  const std::string ptr = "/zero_optimization/" + name;
  const std::string dotted = "zero_optimization." + name;
  const json& o = f.object(*it, ptr, dotted);
  std::string device = "none";
  for (const auto& item : o.items()) {
    const std::string& key = item.key();
    const std::string kptr = child(ptr, '/', key);
    const std::string kname = child(dotted, '.', key);
    if (!listed(keys, key)) f.unknown(kptr, kname, key, keys);
    const json& v = item.value();
    if (key == "device") {
      if (!v.is_string() || !listed(kDevices, v.get<std::string>()))
        fail(f.value_at(kptr), fmt::format("{} must be \"none\", \"cpu\" or \"nvme\", got {}", kname, v.dump()),
             "DeepSpeed's offload devices: none, cpu, nvme");
      device = v.get<std::string>();
    } else if (key == "ratio" && v.is_number() && v.get<double>() < 1.0) {
      f.unmodelled(kptr, kname + " = " + v.dump(),
                   "ZeRO-Offload++ keeps part of the optimizer on the GPU; every plan kind steps all of it on the CPU");
    } else if (key == "pipeline_read" || key == "pipeline_write") {
      // offload_optimizer's pipelined swap (offload_config.py DeepSpeedZeroOffloadOptimizerConfig; used with the
      // nvme device only): read here, applied by the caller once the device is known
      (key == "pipeline_read" ? run.pipeline_read : run.pipeline_write) = f.boolean(v, kptr, kname);
    } else if (key == "super_offload" && f.boolean(v, kptr, kname)) {
      f.unmodelled(kptr, kname + " = true",
                   "SuperOffload (Superchips: speculative CPU updates, GPU/CPU optimizer split) steps the optimizer in "
                   "a way no plan kind prices");
    } else if (key == "pipeline") {
      run.not_priced.push_back(kname + " (DeepSpeed derives it from pipeline_read / pipeline_write)");
    } else if (key == "pin_memory") {
      const bool pinned = f.boolean(v, kptr, kname);
      run.not_priced.push_back(kname + (pinned ? " (true: the priced host buffers are pinned)"
                                               : " (false: pageable copies are slower; priced as pinned)"));
    } else {
      run.not_priced.push_back(kname + (is_auto(v) ? " (auto)" : ""));
    }
  }
  if (device == "nvme" && !o.contains("nvme_path"))
    fail(f.value_at(ptr), fmt::format("{}.device is nvme but there is no nvme_path", dotted),
         "DeepSpeed needs nvme_path, the folder on the NVMe drives; the drives' speed is the machine's topology.nvme");
  return device;
}

void read_zero(const DsFile& f, const json& root, DeepSpeedRun& run) {
  const auto it = root.find("zero_optimization");
  if (it == root.end() || it->is_null()) return;
  const json& zero = f.object(*it, "/zero_optimization", "zero_optimization");
  for (const auto& item : zero.items()) {
    const std::string& key = item.key();
    const std::string ptr = "/zero_optimization/" + json_pointer_token(key);
    const std::string name = "zero_optimization." + key;
    if (listed(kZeroRead, key)) continue;
    if (key == "cpu_offload" || key == "cpu_offload_param" || key == "cpu_offload_use_pin_memory")
      fail(f.key_at(ptr), fmt::format("zero_optimization.{} is DeepSpeed's deprecated spelling", key),
           R"(write "offload_optimizer": {"device": "cpu"} (and "offload_param" for stage 3), with "pin_memory" )"
           R"(inside them, as DeepSpeed now does)");
    if (!listed(kZeroNotPriced, key)) {
      std::vector<std::string> valid = kZeroRead;
      valid.insert(valid.end(), kZeroNotPriced.begin(), kZeroNotPriced.end());
      f.unknown(ptr, name, key, valid);
    }
    const json& v = item.value();
    const bool quantized = (key == "zero_quantized_weights" || key == "zero_quantized_nontrainable_weights" ||
                            key == "zero_quantized_gradients") &&
                           v.is_boolean() && v.get<bool>();
    if (quantized) f.unmodelled(ptr, name, "ZeRO++ quantized communication moves fewer bytes than any plan kind");
    if (key == "zenflow" && !v.is_null() && !(v.is_object() && v.empty()))
      f.unmodelled(ptr, name,
                   "ZenFlow updates the important gradients' parameters on the GPU and the rest asynchronously on the "
                   "CPU, a step no plan kind prices");
    if (key == "zero_hpz_partition_size" && v.is_number_integer() && v.get<std::int64_t>() > 1)
      f.unmodelled(ptr, name + " = " + v.dump(), "ZeRO++ hierarchical partitioning keeps a secondary copy per node");
    if (key == "mics_shard_size" && v.is_number_integer() && v.get<std::int64_t>() > 0)
      f.unmodelled(ptr, name + " = " + v.dump(), "MiCS shards within groups of GPUs, not over all of them");
    run.not_priced.push_back(name + (is_auto(v) ? " (auto)" : ""));
  }
  if (const auto s = zero.find("stage"); s != zero.end() && !s->is_null()) {
    run.stage = f.integer(*s, "/zero_optimization/stage", "zero_optimization.stage", 0);
    if (run.stage > 3)
      fail(f.value_at("/zero_optimization/stage"),
           fmt::format("zero_optimization.stage = {} is not a ZeRO stage", run.stage),
           "ZeRO stages are 0 (off), 1 (optimizer state partitioned), 2 (+ gradients), 3 (+ parameters)");
  }
  run.offload_param = read_offload(f, zero, "offload_param", kOffloadParamKeys, run);
  run.offload_optimizer = read_offload(f, zero, "offload_optimizer", kOffloadOptimizerKeys, run);
  for (auto [flag, key] : {std::pair{&run.pipeline_read, "pipeline_read"}, {&run.pipeline_write, "pipeline_write"}}) {
    if (!*flag) continue;
    if (run.offload_optimizer == "nvme") {
      run.notes.push_back(
          fmt::format("offload_optimizer.{}: the update's NVMe {} overlaps its CPU Adam "
                      "(search.zero3.{}: true)",
                      key, flag == &run.pipeline_read ? "read" : "write", key));
    } else {  // DeepSpeed swaps optimizer state, pipelined or not, only with the nvme device
      run.not_priced.push_back(
          fmt::format("zero_optimization.offload_optimizer.{} (true: used with the nvme device "
                      "only; the optimizer is {})",
                      key, run.offload_optimizer));
      *flag = false;
    }
  }
  if (run.offload_param != "none" && run.stage != 3)
    fail(f.value_at("/zero_optimization/offload_param/device"),
         fmt::format("offload_param.device {} with ZeRO stage {}: parameter offload needs stage 3", run.offload_param,
                     run.stage),
         R"(DeepSpeed offloads parameters only under "stage": 3; set the stage to 3 or the device to "none")");
  if (run.offload_optimizer != "none" && run.stage == 0)  // DeepSpeed would ignore it: ZeRO is off
    fail(f.value_at("/zero_optimization/offload_optimizer/device"),
         fmt::format("offload_optimizer.device {} with ZeRO stage 0: optimizer offload needs ZeRO (stage 1, 2 or 3)",
                     run.offload_optimizer),
         R"(DeepSpeed runs no ZeRO optimizer under "stage": 0 and offloads nothing; set the stage (2 is ZeRO-Offload) )"
         R"(or the device to "none")");
  if (run.offload_optimizer == "nvme" && run.stage != 3)
    fail(f.value_at("/zero_optimization/offload_optimizer/device"),
         fmt::format("offload_optimizer.device nvme with ZeRO stage {}: NVMe offload needs stage 3", run.stage),
         R"(DeepSpeed offloads to NVMe only under "stage": 3 (ZeRO-Infinity); use "cpu" for stages 1 and 2)");
}

// fp16 / bf16 (or its old name bfloat16): the dtype, "auto" keeping the harmony model's.
void read_precision(const DsFile& f, const json& root, const DeepSpeedContext& ctx, DeepSpeedRun& run) {
  bool any_auto = false;
  std::string on;
  for (const char* section : {"fp16", "bf16", "bfloat16"}) {
    const auto it = root.find(section);
    if (it == root.end() || it->is_null()) continue;
    const std::string ptr = std::string("/") + section;
    const json& o = f.object(*it, ptr, section);
    const auto& keys = std::string_view(section) == "fp16" ? kFp16Keys : kBf16Keys;
    for (const auto& item : o.items()) {
      const std::string& key = item.key();
      const std::string kptr = child(ptr, '/', key);
      const std::string kname = child(section, '.', key);
      if (!listed(keys, key)) f.unknown(kptr, kname, key, keys);
      const json& v = item.value();
      if (key == "enabled") {
        if (is_auto(v)) {
          any_auto = true;
          continue;
        }
        if (!f.boolean(v, kptr, kname)) continue;
        const std::string dtype = std::string_view(section) == "fp16" ? "fp16" : "bf16";
        if (!on.empty() && on != dtype)
          fail(f.value_at(kptr), "both fp16.enabled and bf16.enabled are true",
               "DeepSpeed trains in one of them: disable the other");
        on = dtype;
      } else if (key == "fp16_master_weights_and_grads" && v.is_boolean() && v.get<bool>()) {
        f.unmodelled(kptr, kname,
                     "FP16 master weights halve the optimizer's memory and traffic; every kind keeps "
                     "FP32 masters");
      } else {
        run.not_priced.push_back(kname + (is_auto(v) ? " (auto)" : ""));
      }
    }
  }
  if (!on.empty()) {
    run.dtype = on;
  } else if (any_auto) {
    run.dtype = "";
    run.notes.push_back(fmt::format("fp16/bf16.enabled: auto -> the harmony config's dtype ({})", ctx.dtype));
  } else {
    run.dtype = "fp32";
  }
}

// The batch keys: "auto" from the harmony config, then DeepSpeed's inference (deepspeed/runtime/config.py,
// _set_batch_related_parameters) and its check train_batch_size = micro x accumulation x world size.
void read_batch(const DsFile& f, const json& root, const DeepSpeedContext& ctx, DeepSpeedRun& run) {
  run.gpus = ctx.gpus;
  std::optional<int> tbs, micro, accum;
  const auto get = [&](const char* key, std::optional<int>& out) {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) return;
    if (is_auto(*it)) {
      if (std::string_view(key) == "train_batch_size") {
        out = ctx.minibatch;
        run.notes.push_back(
            fmt::format("train_batch_size: auto -> {} (plan.minibatch of the harmony config)", ctx.minibatch));
      } else if (std::string_view(key) == "train_micro_batch_size_per_gpu" && ctx.u_bwd) {
        out = *ctx.u_bwd;
        run.notes.push_back(
            fmt::format("train_micro_batch_size_per_gpu: auto -> {} (plan.u_bwd of the harmony config)", *ctx.u_bwd));
      } else {
        run.notes.push_back(fmt::format("{}: auto -> inferred from the other batch keys, as DeepSpeed does", key));
      }
      return;
    }
    out = f.integer(*it, std::string("/") + key, key, 1);
  };
  get("train_batch_size", tbs);
  get("train_micro_batch_size_per_gpu", micro);
  get("gradient_accumulation_steps", accum);
  const int n = ctx.gpus;
  const auto at = [&](const char* key) {
    return root.contains(key) ? f.value_at(std::string("/") + key) : SourceLoc{f.path(), 1, 1};
  };
  const auto divide = [&](int total, int by, const char* key, const std::string& what) {
    if (total % by != 0 || total / by < 1)
      fail(at(key), fmt::format("train_batch_size {} does not split into {}", total, what),
           "DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x GPUs "
           "(plan.gpus of the harmony config is the world size)");
    return total / by;
  };
  if (tbs && micro && accum) {
    // checked below
  } else if (tbs && micro) {
    accum = divide(*tbs, *micro * n, "train_batch_size",
                   fmt::format("micro-batches of {} on {} GPUs (plan.gpus)", *micro, n));
    run.notes.push_back(fmt::format("gradient_accumulation_steps: {} (train_batch_size / (micro x GPUs))", *accum));
  } else if (tbs && accum) {
    micro = divide(*tbs, *accum * n, "train_batch_size", fmt::format("{} accumulation steps on {} GPUs", *accum, n));
    run.notes.push_back(fmt::format("train_micro_batch_size_per_gpu: {} (train_batch_size / (accum x GPUs))", *micro));
  } else if (micro && accum) {
    tbs = *micro * *accum * n;
  } else if (tbs) {
    accum = 1;
    micro = divide(*tbs, n, "train_batch_size", fmt::format("{} GPUs (plan.gpus)", n));
    run.notes.push_back(
        fmt::format("train_micro_batch_size_per_gpu: {} (train_batch_size / GPUs, no accumulation)", *micro));
  } else if (micro) {
    accum = 1;
    tbs = *micro * n;
  } else {
    fail(SourceLoc{f.path(), 1, 1},
         "the DeepSpeed config gives neither train_batch_size nor "
         "train_micro_batch_size_per_gpu",
         "DeepSpeed needs one of them (\"auto\" takes plan.minibatch / plan.u_bwd from the harmony config)");
  }
  if (static_cast<std::int64_t>(*micro) * *accum * n != *tbs)
    fail(at("train_batch_size"),
         fmt::format("train_batch_size {} is not train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x "
                     "{} GPUs (plan.gpus) = {}",
                     *tbs, *micro, *accum, n, static_cast<std::int64_t>(*micro) * *accum * n),
         "DeepSpeed requires train_batch_size = micro x accumulation x world size: change one of the three, or "
         "--set plan.gpus=N for the number of GPUs the run launches");
  run.train_batch = *tbs;
  run.micro_batch = *micro;
  run.accumulation = *accum;
}

// ZeRO-3 with offload_param: zero-infinity on the parameters' tier.
void map_zero3_offload_param(DeepSpeedRun& run) {
  run.plan_kind = "zero-infinity";
  run.offload = run.offload_param == "nvme" || run.offload_optimizer == "nvme" ? "nvme" : "cpu";
  run.reasoning = fmt::format(
      "ZeRO-3 with offload_param {}: parameters, gradients and optimizer state partitioned over the GPUs and kept "
      "in {}, each layer's shard fetched and all-gathered for every forward and backward, CPU Adam after the "
      "backward: zero-infinity, offload {}",
      run.offload_param, run.offload_param == "cpu" ? "host memory" : "NVMe", run.offload);
  if (run.offload_optimizer != run.offload_param) {
    run.status = "approximate";
    run.approximation = fmt::format(
        "offload_optimizer is {} where offload_param is {}: zero-infinity's {} tier keeps the parameters and the "
        "optimizer state together{}",
        run.offload_optimizer, run.offload_param, run.offload,
        run.offload_optimizer == "none" ? ", and runs the optimizer on the CPU" : "");
  }
}

// ZeRO-Offload (offload_optimizer below stage 3): parameters resident on the GPUs, optimizer state and step on the
// CPU.
void map_zero_offload(DeepSpeedRun& run) {
  run.plan_kind = "zero-offload";
  run.offload = "";
  run.reasoning = fmt::format(
      "ZeRO-{} with offload_optimizer cpu (ZeRO-Offload): parameters stay on every GPU, each rank's gradient "
      "shard goes to the host in FP32, CPU Adam steps its FP32 masters after the backward and the updated shard "
      "comes back up before an all-gather: zero-offload",
      run.stage);
  if (run.stage == 1 || run.accumulation > 1) {
    run.status = "approximate";
    run.approximation = run.accumulation > 1
                            ? fmt::format(
                                  "with {} micro-steps per optimizer step DeepSpeed moves every micro-step's gradients "
                                  "through host memory; zero-offload accumulates them on the GPU and moves them once "
                                  "(docs/baselines.md#zero-offload)",
                                  run.accumulation)
                            : std::string("ZeRO-1 all-reduces the gradients where zero-offload reduce-scatters them");
  }
}

// ZeRO-3 with the optimizer alone offloaded: the parameters stay partitioned on the GPUs (zero3-opt-offload).
void map_zero3_offload_optimizer(DeepSpeedRun& run) {
  run.plan_kind = "zero3-opt-offload";
  run.offload = run.offload_optimizer;
  run.reasoning = fmt::format(
      "ZeRO-{} with offload_optimizer {} and the parameters partitioned on the GPUs: each layer all-gathered from "
      "the GPUs' shards for the forward and the backward, every micro-step's gradient shard through host memory, CPU "
      "Adam after the backward and each GPU's updated shard copied back up: zero3-opt-offload, offload {}",
      run.stage, run.offload_optimizer, run.offload);
}

// ZeRO-3 without offload: zero3.
void map_zero3(DeepSpeedRun& run) {
  run.plan_kind = "zero3";
  run.offload = "";
  run.reasoning =
      "ZeRO-3 without offload: parameters, gradients and optimizer state partitioned over the GPUs, each layer "
      "all-gathered for the forward and the backward, its gradient reduce-scattered every micro-step, Adam on each "
      "GPU's partition, and stage 3's fetch and release hooks on every module and parameter: zero3";
}

// Stage 0 without offload: plain data parallelism, resident.
void map_data_parallel(DeepSpeedRun& run) {
  run.plan_kind = "resident";
  run.offload = "";
  run.reasoning =
      "ZeRO stage 0: plain data parallelism (every GPU holds the whole model, its gradients and Adam state, "
      "all-reduces the gradients and steps Adam on the GPU): resident";
}

// Stages 1-2 without offload_optimizer: zero2 (exact for stage 2).
void map_zero2(DeepSpeedRun& run) {
  run.plan_kind = "zero2";
  run.offload = "";
  run.reasoning = fmt::format(
      "ZeRO-{} without offload: the whole model's weights on every GPU, the optimizer state{} partitioned over the "
      "GPUs, gradients reduce-scattered into the partitions, Adam on each GPU's partition, the updated weights "
      "all-gathered: zero2",
      run.stage, run.stage == 2 ? " and gradients" : "");
  if (run.stage == 1) {
    run.status = "approximate";
    run.approximation =
        "ZeRO-1 keeps every GPU's whole gradient (zero2 partitions it: its memory is a lower bound by (N-1)/N of the "
        "gradient) and reduces it once per optimizer step, where zero2 reduce-scatters every micro-step's";
  }
}

// The closest plan kind, with why, and how it differs (configs/validation/unseen/pricing.json, rules.zero_offload).
void map_to_kind(DeepSpeedRun& run) {
  const bool param = run.offload_param != "none";
  const bool optim = run.offload_optimizer != "none";
  if (run.stage == 3 && param) {
    map_zero3_offload_param(run);
  } else if (optim && run.stage != 3) {
    map_zero_offload(run);
  } else if (optim) {
    map_zero3_offload_optimizer(run);
  } else if (run.stage == 3) {
    map_zero3(run);
  } else if (run.stage > 0) {
    map_zero2(run);
  } else {
    map_data_parallel(run);
  }
}

// optimizer.type: the Adam family (what every plan kind's CPU step and optimizer state price); its params are not read.
void check_optimizer(const DsFile& f, const json& v) {
  const json& o = f.object(v, "/optimizer", "optimizer");
  const auto it = o.find("type");
  if (it == o.end() || it->is_null()) return;
  std::string type = it->is_string() ? it->get<std::string>() : it->dump();
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* adam : {"adam", "adamw", "cpuadam", "fusedadam", "deepspeedcpuadam"})
    if (type == adam) return;
  fail(f.value_at("/optimizer/type"), fmt::format("optimizer.type {} is not modelled", it->dump()),
       "every plan kind prices Adam (two FP32 moments per parameter, the CPU Adam step): use Adam or AdamW, or "
       "remove the optimizer section from a copy");
}

}  // namespace

DeepSpeedRun read_deepspeed_config(const std::string& path, const DeepSpeedContext& ctx) {
  std::string problem;
  auto text = config_detail::read_text_file(path, &problem);
  if (!text)
    fail(SourceLoc{path, 0, 0}, fmt::format("cannot read the DeepSpeed config '{}': {}", path, problem),
         "--deepspeed names a DeepSpeed JSON config (ds_config.json)");
  DsFile f(path, std::move(*text));
  const json& root = f.parse();
  DeepSpeedRun run;
  run.path = path;
  std::vector<std::string> valid = kTopRead;
  valid.insert(valid.end(), kTopNotPriced.begin(), kTopNotPriced.end());
  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    const std::string ptr = "/" + json_pointer_token(key);
    if (listed(kTopRead, key)) continue;
    if (key == "optimizer") check_optimizer(f, item.value());
    if (listed(kTopNotPriced, key)) {
      run.not_priced.push_back(key + (is_auto(item.value()) ? " (auto)" : ""));
      continue;
    }
    if (listed(kTopUnmodelled, key)) {
      if (feature_on(item.value()))
        f.unmodelled(ptr, key, "it changes what each step computes or moves, and no plan kind models it");
      run.not_priced.push_back(key + " (off)");
      continue;
    }
    f.unknown(ptr, key, key, valid);
  }
  read_batch(f, root, ctx, run);
  read_zero(f, root, run);
  read_precision(f, root, ctx, run);
  if (const auto it = root.find("activation_checkpointing"); it != root.end() && !it->is_null()) {
    const json& o = f.object(*it, "/activation_checkpointing", "activation_checkpointing");
    for (const auto& item : o.items()) {
      const std::string kptr = "/activation_checkpointing/" + json_pointer_token(item.key());
      const std::string kname = "activation_checkpointing." + item.key();
      if (!listed(kCheckpointingKeys, item.key())) f.unknown(kptr, kname, item.key(), kCheckpointingKeys);
      run.not_priced.push_back(kname);
    }
    run.activations = "checkpoint";
  } else {
    run.notes.push_back(
        "activations: the config has no activation_checkpointing section, so whether the model checkpoints is not "
        "known: the better of checkpoint and keep is priced");
  }
  map_to_kind(run);
  run.summary = fmt::format("ZeRO-{}", run.stage);
  if (run.offload_param != "none") run.summary += ", offload_param " + run.offload_param;
  if (run.offload_optimizer != "none") run.summary += ", offload_optimizer " + run.offload_optimizer;
  if (run.pipeline_read || run.pipeline_write)
    run.summary += run.pipeline_read && run.pipeline_write ? " (pipelined read and write)"
                   : run.pipeline_read                     ? " (pipelined read)"
                                                           : " (pipelined write)";
  run.summary += fmt::format(", micro {} x accum {} x {} GPU{}", run.micro_batch, run.accumulation, run.gpus,
                             run.gpus == 1 ? "" : "s");
  run.summary += ", " + (run.dtype.empty() ? ctx.dtype + " (auto)" : run.dtype);
  return run;
}

}  // namespace harmony::core
