// fill, copy and overflow_count against their references: bitwise for fill and copy (no
// arithmetic), exact counts for overflow_count, over sizes around the vector widths and thread
// splits, with NaN, infinities, subnormals and values on the threshold; through the typed views,
// and the raw entry points' own checks (overlap, null, negative sizes: kernels/dispatch.h). Exact
// on every backend (no arithmetic; a count is a count). The outputs sit one element into their
// buffers, so their addresses are only 4-byte aligned.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/core/error.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/overflow.h"

namespace trident::kernels {
namespace {

using testing::randn;

// Around the vector widths and thread splits; the last is past the CUDA overflow count's grid of
// 4096 x 256 threads (its grid-stride loop wraps).
constexpr std::int64_t kSizes[] = {0, 1, 7, 16, 17, 1000, 100003};
constexpr std::int64_t kWrap = (std::int64_t{1} << 20) + 4099;

core::ExecContext ctx_with(int threads) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  }
  return true;
}

TEST(Fill, MatchesReferenceBitwise) {
  for (int threads : {1, 3}) {
    for (std::int64_t n : kSizes) {
      for (float value : {0.0f, -0.0f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> fast = randn(n + 2, 5), slow = fast;  // the guard elements stay
        fill(ctx_with(threads), {.out = testing::view_at(fast, 1, {n}), .value = value});
        ref::fill({.out = slow.data() + 1, .value = value, .n = n});
        EXPECT_TRUE(same_bits(testing::fetch(fast), slow)) << "n=" << n << " value=" << value;
      }
    }
  }
}

TEST(Copy, MatchesReferenceBitwise) {
  for (int threads : {1, 3}) {
    for (std::int64_t n : kSizes) {
      std::vector<float> in = randn(n, 9);
      if (n > 3) {
        in[1] = std::numeric_limits<float>::infinity();
        in[2] = std::numeric_limits<float>::denorm_min();
        in[3] = -0.0f;
      }
      std::vector<float> fast = randn(n + 2, 6), slow = fast;
      copy(ctx_with(threads),
           {.out = testing::view_at(fast, 1, {n}), .in = testing::view_of(in, {n})});
      ref::copy({.out = slow.data() + 1, .in = in.data(), .n = n});
      EXPECT_TRUE(same_bits(testing::fetch(fast), slow)) << "n=" << n;
    }
  }
}

// A block of columns between matrices of other widths (Ulysses' head packing): bitwise as the
// reference, the rest of out untouched; ranges outside a matrix are refused.
TEST(CopyColumns, MatchesReferenceBitwise) {
  for (int threads : {1, 3}) {
    for (auto [rows, in_width, in_col, out_width, out_col, cols] :
         {std::array<std::int64_t, 6>{5, 12, 4, 6, 0, 6},
          std::array<std::int64_t, 6>{1, 3, 0, 9, 6, 3},
          std::array<std::int64_t, 6>{301, 24, 8, 40, 17, 16},
          std::array<std::int64_t, 6>{0, 4, 0, 4, 0, 4},
          std::array<std::int64_t, 6>{7, 4, 2, 4, 1, 0}}) {
      const std::vector<float> in = randn(rows * in_width, 11);
      std::vector<float> fast = randn(rows * out_width, 12), slow = fast;
      copy_columns(ctx_with(threads), {.out = testing::view_of(fast, {rows, out_width}),
                                       .in = testing::view_of(in, {rows, in_width}),
                                       .out_col = out_col,
                                       .in_col = in_col,
                                       .cols = cols});
      ref::copy_columns({.out = slow.data(),
                         .in = in.data(),
                         .rows = rows,
                         .cols = cols,
                         .out_width = out_width,
                         .out_col = out_col,
                         .in_width = in_width,
                         .in_col = in_col});
      EXPECT_TRUE(same_bits(testing::fetch(fast), slow)) << rows << " x " << cols;
      if (rows > 0 && cols > 0) {  // the reference really copied
        EXPECT_EQ(slow[static_cast<std::size_t>(out_col)], in[static_cast<std::size_t>(in_col)]);
      }
    }
  }
  std::vector<float> a(12), b(12);
  EXPECT_THROW(copy_columns(ctx_with(1), {.out = testing::view_of(a, {3, 4}),
                                          .in = testing::view_of(b, {3, 4}),
                                          .out_col = 2,
                                          .cols = 3}),
               core::InvalidArgument);
  EXPECT_THROW(copy_columns(ctx_with(1), {.out = testing::view_of(a, {3, 4}),
                                          .in = testing::view_of(b, {2, 6}),
                                          .cols = 2}),
               core::InvalidArgument);
}

TEST(Copy, RejectsOverlapAndNull) {
  std::vector<float> buf(10);
  float* const dev = testing::dev(buf);
  EXPECT_THROW(copy(ctx_with(1), {.out = dev + 1, .in = dev, .n = 5}), core::InvalidArgument);
  EXPECT_THROW(copy(ctx_with(1), {.out = dev, .in = dev + 4, .n = 5}), core::InvalidArgument);
  EXPECT_THROW(copy(ctx_with(1), {.out = nullptr, .in = dev, .n = 5}), core::InvalidArgument);
  EXPECT_THROW(fill(ctx_with(1), {.out = dev, .n = -1}), core::InvalidArgument);
  copy(ctx_with(1), {.out = dev, .in = dev + 5, .n = 5});  // adjacent, not overlapping
}

TEST(OverflowCount, MatchesReferenceWithSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int threads : {1, 3}) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{16},
                           std::int64_t{17}, std::int64_t{1000}, std::int64_t{100003}, kWrap}) {
      std::vector<float> x = randn(n, 11, 100.0);
      // Specials at a few positions, spread so that they fall in different thread ranges.
      const float specials[] = {inf, -inf, nan, 65504.0f, -65504.0f, 65505.0f, 1e-40f};
      for (std::size_t k = 0; k < std::size(specials) && static_cast<std::int64_t>(k) < n; ++k) {
        x[static_cast<std::size_t>((static_cast<std::int64_t>(k) * 7919) % n)] = specials[k];
      }
      for (float threshold : {0.0f, 150.0f, 65504.0f, inf}) {
        const OverflowCountArgs args{.x = x.data(), .threshold = threshold, .n = n};
        EXPECT_EQ(overflow_count(ctx_with(threads),
                                 {.x = testing::view_of(x, {n}), .threshold = threshold}),
                  ref::overflow_count(args))
            << "n=" << n << " threshold=" << threshold << " threads=" << threads;
      }
    }
  }
}

// Closed forms: at threshold +inf only NaNs count; at 65504 (FP16 max) the values above it and
// the infinities do, 65504 itself does not.
TEST(OverflowCount, ClosedForms) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, inf, -inf, std::nanf(""), 65504.0f, 65520.0f, -7e4f, 0.0f};
  const auto count = [&](float t) {
    return overflow_count(ctx_with(2), {.x = testing::view_of(x, {2, 4}), .threshold = t});
  };
  EXPECT_EQ(count(inf), 1);
  EXPECT_EQ(count(65504.0f), 5);
  EXPECT_EQ(count(0.0f), 7);
  EXPECT_THROW(count(-1.0f), core::InvalidArgument);
  const std::vector<core::bf16> h(8);
  const std::string e = testing::invalid_argument_of(
      [&] { (void)overflow_count(ctx_with(2), {.x = testing::view_of(h, {8}), .threshold = 1}); });
  EXPECT_NE(e.find("overflow_count: view `x` holds bf16, the op needs f32"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace trident::kernels
