// Elementwise kernels: GeLU (tanh form, as GPT-2 and Megatron's fused bias-GeLU), residual add,
// scaling and the reductions used by the optimizer and gradient clipping.
//
// Callers use the typed views below: f32 views of any shape (contiguous, row-major: a view has
// no strides) on ctx.device, the views of one op of one shape; a mismatch is a
// core::InvalidArgument naming the op and the view. The raw-pointer entry points the views call
// (pointer + length) are the backend contract, internal to kernels/ (kernels/dispatch.h).
#pragma once

#include <cstdint>
#include <span>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Overwrites out; out may be `in`.
struct GeluViews {
  core::TensorView out{};  // f32, written (=)
  core::TensorView in{};   // f32, out's shape
};
void gelu(const core::ExecContext& ctx, const GeluViews& v);

// d_in = d_out * gelu'(in). Overwrites d_in; d_in may be d_out.
struct GeluBackwardViews {
  core::TensorView d_in{};   // f32, written (=)
  core::TensorView d_out{};  // f32, d_in's shape
  core::TensorView in{};     // f32, d_in's shape: the forward's input
};
void gelu_backward(const core::ExecContext& ctx, const GeluBackwardViews& v);

// out = a + b. Overwrites out; out may be a or b.
struct AddViews {
  core::TensorView out{}, a{}, b{};
};
void add(const core::ExecContext& ctx, const AddViews& v);

// x *= s.
struct ScaleViews {
  core::TensorView x{};  // f32, updated in place
  float s = 1.0f;
};
void scale(const core::ExecContext& ctx, const ScaleViews& v);

// Sum of the squares of x's elements, accumulated in double. Bitwise reproducible for a given
// ctx.num_threads. A view of no elements sums to 0.
struct SumSquaresViews {
  core::TensorView x{};  // f32
};
double sum_squares(const core::ExecContext& ctx, const SumSquaresViews& v);
// Several views, each summed as above, added in order (bitwise the sum of the single calls): the
// gradient norm's ranges with one host read on a device instead of one per range.
double sum_squares(const core::ExecContext& ctx, std::span<const SumSquaresViews> ranges);

// True when every element of x is finite (true for a view of no elements).
struct AllFiniteViews {
  core::TensorView x{};  // f32
};
bool all_finite(const core::ExecContext& ctx, const AllFiniteViews& v);

namespace ref {
// The specification (ref/elementwise_ref.cc), over the element type T (docs/architecture.md, "How
// to add an op").
template <class T = float>
void gelu_forward(T* out, const T* in, std::int64_t n);
template <class T = float>
void gelu_backward(T* d_in, const T* d_out, const T* in, std::int64_t n);
}  // namespace ref

}  // namespace trident::kernels
