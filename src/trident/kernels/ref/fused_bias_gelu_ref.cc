// Reference fused bias + GeLU (fused_bias_gelu.h): the bias add in FP32, then the unfused GeLU
// reference, the BF16 copy rounded from the FP32 result.
#include <vector>

#include "trident/kernels/elementwise.h"
#include "trident/kernels/fused_bias_gelu.h"

namespace trident::kernels::ref {

namespace {

// t[r,c] = in[r,c] + bias[c] in FP32: the bias add of an unfused linear layer.
std::vector<float> add_bias(const float* in, const float* bias, std::int64_t rows,
                            std::int64_t cols) {
  std::vector<float> t(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) t[r * cols + c] = in[r * cols + c] + bias[c];
  }
  return t;
}

void copy_out(float* f32, core::bf16* bf16, const std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (f32 != nullptr) f32[i] = v[i];
    if (bf16 != nullptr) bf16[i] = core::bf16::from_float(v[i]);
  }
}

}  // namespace

void bias_gelu_forward(const BiasGeluForwardArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  const std::vector<float> t = add_bias(a.in, a.bias, a.rows, a.cols);
  std::vector<float> y(static_cast<std::size_t>(n));
  gelu_forward(y.data(), t.data(), n);
  copy_out(a.out, a.out_bf16, y);
}

void bias_gelu_backward(const BiasGeluBackwardArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  const std::vector<float> t = add_bias(a.in, a.bias, a.rows, a.cols);
  std::vector<float> d_in(static_cast<std::size_t>(n));
  gelu_backward(d_in.data(), a.d_out, t.data(), n);
  // d_bias: the bias was broadcast over the rows, so its gradient sums d_in over them.
  for (std::int64_t c = 0; c < a.cols; ++c) {
    double acc = 0.0;
    for (std::int64_t r = 0; r < a.rows; ++r) acc += d_in[r * a.cols + c];
    a.d_bias[c] = static_cast<float>(a.d_bias[c] + acc);
  }
  copy_out(a.d_in, a.d_in_bf16, d_in);
}

}  // namespace trident::kernels::ref
