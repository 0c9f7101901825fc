// Fused bias + GeLU (Megatron's bias-GeLU): out = gelu_tanh(in + bias), where in is the output of
// the MLP's first linear layer before its bias. One pass instead of a bias pass and a GeLU pass,
// and the backward pass needs only `in` (not in + bias), so nothing extra is saved. Optional BF16
// copies of the outputs feed the BF16 matmuls of mixed precision (matmul_bf16.h) without a separate
// conversion pass.
//
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as kernels/elementwise.h.
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// out[r,c] = gelu_tanh(in[r,c] + bias[c]), the sum rounded to FP32 first. At least one of out and
// out_bf16 must be non-null; out_bf16 gets exactly core::bf16::from_float(out value). out may alias
// in. OpenMP over rows.
struct BiasGeluForwardArgs {
  float* out = nullptr;            // (rows, cols)  f32, written (=), or null
  core::bf16* out_bf16 = nullptr;  // (rows, cols)  bf16, written (=), or null
  const float* in = nullptr;       // (rows, cols)  before the bias
  const float* bias = nullptr;     // (cols)
  std::int64_t rows = 0, cols = 0;
};

// d_in[r,c] = d_out[r,c] * gelu_tanh'(in[r,c] + bias[c])        (=)
// d_bias[c] += sum_r d_in[r,c]                                   (+=)
// At least one of d_in and d_in_bf16 must be non-null (d_bias is summed from the FP32 values
// either way); d_in_bf16 gets core::bf16::from_float of them. d_in may alias d_out.
//
// One pass over the rows, OpenMP over fixed chunks of 64 rows: each chunk sums its rows into its
// own double partial in scratch (four rows at a time, added in FP32 first), and the partials are
// added in chunk order, so d_bias is the same for any thread count. scratch: at least
// bias_gelu_backward_scratch_bytes(rows, cols) bytes, 8-byte aligned (the kernel never allocates).
struct BiasGeluBackwardArgs {
  float* d_in = nullptr;            // (rows, cols)  f32, written (=), or null
  core::bf16* d_in_bf16 = nullptr;  // (rows, cols)  bf16, written (=), or null
  float* d_bias = nullptr;          // (cols)  accumulated (+=)
  const float* d_out = nullptr;     // (rows, cols)
  const float* in = nullptr;        // (rows, cols)  the forward's in (before the bias)
  const float* bias = nullptr;      // (cols)
  std::int64_t rows = 0, cols = 0;
  std::span<std::byte> scratch{};  // bias_gelu_backward_scratch_bytes(rows, cols) bytes
};

// Scratch bytes bias_gelu_backward needs: one double per column per chunk of 64 rows
// (rows 8192 x cols 3072: 3 MiB).
[[nodiscard]] std::int64_t bias_gelu_backward_scratch_bytes(std::int64_t rows, std::int64_t cols);

// bias_gelu_forward over typed views; rows and cols are read from `in`. The BF16 copy is a bf16
// view: precision is a property of the views.
struct BiasGeluViews {
  core::TensorView out{};       // (rows, cols) f32, written (=), or empty
  core::TensorView out_bf16{};  // (rows, cols) bf16, written (=), or empty (not both empty)
  core::TensorView in{};        // (rows, cols) f32, before the bias
  core::TensorView bias{};      // (cols)       f32
};
void bias_gelu(const core::ExecContext& ctx, const BiasGeluViews& v);

// bias_gelu_backward over typed views; sizes from `in`.
struct BiasGeluBackwardViews {
  core::TensorView d_in{};         // (rows, cols) f32, written (=), or empty
  core::TensorView d_in_bf16{};    // (rows, cols) bf16, written (=), or empty (not both empty)
  core::TensorView d_bias{};       // (cols)       f32, accumulated (+=)
  core::TensorView d_out{};        // (rows, cols) f32
  core::TensorView in{};           // (rows, cols) f32, the forward's in
  core::TensorView bias{};         // (cols)       f32
  std::span<std::byte> scratch{};  // bias_gelu_backward_scratch_bytes(rows, cols) bytes
};
void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardViews& v);

namespace ref {
// The specification (ref/fused_bias_gelu_ref.cc), as the composition of the unfused references:
// forward: t = in + bias (FP32), then ref::gelu_forward(t); out_bf16 = bf16 of the FP32 result.
// backward: t = in + bias (FP32), ref::gelu_backward(d_in, d_out, t), d_bias += column sums of
// d_in (double).
void bias_gelu_forward(const BiasGeluForwardArgs& args);
void bias_gelu_backward(const BiasGeluBackwardArgs& args);
}  // namespace ref

}  // namespace trident::kernels
