// What this process may still allocate on the host, limit by limit: MemAvailable, the address-space and data
// limits (RLIMIT_AS, RLIMIT_DATA: `ulimit -v`, `ulimit -d`) less what the process maps already, and its cgroup's
// memory limit (v2 memory.max, v1 memory.limit_in_bytes, at its own level and every level above) less the
// cgroup's usage. harmony-run's pre-flight refuses a run that needs more than the tightest of them. Also the
// process's peak resident set (VmHWM), which harmony-run reports beside the executor's metered host memory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/base/units.hpp"

namespace harmony::backend {

struct HostMemoryLimit {
  std::string name;             // "MemAvailable", "RLIMIT_AS (ulimit -v)", "cgroup memory.max (/sys/fs/cgroup/x)", ...
  core::Bytes limit_bytes = 0;  // the limit (for MemAvailable: MemAvailable itself)
  core::Bytes used_bytes =
      0;                  // what already counts against it (VmSize, VmData, the cgroup's usage; 0 for MemAvailable)
  std::string used_what;  // what used_bytes is: "mapped by this process (VmSize)", ...
  core::Bytes headroom_bytes() const { return limit_bytes > used_bytes ? limit_bytes - used_bytes : 0; }
  // "RLIMIT_AS (ulimit -v) is 8.00 GiB, 0.21 GiB of it mapped by this process (VmSize)" / "MemAvailable is 23.10 GiB".
  std::string describe() const;
};

// Where the probe reads: the real files by default; tests point it at a made-up tree.
struct HostMemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_status = "/proc/self/status";  // VmSize, VmData
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";  // v2 mounted here; v1's memory controller at cgroup_root/memory
  bool rlimits = true;                         // getrlimit(RLIMIT_AS, RLIMIT_DATA) of this process
};

struct HostMemoryProbe {
  std::vector<HostMemoryLimit> limits;  // every limit found (none when nothing could be read)
  // The limit with the least headroom, or nullptr when there is none.
  const HostMemoryLimit* tightest() const;
};

// Never throws for an unreadable or malformed source: that limit is left out.
HostMemoryProbe probe_host_memory(const HostMemorySources& sources = {});

// The process's peak resident set so far (VmHWM of `self_status`): everything it touched, on the CPU device its
// devices' arenas included. nullopt when the file or the field cannot be read.
std::optional<core::Bytes> peak_rss_bytes(const std::string& self_status = "/proc/self/status");

}  // namespace harmony::backend
