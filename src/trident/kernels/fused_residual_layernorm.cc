// Backend dispatch of fused_residual_layernorm.h: one switch on the device per op; the CPU bodies
// are in kernels/cpu/fused_residual_layernorm.cc (one per instruction-set variant), the reference
// in kernels/ref/.
#include "trident/kernels/fused_residual_layernorm.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif
#include "trident/kernels/row_partials.h"
#include "trident/kernels/view_check.h"

namespace trident::kernels {

std::int64_t residual_layernorm_backward_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "residual_layernorm_backward_scratch_bytes: need rows >= 0 and cols > 0, got rows=",
                rows, " cols=", cols);
  return detail::num_row_chunks(rows) * 2 * cols * static_cast<std::int64_t>(sizeof(double));
}

void residual_layernorm_forward(const core::ExecContext& ctx,
                                const ResidualLayerNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "residual_layernorm_forward", 0,
                                  4.0 * 4 * args.rows * args.cols);
  TRIDENT_DISPATCH(residual_layernorm_forward, ctx, args);
}

void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "residual_layernorm_backward", 0,
                                  4.0 * 4 * args.rows * args.cols);
  TRIDENT_DISPATCH(residual_layernorm_backward, ctx, args);
}

constexpr core::DType kF32 = core::DType::kF32;

void residual_layernorm(const core::ExecContext& ctx, const ResidualLayerNormViews& v) {
  constexpr const char* op = "residual_layernorm";
  const auto [rows, cols] = detail::check_f32_and_bf16_outputs(op, ctx, {"a", v.a}, {"out", v.out},
                                                               {"out_bf16", v.out_bf16});
  detail::check_views(op, ctx, kF32, {rows, cols}, {{"b", v.b}, {"resid_out", v.resid_out}});
  detail::check_views(op, ctx, kF32, {rows}, {{"mean", v.mean}, {"rstd", v.rstd}});
  detail::check_views(op, ctx, kF32, {cols}, {{"weight", v.weight}, {"bias", v.bias}});
  residual_layernorm_forward(ctx, {.resid_out = v.resid_out.as<float>(),
                                   .out = detail::data_or_null<float>(v.out),
                                   .out_bf16 = detail::data_or_null<core::bf16>(v.out_bf16),
                                   .mean = v.mean.as<float>(),
                                   .rstd = v.rstd.as<float>(),
                                   .a = v.a.as<float>(),
                                   .b = v.b.as<float>(),
                                   .weight = v.weight.as<float>(),
                                   .bias = v.bias.as<float>(),
                                   .rows = rows,
                                   .cols = cols,
                                   .eps = v.eps});
}

void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardViews& v) {
  constexpr const char* op = "residual_layernorm_backward";
  detail::check_rank(op, "resid", v.resid, 2);
  const std::int64_t rows = v.resid.shape[0], cols = v.resid.shape[1];
  detail::check_views(op, ctx, kF32, {rows, cols},
                      {{"resid", v.resid}, {"d_resid", v.d_resid}, {"d_out", v.d_out}});
  detail::check_optional_view(op, "d_resid_bf16", v.d_resid_bf16, core::DType::kBF16, {rows, cols},
                              ctx);
  detail::check_views(op, ctx, kF32, {cols},
                      {{"d_weight", v.d_weight}, {"d_bias", v.d_bias}, {"weight", v.weight}});
  detail::check_views(op, ctx, kF32, {rows}, {{"mean", v.mean}, {"rstd", v.rstd}});
  residual_layernorm_backward(ctx,
                              ResidualLayerNormBackwardArgs{
                                  .d_resid = v.d_resid.as<float>(),
                                  .d_resid_bf16 = detail::data_or_null<core::bf16>(v.d_resid_bf16),
                                  .d_weight = v.d_weight.as<float>(),
                                  .d_bias = v.d_bias.as<float>(),
                                  .d_out = v.d_out.as<float>(),
                                  .resid = v.resid.as<float>(),
                                  .weight = v.weight.as<float>(),
                                  .mean = v.mean.as<float>(),
                                  .rstd = v.rstd.as<float>(),
                                  .rows = rows,
                                  .cols = cols,
                                  .scratch = v.scratch});
}

}  // namespace trident::kernels
