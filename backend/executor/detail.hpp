// The executor's internals, shared by its two interpreters and not part of the public API: the
// happens-before relation of a Program (deps + queue order + executor-added edges), the Interpreter
// interface (what one Program dialect does with its ops, and the lock that guards its bookkeeping) and the
// two loops that run one step: serial on the calling thread, or one worker thread per Program queue.
// Harmony Programs: executor.cpp; the baselines' Programs: baseline.cpp (both in backend/executor/).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/adamw_parallel.hpp"
#include "backend/executor/executor.hpp"

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

// One Program dialect. A step calls begin_step, then run() per ready group and finished() per op of it, then
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
  // Host transfer buffers the interpreter keeps across steps (stash and swap channels), for the pinned-memory
  // pre-flight; allocate_host() allocates them (pinned where the devices pin) after that check.
  virtual Bytes host_bytes() const { return 0; }
  virtual void allocate_host() {}

  std::mutex& mutex() { return mu_; }

  // Set by run_step_concurrent for one step (empty in the serial loop): whether another group may still free
  // device memory: one is running and not itself waiting for memory (`waiting` of them are), or one can start.
  // Called with mutex() held.
  std::function<bool(int waiting)> others_progressing;

 protected:
  // Device::alloc, except that when the device is out of memory while other ops run or can start (their frees
  // may make room: with concurrent queues the order of allocations and frees depends on timing, so a plan that
  // fits can meet a fragmented or momentarily full device), it lets them run and retries. The OutOfMemory is
  // thrown when nothing else can free memory, which in the serial loop is at once, as before.
  Buffer alloc_or_wait(Device& device, Bytes bytes, std::string_view label) {
    for (;;) {
      try {
        return device.alloc(bytes, label);
      } catch (const OutOfMemory&) {
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

 private:
  std::mutex mu_;
  int mem_waiters_ = 0;  // ops of this step sleeping in alloc_or_wait (under mu_)
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

// Harmony-PP / Harmony-DP Programs (core::lower_harmony, every replica lowered).
std::unique_ptr<Interpreter> make_harmony_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                      HostState& state, const ExecutorOptions& options);
// The baselines' Programs (core::lower_baseline: dp-swap, pp-swap, zero-infinity, l2l).
std::unique_ptr<Interpreter> make_baseline_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                       HostState& state, const ExecutorOptions& options);

// What both interpreters keep per Program queue: a stream on the queue's device (so a device's compute, swap-in,
// swap-out and P2P queues are separate streams and their work overlaps), an AdamW pool where the queue has
// Update ops (concurrently running Updates each need their own), and per op its trace label for the device's
// profiler ranges (NVTX on CUDA; the same names as core::write_chrome_trace).
class QueueResources {
 public:
  QueueResources(const core::Program& program, const std::vector<Device*>& devices, const ExecutorOptions& options);
  Stream& stream(int op) { return *streams_[queue(op)]; }
  ParallelAdamW& adamw(int op);
  // Device::trace_range of the op's device, named after the op (nullptr where the device names no ranges).
  std::shared_ptr<void> range(int op);
  void synchronize();  // every stream; rethrows the first error after waiting for all

 private:
  std::size_t queue(int op) const;
  const core::Program& p_;
  std::vector<Device*> devs_;
  std::vector<std::unique_ptr<Stream>> streams_;       // per queue
  std::vector<std::unique_ptr<ParallelAdamW>> adamw_;  // per queue (null without Update ops)
};

// HostState::update(config, first, last) with the element loops on `pool` (bit-identical: ParallelAdamW is
// adamw_update element for element): AdamW per parameter, the tied wte updated with its two gradients summed
// (layer 0's and the head's lm_head), the head's lm_head then a copy of it, each layer's step count advanced.
void update_layers(HostState& state, const AdamWConfig& config, int first, int last, ParallelAdamW& pool);

}  // namespace harmony::backend::detail
