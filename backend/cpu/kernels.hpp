// Reference kernels of the GPT-2 and Llama-family models as plain loops, templated on the scalar (float for the CPU
// device, double for finite-difference checks). Every sum runs in a fixed order that depends only on the sizes
// involved, never on how rows are split into calls: weight gradients are accumulated (+=) row by row in
// row order, so microbatch sums are bit-identical to whole-batch ones. See docs/backend.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "backend/device.hpp"

namespace harmony::backend::cpu {

using Index = std::int64_t;

// Dot product with eight partial sums (lane k sums elements j with j % 8 == k in ascending j, up to the
// last whole group of eight), combined pairwise, plus the tail summed in order. Fixed for a given n, and
// vectorisable without reassociation.
template <class T>
T dot(const T* a, const T* b, Index n) {
  T acc[8] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
  Index j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  }
  T tail = T(0);
  for (; j < n; ++j) tail += a[j] * b[j];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

// y[j] += a * x[j]
template <class T>
inline void axpy(T* y, T a, const T* x, Index n) {
  for (Index j = 0; j < n; ++j) y[j] += a * x[j];
}

// Throws a DeviceError naming the first id (in row order) outside [0, V), prefixed by `op`.
inline void check_token_ids(const char* op, const std::int32_t* ids, int B, int T_, int V, const char* suffix) {
  for (Index r = 0; r < Index(B) * T_; ++r) {
    const std::int32_t id = ids[r];
    if (id < 0 || id >= V)
      throw DeviceError(fmt::format("{}: token id {} at (b={}, t={}) is outside the vocabulary [0, {}){}", op, id,
                                    r / T_, r % T_, V, suffix));
  }
}

// Every id is checked before anything is written (a bad one leaves `out` as it was). wpe may be null (no
// position table).
template <class T>
void embedding_fwd(T* out, const std::int32_t* ids, const T* wte, const T* wpe, int B, int T_, int C, int V) {
  check_token_ids("embedding", ids, B, T_, V, "");
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < T_; ++t) {
      const Index r = b * T_ + t;
      const std::int32_t id = ids[r];
      const T* e = wte + Index(id) * C;
      T* o = out + r * C;
      if (wpe == nullptr) {  // no position table (Llama: rotary positions in the attention)
        std::copy(e, e + C, o);
        continue;
      }
      const T* p = wpe + t * C;
      for (Index c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

// Every id is checked before anything is written: a bad one leaves dwte and dwpe as they were (as on CUDA).
template <class T>
void embedding_bwd(T* dwte, T* dwpe, const T* dout, const std::int32_t* ids, int B, int T_, int C, int V) {
  check_token_ids("embedding_bwd", ids, B, T_, V, "; nothing was written");
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < T_; ++t) {
      const Index r = b * T_ + t;
      const T* d = dout + r * C;
      axpy(dwte + Index(ids[r]) * C, T(1), d, C);
      if (dwpe != nullptr) axpy(dwpe + t * C, T(1), d, C);
    }
  }
}

template <class T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* in, const T* w, const T* b, int N, int C, T eps) {
  for (Index r = 0; r < N; ++r) {
    const T* x = in + r * C;
    T sum = T(0);
    for (Index c = 0; c < C; ++c) sum += x[c];
    const T m = sum / T(C);
    T var = T(0);
    for (Index c = 0; c < C; ++c) {
      const T d = x[c] - m;
      var += d * d;
    }
    var /= T(C);
    const T s = T(1) / std::sqrt(var + eps);
    T* o = out + r * C;
    for (Index c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <class T>
void layernorm_bwd(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, const T* mean, const T* rstd, int N,
                   int C) {
  for (Index r = 0; r < N; ++r) {
    const T* x = in + r * C;
    const T* d = dout + r * C;
    const T m = mean[r];
    const T s = rstd[r];
    T dnorm_mean = T(0);
    T dnorm_norm_mean = T(0);
    for (Index c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= T(C);
    dnorm_norm_mean /= T(C);
    T* dx = din + r * C;
    for (Index c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = w[c] * d[c];
      db[c] += d[c];
      dw[c] += norm * d[c];
      dx[c] += s * ((dnorm - dnorm_mean) - norm * dnorm_norm_mean);
    }
  }
}

template <class T>
void matmul_fwd(T* out, const T* in, const T* w, const T* bias, int N, int IC, int OC, WeightLayout layout) {
  if (layout == WeightLayout::InOut) {
    // Each out[r][o] = bias[o] + sum_i in[r][i] * w[i][o], i ascending; rows in blocks of 4 to reuse w rows.
    constexpr Index kRows = 4;
    for (Index r0 = 0; r0 < N; r0 += kRows) {
      const Index r1 = std::min<Index>(N, r0 + kRows);
      for (Index r = r0; r < r1; ++r) {
        T* o = out + r * OC;
        for (Index j = 0; j < OC; ++j) o[j] = bias != nullptr ? bias[j] : T(0);
      }
      for (Index i = 0; i < IC; ++i) {
        const T* wi = w + i * OC;
        for (Index r = r0; r < r1; ++r) axpy(out + r * OC, in[r * IC + i], wi, OC);
      }
    }
  } else {
    // out[r][o] = bias[o] + dot(in[r], w[o]); weight rows outer so each is read once.
    for (Index o = 0; o < OC; ++o) {
      const T* wo = w + o * IC;
      const T bo = bias != nullptr ? bias[o] : T(0);
      for (Index r = 0; r < N; ++r) out[r * OC + o] = bo + dot(in + r * IC, wo, IC);
    }
  }
}

template <class T>
void matmul_bwd(T* din, T* dw, T* dbias, const T* dout, const T* in, const T* w, int N, int IC, int OC,
                WeightLayout layout) {
  if (layout == WeightLayout::InOut) {
    if (din != nullptr) {
      for (Index r = 0; r < N; ++r) {
        for (Index i = 0; i < IC; ++i) din[r * IC + i] = dot(dout + r * OC, w + i * OC, OC);
      }
    }
    // dw[i][o] += in[r][i] * dout[r][o] for r ascending (i outer keeps dw's row in cache).
    for (Index i = 0; i < IC; ++i) {
      T* dwi = dw + i * OC;
      for (Index r = 0; r < N; ++r) axpy(dwi, in[r * IC + i], dout + r * OC, OC);
    }
  } else {
    if (din != nullptr) {
      for (Index r = 0; r < N; ++r) {
        T* dx = din + r * IC;
        std::fill(dx, dx + IC, T(0));
        for (Index o = 0; o < OC; ++o) axpy(dx, dout[r * OC + o], w + o * IC, IC);
      }
    }
    for (Index o = 0; o < OC; ++o) {
      T* dwo = dw + o * IC;
      for (Index r = 0; r < N; ++r) axpy(dwo, dout[r * OC + o], in + r * IC, IC);
    }
  }
  if (dbias != nullptr) {
    for (Index r = 0; r < N; ++r) axpy(dbias, T(1), dout + r * OC, OC);
  }
}

template <class T>
void attention_fwd(T* out, T* att, const T* qkv, int B, int T_, int C, int H) {
  const Index hs = C / H;
  const Index C3 = Index(3) * C;
  const T sqrt_hs = std::sqrt(T(hs));
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < T_; ++t) {
      for (Index h = 0; h < H; ++h) {
        const T* q = qkv + (b * T_ + t) * C3 + h * hs;
        T* a = att + ((b * H + h) * T_ + t) * T_;
        T mx = -std::numeric_limits<T>::infinity();
        for (Index t2 = 0; t2 <= t; ++t2) {
          const T* k = qkv + (b * T_ + t2) * C3 + C + h * hs;
          a[t2] = dot(q, k, hs) / sqrt_hs;
          mx = std::max(mx, a[t2]);
        }
        T sum = T(0);
        for (Index t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - mx);
          sum += a[t2];
        }
        for (Index t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
        for (Index t2 = t + 1; t2 < T_; ++t2) a[t2] = T(0);
        T* o = out + (b * T_ + t) * C + h * hs;
        std::fill(o, o + hs, T(0));
        for (Index t2 = 0; t2 <= t; ++t2) axpy(o, a[t2], qkv + (b * T_ + t2) * C3 + 2 * C + h * hs, hs);
      }
    }
  }
}

template <class T>
void attention_bwd(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int H) {
  const Index hs = C / H;
  const Index C3 = Index(3) * C;
  const T sqrt_hs = std::sqrt(T(hs));
  std::fill(dqkv, dqkv + Index(B) * T_ * C3, T(0));
  std::vector<T> datt(static_cast<std::size_t>(T_));
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < T_; ++t) {
      for (Index h = 0; h < H; ++h) {
        const T* a = att + ((b * H + h) * T_ + t) * T_;
        const T* d = dout + (b * T_ + t) * C + h * hs;
        const T* q = qkv + (b * T_ + t) * C3 + h * hs;
        T* dq = dqkv + (b * T_ + t) * C3 + h * hs;
        // out = sum_t2 a[t2] v[t2]: gradients of the probabilities and of v.
        T dsum = T(0);
        for (Index t2 = 0; t2 <= t; ++t2) {
          const Index row = (b * T_ + t2) * C3 + 2 * C + h * hs;
          datt[t2] = dot(d, qkv + row, hs);
          axpy(dqkv + row, a[t2], d, hs);
          dsum += a[t2] * datt[t2];
        }
        // softmax backward, then the scores q.k / sqrt(hs).
        for (Index t2 = 0; t2 <= t; ++t2) {
          const T dscore = a[t2] * (datt[t2] - dsum) / sqrt_hs;
          const Index krow = (b * T_ + t2) * C3 + C + h * hs;
          axpy(dq, dscore, qkv + krow, hs);
          axpy(dqkv + krow, dscore, q, hs);
        }
      }
    }
  }
}

template <class T>
inline constexpr T kGeluScale = T(0.7978845608028654);  // sqrt(2 / pi)

template <class T>
void gelu_fwd(T* out, const T* in, Index n) {
  for (Index i = 0; i < n; ++i) {
    const T x = in[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(kGeluScale<T> * (x + T(0.044715) * (x * x * x))));
  }
}

template <class T>
void gelu_bwd(T* din, const T* in, const T* dout, Index n) {
  for (Index i = 0; i < n; ++i) {
    const T x = in[i];
    const T u = kGeluScale<T> * (x + T(0.044715) * (x * x * x));
    const T th = std::tanh(u);
    const T du = kGeluScale<T> * (T(1) + T(3 * 0.044715) * x * x);
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
    din[i] = grad * dout[i];
  }
}

template <class T>
void add(T* out, const T* a, const T* b, Index n) {
  for (Index i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void crossentropy_fwd(T* losses, T* probs, const T* logits, const std::int32_t* targets, int N, int V) {
  for (Index r = 0; r < N; ++r) {
    const std::int32_t target = targets[r];
    if (target < 0 || target >= V)
      throw DeviceError(
          fmt::format("cross-entropy: target id {} at row {} is outside the vocabulary [0, {})", target, r, V));
    const T* l = logits + r * V;
    T* p = probs + r * V;
    T mx = -std::numeric_limits<T>::infinity();
    for (Index v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    T sum = T(0);
    for (Index v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    const T lt = l[target];
    losses[r] = (std::log(sum) + mx) - lt;
    const T inv = T(1) / sum;
    for (Index v = 0; v < V; ++v) p[v] = std::exp(l[v] - mx) * inv;
  }
}

template <class T>
void crossentropy_bwd(T* dlogits, const T* probs, const std::int32_t* targets, T scale, int N, int V) {
  for (Index r = 0; r < N; ++r) {
    const T* p = probs + r * V;
    T* d = dlogits + r * V;
    const Index target = targets[r];
    for (Index v = 0; v < V; ++v) d[v] = (p[v] - (v == target ? T(1) : T(0))) * scale;
  }
}

// ---- the Llama family's kernels (RMSNorm, rotary embeddings with grouped-query heads, SwiGLU)

// out = in * rstd * w per row, rstd = 1 / sqrt(mean(in^2) + eps) kept (N) for the backward (HF LlamaRMSNorm).
template <class T>
void rmsnorm_fwd(T* out, T* rstd, const T* in, const T* w, int N, int C, T eps) {
  for (Index r = 0; r < N; ++r) {
    const T* x = in + r * C;
    const T s = T(1) / std::sqrt(dot(x, x, C) / T(C) + eps);
    T* o = out + r * C;
    for (Index c = 0; c < C; ++c) o[c] = (x[c] * s) * w[c];
    rstd[r] = s;
  }
}

// din += d/din (accumulates), dw += sum over rows of dout * in * rstd, row by row in row order.
template <class T>
void rmsnorm_bwd(T* din, T* dw, const T* dout, const T* in, const T* w, const T* rstd, int N, int C) {
  for (Index r = 0; r < N; ++r) {
    const T* x = in + r * C;
    const T* d = dout + r * C;
    const T s = rstd[r];
    T dot_dn = T(0);  // sum_c (w d)_c * xhat_c
    for (Index c = 0; c < C; ++c) dot_dn += (w[c] * d[c]) * (x[c] * s);
    dot_dn /= T(C);
    T* dx = din + r * C;
    for (Index c = 0; c < C; ++c) {
      const T norm = x[c] * s;
      dw[c] += norm * d[c];
      dx[c] += s * (w[c] * d[c] - norm * dot_dn);
    }
  }
}

// The rotary embedding's angle for position t and frequency index i of a head of width D (HF's default rope:
// inv_freq_i = 1 / theta^(2i / D), in fp32 for T = float).
template <class T>
inline T rope_angle(Index t, Index i, int D, T theta) {
  const T inv_freq = T(1) / std::pow(theta, T(2 * i) / T(D));
  return T(t) * inv_freq;
}

// Rotates each head's two halves (HF rotate_half): x[i] cos - x[i + D/2] sin, x[i + D/2] cos + x[i] sin.
// sign -1 rotates back (the transpose: the backward).
template <class T>
inline void rope_rotate(T* out, const T* in, Index t, int D, T theta, T sign) {
  const Index half = D / 2;
  for (Index i = 0; i < half; ++i) {
    const T a = rope_angle<T>(t, i, D, theta);
    const T c = std::cos(a), s = sign * std::sin(a);
    const T x1 = in[i], x2 = in[i + half];
    out[i] = x1 * c - x2 * s;
    out[i + half] = x2 * c + x1 * s;
  }
}

// qkv (B,T,3C) = [rope(q) | rope(k) repeated | v repeated] from packed (B,T,C + 2*Hkv*D) = [q | k | v] with
// H query heads and Hkv key/value heads of width D = C/H: query head h reads key/value head h / (H / Hkv)
// (HF repeat_kv). The layout attention_fwd reads.
template <class T>
void rope_qkv_fwd(T* qkv, const T* packed, int B, int T_, int H, int Hkv, int D, T theta) {
  const Index C = Index(H) * D, KV = Index(Hkv) * D, P = C + 2 * KV;
  const int rep = H / Hkv;
  for (Index r = 0; r < Index(B) * T_; ++r) {
    const Index t = r % T_;
    const T* in = packed + r * P;
    T* out = qkv + r * 3 * C;
    for (Index h = 0; h < H; ++h) {
      const Index g = h / rep;
      rope_rotate<T>(out + h * D, in + h * D, t, D, theta, T(1));
      rope_rotate<T>(out + C + h * D, in + C + g * D, t, D, theta, T(1));
      std::copy(in + C + KV + g * D, in + C + KV + (g + 1) * D, out + 2 * C + h * D);
    }
  }
}

// dpacked (B,T,C + 2*Hkv*D) written from dqkv (B,T,3C): each key/value head's gradient sums its query heads' in
// head order, then q and k rotate back.
template <class T>
void rope_qkv_bwd(T* dpacked, const T* dqkv, int B, int T_, int H, int Hkv, int D, T theta) {
  const Index C = Index(H) * D, KV = Index(Hkv) * D, P = C + 2 * KV;
  const int rep = H / Hkv;
  std::vector<T> dk(static_cast<std::size_t>(D));
  for (Index r = 0; r < Index(B) * T_; ++r) {
    const Index t = r % T_;
    const T* d = dqkv + r * 3 * C;
    T* out = dpacked + r * P;
    for (Index h = 0; h < H; ++h) rope_rotate<T>(out + h * D, d + h * D, t, D, theta, T(-1));
    for (Index g = 0; g < Hkv; ++g) {
      std::fill(dk.begin(), dk.end(), T(0));
      T* dv = out + C + KV + g * D;
      std::fill(dv, dv + D, T(0));
      for (Index h = g * rep; h < (g + 1) * rep; ++h) {
        for (Index i = 0; i < D; ++i) {
          dk[static_cast<std::size_t>(i)] += d[C + h * D + i];
          dv[i] += d[2 * C + h * D + i];
        }
      }
      rope_rotate<T>(out + C + g * D, dk.data(), t, D, theta, T(-1));
    }
  }
}

// out (N,I) = silu(gate) * up from in (N,2I) = [gate | up] per row.
template <class T>
void swiglu_fwd(T* out, const T* in, int N, int I) {
  for (Index r = 0; r < N; ++r) {
    const T* g = in + r * 2 * I;
    const T* u = g + I;
    T* o = out + r * I;
    for (Index i = 0; i < I; ++i) o[i] = (g[i] / (T(1) + std::exp(-g[i]))) * u[i];
  }
}

// din (N,2I) = [dgate | dup] written from dout (N,I).
template <class T>
void swiglu_bwd(T* din, const T* in, const T* dout, int N, int I) {
  for (Index r = 0; r < N; ++r) {
    const T* g = in + r * 2 * I;
    const T* u = g + I;
    const T* d = dout + r * I;
    T* dg = din + r * 2 * I;
    T* du = dg + I;
    for (Index i = 0; i < I; ++i) {
      const T sig = T(1) / (T(1) + std::exp(-g[i]));
      const T silu = g[i] * sig;
      du[i] = d[i] * silu;
      dg[i] = d[i] * u[i] * (sig * (T(1) + g[i] * (T(1) - sig)));
    }
  }
}

}  // namespace harmony::backend::cpu
