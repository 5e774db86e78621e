// The DNC's fused CPU path (docs/dnc.md §17, docs/performance.md §7): DNCMemory._step
// (docs/dnc.md §2.3–§2.8) as one operator with a hand-written backward (memory_step), and the
// whole recurrence, controller and interface included, over a chunk of time (sequence, at the
// end of this file).
//
// The reference step is about a hundred small eager ops per token (the interface's squashing,
// usage, allocation with its sort, write weights, erase and add, the link and precedence, the
// directional weights, content addressing twice, the read), each with its autograd node; on the
// sizes the DNC runs at, their per-call cost is the whole step. Here one example's step is a
// handful of loops over N, W, R and Wh, and the batch is split over threads.
//
// The forward keeps each example's intermediates in one slab (a row of a buffer saved for the
// backward), and the backward walks them in reverse. In float32 σ, tanh and the softmaxes'
// e^y are vector_math.h's vectorisable approximations (a few ulp); in float64 libm's. The
// gradients follow the reference exactly, including its choices: the
// allocation's permutation is a constant, the usage's clamp and the interface clip pass the
// gradient where the value lies inside the closed interval (torch.clamp's rule), softplus is
// linear above 20 (torch's threshold), and the previous write weights get no gradient through
// the usage unless usage_write_grad.
//
// Notation (docs/dnc.md): B batch, N slots, W word size, R read heads, Wh write heads, I the
// interface size, P = 1 + 2·Wh read modes, laid out [b_1..b_Wh, c, f_1..f_Wh] (paper order;
// deepmind's raw order [b…, f…, c] is mapped on the way in and out).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "../../csrc/blas_gemm.h"
#include "../../csrc/vector_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using relmem_math::exp_nonpositive;
using relmem_math::sigmoid;
using relmem_math::tanh_of;
using relmem_blas::blas_gemm;
using relmem_blas::gemm;

// C [m, n] = bias (each row) + A Bᵀ, B [n, k] a Linear's weight.
template <typename T>
void linear(int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B,
            const T* bias, T* C) {
  for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, C + i * n);
  gemm<T>(true, m, n, k, A, lda, B, k, T(1), C, n);
}

// Where each field starts in the interface vector, in this fixed order (memory.py's
// fused_offsets); read modes are -1 without a link, the sharpness without link_sharpness, the
// masks without key_mask.
enum Field { kReadKeys, kReadStrengths, kWriteKeys, kWriteStrengths, kErase, kWriteVectors,
             kFree, kAllocGates, kWriteGates, kReadModes, kSharpness, kReadMasks, kWriteMasks,
             kFields };

struct Dims {
  int64_t N, W, R, Wh, I, P;
  bool link, deepmind, usage_write_grad, dealloc;
  bool sharpen;  // link_sharpness: the sharpness field is present (with a link)
  bool mask;     // key_mask: the mask fields are present
  double clip, eps;
  int64_t off[kFields];

  // The raw interface index of paper-order read mode p.
  int64_t raw_mode(int64_t p) const {
    if (!deepmind || p < Wh) return p;
    return p == Wh ? 2 * Wh : p - 1;
  }
};

// torch.clamp to ±clip (0: none) and the set where it passes the gradient (the closed interval).
template <typename T>
inline bool inside(T x, double clip) {
  return clip <= 0 || (x >= T(-clip) && x <= T(clip));
}

template <typename T>
inline T clipped(T x, double clip) {
  return clip > 0 ? std::min(std::max(x, T(-clip)), T(clip)) : x;
}

template <typename T>
inline T softplus(T x) { return x > T(20) ? x : std::log1p(std::exp(x)); }

template <typename T>
inline T softplus_grad(T x) {
  if (x > T(20)) return T(1);
  const T z = std::exp(x);
  return z / (z + T(1));
}

// Σ_i a[i]·b[i]; `omp simd` lets the compiler keep partial sums in vector lanes (the order of
// the additions differs from a serial loop's by rounding only).
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

// y[i] += alpha·x[i]
template <typename T>
inline void axpy(T* __restrict y, T alpha, const T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// A view of n values: the scratch's fields live in one buffer (kept for the backward when there
// is one) or in the output tensors.
template <typename T>
struct Span {
  T* p = nullptr;
  T& operator[](int64_t i) const { return p[i]; }
  T* data() const { return p; }
};

// Everything one example's forward computes. The intermediates live in one slab of
// slab_size(d) values (a row of the buffer saved for the backward); the outputs (memory, usage,
// link, prec, rw, ww, rv) are written in place into the output tensors' rows.
template <typename T>
struct Scratch {
  Span<T> xc;                                    // [I] clipped interface
  Span<T> beta_r, beta_w, erase, free, ga, gw;   // squashed fields
  Span<T> pi;                                    // [R, P] read modes, paper order
  Span<T> psi, written, upre;                    // [N]
  Span<T> mdeal;                                 // [N, W] ψ-freed memory (dealloc)
  Span<T> wc, wS, wd, wkn, mn_prev;              // write content [Wh, N] x3, [Wh], [N]
  Span<T> usim, sorted, prefix, alloc;           // [Wh, N]
  Span<T> fwd, bwd;                              // [R, Wh, N] (sharpened with link_sharpness)
  Span<T> sharp, fwd_raw, bwd_raw;               // [R, 2] s_b s_f; [R, Wh, N] before sharpening
  Span<T> rc, rS, rd, rkn, mn;                   // read content [R, N] x3, [R], [N]
  // (the memory norms mn_prev and mn are [Wh, N] and [R, N] with key_mask: one per head)
  Span<T> rmask, wmask;                          // key_mask: [R, W], [Wh, W]
  int64_t* order = nullptr;                      // [Wh, N] the allocation's sort
  Span<T> memory, usage, link, prec, rw, ww, rv; // the outputs
};

// Lay the intermediates out from `base` (null: only count); returns the slab's size.
template <typename T>
int64_t place(const Dims& d, Scratch<T>* s, T* base) {
  int64_t at = 0;
  auto take = [&](Span<T>& span, int64_t n) {
    span.p = base ? base + at : nullptr;
    at += n;
  };
  Scratch<T> unused;
  Scratch<T>& x = s ? *s : unused;
  const int64_t N = d.N, R = d.R, Wh = d.Wh, links = d.link ? R * Wh * N : 0;
  take(x.xc, d.I);
  take(x.beta_r, R), take(x.beta_w, Wh), take(x.erase, Wh * d.W), take(x.free, R);
  take(x.ga, Wh), take(x.gw, Wh), take(x.pi, R * d.P);
  take(x.psi, N), take(x.written, N), take(x.upre, N);
  take(x.mdeal, d.dealloc ? N * d.W : 0);
  take(x.wc, Wh * N), take(x.wS, Wh * N), take(x.wd, Wh * N), take(x.wkn, Wh);
  take(x.mn_prev, d.mask ? Wh * N : N);
  take(x.usim, Wh * N), take(x.sorted, Wh * N), take(x.prefix, Wh * N), take(x.alloc, Wh * N);
  take(x.fwd, links), take(x.bwd, links);
  const int64_t sharpened = d.sharpen ? links : 0;
  take(x.sharp, d.sharpen ? 2 * R : 0), take(x.fwd_raw, sharpened), take(x.bwd_raw, sharpened);
  take(x.rc, R * N), take(x.rS, R * N), take(x.rd, R * N), take(x.rkn, R);
  take(x.mn, d.mask ? R * N : N);
  take(x.rmask, d.mask ? R * d.W : 0), take(x.wmask, d.mask ? Wh * d.W : 0);
  return at;
}

// The backward's temporaries, allocated once per thread's chunk of the batch.
template <typename T>
struct Work {
  std::vector<T> gmn, gx, gM, grw, gww, grc, gpi, gfwd, gbwd, gLrow, gerase, gga, ggw, gwc,
      galloc, gu, gsorted, gbeta_r, gbeta_w, gfree, keep, gkeep, others, gsharp, grmask, gwmask,
      km, gkm;
  explicit Work(const Dims& d)
      : gmn(d.N), gx(d.I), gM(d.N * d.W), grw(d.R * d.N), gww(d.Wh * d.N), grc(d.R * d.N),
        gpi(d.R * d.P), gfwd(d.R * d.Wh * d.N), gbwd(d.R * d.Wh * d.N), gLrow(d.N),
        gerase(d.Wh * d.W), gga(d.Wh), ggw(d.Wh), gwc(d.Wh * d.N), galloc(d.Wh * d.N), gu(d.N),
        gsorted(d.N), gbeta_r(d.R), gbeta_w(d.Wh), gfree(d.R), keep(d.W), gkeep(d.W),
        others(d.W), gsharp(2 * d.R), grmask(d.R * d.W), gwmask(d.Wh * d.W), km(d.W),
        gkm(d.W) {}
};

// ---------------------------------------------------------------- content addressing (§4)

// w[n] = softmax_n(β · S[n]) over one head's similarities S [N].
template <typename T>
void scaled_softmax(const T* S, T beta, int64_t N, T* w) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t n = 0; n < N; ++n) top = std::max(top, beta * S[n]);
  T total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t n = 0; n < N; ++n) {
    w[n] = exp_nonpositive(beta * S[n] - top);
    total += w[n];
  }
  for (int64_t n = 0; n < N; ++n) w[n] /= total;
}

// w[h, :] = softmax_n(β_h · S[h, n]), S = k_h·M_n / (‖k_h‖_ε ‖M_n‖_ε + ε).
template <typename T>
void content_forward(const Dims& d, const T* M, const T* keys, const T* beta, int64_t H, T* w,
                     T* S, T* dots, T* kn, T* mn) {
  const int64_t N = d.N, W = d.W;
  const T eps = T(d.eps);
  for (int64_t n = 0; n < N; ++n) mn[n] = std::sqrt(dot(M + n * W, M + n * W, W) + eps);
  for (int64_t h = 0; h < H; ++h) {
    const T* k = keys + h * W;
    kn[h] = std::sqrt(dot(k, k, W) + eps);
    for (int64_t n = 0; n < N; ++n) {
      const T p = dot(k, M + n * W, W);
      dots[h * N + n] = p;
      S[h * N + n] = p / (kn[h] * mn[n] + eps);
    }
    scaled_softmax(S + h * N, beta[h], N, w + h * N);
  }
}

// Adds to gM [N, W]; writes gkeys [H, W] and gbeta [H].
template <typename T>
void content_backward(const Dims& d, const T* M, const T* keys, const T* beta, int64_t H,
                      const T* w, const T* S, const T* dots, const T* kn, const T* mn,
                      const T* gw, T* gM, T* gkeys, T* gbeta, std::vector<T>& gmn) {
  const int64_t N = d.N, W = d.W;
  const T eps = T(d.eps);
  std::fill(gmn.begin(), gmn.end(), T(0));
  for (int64_t h = 0; h < H; ++h) {
    const T* k = keys + h * W;
    T* gk = gkeys + h * W;
    const T inner = dot(gw + h * N, w + h * N, N);
    T gb = 0, gkn = 0;
    std::fill(gk, gk + W, T(0));
    for (int64_t n = 0; n < N; ++n) {
      const T gz = w[h * N + n] * (gw[h * N + n] - inner);
      gb += gz * S[h * N + n];
      const T gS = gz * beta[h];
      const T den = kn[h] * mn[n] + eps;
      const T gdot = gS / den;
      const T gden = -gS * dots[h * N + n] / (den * den);
      gkn += gden * mn[n];
      gmn[n] += gden * kn[h];
      axpy(gk, gdot, M + n * W, W);
      axpy(gM + n * W, gdot, k, W);
    }
    gbeta[h] = gb;
    axpy(gk, gkn / kn[h], k, W);
  }
  for (int64_t n = 0; n < N; ++n) axpy(gM + n * W, gmn[n] / mn[n], M + n * W, W);
}

// key_mask: head h's key and every memory row masked by m_h [W] before the cosine:
// S[h, n] = (k_h ∘ m_h)·(M_n ∘ m_h) / (‖k_h ∘ m_h‖_ε ‖M_n ∘ m_h‖_ε + ε);
// mn is [H, N].
template <typename T>
void masked_content_forward(const Dims& d, const T* M, const T* keys, const T* beta,
                            const T* masks, int64_t H, T* w, T* S, T* dots, T* kn, T* mn) {
  const int64_t N = d.N, W = d.W;
  const T eps = T(d.eps);
  for (int64_t h = 0; h < H; ++h) {
    const T* k = keys + h * W;
    const T* m = masks + h * W;
    T kk = 0;
    for (int64_t c = 0; c < W; ++c) kk += (k[c] * m[c]) * (k[c] * m[c]);
    kn[h] = std::sqrt(kk + eps);
    for (int64_t n = 0; n < N; ++n) {
      const T* row = M + n * W;
      T p = 0, q = 0;
      for (int64_t c = 0; c < W; ++c) {
        const T mm = row[c] * m[c];
        p += (k[c] * m[c]) * mm;
        q += mm * mm;
      }
      mn[h * N + n] = std::sqrt(q + eps);
      dots[h * N + n] = p;
      S[h * N + n] = p / (kn[h] * mn[h * N + n] + eps);
    }
    scaled_softmax(S + h * N, beta[h], N, w + h * N);
  }
}

// Adds to gM [N, W]; writes gkeys [H, W], gbeta [H] and gmasks [H, W].
template <typename T>
void masked_content_backward(const Dims& d, const T* M, const T* keys, const T* beta,
                             const T* masks, int64_t H, const T* w, const T* S, const T* dots,
                             const T* kn, const T* mn, const T* gw, T* gM, T* gkeys, T* gbeta,
                             T* gmasks, Work<T>& work) {
  const int64_t N = d.N, W = d.W;
  const T eps = T(d.eps);
  T* km = work.km.data();
  T* gkm = work.gkm.data();
  for (int64_t h = 0; h < H; ++h) {
    const T* k = keys + h * W;
    const T* m = masks + h * W;
    T* gm = gmasks + h * W;
    for (int64_t c = 0; c < W; ++c) km[c] = k[c] * m[c];
    std::fill(gkm, gkm + W, T(0));
    std::fill(gm, gm + W, T(0));
    const T inner = dot(gw + h * N, w + h * N, N);
    T gb = 0, gkn = 0;
    for (int64_t n = 0; n < N; ++n) {
      const T gz = w[h * N + n] * (gw[h * N + n] - inner);
      gb += gz * S[h * N + n];
      const T gS = gz * beta[h];
      const T mnh = mn[h * N + n];
      const T den = kn[h] * mnh + eps;
      const T gdot = gS / den;
      const T gden = -gS * dots[h * N + n] / (den * den);
      gkn += gden * mnh;
      const T gnorm = gden * kn[h] / mnh;  // of ‖M_n ∘ m‖, over the norm
      const T* row = M + n * W;
      T* grow = gM + n * W;
      for (int64_t c = 0; c < W; ++c) {
        const T mm = row[c] * m[c];
        const T gmm = gdot * km[c] + gnorm * mm;  // of M_n ∘ m
        gkm[c] += gdot * mm;
        grow[c] += gmm * m[c];
        gm[c] += gmm * row[c];
      }
    }
    gbeta[h] = gb;
    T* gk = gkeys + h * W;
    for (int64_t c = 0; c < W; ++c) {
      const T g = gkm[c] + gkn * km[c] / kn[h];  // of k ∘ m
      gk[c] = g * m[c];
      gm[c] += g * k[c];
    }
  }
}

// ---------------------------------------------------------------- link sharpening

// y = x^s / (Σ x^s + ε) over n, a zero entry staying zero (addressing.sharpen).
template <typename T>
void sharpen_forward(const T* x, T s, T eps, int64_t N, T* y) {
  T total = 0;
  for (int64_t n = 0; n < N; ++n) {
    y[n] = x[n] > T(0) ? std::pow(x[n], s) : T(0);
    total += y[n];
  }
  for (int64_t n = 0; n < N; ++n) y[n] /= total + eps;
}

// g holds the gradient of y on entry and that of x on return; returns the gradient of s.
template <typename T>
T sharpen_backward(const T* x, const T* y, T s, T eps, int64_t N, T* g) {
  T total = 0, inner = 0;
  for (int64_t n = 0; n < N; ++n) {
    total += x[n] > T(0) ? std::pow(x[n], s) : T(0);
    inner += g[n] * y[n];
  }
  const T z = total + eps;
  T gs = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T gp = (g[n] - inner) / z;  // of x^s: its own term and the sum's
    if (x[n] > T(0)) {
      gs += gp * std::pow(x[n], s) * std::log(x[n]);
      g[n] = gp * s * std::pow(x[n], s - T(1));
    } else {
      g[n] = 0;
    }
  }
  return gs;
}

// ---------------------------------------------------------------- one example's forward

// The inputs of one example: pointers into the batch's tensors.
template <typename T>
struct Inputs {
  const T *xi, *M, *u, *L, *p, *rw, *ww;
};

template <typename T>
void step_forward(const Dims& d, const Inputs<T>& in, Scratch<T>& s) {
  const int64_t N = d.N, W = d.W, R = d.R, Wh = d.Wh, P = d.P;
  const T eps = T(d.eps);
  // 3. the interface, clipped and squashed
  for (int64_t i = 0; i < d.I; ++i) s.xc[i] = clipped(in.xi[i], d.clip);
  const T* xc = s.xc.data();
  const T base = d.deepmind ? T(0) : T(1);  // oneplus = 1 + softplus
  for (int64_t r = 0; r < R; ++r) {
    s.beta_r[r] = base + softplus(xc[d.off[kReadStrengths] + r]);
    s.free[r] = sigmoid(xc[d.off[kFree] + r]);
  }
  for (int64_t j = 0; j < Wh; ++j) {
    s.beta_w[j] = base + softplus(xc[d.off[kWriteStrengths] + j]);
    s.ga[j] = sigmoid(xc[d.off[kAllocGates] + j]);
    s.gw[j] = sigmoid(xc[d.off[kWriteGates] + j]);
  }
  for (int64_t i = 0; i < Wh * W; ++i) s.erase[i] = sigmoid(xc[d.off[kErase] + i]);
  if (d.link) {
    for (int64_t r = 0; r < R; ++r) {
      const T* raw = xc + d.off[kReadModes] + r * P;
      T top = -std::numeric_limits<T>::infinity();
      for (int64_t q = 0; q < P; ++q) top = std::max(top, raw[q]);
      T total = 0;
      for (int64_t q = 0; q < P; ++q) total += std::exp(raw[q] - top);
      for (int64_t p = 0; p < P; ++p) s.pi[r * P + p] = std::exp(raw[d.raw_mode(p)] - top) / total;
    }
  }
  for (int64_t i = 0; i < (d.sharpen ? 2 * R : 0); ++i) {
    s.sharp[i] = T(1) + softplus(xc[d.off[kSharpness] + i]);  // oneplus in both compat modes
  }
  for (int64_t i = 0; i < (d.mask ? R * W : 0); ++i) {
    s.rmask[i] = sigmoid(xc[d.off[kReadMasks] + i]);
  }
  for (int64_t i = 0; i < (d.mask ? Wh * W : 0); ++i) {
    s.wmask[i] = sigmoid(xc[d.off[kWriteMasks] + i]);
  }
  const T* read_keys = xc + d.off[kReadKeys];
  const T* write_keys = xc + d.off[kWriteKeys];
  const T* write_vectors = xc + d.off[kWriteVectors];

  // 4. usage
  for (int64_t n = 0; n < N; ++n) {
    T psi = 1, kept = 1;
    for (int64_t r = 0; r < R; ++r) psi *= T(1) - s.free[r] * in.rw[r * N + n];
    for (int64_t j = 0; j < Wh; ++j) kept *= T(1) - in.ww[j * N + n];
    s.psi[n] = psi;
    s.written[n] = T(1) - kept;
    s.upre[n] = (in.u[n] + s.written[n] - in.u[n] * s.written[n]) * psi;
    s.usage[n] = std::min(std::max(s.upre[n], T(0)), T(1));
  }

  // dealloc_content: the freed slots' contents are wiped, M ∘ ψ, before the write
  const T* base_memory = in.M;
  if (d.dealloc) {
    for (int64_t n = 0; n < N; ++n) {
      const T* mp = in.M + n * W;
      T* __restrict row = s.mdeal.data() + n * W;
#pragma omp simd
      for (int64_t c = 0; c < W; ++c) row[c] = mp[c] * s.psi[n];
    }
    base_memory = s.mdeal.data();
  }

  // 5. write weights: content on the previous memory, allocation from the new usage
  if (d.mask) {
    masked_content_forward(d, base_memory, write_keys, s.beta_w.data(), s.wmask.data(), Wh,
                           s.wc.data(), s.wS.data(), s.wd.data(), s.wkn.data(), s.mn_prev.data());
  } else {
    content_forward(d, base_memory, write_keys, s.beta_w.data(), Wh, s.wc.data(), s.wS.data(),
                    s.wd.data(), s.wkn.data(), s.mn_prev.data());
  }
  std::copy(s.usage.data(), s.usage.data() + N, s.usim.data());
  for (int64_t j = 0; j < Wh; ++j) {
    T* u = s.usim.data() + j * N;
    T* sorted = s.sorted.data() + j * N;
    T* prefix = s.prefix.data() + j * N;
    T* a = s.alloc.data() + j * N;
    int64_t* order = s.order + j * N;
    T* clamped = a;  // each a[order[k]] is written after clamped[order[k]] is read
    for (int64_t n = 0; n < N; ++n) clamped[n] = eps + (T(1) - eps) * u[n];
    std::iota(order, order + N, int64_t(0));
    std::stable_sort(order, order + N,
                     [&](int64_t x, int64_t y) { return clamped[x] < clamped[y]; });
    T product = 1;
    for (int64_t k = 0; k < N; ++k) {
      sorted[k] = clamped[order[k]];
      prefix[k] = product;
      a[order[k]] = (T(1) - sorted[k]) * product;
      product *= sorted[k];
    }
    if (j + 1 < Wh) {
      const T g = s.ga[j] * s.gw[j];
      for (int64_t n = 0; n < N; ++n) u[N + n] = u[n] + (T(1) - u[n]) * g * a[n];
    }
  }
  for (int64_t j = 0; j < Wh; ++j) {
    for (int64_t n = 0; n < N; ++n) {
      s.ww[j * N + n] =
          s.gw[j] * (s.ga[j] * s.alloc[j * N + n] + (T(1) - s.ga[j]) * s.wc[j * N + n]);
    }
  }

  // 6. erase and add, the word's columns innermost: M[n, c] = Mp[n, c] Π_j (1 − w_jn e_jc),
  // then + w_jn v_jc head by head
  for (int64_t n = 0; n < N; ++n) {
    T* __restrict row = s.memory.data() + n * W;
    const T* mp = base_memory + n * W;
    std::copy(mp, mp + W, row);
    for (int64_t j = 0; j < Wh; ++j) {
      const T w = s.ww[j * N + n];
      const T* e = s.erase.data() + j * W;
#pragma omp simd
      for (int64_t c = 0; c < W; ++c) row[c] *= T(1) - w * e[c];
    }
    for (int64_t j = 0; j < Wh; ++j) axpy(row, s.ww[j * N + n], write_vectors + j * W, W);
  }

  // 7. link with the previous precedence, then precedence; the directional weights from each
  // new row while it is in cache
  if (d.link) {
    std::fill(s.bwd.data(), s.bwd.data() + R * Wh * N, T(0));
    for (int64_t j = 0; j < Wh; ++j) {
      const T* w = s.ww.data() + j * N;
      const T* pp = in.p + j * N;
      const T* Lp = in.L + j * N * N;
      T* L = s.link.data() + j * N * N;
      for (int64_t i = 0; i < N; ++i) {
        const T wi = w[i];
        T* __restrict row = L + i * N;
        const T* prev = Lp + i * N;
#pragma omp simd
        for (int64_t k = 0; k < N; ++k) row[k] = (T(1) - wi - w[k]) * prev[k] + wi * pp[k];
        row[i] = 0;
        for (int64_t r = 0; r < R; ++r) {
          const T* rwp = in.rw + r * N;
          s.fwd[(r * Wh + j) * N + i] = dot(row, rwp, N);
          axpy(s.bwd.data() + (r * Wh + j) * N, rwp[i], row, N);
        }
      }
      T total = 0;
      for (int64_t n = 0; n < N; ++n) total += w[n];
      for (int64_t n = 0; n < N; ++n) s.prec[j * N + n] = (T(1) - total) * pp[n] + w[n];
    }
  }

  // link_sharpness: b^{s_b} and f^{s_f}, each normalised over the slots
  if (d.sharpen) {
    const int64_t links = R * Wh * N;
    std::copy(s.bwd.data(), s.bwd.data() + links, s.bwd_raw.data());
    std::copy(s.fwd.data(), s.fwd.data() + links, s.fwd_raw.data());
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < Wh; ++j) {
        const int64_t at = (r * Wh + j) * N;
        sharpen_forward(s.bwd_raw.data() + at, s.sharp[2 * r], eps, N, s.bwd.data() + at);
        sharpen_forward(s.fwd_raw.data() + at, s.sharp[2 * r + 1], eps, N, s.fwd.data() + at);
      }
    }
  }

  // 8. read weights on the new memory, then read vectors
  if (d.mask) {
    masked_content_forward(d, s.memory.data(), read_keys, s.beta_r.data(), s.rmask.data(), R,
                           s.rc.data(), s.rS.data(), s.rd.data(), s.rkn.data(), s.mn.data());
  } else {
    content_forward(d, s.memory.data(), read_keys, s.beta_r.data(), R, s.rc.data(), s.rS.data(),
                    s.rd.data(), s.rkn.data(), s.mn.data());
  }
  for (int64_t r = 0; r < R; ++r) {
    T* rw = s.rw.data() + r * N;
    if (!d.link) {
      std::copy(s.rc.data() + r * N, s.rc.data() + (r + 1) * N, rw);
    } else {
      const T* pi = s.pi.data() + r * P;
      for (int64_t n = 0; n < N; ++n) rw[n] = pi[Wh] * s.rc[r * N + n];
      for (int64_t j = 0; j < Wh; ++j) {
        const T* b = s.bwd.data() + (r * Wh + j) * N;
        const T* f = s.fwd.data() + (r * Wh + j) * N;
        for (int64_t n = 0; n < N; ++n) rw[n] += pi[j] * b[n] + pi[Wh + 1 + j] * f[n];
      }
    }
    T* rv = s.rv.data() + r * W;
    std::fill(rv, rv + W, T(0));
    for (int64_t n = 0; n < N; ++n) axpy(rv, rw[n], s.memory.data() + n * W, W);
  }
}

// ---------------------------------------------------------------- one example's backward

// The gradients of one example's outputs (null: zero) and of its inputs (all written).
template <typename T>
struct Grads {
  const T *M, *u, *L, *p, *rw, *ww, *rv;  // of the outputs
  T *xi, *Mp, *up, *Lp, *pp, *rwp, *wwp;  // of the inputs (wwp null: not wanted)
};

template <typename T>
void step_backward(const Dims& d, const Inputs<T>& in, const Scratch<T>& s, const Grads<T>& g,
                   Work<T>& work) {
  const int64_t N = d.N, W = d.W, R = d.R, Wh = d.Wh, P = d.P;
  const T eps = T(d.eps);
  const T* xc = s.xc.data();
  auto at = [](const T* p, int64_t i) { return p ? p[i] : T(0); };
  std::vector<T>& gmn = work.gmn;
  std::vector<T>& gx = work.gx;  // of the clipped interface
  std::fill(gx.begin(), gx.end(), T(0));

  // new memory, read weights, write weights: gradients gathered from every use
  std::vector<T>&gM = work.gM, &grw = work.grw, &gww = work.gww;
  for (int64_t i = 0; i < N * W; ++i) gM[i] = at(g.M, i);
  for (int64_t i = 0; i < R * N; ++i) grw[i] = at(g.rw, i);
  for (int64_t i = 0; i < Wh * N; ++i) gww[i] = at(g.ww, i);
  std::fill(g.rwp, g.rwp + R * N, T(0));

  // 8. read vectors and read weights
  for (int64_t r = 0; r < R; ++r) {
    const T* rw = s.rw.data() + r * N;
    if (!g.rv) continue;
    const T* gv = g.rv + r * W;
    for (int64_t n = 0; n < N; ++n) {
      grw[r * N + n] += dot(gv, s.memory.data() + n * W, W);
      axpy(gM.data() + n * W, rw[n], gv, W);
    }
  }
  std::vector<T>&grc = work.grc, &gpi = work.gpi, &gfwd = work.gfwd, &gbwd = work.gbwd;
  if (!d.link) {
    grc = grw;
  } else {
    for (int64_t r = 0; r < R; ++r) {
      const T* pi = s.pi.data() + r * P;
      const T* gr = grw.data() + r * N;
      T gc = 0;
      for (int64_t n = 0; n < N; ++n) {
        grc[r * N + n] = pi[Wh] * gr[n];
        gc += gr[n] * s.rc[r * N + n];
      }
      gpi[r * P + Wh] = gc;
      for (int64_t j = 0; j < Wh; ++j) {
        const T* b = s.bwd.data() + (r * Wh + j) * N;
        const T* f = s.fwd.data() + (r * Wh + j) * N;
        T gb = 0, gf = 0;
        for (int64_t n = 0; n < N; ++n) {
          gb += gr[n] * b[n];
          gf += gr[n] * f[n];
          gbwd[(r * Wh + j) * N + n] = pi[j] * gr[n];
          gfwd[(r * Wh + j) * N + n] = pi[Wh + 1 + j] * gr[n];
        }
        gpi[r * P + j] = gb;
        gpi[r * P + Wh + 1 + j] = gf;
      }
    }
  }
  // link_sharpness: gfwd and gbwd back through the sharpening, to the raw directional weights
  std::vector<T>& gsharp = work.gsharp;
  if (d.sharpen) {
    for (int64_t r = 0; r < R; ++r) {
      gsharp[2 * r] = gsharp[2 * r + 1] = 0;
      for (int64_t j = 0; j < Wh; ++j) {
        const int64_t at = (r * Wh + j) * N;
        gsharp[2 * r] += sharpen_backward(s.bwd_raw.data() + at, s.bwd.data() + at,
                                          s.sharp[2 * r], eps, N, gbwd.data() + at);
        gsharp[2 * r + 1] += sharpen_backward(s.fwd_raw.data() + at, s.fwd.data() + at,
                                              s.sharp[2 * r + 1], eps, N, gfwd.data() + at);
      }
    }
  }
  std::vector<T>& gbeta_r = work.gbeta_r;
  if (d.mask) {
    masked_content_backward(d, s.memory.data(), xc + d.off[kReadKeys], s.beta_r.data(),
                            s.rmask.data(), R, s.rc.data(), s.rS.data(), s.rd.data(),
                            s.rkn.data(), s.mn.data(), grc.data(), gM.data(),
                            gx.data() + d.off[kReadKeys], gbeta_r.data(), work.grmask.data(), work);
  } else {
    content_backward(d, s.memory.data(), xc + d.off[kReadKeys], s.beta_r.data(), R, s.rc.data(),
                     s.rS.data(), s.rd.data(), s.rkn.data(), s.mn.data(), grc.data(), gM.data(),
                     gx.data() + d.off[kReadKeys], gbeta_r.data(), gmn);
  }

  // 7. precedence, then the link row by row: each row's gradient from the output and the
  // directional weights, then through the link's update
  if (d.link) {
    for (int64_t j = 0; j < Wh; ++j) {
      const T* w = s.ww.data() + j * N;
      const T* pp = in.p + j * N;
      const T* Lp = in.L + j * N * N;
      const T* L = s.link.data() + j * N * N;
      const T* gLout = g.L ? g.L + j * N * N : nullptr;
      T* gpp = g.pp + j * N;
      T* gw = gww.data() + j * N;
      // p = (1 − Σ w) p_prev + w
      T total = 0, gdot = 0;
      for (int64_t n = 0; n < N; ++n) {
        total += w[n];
        gdot += at(g.p ? g.p + j * N : nullptr, n) * pp[n];
      }
      for (int64_t n = 0; n < N; ++n) {
        const T gp = at(g.p ? g.p + j * N : nullptr, n);
        gpp[n] = (T(1) - total) * gp;
        gw[n] += gp - gdot;
      }
      T* gl = work.gLrow.data();
      T* gLp = g.Lp + j * N * N;
      for (int64_t i = 0; i < N; ++i) {
        const T* row = L + i * N;
        if (gLout) {
          std::copy(gLout + i * N, gLout + (i + 1) * N, gl);
        } else {
          std::fill(gl, gl + N, T(0));
        }
        // f[r, i] = Σ_k L[i, k] w_r[k];  b[r, k] = Σ_i w_r[i] L[i, k]
        for (int64_t r = 0; r < R; ++r) {
          const T* rwp = in.rw + r * N;
          const T gf = gfwd[(r * Wh + j) * N + i];
          const T* gb = gbwd.data() + (r * Wh + j) * N;
          T* grp = g.rwp + r * N;
          axpy(gl, gf, rwp, N);
          axpy(gl, rwp[i], gb, N);
          axpy(grp, gf, row, N);
          grp[i] += dot(gb, row, N);
        }
        // L[i, k] = (1 − w_i − w_k) Lp[i, k] + w_i pp[k] off the diagonal, which is set to 0
        gl[i] = 0;
        const T* prev = Lp + i * N;
        T* __restrict gprev = gLp + i * N;
        const T wi = w[i];
        T gwi = 0;
#pragma omp simd reduction(+ : gwi)
        for (int64_t k = 0; k < N; ++k) {
          gprev[k] = (T(1) - wi - w[k]) * gl[k];
          gwi += gl[k] * (pp[k] - prev[k]);
          gw[k] -= gl[k] * prev[k];
          gpp[k] += gl[k] * wi;
        }
        gw[i] += gwi;
      }
    }
  }

  const T* base_memory = d.dealloc ? s.mdeal.data() : in.M;
  // 6. erase and add, a memory row at a time with the word's columns innermost (vectorised):
  // M[n, c] = Mp[n, c] Π_j (1 − w_jn e_jc) + Σ_j w_jn v_jc
  std::vector<T>& gerase = work.gerase;
  std::fill(gerase.begin(), gerase.end(), T(0));
  T* gv = gx.data() + d.off[kWriteVectors];
  const T* write_vectors = xc + d.off[kWriteVectors];
  T* __restrict keep = work.keep.data();
  T* __restrict gkeep = work.gkeep.data();
  T* __restrict others = work.others.data();
  for (int64_t n = 0; n < N; ++n) {
    const T* gm = gM.data() + n * W;
    std::fill(keep, keep + W, T(1));
    for (int64_t j = 0; j < Wh; ++j) {
      const T w = s.ww[j * N + n];
      const T* e = s.erase.data() + j * W;
#pragma omp simd
      for (int64_t c = 0; c < W; ++c) keep[c] *= T(1) - w * e[c];
    }
    T* __restrict gmp = g.Mp + n * W;  // of the memory written to (M ∘ ψ with dealloc)
    const T* mp = base_memory + n * W;
#pragma omp simd
    for (int64_t c = 0; c < W; ++c) {
      gmp[c] = gm[c] * keep[c];
      gkeep[c] = gm[c] * mp[c];
    }
    for (int64_t j = 0; j < Wh; ++j) {
      std::fill(others, others + W, T(1));  // Π over the other heads, without a division
      for (int64_t o = 0; o < Wh; ++o) {
        if (o == j) continue;
        const T wo = s.ww[o * N + n];
        const T* eo = s.erase.data() + o * W;
#pragma omp simd
        for (int64_t c = 0; c < W; ++c) others[c] *= T(1) - wo * eo[c];
      }
      const T w = s.ww[j * N + n];
      const T* e = s.erase.data() + j * W;
      const T* v = write_vectors + j * W;
      T* __restrict ge = gerase.data() + j * W;
      T* __restrict gvj = gv + j * W;
      T gw = 0;
#pragma omp simd reduction(+ : gw)
      for (int64_t c = 0; c < W; ++c) {
        const T gko = gkeep[c] * others[c];
        gw += gm[c] * v[c] - gko * e[c];
        ge[c] -= gko * w;
        gvj[c] += w * gm[c];
      }
      gww[j * N + n] += gw;
    }
  }

  // 5. write weights, allocation (heads in reverse), write content
  std::vector<T>&gga = work.gga, &ggw = work.ggw, &gwc = work.gwc, &galloc = work.galloc;
  std::fill(gga.begin(), gga.end(), T(0));
  std::fill(ggw.begin(), ggw.end(), T(0));
  for (int64_t j = 0; j < Wh; ++j) {
    for (int64_t n = 0; n < N; ++n) {
      const T gw = gww[j * N + n];
      const T a = s.alloc[j * N + n], c = s.wc[j * N + n];
      ggw[j] += gw * (s.ga[j] * a + (T(1) - s.ga[j]) * c);
      gga[j] += gw * s.gw[j] * (a - c);
      galloc[j * N + n] = gw * s.gw[j] * s.ga[j];
      gwc[j * N + n] = gw * s.gw[j] * (T(1) - s.ga[j]);
    }
  }
  // gu: of the simulated usage after head j
  std::vector<T>&gu = work.gu, &gsorted = work.gsorted;
  std::fill(gu.begin(), gu.end(), T(0));
  for (int64_t j = Wh - 1; j >= 0; --j) {
    const T* u = s.usim.data() + j * N;
    const T* a = s.alloc.data() + j * N;
    T* ga = galloc.data() + j * N;
    if (j + 1 < Wh) {  // u_{j+1} = u_j + (1 − u_j) g_j a_j, g_j = ga_j gw_j
      const T gate = s.ga[j] * s.gw[j];
      T ggate = 0;
      for (int64_t n = 0; n < N; ++n) {
        ggate += gu[n] * (T(1) - u[n]) * a[n];
        ga[n] += gu[n] * (T(1) - u[n]) * gate;
        gu[n] *= T(1) - gate * a[n];
      }
      gga[j] += ggate * s.gw[j];
      ggw[j] += ggate * s.ga[j];
    }
    // a[φ_k] = (1 − s_k) Π_{i<k} s_i; Σ_{m>k} of the later terms kept as a running tail
    const T* sorted = s.sorted.data() + j * N;
    const T* prefix = s.prefix.data() + j * N;
    const int64_t* order = s.order + j * N;
    T later = 0;
    for (int64_t k = N - 1; k >= 0; --k) {
      const T gsa = ga[order[k]];
      gsorted[k] = prefix[k] * (later - gsa);
      later = gsa * (T(1) - sorted[k]) + sorted[k] * later;
    }
    for (int64_t k = 0; k < N; ++k) gu[order[k]] += (T(1) - eps) * gsorted[k];
  }
  std::vector<T>& gbeta_w = work.gbeta_w;
  if (d.mask) {
    masked_content_backward(d, base_memory, xc + d.off[kWriteKeys], s.beta_w.data(),
                            s.wmask.data(), Wh, s.wc.data(), s.wS.data(), s.wd.data(),
                            s.wkn.data(), s.mn_prev.data(), gwc.data(), g.Mp,
                            gx.data() + d.off[kWriteKeys], gbeta_w.data(), work.gwmask.data(),
                            work);
  } else {
    content_backward(d, base_memory, xc + d.off[kWriteKeys], s.beta_w.data(), Wh, s.wc.data(),
                     s.wS.data(), s.wd.data(), s.wkn.data(), s.mn_prev.data(), gwc.data(), g.Mp,
                     gx.data() + d.off[kWriteKeys], gbeta_w.data(), gmn);
  }
  // dealloc_content: g.Mp holds the gradient of M ∘ ψ; gmn (free again) takes ψ's share
  std::fill(gmn.begin(), gmn.end(), T(0));
  if (d.dealloc) {
    for (int64_t n = 0; n < N; ++n) {
      T* __restrict gmp = g.Mp + n * W;
      const T* mp = in.M + n * W;
      const T psi = s.psi[n];
      T gpsi = 0;
#pragma omp simd reduction(+ : gpsi)
      for (int64_t c = 0; c < W; ++c) {
        gpsi += gmp[c] * mp[c];
        gmp[c] *= psi;
      }
      gmn[n] = gpsi;
    }
  }

  // 4. usage (gu now also holds the output's gradient)
  std::vector<T>& gfree = work.gfree;
  std::fill(gfree.begin(), gfree.end(), T(0));
  if (g.wwp) std::fill(g.wwp, g.wwp + Wh * N, T(0));
  for (int64_t n = 0; n < N; ++n) {
    T gun = gu[n] + at(g.u, n);
    if (!(s.upre[n] >= T(0) && s.upre[n] <= T(1))) gun = 0;
    const T up = in.u[n], wr = s.written[n], psi = s.psi[n];
    g.up[n] = gun * psi * (T(1) - wr);
    const T gpsi = gun * (up + wr - up * wr) + gmn[n];
    if (g.wwp) {
      const T gwr = gun * psi * (T(1) - up);
      for (int64_t j = 0; j < Wh; ++j) {
        T others = 1;
        for (int64_t o = 0; o < Wh; ++o) {
          if (o != j) others *= T(1) - in.ww[o * N + n];
        }
        g.wwp[j * N + n] = gwr * others;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      T others = 1;
      for (int64_t o = 0; o < R; ++o) {
        if (o != r) others *= T(1) - s.free[o] * in.rw[o * N + n];
      }
      gfree[r] -= gpsi * in.rw[r * N + n] * others;
      g.rwp[r * N + n] -= gpsi * s.free[r] * others;
    }
  }

  // 3. the squashing, then the clip
  for (int64_t r = 0; r < R; ++r) {
    const int64_t at_s = d.off[kReadStrengths] + r, at_f = d.off[kFree] + r;
    gx[at_s] = gbeta_r[r] * softplus_grad(xc[at_s]);
    gx[at_f] = gfree[r] * s.free[r] * (T(1) - s.free[r]);
  }
  for (int64_t j = 0; j < Wh; ++j) {
    const int64_t at_s = d.off[kWriteStrengths] + j;
    gx[at_s] = gbeta_w[j] * softplus_grad(xc[at_s]);
    gx[d.off[kAllocGates] + j] = gga[j] * s.ga[j] * (T(1) - s.ga[j]);
    gx[d.off[kWriteGates] + j] = ggw[j] * s.gw[j] * (T(1) - s.gw[j]);
  }
  for (int64_t i = 0; i < Wh * W; ++i) {
    gx[d.off[kErase] + i] = gerase[i] * s.erase[i] * (T(1) - s.erase[i]);
  }
  if (d.link) {
    for (int64_t r = 0; r < R; ++r) {
      const T* pi = s.pi.data() + r * P;
      T inner = 0;
      for (int64_t p = 0; p < P; ++p) inner += gpi[r * P + p] * pi[p];
      for (int64_t p = 0; p < P; ++p) {
        gx[d.off[kReadModes] + r * P + d.raw_mode(p)] = pi[p] * (gpi[r * P + p] - inner);
      }
    }
  }
  for (int64_t i = 0; i < (d.sharpen ? 2 * R : 0); ++i) {
    const int64_t at_s = d.off[kSharpness] + i;
    gx[at_s] = gsharp[i] * softplus_grad(xc[at_s]);
  }
  for (int64_t i = 0; i < (d.mask ? R * W : 0); ++i) {
    gx[d.off[kReadMasks] + i] = work.grmask[i] * s.rmask[i] * (T(1) - s.rmask[i]);
  }
  for (int64_t i = 0; i < (d.mask ? Wh * W : 0); ++i) {
    gx[d.off[kWriteMasks] + i] = work.gwmask[i] * s.wmask[i] * (T(1) - s.wmask[i]);
  }
  for (int64_t i = 0; i < d.I; ++i) g.xi[i] = inside(in.xi[i], d.clip) ? gx[i] : T(0);
}

// ---------------------------------------------------------------- the operator

Dims make_dims(const Tensor& interface, const Tensor& memory, const Tensor& read_weights,
               const Tensor& write_weights, bool link, at::IntArrayRef offsets, bool deepmind,
               bool usage_write_grad, bool dealloc, double clip, double eps) {
  TORCH_CHECK(offsets.size() == kFields, "relmem DNC memory step: offsets must hold ", kFields,
              " field offsets, got ", offsets.size());
  Dims d;
  d.N = memory.size(1);
  d.W = memory.size(2);
  d.R = read_weights.size(1);
  d.Wh = write_weights.size(1);
  d.I = interface.size(1);
  d.P = 1 + 2 * d.Wh;
  d.link = link;
  d.deepmind = deepmind;
  d.usage_write_grad = usage_write_grad;
  d.dealloc = dealloc;
  d.sharpen = link && offsets[kSharpness] >= 0;
  d.mask = offsets[kReadMasks] >= 0;
  d.clip = clip;
  d.eps = eps;
  for (int64_t f = 0; f < kFields; ++f) d.off[f] = offsets[f];
  return d;
}

void check_inputs(const Dims& d, const tensor_list& t) {
  static const char* names[] = {"interface", "memory", "usage", "link", "precedence",
                                "read_weights", "write_weights"};
  const int64_t B = t[0].size(0);
  const std::vector<std::vector<int64_t>> shapes = {
      {B, d.I}, {B, d.N, d.W}, {B, d.N},
      d.link ? std::vector<int64_t>{B, d.Wh, d.N, d.N} : std::vector<int64_t>{0},
      d.link ? std::vector<int64_t>{B, d.Wh, d.N} : std::vector<int64_t>{0},
      {B, d.R, d.N}, {B, d.Wh, d.N}};
  for (size_t i = 0; i < t.size(); ++i) {
    TORCH_CHECK(t[i].device().is_cpu(), "relmem DNC memory step: ", names[i],
                " must be on the CPU, got ", t[i].device());
    TORCH_CHECK(t[i].scalar_type() == t[0].scalar_type(), "relmem DNC memory step: ", names[i],
                " has dtype ", t[i].scalar_type(), ", the interface ", t[0].scalar_type());
    TORCH_CHECK(t[i].sizes() == at::IntArrayRef(shapes[i]), "relmem DNC memory step: ", names[i],
                " must have shape ", at::IntArrayRef(shapes[i]), ", got ", t[i].sizes());
  }
  TORCH_CHECK(t[0].scalar_type() == at::kFloat || t[0].scalar_type() == at::kDouble,
              "relmem DNC memory step: float32 or float64 only, got ", t[0].scalar_type());
  const int64_t sizes[kFields] = {d.R * d.W, d.R,  d.Wh * d.W, d.Wh, d.Wh * d.W,
                                  d.Wh * d.W, d.R, d.Wh,      d.Wh, d.R * d.P, 2 * d.R,
                                  d.R * d.W,  d.Wh * d.W};
  for (int64_t f = 0; f < kFields; ++f) {
    if ((f == kReadModes && !d.link) || (f == kSharpness && !d.sharpen)) continue;
    if ((f == kReadMasks || f == kWriteMasks) && !d.mask) continue;
    TORCH_CHECK(d.off[f] >= 0 && d.off[f] + sizes[f] <= d.I,
                "relmem DNC memory step: field ", f, " at offset ", d.off[f], " (size ", sizes[f],
                ") lies outside the interface of size ", d.I);
  }
}

// One batch's step as pointers to its [B, …] rows: the interface and the seven state fields
// (memory, usage, link, precedence, read_weights, write_weights, read_vectors; link and
// precedence null without a link; the inputs' read vectors unused), so that the sequence's loop
// reaches them without making a tensor view a step.
template <typename T>
using Fields = std::array<T*, 7>;

// Each field's values per example, in Fields' order.
std::array<int64_t, 7> field_sizes(const Dims& d) {
  return {d.N * d.W, d.N, d.Wh * d.N * d.N, d.Wh * d.N, d.R * d.N, d.Wh * d.N, d.R * d.W};
}

// The fields of t[first], t[first + 1], … (up to seven; null where the list ends or a tensor
// is undefined or empty, as the link's fields are without a link).
template <typename T>
Fields<T> fields_of(const tensor_list& t, int64_t first = 0) {
  Fields<T> f{};
  for (int64_t k = 0; k < 7 && first + k < int64_t(t.size()); ++k) {
    const Tensor& x = t[first + k];
    if (x.defined() && x.numel() > 0) f[k] = x.data_ptr<T>();
  }
  return f;
}

// Example b's rows of the fields f, each `size[k]` values an example (null where f's is).
template <typename T>
Fields<T> rows_of(const Fields<T>& f, const std::array<int64_t, 7>& size, int64_t b) {
  Fields<T> r{};
  for (int64_t k = 0; k < 7; ++k) r[k] = f[k] ? f[k] + b * size[k] : nullptr;
  return r;
}

template <typename T>
Inputs<T> inputs_of(const Dims& d, const T* xi, const Fields<T>& in, int64_t b) {
  const Fields<T> r = rows_of(in, field_sizes(d), b);
  return {xi + b * d.I, r[0], r[1], r[2], r[3], r[4], r[5]};
}

// Point the scratch's output fields at example b's rows of the outputs.
template <typename T>
void place_outputs(const Dims& d, Scratch<T>& s, const Fields<T>& out, int64_t b) {
  const Fields<T> r = rows_of(out, field_sizes(d), b);
  Span<T>* spans[7] = {&s.memory, &s.usage, &s.link, &s.prec, &s.rw, &s.ww, &s.rv};
  for (int64_t k = 0; k < 7; ++k) spans[k]->p = r[k];
}

int64_t slab_size(const Dims& d) { return place<float>(d, nullptr, nullptr); }

tensor_list allocate_outputs(const Dims& d, int64_t B, const at::TensorOptions& options) {
  return {at::empty({B, d.N, d.W}, options),
          at::empty({B, d.N}, options),
          d.link ? at::empty({B, d.Wh, d.N, d.N}, options) : at::empty({0}, options),
          d.link ? at::empty({B, d.Wh, d.N}, options) : at::empty({0}, options),
          at::empty({B, d.R, d.N}, options),
          at::empty({B, d.Wh, d.N}, options),
          at::empty({B, d.R, d.W}, options)};
}

// The step of every example: from the interface xi [B, I] and the state `in` into `out`. With
// `slabs` ([B, slab_size] values) and `orders` ([B, Wh·N]) the intermediates are kept there
// for the backward; with null, in a slab per thread.
template <typename T>
void forward_into(const Dims& d, int64_t B, const T* xi, const Fields<T>& in,
                  const Fields<T>& out, T* slabs, int64_t* orders) {
  const int64_t size = slab_size(d), WhN = d.Wh * d.N;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> own(slabs ? 0 : size);
    std::vector<int64_t> own_order(orders ? 0 : WhN);
    Scratch<T> s;
    for (int64_t b = begin; b < end; ++b) {
      place(d, &s, slabs ? slabs + b * size : own.data());
      s.order = orders ? orders + b * WhN : own_order.data();
      place_outputs(d, s, out, b);
      step_forward(d, inputs_of(d, xi, in, b), s);
    }
  });
}

tensor_list run_forward(const Dims& d, const tensor_list& t, const Tensor& slabs,
                        const Tensor& orders) {
  tensor_list out = allocate_outputs(d, t[0].size(0), t[0].options());
  AT_DISPATCH_FLOATING_TYPES(t[0].scalar_type(), "relmem_dnc_memory_step", [&] {
    using T = scalar_t;
    forward_into<T>(d, t[0].size(0), t[0].data_ptr<T>(), fields_of<T>(t, 1),
                    fields_of<T>(out), slabs.defined() ? slabs.data_ptr<T>() : nullptr,
                    orders.defined() ? orders.data_ptr<int64_t>() : nullptr);
  });
  return out;
}

// Gradients of the interface (gxi [B, I]) and of the six state inputs (gin, each written; the
// previous write weights' zeros without usage_write_grad) from those of the seven outputs
// (gout, null: zero), the inputs, the outputs and the slabs the forward kept. Rows whose
// `active` flag is 0 get zeros (a finished example's step is not differentiated).
template <typename T>
void backward_into(const Dims& d, int64_t B, const T* xi, const Fields<T>& in,
                   const Fields<T>& out, const T* slabs, const int64_t* orders,
                   const Fields<T>& gout, T* gxi, const Fields<T>& gin, const uint8_t* active) {
  const int64_t size = slab_size(d), WhN = d.Wh * d.N;
  const std::array<int64_t, 7> sz = field_sizes(d);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    Work<T> work(d);
    Scratch<T> s;
    for (int64_t b = begin; b < end; ++b) {
      const Fields<T> gr = rows_of(gin, sz, b);
      T* gi[7] = {gxi + b * d.I, gr[0], gr[1], gr[2], gr[3], gr[4], gr[5]};
      if (active && !active[b]) {
        const int64_t sizes[7] = {d.I, sz[0], sz[1], sz[2], sz[3], sz[4], sz[5]};
        for (int64_t k = 0; k < 7; ++k) {
          if (gi[k]) std::fill(gi[k], gi[k] + sizes[k], T(0));
        }
        continue;
      }
      place(d, &s, const_cast<T*>(slabs) + b * size);
      s.order = const_cast<int64_t*>(orders) + b * WhN;
      place_outputs(d, s, out, b);
      const Fields<T> g = rows_of(gout, sz, b);
      Grads<T> grads{g[0],  g[1],  g[2],  g[3],  g[4],  g[5],  g[6],
                     gi[0], gi[1], gi[2], gi[3], gi[4], gi[5],
                     d.usage_write_grad ? gi[6] : nullptr};
      step_backward(d, inputs_of(d, xi, in, b), s, grads, work);
      if (!d.usage_write_grad) std::fill(gi[6], gi[6] + sz[5], T(0));
    }
  });
}

tensor_list run_backward(const Dims& d, const tensor_list& t, const tensor_list& out,
                         const Tensor& slabs, const Tensor& orders, const tensor_list& grads) {
  tensor_list gin;
  for (const Tensor& x : t) gin.push_back(at::empty_like(x));
  tensor_list gout;
  for (const Tensor& g : grads) {
    gout.push_back(g.defined() && g.numel() > 0 ? g.contiguous() : Tensor());
  }
  AT_DISPATCH_FLOATING_TYPES(t[0].scalar_type(), "relmem_dnc_memory_step_backward", [&] {
    using T = scalar_t;
    backward_into<T>(d, t[0].size(0), t[0].data_ptr<T>(), fields_of<T>(t, 1),
                     fields_of<T>(out), slabs.data_ptr<T>(), orders.data_ptr<int64_t>(),
                     fields_of<T>(gout), gin[0].data_ptr<T>(), fields_of<T>(gin, 1),
                     nullptr);
  });
  if (!d.link) gin[3] = gin[4] = Tensor();
  if (!d.usage_write_grad) gin[6] = Tensor();
  return gin;
}

class MemoryStep : public torch::autograd::Function<MemoryStep> {
 public:
  static tensor_list forward(AutogradContext* ctx, const Tensor& interface, const Tensor& memory,
                             const Tensor& usage, const Tensor& link, const Tensor& precedence,
                             const Tensor& read_weights, const Tensor& write_weights,
                             at::IntArrayRef offsets, bool deepmind, bool usage_write_grad,
                             bool dealloc, double clip, double eps) {
    tensor_list t{interface, memory, usage, link, precedence, read_weights, write_weights};
    const Dims d = make_dims(interface, memory, read_weights, write_weights, link.numel() > 0,
                             offsets, deepmind, usage_write_grad, dealloc, clip, eps);
    const int64_t B = interface.size(0);
    const Tensor slabs = at::empty({B, slab_size(d)}, interface.options());
    const Tensor orders = at::empty({B, d.Wh * d.N}, interface.options().dtype(at::kLong));
    tensor_list out = run_forward(d, t, slabs, orders);
    tensor_list saved = t;
    saved.insert(saved.end(), out.begin(), out.end());
    saved.push_back(slabs);
    saved.push_back(orders);
    ctx->save_for_backward(saved);
    ctx->saved_data["offsets"] = offsets.vec();
    ctx->saved_data["deepmind"] = deepmind;
    ctx->saved_data["usage_write_grad"] = usage_write_grad;
    ctx->saved_data["dealloc"] = dealloc;
    ctx->saved_data["clip"] = clip;
    ctx->saved_data["eps"] = eps;
    if (!d.link) ctx->mark_non_differentiable({out[2], out[3]});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "the fused DNC memory step has no second derivative (backward with "
                "create_graph=True); implementation='reference' runs the reference step");
    const tensor_list saved = ctx->get_saved_variables();
    const tensor_list t(saved.begin(), saved.begin() + 7);
    const tensor_list out(saved.begin() + 7, saved.begin() + 14);
    const std::vector<int64_t> offsets = ctx->saved_data["offsets"].toIntVector();
    const Dims d = make_dims(t[0], t[1], t[5], t[6], t[3].numel() > 0, offsets,
                             ctx->saved_data["deepmind"].toBool(),
                             ctx->saved_data["usage_write_grad"].toBool(),
                             ctx->saved_data["dealloc"].toBool(),
                             ctx->saved_data["clip"].toDouble(), ctx->saved_data["eps"].toDouble());
    tensor_list gin = run_backward(d, t, out, saved[14], saved[15], grads);
    gin.resize(gin.size() + 6);  // offsets, deepmind, usage_write_grad, dealloc, clip, eps
    return gin;
  }
};

tensor_list memory_step(const Tensor& interface, const Tensor& memory, const Tensor& usage,
                        const Tensor& link, const Tensor& precedence, const Tensor& read_weights,
                        const Tensor& write_weights, at::IntArrayRef offsets, bool deepmind,
                        bool usage_write_grad, bool dealloc, double clip, double eps) {
  TORCH_CHECK(interface.dim() == 2 && memory.dim() == 3 && read_weights.dim() == 3 &&
                  write_weights.dim() == 3,
              "relmem DNC memory step: expected interface [B, I], memory [B, N, W], "
              "read_weights [B, R, N] and write_weights [B, Wh, N], got ", interface.sizes(), ", ",
              memory.sizes(), ", ", read_weights.sizes(), ", ", write_weights.sizes());
  tensor_list t{interface.contiguous(), memory.contiguous(), usage.contiguous(),
                link.contiguous(), precedence.contiguous(), read_weights.contiguous(),
                write_weights.contiguous()};
  const Dims d = make_dims(t[0], t[1], t[5], t[6], link.numel() > 0, offsets, deepmind,
                           usage_write_grad, dealloc, clip, eps);
  check_inputs(d, t);
  bool grad = false;
  for (const Tensor& x : t) grad = grad || x.requires_grad();
  // Without a gradient to make, nothing is kept (inference holds no step's inputs).
  if (!at::GradMode::is_enabled() || !grad) return run_forward(d, t, Tensor(), Tensor());
  return MemoryStep::apply(t[0], t[1], t[2], t[3], t[4], t[5], t[6], offsets, deepmind,
                           usage_write_grad, dealloc, clip, eps);
}

// ---------------------------------------------------------------- the sequence (§2 over time)
//
// The DNC's recurrence over a chunk of time as one operator with one backward: per step the
// controller (L layers of LSTM or GRU, PyTorch's gate order, clipped as Controller._clip), the
// interface GEMM and the memory step; `lengths` carry a finished example's state unchanged, as
// run_cell_loop's where_active does. The backward runs the loop in reverse with the memory
// step's backward and the controller's gates written by hand, and makes each weight's gradient
// in one GEMM over all T·B rows. A finished example's hiddens and reads are zeros (the modules
// output zeros there). The output layers that read [h_t; r_t] (the DNC's output
// linear, the memory controller layer's projections) are not in the loop: the caller applies
// them to the returned hiddens and reads at once.

struct Seq {
  bool lstm;
  int64_t L, H, X, T, B, G;  // G: 4H (LSTM) or 3H (GRU) gate columns
  double forget_bias, clip;
  bool save;  // keep every step for a backward (else two state slots, one step buffer)

  int64_t in(int64_t l) const { return l == 0 ? X : X + H; }  // + R·W, added by the caller
  int64_t slot(int64_t t) const { return save ? t : t % 2; }
  int64_t step(int64_t t) const { return save ? t : 0; }
};

// Everything the loop keeps. Per layer: the carried h (and c) over slots [S, B, H], the gate
// activations [steps, B, 4H] (LSTM i f g o; GRU r z n and W_hn h + b_hn), the pre-clip values
// [steps, B, 2H] (LSTM c h; GRU h), the layer's input rows [steps, B, in]. The memory state
// over slots (the seven fields), the interfaces [steps, B, I], the memory step's slabs.
struct Buffers {
  std::vector<Tensor> h, c, acts, pre, xin;
  tensor_list mem;  // memory, usage, link, precedence, read_weights, write_weights, read_vectors
  Tensor xi, slabs, orders;
};

Buffers allocate_buffers(const Seq& q, const Dims& d, const at::TensorOptions& o) {
  const int64_t S = q.save ? q.T + 1 : 2, steps = q.save ? q.T : 1, B = q.B;
  const int64_t RW = d.R * d.W;
  Buffers buf;
  for (int64_t l = 0; l < q.L; ++l) {
    buf.h.push_back(at::empty({S, B, q.H}, o));
    buf.c.push_back(q.lstm ? at::empty({S, B, q.H}, o) : Tensor());
    buf.acts.push_back(at::empty({steps, B, 4 * q.H}, o));
    buf.pre.push_back(at::empty({steps, B, 2 * q.H}, o));
    buf.xin.push_back(at::empty({steps, B, q.in(l) + RW}, o));
  }
  buf.mem = {at::empty({S, B, d.N, d.W}, o),
             at::empty({S, B, d.N}, o),
             d.link ? at::empty({S, B, d.Wh, d.N, d.N}, o) : at::empty({0}, o),
             d.link ? at::empty({S, B, d.Wh, d.N}, o) : at::empty({0}, o),
             at::empty({S, B, d.R, d.N}, o),
             at::empty({S, B, d.Wh, d.N}, o),
             at::empty({S, B, d.R, d.W}, o)};
  buf.xi = at::empty({steps, B, d.I}, o);
  if (q.save) {
    buf.slabs = at::empty({q.T, B, slab_size(d)}, o);
    buf.orders = at::empty({q.T, B, d.Wh * d.N}, o.dtype(at::kLong));
  }
  return buf;
}

// Row i of a buffer laid out [rows, …] (its first dimension), as a pointer.
template <typename T>
T* row(const Tensor& t, int64_t i) {
  return t.data_ptr<T>() + i * t.stride(0);
}

// The memory state at slot s (link and precedence null without a link).
template <typename T>
Fields<T> state_at(const Buffers& buf, int64_t s) {
  Fields<T> f{};
  for (int64_t k = 0; k < 7; ++k) {
    if (buf.mem[k].numel()) f[k] = row<T>(buf.mem[k], s);
  }
  return f;
}

// Copy (or add) `values` values a row from `from` into `to` where `keep[b]`; `to` null: nothing.
template <typename T>
void copy_rows(T* to, const T* from, int64_t values, const std::vector<uint8_t>& keep) {
  if (!to) return;
  for (size_t b = 0; b < keep.size(); ++b) {
    if (keep[b]) std::copy(from + b * values, from + (b + 1) * values, to + b * values);
  }
}

template <typename T>
void add_rows(T* to, const T* from, int64_t values, const std::vector<uint8_t>& keep) {
  for (size_t b = 0; b < keep.size(); ++b) {
    if (!keep[b]) continue;
    for (int64_t i = 0; i < values; ++i) to[b * values + i] += from[b * values + i];
  }
}

// Marks in `done` the rows finished before step t (t >= lengths[b]); whether any is.
bool finished_at(const int64_t* lengths, int64_t t, std::vector<uint8_t>& done) {
  bool some = false;
  for (size_t b = 0; b < done.size(); ++b) {
    done[b] = lengths && t >= lengths[b];
    some = some || done[b];
  }
  return some;
}

// One example's LSTM gates from their pre-activations g [4H] (x W_ih^T + b_ih + h W_hh^T + b_hh,
// PyTorch's order i f g o) and the previous cell cp [H]: the activations into acts [4H], the
// pre-clip c and h into pre [2H], the clipped new state into c_new, h_new [H]. The columns run
// in vector lanes (the σ and tanh of vector_math.h are inline arithmetic).
template <typename T>
void lstm_gates(int64_t H, T forget_bias, double clip, const T* __restrict g,
                const T* __restrict cp, T* __restrict acts, T* __restrict pre,
                T* __restrict c_new, T* __restrict h_new) {
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) {
    const T i = sigmoid(g[j]), f = sigmoid(g[H + j] + forget_bias);
    const T gg = tanh_of(g[2 * H + j]), o = sigmoid(g[3 * H + j]);
    acts[j] = i, acts[H + j] = f, acts[2 * H + j] = gg, acts[3 * H + j] = o;
    const T c = f * cp[j] + i * gg;
    const T h = o * tanh_of(c);
    pre[j] = c, pre[H + j] = h;
    c_new[j] = clipped(c, clip);
    h_new[j] = clipped(h, clip);
  }
}

// One example's GRU gates from xg = x W_ih^T + b_ih and hg = h W_hh^T + b_hh [3H] (r z n) and
// the previous hidden hp [H]: r, z, n and W_hn h + b_hn into acts [4H], the pre-clip h into
// pre [H], the clipped new hidden into h_new [H]. h' = (1 − z) n + z h,
// n = tanh(x W_in + b_in + r ∘ (h W_hn + b_hn)).
template <typename T>
void gru_gates(int64_t H, double clip, const T* __restrict xg, const T* __restrict hg,
               const T* __restrict hp, T* __restrict acts, T* __restrict pre,
               T* __restrict h_new) {
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) {
    const T r = sigmoid(xg[j] + hg[j]), z = sigmoid(xg[H + j] + hg[H + j]);
    const T n = tanh_of(xg[2 * H + j] + r * hg[2 * H + j]);
    acts[j] = r, acts[H + j] = z, acts[2 * H + j] = n, acts[3 * H + j] = hg[2 * H + j];
    const T h = (T(1) - z) * n + z * hp[j];
    pre[j] = h;
    h_new[j] = clipped(h, clip);
  }
}

// weights: per layer w_ih [G, in + R·W], w_hh [G, H], b_ih [G], b_hh [G]; then w_xi [I, L·H],
// b_xi [I]. Returns hiddens [T, B, L·H], reads [T, B, R·W]. The loop works on the buffers'
// pointers (no tensor is made a step) and calls the GEMMs directly (gemm, above).
template <typename T>
void sequence_forward(const Seq& q, const Dims& d, const Tensor& x, const Tensor& lengths,
                      const tensor_list& w, Buffers& buf, const Tensor& hiddens,
                      const Tensor& reads) {
  const int64_t B = q.B, H = q.H, G = q.G, X = q.X, RW = d.R * d.W, LH = q.L * H;
  const int64_t width = X + RW;  // χ_t
  const std::array<int64_t, 7> size = field_sizes(d);
  const T* w_xi = w[4 * q.L].data_ptr<T>();
  const T* b_xi = w[4 * q.L + 1].data_ptr<T>();
  std::vector<T> gi(q.lstm ? 0 : B * G), gh(B * G);
  const int64_t* len = lengths.numel() ? lengths.data_ptr<int64_t>() : nullptr;
  std::vector<uint8_t> done(B);
  for (int64_t t = 0; t < q.T; ++t) {
    const int64_t si = q.slot(t), so = q.slot(t + 1), a = q.step(t);
    const Fields<T> in = state_at<T>(buf, si), out = state_at<T>(buf, so);
    // χ_t = [x_t ; r_{t−1}] into layer 1's input rows
    T* chi = row<T>(buf.xin[0], a);
    const T* xt = row<T>(x, t);
    for (int64_t b = 0; b < B; ++b) {
      std::copy(xt + b * X, xt + (b + 1) * X, chi + b * width);
      std::copy(in[6] + b * RW, in[6] + (b + 1) * RW, chi + b * width + X);
    }
    T* hidden = row<T>(hiddens, t);
    for (int64_t l = 0; l < q.L; ++l) {
      const int64_t columns = q.in(l) + RW;
      const T* xin = row<T>(buf.xin[l], a);
      const T* hp = row<T>(buf.h[l], si);
      T* acts = row<T>(buf.acts[l], a);
      T* pre = row<T>(buf.pre[l], a);
      T* h_new = row<T>(buf.h[l], so);
      const T* w_ih = w[4 * l].data_ptr<T>();
      const T* w_hh = w[4 * l + 1].data_ptr<T>();
      const T* b_ih = w[4 * l + 2].data_ptr<T>();
      const T* b_hh = w[4 * l + 3].data_ptr<T>();
      if (q.lstm) {
        // gates = x W_ih^T + b_ih + h W_hh^T + b_hh, activated in place: [i f g o]
        linear<T>(B, G, columns, xin, columns, w_ih, b_ih, gh.data());
        gemm<T>(true, B, G, H, hp, H, w_hh, H, T(1), gh.data(), G);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t j = 0; j < G; ++j) gh[b * G + j] += b_hh[j];
        }
        const T* cp = row<T>(buf.c[l], si);
        T* c_new = row<T>(buf.c[l], so);
        for (int64_t b = 0; b < B; ++b) {
          lstm_gates(H, T(q.forget_bias), q.clip, gh.data() + b * G, cp + b * H,
                     acts + b * 4 * H, pre + b * 2 * H, c_new + b * H, h_new + b * H);
        }
      } else {
        // r, z, n = σ(·), σ(·), tanh(x W_in + b_in + r ∘ (h W_hn + b_hn)); h' = (1 − z) n + z h
        linear<T>(B, G, columns, xin, columns, w_ih, b_ih, gi.data());
        linear<T>(B, G, H, hp, H, w_hh, b_hh, gh.data());
        for (int64_t b = 0; b < B; ++b) {
          gru_gates(H, q.clip, gi.data() + b * G, gh.data() + b * G, hp + b * H,
                    acts + b * 4 * H, pre + b * 2 * H, h_new + b * H);
        }
      }
      for (int64_t b = 0; b < B; ++b) {
        std::copy(h_new + b * H, h_new + (b + 1) * H, hidden + b * LH + l * H);
      }
      if (l + 1 < q.L) {  // layer l + 1 reads [χ_t ; h^l_t]
        T* next = row<T>(buf.xin[l + 1], a);
        for (int64_t b = 0; b < B; ++b) {
          std::copy(chi + b * width, chi + (b + 1) * width, next + b * (width + H));
          std::copy(h_new + b * H, h_new + (b + 1) * H, next + b * (width + H) + width);
        }
      }
    }
    T* xi = row<T>(buf.xi, a);
    linear<T>(B, d.I, LH, hidden, LH, w_xi, b_xi, xi);
    forward_into<T>(d, B, xi, in, out, q.save ? row<T>(buf.slabs, t) : nullptr,
                    q.save ? row<int64_t>(buf.orders, t) : nullptr);
    T* read = row<T>(reads, t);
    std::copy(out[6], out[6] + B * RW, read);
    if (finished_at(len, t, done)) {  // a finished example keeps its state and outputs zeros
      for (int64_t b = 0; b < B; ++b) {
        if (!done[b]) continue;
        std::fill(hidden + b * LH, hidden + (b + 1) * LH, T(0));
        std::fill(read + b * RW, read + (b + 1) * RW, T(0));
      }
      for (int64_t l = 0; l < q.L; ++l) {
        copy_rows(row<T>(buf.h[l], so), row<T>(buf.h[l], si), H, done);
        if (q.lstm) copy_rows(row<T>(buf.c[l], so), row<T>(buf.c[l], si), H, done);
      }
      for (int64_t k = 0; k < 7; ++k) copy_rows(out[k], in[k], size[k], done);
    }
  }
}

Tensor zeros_or(const Tensor& g, const Tensor& like) {
  return g.defined() && g.numel() ? g.contiguous().clone() : at::zeros_like(like);
}

// Gradients: of x [T, B, X], of the initial controller state (per layer h, and c for an LSTM),
// of the initial memory state (seven fields), of the weights (in their order).
template <typename T>
tensor_list sequence_backward(const Seq& q, const Dims& d, const Tensor& x, const Tensor& lengths,
                              const tensor_list& w, const Buffers& buf, const Tensor& hiddens,
                              const Tensor& g_hiddens, const Tensor& g_reads,
                              const tensor_list& g_ctrl, const tensor_list& g_mem) {
  const int64_t B = q.B, H = q.H, G = q.G, X = q.X, RW = d.R * d.W, LH = q.L * H;
  const int64_t width = X + RW;  // χ_t
  const std::array<int64_t, 7> size = field_sizes(d);
  const auto o = x.options();
  // the carried gradients, of the state after step t
  std::vector<Tensor> gh(q.L), gc(q.L);
  const int64_t per = q.lstm ? 2 : 1;
  for (int64_t l = 0; l < q.L; ++l) {
    gh[l] = zeros_or(g_ctrl[per * l], buf.h[l][q.T]);
    if (q.lstm) gc[l] = zeros_or(g_ctrl[per * l + 1], buf.c[l][q.T]);
  }
  tensor_list gm(7);
  for (int64_t k = 0; k < 7; ++k) {
    gm[k] = buf.mem[k].numel() ? zeros_or(g_mem[k], buf.mem[k][q.T]) : buf.mem[k];
  }
  std::vector<Tensor> g_gi(q.L), g_gh(q.L);
  for (int64_t l = 0; l < q.L; ++l) {
    g_gi[l] = at::empty({q.T, B, G}, o);
    g_gh[l] = q.lstm ? g_gi[l] : at::empty({q.T, B, G}, o);
  }
  const Tensor g_xi = at::empty({q.T, B, d.I}, o);
  const Tensor g_x = at::empty({q.T, B, X}, o);
  // Each step's buffers, allocated once: the memory step's input gradients (swapped with gm
  // after the step), the carried controller gradients' next values (swapped likewise), the
  // gradients of the read vectors with the loop's own, of the hiddens, of χ_t, of each layer's
  // input rows.
  tensor_list spare(7);
  for (int64_t k = 0; k < 7; ++k) spare[k] = at::empty_like(gm[k]);
  std::vector<Tensor> gh_spare(q.L), gc_spare(q.L);
  std::vector<std::vector<T>> g_in(q.L);
  for (int64_t l = 0; l < q.L; ++l) {
    gh_spare[l] = at::empty({B, H}, o);
    if (q.lstm) gc_spare[l] = at::empty({B, H}, o);
    g_in[l].resize(B * (q.in(l) + RW));
  }
  std::vector<T> g_rv(B * RW), g_hidden(B * LH), g_chi(B * width);
  const T* w_xi = w[4 * q.L].data_ptr<T>();
  const int64_t* len = lengths.numel() ? lengths.data_ptr<int64_t>() : nullptr;
  std::vector<uint8_t> done(B), active(B);
  for (int64_t t = q.T - 1; t >= 0; --t) {
    const bool some_done = finished_at(len, t, done);
    for (int64_t b = 0; b < B; ++b) active[b] = !done[b];
    // the memory step (finished rows skipped: their state is carried)
    const Fields<T> gstate = fields_of<T>(gm);
    Fields<T> gout = gstate;
    if (g_reads.defined()) {
      const T* gr = row<T>(g_reads, t);
      for (int64_t i = 0; i < B * RW; ++i) g_rv[i] = gstate[6][i] + gr[i];
      gout[6] = g_rv.data();
    }
    const Fields<T> gin = fields_of<T>(spare);
    T* gxi = row<T>(g_xi, t);
    backward_into<T>(d, B, row<T>(buf.xi, t), state_at<T>(buf, t), state_at<T>(buf, t + 1),
                     row<T>(buf.slabs, t), row<int64_t>(buf.orders, t), gout, gxi, gin,
                     some_done ? active.data() : nullptr);
    if (some_done) {
      for (int64_t k = 0; k < 6; ++k) copy_rows(gin[k], gstate[k], size[k], done);
    }
    // the controller, top layer first
    if (g_hiddens.defined()) {
      const T* gy = row<T>(g_hiddens, t);
      std::copy(gy, gy + B * LH, g_hidden.data());
    } else {
      std::fill(g_hidden.begin(), g_hidden.end(), T(0));
    }
    gemm<T>(false, B, LH, d.I, gxi, d.I, w_xi, LH, T(1), g_hidden.data(), LH);
    for (int64_t b = 0; b < B; ++b) {  // a finished example's outputs were zeros
      if (done[b]) std::fill(g_hidden.begin() + b * LH, g_hidden.begin() + (b + 1) * LH, T(0));
    }
    std::fill(g_chi.begin(), g_chi.end(), T(0));
    const T* g_above = nullptr;  // of h^l through layer l + 1's input, rows of above_stride
    int64_t above_stride = 0;
    for (int64_t l = q.L - 1; l >= 0; --l) {
      const int64_t columns = q.in(l) + RW;
      const T* gh_out = g_hidden.data();
      const T* ghc = gh[l].data_ptr<T>();
      const T* acts = row<T>(buf.acts[l], t);
      const T* pre = row<T>(buf.pre[l], t);
      const T* hp = row<T>(buf.h[l], t);
      T* gi = row<T>(g_gi[l], t);
      T* ghh = row<T>(g_gh[l], t);
      T* dh = gh_spare[l].data_ptr<T>();  // of h_{t−1} not through W_hh (GRU's z ∘ h)
      const T* gcc = q.lstm ? gc[l].data_ptr<T>() : nullptr;
      const T* cp = q.lstm ? row<T>(buf.c[l], t) : nullptr;
      T* gcp = q.lstm ? gc_spare[l].data_ptr<T>() : nullptr;
      for (int64_t b = 0; b < B; ++b) {
        const bool on = active[b];
        const T* ar = acts + b * 4 * H;
        const T* pr = pre + b * 2 * H;
        for (int64_t j = 0; j < H; ++j) {
          T g = gh_out[b * LH + l * H + j] + (on ? ghc[b * H + j] : T(0));
          if (g_above) g += g_above[b * above_stride + j];
          if (q.lstm) {
            const T i = ar[j], f = ar[H + j], gg = ar[2 * H + j], og = ar[3 * H + j];
            const T c = pr[j], h = pr[H + j];
            const T gh_pre = inside(h, q.clip) ? g : T(0);
            const T tc = tanh_of(c);
            T gc_pre = on && inside(c, q.clip) ? gcc[b * H + j] : T(0);
            gc_pre += gh_pre * og * (T(1) - tc * tc);
            T* gr = gi + b * G;
            gr[j] = gc_pre * gg * i * (T(1) - i);
            gr[H + j] = gc_pre * cp[b * H + j] * f * (T(1) - f);
            gr[2 * H + j] = gc_pre * i * (T(1) - gg * gg);
            gr[3 * H + j] = gh_pre * tc * og * (T(1) - og);
            gcp[b * H + j] = gc_pre * f;
            dh[b * H + j] = 0;
          } else {
            const T r = ar[j], z = ar[H + j], n = ar[2 * H + j], hn = ar[3 * H + j];
            const T gh_pre = inside(pr[j], q.clip) ? g : T(0);
            const T g_npre = gh_pre * (T(1) - z) * (T(1) - n * n);
            const T g_rpre = g_npre * hn * r * (T(1) - r);
            const T g_zpre = gh_pre * (hp[b * H + j] - n) * z * (T(1) - z);
            T* xr = gi + b * G;
            T* hr = ghh + b * G;
            xr[j] = hr[j] = g_rpre;
            xr[H + j] = hr[H + j] = g_zpre;
            xr[2 * H + j] = g_npre;
            hr[2 * H + j] = g_npre * r;
            dh[b * H + j] = gh_pre * z;
          }
        }
      }
      T* g_rows = g_in[l].data();  // of the layer's input rows [χ_t ; h^{l−1}_t]
      gemm<T>(false, B, columns, G, gi, G, w[4 * l].data_ptr<T>(), columns, T(0), g_rows, columns);
      gemm<T>(false, B, H, G, ghh, G, w[4 * l + 1].data_ptr<T>(), H, T(1), dh, H);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t c = 0; c < width; ++c) g_chi[b * width + c] += g_rows[b * columns + c];
      }
      g_above = g_rows + width;
      above_stride = columns;
    }
    T* gx = row<T>(g_x, t);
    T* g_rv_prev = spare[6].data_ptr<T>();
    for (int64_t b = 0; b < B; ++b) {
      std::copy(g_chi.begin() + b * width, g_chi.begin() + b * width + X, gx + b * X);
      std::copy(g_chi.begin() + b * width + X, g_chi.begin() + (b + 1) * width,
                g_rv_prev + b * RW);
    }
    if (some_done) {
      add_rows(g_rv_prev, gstate[6], RW, done);
      for (int64_t l = 0; l < q.L; ++l) {
        add_rows(gh_spare[l].data_ptr<T>(), gh[l].data_ptr<T>(), H, done);
        if (q.lstm) add_rows(gc_spare[l].data_ptr<T>(), gc[l].data_ptr<T>(), H, done);
      }
    }
    for (int64_t l = 0; l < q.L; ++l) {
      std::swap(gh[l], gh_spare[l]);
      if (q.lstm) std::swap(gc[l], gc_spare[l]);
    }
    for (int64_t k = 0; k < 7; ++k) std::swap(gm[k], spare[k]);
  }
  // each weight's gradient over all T·B rows at once
  tensor_list out{g_x};
  for (int64_t l = 0; l < q.L; ++l) {
    out.push_back(gh[l]);
    if (q.lstm) out.push_back(gc[l]);
  }
  for (int64_t k = 0; k < 7; ++k) out.push_back(buf.mem[k].numel() ? gm[k] : Tensor());
  const int64_t TB = q.T * B;
  for (int64_t l = 0; l < q.L; ++l) {
    const Tensor gi = g_gi[l].view({TB, G}), ghh = g_gh[l].view({TB, G});
    out.push_back(at::mm(gi.t(), buf.xin[l].view({TB, -1})));
    out.push_back(at::mm(ghh.t(), buf.h[l].narrow(0, 0, q.T).reshape({TB, H})));
    out.push_back(gi.sum(0));
    out.push_back(ghh.sum(0));
  }
  const Tensor gxi = g_xi.view({TB, d.I});
  out.push_back(at::mm(gxi.t(), hiddens.view({TB, LH})));
  out.push_back(gxi.sum(0));
  return out;
}

Seq make_seq(const Tensor& x, at::TensorList ctrl, at::TensorList weights, bool lstm,
             int64_t layers, double forget_bias, double clip, bool save) {
  Seq q;
  q.lstm = lstm;
  q.L = layers;
  q.T = x.size(0);
  q.B = x.size(1);
  q.X = x.size(2);
  q.H = ctrl[0].size(1);
  q.G = (lstm ? 4 : 3) * q.H;
  q.forget_bias = forget_bias;
  q.clip = clip;
  q.save = save;
  return q;
}

Dims sequence_dims(at::TensorList mem, const Tensor& w_xi, at::IntArrayRef offsets, bool deepmind,
                   bool usage_write_grad, bool dealloc, double interface_clip, double eps) {
  const Tensor interface = at::empty({1, w_xi.size(0)}, w_xi.options());
  return make_dims(interface, mem[0], mem[4], mem[5], mem[2].numel() > 0, offsets, deepmind,
                   usage_write_grad, dealloc, interface_clip, eps);
}

void check_sequence(const Seq& q, const Dims& d, const Tensor& x, const Tensor& lengths,
                    at::TensorList ctrl, at::TensorList mem, at::TensorList w) {
  const char* name = "relmem DNC sequence";
  TORCH_CHECK(x.dim() == 3 && x.size(0) > 0 && x.size(1) > 0, name,
              ": x must be [T, B, X] with T, B > 0, got ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), name, ": x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, name,
              ": float32 or float64 only, got ", x.scalar_type());
  TORCH_CHECK(!lengths.defined() || lengths.numel() == 0 ||
                  (lengths.scalar_type() == at::kLong && lengths.sizes() == at::IntArrayRef{q.B}),
              name, ": lengths must be int64 [B] or empty");
  TORCH_CHECK(static_cast<int64_t>(ctrl.size()) == q.L * (q.lstm ? 2 : 1), name, ": expected ",
              q.L * (q.lstm ? 2 : 1), " controller state tensors, got ", ctrl.size());
  for (const Tensor& s : ctrl) {
    TORCH_CHECK(s.sizes() == at::IntArrayRef({q.B, q.H}) && s.scalar_type() == x.scalar_type(),
                name, ": every controller state must be [B, H] = [", q.B, ", ", q.H,
                "] of x's dtype, got ", s.sizes(), " ", s.scalar_type());
  }
  TORCH_CHECK(mem.size() == 7, name, ": expected 7 memory state tensors, got ", mem.size());
  TORCH_CHECK(static_cast<int64_t>(w.size()) == 4 * q.L + 2, name, ": expected ", 4 * q.L + 2,
              " weights, got ", w.size());
  const int64_t RW = d.R * d.W;
  for (int64_t l = 0; l < q.L; ++l) {
    TORCH_CHECK(w[4 * l].sizes() == at::IntArrayRef({q.G, q.in(l) + RW}) &&
                    w[4 * l + 1].sizes() == at::IntArrayRef({q.G, q.H}) &&
                    w[4 * l + 2].sizes() == at::IntArrayRef({q.G}) &&
                    w[4 * l + 3].sizes() == at::IntArrayRef({q.G}),
                name, ": layer ", l, "'s weights must be [", q.G, ", ", q.in(l) + RW, "], [",
                q.G, ", ", q.H, "], [", q.G, "], [", q.G, "]");
  }
  TORCH_CHECK(w[4 * q.L].sizes() == at::IntArrayRef({d.I, q.L * q.H}) &&
                  w[4 * q.L + 1].sizes() == at::IntArrayRef({d.I}),
              name, ": the interface weights must be [", d.I, ", ", q.L * q.H, "] and [", d.I, "]");
  tensor_list t{at::empty({q.B, d.I}, x.options())};
  for (int64_t k = 0; k < 6; ++k) t.push_back(mem[k]);
  check_inputs(d, t);
  TORCH_CHECK(mem[6].sizes() == at::IntArrayRef({q.B, d.R, d.W}), name,
              ": read_vectors must be [B, R, W], got ", mem[6].sizes());
  for (const Tensor& p : w) {
    TORCH_CHECK(p.scalar_type() == x.scalar_type() && p.device().is_cpu(), name,
                ": every weight must be of x's dtype on the CPU");
  }
}

// Runs the loop; returns hiddens, reads, the final controller state, the final memory state.
tensor_list run_sequence(const Seq& q, const Dims& d, const Tensor& x, const Tensor& lengths,
                         at::TensorList ctrl, at::TensorList mem, const tensor_list& w,
                         Buffers& buf) {
  const auto o = x.options();
  const int64_t per = q.lstm ? 2 : 1;
  for (int64_t l = 0; l < q.L; ++l) {
    buf.h[l][0].copy_(ctrl[per * l]);
    if (q.lstm) buf.c[l][0].copy_(ctrl[per * l + 1]);
  }
  for (int64_t k = 0; k < 7; ++k) {
    if (buf.mem[k].numel()) buf.mem[k][0].copy_(mem[k]);
  }
  const Tensor hiddens = at::empty({q.T, q.B, q.L * q.H}, o);
  const Tensor reads = at::empty({q.T, q.B, d.R * d.W}, o);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relmem_dnc_sequence", [&] {
    sequence_forward<scalar_t>(q, d, x, lengths, w, buf, hiddens, reads);
  });
  tensor_list out{hiddens, reads};
  const int64_t last = q.slot(q.T);
  for (int64_t l = 0; l < q.L; ++l) {
    out.push_back(buf.h[l][last].clone());
    if (q.lstm) out.push_back(buf.c[l][last].clone());
  }
  for (int64_t k = 0; k < 7; ++k) {
    out.push_back(buf.mem[k].numel() ? buf.mem[k][last].clone() : at::empty({0}, o));
  }
  return out;
}

class Sequence : public torch::autograd::Function<Sequence> {
 public:
  static tensor_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& lengths,
                             at::TensorList ctrl, at::TensorList mem, at::TensorList weights,
                             at::IntArrayRef offsets, bool lstm, int64_t layers,
                             double forget_bias, double clip, bool deepmind,
                             bool usage_write_grad, bool dealloc, double interface_clip,
                             double eps) {
    const Seq q = make_seq(x, ctrl, weights, lstm, layers, forget_bias, clip, true);
    const Dims d = sequence_dims(mem, weights[4 * layers], offsets, deepmind, usage_write_grad,
                                 dealloc, interface_clip, eps);
    const tensor_list w(weights.begin(), weights.end());
    Buffers buf = allocate_buffers(q, d, x.options());
    tensor_list out = run_sequence(q, d, x, lengths, ctrl, mem, w, buf);
    // saved: x, lengths, weights, the hiddens, then the buffers
    tensor_list saved{x, lengths, out[0], buf.xi, buf.slabs, buf.orders};
    saved.insert(saved.end(), w.begin(), w.end());
    saved.insert(saved.end(), buf.mem.begin(), buf.mem.end());
    for (int64_t l = 0; l < layers; ++l) {
      saved.insert(saved.end(), {buf.h[l], lstm ? buf.c[l] : buf.h[l], buf.acts[l], buf.pre[l],
                                 buf.xin[l]});
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["offsets"] = offsets.vec();
    ctx->saved_data["lstm"] = lstm;
    ctx->saved_data["layers"] = layers;
    ctx->saved_data["forget_bias"] = forget_bias;
    ctx->saved_data["clip"] = clip;
    ctx->saved_data["deepmind"] = deepmind;
    ctx->saved_data["usage_write_grad"] = usage_write_grad;
    ctx->saved_data["dealloc"] = dealloc;
    ctx->saved_data["interface_clip"] = interface_clip;
    ctx->saved_data["eps"] = eps;
    const int64_t first_mem = 2 + (lstm ? 2 : 1) * layers;
    if (!d.link) ctx->mark_non_differentiable({out[first_mem + 2], out[first_mem + 3]});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "the fused DNC sequence has no second derivative (backward with "
                "create_graph=True); implementation='reference' runs the reference step");
    const tensor_list s = ctx->get_saved_variables();
    const bool lstm = ctx->saved_data["lstm"].toBool();
    const int64_t layers = ctx->saved_data["layers"].toInt();
    const Tensor& x = s[0];
    const Tensor& lengths = s[1];
    const Tensor& hiddens = s[2];
    Buffers buf;
    buf.xi = s[3];
    buf.slabs = s[4];
    buf.orders = s[5];
    const tensor_list w(s.begin() + 6, s.begin() + 6 + 4 * layers + 2);
    int64_t at = 6 + 4 * layers + 2;
    buf.mem = tensor_list(s.begin() + at, s.begin() + at + 7);
    at += 7;
    for (int64_t l = 0; l < layers; ++l, at += 5) {
      buf.h.push_back(s[at]);
      buf.c.push_back(lstm ? s[at + 1] : Tensor());
      buf.acts.push_back(s[at + 2]);
      buf.pre.push_back(s[at + 3]);
      buf.xin.push_back(s[at + 4]);
    }
    const std::vector<int64_t> offsets = ctx->saved_data["offsets"].toIntVector();
    tensor_list ctrl_state;
    for (int64_t l = 0; l < layers; ++l) {
      ctrl_state.push_back(buf.h[l][0]);
      if (lstm) ctrl_state.push_back(buf.c[l][0]);
    }
    Seq q = make_seq(x, ctrl_state, w, lstm, layers, ctx->saved_data["forget_bias"].toDouble(),
                     ctx->saved_data["clip"].toDouble(), true);
    tensor_list mem0;
    for (int64_t k = 0; k < 7; ++k) mem0.push_back(buf.mem[k].numel() ? buf.mem[k][0] : buf.mem[k]);
    const Dims d = sequence_dims(mem0, w[4 * layers], offsets,
                                 ctx->saved_data["deepmind"].toBool(),
                                 ctx->saved_data["usage_write_grad"].toBool(),
                                 ctx->saved_data["dealloc"].toBool(),
                                 ctx->saved_data["interface_clip"].toDouble(),
                                 ctx->saved_data["eps"].toDouble());
    const int64_t n_ctrl = (lstm ? 2 : 1) * layers;
    const tensor_list g_ctrl(grads.begin() + 2, grads.begin() + 2 + n_ctrl);
    const tensor_list g_mem(grads.begin() + 2 + n_ctrl, grads.begin() + 2 + n_ctrl + 7);
    auto defined = [](const Tensor& g) { return g.defined() ? g.contiguous() : g; };
    tensor_list out;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relmem_dnc_sequence_backward", [&] {
      out = sequence_backward<scalar_t>(q, d, x, lengths, w, buf, hiddens, defined(grads[0]),
                                        defined(grads[1]), g_ctrl, g_mem);
    });
    // one gradient per input, the lists flattened: x, lengths, ctrl, mem, weights, 10 options
    tensor_list result{out[0], Tensor()};
    result.insert(result.end(), out.begin() + 1, out.end());
    result.resize(result.size() + 10);
    return result;
  }
};

tensor_list sequence(const Tensor& x, const std::optional<Tensor>& lengths, at::TensorList ctrl,
                     at::TensorList mem, at::TensorList weights, at::IntArrayRef offsets, bool lstm,
                     int64_t layers, double forget_bias, double clip, bool deepmind,
                     bool usage_write_grad, bool dealloc, double interface_clip, double eps) {
  TORCH_CHECK(layers >= 1 && !ctrl.empty() && static_cast<int64_t>(weights.size()) == 4 * layers + 2,
              "relmem DNC sequence: expected ", 4 * layers + 2, " weights for ", layers,
              " layers, got ", weights.size());
  TORCH_CHECK(x.dim() == 3 && x.size(0) > 0 && x.size(1) > 0,
              "relmem DNC sequence: x must be [T, B, X] with T, B > 0, got ", x.sizes());
  TORCH_CHECK(ctrl[0].dim() == 2, "relmem DNC sequence: every controller state must be [B, H], got ",
              ctrl[0].sizes());
  const Tensor xc = x.contiguous();
  const Tensor len =
      lengths ? lengths->contiguous() : at::empty({0}, x.options().dtype(at::kLong));
  tensor_list c, m, w;
  for (const Tensor& t : ctrl) c.push_back(t.contiguous());
  for (const Tensor& t : mem) m.push_back(t.contiguous());
  for (const Tensor& t : weights) w.push_back(t.contiguous());
  const Seq probe = make_seq(xc, c, w, lstm, layers, forget_bias, clip, false);
  TORCH_CHECK(m.size() == 7, "relmem DNC sequence: expected 7 memory state tensors, got ", m.size());
  const Dims d = sequence_dims(m, w[4 * layers], offsets, deepmind, usage_write_grad, dealloc,
                               interface_clip, eps);
  check_sequence(probe, d, xc, len, c, m, w);
  const auto needs = [](const Tensor& t) { return t.defined() && t.requires_grad(); };
  bool grad = needs(xc);
  for (const Tensor& t : c) grad = grad || needs(t);
  for (const Tensor& t : m) grad = grad || needs(t);
  for (const Tensor& t : w) grad = grad || needs(t);
  if (!at::GradMode::is_enabled() || !grad) {
    // Without a gradient to make, two state slots and one step's buffers (inference keeps no
    // sequence of states: a long document fits).
    Buffers buf = allocate_buffers(probe, d, xc.options());
    return run_sequence(probe, d, xc, len, c, m, w, buf);
  }
  // the lists as TensorList: autograd links the tensors of a TensorList argument, not of a vector
  return Sequence::apply(xc, len, at::TensorList(c), at::TensorList(m), at::TensorList(w), offsets,
                         lstm, layers, forget_bias, clip, deepmind, usage_write_grad, dealloc,
                         interface_clip, eps);
}

// Whether the sequence's GEMMs call MKL directly (else through ATen).
bool direct_gemm() { return blas_gemm<float>() != nullptr && blas_gemm<double>() != nullptr; }

}  // namespace

TORCH_LIBRARY(relmem_dnc, m) {
  m.def("direct_gemm() -> bool", &direct_gemm);
  m.def(
      "memory_step(Tensor interface, Tensor memory, Tensor usage, Tensor link, Tensor precedence, "
      "Tensor read_weights, Tensor write_weights, int[] offsets, bool deepmind, "
      "bool usage_write_grad, bool dealloc_content, float clip, float eps) -> Tensor[]");
  m.def(
      "sequence(Tensor x, Tensor? lengths, Tensor[] controller, Tensor[] memory, "
      "Tensor[] weights, int[] offsets, bool lstm, int layers, float forget_bias, float clip, "
      "bool deepmind, bool usage_write_grad, bool dealloc_content, float interface_clip, "
      "float eps) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(relmem_dnc, CompositeImplicitAutograd, m) {
  m.impl("memory_step", &memory_step);
  m.impl("sequence", &sequence);
}
