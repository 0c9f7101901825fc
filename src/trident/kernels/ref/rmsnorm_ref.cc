// Reference RMSNorm forward and backward (rmsnorm.h): plain loops, double arithmetic, one thread.
#include <cmath>

#include "trident/kernels/rmsnorm.h"

namespace trident::kernels::ref {

// rstd = 1 / sqrt((1/C) sum_c x_c^2 + eps),  y_c = x_c * rstd * w_c.
template <class T>
void rmsnorm_forward(const BasicRmsNormForwardArgs<T>& a) {
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
void rmsnorm_backward(const BasicRmsNormBackwardArgs<T>& a) {
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

template void rmsnorm_forward<float>(const BasicRmsNormForwardArgs<float>&);
template void rmsnorm_forward<double>(const BasicRmsNormForwardArgs<double>&);
template void rmsnorm_backward<float>(const BasicRmsNormBackwardArgs<float>&);
template void rmsnorm_backward<double>(const BasicRmsNormBackwardArgs<double>&);

}  // namespace trident::kernels::ref
