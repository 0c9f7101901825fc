// The checks every typed-view op (kernels/<op>.h, "Views" structs) makes in its dispatch before it
// reads a pointer: each view is non-empty (unless optional), holds the dtype the op needs, has the
// op's shape and lives on ctx.device. A TensorView is contiguous and row-major by construction
// (core/tensor.h), so the shape fixes the layout. A failed check is a core::InvalidArgument that
// names the op and the view, what it holds and what the op needs.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels::detail {

// `v` must be non-empty (unless `shape` has no elements) and hold `dtype` with `shape` on
// ctx.device. `why` is appended to a dtype mismatch (e.g. " (the weight is BF16)").
void check_view(const char* op, const char* name, const core::TensorView& v, core::DType dtype,
                const core::Shape& shape, const core::ExecContext& ctx, const char* why = "");
// As check_view, but an empty view passes (an optional input or output).
void check_optional_view(const char* op, const char* name, const core::TensorView& v,
                         core::DType dtype, const core::Shape& shape, const core::ExecContext& ctx,
                         const char* why = "");
// A view and its name in the op's Views struct, for the list forms below.
struct NamedView {
  const char* name;
  const core::TensorView& view;
};
// check_view (check_optional_view) of every view in `views`, each with `dtype` and `shape`.
void check_views(const char* op, const core::ExecContext& ctx, core::DType dtype,
                 const core::Shape& shape, std::initializer_list<NamedView> views);
void check_optional_views(const char* op, const core::ExecContext& ctx, core::DType dtype,
                          const core::Shape& shape, std::initializer_list<NamedView> views);
// `v` must be non-empty with `rank` dimensions: the view an op reads its sizes from.
void check_rank(const char* op, const char* name, const core::TensorView& v, int rank);

// The fused ops that write an FP32 result and/or its BF16 copy: `in` is a 2-D f32 view giving
// (rows, cols); at least one of `f32_out` and `bf16_out` is given, each of in's shape, the copy a
// bf16 view. Returns (rows, cols).
struct RowsCols {
  std::int64_t rows = 0, cols = 0;
};
RowsCols check_f32_and_bf16_outputs(const char* op, const core::ExecContext& ctx, NamedView in,
                                    NamedView f32_out, NamedView bf16_out);

// The pointer of a checked view, or null for an empty (optional) one.
template <class T>
T* data_or_null(const core::TensorView& v) {
  return v.empty() ? nullptr : v.as<T>();
}

}  // namespace trident::kernels::detail
