// RMSNorm, SwiGLU and rotary QKV (Llama's kernels) against the double-precision references, the
// references' backward passes against central differences (in double), += semantics, and the
// rotary embedding's defining properties (norm preserved, scores depend on relative positions).
//
// Tolerance: |x - ref| <= 1e-5 + 1e-5 |ref| (FP32 SIMD sums over rows of up to 1027 values; the
// SwiGLU kernel's exp is within 1e-7 relative of expf). On cuda: the device expf (2 ulp) in the
// sigmoid, FMA contraction, RMSNorm rows summed over a 256-thread tree, rotary angles and their
// cos/sin in double as the CPU's: a few FP32 ulp, inside the same tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr Tol kTol{1e-5, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  std::int64_t rows, cols;
};
// 1, odd sizes, one column, sizes that are not multiples of the CUDA blocks (256 threads), Llama
// 7B's hidden size (4096).
const Case kCases[] = {{1, 1},    {1, 7},    {3, 17},   {33, 1},
                       {17, 100}, {4, 1027}, {64, 256}, {5, 4096}};

std::string name(const char* what, const Case& c) {
  return std::string(what) + " rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols);
}

TEST(RmsNorm, ForwardAndBackwardMatchReference) {
  std::uint64_t seed = 1;
  for (const Case& c : kCases) {
    const auto in = randn(c.rows * c.cols, seed++, 1.5, 0.3);
    const auto w = randn(c.cols, seed++, 0.2, 1.0);
    const auto d_out = randn(c.rows * c.cols, seed++);
    std::vector<float> out(in.size(), kNaN), rstd(c.rows, kNaN), out_r = out, rstd_r = rstd;
    rmsnorm(testing::backend_ctx(), {.out = view_of(out, {c.rows, c.cols}),
                                     .rstd = view_of(rstd, {c.rows}),
                                     .in = view_of(in, {c.rows, c.cols}),
                                     .weight = view_of(w, {c.cols}),
                                     .eps = 1e-6f});
    ref::rmsnorm_forward({.out = out_r.data(),
                          .rstd = rstd_r.data(),
                          .in = in.data(),
                          .weight = w.data(),
                          .rows = c.rows,
                          .cols = c.cols,
                          .eps = 1e-6f});
    EXPECT_TRUE(all_close(name("rmsnorm out", c).c_str(), out, out_r, kTol));
    EXPECT_TRUE(all_close(name("rmsnorm rstd", c).c_str(), rstd, rstd_r, kTol));
    // Backward accumulates into d_in and d_weight.
    auto d_in = randn(in.size(), seed++), d_w = randn(c.cols, seed++);
    auto d_in_r = d_in, d_w_r = d_w;
    rmsnorm_backward(testing::backend_ctx(), {.d_in = view_of(d_in, {c.rows, c.cols}),
                                              .d_weight = view_of(d_w, {c.cols}),
                                              .d_out = view_of(d_out, {c.rows, c.cols}),
                                              .in = view_of(in, {c.rows, c.cols}),
                                              .weight = view_of(w, {c.cols}),
                                              .rstd = view_of(rstd_r, {c.rows})});
    ref::rmsnorm_backward({.d_in = d_in_r.data(),
                           .d_weight = d_w_r.data(),
                           .d_out = d_out.data(),
                           .in = in.data(),
                           .weight = w.data(),
                           .rstd = rstd_r.data(),
                           .rows = c.rows,
                           .cols = c.cols});
    EXPECT_TRUE(all_close(name("rmsnorm d_in", c).c_str(), d_in, d_in_r, kTol));
    EXPECT_TRUE(all_close(name("rmsnorm d_weight", c).c_str(), d_w, d_w_r, Tol{1e-4, 1e-5}));
  }
}

TEST(RmsNormReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t R = 3, C = 5;
  auto x = randn<double>(R * C, 7, 1.0, 0.2), w = randn<double>(C, 8, 0.3, 1.0);
  const auto dy = randn<double>(R * C, 9);
  auto loss = [&] {
    std::vector<double> y(R * C), rstd(R);
    ref::rmsnorm_forward<double>({.out = y.data(),
                                  .rstd = rstd.data(),
                                  .in = x.data(),
                                  .weight = w.data(),
                                  .rows = R,
                                  .cols = C,
                                  .eps = 1e-5});
    return testing::dot(dy, y);
  };
  const auto gx = testing::numeric_grad(x, loss), gw = testing::numeric_grad(w, loss);
  std::vector<double> y(R * C), rstd(R), dx(R * C, 0.0), dw(C, 0.0);
  ref::rmsnorm_forward<double>({.out = y.data(),
                                .rstd = rstd.data(),
                                .in = x.data(),
                                .weight = w.data(),
                                .rows = R,
                                .cols = C,
                                .eps = 1e-5});
  ref::rmsnorm_backward<double>({.d_in = dx.data(),
                                 .d_weight = dw.data(),
                                 .d_out = dy.data(),
                                 .in = x.data(),
                                 .weight = w.data(),
                                 .rstd = rstd.data(),
                                 .rows = R,
                                 .cols = C});
  EXPECT_TRUE(all_close("rmsnorm ref d_in vs finite differences", dx, gx, testing::kFiniteDiffTol));
  EXPECT_TRUE(all_close("rmsnorm ref d_w vs finite differences", dw, gw, testing::kFiniteDiffTol));
}

TEST(SwiGlu, ForwardAndBackwardMatchReference) {
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    const auto in = randn(c.rows * 2 * c.cols, seed++, 3.0);  // wide: saturated sigmoids too
    const auto d_out = randn(c.rows * c.cols, seed++);
    std::vector<float> out(c.rows * c.cols, kNaN), out_r = out;
    swiglu(testing::backend_ctx(),
           {.out = view_of(out, {c.rows, c.cols}), .in = view_of(in, {c.rows, 2 * c.cols})});
    ref::swiglu_forward({.out = out_r.data(), .in = in.data(), .rows = c.rows, .cols = c.cols});
    EXPECT_TRUE(all_close(name("swiglu out", c).c_str(), out, out_r, kTol));
    std::vector<float> d_in(in.size(), kNaN), d_in_r = d_in;
    swiglu_backward(testing::backend_ctx(), {.d_in = view_of(d_in, {c.rows, 2 * c.cols}),
                                             .d_out = view_of(d_out, {c.rows, c.cols}),
                                             .in = view_of(in, {c.rows, 2 * c.cols})});
    ref::swiglu_backward({.d_in = d_in_r.data(),
                          .d_out = d_out.data(),
                          .in = in.data(),
                          .rows = c.rows,
                          .cols = c.cols});
    EXPECT_TRUE(all_close(name("swiglu d_in", c).c_str(), d_in, d_in_r, kTol));
  }
}

// The views are checked before a pointer is read: errors name the op and the view.
TEST(RmsNormAndSwiGlu, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  const std::int64_t rows = 2, cols = 3;
  std::vector<float> x(rows * cols), x2(rows * 2 * cols), y2(x2.size()), w(cols), r(rows);
  const std::vector<core::bf16> w16(cols);
  const RmsNormViews ok{.out = view_of(x, {rows, cols}),
                        .rstd = view_of(r, {rows}),
                        .in = view_of(x, {rows, cols}),
                        .weight = view_of(w, {cols})};
  RmsNormViews v = ok;
  v.weight = view_of(w16, {cols});
  std::string e = testing::invalid_argument_of([&] { rmsnorm(testing::backend_ctx(), v); });
  EXPECT_NE(e.find("rmsnorm: view `weight` holds bf16, the op needs f32"), std::string::npos) << e;
  e = testing::invalid_argument_of([&] {
    rmsnorm_backward(testing::backend_ctx(), {.d_in = view_of(x, {rows, cols}),
                                              .d_weight = view_of(w, {cols}),
                                              .d_out = view_of(x, {rows, cols}),
                                              .in = view_of(x, {rows, cols}),
                                              .weight = view_of(w, {cols})});
  });
  EXPECT_NE(e.find("rmsnorm_backward: view `rstd` is empty"), std::string::npos) << e;
  e = testing::invalid_argument_of([&] {
    swiglu(testing::backend_ctx(),
           {.out = view_of(x, {rows, cols}), .in = view_of(x, {rows, cols})});
  });
  EXPECT_NE(e.find("swiglu: view `in` has shape (2, 3), the op needs (2, 6)"), std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    swiglu_backward(testing::backend_ctx(), {.d_in = view_of(x2, {rows, 2 * cols}),
                                             .d_out = view_of(x, {rows, cols}),
                                             .in = view_of(y2, {rows, 2 * cols})});
  });
  EXPECT_EQ(e, "no error");
}

TEST(SwiGluReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t R = 2, F = 4;
  auto x = randn<double>(R * 2 * F, 11, 2.0);
  const auto dy = randn<double>(R * F, 12);
  auto loss = [&] {
    std::vector<double> y(R * F);
    ref::swiglu_forward<double>({.out = y.data(), .in = x.data(), .rows = R, .cols = F});
    return testing::dot(dy, y);
  };
  const auto gx = testing::numeric_grad(x, loss);
  std::vector<double> dx(x.size());
  ref::swiglu_backward<double>(
      {.d_in = dx.data(), .d_out = dy.data(), .in = x.data(), .rows = R, .cols = F});
  EXPECT_TRUE(all_close("swiglu ref d_in vs finite differences", dx, gx, testing::kFiniteDiffTol));
}

std::vector<float> inv_freq(std::int64_t head_dim, double base) {
  std::vector<float> f(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(base, 2.0 * static_cast<double>(i) / head_dim));
  }
  return f;
}

struct RopeCase {
  std::int64_t rows, seq_len, position, groups, heads_per_group, head_dim;
  bool rotate;
};
const RopeCase kRopeCases[] = {{6, 3, 0, 2, 1, 8, true},     {10, 5, 7, 1, 4, 16, true},
                               {8, 8, 0, 2, 3, 6, true},     {12, 4, 0, 3, 2, 8, false},
                               {33, 11, 2, 2, 2, 32, true},  {1, 1, 40, 4, 1, 64, true},
                               {6, 3, 1000, 2, 4, 128, true}};  // Llama: GQA, head_dim 128

TEST(RopeQkv, ForwardAndBackwardMatchReference) {
  std::uint64_t seed = 200;
  for (const RopeCase& c : kRopeCases) {
    const auto freq = inv_freq(c.head_dim, 10000.0);
    const RopeQkvShape s{.rows = c.rows,
                         .seq_len = c.seq_len,
                         .position = c.position,
                         .groups = c.groups,
                         .heads_per_group = c.heads_per_group,
                         .head_dim = c.head_dim,
                         .inv_freq = c.rotate ? freq.data() : nullptr};
    const std::string tag = "rope rows=" + std::to_string(c.rows) +
                            " groups=" + std::to_string(c.groups) +
                            " hpg=" + std::to_string(c.heads_per_group);
    const auto in = randn(c.rows * s.in_cols(), seed++);
    std::vector<float> out(static_cast<std::size_t>(c.rows * s.out_cols()), kNaN), out_r = out;
    const RopeQkvGeometry g{.seq_len = c.seq_len,
                            .position = c.position,
                            .groups = c.groups,
                            .heads_per_group = c.heads_per_group,
                            .head_dim = c.head_dim};
    const core::TensorView freq_view =
        c.rotate ? view_of(freq, {c.head_dim / 2}) : core::TensorView{};
    rope_qkv(testing::backend_ctx(), {.out = view_of(out, {c.rows, s.out_cols()}),
                                      .in = view_of(in, {c.rows, s.in_cols()}),
                                      .inv_freq = freq_view,
                                      .geometry = g});
    ref::rope_qkv_forward({.out = out_r.data(), .in = in.data(), .shape = s});
    EXPECT_TRUE(all_close((tag + " out").c_str(), out, out_r, kTol));
    const auto d_out = randn(c.rows * s.out_cols(), seed++);
    std::vector<float> d_in(in.size(), kNaN), d_in_r = d_in;
    rope_qkv_backward(testing::backend_ctx(), {.d_in = view_of(d_in, {c.rows, s.in_cols()}),
                                               .d_out = view_of(d_out, {c.rows, s.out_cols()}),
                                               .inv_freq = freq_view,
                                               .geometry = g});
    ref::rope_qkv_backward({.d_in = d_in_r.data(), .d_out = d_out.data(), .shape = s});
    EXPECT_TRUE(all_close((tag + " d_in").c_str(), d_in, d_in_r, kTol));
    // The backward is the forward's transpose: <forward(x), y> = <x, backward(y)>.
    double lhs = 0, rhs = 0;
    for (std::size_t i = 0; i < out_r.size(); ++i) lhs += static_cast<double>(out_r[i]) * d_out[i];
    for (std::size_t i = 0; i < in.size(); ++i) rhs += static_cast<double>(in[i]) * d_in_r[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * (std::abs(lhs) + 1)) << tag;
  }
}

// The geometry fixes the columns of the views: a QKV of the wrong width is an error naming it.
TEST(RopeQkv, ViewsThatDisagreeWithTheGeometryAreClearErrors) {
  const RopeQkvGeometry g{.seq_len = 2, .groups = 2, .heads_per_group = 2, .head_dim = 4};
  std::vector<float> in(2 * g.in_cols()), out(2 * g.out_cols()), freq(2);
  const std::vector<std::int32_t> pos(3);
  std::string e = testing::invalid_argument_of([&] {
    rope_qkv(testing::backend_ctx(), {.out = view_of(out, {2, g.out_cols()}),
                                      .in = testing::view_claiming(in, {2, g.out_cols()}),
                                      .geometry = g});
  });
  EXPECT_NE(e.find("rope_qkv: view `in` has shape (2, 48), the op needs (2, 32)"),
            std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    rope_qkv_backward(testing::backend_ctx(), {.d_in = view_of(in, {2, g.in_cols()}),
                                               .d_out = view_of(out, {2, g.out_cols()}),
                                               .inv_freq = view_of(freq, {2}),
                                               .positions = view_of(pos, {3}),
                                               .geometry = g});
  });
  EXPECT_NE(e.find("view `positions` has shape (3), the op needs (2)"), std::string::npos) << e;
}

// q at position m and k at position n give the score of the unrotated pair rotated by m - n: the
// dot product of rotated heads depends on the positions only through m - n, and rotation keeps
// each head's norm.
TEST(RopeQkvReferenceCpuOnly, ScoresDependOnRelativePositionOnly) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t HS = 16;
  const auto freq = inv_freq(HS, 10000.0);
  const auto q = randn(HS, 1), k = randn(HS, 2), v = randn(HS, 3);
  auto score = [&](std::int64_t m, std::int64_t n) {
    std::vector<float> in(3 * HS), out(3 * HS), out2(3 * HS);
    std::copy(q.begin(), q.end(), in.begin());
    std::copy(k.begin(), k.end(), in.begin() + HS);
    std::copy(v.begin(), v.end(), in.begin() + 2 * HS);
    RopeQkvShape s{.rows = 1,
                   .seq_len = 1,
                   .position = m,
                   .groups = 1,
                   .head_dim = HS,
                   .inv_freq = freq.data()};
    ref::rope_qkv_forward({.out = out.data(), .in = in.data(), .shape = s});
    s.position = n;
    ref::rope_qkv_forward({.out = out2.data(), .in = in.data(), .shape = s});
    double dot = 0, nq = 0, q0 = 0;
    for (std::int64_t i = 0; i < HS; ++i) {
      dot += static_cast<double>(out[i]) * out2[HS + i];
      nq += static_cast<double>(out[i]) * out[i];
      q0 += static_cast<double>(q[i]) * q[i];
    }
    EXPECT_NEAR(nq, q0, 1e-5 * q0);
    return dot;
  };
  EXPECT_NEAR(score(5, 2), score(13, 10), 1e-5);
  EXPECT_NEAR(score(0, 0), score(31, 31), 1e-5);
  EXPECT_GT(std::abs(score(5, 2) - score(5, 4)), 1e-3);  // it does depend on the distance
}

}  // namespace
}  // namespace trident::kernels
