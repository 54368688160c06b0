// The executor's step loops (detail.hpp): one training step over a Program's queues, serially on the calling thread
// or with one worker thread per queue (an op runs when it heads its queue and its deps have ended; P2P pairs and
// collectives run together as a group), the persistent WorkerPool the concurrent loop runs on, and the
// happens-before relation (Ancestry) the interpreters' read checks use.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail {

Ancestry::Ancestry(const core::Program& p, const std::vector<std::vector<int>>& extra) {
  const std::size_t n = p.ops.size();
  words_ = (n + 63) / 64;
  bits_.assign(n * words_, 0);
  // ancestors = the union of the predecessors' ancestors, filled in a topological order
  const core::ProgramGraph g(p, extra);
  const std::vector<int> order = g.topological_order();
  if (order.size() != n)
    throw ScheduleViolation(
        "executor: the Program's dependencies and queue order (with the executor's added edges) "
        "form a cycle");
  for (const int op : order) {
    std::uint64_t* row = &bits_[static_cast<std::size_t>(op) * words_];
    for (const int d : g.predecessors(op)) {
      const auto du = static_cast<std::size_t>(d);
      const std::uint64_t* drow = &bits_[du * words_];
      for (std::size_t w = 0; w < words_; ++w) row[w] |= drow[w];
      row[du / 64] |= std::uint64_t{1} << (du % 64);
    }
  }
}

std::string op_name(const core::Program& p, int op) { return p.op_label(op) + " (" + p.op_id(op) + ")"; }

namespace {

// Both step loops' shared parts: the readiness of an op (it heads its queue, its deps and the executor's extra
// deps are done), the deadlock message, the per-op times handed to the interpreter.
struct TimesHook {  // Interpreter::times for one step
  Interpreter& it;
  StepTimes times;
  TimesHook(Interpreter& i, StepResult& res) : it(i) {
    times.begin = &res.begin;
    times.end = &res.end;
    it.times = &times;
  }
  ~TimesHook() { it.times = nullptr; }
  TimesHook(const TimesHook&) = delete;
  TimesHook& operator=(const TimesHook&) = delete;
};

bool heads_and_deps_done(const core::Program& p, const std::vector<std::vector<int>>& extra,
                         const std::vector<char>& done, const std::vector<std::size_t>& head, int o) {
  const core::Op& op = p.ops[static_cast<std::size_t>(o)];
  if (head[static_cast<std::size_t>(op.queue)] != static_cast<std::size_t>(op.queue_pos)) return false;
  for (int dp : op.deps)
    if (done[static_cast<std::size_t>(dp)] == 0) return false;
  if (static_cast<std::size_t>(o) < extra.size())
    for (int dp : extra[static_cast<std::size_t>(o)])
      if (done[static_cast<std::size_t>(dp)] == 0) return false;
  return true;
}

std::string stuck_message(const core::Program& p, const std::vector<std::size_t>& head) {
  std::string stuck;
  for (std::size_t q = 0; q < p.queues.size(); ++q)
    if (head[q] < p.queues[q].ops.size()) stuck += "\n  " + op_name(p, p.queues[q].ops[head[q]]);
  return "executor: no op can start; queue heads:" + stuck;
}

}  // namespace

StepResult run_step(const core::Program& p, Interpreter& it) {
  const std::size_t nops = p.ops.size();
  const auto& extra = it.extra_deps();
  StepResult res;
  res.begin.assign(nops, -1);
  res.end.assign(nops, -1);
  std::vector<char> done(nops, 0);
  std::vector<std::size_t> head(p.queues.size(), 0);
  const TimesHook times(it, res);  // the interpreter stamps the ops' times, on their streams
  struct ExactMemory {             // the serial loop's allocation order, whatever the timing (alloc_or_wait)
    Interpreter& it;
    explicit ExactMemory(Interpreter& i) : it(i) { it.exact_memory = true; }
    ~ExactMemory() { it.exact_memory = false; }
    ExactMemory(const ExactMemory&) = delete;
    ExactMemory& operator=(const ExactMemory&) = delete;
  } exact(it);
  auto ready = [&](int o) { return heads_and_deps_done(p, extra, done, head, o); };
  std::size_t left = nops;
  try {
    while (left > 0) {
      bool progress = false;
      for (std::size_t q = 0; q < p.queues.size(); ++q) {
        if (head[q] >= p.queues[q].ops.size()) continue;
        const int o = p.queues[q].ops[head[q]];
        if (!ready(o)) continue;
        const std::vector<int> group = it.group(o);
        if (!std::all_of(group.begin(), group.end(), ready)) continue;
        const std::lock_guard lock(it.mutex());  // uncontended: the interpreters release it around waits
        it.run(group);
        for (int g : group) {
          done[static_cast<std::size_t>(g)] = 1;
          ++head[static_cast<std::size_t>(p.ops[static_cast<std::size_t>(g)].queue)];
        }
        for (int g : group) it.finished(g);
        left -= group.size();
        progress = true;
      }
      if (!progress) throw ScheduleViolation(stuck_message(p, head));
    }
  } catch (...) {
    // Queued work may still stamp times into res: let it drain before res goes.
    try {
      it.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is the one to report
    }
    throw;
  }
  return res;
}

WorkerPool::WorkerPool(std::size_t n) {
  threads_.reserve(n);
  try {
    for (std::size_t k = 0; k < n; ++k) threads_.emplace_back([this, k]() { loop(k); });
  } catch (...) {  // cannot start a thread: stop those that run
    {
      const std::lock_guard lk(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

WorkerPool::~WorkerPool() {
  {
    const std::lock_guard lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::run(const std::function<void(std::size_t)>& fn) {
  std::unique_lock lk(mu_);
  job_ = &fn;
  pending_ = threads_.size();
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void WorkerPool::loop(std::size_t k) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(std::size_t)>* job = nullptr;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(k);
    {
      const std::lock_guard lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

namespace {

// One concurrent step's scheduler. Its state, all under mu: done and claimed (a group's ops from when a worker takes
// it) per op, the position of each queue's next op, the groups in flight, and the first error. worker(q) runs queue
// q's ops; every state change notifies all workers.
class ConcurrentStep {
 public:
  ConcurrentStep(const core::Program& p, Interpreter& it)
      : p_(p),
        it_(it),
        extra_(it.extra_deps()),
        nq_(p.queues.size()),
        groups_(p.ops.size()),
        done_(p.ops.size(), 0),
        claimed_(p.ops.size(), 0),
        head_(nq_, 0) {
    for (std::size_t o = 0; o < p.ops.size(); ++o) groups_[o] = it.group(static_cast<int>(o));
  }

  // Runs queue q's ops in order until the queue is done, the step stopped, or it deadlocked.
  void worker(std::size_t q) {
    std::unique_lock lk(mu_);
    for (;;) {
      if (stop_ || head_[q] >= p_.queues[q].ops.size()) return;
      const int o = p_.queues[q].ops[head_[q]];
      if (!runnable(o)) {
        // Nothing in flight and nothing can start: the serial loop's deadlock (a group whose members wait for
        // each other's queues). Checked by whichever worker sees it; every state change notifies all.
        if (running_ == 0 && claimed_[static_cast<std::size_t>(o)] == 0 && !any_runnable()) {
          fail(std::make_exception_ptr(ScheduleViolation(stuck_message(p_, head_))));
          return;
        }
        cv_.wait(lk);
        continue;
      }
      if (!run_group(lk, groups_[static_cast<std::size_t>(o)])) return;
    }
  }

  // Memory: an op out of device memory waits while another group runs (not itself waiting) or can start.
  bool others_progressing(int waiting) {
    const std::lock_guard lk(mu_);
    return !stop_ && (running_ - 1 - waiting > 0 || any_runnable());
  }

  // Records the first error and stops every worker (call with mu held).
  void fail(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
    stop_ = true;
    cv_.notify_all();
  }
  std::mutex& mutex() { return mu_; }
  const std::exception_ptr& error() const { return error_; }

 private:
  bool ready(int o) const {
    return claimed_[static_cast<std::size_t>(o)] == 0 && heads_and_deps_done(p_, extra_, done_, head_, o);
  }
  bool runnable(int o) const {
    const auto& g = groups_[static_cast<std::size_t>(o)];
    return std::all_of(g.begin(), g.end(), [&](int x) { return ready(x); });
  }
  bool any_runnable() const {
    for (std::size_t q = 0; q < nq_; ++q)
      if (head_[q] < p_.queues[q].ops.size() && runnable(p_.queues[q].ops[head_[q]])) return true;
    return false;
  }
  // Claims group g, runs it with mu released (under the interpreter's lock) and marks it done; false after an error.
  bool run_group(std::unique_lock<std::mutex>& lk, const std::vector<int>& g) {
    for (int x : g) claimed_[static_cast<std::size_t>(x)] = 1;
    ++running_;
    lk.unlock();
    std::exception_ptr err;
    try {
      const std::lock_guard il(it_.mutex());
      it_.run(g);
      for (int x : g) it_.finished(x);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    --running_;
    if (err) {
      fail(err);
      return false;
    }
    for (int x : g) {
      const auto xu = static_cast<std::size_t>(x);
      done_[xu] = 1;
      ++head_[static_cast<std::size_t>(p_.ops[xu].queue)];
    }
    cv_.notify_all();
    return true;
  }

  const core::Program& p_;
  Interpreter& it_;
  const std::vector<std::vector<int>>& extra_;
  std::size_t nq_;
  std::vector<std::vector<int>> groups_;  // per op: it.group(op)
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_, claimed_;
  std::vector<std::size_t> head_;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

StepResult run_step_concurrent(const core::Program& p, Interpreter& it, WorkerPool* pool) {
  const std::size_t nops = p.ops.size(), nq = p.queues.size();
  ConcurrentStep step(p, it);
  StepResult res;
  res.begin.assign(nops, -1);
  res.end.assign(nops, -1);
  const TimesHook times(it, res);  // the interpreter stamps the ops' times, on their streams
  struct Hook {
    Interpreter& it;
    ~Hook() { it.others_progressing = nullptr; }
  } hook{it};
  it.others_progressing = [&](int waiting) { return step.others_progressing(waiting); };

  if (pool != nullptr && pool->size() == nq) {
    pool->run([&](std::size_t q) { step.worker(q); });
  } else {
    std::vector<std::thread> threads;
    threads.reserve(nq);
    try {
      for (std::size_t q = 0; q < nq; ++q) threads.emplace_back([&step, q] { step.worker(q); });
    } catch (...) {  // cannot start a thread: stop those that run
      {
        const std::lock_guard lk(step.mutex());
        step.fail(std::current_exception());
      }
    }
    for (auto& t : threads) t.join();
  }
  if (step.error()) {
    // Work a failed op enqueued may still be queued: let it drain before the caller frees anything.
    try {
      it.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is the one to report
    }
    std::rethrow_exception(step.error());
  }
  return res;
}

}  // namespace harmony::backend::detail
