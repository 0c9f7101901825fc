// The linear layer over typed views, in PyTorch's weight layout:
//   out(rows, out_features) = in(rows, in_features) @ weight(out_features, in_features)^T + bias.
// Precision is a property of the views: the weight's dtype picks the product. An FP32 weight runs
// the FP32 GEMM (matmul.h); a BF16 weight runs BF16 operands with FP32 accumulation and FP32
// output (matmul_bf16.h), and then `in` (and, backward, the upstream gradient's BF16 copy) must be
// BF16 too. Every view is on ctx.device, contiguous, with the shapes below; a mismatch is a
// core::InvalidArgument naming the view, what it holds and what the op needs.
#pragma once

#include <cstddef>
#include <span>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"
#include "trident/core/view.h"

namespace trident::kernels {

struct LinearViews {
  core::TensorView out{};          // (rows, out_features) f32, written (=)
  core::TensorView in{};           // (rows, in_features), the weight's dtype
  core::TensorView weight{};       // (out_features, in_features) f32 or bf16
  core::TensorView bias{};         // (out_features) f32, or empty
  std::span<std::byte> scratch{};  // BF16 weights: linear_bf16_scratch_bytes(...) bytes
};
void linear(const core::ExecContext& ctx, const LinearViews& v);

// Backward of linear:
//   d_in      (=)  d_out @ weight         (skipped when empty)
//   d_weight  (+=) d_out^T @ in           (accumulates across micro-batches)
//   d_bias    (+=) column sums of d_out   (skipped when empty; FP32 d_out, summed in double)
// With a BF16 weight the two products read d_out_bf16, the BF16 copy of d_out.
struct LinearBackwardViews {
  core::TensorView d_in{};        // (rows, in_features) f32, written (=), or empty
  core::TensorView d_weight{};    // (out_features, in_features) f32, accumulated (+=)
  core::TensorView d_bias{};      // (out_features) f32, accumulated (+=), or empty
  core::TensorView d_out{};       // (rows, out_features) f32
  core::TensorView d_out_bf16{};  // (rows, out_features) bf16: BF16 weights only
  core::TensorView in{};          // (rows, in_features), the weight's dtype
  core::TensorView weight{};      // (out_features, in_features) f32 or bf16
  std::span<std::byte> scratch{};
};
void linear_backward(const core::ExecContext& ctx, const LinearBackwardViews& v);

}  // namespace trident::kernels
