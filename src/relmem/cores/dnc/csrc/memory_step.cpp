// The DNC's fused CPU memory step: DNCMemory._step (docs/dnc.md §2.3–§2.8) as one operator with
// a hand-written backward (docs/performance.md §5).
//
// The reference step is about a hundred small eager ops per token (the interface's squashing,
// usage, allocation with its sort, write weights, erase and add, the link and precedence, the
// directional weights, content addressing twice, the read), each with its autograd node; on the
// sizes the DNC runs at, their per-call cost is the whole step. Here one example's step is a
// handful of loops over N, W, R and Wh, and the batch is split over threads.
//
// The backward recomputes the example's forward into scratch (the step's arithmetic is small
// beside its bookkeeping, and nothing but the step's inputs is kept per step), then walks it
// in reverse. The gradients follow the reference exactly, including its choices: the
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Where each field starts in the interface vector, in this fixed order (memory.py's
// fused_offsets); read modes are -1 without a link.
enum Field { kReadKeys, kReadStrengths, kWriteKeys, kWriteStrengths, kErase, kWriteVectors,
             kFree, kAllocGates, kWriteGates, kReadModes, kFields };

struct Dims {
  int64_t N, W, R, Wh, I, P;
  bool link, deepmind, usage_write_grad;
  double clip, eps;
  int64_t off[kFields];

  // The raw interface index of paper-order read mode p.
  int64_t raw_mode(int64_t p) const {
    if (!deepmind || p < Wh) return p;
    return p == Wh ? 2 * Wh : p - 1;
  }
};

template <typename T>
inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

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
  Span<T> wc, wS, wd, wkn, mn_prev;              // write content [Wh, N] x3, [Wh], [N]
  Span<T> usim, sorted, prefix, alloc;           // [Wh, N]
  Span<T> fwd, bwd;                              // [R, Wh, N]
  Span<T> rc, rS, rd, rkn, mn;                   // read content [R, N] x3, [R], [N]
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
  take(x.wc, Wh * N), take(x.wS, Wh * N), take(x.wd, Wh * N), take(x.wkn, Wh);
  take(x.mn_prev, N);
  take(x.usim, Wh * N), take(x.sorted, Wh * N), take(x.prefix, Wh * N), take(x.alloc, Wh * N);
  take(x.fwd, links), take(x.bwd, links);
  take(x.rc, R * N), take(x.rS, R * N), take(x.rd, R * N), take(x.rkn, R), take(x.mn, N);
  return at;
}

// The backward's temporaries, allocated once per thread's chunk of the batch.
template <typename T>
struct Work {
  std::vector<T> gmn, gx, gM, grw, gww, grc, gpi, gfwd, gbwd, gLrow, gerase, gga, ggw, gwc,
      galloc, gu, gsorted, gbeta_r, gbeta_w, gfree;
  explicit Work(const Dims& d)
      : gmn(d.N), gx(d.I), gM(d.N * d.W), grw(d.R * d.N), gww(d.Wh * d.N), grc(d.R * d.N),
        gpi(d.R * d.P), gfwd(d.R * d.Wh * d.N), gbwd(d.R * d.Wh * d.N), gLrow(d.N),
        gerase(d.Wh * d.W), gga(d.Wh), ggw(d.Wh), gwc(d.Wh * d.N), galloc(d.Wh * d.N), gu(d.N),
        gsorted(d.N), gbeta_r(d.R), gbeta_w(d.Wh), gfree(d.R) {}
};

// ---------------------------------------------------------------- content addressing (§4)

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
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t n = 0; n < N; ++n) {
      const T p = dot(k, M + n * W, W);
      dots[h * N + n] = p;
      S[h * N + n] = p / (kn[h] * mn[n] + eps);
      top = std::max(top, beta[h] * S[h * N + n]);
    }
    T total = 0;
    for (int64_t n = 0; n < N; ++n) {
      w[h * N + n] = std::exp(beta[h] * S[h * N + n] - top);
      total += w[h * N + n];
    }
    for (int64_t n = 0; n < N; ++n) w[h * N + n] /= total;
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
  for (int64_t i = 0; i < d.I; ++i) {
    T x = in.xi[i];
    if (d.clip > 0) x = std::min(std::max(x, T(-d.clip)), T(d.clip));
    s.xc[i] = x;
  }
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

  // 5. write weights: content on the previous memory, allocation from the new usage
  content_forward(d, in.M, write_keys, s.beta_w.data(), Wh, s.wc.data(), s.wS.data(),
                  s.wd.data(), s.wkn.data(), s.mn_prev.data());
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

  // 6. erase and add
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < W; ++c) {
      T keep = 1, add = 0;
      for (int64_t j = 0; j < Wh; ++j) {
        keep *= T(1) - s.ww[j * N + n] * s.erase[j * W + c];
        add += s.ww[j * N + n] * write_vectors[j * W + c];
      }
      s.memory[n * W + c] = in.M[n * W + c] * keep + add;
    }
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

  // 8. read weights on the new memory, then read vectors
  content_forward(d, s.memory.data(), read_keys, s.beta_r.data(), R, s.rc.data(), s.rS.data(),
                  s.rd.data(), s.rkn.data(), s.mn.data());
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
  std::vector<T>& gbeta_r = work.gbeta_r;
  content_backward(d, s.memory.data(), xc + d.off[kReadKeys], s.beta_r.data(), R, s.rc.data(),
                   s.rS.data(), s.rd.data(), s.rkn.data(), s.mn.data(), grc.data(), gM.data(),
                   gx.data() + d.off[kReadKeys], gbeta_r.data(), gmn);

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

  // 6. erase and add
  std::vector<T>& gerase = work.gerase;
  std::fill(gerase.begin(), gerase.end(), T(0));
  T* gv = gx.data() + d.off[kWriteVectors];
  const T* write_vectors = xc + d.off[kWriteVectors];
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < W; ++c) {
      const T gm = gM[n * W + c];
      T keep = 1;
      for (int64_t j = 0; j < Wh; ++j) keep *= T(1) - s.ww[j * N + n] * s.erase[j * W + c];
      g.Mp[n * W + c] = gm * keep;
      const T gkeep = gm * in.M[n * W + c];
      for (int64_t j = 0; j < Wh; ++j) {
        T others = 1;  // Π over the other heads, without a division
        for (int64_t o = 0; o < Wh; ++o) {
          if (o != j) others *= T(1) - s.ww[o * N + n] * s.erase[o * W + c];
        }
        const T w = s.ww[j * N + n];
        gww[j * N + n] += gm * write_vectors[j * W + c] - gkeep * s.erase[j * W + c] * others;
        gerase[j * W + c] -= gkeep * w * others;
        gv[j * W + c] += w * gm;
      }
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
  content_backward(d, in.M, xc + d.off[kWriteKeys], s.beta_w.data(), Wh, s.wc.data(),
                   s.wS.data(), s.wd.data(), s.wkn.data(), s.mn_prev.data(), gwc.data(), g.Mp,
                   gx.data() + d.off[kWriteKeys], gbeta_w.data(), gmn);

  // 4. usage (gu now also holds the output's gradient)
  std::vector<T>& gfree = work.gfree;
  std::fill(gfree.begin(), gfree.end(), T(0));
  if (g.wwp) std::fill(g.wwp, g.wwp + Wh * N, T(0));
  for (int64_t n = 0; n < N; ++n) {
    T gun = gu[n] + at(g.u, n);
    if (!(s.upre[n] >= T(0) && s.upre[n] <= T(1))) gun = 0;
    const T up = in.u[n], wr = s.written[n], psi = s.psi[n];
    g.up[n] = gun * psi * (T(1) - wr);
    const T gpsi = gun * (up + wr - up * wr);
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
  for (int64_t i = 0; i < d.I; ++i) {
    const T x = in.xi[i];
    const bool inside = d.clip <= 0 || (x >= T(-d.clip) && x <= T(d.clip));
    g.xi[i] = inside ? gx[i] : T(0);
  }
}

// ---------------------------------------------------------------- the operator

Dims make_dims(const Tensor& interface, const Tensor& memory, const Tensor& read_weights,
               const Tensor& write_weights, bool link, at::IntArrayRef offsets, bool deepmind,
               bool usage_write_grad, double clip, double eps) {
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
                                  d.Wh * d.W, d.R, d.Wh,      d.Wh, d.R * d.P};
  for (int64_t f = 0; f < kFields; ++f) {
    if (f == kReadModes && !d.link) continue;
    TORCH_CHECK(d.off[f] >= 0 && d.off[f] + sizes[f] <= d.I,
                "relmem DNC memory step: field ", f, " at offset ", d.off[f], " (size ", sizes[f],
                ") lies outside the interface of size ", d.I);
  }
}

template <typename T>
Inputs<T> inputs_of(const Dims& d, const tensor_list& t, int64_t b) {
  return {t[0].data_ptr<T>() + b * d.I,
          t[1].data_ptr<T>() + b * d.N * d.W,
          t[2].data_ptr<T>() + b * d.N,
          d.link ? t[3].data_ptr<T>() + b * d.Wh * d.N * d.N : nullptr,
          d.link ? t[4].data_ptr<T>() + b * d.Wh * d.N : nullptr,
          t[5].data_ptr<T>() + b * d.R * d.N,
          t[6].data_ptr<T>() + b * d.Wh * d.N};
}

// Point the scratch's output fields at example b's rows of the outputs.
template <typename T>
void place_outputs(const Dims& d, Scratch<T>& s, const tensor_list& out, int64_t b) {
  s.memory.p = out[0].data_ptr<T>() + b * d.N * d.W;
  s.usage.p = out[1].data_ptr<T>() + b * d.N;
  s.link.p = d.link ? out[2].data_ptr<T>() + b * d.Wh * d.N * d.N : nullptr;
  s.prec.p = d.link ? out[3].data_ptr<T>() + b * d.Wh * d.N : nullptr;
  s.rw.p = out[4].data_ptr<T>() + b * d.R * d.N;
  s.ww.p = out[5].data_ptr<T>() + b * d.Wh * d.N;
  s.rv.p = out[6].data_ptr<T>() + b * d.R * d.W;
}

int64_t slab_size(const Dims& d) { return place<float>(d, nullptr, nullptr); }

// Outputs: memory, usage, link, precedence, read_weights, write_weights, read_vectors (link and
// precedence empty without a link). With `slabs` ([B, slab_size] values and [B, Wh·N] int64,
// defined) the intermediates are kept there for the backward; without, in a slab per thread.
tensor_list run_forward(const Dims& d, const tensor_list& t, const Tensor& slabs,
                        const Tensor& orders) {
  const int64_t B = t[0].size(0);
  const auto options = t[0].options();
  tensor_list out{at::empty({B, d.N, d.W}, options),
                  at::empty({B, d.N}, options),
                  d.link ? at::empty({B, d.Wh, d.N, d.N}, options) : at::empty({0}, options),
                  d.link ? at::empty({B, d.Wh, d.N}, options) : at::empty({0}, options),
                  at::empty({B, d.R, d.N}, options),
                  at::empty({B, d.Wh, d.N}, options),
                  at::empty({B, d.R, d.W}, options)};
  const int64_t size = slab_size(d), WhN = d.Wh * d.N;
  AT_DISPATCH_FLOATING_TYPES(t[0].scalar_type(), "relmem_dnc_memory_step", [&] {
    using T = scalar_t;
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> own(slabs.defined() ? 0 : size);
      std::vector<int64_t> own_order(slabs.defined() ? 0 : WhN);
      Scratch<T> s;
      for (int64_t b = begin; b < end; ++b) {
        place(d, &s, slabs.defined() ? slabs.data_ptr<T>() + b * size : own.data());
        s.order = orders.defined() ? orders.data_ptr<int64_t>() + b * WhN : own_order.data();
        place_outputs(d, s, out, b);
        step_forward(d, inputs_of<T>(d, t, b), s);
      }
    });
  });
  return out;
}

// Gradients of the seven inputs from those of the seven outputs (undefined: zero), from the
// inputs, the outputs and the slabs the forward kept.
tensor_list run_backward(const Dims& d, const tensor_list& t, const tensor_list& out,
                         const Tensor& slabs, const Tensor& orders, const tensor_list& grads) {
  const int64_t B = t[0].size(0);
  tensor_list gin;
  for (const Tensor& x : t) gin.push_back(at::empty_like(x));
  tensor_list gout;
  for (const Tensor& g : grads) {
    gout.push_back(g.defined() && g.numel() > 0 ? g.contiguous() : Tensor());
  }
  const int64_t size = slab_size(d);
  AT_DISPATCH_FLOATING_TYPES(t[0].scalar_type(), "relmem_dnc_memory_step_backward", [&] {
    using T = scalar_t;
    auto ptr = [&](const Tensor& g, int64_t stride, int64_t b) -> const T* {
      return g.defined() ? g.data_ptr<T>() + b * stride : nullptr;
    };
    const int64_t NW = d.N * d.W, WhNN = d.Wh * d.N * d.N, WhN = d.Wh * d.N, RN = d.R * d.N;
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      Work<T> work(d);
      Scratch<T> s;
      for (int64_t b = begin; b < end; ++b) {
        place(d, &s, slabs.data_ptr<T>() + b * size);
        s.order = orders.data_ptr<int64_t>() + b * WhN;
        place_outputs(d, s, out, b);
        Grads<T> g{ptr(gout[0], NW, b),
                   ptr(gout[1], d.N, b),
                   d.link ? ptr(gout[2], WhNN, b) : nullptr,
                   d.link ? ptr(gout[3], WhN, b) : nullptr,
                   ptr(gout[4], RN, b),
                   ptr(gout[5], WhN, b),
                   ptr(gout[6], d.R * d.W, b),
                   gin[0].data_ptr<T>() + b * d.I,
                   gin[1].data_ptr<T>() + b * NW,
                   gin[2].data_ptr<T>() + b * d.N,
                   d.link ? gin[3].data_ptr<T>() + b * WhNN : nullptr,
                   d.link ? gin[4].data_ptr<T>() + b * WhN : nullptr,
                   gin[5].data_ptr<T>() + b * RN,
                   d.usage_write_grad ? gin[6].data_ptr<T>() + b * WhN : nullptr};
        step_backward(d, inputs_of<T>(d, t, b), s, g, work);
      }
    });
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
                             double clip, double eps) {
    tensor_list t{interface, memory, usage, link, precedence, read_weights, write_weights};
    const Dims d = make_dims(interface, memory, read_weights, write_weights, link.numel() > 0,
                             offsets, deepmind, usage_write_grad, clip, eps);
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
                             ctx->saved_data["clip"].toDouble(), ctx->saved_data["eps"].toDouble());
    tensor_list gin = run_backward(d, t, out, saved[14], saved[15], grads);
    gin.resize(gin.size() + 5);  // offsets, deepmind, usage_write_grad, clip, eps
    return gin;
  }
};

tensor_list memory_step(const Tensor& interface, const Tensor& memory, const Tensor& usage,
                        const Tensor& link, const Tensor& precedence, const Tensor& read_weights,
                        const Tensor& write_weights, at::IntArrayRef offsets, bool deepmind,
                        bool usage_write_grad, double clip, double eps) {
  TORCH_CHECK(interface.dim() == 2 && memory.dim() == 3 && read_weights.dim() == 3 &&
                  write_weights.dim() == 3,
              "relmem DNC memory step: expected interface [B, I], memory [B, N, W], "
              "read_weights [B, R, N] and write_weights [B, Wh, N], got ", interface.sizes(), ", ",
              memory.sizes(), ", ", read_weights.sizes(), ", ", write_weights.sizes());
  tensor_list t{interface.contiguous(), memory.contiguous(), usage.contiguous(),
                link.contiguous(), precedence.contiguous(), read_weights.contiguous(),
                write_weights.contiguous()};
  const Dims d = make_dims(t[0], t[1], t[5], t[6], link.numel() > 0, offsets, deepmind,
                           usage_write_grad, clip, eps);
  check_inputs(d, t);
  bool grad = false;
  for (const Tensor& x : t) grad = grad || x.requires_grad();
  // Without a gradient to make, nothing is kept (inference holds no step's inputs).
  if (!at::GradMode::is_enabled() || !grad) return run_forward(d, t, Tensor(), Tensor());
  return MemoryStep::apply(t[0], t[1], t[2], t[3], t[4], t[5], t[6], offsets, deepmind,
                           usage_write_grad, clip, eps);
}

}  // namespace

TORCH_LIBRARY(relmem_dnc, m) {
  m.def(
      "memory_step(Tensor interface, Tensor memory, Tensor usage, Tensor link, Tensor precedence, "
      "Tensor read_weights, Tensor write_weights, int[] offsets, bool deepmind, "
      "bool usage_write_grad, float clip, float eps) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(relmem_dnc, CompositeImplicitAutograd, m) {
  m.impl("memory_step", &memory_step);
}
