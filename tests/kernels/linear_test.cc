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
#include "trident/kernels/ref/ref.h"

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
  linear(testing::backend_ctx(), {.out = core::view(out.data(), {kRows, kOut}),
                                  .in = core::view(in.data(), {kRows, kIn}),
                                  .weight = core::view(w.data(), {kOut, kIn}),
                                  .bias = core::view(b.data(), {kOut})});
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
  std::vector<float> out(kRows * kOut), want(out.size());
  linear(ctx, {.out = core::view(out.data(), {kRows, kOut}),
               .in = core::view(in.data(), {kRows, kIn}),
               .weight = core::view(w.data(), {kOut, kIn}),
               .scratch = scratch});
  linear_forward_bf16(ctx, {.out = want.data(),
                            .in = in.data(),
                            .weight = w.data(),
                            .rows = kRows,
                            .in_features = kIn,
                            .out_features = kOut,
                            .scratch = scratch});
  EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0);

  std::vector<float> d_in(kRows * kIn), d_w(kOut * kIn, 0.5f), d_b(kOut, 0.25f);
  std::vector<float> want_in(d_in.size()), want_w(d_w), want_b(d_b);
  linear_backward(ctx, LinearBackwardViews{.d_in = core::view(d_in.data(), {kRows, kIn}),
                                           .d_weight = core::view(d_w.data(), {kOut, kIn}),
                                           .d_bias = core::view(d_b.data(), {kOut}),
                                           .d_out = core::view(d_out32.data(), {kRows, kOut}),
                                           .d_out_bf16 = core::view(d_out16.data(), {kRows, kOut}),
                                           .in = core::view(in.data(), {kRows, kIn}),
                                           .weight = core::view(w.data(), {kOut, kIn}),
                                           .scratch = scratch});
  linear_backward_bf16(ctx, {.d_in = want_in.data(),
                             .d_weight = want_w.data(),
                             .d_bias = want_b.data(),
                             .d_out = d_out32.data(),
                             .d_out_bf16 = d_out16.data(),
                             .in = in.data(),
                             .weight = w.data(),
                             .rows = kRows,
                             .in_features = kIn,
                             .out_features = kOut,
                             .scratch = scratch});
  EXPECT_EQ(std::memcmp(d_in.data(), want_in.data(), d_in.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(d_w.data(), want_w.data(), d_w.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(d_b.data(), want_b.data(), d_b.size() * sizeof(float)), 0);
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
  const LinearViews ok{.out = core::view(out.data(), {kRows, kOut}),
                       .in = core::view(in.data(), {kRows, kIn}),
                       .weight = core::view(w.data(), {kOut, kIn})};
  LinearViews v = ok;
  v.weight = core::view(w16.data(), {kOut, kIn});  // BF16 weight, FP32 input
  EXPECT_NE(error_of(v).find("view `in` holds f32, the op needs bf16"), std::string::npos)
      << error_of(v);
  v = ok;
  v.out = core::view(out.data(), {kRows, kOut - 1});
  EXPECT_NE(error_of(v).find("view `out` has shape"), std::string::npos) << error_of(v);
  v = ok;
  v.in = core::view(in.data(), {kRows, kIn}, {.kind = core::DeviceKind::kCuda});
  EXPECT_NE(error_of(v).find("view `in` is on another device"), std::string::npos) << error_of(v);
  v = ok;
  v.out = {};
  EXPECT_NE(error_of(v).find("view `out` is empty"), std::string::npos) << error_of(v);
}

}  // namespace
}  // namespace trident::kernels
