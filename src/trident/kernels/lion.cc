// Backend dispatch of lion.h: one switch on the device; the CPU bodies are in kernels/cpu/lion.cc
// (one per instruction-set variant), the CUDA body in kernels/cuda/lion.cu, the reference in
// kernels/ref/lion_ref.cc.
#include "trident/kernels/lion.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void lion_update(const core::ExecContext& ctx, const LionHyper& hp, const LionArgs& args) {
  // The contract, checked once here for every backend's body.
  TRIDENT_CHECK(args.n >= 0, "lion_update: n must be >= 0, got ", args.n);
  TRIDENT_CHECK(hp.beta1 >= 0.0f && hp.beta1 <= 1.0f && hp.beta2 >= 0.0f && hp.beta2 <= 1.0f,
                "lion_update: betas must be in [0, 1], got beta1=", hp.beta1, " beta2=", hp.beta2);
  TRIDENT_CHECK(hp.lr >= 0.0f && hp.weight_decay >= 0.0f,
                "lion_update: lr and weight_decay must be >= 0, got lr=", hp.lr,
                " weight_decay=", hp.weight_decay);
  if (args.n == 0) return;
  TRIDENT_CHECK(args.param && args.m && args.grad,
                "lion_update: param, m and grad must be non-null");
  // Bytes moved: param, m read and written, grad read.
  const core::profile::Scope prof(core::profile::Kind::kOptimizer, "lion_update", 0,
                                  4.0 * 5 * args.n);
  TRIDENT_DISPATCH(lion_update, ctx, hp, args);
}

void lion_update(const core::ExecContext& ctx, const LionHyper& hp, const LionViews& views) {
  constexpr const char* op = "lion_update";
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_rank(op, "param", views.param, 1);
  const std::int64_t n = views.param.shape[0];
  detail::check_views(op, ctx, f32, {n},
                      {{"param", views.param}, {"m", views.m}, {"grad", views.grad}});
  lion_update(ctx, hp,
              LionArgs{.param = views.param.as<float>(),
                       .m = views.m.as<float>(),
                       .grad = views.grad.as<float>(),
                       .n = n});
}

}  // namespace trident::kernels
