// Machines for the config loader: machine files (with a base preset or file and key-by-key overrides), the
// built-in presets embedded from configs/machines/, the `topology:` mapping, `gpu_rates` / `cpu_adam`, `host_paths`,
// `compute` and `dispatch`, each key located and checked (docs/machines.md); and the public machine loaders of
// config.hpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/base/units.hpp"
#include "core/config/config_internal.hpp"
#include "core/model/analytic.hpp"

namespace harmony::core {
namespace config_detail {

constexpr EmbeddedPreset kEmbeddedPresets[] = {
#include "machine_presets.inc"
};

// ------------------------------------------------------------------------------------------------
// Machines

const std::vector<std::string> kMachineSpecKeys = {
    "name",     "gpu",        "gpus",     "gpu_memory",     "memory_cap_scale", "bw_swap",
    "bw_p2p",   "bw_msg",     "time_del", "price_per_hour", "topology",         "gpu_rates",
    "cpu_adam", "host_paths", "compute",  "dispatch"};

std::vector<std::string> machine_keys_with_base() {
  std::vector<std::string> keys = {"preset", "file"};
  keys.insert(keys.end(), kMachineSpecKeys.begin(), kMachineSpecKeys.end());
  return keys;
}

const EmbeddedPreset* find_preset(std::string_view name) {
  for (const EmbeddedPreset& p : kEmbeddedPresets) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

bool looks_like_path(const std::string& s) {
  const auto ends_with = [&](std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return s.find('/') != std::string::npos || s.find('\\') != std::string::npos || ends_with(".yaml") ||
         ends_with(".yml");
}

[[noreturn]] void fail_unknown_preset(const std::string& name, const SourceLoc& loc) {
  const std::vector<std::string> names = machine_preset_names();
  const std::string best = closest_match(name, names);
  std::string hint = best.empty() ? std::string() : fmt::format("did you mean '{}'? ", best);
  // The default machine first, then the rest in name order.
  std::vector<std::string> listed = {fmt::format("{} (the default)", kDefaultPreset)};
  for (const std::string& n : names) {
    if (n != kDefaultPreset) listed.push_back(n);
  }
  hint += fmt::format("built-in presets: {}; or give the path of a machine YAML file", join(listed));
  fail(loc, fmt::format("unknown machine preset '{}'", name), hint);
}

MachineSpec machine_from_preset(const std::string& name, const SourceLoc& loc, int depth);
MachineSpec machine_from_file(const std::string& path, const SourceLoc& ref_loc, int depth);

// A machine named by a string: a preset name, else a path (relative to `base_dir`).
MachineSpec machine_from_reference(const std::string& ref, const SourceLoc& loc, const std::string& base_dir,
                                   int depth) {
  if (find_preset(ref)) return machine_from_preset(ref, loc, depth);
  const std::string path = resolve_path(base_dir, ref);
  std::error_code ec;
  if (looks_like_path(ref) || std::filesystem::is_regular_file(path, ec)) return machine_from_file(path, loc, depth);
  fail_unknown_preset(ref, loc);
}

// ------------------------------------------------------------------------------------------------
// Machine topology: the `topology:` mapping of a machine (docs/machines.md). It is read into a draft
// that starts from the base machine's topology, if any, so a mapping with `preset:` can change single
// topology keys; the draft is then checked as a whole and becomes core::Topology.

// A topology's per-GPU tables and NVLink pairs grow with the GPU count; this keeps them small.
constexpr int kMaxTopologyGpus = 1024;

const std::vector<std::string> kTopologyKeys = {
    "sockets",     "inter_socket", "switches",    "gpus",      "p2p",       "nvlink", "latency",
    "host_memory", "pinned_limit", "host_memcpy", "cpu_cores", "free_time", "nvme",   "host_memory_bandwidth"};
const std::vector<std::string> kNvmeKeys = {"read", "write", "capacity", "latency"};
const std::vector<std::string> kSwitchKeys = {"name", "socket", "uplink"};
const std::vector<std::string> kGpuKeys = {"switch", "link", "copy_engines"};
const std::vector<std::string> kCopyEngineKeys = {"h2d", "d2h"};
const std::vector<std::string> kNvLinkKeys = {"gpus", "bandwidth"};
const std::vector<std::string> kP2PModes = {"pcie", "host"};

constexpr const char* kTopologySizeHint =
    "topology sizes need a unit: binary KiB/MiB/GiB/TiB or decimal KB/MB/GB/TB (case-sensitive); plain byte counts "
    "are accepted only by the reference key gpu_memory";
constexpr const char* kTopologyBandwidthHint =
    "topology bandwidths need a unit and are per direction, e.g. 12GB/s, 11.5GiB/s or 450GB/s; plain numbers are "
    "accepted only by the reference keys bw_swap, bw_p2p and bw_msg";
constexpr const char* kTopologyDurationHint =
    "topology durations need a unit: s, ms, us or ns, e.g. 10us; a bare 0 is accepted";

// Where a topology value came from: written in the mapping being read, or inherited from its base
// machine (then `loc` is where the base is named: its `preset:` or `file:` value).
struct Origin {
  SourceLoc loc;
  bool inherited = false;
};

struct TopologyDraft {
  Topology topo;                         // GpuSpec::pcie_switch is resolved from gpu_switch at the end
  std::vector<std::string> gpu_switch;   // per GPU, the switch it names ("" = none yet)
  std::vector<Origin> gpu_switch_at;     // per GPU
  std::vector<Origin> switch_socket_at;  // per switch
  Origin topology_at, sockets_at, switches_at, gpus_at, host_memory_at, pinned_limit_at;
};

std::string_view trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

// A number without a unit ("750", "12.5"); its value, or nullopt when the text has a unit or is no number.
std::optional<double> plain_number(std::string_view s) {
  s = trimmed(s);
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s.front())) || s.front() == '.')) return std::nullopt;
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// A capacity such as host_memory: a size with a unit, > 0.
Bytes get_capacity(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a size with a unit", kTopologySizeHint);
  const std::string leave_out = "; leave the key out for no limit";
  if (starts_negative(s))
    fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0)
      fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
    const std::string t(trimmed(s));
    const std::string suggestion = *n < 1e6 ? t + "GiB" : t + "B";
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}'? {}", suggestion, kTopologySizeHint));
  }
  const auto bytes = parse_bytes(s);
  if (!bytes) fail(v.loc, fmt::format("{}: '{}' is not a valid size", what, s), kTopologySizeHint);
  if (*bytes <= 0)
    fail(v.loc, fmt::format("{} must be a positive size, got '{}'", what, s), kTopologySizeHint + leave_out);
  return check_bytes_range(v, what, s, *bytes, kTopologySizeHint);
}

// A link bandwidth: a bandwidth with a unit, > 0.
double get_link_bandwidth(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a bandwidth with a unit", kTopologyBandwidthHint);
  const std::string positive = fmt::format("{} must be a positive bandwidth, got '{}'", what, s);
  if (starts_negative(s)) fail(v.loc, positive, kTopologyBandwidthHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) fail(v.loc, positive, kTopologyBandwidthHint);
    const std::string t(trimmed(s));
    const std::string suggestion = *n < 1e6 ? t + "GB/s" : t + "B/s";
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}'? {}", suggestion, kTopologyBandwidthHint));
  }
  if (const auto bw = parse_bandwidth(s)) return check_bandwidth_range(v, what, s, *bw, kTopologyBandwidthHint);
  const std::string_view t = trimmed(s);
  if (t.size() > 2 && t.substr(t.size() - 2) == "/s") {
    if (const auto size = parse_bytes(t.substr(0, t.size() - 2)); size && *size == 0)
      fail(v.loc, positive, kTopologyBandwidthHint);
  } else if (const auto size = parse_bytes(t); size && *size > 0) {
    fail(v.loc, fmt::format("{}: '{}' is a size, not a bandwidth", what, s),
         fmt::format("did you mean '{}/s'? {}", t, kTopologyBandwidthHint));
  }
  fail(v.loc, fmt::format("{}: '{}' is not a valid bandwidth", what, s), kTopologyBandwidthHint);
}

// A duration with a unit (a bare 0 is fine); `unit` is the one suggested for a bare number.
double get_topology_duration(const Node& v, const std::string& what, std::string_view unit) {
  const std::string& s = expect_scalar(v, what, "a duration with a unit", kTopologyDurationHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must not be negative, got '{}'", what, s), kTopologyDurationHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) return 0.0;
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}{}'? {}", trimmed(s), unit, kTopologyDurationHint));
  }
  const auto d = parse_duration_s(s);
  if (!d) fail(v.loc, fmt::format("{}: '{}' is not a valid duration", what, s), kTopologyDurationHint);
  return check_duration_range(v, what, s, *d, kTopologyDurationHint);
}

double get_price(const Node& v, const std::string& what) {
  const std::string hint = "write a plain number (the price of the whole machine per hour), e.g. 32.77";
  const std::string& s = expect_scalar(v, what, "a number", hint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must not be negative, got '{}'", what, s), hint);
  const auto n = plain_number(s);
  if (!n) fail(v.loc, fmt::format("{} must be a number, got '{}'", what, s), hint);
  return *n;
}

// `none`: the value that drops what a machine inherits from its base (topology: none, topology.nvme: none,
// gpu_rates.matrix_tf32: none, gpu_rates.gemm_ceiling: none).
bool is_none(const Node& v) { return v.kind == Node::Kind::Scalar && v.scalar == "none"; }

// ------------------------------------------------------------------------------------------------
// Compute rates for analytic models (docs/machines.md, `gpu_rates` and `cpu_adam`): key by key over the base's.

const std::vector<std::string> kGpuRatesKeys = {"matrix_fp32",  "matrix_fp16",       "matrix_tf32",
                                                "memory",       "gemm_efficiency",   "gemm_efficiency_fp32",
                                                "gemm_ceiling", "vector_efficiency", "overhead"};
const std::vector<std::string> kGemmEfficiencyKeys = {"max", "half"};
const std::vector<std::string> kOverheadKeys = {"kernel", "forward", "backward"};
const std::vector<std::string> kCpuAdamKeys = {"bandwidth", "per_layer", "bandwidth_bf16", "bandwidth_fp16",
                                               "bandwidth_torch"};

constexpr const char* kFlopsHint =
    "write a rate with a unit, e.g. 11.3TFLOP/s, 312 TFLOP/s or 500GFLOP/s (prefixes k, M, G, T, P; case-sensitive)";

double get_flops_per_s(const Node& v, const std::string& what) {
  const std::string& s = expect_scalar(v, what, "a FLOP rate", kFlopsHint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must be a positive rate, got '{}'", what, s), kFlopsHint);
  if (const auto n = plain_number(s)) {
    if (*n == 0.0) fail(v.loc, fmt::format("{} must be a positive rate, got '{}'", what, s), kFlopsHint);
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}{}'? {}", trimmed(s), *n < 1e6 ? "TFLOP/s" : "FLOP/s", kFlopsHint));
  }
  if (const auto f = parse_flops_per_s(s)) {
    if (!(*f >= kMinInputFlopsPerS) || !(*f <= kMaxInputFlopsPerS))
      fail(v.loc, fmt::format("{} = '{}' is too {}", what, s, *f < kMinInputFlopsPerS ? "small" : "large"),
           fmt::format("FLOP rates range from 1 MFLOP/s to 1000 PFLOP/s (1e18 FLOP/s); {}", kFlopsHint));
    return *f;
  }
  if (parse_flop_count(s))
    fail(v.loc, fmt::format("{}: '{}' is an amount of work, not a rate", what, s),
         fmt::format("did you mean '{}/s'? {}", trimmed(s), kFlopsHint));
  fail(v.loc, fmt::format("{}: '{}' is not a valid FLOP rate", what, s), kFlopsHint);
}

double get_flop_count(const Node& v, const std::string& what) {
  const char* hint = "write an amount of work with a unit, e.g. 0.7GFLOP or 500MFLOP (prefixes k, M, G, T, P)";
  const std::string& s = expect_scalar(v, what, "a FLOP count", hint);
  if (starts_negative(s)) fail(v.loc, fmt::format("{} must be positive, got '{}'", what, s), hint);
  if (const auto n = plain_number(s); n && *n > 0.0)
    fail(v.loc, fmt::format("{}: '{}' has no unit", what, s),
         fmt::format("did you mean '{}GFLOP'? {}", trimmed(s), hint));
  if (const auto f = parse_flop_count(s)) {
    if (!(*f <= kMaxInputFlops))
      fail(v.loc, fmt::format("{} = '{}' is too large", what, s),
           fmt::format("FLOP counts range up to 1000 PFLOP (1e18 FLOP); {}", hint));
    return *f;
  }
  fail(v.loc, fmt::format("{}: '{}' is not a valid FLOP count", what, s), hint);
}

// A fraction in (0, 1].
// A fraction in (0, max] (of a peak; `hint` says which).
double get_fraction(const Node& v, const std::string& what, double max = 1.0,
                    const std::string& hint = "write a number in (0, 1], the fraction of the peak reached, e.g. 0.8") {
  const std::string& s = expect_scalar(v, what, "a number", hint);
  const auto n = plain_number(s);
  if (!n || starts_negative(s))
    fail(v.loc, fmt::format("{} must be a number in (0, {:g}], got '{}'", what, max, s), hint);
  if (!(*n > 0.0) || *n > max) fail(v.loc, fmt::format("{} must be in (0, {:g}], got {}", what, max, s), hint);
  return *n;
}

// gpu_rates.gemm_ceiling: a measured fraction of matrix_fp16 in (0, kMaxGemmCeiling]. Above 1 where a card's sustained
// boost clock exceeds the rated boost its datasheet peak is quoted at (GeForce cards: docs/machines.md, gemm_ceiling).
constexpr double kMaxGemmCeiling = 1.5;

double get_gemm_ceiling(const Node& v, const std::string& what) {
  return get_fraction(v, what, kMaxGemmCeiling,
                      "write the fraction of matrix_fp16 a GEMM microbenchmark reaches, e.g. 0.8 (up to 1.5: a "
                      "GeForce card boosting past its rated clock can exceed its datasheet peak)");
}

const Node& sub_map(const Entry& e, const std::string& what, const std::vector<std::string>& keys,
                    const char* example) {
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc, fmt::format("{} must be a mapping, got {}", what, describe(e.value)), example);
  check_keys(e.value, what, keys);
  return e.value;
}

void apply_gpu_rates(GpuRates& r, const Entry& e, const std::string& what) {
  const char* example =
      "e.g. gpu_rates: {matrix_fp32: 11.3TFLOP/s, memory: 484GB/s, gemm_efficiency: {max: 0.8, half: 0.7GFLOP}}";
  const Node& map = sub_map(e, what, kGpuRatesKeys, example);
  if (const Entry* x = find(map, "matrix_fp32"))
    r.matrix_fp32_flops_per_s = get_flops_per_s(x->value, what + ".matrix_fp32");
  if (const Entry* x = find(map, "matrix_fp16"))
    r.matrix_fp16_flops_per_s = get_flops_per_s(x->value, what + ".matrix_fp16");
  // The two optional capabilities a base machine may have and this GPU may lack: `none` drops the inherited value
  // (a machine file for a GPU without TF32, or without a measured ceiling, that starts from a preset with one).
  if (const Entry* x = find(map, "matrix_tf32"))
    r.matrix_tf32_flops_per_s = is_none(x->value) ? 0.0 : get_flops_per_s(x->value, what + ".matrix_tf32");
  if (const Entry* x = find(map, "memory")) r.memory_bytes_per_s = get_link_bandwidth(x->value, what + ".memory");
  if (const Entry* x = find(map, "gemm_efficiency")) {
    const std::string w = what + ".gemm_efficiency";
    const Node& g = sub_map(*x, w, kGemmEfficiencyKeys, "e.g. gemm_efficiency: {max: 0.8, half: 0.7GFLOP}");
    if (const Entry* y = find(g, "max")) r.gemm_efficiency_max = get_fraction(y->value, w + ".max");
    if (const Entry* y = find(g, "half")) r.gemm_half_flops = get_flop_count(y->value, w + ".half");
  }
  if (const Entry* x = find(map, "gemm_efficiency_fp32")) {
    const std::string w = what + ".gemm_efficiency_fp32";
    const Node& g = sub_map(*x, w, kGemmEfficiencyKeys, "e.g. gemm_efficiency_fp32: {max: 0.79, half: 0.12GFLOP}");
    if (const Entry* y = find(g, "max")) r.gemm_fp32_efficiency_max = get_fraction(y->value, w + ".max");
    if (const Entry* y = find(g, "half")) r.gemm_fp32_half_flops = get_flop_count(y->value, w + ".half");
    // over a base that has none, both: a half left out would price fp32 GEMMs with no fixed cost, or none at all
    if ((r.gemm_fp32_efficiency_max > 0) != (r.gemm_fp32_half_flops > 0))
      fail(x->key_loc, fmt::format("{} needs both max and half (the machine it starts from has neither)", w),
           "e.g. gemm_efficiency_fp32: {max: 0.79, half: 0.12GFLOP}");
  }
  if (const Entry* x = find(map, "gemm_ceiling"))
    r.gemm_ceiling = is_none(x->value) ? 0.0 : get_gemm_ceiling(x->value, what + ".gemm_ceiling");
  if (const Entry* x = find(map, "vector_efficiency"))
    r.vector_efficiency = get_fraction(x->value, what + ".vector_efficiency");
  if (const Entry* x = find(map, "overhead")) {
    const std::string w = what + ".overhead";
    const Node& o = sub_map(*x, w, kOverheadKeys, "e.g. overhead: {kernel: 20us, forward: 90us, backward: 520us}");
    if (const Entry* y = find(o, "kernel")) r.kernel_floor_s = get_topology_duration(y->value, w + ".kernel", "us");
    if (const Entry* y = find(o, "forward"))
      r.forward_overhead_s = get_topology_duration(y->value, w + ".forward", "us");
    if (const Entry* y = find(o, "backward"))
      r.backward_overhead_s = get_topology_duration(y->value, w + ".backward", "us");
  }
  if (!r.valid())
    fail(e.key_loc, fmt::format("{} needs matrix_fp32 and memory", what),
         "give at least the GPU's FP32 GEMM peak and its memory bandwidth, e.g. "
         "gpu_rates: {matrix_fp32: 11.3TFLOP/s, memory: 484GB/s} (docs/machines.md)");
}

void apply_cpu_adam(CpuAdam& c, const Entry& e, const std::string& what) {
  const Node& map = sub_map(e, what, kCpuAdamKeys, "e.g. cpu_adam: {bandwidth: 3.6GB/s, per_layer: 300us}");
  if (const Entry* x = find(map, "bandwidth")) c.bytes_per_s = get_link_bandwidth(x->value, what + ".bandwidth");
  if (const Entry* x = find(map, "per_layer"))
    c.per_layer_s = get_topology_duration(x->value, what + ".per_layer", "us");
  if (const Entry* x = find(map, "bandwidth_bf16"))
    c.bf16_bytes_per_s = get_link_bandwidth(x->value, what + ".bandwidth_bf16");
  if (const Entry* x = find(map, "bandwidth_fp16"))
    c.fp16_bytes_per_s = get_link_bandwidth(x->value, what + ".bandwidth_fp16");
  if (const Entry* x = find(map, "bandwidth_torch"))
    c.torch_bytes_per_s = get_link_bandwidth(x->value, what + ".bandwidth_torch");
}

// ------------------------------------------------------------------------------------------------
// Measured host paths (docs/machines.md, `host_paths`): bandwidths, key by key over the base's.

struct HostPathKey {
  const char* name;
  double HostPaths::*field;
};
constexpr HostPathKey kHostPathKeys[] = {
    {"pinned_h2d", &HostPaths::pinned_h2d_bytes_per_s},
    {"pinned_d2h", &HostPaths::pinned_d2h_bytes_per_s},
    {"pageable_h2d", &HostPaths::pageable_h2d_bytes_per_s},
    {"pageable_d2h", &HostPaths::pageable_d2h_bytes_per_s},
    {"bf16_stage_up", &HostPaths::bf16_stage_up_bytes_per_s},
    {"bf16_stage_down", &HostPaths::bf16_stage_down_bytes_per_s},
    {"bf16_round", &HostPaths::bf16_round_bytes_per_s},
    {"bf16_widen", &HostPaths::bf16_widen_bytes_per_s},
    {"memcpy_one_thread", &HostPaths::memcpy_one_thread_bytes_per_s},
};

void apply_host_paths(HostPaths& h, const Entry& e, const std::string& what) {
  std::vector<std::string> keys;
  for (const HostPathKey& k : kHostPathKeys) keys.emplace_back(k.name);
  const Node& map = sub_map(e, what, keys,
                            "e.g. host_paths: {pinned_h2d: 24.5GB/s, pinned_d2h: 25.1GB/s, bf16_stage_up: 18GB/s} "
                            "(each key optional; `harmony-run probe` writes them)");
  for (const HostPathKey& k : kHostPathKeys) {
    if (const Entry* x = find(map, k.name)) h.*k.field = get_link_bandwidth(x->value, what + "." + k.name);
  }
}

// ------------------------------------------------------------------------------------------------
// Shared compute and dispatch overheads for the native model (docs/machines.md, `compute` and `dispatch`).

const std::vector<std::string> kComputeKeys = {"units",      "units_per_op", "time_scale", "update_time_scale",
                                               "host_cores", "wake"};
const std::vector<std::string> kDispatchKeys = {"compute", "copy", "p2p", "update"};

// A plain number in [lo, hi] (lo itself only when `lo_inclusive`).
double get_number_in(const Node& v, const std::string& what, double lo, bool lo_inclusive, double hi,
                     const std::string& hint) {
  const std::string& s = expect_scalar(v, what, "a number", hint);
  const auto n = plain_number(s);
  if (!n || starts_negative(s)) {
    if (starts_negative(s) && !lo_inclusive) fail(v.loc, fmt::format("{} must be positive, got '{}'", what, s), hint);
    fail(v.loc, fmt::format("{} must be a plain number, got '{}'", what, s), hint);
  }
  if ((lo_inclusive ? *n < lo : *n <= lo) || *n > hi)
    fail(v.loc, fmt::format("{} = {} is out of range", what, s), hint);
  return *n;
}

void apply_compute(ComputeSharing& c, const Entry& e, const std::string& what) {
  const Node& map = sub_map(e, what, kComputeKeys, "e.g. compute: {units: 2, units_per_op: 1, time_scale: 1.1}");
  if (const Entry* x = find(map, "units"))
    c.units = get_number_in(x->value, what + ".units", 0.0, true, 1e6,
                            "the compute units every device shares, from 0 (not shared: each device computes alone) "
                            "to 1e6, e.g. units: 2 for logical devices on a 2-core host");
  if (const Entry* x = find(map, "units_per_op"))
    c.units_per_op =
        get_number_in(x->value, what + ".units_per_op", 0.0, false, 1e6,
                      "the most units one compute op uses, in (0, units], e.g. 1 for one thread per kernel");
  if (const Entry* x = find(map, "time_scale"))
    c.time_scale = get_number_in(x->value, what + ".time_scale", 0.0, false, 1000.0,
                                 "a factor in (0, 1000] on every profiled FWD/REC/BWD time, e.g. 1.1");
  if (const Entry* x = find(map, "update_time_scale"))
    c.update_time_scale = get_number_in(x->value, what + ".update_time_scale", 0.0, false, 1000.0,
                                        "a factor in (0, 1000] on every profiled CPU update time, e.g. 0.9");
  if (const Entry* x = find(map, "host_cores")) c.host_cores = get_bool(x->value, what + ".host_cores");
  if (const Entry* x = find(map, "wake")) {
    c.wake_s = get_topology_duration(x->value, what + ".wake", "us");
    if (c.wake_s > 1.0)
      fail(x->value.loc, fmt::format("{}.wake = '{}' is too long", what, x->value.scalar),
           "the wait from an op becoming ready to its thread starting it, from 0 to 1s, e.g. 300us (harmony-sim "
           "calibrate measures it)");
    if (c.wake_s > 0 && !c.host_cores)
      fail(x->key_loc, fmt::format("{}.wake is set but {}.host_cores is not true", what, what),
           "wake is the delay of an op's host thread: give it with compute: {units: 2, host_cores: true, wake: 300us}");
  }
  if (c.host_cores && !c.shared())
    fail(e.key_loc, fmt::format("{}.host_cores is true but {}.units is 0", what, what),
         "host_cores says the pool is the host's cores: give their number, e.g. compute: {units: 2, host_cores: true}");
  if (c.shared() && c.units_per_op > c.units)
    fail(e.key_loc, fmt::format("{}.units_per_op ({}) exceeds {}.units ({})", what, c.units_per_op, what, c.units),
         "one op cannot use more units than the pool has: lower units_per_op or raise units");
}

void apply_dispatch(DispatchOverheads& d, const Entry& e, const std::string& what) {
  const Node& map =
      sub_map(e, what, kDispatchKeys, "e.g. dispatch: {compute: 40us, copy: 20us, p2p: 20us, update: 50us}");
  // At most 1 s per op: a dispatch cost is a launch, not work, and this keeps every op's end in range.
  auto overhead = [&](const char* key, double& out) {
    const Entry* x = find(map, key);
    if (!x) return;
    const std::string w = what + "." + key;
    out = get_topology_duration(x->value, w, "us");
    if (out > 1.0)
      fail(x->value.loc, fmt::format("{} = '{}' is too long", w, x->value.scalar),
           "a dispatch overhead is a per-op launch cost from 0 to 1s, e.g. 40us");
  };
  overhead("compute", d.compute_s);
  overhead("copy", d.copy_s);
  overhead("p2p", d.p2p_s);
  overhead("update", d.update_s);
}

// The draft of a base machine's topology, cut or padded to `gpus` GPUs: GPUs beyond the base's are
// blank (no switch, no link) until the mapping describes them; NVLinks to cut GPUs are dropped.
TopologyDraft draft_from(const Topology& base, const SourceLoc& base_loc, const SourceLoc& topology_loc, int gpus) {
  TopologyDraft d;
  d.topo = base;
  const Origin inherited{base_loc, true};
  d.topology_at = base.valid() ? inherited : Origin{topology_loc, false};
  d.sockets_at = d.switches_at = d.gpus_at = d.host_memory_at = d.pinned_limit_at = d.topology_at;
  d.switch_socket_at.assign(base.switches.size(), inherited);
  for (const GpuSpec& g : base.gpus)
    d.gpu_switch.push_back(base.switches.at(static_cast<std::size_t>(g.pcie_switch)).name);
  d.gpu_switch_at.assign(d.gpu_switch.size(), inherited);
  const auto n = static_cast<std::size_t>(gpus);
  d.topo.gpus.resize(n, GpuSpec{});
  d.gpu_switch.resize(n);
  d.gpu_switch_at.resize(n, d.topology_at);
  std::erase_if(d.topo.nvlinks, [gpus](const NvLink& l) { return l.gpu_a >= gpus || l.gpu_b >= gpus; });
  return d;
}

void parse_switches(TopologyDraft& d, const Entry& e, const std::string& what) {
  const char* example = "e.g. switches: [{name: plx0, socket: 0, uplink: 12GB/s}]";
  if (e.value.kind != Node::Kind::Seq)
    fail(e.value.loc, fmt::format("{} must be a list of PCIe switches, got {}", what, describe(e.value)), example);
  d.topo.switches.clear();
  d.switch_socket_at.clear();
  d.switches_at = Origin{e.value.loc, false};
  std::vector<SourceLoc> name_locs;
  for (std::size_t i = 0; i < e.value.items.size(); ++i) {
    const Node& item = e.value.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Map)
      fail(item.loc, fmt::format("{} must be a mapping, got {}", name, describe(item)), example);
    check_keys(item, name, kSwitchKeys);
    PcieSwitch sw;
    const Entry& n = require(item, "name", name, item.loc, "give every switch a name that GPUs refer to, e.g. plx0");
    sw.name = get_string(n.value, name + ".name");
    for (std::size_t j = 0; j < d.topo.switches.size(); ++j) {
      if (d.topo.switches[j].name == sw.name)
        fail(n.value.loc, fmt::format("switch name '{}' is used twice in {}", sw.name, what),
             fmt::format("{}[{}] at {} has the same name; GPUs name their switch, so names must be unique", what, j,
                         name_locs[j].str()));
    }
    name_locs.push_back(n.value.loc);
    Origin socket_at{item.loc, false};
    if (const Entry* s = find(item, "socket")) {
      sw.socket = get_int(s->value, name + ".socket", 0);
      socket_at.loc = s->value.loc;
    }
    const Entry& up = require(item, "uplink", name, item.loc,
                              "give the switch's link to its CPU socket, per direction, e.g. uplink: 12GB/s");
    sw.uplink_bytes_per_s = get_link_bandwidth(up.value, name + ".uplink");
    d.topo.switches.push_back(std::move(sw));
    d.switch_socket_at.push_back(socket_at);
  }
}

// Applies one GPU mapping ({switch, link, copy_engines}, each optional) to GPU `g`.
void apply_gpu_fields(TopologyDraft& d, std::size_t g, const Node& item, const std::string& what) {
  if (item.kind != Node::Kind::Map)
    fail(item.loc, fmt::format("{} must be a mapping, got {}", what, describe(item)),
         "e.g. {switch: plx0, link: 12GB/s, copy_engines: {h2d: 1, d2h: 1}}");
  check_keys(item, what, kGpuKeys);
  if (const Entry* e = find(item, "switch")) {
    const std::string hint =
        "a GPU hangs off exactly one PCIe switch or root port: write switch: NAME, one of topology.switches";
    const std::string& name = expect_scalar(e->value, what + ".switch", "a switch name", hint);
    if (name.empty()) fail(e->value.loc, fmt::format("{}.switch must not be empty", what), hint);
    d.gpu_switch[g] = name;
    d.gpu_switch_at[g] = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(item, "link"))
    d.topo.gpus[g].link_bytes_per_s = get_link_bandwidth(e->value, what + ".link");
  if (const Entry* e = find(item, "copy_engines")) {
    const std::string ce = what + ".copy_engines";
    if (e->value.kind != Node::Kind::Map)
      fail(e->value.loc, fmt::format("{} must be a mapping, got {}", ce, describe(e->value)),
           "e.g. copy_engines: {h2d: 1, d2h: 1} (concurrent copies per direction)");
    check_keys(e->value, ce, kCopyEngineKeys);
    if (const Entry* h = find(e->value, "h2d")) d.topo.gpus[g].copy_engines_h2d = get_int(h->value, ce + ".h2d", 1);
    if (const Entry* h = find(e->value, "d2h")) d.topo.gpus[g].copy_engines_d2h = get_int(h->value, ce + ".d2h", 1);
  }
}

// "3" -> {3, 3}, "0-3" -> {0, 3}; nullopt unless digits (and one '-').
std::optional<std::pair<long long, long long>> parse_gpu_range(std::string_view key) {
  const auto number = [](std::string_view s) -> std::optional<long long> {
    long long v = 0;
    if (s.empty() || s.size() > 9) return std::nullopt;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.front() == '-' || s.front() == '+') return std::nullopt;
    return v;
  };
  const auto dash = key.find('-');
  const auto lo = number(key.substr(0, dash));
  if (!lo) return std::nullopt;
  if (dash == std::string_view::npos) return std::pair{*lo, *lo};
  const auto hi = number(key.substr(dash + 1));
  if (!hi) return std::nullopt;
  return std::pair{*lo, *hi};
}

void parse_gpus(TopologyDraft& d, const Entry& e, const std::string& what, int gpus) {
  d.gpus_at = Origin{e.value.loc, false};
  const auto n = static_cast<std::size_t>(gpus);
  if (e.value.kind == Node::Kind::Seq) {
    // The list form: one entry per GPU, in index order; it replaces every GPU of the base.
    if (e.value.items.size() != n)
      fail(e.value.loc,
           fmt::format("{} lists {} GPU{} but the machine has gpus: {}", what, e.value.items.size(),
                       e.value.items.size() == 1 ? "" : "s", gpus),
           fmt::format("give one entry per GPU, in index order ({} entries), or change the machine's gpus; the "
                       "mapping form {{all: {{...}}, 0-3: {{...}}}} sizes itself from gpus",
                       gpus));
    for (std::size_t g = 0; g < n; ++g) {
      d.topo.gpus[g] = GpuSpec{};
      d.gpu_switch[g].clear();
      apply_gpu_fields(d, g, e.value.items[g], fmt::format("{}[{}]", what, g));
    }
    return;
  }
  if (e.value.kind != Node::Kind::Map)
    fail(e.value.loc,
         fmt::format("{} must be a list (one entry per GPU) or a mapping of GPU indices, got {}", what,
                     describe(e.value)),
         "e.g. gpus: [{switch: plx0, link: 12GB/s}, ...] or gpus: {all: {link: 12GB/s}, 0-1: {switch: plx0}}");
  // The mapping form: `all` applies to every GPU, then `N` or `N-M` keys to single GPUs or ranges, on top
  // of what the base machine had. A GPU may be named by one key only.
  if (const Entry* all = find(e.value, "all")) {
    for (std::size_t g = 0; g < n; ++g) apply_gpu_fields(d, g, all->value, what + ".all");
  }
  std::vector<const Entry*> named_by(n, nullptr);
  const std::string key_hint =
      fmt::format("keys of {} are `all`, a GPU index like 3 or an inclusive range like 0-3, with GPUs numbered 0..{}",
                  what, gpus - 1);
  for (const Entry& entry : e.value.entries) {
    if (entry.key == "all") continue;
    const auto range = parse_gpu_range(entry.key);
    if (!range)
      fail(entry.key_loc, fmt::format("{}: '{}' is not `all`, a GPU index or a range", what, entry.key), key_hint);
    if (range->first > range->second)
      fail(entry.key_loc, fmt::format("{}: range '{}' is reversed", what, entry.key), key_hint);
    if (range->second >= gpus)
      fail(entry.key_loc,
           fmt::format("{}: GPU {} ('{}') is out of range: the machine has {} GPU{} (0..{})", what, range->second,
                       entry.key, gpus, gpus == 1 ? "" : "s", gpus - 1),
           "raise the machine's gpus, or name GPUs that exist");
    for (auto g = static_cast<std::size_t>(range->first); g <= static_cast<std::size_t>(range->second); ++g) {
      if (named_by[g])
        fail(entry.key_loc,
             fmt::format("GPU {} is given twice in {}: by '{}' and by '{}' at {}", g, what, entry.key, named_by[g]->key,
                         named_by[g]->key_loc.str()),
             "name each GPU in one index or range (a GPU hangs off one switch); put settings shared by all GPUs "
             "under `all:`");
      named_by[g] = &entry;
    }
    if (entry.value.kind == Node::Kind::Null) continue;
    for (auto g = static_cast<std::size_t>(range->first); g <= static_cast<std::size_t>(range->second); ++g)
      apply_gpu_fields(d, g, entry.value, fmt::format("{}.{}", what, entry.key));
  }
}

void parse_nvlinks(TopologyDraft& d, const Entry& e, const std::string& what, int gpus) {
  const char* example =
      "e.g. nvlink: [{gpus: [0, 1], bandwidth: 25GB/s}]; gpus: [0, 1, 2, 3] links every pair of the listed GPUs, "
      "gpus: all every pair of the machine";
  if (e.value.kind != Node::Kind::Seq)
    fail(e.value.loc, fmt::format("{} must be a list of links, got {}", what, describe(e.value)), example);
  d.topo.nvlinks.clear();
  const auto n = static_cast<std::size_t>(gpus);
  std::vector<int> pair_owner;  // n*n, the nvlink entry that gave pair (a, b), a < b; -1 if none
  if (!e.value.items.empty()) pair_owner.assign(n * n, -1);
  for (std::size_t i = 0; i < e.value.items.size(); ++i) {
    const Node& item = e.value.items[i];
    const std::string name = fmt::format("{}[{}]", what, i);
    if (item.kind != Node::Kind::Map)
      fail(item.loc, fmt::format("{} must be a mapping, got {}", name, describe(item)), example);
    check_keys(item, name, kNvLinkKeys);
    const Entry& members_e = require(item, "gpus", name, item.loc, example);
    const Entry& bw_e =
        require(item, "bandwidth", name, item.loc, "give the link's bandwidth per direction, e.g. bandwidth: 25GB/s");
    const double bw = get_link_bandwidth(bw_e.value, name + ".bandwidth");
    std::vector<int> members;
    const Node& mv = members_e.value;
    if (mv.kind == Node::Kind::Scalar && mv.scalar == "all") {
      for (int g = 0; g < gpus; ++g) members.push_back(g);
    } else if (mv.kind == Node::Kind::Seq) {
      for (const Node& m : mv.items) {
        const int g = get_int(m, name + ".gpus entries", 0);
        if (g >= gpus)
          fail(m.loc,
               fmt::format("{} names GPU {}, but the machine has {} GPU{} (0..{})", name, g, gpus, gpus == 1 ? "" : "s",
                           gpus - 1),
               "NVLink GPUs are machine GPU indices, numbered from 0");
        if (std::find(members.begin(), members.end(), g) != members.end())
          fail(m.loc, fmt::format("{} names GPU {} twice: a GPU has no NVLink to itself", name, g),
               "list two or more different GPUs, e.g. gpus: [0, 1]");
        members.push_back(g);
      }
    } else {
      fail(mv.loc, fmt::format("{}.gpus must be a list of GPU indices or `all`, got {}", name, describe(mv)), example);
    }
    if (members.size() < 2) fail(mv.loc, fmt::format("{}.gpus must name at least two GPUs", name), example);
    for (std::size_t x = 0; x < members.size(); ++x) {
      for (std::size_t y = x + 1; y < members.size(); ++y) {
        const auto a = static_cast<std::size_t>(std::min(members[x], members[y]));
        const auto b = static_cast<std::size_t>(std::max(members[x], members[y]));
        int& owner = pair_owner[a * n + b];
        if (owner >= 0)
          fail(mv.loc,
               fmt::format("the NVLink between GPUs {} and {} is given twice: by {}[{}] and {}", a, b, what, owner,
                           name),
               "give each pair once; one entry per pair holds its total bandwidth per direction");
        owner = static_cast<int>(i);
        d.topo.nvlinks.push_back(NvLink{static_cast<int>(a), static_cast<int>(b), bw});
      }
    }
  }
}

// topology.nvme: {read: BW, write: BW, capacity: SIZE, latency: DURATION}; read and write are required, the
// rest default to unlimited capacity and no latency. `nvme: none` drops an inherited tier.
void parse_nvme(NvmeSpec& out, const Entry& e, const std::string& what) {
  const std::string hint =
      "write nvme: {read: 25GB/s, write: 20GB/s, capacity: 7.6TB, latency: 100us} (the drive array's aggregate "
      "bandwidth per direction, its capacity and the latency of one I/O), or nvme: none";
  if (is_none(e.value)) {
    out = NvmeSpec{};
    return;
  }
  if (e.value.kind != Node::Kind::Map) fail(e.value.loc, fmt::format("{} must be a mapping", what), hint);
  check_keys(e.value, what, kNvmeKeys);
  NvmeSpec n;
  const Entry* r = find(e.value, "read");
  const Entry* w = find(e.value, "write");
  if (!r || !w) fail(e.key_loc, fmt::format("{} needs both read and write bandwidths", what), hint);
  n.read_bytes_per_s = get_link_bandwidth(r->value, what + ".read");
  n.write_bytes_per_s = get_link_bandwidth(w->value, what + ".write");
  if (const Entry* c = find(e.value, "capacity")) n.capacity_bytes = get_capacity(c->value, what + ".capacity");
  if (const Entry* l = find(e.value, "latency")) n.latency_s = get_topology_duration(l->value, what + ".latency", "us");
  out = n;
}

void apply_topology(TopologyDraft& d, const Entry& topo_entry, const std::string& what, int gpus) {
  const Node& map = topo_entry.value;
  check_keys(map, what, kTopologyKeys);
  d.topology_at = Origin{topo_entry.key_loc, false};
  if (const Entry* e = find(map, "sockets")) {
    d.topo.sockets = get_int(e->value, what + ".sockets", 1);
    d.sockets_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "inter_socket"))
    d.topo.inter_socket_bytes_per_s = get_link_bandwidth(e->value, what + ".inter_socket");
  if (const Entry* e = find(map, "switches")) parse_switches(d, *e, what + ".switches");
  if (const Entry* e = find(map, "gpus")) parse_gpus(d, *e, what + ".gpus", gpus);
  if (const Entry* e = find(map, "p2p")) {
    const std::string hint =
        "p2p: pcie (GPU-to-GPU copies over the PCIe tree) or p2p: host (no P2P: staged "
        "through pinned host memory)";
    const std::string& mode = expect_scalar(e->value, what + ".p2p", "pcie or host", hint);
    if (mode == "pcie") {
      d.topo.p2p = P2PMode::Pcie;
    } else if (mode == "host") {
      d.topo.p2p = P2PMode::Host;
    } else {
      fail(e->value.loc, fmt::format("unknown {} mode '{}'", what + ".p2p", mode),
           suggestion_hint(mode, kP2PModes, "modes"));
    }
  }
  if (const Entry* e = find(map, "nvlink")) parse_nvlinks(d, *e, what + ".nvlink", gpus);
  if (const Entry* e = find(map, "latency"))
    d.topo.transfer_latency_s = get_topology_duration(e->value, what + ".latency", "us");
  if (const Entry* e = find(map, "host_memory")) {
    d.topo.host_memory_bytes = get_capacity(e->value, what + ".host_memory");
    d.host_memory_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "pinned_limit")) {
    d.topo.pinned_limit_bytes = get_capacity(e->value, what + ".pinned_limit");
    d.pinned_limit_at = Origin{e->value.loc, false};
  }
  if (const Entry* e = find(map, "host_memcpy"))
    d.topo.host_memcpy_bytes_per_s = get_link_bandwidth(e->value, what + ".host_memcpy");
  if (const Entry* e = find(map, "cpu_cores")) d.topo.cpu_cores = get_int(e->value, what + ".cpu_cores", 1);
  if (const Entry* e = find(map, "free_time"))
    d.topo.free_time_s = get_topology_duration(e->value, what + ".free_time", "ms");
  if (const Entry* e = find(map, "host_memory_bandwidth"))
    d.topo.host_memory_bytes_per_s = get_link_bandwidth(e->value, what + ".host_memory_bandwidth");
  if (const Entry* e = find(map, "nvme")) parse_nvme(d.topo.nvme, *e, what + ".nvme");
}

// Checks that need the whole draft, pointing at what the mapping wrote rather than at its base.
Topology finish_topology(TopologyDraft d, const std::string& what) {
  Topology& t = d.topo;
  if (t.switches.empty())
    fail(d.switches_at.loc, fmt::format("{} needs at least one PCIe switch in {}.switches", what, what),
         "every GPU hangs off a switch or CPU root port, e.g. switches: [{name: rc0, socket: 0, uplink: 25GB/s}]; "
         "a GPU on its own root port is a switch with one GPU");
  if (t.sockets > 1 && t.inter_socket_bytes_per_s <= 0)
    fail(d.sockets_at.loc, fmt::format("{}.inter_socket is required with {} sockets", what, t.sockets),
         "give the bandwidth between sockets (QPI/UPI/Infinity Fabric) per direction, e.g. inter_socket: 19.2GB/s");
  for (std::size_t i = 0; i < t.switches.size(); ++i) {
    const PcieSwitch& sw = t.switches[i];
    if (sw.socket < t.sockets) continue;
    const Origin& at = d.switch_socket_at[i].inherited ? d.sockets_at : d.switch_socket_at[i];
    fail(at.loc,
         fmt::format("switch '{}' is on socket {}, but the topology has {} socket{} (0..{})", sw.name, sw.socket,
                     t.sockets, t.sockets == 1 ? "" : "s", t.sockets - 1),
         "sockets are numbered from 0: raise topology.sockets or move the switch");
  }
  std::vector<std::string> switch_names;
  for (const PcieSwitch& sw : t.switches) switch_names.push_back(sw.name);
  for (std::size_t g = 0; g < t.gpus.size(); ++g) {
    GpuSpec& gpu = t.gpus[g];
    if (d.gpu_switch[g].empty()) {
      if (t.switches.size() != 1)
        fail(d.gpus_at.loc, fmt::format("{}: GPU {} names no switch", what, g),
             fmt::format("give switch: NAME for every GPU (in the list form, or under `all:` or an index or range "
                         "of the mapping form); switches: {}",
                         join(switch_names)));
      d.gpu_switch[g] = t.switches.front().name;  // a single switch needs no naming
    }
    const auto it = std::find(switch_names.begin(), switch_names.end(), d.gpu_switch[g]);
    if (it == switch_names.end()) {
      const Origin& at = d.gpu_switch_at[g].inherited ? d.switches_at : d.gpu_switch_at[g];
      fail(at.loc, fmt::format("GPU {} names unknown switch '{}'", g, d.gpu_switch[g]),
           suggestion_hint(d.gpu_switch[g], switch_names, "switches in " + what + ".switches"));
    }
    gpu.pcie_switch = static_cast<int>(it - switch_names.begin());
    if (gpu.link_bytes_per_s <= 0)
      fail(d.gpus_at.loc, fmt::format("{}: GPU {} has no link bandwidth", what, g),
           "give link: BANDWIDTH (the GPU's own PCIe link, per direction) for every GPU, e.g. under `all:`");
  }
  if (t.host_memory_bytes > 0 && t.pinned_limit_bytes > t.host_memory_bytes) {
    const Origin& at = d.pinned_limit_at.inherited ? d.host_memory_at : d.pinned_limit_at;
    fail(at.loc,
         fmt::format("{}.pinned_limit ({}) exceeds {}.host_memory ({})", what, format_bytes(t.pinned_limit_bytes), what,
                     format_bytes(t.host_memory_bytes)),
         "pinned (page-locked) memory is part of host memory: lower pinned_limit or raise host_memory");
  }
  return std::move(d.topo);
}

// The machine's topology after `map` (a machine mapping whose flat keys are already applied to `m`):
// inherited from the base, changed by `topology:` keys, cut to `gpus`, or dropped by `topology: none`.
void resolve_topology(MachineSpec& m, const Node& map, const std::string& section, const SourceLoc& base_loc) {
  const Entry* topo = find(map, "topology");
  const std::string what = qualify(section, "topology");
  if (topo && is_none(topo->value)) {
    m.topology = Topology{};
    return;
  }
  if (topo && topo->value.kind != Node::Kind::Map)
    fail(topo->value.loc, fmt::format("{} must be a mapping or `none`, got {}", what, describe(topo->value)),
         "write `topology:` followed by indented keys (see docs/machines.md), or topology: none for a machine "
         "only the reference cost model can use");
  if (!topo && !m.topology.valid()) return;
  const Entry* gpus_key = find(map, "gpus");
  const SourceLoc gpus_loc = gpus_key ? gpus_key->value.loc : (topo ? topo->key_loc : base_loc);
  if (m.gpus > kMaxTopologyGpus)
    fail(gpus_loc, fmt::format("a machine with a topology has at most {} GPUs, got gpus: {}", kMaxTopologyGpus, m.gpus),
         "a topology describes one server; use fewer GPUs, or topology: none for the reference cost model only");
  const auto base_gpus = static_cast<int>(m.topology.gpus.size());
  if (m.topology.valid() && m.gpus > base_gpus && !(topo && find(topo->value, "gpus")))
    fail(gpus_loc,
         fmt::format("gpus: {} exceeds the {} GPUs of the inherited topology of '{}'", m.gpus, base_gpus, m.name),
         fmt::format("describe the new GPUs in {}.gpus (e.g. gpus: {{all: {{switch: NAME, link: 12GB/s}}}}), or "
                     "write topology: none for a machine only the reference cost model can use",
                     what));
  TopologyDraft d = draft_from(m.topology, base_loc, topo ? topo->key_loc : base_loc, m.gpus);
  if (topo) apply_topology(d, *topo, what, m.gpus);
  m.topology = finish_topology(std::move(d), what);
}

// A machine mapping: an optional base (`preset: NAME` or `file: PATH`) whose values the other keys override.
// Without a base it describes a machine from scratch: gpus and gpu_memory are required, the rest default to
// the paper's scheduler constants (MachineSpec's defaults).
MachineSpec machine_from_map(const Node& map, const std::string& section, const SourceLoc& owner_loc,
                             const std::string& base_dir, const std::string& default_name, int depth) {
  if (depth > kMaxMachineDepth)
    fail(owner_loc, fmt::format("machine files nest more than {} levels deep", kMaxMachineDepth),
         "check for a cycle of `file:` references");
  check_keys(map, section, machine_keys_with_base());
  const Entry* preset = find(map, "preset");
  const Entry* file = find(map, "file");
  MachineSpec m;
  SourceLoc base_loc = owner_loc;  // where inherited topology values are reported
  if (preset && file)
    fail(file->key_loc, fmt::format("{} and {} are both given", qualify(section, "preset"), qualify(section, "file")),
         "give at most one base machine: `preset: NAME` or `file: PATH`, then override single keys");
  if (preset) {
    const std::string name = get_string(preset->value, qualify(section, "preset"));
    if (!find_preset(name)) fail_unknown_preset(name, preset->value.loc);
    m = machine_from_preset(name, preset->value.loc, depth + 1);
    base_loc = preset->value.loc;
  } else if (file) {
    const std::string path = resolve_path(base_dir, get_string(file->value, qualify(section, "file")));
    m = machine_from_file(path, file->value.loc, depth + 1);
    base_loc = file->value.loc;
  } else {
    const std::string hint =
        "a machine without `preset:` or `file:` must give gpus and gpu_memory, e.g. {gpus: 8, gpu_memory: 10GiB}; "
        "or start from a preset: {preset: paper-1080ti}";
    require(map, "gpus", section, owner_loc, hint);
    require(map, "gpu_memory", section, owner_loc, hint);
    m.name = default_name;
  }
  if (const Entry* e = find(map, "name")) m.name = get_string(e->value, qualify(section, "name"));
  if (const Entry* e = find(map, "gpu")) m.gpu_name = get_string(e->value, qualify(section, "gpu"));
  if (const Entry* e = find(map, "gpus")) m.gpus = get_int(e->value, qualify(section, "gpus"), 1);
  if (const Entry* e = find(map, "gpu_memory"))
    m.gpu_memory_bytes = get_bytes(e->value, qualify(section, "gpu_memory"));
  if (const Entry* e = find(map, "memory_cap_scale"))
    m.memory_cap_scale = get_positive_double(e->value, qualify(section, "memory_cap_scale"));
  if (const Entry* e = find(map, "bw_swap"))
    m.bw_swap_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_swap"));
  if (const Entry* e = find(map, "bw_p2p")) m.bw_p2p_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_p2p"));
  if (const Entry* e = find(map, "bw_msg")) m.bw_msg_bytes_per_s = get_bandwidth(e->value, qualify(section, "bw_msg"));
  if (const Entry* e = find(map, "time_del")) m.time_del_s = get_duration(e->value, qualify(section, "time_del"));
  if (const Entry* e = find(map, "price_per_hour"))
    m.price_per_hour = get_price(e->value, qualify(section, "price_per_hour"));
  if (const Entry* e = find(map, "gpu_rates")) apply_gpu_rates(m.gpu_rates, *e, qualify(section, "gpu_rates"));
  if (const Entry* e = find(map, "cpu_adam")) apply_cpu_adam(m.cpu_adam, *e, qualify(section, "cpu_adam"));
  if (const Entry* e = find(map, "host_paths")) apply_host_paths(m.host_paths, *e, qualify(section, "host_paths"));
  if (const Entry* e = find(map, "compute")) apply_compute(m.compute, *e, qualify(section, "compute"));
  if (const Entry* e = find(map, "dispatch")) apply_dispatch(m.dispatch, *e, qualify(section, "dispatch"));
  resolve_topology(m, map, section, base_loc);
  return m;
}

// The top of a machine document: a mapping (null means "empty file").
MachineSpec machine_from_document(const Node& root, const std::string& file, const std::string& default_name,
                                  int depth) {
  if (root.kind == Node::Kind::Null)
    fail(SourceLoc{file, 0, 0}, "the machine file is empty",
         "a machine file maps keys to values, e.g. gpus: 8 and gpu_memory: 10GiB (see docs/config.md)");
  if (root.kind != Node::Kind::Map)
    fail(root.loc, fmt::format("a machine file must be a mapping of keys, got {}", describe(root)),
         "e.g. gpus: 8 and gpu_memory: 10GiB on separate lines (see docs/config.md)");
  return machine_from_map(root, "", SourceLoc{file, 0, 0}, parent_dir(file), default_name, depth);
}

MachineSpec machine_from_preset(const std::string& name, const SourceLoc& loc, int depth) {
  const EmbeddedPreset* preset = find_preset(name);
  if (!preset) fail_unknown_preset(name, loc);
  const std::string file = fmt::format("preset {}", name);
  MachineSpec m = machine_from_document(parse_yaml_tree(std::string(preset->yaml), file), file, name, depth);
  m.name = name;
  return m;
}

MachineSpec machine_from_file(const std::string& path, const SourceLoc& ref_loc, int depth) {
  std::string problem;
  const auto text = read_text_file(path, &problem);
  if (!text)
    fail(ref_loc, fmt::format("cannot read machine file '{}': {}", path, problem),
         fmt::format("paths are relative to the folder of the file that names them; built-in presets: {}",
                     join(machine_preset_names())));
  return machine_from_document(parse_yaml_tree(*text, path), path, std::filesystem::path(path).stem().string(), depth);
}

// machine: absent -> the paper's testbed; a string -> preset or file; a mapping -> base + overrides.
MachineSpec parse_machine_section(const Node& root, const std::string& file, const std::string& base_dir) {
  if (const Entry* e = find(root, "machine")) {
    if (e->value.kind == Node::Kind::Scalar) return machine_from_reference(e->value.scalar, e->value.loc, base_dir, 0);
    if (e->value.kind == Node::Kind::Map)
      return machine_from_map(e->value, "machine", e->key_loc, base_dir, "custom", 0);
    fail(e->value.loc,
         fmt::format("machine must be a preset name, a file path or a mapping, got {}", describe(e->value)),
         "e.g. machine: paper-1080ti, machine: ../machines/box.yaml or machine: {preset: paper-1080ti, gpus: 4}");
  }
  return machine_from_preset(std::string(kDefaultPreset), SourceLoc{file, 0, 0}, 0);
}

}  // namespace config_detail

using namespace config_detail;  // NOLINT(google-build-using-namespace): the loader's own internals

MachineSpec load_machine_file(const std::string& path) {
  const SourceLoc loc{path, 0, 0};
  std::error_code ec;
  if (find_preset(path) && !std::filesystem::is_regular_file(path, ec)) return machine_from_preset(path, loc, 0);
  if (!looks_like_path(path) && !std::filesystem::exists(path, ec)) fail_unknown_preset(path, loc);
  return machine_from_file(path, loc, 0);
}

MachineSpec machine_preset(const std::string& name) {
  return machine_from_preset(name, SourceLoc{"machine preset", 0, 0}, 0);
}

std::vector<std::string> machine_preset_names() {
  std::vector<std::string> names;
  for (const EmbeddedPreset& p : kEmbeddedPresets) names.emplace_back(p.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace harmony::core
