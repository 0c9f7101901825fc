// The typed-view linear layer (linear.h): checks the views and picks the product from the weight's
// dtype; the products' raw entry points (matmul.h, matmul_bf16.h) dispatch on the device.
#include "trident/kernels/linear.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/view_check.h"

namespace trident::kernels {

namespace {

struct Sizes {
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};

// The shared view checks (view_check.h), with the reason a BF16 dtype is needed.
void check_view(const char* op, const char* name, const core::TensorView& v, core::DType dtype,
                const core::Shape& shape, const core::ExecContext& ctx) {
  detail::check_view(op, name, v, dtype, shape, ctx,
                     dtype == core::DType::kBF16 ? " (the weight is BF16)" : "");
}

Sizes sizes_of(const char* op, const core::TensorView& in, const core::TensorView& weight) {
  TRIDENT_CHECK(in.shape.rank == 2 && weight.shape.rank == 2, op,
                ": in and weight must be 2-D, got ", core::to_string(in.shape), " and ",
                core::to_string(weight.shape));
  TRIDENT_CHECK(weight.dtype == core::DType::kF32 || weight.dtype == core::DType::kBF16, op,
                ": the weight must be f32 or bf16, got ", core::dtype_name(weight.dtype));
  return {in.shape[0], in.shape[1], weight.shape[0]};
}

void run_linear(const core::ExecContext& ctx, const LinearViews& v, const Sizes& s) {
  const float* bias = v.bias.empty() ? nullptr : v.bias.as<float>();
  if (v.weight.dtype == core::DType::kF32) {
    return linear_forward(ctx, {.out = v.out.as<float>(),
                                .in = v.in.as<float>(),
                                .weight = v.weight.as<float>(),
                                .bias = bias,
                                .rows = s.rows,
                                .in_features = s.in_features,
                                .out_features = s.out_features});
  }
  linear_forward_bf16(ctx, {.out = v.out.as<float>(),
                            .in = v.in.as<core::bf16>(),
                            .weight = v.weight.as<core::bf16>(),
                            .bias = bias,
                            .rows = s.rows,
                            .in_features = s.in_features,
                            .out_features = s.out_features,
                            .scratch = v.scratch});
}

void run_linear_backward(const core::ExecContext& ctx, const LinearBackwardViews& v,
                         const Sizes& s) {
  float* d_in = v.d_in.empty() ? nullptr : v.d_in.as<float>();
  float* d_bias = v.d_bias.empty() ? nullptr : v.d_bias.as<float>();
  if (v.weight.dtype == core::DType::kF32) {
    return linear_backward(ctx, LinearBackwardArgs{.d_in = d_in,
                                                   .d_weight = v.d_weight.as<float>(),
                                                   .d_bias = d_bias,
                                                   .d_out = v.d_out.as<float>(),
                                                   .in = v.in.as<float>(),
                                                   .weight = v.weight.as<float>(),
                                                   .rows = s.rows,
                                                   .in_features = s.in_features,
                                                   .out_features = s.out_features});
  }
  linear_backward_bf16(ctx, {.d_in = d_in,
                             .d_weight = v.d_weight.as<float>(),
                             .d_bias = d_bias,
                             .d_out = v.d_out.as<float>(),
                             .d_out_bf16 = v.d_out_bf16.as<core::bf16>(),
                             .in = v.in.as<core::bf16>(),
                             .weight = v.weight.as<core::bf16>(),
                             .rows = s.rows,
                             .in_features = s.in_features,
                             .out_features = s.out_features,
                             .scratch = v.scratch});
}

}  // namespace

void linear(const core::ExecContext& ctx, const LinearViews& v) {
  constexpr const char* op = "linear";
  const Sizes s = sizes_of(op, v.in, v.weight);
  const core::DType wt = v.weight.dtype;
  check_view(op, "weight", v.weight, wt, {s.out_features, s.in_features}, ctx);
  check_view(op, "in", v.in, wt, {s.rows, s.in_features}, ctx);
  check_view(op, "out", v.out, core::DType::kF32, {s.rows, s.out_features}, ctx);
  if (!v.bias.empty()) check_view(op, "bias", v.bias, core::DType::kF32, {s.out_features}, ctx);
  const core::profile::Scope prof(
      core::profile::Kind::kGemm, wt == core::DType::kBF16 ? "linear bf16" : "linear fp32",
      2.0 * s.rows * s.in_features * s.out_features, 0, s.rows, s.out_features, s.in_features);
  run_linear(ctx, v, s);  // linear_forward(_bf16) dispatch on ctx.device
}

void linear_backward(const core::ExecContext& ctx, const LinearBackwardViews& v) {
  constexpr const char* op = "linear_backward";
  const Sizes s = sizes_of(op, v.in, v.weight);
  const core::DType wt = v.weight.dtype;
  constexpr core::DType f32 = core::DType::kF32;
  check_view(op, "weight", v.weight, wt, {s.out_features, s.in_features}, ctx);
  check_view(op, "in", v.in, wt, {s.rows, s.in_features}, ctx);
  check_view(op, "d_out", v.d_out, f32, {s.rows, s.out_features}, ctx);
  check_view(op, "d_weight", v.d_weight, f32, {s.out_features, s.in_features}, ctx);
  if (!v.d_in.empty()) check_view(op, "d_in", v.d_in, f32, {s.rows, s.in_features}, ctx);
  if (!v.d_bias.empty()) check_view(op, "d_bias", v.d_bias, f32, {s.out_features}, ctx);
  if (wt == core::DType::kBF16) {
    check_view(op, "d_out_bf16", v.d_out_bf16, core::DType::kBF16, {s.rows, s.out_features}, ctx);
  }
  // Two products: d_in (rows x in, over out) unless d_in is null, d_weight (out x in, over rows).
  const double product = 2.0 * s.rows * s.in_features * s.out_features;
  const core::profile::Scope prof(
      core::profile::Kind::kGemm,
      wt == core::DType::kBF16 ? "linear_backward bf16" : "linear_backward fp32",
      v.d_in.empty() ? product : 2 * product, 0, s.rows, s.out_features, s.in_features);
  run_linear_backward(ctx, v, s);  // linear_backward(_bf16) dispatch on ctx.device
}

}  // namespace trident::kernels
