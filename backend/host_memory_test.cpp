// Tests of the host memory probe (backend/host_memory): MemAvailable from a meminfo file; the cgroup's limit less
// its usage, at the process's own level and every level above, in the v2 (memory.max / memory.current), hybrid
// (unified/) and v1 (memory/memory.limit_in_bytes / memory.usage_in_bytes) layouts; "max" and v1's huge value
// mean no limit; a container's cgroup missing from the mount falls back to the mount's root; the tightest limit
// is the one with the least headroom; unreadable sources are left out. (RLIMIT_AS / RLIMIT_DATA are tested end
// to end, under setrlimit, by tests/cli/test_run_faults.py.) Also the peak resident set (VmHWM).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "backend/host_memory.hpp"

using namespace harmony;
using backend::HostMemorySources;
namespace fs = std::filesystem;

namespace {

constexpr core::Bytes kGiB = core::kGiB;

struct Tree {
  fs::path root;
  Tree() {
    root = fs::temp_directory_path() / ("harmony_host_memory_" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~Tree() { fs::remove_all(root); }
  void write(const std::string& rel, const std::string& text) const {
    const fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  HostMemorySources sources() const {
    HostMemorySources s;
    s.meminfo = (root / "meminfo").string();
    s.self_status = (root / "status").string();
    s.self_cgroup = (root / "cgroup").string();
    s.cgroup_root = (root / "sys").string();
    s.rlimits = false;
    return s;
  }
};

const backend::HostMemoryLimit* find(const backend::HostMemoryProbe& p, const std::string& prefix) {
  for (const auto& l : p.limits)
    if (l.name.starts_with(prefix)) return &l;
  return nullptr;
}

}  // namespace

TEST_CASE("MemAvailable alone") {
  Tree t;
  t.write("meminfo", "MemTotal:       24683748 kB\nMemFree:  100 kB\nMemAvailable:   2097152 kB\n");
  const auto p = backend::probe_host_memory(t.sources());
  REQUIRE(p.limits.size() == 1);
  CHECK(p.limits[0].name == "MemAvailable");
  CHECK(p.limits[0].headroom_bytes() == 2 * kGiB);
  CHECK(p.tightest() == &p.limits[0]);
  CHECK(p.limits[0].describe() == "MemAvailable is 2.00 GiB");
}

TEST_CASE("nothing readable: no limit") {
  Tree t;
  const auto p = backend::probe_host_memory(t.sources());
  CHECK(p.limits.empty());
  CHECK(p.tightest() == nullptr);
}

TEST_CASE("cgroup v2: the tightest level from the process's cgroup up") {
  Tree t;
  t.write("meminfo", "MemAvailable:   16777216 kB\n");  // 16 GiB
  t.write("cgroup", "0::/job/step\n");
  t.write("sys/memory.max", "max\n");  // the root: no limit
  t.write("sys/job/memory.max", std::to_string(8 * kGiB) + "\n");
  t.write("sys/job/memory.current", std::to_string(5 * kGiB) + "\n");  // headroom 3 GiB
  t.write("sys/job/step/memory.max", "max\n");
  t.write("sys/job/step/memory.current", std::to_string(1 * kGiB) + "\n");
  const auto p = backend::probe_host_memory(t.sources());
  const auto* cg = find(p, "the cgroup's memory.max");
  REQUIRE(cg != nullptr);
  CHECK(cg->limit_bytes == 8 * kGiB);
  CHECK(cg->used_bytes == 5 * kGiB);
  CHECK(cg->name.find((t.root / "sys" / "job").string()) != std::string::npos);
  CHECK(p.tightest() == cg);
  CHECK(cg->describe().find("8.00 GiB, 5.00 GiB of it used by the cgroup (memory.current)") != std::string::npos);
}

TEST_CASE("cgroup v2 in a container: the process's path is not in the mount, the root is read") {
  Tree t;
  t.write("meminfo", "MemAvailable:   16777216 kB\n");
  t.write("cgroup", "0::/kubepods/pod1/ctr\n");
  t.write("sys/memory.max", std::to_string(2 * kGiB) + "\n");
  t.write("sys/memory.current", std::to_string(kGiB / 2) + "\n");
  const auto p = backend::probe_host_memory(t.sources());
  const auto* cg = find(p, "the cgroup's memory.max");
  REQUIRE(cg != nullptr);
  CHECK(cg->headroom_bytes() == 2 * kGiB - kGiB / 2);
  CHECK(p.tightest() == cg);
}

TEST_CASE("cgroup v1 (and hybrid): the memory controller's limit_in_bytes; the huge value is no limit") {
  Tree t;
  t.write("meminfo", "MemAvailable:   1048576 kB\n");  // 1 GiB: tighter than the cgroup here
  t.write("cgroup", "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n");
  t.write("sys/unified/cgroup.procs", "");
  t.write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("sys/memory/process_api/memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  t.write("sys/memory/process_api/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  t.write("sys/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("sys/memory/process_api/abc/memory.usage_in_bytes", "123\n");
  const auto p = backend::probe_host_memory(t.sources());
  const auto* cg = find(p, "the cgroup's memory.limit_in_bytes");
  REQUIRE(cg != nullptr);
  CHECK(cg->limit_bytes == 4 * kGiB);
  CHECK(cg->used_bytes == kGiB);
  REQUIRE(p.tightest() != nullptr);
  CHECK(p.tightest()->name == "MemAvailable");
  // without any limit at any level, the cgroup adds none
  t.write("sys/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(find(backend::probe_host_memory(t.sources()), "the cgroup") == nullptr);
}

TEST_CASE("malformed files are left out") {
  Tree t;
  t.write("meminfo", "MemAvailable: lots\n");
  t.write("cgroup", "garbage\n0::/a\n");
  t.write("sys/a/memory.max", "12x\n");
  const auto p = backend::probe_host_memory(t.sources());
  CHECK(p.limits.empty());
}

TEST_CASE("the process's own limits are read") {
  const auto p = backend::probe_host_memory();  // the real files: at least MemAvailable on Linux
  CHECK(find(p, "MemAvailable") != nullptr);
}

TEST_CASE("peak RSS: VmHWM of the status file, nullopt when absent or malformed") {
  Tree t;
  t.write("status", "Name:\tharmony-run\nVmPeak:\t  900000 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n");
  CHECK(backend::peak_rss_bytes(t.sources().self_status) == 20480 * core::Bytes{1024});
  t.write("status", "VmHWM:\t lots kB\n");
  CHECK_FALSE(backend::peak_rss_bytes(t.sources().self_status).has_value());
  CHECK_FALSE(backend::peak_rss_bytes((t.root / "missing").string()).has_value());
  const auto own = backend::peak_rss_bytes();  // this process: something resident
  REQUIRE(own.has_value());
  CHECK(*own > 0);
}
