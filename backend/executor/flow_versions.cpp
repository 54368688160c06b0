// FlowVersions (flow_versions.hpp): the Program's dataflow resolved to the version each read sees, the reads per
// version, and the check of the Program's frees against them.
#include "backend/executor/flow_versions.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace harmony::backend::detail {

FlowVersions::FlowVersions(const core::Program& program, const Ancestry& anc, Tracked tracked, Name name,
                           const Ranged& ranged)
    : p_(&program), tracked_(std::move(tracked)), name_(std::move(name)) {
  const core::Dataflow& df = program.dataflow;
  const std::size_t n = program.ops.size();
  producers_.assign(df.tensors.size(), {});
  reads_.assign(n, {});
  writes_.assign(n, {});
  for (std::size_t o = 0; o < n; ++o)
    for (const int id : df.ops[o].writes)
      if (tracked_(df.tensor(id))) {
        writes_[o].push_back(id);
        producers_[static_cast<std::size_t>(id)].push_back(static_cast<int>(o));
      }
  for (std::size_t o = 0; o < n; ++o)
    for (const int id : df.ops[o].reads) {
      if (!tracked_(df.tensor(id))) continue;
      const FlowVersion v{id, reaching(anc, static_cast<int>(o), id)};
      reads_[o].push_back(v);
      ++readers_[v];
    }
  freed_.assign(n, {});
  for (std::size_t o = 0; o < n; ++o)
    for (const int id : df.ops[o].frees) {
      if (!tracked_(df.tensor(id))) continue;
      const auto& w = writes_[o];
      if (std::find(w.begin(), w.end(), id) != w.end()) {
        freed_[o].push_back(FlowVersion{id, static_cast<int>(o)});
        continue;
      }
      try {
        freed_[o].push_back(FlowVersion{id, reaching(anc, static_cast<int>(o), id)});
      } catch (const ScheduleViolation&) {  // NOLINT(bugprone-empty-catch): check_frees reports it where asked
      }
    }
  check_dead_versions(anc);
  sample_reads_.assign(n, {});
  ranged_writes_.assign(n, {});
  if (ranged) resolve_ranged(anc, ranged);
  for (const auto& runs : sample_reads_)
    for (const SampleRun& r : runs) ++readers_[FlowVersion{r.source, r.producer}];
}

void FlowVersions::resolve_ranged(const Ancestry& anc, const Ranged& ranged) {
  const core::Dataflow& df = p_->dataflow;
  using Channel = std::tuple<int, core::FlowKind, int, int>;
  const auto channel = [](const core::FlowTensor& t) { return Channel{t.device, t.kind, t.layer, t.owner}; };
  std::map<Channel, std::vector<std::pair<int, int>>> writers;  // per channel: (op, tensor) of every write
  for (std::size_t o = 0; o < df.ops.size(); ++o)
    for (const int id : df.ops[o].writes)
      if (ranged(df.tensor(id))) {
        writers[channel(df.tensor(id))].emplace_back(static_cast<int>(o), id);
        ranged_writes_[o].push_back(id);
      }
  for (std::size_t ro = 0; ro < df.ops.size(); ++ro) {
    const int o = static_cast<int>(ro);
    for (const int id : df.ops[ro].reads) {
      const core::FlowTensor& t = df.tensor(id);
      if (!ranged(t)) continue;
      const auto& ws = writers[channel(t)];
      for (int s = t.s0; s < t.s0 + t.n; ++s) {
        int best = -1, source = -1;
        for (const auto& [c, wid] : ws) {
          const core::FlowTensor& w = df.tensor(wid);
          if (c == o || s < w.s0 || s >= w.s0 + w.n) continue;
          if (anc.before(c, o)) {
            if (best >= 0 && !anc.before(best, c) && !anc.before(c, best))
              throw ScheduleViolation(fmt::format(
                  "executor: op {} reads {} sample {}, written by both op {} and op {}, which are not ordered",
                  label(o), tname(id), s, label(best), label(c)));
            if (best < 0 || anc.before(best, c)) {
              best = c;
              source = wid;
            }
          } else if (!anc.before(o, c)) {
            throw ScheduleViolation(fmt::format(
                "executor: op {} reads {} sample {}, which op {} may write first: neither depends on the other",
                label(o), tname(id), s, label(c)));
          }
        }
        if (best < 0)
          throw ScheduleViolation(
              fmt::format("executor: op {} reads {} sample {}, which no op writes before it", label(o), tname(id), s));
        auto& runs = sample_reads_[ro];
        if (!runs.empty() && runs.back().tensor == id && runs.back().producer == best && runs.back().source == source &&
            runs.back().s0 + runs.back().n == s) {
          ++runs.back().n;
        } else {
          runs.push_back(SampleRun{id, s, 1, best, source});
        }
      }
    }
  }
}

void FlowVersions::check_dead_versions(const Ancestry& anc) const {
  for (std::size_t o = 0; o < reads_.size(); ++o) {
    const int ro = static_cast<int>(o);
    for (const FlowVersion& v : reads_[o])
      for (const int c : producers_[static_cast<std::size_t>(v.tensor)]) {
        if (c == ro || c == v.producer || !anc.before(v.producer, c) || anc.before(c, ro) || anc.before(ro, c) ||
            readers(FlowVersion{v.tensor, c}) > 0)
          continue;
        throw ScheduleViolation(
            fmt::format("executor: op {} reads {}, produced by op {} and again by op {}, which no op reads: neither "
                        "depends on the other",
                        label(ro), tname(v.tensor), label(v.producer), label(c)));
      }
  }
}

int FlowVersions::readers(const FlowVersion& v) const {
  const auto it = readers_.find(v);
  return it == readers_.end() ? 0 : it->second;
}

int FlowVersions::reaching(const Ancestry& anc, int o, int id) const {
  const std::vector<int>& prods = producers_.at(static_cast<std::size_t>(id));
  const auto unordered = [&](int a, int b) {
    return ScheduleViolation(
        fmt::format("executor: op {} reads {}, produced by both op {} and op {}, which are not ordered", label(o),
                    tname(id), label(a), label(b)));
  };
  int best = -1;
  for (const int c : prods) {
    if (c == o || !anc.before(c, o)) continue;
    if (best < 0 || anc.before(best, c)) {
      best = c;
    } else if (!anc.before(c, best)) {
      throw unordered(best, c);
    }
  }
  if (best >= 0) {  // every ancestor producer must come before the chosen one
    for (const int c : prods)
      if (c != o && anc.before(c, o) && !anc.before(c, best)) throw unordered(best, c);
    return best;
  }
  if (prods.empty())
    throw ScheduleViolation(fmt::format("executor: op {} reads {}, which no op produces", label(o), tname(id)));
  std::string names;
  for (const int c : prods) {
    if (c == o) continue;
    names += (names.empty() ? "" : ", ") + label(c);
  }
  throw ScheduleViolation(fmt::format("executor: op {} reads {}, produced by op {}, on which it does not depend",
                                      label(o), tname(id), names.empty() ? std::string("(itself)") : names));
}

void FlowVersions::check_frees(const Ancestry& anc) const {
  const core::Dataflow& df = p_->dataflow;
  std::map<FlowVersion, std::vector<int>> killers;
  for (std::size_t f = 0; f < p_->ops.size(); ++f) {
    const int fo = static_cast<int>(f);
    for (const int id : df.ops[f].frees) {
      if (!tracked_(df.tensor(id))) continue;
      const auto& w = writes_[f];
      int v = std::find(w.begin(), w.end(), id) != w.end() ? fo : -1;
      if (v < 0 && producers_[static_cast<std::size_t>(id)].empty()) continue;  // nothing ever written: nothing to free
      if (v < 0) {
        try {
          v = reaching(anc, fo, id);
        } catch (const ScheduleViolation& e) {
          throw ScheduleViolation(fmt::format("executor: op {} frees {}: {}", label(fo), tname(id), e.what()));
        }
      }
      killers[FlowVersion{id, v}].push_back(fo);
    }
  }
  for (std::size_t o = 0; o < p_->ops.size(); ++o) {
    const int ro = static_cast<int>(o);
    for (const FlowVersion& v : reads_[o]) {
      const auto it = killers.find(v);
      if (it == killers.end()) continue;
      for (const int f : it->second) {
        if (f == ro || anc.before(ro, f)) continue;
        if (anc.before(f, ro))
          throw ScheduleViolation(fmt::format("executor: op {} reads {} (of op {}), which op {} frees before it",
                                              label(ro), tname(v.tensor), label(v.producer), label(f)));
        throw ScheduleViolation(
            fmt::format("executor: op {} reads {} (of op {}), which op {} may free first: neither depends on the other",
                        label(ro), tname(v.tensor), label(v.producer), label(f)));
      }
    }
  }
}

}  // namespace harmony::backend::detail
