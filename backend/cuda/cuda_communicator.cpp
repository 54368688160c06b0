// The CUDA communicator: every call is a rendezvous on the callers' submission threads (each parks when its
// stream reaches the call, like the CPU communicator's stream threads); the last to arrive issues the transfer on
// all participants' streams at once, with NCCL (one communicator over distinct GPUs, ncclCommInitAll, group calls)
// or with device/peer copies and event waits (logical devices sharing a GPU; all-reduce added in rank order).
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/check.hpp"
#include "backend/cuda/cuda_internal.hpp"

#ifdef HARMONY_HAVE_NCCL
#include <nccl.h>
#endif

namespace harmony::backend::cuda {
namespace detail {
namespace {

#ifdef HARMONY_HAVE_NCCL
// ncclGroupStart ... ncclGroupEnd, ended on every path. A throw between them (a failed ncclSend or ncclAllReduce)
// used to leave the group open on this thread, so every later NCCL call of the thread joined it and none launched:
// the run hung instead of reporting the first error. end() ends it and checks the result; the destructor ends a
// group still open (its own error is dropped: the exception already in flight is the one to report).
class NcclGroup {
 public:
  NcclGroup() { HARMONY_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    HARMONY_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};
#endif

// A CUDA event used once, to order one stream after another.
class OneShotEvent {
 public:
  explicit OneShotEvent(int gpu) : gpu_(gpu) {
    DeviceGuard guard(gpu);
    HARMONY_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~OneShotEvent() {
    if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();  // released once its waits are done
  }
  OneShotEvent(const OneShotEvent&) = delete;
  OneShotEvent& operator=(const OneShotEvent&) = delete;
  // `waiter` (any GPU) waits for what `recorder` (a stream of this event's GPU) has enqueued so far.
  void order(cudaStream_t recorder, cudaStream_t waiter) {
    DeviceGuard guard(gpu_);
    HARMONY_CUDA_CHECK(cudaEventRecord(event_, recorder));
    HARMONY_CUDA_CHECK(cudaStreamWaitEvent(waiter, event_, 0));
  }

 private:
  int gpu_;
  cudaEvent_t event_ = nullptr;
};

struct Side {  // one participant, as its submission thread reports it
  cudaStream_t stream = nullptr;
  int gpu = 0;
  void* ptr = nullptr;
  Bytes bytes = 0;    // an all-reduce: the count of elements
  bool bf16 = false;  // an all-reduce: bf16 elements (else fp32)
};

class CudaCommunicator final : public Communicator {
 public:
  explicit CudaCommunicator(const std::vector<Device*>& devices) {
    if (devices.empty()) throw DeviceError("communicator: no devices");
    std::set<int> gpus;
    for (Device* d : devices) {
      if (d == nullptr) throw DeviceError("communicator: null device");
      devices_.push_back(&as_cuda(*d));
      gpus.insert(devices_.back()->gpu());
    }
    const auto n = devices_.size();
    send_seq_.assign(n, std::vector<std::int64_t>(n, 0));
    recv_seq_.assign(n, std::vector<std::int64_t>(n, 0));
    reduce_seq_.assign(n, 0);
    const bool distinct = gpus.size() == n;
#ifdef HARMONY_HAVE_NCCL
    if (distinct && n > 1) {
      std::vector<int> list;
      for (CudaDevice* d : devices_) list.push_back(d->gpu());
      comms_.assign(n, nullptr);
      HARMONY_NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(n), list.data()));
      nccl_ = true;
    }
#endif
    if (!nccl_) {
      for (CudaDevice* a : devices_) {
        for (CudaDevice* b : devices_) enable_peer_access(a->gpu(), b->gpu());
      }
    }
    (void)distinct;
  }

  ~CudaCommunicator() override {
#ifdef HARMONY_HAVE_NCCL
    for (ncclComm_t c : comms_) {
      if (c != nullptr) (void)ncclCommDestroy(c);
    }
#endif
  }
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  int size() const override { return static_cast<int>(devices_.size()); }
  Device& device(int rank) override { return *devices_.at(static_cast<std::size_t>(check_rank(rank, "device"))); }
  bool nccl() const { return nccl_; }
  // NCCL's ring adds in its own order; the copy path adds in rank order (docs/backend.md).
  bool sums_in_rank_order() const override { return !nccl_; }

  void send(int rank, Stream& s, const void* src, Bytes bytes, int peer) override {
    CudaDevice& d = *devices_[static_cast<std::size_t>(check_rank(rank, "send"))];
    check_rank(peer, "send");
    CudaStream& cs = d.own(s, "send");
    if (bytes < 0) throw DeviceError(fmt::format("send: negative size {}", bytes));
    d.check_device(src, bytes, "send", "source");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = send_seq_[rank][peer]++;
    }
    const int gpu = d.gpu();
    cs.submit("send", [this, rank, peer, seq, src, bytes, gpu](StreamContext& c) {
      p2p(Key{rank, peer, seq}, true, Side{c.stream(), gpu, const_cast<void*>(src), bytes});
    });
  }

  void recv(int rank, Stream& s, void* dst, Bytes bytes, int peer) override {
    CudaDevice& d = *devices_[static_cast<std::size_t>(check_rank(rank, "recv"))];
    check_rank(peer, "recv");
    CudaStream& cs = d.own(s, "recv");
    if (bytes < 0) throw DeviceError(fmt::format("recv: negative size {}", bytes));
    d.check_device(dst, bytes, "recv", "destination");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = recv_seq_[peer][rank]++;
    }
    const int gpu = d.gpu();
    cs.submit("recv", [this, rank, peer, seq, dst, bytes, gpu](StreamContext& c) {
      p2p(Key{peer, rank, seq}, false, Side{c.stream(), gpu, dst, bytes});
    });
  }

  void all_reduce_sum(int rank, Stream& s, float* buf, std::int64_t count) override {
    enqueue_all_reduce(rank, s, buf, count, false);
  }
  void all_reduce_sum_bf16(int rank, Stream& s, Bf16* buf, std::int64_t count) override {
    enqueue_all_reduce(rank, s, buf, count, true);
  }

 private:
  using Key = std::tuple<int, int, std::int64_t>;  // (sender, receiver, sequence)
  struct Pair {
    Side sender, receiver;
    bool has_sender = false, has_receiver = false, done = false;
    int left = 2;
    std::string error;
  };
  struct Collective {
    std::vector<Side> sides;
    int arrived = 0, left = 0;
    bool done = false;
    std::string error;
  };

  int check_rank(int rank, const char* op) const {
    if (rank < 0 || rank >= size())
      throw DeviceError(fmt::format("{}: rank {} outside the communicator's 0..{}", op, rank, size() - 1));
    return rank;
  }

  // Both all-reduces (one call order per rank for both kinds): buf holds count fp32 or bf16 values.
  void enqueue_all_reduce(int rank, Stream& s, void* buf, std::int64_t count, bool bf16) {
    const char* op = bf16 ? "all_reduce_sum_bf16" : "all_reduce_sum";
    CudaDevice& d = *devices_[static_cast<std::size_t>(check_rank(rank, op))];
    CudaStream& cs = d.own(s, op);
    if (count < 0) throw DeviceError(fmt::format("{}: negative count {}", op, count));
    d.check_device(buf, count * elem_bytes(bf16), op, "buffer");
    std::int64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = reduce_seq_[rank]++;
    }
    const int gpu = d.gpu();
    cs.submit(op, [this, rank, seq, buf, count, gpu, bf16](StreamContext& c) {
      all_reduce(seq, rank, Side{c.stream(), gpu, buf, count, bf16});
    });
  }
  static Bytes elem_bytes(bool bf16) { return bf16 ? Bytes{sizeof(Bf16)} : Bytes{sizeof(float)}; }

  // Runs on a submission thread: park until both sides of the message have arrived; the second issues it.
  void p2p(const Key& key, bool is_sender, const Side& side) {
    std::unique_lock lock(mu_);
    Pair& p = pairs_[key];
    (is_sender ? p.sender : p.receiver) = side;
    (is_sender ? p.has_sender : p.has_receiver) = true;
    if (p.has_sender && p.has_receiver) {
      const auto [from, to, seq] = key;
      if (p.sender.bytes != p.receiver.bytes) {
        p.error = fmt::format("recv on rank {} from rank {} (message {}): expected {} bytes, the sender sent {}", to,
                              from, seq, p.receiver.bytes, p.sender.bytes);
      } else {
        try {
          issue_p2p(from, to, p.sender, p.receiver);
        } catch (const std::exception& e) {
          p.error = e.what();
        }
      }
      p.done = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&]() { return p.done; });
    }
    const std::string error = p.error;
    if (--p.left == 0) pairs_.erase(key);
    if (!error.empty()) throw DeviceError(error);
  }

  void issue_p2p(int from, int to, const Side& s, const Side& r) {
    if (s.bytes == 0) return;
#ifdef HARMONY_HAVE_NCCL
    if (nccl_) {
      const auto n = static_cast<std::size_t>(s.bytes);
      NcclGroup group;
      HARMONY_NCCL_CHECK(ncclSend(s.ptr, n, ncclUint8, to, comms_[static_cast<std::size_t>(from)], s.stream));
      HARMONY_NCCL_CHECK(ncclRecv(r.ptr, n, ncclUint8, from, comms_[static_cast<std::size_t>(to)], r.stream));
      group.end();
      return;
    }
#endif
    (void)from;
    (void)to;
    // The sender's stream copies once the receiver's stream has reached the recv; the receiver waits for the copy.
    OneShotEvent arrived(r.gpu), copied(s.gpu);
    arrived.order(r.stream, s.stream);
    copy(s.gpu, s.stream, r.ptr, r.gpu, s.ptr, s.bytes);
    copied.order(s.stream, r.stream);
  }

  // dst on dst_gpu <- src on src_gpu, enqueued on `stream` (of src_gpu).
  static void copy(int src_gpu, cudaStream_t stream, void* dst, int dst_gpu, const void* src, Bytes bytes) {
    const auto n = static_cast<std::size_t>(bytes);
    DeviceGuard guard(src_gpu);
    if (dst_gpu == src_gpu) {
      HARMONY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
    } else {
      HARMONY_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_gpu, src, src_gpu, n, stream));
    }
  }

  void all_reduce(std::int64_t seq, int rank, const Side& side) {
    const int n = size();
    std::unique_lock lock(mu_);
    Collective& c = reduces_[seq];
    if (c.sides.empty()) {
      c.sides.assign(static_cast<std::size_t>(n), Side{});
    }
    c.sides[static_cast<std::size_t>(rank)] = side;
    if (++c.arrived == n) {
      for (int r = 0; r < n; ++r) {
        const Side& s = c.sides[static_cast<std::size_t>(r)];
        if (s.bf16 != c.sides[0].bf16 && c.error.empty())
          c.error = fmt::format("all-reduce {}: rank {} reduces {}, rank 0 {}", seq, r, s.bf16 ? "bf16" : "fp32",
                                c.sides[0].bf16 ? "bf16" : "fp32");
        if (s.bytes != c.sides[0].bytes && c.error.empty())
          c.error = fmt::format("all_reduce_sum {}: rank {} reduces {} {}, rank 0 {}", seq, r, s.bytes,
                                s.bf16 ? "bf16 values" : "floats", c.sides[0].bytes);
      }
      if (c.error.empty()) {
        try {
          issue_all_reduce(c.sides);
        } catch (const std::exception& e) {
          c.error = e.what();
        }
      }
      c.done = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&]() { return c.done; });
    }
    const std::string error = c.error;
    if (++c.left == n) reduces_.erase(seq);
    if (!error.empty()) throw DeviceError(error);
  }

  // sides[r].bytes holds the count of elements, sides[r].bf16 their type (the same on every rank).
  void issue_all_reduce(const std::vector<Side>& sides) {
    const std::int64_t count = sides[0].bytes;
    const bool bf16 = sides[0].bf16;
    const int n = size();
    if (count == 0 || n == 1) return;
#ifdef HARMONY_HAVE_NCCL
    if (nccl_) {
      issue_nccl_all_reduce(sides, count, bf16);
      return;
    }
#endif
    // Rank 0's stream adds rank 1, 2, ... in order into an fp32 sum (bit-identical to a serial sum in rank order,
    // as the CPU communicator): fp32 in its own buffer; bf16 in fp32 scratch, every operand widened and the sum
    // rounded once into rank 0's buffer. Then it copies the result to every other rank.
    const Side& root = sides[0];
    const Bytes bytes = count * elem_bytes(bf16);
    DeviceGuard guard(root.gpu);
    void* scratch = nullptr;  // for buffers on other GPUs, stream-ordered
    float* acc = static_cast<float*>(root.ptr);
    if (bf16) {  // the fp32 sum, starting from rank 0's values widened
      void* wide = nullptr;
      HARMONY_CUDA_CHECK(cudaMallocAsync(&wide, static_cast<std::size_t>(count) * sizeof(float), root.stream));
      acc = static_cast<float*>(wide);
      kern::convert_rows(root.stream, acc, count, static_cast<const Bf16*>(root.ptr), count, 1, count);
    }
    for (int r = 1; r < n; ++r) {
      const Side& s = sides[static_cast<std::size_t>(r)];
      OneShotEvent(s.gpu).order(s.stream, root.stream);
      const void* operand = s.ptr;
      if (s.gpu != root.gpu) {
        if (scratch == nullptr)
          HARMONY_CUDA_CHECK(cudaMallocAsync(&scratch, static_cast<std::size_t>(bytes), root.stream));
        copy(s.gpu, root.stream, scratch, root.gpu, s.ptr, bytes);
        operand = scratch;
      }
      if (bf16) {
        kern::add_inplace(root.stream, acc, static_cast<const Bf16*>(operand), count);
      } else {
        kern::add_inplace(root.stream, acc, static_cast<const float*>(operand), count);
      }
    }
    if (scratch != nullptr) HARMONY_CUDA_CHECK(cudaFreeAsync(scratch, root.stream));
    if (bf16) {  // rounded once
      kern::convert_rows(root.stream, static_cast<Bf16*>(root.ptr), count, acc, count, 1, count);
      HARMONY_CUDA_CHECK(cudaFreeAsync(acc, root.stream));
    }
    for (int r = 1; r < n; ++r) {
      const Side& s = sides[static_cast<std::size_t>(r)];
      copy(root.gpu, root.stream, s.ptr, s.gpu, root.ptr, bytes);
      OneShotEvent(root.gpu).order(root.stream, s.stream);
    }
  }

#ifdef HARMONY_HAVE_NCCL
  // NCCL adds in its own order (ring or tree, not rank order): deterministic for a fixed topology, but not
  // bit-identical to the CPU communicator or the host sum. bf16: each rank widens into fp32 scratch, NCCL
  // all-reduces that in fp32, and each rank rounds the sum once into its buffer (the host path's fp32 sum and one
  // rounding, in NCCL's order).
  void issue_nccl_all_reduce(const std::vector<Side>& sides, std::int64_t count, bool bf16) {
    const int n = size();
    const auto elems = static_cast<std::size_t>(count);
    std::vector<float*> wide(static_cast<std::size_t>(n), nullptr);
    for (int r = 0; r < n; ++r) {
      const Side& s = sides[static_cast<std::size_t>(r)];
      wide[static_cast<std::size_t>(r)] = static_cast<float*>(s.ptr);
      if (!bf16) continue;
      DeviceGuard guard(s.gpu);
      void* w = nullptr;
      HARMONY_CUDA_CHECK(cudaMallocAsync(&w, elems * sizeof(float), s.stream));
      wide[static_cast<std::size_t>(r)] = static_cast<float*>(w);
      kern::convert_rows(s.stream, wide[static_cast<std::size_t>(r)], count, static_cast<const Bf16*>(s.ptr), count, 1,
                         count);
    }
    NcclGroup group;
    for (int r = 0; r < n; ++r) {
      const Side& s = sides[static_cast<std::size_t>(r)];
      float* w = wide[static_cast<std::size_t>(r)];
      HARMONY_NCCL_CHECK(ncclAllReduce(w, w, elems, ncclFloat, ncclSum, comms_[static_cast<std::size_t>(r)], s.stream));
    }
    group.end();
    if (!bf16) return;
    for (int r = 0; r < n; ++r) {
      const Side& s = sides[static_cast<std::size_t>(r)];
      DeviceGuard guard(s.gpu);
      kern::convert_rows(s.stream, static_cast<Bf16*>(s.ptr), count, wide[static_cast<std::size_t>(r)], count, 1,
                         count);
      HARMONY_CUDA_CHECK(cudaFreeAsync(wide[static_cast<std::size_t>(r)], s.stream));
    }
  }
#endif

  std::vector<CudaDevice*> devices_;
  bool nccl_ = false;
#ifdef HARMONY_HAVE_NCCL
  std::vector<ncclComm_t> comms_;
#endif
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::int64_t>> send_seq_, recv_seq_;
  std::vector<std::int64_t> reduce_seq_;
  std::map<Key, Pair> pairs_;
  std::map<std::int64_t, Collective> reduces_;
};

}  // namespace
}  // namespace detail

std::unique_ptr<Communicator> make_cuda_communicator(const std::vector<Device*>& devices) {
  return std::make_unique<detail::CudaCommunicator>(devices);
}

bool uses_nccl(const Communicator& communicator) {
  const auto* c = dynamic_cast<const detail::CudaCommunicator*>(&communicator);
  return c != nullptr && c->nccl();
}

}  // namespace harmony::backend::cuda
