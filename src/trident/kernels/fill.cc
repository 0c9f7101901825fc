// Backend dispatch of fill.h; the CPU bodies are in kernels/cpu/fill.cc (one per instruction-set
// variant), the reference in kernels/ref/fill_ref.cc.
#include "trident/kernels/fill.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void fill(const core::ExecContext& ctx, const FillArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "fill");
  TRIDENT_DISPATCH(fill, ctx, args);
}

void copy(const core::ExecContext& ctx, const CopyArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "copy");
  TRIDENT_DISPATCH(copy, ctx, args);
}

void copy_columns(const core::ExecContext& ctx, const CopyColumnsArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "copy_columns");
  TRIDENT_DISPATCH(copy_columns, ctx, args);
}

void fill(const core::ExecContext& ctx, const FillViews& v) {
  detail::check_view("fill", "out", v.out, core::DType::kF32, v.out.shape, ctx);
  fill(ctx,
       FillArgs{.out = detail::data_or_null<float>(v.out), .value = v.value, .n = v.out.numel()});
}

void copy(const core::ExecContext& ctx, const CopyViews& v) {
  detail::check_views("copy", ctx, core::DType::kF32, v.out.shape, {{"out", v.out}, {"in", v.in}});
  copy(ctx, CopyArgs{.out = detail::data_or_null<float>(v.out),
                     .in = detail::data_or_null<float>(v.in),
                     .n = v.out.numel()});
}

void copy_columns(const core::ExecContext& ctx, const CopyColumnsViews& v) {
  TRIDENT_CHECK(v.out.shape.rank == 2 && v.in.shape.rank == 2,
                "copy_columns: out and in must be matrices (rows, width)");
  const std::int64_t rows = v.out.shape[0];
  detail::check_view("copy_columns", "out", v.out, core::DType::kF32, v.out.shape, ctx);
  detail::check_view("copy_columns", "in", v.in, core::DType::kF32, {rows, v.in.shape[1]}, ctx);
  TRIDENT_CHECK(v.cols >= 0 && v.out_col >= 0 && v.in_col >= 0 &&
                    v.out_col + v.cols <= v.out.shape[1] && v.in_col + v.cols <= v.in.shape[1],
                "copy_columns: columns [", v.in_col, ", ", v.in_col + v.cols, ") of ",
                v.in.shape[1], " into [", v.out_col, ", ", v.out_col + v.cols, ") of ",
                v.out.shape[1], " fall outside a matrix");
  copy_columns(ctx, CopyColumnsArgs{.out = detail::data_or_null<float>(v.out),
                                    .in = detail::data_or_null<float>(v.in),
                                    .rows = rows,
                                    .cols = v.cols,
                                    .out_width = v.out.shape[1],
                                    .out_col = v.out_col,
                                    .in_width = v.in.shape[1],
                                    .in_col = v.in_col});
}

}  // namespace trident::kernels
