// Backend dispatch of overflow.h; the CPU bodies are in kernels/cpu/overflow.cc (one per
// instruction-set variant), the reference in kernels/ref/overflow_ref.cc.
#include "trident/kernels/overflow.h"

#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

std::int64_t overflow_count(const core::ExecContext& ctx, const OverflowCountArgs& args) {
  TRIDENT_DISPATCH(overflow_count, ctx, args);
}

std::int64_t overflow_count(const core::ExecContext& ctx, const OverflowCountViews& v) {
  detail::check_view("overflow_count", "x", v.x, core::DType::kF32, v.x.shape, ctx);
  return overflow_count(
      ctx, OverflowCountArgs{
               .x = detail::data_or_null<float>(v.x), .threshold = v.threshold, .n = v.x.numel()});
}

}  // namespace trident::kernels
