// Backend dispatch of adamw.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/adamw.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/adamw.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void adamw_update(const core::ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kOptimizer, "adamw_update", 0,
                                  4.0 * 7 * args.n);
  TRIDENT_DISPATCH(adamw_update, ctx, hp, args);
}

void adamw_update(const core::ExecContext& ctx, const AdamWHyper& hp, const AdamWViews& views) {
  constexpr const char* op = "adamw_update";
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_rank(op, "param", views.param, 1);
  const std::int64_t n = views.param.shape[0];
  detail::check_views(
      op, ctx, f32, {n},
      {{"param", views.param}, {"m", views.m}, {"v", views.v}, {"grad", views.grad}});
  adamw_update(ctx, hp,
               AdamWArgs{.param = views.param.as<float>(),
                         .m = views.m.as<float>(),
                         .v = views.v.as<float>(),
                         .grad = views.grad.as<float>(),
                         .n = n});
}

}  // namespace trident::kernels
