// Backend dispatch of init_normal.h; the CPU bodies are in kernels/cpu/init_normal.cc (one per
// instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/init_normal.h"

#include "trident/core/error.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void init_normal(const core::ExecContext& ctx, const InitNormalArgs& a) {
  TRIDENT_CHECK(0 <= a.begin && a.begin <= a.end && a.local_cols > 0 && a.global_cols > 0,
                "init_normal: bad range [", a.begin, ", ", a.end, ") or column counts ",
                a.local_cols, " / ", a.global_cols);
  TRIDENT_DISPATCH(init_normal, ctx, a);
}

void init_normal(const core::ExecContext& ctx, const InitNormalViews& v) {
  detail::check_view("init_normal", "out", v.out, core::DType::kF32, v.out.shape, ctx);
  init_normal(ctx, InitNormalArgs{.out = detail::data_or_null<float>(v.out),
                                  .begin = v.begin,
                                  .end = v.begin + v.out.numel(),
                                  .seed = v.seed,
                                  .stream = v.stream,
                                  .stddev = v.stddev,
                                  .base = v.base,
                                  .local_cols = v.local_cols,
                                  .global_cols = v.global_cols,
                                  .col_offset = v.col_offset});
}

}  // namespace trident::kernels
