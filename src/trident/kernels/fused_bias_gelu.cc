// Backend dispatch of fused_bias_gelu.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/fused_bias_gelu.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/fused_bias_gelu.h"

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

std::int64_t bias_gelu_backward_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "bias_gelu_backward_scratch_bytes: need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
  return detail::num_row_chunks(rows) * cols * static_cast<std::int64_t>(sizeof(double));
}

void bias_gelu_forward(const core::ExecContext& ctx, const BiasGeluForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "bias_gelu_forward", 0,
                                  4.0 * 2 * args.rows * args.cols);
  TRIDENT_DISPATCH(bias_gelu_forward, ctx, args);
}

void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "bias_gelu_backward", 0,
                                  4.0 * 3 * args.rows * args.cols);
  TRIDENT_DISPATCH(bias_gelu_backward, ctx, args);
}

void bias_gelu(const core::ExecContext& ctx, const BiasGeluViews& v) {
  constexpr const char* op = "bias_gelu";
  const auto [rows, cols] = detail::check_f32_and_bf16_outputs(
      op, ctx, {"in", v.in}, {"out", v.out}, {"out_bf16", v.out_bf16});
  detail::check_view(op, "bias", v.bias, core::DType::kF32, {cols}, ctx);
  bias_gelu_forward(ctx, {.out = detail::data_or_null<float>(v.out),
                          .out_bf16 = detail::data_or_null<core::bf16>(v.out_bf16),
                          .in = v.in.as<float>(),
                          .bias = v.bias.as<float>(),
                          .rows = rows,
                          .cols = cols});
}

void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardViews& v) {
  constexpr const char* op = "bias_gelu_backward";
  const auto [rows, cols] = detail::check_f32_and_bf16_outputs(
      op, ctx, {"in", v.in}, {"d_in", v.d_in}, {"d_in_bf16", v.d_in_bf16});
  detail::check_view(op, "d_out", v.d_out, core::DType::kF32, {rows, cols}, ctx);
  detail::check_views(op, ctx, core::DType::kF32, {cols}, {{"d_bias", v.d_bias}, {"bias", v.bias}});
  bias_gelu_backward(
      ctx, BiasGeluBackwardArgs{.d_in = detail::data_or_null<float>(v.d_in),
                                .d_in_bf16 = detail::data_or_null<core::bf16>(v.d_in_bf16),
                                .d_bias = v.d_bias.as<float>(),
                                .d_out = v.d_out.as<float>(),
                                .in = v.in.as<float>(),
                                .bias = v.bias.as<float>(),
                                .rows = rows,
                                .cols = cols,
                                .scratch = v.scratch});
}

}  // namespace trident::kernels
