// Reference BF16 linear layer (matmul_bf16.h): the BF16 operands widened to FP32 (exact), then the
// FP32 linear reference.
#include <vector>

#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::kernels::ref {

namespace {

std::vector<float> widen(const core::bf16* x, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = x[i].to_float();
  return v;
}

}  // namespace

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
