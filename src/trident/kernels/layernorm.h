// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with the population
// variance and rstd = 1 / sqrt(var + eps).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

// Overwrites out, mean and rstd; mean and rstd are saved for the backward pass.
struct LayerNormForwardArgs {
  float* out = nullptr;           // (rows, cols)  written (=)
  float* mean = nullptr;          // (rows)        written (=)
  float* rstd = nullptr;          // (rows)        written (=)
  const float* in = nullptr;      // (rows, cols)
  const float* weight = nullptr;  // (cols)
  const float* bias = nullptr;    // (cols)
  std::int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
};
void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args);

// ACCUMULATES into d_in (+=): LayerNorm inputs sit on the residual stream, whose gradient is
// already in d_in. Accumulates into d_weight and d_bias (+=) for micro-batch accumulation.
struct LayerNormBackwardArgs {
  float* d_in = nullptr;          // (rows, cols)  accumulated (+=)
  float* d_weight = nullptr;      // (cols)        accumulated (+=)
  float* d_bias = nullptr;        // (cols)        accumulated (+=)
  const float* d_out = nullptr;   // (rows, cols)
  const float* in = nullptr;      // (rows, cols)
  const float* weight = nullptr;  // (cols)
  const float* mean = nullptr;    // (rows)
  const float* rstd = nullptr;    // (rows)
  std::int64_t rows = 0, cols = 0;
};
void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardArgs& args);

}  // namespace trident::kernels
