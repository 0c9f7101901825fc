// Buffer fill and copy: the gradient zeroing, staging copies and padding fills of the optimizer
// and the trainer, as kernels (a device backend needs no memset above kernels/).
//   fill: out[i] = value            for i in [0, n)
//   copy: out[i] = in[i]            for i in [0, n); out and in must not overlap
// Bandwidth-bound; bitwise exact (no arithmetic). Callers use the typed views (FillViews,
// CopyViews, below); FillArgs and CopyArgs are the backend contract.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct FillArgs {
  float* out = nullptr;  // (n) overwritten
  float value = 0.0f;
  std::int64_t n = 0;
};

struct CopyArgs {
  float* out = nullptr;       // (n) overwritten
  const float* in = nullptr;  // (n), disjoint from out
  std::int64_t n = 0;
};

// fill and copy over typed views (checked as kernels/view_check.h says): f32 views of any shape
// on ctx.device; copy's `in` has out's shape.
struct FillViews {
  core::TensorView out{};  // f32, overwritten
  float value = 0.0f;
};
void fill(const core::ExecContext& ctx, const FillViews& v);
struct CopyViews {
  core::TensorView out{};  // f32, overwritten
  core::TensorView in{};   // f32, out's shape, disjoint from out
};
void copy(const core::ExecContext& ctx, const CopyViews& v);

namespace ref {
// The specification (ref/fill_ref.cc).
void fill(const FillArgs& args);
void copy(const CopyArgs& args);
}  // namespace ref

}  // namespace trident::kernels
