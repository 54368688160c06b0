// The executor: the step loops over a Program's queues (one worker thread per queue, or serially on the host
// thread: an op runs when it heads its queue and its deps have ended; P2P pairs and collectives run together),
// the happens-before relation the read checks use, the per-queue streams and AdamW pools, and the interpreter of
// Harmony Programs (a tensor store per device and per host channel with the producing op). Baseline Programs
// are interpreted in baseline.cpp.
#include "backend/executor/executor.hpp"
#include "backend/model/describe.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "backend/bf16_convert.hpp"
#include "backend/executor/detail.hpp"
#include "backend/rank_sum.hpp"
#include "core/program/program_graph.hpp"
#include "core/program/task_graph.hpp"

namespace harmony::backend {

namespace detail {

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

StepResult run_step_concurrent(const core::Program& p, Interpreter& it, WorkerPool* pool) {
  const std::size_t nops = p.ops.size(), nq = p.queues.size();
  const auto& extra = it.extra_deps();
  std::vector<std::vector<int>> groups(nops);
  for (std::size_t o = 0; o < nops; ++o) groups[o] = it.group(static_cast<int>(o));
  StepResult res;
  res.begin.assign(nops, -1);
  res.end.assign(nops, -1);
  // Scheduler state, all under mu: done and claimed (a group's ops from when a worker takes it) per op, the
  // position of each queue's next op, the groups in flight, and the first error.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> done(nops, 0), claimed(nops, 0);
  std::vector<std::size_t> head(nq, 0);
  int running = 0;
  bool stop = false;
  std::exception_ptr error;
  const TimesHook times(it, res);  // the interpreter stamps the ops' times, on their streams
  auto ready = [&](int o) {
    return claimed[static_cast<std::size_t>(o)] == 0 && heads_and_deps_done(p, extra, done, head, o);
  };
  auto runnable = [&](int o) {
    const auto& g = groups[static_cast<std::size_t>(o)];
    return std::all_of(g.begin(), g.end(), ready);
  };
  auto any_runnable = [&] {
    for (std::size_t q = 0; q < nq; ++q)
      if (head[q] < p.queues[q].ops.size() && runnable(p.queues[q].ops[head[q]])) return true;
    return false;
  };
  auto fail = [&](std::exception_ptr e) {  // under mu
    if (!error) error = std::move(e);
    stop = true;
    cv.notify_all();
  };

  auto worker = [&](std::size_t q) {
    std::unique_lock lk(mu);
    for (;;) {
      if (stop || head[q] >= p.queues[q].ops.size()) return;
      const int o = p.queues[q].ops[head[q]];
      if (!runnable(o)) {
        // Nothing in flight and nothing can start: the serial loop's deadlock (a group whose members wait for
        // each other's queues). Checked by whichever worker sees it; every state change notifies all.
        if (running == 0 && claimed[static_cast<std::size_t>(o)] == 0 && !any_runnable()) {
          fail(std::make_exception_ptr(ScheduleViolation(stuck_message(p, head))));
          return;
        }
        cv.wait(lk);
        continue;
      }
      const std::vector<int>& g = groups[static_cast<std::size_t>(o)];
      for (int x : g) claimed[static_cast<std::size_t>(x)] = 1;
      ++running;
      lk.unlock();
      std::exception_ptr err;
      try {
        const std::lock_guard il(it.mutex());
        it.run(g);
        for (int x : g) it.finished(x);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      --running;
      if (err) {
        fail(err);
        return;
      }
      for (int x : g) {
        const auto xu = static_cast<std::size_t>(x);
        done[xu] = 1;
        ++head[static_cast<std::size_t>(p.ops[xu].queue)];
      }
      cv.notify_all();
    }
  };

  // Memory: an op out of device memory waits while another group runs (not itself waiting) or can start.
  struct Hook {
    Interpreter& it;
    ~Hook() { it.others_progressing = nullptr; }
  } hook{it};
  it.others_progressing = [&](int waiting) {
    const std::lock_guard lk(mu);
    return !stop && (running - 1 - waiting > 0 || any_runnable());
  };

  if (pool != nullptr && pool->size() == nq) {
    pool->run(worker);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(nq);
    try {
      for (std::size_t q = 0; q < nq; ++q) threads.emplace_back(worker, q);
    } catch (...) {  // cannot start a thread: stop those that run
      {
        const std::lock_guard lk(mu);
        fail(std::current_exception());
      }
    }
    for (auto& t : threads) t.join();
  }
  if (error) {
    // Work a failed op enqueued may still be queued: let it drain before the caller frees anything.
    try {
      it.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is the one to report
    }
    std::rethrow_exception(error);
  }
  return res;
}

QueueResources::QueueResources(const core::Program& program, const std::vector<Device*>& devices,
                               const ExecutorOptions& options)
    : p_(program), devs_(devices), comm_(options.communicator), run_ahead_(options.run_ahead) {
  if (options.run_ahead < 0)
    throw BackendError(fmt::format("executor: run_ahead {} is negative (0: unbounded)", options.run_ahead));
  if (options.staging_chunk_bytes < static_cast<Bytes>(sizeof(Bf16)))
    throw BackendError(fmt::format("executor: staging_chunk_bytes {} is less than one bf16 element (2 bytes)",
                                   options.staging_chunk_bytes));
  for (const core::OpQueue& q : p_.queues) {
    Device& d = *devs_.at(static_cast<std::size_t>(q.device));
    streams_.push_back(d.create_stream(core::stream_name(q.stream)));
    const bool updates = std::any_of(q.ops.begin(), q.ops.end(),
                                     [&](int o) { return core::host_update(p_.ops[static_cast<std::size_t>(o)]); });
    adamw_.push_back(updates ? std::make_unique<ParallelAdamW>(options.adamw_threads) : nullptr);
  }
  events_.reserve(p_.ops.size());
  recorded_.assign(p_.ops.size(), 0);
  for (const core::Op& op : p_.ops) events_.push_back(devs_.at(static_cast<std::size_t>(op.device))->create_event());
  for (std::size_t d = 0; d < devs_.size(); ++d) pending_.push_back(std::make_shared<std::atomic<int>>(0));
}

std::vector<int> QueueResources::preds(int op, const std::vector<std::vector<int>>& extra) const {
  const core::Op& o = p_.ops[static_cast<std::size_t>(op)];
  std::vector<int> r(o.deps.begin(), o.deps.end());
  if (static_cast<std::size_t>(op) < extra.size())
    r.insert(r.end(), extra[static_cast<std::size_t>(op)].begin(), extra[static_cast<std::size_t>(op)].end());
  if (o.queue_pos > 0)
    r.push_back(p_.queues[static_cast<std::size_t>(o.queue)].ops[static_cast<std::size_t>(o.queue_pos - 1)]);
  return r;
}

void QueueResources::order(int op, Stream& on, const std::vector<std::vector<int>>& extra) {
  std::vector<std::size_t> waited;  // queues already waited for: the latest of their preds covers the earlier
  std::vector<int> ps = preds(op, extra);
  std::sort(ps.begin(), ps.end(), [&](int a, int b) {
    return p_.ops[static_cast<std::size_t>(a)].queue_pos > p_.ops[static_cast<std::size_t>(b)].queue_pos;
  });
  for (const int d : ps) {
    if (&stream(d) == &on) continue;
    const std::size_t q = queue(d);
    if (std::find(waited.begin(), waited.end(), q) != waited.end()) continue;
    waited.push_back(q);
    on.wait(event(d));
  }
}

void QueueResources::host_wait(int op, const std::vector<std::vector<int>>& extra) {
  for (const int d : preds(op, extra)) event(d).synchronize();
}

void QueueResources::throttle(int op, const std::vector<std::vector<int>>& extra) {
  if (run_ahead_ <= 0) return;
  for (const int d : preds(op, extra)) {
    const core::Op& pd = p_.ops[static_cast<std::size_t>(d)];
    const int behind = pd.queue_pos - (run_ahead_ - 1);
    if (behind >= 0)
      event(p_.queues[static_cast<std::size_t>(pd.queue)].ops[static_cast<std::size_t>(behind)]).synchronize();
  }
}

void QueueResources::record_group(const std::vector<int>& group) {
  for (const int a : group) record(a);
  if (group.size() < 2) return;
  for (const int b : group) {
    for (const int a : group)
      if (a != b && &stream(a) != &stream(b)) stream(b).wait(event(a));
  }
  for (const int b : group) record(b);
}

bool QueueResources::device_sums(const std::vector<int>& group) const {
  if (comm_ == nullptr || static_cast<int>(group.size()) != comm_->size()) return false;
  for (std::size_t r = 0; r < group.size(); ++r)
    if (p_.ops[static_cast<std::size_t>(group[r])].device != static_cast<int>(r)) return false;
  return true;
}

void QueueResources::all_reduce(const std::vector<int>& group, const std::vector<void*>& bufs, std::int64_t count,
                                DType dtype) {
  // One thread issues every member's call, under the interpreter's lock: each rank sees the groups' all-reduces in
  // the same order, as the communicator matches them.
  for (std::size_t r = 0; r < group.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (dtype == DType::BF16) {
      comm_->all_reduce_sum_bf16(rank, stream(group[r]), static_cast<Bf16*>(bufs[r]), count);
    } else {
      comm_->all_reduce_sum(rank, stream(group[r]), static_cast<float*>(bufs[r]), count);
    }
  }
}

void QueueResources::release_after(Stream& s, int device, std::shared_ptr<void> held) {
  if (!held) return;
  // Freed (and counted done) when the closure runs, or when it is destroyed without running (a CUDA stream whose
  // context failed drops its host functions): frees_pending must not wait forever for it.
  struct Release {
    std::shared_ptr<void> held;
    std::shared_ptr<std::atomic<int>> n;
    Release(std::shared_ptr<void> h, std::shared_ptr<std::atomic<int>> c) : held(std::move(h)), n(std::move(c)) {
      ++*n;
    }
    ~Release() {
      held.reset();
      --*n;
    }
    Release(const Release&) = delete;
    Release& operator=(const Release&) = delete;
  };
  auto r = std::make_shared<Release>(std::move(held), pending_.at(static_cast<std::size_t>(device)));
  s.launch_host([r]() mutable { r.reset(); });
}

void QueueResources::release_after(int op, Buffer buffer) {
  if (!buffer) return;
  release_after(stream(op), p_.ops[static_cast<std::size_t>(op)].device, std::make_shared<Buffer>(std::move(buffer)));
}

void QueueResources::retire(int device, const std::vector<int>& users, std::shared_ptr<void> held) {
  if (!held) return;
  {
    const std::lock_guard lk(retired_mu_);
    retired_.push_back(Retired{device, users, std::move(held)});
  }
  collect();
}

void QueueResources::collect() {
  std::vector<std::shared_ptr<void>> done;  // destroyed outside the lock
  const std::lock_guard lk(retired_mu_);
  auto keep = std::remove_if(retired_.begin(), retired_.end(), [&](Retired& r) {
    for (const int u : r.users)  // a user that has not recorded yet (still issuing its work) is not done
      if (recorded_[static_cast<std::size_t>(u)] != step_ || !event(u).query()) return false;
    done.push_back(std::move(r.held));
    return true;
  });
  retired_.erase(keep, retired_.end());
}

void QueueResources::stamp(int op, const StepTimes* times, bool begin) {
  if (times == nullptr) return;
  core::TimePs* slot = (begin ? times->begin : times->end)->data() + op;
  stream(op).launch_host([slot, t0 = times->t0]() {
    *slot = static_cast<core::TimePs>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count() *
        core::kPsPerNs);
  });
}

bool QueueResources::frees_pending(const Device& device) {
  collect();
  for (std::size_t d = 0; d < devs_.size(); ++d) {
    if (devs_[d] != &device) continue;
    if (pending_[d]->load() > 0) return true;
    const std::lock_guard lk(retired_mu_);
    for (const Retired& r : retired_) {
      // one whose users have all recorded will be freed without the host (an op still issuing its work, the
      // caller's own, would never be: no entry has one, and waiting for it would not end)
      if (r.device == static_cast<int>(d) && std::all_of(r.users.begin(), r.users.end(), [&](int u) {
            return recorded_[static_cast<std::size_t>(u)] == step_;
          }))
        return true;
    }
  }
  return false;
}

std::size_t QueueResources::queue(int op) const {
  return static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(op)].queue);
}

ParallelAdamW& QueueResources::adamw(int op) {
  auto& a = adamw_[queue(op)];
  if (!a) a = std::make_unique<ParallelAdamW>(1);  // an Update outside the queues scanned: cannot happen
  return *a;
}

std::shared_ptr<void> QueueResources::range(int op) {
  Device& d = *devs_[static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(op)].device)];
  if (!d.names_ranges()) return nullptr;
  return d.trace_range(p_.op_label(op));
}

void QueueResources::synchronize() {
  std::exception_ptr first;
  for (auto& s : streams_) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  std::vector<Retired> all;  // every stream has run: nothing retired is still used
  {
    const std::lock_guard lk(retired_mu_);
    all.swap(retired_);
  }
  all.clear();
  if (first) std::rethrow_exception(first);
}

// --- bf16 staging (Interpreter::stage_up / stage_down) ---

Interpreter::StagingSlot& Interpreter::staging_slot(std::size_t queue, Device& device, Bytes bytes) {
  StagingRing& ring = staging_[queue];
  StagingSlot& slot = ring.slots[static_cast<std::size_t>(ring.next)];
  ring.next ^= 1;
  if (slot.done) unlocked([&] { slot.done->synchronize(); });  // the copy that used it last has run
  if (slot.buf.bytes() < bytes) slot.buf = device.alloc_host(bytes, fmt::format("bf16 staging of queue {}", queue));
  if (!slot.done) slot.done = device.create_event();
  return slot;
}

namespace {

std::int64_t total_size(auto spans) {
  std::int64_t n = 0;
  for (const auto& sp : spans) n += static_cast<std::int64_t>(sp.size());
  return n;
}

// fn(span_index, offset in that span, offset in the concatenation, count) over the pieces of the concatenated
// spans that [begin, begin + n) covers, in order.
template <class Spans, class F>
void for_pieces(const Spans& spans, std::int64_t begin, std::int64_t n, F&& fn) {
  std::int64_t base = 0;
  for (std::size_t k = 0; k < spans.size() && n > 0; ++k) {
    const auto size = static_cast<std::int64_t>(spans[k].size());
    if (begin < base + size) {
      const std::int64_t off = begin - base, take = std::min(n, size - off);
      fn(k, off, begin, take);
      begin += take;
      n -= take;
    }
    base += size;
  }
}

std::int64_t chunk_elems(Bytes chunk_bytes) {
  return std::max<std::int64_t>(1, chunk_bytes / static_cast<Bytes>(sizeof(Bf16)));
}

}  // namespace

Bytes Interpreter::staging_bytes(const core::Program& program, const ExecutorOptions& options) {
  if (options.dtype != DType::BF16) return 0;
  std::map<int, Bytes> largest;  // per queue
  for (const core::Op& op : program.ops) {
    if (op.kind != core::OpKind::WB && op.kind != core::OpKind::dWB && op.kind != core::OpKind::ARD &&
        op.kind != core::OpKind::RS)
      continue;
    Bytes& b = largest[op.queue];
    b = std::max(b, op.bytes);
  }
  const Bytes chunk = chunk_elems(options.staging_chunk_bytes) * static_cast<Bytes>(sizeof(Bf16));
  Bytes total = 0;
  for (const auto& [queue, bytes] : largest) total += 2 * std::min(chunk, bytes);
  return total;
}

void Interpreter::stage_up(std::size_t queue, Device& device, Stream& stream, void* dst,
                           std::span<const std::span<const float>> src) {
  const std::int64_t total = total_size(src), chunk = chunk_elems(staging_chunk_bytes);
  for (std::int64_t b = 0; b < total; b += chunk) {
    const std::int64_t n = std::min(chunk, total - b);
    StagingSlot& slot = staging_slot(queue, device, n * static_cast<Bytes>(sizeof(Bf16)));
    Bf16* out = slot.buf.as<Bf16>();
    // The rounding runs with mutex() released: it touches only this queue's slot and the op's own source, so the
    // other queues' workers issue their work meanwhile (the compute queue above all).
    unlocked([&] {
      for_pieces(src, b, n, [&](std::size_t k, std::int64_t off, std::int64_t at, std::int64_t count) {
        const float* in = src[k].data() + off;
        round_to_bf16(in, out + (at - b), count);  // on up to 16 threads (bf16_convert.hpp)
      });
    });
    device.copy_h2d(stream, static_cast<Bf16*>(dst) + b, out, n * static_cast<Bytes>(sizeof(Bf16)));
    stream.record(*slot.done);
  }
}

void Interpreter::stage_down(std::size_t queue, Device& device, Stream& stream, std::span<const std::span<float>> dst,
                             const void* src) {
  const std::int64_t total = total_size(dst), chunk = chunk_elems(staging_chunk_bytes);
  const auto* from = static_cast<const Bf16*>(src);
  const auto issue = [&](std::int64_t b) -> StagingSlot* {
    if (b >= total) return nullptr;
    const std::int64_t n = std::min(chunk, total - b);
    StagingSlot& slot = staging_slot(queue, device, n * static_cast<Bytes>(sizeof(Bf16)));
    device.copy_d2h(stream, slot.buf.data(), from + b, n * static_cast<Bytes>(sizeof(Bf16)));
    stream.record(*slot.done);
    return &slot;
  };
  StagingSlot* cur = issue(0);
  for (std::int64_t b = 0; b < total; b += chunk) {
    StagingSlot* next = issue(b + chunk);  // the link brings the next chunk while the host widens this one
    // The wait and the widening run with mutex() released (only this queue's slot and the op's own destination are
    // touched), so the other queues' workers issue their work meanwhile.
    unlocked([&] {
      cur->done->synchronize();
      const Bf16* in = cur->buf.as<Bf16>();
      for_pieces(dst, b, std::min(chunk, total - b),
                 [&](std::size_t k, std::int64_t off, std::int64_t at, std::int64_t count) {
                   widen_from_bf16(in + (at - b), dst[k].data() + off, count);  // on up to 16 threads
                 });
    });
    cur = next;
  }
}

}  // namespace detail

namespace {

using core::OpKind;

// Device tensors: activation at the input of layer l (Act), stash (Stash), gradient of the input of layer l
// (Grad), recompute inputs/acts per layer (RecX, RecAct), a task's weights (W) and weight gradients (DW).
enum class DK : std::uint8_t { Act, Stash, Grad, RecX, RecAct, W, DW };
const char* dk_name(DK k) {
  constexpr const char* n[] = {"Act", "Stash", "dX", "RecX", "RecAct", "W", "dW"};
  return n[static_cast<int>(k)];
}
// Host channels (per boundary layer, the whole minibatch, per-sample producer).
enum class HC : std::uint8_t { YSwap, YMsg, Stash, StashMsg, DXSwap };
const char* hc_name(HC k) {
  constexpr const char* n[] = {"host Y", "host Y msg", "host stash", "host stash msg", "host dX"};
  return n[static_cast<int>(k)];
}

struct DevTensor {
  Buffer buf;
  int producer = -1;
  int owner_task = -1;
  std::vector<int> users;  // the ops whose device work used it this step: freed after their events (retire)
};
struct HostChan {
  HostBuffer data;            // the whole minibatch; kept across steps (pinned where the devices pin)
  std::vector<int> producer;  // per sample, this step
};
using DevKey = std::tuple<DK, int, int, int>;  // kind, layer (or task), first sample, samples

class HarmonyInterpreter final : public detail::Interpreter {
 public:
  const core::Program& p;
  std::vector<Device*> devs;
  HostState& st;
  ExecutorOptions opt;
  const Gpt2& m;
  int B = 0, T = 0;
  DType dt = DType::F32;  // device storage; bf16: the host rounds weights on their way up, widens gradients back
  Bytes es = 4;           // bytes per device element
  detail::QueueResources qr;
  std::vector<std::vector<int>> extra;  // the tie's edges (tie_edges)
  detail::Ancestry anc;
  // Harmony-DP: every replica's Update of a pack sees the same all-reduced gradient, and the shared master is
  // updated once, by the lowest device's Update (update_owner, per layer range); the other replicas' dWBs bring
  // their (equal) gradients into scratch memory instead of HostState::grads, which that update reads.
  std::map<std::pair<int, int>, int> update_owner;
  std::vector<int> rank_offset;  // first sample of each rank's share
  std::vector<std::map<DevKey, DevTensor>> dev;
  std::map<std::pair<HC, int>, HostChan> host;
  std::vector<float> losses;
  std::span<const std::int32_t> in, tgt;

  HarmonyInterpreter(const core::Program& prog, std::vector<Device*> d, HostState& s, const ExecutorOptions& o)
      : p(prog), devs(std::move(d)), st(s), opt(o), m(s.model()), qr(prog, devs, o) {
    B = p.graph.plan.minibatch;
    T = opt.seq_len;
    dt = opt.dtype;
    es = dtype_bytes(dt);
    staging_chunk_bytes = opt.staging_chunk_bytes;
    if (dt == DType::BF16)
      for (Device* dev_ptr : devs) require_bf16(*dev_ptr, "executor");
    if (p.graph.plan.kind->data_parallel && static_cast<int>(p.devices.size()) != p.num_devices())
      throw BackendError(fmt::format("executor: {} Program lowered for GPU 0 only (set dp_first_gpu_only = false)",
                                     p.graph.plan.kind.name()));
    for (std::size_t o = 0; o < p.ops.size(); ++o) {
      const core::Op& op = p.ops[o];
      if (op.kind != OpKind::Update) continue;
      const std::pair<int, int> r{op.layers.first, op.layers.last};
      auto [it, fresh] = update_owner.emplace(r, op.device);
      if (!fresh) it->second = std::min(it->second, op.device);
    }
    for (std::size_t o = 0; o < p.ops.size(); ++o) {  // the owner's dWB is the one that fills HostState::grads
      const core::Op& op = p.ops[o];
      if (op.kind != OpKind::Update || !owns_update(op)) continue;
      const bool local = std::any_of(p.ops.begin(), p.ops.end(), [&](const core::Op& g) {
        return g.kind == OpKind::dWB && g.device == op.device && g.layers == op.layers;
      });
      if (!local)
        throw BackendError(
            fmt::format("executor: op {} updates a pack whose dWB is on another GPU", label(static_cast<int>(o))));
    }
    tie_edges();
    anc = detail::Ancestry(p, extra);
    dev.resize(devs.size());
    const bool dp = p.graph.plan.kind->data_parallel;
    int off = 0;
    for (int r = 0; r < p.num_devices(); ++r) {
      rank_offset.push_back(dp ? off : 0);
      for (int u : p.graph.ubatch_bwd[static_cast<std::size_t>(r)]) off += u;
    }
    for (std::size_t o = 0; o < p.ops.size(); ++o)
      for (const auto& k : reads_of(static_cast<int>(o))) ++readers_total[k];
  }

  bool happens_before(int a, int b) const { return anc.before(a, b); }

  // The tie: the Update of the pack holding layer 0 also reads the head's lm_head gradient (HostState::update), a
  // dependency core::Model cannot express. The serial v1 loop happened to run the head's dWB first; here the
  // owning Update waits for the owner's dWBs of the head's pack (an executor-added edge, also in `anc`).
  void tie_edges() {
    extra.assign(p.ops.size(), {});
    const int head = m.head_layer();
    if (head == 0) return;
    for (std::size_t u = 0; u < p.ops.size(); ++u) {
      const core::Op& up = p.ops[u];
      if (up.kind != OpKind::Update || up.layers.first != 0 || !owns_update(up)) continue;
      for (std::size_t g = 0; g < p.ops.size(); ++g) {
        const core::Op& gp = p.ops[g];
        if (gp.kind == OpKind::dWB && gp.layers.first <= head && head <= gp.layers.last && owns_update(gp))
          extra[u].push_back(static_cast<int>(g));
      }
    }
  }
  bool owns_update(const core::Op& op) const {
    auto it = update_owner.find({op.layers.first, op.layers.last});
    return it == update_owner.end() || it->second == op.device;
  }

  // The host channels op o reads or writes (layer of the boundary).
  std::vector<std::pair<HC, int>> chans_of(int o) const {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const int lf = op.layers.first, ll = op.layers.last;
    switch (op.kind) {
      case OpKind::X:
        if (t.has_data) return {};
        if (t.in_x.medium == core::Medium::Msg) return {{HC::YMsg, lf}};
        if (t.in_x.medium == core::Medium::Swap) return {{HC::YSwap, lf}};
        return {};
      case OpKind::sX:
        return {{t.type == core::TaskType::Fwd ? HC::Stash : HC::StashMsg, lf}};
      case OpKind::MSGsX:
        return {{HC::Stash, lf}, {HC::StashMsg, lf}};
      case OpKind::MSGY:
        return {{HC::YSwap, ll + 1}, {HC::YMsg, ll + 1}};
      case OpKind::Y:
        return op.peer >= 0 ? std::vector<std::pair<HC, int>>{} : std::vector<std::pair<HC, int>>{{HC::YSwap, ll + 1}};
      case OpKind::dX:
        return op.peer >= 0 ? std::vector<std::pair<HC, int>>{} : std::vector<std::pair<HC, int>>{{HC::DXSwap, lf}};
      case OpKind::dY:
        return op.peer >= 0 ? std::vector<std::pair<HC, int>>{} : std::vector<std::pair<HC, int>>{{HC::DXSwap, ll + 1}};
      default:
        return {};
    }
  }
  std::set<std::pair<HC, int>> all_chans() const {
    std::set<std::pair<HC, int>> r;
    for (std::size_t o = 0; o < p.ops.size(); ++o)
      for (const auto& c : chans_of(static_cast<int>(o))) r.insert(c);
    return r;
  }
  Bytes chan_bytes(int l) const { return Bytes(B) * per_sample(l); }
  Bytes host_bytes() const override {
    Bytes total = 0;
    for (const auto& [c, l] : all_chans()) total += chan_bytes(l);
    return total;
  }
  void allocate_host() override {
    for (const auto& [c, l] : all_chans()) {
      HostChan& h = host[{c, l}];
      h.data = D(0).alloc_host(chan_bytes(l), fmt::format("{} {}", hc_name(c), l));
      h.producer.assign(static_cast<std::size_t>(B), -1);
    }
  }
  std::string label(int op) const { return detail::op_name(p, op); }

  // Samples [first, first + n) of an op's microbatch.
  std::pair<int, int> samples(int o) const {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const bool msg = op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY;
    const std::vector<int>& list = msg ? p.graph.ubatch_bwd[static_cast<std::size_t>(t.rank)] : t.ubatch_sizes;
    int s = rank_offset[static_cast<std::size_t>(t.rank)];
    for (int i = 0; i < op.ui; ++i) s += list[static_cast<std::size_t>(i)];
    return {s, list[static_cast<std::size_t>(op.ui)]};
  }
  Bytes per_sample(int l) const { return m.input_bytes(l, 1, T, dt); }

  // ---- device tensors ----
  std::string dname(int d, const DevKey& k) const {
    return fmt::format("{} {} {} samples [{}, {})", devs[static_cast<std::size_t>(d)]->name(), dk_name(std::get<0>(k)),
                       std::get<1>(k), std::get<2>(k), std::get<2>(k) + std::get<3>(k));
  }
  DevTensor& read(int o, int d, const DevKey& k) {
    auto it = dev[static_cast<std::size_t>(d)].find(k);
    if (it == dev[static_cast<std::size_t>(d)].end())
      throw ScheduleViolation(
          fmt::format("executor: op {} reads {}, which no op has produced yet", label(o), dname(d, k)));
    if (!happens_before(it->second.producer, o))
      throw ScheduleViolation(fmt::format("executor: op {} reads {}, produced by op {}, on which it does not depend",
                                          label(o), dname(d, k), label(it->second.producer)));
    version_readers[{d, k}].push_back(o);
    it->second.users.push_back(o);
    return it->second;
  }
  // A new version of k replaces the last one: every op that read the last one must come before o. Otherwise the
  // reader may have read a stale version (the serial loop happened to order them; with concurrent queues it may
  // still be reading the buffer o frees).
  DevTensor& make(int o, int d, const DevKey& k, Bytes bytes) {
    auto& map = dev[static_cast<std::size_t>(d)];
    auto vr = version_readers.find({d, k});
    if (vr != version_readers.end()) {
      for (int r : vr->second)
        if (r != o && !happens_before(r, o))
          throw ScheduleViolation(
              fmt::format("executor: op {} reads {}, which op {} replaces, on which it does not depend: neither "
                          "depends on the other",
                          label(r), dname(d, k), label(o)));
      vr->second.clear();
    }
    if (auto old = map.find(k); old != map.end()) drop(d, map, old);
    DevTensor t;
    t.buf = alloc_or_wait(*devs[static_cast<std::size_t>(d)], bytes, dname(d, k));
    t.producer = o;
    t.owner_task = p.ops[static_cast<std::size_t>(o)].task;
    t.users.push_back(o);
    return map[k] = std::move(t);
  }
  // Erases a device tensor; its memory is freed once the work of every op that used it has run (retire).
  std::map<DevKey, DevTensor>::iterator drop(int d, std::map<DevKey, DevTensor>& map,
                                             std::map<DevKey, DevTensor>::iterator it) {
    const std::vector<int> users = std::move(it->second.users);
    qr.retire(d, users, std::make_shared<Buffer>(std::move(it->second.buf)));
    return map.erase(it);
  }

  // ---- host channels ----
  HostChan& chan(HC c, int l) {
    HostChan& h = host[{c, l}];
    if (h.data.bytes() == 0) {  // a channel allocate_host did not foresee
      h.data = D(0).alloc_host(chan_bytes(l), fmt::format("{} {}", hc_name(c), l));
      h.producer.assign(static_cast<std::size_t>(B), -1);
    }
    return h;
  }
  std::byte* host_read(int o, HC c, int l, int s0, int n) {
    HostChan& h = chan(c, l);
    for (int s = s0; s < s0 + n; ++s) {
      const int pr = h.producer[static_cast<std::size_t>(s)];
      if (pr < 0)
        throw ScheduleViolation(fmt::format("executor: op {} reads {} {} sample {}, which no op has produced yet",
                                            label(o), hc_name(c), l, s));
      if (!happens_before(pr, o))
        throw ScheduleViolation(
            fmt::format("executor: op {} reads {} {} sample {}, produced by op {}, on which it does not depend",
                        label(o), hc_name(c), l, s, label(pr)));
    }
    return h.data.as<std::byte>() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(l));
  }
  std::byte* host_write(int o, HC c, int l, int s0, int n) {
    HostChan& h = chan(c, l);
    for (int s = s0; s < s0 + n; ++s) h.producer[static_cast<std::size_t>(s)] = o;
    return h.data.as<std::byte>() + static_cast<std::size_t>(s0) * static_cast<std::size_t>(per_sample(l));
  }

  Device& D(int d) { return *devs[static_cast<std::size_t>(d)]; }
  Stream& S(int o) { return qr.stream(o); }  // the stream of op o's queue
  // Waits for op o's stream with the interpreter's lock released, so other queues' ops proceed meanwhile: only
  // where the host reads what o's work brought down (a bf16 gradient to widen, the ARD's host sum).
  void sync(int o) { wait_unlocked(S(o)); }
  // A temporary of op o's work, freed when o's stream has run past it.
  void release_after(int o, Buffer& b) { qr.release_after(o, std::move(b)); }
  // Host memory an async copy of op o reads (a bf16 staging buffer, the ARD's sum): kept until o's stream has run
  // past the copy.
  void keep_until_done(int o, std::shared_ptr<void> held) {
    qr.release_after(S(o), p.ops[static_cast<std::size_t>(o)].device, std::move(held));
  }
  bool frees_pending(const Device& device) override { return qr.frees_pending(device); }

  std::int64_t w_offset(const core::LayerRange& r, int l) const {
    std::int64_t o = 0;
    for (int k = r.first; k < l; ++k) o += m.param_floats(k);
    return o;
  }
  std::int64_t w_floats(const core::LayerRange& r) const { return w_offset(r, r.last + 1); }

  // Forward of layers [a, b] of the task's weights over n samples from x; keeps every input and act when
  // `keep` (REC), else writes the result to out. Returns nothing; losses of the head go to `losses`.
  void forward_range(int o, int d, const core::LayerRange& wr, const DevTensor& W, int a, int b, int s0, int n,
                     const void* x0, const DevKey* out_key, bool keep) {
    if (dt == DType::BF16) {
      forward_range_as<Bf16>(o, d, wr, W, a, b, s0, n, x0, out_key, keep);
    } else {
      forward_range_as<float>(o, d, wr, W, a, b, s0, n, x0, out_key, keep);
    }
  }
  template <class E>
  void forward_range_as(int o, int d, const core::LayerRange& wr, const DevTensor& W, int a, int b, int s0, int n,
                        const void* x0, const DevKey* out_key, bool keep) {
    BasicDeviceOps<E> ops(D(d), S(o));
    const void* x = x0;
    Buffer tmp_y, tmp_act, prev, targets;
    for (int l = a; l <= b; ++l) {
      LayerArgs<E> args;
      args.B = n;
      args.T = T;
      args.w = W.buf.as<E>() + w_offset(wr, l);
      if (l == 0) {
        args.tokens = static_cast<const std::int32_t*>(x);
      } else {
        args.x = static_cast<const E*>(x);
      }
      if (m.kind(l) == LayerKind::Head) {
        release_after(o, targets);
        targets = alloc_or_wait(D(d), Bytes(n) * T * 4, "targets");
        D(d).copy_h2d(S(o), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
        args.targets = targets.as<std::int32_t>();
      }
      Buffer y;
      DevTensor* yt = nullptr;
      if (l == b && !keep) {
        yt = &make(o, d, *out_key, m.output_bytes(l, n, T, dt));
        args.y = yt->buf.as<E>();
      } else {
        y = alloc_or_wait(D(d), m.output_bytes(l, n, T, dt), "y");
        args.y = y.as<E>();
      }
      E* act = nullptr;
      if (keep) {
        act = make(o, d, DevKey{DK::RecAct, l, s0, n}, m.act_floats(l, n, T) * es).buf.as<E>();
      } else {
        Buffer next_act = alloc_or_wait(D(d), m.act_floats(l, n, T) * es, "act");
        release_after(o, tmp_act);  // the previous layer's, after its kernels
        tmp_act = std::move(next_act);
        act = tmp_act.as<E>();
      }
      args.act = act;
      m.forward(ops, l, args);
      if (m.kind(l) == LayerKind::Head) {  // read by end_step, after every stream has run
        D(d).copy_d2h(S(o), losses.data() + static_cast<std::size_t>(s0) * T, args.y, Bytes(n) * T * kF);
      }
      if (l < b) {
        if (keep) {
          DevTensor& nx = make(o, d, DevKey{DK::RecX, l + 1, s0, n}, m.output_bytes(l, n, T, dt));
          D(d).copy_d2d(S(o), nx.buf.data(), y.data(), m.output_bytes(l, n, T, dt));
          x = nx.buf.data();
        } else {
          release_after(o, prev);
          prev = std::move(y);
          x = prev.data();
        }
      }
      release_after(o, y);
    }
    // No host wait: the temporaries are freed after the kernels that use them, in stream order.
    for (Buffer* b : {&tmp_y, &tmp_act, &prev, &targets}) release_after(o, *b);
  }

  // Recompute inputs were kept by REC; the backward of the task's layers [lf, ll] over one microbatch, in the
  // device dtype S (dW accumulated across microbatches in S).
  template <class E>
  void run_bwd(int o, const core::Op& op, const core::Task& t) {
    const int d = op.device;
    const int lf = op.layers.first, ll = op.layers.last;
    const auto [s0, n] = samples(o);
    const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
    const DevTensor& x0 = read(o, d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n});
    const DevKey dwk{DK::DW, op.task, 0, 0};
    if (dev[static_cast<std::size_t>(d)].count(dwk) == 0) {
      DevTensor& g = make(o, d, dwk, w_floats(t.layers) * es);
      D(d).fill_zero(S(o), g.buf.data(), g.buf.bytes());
    } else {
      read(o, d, dwk).producer = o;
    }
    E* dw = dev[static_cast<std::size_t>(d)][dwk].buf.as<E>();
    const E* dy = t.has_criterion ? nullptr : read(o, d, DevKey{DK::Grad, ll + 1, s0, n}).buf.as<E>();
    std::int64_t scratch = 0;
    for (int l = lf; l <= ll; ++l) scratch = std::max(scratch, m.scratch_floats(l, n, T));
    Buffer scr = alloc_or_wait(D(d), scratch * es, "scratch"), targets, g_a, g_b;
    const Bytes gb = Bytes(n) * T * m.config().n_embd * es;
    g_a = alloc_or_wait(D(d), gb, "dx a");
    g_b = alloc_or_wait(D(d), gb, "dx b");
    if (t.has_criterion) {
      targets = alloc_or_wait(D(d), Bytes(n) * T * 4, "targets");
      D(d).copy_h2d(S(o), targets.data(), tgt.data() + static_cast<std::size_t>(s0) * T, Bytes(n) * T * 4);
    }
    BasicDeviceOps<E> ops(D(d), S(o));
    E* spare = g_a.as<E>();
    E* other = g_b.as<E>();
    for (int l = ll; l >= lf; --l) {
      LayerArgs<E> a;
      a.B = n;
      a.T = T;
      a.w = W.buf.as<E>() + w_offset(t.layers, l);
      a.dw = dw + w_offset(t.layers, l);
      const void* x = l == lf ? x0.buf.data() : read(o, d, DevKey{DK::RecX, l, s0, n}).buf.data();
      if (l == 0) {
        a.tokens = static_cast<const std::int32_t*>(x);
      } else {
        a.x = static_cast<const E*>(x);
      }
      a.targets = targets.as<std::int32_t>();
      a.act = read(o, d, DevKey{DK::RecAct, l, s0, n}).buf.as<E>();
      a.dy = dy;
      a.scratch = scr.as<E>();
      a.loss_scale = 1.0f / static_cast<float>(static_cast<std::size_t>(B) * static_cast<std::size_t>(T));
      E* dx = nullptr;
      if (l > 0) dx = l == lf ? make(o, d, DevKey{DK::Grad, lf, s0, n}, gb).buf.as<E>() : spare;
      a.dx = dx;
      m.backward(ops, l, a);
      dy = dx;
      std::swap(spare, other);
    }
    for (Buffer* b : {&scr, &targets, &g_a, &g_b}) release_after(o, *b);  // after the kernels, in stream order
  }

  void run_op(int o) {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const int d = op.device;
    const int lf = op.layers.first, ll = op.layers.last;
    switch (op.kind) {
      case OpKind::WB: {
        DevTensor& w = make(o, d, DevKey{DK::W, op.task, 0, 0}, w_floats(op.layers) * es);
        if (dt == DType::BF16) {  // the fp32 masters rounded to nearest even on the host, staged up
          std::vector<std::span<const float>> src;
          for (int l = lf; l <= ll; ++l) src.push_back(st.weights(l));
          stage_up(qr.queue(o), D(d), S(o), w.buf.data(), src);
          return;
        }
        // The host masters are read when the copy runs: the Updates that overwrite them wait for this op's event
        // (they follow it, host_wait).
        for (int l = lf; l <= ll; ++l)
          D(d).copy_h2d(S(o), w.buf.as<float>() + w_offset(op.layers, l), st.weights(l).data(), m.param_floats(l) * kF);
        return;
      }
      case OpKind::X: {
        const auto [s0, n] = samples(o);
        const Bytes b = Bytes(n) * per_sample(lf);
        if (t.has_data) {
          DevTensor& x = make(o, d, DevKey{DK::Act, 0, s0, n}, b);
          D(d).copy_h2d(S(o), x.buf.data(), in.data() + static_cast<std::size_t>(s0) * T, b);
        } else if (t.in_x.medium == core::Medium::Msg || t.in_x.medium == core::Medium::Swap) {
          const HC c = t.in_x.medium == core::Medium::Msg ? HC::YMsg : HC::YSwap;
          const std::byte* src = host_read(o, c, lf, s0, n);
          DevTensor& x = make(o, d, DevKey{DK::Act, lf, s0, n}, b);
          D(d).copy_h2d(S(o), x.buf.data(), src, b);
        } else {
          throw BackendError(fmt::format("executor: op {}: unsupported input medium", label(o)));
        }
        return;
      }
      case OpKind::sX: {
        const auto [s0, n] = samples(o);
        const Bytes b = Bytes(n) * per_sample(lf);
        if (t.type == core::TaskType::Fwd) {  // stash out
          const DevTensor& x = read(o, d, DevKey{DK::Act, lf, s0, n});
          D(d).copy_d2h(S(o), host_write(o, HC::Stash, lf, s0, n), x.buf.data(), b);
        } else {  // stash in
          const std::byte* src = host_read(o, HC::StashMsg, lf, s0, n);
          DevTensor& x = make(o, d, DevKey{DK::Stash, lf, s0, n}, b);
          D(d).copy_h2d(S(o), x.buf.data(), src, b);
        }
        return;
      }
      case OpKind::MSGsX:
      case OpKind::MSGY: {
        const auto [s0, n] = samples(o);
        const int l = op.kind == OpKind::MSGsX ? lf : ll + 1;
        const HC from = op.kind == OpKind::MSGsX ? HC::Stash : HC::YSwap;
        const HC to = op.kind == OpKind::MSGsX ? HC::StashMsg : HC::YMsg;
        const std::byte* src = host_read(o, from, l, s0, n);
        std::memcpy(host_write(o, to, l, s0, n), src, static_cast<std::size_t>(Bytes(n) * per_sample(l)));
        return;
      }
      case OpKind::Y: {  // swap out (P2P runs as a pair)
        const auto [s0, n] = samples(o);
        const DevTensor& y = read(o, d, DevKey{DK::Act, ll + 1, s0, n});
        D(d).copy_d2h(S(o), host_write(o, HC::YSwap, ll + 1, s0, n), y.buf.data(), Bytes(n) * per_sample(ll + 1));
        return;
      }
      case OpKind::dX: {
        const auto [s0, n] = samples(o);
        const DevTensor& g = read(o, d, DevKey{DK::Grad, lf, s0, n});
        D(d).copy_d2h(S(o), host_write(o, HC::DXSwap, lf, s0, n), g.buf.data(), Bytes(n) * per_sample(lf));
        return;
      }
      case OpKind::dY: {
        const auto [s0, n] = samples(o);
        const std::byte* src = host_read(o, HC::DXSwap, ll + 1, s0, n);
        DevTensor& g = make(o, d, DevKey{DK::Grad, ll + 1, s0, n}, Bytes(n) * per_sample(ll + 1));
        D(d).copy_h2d(S(o), g.buf.data(), src, Bytes(n) * per_sample(ll + 1));
        return;
      }
      case OpKind::FWD: {
        const auto [s0, n] = samples(o);
        const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
        const DevTensor& x = read(o, d, DevKey{DK::Act, lf, s0, n});
        const DevKey out{DK::Act, ll + 1, s0, n};
        forward_range(o, d, t.layers, W, lf, ll, s0, n, x.buf.data(), &out, false);
        return;
      }
      case OpKind::REC: {
        const auto [s0, n] = samples(o);
        const DevTensor& W = read(o, d, DevKey{DK::W, op.task, 0, 0});
        const DevTensor& x = read(o, d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n});
        forward_range(o, d, t.layers, W, lf, ll, s0, n, x.buf.data(), nullptr, true);
        return;
      }
      case OpKind::BWD: {
        if (dt == DType::BF16) {
          run_bwd<Bf16>(o, op, t);
        } else {
          run_bwd<float>(o, op, t);
        }
        return;
      }
      case OpKind::ARD:
        return;  // run as a group (run_ard)
      case OpKind::dWB: {
        const DevTensor& g = read(o, d, DevKey{DK::DW, op.task, 0, 0});
        std::vector<float>* scratch = nullptr;
        if (!owns_update(op)) {
          scratch = &dwb_scratch[o];
          scratch->resize(static_cast<std::size_t>(w_floats(op.layers)));
        }
        if (dt == DType::BF16) {  // the pack's bf16 gradients staged down, widened exactly on the host
          std::vector<std::span<float>> dst;
          for (int l = lf; l <= ll; ++l)
            dst.push_back(scratch != nullptr ? std::span<float>(scratch->data() + w_offset(op.layers, l),
                                                                static_cast<std::size_t>(m.param_floats(l)))
                                             : st.grads(l));
          stage_down(qr.queue(o), D(d), S(o), dst, g.buf.data());
        } else {
          for (int l = lf; l <= ll; ++l) {
            float* dst = scratch != nullptr ? scratch->data() + w_offset(op.layers, l) : st.grads(l).data();
            D(d).copy_d2h(S(o), dst, g.buf.as<float>() + w_offset(op.layers, l), m.param_floats(l) * kF);
          }
          // no wait: the Update that reads the host gradients waits for this op's event (host_wait)
        }
        for (int l = lf; l <= ll; ++l) grad_producer[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)] = o;
        return;
      }
      case OpKind::Update: {
        for (int l = lf; l <= ll; ++l) {
          const int g = grad_producer[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)];
          if (g < 0 || !happens_before(g, o))
            throw ScheduleViolation(
                fmt::format("executor: op {} updates layer {} before its gradients reach the host", label(o), l));
        }
        // Harmony-DP: every replica's Update sees the same all-reduced gradients; the shared master copy is
        // updated once per pack, by the owner. AdamW runs unlocked: what it touches (the pack's host weights,
        // gradients and moments; for layer 0 also the head's lm_head gradient and weight) no other op touches
        // until the next step — the deps order the pack's WBs and dWBs before it, tie_edges the head's dWB.
        if (owns_update(op)) unlocked([&] { note_nonfinite(update_layers(st, opt.adamw, lf, ll, qr.adamw(o))); });
        return;
      }
      case OpKind::DEL: {
        auto& map = dev[static_cast<std::size_t>(d)];
        for (auto it = map.begin(); it != map.end();) {
          const DK k = std::get<0>(it->first);
          if (it->second.owner_task == op.task && (k == DK::W || k == DK::DW)) {
            it = drop(d, map, it);
          } else {
            ++it;
          }
        }
        return;
      }
      default:
        throw BackendError(
            fmt::format("executor: op {}: kind {} not supported", label(o), core::op_kind_name(op.kind)));
    }
  }

  // P2P pair: the send side's device tensor is copied into the receive side's device.
  void run_pair(int send, int recv) {
    const core::Op& so = p.ops[static_cast<std::size_t>(send)];
    const core::Op& ro = p.ops[static_cast<std::size_t>(recv)];
    const auto [s0, n] = samples(send);
    const auto [r0, rn] = samples(recv);
    const bool fwd = so.kind == OpKind::Y;
    const int l = fwd ? so.layers.last + 1 : so.layers.first;
    if (r0 != s0 || rn != n)
      throw ScheduleViolation(fmt::format("executor: P2P {} -> {} moves different samples", label(send), label(recv)));
    const DevTensor& src = read(send, so.device, DevKey{fwd ? DK::Act : DK::Grad, l, s0, n});
    DevTensor& dst = make(recv, ro.device, DevKey{fwd ? DK::Act : DK::Grad, l, s0, n}, Bytes(n) * per_sample(l));
    D(so.device).copy_d2d(S(send), dst.buf.data(), src.buf.data(), Bytes(n) * per_sample(l), &D(ro.device));
    dst.users.push_back(send);  // written by the sender's stream; the receiver's stream waits for it (record_group)
  }

  // ARD group: the replicas' dW summed in rank order (as Communicator::all_reduce_sum), written back to all. With
  // ExecutorOptions::communicator, on the devices: each member's dW all-reduced in place on its own stream.
  void run_ard(const std::vector<int>& group) {
    const core::Op& o0 = p.ops[static_cast<std::size_t>(group.front())];
    const std::int64_t count = w_floats(o0.layers);
    if (qr.device_sums(group)) {
      std::vector<void*> bufs;
      bufs.reserve(group.size());
      for (const int a : group) {
        const core::Op& op = p.ops[static_cast<std::size_t>(a)];
        DevTensor& g = read(a, op.device, DevKey{DK::DW, op.task, 0, 0});
        bufs.push_back(g.buf.data());
        g.producer = a;
      }
      qr.all_reduce(group, bufs, count, dt);
      return;
    }
    // The host path (no communicator, or a group that does not span the communicator's ranks in order).
    // The host sums what each replica's copy brought (it waits for that replica's stream: the host reads the
    // data); the sum goes up by async copies, so its buffers live until every replica's stream has run them.
    auto sum = std::make_shared<std::vector<float>>(static_cast<std::size_t>(count));
    std::vector<float> part(dt == DType::BF16 ? 0 : static_cast<std::size_t>(count));
    auto raw = std::make_shared<std::vector<Bf16>>(dt == DType::BF16 ? static_cast<std::size_t>(count) : 0);
    for (std::size_t r = 0; r < group.size(); ++r) {
      const core::Op& op = p.ops[static_cast<std::size_t>(group[r])];
      const DevTensor& g = read(group[r], op.device, DevKey{DK::DW, op.task, 0, 0});
      if (dt == DType::BF16) {
        D(op.device).copy_d2h(S(group[r]), raw->data(), g.buf.data(), count * es);
        sync(group[r]);
        add_in_rank_order<Bf16>(*sum, *raw, r);  // widened, as all_reduce_sum_bf16 adds
      } else {
        D(op.device).copy_d2h(S(group[r]), part.data(), g.buf.data(), count * kF);
        sync(group[r]);
        add_in_rank_order(*sum, part, r);
      }
    }
    if (dt == DType::BF16) store_sum(*raw, *sum);  // the fp32 sum rounded once
    for (int a : group) {
      const core::Op& op = p.ops[static_cast<std::size_t>(a)];
      DevTensor& g = dev[static_cast<std::size_t>(op.device)][DevKey{DK::DW, op.task, 0, 0}];
      if (dt == DType::BF16) {
        D(op.device).copy_h2d(S(a), g.buf.data(), raw->data(), count * es);
        keep_until_done(a, raw);
      } else {
        D(op.device).copy_h2d(S(a), g.buf.data(), sum->data(), count * kF);
        keep_until_done(a, sum);
      }
      g.producer = a;
    }
  }

  std::vector<std::vector<int>> grad_producer;    // per device, per layer: the dWB that brought it this step
  std::map<int, std::vector<float>> dwb_scratch;  // per non-owning dWB op: where its gradient lands

  // The device tensors op o reads, as run_op/run_pair/run_ard read them (the RecX/RecAct of BWD included).
  // A tensor is freed once its last reader has run: memory follows the Program's data flow, so a device holds
  // what the Program's allocs/frees say it holds (docs/backend.md, "Executor memory").
  std::vector<std::pair<int, DevKey>> reads_of(int o) const {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    const core::Task& t = p.graph.tasks[static_cast<std::size_t>(op.task)];
    const int d = op.device;
    const int lf = op.layers.first, ll = op.layers.last;
    std::vector<std::pair<int, DevKey>> r;
    auto mb = [&] { return samples(o); };
    switch (op.kind) {
      case OpKind::sX:
        if (t.type == core::TaskType::Fwd) r.push_back({d, DevKey{DK::Act, lf, mb().first, mb().second}});
        break;
      case OpKind::Y:
        r.push_back({d, DevKey{DK::Act, ll + 1, mb().first, mb().second}});
        break;
      case OpKind::dX:
        r.push_back({d, DevKey{DK::Grad, lf, mb().first, mb().second}});
        break;
      case OpKind::FWD:
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{DK::Act, lf, mb().first, mb().second}});
        break;
      case OpKind::REC:
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, mb().first, mb().second}});
        break;
      case OpKind::BWD: {
        const auto [s0, n] = mb();
        r.push_back({d, DevKey{DK::W, op.task, 0, 0}});
        r.push_back({d, DevKey{t.has_criterion ? DK::Act : DK::Stash, lf, s0, n}});
        if (op.ui > 0) r.push_back({d, DevKey{DK::DW, op.task, 0, 0}});
        if (!t.has_criterion) r.push_back({d, DevKey{DK::Grad, ll + 1, s0, n}});
        for (int l = lf; l <= ll; ++l) {
          if (l > lf) r.push_back({d, DevKey{DK::RecX, l, s0, n}});
          r.push_back({d, DevKey{DK::RecAct, l, s0, n}});
        }
        break;
      }
      case OpKind::ARD:
      case OpKind::dWB:
        r.push_back({d, DevKey{DK::DW, op.task, 0, 0}});
        break;
      default:
        break;
    }
    return r;
  }
  std::map<std::pair<int, DevKey>, int> readers_total;  // per (device, tensor): ops that read it
  std::map<std::pair<int, DevKey>, int> readers_left;
  std::map<std::pair<int, DevKey>, std::vector<int>> version_readers;  // this step: the readers of its last version

  // After op o ran: drop the tensors whose last reader it was, and those it produced that nobody reads.
  void release(int o) {
    for (const auto& k : reads_of(o)) {
      auto it = readers_left.find(k);
      if (it != readers_left.end() && --it->second == 0) {
        auto& map = dev[static_cast<std::size_t>(k.first)];
        if (auto t = map.find(k.second); t != map.end()) drop(k.first, map, t);
      }
    }
    for (int d = 0; d < static_cast<int>(dev.size()); ++d) {
      auto& map = dev[static_cast<std::size_t>(d)];
      for (auto it = map.begin(); it != map.end();) {
        if (it->second.producer == o && readers_total.count({d, it->first}) == 0) {
          it = drop(d, map, it);
        } else {
          ++it;
        }
      }
    }
  }

  const std::vector<std::vector<int>>& extra_deps() const override { return extra; }

  void begin_step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) override {
    in = inputs;
    tgt = targets;
    losses.assign(static_cast<std::size_t>(B) * static_cast<std::size_t>(T), 0.0f);
    for (auto& [k, h] : host) h.producer.assign(static_cast<std::size_t>(B), -1);
    for (auto& mp : dev) mp.clear();
    grad_producer.assign(devs.size(), std::vector<int>(static_cast<std::size_t>(m.num_layers()), -1));
    readers_left = readers_total;
    version_readers.clear();
    qr.begin_step();
  }

  // A P2P pair runs as one copy (send first); the replicas' ARD ops of a pack run together, in device order.
  std::vector<int> group(int o) const override {
    const core::Op& op = p.ops[static_cast<std::size_t>(o)];
    if (op.peer >= 0) {
      const bool send = op.kind == OpKind::Y || op.kind == OpKind::dX;
      return send ? std::vector<int>{o, op.peer} : std::vector<int>{op.peer, o};
    }
    if (op.kind != OpKind::ARD) return {o};
    std::vector<int> g;
    for (std::size_t a = 0; a < p.ops.size(); ++a) {
      const core::Op& x = p.ops[a];
      if (x.kind == OpKind::ARD && x.layers == op.layers) g.push_back(static_cast<int>(a));
    }
    std::sort(g.begin(), g.end(), [&](int x, int y) {
      return p.ops[static_cast<std::size_t>(x)].device < p.ops[static_cast<std::size_t>(y)].device;
    });
    return g;
  }

  // Event ordering (QueueResources): the host issues a group once its queues are at most kRunAhead ops ahead of
  // their devices; host ops (MSG copies between host channels, Update) wait on the host for their preds' events,
  // the others make their streams wait for them; each member's event is recorded after the group's work.
  void run(const std::vector<int>& g) override {
    const std::shared_ptr<void> range = qr.range(g.front());  // NVTX on CUDA, named like the trace's op
    const core::Op& op = p.ops[static_cast<std::size_t>(g.front())];
    const bool host = op.kind == OpKind::MSGsX || op.kind == OpKind::MSGY || op.kind == OpKind::Update;
    qr.await_preds(g, extra, host, [&](auto&& fn) { unlocked(fn); });
    qr.issue(g, times, host, [&] {
      if (op.peer >= 0) {
        run_pair(g[0], g[1]);
      } else if (op.kind == OpKind::ARD) {
        run_ard(g);
      } else {
        run_op(g.front());
      }
    });
  }

  void finished(int o) override { release(o); }

  void abandon_step() override {
    for (auto& mp : dev) mp.clear();
  }

  double end_step() override {
    qr.synchronize();  // the losses' copies, the last updates' inputs, every stream-ordered free
    for (auto& mp : dev) mp.clear();
    double total = 0.0;
    for (const float x : losses) total += x;
    return total / static_cast<double>(losses.size());
  }

  void synchronize() override { qr.synchronize(); }
};

}  // namespace

namespace detail {
std::unique_ptr<Interpreter> make_harmony_interpreter(const core::Program& program, std::vector<Device*> devices,
                                                      HostState& state, const ExecutorOptions& options) {
  return std::make_unique<HarmonyInterpreter>(program, std::move(devices), state, options);
}
}  // namespace detail

struct Executor::Impl {
  const core::Program& p;
  int B = 0;
  int T = 0;
  bool concurrent = true;
  std::vector<std::shared_ptr<void>> pins;  // HostState's weights and gradients, where the devices pin
  std::unique_ptr<detail::Interpreter> interpreter;
  // Concurrent steps: one persistent thread per queue (made at the first step; idle between steps). Declared
  // last, so destroyed first: its threads are joined before the interpreter goes.
  std::unique_ptr<detail::WorkerPool> workers = nullptr;
};

namespace {
// Which interpreter runs a Program: its kind's dialect says (PlanKindSpec::dialect). Swapping Programs carry no
// Harmony tasks (their ops have pseudo task ids) and Harmony Programs do: a Program whose task graph contradicts its
// kind is malformed and refused, not guessed at.
core::ExecutorDialect dialect_of(const core::Program& p) {
  const core::ExecutorDialect dialect = p.graph.plan.kind->dialect;
  const bool swapping = dialect == core::ExecutorDialect::Swapping;
  const bool no_tasks = p.graph.tasks.empty() && std::all_of(p.graph.rank_tasks.begin(), p.graph.rank_tasks.end(),
                                                             [](const auto& r) { return r.empty(); });
  if (swapping != no_tasks)
    throw BackendError(fmt::format("executor: a {} Program {} Harmony tasks: its kind and its task graph disagree",
                                   p.graph.plan.kind.name(), swapping ? "with" : "without"));
  return dialect;
}
}  // namespace

Executor::Executor(const core::Program& program, std::vector<Device*> devices, HostState& state,
                   const ExecutorOptions& options) {
  const Gpt2& m = state.model();
  if (static_cast<int>(devices.size()) != program.num_devices())
    throw BackendError(
        fmt::format("executor: {} devices for a Program of {} GPUs", devices.size(), program.num_devices()));
  if (program.graph.num_layers != m.num_layers())
    throw BackendError(
        fmt::format("executor: Program has {} layers, the model {}", program.graph.num_layers, m.num_layers()));
  if (options.seq_len < 1 || options.seq_len > m.config().max_seq_len)
    throw BackendError(
        fmt::format("executor: sequence length {} outside 1..{}", options.seq_len, m.config().max_seq_len));
  core::validate_program(program);
  if (Communicator* c = options.communicator) {
    if (c->size() != static_cast<int>(devices.size()))
      throw BackendError(
          fmt::format("executor: the communicator has {} ranks for {} devices", c->size(), devices.size()));
    for (int r = 0; r < c->size(); ++r)
      if (&c->device(r) != devices[static_cast<std::size_t>(r)])
        throw BackendError(fmt::format("executor: the communicator's rank {} is {}, not device {} ({})", r,
                                       c->device(r).name(), r, devices[static_cast<std::size_t>(r)]->name()));
  }
  Device& first = *devices.at(0);
  auto interpreter = dialect_of(program) == core::ExecutorDialect::Swapping
                         ? detail::make_baseline_interpreter(program, devices, state, options)
                         : detail::make_harmony_interpreter(program, devices, state, options);
  // Pinned host memory (CUDA; nothing on the CPU device): HostState's weights (every WB reads them) and gradients
  // (every dWB writes them), the interpreter's stash/swap channels and its bf16 staging, checked once as a total so a
  // plan that cannot pin is refused with the numbers before anything is pinned. The AdamW moments never cross the bus:
  // pinning them would only shrink the budget. All through devices[0]: registrations are portable to every GPU.
  // A kind with resident state moves its weights and gradients once, at construction: nothing of the HostState pinned.
  const bool resident = program.graph.plan.kind->resident_state;
  Bytes state_bytes = 0;
  for (int l = 0; l < m.num_layers() && !resident; ++l) state_bytes += 2 * m.param_floats(l) * Bytes{sizeof(float)};
  first.check_pinnable(state_bytes + interpreter->host_bytes() + detail::Interpreter::staging_bytes(program, options),
                       "the host weights, gradients, stash/swap buffers and bf16 staging", options.pinned_limit);
  std::vector<std::shared_ptr<void>> pins;
  for (int l = 0; l < m.num_layers() && !resident; ++l) {
    const auto w = state.weights(l), g = state.grads(l);
    pins.push_back(first.pin_host(w.data(), Bytes(w.size_bytes()), fmt::format("the host weights of layer {}", l)));
    pins.push_back(first.pin_host(g.data(), Bytes(g.size_bytes()), fmt::format("the host gradients of layer {}", l)));
  }
  interpreter->allocate_host();
  impl_ = new Impl{program,         program.graph.plan.minibatch, options.seq_len, options.concurrent,
                   std::move(pins), std::move(interpreter),       nullptr};
}

Executor::~Executor() {
  try {
    impl_->interpreter->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  delete impl_;
}

void Executor::sync_state() { impl_->interpreter->sync_host_state(); }

StepResult Executor::step(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
  const auto bt = static_cast<std::size_t>(impl_->B) * static_cast<std::size_t>(impl_->T);
  if (inputs.size() != bt || targets.size() != bt)
    throw BackendError(
        fmt::format("executor: expected {} inputs and targets, got {} and {}", bt, inputs.size(), targets.size()));
  if (impl_->concurrent && !impl_->workers)
    impl_->workers = std::make_unique<detail::WorkerPool>(impl_->p.queues.size());
  detail::Interpreter& it = *impl_->interpreter;
  (void)it.take_nonfinite();  // a failed step's report is not this step's
  it.begin_step(inputs, targets);
  StepResult res;
  try {
    res = impl_->concurrent ? detail::run_step_concurrent(impl_->p, it, impl_->workers.get())
                            : detail::run_step(impl_->p, it);
    res.loss = it.end_step();  // waits for every stream: a device error of the step's last work is thrown here
    res.nonfinite_gradient = it.take_nonfinite();
  } catch (...) {
    // Drain what the failed step enqueued, then free its device tensors, so the devices are empty again.
    try {
      it.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the step's own error is the one to report
    }
    it.abandon_step();
    throw;
  }
  return res;
}

}  // namespace harmony::backend
