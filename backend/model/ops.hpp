// The two ways the model's layers run their kernels, with one signature set so that the layer code is
// written once for both families (backend/model/gpt2.cpp): BasicDeviceOps<S> enqueues the device's Kernels<S> on a
// stream (DeviceOps fp32, DeviceOpsBf16 mixed precision); HostOps<T> calls the reference loops synchronously on host
// memory (T = double for finite-difference checks). Stat is the type of the normalizations' saved row statistics
// (mean, rstd): fp32 on a device whatever S (as torch under bf16 autocast), T on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cpu/kernels.hpp"
#include "backend/device.hpp"

namespace harmony::backend {

// The device's Kernels<S> (S = Bf16: mixed precision; kernels_of throws a DeviceError on a device that has none). Real
// is the type of eps, loss scales and the head's per-token losses.
template <class S>
class BasicDeviceOps {
 public:
  using Scalar = S;
  using Real = float;
  using Stat = float;
  BasicDeviceOps(Device& device, Stream& stream)
      : dev_(device), s_(stream), k_(kernels_of<S>(device, "bf16 kernels")) {}
  Device& device() { return dev_; }
  Stream& stream() { return s_; }

  void copy(S* dst, const S* src, std::int64_t n) { dev_.copy_d2d(s_, dst, src, n * static_cast<Bytes>(sizeof(S))); }
  void zero(S* dst, std::int64_t n) { dev_.fill_zero(s_, dst, n * static_cast<Bytes>(sizeof(S))); }
  void embedding_fwd(S* out, const std::int32_t* ids, const S* wte, const S* wpe, int B, int T, int C, int V) {
    k_.embedding_fwd(s_, out, ids, wte, wpe, B, T, C, V);
  }
  void embedding_bwd(S* dwte, S* dwpe, const S* dout, const std::int32_t* ids, int B, int T, int C, int V) {
    k_.embedding_bwd(s_, dwte, dwpe, dout, ids, B, T, C, V);
  }
  void layernorm_fwd(S* out, float* mean, float* rstd, const S* in, const S* w, const S* b, int N, int C, float eps) {
    k_.layernorm_fwd(s_, out, mean, rstd, in, w, b, N, C, eps);
  }
  void layernorm_bwd(S* din, S* dw, S* db, const S* dout, const S* in, const S* w, const float* mean, const float* rstd,
                     int N, int C) {
    k_.layernorm_bwd(s_, din, dw, db, dout, in, w, mean, rstd, N, C);
  }
  void matmul_fwd(S* out, const S* in, const S* w, const S* bias, int N, int IC, int OC, WeightLayout layout) {
    k_.matmul_fwd(s_, out, in, w, bias, N, IC, OC, layout);
  }
  void matmul_bwd(S* din, S* dw, S* dbias, const S* dout, const S* in, const S* w, int N, int IC, int OC,
                  WeightLayout layout) {
    k_.matmul_bwd(s_, din, dw, dbias, dout, in, w, N, IC, OC, layout);
  }
  void matmul_gelu_fwd(S* out, S* pre, const S* in, const S* w, const S* bias, int N, int IC, int OC,
                       WeightLayout layout) {
    k_.matmul_gelu_fwd(s_, out, pre, in, w, bias, N, IC, OC, layout);
  }
  bool matmul_gelu_bwd(S* din, S* dw, S* dbias, S* dpre_bias, const S* dout, const S* in, const S* w, const S* pre,
                       int N, int IC, int OC, WeightLayout layout) {
    return k_.matmul_gelu_bwd(s_, din, dw, dbias, dpre_bias, dout, in, w, pre, N, IC, OC, layout);
  }
  void add_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* w, const S* bias,
                         int N, int C, float eps) {
    k_.add_layernorm_fwd(s_, res, out, mean, rstd, a, b, w, bias, N, C, eps);
  }
  void attention_fwd(S* out, S* att, const S* qkv, int B, int T, int C, int H) {
    k_.attention_fwd(s_, out, att, qkv, B, T, C, H);
  }
  void attention_bwd(S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C, int H) {
    k_.attention_bwd(s_, dqkv, dout, qkv, att, B, T, C, H);
  }
  void gelu_fwd(S* out, const S* in, std::int64_t n) { k_.gelu_fwd(s_, out, in, n); }
  void gelu_bwd(S* din, const S* in, const S* dout, std::int64_t n) { k_.gelu_bwd(s_, din, in, dout, n); }
  void add(S* out, const S* a, const S* b, std::int64_t n) { k_.add(s_, out, a, b, n); }
  void crossentropy_fwd(float* losses, S* probs, const S* logits, const std::int32_t* targets, int N, int V) {
    k_.crossentropy_fwd(s_, losses, probs, logits, targets, N, V);
  }
  void rmsnorm_fwd(S* out, float* rstd, const S* in, const S* w, int N, int C, float eps) {
    k_.rmsnorm_fwd(s_, out, rstd, in, w, N, C, eps);
  }
  void rmsnorm_bwd(S* din, S* dw, const S* dout, const S* in, const S* w, const float* rstd, int N, int C) {
    k_.rmsnorm_bwd(s_, din, dw, dout, in, w, rstd, N, C);
  }
  void rope_qkv_fwd(S* qkv, const S* packed, int B, int T, int H, int Hkv, int D, float theta) {
    k_.rope_qkv_fwd(s_, qkv, packed, B, T, H, Hkv, D, theta);
  }
  void rope_qkv_bwd(S* dpacked, const S* dqkv, int B, int T, int H, int Hkv, int D, float theta) {
    k_.rope_qkv_bwd(s_, dpacked, dqkv, B, T, H, Hkv, D, theta);
  }
  void swiglu_fwd(S* out, const S* in, int N, int I) { k_.swiglu_fwd(s_, out, in, N, I); }
  void swiglu_bwd(S* din, const S* in, const S* dout, int N, int I) { k_.swiglu_bwd(s_, din, in, dout, N, I); }
  void crossentropy_bwd(S* dlogits, const S* probs, const std::int32_t* targets, float scale, int N, int V) {
    k_.crossentropy_bwd(s_, dlogits, probs, targets, scale, N, V);
  }

 private:
  Device& dev_;
  Stream& s_;
  Kernels<S>& k_;
};
using DeviceOps = BasicDeviceOps<float>;
using DeviceOpsBf16 = BasicDeviceOps<Bf16>;

template <class T>
class HostOps {
 public:
  using Scalar = T;
  using Real = T;
  using Stat = T;
  void copy(T* dst, const T* src, std::int64_t n) { std::copy(src, src + n, dst); }
  void zero(T* dst, std::int64_t n) { std::fill(dst, dst + n, T(0)); }
  void embedding_fwd(T* out, const std::int32_t* ids, const T* wte, const T* wpe, int B, int T_, int C, int V) {
    cpu::embedding_fwd<T>(out, ids, wte, wpe, B, T_, C, V);
  }
  void embedding_bwd(T* dwte, T* dwpe, const T* dout, const std::int32_t* ids, int B, int T_, int C, int V) {
    cpu::embedding_bwd<T>(dwte, dwpe, dout, ids, B, T_, C, V);
  }
  void layernorm_fwd(T* out, T* mean, T* rstd, const T* in, const T* w, const T* b, int N, int C, T eps) {
    cpu::layernorm_fwd<T>(out, mean, rstd, in, w, b, N, C, eps);
  }
  void layernorm_bwd(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, const T* mean, const T* rstd, int N,
                     int C) {
    cpu::layernorm_bwd<T>(din, dw, db, dout, in, w, mean, rstd, N, C);
  }
  void matmul_fwd(T* out, const T* in, const T* w, const T* bias, int N, int IC, int OC, WeightLayout layout) {
    cpu::matmul_fwd<T>(out, in, w, bias, N, IC, OC, layout);
  }
  void matmul_bwd(T* din, T* dw, T* dbias, const T* dout, const T* in, const T* w, int N, int IC, int OC,
                  WeightLayout layout) {
    cpu::matmul_bwd<T>(din, dw, dbias, dout, in, w, N, IC, OC, layout);
  }
  // The fused entry points as Kernels<S>' defaults: the composition (nothing fused on the host).
  void matmul_gelu_fwd(T* out, T* pre, const T* in, const T* w, const T* bias, int N, int IC, int OC,
                       WeightLayout layout) {
    matmul_fwd(pre, in, w, bias, N, IC, OC, layout);
    gelu_fwd(out, pre, std::int64_t(N) * OC);
  }
  bool matmul_gelu_bwd(T* din, T* dw, T* dbias, T* /*dpre_bias*/, const T* dout, const T* in, const T* w, const T* pre,
                       int N, int IC, int OC, WeightLayout layout) {
    matmul_bwd(din, dw, dbias, dout, in, w, N, IC, OC, layout);
    gelu_bwd(din, pre, din, std::int64_t(N) * IC);
    return false;
  }
  void add_layernorm_fwd(T* res, T* out, T* mean, T* rstd, const T* a, const T* b, const T* w, const T* bias, int N,
                         int C, T eps) {
    add(res, a, b, std::int64_t(N) * C);
    layernorm_fwd(out, mean, rstd, res, w, bias, N, C, eps);
  }
  void attention_fwd(T* out, T* att, const T* qkv, int B, int T_, int C, int H) {
    cpu::attention_fwd<T>(out, att, qkv, B, T_, C, H);
  }
  void attention_bwd(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int H) {
    cpu::attention_bwd<T>(dqkv, dout, qkv, att, B, T_, C, H);
  }
  void gelu_fwd(T* out, const T* in, std::int64_t n) { cpu::gelu_fwd<T>(out, in, n); }
  void gelu_bwd(T* din, const T* in, const T* dout, std::int64_t n) { cpu::gelu_bwd<T>(din, in, dout, n); }
  void add(T* out, const T* a, const T* b, std::int64_t n) { cpu::add<T>(out, a, b, n); }
  void crossentropy_fwd(T* losses, T* probs, const T* logits, const std::int32_t* targets, int N, int V) {
    cpu::crossentropy_fwd<T>(losses, probs, logits, targets, N, V);
  }
  void rmsnorm_fwd(T* out, T* rstd, const T* in, const T* w, int N, int C, T eps) {
    cpu::rmsnorm_fwd<T>(out, rstd, in, w, N, C, eps);
  }
  void rmsnorm_bwd(T* din, T* dw, const T* dout, const T* in, const T* w, const T* rstd, int N, int C) {
    cpu::rmsnorm_bwd<T>(din, dw, dout, in, w, rstd, N, C);
  }
  void rope_qkv_fwd(T* qkv, const T* packed, int B, int T_, int H, int Hkv, int D, T theta) {
    cpu::rope_qkv_fwd<T>(qkv, packed, B, T_, H, Hkv, D, theta);
  }
  void rope_qkv_bwd(T* dpacked, const T* dqkv, int B, int T_, int H, int Hkv, int D, T theta) {
    cpu::rope_qkv_bwd<T>(dpacked, dqkv, B, T_, H, Hkv, D, theta);
  }
  void swiglu_fwd(T* out, const T* in, int N, int I) { cpu::swiglu_fwd<T>(out, in, N, I); }
  void swiglu_bwd(T* din, const T* in, const T* dout, int N, int I) { cpu::swiglu_bwd<T>(din, in, dout, N, I); }
  void crossentropy_bwd(T* dlogits, const T* probs, const std::int32_t* targets, T scale, int N, int V) {
    cpu::crossentropy_bwd<T>(dlogits, probs, targets, scale, N, V);
  }
};

}  // namespace harmony::backend
