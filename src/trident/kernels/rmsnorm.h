// RMSNorm over the last dimension (Llama): out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) +
// eps). No centring and no bias.
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

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

// rmsnorm_forward over typed views; rows and cols are read from `in`.
struct RmsNormViews {
  core::TensorView out{};     // (rows, cols) f32, written (=)
  core::TensorView rstd{};    // (rows)       f32, written (=)
  core::TensorView in{};      // (rows, cols) f32
  core::TensorView weight{};  // (cols)       f32
  float eps = 1e-5f;
};
void rmsnorm(const core::ExecContext& ctx, const RmsNormViews& v);

// rmsnorm_backward over typed views (d_in and d_weight accumulate +=); sizes from `in`.
struct RmsNormBackwardViews {
  core::TensorView d_in{};      // (rows, cols) f32, accumulated (+=)
  core::TensorView d_weight{};  // (cols)       f32, accumulated (+=)
  core::TensorView d_out{};     // (rows, cols) f32
  core::TensorView in{};        // (rows, cols) f32
  core::TensorView weight{};    // (cols)       f32
  core::TensorView rstd{};      // (rows)       f32, from the forward
};
void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardViews& v);

}  // namespace trident::kernels
