// RMSNorm over the last dimension (Llama): out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) +
// eps). No centring and no bias.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

// Overwrites out and rstd; rstd is saved for the backward pass.
struct RmsNormForwardArgs {
  float* out = nullptr;           // (rows, cols)  written (=)
  float* rstd = nullptr;          // (rows)        written (=)
  const float* in = nullptr;      // (rows, cols)
  const float* weight = nullptr;  // (cols)
  std::int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
};
void rmsnorm_forward(const core::ExecContext& ctx, const RmsNormForwardArgs& args);

// With xhat = x * rstd and g = d_out * weight:
//   d_in += rstd * (g - xhat * mean(g * xhat))   ACCUMULATED (+=): the residual stream's gradient
//   d_weight += sum_rows d_out * xhat            ACCUMULATED (+=)
struct RmsNormBackwardArgs {
  float* d_in = nullptr;          // (rows, cols)  accumulated (+=)
  float* d_weight = nullptr;      // (cols)        accumulated (+=)
  const float* d_out = nullptr;   // (rows, cols)
  const float* in = nullptr;      // (rows, cols)
  const float* weight = nullptr;  // (cols)
  const float* rstd = nullptr;    // (rows)
  std::int64_t rows = 0, cols = 0;
};
void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardArgs& args);

}  // namespace trident::kernels
