// Backend dispatch of layernorm.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/layernorm.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/layernorm.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "layernorm_forward", 0,
                                  4.0 * 2 * args.rows * args.cols);
  TRIDENT_DISPATCH(layernorm_forward, ctx, args);
}

void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "layernorm_backward", 0,
                                  4.0 * 3 * args.rows * args.cols);
  TRIDENT_DISPATCH(layernorm_backward, ctx, args);
}

constexpr core::DType kF32 = core::DType::kF32;

void layernorm(const core::ExecContext& ctx, const LayerNormViews& v) {
  constexpr const char* op = "layernorm";
  detail::check_rank(op, "in", v.in, 2);
  const std::int64_t rows = v.in.shape[0], cols = v.in.shape[1];
  detail::check_views(op, ctx, kF32, {rows, cols}, {{"in", v.in}, {"out", v.out}});
  detail::check_views(op, ctx, kF32, {rows}, {{"mean", v.mean}, {"rstd", v.rstd}});
  detail::check_views(op, ctx, kF32, {cols}, {{"weight", v.weight}, {"bias", v.bias}});
  layernorm_forward(ctx, {.out = v.out.as<float>(),
                          .mean = v.mean.as<float>(),
                          .rstd = v.rstd.as<float>(),
                          .in = v.in.as<float>(),
                          .weight = v.weight.as<float>(),
                          .bias = v.bias.as<float>(),
                          .rows = rows,
                          .cols = cols,
                          .eps = v.eps});
}

void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardViews& v) {
  constexpr const char* op = "layernorm_backward";
  detail::check_rank(op, "in", v.in, 2);
  const std::int64_t rows = v.in.shape[0], cols = v.in.shape[1];
  detail::check_views(op, ctx, kF32, {rows, cols},
                      {{"in", v.in}, {"d_in", v.d_in}, {"d_out", v.d_out}});
  detail::check_views(op, ctx, kF32, {cols},
                      {{"d_weight", v.d_weight}, {"d_bias", v.d_bias}, {"weight", v.weight}});
  detail::check_views(op, ctx, kF32, {rows}, {{"mean", v.mean}, {"rstd", v.rstd}});
  layernorm_backward(ctx, LayerNormBackwardArgs{.d_in = v.d_in.as<float>(),
                                                .d_weight = v.d_weight.as<float>(),
                                                .d_bias = v.d_bias.as<float>(),
                                                .d_out = v.d_out.as<float>(),
                                                .in = v.in.as<float>(),
                                                .weight = v.weight.as<float>(),
                                                .mean = v.mean.as<float>(),
                                                .rstd = v.rstd.as<float>(),
                                                .rows = rows,
                                                .cols = cols});
}

}  // namespace trident::kernels
