// gemm_bf16, linear_forward_bf16 and linear_backward_bf16 (oneDNN bf16 matmul, FP32 accumulation)
// against the double-precision references, = / += semantics, scratch checks, thread safety of the
// primitive cache, and the mixed-precision error against the FP32 layer.
//
// Tolerances.
// - Against the reference on the same bf16 operands widened to FP32 (kTol, 1e-5 + 1e-5 |ref|): a
//   product of two bf16 values is exact in FP32 (8 + 8 significant bits), so the only error is FP32
//   accumulation, about sqrt(K) * 6e-8 * |a||b| with the data scaled so outputs are O(1); that is
//   below 3e-6 at K = 3072. d_weight sums `rows` products of O(1) terms, so its scale and its
//   absolute tolerance grow by sqrt(rows).
// - Against the FP32 layer on the unrounded operands (kMixedTol, 2e-2 + 1e-2 |ref|): rounding an
//   operand to bf16 moves it by up to 2^-9 (0.2%), uniformly, so each product term carries about
//   2^-9 * sqrt(2/3) = 0.16% relative error and a sum of K random terms of output scale 1 an
//   absolute error of about 0.0016-0.003 rms. The largest of ~2e5 outputs is ~5 sigma (0.013
//   measured), so the absolute part is 2e-2; the relative part is the usual BF16 1e-2.
// - On cuda the products are cuBLASLt's with BF16 operands and FP32 accumulation
//   (CUBLAS_COMPUTE_32F), the products of two bf16 values exact in FP32 as on the CPU: the same
//   budgets.
#include "trident/kernels/matmul_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/matmul.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;

constexpr Tol kTol{1e-5, 1e-5};
constexpr Tol kMixedTol{2e-2, 1e-2};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

std::vector<core::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<core::bf16> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = core::bf16::from_float(x[i]);
  return y;
}

std::vector<float> widen(const std::vector<core::bf16>& x) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i].to_float();
  return y;
}

std::vector<std::byte> scratch_for(std::int64_t bytes) {
  return std::vector<std::byte>(static_cast<std::size_t>(bytes));
}

struct GemmCase {
  std::int64_t m, n, k;
};

// Every transposition, beta 0 (NaN in C), 1 and 0.5, with and without the bias, strided operands,
// and operands at element offsets 0-3 into their buffers (only element-aligned, as inside a flat
// weight buffer).
TEST(GemmBf16, MatchesReferenceForAllTransposesBetasAndBias) {
  const GemmCase cases[] = {{1, 1, 1},    {3, 5, 7},    {17, 33, 9}, {64, 48, 80},
                            {1, 129, 31}, {100, 1, 50}, {31, 17, 1}, {96, 64, 768}};
  std::uint64_t seed = 1;
  std::int64_t case_index = 0;
  for (const GemmCase& gc : cases) {
    const std::int64_t off_a = case_index % 4, off_b = (case_index + 1) % 4,
                       off_c = (case_index + 2) % 4;
    ++case_index;
    for (Trans ta : {Trans::kNo, Trans::kYes}) {
      for (Trans tb : {Trans::kNo, Trans::kYes}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          for (bool with_bias : {false, true}) {
            // Leading dimensions 3 larger than needed, to exercise strided access.
            const std::int64_t a_rows = ta == Trans::kYes ? gc.k : gc.m;
            const std::int64_t a_cols = ta == Trans::kYes ? gc.m : gc.k;
            const std::int64_t b_rows = tb == Trans::kYes ? gc.n : gc.k;
            const std::int64_t b_cols = tb == Trans::kYes ? gc.k : gc.n;
            const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = gc.n + 3;
            const auto a = to_bf16(randn(off_a + a_rows * lda, seed++));
            const auto b =
                to_bf16(randn(off_b + b_rows * ldb, seed++, 1.0 / std::sqrt(double(gc.k))));
            const auto bias = randn(gc.n, seed++);
            auto c = randn(off_c + gc.m * ldc, seed++);
            if (beta == 0.0f) {  // beta == 0 must overwrite: garbage in C may not leak through
              for (std::int64_t i = 0; i < gc.m; ++i)
                for (std::int64_t j = 0; j < gc.n; ++j) c[off_c + i * ldc + j] = kNaN;
            }
            auto c_ref = c;
            GemmBf16Args args{.trans_a = ta,
                              .trans_b = tb,
                              .m = gc.m,
                              .n = gc.n,
                              .k = gc.k,
                              .a = testing::dev(a) + off_a,
                              .lda = lda,
                              .b = testing::dev(b) + off_b,
                              .ldb = ldb,
                              .bias = with_bias ? testing::dev(bias) : nullptr,
                              .beta = beta,
                              .c = testing::dev(c) + off_c,
                              .ldc = ldc};
            auto scratch = scratch_for(gemm_bf16_scratch_bytes(cpu_ctx(), args));
            args.scratch = testing::dev_span(scratch);
            gemm_bf16(cpu_ctx(), args);
            testing::fetch(c);
            // Reference: the widened operands through ref::gemm (double sums), then the bias.
            const auto a32 = widen(a), b32 = widen(b);
            ref::gemm({.trans_a = ta,
                       .trans_b = tb,
                       .m = gc.m,
                       .n = gc.n,
                       .k = gc.k,
                       .a = a32.data() + off_a,
                       .lda = lda,
                       .b = b32.data() + off_b,
                       .ldb = ldb,
                       .beta = beta,
                       .c = c_ref.data() + off_c,
                       .ldc = ldc});
            for (std::int64_t i = 0; with_bias && i < gc.m; ++i)
              for (std::int64_t j = 0; j < gc.n; ++j) c_ref[off_c + i * ldc + j] += bias[j];
            // The padding columns and the elements before C must stay untouched.
            for (std::int64_t i = 0; i < off_c + gc.m * ldc; ++i) {
              const std::int64_t j = (i - off_c) % ldc;
              if (i >= off_c && j < gc.n) continue;
              ASSERT_EQ(std::bit_cast<std::uint32_t>(c[i]), std::bit_cast<std::uint32_t>(c_ref[i]))
                  << "gemm_bf16 wrote outside C at element " << i << " of its buffer";
            }
            const std::string name = "gemm_bf16 C m=" + std::to_string(gc.m) +
                                     " n=" + std::to_string(gc.n) + " k=" + std::to_string(gc.k) +
                                     (ta == Trans::kYes ? " A^T" : " A") +
                                     (tb == Trans::kYes ? " B^T" : " B") +
                                     " beta=" + std::to_string(beta) + (with_bias ? " bias" : "");
            EXPECT_TRUE(all_close(name.c_str(), c, c_ref, kTol));
          }
        }
      }
    }
  }
}

TEST(GemmBf16, ZeroInnerDimensionScalesCAndAddsBias) {
  std::vector<float> c = {1.0f, -2.0f, 3.0f, kNaN};
  const std::vector<float> bias = {0.5f, 0.25f, 1.0f};
  gemm_bf16(cpu_ctx(), {.m = 1,
                        .n = 3,
                        .k = 0,
                        .lda = 1,
                        .ldb = 3,
                        .bias = testing::dev(bias),
                        .beta = 2.0f,
                        .c = testing::dev(c),
                        .ldc = 4});
  testing::fetch(c);
  EXPECT_EQ(c[0], 2.5f);
  EXPECT_EQ(c[1], -3.75f);
  EXPECT_EQ(c[2], 7.0f);
  EXPECT_TRUE(std::isnan(c[3]));  // outside the 1x3 matrix: untouched
  std::vector<float> z = {kNaN, kNaN};
  gemm_bf16(cpu_ctx(), {.m = 1, .n = 2, .k = 0, .beta = 0.0f, .c = testing::dev(z), .ldc = 2});
  testing::fetch(z);
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_EQ(z[1], 0.0f);
}

TEST(GemmBf16, RejectsBadArguments) {
  const std::vector<core::bf16> buf(64);
  std::vector<float> c(64);
  const GemmBf16Args good{.m = 4,
                          .n = 4,
                          .k = 4,
                          .a = testing::dev(buf),
                          .lda = 4,
                          .b = testing::dev(buf) + 16,
                          .ldb = 4,
                          .c = testing::dev(c),
                          .ldc = 4};
  auto scratch = scratch_for(gemm_bf16_scratch_bytes(cpu_ctx(), good));
  GemmBf16Args ok = good;
  ok.scratch = testing::dev_span(scratch);
  gemm_bf16(cpu_ctx(), ok);
  GemmBf16Args bad = ok;
  bad.m = -1;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
  bad = ok;
  bad.lda = 3;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
  bad = ok;
  bad.trans_b = Trans::kYes;
  bad.ldb = 2;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
  bad = ok;
  bad.ldc = 3;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
  bad = ok;
  bad.b = nullptr;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
  bad = ok;
  bad.c = nullptr;
  EXPECT_THROW(gemm_bf16(cpu_ctx(), bad), core::InvalidArgument);
}

// A product that needs working memory must be refused, naming the shortfall, when given less.
TEST(GemmBf16CpuOnly, RejectsTooSmallScratch) {
  TRIDENT_CPU_ONLY("oneDNN's scratch; CUDA takes cuBLASLt's workspace from the stream pool");
  const std::int64_t rows = 64, in_f = 768, out_f = 256;
  const std::vector<core::bf16> in(rows * in_f), w(out_f * in_f);
  std::vector<float> out(rows * out_f);
  GemmBf16Args args{.trans_b = Trans::kYes,
                    .m = rows,
                    .n = out_f,
                    .k = in_f,
                    .a = in.data(),
                    .lda = in_f,
                    .b = w.data(),
                    .ldb = in_f,
                    .c = out.data(),
                    .ldc = out_f};
  const std::int64_t need = gemm_bf16_scratch_bytes(cpu_ctx(), args);
  ASSERT_GT(need, 0) << "expected oneDNN to need scratch for this product; pick another shape";
  EXPECT_GE(linear_bf16_scratch_bytes(cpu_ctx(), rows, in_f, out_f), need);
  auto scratch = scratch_for(need);
  args.scratch = std::span<std::byte>(scratch).first(static_cast<std::size_t>(need - 1));
  try {
    gemm_bf16(cpu_ctx(), args);
    ADD_FAILURE() << "scratch of " << need - 1 << " bytes was accepted, " << need << " needed";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("scratch"), std::string::npos) << e.what();
  }
  args.scratch = scratch;
  gemm_bf16(cpu_ctx(), args);  // enough: runs
}

// Where the CPU has avx512_bf16, oneDNN must pick an optimized kernel (not a reference loop).
TEST(GemmBf16CpuOnly, UsesAnOptimizedImplementation) {
  TRIDENT_CPU_ONLY("oneDNN's choice of implementation");
  const GemmBf16Args args{
      .trans_b = Trans::kYes, .m = 256, .n = 768, .k = 768, .lda = 768, .ldb = 768, .ldc = 768};
  const std::string impl = gemm_bf16_implementation(cpu_ctx(), args);
  RecordProperty("onednn_bf16_impl", impl);
  if (detail::has_avx512bf16_convert()) {
    EXPECT_NE(impl.rfind("ref", 0), 0u) << "oneDNN runs a reference loop: " << impl;
  }
}

struct LinearCase {
  std::int64_t rows, in_f, out_f;
};
const LinearCase kLinearCases[] = {{1, 1, 1}, {3, 7, 5},     {17, 33, 65},
                                   {0, 8, 8}, {64, 96, 288}, {128, 768, 256}};

std::string linear_name(const char* tensor, const LinearCase& c) {
  return std::string(tensor) + " rows=" + std::to_string(c.rows) + " in=" + std::to_string(c.in_f) +
         " out=" + std::to_string(c.out_f);
}

struct LinearData {
  std::vector<float> in, weight, bias, d_out;  // FP32 originals
  std::vector<core::bf16> in16, weight16, d_out16;
};
LinearData make_linear_data(const LinearCase& c, std::uint64_t seed) {
  LinearData d;
  d.in = randn(c.rows * c.in_f, seed);
  d.weight = randn(c.out_f * c.in_f, seed + 1, 1.0 / std::sqrt(static_cast<double>(c.in_f)));
  d.bias = randn(c.out_f, seed + 2);
  d.d_out = randn(c.rows * c.out_f, seed + 3);
  d.in16 = to_bf16(d.in);
  d.weight16 = to_bf16(d.weight);
  d.d_out16 = to_bf16(d.d_out);
  return d;
}

TEST(LinearBf16, ForwardMatchesReference) {
  std::uint64_t seed = 100;
  for (const LinearCase& c : kLinearCases) {
    for (bool with_bias : {false, true}) {
      const LinearData d = make_linear_data(c, seed += 4);
      auto scratch = scratch_for(linear_bf16_scratch_bytes(cpu_ctx(), c.rows, c.in_f, c.out_f));
      std::vector<float> out(c.rows * c.out_f, kNaN), out_ref = out;
      LinearForwardBf16Args args{.out = out_ref.data(),
                                 .in = d.in16.data(),
                                 .weight = d.weight16.data(),
                                 .bias = with_bias ? d.bias.data() : nullptr,
                                 .rows = c.rows,
                                 .in_features = c.in_f,
                                 .out_features = c.out_f};
      ref::linear_forward_bf16(args);
      args.out = testing::dev(out);
      args.in = testing::dev(d.in16);
      args.weight = testing::dev(d.weight16);
      args.bias = with_bias ? testing::dev(d.bias) : nullptr;
      args.scratch = testing::dev_span(scratch);
      linear_forward_bf16(cpu_ctx(), args);
      const std::string suffix = with_bias ? " bias" : "";
      EXPECT_TRUE(all_close(linear_name("out", c).append(suffix).c_str(), out, out_ref, kTol));
    }
  }
}

TEST(LinearBf16, BackwardMatchesReferenceAndAccumulates) {
  std::uint64_t seed = 200;
  for (const LinearCase& c : kLinearCases) {
    const LinearData d = make_linear_data(c, seed += 4);
    auto scratch = scratch_for(linear_bf16_scratch_bytes(cpu_ctx(), c.rows, c.in_f, c.out_f));
    // d_in starts as garbage (=); d_weight and d_bias start non-zero (+=).
    std::vector<float> d_in(c.rows * c.in_f, kNaN), d_in_ref = d_in;
    std::vector<float> d_w = randn(c.out_f * c.in_f, seed + 7), d_w_ref = d_w;
    std::vector<float> d_b = randn(c.out_f, seed + 8), d_b_ref = d_b;
    LinearBackwardBf16Args args{.d_in = d_in.data(),
                                .d_weight = d_w.data(),
                                .d_bias = d_b.data(),
                                .d_out = d.d_out.data(),
                                .d_out_bf16 = d.d_out16.data(),
                                .in = d.in16.data(),
                                .weight = d.weight16.data(),
                                .rows = c.rows,
                                .in_features = c.in_f,
                                .out_features = c.out_f};
    LinearBackwardBf16Args on = args;  // this backend's copies
    on.d_in = testing::dev(d_in);
    on.d_weight = testing::dev(d_w);
    on.d_bias = testing::dev(d_b);
    on.d_out = testing::dev(d.d_out);
    on.d_out_bf16 = testing::dev(d.d_out16);
    on.in = testing::dev(d.in16);
    on.weight = testing::dev(d.weight16);
    on.scratch = testing::dev_span(scratch);
    linear_backward_bf16(cpu_ctx(), on);
    args.d_in = d_in_ref.data();
    args.d_weight = d_w_ref.data();
    args.d_bias = d_b_ref.data();
    ref::linear_backward_bf16(args);
    EXPECT_TRUE(all_close(linear_name("d_in", c).c_str(), d_in, d_in_ref, kTol));
    const Tol d_weight_tol{kTol.atol * std::sqrt(std::max(1.0, double(c.rows))), kTol.rtol};
    EXPECT_TRUE(all_close(linear_name("d_weight", c).c_str(), d_w, d_w_ref, d_weight_tol));
    EXPECT_TRUE(all_close(linear_name("d_bias", c).c_str(), d_b, d_b_ref, kTol));
  }
}

// d_in and d_bias are optional; d_weight alone must still be right.
TEST(LinearBf16, BackwardWithoutDataAndBiasGradients) {
  const LinearCase c{33, 40, 24};
  const LinearData d = make_linear_data(c, 300);
  auto scratch = scratch_for(linear_bf16_scratch_bytes(cpu_ctx(), c.rows, c.in_f, c.out_f));
  std::vector<float> d_w(c.out_f * c.in_f, 1.0f), d_w_ref = d_w;
  LinearBackwardBf16Args args{.d_weight = testing::dev(d_w),
                              .d_out_bf16 = testing::dev(d.d_out16),
                              .in = testing::dev(d.in16),
                              .weight = testing::dev(d.weight16),
                              .rows = c.rows,
                              .in_features = c.in_f,
                              .out_features = c.out_f,
                              .scratch = testing::dev_span(scratch)};
  linear_backward_bf16(cpu_ctx(), args);
  args.d_out_bf16 = d.d_out16.data();
  args.in = d.in16.data();
  args.weight = d.weight16.data();
  args.d_weight = d_w_ref.data();
  ref::linear_backward_bf16(args);
  EXPECT_TRUE(all_close("d_weight only", d_w, d_w_ref, kTol));
}

// The mixed-precision error budget: the bf16 layer against the FP32 layer on the unrounded
// operands, at a GPT-2 shape (K = 768 forward and d_in, K = rows for d_weight).
TEST(LinearBf16, StaysWithinBf16ErrorOfTheFp32Layer) {
  const LinearCase c{256, 768, 768};
  const LinearData d = make_linear_data(c, 400);
  auto scratch = scratch_for(linear_bf16_scratch_bytes(cpu_ctx(), c.rows, c.in_f, c.out_f));
  std::vector<float> out(c.rows * c.out_f), out_ref(out.size());
  linear_forward_bf16(cpu_ctx(), {.out = testing::dev(out),
                                  .in = testing::dev(d.in16),
                                  .weight = testing::dev(d.weight16),
                                  .bias = testing::dev(d.bias),
                                  .rows = c.rows,
                                  .in_features = c.in_f,
                                  .out_features = c.out_f,
                                  .scratch = testing::dev_span(scratch)});
  ref::linear_forward({.out = out_ref.data(),
                       .in = d.in.data(),
                       .weight = d.weight.data(),
                       .bias = d.bias.data(),
                       .rows = c.rows,
                       .in_features = c.in_f,
                       .out_features = c.out_f});
  EXPECT_TRUE(all_close("out vs fp32 layer", out, out_ref, kMixedTol));
  std::vector<float> d_in(c.rows * c.in_f), d_in_ref(d_in.size());
  // d_weight sums `rows` products of O(1) terms: scale it to O(1) before comparing.
  std::vector<float> d_w(c.out_f * c.in_f, 0.0f), d_w_ref = d_w;
  linear_backward_bf16(cpu_ctx(), {.d_in = testing::dev(d_in),
                                   .d_weight = testing::dev(d_w),
                                   .d_out_bf16 = testing::dev(d.d_out16),
                                   .in = testing::dev(d.in16),
                                   .weight = testing::dev(d.weight16),
                                   .rows = c.rows,
                                   .in_features = c.in_f,
                                   .out_features = c.out_f,
                                   .scratch = testing::dev_span(scratch)});
  ref::linear_backward({.d_in = d_in_ref.data(),
                        .d_weight = d_w_ref.data(),
                        .d_out = d.d_out.data(),
                        .in = d.in.data(),
                        .weight = d.weight.data(),
                        .rows = c.rows,
                        .in_features = c.in_f,
                        .out_features = c.out_f});
  EXPECT_TRUE(all_close("d_in vs fp32 layer", d_in, d_in_ref, kMixedTol));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.rows));
  testing::fetch(d_w);  // edited on the host below
  for (auto& v : d_w) v *= scale;
  for (auto& v : d_w_ref) v *= scale;
  EXPECT_TRUE(all_close("d_weight / sqrt(rows) vs fp32 layer", d_w, d_w_ref, kMixedTol));
}

// 1 and 2 oneDNN threads give results within FP32 accumulation error of each other (the cache
// keys primitives by thread count, so both run). On cuda (no thread count): two calls.
TEST(LinearBf16, ThreadCountsAgree) {
  const LinearCase c{96, 256, 192};
  const LinearData d = make_linear_data(c, 500);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2}) {
    auto scratch =
        scratch_for(linear_bf16_scratch_bytes(cpu_ctx(threads), c.rows, c.in_f, c.out_f));
    std::vector<float> out(c.rows * c.out_f);
    linear_forward_bf16(cpu_ctx(threads), {.out = testing::dev(out),
                                           .in = testing::dev(d.in16),
                                           .weight = testing::dev(d.weight16),
                                           .rows = c.rows,
                                           .in_features = c.in_f,
                                           .out_features = c.out_f,
                                           .scratch = testing::dev_span(scratch)});
    outs.push_back(testing::fetch(out));
  }
  EXPECT_TRUE(all_close("out threads=2 vs threads=1", outs[1], outs[0], kTol));
}

// Several threads creating and running primitives at once (shared cache), each with its own
// scratch: every result must match the reference.
TEST(LinearBf16CpuOnly, ConcurrentCallsShareTheCacheSafely) {
  TRIDENT_CPU_ONLY("oneDNN's primitive cache");
  constexpr int kThreads = 4;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, &failures] {
      for (int iter = 0; iter < 6; ++iter) {
        // Some shapes are shared between threads, some are not.
        const LinearCase c{8 + 8 * (iter % 3), 32 + 16 * ((t + iter) % 2), 24};
        const LinearData d = make_linear_data(c, 1000 + 10 * t + iter);
        auto scratch = scratch_for(linear_bf16_scratch_bytes(cpu_ctx(1), c.rows, c.in_f, c.out_f));
        std::vector<float> out(c.rows * c.out_f), out_ref(out.size());
        LinearForwardBf16Args args{.out = out.data(),
                                   .in = d.in16.data(),
                                   .weight = d.weight16.data(),
                                   .rows = c.rows,
                                   .in_features = c.in_f,
                                   .out_features = c.out_f,
                                   .scratch = scratch};
        linear_forward_bf16(cpu_ctx(1), args);
        args.out = out_ref.data();
        ref::linear_forward_bf16(args);
        for (std::size_t i = 0; i < out.size(); ++i) {
          if (!(std::abs(out[i] - out_ref[i]) <= 1e-5 + 1e-5 * std::abs(out_ref[i]))) {
            ++failures[t];
            break;
          }
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST(LinearBf16, RejectsBadArguments) {
  const std::vector<core::bf16> buf(64);
  const std::vector<float> d_out(64);
  std::vector<float> out(64);
  EXPECT_THROW(linear_forward_bf16(cpu_ctx(), {.out = testing::dev(out),
                                               .in = testing::dev(buf),
                                               .weight = nullptr,
                                               .rows = 2,
                                               .in_features = 4,
                                               .out_features = 4}),
               core::InvalidArgument);
  EXPECT_THROW(linear_forward_bf16(cpu_ctx(), {.out = testing::dev(out),
                                               .in = testing::dev(buf),
                                               .weight = testing::dev(buf),
                                               .rows = 2,
                                               .in_features = 0,
                                               .out_features = 4}),
               core::InvalidArgument);
  // d_bias needs the FP32 d_out.
  std::vector<float> d_w(16), d_b(4);
  EXPECT_THROW(linear_backward_bf16(cpu_ctx(), {.d_weight = testing::dev(d_w),
                                                .d_bias = testing::dev(d_b),
                                                .d_out_bf16 = testing::dev(buf),
                                                .in = testing::dev(buf),
                                                .weight = testing::dev(buf),
                                                .rows = 2,
                                                .in_features = 4,
                                                .out_features = 4}),
               core::InvalidArgument);
  EXPECT_THROW(linear_backward_bf16(cpu_ctx(), {.d_weight = nullptr,
                                                .d_out = testing::dev(d_out),
                                                .d_out_bf16 = testing::dev(buf),
                                                .in = testing::dev(buf),
                                                .weight = testing::dev(buf),
                                                .rows = 2,
                                                .in_features = 4,
                                                .out_features = 4}),
               core::InvalidArgument);
}

}  // namespace
}  // namespace trident::kernels
