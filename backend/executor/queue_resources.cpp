// QueueResources (detail.hpp): what the interpreter keeps per Program queue (a stream, an AdamW pool, per op an
// event and a trace label) and the event ordering built on them: device-side waits on predecessors' events, host
// waits, the run-ahead throttle, group records, device all-reduces and the stream-ordered (deferred) frees.
#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "backend/executor/detail.hpp"
#include "core/program/program_graph.hpp"

namespace harmony::backend::detail {

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

}  // namespace harmony::backend::detail
