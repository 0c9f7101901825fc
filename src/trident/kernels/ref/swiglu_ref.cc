// Reference SwiGLU forward and backward (swiglu.h): plain loops, double arithmetic, one thread.
#include <cmath>

#include "trident/kernels/swiglu.h"

namespace trident::kernels::ref {

// silu(g) = g / (1 + exp(-g)); y = silu(gate) * up.
template <class T>
void swiglu_forward(const BasicSwiGluForwardArgs<T>& a) {
  T* out = a.out;
  const T* in = a.in;
  const std::int64_t rows = a.rows, F = a.cols;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c];
      out[r * F + c] = static_cast<T>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

// silu'(g) = s + g s (1 - s), s = sigmoid(g).
template <class T>
void swiglu_backward(const BasicSwiGluBackwardArgs<T>& a) {
  T* d_in = a.d_in;
  const T* d_out = a.d_out;
  const T* in = a.in;
  const std::int64_t rows = a.rows, F = a.cols;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c], dy = d_out[r * F + c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      d_in[r * 2 * F + c] = static_cast<T>(dy * u * (s + g * s * (1.0 - s)));
      d_in[r * 2 * F + F + c] = static_cast<T>(dy * g * s);
    }
  }
}

template void swiglu_forward<float>(const BasicSwiGluForwardArgs<float>&);
template void swiglu_forward<double>(const BasicSwiGluForwardArgs<double>&);
template void swiglu_backward<float>(const BasicSwiGluBackwardArgs<float>&);
template void swiglu_backward<double>(const BasicSwiGluBackwardArgs<double>&);

}  // namespace trident::kernels::ref
