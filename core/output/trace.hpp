// Chrome trace export (JSON object form, opens in Perfetto and chrome://tracing): one complete
// event per op with pid = GPU and tid = stream, named like "t3 BWD L21-27 mb0 u8", so a predicted
// and a measured timeline of the same Program overlay.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/program/program.hpp"

namespace harmony::core {

struct TraceMeta {
  std::string source;  // "harmony-sim (reference)" or "harmony-run (cpu)"
  std::string title;   // plan summary
};

// The trace document ({"traceEvents": [...], ...}); callers may append events (e.g. counter tracks).
nlohmann::json chrome_trace_json(const Program& program, const std::vector<TimePs>& begin_ps,
                                 const std::vector<TimePs>& end_ps, const TraceMeta& meta);

// begin/end per op in picoseconds; ops with begin < 0 (never ran) are left out.
void write_chrome_trace(std::ostream& out, const Program& program, const std::vector<TimePs>& begin_ps,
                        const std::vector<TimePs>& end_ps, const TraceMeta& meta);

}  // namespace harmony::core
