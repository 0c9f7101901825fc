// gemm, linear_forward and linear_backward (oneDNN sgemm) against the double-precision reference,
// and finite-difference checks of the reference linear backward.
//
// Tolerance: |x - ref| <= 1e-5 + 1e-5 |ref|. FP32 products of K terms carry a rounding error of
// about sqrt(K) * 6e-8 * |a||b|; with the data scaled like a GPT layer (inputs ~1, weights ~0.02 or
// ~1/sqrt(K)) that stays below 1e-6 at K = 768 (and at K = 3072 of unit-scale terms, ~3e-6). The
// CUDA products are cuBLASLt's in true FP32 (CUBLAS_COMPUTE_32F, no TF32), summed in its own
// order with FMAs: the same FP32 error budget. Elements outside C are compared bitwise.
#include "trident/kernels/matmul.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "kernel_test_util.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;

constexpr Tol kTol{1e-5, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct GemmCase {
  std::int64_t m, n, k;
};

// Every transposition, alpha and beta (beta 0 with NaN in C), strided operands, and operands at
// element offsets 0-3 into their buffers (only 4-byte aligned, as inside a flat weight buffer).
TEST(Gemm, MatchesReferenceForAllTransposesAndScalars) {
  const GemmCase cases[] = {{1, 1, 1},    {3, 5, 7},    {17, 33, 9}, {64, 48, 80},
                            {1, 129, 31}, {100, 1, 50}, {31, 17, 1}, {2, 3, 3072}};
  const std::tuple<float, float> scalars[] = {{1.0f, 0.0f}, {0.5f, 1.5f}, {-2.0f, 1.0f}};
  std::uint64_t seed = 1;
  std::int64_t case_index = 0;
  for (const GemmCase& gc : cases) {
    const std::int64_t off_a = case_index % 4, off_b = (case_index + 1) % 4,
                       off_c = (case_index + 2) % 4;
    ++case_index;
    for (Trans ta : {Trans::kNo, Trans::kYes}) {
      for (Trans tb : {Trans::kNo, Trans::kYes}) {
        for (auto [alpha, beta] : scalars) {
          // Leading dimensions 3 larger than needed, to exercise strided access.
          const std::int64_t a_rows = ta == Trans::kYes ? gc.k : gc.m;
          const std::int64_t a_cols = ta == Trans::kYes ? gc.m : gc.k;
          const std::int64_t b_rows = tb == Trans::kYes ? gc.n : gc.k;
          const std::int64_t b_cols = tb == Trans::kYes ? gc.k : gc.n;
          const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = gc.n + 3;
          const auto a =
              randn(off_a + a_rows * lda, seed++, 1.0 / std::sqrt(static_cast<double>(gc.k)));
          const auto b = randn(off_b + b_rows * ldb, seed++);
          auto c = randn(off_c + gc.m * ldc, seed++);
          if (beta == 0.0f) {  // beta == 0 must overwrite: garbage in C may not leak through
            for (std::int64_t i = 0; i < gc.m; ++i)
              for (std::int64_t j = 0; j < gc.n; ++j) c[off_c + i * ldc + j] = kNaN;
          }
          auto c_ref = c;
          GemmArgs args{.trans_a = ta,
                        .trans_b = tb,
                        .m = gc.m,
                        .n = gc.n,
                        .k = gc.k,
                        .alpha = alpha,
                        .a = testing::dev(a) + off_a,
                        .lda = lda,
                        .b = testing::dev(b) + off_b,
                        .ldb = ldb,
                        .beta = beta,
                        .c = testing::dev(c) + off_c,
                        .ldc = ldc};
          gemm(cpu_ctx(), args);
          testing::fetch(c);
          args.a = a.data() + off_a;
          args.b = b.data() + off_b;
          args.c = c_ref.data() + off_c;
          ref::gemm(args);
          // Compare whole rows including the padding columns (which must stay untouched), and
          // the elements before C.
          for (std::int64_t i = 0; i < off_c + gc.m * ldc; ++i) {
            const std::int64_t j = (i - off_c) % ldc;
            if (i >= off_c && j < gc.n) continue;
            ASSERT_EQ(std::bit_cast<std::uint32_t>(c[i]), std::bit_cast<std::uint32_t>(c_ref[i]))
                << "gemm wrote outside C at element " << i << " of its buffer";
          }
          const std::string name =
              "gemm C m=" + std::to_string(gc.m) + " n=" + std::to_string(gc.n) +
              " k=" + std::to_string(gc.k) + (ta == Trans::kYes ? " A^T" : " A") +
              (tb == Trans::kYes ? " B^T" : " B") + " alpha=" + std::to_string(alpha) +
              " beta=" + std::to_string(beta);
          EXPECT_TRUE(all_close(name.c_str(), c, c_ref, kTol));
        }
      }
    }
  }
}

TEST(Gemm, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1.0f, -2.0f, 3.0f, kNaN};
  gemm(cpu_ctx(), {.m = 1,
                   .n = 3,
                   .k = 0,
                   .a = nullptr,
                   .lda = 1,
                   .b = nullptr,
                   .ldb = 3,
                   .beta = 2.0f,
                   .c = testing::dev(c),
                   .ldc = 4});
  testing::fetch(c);
  EXPECT_EQ(c[0], 2.0f);
  EXPECT_EQ(c[1], -4.0f);
  EXPECT_EQ(c[2], 6.0f);
  EXPECT_TRUE(std::isnan(c[3]));  // outside the 1x3 matrix: untouched
  std::vector<float> z = {kNaN, kNaN};
  gemm(cpu_ctx(), {.m = 1, .n = 2, .k = 0, .beta = 0.0f, .c = testing::dev(z), .ldc = 2});
  testing::fetch(z);
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_EQ(z[1], 0.0f);
}

TEST(Gemm, RejectsBadArguments) {
  std::vector<float> buf(64, 1.0f);
  float* const d = testing::dev(buf);
  GemmArgs good{
      .m = 4, .n = 4, .k = 4, .a = d, .lda = 4, .b = d + 16, .ldb = 4, .c = d + 32, .ldc = 4};
  GemmArgs bad = good;
  bad.m = -1;
  EXPECT_THROW(gemm(cpu_ctx(), bad), core::InvalidArgument);
  bad = good;
  bad.lda = 3;
  try {
    gemm(cpu_ctx(), bad);
    ADD_FAILURE() << "lda < k was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lda"), std::string::npos) << e.what();
  }
  bad = good;
  bad.trans_b = Trans::kYes;
  bad.ldb = 2;
  EXPECT_THROW(gemm(cpu_ctx(), bad), core::InvalidArgument);
  bad = good;
  bad.c = nullptr;
  EXPECT_THROW(gemm(cpu_ctx(), bad), core::InvalidArgument);
  core::ExecContext cuda = cpu_ctx();
  cuda.device.kind = core::DeviceKind::kCuda;
  // Unavailable without CUDA in the build (with it, see
  // Dispatch.HostMemoryInACudaViewIsAClearError).
  if (!cuda_built()) {
    EXPECT_THROW(gemm(cuda, good), core::Unavailable);
  }
}

struct LinearCase {
  std::int64_t rows, in, out;
};
// 1, odd sizes, sizes that are not multiples of 16, and a GPT-2 small layer (rows=256, C=768).
const LinearCase kLinearCases[] = {{1, 1, 1},    {1, 7, 5},     {3, 17, 33},
                                   {13, 50, 23}, {65, 31, 130}, {256, 768, 768}};

TEST(Linear, ForwardMatchesReference) {
  std::uint64_t seed = 100;
  for (const LinearCase& lc : kLinearCases) {
    for (bool with_bias : {true, false}) {
      const auto in = randn(lc.rows * lc.in, seed++);
      const auto w = randn(lc.out * lc.in, seed++, 0.02);
      const auto bias = randn(lc.out, seed++, 0.1);
      std::vector<float> out(lc.rows * lc.out, kNaN), out_ref(lc.rows * lc.out, kNaN);
      LinearForwardArgs args{.out = out_ref.data(),
                             .in = in.data(),
                             .weight = w.data(),
                             .bias = with_bias ? bias.data() : nullptr,
                             .rows = lc.rows,
                             .in_features = lc.in,
                             .out_features = lc.out};
      ref::linear_forward(args);
      args.out = testing::dev(out);
      args.in = testing::dev(in);
      args.weight = testing::dev(w);
      args.bias = with_bias ? testing::dev(bias) : nullptr;
      linear_forward(cpu_ctx(), args);
      const std::string name = "linear_forward out rows=" + std::to_string(lc.rows) +
                               " in=" + std::to_string(lc.in) + " out=" + std::to_string(lc.out) +
                               (with_bias ? " bias" : " no bias");
      EXPECT_TRUE(all_close(name.c_str(), out, out_ref, kTol));
    }
  }
}

TEST(Linear, BackwardMatchesReferenceWithAccumulation) {
  std::uint64_t seed = 200;
  for (const LinearCase& lc : kLinearCases) {
    for (bool optional_outputs : {true, false}) {
      const auto in = randn(lc.rows * lc.in, seed++);
      const auto w = randn(lc.out * lc.in, seed++, 0.02);
      const auto d_out = randn(lc.rows * lc.out, seed++, 0.1);
      // d_in is overwritten (prefilled with NaN), d_weight and d_bias accumulate (prefilled).
      std::vector<float> d_in(lc.rows * lc.in, kNaN);
      auto d_w = randn(lc.out * lc.in, seed++);
      auto d_b = randn(lc.out, seed++);
      auto d_in_ref = d_in, d_w_ref = d_w, d_b_ref = d_b;
      LinearBackwardArgs args{.d_in = optional_outputs ? d_in_ref.data() : nullptr,
                              .d_weight = d_w_ref.data(),
                              .d_bias = optional_outputs ? d_b_ref.data() : nullptr,
                              .d_out = d_out.data(),
                              .in = in.data(),
                              .weight = w.data(),
                              .rows = lc.rows,
                              .in_features = lc.in,
                              .out_features = lc.out};
      ref::linear_backward(args);
      args.d_in = optional_outputs ? testing::dev(d_in) : nullptr;
      args.d_weight = testing::dev(d_w);
      args.d_bias = optional_outputs ? testing::dev(d_b) : nullptr;
      args.d_out = testing::dev(d_out);
      args.in = testing::dev(in);
      args.weight = testing::dev(w);
      linear_backward(cpu_ctx(), args);
      const std::string shape = " rows=" + std::to_string(lc.rows) +
                                " in=" + std::to_string(lc.in) + " out=" + std::to_string(lc.out);
      EXPECT_TRUE(all_close(("linear_backward d_weight" + shape).c_str(), d_w, d_w_ref, kTol));
      if (optional_outputs) {
        EXPECT_TRUE(all_close(("linear_backward d_in" + shape).c_str(), d_in, d_in_ref, kTol));
        EXPECT_TRUE(all_close(("linear_backward d_bias" + shape).c_str(), d_b, d_b_ref, kTol));
      } else {  // skipped outputs stay untouched
        for (float x : d_in) ASSERT_TRUE(std::isnan(x)) << "d_in written although null";
        EXPECT_TRUE(testing::all_equal("d_bias untouched", d_b, d_b_ref));
      }
    }
  }
}

// d_bias is a column-parallel reduction walked in row order: bitwise equal for 1 and 2 threads.
// On cuda (no thread count) the two runs check that a second call gives the same bits.
TEST(Linear, BiasGradientIsIndependentOfThreadCount) {
  const std::int64_t rows = 301, in = 40, out = 1030;
  const auto x = randn(rows * in, 1), w = randn(out * in, 2, 0.02), d_out = randn(rows * out, 3);
  std::vector<float> d_b[2], d_w(out * in);
  for (int t = 0; t < 2; ++t) {
    d_b[t].assign(out, 0.125f);
    linear_backward(cpu_ctx(t + 1), {.d_weight = testing::dev(d_w),
                                     .d_bias = testing::dev(d_b[t]),
                                     .d_out = testing::dev(d_out),
                                     .in = testing::dev(x),
                                     .weight = testing::dev(w),
                                     .rows = rows,
                                     .in_features = in,
                                     .out_features = out});
  }
  EXPECT_TRUE(testing::all_equal("d_bias 1 vs 2 threads", d_b[0], d_b[1]));
}

TEST(Linear, ZeroRowsIsANoOp) {
  std::vector<float> w(6, 1.0f), d_w(6, 2.0f);
  linear_forward(cpu_ctx(), {.out = nullptr,
                             .in = nullptr,
                             .weight = testing::dev(w),
                             .rows = 0,
                             .in_features = 3,
                             .out_features = 2});
  linear_backward(cpu_ctx(), {.d_weight = testing::dev(d_w),
                              .weight = testing::dev(w),
                              .rows = 0,
                              .in_features = 3,
                              .out_features = 2});
  for (float x : d_w) EXPECT_EQ(x, 2.0f);
}

TEST(Linear, RejectsBadArguments) {
  std::vector<float> buf(16, 1.0f);
  EXPECT_THROW(linear_forward(cpu_ctx(), {.out = testing::dev(buf),
                                          .in = testing::dev(buf),
                                          .weight = nullptr,
                                          .rows = 2,
                                          .in_features = 2,
                                          .out_features = 2}),
               core::InvalidArgument);
  EXPECT_THROW(linear_forward(cpu_ctx(), {.out = testing::dev(buf),
                                          .in = testing::dev(buf),
                                          .weight = testing::dev(buf),
                                          .rows = 2,
                                          .in_features = 0,
                                          .out_features = 2}),
               core::InvalidArgument);
  EXPECT_THROW(linear_backward(cpu_ctx(), {.d_weight = nullptr,
                                           .d_out = testing::dev(buf),
                                           .in = testing::dev(buf),
                                           .weight = testing::dev(buf),
                                           .rows = 2,
                                           .in_features = 2,
                                           .out_features = 2}),
               core::InvalidArgument);
}

// The reference backward (in double) against central differences of the reference forward, with
// loss = sum(w_up * out) so that d_out = w_up.
TEST(LinearReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t rows = 3, I = 4, O = 5;
  auto in = randn<double>(rows * I, 1);
  auto w = randn<double>(O * I, 2);
  auto bias = randn<double>(O, 3);
  const auto d_out = randn<double>(rows * O, 4);
  std::vector<double> out(rows * O);
  auto loss = [&] {
    ref::linear_forward<double>({.out = out.data(),
                                 .in = in.data(),
                                 .weight = w.data(),
                                 .bias = bias.data(),
                                 .rows = rows,
                                 .in_features = I,
                                 .out_features = O});
    return testing::dot(d_out, out);
  };
  std::vector<double> d_in(rows * I), d_w(O * I, 0.0), d_b(O, 0.0);
  ref::linear_backward<double>({.d_in = d_in.data(),
                                .d_weight = d_w.data(),
                                .d_bias = d_b.data(),
                                .d_out = d_out.data(),
                                .in = in.data(),
                                .weight = w.data(),
                                .rows = rows,
                                .in_features = I,
                                .out_features = O});
  EXPECT_TRUE(all_close("d_in vs finite differences", d_in, testing::numeric_grad(in, loss),
                        testing::kFiniteDiffTol));
  EXPECT_TRUE(all_close("d_weight vs finite differences", d_w, testing::numeric_grad(w, loss),
                        testing::kFiniteDiffTol));
  EXPECT_TRUE(all_close("d_bias vs finite differences", d_b, testing::numeric_grad(bias, loss),
                        testing::kFiniteDiffTol));
}

}  // namespace
}  // namespace trident::kernels
