// Buffer fill and copy: the gradient zeroing, staging copies and padding fills of the optimizer
// and the trainer, as kernels (a device backend needs no memset above kernels/).
//   fill: out[i] = value            for i in [0, n)
//   copy: out[i] = in[i]            for i in [0, n); out and in must not overlap
// Bandwidth-bound; bitwise exact (no arithmetic).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

struct FillArgs {
  float* out = nullptr;  // (n) overwritten
  float value = 0.0f;
  std::int64_t n = 0;
};
void fill(const core::ExecContext& ctx, const FillArgs& args);

struct CopyArgs {
  float* out = nullptr;       // (n) overwritten
  const float* in = nullptr;  // (n), disjoint from out
  std::int64_t n = 0;
};
void copy(const core::ExecContext& ctx, const CopyArgs& args);

}  // namespace trident::kernels
