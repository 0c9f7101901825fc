// Reference fused residual add + LayerNorm (fused_residual_layernorm.h): the sum in FP32, then the
// unfused LayerNorm reference, the BF16 copies rounded from the FP32 results.
#include <vector>

#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"

namespace trident::kernels::ref {

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
  for (std::int64_t i = 0; i < n; ++i) {
    if (a.resid_out != nullptr) a.resid_out[i] = s[i];
    if (a.out != nullptr) a.out[i] = y[i];
    if (a.out_bf16 != nullptr) a.out_bf16[i] = core::bf16::from_float(y[i]);
  }
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

}  // namespace trident::kernels::ref
