// The native engine's activities: what an op (or a rendezvous pair) does on the machine, as stages run in turn (a
// fixed delay, or a fluid flow over a path of links after a latency), its copy engine and its swap-ledger class,
// built from the Program, the model's profile and the machine (ActivityBuilder). Private to sim/engine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/base/flat_table.hpp"
#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/program/program.hpp"
#include "sim/engine/native_engine.hpp"

namespace harmony::sim::native_detail {

// A short list held in place: a flow's path and coefficients (at most kMaxPath links: a P2P copy across sockets
// crosses five, plus host memory and the host-core pool). An activity per op made the engine's malloc/free a fifth
// of a sweep's time with std::vector here.
constexpr std::size_t kMaxPath = 8;
template <class T>
class SmallVec {
 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> v) {
    for (const T& x : v) push_back(x);
  }
  SmallVec(const std::vector<T>& v) {  // NOLINT(google-explicit-constructor): LinkGraph's paths convert
    for (const T& x : v) push_back(x);
  }
  void push_back(T x) {
    if (n_ == kMaxPath)
      throw core::InternalError(fmt::format("native engine: a flow path longer than {} links", kMaxPath));
    v_[n_++] = x;
  }
  void assign(std::size_t n, T x) {
    clear();
    for (std::size_t i = 0; i < n; ++i) push_back(x);
  }
  void clear() { n_ = 0; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](std::size_t i) { return v_[i]; }
  const T& operator[](std::size_t i) const { return v_[i]; }
  const T* begin() const { return v_.data(); }
  const T* end() const { return v_.data() + n_; }

 private:
  std::array<T, kMaxPath> v_{};
  std::size_t n_ = 0;
};
using Path = SmallVec<int>;

enum class ActKind : std::uint8_t { Fixed, Flow };

// DRAM bytes a DeepSpeed-style CPU Adam moves per byte of the FP32 parameters it steps: 28 per parameter (FP32
// masters read and written, the gradient read, two moments read and written) over 4 (ActivityBuilder's
// update_traffic_bytes counts the same 28).
constexpr double kAdamDramBytesPerFp32Byte = 7.0;

// One stage of an activity: a fixed delay, or a fluid flow over a path after a latency. Most ops are one
// stage; with the native model's host work an op runs several in turn (an NVMe read before a swap-in, a
// host gradient sum after a swap-out, NVMe I/O and dtype conversions around a CPU update).
struct Stage {
  ActKind kind = ActKind::Fixed;
  core::TimePs fixed_ps = 0;
  core::TimePs latency_ps = 0;
  double volume = 0;  // bytes (core-seconds on the CPU)
  double cap = 0;     // the flow's own rate limit; <= 0: none
  Path path;
  SmallVec<double> coef;  // per path link: what one unit of volume uses of it; empty: 1 each
};

struct Activity : Stage {  // the Stage part is the stage running now
  int a = -1;
  int b = -1;                // the P2P peer of `a`, or -1
  std::vector<Stage> later;  // the stages still to run, in order
  int engine_stage = 0;      // the copy engine is given back when the stage of this index ends (0: the first)
  int stage = 0;             // index of the running stage
  int engine = -1;           // copy engine: gpu * 2 (+ 1 for device->host), -1 none
  TransferClass cls = TransferClass::None;
  core::TensorKind tensor = core::TensorKind::Activation;
  core::Bytes ledger_bytes = 0;  // payload counted in the swap ledger (0: not a transfer)
  // a dWB's copy back to its device (its return stage): counted in the ledger as host -> device, of the op's tensor
  core::Bytes return_ledger_bytes = 0;
  // flow state
  double remaining = 0;
  double rate = -1;
  std::uint64_t version = 0;
  bool active = false;
};

inline double coef_of(const Stage& x, std::size_t i) { return x.coef.empty() ? 1.0 : x.coef[i]; }

// compute.host_cores on a shared pool, priced natively: the updates, copies and dispatch run on its units.
bool on_host_pool(const core::MachineSpec& machine, const NativeOptions& options);
// What an update takes with the whole CPU (or pool) to itself: its profiled time at the machine's optimizer rate.
double update_work_s(const core::Op& o, const core::Model& model, const core::MachineSpec& machine);
// The factor on a compute op's profiled time: machine.compute.time_scale, ignored under the reference settings.
double compute_time_scale(const core::MachineSpec& machine, const NativeOptions& options);

// Builds the activity of an op or a rendezvous pair and prices a stage alone. Holds what pricing reads (the
// Program, model, machine, options, topology, link graph and its link capacities, by reference: they outlive it)
// and its memos (the P2P paths the Program uses, compute times).
class ActivityBuilder {
 public:
  // `capacity`: per link of `graph`, what the engine divides (infinite: not shared).
  ActivityBuilder(const core::Program& p, const core::Model& m, const core::MachineSpec& mach, const NativeOptions& opt,
                  const core::Topology& topo, const LinkGraph& graph, const std::vector<double>& capacity);

  // The activity of op `a` (with its rendezvous peer `b`, or -1) into a default one: its stages, paths and copy
  // engine.
  void build(Activity& x, int a, int b) const;

  // A stage's time alone on the machine: its fixed time, or its latency plus its volume at the path's bottleneck
  // (capped by its own rate limit), the rate max-min fairness gives a flow that shares nothing.
  double alone_ps(const Stage& st) const;

 private:
  Path p2p(int from, int to, TransferClass* cls) const;
  double compute_s(const core::Op& o) const;
  void set_compute_stage(Stage& x, const core::Op& o) const;
  void set_update_stage(Activity& x, const core::Op& o) const;
  void cpu_work(Stage& st, double w, double dram_bytes) const;
  Stage pass_stage(double bytes) const;
  void set_flow(Activity& x, double volume, const Path& path, double cap, TransferClass cls, core::Bytes ledger,
                core::TensorKind tensor, int engine) const;
  void add_host_memory(Stage& x, double coef) const;
  Stage host_stage(int link, double volume, double mem_coef, core::TimePs latency) const;
  Stage return_stage(const core::Op& o, const core::NativeOpCosts& c) const;
  void add_host_work(Activity& x) const;  // x.a's op
  void overlap_io(const std::vector<Stage*>& work, double read_bytes, double write_bytes) const;
  double conversion_bytes(int a) const;      // op a's
  double update_traffic_bytes(int a) const;  // op a's
  bool host_pool() const;
  void share_host_pool(Activity& x) const;
  void add_dispatch(Activity& x) const;
  double dispatch_s(const Activity& x) const;
  double host_path_cap(const core::Op& o, bool up) const;
  void transfer(Activity& x, const core::Op& o, double bytes) const;
  bool idle_update(int a) const;  // op a: a replica's host Update of a range another Update steps (core::update_owners)

  const core::Program& p_;
  const core::Model& m_;
  const core::MachineSpec& mach_;
  NativeOptions opt_;
  const core::Topology& topo_;
  const LinkGraph& graph_;
  const std::vector<double>& cap_;
  double nsim_ = 1;
  core::TimePs latency_ps_ = 0;
  std::vector<Path> h2d_, d2h_;  // per GPU
  // per (from, to) GPU pair the Program uses, filled on first use (p2p)
  struct P2PRoute {
    Path path;
    TransferClass cls = TransferClass::None;
  };
  mutable core::FlatTable<P2PRoute> p2p_;
  mutable core::FlatTable<double> compute_memo_;  // compute_s's memo
  std::vector<char> owner_;                       // per op: core::update_owners
};

}  // namespace harmony::sim::native_detail
