// The Relational Memory Core's fused CPU step: the non-GEMM work of one recurrent step as four
// operators with hand-written backward passes (docs/performance.md §4.8).
//
// Each operator replaces a chain of small eager ops whose per-call cost, not their arithmetic,
// dominated the fast path on small cores:
//
//   attend_block    LN_qkv of the rows computed in the step, multi-head attention of the first
//                   Rq rows over all rows (those and the hoisted input rows, without joining
//                   them), the residual and LN_attn                     [B, Rq, M]
//   add_layer_norm  LN(a + b), the MLP's residual and LayerNorm          [B, R, M]
//   gate_update     σ(pre + gate_x), the input/forget blend, the output gate  [B, N, M] x 2
//   tanh            tanh with its backward (the recurrent input)
//
// The GEMMs stay ATen's (the Python step calls F.linear between the operators). σ and tanh are
// computed in the operators' own loops from a vectorisable e^x (exp_nonpositive): on this build
// ATen's tanh ran at about four times its sigmoid's cost per element (docs/performance.md §4.6).
//
// Notation (docs/rmc.md §1): B batch, N slots, M = H·D, Q = H·(2K + D) qkv columns in head-major
// order [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], g the gate width (M or 1), W = (2 or 3)·g.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "../../csrc/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using relmem_math::exp_nonpositive;
using relmem_math::sigmoid;
using relmem_math::tanh_of;

constexpr double kEps = 1e-5;

// The backward passes are written by hand and are not differentiable themselves: a second
// derivative through them would silently be wrong, so it is refused.
void refuse_double_backward() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "implementation='fused' has no second derivative (backward with "
              "create_graph=True); use implementation='reference' for it");
}

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "relmem fused step: ", name, " must be on the CPU, got ",
              t.device());
}

// ---------------------------------------------------------------- 64-byte vectors
//
// The rows of a small core are short (K = 32 key columns, M = 128), so a reduction's last step,
// adding the lanes of its vector, costs as much as its body. An `omp simd` reduction ended with
// the lanes summed one by one through memory; these helpers keep the partial sums in one
// register (GCC's and Clang's vector extension: one AVX-512 register or two AVX2 ones, no
// intrinsics) and add its halves in log2(lanes) shuffles (docs/performance.md §4.9). The order
// of the additions is fixed here, not by compiler flags.

template <typename scalar_t>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename scalar_t>
using Vec = typename VecOf<scalar_t>::type;
template <typename scalar_t>
constexpr int64_t kLanes = 64 / sizeof(scalar_t);

template <typename scalar_t>
[[gnu::always_inline]] inline Vec<scalar_t> load(const scalar_t* p) {
  Vec<scalar_t> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename scalar_t>
[[gnu::always_inline]] inline void store(scalar_t* p, Vec<scalar_t> v) {
  std::memcpy(p, &v, sizeof v);
}

// The sum of a vector's lanes, halves first.
[[gnu::always_inline]] inline float lanes_total(Vec<float> v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

[[gnu::always_inline]] inline double lanes_total(Vec<double> v) {
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

// Σ_i term(p_0[i], p_1[i], ...) for i in [0, n); `term` is generic, called with vectors for
// the body and with scalars for the n mod lanes tail. Long rows use four accumulators, so that
// the additions do not wait on each other.
template <typename scalar_t, typename Term, typename... Rows>
[[gnu::always_inline]] inline scalar_t sum_over(int64_t n, Term&& term, const Rows*... rows) {
  constexpr int64_t L = kLanes<scalar_t>;
  Vec<scalar_t> acc = {}, acc1 = {}, acc2 = {}, acc3 = {};
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    acc += term(load(rows + i)...);
    acc1 += term(load(rows + i + L)...);
    acc2 += term(load(rows + i + 2 * L)...);
    acc3 += term(load(rows + i + 3 * L)...);
  }
  for (; i + L <= n; i += L) acc += term(load(rows + i)...);
  scalar_t total = lanes_total((acc + acc1) + (acc2 + acc3));
  for (; i < n; ++i) total += term(rows[i]...);
  return total;
}

template <typename scalar_t>
[[gnu::always_inline]] inline scalar_t dot(const scalar_t* a, const scalar_t* b, int64_t n) {
  return sum_over<scalar_t>(n, [](auto x, auto y) { return x * y; }, a, b);
}

// out[c] = init[c] + Σ_j w[j]·rows[j][c] for c in [0, n): each block of columns stays in a
// register over the R terms.
template <typename scalar_t>
[[gnu::always_inline]] inline void weighted_rows(scalar_t* out, const scalar_t* init,
                                                 const scalar_t* w,
                                                 const scalar_t* const* rows, int64_t R,
                                                 int64_t n) {
  constexpr int64_t L = kLanes<scalar_t>;
  int64_t c = 0;
  for (; c + L <= n; c += L) {
    Vec<scalar_t> acc = load(init + c);
    for (int64_t j = 0; j < R; ++j) acc += w[j] * load(rows[j] + c);
    store(out + c, acc);
  }
  for (; c < n; ++c) {
    scalar_t acc = init[c];
    for (int64_t j = 0; j < R; ++j) acc += w[j] * rows[j][c];
    out[c] = acc;
  }
}

// out[c] = a[c] + b[c] for c in [0, n); out may be a.
template <typename scalar_t>
[[gnu::always_inline]] inline void add_rows(scalar_t* out, const scalar_t* a,
                                            const scalar_t* __restrict b, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = a[c] + b[c];
}

// y += a·x over n elements (distinct arrays: the loop vectorises).
template <typename scalar_t>
[[gnu::always_inline]] inline void axpy(scalar_t a, const scalar_t* __restrict x,
                                        scalar_t* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Row-wise LayerNorm forward of `rows` rows of width `width`: out = xhat·γ + β, keeping
// xhat and 1/σ for the backward.
template <typename scalar_t>
void layer_norm_rows(const scalar_t* __restrict x, const scalar_t* __restrict gamma,
                     const scalar_t* __restrict beta, scalar_t* __restrict xhat,
                     scalar_t* __restrict rstd, scalar_t* __restrict out, int64_t width) {
  const scalar_t mean = sum_over<scalar_t>(width, [](auto v) { return v; }, x) / width;
  const scalar_t var = sum_over<scalar_t>(
                           width,
                           [mean](auto v) {
                             const auto d = v - mean;
                             return d * d;
                           },
                           x) /
                       width;
  const scalar_t r = scalar_t(1) / std::sqrt(var + scalar_t(kEps));
  *rstd = r;
  for (int64_t c = 0; c < width; ++c) {
    const scalar_t h = (x[c] - mean) * r;
    xhat[c] = h;
    out[c] = h * gamma[c] + beta[c];
  }
}

// Row-wise LayerNorm backward of one row: dx from dout, and this row's share of dγ (dout·xhat;
// dβ's share is dout itself) added into dgamma_row.
template <typename scalar_t>
void layer_norm_row_backward(const scalar_t* __restrict dout, const scalar_t* __restrict gamma,
                             const scalar_t* __restrict xhat, scalar_t rstd,
                             scalar_t* __restrict dx, scalar_t* __restrict dgamma_row,
                             scalar_t* __restrict dbeta_row, int64_t width) {
  const scalar_t mean_g = dot(dout, gamma, width) / width;
  const scalar_t mean_gx =
      sum_over<scalar_t>(width, [](auto d, auto g, auto h) { return d * g * h; }, dout, gamma,
                         xhat) /
      width;
  for (int64_t c = 0; c < width; ++c) {
    dgamma_row[c] += dout[c] * xhat[c];
    dbeta_row[c] += dout[c];
  }
  for (int64_t c = 0; c < width; ++c) {
    dx[c] = rstd * (dout[c] * gamma[c] - mean_g - xhat[c] * mean_gx);
  }
}

// ---------------------------------------------------------------- attend_block

struct AttendSizes {
  int64_t batch, rows_y, rows_z, rows_q, heads, key, value;
  int64_t rows() const { return rows_y + rows_z; }
  int64_t qkv() const { return heads * (2 * key + value); }
  int64_t mem() const { return heads * value; }
};

AttendSizes attend_sizes(const Tensor& y, const Tensor& z_in, const Tensor& residual,
                         int64_t heads, int64_t key, int64_t value) {
  check_cpu(y, "y");
  TORCH_CHECK(y.dim() == 3 && z_in.dim() == 3 && residual.dim() == 3,
              "relmem attend_block: y, z_in and residual must be [B, R, width]");
  AttendSizes s{y.size(0), y.size(1), z_in.size(1), residual.size(1), heads, key, value};
  TORCH_CHECK(y.size(2) == s.qkv() && z_in.size(2) == s.qkv(),
              "relmem attend_block: y and z_in need H·(2K+D) = ", s.qkv(), " columns");
  TORCH_CHECK(residual.size(2) == s.mem() && s.rows_q <= s.rows(),
              "relmem attend_block: residual must be [B, Rq <= R, H·D]");
  TORCH_CHECK(z_in.size(0) == s.batch && residual.size(0) == s.batch,
              "relmem attend_block: batch sizes differ");
  return s;
}

// Forward. Returns out and, for the backward, xhat_y, rstd_y, probs [B, H, Rq, R], xhat_o,
// rstd_o. LN_qkv(y) itself is not kept: the backward makes it again from xhat_y (γ·xhat + β),
// which it reads anyway, instead of reading a third [B, R, Q] tensor from memory.
tensor_list attend_block_forward(const Tensor& y_, const Tensor& z_in_, const Tensor& residual_,
                                 const Tensor& qkv_bias_, const Tensor& qkv_gamma_,
                                 const Tensor& qkv_beta_,
                                 const Tensor& out_gamma_, const Tensor& out_beta_,
                                 int64_t heads, int64_t key, int64_t value) {
  const AttendSizes s = attend_sizes(y_, z_in_, residual_, heads, key, value);
  const Tensor y = y_.contiguous(), z_in = z_in_.contiguous(), residual = residual_.contiguous();
  const Tensor qkv_bias = qkv_bias_.contiguous();
  const Tensor qkv_gamma = qkv_gamma_.contiguous(), qkv_beta = qkv_beta_.contiguous();
  const Tensor out_gamma = out_gamma_.contiguous(), out_beta = out_beta_.contiguous();
  const int64_t Q = s.qkv(), M = s.mem(), R = s.rows();
  TORCH_CHECK(qkv_bias.numel() == Q, "relmem attend_block: qkv_bias needs H·(2K+D) = ", Q,
              " entries");
  Tensor xhat_y = at::empty_like(y);
  Tensor rstd_y = at::empty({s.batch, s.rows_y}, y.options());
  Tensor probs = at::empty({s.batch, heads, s.rows_q, R}, y.options());
  Tensor out = at::empty({s.batch, s.rows_q, M}, y.options());
  Tensor xhat_o = at::empty_like(out);
  Tensor rstd_o = at::empty({s.batch, s.rows_q}, y.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "relmem_attend_block", [&] {
    const scalar_t* py = y.data_ptr<scalar_t>();
    const scalar_t* pz = z_in.data_ptr<scalar_t>();
    const scalar_t* pres = residual.data_ptr<scalar_t>();
    const scalar_t* bias = qkv_bias.data_ptr<scalar_t>();
    const scalar_t *g1 = qkv_gamma.data_ptr<scalar_t>(), *b1 = qkv_beta.data_ptr<scalar_t>();
    const scalar_t *g2 = out_gamma.data_ptr<scalar_t>(), *b2 = out_beta.data_ptr<scalar_t>();
    scalar_t* pxy = xhat_y.data_ptr<scalar_t>();
    scalar_t* pry = rstd_y.data_ptr<scalar_t>();
    scalar_t* pp = probs.data_ptr<scalar_t>();
    scalar_t* pout = out.data_ptr<scalar_t>();
    scalar_t* pxo = xhat_o.data_ptr<scalar_t>();
    scalar_t* pro = rstd_o.data_ptr<scalar_t>();
    const scalar_t scale = scalar_t(1) / std::sqrt(scalar_t(key));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> sum(std::max(M, Q)), scores(heads * R), zy(s.rows_y * Q);
      std::vector<const scalar_t*> rows(R), values(R);
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t r = 0; r < s.rows_y; ++r) {
          const int64_t o = (b * s.rows_y + r) * Q;
          add_rows(sum.data(), py + o, bias, Q);
          layer_norm_rows(sum.data(), g1, b1, pxy + o, pry + b * s.rows_y + r, zy.data() + r * Q,
                          Q);
        }
        for (int64_t j = 0; j < R; ++j) {
          rows[j] = j < s.rows_y ? zy.data() + j * Q : pz + (b * s.rows_z + j - s.rows_y) * Q;
        }
        for (int64_t i = 0; i < s.rows_q; ++i) {
          // Query i's scores against every row, for all heads ([H, R]), each head's shifted
          // by its largest, then e^x over all of them in one vectorised loop.
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t qo = h * (2 * key + value);
            scalar_t* score = scores.data() + h * R;
            scalar_t top = -std::numeric_limits<scalar_t>::infinity();
            for (int64_t j = 0; j < R; ++j) {
              score[j] = dot(rows[i] + qo, rows[j] + qo + key, key) * scale;
              top = std::max(top, score[j]);
            }
            for (int64_t j = 0; j < R; ++j) score[j] -= top;
          }
          for (int64_t k = 0; k < heads * R; ++k) scores[k] = exp_nonpositive(scores[k]);
          const scalar_t* res = pres + (b * s.rows_q + i) * M;
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t qo = h * (2 * key + value);
            const scalar_t* score = scores.data() + h * R;
            scalar_t* p = pp + ((b * heads + h) * s.rows_q + i) * R;
            scalar_t total = 0;
            for (int64_t j = 0; j < R; ++j) total += score[j];
            for (int64_t j = 0; j < R; ++j) {
              p[j] = score[j] / total;
              values[j] = rows[j] + qo + 2 * key;
            }
            weighted_rows(sum.data() + h * value, res + h * value, p, values.data(), R, value);
          }
          const int64_t o = (b * s.rows_q + i) * M;
          layer_norm_rows(sum.data(), g2, b2, pxo + o, pro + b * s.rows_q + i, pout + o, M);
        }
      }
    });
  });
  return {out, xhat_y, rstd_y, probs, xhat_o, rstd_o};
}

// Backward: returns dy, dz_in, dresidual, dγ_qkv, dβ_qkv, dγ_out, dβ_out.
tensor_list attend_block_backward(const Tensor& dout_, const Tensor& z_in_,
                                  const Tensor& qkv_gamma_, const Tensor& qkv_beta_,
                                  const Tensor& out_gamma_, const Tensor& xhat_y,
                                  const Tensor& rstd_y, const Tensor& probs, const Tensor& xhat_o,
                                  const Tensor& rstd_o, int64_t heads, int64_t key,
                                  int64_t value) {
  const Tensor dout = dout_.contiguous(), z_in = z_in_.contiguous();
  const Tensor qkv_gamma = qkv_gamma_.contiguous(), qkv_beta = qkv_beta_.contiguous();
  const Tensor out_gamma = out_gamma_.contiguous();
  AttendSizes s{xhat_y.size(0), xhat_y.size(1), z_in.size(1), dout.size(1), heads, key, value};
  const int64_t Q = s.qkv(), M = s.mem(), R = s.rows();
  Tensor dy = at::empty_like(xhat_y);
  Tensor dz_in = at::empty_like(z_in);
  Tensor dres = at::empty_like(dout);
  // The gradients of the bias and the LayerNorms' parameters, one row per chunk of the batch
  // (one chunk per thread), summed at the end: [chunks, dbias Q | dγ_qkv Q | dβ_qkv Q |
  // dγ_out M | dβ_out M].
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(s.batch, at::get_num_threads()));
  const int64_t per_chunk = (s.batch + chunks - 1) / chunks, width = 3 * Q + 2 * M;
  Tensor params = at::zeros({chunks, width}, xhat_y.options());
  AT_DISPATCH_FLOATING_TYPES(xhat_y.scalar_type(), "relmem_attend_block_backward", [&] {
    const scalar_t* pd = dout.data_ptr<scalar_t>();
    const scalar_t* pz = z_in.data_ptr<scalar_t>();
    const scalar_t* pxy = xhat_y.data_ptr<scalar_t>();
    const scalar_t* pry = rstd_y.data_ptr<scalar_t>();
    const scalar_t* pp = probs.data_ptr<scalar_t>();
    const scalar_t* pxo = xhat_o.data_ptr<scalar_t>();
    const scalar_t* pro = rstd_o.data_ptr<scalar_t>();
    const scalar_t *g1 = qkv_gamma.data_ptr<scalar_t>(), *b1 = qkv_beta.data_ptr<scalar_t>();
    const scalar_t* g2 = out_gamma.data_ptr<scalar_t>();
    scalar_t* pdy = dy.data_ptr<scalar_t>();
    scalar_t* pdz = dz_in.data_ptr<scalar_t>();
    scalar_t* pdr = dres.data_ptr<scalar_t>();
    scalar_t* pparams = params.data_ptr<scalar_t>();
    const scalar_t scale = scalar_t(1) / std::sqrt(scalar_t(key));
    at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
      std::vector<scalar_t> dz(R * Q), dp(R), ds(R), zy(s.rows_y * Q);
      std::vector<const scalar_t*> rows(R), keys(R);
      for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      scalar_t* dbias = pparams + chunk * width;
      scalar_t *pdg1 = dbias + Q, *pdb1 = dbias + 2 * Q;
      scalar_t *pdg2 = dbias + 3 * Q, *pdb2 = dbias + 3 * Q + M;
      for (int64_t b = chunk * per_chunk; b < std::min(s.batch, (chunk + 1) * per_chunk); ++b) {
        std::fill(dz.begin(), dz.end(), scalar_t(0));
        for (int64_t j = 0; j < R; ++j) {
          rows[j] = j < s.rows_y ? zy.data() + j * Q : pz + (b * s.rows_z + j - s.rows_y) * Q;
        }
        for (int64_t r = 0; r < s.rows_y; ++r) {  // LN_qkv(y) again: γ·xhat + β
          const scalar_t* xh = pxy + (b * s.rows_y + r) * Q;
          scalar_t* z = zy.data() + r * Q;
          for (int64_t c = 0; c < Q; ++c) z[c] = xh[c] * g1[c] + b1[c];
        }
        for (int64_t i = 0; i < s.rows_q; ++i) {
          const int64_t o = (b * s.rows_q + i) * M;
          // dres is d(residual + attention): the residual's and the attention output's gradient.
          layer_norm_row_backward(pd + o, g2, pxo + o, pro[b * s.rows_q + i], pdr + o, pdg2,
                                  pdb2, M);
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t qo = h * (2 * key + value);
            const scalar_t* q = rows[i] + qo;
            const scalar_t* p = pp + ((b * heads + h) * s.rows_q + i) * R;
            const scalar_t* dattn = pdr + o + h * value;
            scalar_t weighted = 0;
            for (int64_t j = 0; j < R; ++j) {
              const scalar_t* v = rows[j] + qo + 2 * key;
              scalar_t* dv = dz.data() + j * Q + qo + 2 * key;
              axpy(p[j], dattn, dv, value);
              dp[j] = dot(dattn, v, value);
              weighted += p[j] * dp[j];
            }
            for (int64_t j = 0; j < R; ++j) {
              ds[j] = p[j] * (dp[j] - weighted) * scale;
              keys[j] = rows[j] + qo + key;
              axpy(ds[j], q, dz.data() + j * Q + qo + key, key);  // dk_j
            }
            scalar_t* dq = dz.data() + i * Q + qo;
            weighted_rows(dq, dq, ds.data(), keys.data(), R, key);
          }
        }
        for (int64_t r = 0; r < s.rows_y; ++r) {
          const int64_t o = (b * s.rows_y + r) * Q;
          layer_norm_row_backward(dz.data() + r * Q, g1, pxy + o, pry[b * s.rows_y + r], pdy + o,
                                  pdg1, pdb1, Q);
          add_rows(dbias, dbias, pdy + o, Q);
        }
        std::copy(dz.begin() + s.rows_y * Q, dz.end(), pdz + b * s.rows_z * Q);
      }
      }
    });
  });
  const Tensor total = params.sum(0);
  return {dy,
          dz_in,
          dres,
          total.narrow(0, 0, Q),
          total.narrow(0, Q, Q),
          total.narrow(0, 2 * Q, Q),
          total.narrow(0, 3 * Q, M),
          total.narrow(0, 3 * Q + M, M)};
}

struct AttendBlock : public torch::autograd::Function<AttendBlock> {
  static Tensor forward(AutogradContext* ctx, const Tensor& y, const Tensor& z_in,
                        const Tensor& residual, const Tensor& qkv_bias, const Tensor& qkv_gamma,
                        const Tensor& qkv_beta, const Tensor& out_gamma, const Tensor& out_beta,
                        int64_t heads, int64_t key, int64_t value) {
    tensor_list r = attend_block_forward(y, z_in, residual, qkv_bias, qkv_gamma, qkv_beta,
                                         out_gamma, out_beta, heads, key, value);
    ctx->save_for_backward({z_in, qkv_gamma, qkv_beta, out_gamma, r[1], r[2], r[3], r[4], r[5]});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["key"] = key;
    ctx->saved_data["value"] = value;
    return r[0];
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto v = ctx->get_saved_variables();
    tensor_list d = attend_block_backward(
        grads[0], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8],
        ctx->saved_data["heads"].toInt(), ctx->saved_data["key"].toInt(),
        ctx->saved_data["value"].toInt());
    return {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], Tensor(), Tensor(), Tensor()};
  }
};

Tensor attend_block(const Tensor& y, const Tensor& z_in, const Tensor& residual,
                    const Tensor& qkv_bias, const Tensor& qkv_gamma, const Tensor& qkv_beta,
                    const Tensor& out_gamma, const Tensor& out_beta, int64_t heads, int64_t key,
                    int64_t value) {
  return AttendBlock::apply(y, z_in, residual, qkv_bias, qkv_gamma, qkv_beta, out_gamma,
                            out_beta, heads, key, value);
}

// ---------------------------------------------------------------- add_layer_norm

// Forward: LN((a + bias) + b) over the last axis. Returns out, xhat, rstd.
tensor_list add_layer_norm_forward(const Tensor& a, const Tensor& b_, const Tensor& bias_,
                                   const Tensor& gamma_, const Tensor& beta_) {
  check_cpu(a, "a");
  TORCH_CHECK(a.sizes() == b_.sizes(), "relmem add_layer_norm: a and b differ in shape");
  TORCH_CHECK(bias_.numel() == a.size(-1), "relmem add_layer_norm: bias needs ", a.size(-1),
              " entries");
  const Tensor a_c = a.contiguous(), b_c = b_.contiguous(), bias = bias_.contiguous();
  const Tensor gamma = gamma_.contiguous(), beta = beta_.contiguous();
  const int64_t width = a_c.size(-1), rows = a_c.numel() / width;
  Tensor out = at::empty_like(a_c), xhat = at::empty_like(a_c);
  Tensor rstd = at::empty({rows}, a_c.options());
  AT_DISPATCH_FLOATING_TYPES(a_c.scalar_type(), "relmem_add_layer_norm", [&] {
    const scalar_t *pa = a_c.data_ptr<scalar_t>(), *pb = b_c.data_ptr<scalar_t>();
    const scalar_t* pbias = bias.data_ptr<scalar_t>();
    const scalar_t *g = gamma.data_ptr<scalar_t>(), *bt = beta.data_ptr<scalar_t>();
    scalar_t *po = out.data_ptr<scalar_t>(), *ph = xhat.data_ptr<scalar_t>();
    scalar_t* pr = rstd.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> sum(width);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r * width;
        // (a + bias) + b: the MLP's output with its bias, then the residual.
        add_rows(sum.data(), pa + o, pbias, width);
        add_rows(sum.data(), sum.data(), pb + o, width);
        layer_norm_rows(sum.data(), g, bt, ph + o, pr + r, po + o, width);
      }
    });
  });
  return {out, xhat, rstd};
}

// Backward: returns d(a + bias + b) (the gradient of a and of b), dbias, dγ, dβ.
tensor_list add_layer_norm_backward(const Tensor& dout_, const Tensor& gamma,
                                    const Tensor& xhat, const Tensor& rstd) {
  const Tensor dout = dout_.contiguous();
  const int64_t width = xhat.size(-1), rows = xhat.numel() / width;
  Tensor dx = at::empty_like(xhat);
  // [chunks, dbias | dγ | dβ]: one row per chunk of rows (one chunk per thread).
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(rows, at::get_num_threads()));
  Tensor params = at::zeros({chunks, 3 * width}, xhat.options());
  AT_DISPATCH_FLOATING_TYPES(xhat.scalar_type(), "relmem_add_layer_norm_backward", [&] {
    const scalar_t *pd = dout.data_ptr<scalar_t>(), *g = gamma.data_ptr<scalar_t>();
    const scalar_t *ph = xhat.data_ptr<scalar_t>(), *pr = rstd.data_ptr<scalar_t>();
    scalar_t* pdx = dx.data_ptr<scalar_t>();
    scalar_t* pparams = params.data_ptr<scalar_t>();
    const int64_t per = (rows + chunks - 1) / chunks;
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        scalar_t* dbias = pparams + c * 3 * width;
        for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
          layer_norm_row_backward(pd + r * width, g, ph + r * width, pr[r], pdx + r * width,
                                  dbias + width, dbias + 2 * width, width);
          add_rows(dbias, dbias, pdx + r * width, width);
        }
      }
    });
  });
  const Tensor total = params.sum(0);
  return {dx, total.narrow(0, 0, width), total.narrow(0, width, width),
          total.narrow(0, 2 * width, width)};
}

struct AddLayerNorm : public torch::autograd::Function<AddLayerNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b,
                        const Tensor& bias, const Tensor& gamma, const Tensor& beta) {
    tensor_list r = add_layer_norm_forward(a, b, bias, gamma, beta);
    ctx->save_for_backward({gamma.contiguous(), r[1], r[2]});
    return r[0];
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto v = ctx->get_saved_variables();
    tensor_list d = add_layer_norm_backward(grads[0], v[0], v[1], v[2]);
    return {d[0], d[0], d[1], d[2], d[3]};
  }
};

Tensor add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& gamma,
                      const Tensor& beta) {
  return AddLayerNorm::apply(a, b, bias, gamma, beta);
}

// ---------------------------------------------------------------- tanh

template <typename scalar_t>
void tanh_span(const scalar_t* __restrict x, scalar_t* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = tanh_of(x[i]);
}

Tensor tanh_tensor(const Tensor& x_) {
  check_cpu(x_, "x");
  const Tensor x = x_.contiguous();
  Tensor t = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relmem_tanh", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    scalar_t* pt = t.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
      tanh_span(px + begin, pt + begin, end - begin);
    });
  });
  return t;
}

// dx = grad·(1 − t²) from t = tanh(x).
Tensor tanh_tensor_backward(const Tensor& t, const Tensor& grad_) {
  const Tensor grad = grad_.contiguous();
  Tensor dx = at::empty_like(t);
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "relmem_tanh_backward", [&] {
    const scalar_t *pt = t.data_ptr<scalar_t>(), *pg = grad.data_ptr<scalar_t>();
    scalar_t* pd = dx.data_ptr<scalar_t>();
    at::parallel_for(0, t.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pd[i] = pg[i] * (1 - pt[i] * pt[i]);
    });
  });
  return dx;
}

struct Tanh : public torch::autograd::Function<Tanh> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor t = tanh_tensor(x);
    ctx->save_for_backward({t});
    return t;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    return {tanh_tensor_backward(ctx->get_saved_variables()[0], grads[0])};
  }
};

Tensor tanh_op(const Tensor& x) { return Tanh::apply(x); }

// ---------------------------------------------------------------- gate_update

// One row (one slot of one example) of the gate update. Gate k's column for element c is
// k·g + c with unit gates (g = M) and k with memory gates (g = 1, one gate per slot); both are
// compile-time cases so that the loops vectorise.
template <typename scalar_t, bool unit, bool output_gate>
void gate_forward_row(const scalar_t* __restrict pre, const scalar_t* __restrict gate_x,
                      const scalar_t* __restrict rows, const scalar_t* __restrict memory,
                      scalar_t* __restrict gates, scalar_t* __restrict tanh_rows,
                      scalar_t* __restrict new_memory, scalar_t* __restrict tanh_new,
                      scalar_t* __restrict hidden, int64_t width, int64_t gate) {
  const int64_t W = (output_gate ? 3 : 2) * gate;
  for (int64_t k = 0; k < W; ++k) gates[k] = sigmoid(pre[k] + gate_x[k]);
  const scalar_t *gi = gates, *gf = gates + gate, *go = gates + 2 * gate;
  for (int64_t c = 0; c < width; ++c) {
    const scalar_t tr = tanh_of(rows[c]);
    const scalar_t m = (unit ? gi[c] : gi[0]) * tr + (unit ? gf[c] : gf[0]) * memory[c];
    const scalar_t tn = tanh_of(m);
    tanh_rows[c] = tr;
    new_memory[c] = m;
    tanh_new[c] = tn;
    if (output_gate) hidden[c] = (unit ? go[c] : go[0]) * tn;
  }
}

// The row's backward: dnew_memory and dhidden in; d(pre) (= d(gate_x)'s share), drows and
// dmemory out. Without the output gate, "hidden" is tanh(new memory), the next recurrent input.
template <typename scalar_t, bool unit, bool output_gate>
void gate_backward_row(const scalar_t* __restrict gates, const scalar_t* __restrict tanh_rows,
                       const scalar_t* __restrict memory, const scalar_t* __restrict tanh_new,
                       const scalar_t* __restrict dnew, const scalar_t* __restrict dhidden,
                       scalar_t* __restrict dpre, scalar_t* __restrict drows,
                       scalar_t* __restrict dmemory, int64_t width, int64_t gate) {
  const int64_t W = (output_gate ? 3 : 2) * gate;
  const scalar_t *gi = gates, *gf = gates + gate, *go = gates + 2 * gate;
  scalar_t sum_i = 0, sum_f = 0, sum_o = 0;  // memory gates: one gate per row
#pragma omp simd reduction(+ : sum_i, sum_f, sum_o)
  for (int64_t c = 0; c < width; ++c) {
    const scalar_t tn = tanh_new[c], tr = tanh_rows[c];
    scalar_t dtotal = dnew[c], d_o = 0;
    if (output_gate) {
      d_o = dhidden[c] * tn;
      dtotal += dhidden[c] * (unit ? go[c] : go[0]) * (1 - tn * tn);
    } else {
      dtotal += dhidden[c] * (1 - tn * tn);
    }
    const scalar_t d_i = dtotal * tr, d_f = dtotal * memory[c];
    drows[c] = dtotal * (unit ? gi[c] : gi[0]) * (1 - tr * tr);
    dmemory[c] = dtotal * (unit ? gf[c] : gf[0]);
    if (unit) {
      dpre[c] = d_i;
      dpre[gate + c] = d_f;
      if (output_gate) dpre[2 * gate + c] = d_o;
    } else {
      sum_i += d_i;
      sum_f += d_f;
      sum_o += d_o;
    }
  }
  if (!unit) {
    dpre[0] = sum_i;
    dpre[1] = sum_f;
    if (output_gate) dpre[2] = sum_o;
  }
  // σ' = σ(1 − σ): a gate saturated by a ±inf bias passes zero.
  for (int64_t k = 0; k < W; ++k) dpre[k] *= gates[k] * (1 - gates[k]);
}

// Runs row.template operator()<unit, output_gate>(r) for every row r of B·N, in parallel, with
// the run-time pair as compile-time arguments.
template <typename Row>
void for_each_gate_row(bool unit, bool output_gate, int64_t total, Row&& row) {
  auto rows = [&]<bool U, bool O>() {
    at::parallel_for(0, total, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) row.template operator()<U, O>(r);
    });
  };
  if (unit && output_gate) rows.template operator()<true, true>();
  else if (unit) rows.template operator()<true, false>();
  else if (output_gate) rows.template operator()<false, true>();
  else rows.template operator()<false, false>();
}

// Forward: new_memory = i ⊙ tanh(rows) + f ⊙ memory; hidden = o ⊙ tanh(new_memory) with the
// output gate, else tanh(new_memory) (the next step's recurrent input). Returns new_memory,
// hidden and, for the backward, gates [B, N, W], tanh(rows), memory, tanh(new_memory).
tensor_list gate_update_forward(const Tensor& pre_, const Tensor& gate_x_, const Tensor& rows_,
                                const Tensor& memory_, int64_t gate, bool output_gate) {
  check_cpu(pre_, "pre");
  TORCH_CHECK(pre_.dim() == 3 && rows_.sizes() == memory_.sizes() && rows_.dim() == 3,
              "relmem gate_update: pre [B, N, W], rows and memory [B, N, M]");
  const int64_t W = (output_gate ? 3 : 2) * gate;
  TORCH_CHECK(pre_.size(2) == W && gate_x_.dim() == 2 && gate_x_.size(1) == W,
              "relmem gate_update: pre [B, N, W] and gate_x [B, W] need W = ", W, " columns");
  TORCH_CHECK(gate == 1 || gate == rows_.size(2),
              "relmem gate_update: the gate width must be 1 or the slot width");
  const Tensor pre = pre_.contiguous(), gate_x = gate_x_.contiguous();
  const Tensor rows = rows_.contiguous(), memory = memory_.contiguous();
  const int64_t slots = rows.size(1), width = rows.size(2), total = rows.size(0) * slots;
  Tensor gates = at::empty_like(pre);  // [B, N, W]
  Tensor tanh_rows = at::empty_like(rows), tanh_new = at::empty_like(rows);
  Tensor new_memory = at::empty_like(rows);
  Tensor hidden = output_gate ? at::empty_like(rows) : tanh_new;
  AT_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "relmem_gate_update", [&] {
    const scalar_t *pp = pre.data_ptr<scalar_t>(), *px = gate_x.data_ptr<scalar_t>();
    const scalar_t *prows = rows.data_ptr<scalar_t>(), *pm = memory.data_ptr<scalar_t>();
    scalar_t *pg = gates.data_ptr<scalar_t>(), *ptr = tanh_rows.data_ptr<scalar_t>();
    scalar_t *ptn = tanh_new.data_ptr<scalar_t>(), *pn = new_memory.data_ptr<scalar_t>();
    scalar_t* ph = hidden.data_ptr<scalar_t>();
    const bool unit_gates = gate != 1 || width == 1;
    for_each_gate_row(unit_gates, output_gate, total, [&]<bool unit, bool out_gate>(int64_t r) {
      const int64_t o = r * width;
      gate_forward_row<scalar_t, unit, out_gate>(pp + r * W, px + (r / slots) * W, prows + o,
                                                 pm + o, pg + r * W, ptr + o, pn + o, ptn + o,
                                                 ph + o, width, gate);
    });
  });
  return {new_memory, hidden, gates, tanh_rows, memory, tanh_new};
}

// Backward from the saved gates, tanh(rows), memory and tanh(new_memory), and the gradients of
// new_memory and hidden (either may be undefined: zeros). Returns dpre [B, N, W], dgate_x
// [B, W], drows, dmemory.
tensor_list gate_update_backward(const Tensor& gates, const Tensor& tanh_rows,
                                 const Tensor& memory, const Tensor& tanh_new,
                                 const Tensor& dnew_, const Tensor& dhid_, int64_t gate,
                                 bool output_gate) {
  const int64_t W = (output_gate ? 3 : 2) * gate;
  const int64_t width = memory.size(2), total = memory.size(0) * memory.size(1);
  const Tensor dnew = dnew_.defined() ? dnew_.contiguous() : at::zeros_like(memory);
  const Tensor dhid = dhid_.defined() ? dhid_.contiguous() : at::zeros_like(memory);
  Tensor dpre = at::empty_like(gates);
  Tensor drows = at::empty_like(memory), dmemory = at::empty_like(memory);
  AT_DISPATCH_FLOATING_TYPES(memory.scalar_type(), "relmem_gate_update_backward", [&] {
    const scalar_t *pg = gates.data_ptr<scalar_t>(), *ptr = tanh_rows.data_ptr<scalar_t>();
    const scalar_t *pm = memory.data_ptr<scalar_t>(), *ptn = tanh_new.data_ptr<scalar_t>();
    const scalar_t *pdn = dnew.data_ptr<scalar_t>(), *pdh = dhid.data_ptr<scalar_t>();
    scalar_t *pdp = dpre.data_ptr<scalar_t>(), *pdr = drows.data_ptr<scalar_t>();
    scalar_t* pdm = dmemory.data_ptr<scalar_t>();
    const bool unit_gates = gate != 1 || width == 1;
    for_each_gate_row(unit_gates, output_gate, total, [&]<bool unit, bool out_gate>(int64_t r) {
      const int64_t o = r * width;
      gate_backward_row<scalar_t, unit, out_gate>(pg + r * W, ptr + o, pm + o, ptn + o,
                                                  pdn + o, pdh + o, pdp + r * W, pdr + o,
                                                  pdm + o, width, gate);
    });
  });
  return {dpre, dpre.sum(1), drows, dmemory};
}

struct GateUpdate : public torch::autograd::Function<GateUpdate> {
  static tensor_list forward(AutogradContext* ctx, const Tensor& pre, const Tensor& gate_x,
                             const Tensor& rows, const Tensor& memory, int64_t gate,
                             bool output_gate) {
    tensor_list r = gate_update_forward(pre, gate_x, rows, memory, gate, output_gate);
    ctx->save_for_backward({r[2], r[3], r[4], r[5]});
    ctx->saved_data["gate"] = gate;
    ctx->saved_data["output_gate"] = output_gate;
    return {r[0], r[1]};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto v = ctx->get_saved_variables();
    tensor_list d = gate_update_backward(v[0], v[1], v[2], v[3], grads[0], grads[1],
                                         ctx->saved_data["gate"].toInt(),
                                         ctx->saved_data["output_gate"].toBool());
    return {d[0], d[1], d[2], d[3], Tensor(), Tensor()};
  }
};

tensor_list gate_update(const Tensor& pre, const Tensor& gate_x, const Tensor& rows,
                        const Tensor& memory, int64_t gate, bool output_gate) {
  return GateUpdate::apply(pre, gate_x, rows, memory, gate, output_gate);
}

// ---------------------------------------------------------------- sequence

// A whole sequence of recurrent steps as one operator with one backward: fused_step's steps
// (relmem/cores/rmc/fused.py), their GEMMs included, run in a C++ loop, and the backward runs
// the loop in reverse with the operators' backward functions, each weight's gradient summed
// over the steps inside its GEMM (beta = 1). It saves the per-step autograd nodes and the eager
// ops between the operators; on small cores those cost more than the step's arithmetic
// (docs/performance.md §4.9).
//
// The weights come flat: per block qkv_w [Q, M], qkv_b [Q], LN_qkv γ, β [Q], LN_attn γ, β [M],
// LN_mlp γ, β [M], then (W [M, M], b [M]) per MLP layer; then the memory-gate weight [W, M]
// when gated. z_inputs holds the hoisted input-row qkv [T, B, n, Q] of the blocks flagged in
// `hoisted`, in block order. x, the projected input rows [T, B, n, M], may be absent when no
// block reads them (every block hoisted, none updating the input rows: E13 in fast.py).

constexpr int64_t kBlockTensors = 8;

// x·Wᵀ (+ b) over the last axis: [..., in] -> [..., out].
Tensor project(const Tensor& x, const Tensor& weight) {
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return at::mm(x.reshape({-1, x.size(-1)}), weight.t()).view(sizes);
}

Tensor project(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return at::addmm(bias, x.reshape({-1, x.size(-1)}), weight.t()).view(sizes);
}

// dy·W: the gradient of project's input, [..., out] -> [..., in].
Tensor project_back(const Tensor& dy, const Tensor& weight) {
  auto sizes = dy.sizes().vec();
  sizes.back() = weight.size(1);
  return at::mm(dy.reshape({-1, dy.size(-1)}), weight).view(sizes);
}

// grad += dyᵀ·x over all rows: [out, in] from [..., out] and [..., in]; an undefined grad is
// zero (the first use makes it, later ones add inside the GEMM).
void add_weight_grad(Tensor& grad, const Tensor& dy, const Tensor& x) {
  const Tensor dy_rows = dy.reshape({-1, dy.size(-1)}), x_rows = x.reshape({-1, x.size(-1)});
  if (grad.defined()) {
    grad.addmm_(dy_rows.t(), x_rows);
  } else {
    grad = at::mm(dy_rows.t(), x_rows);
  }
}

// sum += b, an undefined tensor being zero. `sum` is a gradient this backward made (never the
// incoming gradients or a saved tensor), so it is added to in place.
void accumulate(Tensor& sum, const Tensor& b) {
  if (!b.defined()) return;
  if (sum.defined()) {
    sum.add_(b);
  } else {
    sum = b;
  }
}

// Where forward() put each saved tensor: the weights, then per step and block gemm_in, z_in,
// attend_block's five, the MLP layers' inputs, LN_mlp's xhat and 1/σ; then per step, when
// gated, the recurrent input, gates, tanh(rows), m_{t-1} and tanh(m_t).
struct SequenceLayout {
  int64_t weights, blocks, layers;
  bool gated;
  int64_t block_stride() const { return 9 + layers; }
  int64_t step_stride() const { return blocks * block_stride() + (gated ? 5 : 0); }
  int64_t block(int64_t t, int64_t k) const {
    return weights + t * step_stride() + k * block_stride();
  }
  int64_t gates(int64_t t) const { return weights + t * step_stride() + blocks * block_stride(); }
};

// The steps; with `saved`, also what the backward needs (SequenceLayout's order). Returns the
// memories [T, B, N, M] and, with the output gate, the hidden states.
tensor_list sequence_forward(const Tensor& memory0, const std::optional<Tensor>& hidden0,
                             const std::optional<Tensor>& x_in, at::TensorList z_inputs,
                             const std::optional<Tensor>& gate_x, at::TensorList weights,
                             at::IntArrayRef hoisted, int64_t heads, int64_t key, int64_t value,
                             int64_t gate, bool query_all, bool output_gate, int64_t layers,
                             tensor_list* saved) {
  check_cpu(memory0, "memory");
  const Tensor x = x_in.has_value() ? *x_in : Tensor();
  TORCH_CHECK(x.defined() || !z_inputs.empty(),
              "relmem sequence: without x, block 1's input rows must come hoisted");
  const int64_t steps = x.defined() ? x.size(0) : z_inputs[0].size(0);
  const int64_t slots = memory0.size(1);
  const int64_t blocks = static_cast<int64_t>(hoisted.size());
  const bool gated = gate_x.has_value() && gate_x->defined();
  const int64_t per_block = kBlockTensors + 2 * layers;
  TORCH_CHECK(steps >= 1, "relmem sequence: no time steps");
  TORCH_CHECK(layers >= 1 && blocks >= 1 &&
                  static_cast<int64_t>(weights.size()) == blocks * per_block + (gated ? 1 : 0),
              "relmem sequence: the weight list does not match the blocks and layers");
  TORCH_CHECK(!output_gate || (hidden0.has_value() && hidden0->defined()),
              "relmem sequence: the output gate needs the initial hidden state");
  const auto keep = [saved](std::initializer_list<Tensor> tensors) {
    if (saved != nullptr) saved->insert(saved->end(), tensors);
  };
  if (saved != nullptr) saved->assign(weights.begin(), weights.end());
  tensor_list memories, hiddens;
  Tensor memory = memory0;
  Tensor recurrent;  // the gate GEMM's input: h_{t-1} with the output gate, else tanh(m_{t-1})
  if (gated) recurrent = output_gate ? *hidden0 : tanh_tensor(memory0);
  for (int64_t t = 0; t < steps; ++t) {
    Tensor rows_mem = memory, rows_in = x.defined() ? x[t] : Tensor();
    int64_t next_z = 0;
    for (int64_t k = 0; k < blocks; ++k) {
      const Tensor* w = weights.data() + k * per_block;
      const bool full = query_all && k < blocks - 1;  // the block updates the input rows too
      const Tensor z = hoisted[k] ? z_inputs[next_z++][t] : Tensor();
      TORCH_CHECK(rows_in.defined() || (z.defined() && !full),
                  "relmem sequence: block ", k, " reads the input rows, and x was not given");
      const Tensor joined = full || !z.defined() ? at::cat({rows_mem, rows_in}, 1) : Tensor();
      const Tensor gemm_in = z.defined() ? rows_mem : joined;
      const Tensor y = project(gemm_in, w[0]);
      const Tensor z_in = z.defined() ? z : y.new_empty({y.size(0), 0, y.size(2)});
      tensor_list a = attend_block_forward(y, z_in, full ? joined : rows_mem, w[1], w[2], w[3],
                                           w[4], w[5], heads, key, value);
      keep({gemm_in, z_in, a[1], a[2], a[3], a[4], a[5]});
      Tensor u = a[0];
      for (int64_t l = 0; l < layers; ++l) {
        if (l > 0) u = at::relu(u);
        keep({u});  // the layer's input
        const Tensor& weight = w[kBlockTensors + 2 * l];
        u = l < layers - 1 ? project(u, weight, w[kBlockTensors + 2 * l + 1])
                           : project(u, weight);  // the last bias is add_layer_norm's
      }
      tensor_list ln = add_layer_norm_forward(u, a[0], w[per_block - 1], w[6], w[7]);
      keep({ln[1], ln[2]});
      if (full) {
        rows_mem = ln[0].narrow(1, 0, slots);
        rows_in = ln[0].narrow(1, slots, ln[0].size(1) - slots);
      } else {
        rows_mem = ln[0];
      }
    }
    if (gated) {
      const Tensor pre = project(recurrent, weights.back());
      tensor_list g = gate_update_forward(pre, (*gate_x)[t], rows_mem, memory, gate, output_gate);
      keep({recurrent, g[2], g[3], g[4], g[5]});
      memory = g[0];
      recurrent = g[1];  // h_t, or tanh(m_t) without the output gate
      if (output_gate) hiddens.push_back(g[1]);
    } else {
      memory = rows_mem;
    }
    memories.push_back(memory);
  }
  tensor_list out{at::stack(memories)};
  if (output_gate) out.push_back(at::stack(hiddens));
  return out;
}

struct Sequence : public torch::autograd::Function<Sequence> {
  static tensor_list forward(AutogradContext* ctx, const Tensor& memory0,
                             const std::optional<Tensor>& hidden0, const std::optional<Tensor>& x,
                             at::TensorList z_inputs, const std::optional<Tensor>& gate_x,
                             at::TensorList weights, at::IntArrayRef hoisted, int64_t heads,
                             int64_t key, int64_t value, int64_t gate, bool query_all,
                             bool output_gate, int64_t layers) {
    tensor_list saved;
    tensor_list out = sequence_forward(memory0, hidden0, x, z_inputs, gate_x, weights, hoisted,
                                       heads, key, value, gate, query_all, output_gate, layers,
                                       &saved);
    ctx->save_for_backward(saved);
    ctx->saved_data["hoisted"] = hoisted.vec();
    // [T, B, n, M]: x's sizes, or what they would be (x may be absent)
    const bool has_x = x.has_value() && x->defined();
    const Tensor& z0 = has_x ? *x : z_inputs[0];
    ctx->saved_data["x_sizes"] =
        std::vector<int64_t>{z0.size(0), z0.size(1), z0.size(2), memory0.size(2)};
    ctx->saved_data["slots"] = memory0.size(1);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["key"] = key;
    ctx->saved_data["value"] = value;
    ctx->saved_data["gate"] = gate;
    ctx->saved_data["query_all"] = query_all;
    ctx->saved_data["output_gate"] = output_gate;
    ctx->saved_data["layers"] = layers;
    ctx->saved_data["gated"] = gate_x.has_value() && gate_x->defined();
    ctx->saved_data["weights"] = static_cast<int64_t>(weights.size());
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const tensor_list v = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    const std::vector<int64_t> hoisted = data["hoisted"].toIntVector();
    const std::vector<int64_t> x_sizes = data["x_sizes"].toIntVector();
    const int64_t slots = data["slots"].toInt(), heads = data["heads"].toInt();
    const int64_t key = data["key"].toInt(), value = data["value"].toInt();
    const int64_t gate = data["gate"].toInt();
    const bool query_all = data["query_all"].toBool(), output_gate = data["output_gate"].toBool();
    const SequenceLayout layout{data["weights"].toInt(), static_cast<int64_t>(hoisted.size()),
                                data["layers"].toInt(), data["gated"].toBool()};
    const int64_t steps = x_sizes[0], batch = x_sizes[1], inputs = x_sizes[2];
    const int64_t width = x_sizes[3], blocks = layout.blocks, layers = layout.layers;
    const int64_t per_block = kBlockTensors + 2 * layers;
    const auto options = v[0].options();
    const Tensor dmemories = grads[0];
    const Tensor dhiddens = output_gate ? grads[1] : Tensor();
    // The initial state's gradient only where it is wanted (a cell's or a segment's initial
    // state often is a constant): step 0 then skips the products that make it alone.
    // Edge 0 is memory0 and edge 1 hidden0, which is an input only with the output gate.
    const bool want_memory0 = ctx->needs_input_grad(0);
    const bool want_recurrent0 = output_gate ? ctx->needs_input_grad(1) : want_memory0;
    // Undefined is zero throughout: the gradients are made by their first use. Every step
    // writes its slice of dx (when the first block reads x_t), dz and dgate_x.
    tensor_list dw(layout.weights);
    Tensor dx, dgate_x;      // [T, B, n, M], [T, B, W]
    tensor_list dz(blocks);  // [T, B, n, Q] per hoisted block
    Tensor d_memory, d_recurrent;  // into step t from step t + 1
    for (int64_t t = steps - 1; t >= 0; --t) {
      Tensor dm = d_memory;
      if (dmemories.defined()) dm = dm.defined() ? dm.add_(dmemories[t]) : dmemories[t];
      Tensor d_rows, d_memory_prev, d_rec;
      if (layout.gated) {
        const int64_t o = layout.gates(t);
        const Tensor& recurrent = v[o];
        Tensor dh = d_recurrent;
        if (output_gate && dhiddens.defined()) {
          dh = dh.defined() ? dh.add_(dhiddens[t]) : dhiddens[t];
        }
        tensor_list g = gate_update_backward(v[o + 1], v[o + 2], v[o + 3], v[o + 4], dm, dh,
                                             gate, output_gate);
        if (!dgate_x.defined()) dgate_x = at::empty({steps, batch, g[1].size(1)}, options);
        dgate_x[t].copy_(g[1]);
        add_weight_grad(dw[layout.weights - 1], g[0], recurrent);
        if (t > 0 || want_recurrent0) d_rec = project_back(g[0], v[layout.weights - 1]);
        d_rows = g[2];
        d_memory_prev = g[3];
      } else {
        d_rows = dm.defined() ? dm : at::zeros({batch, slots, width}, options);
      }
      Tensor d_mem_rows = d_rows, d_in_rows;  // the gradients of the block's output rows
      for (int64_t k = blocks - 1; k >= 0; --k) {
        const int64_t o = layout.block(t, k), w = k * per_block;
        const bool full = query_all && k < blocks - 1;
        const Tensor &gemm_in = v[o], &z_in = v[o + 1];
        Tensor d_out = d_mem_rows;
        if (full) {
          d_out = at::cat({d_mem_rows, d_in_rows.defined()
                                           ? d_in_rows
                                           : at::zeros({batch, inputs, width}, options)},
                          1);
        }
        tensor_list ln = add_layer_norm_backward(d_out, v[w + 6], v[o + 7 + layers],
                                                 v[o + 8 + layers]);
        accumulate(dw[w + per_block - 1], ln[1]);
        accumulate(dw[w + 6], ln[2]);
        accumulate(dw[w + 7], ln[3]);
        Tensor d_layer = ln[0], d_attended;
        for (int64_t l = layers - 1; l >= 0; --l) {
          const Tensor& u = v[o + 7 + l];
          const int64_t wl = w + kBlockTensors + 2 * l;
          add_weight_grad(dw[wl], d_layer, u);
          if (l < layers - 1) accumulate(dw[wl + 1], d_layer.reshape({-1, width}).sum(0));
          Tensor d_u = project_back(d_layer, v[wl]);
          if (l > 0) {
            d_layer = at::threshold_backward(d_u, u, 0);  // u = relu(previous layer's output)
          } else {
            d_attended = d_u.add_(ln[0]);  // the MLP's input is also LN_mlp's residual
          }
        }
        tensor_list a = attend_block_backward(d_attended, z_in, v[w + 2], v[w + 3], v[w + 4],
                                              v[o + 2], v[o + 3], v[o + 4], v[o + 5], v[o + 6],
                                              heads, key, value);
        for (int64_t i = 0; i < 5; ++i) accumulate(dw[w + 1 + i], a[3 + i]);  // b, γ, β, γ, β
        add_weight_grad(dw[w], a[0], gemm_in);
        // With hoisted input rows, block 1's GEMM read m_{t-1} alone.
        const bool reads_memory0_only = t == 0 && k == 0 && hoisted[k];
        const Tensor d_gemm_in =
            reads_memory0_only && !want_memory0 ? Tensor() : project_back(a[0], v[w]);
        if (hoisted[k]) {
          if (!dz[k].defined()) dz[k] = at::empty({steps, batch, inputs, z_in.size(2)}, options);
          dz[k][t].copy_(a[1]);
        }
        // The block read [memory rows; input rows] in its GEMM (no hoisted input rows) and as
        // its residual (full), else the memory rows alone.
        Tensor d_joined = hoisted[k] ? Tensor() : d_gemm_in;
        if (full) accumulate(d_joined, a[2]);
        Tensor d_mem_in, d_in_in;
        if (d_joined.defined()) {
          d_mem_in = d_joined.narrow(1, 0, slots);
          d_in_in = d_joined.narrow(1, slots, d_joined.size(1) - slots);
        }
        if (hoisted[k]) accumulate(d_mem_in, d_gemm_in);
        if (!full) accumulate(d_mem_in, a[2]);
        d_mem_rows = d_mem_in;
        d_in_rows = d_in_in;
      }
      // Block 1 read m_{t-1} and x_t.
      accumulate(d_memory_prev, d_mem_rows);
      if (d_in_rows.defined()) {
        if (!dx.defined()) dx = at::empty(x_sizes, options);
        dx[t].copy_(d_in_rows);
      }
      if (layout.gated) {
        if (!output_gate && t == 0 && d_rec.defined()) {  // the recurrent input was tanh(m_0)
          accumulate(d_memory_prev, tanh_tensor_backward(v[layout.gates(0)], d_rec));
        }
        d_recurrent = d_rec;
      }
      d_memory = d_memory_prev;
    }
    // One gradient per input, in forward()'s order (the list inputs flattened).
    tensor_list out{want_memory0 ? d_memory : Tensor(),
                    output_gate && want_recurrent0 ? d_recurrent : Tensor(), dx};
    for (int64_t k = 0; k < blocks; ++k) {
      if (hoisted[k]) out.push_back(dz[k]);
    }
    out.push_back(layout.gated ? dgate_x : Tensor());
    out.insert(out.end(), dw.begin(), dw.end());
    out.resize(out.size() + 8);  // hoisted, heads, key, value, gate, query_all, output_gate, layers
    return out;
  }
};

tensor_list sequence(const Tensor& memory, const std::optional<Tensor>& hidden,
                     const std::optional<Tensor>& x,
                     at::TensorList z_inputs, const std::optional<Tensor>& gate_x,
                     at::TensorList weights, at::IntArrayRef hoisted, int64_t heads, int64_t key,
                     int64_t value, int64_t gate, bool query_all, bool output_gate,
                     int64_t layers) {
  // Without a gradient to make, nothing is kept for a backward (inference holds one step's
  // tensors at a time, not the sequence's).
  const auto needs_grad = [](const Tensor& t) { return t.defined() && t.requires_grad(); };
  bool grad = needs_grad(memory) || (x && needs_grad(*x)) || (hidden && needs_grad(*hidden)) ||
              (gate_x && needs_grad(*gate_x));
  for (const Tensor& t : z_inputs) grad = grad || needs_grad(t);
  for (const Tensor& t : weights) grad = grad || needs_grad(t);
  if (!at::GradMode::is_enabled() || !grad) {
    return sequence_forward(memory, hidden, x, z_inputs, gate_x, weights, hoisted, heads, key,
                            value, gate, query_all, output_gate, layers, nullptr);
  }
  return Sequence::apply(memory, hidden, x, z_inputs, gate_x, weights, hoisted, heads, key, value,
                         gate, query_all, output_gate, layers);
}

}  // namespace

TORCH_LIBRARY(relmem_fused, m) {
  m.def(
      "attend_block(Tensor y, Tensor z_in, Tensor residual, Tensor qkv_bias, Tensor qkv_gamma, "
      "Tensor qkv_beta, Tensor out_gamma, Tensor out_beta, int heads, int key, int value) -> "
      "Tensor");
  m.def("add_layer_norm(Tensor a, Tensor b, Tensor bias, Tensor gamma, Tensor beta) -> Tensor");
  m.def("tanh(Tensor x) -> Tensor");
  m.def(
      "gate_update(Tensor pre, Tensor gate_x, Tensor rows, Tensor memory, int gate, "
      "bool output_gate) -> Tensor[]");
  m.def(
      "sequence(Tensor memory, Tensor? hidden, Tensor? x, Tensor[] z_inputs, Tensor? gate_x, "
      "Tensor[] weights, int[] hoisted, int heads, int key, int value, int gate, bool query_all, "
      "bool output_gate, int mlp_layers) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(relmem_fused, CompositeImplicitAutograd, m) {
  m.impl("attend_block", &attend_block);
  m.impl("add_layer_norm", &add_layer_norm);
  m.impl("tanh", &tanh_op);
  m.impl("gate_update", &gate_update);
  m.impl("sequence", &sequence);
}
