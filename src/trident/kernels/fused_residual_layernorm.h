// Fused residual add + LayerNorm, the pattern at every sub-layer boundary of a pre-LN transformer:
// resid_out = a + b (the residual stream plus a sub-layer's output), out = LayerNorm(resid_out).
// One pass over each row writes both. Optional BF16 copies of the outputs feed the BF16 matmuls of
// mixed precision (matmul_bf16.h) without a separate conversion pass.
//
// LayerNorm as kernels/layernorm.h: out = (x - mean) * rstd * weight + bias, population variance,
// rstd = 1 / sqrt(var + eps).
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

// resid_out = a + b (FP32), then LayerNorm of resid_out. Overwrites resid_out, out / out_bf16, mean
// and rstd (saved for the backward pass). At least one of out and out_bf16 must be non-null;
// out_bf16 gets exactly core::bf16::from_float of the FP32 result. resid_out may alias a or b (the
// usual in-place update of the residual stream); out must not alias anything. OpenMP over rows.
struct ResidualLayerNormForwardArgs {
  float* resid_out = nullptr;      // (rows, cols)  written (=): a + b
  float* out = nullptr;            // (rows, cols)  f32, written (=), or null
  core::bf16* out_bf16 = nullptr;  // (rows, cols)  bf16, written (=), or null
  float* mean = nullptr;           // (rows)        written (=)
  float* rstd = nullptr;           // (rows)        written (=)
  const float* a = nullptr;        // (rows, cols)  the residual stream
  const float* b = nullptr;        // (rows, cols)  the sub-layer output added to it
  const float* weight = nullptr;   // (cols)
  const float* bias = nullptr;     // (cols)
  std::int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
};

// Backward, with layernorm_backward's semantics on the residual stream:
//   d_resid  (+=) the LayerNorm input gradient. On entry d_resid holds the gradient that reached
//                 resid_out from its later uses (the next residual add); on exit it is the full
//                 gradient of resid_out, which is also the gradient of a and of b (resid_out =
//                 a + b passes it through unchanged), so the caller hands the same buffer to the
//                 sub-layer that produced b and to the layer before.
//   d_resid_bf16 (=) core::bf16::from_float of the final d_resid, or null: the d_out operand of the
//                 BF16 linear backward that produced b (linear_backward_bf16).
//   d_weight, d_bias (+=) as layernorm_backward: sums over the rows in double, independent of the
//                 thread count (grouped by chunks of 64 rows, so the rounding can differ from
//                 layernorm_backward's in the last bits).
// One pass (layernorm_backward reads d_out and the input twice): OpenMP over fixed chunks of 64
// rows; each chunk sums its rows into its own double partials in scratch, and the partials are
// added in chunk order. scratch: at least residual_layernorm_backward_scratch_bytes(rows, cols)
// bytes, 8-byte aligned (the kernel never allocates). d_resid must not alias d_out or resid.
struct ResidualLayerNormBackwardArgs {
  float* d_resid = nullptr;            // (rows, cols)  accumulated (+=)
  core::bf16* d_resid_bf16 = nullptr;  // (rows, cols)  bf16, written (=), or null
  float* d_weight = nullptr;           // (cols)        accumulated (+=)
  float* d_bias = nullptr;             // (cols)        accumulated (+=)
  const float* d_out = nullptr;        // (rows, cols)  gradient of out
  const float* resid = nullptr;        // (rows, cols)  resid_out of the forward
  const float* weight = nullptr;       // (cols)
  const float* mean = nullptr;         // (rows)
  const float* rstd = nullptr;         // (rows)
  std::int64_t rows = 0, cols = 0;
  std::span<std::byte> scratch{};  // residual_layernorm_backward_scratch_bytes(rows, cols)
};

// Scratch bytes residual_layernorm_backward needs: two doubles per column per chunk of 64 rows
// (rows 16384 x cols 768: 3 MiB).
[[nodiscard]] std::int64_t residual_layernorm_backward_scratch_bytes(std::int64_t rows,
                                                                     std::int64_t cols);

// residual_layernorm_forward over typed views; rows and cols are read from `a`. The BF16 copy is
// a bf16 view: precision is a property of the views.
struct ResidualLayerNormViews {
  core::TensorView resid_out{};  // (rows, cols) f32, written (=): a + b
  core::TensorView out{};        // (rows, cols) f32, written (=), or empty
  core::TensorView out_bf16{};   // (rows, cols) bf16, written (=), or empty (not both empty)
  core::TensorView mean{};       // (rows)       f32, written (=)
  core::TensorView rstd{};       // (rows)       f32, written (=)
  core::TensorView a{};          // (rows, cols) f32, the residual stream
  core::TensorView b{};          // (rows, cols) f32, the sub-layer output added to it
  core::TensorView weight{};     // (cols)       f32
  core::TensorView bias{};       // (cols)       f32
  float eps = 1e-5f;
};
void residual_layernorm(const core::ExecContext& ctx, const ResidualLayerNormViews& v);

// residual_layernorm_backward over typed views; sizes from `resid`.
struct ResidualLayerNormBackwardViews {
  core::TensorView d_resid{};       // (rows, cols) f32, accumulated (+=)
  core::TensorView d_resid_bf16{};  // (rows, cols) bf16, written (=), or empty
  core::TensorView d_weight{};      // (cols)       f32, accumulated (+=)
  core::TensorView d_bias{};        // (cols)       f32, accumulated (+=)
  core::TensorView d_out{};         // (rows, cols) f32
  core::TensorView resid{};         // (rows, cols) f32, resid_out of the forward
  core::TensorView weight{};        // (cols)       f32
  core::TensorView mean{};          // (rows)       f32
  core::TensorView rstd{};          // (rows)       f32
  std::span<std::byte> scratch{};   // residual_layernorm_backward_scratch_bytes(rows, cols)
};
void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardViews& v);

namespace ref {
// The specification (ref/fused_residual_layernorm_ref.cc), as the composition of the unfused
// references: forward: resid_out = a + b (FP32), then ref::layernorm_forward(resid_out); out_bf16
// = bf16 of the FP32 out. backward: ref::layernorm_backward with d_in = d_resid (+=);
// d_resid_bf16 = bf16 of the final d_resid.
void residual_layernorm_forward(const ResidualLayerNormForwardArgs& args);
void residual_layernorm_backward(const ResidualLayerNormBackwardArgs& args);
}  // namespace ref

}  // namespace trident::kernels
