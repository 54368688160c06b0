// Writes the Chrome trace JSON: process/thread name metadata, then ops ordered by GPU, stream
// (SwapIn, P2PIn, Compute, P2POut, SwapOut, CPU) and FIFO position, with ids and deps in args.
#include "core/output/trace.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace harmony::core {

void write_chrome_trace(std::ostream& out, const Program& p, const std::vector<TimePs>& begin_ps,
                        const std::vector<TimePs>& end_ps, const TraceMeta& meta) {
  out << chrome_trace_json(p, begin_ps, end_ps, meta).dump(1) << "\n";
}

nlohmann::json chrome_trace_json(const Program& p, const std::vector<TimePs>& begin_ps,
                                 const std::vector<TimePs>& end_ps, const TraceMeta& meta) {
  nlohmann::json events = nlohmann::json::array();
  std::vector<int> devices;
  for (const auto& q : p.queues) {
    if (std::find(devices.begin(), devices.end(), q.device) == devices.end()) devices.push_back(q.device);
  }
  std::sort(devices.begin(), devices.end());
  for (int d : devices) {
    events.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", d}, {"args", {{"name", fmt::format("GPU{}", d)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", d}, {"args", {{"sort_index", d}}}});
    for (int s = 0; s < kNumStreams; ++s) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", d},
                        {"tid", s},
                        {"args", {{"name", stream_name(static_cast<Stream>(s))}}}});
      events.push_back(
          {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", d}, {"tid", s}, {"args", {{"sort_index", s}}}});
    }
  }
  std::vector<const OpQueue*> queues;
  for (const auto& q : p.queues) queues.push_back(&q);
  std::stable_sort(queues.begin(), queues.end(), [](const OpQueue* a, const OpQueue* b) {
    return a->device != b->device ? a->device < b->device : a->stream < b->stream;
  });
  for (const OpQueue* q : queues) {
    for (int op : q->ops) {
      const auto i = static_cast<std::size_t>(op);
      if (begin_ps[i] < 0) continue;
      const Op& o = p.ops[i];
      nlohmann::json args = {{"id", p.op_id(op)},
                             {"task", o.task},
                             {"kind", op_kind_name(o.kind)},
                             {"layers", {o.layers.first, o.layers.last}}};
      if (o.ubs > 0) {
        args["microbatch"] = o.ui;
        args["ubatch_size"] = o.ubs;
      }
      if (o.bytes > 0) args["bytes"] = o.bytes;
      nlohmann::json deps = nlohmann::json::array();
      for (int d : o.deps) deps.push_back(p.op_id(d));
      args["deps"] = std::move(deps);
      events.push_back({{"ph", "X"},
                        {"name", p.op_label(op)},
                        {"cat", op_kind_name(o.kind)},
                        {"pid", o.device},
                        {"tid", static_cast<int>(o.stream)},
                        {"ts", static_cast<double>(begin_ps[i]) / 1e6},
                        {"dur", static_cast<double>(end_ps[i] - begin_ps[i]) / 1e6},
                        {"args", std::move(args)}});
    }
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"source", meta.source}, {"title", meta.title}, {"time_unit", "us"}}}};
}

}  // namespace harmony::core
