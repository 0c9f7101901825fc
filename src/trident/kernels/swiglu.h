// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(x) = x * sigmoid(x), where each row
// of `in` is [gate (cols) | up (cols)]: the column-parallel up-projection's local output, whose
// weight is laid out (2, F/tp, C) (model/param_table.cc).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

struct SwiGluForwardArgs {
  float* out = nullptr;       // (rows, cols)      written (=)
  const float* in = nullptr;  // (rows, 2 * cols)  [gate | up]
  std::int64_t rows = 0, cols = 0;
};
void swiglu_forward(const core::ExecContext& ctx, const SwiGluForwardArgs& args);

// d_gate = d_out * up * silu'(gate), d_up = d_out * silu(gate); d_in written (=). d_in must not
// alias d_out.
struct SwiGluBackwardArgs {
  float* d_in = nullptr;         // (rows, 2 * cols)  written (=)
  const float* d_out = nullptr;  // (rows, cols)
  const float* in = nullptr;     // (rows, 2 * cols)
  std::int64_t rows = 0, cols = 0;
};
void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardArgs& args);

}  // namespace trident::kernels
