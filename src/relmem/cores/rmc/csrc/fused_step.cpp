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
// The GEMMs stay ATen's (the Python step calls F.linear between the operators). tanh is
// computed as 2σ(2x) − 1 with ATen's vectorised sigmoid: on this build ATen's tanh ran several
// times slower than its sigmoid per element (docs/performance.md §4.6).
//
// Notation (docs/rmc.md §1): B batch, N slots, M = H·D, Q = H·(2K + D) qkv columns in head-major
// order [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], g the gate width (M or 1), W = (2 or 3)·g.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr double kEps = 1e-5;

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "relmem fused step: ", name, " must be on the CPU, got ",
              t.device());
}

template <typename scalar_t>
scalar_t dot(const scalar_t* a, const scalar_t* b, int64_t n) {
  scalar_t total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

// Row-wise LayerNorm forward of `rows` rows of width `width`: out = xhat·γ + β, keeping
// xhat and 1/σ for the backward.
template <typename scalar_t>
void layer_norm_rows(const scalar_t* x, const scalar_t* gamma, const scalar_t* beta,
                     scalar_t* xhat, scalar_t* rstd, scalar_t* out, int64_t width) {
  scalar_t mean = 0;
#pragma omp simd reduction(+ : mean)
  for (int64_t c = 0; c < width; ++c) mean += x[c];
  mean /= width;
  scalar_t var = 0;
#pragma omp simd reduction(+ : var)
  for (int64_t c = 0; c < width; ++c) {
    const scalar_t d = x[c] - mean;
    var += d * d;
  }
  var /= width;
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
void layer_norm_row_backward(const scalar_t* dout, const scalar_t* gamma, const scalar_t* xhat,
                             scalar_t rstd, scalar_t* dx, scalar_t* dgamma_row,
                             scalar_t* dbeta_row, int64_t width) {
  scalar_t mean_g = 0, mean_gx = 0;
#pragma omp simd reduction(+ : mean_g, mean_gx)
  for (int64_t c = 0; c < width; ++c) {
    const scalar_t g = dout[c] * gamma[c];
    mean_g += g;
    mean_gx += g * xhat[c];
    dgamma_row[c] += dout[c] * xhat[c];
    dbeta_row[c] += dout[c];
  }
  mean_g /= width;
  mean_gx /= width;
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

// Forward. Saves: zy (LN_qkv(y)), xhat_y, rstd_y, probs [B, H, Rq, R], xhat_o, rstd_o.
tensor_list attend_block_forward(const Tensor& y_, const Tensor& z_in_, const Tensor& residual_,
                                 const Tensor& qkv_gamma_, const Tensor& qkv_beta_,
                                 const Tensor& out_gamma_, const Tensor& out_beta_,
                                 int64_t heads, int64_t key, int64_t value) {
  const AttendSizes s = attend_sizes(y_, z_in_, residual_, heads, key, value);
  const Tensor y = y_.contiguous(), z_in = z_in_.contiguous(), residual = residual_.contiguous();
  const Tensor qkv_gamma = qkv_gamma_.contiguous(), qkv_beta = qkv_beta_.contiguous();
  const Tensor out_gamma = out_gamma_.contiguous(), out_beta = out_beta_.contiguous();
  const int64_t Q = s.qkv(), M = s.mem(), R = s.rows();
  Tensor zy = at::empty_like(y), xhat_y = at::empty_like(y);
  Tensor rstd_y = at::empty({s.batch, s.rows_y}, y.options());
  Tensor probs = at::empty({s.batch, heads, s.rows_q, R}, y.options());
  Tensor out = at::empty({s.batch, s.rows_q, M}, y.options());
  Tensor xhat_o = at::empty_like(out);
  Tensor rstd_o = at::empty({s.batch, s.rows_q}, y.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "relmem_attend_block", [&] {
    const scalar_t* py = y.data_ptr<scalar_t>();
    const scalar_t* pz = z_in.data_ptr<scalar_t>();
    const scalar_t* pres = residual.data_ptr<scalar_t>();
    const scalar_t *g1 = qkv_gamma.data_ptr<scalar_t>(), *b1 = qkv_beta.data_ptr<scalar_t>();
    const scalar_t *g2 = out_gamma.data_ptr<scalar_t>(), *b2 = out_beta.data_ptr<scalar_t>();
    scalar_t* pzy = zy.data_ptr<scalar_t>();
    scalar_t* pxy = xhat_y.data_ptr<scalar_t>();
    scalar_t* pry = rstd_y.data_ptr<scalar_t>();
    scalar_t* pp = probs.data_ptr<scalar_t>();
    scalar_t* pout = out.data_ptr<scalar_t>();
    scalar_t* pxo = xhat_o.data_ptr<scalar_t>();
    scalar_t* pro = rstd_o.data_ptr<scalar_t>();
    const scalar_t scale = scalar_t(1) / std::sqrt(scalar_t(key));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> sum(M);
      std::vector<const scalar_t*> rows(R);
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t r = 0; r < s.rows_y; ++r) {
          const int64_t o = (b * s.rows_y + r) * Q;
          layer_norm_rows(py + o, g1, b1, pxy + o, pry + b * s.rows_y + r, pzy + o, Q);
        }
        for (int64_t j = 0; j < R; ++j) {
          rows[j] = j < s.rows_y ? pzy + (b * s.rows_y + j) * Q
                                 : pz + (b * s.rows_z + j - s.rows_y) * Q;
        }
        auto row = [&](int64_t j) { return rows[j]; };
        for (int64_t i = 0; i < s.rows_q; ++i) {
          const scalar_t* res = pres + (b * s.rows_q + i) * M;
          for (int64_t c = 0; c < M; ++c) sum[c] = res[c];
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t qo = h * (2 * key + value);
            const scalar_t* q = row(i) + qo;
            scalar_t* p = pp + ((b * heads + h) * s.rows_q + i) * R;
            scalar_t top = -std::numeric_limits<scalar_t>::infinity();
            for (int64_t j = 0; j < R; ++j) {
              const scalar_t* k = row(j) + qo + key;
              p[j] = dot(q, k, key) * scale;
              top = std::max(top, p[j]);
            }
            scalar_t total = 0;
            for (int64_t j = 0; j < R; ++j) {
              p[j] = std::exp(p[j] - top);
              total += p[j];
            }
            for (int64_t j = 0; j < R; ++j) p[j] /= total;
            scalar_t* acc = sum.data() + h * value;
            for (int64_t j = 0; j < R; ++j) {
              const scalar_t* v = row(j) + qo + 2 * key;
              const scalar_t w = p[j];
              for (int64_t d = 0; d < value; ++d) acc[d] += w * v[d];
            }
          }
          const int64_t o = (b * s.rows_q + i) * M;
          layer_norm_rows(sum.data(), g2, b2, pxo + o, pro + b * s.rows_q + i, pout + o, M);
        }
      }
    });
  });
  return {out, zy, xhat_y, rstd_y, probs, xhat_o, rstd_o};
}

// Backward: returns dy, dz_in, dresidual, dγ_qkv, dβ_qkv, dγ_out, dβ_out.
tensor_list attend_block_backward(const Tensor& dout_, const Tensor& z_in_,
                                  const Tensor& qkv_gamma_, const Tensor& out_gamma_,
                                  const Tensor& zy, const Tensor& xhat_y, const Tensor& rstd_y,
                                  const Tensor& probs, const Tensor& xhat_o,
                                  const Tensor& rstd_o, int64_t heads, int64_t key,
                                  int64_t value) {
  const Tensor dout = dout_.contiguous(), z_in = z_in_.contiguous();
  const Tensor qkv_gamma = qkv_gamma_.contiguous(), out_gamma = out_gamma_.contiguous();
  AttendSizes s{zy.size(0), zy.size(1), z_in.size(1), dout.size(1), heads, key, value};
  const int64_t Q = s.qkv(), M = s.mem(), R = s.rows();
  Tensor dy = at::empty_like(zy);
  Tensor dz_in = at::empty_like(z_in);
  Tensor dres = at::empty_like(dout);
  // Per-example shares of the LayerNorm parameters' gradients, summed over B at the end.
  Tensor dg1 = at::zeros({s.batch, Q}, zy.options()), db1 = at::zeros({s.batch, Q}, zy.options());
  Tensor dg2 = at::zeros({s.batch, M}, zy.options()), db2 = at::zeros({s.batch, M}, zy.options());
  AT_DISPATCH_FLOATING_TYPES(zy.scalar_type(), "relmem_attend_block_backward", [&] {
    const scalar_t* pd = dout.data_ptr<scalar_t>();
    const scalar_t* pz = z_in.data_ptr<scalar_t>();
    const scalar_t* pzy = zy.data_ptr<scalar_t>();
    const scalar_t* pxy = xhat_y.data_ptr<scalar_t>();
    const scalar_t* pry = rstd_y.data_ptr<scalar_t>();
    const scalar_t* pp = probs.data_ptr<scalar_t>();
    const scalar_t* pxo = xhat_o.data_ptr<scalar_t>();
    const scalar_t* pro = rstd_o.data_ptr<scalar_t>();
    const scalar_t *g1 = qkv_gamma.data_ptr<scalar_t>(), *g2 = out_gamma.data_ptr<scalar_t>();
    scalar_t* pdy = dy.data_ptr<scalar_t>();
    scalar_t* pdz = dz_in.data_ptr<scalar_t>();
    scalar_t* pdr = dres.data_ptr<scalar_t>();
    scalar_t *pdg1 = dg1.data_ptr<scalar_t>(), *pdb1 = db1.data_ptr<scalar_t>();
    scalar_t *pdg2 = dg2.data_ptr<scalar_t>(), *pdb2 = db2.data_ptr<scalar_t>();
    const scalar_t scale = scalar_t(1) / std::sqrt(scalar_t(key));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> dz(R * Q), dp(R);
      std::vector<const scalar_t*> rows(R);
      for (int64_t b = begin; b < end; ++b) {
        std::fill(dz.begin(), dz.end(), scalar_t(0));
        for (int64_t j = 0; j < R; ++j) {
          rows[j] = j < s.rows_y ? pzy + (b * s.rows_y + j) * Q
                                 : pz + (b * s.rows_z + j - s.rows_y) * Q;
        }
        auto row = [&](int64_t j) { return rows[j]; };
        for (int64_t i = 0; i < s.rows_q; ++i) {
          const int64_t o = (b * s.rows_q + i) * M;
          // dres is d(residual + attention): the residual's and the attention output's gradient.
          layer_norm_row_backward(pd + o, g2, pxo + o, pro[b * s.rows_q + i], pdr + o,
                                  pdg2 + b * M, pdb2 + b * M, M);
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t qo = h * (2 * key + value);
            const scalar_t* q = row(i) + qo;
            const scalar_t* p = pp + ((b * heads + h) * s.rows_q + i) * R;
            const scalar_t* dattn = pdr + o + h * value;
            scalar_t weighted = 0;
            for (int64_t j = 0; j < R; ++j) {
              const scalar_t* v = row(j) + qo + 2 * key;
              scalar_t* dv = dz.data() + j * Q + qo + 2 * key;
              for (int64_t d = 0; d < value; ++d) dv[d] += p[j] * dattn[d];
              dp[j] = dot(dattn, v, value);
              weighted += p[j] * dp[j];
            }
            scalar_t* dq = dz.data() + i * Q + qo;
            for (int64_t j = 0; j < R; ++j) {
              const scalar_t ds = p[j] * (dp[j] - weighted) * scale;
              const scalar_t* k = row(j) + qo + key;
              scalar_t* dk = dz.data() + j * Q + qo + key;
              for (int64_t d = 0; d < key; ++d) {
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
              }
            }
          }
        }
        for (int64_t r = 0; r < s.rows_y; ++r) {
          const int64_t o = (b * s.rows_y + r) * Q;
          layer_norm_row_backward(dz.data() + r * Q, g1, pxy + o, pry[b * s.rows_y + r], pdy + o,
                                  pdg1 + b * Q, pdb1 + b * Q, Q);
        }
        std::copy(dz.begin() + s.rows_y * Q, dz.end(), pdz + b * s.rows_z * Q);
      }
    });
  });
  return {dy, dz_in, dres, dg1.sum(0), db1.sum(0), dg2.sum(0), db2.sum(0)};
}

struct AttendBlock : public torch::autograd::Function<AttendBlock> {
  static Tensor forward(AutogradContext* ctx, const Tensor& y, const Tensor& z_in,
                        const Tensor& residual, const Tensor& qkv_gamma, const Tensor& qkv_beta,
                        const Tensor& out_gamma, const Tensor& out_beta, int64_t heads,
                        int64_t key, int64_t value) {
    tensor_list r = attend_block_forward(y, z_in, residual, qkv_gamma, qkv_beta, out_gamma,
                                         out_beta, heads, key, value);
    ctx->save_for_backward({z_in, qkv_gamma, out_gamma, r[1], r[2], r[3], r[4], r[5], r[6]});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["key"] = key;
    ctx->saved_data["value"] = value;
    return r[0];
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    tensor_list d = attend_block_backward(
        grads[0], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8],
        ctx->saved_data["heads"].toInt(), ctx->saved_data["key"].toInt(),
        ctx->saved_data["value"].toInt());
    return {d[0], d[1], d[2], d[3], d[4], d[5], d[6], Tensor(), Tensor(), Tensor()};
  }
};

Tensor attend_block(const Tensor& y, const Tensor& z_in, const Tensor& residual,
                    const Tensor& qkv_gamma, const Tensor& qkv_beta, const Tensor& out_gamma,
                    const Tensor& out_beta, int64_t heads, int64_t key, int64_t value) {
  return AttendBlock::apply(y, z_in, residual, qkv_gamma, qkv_beta, out_gamma, out_beta, heads,
                            key, value);
}

// ---------------------------------------------------------------- add_layer_norm

struct AddLayerNorm : public torch::autograd::Function<AddLayerNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b_,
                        const Tensor& gamma_, const Tensor& beta_) {
    check_cpu(a, "a");
    TORCH_CHECK(a.sizes() == b_.sizes(), "relmem add_layer_norm: a and b differ in shape");
    const Tensor sum = at::add(a, b_).contiguous();
    const Tensor gamma = gamma_.contiguous(), beta = beta_.contiguous();
    const int64_t width = sum.size(-1), rows = sum.numel() / width;
    Tensor out = at::empty_like(sum), xhat = at::empty_like(sum);
    Tensor rstd = at::empty({rows}, sum.options());
    AT_DISPATCH_FLOATING_TYPES(sum.scalar_type(), "relmem_add_layer_norm", [&] {
      const scalar_t* px = sum.data_ptr<scalar_t>();
      const scalar_t *g = gamma.data_ptr<scalar_t>(), *bt = beta.data_ptr<scalar_t>();
      scalar_t *po = out.data_ptr<scalar_t>(), *ph = xhat.data_ptr<scalar_t>();
      scalar_t* pr = rstd.data_ptr<scalar_t>();
      at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          layer_norm_rows(px + r * width, g, bt, ph + r * width, pr + r, po + r * width, width);
        }
      });
    });
    ctx->save_for_backward({gamma, xhat, rstd});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const Tensor &gamma = v[0], &xhat = v[1], &rstd = v[2];
    const Tensor dout = grads[0].contiguous();
    const int64_t width = xhat.size(-1), rows = xhat.numel() / width;
    Tensor dx = at::empty_like(xhat);
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(rows, at::get_num_threads()));
    Tensor dg = at::zeros({chunks, width}, xhat.options());
    Tensor db = at::zeros({chunks, width}, xhat.options());
    AT_DISPATCH_FLOATING_TYPES(xhat.scalar_type(), "relmem_add_layer_norm_backward", [&] {
      const scalar_t *pd = dout.data_ptr<scalar_t>(), *g = gamma.data_ptr<scalar_t>();
      const scalar_t *ph = xhat.data_ptr<scalar_t>(), *pr = rstd.data_ptr<scalar_t>();
      scalar_t* pdx = dx.data_ptr<scalar_t>();
      scalar_t *pdg = dg.data_ptr<scalar_t>(), *pdb = db.data_ptr<scalar_t>();
      const int64_t per = (rows + chunks - 1) / chunks;
      at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
            layer_norm_row_backward(pd + r * width, g, ph + r * width, pr[r], pdx + r * width,
                                    pdg + c * width, pdb + c * width, width);
          }
        }
      });
    });
    return {dx, dx, dg.sum(0), db.sum(0)};
  }
};

Tensor add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta) {
  return AddLayerNorm::apply(a, b, gamma, beta);
}

// ---------------------------------------------------------------- tanh

// tanh(x) = 2σ(2x) − 1, with ATen's vectorised sigmoid.
Tensor tanh_by_sigmoid(const Tensor& x) {
  Tensor t = at::sigmoid(x * 2);
  return t.mul_(2).sub_(1);
}

struct Tanh : public torch::autograd::Function<Tanh> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    check_cpu(x, "x");
    Tensor t = tanh_by_sigmoid(x);
    ctx->save_for_backward({t});
    return t;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const Tensor t = ctx->get_saved_variables()[0];
    return {grads[0] * (1 - t * t)};
  }
};

Tensor tanh_op(const Tensor& x) { return Tanh::apply(x); }

// ---------------------------------------------------------------- gate_update

// Gate column of element (n, c) of gate k: k·g + c for unit gates (g = M), k for memory gates.
struct GateSizes {
  int64_t rows, width, gate, gates;  // B·N rows, M, g, W = gates·g
  int64_t col(int64_t k, int64_t c) const { return k * gate + (gate == 1 ? 0 : c); }
};

// Forward: new_memory = i ⊙ tanh(rows) + f ⊙ memory; hidden = o ⊙ tanh(new_memory) with the
// output gate, else tanh(new_memory). Saves gates [B, N, W], tanh(rows), tanh(new_memory).
struct GateUpdate : public torch::autograd::Function<GateUpdate> {
  static tensor_list forward(AutogradContext* ctx, const Tensor& pre, const Tensor& gate_x,
                             const Tensor& rows_, const Tensor& memory_, int64_t gate,
                             bool output_gate) {
    check_cpu(pre, "pre");
    TORCH_CHECK(pre.dim() == 3 && rows_.sizes() == memory_.sizes() && rows_.dim() == 3,
                "relmem gate_update: pre [B, N, W], rows and memory [B, N, M]");
    const int64_t gates_n = output_gate ? 3 : 2;
    TORCH_CHECK(pre.size(2) == gates_n * gate && gate_x.size(-1) == pre.size(2),
                "relmem gate_update: pre and gate_x need ", gates_n, " x g columns");
    const Tensor gates = at::sigmoid(pre + gate_x.unsqueeze(1)).contiguous();  // [B, N, W]
    const Tensor rows = rows_.contiguous(), memory = memory_.contiguous();
    const Tensor tanh_rows = tanh_by_sigmoid(rows);
    const GateSizes s{rows.size(0) * rows.size(1), rows.size(2), gate, gates_n};
    Tensor new_memory = at::empty_like(rows);
    AT_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "relmem_gate_update", [&] {
      const scalar_t *pg = gates.data_ptr<scalar_t>(), *pt = tanh_rows.data_ptr<scalar_t>();
      const scalar_t* pm = memory.data_ptr<scalar_t>();
      scalar_t* pn = new_memory.data_ptr<scalar_t>();
      const int64_t W = gates_n * gate;
      at::parallel_for(0, s.rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* g = pg + r * W;
          const int64_t o = r * s.width;
          for (int64_t c = 0; c < s.width; ++c) {
            pn[o + c] = g[s.col(0, c)] * pt[o + c] + g[s.col(1, c)] * pm[o + c];
          }
        }
      });
    });
    const Tensor tanh_new = tanh_by_sigmoid(new_memory);
    Tensor hidden = output_gate
        ? at::mul(tanh_new, gate == 1 ? gates.narrow(2, 2, 1) : gates.narrow(2, 2 * gate, gate))
        : tanh_new;
    ctx->save_for_backward({gates, tanh_rows, memory, tanh_new});
    ctx->saved_data["gate"] = gate;
    ctx->saved_data["output_gate"] = output_gate;
    return {new_memory, hidden};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const Tensor &gates = v[0], &tanh_rows = v[1], &memory = v[2], &tanh_new = v[3];
    const int64_t gate = ctx->saved_data["gate"].toInt();
    const bool output_gate = ctx->saved_data["output_gate"].toBool();
    const int64_t gates_n = output_gate ? 3 : 2, W = gates_n * gate;
    const GateSizes s{memory.size(0) * memory.size(1), memory.size(2), gate, gates_n};
    const bool has_dm = grads[0].defined(), has_dh = grads[1].defined();
    const Tensor dm = has_dm ? grads[0].contiguous() : Tensor();
    const Tensor dh = has_dh ? grads[1].contiguous() : Tensor();
    Tensor dpre = at::zeros_like(gates);
    Tensor drows = at::empty_like(memory), dmemory = at::empty_like(memory);
    AT_DISPATCH_FLOATING_TYPES(memory.scalar_type(), "relmem_gate_update_backward", [&] {
      const scalar_t *pg = gates.data_ptr<scalar_t>(), *ptr = tanh_rows.data_ptr<scalar_t>();
      const scalar_t *pm = memory.data_ptr<scalar_t>(), *ptn = tanh_new.data_ptr<scalar_t>();
      const scalar_t* pdm = has_dm ? dm.data_ptr<scalar_t>() : nullptr;
      const scalar_t* pdh = has_dh ? dh.data_ptr<scalar_t>() : nullptr;
      scalar_t *pdp = dpre.data_ptr<scalar_t>(), *pdr = drows.data_ptr<scalar_t>();
      scalar_t* pdmem = dmemory.data_ptr<scalar_t>();
      at::parallel_for(0, s.rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* g = pg + r * W;
          scalar_t* dg = pdp + r * W;  // d(gates) first, times σ' below
          const int64_t o = r * s.width;
          for (int64_t c = 0; c < s.width; ++c) {
            const scalar_t tn = ptn[o + c];
            scalar_t dtotal = pdm ? pdm[o + c] : scalar_t(0);
            if (pdh) {
              const scalar_t dhid = pdh[o + c];
              if (output_gate) {
                dg[s.col(2, c)] += dhid * tn;
                dtotal += dhid * g[s.col(2, c)] * (1 - tn * tn);
              } else {
                dtotal += dhid * (1 - tn * tn);
              }
            }
            const scalar_t in_gate = g[s.col(0, c)], tr = ptr[o + c];
            dg[s.col(0, c)] += dtotal * tr;
            dg[s.col(1, c)] += dtotal * pm[o + c];
            pdr[o + c] = dtotal * in_gate * (1 - tr * tr);
            pdmem[o + c] = dtotal * g[s.col(1, c)];
          }
          for (int64_t k = 0; k < W; ++k) {
            // σ' = σ(1 − σ); a gate saturated by a ±inf bias passes zero.
            dg[k] *= g[k] * (1 - g[k]);
          }
        }
      });
    });
    return {dpre, dpre.sum(1), drows, dmemory, Tensor(), Tensor()};
  }
};

tensor_list gate_update(const Tensor& pre, const Tensor& gate_x, const Tensor& rows,
                        const Tensor& memory, int64_t gate, bool output_gate) {
  return GateUpdate::apply(pre, gate_x, rows, memory, gate, output_gate);
}

}  // namespace

TORCH_LIBRARY(relmem_fused, m) {
  m.def(
      "attend_block(Tensor y, Tensor z_in, Tensor residual, Tensor qkv_gamma, Tensor qkv_beta, "
      "Tensor out_gamma, Tensor out_beta, int heads, int key, int value) -> Tensor");
  m.def("add_layer_norm(Tensor a, Tensor b, Tensor gamma, Tensor beta) -> Tensor");
  m.def("tanh(Tensor x) -> Tensor");
  m.def(
      "gate_update(Tensor pre, Tensor gate_x, Tensor rows, Tensor memory, int gate, "
      "bool output_gate) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(relmem_fused, CompositeImplicitAutograd, m) {
  m.impl("attend_block", &attend_block);
  m.impl("add_layer_norm", &add_layer_norm);
  m.impl("tanh", &tanh_op);
  m.impl("gate_update", &gate_update);
}
