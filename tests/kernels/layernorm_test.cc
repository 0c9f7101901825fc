// layernorm / layernorm_backward (the typed views) against the double-precision reference, +=
// semantics, thread-count independence, the views' checks, and finite-difference checks of the
// reference backward.
//
// Tolerance: |x - ref| <= 1e-5 + 1e-5 |ref|. The fast kernel accumulates each row (up to 1027
// columns) in FP32 SIMD lanes and the column sums of d_weight/d_bias in double; the outputs are
// O(1-10), so FP32 rounding (6e-8 relative per operation) stays well inside. The CUDA kernel sums
// each row over a 256-thread tree in FP32 (another order, FMAs where nvcc contracts d*d + s),
// rsqrt as 1/sqrtf (correctly rounded): the same FP32 accumulation error, ~1e-6 relative even at
// 12288 columns, and its column sums are in double as the CPU's. d_in's absolute part grows with
// the rows' rstd (testing::layernorm_d_in_tol: one-column rows, where FMA contraction leaves a
// rounding error that rstd = 1/sqrt(eps) multiplies).
#include "trident/kernels/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr Tol kTol{1e-5, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct Case {
  std::int64_t rows, cols;
};
// 1, odd sizes, one column, sizes that are not multiples of 16 (nor of the CUDA kernels' 256
// threads), GPT-2 small (rows=256, C=768), a batch of GPT-2 small rows (B*T = 8192) and the widest
// hidden sizes in use (12288, GPT-3 175B).
const Case kCases[] = {{1, 1},    {1, 7},    {3, 17},    {7, 1},      {5, 33},
                       {17, 100}, {4, 1027}, {256, 768}, {8192, 768}, {2, 12288}};

std::string shape_name(const char* tensor, const Case& c) {
  return std::string(tensor) + " rows=" + std::to_string(c.rows) +
         " cols=" + std::to_string(c.cols);
}

struct Inputs {
  std::vector<float> in, weight, bias, d_out;
};
Inputs make_inputs(const Case& c, std::uint64_t seed) {
  // A non-zero mean and a spread > 1 exercise the centring and the variance.
  return {randn(c.rows * c.cols, seed, 2.0, 0.5), randn(c.cols, seed + 1, 0.1, 1.0),
          randn(c.cols, seed + 2, 0.1), randn(c.rows * c.cols, seed + 3)};
}

TEST(LayerNorm, ForwardMatchesReference) {
  std::uint64_t seed = 10;
  for (const Case& c : kCases) {
    const Inputs x = make_inputs(c, seed += 4);
    std::vector<float> out(c.rows * c.cols, kNaN), mean(c.rows, kNaN), rstd(c.rows, kNaN);
    auto out_ref = out, mean_ref = mean, rstd_ref = rstd;
    layernorm(cpu_ctx(), {.out = view_of(out, {c.rows, c.cols}),
                          .mean = view_of(mean, {c.rows}),
                          .rstd = view_of(rstd, {c.rows}),
                          .in = view_of(x.in, {c.rows, c.cols}),
                          .weight = view_of(x.weight, {c.cols}),
                          .bias = view_of(x.bias, {c.cols})});
    ref::layernorm_forward({.out = out_ref.data(),
                            .mean = mean_ref.data(),
                            .rstd = rstd_ref.data(),
                            .in = x.in.data(),
                            .weight = x.weight.data(),
                            .bias = x.bias.data(),
                            .rows = c.rows,
                            .cols = c.cols});
    EXPECT_TRUE(all_close(shape_name("layernorm out", c).c_str(), out, out_ref, kTol));
    EXPECT_TRUE(all_close(shape_name("layernorm mean", c).c_str(), mean, mean_ref, kTol));
    EXPECT_TRUE(all_close(shape_name("layernorm rstd", c).c_str(), rstd, rstd_ref, kTol));
  }
}

TEST(LayerNorm, BackwardMatchesReferenceAndAccumulates) {
  std::uint64_t seed = 1000;
  for (const Case& c : kCases) {
    const Inputs x = make_inputs(c, seed += 4);
    // Saved statistics from the reference forward, shared by both backward passes.
    std::vector<float> out(c.rows * c.cols), mean(c.rows), rstd(c.rows);
    ref::layernorm_forward({.out = out.data(),
                            .mean = mean.data(),
                            .rstd = rstd.data(),
                            .in = x.in.data(),
                            .weight = x.weight.data(),
                            .bias = x.bias.data(),
                            .rows = c.rows,
                            .cols = c.cols});
    // Every output accumulates: prefill with known values.
    auto d_in = randn(c.rows * c.cols, seed + 100);
    auto d_w = randn(c.cols, seed + 101);
    auto d_b = randn(c.cols, seed + 102);
    auto d_in_ref = d_in, d_w_ref = d_w, d_b_ref = d_b;
    layernorm_backward(cpu_ctx(), {.d_in = view_of(d_in, {c.rows, c.cols}),
                                   .d_weight = view_of(d_w, {c.cols}),
                                   .d_bias = view_of(d_b, {c.cols}),
                                   .d_out = view_of(x.d_out, {c.rows, c.cols}),
                                   .in = view_of(x.in, {c.rows, c.cols}),
                                   .weight = view_of(x.weight, {c.cols}),
                                   .mean = view_of(mean, {c.rows}),
                                   .rstd = view_of(rstd, {c.rows})});
    ref::layernorm_backward({.d_in = d_in_ref.data(),
                             .d_weight = d_w_ref.data(),
                             .d_bias = d_b_ref.data(),
                             .d_out = x.d_out.data(),
                             .in = x.in.data(),
                             .weight = x.weight.data(),
                             .mean = mean.data(),
                             .rstd = rstd.data(),
                             .rows = c.rows,
                             .cols = c.cols});
    EXPECT_TRUE(all_close(shape_name("layernorm d_in", c).c_str(), d_in, d_in_ref,
                          testing::layernorm_d_in_tol(kTol, rstd, x.d_out, x.weight)));
    EXPECT_TRUE(all_close(shape_name("layernorm d_weight", c).c_str(), d_w, d_w_ref, kTol));
    EXPECT_TRUE(all_close(shape_name("layernorm d_bias", c).c_str(), d_b, d_b_ref, kTol));
  }
}

// Rows go to threads and columns of the weight gradients to column blocks walked in row order,
// so 1 and 2 threads must give bitwise-identical results. On cuda (no thread count) the two runs
// check that a second call gives the same bits.
TEST(LayerNorm, BackwardIsIndependentOfThreadCount) {
  const Case c{67, 200};
  const Inputs x = make_inputs(c, 77);
  std::vector<float> out(c.rows * c.cols), mean(c.rows), rstd(c.rows);
  layernorm_forward(cpu_ctx(), {.out = testing::dev(out),
                                .mean = testing::dev(mean),
                                .rstd = testing::dev(rstd),
                                .in = testing::dev(x.in),
                                .weight = testing::dev(x.weight),
                                .bias = testing::dev(x.bias),
                                .rows = c.rows,
                                .cols = c.cols});
  std::vector<float> d_in[2], d_w[2], d_b[2];
  for (int t = 0; t < 2; ++t) {
    d_in[t].assign(c.rows * c.cols, 0.5f);
    d_w[t].assign(c.cols, 0.25f);
    d_b[t].assign(c.cols, -0.25f);
    layernorm_backward(cpu_ctx(t + 1), {.d_in = testing::dev(d_in[t]),
                                        .d_weight = testing::dev(d_w[t]),
                                        .d_bias = testing::dev(d_b[t]),
                                        .d_out = testing::dev(x.d_out),
                                        .in = testing::dev(x.in),
                                        .weight = testing::dev(x.weight),
                                        .mean = testing::dev(mean),
                                        .rstd = testing::dev(rstd),
                                        .rows = c.rows,
                                        .cols = c.cols});
  }
  EXPECT_TRUE(testing::all_equal("d_in 1 vs 2 threads", d_in[0], d_in[1]));
  EXPECT_TRUE(testing::all_equal("d_weight 1 vs 2 threads", d_w[0], d_w[1]));
  EXPECT_TRUE(testing::all_equal("d_bias 1 vs 2 threads", d_b[0], d_b[1]));
}

TEST(LayerNorm, RejectsBadArguments) {
  std::vector<float> buf(16, 1.0f);
  float* const d = testing::dev(buf);
  LayerNormForwardArgs args{
      .out = d, .mean = d, .rstd = d, .in = d, .weight = d, .bias = nullptr, .rows = 2, .cols = 2};
  EXPECT_THROW(layernorm_forward(cpu_ctx(), args), core::InvalidArgument);
  args.bias = d;
  args.cols = 0;
  EXPECT_THROW(layernorm_forward(cpu_ctx(), args), core::InvalidArgument);
  core::ExecContext cuda = cpu_ctx();
  cuda.device.kind = core::DeviceKind::kCuda;
  args.cols = 2;
  // Without CUDA in the build a CUDA context is Unavailable; with it, the raw entry points trust
  // their pointers (Dispatch.HostMemoryInACudaViewIsAClearError tests the typed views' check).
  if (!cuda_built()) {
    EXPECT_THROW(layernorm_forward(cuda, args), core::Unavailable);
  }
}

// Every view is checked before a pointer is read: the error names the op and the view.
TEST(LayerNorm, ViewsOfTheWrongDtypeShapeOrDeviceAreClearErrors) {
  const std::int64_t rows = 3, cols = 4;
  std::vector<float> in(rows * cols, 1.0f), out(rows * cols), w(cols, 1.0f), b(cols), mean(rows),
      rstd(rows);
  const std::vector<core::bf16> in16(rows * cols);
  const LayerNormViews ok{.out = view_of(out, {rows, cols}),
                          .mean = view_of(mean, {rows}),
                          .rstd = view_of(rstd, {rows}),
                          .in = view_of(in, {rows, cols}),
                          .weight = view_of(w, {cols}),
                          .bias = view_of(b, {cols})};
  auto error = [](const LayerNormViews& v) {
    return testing::invalid_argument_of([&] { layernorm(cpu_ctx(), v); });
  };
  EXPECT_EQ(error(ok), "no error");
  LayerNormViews v = ok;
  v.in = view_of(in16, {rows, cols});
  EXPECT_NE(error(v).find("layernorm: view `in` holds bf16, the op needs f32"), std::string::npos)
      << error(v);
  v = ok;
  v.mean = testing::view_claiming(mean, {rows - 1});
  EXPECT_NE(error(v).find("view `mean` has shape"), std::string::npos) << error(v);
  v = ok;
  v.bias = core::view(testing::dev(b), {cols}, testing::other_device());
  EXPECT_NE(error(v).find("view `bias` is on another device"), std::string::npos) << error(v);
  v = ok;
  v.weight = {};
  EXPECT_NE(error(v).find("view `weight` is empty"), std::string::npos) << error(v);
  v = ok;
  v.in = testing::view_claiming(in, {rows * cols});
  EXPECT_NE(error(v).find("view `in` must be 2-D"), std::string::npos) << error(v);
  LayerNormBackwardViews bv{.d_in = view_of(out, {rows, cols}),
                            .d_weight = view_of(w, {cols}),
                            .d_bias = view_of(b, {cols}),
                            .d_out = view_of(in, {rows, cols}),
                            .in = view_of(in, {rows, cols}),
                            .weight = view_of(w, {cols}),
                            .mean = view_of(mean, {rows}),
                            .rstd = testing::view_claiming(rstd, {rows, 1})};
  const std::string bwd = testing::invalid_argument_of([&] { layernorm_backward(cpu_ctx(), bv); });
  EXPECT_NE(bwd.find("layernorm_backward: view `rstd` has shape"), std::string::npos) << bwd;
}

// The reference backward in double against central differences of the reference forward, with
// loss = sum(w_up * out): d_out = w_up. mean and rstd are recomputed by every forward, so the
// differences see the paths through the statistics (terms 2 and 3).
TEST(LayerNormReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t rows = 3, cols = 5;
  auto in = randn<double>(rows * cols, 5, 1.5, 0.3);
  auto w = randn<double>(cols, 6, 0.3, 1.0);
  auto b = randn<double>(cols, 7);
  const auto d_out = randn<double>(rows * cols, 8);
  std::vector<double> out(rows * cols), mean(rows), rstd(rows);
  auto forward = [&] {
    ref::layernorm_forward<double>({.out = out.data(),
                                    .mean = mean.data(),
                                    .rstd = rstd.data(),
                                    .in = in.data(),
                                    .weight = w.data(),
                                    .bias = b.data(),
                                    .rows = rows,
                                    .cols = cols});
  };
  auto loss = [&] {
    forward();
    return testing::dot(d_out, out);
  };
  forward();
  std::vector<double> d_in(rows * cols, 0.0), d_w(cols, 0.0), d_b(cols, 0.0);
  ref::layernorm_backward<double>({.d_in = d_in.data(),
                                   .d_weight = d_w.data(),
                                   .d_bias = d_b.data(),
                                   .d_out = d_out.data(),
                                   .in = in.data(),
                                   .weight = w.data(),
                                   .mean = mean.data(),
                                   .rstd = rstd.data(),
                                   .rows = rows,
                                   .cols = cols});
  EXPECT_TRUE(all_close("layernorm d_in vs finite differences", d_in,
                        testing::numeric_grad(in, loss), testing::kFiniteDiffTol));
  EXPECT_TRUE(all_close("layernorm d_weight vs finite differences", d_w,
                        testing::numeric_grad(w, loss), testing::kFiniteDiffTol));
  EXPECT_TRUE(all_close("layernorm d_bias vs finite differences", d_b,
                        testing::numeric_grad(b, loss), testing::kFiniteDiffTol));
}

}  // namespace
}  // namespace trident::kernels
