// The config loader's internals shared by its files (config.cpp: overrides and the loaders; config_model.cpp: model,
// cost_model; config_plan.cpp: plan, options, search and their checks; config_train.cpp: harmony-run's TrainConfig;
// config_yaml.cpp: the located YAML tree, key checks and quantity getters; config_machine.cpp: machine files,
// presets, topology, rates): nothing outside core/config includes it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/error.hpp"
#include "core/base/units.hpp"
#include "core/config/config.hpp"
#include "core/config/yaml_tree.hpp"
#include "core/plan/plan_kind.hpp"
#include "core/plan/plan_rules.hpp"

namespace harmony::core::config_detail {

using Node = YamlNode;
using Entry = YamlEntry;

// The machine of a config without `machine:`.
constexpr std::string_view kDefaultPreset = "paper-1080ti";

// Machine files may name a base (preset or file); this bounds `file:` chains and cycles.
constexpr int kMaxMachineDepth = 8;

constexpr const char* kYamlHint =
    "check the indentation (spaces, not tabs), that each `key: value` has a space after the colon, and that "
    "brackets and quotes are closed; flow lists look like [a, b]";

constexpr const char* kSizeHint =
    "write a size like 10GiB, 512 MiB, 11GB or a byte count like 10737418240 (binary KiB/MiB/GiB/TiB, decimal "
    "KB/MB/GB/TB; units are case-sensitive)";

constexpr const char* kBandwidthHint =
    "write a bandwidth like 11.5GiB/s, 16 GB/s, 500MiB/s or a plain number of bytes per second like 12348030976 "
    "(units are case-sensitive)";

constexpr const char* kDurationHint =
    "write a duration like 40ms, 0.04s, 250us, 10ns or a plain number of seconds like 0.04";

struct EmbeddedPreset {
  std::string_view name;
  std::string_view yaml;
};

// The files read while one load_config / load_config_text call builds its RunConfig (RunConfig::inputs); per
// thread, since configs are loaded on many threads at once (sweeps). Defined in config_yaml.cpp.
extern thread_local std::vector<std::string>* t_files_read;

class RecordFilesRead {
 public:
  RecordFilesRead() : previous_(t_files_read) { t_files_read = &files_; }
  ~RecordFilesRead() { t_files_read = previous_; }
  RecordFilesRead(const RecordFilesRead&) = delete;
  RecordFilesRead& operator=(const RecordFilesRead&) = delete;
  // The files read, then the profile the config names (read later by load_model), each once.
  std::vector<std::string> take(const RunConfig& cfg) {
    std::vector<std::string> out;
    for (auto& f : files_) {
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(std::move(f));
    }
    if (!cfg.model.profile_path.empty() && std::find(out.begin(), out.end(), cfg.model.profile_path) == out.end())
      out.push_back(cfg.model.profile_path);
    return out;
  }

 private:
  std::vector<std::string> files_;
  std::vector<std::string>* previous_;
};

// ---- config_yaml.cpp: the located tree, small helpers, quantities, files

SourceLoc loc_from_mark(const YAML::Mark& mark, const std::string& file);
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");
std::string describe(const Node& n);
std::string qualify(const std::string& section, std::string_view key);
std::string suggestion_hint(const std::string& word, const std::vector<std::string>& valid, std::string_view what);
[[noreturn]] void fail(const SourceLoc& loc, const std::string& message, const std::string& hint = {});
void check_keys(const Node& map, const std::string& section, const std::vector<std::string>& valid);
const Entry* find(const Node& map, std::string_view key);
const Entry* find_any(const Node& map, std::string_view key);
const Entry& require(const Node& map, std::string_view key, const std::string& section, const SourceLoc& section_loc,
                     const std::string& hint);
const Node* section_map(const Node& root, std::string_view key);
const std::string& expect_scalar(const Node& v, const std::string& what, std::string_view expected,
                                 const std::string& hint = {});
std::string get_string(const Node& v, const std::string& what);
int get_int(const Node& v, const std::string& what, int min);
bool get_bool(const Node& v, const std::string& what);
double get_positive_double(const Node& v, const std::string& what);
bool starts_negative(const std::string& s);
Bytes check_bytes_range(const Node& v, const std::string& what, const std::string& s, Bytes bytes,
                        const std::string& hint);
double check_bandwidth_range(const Node& v, const std::string& what, const std::string& s, double bytes_per_s,
                             const std::string& hint);
double check_duration_range(const Node& v, const std::string& what, const std::string& s, double seconds,
                            const std::string& hint);
Bytes get_bytes(const Node& v, const std::string& what);
double get_bandwidth(const Node& v, const std::string& what);
double get_duration(const Node& v, const std::string& what);
std::vector<const Node*> get_list(const Node& v, const std::string& what, std::string_view example);
std::string resolve_path(const std::string& base_dir, const std::string& path);
std::string parent_dir(const std::string& file);
std::optional<std::string> read_text_file(const std::string& path, std::string* problem);

// ---- config_machine.cpp: machine files, presets, topology, rates

const EmbeddedPreset* find_preset(std::string_view name);
bool looks_like_path(const std::string& s);
[[noreturn]] void fail_unknown_preset(const std::string& name, const SourceLoc& loc);
MachineSpec machine_from_preset(const std::string& name, const SourceLoc& loc, int depth);
MachineSpec machine_from_file(const std::string& path, const SourceLoc& ref_loc, int depth);

// A machine named by a string: a preset name, else a path (relative to `base_dir`).
MachineSpec machine_from_reference(const std::string& ref, const SourceLoc& loc, const std::string& base_dir,
                                   int depth);
double get_topology_duration(const Node& v, const std::string& what, std::string_view unit);
MachineSpec machine_from_map(const Node& map, const std::string& section, const SourceLoc& owner_loc,
                             const std::string& base_dir, const std::string& default_name, int depth);

// machine: absent -> the paper's testbed; a string -> preset or file; a mapping -> base + overrides.
MachineSpec parse_machine_section(const Node& root, const std::string& file, const std::string& base_dir);

// ---- config.cpp: overrides

// Applies one `--set a.b.c=value` override to the config tree (the value parsed as YAML, flow style allowed).
// `origin`: where its errors point (default: "--set TEXT").
void apply_override(Node& root, const std::string& text, const std::optional<SourceLoc>& origin = std::nullopt);
// The opening of both config builders: the overrides applied, then an empty config or one that is not a mapping
// refused (with `start_hint`), then the top-level keys checked against `top_keys`.
void open_root(Node& root, const std::string& file, const std::vector<std::string>& overrides,
               const std::vector<std::string>& top_keys, const char* start_hint,
               const std::vector<FlagOverride>& flags = {});

// ---- config_model.cpp: model and cost_model

ModelSpec parse_model(const Node& model, const SourceLoc& model_loc, const std::string& base_dir);
CostModelKind parse_cost_model(const Entry& e);

// ---- config_plan.cpp: plan, options, search, and the checks that combine sections

// Where plan values were written, for the checks that combine sections.
struct PlanLocs {
  SourceLoc gpus, minibatch, u_fwd, u_bwd;
};

struct SearchLocs {
  std::vector<SourceLoc> u_fwd, u_bwd;
};

// `machine`: the config's (plan.offload: nvme needs its NVMe tier).
PlanSpec parse_plan(const Node& map, const SourceLoc& plan_key_loc, PlanLocs& locs, const MachineSpec& machine);
Options parse_options(const Node* map, bool prefetch_default);
// `swap_default`: search.swap when not given (plan.swap, which a mode without the knob leaves scheduled).
SearchSpec parse_search(const Node* map, SearchLocs& locs, PackCounts pack_counts_default, SwapTiming swap_default,
                        const Zero3Overheads& zero3_default = {});

// The plan rules (core/plan/plan_rules) for plan.mode's kind, each problem located at the key it is about:
// plan.gpus, plan.minibatch, or the microbatch key or search entry that breaks it. A kind without packs runs one
// microbatch size, plan.u_bwd (and search.u_bwd): its u_fwd keys are not read.
void check_plan(const RunConfig& cfg, UnequalMicrobatches unequal, const PlanLocs& plan_locs,
                const SearchLocs& search_locs);

// ---- config_train.cpp: harmony-run's TrainConfig

TrainConfig build_train_config(Node root, const std::string& file, const std::vector<std::string>& overrides,
                               bool plan_searched, const std::vector<FlagOverride>& flags = {});

}  // namespace harmony::core::config_detail
