// The host optimizer at memory speed: AdamW over a range of parameters split across a pool of threads, each
// running an explicitly vectorised copy of adamw_update's element loop (the same float operations in the same
// order, no fused multiply-adds), so every element is bit-identical to adamw_update's. For either device's
// Update op, typically over pinned host buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend/adamw.hpp"
#include "backend/bf16.hpp"

namespace harmony::backend {

class HostState;
class ParallelAdamW;

// A gradient that held a NaN or an infinity when an update read it.
struct NonFiniteGradient {
  int layer = 0;      // the highest such layer of the update (the one nearest the loss, where backward starts)
  std::string param;  // its first such parameter, by its Hugging Face name ("h.3.attn.c_attn.weight")
  int params = 0;     // how many parameters of the update had one
};

// HostState::update(config, first, last) with the element loops on `pool` (bit-identical: ParallelAdamW is
// adamw_update element for element): AdamW per parameter, the tied wte updated with its two gradients summed
// (layer 0's and the head's lm_head), the head's lm_head then a copy of it, each layer's step count advanced.
// The executors' Update ops, and what the profiler times as a layer's host update. Returns the non-finite
// gradients the update read (found inside its element loops, at no extra pass), nullopt when all were finite; the
// update is applied either way (the weights of such a parameter are then no longer finite).
std::optional<NonFiniteGradient> update_layers(HostState& state, const AdamWConfig& config, int first, int last,
                                               ParallelAdamW& pool);

// One step over n elements on the calling thread, vectorised (AVX2 when the CPU has it, else SSE2 on x86-64,
// else scalar). Same contract and results, bit for bit, as adamw_update; the four arrays must not overlap.
void adamw_update_vectorized(const AdamWConfig& config, std::int64_t step, float* param, const float* grad,
                             float* exp_avg, float* exp_avg_sq, std::int64_t n);

// adamw_update's scalar factors for one step, computed with its expressions (in double, then rounded to float once
// each). Every device's AdamW applies these, so the CPU and the CUDA device start each element from the same bits.
struct AdamWFactors {
  float decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
};
// Throws BackendError for step < 1.
AdamWFactors adamw_factors(const AdamWConfig& config, std::int64_t step);

// The element update the devices' Kernels<S>::adamw runs on the CPU device (vectorised as adamw_update_vectorized,
// on the calling thread), n elements; returns whether every gradient element was finite.
// fp32: param updated from grad (+ grad2 when not null: one float add per element, before the update), then copied
// into `twin` when not null. Bit-identical to adamw_update over the summed gradient.
bool adamw_apply(const AdamWFactors& f, float* param, const float* grad, const float* grad2, float* exp_avg,
                 float* exp_avg_sq, float* twin, std::int64_t n);
// bf16 with an fp32 master: the gradient widened exactly (grad2 widened and added in fp32), `master` updated as
// adamw_update does, then rounded to nearest even into `working` (and `twin` when not null). Bit-identical to
// widening the gradients to fp32, adamw_update on the master and rounding it (what the host path does).
bool adamw_apply_bf16(const AdamWFactors& f, float* master, Bf16* working, const Bf16* grad, const Bf16* grad2,
                      float* exp_avg, float* exp_avg_sq, Bf16* twin, std::int64_t n);

// The instruction set adamw_update_vectorized uses on this CPU: "avx2", "sse2" or "scalar".
const char* adamw_vector_isa();

// adamw_update_vectorized with a chosen instruction set, for tests and benchmarks: "scalar" anywhere, "sse2" on
// x86-64, "avx2" where the CPU has it; anything else throws BackendError.
void adamw_update_isa(std::string_view isa, const AdamWConfig& config, std::int64_t step, float* param,
                      const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n);

// A pool of `threads` workers (the caller is one of them) that splits each update into contiguous ranges of
// whole 64-byte lines. Elements are independent, so the split never changes a result. update() is not
// reentrant: one update at a time per ParallelAdamW (callers that update packs concurrently need one each).
class ParallelAdamW {
 public:
  // threads <= 0: std::thread::hardware_concurrency(). Ranges smaller than min_elements_per_thread are
  // not split further (thread hand-off costs ~10 us, a 64K-element range ~20 us).
  explicit ParallelAdamW(int threads = 0, std::int64_t min_elements_per_thread = 64 * 1024);
  ~ParallelAdamW();
  ParallelAdamW(const ParallelAdamW&) = delete;
  ParallelAdamW& operator=(const ParallelAdamW&) = delete;

  int threads() const;
  // As adamw_update (throws BackendError for step < 1 before touching anything). Returns whether every gradient
  // element was finite (checked inside the element loop).
  bool update(const AdamWConfig& config, std::int64_t step, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, std::int64_t n);
  // A tied pair (GPT-2's wte and lm_head): AdamW over grad + grad2 (one float add per element, as summing into
  // a buffer first: bit-identical to that sum followed by update()), then the updated `param` copied into
  // `copy_to` (the twin; null: no copy), every pass split across the pool: no serial pass over the tensor. Returns
  // whether every element of grad + grad2 was finite.
  bool update_tied(const AdamWConfig& config, std::int64_t step, float* param, const float* grad, const float* grad2,
                   float* exp_avg, float* exp_avg_sq, std::int64_t n, float* copy_to);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace harmony::backend
