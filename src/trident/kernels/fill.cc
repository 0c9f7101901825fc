// Backend dispatch of fill.h; the CPU bodies are in kernels/cpu/fill.cc (one per instruction-set
// variant), the reference in kernels/ref/fill_ref.cc.
#include "trident/kernels/fill.h"

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

}  // namespace trident::kernels
