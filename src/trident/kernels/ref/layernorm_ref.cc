// Reference LayerNorm forward and backward: plain loops, double accumulation, one thread.
#include <cmath>

#include "trident/kernels/layernorm.h"

namespace trident::kernels::ref {
// mean = (1/C) sum_c x_c,  var = (1/C) sum_c (x_c - mean)^2  (population variance),
// rstd = 1 / sqrt(var + eps),  y_c = (x_c - mean) * rstd * w_c + b_c.
template <class T>
void layernorm_forward(const BasicLayerNormForwardArgs<T>& a) {
  const std::int64_t C = a.cols;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* x = a.in + r * C;
    double sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) sum += x[c];
    const double mean = sum / static_cast<double>(C);
    double sum_sq = 0.0;
    for (std::int64_t c = 0; c < C; ++c) sum_sq += (x[c] - mean) * (x[c] - mean);
    const double rstd = 1.0 / std::sqrt(sum_sq / static_cast<double>(C) + a.eps);
    for (std::int64_t c = 0; c < C; ++c) {
      a.out[r * C + c] = static_cast<T>((x[c] - mean) * rstd * a.weight[c] + a.bias[c]);
    }
    a.mean[r] = static_cast<T>(mean);
    a.rstd[r] = static_cast<T>(rstd);
  }
}

// With xhat = (x - mean) * rstd, y = xhat * w + b and g = dy * w, for each row:
//   d_in_c += rstd * ( g_c                            term 1: through xhat directly
//                     - (1/C) sum_j g_j               term 2: through the mean
//                     - xhat_c (1/C) sum_j g_j xhat_j ) term 3: through rstd (the variance)
//   d_weight_c += sum_rows dy_c * xhat_c,   d_bias_c += sum_rows dy_c.
template <class T>
void layernorm_backward(const BasicLayerNormBackwardArgs<T>& a) {
  const std::int64_t C = a.cols;
  for (std::int64_t c = 0; c < C; ++c) {
    double acc_w = 0.0, acc_b = 0.0;
    for (std::int64_t r = 0; r < a.rows; ++r) {
      const double xhat = (static_cast<double>(a.in[r * C + c]) - a.mean[r]) * a.rstd[r];
      acc_w += static_cast<double>(a.d_out[r * C + c]) * xhat;
      acc_b += a.d_out[r * C + c];
    }
    a.d_weight[c] = static_cast<T>(a.d_weight[c] + acc_w);
    a.d_bias[c] = static_cast<T>(a.d_bias[c] + acc_b);
  }
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* x = a.in + r * C;
    const T* dy = a.d_out + r * C;
    const double mean = a.mean[r], rstd = a.rstd[r];
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = static_cast<double>(dy[c]) * a.weight[c];
      sum_g += g;
      sum_g_xhat += g * (x[c] - mean) * rstd;
    }
    const double mean_g = sum_g / static_cast<double>(C);
    const double mean_g_xhat = sum_g_xhat / static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const double xhat = (x[c] - mean) * rstd;
      const double g = static_cast<double>(dy[c]) * a.weight[c];
      const double term1 = g, term2 = -mean_g, term3 = -xhat * mean_g_xhat;
      a.d_in[r * C + c] = static_cast<T>(a.d_in[r * C + c] + rstd * (term1 + term2 + term3));
    }
  }
}

template void layernorm_forward<float>(const BasicLayerNormForwardArgs<float>&);
template void layernorm_forward<double>(const BasicLayerNormForwardArgs<double>&);
template void layernorm_backward<float>(const BasicLayerNormBackwardArgs<float>&);
template void layernorm_backward<double>(const BasicLayerNormBackwardArgs<double>&);

}  // namespace trident::kernels::ref
