// Reference fused and BF16 kernels as compositions of the unfused references (see fused_ref.h).
#include "trident/kernels/ref/fused_ref.h"

#include <vector>

#include "trident/kernels/ref/ref.h"

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

std::vector<float> widen(const core::bf16* x, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = x[i].to_float();
  return v;
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

void residual_layernorm_forward(const ResidualLayerNormForwardArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  std::vector<float> s(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) s[i] = a.a[i] + a.b[i];
  layernorm_forward({.out = y.data(),
                     .mean = a.mean,
                     .rstd = a.rstd,
                     .in = s.data(),
                     .weight = a.weight,
                     .bias = a.bias,
                     .rows = a.rows,
                     .cols = a.cols,
                     .eps = a.eps});
  copy_out(a.resid_out, nullptr, s);
  copy_out(a.out, a.out_bf16, y);
}

void residual_layernorm_backward(const ResidualLayerNormBackwardArgs& a) {
  layernorm_backward({.d_in = a.d_resid,
                      .d_weight = a.d_weight,
                      .d_bias = a.d_bias,
                      .d_out = a.d_out,
                      .in = a.resid,
                      .weight = a.weight,
                      .mean = a.mean,
                      .rstd = a.rstd,
                      .rows = a.rows,
                      .cols = a.cols});
  if (a.d_resid_bf16 == nullptr) return;
  for (std::int64_t i = 0; i < a.rows * a.cols; ++i) {
    a.d_resid_bf16[i] = core::bf16::from_float(a.d_resid[i]);
  }
}

void linear_forward_bf16(const LinearForwardBf16Args& a) {
  const std::vector<float> in = widen(a.in, a.rows * a.in_features);
  const std::vector<float> weight = widen(a.weight, a.out_features * a.in_features);
  linear_forward({.out = a.out,
                  .in = in.data(),
                  .weight = weight.data(),
                  .bias = a.bias,
                  .rows = a.rows,
                  .in_features = a.in_features,
                  .out_features = a.out_features});
}

void linear_backward_bf16(const LinearBackwardBf16Args& a) {
  const std::vector<float> d_out = widen(a.d_out_bf16, a.rows * a.out_features);
  const std::vector<float> in = widen(a.in, a.rows * a.in_features);
  const std::vector<float> weight = widen(a.weight, a.out_features * a.in_features);
  linear_backward({.d_in = a.d_in,
                   .d_weight = a.d_weight,
                   .d_bias = nullptr,  // from the FP32 d_out below, not the rounded one
                   .d_out = d_out.data(),
                   .in = in.data(),
                   .weight = weight.data(),
                   .rows = a.rows,
                   .in_features = a.in_features,
                   .out_features = a.out_features});
  if (a.d_bias == nullptr) return;
  for (std::int64_t o = 0; o < a.out_features; ++o) {
    double acc = 0.0;
    for (std::int64_t r = 0; r < a.rows; ++r) acc += a.d_out[r * a.out_features + o];
    a.d_bias[o] = static_cast<float>(a.d_bias[o] + acc);
  }
}

}  // namespace trident::kernels::ref
