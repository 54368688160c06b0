// Tests of the machine model in YAML (core/config/config_machine.cpp, docs/machines.md): the four built-in presets and
// their topologies, the list and mapping forms of topology.gpus, inheritance from a base machine, and one
// case per kind of bad topology, checking the exact file:line:column and that the error carries a hint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/config/config.hpp"
#include "tests/common/test_support.hpp"

using namespace harmony::core;
using harmony::test::source_dir;
using harmony::test::TempDir;

namespace {

constexpr double kGiBf = 1024.0 * 1024.0 * 1024.0;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `text` with the first `from` replaced by `to` (the test fails if `from` is missing).
std::string with(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "'" << from << "' is not in the text");
  return text.replace(at, from.size(), to);
}

// The 1-based line and column of the `occurrence`-th `needle` in `text`.
std::pair<int, int> pos_of(const std::string& text, const std::string& needle, int occurrence = 1) {
  std::size_t at = std::string::npos;
  for (int i = 0; i < occurrence; ++i) {
    at = text.find(needle, at == std::string::npos ? 0 : at + 1);
    REQUIRE_MESSAGE(at != std::string::npos, "'" << needle << "' is not in the text");
  }
  const auto line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  const int column = static_cast<int>(line_start == std::string::npos ? at + 1 : at - line_start);
  return {line, column};
}

void check_at(const ConfigError& e, const std::string& file, std::pair<int, int> pos) {
  INFO(std::string(e.what()));
  CHECK(e.loc().file == file);
  CHECK(e.loc().line == pos.first);
  CHECK(e.loc().column == pos.second);
  CHECK_FALSE(e.hint().empty());
}

// Loads `text` as a machine file; the error it throws (the test fails if it loads).
struct MachineFile {
  TempDir dir;
  std::string file;
  MachineSpec load(const std::string& text) {
    file = dir.write("m.yaml", text);
    return load_machine_file(file);
  }
  ConfigError error(const std::string& text) {
    try {
      load(text);
    } catch (const ConfigError& e) {
      return e;
    }
    FAIL("expected a ConfigError for:\n" << text);
    return ConfigError(SourceLoc{}, "unreachable");
  }
};

const std::string kModel = "model:\n  profile: model.json\n";
const std::string kPlan = "plan: {mode: vPP, gpus: 2, minibatch: 8}\n";

ConfigError config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    load_config_text(yaml, "bad.yaml", overrides);
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  return ConfigError(SourceLoc{}, "unreachable");
}

// A small valid machine: 4 GPUs on two switches in two sockets, one NVLink pair; GPUs in the list form.
const std::string kBox =
    "gpu: Test GPU\n"
    "gpus: 4\n"
    "gpu_memory: 10GiB\n"
    "topology:\n"
    "  sockets: 2\n"
    "  inter_socket: 19.2GB/s\n"
    "  switches:\n"
    "    - {name: plx0, socket: 0, uplink: 12GB/s}\n"
    "    - {name: plx1, socket: 1, uplink: 12GB/s}\n"
    "  gpus:\n"
    "    - {switch: plx0, link: 12GB/s}\n"
    "    - {switch: plx0, link: 12GB/s}\n"
    "    - {switch: plx1, link: 12GB/s, copy_engines: {h2d: 2, d2h: 1}}\n"
    "    - {switch: plx1, link: 12GB/s}\n"
    "  p2p: pcie\n"
    "  nvlink:\n"
    "    - {gpus: [0, 1], bandwidth: 25GB/s}\n"
    "  latency: 10us\n"
    "  host_memory: 64GiB\n"
    "  pinned_limit: 48GiB\n"
    "  host_memcpy: 10GB/s\n"
    "  cpu_cores: 16\n"
    "  free_time: 0\n"
    "price_per_hour: 4.5\n";

// The same machine with topology.gpus in the mapping form.
const std::string kBoxMap =
    "gpu: Test GPU\n"
    "gpus: 4\n"
    "gpu_memory: 10GiB\n"
    "topology:\n"
    "  sockets: 2\n"
    "  inter_socket: 19.2GB/s\n"
    "  switches:\n"
    "    - {name: plx0, socket: 0, uplink: 12GB/s}\n"
    "    - {name: plx1, socket: 1, uplink: 12GB/s}\n"
    "  gpus:\n"
    "    all: {link: 12GB/s}\n"
    "    0-1: {switch: plx0}\n"
    "    2: {switch: plx1, copy_engines: {h2d: 2}}\n"
    "    3: {switch: plx1}\n"
    "  p2p: pcie\n"
    "  nvlink:\n"
    "    - {gpus: [0, 1], bandwidth: 25GB/s}\n"
    "  latency: 10us\n"
    "  host_memory: 64GiB\n"
    "  pinned_limit: 48GiB\n"
    "  host_memcpy: 10GB/s\n"
    "  cpu_cores: 16\n"
    "  free_time: 0\n"
    "price_per_hour: 4.5\n";

void check_box(const MachineSpec& m) {
  CHECK(m.gpus == 4);
  CHECK(m.price_per_hour == 4.5);
  const Topology& t = m.topology;
  REQUIRE(t.valid());
  CHECK(t.sockets == 2);
  CHECK(t.inter_socket_bytes_per_s == doctest::Approx(19.2e9));
  REQUIRE(t.switches.size() == 2);
  CHECK(t.switches[0].name == "plx0");
  CHECK(t.switches[1].socket == 1);
  CHECK(t.switches[1].uplink_bytes_per_s == doctest::Approx(12e9));
  REQUIRE(t.gpus.size() == 4);
  const std::vector<int> on = {0, 0, 1, 1};
  for (std::size_t g = 0; g < 4; ++g) {
    CHECK(t.gpus[g].pcie_switch == on[g]);
    CHECK(t.gpus[g].link_bytes_per_s == doctest::Approx(12e9));
    CHECK(t.gpus[g].copy_engines_h2d == (g == 2 ? 2 : 1));
    CHECK(t.gpus[g].copy_engines_d2h == 1);
  }
  CHECK(t.p2p == P2PMode::Pcie);
  REQUIRE(t.nvlinks.size() == 1);
  CHECK(t.nvlinks[0].gpu_a == 0);
  CHECK(t.nvlinks[0].gpu_b == 1);
  CHECK(t.nvlinks[0].bytes_per_s == doctest::Approx(25e9));
  CHECK(t.transfer_latency_s == doctest::Approx(10e-6));
  CHECK(t.host_memory_bytes == 64 * kGiB);
  CHECK(t.pinned_limit_bytes == 48 * kGiB);
  CHECK(t.host_memcpy_bytes_per_s == doctest::Approx(10e9));
  CHECK(t.cpu_cores == 16);
  CHECK(t.free_time_s == 0.0);
}

void check_same(const MachineSpec& a, const MachineSpec& b) {
  CHECK(a.name == b.name);
  CHECK(a.gpu_name == b.gpu_name);
  CHECK(a.gpus == b.gpus);
  CHECK(a.gpu_memory_bytes == b.gpu_memory_bytes);
  CHECK(a.memory_cap_scale == b.memory_cap_scale);
  CHECK(a.bw_swap_bytes_per_s == b.bw_swap_bytes_per_s);
  CHECK(a.bw_p2p_bytes_per_s == b.bw_p2p_bytes_per_s);
  CHECK(a.bw_msg_bytes_per_s == b.bw_msg_bytes_per_s);
  CHECK(a.time_del_s == b.time_del_s);
  CHECK(a.price_per_hour == b.price_per_hour);
  const Topology& s = a.topology;
  const Topology& t = b.topology;
  CHECK(s.sockets == t.sockets);
  CHECK(s.inter_socket_bytes_per_s == t.inter_socket_bytes_per_s);
  REQUIRE(s.switches.size() == t.switches.size());
  for (std::size_t i = 0; i < s.switches.size(); ++i) {
    CHECK(s.switches[i].name == t.switches[i].name);
    CHECK(s.switches[i].socket == t.switches[i].socket);
    CHECK(s.switches[i].uplink_bytes_per_s == t.switches[i].uplink_bytes_per_s);
  }
  REQUIRE(s.gpus.size() == t.gpus.size());
  for (std::size_t i = 0; i < s.gpus.size(); ++i) {
    CHECK(s.gpus[i].pcie_switch == t.gpus[i].pcie_switch);
    CHECK(s.gpus[i].link_bytes_per_s == t.gpus[i].link_bytes_per_s);
    CHECK(s.gpus[i].copy_engines_h2d == t.gpus[i].copy_engines_h2d);
    CHECK(s.gpus[i].copy_engines_d2h == t.gpus[i].copy_engines_d2h);
  }
  CHECK(s.p2p == t.p2p);
  REQUIRE(s.nvlinks.size() == t.nvlinks.size());
  for (std::size_t i = 0; i < s.nvlinks.size(); ++i) {
    CHECK(s.nvlinks[i].gpu_a == t.nvlinks[i].gpu_a);
    CHECK(s.nvlinks[i].gpu_b == t.nvlinks[i].gpu_b);
    CHECK(s.nvlinks[i].bytes_per_s == t.nvlinks[i].bytes_per_s);
  }
  CHECK(s.transfer_latency_s == t.transfer_latency_s);
  CHECK(s.host_memory_bytes == t.host_memory_bytes);
  CHECK(s.pinned_limit_bytes == t.pinned_limit_bytes);
  CHECK(s.host_memcpy_bytes_per_s == t.host_memcpy_bytes_per_s);
  CHECK(s.cpu_cores == t.cpu_cores);
  CHECK(s.free_time_s == t.free_time_s);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Presets

TEST_CASE("paper-1080ti keeps the paper's scheduler constants and gains a topology") {
  const MachineSpec m = machine_preset("paper-1080ti");
  CHECK(m.gpu_name == "GTX 1080 Ti");
  CHECK(m.gpus == 8);
  CHECK(m.gpu_memory_bytes == 10 * kGiB);
  CHECK(m.bw_swap_bytes_per_s == 11.5 * kGiBf);
  CHECK(m.bw_p2p_bytes_per_s == 8.2 * kGiBf);
  CHECK(m.bw_msg_bytes_per_s == 16 * kGiBf);
  CHECK(m.time_del_s == 0.040);
  CHECK(m.price_per_hour == 1.20);  // ASSUMPTION in the file: 8 x $0.15 per GPU-hour

  const Topology& t = m.topology;
  REQUIRE(t.valid());
  CHECK(t.sockets == 2);
  CHECK(t.inter_socket_bytes_per_s == doctest::Approx(19.2e9));
  REQUIRE(t.switches.size() == 4);
  for (std::size_t s = 0; s < 4; ++s) {
    CHECK(t.switches[s].socket == (s < 2 ? 0 : 1));
    CHECK(t.switches[s].uplink_bytes_per_s == 11.5 * kGiBf);
  }
  REQUIRE(t.gpus.size() == 8);
  for (std::size_t g = 0; g < 8; ++g) {
    CHECK(t.gpus[g].pcie_switch == static_cast<int>(g / 2));  // two GPUs per PLX switch
    CHECK(t.gpus[g].link_bytes_per_s == m.bw_swap_bytes_per_s);
    CHECK(t.gpus[g].copy_engines_h2d == 1);
    CHECK(t.gpus[g].copy_engines_d2h == 1);
  }
  CHECK(t.p2p == P2PMode::Pcie);
  CHECK(t.nvlinks.empty());
  CHECK(t.transfer_latency_s == doctest::Approx(10e-6));
  CHECK(t.host_memory_bytes == 750 * kGiB);
  CHECK(t.pinned_limit_bytes == 700 * kGiB);
  CHECK(t.host_memcpy_bytes_per_s == doctest::Approx(10e9));
  CHECK(t.cpu_cores == 36);
  // the paper's 40 ms stays time_del (the reference model); the native model frees through the caching allocator
  CHECK(t.free_time_s == 0.0);
}

TEST_CASE("the new presets: rtx4090-4x, a100-pcie-8x, h100-sxm-8x") {
  const MachineSpec rtx = machine_preset("rtx4090-4x");
  CHECK(rtx.gpu_name == "RTX 4090");
  CHECK(rtx.gpus == 4);
  CHECK(rtx.gpu_memory_bytes == 22 * kGiB);
  CHECK(rtx.bw_swap_bytes_per_s == doctest::Approx(24.7e9));
  CHECK(rtx.bw_p2p_bytes_per_s == doctest::Approx(rtx.bw_swap_bytes_per_s / 2));  // staged through the host
  CHECK(rtx.topology.p2p == P2PMode::Host);
  CHECK(rtx.topology.sockets == 1);
  REQUIRE(rtx.topology.switches.size() == 4);
  for (std::size_t g = 0; g < 4; ++g) CHECK(rtx.topology.gpus[g].pcie_switch == static_cast<int>(g));
  CHECK(rtx.topology.nvlinks.empty());

  const MachineSpec a100 = machine_preset("a100-pcie-8x");
  CHECK(a100.gpus == 8);
  CHECK(a100.gpu_memory_bytes == 74 * kGiB);
  CHECK(a100.topology.sockets == 2);
  CHECK(a100.topology.p2p == P2PMode::Pcie);
  CHECK(a100.topology.switches.size() == 4);
  CHECK(a100.topology.nvlinks.empty());
  CHECK(a100.bw_p2p_bytes_per_s < a100.bw_swap_bytes_per_s);

  const MachineSpec h100 = machine_preset("h100-sxm-8x");
  CHECK(h100.gpus == 8);
  CHECK(h100.gpu_memory_bytes == 74 * kGiB);
  CHECK(h100.bw_swap_bytes_per_s == doctest::Approx(49.4e9));
  CHECK(h100.topology.cpu_cores == 112);
  CHECK(h100.topology.host_memory_bytes == 2048 * kGiB);
  // NVSwitch modelled as a direct 450 GB/s link between every pair of the 8 GPUs.
  REQUIRE(h100.topology.nvlinks.size() == 28);
  std::set<std::pair<int, int>> pairs;
  for (const NvLink& l : h100.topology.nvlinks) {
    CHECK(l.gpu_a < l.gpu_b);
    CHECK(l.bytes_per_s == doctest::Approx(450e9));
    pairs.emplace(l.gpu_a, l.gpu_b);
  }
  CHECK(pairs.size() == 28);
  CHECK(h100.bw_p2p_bytes_per_s < 450e9);
}

// The built-in machines of harmony-run's CPU device (no topology, rates or price: threads on the host's cores).
const std::vector<std::string> kCpuPresets = {"cpu-4x", "cpu-4x-calibrated"};
bool is_cpu_preset(const std::string& name) {
  return std::find(kCpuPresets.begin(), kCpuPresets.end(), name) != kCpuPresets.end();
}

TEST_CASE("the CPU device's presets: four devices on the CI VM's two host cores, the calibrated one fitted") {
  for (const std::string& name : kCpuPresets) {
    INFO(name);
    const MachineSpec m = machine_preset(name);
    CHECK(m.name == name);
    CHECK(m.gpu_name == "harmony CPU device");
    CHECK(m.gpus == 4);
    CHECK(m.compute.units == 2);
    CHECK(m.compute.host_cores);
    CHECK_FALSE(m.topology.valid());
    CHECK_FALSE(m.gpu_rates.valid());
    CHECK(m.price_per_hour == 0);
    CHECK(contains(machine_summary(m), "4 x harmony CPU device, 2.00 MiB per GPU"));
  }
  // Fitted by harmony-sim calibrate: dispatch costs and a bandwidth of its own, not cpu-4x's assumed 8 GB/s.
  const MachineSpec plain = machine_preset("cpu-4x"), fitted = machine_preset("cpu-4x-calibrated");
  CHECK(plain.bw_swap_bytes_per_s == 8e9);
  CHECK(fitted.bw_swap_bytes_per_s != plain.bw_swap_bytes_per_s);
  CHECK(fitted.dispatch.copy_s > 0);
  CHECK(plain.dispatch.copy_s == 0);
  CHECK(fitted.compute.time_scale != 1.0);
}

TEST_CASE("every preset is consistent: reference keys against its own topology") {
  for (const std::string& name : machine_preset_names()) {
    INFO(name);
    if (is_cpu_preset(name)) continue;  // checked above: no topology
    const MachineSpec m = machine_preset(name);
    CHECK(m.name == name);
    CHECK_FALSE(m.gpu_name.empty());
    CHECK(m.bw_msg_bytes_per_s == 16 * kGiBf);
    const Topology& t = m.topology;
    REQUIRE(t.valid());
    CHECK(static_cast<int>(t.gpus.size()) == m.gpus);
    for (const GpuSpec& g : t.gpus) {
      // bw_swap is the effective host link: no faster than the GPU's link or its switch's uplink.
      const PcieSwitch& sw = t.switches.at(static_cast<std::size_t>(g.pcie_switch));
      CHECK(m.bw_swap_bytes_per_s <= g.link_bytes_per_s * (1 + 1e-9));
      CHECK(m.bw_swap_bytes_per_s <= sw.uplink_bytes_per_s * (1 + 1e-9));
    }
    for (const PcieSwitch& sw : t.switches) CHECK(sw.socket < t.sockets);
    if (t.sockets > 1) CHECK(t.inter_socket_bytes_per_s > 0);
    CHECK(t.host_memory_bytes > 0);
    CHECK(t.pinned_limit_bytes <= t.host_memory_bytes);
    CHECK(t.cpu_cores >= 1);
  }
}

TEST_CASE("every preset has a price per hour, the figures of the GPT sweep; summaries show it") {
  // The illustrative prices configs/sweeps/gpt_1b_100b.yaml cites (ASSUMPTION in each machine file).
  const std::pair<const char*, double> prices[] = {
      {"paper-1080ti", 1.20},
      {"rtx4090-4x", 1.60},
      {"a100-pcie-8x", 16.00},
      {"h100-sxm-8x", 98.32},
      {"v100-dgx2-16x", 12.80}};  // the last is not in the sweep: the validation preset (docs/validation.md)
  for (const auto& [name, price] : prices) {
    CAPTURE(name);
    CHECK(machine_preset(name).price_per_hour == price);
  }
  CHECK(machine_preset_names().size() == std::size(prices) + kCpuPresets.size());  // the CPU device's: no price
  CHECK(machine_summary(machine_preset("h100-sxm-8x")) ==
        "8 x H100 80GB SXM5, 74.00 GiB per GPU, swap 46.01 GiB/s, p2p 335.28 GiB/s, 98.32 per hour");
  // an override wins over the preset's price; a machine without one says so
  const RunConfig c =
      load_config_text(kModel + "machine: {preset: h100-sxm-8x, price_per_hour: 50}\n" + kPlan, "run.yaml");
  CHECK(c.machine.price_per_hour == 50.0);
  MachineSpec plain;
  plain.gpus = 2;
  plain.gpu_name = "X";
  CHECK(machine_summary(plain) == "2 x X, 10.00 GiB per GPU, swap 11.50 GiB/s, p2p 8.20 GiB/s, no price");
}

TEST_CASE("every configs/machines/*.yaml is embedded, and equals its file") {
  const std::vector<std::string> names = machine_preset_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const char* expected :
       {"paper-1080ti", "rtx4090-4x", "a100-pcie-8x", "h100-sxm-8x", "v100-dgx2-16x", "cpu-4x", "cpu-4x-calibrated"})
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/configs/machines")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    const std::string stem = entry.path().stem().string();
    INFO(stem);
    // A file missing here is missing from the custom_target's input list in core/meson.build.
    REQUIRE(std::find(names.begin(), names.end(), stem) != names.end());
    check_same(load_machine_file(entry.path().string()), machine_preset(stem));
  }
  CHECK(files == names.size());
}

TEST_CASE("an unknown preset lists the default first, then the rest") {
  try {
    machine_preset("h100-sxm");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(contains(e.hint(), "did you mean 'h100-sxm-8x'?"));
    CHECK(
        contains(e.hint(),
                 "built-in presets: paper-1080ti (the default), a100-pcie-8x, cpu-4x, cpu-4x-calibrated, h100-sxm-8x, "
                 "rtx4090-4x, v100-dgx2-16x"));
  }
}

// ------------------------------------------------------------------------------------------------
// Schema

TEST_CASE("topology.gpus: the list form and the mapping form give the same machine") {
  MachineFile f;
  const MachineSpec list = f.load(kBox);
  check_box(list);
  const MachineSpec map = f.load(kBoxMap);
  check_box(map);
  // The same machine written inside a run config.
  std::string indented;
  for (std::size_t start = 0; start < kBox.size();) {
    const auto end = kBox.find('\n', start);
    indented += "  " + kBox.substr(start, end - start + 1);
    start = end + 1;
  }
  check_box(load_config_text(kModel + "machine:\n" + indented + kPlan, "run.yaml").machine);
}

TEST_CASE("optional topology keys default; a lone switch needs no naming") {
  MachineFile f;
  const MachineSpec m = f.load(
      "gpus: 2\ngpu_memory: 16GiB\n"
      "topology:\n  switches: [{name: rc0, uplink: 25GB/s}]\n  gpus: {all: {link: 25GB/s}}\n");
  const Topology& t = m.topology;
  CHECK(t.sockets == 1);
  CHECK(t.switches[0].socket == 0);
  CHECK(t.gpus.size() == 2);
  CHECK(t.gpus[1].pcie_switch == 0);
  CHECK(t.gpus[1].copy_engines_h2d == 1);
  CHECK(t.p2p == P2PMode::Pcie);
  CHECK(t.nvlinks.empty());
  CHECK(t.transfer_latency_s == 0.0);
  CHECK(t.host_memory_bytes == 0);  // unlimited
  CHECK(t.pinned_limit_bytes == 0);
  CHECK(t.host_memcpy_bytes_per_s == 0.0);
  CHECK(t.cpu_cores == 1);
  CHECK(t.free_time_s == 0.0);
  CHECK(m.price_per_hour == 0.0);

  // A machine without a topology is reference-only; gpu_memory still takes a plain byte count.
  const MachineSpec plain = f.load("gpus: 2\ngpu_memory: 10737418240\n");
  CHECK_FALSE(plain.topology.valid());
  CHECK(plain.gpu_memory_bytes == 10 * kGiB);

  // nvlink `gpus: [a, b, c]` links every pair of the listed GPUs.
  const MachineSpec clique = f.load(
      "gpus: 4\ngpu_memory: 16GiB\ntopology:\n  switches: [{name: rc0, uplink: 25GB/s}]\n"
      "  gpus: {all: {link: 25GB/s}}\n  nvlink: [{gpus: [3, 1, 2], bandwidth: 50GB/s}]\n");
  REQUIRE(clique.topology.nvlinks.size() == 3);
  CHECK(clique.topology.nvlinks[0].gpu_a == 1);
  CHECK(clique.topology.nvlinks[0].gpu_b == 3);
}

TEST_CASE("a base machine's topology is inherited, changed key by key, cut to fewer GPUs, or dropped") {
  const std::string paper = "machine: {preset: paper-1080ti, ";
  RunConfig c = load_config_text(kModel + paper + "topology: {p2p: host}}\n" + kPlan, "run.yaml");
  CHECK(c.machine.topology.p2p == P2PMode::Host);
  MachineSpec back = c.machine;  // everything else is the preset's
  back.topology.p2p = P2PMode::Pcie;
  check_same(back, machine_preset("paper-1080ti"));

  // --set reaches into the topology of `machine: NAME` and of the default machine.
  c = load_config_text(kModel + "machine: paper-1080ti\n" + kPlan, "run.yaml", {"machine.topology.p2p=host"});
  CHECK(c.machine.topology.p2p == P2PMode::Host);
  c = load_config_text(kModel + kPlan, "run.yaml", {"machine.topology.gpus.all.link=8GB/s"});
  for (const GpuSpec& g : c.machine.topology.gpus) CHECK(g.link_bytes_per_s == doctest::Approx(8e9));
  CHECK(c.machine.topology.gpus[7].pcie_switch == 3);
  c = load_config_text(kModel + kPlan, "run.yaml", {"machine.topology.gpus.6-7.switch=plx0"});
  CHECK(c.machine.topology.gpus[7].pcie_switch == 0);

  // Fewer GPUs: the first N of the box, with the NVLinks among them.
  c = load_config_text(kModel + paper + "gpus: 2}\n" + kPlan, "run.yaml");
  CHECK(c.machine.topology.gpus.size() == 2);
  CHECK(c.machine.topology.switches.size() == 4);
  c = load_config_text(kModel + "machine: {preset: h100-sxm-8x, gpus: 4}\n" + kPlan, "run.yaml");
  CHECK(c.machine.topology.nvlinks.size() == 6);
  for (const NvLink& l : c.machine.topology.nvlinks) CHECK(l.gpu_b < 4);

  // More GPUs: the new ones must be described; or the topology dropped.
  c = load_config_text(kModel + paper + "gpus: 10, topology: {gpus: {8-9: {switch: plx3, link: 8GB/s}}}}\n" + kPlan,
                       "run.yaml");
  REQUIRE(c.machine.topology.gpus.size() == 10);
  CHECK(c.machine.topology.gpus[9].pcie_switch == 3);
  CHECK(c.machine.topology.gpus[9].link_bytes_per_s == doctest::Approx(8e9));
  CHECK(c.machine.topology.gpus[0].link_bytes_per_s == 11.5 * kGiBf);
  c = load_config_text(kModel + paper + "gpus: 16, topology: none}\n" + kPlan, "run.yaml");
  CHECK(c.machine.gpus == 16);
  CHECK_FALSE(c.machine.topology.valid());

  // New switches keep the base GPUs when their switch names survive.
  c = load_config_text(kModel + paper +
                           "topology: {sockets: 1, switches: [{name: plx0, uplink: 6GB/s}, {name: plx1, uplink: 6GB/s},"
                           " {name: plx2, uplink: 6GB/s}, {name: plx3, uplink: 6GB/s}]}}\n" +
                           kPlan,
                       "run.yaml");
  CHECK(c.machine.topology.sockets == 1);
  CHECK(c.machine.topology.gpus[5].pcie_switch == 2);
  CHECK(c.machine.topology.switches[2].uplink_bytes_per_s == doctest::Approx(6e9));

  c = load_config_text(kModel + "machine: {preset: a100-pcie-8x, price_per_hour: 32.77}\n" + kPlan, "run.yaml");
  CHECK(c.machine.price_per_hour == doctest::Approx(32.77));
}

// ------------------------------------------------------------------------------------------------
// Errors, each at the offending key or value

TEST_CASE("error: unknown keys in the topology suggest the closest") {
  MachineFile f;
  std::string text = with(kBox, "  inter_socket:", "  inter_sockets:");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "inter_sockets"));
  CHECK(contains(e.message(), "unknown key 'inter_sockets' in topology"));
  CHECK(contains(e.hint(), "did you mean 'inter_socket'?"));

  text = with(kBox, "{switch: plx1, link: 12GB/s}", "{swich: plx1, link: 12GB/s}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "swich"));
  CHECK(contains(e.message(), "topology.gpus[3]"));
  CHECK(contains(e.hint(), "did you mean 'switch'?"));

  text = with(kBox, "uplink: 12GB/s}", "uplnk: 12GB/s}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "uplnk"));
  CHECK(contains(e.hint(), "did you mean 'uplink'?"));

  text = with(kBox, "{h2d: 2, d2h: 1}", "{h2d: 2, d2hx: 1}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "d2hx"));
  CHECK(contains(e.hint(), "did you mean 'd2h'?"));

  text = with(kBox, "  p2p: pcie", "  p2p: hots");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "hots"));
  CHECK(contains(e.hint(), "did you mean 'host'?"));

  // In a run config, the section is named machine.topology.
  e = config_error(kModel + "machine: {preset: paper-1080ti, topology: {nvlinks: []}}\n" + kPlan);
  check_at(e, "bad.yaml", {3, 44});
  CHECK(contains(e.message(), "unknown key 'nvlinks' in machine.topology"));
  CHECK(contains(e.hint(), "did you mean 'nvlink'?"));
}

TEST_CASE("error: a GPU naming an unknown switch") {
  MachineFile f;
  const std::string text = with(kBox, "{switch: plx1, link: 12GB/s, copy", "{switch: plx7, link: 12GB/s, copy");
  const ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "plx7"));
  CHECK(e.message() == "GPU 2 names unknown switch 'plx7'");
  CHECK(contains(e.hint(), "switches in topology.switches: plx0, plx1"));

  const std::string map = with(kBoxMap, "    3: {switch: plx1}", "    3: {switch: plx-1}");
  check_at(f.error(map), f.file, pos_of(map, "plx-1"));

  // New switches that drop a name the inherited GPUs use: reported at the new list.
  const std::string cfg =
      kModel + "machine: {preset: paper-1080ti, topology: {switches: [{name: plx0, uplink: 6GB/s}]}}\n" + kPlan;
  const ConfigError inherited = config_error(cfg);
  check_at(inherited, "bad.yaml", pos_of(cfg, "[{name"));
  CHECK(inherited.message() == "GPU 2 names unknown switch 'plx1'");
}

TEST_CASE("error: a GPU on two switches cannot be written; the nearest mistakes are rejected") {
  // Each GPU names one switch (a scalar), so "on two switches" has no spelling: a list is a type error ...
  MachineFile f;
  std::string text = with(kBox, "{switch: plx0, link: 12GB/s}", "{switch: [plx0, plx1], link: 12GB/s}");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "[plx0"));
  CHECK(contains(e.message(), "topology.gpus[0].switch must be a switch name, got a list"));
  CHECK(contains(e.hint(), "exactly one"));

  // ... a repeated `switch:` key is a duplicate key ...
  text = with(kBox, "{switch: plx0, link: 12GB/s}", "{switch: plx0, switch: plx1, link: 12GB/s}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "switch: plx1"));
  CHECK(contains(e.message(), "duplicate key 'switch'"));

  // ... and in the mapping form, a GPU named by two indices or ranges is a duplicate GPU index.
  text = with(kBoxMap, "    2: {switch: plx1, copy_engines: {h2d: 2}}\n    3: {switch: plx1}\n",
              "    2-3: {switch: plx1, copy_engines: {h2d: 2}}\n    1-2: {switch: plx1}\n");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "1-2:"));
  CHECK(contains(e.message(), "GPU 1 is given twice in topology.gpus: by '1-2' and by '0-1' at"));

  text = with(kBoxMap, "    3: {switch: plx1}\n", "    3: {switch: plx1}\n    03: {switch: plx0}\n");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "03:"));
  CHECK(contains(e.message(), "GPU 3 is given twice"));
}

TEST_CASE("error: links with zero or negative bandwidth") {
  MachineFile f;
  struct Case {
    std::string from, to, value;  // `value` locates the error
  };
  const std::vector<Case> cases = {
      {"{switch: plx0, link: 12GB/s}", "{switch: plx0, link: 0GB/s}", "0GB/s"},
      {"{switch: plx0, link: 12GB/s}", "{switch: plx0, link: 0}", "0}"},
      {"{switch: plx0, link: 12GB/s}", "{switch: plx0, link: -12GB/s}", "-12GB/s"},
      {"uplink: 12GB/s}", "uplink: 0GiB/s}", "0GiB/s"},
      {"inter_socket: 19.2GB/s", "inter_socket: -19.2GB/s", "-19.2GB/s"},
      {"bandwidth: 25GB/s", "bandwidth: 0.0GB/s", "0.0GB/s"},
      {"host_memcpy: 10GB/s", "host_memcpy: 0B/s", "0B/s"},
  };
  for (const Case& c : cases) {
    const std::string text = with(kBox, c.from, c.to);
    INFO(c.to);
    const ConfigError e = f.error(text);
    check_at(e, f.file, pos_of(text, c.value));
    CHECK(contains(e.message(), "must be a positive bandwidth"));
  }
}

TEST_CASE("error: topology quantities need units (plain numbers are bytes only in the reference keys)") {
  MachineFile f;
  std::string text = with(kBox, "host_memory: 64GiB", "host_memory: 750");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "750"));
  CHECK(e.message() == "topology.host_memory: '750' has no unit");
  CHECK(contains(e.hint(), "did you mean '750GiB'?"));

  text = with(kBox, "pinned_limit: 48GiB", "pinned_limit: 51539607552");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "51539607552"));
  CHECK(contains(e.hint(), "did you mean '51539607552B'?"));

  text = with(kBox, "{switch: plx0, link: 12GB/s}", "{switch: plx0, link: 12}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "12}"));
  CHECK(contains(e.hint(), "did you mean '12GB/s'?"));

  text = with(kBox, "{switch: plx0, link: 12GB/s}", "{switch: plx0, link: 12GB}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "12GB}"));
  CHECK(contains(e.message(), "is a size, not a bandwidth"));
  CHECK(contains(e.hint(), "did you mean '12GB/s'?"));

  text = with(kBox, "latency: 10us", "latency: 10");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "10\n"));
  CHECK(contains(e.hint(), "did you mean '10us'?"));

  text = with(kBox, "host_memory: 64GiB", "host_memory: 0GiB");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "0GiB", 2));  // the first is in 10GiB
  CHECK(contains(e.hint(), "leave the key out for no limit"));

  text = with(kBox, "host_memory: 64GiB", "host_memory: 64gib");
  check_at(f.error(text), f.file, pos_of(text, "64gib"));
}

TEST_CASE("error: topology quantities out of their documented range (issue 11)") {
  MachineFile f;
  struct Case {
    std::string from, to, needle, hint;
  };
  const std::vector<Case> cases = {
      {"host_memory: 64GiB", "host_memory: 2048TiB", "2048TiB", "1 PiB"},
      {"{switch: plx0, link: 12GB/s}", "{switch: plx0, link: 10B/s}", "10B/s", "1 KB/s"},
      {"inter_socket: 19.2GB/s", "inter_socket: 2000000TB/s", "2000000TB/s", "1 EB/s"},
      {"latency: 10us", "latency: 2000000s", "2000000s", "0 to 1e6 s"},
  };
  for (const Case& c : cases) {
    INFO(c.to);
    const std::string text = with(kBox, c.from, c.to);
    const ConfigError e = f.error(text);
    check_at(e, f.file, pos_of(text, c.needle));
    CHECK(contains(e.message(), "too"));
    CHECK(contains(e.hint(), c.hint));
  }
}

TEST_CASE("error: NVLinks naming a GPU out of range or the GPU itself, or a pair twice") {
  MachineFile f;
  std::string text = with(kBox, "{gpus: [0, 1], bandwidth", "{gpus: [0, 4], bandwidth");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "4]"));
  CHECK(e.message() == "topology.nvlink[0] names GPU 4, but the machine has 4 GPUs (0..3)");

  text = with(kBox, "{gpus: [0, 1], bandwidth", "{gpus: [1, 1], bandwidth");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "1]"));
  CHECK(e.message() == "topology.nvlink[0] names GPU 1 twice: a GPU has no NVLink to itself");

  text = with(kBox, "{gpus: [0, 1], bandwidth", "{gpus: [0], bandwidth");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "[0]"));
  CHECK(contains(e.message(), "must name at least two GPUs"));

  text = with(kBox, "    - {gpus: [0, 1], bandwidth: 25GB/s}\n",
              "    - {gpus: [0, 1], bandwidth: 25GB/s}\n    - {gpus: all, bandwidth: 10GB/s}\n");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "all"));
  CHECK(e.message() == "the NVLink between GPUs 0 and 1 is given twice: by topology.nvlink[0] and topology.nvlink[1]");

  text = with(kBox, "{gpus: [0, 1], bandwidth", "{gpus: [0, -1], bandwidth");
  check_at(f.error(text), f.file, pos_of(text, "-1"));

  text = with(kBox, "{gpus: [0, 1], bandwidth: 25GB/s}", "{gpus: [0, 1]}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "{gpus: [0, 1]}"));
  CHECK(contains(e.message(), "missing required field topology.nvlink[0].bandwidth"));
}

TEST_CASE("error: topology.gpus describes a different number of GPUs than the machine") {
  MachineFile f;
  std::string text = with(kBox, "    - {switch: plx1, link: 12GB/s}\n  p2p", "  p2p");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "- {switch: plx0"));
  CHECK(e.message() == "topology.gpus lists 3 GPUs but the machine has gpus: 4");

  text = with(kBox, "gpus: 4\n", "gpus: 2\n");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "- {switch: plx0"));
  CHECK(e.message() == "topology.gpus lists 4 GPUs but the machine has gpus: 2");

  text = with(kBoxMap, "    3: {switch: plx1}", "    4: {switch: plx1}");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "4: {"));
  CHECK(contains(e.message(), "GPU 4 ('4') is out of range: the machine has 4 GPUs (0..3)"));

  text = with(kBoxMap, "    3: {switch: plx1}", "    3-1: {switch: plx1}");
  check_at(f.error(text), f.file, pos_of(text, "3-1"));
  text = with(kBoxMap, "    3: {switch: plx1}", "    last: {switch: plx1}");
  check_at(f.error(text), f.file, pos_of(text, "last"));

  // Growing a preset without describing the new GPUs.
  const std::string cfg = kModel + "machine: {preset: paper-1080ti, gpus: 16}\n" + kPlan;
  e = config_error(cfg);
  check_at(e, "bad.yaml", pos_of(cfg, "16"));
  CHECK(contains(e.message(), "exceeds the 8 GPUs of the inherited topology"));
  CHECK(contains(e.hint(), "topology: none"));

  text = with(kBox, "gpus: 4\n", "gpus: 5000\n");
  check_at(f.error(text), f.file, pos_of(text, "5000"));
}

TEST_CASE("error: a switch on a socket the machine does not have") {
  MachineFile f;
  std::string text = with(kBox, "{name: plx1, socket: 1,", "{name: plx1, socket: 2,");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "2, uplink"));
  CHECK(e.message() == "switch 'plx1' is on socket 2, but the topology has 2 sockets (0..1)");

  // Fewer sockets than an inherited switch uses: reported at the new socket count.
  const std::string cfg = kModel + "machine: {preset: paper-1080ti, topology: {sockets: 1}}\n" + kPlan;
  e = config_error(cfg);
  check_at(e, "bad.yaml", pos_of(cfg, "1}}"));
  CHECK(e.message() == "switch 'plx2' is on socket 1, but the topology has 1 socket (0..0)");

  text = with(kBox, "  inter_socket: 19.2GB/s\n", "");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "2\n  switches"));
  CHECK(e.message() == "topology.inter_socket is required with 2 sockets");
}

TEST_CASE("error: other topology mistakes") {
  MachineFile f;
  // Duplicate switch names.
  std::string text = with(kBox, "{name: plx1, socket: 1", "{name: plx0, socket: 1");
  ConfigError e = f.error(text);
  check_at(e, f.file, pos_of(text, "plx0", 2));
  CHECK(contains(e.message(), "switch name 'plx0' is used twice"));

  // With two switches every GPU must name one, and every GPU needs a link.
  text = with(kBoxMap, "    0-1: {switch: plx0}\n", "");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "all:"));
  CHECK(e.message() == "topology: GPU 0 names no switch");
  text = with(kBoxMap, "    all: {link: 12GB/s}\n", "");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "0-1:"));
  CHECK(e.message() == "topology: GPU 0 has no link bandwidth");

  // No switches at all.
  text = "gpus: 1\ngpu_memory: 1GiB\ntopology:\n  gpus: [{link: 1GB/s}]\n";
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "topology"));
  CHECK(contains(e.message(), "needs at least one PCIe switch"));

  text = with(kBox, "pinned_limit: 48GiB", "pinned_limit: 96GiB");
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "96GiB"));
  CHECK(contains(e.message(), "exceeds topology.host_memory"));

  text = with(kBox, "{h2d: 2, d2h: 1}", "{h2d: 0, d2h: 1}");
  check_at(f.error(text), f.file, pos_of(text, "0, d2h"));
  text = with(kBox, "cpu_cores: 16", "cpu_cores: 0");
  check_at(f.error(text), f.file, pos_of(text, "0\n"));
  text = with(kBox, "  sockets: 2", "  sockets: two");
  check_at(f.error(text), f.file, pos_of(text, "two"));

  text = "gpus: 4\ngpu_memory: 10GiB\ntopology: [1]\n";
  e = f.error(text);
  check_at(e, f.file, pos_of(text, "[1]"));
  CHECK(contains(e.hint(), "topology: none"));

  text = with(kBox, "price_per_hour: 4.5", "price_per_hour: -4.5");
  check_at(f.error(text), f.file, pos_of(text, "-4.5"));
  text = with(kBox, "price_per_hour: 4.5", "price_per_hour: $4.5");
  check_at(f.error(text), f.file, pos_of(text, "$4.5"));

  // Overrides are located at the override.
  e = config_error(kModel + kPlan, {"machine.topology.gpus.0.link=0"});
  CHECK(e.loc().file == "--set machine.topology.gpus.0.link=0");
  CHECK(contains(e.message(), "machine.topology.gpus.0.link must be a positive bandwidth"));
}

TEST_CASE("topology.nvme and topology.host_memory_bandwidth: parsed, optional, located errors") {
  MachineFile f;
  const MachineSpec plain = f.load(kBox);
  CHECK_FALSE(plain.topology.nvme.present());
  CHECK(plain.topology.host_memory_bytes_per_s == 0);
  const std::string nvme = with(kBox, "  host_memcpy: 10GB/s\n",
                                "  host_memcpy: 10GB/s\n  host_memory_bandwidth: 200GB/s\n"
                                "  nvme: {read: 25GB/s, write: 20GB/s, capacity: 7.6TB, latency: 100us}\n");
  const MachineSpec m = f.load(nvme);
  CHECK(m.topology.nvme.present());
  CHECK(m.topology.nvme.read_bytes_per_s == doctest::Approx(25e9));
  CHECK(m.topology.nvme.write_bytes_per_s == doctest::Approx(20e9));
  CHECK(m.topology.nvme.capacity_bytes == 7'600'000'000'000LL);
  CHECK(m.topology.nvme.latency_s == doctest::Approx(100e-6));
  CHECK(m.topology.host_memory_bytes_per_s == doctest::Approx(200e9));
  // capacity and latency are optional
  const MachineSpec bare = f.load(with(nvme, ", capacity: 7.6TB, latency: 100us", ""));
  CHECK(bare.topology.nvme.capacity_bytes == 0);
  CHECK(bare.topology.nvme.latency_s == 0);
  // an unknown key, a missing direction, a bandwidth without a unit: located, with a hint
  for (const auto& [from, to, at] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"latency: 100us}", "latency: 100us, iops: 1e6}", "iops"},
           {"read: 25GB/s, ", "", "nvme"},
           {"write: 20GB/s", "write: 20", "20, capacity"},
           {"host_memory_bandwidth: 200GB/s", "host_memory_bandwidth: -1GB/s", "-1GB/s"}}) {
    const std::string text = with(nvme, from, to);
    const ConfigError e = f.error(text);
    check_at(e, f.file, pos_of(text, at));
  }
}
