// The typed-view linear layer (kernels/linear.h): the weight's dtype picks the product (FP32
// against the double reference; BF16 bit for bit against the BF16 kernel it must run), and views
// of the wrong dtype, shape or device are clear errors.
#include "trident/kernels/linear.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernel_test_util.h"
#include "trident/core/bf16.h"
#include "trident/core/error.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::kernels {
namespace {

constexpr std::int64_t kRows = 37, kIn = 48, kOut = 29;

std::vector<core::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<core::bf16> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = core::bf16::from_float(x[i]);
  return y;
}

TEST(TypedLinear, Fp32WeightRunsTheFp32ProductAndMatchesTheReference) {
  const auto in = testing::randn(kRows * kIn, 1), w = testing::randn(kOut * kIn, 2, 0.2),
             b = testing::randn(kOut, 3);
  std::vector<float> out(kRows * kOut, NAN), want(out.size());
  ref::linear_forward({.out = want.data(),
                       .in = in.data(),
                       .weight = w.data(),
                       .bias = b.data(),
                       .rows = kRows,
                       .in_features = kIn,
                       .out_features = kOut});
  linear(testing::backend_ctx(), {.out = testing::view_of(out, {kRows, kOut}),
                                  .in = testing::view_of(in, {kRows, kIn}),
                                  .weight = testing::view_of(w, {kOut, kIn}),
                                  .bias = testing::view_of(b, {kOut})});
  EXPECT_TRUE(testing::all_close("out", out, want, testing::Tol{1e-5, 1e-5}));
}

TEST(TypedLinear, Bf16WeightRunsTheBf16ProductBitForBit) {
  const auto in = to_bf16(testing::randn(kRows * kIn, 4)),
             w = to_bf16(testing::randn(kOut * kIn, 5, 0.2));
  const auto d_out32 = testing::randn(kRows * kOut, 6);
  const auto d_out16 = to_bf16(d_out32);
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<std::byte> scratch(
      static_cast<std::size_t>(linear_bf16_scratch_bytes(ctx, kRows, kIn, kOut)));
  std::vector<float> out(kRows * kOut, NAN), want(out.size());
  linear(ctx, {.out = testing::view_of(out, {kRows, kOut}),
               .in = testing::view_of(in, {kRows, kIn}),
               .weight = testing::view_of(w, {kOut, kIn}),
               .scratch = testing::dev_span(scratch)});
  linear_forward_bf16(ctx, {.out = testing::dev(want),
                            .in = testing::dev(in),
                            .weight = testing::dev(w),
                            .rows = kRows,
                            .in_features = kIn,
                            .out_features = kOut,
                            .scratch = testing::dev_span(scratch)});
  EXPECT_TRUE(testing::all_equal("out", out, want));

  std::vector<float> d_in(kRows * kIn, NAN), d_w(kOut * kIn, 0.5f), d_b(kOut, 0.25f);
  std::vector<float> want_in(d_in.size()), want_w(d_w), want_b(d_b);
  linear_backward(ctx, LinearBackwardViews{.d_in = testing::view_of(d_in, {kRows, kIn}),
                                           .d_weight = testing::view_of(d_w, {kOut, kIn}),
                                           .d_bias = testing::view_of(d_b, {kOut}),
                                           .d_out = testing::view_of(d_out32, {kRows, kOut}),
                                           .d_out_bf16 = testing::view_of(d_out16, {kRows, kOut}),
                                           .in = testing::view_of(in, {kRows, kIn}),
                                           .weight = testing::view_of(w, {kOut, kIn}),
                                           .scratch = testing::dev_span(scratch)});
  linear_backward_bf16(ctx, {.d_in = testing::dev(want_in),
                             .d_weight = testing::dev(want_w),
                             .d_bias = testing::dev(want_b),
                             .d_out = testing::dev(d_out32),
                             .d_out_bf16 = testing::dev(d_out16),
                             .in = testing::dev(in),
                             .weight = testing::dev(w),
                             .rows = kRows,
                             .in_features = kIn,
                             .out_features = kOut,
                             .scratch = testing::dev_span(scratch)});
  EXPECT_TRUE(testing::all_equal("d_in", d_in, want_in));
  EXPECT_TRUE(testing::all_equal("d_weight", d_w, want_w));
  EXPECT_TRUE(testing::all_equal("d_bias", d_b, want_b));
}

std::string error_of(const LinearViews& v) {
  try {
    linear(testing::backend_ctx(), v);
  } catch (const core::InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(TypedLinear, ViewsOfTheWrongDtypeShapeOrDeviceAreClearErrors) {
  std::vector<float> in(kRows * kIn), w(kOut * kIn), out(kRows * kOut);
  const auto w16 = to_bf16(w);
  const LinearViews ok{.out = testing::view_of(out, {kRows, kOut}),
                       .in = testing::view_of(in, {kRows, kIn}),
                       .weight = testing::view_of(w, {kOut, kIn})};
  LinearViews v = ok;
  v.weight = testing::view_of(w16, {kOut, kIn});  // BF16 weight, FP32 input
  EXPECT_NE(error_of(v).find("view `in` holds f32, the op needs bf16"), std::string::npos)
      << error_of(v);
  v = ok;
  v.out = testing::view_claiming(out, {kRows, kOut - 1});
  EXPECT_NE(error_of(v).find("view `out` has shape"), std::string::npos) << error_of(v);
  v = ok;
  v.in = core::view(testing::dev(in), {kRows, kIn}, testing::other_device());
  EXPECT_NE(error_of(v).find("view `in` is on another device"), std::string::npos) << error_of(v);
  v = ok;
  v.out = {};
  EXPECT_NE(error_of(v).find("view `out` is empty"), std::string::npos) << error_of(v);
}

}  // namespace
}  // namespace trident::kernels
