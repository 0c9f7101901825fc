// Backend dispatch of rmsnorm.h; CPU bodies in kernels/cpu/rmsnorm.cc, reference in kernels/ref/.
#include "trident/kernels/rmsnorm.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void rmsnorm_forward(const core::ExecContext& ctx, const RmsNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_forward");
  TRIDENT_DISPATCH(rmsnorm_forward, ctx, args);
}

void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_backward");
  TRIDENT_DISPATCH(rmsnorm_backward, ctx, args);
}

constexpr core::DType kF32 = core::DType::kF32;

void rmsnorm(const core::ExecContext& ctx, const RmsNormViews& v) {
  constexpr const char* op = "rmsnorm";
  detail::check_rank(op, "in", v.in, 2);
  const std::int64_t rows = v.in.shape[0], cols = v.in.shape[1];
  detail::check_views(op, ctx, kF32, {rows, cols}, {{"in", v.in}, {"out", v.out}});
  detail::check_view(op, "rstd", v.rstd, kF32, {rows}, ctx);
  detail::check_view(op, "weight", v.weight, kF32, {cols}, ctx);
  rmsnorm_forward(ctx, {.out = v.out.as<float>(),
                        .rstd = v.rstd.as<float>(),
                        .in = v.in.as<float>(),
                        .weight = v.weight.as<float>(),
                        .rows = rows,
                        .cols = cols,
                        .eps = v.eps});
}

void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardViews& v) {
  constexpr const char* op = "rmsnorm_backward";
  detail::check_rank(op, "in", v.in, 2);
  const std::int64_t rows = v.in.shape[0], cols = v.in.shape[1];
  detail::check_views(op, ctx, kF32, {rows, cols},
                      {{"in", v.in}, {"d_in", v.d_in}, {"d_out", v.d_out}});
  detail::check_views(op, ctx, kF32, {cols}, {{"d_weight", v.d_weight}, {"weight", v.weight}});
  detail::check_view(op, "rstd", v.rstd, kF32, {rows}, ctx);
  rmsnorm_backward(ctx, RmsNormBackwardArgs{.d_in = v.d_in.as<float>(),
                                            .d_weight = v.d_weight.as<float>(),
                                            .d_out = v.d_out.as<float>(),
                                            .in = v.in.as<float>(),
                                            .weight = v.weight.as<float>(),
                                            .rstd = v.rstd.as<float>(),
                                            .rows = rows,
                                            .cols = cols});
}

}  // namespace trident::kernels
