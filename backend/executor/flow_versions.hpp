// The version analysis every interpreter shares: from a Program's dataflow (core/program/dataflow.hpp) and its
// happens-before order (Ancestry), which write's version each op's read sees, how many reads each version has (a
// tensor is freed after its last read), and the check that every free named by the Program follows the reads of
// the version it frees. No plan kind is named here: only ops, tensors and the order between them.
#pragma once

#include <compare>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor/detail.hpp"
#include "core/program/program.hpp"

namespace harmony::backend::detail {

// One version of a dataflow tensor: the tensor's id (core::Dataflow) and the op that wrote it.
struct FlowVersion {
  int tensor = -1;
  int producer = -1;
  auto operator<=>(const FlowVersion&) const = default;
};

class FlowVersions {
 public:
  // Which tensors the analysis follows (the others an interpreter keeps elsewhere: a resident kind's weights and
  // gradients in its DeviceState, Harmony's host channels per sample); a tensor's name for messages.
  using Tracked = std::function<bool(const core::FlowTensor&)>;
  using Name = std::function<std::string(const core::FlowTensor&)>;

  // Tensors resolved per sample instead (Harmony's host channels: one buffer per kind and layer for the whole
  // minibatch, written a microbatch at a time and read at other microbatch sizes): a tensor's channel is its device,
  // kind, layer and owner, its samples [s0, s0 + n).
  using Ranged = std::function<bool(const core::FlowTensor&)>;
  // A run of samples [s0, s0 + n) of a ranged tensor an op reads, and the version that holds them: the op that wrote
  // them and the tensor it wrote (`source`: the same channel, other samples possibly).
  struct SampleRun {
    int tensor = -1;
    int s0 = 0, n = 0;
    int producer = -1;
    int source = -1;
  };

  FlowVersions() = default;
  // Resolves every tracked read of every op to the version it sees (reaching); throws ScheduleViolation naming the
  // op where a read has no producer among the op's ancestors or two unordered ones, or where a later version of the
  // tensor it reads, which no op reads, is written by an op unordered with it (check_dead_versions). Resolves every
  // ranged read per sample (resolve_ranged).
  FlowVersions(const core::Program& program, const Ancestry& anc, Tracked tracked, Name name,
               const Ranged& ranged = nullptr);

  // Op o's ranged reads, in its dataflow's order: the runs of samples and who wrote each.
  const std::vector<SampleRun>& sample_reads(int o) const { return sample_reads_[static_cast<std::size_t>(o)]; }

  // Op o's tracked reads, in its dataflow's order: the version each sees.
  const std::vector<FlowVersion>& reads(int o) const { return reads_[static_cast<std::size_t>(o)]; }
  // Op o's tracked writes (tensor ids), in its dataflow's order.
  const std::vector<int>& writes(int o) const { return writes_[static_cast<std::size_t>(o)]; }
  // Op o's ranged writes (tensor ids): versions too, whose reads are the sample runs that name them.
  const std::vector<int>& ranged_writes(int o) const { return ranged_writes_[static_cast<std::size_t>(o)]; }
  // The versions op o's frees name (tracked tensors): the one o writes, else the one it would read; a free whose
  // version cannot be resolved (no producer among o's ancestors) names none (check_frees reports it).
  const std::vector<FlowVersion>& freed(int o) const { return freed_[static_cast<std::size_t>(o)]; }
  // How many reads (over all ops, a tensor read twice by one op counted twice; a ranged read once per sample run)
  // see version v.
  int readers(const FlowVersion& v) const;
  // Per version: its reads (what a step counts down to free a version after its last read).
  const std::map<FlowVersion, int>& reader_counts() const { return readers_; }

  // The version of tracked tensor `id` that op o reads: the latest of its producers among o's ancestors (o itself
  // excluded). They must exist and be ordered (two unordered producers would race for the same tensor).
  int reaching(const Ancestry& anc, int o, int id) const;

  // The Program's frees are honoured: every read of a version happens before each op that frees that version (or
  // is that op: an op frees at its end). The version a free names is the one the op writes, else the one it would
  // read. Frees of untracked tensors, and of tensors no op writes (a Harmony task's DEL names its gradient whether or
  // not the task makes one), are not checked.
  void check_frees(const Ancestry& anc) const;

  // Tensor `id`'s name, for messages.
  std::string name(int id) const { return tname(id); }

 private:
  // A version nobody reads, written after the version an op reads by an op unordered with that reader: the reader
  // most likely misses its dependency on the later version (a BWD whose dY edge is gone reads an older input
  // gradient, and the one dY brings is never read).
  void check_dead_versions(const Ancestry& anc) const;
  // Every ranged read, per sample: the latest of the ops among the reader's ancestors that write that sample of the
  // tensor's channel (they must exist and be ordered), while every other writer of the sample comes after the reader
  // (one unordered with it could overwrite the sample first). ScheduleViolation naming the ops otherwise.
  void resolve_ranged(const Ancestry& anc, const Ranged& ranged);
  std::string label(int o) const { return op_name(*p_, o); }
  std::string tname(int id) const { return name_(p_->dataflow.tensor(id)); }

  const core::Program* p_ = nullptr;
  Tracked tracked_;
  Name name_;
  std::vector<std::vector<int>> producers_;  // per tensor id: the ops that write it
  std::vector<std::vector<FlowVersion>> reads_;
  std::vector<std::vector<int>> writes_;
  std::vector<std::vector<FlowVersion>> freed_;
  std::vector<std::vector<SampleRun>> sample_reads_;
  std::vector<std::vector<int>> ranged_writes_;
  std::map<FlowVersion, int> readers_;
};

}  // namespace harmony::backend::detail
