// Hidden dropout on rows of the residual stream (Megatron's dropout after the embedding and after
// each sub-layer): out = in * keep / (1 - p), keep drawn from Philox at a GLOBAL element index, so
// every parallel layout (tp, sp, pp, dp) draws the same mask for the same token.
//
// Element (r, c) has index (first_row + r) * cols + c, where first_row is the global flattened
// token row of row 0 (first_sample * T + the row's offset inside the micro-batch); it is kept when
// dropout_keep(seed, stream, index, p) (flash_attention.h). The backward pass is the same op on the
// gradient with the same arguments (the mask is regenerated, never stored).
//
// Callers use the typed views (HiddenDropoutViews, below): out and in f32 (rows, cols) views on
// ctx.device; a mismatch is a core::InvalidArgument naming the view. HiddenDropoutArgs is the
// backend contract the CPU body, the CUDA body and the reference implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct HiddenDropoutArgs {
  float* out = nullptr;       // (rows, cols)  written (=); may alias in
  const float* in = nullptr;  // (rows, cols)
  std::int64_t rows = 0, cols = 0;
  std::int64_t first_row = 0;  // global token row of row 0
  float p = 0.0f;              // drop probability in [0, 1)
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;  // the dropout site and iteration
};

// hidden_dropout over typed views; rows and cols are read from `in`. OpenMP over rows; the result
// does not depend on the thread count.
struct HiddenDropoutViews {
  core::TensorView out{};      // (rows, cols) f32, written (=); may be `in` itself
  core::TensorView in{};       // (rows, cols) f32
  std::int64_t first_row = 0;  // global token row of row 0
  float p = 0.0f;              // drop probability in [0, 1)
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;  // the dropout site and iteration
};
void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutViews& v);

namespace ref {
// The specification: the same mask, the scale 1 / (1 - p) and the product in double.
void hidden_dropout(const HiddenDropoutArgs& args);
}  // namespace ref

}  // namespace trident::kernels
