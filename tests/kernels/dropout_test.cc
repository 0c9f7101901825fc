// Hidden dropout against its double-precision reference: the kept fraction, the scale, in-place
// use, thread-count independence, and that the mask depends only on the global element index (a
// block of rows at first_row = k draws what rows k.. of the whole buffer draw).
//
// Tolerance: |x - ref| <= 1e-7 |ref| (one FP32 rounding of the product in the kernel; the
// reference rounds the double product once). The CUDA kernel draws the CPU's Philox masks and
// forms the same single product (nothing for nvcc to contract): the same bits as the CPU's.
#include "trident/kernels/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/cpu_util.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::randn;

constexpr testing::Tol kTol{0.0, 1.2e-7};

// The CPU bodies draw four decisions per Philox block in a vectorized loop over whole blocks,
// with the partial blocks at the ends one at a time (cpu_util.h): every decision must be
// dropout_keep's, for every probability (including the ends of the range), for runs that start
// and end at every offset inside a block, and for indices with high bits set.
TEST(DropoutDecisionCpuOnly, VectorizedRunsAreDropoutKeep) {
  TRIDENT_CPU_ONLY("the CPU bodies' vectorized decisions (cpu_util.h)");
  const float ps[] = {
      0.0f, 1e-30f, 1e-9f, 0.1f, 0.3f, 1.0f / 3.0f, 0.5f, 0.9f, std::nextafter(1.0f, 0.0f)};
  std::int64_t checked = 0, kept = 0;
  std::vector<float> keep(80);
  for (float p : ps) {
    const std::uint64_t threshold = detail::dropout_threshold(p);
    for (std::uint64_t seed : {1ull, 1234ull, 0xfedcba9876543210ull}) {
      for (std::uint64_t i = 0; i < 200; ++i) {
        const std::uint64_t first = (i * 0x9e3779b97f4a7c15ull ^ (i << 40)) + i % 4;
        const std::int64_t n = static_cast<std::int64_t>(i % 80);
        detail::dropout_keep_run(seed, 7, first, n, threshold, keep.data());
        for (std::int64_t j = 0; j < n; ++j) {
          const std::uint64_t index = first + static_cast<std::uint64_t>(j);
          const bool want = dropout_keep(seed, 7, index, p);
          ASSERT_EQ(keep[static_cast<std::size_t>(j)] != 0.0f, want)
              << "p=" << p << " seed=" << seed << " index=" << index;
          ASSERT_EQ(detail::dropout_keep_bits(seed, 7, index, threshold), want);
          ++checked;
          kept += want;
        }
      }
    }
  }
  EXPECT_EQ(checked, 9 * 3 * (200 / 80 * (79 * 80 / 2) + (39 * 40 / 2)));
  EXPECT_GT(kept, 0);
}

// The four words of a block are four decisions: over many elements the kept fraction is 1 - p
// within 5 standard deviations, and neighbours in a block are not correlated (the fraction of
// pairs both kept is (1 - p)^2).
TEST(DropoutDecisionCpuOnly, FourPerBlockKeepOneMinusPIndependently) {
  TRIDENT_CPU_ONLY("the CPU bodies' vectorized decisions (cpu_util.h)");
  const std::int64_t n = 1 << 20;
  std::vector<float> keep(static_cast<std::size_t>(n));
  for (float p : {0.1f, 0.5f}) {
    detail::dropout_keep_run(42, 3, 0, n, detail::dropout_threshold(p), keep.data());
    double k = 0, pairs = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      k += keep[static_cast<std::size_t>(j)];
      if (j % 2 == 0)
        pairs += keep[static_cast<std::size_t>(j)] * keep[static_cast<std::size_t>(j + 1)];
    }
    const double q = 1.0 - p, sd = std::sqrt(p * q / static_cast<double>(n));
    EXPECT_NEAR(k / static_cast<double>(n), q, 5 * sd) << p;
    const double m = static_cast<double>(n / 2), q2 = q * q;
    EXPECT_NEAR(pairs / m, q2, 5 * std::sqrt(q2 * (1 - q2) / m)) << p;
  }
}

TEST(HiddenDropout, MatchesReferenceAndKeepsOneMinusP) {
  const std::int64_t rows = 37, cols = 129;
  for (float p : {0.0f, 0.1f, 0.5f}) {
    const std::vector<float> in = randn(rows * cols, 3);
    std::vector<float> out(in.size()), want(in.size());
    HiddenDropoutArgs args{.out = out.data(),
                           .in = in.data(),
                           .rows = rows,
                           .cols = cols,
                           .first_row = 11,
                           .p = p,
                           .seed = 5,
                           .stream = 77};
    hidden_dropout(testing::backend_ctx(), {.out = testing::view_of(out, {rows, cols}),
                                            .in = testing::view_of(in, {rows, cols}),
                                            .first_row = 11,
                                            .p = p,
                                            .seed = 5,
                                            .stream = 77});
    args.out = want.data();
    ref::hidden_dropout(args);
    EXPECT_TRUE(all_close("out", out, want, kTol)) << "p=" << p;
    std::int64_t kept = 0;
    for (float v : out) kept += v != 0.0f;
    const double frac = static_cast<double>(kept) / static_cast<double>(out.size());
    EXPECT_NEAR(frac, 1.0 - p, 0.02) << "p=" << p;
  }
}

// On cuda (no thread count) the two runs check that a second call gives the same bits.
TEST(HiddenDropout, InPlaceThreadsAndGlobalIndex) {
  const std::int64_t rows = 16, cols = 40;
  const std::vector<float> in = randn(rows * cols, 4);
  std::vector<float> one(in.size(), NAN), many(in.size(), NAN), inplace = in;
  HiddenDropoutArgs args{.out = testing::dev(one),
                         .in = testing::dev(in),
                         .rows = rows,
                         .cols = cols,
                         .first_row = 0,
                         .p = 0.3f,
                         .seed = 9,
                         .stream = 2};
  core::ExecContext ctx1 = testing::backend_ctx();
  ctx1.num_threads = 1;
  hidden_dropout(ctx1, args);
  core::ExecContext ctx3 = testing::backend_ctx();
  ctx3.num_threads = 3;
  args.out = testing::dev(many);
  hidden_dropout(ctx3, args);
  EXPECT_TRUE(all_equal("threads", many, one));
  args.out = testing::dev(inplace);
  args.in = testing::dev(inplace);
  hidden_dropout(ctx3, args);
  EXPECT_TRUE(all_equal("in place", inplace, one));
  // Rows 5.. on their own, keyed by first_row = 5: the same values as rows 5.. of the whole.
  std::vector<float> tail(static_cast<std::size_t>((rows - 5) * cols), NAN);
  hidden_dropout(ctx3, {.out = testing::dev(tail),
                        .in = testing::dev(in) + 5 * cols,
                        .rows = rows - 5,
                        .cols = cols,
                        .first_row = 5,
                        .p = 0.3f,
                        .seed = 9,
                        .stream = 2});
  EXPECT_TRUE(all_equal("block", tail, std::vector<float>(one.begin() + 5 * cols, one.end())));
}

TEST(HiddenDropout, ViewsOfTheWrongShapeAreClearErrors) {
  std::vector<float> x(12);
  const std::string e = testing::invalid_argument_of([&] {
    hidden_dropout(
        testing::backend_ctx(),
        {.out = testing::view_of(x, {4, 3}), .in = testing::view_of(x, {3, 4}), .p = 0.5f});
  });
  EXPECT_NE(e.find("hidden_dropout: view `out` has shape (4, 3), the op needs (3, 4)"),
            std::string::npos)
      << e;
}

TEST(HiddenDropout, RejectsPOfOne) {
  const std::vector<float> x(1, 1.0f);
  EXPECT_THROW(
      hidden_dropout(
          testing::backend_ctx(),
          {.out = testing::dev(x), .in = testing::dev(x), .rows = 1, .cols = 1, .p = 1.0f}),
      core::InvalidArgument);
}

}  // namespace
}  // namespace trident::kernels
