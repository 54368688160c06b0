// The probe's outputs (probe_output.hpp): which machine keys its measurements become, the machine YAML, the JSON
// document and the table.
#include "backend/probe/probe_output.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/output/report.hpp"

namespace harmony::backend {
namespace {

using core::Bytes;
using nlohmann::json;

std::string mib(Bytes b) { return core::format_bytes(b); }

// One line of a YAML comment: a note with its line breaks (an error message's) made spaces.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

// A double-quoted YAML scalar.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string spread_text(const RateSample& s) {
  return fmt::format("best of {}, spread {:.1f}%", s.samples, 100.0 * s.spread());
}

// "… on HOST at DATE: best of 5, spread 2.1%": the provenance every measured key's comment carries.
std::string provenance(const ProbeResult& r, const RateSample& s, const std::string& what) {
  return fmt::format("{}; harmony-run probe on {} at {}: {}", what, r.host, r.date_utc, spread_text(s));
}

std::string params_text(const RateSample& s) { return fmt::format("{}M parameters", s.work_bytes / 4 / (1 << 20)); }

// The base machine's value of each key, as the machine file would write it; empty when it has none.
std::string base_value(const std::string& key, const core::MachineSpec& m) {
  const core::Topology& t = m.topology;
  const auto bw = [](double v) { return v > 0 ? yaml_bandwidth(v) : std::string(); };
  const std::map<std::string, double core::HostPaths::*> paths = {
      {"host_paths.pinned_h2d", &core::HostPaths::pinned_h2d_bytes_per_s},
      {"host_paths.pinned_d2h", &core::HostPaths::pinned_d2h_bytes_per_s},
      {"host_paths.pageable_h2d", &core::HostPaths::pageable_h2d_bytes_per_s},
      {"host_paths.pageable_d2h", &core::HostPaths::pageable_d2h_bytes_per_s},
      {"host_paths.bf16_stage_up", &core::HostPaths::bf16_stage_up_bytes_per_s},
      {"host_paths.bf16_stage_down", &core::HostPaths::bf16_stage_down_bytes_per_s},
      {"host_paths.bf16_round", &core::HostPaths::bf16_round_bytes_per_s},
      {"host_paths.bf16_widen", &core::HostPaths::bf16_widen_bytes_per_s},
      {"host_paths.memcpy_one_thread", &core::HostPaths::memcpy_one_thread_bytes_per_s},
  };
  if (const auto it = paths.find(key); it != paths.end()) return bw(m.host_paths.*(it->second));
  if (key == "cpu_adam.bandwidth") return bw(m.cpu_adam.bytes_per_s);
  if (key == "cpu_adam.bandwidth_bf16") return bw(m.cpu_adam.bf16_bytes_per_s);
  if (key == "cpu_adam.bandwidth_fp16") return bw(m.cpu_adam.fp16_bytes_per_s);
  if (key == "cpu_adam.per_layer") return m.cpu_adam.per_layer_s > 0 ? yaml_duration(m.cpu_adam.per_layer_s) : "";
  if (key == "cpu_adam.bandwidth_torch") return bw(m.cpu_adam.torch_bytes_per_s);
  if (!t.valid()) return {};
  if (key == "topology.host_memcpy") return bw(t.host_memcpy_bytes_per_s);
  if (key == "topology.pinned_limit") return t.pinned_limit_bytes > 0 ? yaml_size(t.pinned_limit_bytes) : "";
  if (!t.nvme.present()) return {};
  if (key == "topology.nvme.read") return bw(t.nvme.read_bytes_per_s);
  if (key == "topology.nvme.write") return bw(t.nvme.write_bytes_per_s);
  if (key == "topology.nvme.capacity") return t.nvme.capacity_bytes > 0 ? yaml_size(t.nvme.capacity_bytes) : "";
  if (key == "topology.nvme.latency") return t.nvme.latency_s > 0 ? yaml_duration(t.nvme.latency_s) : "";
  return {};
}

json rate_json(const RateSample& s) {
  if (!s.measured()) return nullptr;
  return json{{"best_bytes_per_s", s.best_bytes_per_s},
              {"median_bytes_per_s", s.median_bytes_per_s},
              {"worst_bytes_per_s", s.worst_bytes_per_s},
              {"spread", s.spread()},
              {"samples", s.samples},
              {"work_bytes", s.work_bytes}};
}

json optional_bytes(const std::optional<Bytes>& b) { return b ? json(*b) : json(nullptr); }
json text_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// The rates in table and JSON order: JSON name, table label.
struct RateRow {
  const char* name;
  const RateSample ProbeResult::*rate;
};
constexpr RateRow kRateRows[] = {
    {"adamw_fp32", &ProbeResult::adamw_fp32},
    {"adamw_fp32_one_thread", &ProbeResult::adamw_fp32_one_thread},
    {"adamw_bf16", &ProbeResult::adamw_bf16},
    {"adamw_fp16", &ProbeResult::adamw_fp16},
    {"memcpy", &ProbeResult::memcpy_threaded},
    {"memcpy_one_thread", &ProbeResult::memcpy_one_thread},
    {"bf16_round", &ProbeResult::bf16_round},
    {"bf16_widen", &ProbeResult::bf16_widen},
    {"h2d", &ProbeResult::h2d},
    {"d2h", &ProbeResult::d2h},
    {"pageable_h2d", &ProbeResult::pageable_h2d},
    {"pageable_d2h", &ProbeResult::pageable_d2h},
    {"bf16_stage_up", &ProbeResult::bf16_stage_up},
    {"bf16_stage_down", &ProbeResult::bf16_stage_down},
};

std::string rate_label(const ProbeResult& r, std::string_view name) {
  const std::string host_mem = r.device_pins ? "pinned" : "alloc_host";
  if (name == "adamw_fp32") return fmt::format("host AdamW fp32, {} threads", r.threads);
  if (name == "adamw_fp32_one_thread") return "host AdamW fp32, 1 thread";
  if (name == "adamw_bf16") return fmt::format("host AdamW + bf16 casts, {} threads", r.threads);
  if (name == "adamw_fp16") return fmt::format("host AdamW + fp16 casts, {} threads", r.threads);
  if (name == "memcpy") return fmt::format("memcpy, {} threads", std::min(16, r.threads));
  if (name == "memcpy_one_thread") return "memcpy, 1 thread";
  if (name == "bf16_round") return "round fp32 -> bf16 (threaded)";
  if (name == "bf16_widen") return "widen bf16 -> fp32 (threaded)";
  if (name == "h2d") return fmt::format("{} H2D from {} memory", r.device_name, host_mem);
  if (name == "d2h") return fmt::format("{} D2H to {} memory", r.device_name, host_mem);
  if (name == "pageable_h2d") return fmt::format("{} H2D from pageable memory", r.device_name);
  if (name == "pageable_d2h") return fmt::format("{} D2H to pageable memory", r.device_name);
  if (name == "bf16_stage_up") return fmt::format("{} bf16 stage_up (round + H2D)", r.device_name);
  if (name == "bf16_stage_down") return fmt::format("{} bf16 stage_down (D2H + widen)", r.device_name);
  if (name == "nvme_write") return "NVMe sequential write";
  if (name == "nvme_read") return "NVMe sequential read";
  return std::string(name);
}

std::string gbs(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

}  // namespace

std::string yaml_bandwidth(double bytes_per_s) {
  static constexpr std::pair<double, const char*> kUnits[] = {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}};
  double scale = 1e3;
  const char* unit = "KB/s";
  for (const auto& [s, u] : kUnits) {
    if (bytes_per_s >= s) {
      scale = s;
      unit = u;
      break;
    }
  }
  const double v = bytes_per_s / scale;
  const int decimals = v >= 1000 ? 0 : v >= 100 ? 1 : v >= 10 ? 2 : 3;
  return fmt::format("{:.{}f}{}", v, decimals, unit);
}

std::string yaml_size(Bytes bytes) {
  if (bytes % core::kMiB == 0) return fmt::format("{}MiB", bytes / core::kMiB);
  return fmt::format("{}B", bytes);
}

std::string yaml_duration(double seconds) { return fmt::format("{:.1f}us", seconds * 1e6); }

namespace {

// The machine keys as they are collected, in order: add() one with its value ("" when not written) and its note;
// rate() one measured as a bandwidth, its note the sample's provenance.
class KeyList {
 public:
  KeyList(const ProbeResult& r, const core::MachineSpec& m) : r_(r), m_(m) {}
  void add(const std::string& key, std::string value, std::string note) {
    keys_.push_back(ProbeMachineKey{key, std::move(value), base_value(key, m_), std::move(note)});
  }
  void rate(const std::string& key, const RateSample& s, const std::string& what) {
    add(key, yaml_bandwidth(s.best_bytes_per_s), provenance(r_, s, what));
  }
  std::vector<ProbeMachineKey> take() { return std::move(keys_); }

 private:
  const ProbeResult& r_;
  const core::MachineSpec& m_;
  std::vector<ProbeMachineKey> keys_;
};

// The CPU's rates: AdamW in fp32, bf16 and fp16, and the host paths' memcpy and bf16 casts.
void add_cpu_keys(KeyList& keys, const ProbeResult& r) {
  keys.rate("cpu_adam.bandwidth", r.adamw_fp32,
            fmt::format("ParallelAdamW fp32 (the executor's Update) on {} threads, {}", r.threads,
                        params_text(r.adamw_fp32)));
  keys.rate("cpu_adam.bandwidth_bf16", r.adamw_bf16,
            fmt::format("AdamW with bf16 gradients in and bf16 weights out, the casts fused per 16K-element block, "
                        "on {} threads, {}",
                        r.threads, params_text(r.adamw_bf16)));
  keys.rate("cpu_adam.bandwidth_fp16", r.adamw_fp16,
            fmt::format("AdamW with fp16 gradients in and fp16 weights out ({} casts), fused as bf16's, on {} threads",
                        r.fp16_isa, r.threads));
  keys.add("cpu_adam.per_layer", "", "not measured: a fixed cost per layer, not a rate");
  keys.add("cpu_adam.bandwidth_torch", "",
           "not measured: torch.optim.AdamW runs in Python (scripts/torch-adamw-vs-host.py times it against this "
           "probe's AdamW); the default is cpu_adam.bandwidth / 5");
  keys.rate("host_paths.memcpy_one_thread", r.memcpy_one_thread,
            fmt::format("one memcpy of {} on one thread", mib(r.memcpy_one_thread.work_bytes)));
  keys.rate("host_paths.bf16_round", r.bf16_round,
            "round_to_bf16 (stage_up's host part) on up to 16 threads, per bf16 byte written");
  keys.rate("host_paths.bf16_widen", r.bf16_widen,
            "widen_from_bf16 (stage_down's host part) on up to 16 threads, per bf16 byte read");
}

// The host link's rates (pinned and pageable copies, the bf16 staging), written only when the device pins memory.
void add_link_keys(KeyList& keys, const ProbeResult& r) {
  const std::string no_link = fmt::format(
      "not written: {} pins nothing, its copies are memcpy between host buffers, not a host link{} (run the probe "
      "with --device cuda on the GPU machine)",
      r.device_name, r.device_note.empty() ? "" : fmt::format("; {}", r.device_note));
  const auto link = [&](const std::string& key, const RateSample& s, const std::string& what) {
    if (r.device_pins) {
      keys.rate(key, s, what);
    } else {
      keys.add(key, "", no_link);
    }
  };
  const std::string pieces = fmt::format("in {} copies", mib(std::min<Bytes>(r.h2d.work_bytes, 64 * core::kMiB)));
  link("host_paths.pinned_h2d", r.h2d,
       fmt::format("{} copy_h2d from alloc_host (pinned) memory {}", r.device_name, pieces));
  link("host_paths.pinned_d2h", r.d2h,
       fmt::format("{} copy_d2h to alloc_host (pinned) memory {}", r.device_name, pieces));
  link("host_paths.pageable_h2d", r.pageable_h2d,
       fmt::format("{} copy_h2d from malloc'd memory {}", r.device_name, pieces));
  link("host_paths.pageable_d2h", r.pageable_d2h,
       fmt::format("{} copy_d2h to malloc'd memory {}", r.device_name, pieces));
  link("host_paths.bf16_stage_up", r.bf16_stage_up,
       fmt::format("the executor's stage_up on {}: fp32 rounded into pinned chunks while the last one is copied up, "
                   "per bf16 byte delivered",
                   r.device_name));
  link("host_paths.bf16_stage_down", r.bf16_stage_down,
       fmt::format("the executor's stage_down on {}: chunks copied down while the last one is widened, per bf16 byte",
                   r.device_name));
}

constexpr const char* kNoTopology =
    "not written: the base machine has no topology, and this is a topology key (give --base a machine with one)";

// topology.pinned_limit: what the device could pin, written only when pinning failed under the host's memory.
void add_pinned_limit_key(KeyList& keys, const ProbeResult& r, const core::MachineSpec& m) {
  const bool topo = m.topology.valid();
  const PinnedProbe& p = r.pinned;
  const Bytes host_memory = topo ? m.topology.host_memory_bytes : 0;
  if (!r.device_pins) {
    keys.add("topology.pinned_limit", "",
             fmt::format("not written: measured with mlock ({} granted{}), which does not bind {}: it pins nothing",
                         mib(p.granted_bytes), p.limit_reached ? "" : ", the cap", r.device_name));
  } else if (!p.limit_reached) {
    keys.add("topology.pinned_limit", "",
             fmt::format("not written: {} pinned with {} without a failure, up to the probe's cap: the limit is higher",
                         mib(p.granted_bytes), p.method));
  } else if (!topo) {
    keys.add("topology.pinned_limit", "", kNoTopology);
  } else if (host_memory > 0 && p.granted_bytes > host_memory) {
    keys.add("topology.pinned_limit", "",
             fmt::format("not written: {} pinned exceeds the base's host_memory {}", mib(p.granted_bytes),
                         mib(host_memory)));
  } else {
    keys.add("topology.pinned_limit", yaml_size(p.granted_bytes),
             fmt::format("{} granted {} in {} chunks, then failed: {}; harmony-run probe on {} at {}", p.method,
                         mib(p.granted_bytes), mib(p.chunk_bytes), p.failure, r.host, r.date_utc));
  }
}

// The NVMe tier's keys (read, write, capacity, latency), measured in the --path folder.
void add_nvme_keys(KeyList& keys, const ProbeResult& r, const core::MachineSpec& m) {
  const char* nvme_keys[] = {"topology.nvme.read", "topology.nvme.write", "topology.nvme.capacity",
                             "topology.nvme.latency"};
  if (!r.nvme) {
    for (const char* k : nvme_keys) keys.add(k, "", "not measured: no --path folder given");
    return;
  }
  if (!m.topology.valid()) {
    for (const char* k : nvme_keys) keys.add(k, "", kNoTopology);
    return;
  }
  const NvmeProbe& n = *r.nvme;
  const std::string how = fmt::format("{} {} test file in {} ({}, {}), 4 MiB blocks on 4 threads", mib(n.file_bytes),
                                      "sequential", n.path, n.filesystem, n.direct_io ? "O_DIRECT" : "buffered");
  keys.rate("topology.nvme.read", n.read, how);
  keys.rate("topology.nvme.write", n.write, how + ", fdatasync");
  keys.add("topology.nvme.capacity", yaml_size(n.free_bytes / core::kMiB * core::kMiB),
           fmt::format("the free space in {} when probed; harmony-run probe on {} at {}", n.path, r.host, r.date_utc));
  if (n.latency_s) {
    keys.add("topology.nvme.latency", yaml_duration(*n.latency_s),
             fmt::format("median of random 4 KiB O_DIRECT reads; harmony-run probe on {} at {}", r.host, r.date_utc));
  } else {
    // nvme: replaces the whole tier, so the base's latency is kept by writing it again
    const std::string kept = base_value("topology.nvme.latency", m);
    keys.add("topology.nvme.latency", kept,
             kept.empty() ? "not measured: without O_DIRECT a read may come from the page cache"
                          : "the base's value (not measured: without O_DIRECT a read may come from the page cache)");
  }
}

}  // namespace

std::vector<ProbeMachineKey> probe_machine_keys(const ProbeResult& r, const ProbeBase& base) {
  const core::MachineSpec& m = base.machine;
  KeyList keys(r, m);
  add_cpu_keys(keys, r);
  add_link_keys(keys, r);
  if (m.topology.valid()) {
    keys.rate("topology.host_memcpy", r.memcpy_threaded,
              fmt::format("memcpy of {} split over {} threads (all CPU copies together)",
                          mib(r.memcpy_threaded.work_bytes), std::min(16, r.threads)));
  } else {
    keys.add("topology.host_memcpy", "", kNoTopology);
  }
  add_pinned_limit_key(keys, r, m);
  add_nvme_keys(keys, r, m);
  return keys.take();
}

std::string probe_machine_yaml(const ProbeResult& r, const ProbeBase& base, const std::string& command) {
  const std::vector<ProbeMachineKey> keys = probe_machine_keys(r, base);
  std::string out;
  out += fmt::format("# This machine's host rates, measured by `{}`\n", command);
  out += fmt::format("# on {} at {} (device {}, {} threads; AdamW {}, fp16 casts {}{}). docs/machines.md,\n", r.host,
                     r.date_utc, r.device_name, r.threads, r.adamw_isa, r.fp16_isa, r.quick ? "; quick sizes" : "");
  out +=
      "# \"Measuring a machine\". A measured key's comment says what was timed: the best of N runs and the spread,\n";
  out += fmt::format("# (best - worst) / best. Every key not written here is the base machine's ({} {}), with the\n",
                     base.preset ? "preset" : "file", base.given);
  out += "# sources its file gives; the keys the probe left to the base say why at the end.\n";
  out += fmt::format("{}: {}\n", base.preset ? "preset" : "file", quoted(base.yaml_ref));
  out += fmt::format("name: {}\n", quoted(base.machine.name + "-probed"));
  // Group the written keys by their section, in order; nvme as one mapping.
  const auto section = [&](const std::string& prefix, const std::string& indent) {
    std::string text;
    for (const ProbeMachineKey& k : keys) {
      if (!k.written() || k.key.rfind(prefix, 0) != 0) continue;
      const std::string leaf = k.key.substr(prefix.size());
      if (leaf.find('.') != std::string::npos) continue;
      text += fmt::format("{}{}: {}  # {}\n", indent, leaf, k.value, one_line(k.note));
    }
    return text;
  };
  for (const char* s : {"cpu_adam", "host_paths"}) {
    const std::string body = section(std::string(s) + ".", "  ");
    if (!body.empty()) out += fmt::format("{}:\n{}", s, body);
  }
  std::string topo = section("topology.", "  ");
  if (const std::string nvme = section("topology.nvme.", "    "); !nvme.empty()) topo += "  nvme:\n" + nvme;
  if (!topo.empty()) out += "topology:\n" + topo;
  out += "# Not written (the base's value applies, or none):\n";
  for (const ProbeMachineKey& k : keys) {
    if (k.written()) continue;
    out +=
        fmt::format("#   {} (base: {}): {}\n", k.key, k.base_value.empty() ? "none" : k.base_value, one_line(k.note));
  }
  return out;
}

std::string probe_json(const ProbeResult& r, const ProbeBase& base, const std::string& out_path) {
  json rates = json::object();
  for (const RateRow& row : kRateRows) rates[row.name] = rate_json(r.*row.rate);
  rates["nvme_read"] = r.nvme ? rate_json(r.nvme->read) : json(nullptr);
  rates["nvme_write"] = r.nvme ? rate_json(r.nvme->write) : json(nullptr);
  const PinnedProbe& p = r.pinned;
  json pinned{{"method", p.method},
              {"rlimit_memlock_bytes", optional_bytes(p.rlimit_memlock_bytes)},
              {"rlimit_memlock_hard_bytes", optional_bytes(p.rlimit_memlock_hard_bytes)},
              {"cap_ipc_lock", p.cap_ipc_lock},
              {"cap_bytes", p.cap_bytes},
              {"granted_bytes", p.granted_bytes},
              {"limit_reached", p.limit_reached},
              {"failure", text_or_null(p.failure)}};
  json nvme = nullptr;
  if (r.nvme) {
    const NvmeProbe& n = *r.nvme;
    nvme = json{{"path", n.path},
                {"filesystem", n.filesystem},
                {"direct_io", n.direct_io},
                {"file_bytes", n.file_bytes},
                {"free_bytes", n.free_bytes},
                {"latency_s", n.latency_s ? json(*n.latency_s) : json(nullptr)}};
  }
  json keys = json::array();
  for (const ProbeMachineKey& k : probe_machine_keys(r, base)) {
    keys.push_back(json{{"key", k.key},
                        {"written", k.written()},
                        {"value", text_or_null(k.value)},
                        {"base_value", text_or_null(k.base_value)},
                        {"note", k.note}});
  }
  const json doc{
      {"schema_version", core::kOutputSchemaVersion},
      {"command", "probe"},
      {"host", r.host},
      {"date_utc", r.date_utc},
      {"device", r.device_name},
      {"device_pins_host_memory", r.device_pins},
      {"device_note", text_or_null(r.device_note)},
      {"threads", r.threads},
      {"quick", r.quick},
      {"adamw_isa", r.adamw_isa},
      {"fp16_isa", r.fp16_isa},
      {"base_machine",
       json{{"given", base.given}, {"kind", base.preset ? "preset" : "file"}, {"machine_name", base.machine.name}}},
      {"rates", rates},
      {"pinned", pinned},
      {"nvme", nvme},
      {"machine_keys", keys},
      {"out_path", text_or_null(out_path)},
      {"wall_time_s", r.wall_time_s}};
  return doc.dump(2) + "\n";
}

std::string probe_table(const ProbeResult& r, const ProbeBase& base, const std::string& out_path) {
  const std::vector<ProbeMachineKey> keys = probe_machine_keys(r, base);
  std::map<std::string, std::string> written_by;  // rate name -> the key it became
  const std::map<std::string, std::string> key_of = {{"cpu_adam.bandwidth", "adamw_fp32"},
                                                     {"cpu_adam.bandwidth_bf16", "adamw_bf16"},
                                                     {"cpu_adam.bandwidth_fp16", "adamw_fp16"},
                                                     {"host_paths.memcpy_one_thread", "memcpy_one_thread"},
                                                     {"host_paths.bf16_round", "bf16_round"},
                                                     {"host_paths.bf16_widen", "bf16_widen"},
                                                     {"host_paths.pinned_h2d", "h2d"},
                                                     {"host_paths.pinned_d2h", "d2h"},
                                                     {"host_paths.pageable_h2d", "pageable_h2d"},
                                                     {"host_paths.pageable_d2h", "pageable_d2h"},
                                                     {"host_paths.bf16_stage_up", "bf16_stage_up"},
                                                     {"host_paths.bf16_stage_down", "bf16_stage_down"},
                                                     {"topology.host_memcpy", "memcpy"},
                                                     {"topology.nvme.read", "nvme_read"},
                                                     {"topology.nvme.write", "nvme_write"}};
  for (const ProbeMachineKey& k : keys) {
    if (const auto it = key_of.find(k.key); it != key_of.end() && k.written()) written_by[it->second] = k.key;
  }
  std::string out = fmt::format("harmony-run probe on {} at {}: device {}, {} threads, AdamW {}, fp16 casts {}{}\n",
                                r.host, r.date_utc, r.device_name, r.threads, r.adamw_isa, r.fp16_isa,
                                r.quick ? " (quick sizes; --long for more)" : "");
  if (!r.device_note.empty()) out += fmt::format("{}: the host link's copies are not measured\n", r.device_note);
  out += fmt::format("\n{:<42} {:>11} {:>11} {:>7}  {}\n", "what", "best", "median", "spread", "machine key");
  const auto row = [&](const std::string& name, const RateSample& s) {
    if (!s.measured()) return;
    const auto it = written_by.find(name);
    out += fmt::format("{:<42} {:>11} {:>11} {:>6.1f}%  {}\n", rate_label(r, name), gbs(s.best_bytes_per_s),
                       gbs(s.median_bytes_per_s), 100.0 * s.spread(), it == written_by.end() ? "-" : it->second);
  };
  for (const RateRow& rr : kRateRows) row(rr.name, r.*rr.rate);
  if (r.nvme) {
    row("nvme_write", r.nvme->write);
    row("nvme_read", r.nvme->read);
  }
  const PinnedProbe& p = r.pinned;
  const auto limit = [](const std::optional<Bytes>& b) {
    return b ? core::format_bytes(*b) : std::string("unlimited");
  };
  out += fmt::format("\npinned host memory: {} granted {} of the probe's {} cap{}; RLIMIT_MEMLOCK {} (hard {}){}\n",
                     p.method, mib(p.granted_bytes), mib(p.cap_bytes),
                     p.limit_reached ? fmt::format(", then failed: {}", p.failure) : "", limit(p.rlimit_memlock_bytes),
                     limit(p.rlimit_memlock_hard_bytes),
                     p.cap_ipc_lock ? ", which CAP_IPC_LOCK (root) lifts for mlock" : "");
  if (r.nvme) {
    const NvmeProbe& n = *r.nvme;
    out += fmt::format("NVMe: {} ({}, {}), {} test file (removed), {} free{}\n", n.path, n.filesystem,
                       n.direct_io ? "O_DIRECT" : "buffered: O_DIRECT refused", mib(n.file_bytes), mib(n.free_bytes),
                       n.latency_s ? fmt::format(", 4 KiB read latency {:.1f} us", *n.latency_s * 1e6) : "");
  }
  out += fmt::format("\nmachine keys (base: {} {}):\n", base.preset ? "preset" : "file", base.given);
  for (const ProbeMachineKey& k : keys) {
    out += fmt::format(
        "  {:<30} {:<12} {}\n", k.key, k.written() ? k.value : "-",
        k.written() ? "measured" : fmt::format("base: {}; {}", k.base_value.empty() ? "none" : k.base_value, k.note));
  }
  out += out_path.empty() ? "no machine file written (--out FILE writes one)\n"
                          : fmt::format("machine file written to {}\n", out_path);
  out += fmt::format("probe took {:.1f} s\n", r.wall_time_s);
  return out;
}

}  // namespace harmony::backend
