// Reference RMSNorm, SwiGLU and rotary QKV (rmsnorm.h, swiglu.h, rope.h): plain loops, double
// arithmetic, one thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/ref/generic.h"
#include "trident/kernels/ref/ref.h"

namespace trident::kernels::ref {
namespace generic {

// rstd = 1 / sqrt((1/C) sum_c x_c^2 + eps),  y_c = x_c * rstd * w_c.
template <class T>
void rmsnorm_forward(const RmsNormForward<T>& a) {
  const std::int64_t C = a.cols;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* x = a.in + r * C;
    double sum_sq = 0.0;
    for (std::int64_t c = 0; c < C; ++c) sum_sq += static_cast<double>(x[c]) * x[c];
    const double rstd = 1.0 / std::sqrt(sum_sq / static_cast<double>(C) + a.eps);
    for (std::int64_t c = 0; c < C; ++c)
      a.out[r * C + c] = static_cast<T>(x[c] * rstd * a.weight[c]);
    a.rstd[r] = static_cast<T>(rstd);
  }
}

// With xhat = x * rstd and g = dy * w: dy/dx through xhat directly (rstd * g) and through rstd
// (d rstd / d x_c = -rstd^3 x_c / C):
//   d_in_c += rstd * (g_c - xhat_c (1/C) sum_j g_j xhat_j),   d_weight_c += sum_rows dy_c xhat_c.
template <class T>
void rmsnorm_backward(const RmsNormBackward<T>& a) {
  const std::int64_t C = a.cols;
  for (std::int64_t c = 0; c < C; ++c) {
    double acc = 0.0;
    for (std::int64_t r = 0; r < a.rows; ++r) {
      acc += static_cast<double>(a.d_out[r * C + c]) * a.in[r * C + c] * a.rstd[r];
    }
    a.d_weight[c] = static_cast<T>(a.d_weight[c] + acc);
  }
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const double rstd = a.rstd[r];
    double sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) {
      sum += static_cast<double>(a.d_out[r * C + c]) * a.weight[c] * a.in[r * C + c] * rstd;
    }
    const double mean = sum / static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = static_cast<double>(a.d_out[r * C + c]) * a.weight[c];
      const double xhat = static_cast<double>(a.in[r * C + c]) * rstd;
      a.d_in[r * C + c] = static_cast<T>(a.d_in[r * C + c] + rstd * (g - xhat * mean));
    }
  }
}

// silu(g) = g / (1 + exp(-g)); y = silu(gate) * up.
template <class T>
void swiglu_forward(T* out, const T* in, std::int64_t rows, std::int64_t F) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c];
      out[r * F + c] = static_cast<T>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

// silu'(g) = s + g s (1 - s), s = sigmoid(g).
template <class T>
void swiglu_backward(T* d_in, const T* d_out, const T* in, std::int64_t rows, std::int64_t F) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c], dy = d_out[r * F + c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      d_in[r * 2 * F + c] = static_cast<T>(dy * u * (s + g * s * (1.0 - s)));
      d_in[r * 2 * F + F + c] = static_cast<T>(dy * g * s);
    }
  }
}

template void rmsnorm_forward<float>(const RmsNormForward<float>&);
template void rmsnorm_forward<double>(const RmsNormForward<double>&);
template void rmsnorm_backward<float>(const RmsNormBackward<float>&);
template void rmsnorm_backward<double>(const RmsNormBackward<double>&);
template void swiglu_forward<float>(float*, const float*, std::int64_t, std::int64_t);
template void swiglu_forward<double>(double*, const double*, std::int64_t, std::int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, std::int64_t,
                                     std::int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, std::int64_t,
                                      std::int64_t);

}  // namespace generic

void rmsnorm_forward(const RmsNormForwardArgs& a) {
  generic::rmsnorm_forward<float>({.out = a.out,
                                   .rstd = a.rstd,
                                   .in = a.in,
                                   .weight = a.weight,
                                   .rows = a.rows,
                                   .cols = a.cols,
                                   .eps = a.eps});
}
void rmsnorm_backward(const RmsNormBackwardArgs& a) {
  generic::rmsnorm_backward<float>({.d_in = a.d_in,
                                    .d_weight = a.d_weight,
                                    .d_out = a.d_out,
                                    .in = a.in,
                                    .weight = a.weight,
                                    .rstd = a.rstd,
                                    .rows = a.rows,
                                    .cols = a.cols});
}
void swiglu_forward(const SwiGluForwardArgs& a) {
  generic::swiglu_forward<float>(a.out, a.in, a.rows, a.cols);
}
void swiglu_backward(const SwiGluBackwardArgs& a) {
  generic::swiglu_backward<float>(a.d_in, a.d_out, a.in, a.rows, a.cols);
}

// Rotary QKV: for every query head h of group g, out[h] = (rot(q_h), rot(k_g), v_g); the
// backward is the transpose, summing the key and value gradients of a group's query heads.
namespace {
double angle(const RopeQkvShape& s, std::int64_t r, std::int64_t i) {
  const std::int64_t pos = s.positions ? s.positions[r] : s.position + r % s.seq_len;
  return static_cast<double>(pos) * static_cast<double>(s.inv_freq[i]);
}
// y = R x (transpose: R^T x) for one head; R rotates the pair (i, i + HS/2) by the angle.
void rot(const RopeQkvShape& s, std::int64_t r, const float* x, double* y, bool transpose) {
  const std::int64_t half = s.head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    double c = 1, sn = 0;
    if (s.inv_freq) {
      c = std::cos(angle(s, r, i));
      sn = std::sin(angle(s, r, i)) * (transpose ? -1.0 : 1.0);
    }
    y[i] = x[i] * c - x[i + half] * sn;
    y[i + half] = x[i + half] * c + x[i] * sn;
  }
}
}  // namespace

void rope_qkv_forward(const RopeQkvForwardArgs& a) {
  const RopeQkvShape& s = a.shape;
  const std::int64_t HS = s.head_dim, hpg = s.heads_per_group;
  std::vector<double> y(static_cast<std::size_t>(HS));
  for (std::int64_t r = 0; r < s.rows; ++r) {
    for (std::int64_t g = 0; g < s.groups; ++g) {
      const float* grp = a.in + r * s.in_cols() + g * (hpg + 2) * HS;
      for (std::int64_t h = 0; h < hpg; ++h) {
        float* o = a.out + r * s.out_cols() + (g * hpg + h) * 3 * HS;
        rot(s, r, grp + h * HS, y.data(), false);
        for (std::int64_t i = 0; i < HS; ++i) o[i] = static_cast<float>(y[i]);
        rot(s, r, grp + hpg * HS, y.data(), false);
        for (std::int64_t i = 0; i < HS; ++i) o[HS + i] = static_cast<float>(y[i]);
        for (std::int64_t i = 0; i < HS; ++i) o[2 * HS + i] = grp[(hpg + 1) * HS + i];
      }
    }
  }
}

void rope_qkv_backward(const RopeQkvBackwardArgs& a) {
  const RopeQkvShape& s = a.shape;
  const std::int64_t HS = s.head_dim, hpg = s.heads_per_group;
  std::vector<double> y(static_cast<std::size_t>(HS)), dk(y.size()), dv(y.size());
  for (std::int64_t r = 0; r < s.rows; ++r) {
    for (std::int64_t g = 0; g < s.groups; ++g) {
      float* grp = a.d_in + r * s.in_cols() + g * (hpg + 2) * HS;
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (std::int64_t h = 0; h < hpg; ++h) {
        const float* o = a.d_out + r * s.out_cols() + (g * hpg + h) * 3 * HS;
        rot(s, r, o, y.data(), true);
        for (std::int64_t i = 0; i < HS; ++i) grp[h * HS + i] = static_cast<float>(y[i]);
        rot(s, r, o + HS, y.data(), true);
        for (std::int64_t i = 0; i < HS; ++i) {
          dk[static_cast<std::size_t>(i)] += y[static_cast<std::size_t>(i)];
          dv[static_cast<std::size_t>(i)] += o[2 * HS + i];
        }
      }
      for (std::int64_t i = 0; i < HS; ++i) {
        grp[hpg * HS + i] = static_cast<float>(dk[static_cast<std::size_t>(i)]);
        grp[(hpg + 1) * HS + i] = static_cast<float>(dv[static_cast<std::size_t>(i)]);
      }
    }
  }
}

}  // namespace trident::kernels::ref
