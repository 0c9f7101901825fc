// Buffer fill and copy: the gradient zeroing, staging copies and padding fills of the optimizer
// and the trainer, as kernels (a device backend needs no memset above kernels/).
//   fill: out[i] = value            for i in [0, n)
//   copy: out[i] = in[i]            for i in [0, n); out and in must not overlap
//   copy_columns: out[r * out_width + out_col + c] = in[r * in_width + in_col + c]
//                 for r in [0, rows), c in [0, cols): a block of columns of one row-major matrix
//                 into another (DeepSpeed-Ulysses packs and unpacks its heads with it); the two
//                 blocks must not overlap
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

struct CopyColumnsArgs {
  float* out = nullptr;       // (rows, out_width): columns [out_col, out_col + cols) overwritten
  const float* in = nullptr;  // (rows, in_width): columns [in_col, in_col + cols) read
  std::int64_t rows = 0, cols = 0;
  std::int64_t out_width = 0, out_col = 0, in_width = 0, in_col = 0;
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

// copy_columns over typed views: out (rows, out_width) and in (rows, in_width) f32 matrices on
// ctx.device, the same rows; the column ranges must lie inside their widths.
struct CopyColumnsViews {
  core::TensorView out{};  // (rows, out_width)
  core::TensorView in{};   // (rows, in_width)
  std::int64_t out_col = 0, in_col = 0, cols = 0;
};
void copy_columns(const core::ExecContext& ctx, const CopyColumnsViews& v);
namespace ref {
// The specification (ref/fill_ref.cc).
void fill(const FillArgs& args);
void copy(const CopyArgs& args);
void copy_columns(const CopyColumnsArgs& args);
}  // namespace ref

}  // namespace trident::kernels
