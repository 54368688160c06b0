// The kernels' error record and its protocol, shared by the device code (kernels.cu: report) and the host
// (CudaStream: consume), and compiled for the CPU by backend/cuda/error_record_test.cpp. A record lives in
// mapped pinned host memory, one per stream, so a report surfaces on the stream whose kernel made it.
#pragma once

#include <cstdint>
#include <optional>

#if defined(__CUDACC__)
#define HARMONY_HOST_DEVICE __host__ __device__
#else
#define HARMONY_HOST_DEVICE
#endif

namespace harmony::backend::cuda::kern {

// code is the flag: 0 free, kErrBusy claimed by a writer that is still filling the fields, > 0 published (the
// fields are complete). Only a writer moves it 0 -> kErrBusy -> code; only the host consumer moves code -> 0.
struct ErrorRecord {
  int code;
  int pad;
  long long value;  // the bad id
  long long a, b;   // (b, t) for the embedding, (row, -) for the cross-entropy
  long long limit;  // the vocabulary size (-1: unknown)
};
enum ErrorCode : int { kErrBusy = -1, kErrNone = 0, kErrEmbeddingId = 1, kErrEmbeddingBwdId = 2, kErrTargetId = 3 };

// A consumed report (a copy of the record's fields).
struct ErrorReport {
  int code = kErrNone;
  long long value = 0, a = 0, b = 0, limit = 0;
};

// Writer (a kernel's thread, or a host thread in the tests): the first report wins; later reports are dropped
// until the host consumes it. The fields are written before the code, separated by a system-scope fence, so a
// host that sees the code (acquire) sees the fields.
HARMONY_HOST_DEVICE inline void report_error(ErrorRecord* e, int code, long long value, long long a, long long b,
                                             long long limit) {
#if defined(__CUDA_ARCH__)
  if (atomicCAS(&e->code, kErrNone, kErrBusy) != kErrNone) return;
  volatile ErrorRecord* v = e;
  v->value = value;
  v->a = a;
  v->b = b;
  v->limit = limit;
  __threadfence_system();
  atomicExch(&e->code, code);
#else
  int expected = kErrNone;
  if (!__atomic_compare_exchange_n(&e->code, &expected, kErrBusy, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
  __atomic_store_n(&e->value, value, __ATOMIC_RELAXED);
  __atomic_store_n(&e->a, a, __ATOMIC_RELAXED);
  __atomic_store_n(&e->b, b, __ATOMIC_RELAXED);
  __atomic_store_n(&e->limit, limit, __ATOMIC_RELAXED);
  __atomic_store_n(&e->code, code, __ATOMIC_RELEASE);
#endif
}

#if !defined(__CUDA_ARCH__)
// Host consumer: takes a published report (and frees the record for the next one), or nothing when the record
// is free or a writer is still filling it (that report is complete later and the next consume takes it: the
// caller checks after the stream's synchronize, when every kernel enqueued before it has finished writing). One
// consumer at a time per record (the caller serializes them): writers race the consumer, never two consumers.
inline std::optional<ErrorReport> consume_error(ErrorRecord* e) {
  const int code = __atomic_load_n(&e->code, __ATOMIC_ACQUIRE);
  if (code == kErrNone || code == kErrBusy) return std::nullopt;
  ErrorReport r;
  r.code = code;
  r.value = __atomic_load_n(&e->value, __ATOMIC_RELAXED);
  r.a = __atomic_load_n(&e->a, __ATOMIC_RELAXED);
  r.b = __atomic_load_n(&e->b, __ATOMIC_RELAXED);
  r.limit = __atomic_load_n(&e->limit, __ATOMIC_RELAXED);
  // Published records are never written by a writer (its claim fails), so nothing else changes code now; release
  // orders the field reads above before a new writer's claim can succeed.
  __atomic_store_n(&e->code, kErrNone, __ATOMIC_RELEASE);
  return r;
}
#endif

}  // namespace harmony::backend::cuda::kern
