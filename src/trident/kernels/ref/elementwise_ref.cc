// Reference GeLU (tanh form) forward and backward, in double, one thread.
#include <cmath>

#include "trident/kernels/elementwise.h"

namespace trident::kernels::ref {
namespace {
const double kSqrt2OverPi = std::sqrt(2.0 / 3.14159265358979323846);
constexpr double kCubic = 0.044715;
}  // namespace

// gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
template <class T>
void gelu_forward(T* out, const T* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = in[i];
    const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = static_cast<T>(0.5 * x * (1.0 + std::tanh(u)));
  }
}

// gelu'(x) = 0.5 (1 + tanh(u))                      term 1: d/dx of the factor x
//          + 0.5 x (1 - tanh(u)^2) u'(x)            term 2: through tanh(u)
// with u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2);   d_in = d_out * gelu'(x).
template <class T>
void gelu_backward(T* d_in, const T* d_out, const T* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = in[i];
    const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
    const double t = std::tanh(u);
    const double term1 = 0.5 * (1.0 + t);
    const double term2 = 0.5 * x * (1.0 - t * t) * du;
    d_in[i] = static_cast<T>(static_cast<double>(d_out[i]) * (term1 + term2));
  }
}

template void gelu_forward<float>(float*, const float*, std::int64_t);
template void gelu_forward<double>(double*, const double*, std::int64_t);
template void gelu_backward<float>(float*, const float*, const float*, std::int64_t);
template void gelu_backward<double>(double*, const double*, const double*, std::int64_t);

}  // namespace trident::kernels::ref
