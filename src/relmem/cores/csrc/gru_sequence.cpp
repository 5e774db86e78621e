// A one-layer GRU over a whole sequence from a zero state, as one operator with a hand-written
// backward (relmem/cores/gru.py, docs/performance.md §7.9): what nn.GRU(X, H) computes on the
// CPU, with one autograd node where ATen's recurrence records about a dozen a step.
//
// On the CPU nn.GRU steps through time in ATen: per step a GEMM, a chunk, two sigmoids, a tanh
// and a few products, each a dispatch and, in training, an autograd node; at the reader's sizes
// (32 rows of 48 to 96 units) that bookkeeping is most of the time. Here the input's share,
// x W_ihᵀ + b_ih, is one GEMM over every step; the loop does the hidden GEMM and the gates on
// raw pointers; the backward walks the steps in reverse for the recurrent gradient alone and
// forms the weights' and the input's gradients after the loop, each as one GEMM.
//
// PyTorch's GRU, gate order r z n:
//   r = σ(x W_irᵀ + b_ir + h W_hrᵀ + b_hr), z = σ(x W_izᵀ + b_iz + h W_hzᵀ + b_hz),
//   n = tanh(x W_inᵀ + b_in + r ∘ (h W_hnᵀ + b_hn)), h' = (1 − z) ∘ n + z ∘ h.
// In float32 σ and tanh are vector_math.h's (a few ulp from libm's); in float64 libm's.
//
// Layout: x [T, B, X] (time-major) or [B, T, X] (batch_first), contiguous; a (t, b) row is row
// t·B + b or b·T + t of the flattened tensor, so a step's B rows sit `batch_stride` rows apart.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "blas_gemm.h"
#include "vector_math.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using at::Tensor;
using relmem_blas::gemm;
using relmem_math::sigmoid;
using relmem_math::tanh_of;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct Shape {
  int64_t T, B, X, H;
  bool batch_first;
  int64_t G() const { return 3 * H; }
  // the flattened row of step t, example b; a step's examples are batch_stride() rows apart
  int64_t row(int64_t t, int64_t b) const { return batch_first ? b * T + t : t * B + b; }
  int64_t batch_stride() const { return batch_first ? T : 1; }
};

// One example's step: xg = x W_ihᵀ + b_ih and hg = h W_hhᵀ + b_hh [3H], the previous hidden hp
// [H] -> r, z, n and hg's n part into acts [4H] (what the backward needs), the new hidden h [H].
template <typename T>
void gates_forward(int64_t H, const T* __restrict xg, const T* __restrict hg,
                   const T* __restrict hp, T* __restrict acts, T* __restrict h) {
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) {
    const T r = sigmoid(xg[j] + hg[j]), z = sigmoid(xg[H + j] + hg[H + j]);
    const T n = tanh_of(xg[2 * H + j] + r * hg[2 * H + j]);
    acts[j] = r, acts[H + j] = z, acts[2 * H + j] = n, acts[3 * H + j] = hg[2 * H + j];
    h[j] = (T(1) - z) * n + z * hp[j];
  }
}

// One example's step backward: dh [H] the gradient of h -> the gradients of xg and hg [3H],
// and of hp through z alone into dhp [H] (its share through hg is a GEMM, after).
template <typename T>
void gates_backward(int64_t H, const T* __restrict acts, const T* __restrict hp,
                    const T* __restrict dh, T* __restrict dxg, T* __restrict dhg,
                    T* __restrict dhp) {
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) {
    const T r = acts[j], z = acts[H + j], n = acts[2 * H + j], hn = acts[3 * H + j];
    const T dn = dh[j] * (T(1) - z), dz = dh[j] * (hp[j] - n);
    const T da_n = dn * (T(1) - n * n);
    const T da_r = da_n * hn * r * (T(1) - r), da_z = dz * z * (T(1) - z);
    dxg[j] = da_r, dxg[H + j] = da_z, dxg[2 * H + j] = da_n;
    dhg[j] = da_r, dhg[H + j] = da_z, dhg[2 * H + j] = da_n * r;
    dhp[j] = dh[j] * z;
  }
}

// The previous hidden of step t's B rows: a zero block at t = 0, else step t − 1's outputs;
// its row stride into *ld.
template <typename T>
const T* previous(const Shape& s, const T* out, const T* zeros, int64_t t, int64_t* ld) {
  if (t == 0) {
    *ld = s.H;
    return zeros;
  }
  *ld = s.batch_stride() * s.H;
  return out + s.row(t - 1, 0) * s.H;
}

// out [rows, H] and acts [rows, 4H] from x [rows, X].
template <typename T>
void forward_into(const Shape& s, const Tensor& x, const Tensor& w_ih, const Tensor& w_hh,
                  const Tensor& b_ih, const Tensor& b_hh, Tensor& out, Tensor& acts) {
  const int64_t H = s.H, G = s.G(), B = s.B;
  const Tensor xg = at::addmm(b_ih, x.reshape({-1, s.X}), w_ih.t());  // [rows, G]
  const T* xg_p = xg.data_ptr<T>();
  const T* whh = w_hh.data_ptr<T>();
  const T* bhh = b_hh.data_ptr<T>();
  T* out_p = out.data_ptr<T>();
  T* acts_p = acts.data_ptr<T>();
  std::vector<T> hg(B * G), zeros(B * H, T(0));
  for (int64_t t = 0; t < s.T; ++t) {
    int64_t ld;
    const T* hp = previous<T>(s, out_p, zeros.data(), t, &ld);
    for (int64_t b = 0; b < B; ++b) std::copy(bhh, bhh + G, hg.data() + b * G);
    gemm<T>(true, B, G, H, hp, ld, whh, H, T(1), hg.data(), G);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = s.row(t, b);
      gates_forward<T>(H, xg_p + r * G, hg.data() + b * G, hp + b * ld, acts_p + r * 4 * H,
                       out_p + r * H);
    }
  }
}

// The gradients of x, w_ih, w_hh, b_ih, b_hh from that of out [rows, H].
template <typename T>
tensor_list backward_of(const Shape& s, const Tensor& x, const Tensor& w_ih, const Tensor& w_hh,
                        const Tensor& out, const Tensor& acts, const Tensor& grad_out) {
  const int64_t H = s.H, G = s.G(), B = s.B, rows = s.T * s.B;
  Tensor dxg = at::empty({rows, G}, x.options());
  Tensor dhg = at::empty({rows, G}, x.options());
  const T* out_p = out.data_ptr<T>();
  const T* acts_p = acts.data_ptr<T>();
  const T* gout = grad_out.data_ptr<T>();
  const T* whh = w_hh.data_ptr<T>();
  T* dxg_p = dxg.data_ptr<T>();
  T* dhg_p = dhg.data_ptr<T>();
  // carry: the gradient of the hidden that step t + 1 read, from every later step
  std::vector<T> carry(B * H, T(0)), dh(H), zeros(B * H, T(0));
  for (int64_t t = s.T - 1; t >= 0; --t) {
    int64_t ld;
    const T* hp = previous<T>(s, out_p, zeros.data(), t, &ld);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = s.row(t, b);
      T* c = carry.data() + b * H;
      for (int64_t j = 0; j < H; ++j) dh[j] = gout[r * H + j] + c[j];
      gates_backward<T>(H, acts_p + r * 4 * H, hp + b * ld, dh.data(), dxg_p + r * G,
                        dhg_p + r * G, c);
    }
    // carry += dhg_t W_hh: the share of h_{t−1} through the hidden GEMM
    gemm<T>(false, B, H, G, dhg_p + s.row(t, 0) * G, s.batch_stride() * G, whh, H, T(1),
            carry.data(), H);
  }
  // every step's h_{t−1} beside its dhg row: the outputs shifted one step, zeros first
  const Tensor steps = s.batch_first ? out.view({s.B, s.T, H}) : out.view({s.T, s.B, H});
  const int64_t time = s.batch_first ? 1 : 0;
  const Tensor before =
      at::cat({at::zeros_like(steps.narrow(time, 0, 1)), steps.narrow(time, 0, s.T - 1)}, time)
          .reshape({rows, H});
  const Tensor x2 = x.reshape({rows, s.X});
  return {dxg.mm(w_ih).view(x.sizes()), dxg.t().mm(x2), dhg.t().mm(before), dxg.sum(0),
          dhg.sum(0)};
}

Shape shape_of(const Tensor& x, const Tensor& w_hh, bool batch_first) {
  const int64_t T = batch_first ? x.size(1) : x.size(0), B = batch_first ? x.size(0) : x.size(1);
  return Shape{T, B, x.size(2), w_hh.size(1), batch_first};
}

Shape check(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
            const Tensor& b_hh, bool batch_first) {
  TORCH_CHECK(x.dim() == 3, "relmem gru_sequence: x must be ",
              batch_first ? "[B, T, X]" : "[T, B, X]", ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "relmem gru_sequence: x must be float32 or float64, got ", x.scalar_type());
  const Tensor* named[] = {&x, &w_ih, &w_hh, &b_ih, &b_hh};
  const char* names[] = {"x", "weight_ih", "weight_hh", "bias_ih", "bias_hh"};
  for (int k = 0; k < 5; ++k) {
    TORCH_CHECK(named[k]->device().is_cpu(), "relmem gru_sequence: ", names[k],
                " must be on the CPU, got ", named[k]->device());
    TORCH_CHECK(named[k]->scalar_type() == x.scalar_type(), "relmem gru_sequence: ", names[k],
                " is ", named[k]->scalar_type(), " where x is ", x.scalar_type());
  }
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == 3 * w_hh.size(1),
              "relmem gru_sequence: weight_hh must be [3H, H], got ", w_hh.sizes());
  const int64_t H = w_hh.size(1);
  const int64_t X = x.size(2);
  TORCH_CHECK(w_ih.dim() == 2 && w_ih.size(0) == 3 * H && w_ih.size(1) == X,
              "relmem gru_sequence: weight_ih must be [3H, X] = [", 3 * H, ", ", X, "], got ",
              w_ih.sizes());
  TORCH_CHECK(b_ih.dim() == 1 && b_ih.size(0) == 3 * H, "relmem gru_sequence: bias_ih must be [",
              3 * H, "], got ", b_ih.sizes());
  TORCH_CHECK(b_hh.dim() == 1 && b_hh.size(0) == 3 * H, "relmem gru_sequence: bias_hh must be [",
              3 * H, "], got ", b_hh.sizes());
  return shape_of(x, w_hh, batch_first);
}

tensor_list run_forward(const Shape& s, const Tensor& x, const Tensor& w_ih, const Tensor& w_hh,
                        const Tensor& b_ih, const Tensor& b_hh) {
  const int64_t rows = s.T * s.B;
  Tensor out = at::empty({rows, s.H}, x.options());
  Tensor acts = at::empty({rows, 4 * s.H}, x.options());
  if (rows > 0) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relmem_gru_sequence", [&] {
      forward_into<scalar_t>(s, x, w_ih, w_hh, b_ih, b_hh, out, acts);
    });
  }
  const std::vector<int64_t> shape{x.size(0), x.size(1), s.H};
  return {out.view(shape), acts};
}

class Sequence : public torch::autograd::Function<Sequence> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w_ih,
                        const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh,
                        bool batch_first) {
    const Shape s = check(x, w_ih, w_hh, b_ih, b_hh, batch_first);
    tensor_list out = run_forward(s, x, w_ih, w_hh, b_ih, b_hh);
    ctx->save_for_backward({x, w_ih, w_hh, out[0], out[1]});
    ctx->saved_data["batch_first"] = batch_first;
    return out[0];
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "the fused GRU sequence has no second derivative (backward with "
                "create_graph=True); nn.GRU itself has one");
    const tensor_list v = ctx->get_saved_variables();
    const Tensor &x = v[0], &w_ih = v[1], &w_hh = v[2], &out = v[3], &acts = v[4];
    const Shape s = shape_of(x, w_hh, ctx->saved_data["batch_first"].toBool());
    const Tensor grad = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
    tensor_list g;
    if (s.T * s.B == 0) {
      g = {at::zeros_like(x), at::zeros_like(w_ih), at::zeros_like(w_hh),
           at::zeros({s.G()}, x.options()), at::zeros({s.G()}, x.options())};
    } else {
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relmem_gru_sequence_backward", [&] {
        g = backward_of<scalar_t>(s, x, w_ih, w_hh, out.reshape({-1, s.H}), acts, grad);
      });
    }
    g.push_back(Tensor());  // batch_first
    return g;
  }
};

Tensor gru_sequence(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                    const Tensor& b_hh, bool batch_first) {
  const Tensor xc = x.contiguous(), wi = w_ih.contiguous(), wh = w_hh.contiguous();
  const Tensor bi = b_ih.contiguous(), bh = b_hh.contiguous();
  const auto needs = [](const Tensor& t) { return t.requires_grad(); };
  const bool grad = needs(xc) || needs(wi) || needs(wh) || needs(bi) || needs(bh);
  if (!at::GradMode::is_enabled() || !grad) {
    const Shape s = check(xc, wi, wh, bi, bh, batch_first);
    return run_forward(s, xc, wi, wh, bi, bh)[0];
  }
  return Sequence::apply(xc, wi, wh, bi, bh, batch_first);
}

}  // namespace

TORCH_LIBRARY(relmem_gru, m) {
  m.def(
      "sequence(Tensor x, Tensor weight_ih, Tensor weight_hh, Tensor bias_ih, Tensor bias_hh, "
      "bool batch_first) -> Tensor");
}

TORCH_LIBRARY_IMPL(relmem_gru, CompositeImplicitAutograd, m) {
  m.impl("sequence", &gru_sequence);
}
