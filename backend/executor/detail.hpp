// The executor's internals, not public: the happens-before relation of a Program (Ancestry), the Interpreter interface
// (a Program's ops, the lock guarding its bookkeeping), the step loops (step_loops.cpp), the per-queue resources
// (queue_resources.cpp) and bf16 staging (staging.cpp). The interpreter, one for every kind: flow_interpreter.hpp.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/adamw_parallel.hpp"
#include "backend/executor/executor.hpp"
#include "backend/executor/host_meter.hpp"

namespace harmony::backend::detail {

// a "happens before" b in every execution: a path of deps, queue order and `extra` edges (extra[b]: ops b
// must also wait for) leads from a to b. Throws ScheduleViolation if the edges form a cycle.
class Ancestry {
 public:
  Ancestry() = default;
  Ancestry(const core::Program& program, const std::vector<std::vector<int>>& extra);
  bool before(int a, int b) const {  // a == b, or a is an ancestor of b
    return a == b || ((bits_[static_cast<std::size_t>(b) * words_ + static_cast<std::size_t>(a) / 64] >>
                       (static_cast<unsigned>(a) % 64)) &
                      1U) != 0;
  }

 private:
  std::size_t words_ = 0;
  std::vector<std::uint64_t> bits_;  // op-major: words_ per op
};

// "t3 BWD L2 mb0 u1 (3.0.0.Compute.BWD)": the label and the reference id, for messages.
std::string op_name(const core::Program& program, int op);

// Per op, the ops that run with it (Interpreter::group), the same for every kind: core::op_groups (a P2P pair, send
// first; a collective's members, the k-th of each device per (kind, layers, microbatch), in device order; every other
// op alone), and BackendError naming a collective without one member per GPU (op_groups.cpp).
std::vector<std::vector<int>> op_groups(const core::Program& program);

// One step's per-op times (StepResult::begin/end, ps since t0 on the steady clock), set by the step loops for the
// interpreter, which stamps them where the op's work runs: on its stream (QueueResources::stamp) for device work,
// on the host for host ops. The vectors have one slot per op and are not resized during the step.
struct StepTimes {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::vector<core::TimePs>* begin = nullptr;
  std::vector<core::TimePs>* end = nullptr;
  core::TimePs now() const {
    return static_cast<core::TimePs>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count() *
        core::kPsPerNs);
  }
};

// A Program's interpreter. A step calls begin_step, then run() per ready group and finished() per op of it, then
// end_step. With concurrent queues, run() and finished() of different groups are called from different worker
// threads: the step loops call them with mutex() held, and an interpreter releases it only where it waits
// for device work (wait_unlocked) or does long host work that touches nothing another op may touch at the
// same time (unlocked). So its maps and counters need no locking of their own, and device work and host
// updates of different queues overlap.
class Interpreter {
 public:
  Interpreter() = default;
  virtual ~Interpreter() = default;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Ops the executor makes `op` wait for beyond its deps (per op; may be empty).
  virtual const std::vector<std::vector<int>>& extra_deps() const = 0;
  virtual void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) = 0;
  // The ops that run together with `op` (a P2P pair, a collective), `op` included, in run order.
  virtual std::vector<int> group(int op) const = 0;
  virtual void run(const std::vector<int>& group) = 0;
  virtual void finished(int op) = 0;  // after every op of a group ran: release what it was the last reader of
  virtual double end_step() = 0;      // the mean loss; every device tensor released
  virtual void abandon_step() = 0;    // after a failed step (streams drained): every device tensor released
  virtual void synchronize() = 0;     // waits for every device stream
  // Kinds with resident state: copies the devices' weights, AdamW moments and step counts into the HostState (after
  // waiting for every stream). Nothing for the others, whose steps leave the updated weights in the HostState.
  virtual void sync_host_state() {}
  // Host transfer buffers the interpreter keeps across steps (stash and swap channels), for the pinned-memory
  // pre-flight; allocate_host() allocates them (pinned where the devices pin) after that check.
  virtual Bytes host_bytes() const { return 0; }
  virtual void allocate_host() {}
  // What stage_up / stage_down will allocate for `program` at most (bf16 only; 0 otherwise): per queue that runs a
  // WB, dWB, ARD or RS, two buffers of min(staging_chunk_bytes, its largest such transfer). For the pinned
  // pre-flight; conservative where a collective sums on the devices and stages nothing.
  static Bytes staging_bytes(const core::Program& program, const ExecutorOptions& options);

  std::mutex& mutex() { return mu_; }

  // What the step's Updates found non-finite (update_layers' reports): the highest layer's, the parameters summed.
  // Thread-safe (Updates of different queues run unlocked); take_nonfinite() returns and clears it.
  void note_nonfinite(const std::optional<NonFiniteGradient>& g) {
    if (!g) return;
    const std::lock_guard lock(nonfinite_mu_);
    const int before = nonfinite_ ? nonfinite_->params : 0;
    if (!nonfinite_ || g->layer > nonfinite_->layer) nonfinite_ = *g;
    nonfinite_->params = before + g->params;
  }
  std::optional<NonFiniteGradient> take_nonfinite() {
    const std::lock_guard lock(nonfinite_mu_);
    return std::exchange(nonfinite_, std::nullopt);
  }

  // The host memory the interpreter (and the HostState blocks its steps use, metered by the Executor) holds.
  HostMeter host_meter;

  // Set by the step loops for one step: where run() stamps its ops' begin and end times.
  StepTimes* times = nullptr;
  // Set by the serial loop for one step: allocations wait for the device's deferred frees (alloc_or_wait).
  bool exact_memory = false;

  // Set by run_step_concurrent for one step (empty in the serial loop): whether another group may still free
  // device memory: one is running and not itself waiting for memory (`waiting` of them are), or one can start.
  // Called with mutex() held.
  std::function<bool(int waiting)> others_progressing;

 protected:
  // Device::alloc, except that when the device is out of memory while other ops run or can start (their frees
  // may make room: with concurrent queues the order of allocations and frees depends on timing, so a plan that
  // fits can meet a fragmented or momentarily full device), it lets them run and retries. The OutOfMemory is
  // thrown when nothing else can free memory, which in the serial loop is at once, as before.
  //
  // Frees are stream-ordered (QueueResources::retire, release_after): memory a device's queued work will still
  // free counts as progress too, in the serial loop as well, so a plan that fits never fails because the host
  // ran ahead of the device.
  //
  // exact_memory (the serial loop): every deferred free of the device is done before an allocation, so the arena
  // sees the allocations and frees of the loop before event ordering, in the same order, whatever the timing:
  // the same placements, peaks and out-of-memory errors every run (the CPU device is the reference).
  Buffer alloc_or_wait(Device& device, Bytes bytes, std::string_view label) {
    // Every wait below first asks the device whether queued work can still complete (Device::check_alive): after
    // a sticky CUDA error the frees it waits for never come, and the check throws that error instead.
    if (exact_memory) {
      while (frees_pending(device)) {
        device.check_alive();
        unlocked([] { std::this_thread::sleep_for(std::chrono::microseconds(20)); });
      }
    }
    for (;;) {
      try {
        return device.alloc(bytes, label);
      } catch (const OutOfMemory&) {
        device.check_alive();
        if (frees_pending(device)) {
          unlocked([] { std::this_thread::sleep_for(std::chrono::microseconds(50)); });
          continue;
        }
        if (!others_progressing || !others_progressing(mem_waiters_)) throw;
      }
      ++mem_waiters_;
      unlocked([] { std::this_thread::sleep_for(std::chrono::microseconds(100)); });
      --mem_waiters_;
    }
  }

  // Runs fn with mutex() released (the caller holds it), and takes it again, also when fn throws.
  template <class F>
  void unlocked(F&& fn) {
    struct Relock {
      std::mutex& m;
      explicit Relock(std::mutex& mu) : m(mu) { m.unlock(); }
      ~Relock() { m.lock(); }
      Relock(const Relock&) = delete;
      Relock& operator=(const Relock&) = delete;
    } relock(mu_);
    fn();
  }
  void wait_unlocked(Stream& s) {
    unlocked([&] { s.synchronize(); });
  }
  // Whether queued device work will still free memory of `device` (deferred frees not yet done).
  virtual bool frees_pending(const Device& /*device*/) { return false; }

  // bf16 staging (docs/backend.md, "Mixed precision"): weights go up rounded from the fp32 masters, gradients
  // come down widened into fp32, through two host buffers per queue (Device::alloc_host: pinned on CUDA, where a
  // copy from pageable memory runs at a fraction of the link) of at most staging_chunk_bytes, used in turn, so the
  // host rounds or widens one chunk while the link moves the other, in bounded host memory. The rounding and
  // widening run on up to 16 threads with mutex() released (so the other queues' workers, the compute queue above
  // all, issue their work meanwhile). A queue's ops run one at a time, so its buffers need no lock of their own;
  // each buffer's event marks the last copy that used it, waited for (with mutex() released) before the host
  // touches the buffer again. The bits are those of rounding and widening element by element.
  //
  // stage_up: `src` (fp32 spans, concatenated) rounded to bf16 and copied to `dst` (device memory of `device`) on
  // `stream`; returns once the host has filled its last chunk (the source may change afterwards).
  void stage_up(std::size_t queue, Device& device, Stream& stream, void* dst,
                std::span<const std::span<const float>> src);
  // stage_down: the bf16 elements at `src` (device memory, as many as `dst` holds) copied down on `stream` and
  // widened into `dst` (fp32 spans, concatenated); returns once they are all there.
  void stage_down(std::size_t queue, Device& device, Stream& stream, std::span<const std::span<float>> dst,
                  const void* src);
  Bytes staging_chunk_bytes = core::kStagingChunkBytes;  // ExecutorOptions::staging_chunk_bytes

 private:
  struct StagingSlot {
    HostBuffer buf;
    MeteredBytes metered;
    std::unique_ptr<Event> done;
  };
  struct StagingRing {
    std::array<StagingSlot, 2> slots;
    int next = 0;
  };
  // The queue's next buffer, holding at least `bytes`, once the copy that used it last has run.
  StagingSlot& staging_slot(std::size_t queue, Device& device, Bytes bytes);

  std::mutex mu_;
  int mem_waiters_ = 0;  // ops of this step sleeping in alloc_or_wait (under mu_)
  std::mutex nonfinite_mu_;
  std::optional<NonFiniteGradient> nonfinite_;  // note_nonfinite (under nonfinite_mu_)
  std::map<std::size_t, StagingRing> staging_;
};

// One training step over the Program's queues on the calling thread: a queue's head runs when it and every
// op of its group head their queues and have their deps (and extra deps) done. Per op begin/end times.
// ScheduleViolation when no op can start.
StepResult run_step(const core::Program& program, Interpreter& interpreter);
// The same step with one worker thread per Program queue: each runs its queue's ops in order, an op (or its
// group, run by whichever member's worker finds it ready first) once its deps and extra deps have completed.
// The first exception of any worker stops the others after their current op and is rethrown here; a state in
// which nothing runs and nothing can start is the serial loop's ScheduleViolation.
// `pool`: its threads run the workers (one per queue; the Executor keeps one pool for all its steps); null: the
// step starts and joins its own threads.
class WorkerPool;
StepResult run_step_concurrent(const core::Program& program, Interpreter& interpreter, WorkerPool* pool = nullptr);

// n persistent threads: run(fn) has thread k call fn(k) for every k < n and returns when all have returned, so
// a concurrent step costs two hand-offs per queue instead of creating and joining a thread per queue. fn must
// not throw (an exception escaping it ends the program, as from a std::thread).
class WorkerPool {
 public:
  explicit WorkerPool(std::size_t n);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  std::size_t size() const { return threads_.size(); }
  void run(const std::function<void(std::size_t)>& fn);

 private:
  void loop(std::size_t k);
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The executor's interpreter of a Program of any kind (flow_interpreter.hpp).
std::unique_ptr<Interpreter> make_interpreter(const core::Program& program, std::vector<Device*> devices,
                                              HostState& state, const ExecutorOptions& options);

// What the interpreter keeps per Program queue: a stream on the queue's device (so a device's compute, swap-in,
// swap-out and P2P queues are separate streams and their work overlaps), an AdamW pool where the queue has
// Update ops (concurrently running Updates each need their own), and per op its trace label for the device's
// profiler ranges (NVTX on CUDA; the same names as core::write_chrome_trace).
//
// Event ordering (docs/backend.md, "Event ordering"): an op's device work is only enqueued on its queue's stream,
// and an Event recorded after it (record) stands for it. An op's work is ordered after its predecessors — its
// deps, the executor's extra deps and its queue predecessor — by device-side waits on their events (order), so
// the host does not wait for the device between ops. Host steps that read or write memory a predecessor's copy
// touches wait for exactly those events on the host (host_wait). A buffer (device or host) that queued work may
// still use is freed stream-ordered: retire (after the events of every op that used it) or release_after (after
// the work already on one stream). How far the host runs ahead of the devices is ExecutorOptions::run_ahead.
class QueueResources {
 public:
  QueueResources(const core::Program& program, const std::vector<Device*>& devices, const ExecutorOptions& options);
  Stream& stream(int op) { return *streams_[queue(op)]; }
  ParallelAdamW& adamw(int op);
  // Device::trace_range of the op's device, named after the op (nullptr where the device names no ranges).
  std::shared_ptr<void> range(int op);
  void synchronize();  // every stream, then every deferred free; rethrows the first error after waiting for all

  // The event recorded after op's work (this step's, once the op has run).
  Event& event(int op) { return *events_[static_cast<std::size_t>(op)]; }
  // The ops op must follow: its deps, extra[op] (the executor's edges; may be shorter than the ops) and its
  // queue predecessor.
  std::vector<int> preds(int op, const std::vector<std::vector<int>>& extra) const;
  // `on` waits (device side) for the events of op's preds recorded on other streams than `on`; a pred on `on`
  // itself is ordered by the stream.
  void order(int op, Stream& on, const std::vector<std::vector<int>>& extra);
  // The host blocks until op's preds have run on their devices (call with the interpreter's lock released).
  void host_wait(int op, const std::vector<std::vector<int>>& extra);
  // ExecutorOptions::run_ahead = k > 0: the host blocks until, for each pred of op, the op k - 1 before it in its
  // queue has run (call unlocked). Nothing for k = 0.
  void throttle(int op, const std::vector<std::vector<int>>& extra);
  // What every group does before its work: collect finished frees, throttle each member
  // (run_ahead), then a host group waits on the host for its members' preds, a device group makes each member's
  // stream wait for every member's preds. `unlocked(fn)` runs fn with the interpreter's lock released.
  template <class Unlocked>
  void await_preds(const std::vector<int>& group, const std::vector<std::vector<int>>& extra, bool host,
                   Unlocked&& unlocked) {
    collect();
    unlocked([&] {
      for (const int a : group) throttle(a, extra);
    });
    if (host) {
      unlocked([&] {
        for (const int a : group) host_wait(a, extra);
      });
      return;
    }
    for (const int a : group)
      for (const int b : group) order(b, stream(a), extra);
  }
  // Stamps op's begin (or end) time in `times` when op's stream reaches this point (nothing when times is null).
  void stamp(int op, const StepTimes* times, bool begin);
  // Stamps begin, runs `work` (which enqueues the group's work on its members' streams), records the group's
  // events (record_group) and stamps end; host ops (Update, host copies) are stamped on the host around `work`.
  template <class F>
  void issue(const std::vector<int>& group, const StepTimes* times, bool host, F&& work) {
    const auto host_stamp = [&](bool begin) {
      if (times == nullptr) return;
      for (const int a : group) (begin ? *times->begin : *times->end)[static_cast<std::size_t>(a)] = times->now();
    };
    if (host) {
      host_stamp(true);
    } else {
      for (const int a : group) stamp(a, times, true);
    }
    work();
    record_group(group);
    if (host) {
      host_stamp(false);
    } else {
      for (const int a : group) stamp(a, times, false);
    }
  }
  // Records op's event on its stream, after the work the op enqueued there.
  void record(int op) {
    stream(op).record(event(op));
    recorded_[static_cast<std::size_t>(op)] = step_;
  }
  // A new step: every op's event stands for the previous step's work until the op records it again (collect
  // treats an op not recorded in this step as still running).
  void begin_step() { ++step_; }
  // For a group whose members' work spans their streams (a P2P copy on the sender's stream into the receiver's
  // tensor): records every member's event, then each member's stream waits for the others' and records again, so
  // every member's event stands for the whole group.
  void record_group(const std::vector<int>& group);

  // Replica sums on the devices (ExecutorOptions::communicator): whether the communicator is set and `group` has
  // one member per device in rank order (member r on device r), so it can all-reduce the group's tensors.
  bool device_sums(const std::vector<int>& group) const;
  // Enqueues the communicator's in-place all-reduce (all_reduce_sum, or all_reduce_sum_bf16 for BF16) of `count`
  // elements at bufs[r] on member r's stream, for every member (call after await_preds; issue's record_group then
  // makes every member's event stand for the whole collective). Needs device_sums(group).
  void all_reduce(const std::vector<int>& group, const std::vector<void*>& bufs, std::int64_t count, DType dtype);

  // Deferred frees. retire: `held` (a tensor, a host buffer) is destroyed once the events of `users` (the ops
  // whose work touched it; all of them have run on the host) have completed: collect() polls them (Event::query,
  // as a caching allocator reuses a block once the events of its streams have passed), so one slow user delays
  // only its own tensors. release_after: `held` is destroyed when `s` (a stream of that device) reaches this point.
  void retire(int device, const std::vector<int>& users, std::shared_ptr<void> held);
  void release_after(Stream& s, int device, std::shared_ptr<void> held);
  void release_after(int op, Buffer buffer);  // on op's stream and device
  // Destroys what retire holds whose users' events have completed.
  void collect();
  // Whether frees of `device` are deferred and not yet done (collects first).
  bool frees_pending(const Device& device);
  std::size_t queue(int op) const;  // the Program queue op runs on (the index of its stream)

 private:
  const core::Program& p_;
  std::vector<Device*> devs_;
  Communicator* comm_ = nullptr;                       // ExecutorOptions::communicator
  std::vector<std::unique_ptr<Stream>> streams_;       // per queue
  std::vector<std::unique_ptr<ParallelAdamW>> adamw_;  // per queue (null without Update ops)
  std::vector<std::unique_ptr<Event>> events_;         // per op, on the op's device
  int run_ahead_ = 1;
  std::uint64_t step_ = 1;               // begin_step's count
  std::vector<std::uint64_t> recorded_;  // per op: the step its event was last recorded in
  struct Retired {
    int device = 0;
    std::vector<int> users;
    std::shared_ptr<void> held;
  };
  std::mutex retired_mu_;
  std::vector<Retired> retired_;                            // retire's, not yet destroyed
  std::vector<std::shared_ptr<std::atomic<int>>> pending_;  // per device: release_after's, not yet run
};

}  // namespace harmony::backend::detail
