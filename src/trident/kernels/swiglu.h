// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(x) = x * sigmoid(x), where each row
// of `in` is [gate (cols) | up (cols)]: the column-parallel up-projection's local output, whose
// weight is laid out (2, F/tp, C) (model/param_table.cc).
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

template <class T>
struct BasicSwiGluForwardArgs {
  T* out = nullptr;       // (rows, cols)      written (=)
  const T* in = nullptr;  // (rows, 2 * cols)  [gate | up]
  std::int64_t rows = 0, cols = 0;
};
using SwiGluForwardArgs = BasicSwiGluForwardArgs<float>;

// d_gate = d_out * up * silu'(gate), d_up = d_out * silu(gate); d_in written (=). d_in must not
// alias d_out.
template <class T>
struct BasicSwiGluBackwardArgs {
  T* d_in = nullptr;         // (rows, 2 * cols)  written (=)
  const T* d_out = nullptr;  // (rows, cols)
  const T* in = nullptr;     // (rows, 2 * cols)
  std::int64_t rows = 0, cols = 0;
};
using SwiGluBackwardArgs = BasicSwiGluBackwardArgs<float>;

// swiglu_forward over typed views; rows and cols are read from `out`.
struct SwiGluViews {
  core::TensorView out{};  // (rows, cols)     f32, written (=)
  core::TensorView in{};   // (rows, 2 * cols) f32, [gate | up]
};
void swiglu(const core::ExecContext& ctx, const SwiGluViews& v);

// swiglu_backward over typed views; rows and cols are read from `d_out`.
struct SwiGluBackwardViews {
  core::TensorView d_in{};   // (rows, 2 * cols) f32, written (=)
  core::TensorView d_out{};  // (rows, cols)     f32
  core::TensorView in{};     // (rows, 2 * cols) f32
};
void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardViews& v);

namespace ref {
// The specification (ref/swiglu_ref.cc), over the element type T (docs/architecture.md, "How to
// add an op").
template <class T = float>
void swiglu_forward(const BasicSwiGluForwardArgs<T>& args);
template <class T = float>
void swiglu_backward(const BasicSwiGluBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
