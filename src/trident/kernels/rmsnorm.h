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
template <class T>
struct BasicRmsNormForwardArgs {
  T* out = nullptr;           // (rows, cols)  written (=)
  T* rstd = nullptr;          // (rows)        written (=)
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  std::int64_t rows = 0, cols = 0;
  T eps = T(1e-5);
};
using RmsNormForwardArgs = BasicRmsNormForwardArgs<float>;

// With xhat = x * rstd and g = d_out * weight:
//   d_in += rstd * (g - xhat * mean(g * xhat))   ACCUMULATED (+=): the residual stream's gradient
//   d_weight += sum_rows d_out * xhat            ACCUMULATED (+=)
template <class T>
struct BasicRmsNormBackwardArgs {
  T* d_in = nullptr;          // (rows, cols)  accumulated (+=)
  T* d_weight = nullptr;      // (cols)        accumulated (+=)
  const T* d_out = nullptr;   // (rows, cols)
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  const T* rstd = nullptr;    // (rows)
  std::int64_t rows = 0, cols = 0;
};
using RmsNormBackwardArgs = BasicRmsNormBackwardArgs<float>;

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

namespace ref {
// The specification (ref/rmsnorm_ref.cc), over the element type T (docs/architecture.md, "How to
// add an op").
template <class T = float>
void rmsnorm_forward(const BasicRmsNormForwardArgs<T>& args);
template <class T = float>
void rmsnorm_backward(const BasicRmsNormBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
