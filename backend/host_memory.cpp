// The host memory probe (host_memory.hpp): /proc/meminfo, getrlimit and /proc/self/status, and the cgroup's
// memory files from the process's cgroup up to the mount's root (v2 and v1 layouts).
#include "backend/host_memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

namespace harmony::backend {

namespace fs = std::filesystem;

namespace {

// v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages); anything this large is none.
constexpr core::Bytes kNoLimit = core::Bytes{1} << 60;

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return s.str();
}

std::optional<core::Bytes> parse_count(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  core::Bytes v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

// "Key:   1234 kB" in a /proc file, in bytes.
std::optional<core::Bytes> proc_kib(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ':') continue;
    std::istringstream fields(line.substr(key.size() + 1));
    long long kib = -1;
    std::string unit;
    if (fields >> kib >> unit && kib >= 0 && unit == "kB") return static_cast<core::Bytes>(kib) * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

// The process's cgroup path for the v2 hierarchy ("0::/a/b") and for v1's memory controller ("4:memory:/a/b").
struct CgroupPaths {
  std::optional<std::string> v2, v1_memory;
};

CgroupPaths cgroup_paths(const std::string& self_cgroup) {
  CgroupPaths out;
  std::ifstream in(self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      out.v2 = path;
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") out.v1_memory = path;
  }
  return out;
}

// From the process's cgroup folder under `mount` up to `mount` itself, the tightest of `limit_file` less
// `usage_file` (a level without the files, or without a limit, adds nothing). The process's folder may be absent
// from this mount namespace (a container sees its own cgroup as the root): then only the root is read.
std::optional<HostMemoryLimit> cgroup_limit(const fs::path& mount, const std::string& path, const char* limit_file,
                                            const char* usage_file) {
  std::error_code ec;
  if (!fs::is_directory(mount, ec)) return std::nullopt;
  fs::path dir = (mount / fs::path(path).relative_path()).lexically_normal();
  if (!fs::is_directory(dir, ec)) dir = mount;
  std::optional<HostMemoryLimit> best;
  const fs::path root = mount.lexically_normal();
  for (;;) {
    const auto limit_text = slurp((dir / limit_file).string());
    const auto usage_text = slurp((dir / usage_file).string());
    const auto limit = limit_text ? parse_count(*limit_text) : std::nullopt;  // "max" (v2's none) does not parse
    const auto usage = usage_text ? parse_count(*usage_text) : std::nullopt;
    if (limit && *limit < kNoLimit) {
      HostMemoryLimit l{fmt::format("the cgroup's {} ({})", limit_file, dir.string()), *limit, usage.value_or(0),
                        fmt::format("used by the cgroup ({})", usage_file)};
      if (!best || l.headroom_bytes() < best->headroom_bytes()) best = std::move(l);
    }
    if (dir == root || dir.parent_path() == dir || !dir.string().starts_with(root.string())) break;
    dir = dir.parent_path();
  }
  return best;
}

}  // namespace

std::string HostMemoryLimit::describe() const {
  const double gib = static_cast<double>(core::kGiB);
  if (used_what.empty()) return fmt::format("{} is {:.2f} GiB", name, static_cast<double>(limit_bytes) / gib);
  return fmt::format("{} is {:.2f} GiB, {:.2f} GiB of it {}", name, static_cast<double>(limit_bytes) / gib,
                     static_cast<double>(used_bytes) / gib, used_what);
}

const HostMemoryLimit* HostMemoryProbe::tightest() const {
  const HostMemoryLimit* best = nullptr;
  for (const HostMemoryLimit& l : limits)
    if (best == nullptr || l.headroom_bytes() < best->headroom_bytes()) best = &l;
  return best;
}

HostMemoryProbe probe_host_memory(const HostMemorySources& src) {
  HostMemoryProbe probe;
  if (const auto avail = proc_kib(src.meminfo, "MemAvailable")) {
    probe.limits.push_back({"MemAvailable", *avail, 0, ""});
  } else if (src.meminfo == HostMemorySources{}.meminfo) {  // no /proc/meminfo: the free pages
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      probe.limits.push_back({"free memory (_SC_AVPHYS_PAGES)", core::Bytes{pages} * core::Bytes{page}, 0, ""});
  }
  if (src.rlimits) {
    struct Rlimit {
      int resource;
      const char* name;
      const char* status_key;  // what the kernel counts against it
      const char* used_what;
    };
    for (const Rlimit r :
         {Rlimit{RLIMIT_AS, "RLIMIT_AS (ulimit -v)", "VmSize", "mapped by this process (VmSize)"},
          Rlimit{RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)", "VmData", "used by this process's data (VmData)"}}) {
      struct rlimit lim {};
      if (::getrlimit(r.resource, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) continue;
      const core::Bytes limit = static_cast<core::Bytes>(std::min<rlim_t>(lim.rlim_cur, rlim_t{kNoLimit}));
      if (limit >= kNoLimit) continue;
      probe.limits.push_back({r.name, limit, proc_kib(src.self_status, r.status_key).value_or(0), r.used_what});
    }
  }
  const CgroupPaths paths = cgroup_paths(src.self_cgroup);
  const fs::path root(src.cgroup_root);
  std::optional<HostMemoryLimit> cg;
  if (paths.v2) {
    // the unified hierarchy at the root (v2), or beside v1's controllers at unified/ (hybrid)
    cg = cgroup_limit(root, *paths.v2, "memory.max", "memory.current");
    if (!cg) cg = cgroup_limit(root / "unified", *paths.v2, "memory.max", "memory.current");
  }
  if (!cg && paths.v1_memory)
    cg = cgroup_limit(root / "memory", *paths.v1_memory, "memory.limit_in_bytes", "memory.usage_in_bytes");
  if (cg) probe.limits.push_back(std::move(*cg));
  return probe;
}

std::optional<core::Bytes> peak_rss_bytes(const std::string& self_status) { return proc_kib(self_status, "VmHWM"); }

}  // namespace harmony::backend
