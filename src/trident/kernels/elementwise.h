// Elementwise kernels: GeLU (tanh form, as GPT-2 and Megatron's fused bias-GeLU), residual add,
// scaling and reductions used by the optimizer and gradient clipping.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Overwrites out; out may alias in.
void gelu_forward(const core::ExecContext& ctx, float* out, const float* in, std::int64_t n);
// d_in = d_out * gelu'(in). Overwrites d_in; d_in may alias d_out.
void gelu_backward(const core::ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n);

// out = a + b. Overwrites out; out may alias a or b.
void add_forward(const core::ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n);
// add_forward over typed views (checked as kernels/view_check.h says): three f32 views of one
// shape on ctx.device; out may be a or b.
struct AddViews {
  core::TensorView out{}, a{}, b{};
};
void add(const core::ExecContext& ctx, const AddViews& v);
// x *= s.
void scale_inplace(const core::ExecContext& ctx, float* x, float s, std::int64_t n);
// Sum of squares, accumulated in double. Bitwise reproducible for a given ctx.num_threads.
double sum_squares(const core::ExecContext& ctx, const float* x, std::int64_t n);
// True when every element is finite.
bool all_finite(const core::ExecContext& ctx, const float* x, std::int64_t n);

}  // namespace trident::kernels
