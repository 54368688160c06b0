// harmony-run profile: per-layer times and memory of the config's model on its device, as a harmony-sim profile.
#include "apps/run/common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include "backend/executor/executor.hpp"
#include "backend/host_memory.hpp"
#include "backend/model/describe.hpp"
#include "backend/model/hf_weights.hpp"
#include "backend/profiler.hpp"
#include "backend/registry.hpp"
#include "backend/tokens.hpp"
#include "backend/train_checkpoint.hpp"
#include "core/base/atomic_file.hpp"
#include "core/config/config.hpp"
#include "core/kinds/kinds.hpp"
#include "core/model/profile.hpp"
#include "core/output/report.hpp"
#include "core/output/trace.hpp"
#include "core/plan/plan_rules.hpp"
#include "core/program/lower.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_native.hpp"
#include "sim/engine/native_engine.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

namespace harmony::run {

int cmd_profile(const Cli& cli) {
  core::check_output_file(cli.out, "the profile (--out)");
  Setup s = make_setup(cli);
  const auto& cfg = s.cfg;
  backend::ProfileOptions po;
  po.seq_len = cfg.model.seq_len;
  po.ubatch_sizes = cli.ubatch.empty() ? s.desc.ubatch_fwd : cli.ubatch;
  po.repeats = cli.repeats;
  po.rounds = cli.rounds;
  po.dtype = run_dtype(cfg);
  check_host_state(s, 1);
  allocating(fmt::format("the host model state (fp32 weights, gradients and AdamW moments: {:.2f} GiB)",
                         gib(s.model->param_count() * 16)),
             [&] { init_state(s); });
  auto dev = make_device(cfg, s.device_flags, 0, true);
  const bool tty = isatty(STDERR_FILENO) != 0;
  const backend::ProfileResult prof = backend::profile_gpt2(*dev, *s.state, po, [&](const backend::ProfileProgress& p) {
    if (tty) fmt::print(stderr, "\rprofiling {}/{}", p.step, p.total_steps);
  });
  if (tty) fmt::print(stderr, "\n");
  backend::ProfileMeta meta;
  meta.model_name = s.desc.name;
  meta.device_kind = cfg.device;
  meta.threads = static_cast<int>(std::thread::hardware_concurrency());
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) meta.host = host;
  const std::time_t now = std::time(nullptr);
  char date[32] = {};
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  meta.date_utc = date;
  const std::string text = backend::profile_json(prof, meta);
  core::write_file_atomic(cli.out, text, "the profile");
  fmt::print("profile of {} on {} ({} layers, microbatch {}..{}) written to {}\n", s.desc.name, prof.device_name,
             prof.model.num_layers(), prof.model.ubatch_min(core::Phase::Fwd), prof.model.ubatch_max(core::Phase::Fwd),
             cli.out);
  if (!prof.dropped_fwd.empty() || !prof.dropped_bwd.empty())
    fmt::print("sizes left out (did not fit {:.2f} MiB): forward {}, backward {}\n", mib(prof.device_capacity_bytes),
               fmt::join(prof.dropped_fwd, ","), fmt::join(prof.dropped_bwd, ","));
  return 0;
}

}  // namespace harmony::run
