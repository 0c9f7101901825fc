// Normal initialization against its reference (on the CPU exactly: the same Philox draw and one
// rounding; on cuda to one FP32 ulp: the device's double log, sqrt and cos are within 1-2 double
// ulp of libm's, which moves the FP32 rounding only when the value sits that close to a rounding
// boundary),
// and layout independence: tp shards along dim 0 and dim 1, and sub-ranges of a shard, reassemble
// the values of the unsplit parameter; the sample moments are those of N(0, stddev^2). Through the
// typed view; a bad view and a bad range are errors naming them.
#include "trident/kernels/init_normal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernel_test_util.h"

namespace trident::kernels {
namespace {

using testing::all_equal;

constexpr std::int64_t kRows = 24, kCols = 40;

std::vector<float> whole(double stddev) {
  std::vector<float> v(kRows * kCols, NAN);
  init_normal(testing::backend_ctx(), {.out = testing::view_of(v, {kRows, kCols}),
                                       .begin = 0,
                                       .seed = 3,
                                       .stream = 99,
                                       .stddev = stddev,
                                       .local_cols = kCols,
                                       .global_cols = kCols});
  return testing::fetch(v);
}

TEST(InitNormal, MatchesReferenceAndMoments) {
  const std::vector<float> got = whole(0.02);
  std::vector<float> want(got.size());
  ref::init_normal({.out = want.data(),
                    .begin = 0,
                    .end = kRows * kCols,
                    .seed = 3,
                    .stream = 99,
                    .stddev = 0.02,
                    .local_cols = kCols,
                    .global_cols = kCols});
  if (testing::on_cuda()) {
    EXPECT_TRUE(testing::all_close("init", got, want, {0.0, 0x1.0p-23}));
  } else {
    EXPECT_TRUE(all_equal("init", got, want));
  }
  double sum = 0, sq = 0;
  for (float x : got) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(got.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.004);  // ~5 standard errors of the mean
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.002);
}

TEST(InitNormal, ShardsReassembleTheWholeParameter) {
  const std::vector<float> ref = whole(1.0);
  const int tp = 4;
  for (int dim : {0, 1}) {
    std::vector<float> joined(ref.size());
    for (int r = 0; r < tp; ++r) {
      const std::int64_t rows = dim == 0 ? kRows / tp : kRows, cols = dim == 0 ? kCols : kCols / tp;
      std::vector<float> shard(rows * cols, NAN);
      // Two sub-ranges (as a ZeRO shard boundary would cut it).
      const std::int64_t cut = rows * cols / 3;
      for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, cut}, {cut, rows * cols}}) {
        init_normal(testing::backend_ctx(), {.out = testing::view_at(shard, b, {e - b}),
                                             .begin = b,
                                             .seed = 3,
                                             .stream = 99,
                                             .stddev = 1.0,
                                             .base = dim == 0 ? r * rows * cols : 0,
                                             .local_cols = cols,
                                             .global_cols = kCols,
                                             .col_offset = dim == 1 ? r * cols : 0});
      }
      testing::fetch(shard);
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        const std::int64_t row = i / cols + (dim == 0 ? r * rows : 0);
        const std::int64_t col = i % cols + (dim == 1 ? r * cols : 0);
        joined[row * kCols + col] = shard[i];
      }
    }
    EXPECT_TRUE(all_equal("reassembled", joined, ref)) << "split dim " << dim;
  }
}

TEST(InitNormal, ABadViewOrRangeIsAnError) {
  std::vector<float> v(8);
  std::vector<core::bf16> h(8);
  std::string e = testing::invalid_argument_of(
      [&] { init_normal(testing::backend_ctx(), {.out = testing::view_of(h, {8})}); });
  EXPECT_NE(e.find("init_normal: view `out` holds bf16, the op needs f32"), std::string::npos) << e;
  e = testing::invalid_argument_of(
      [&] { init_normal(testing::backend_ctx(), {.out = core::view<float>(nullptr, {8})}); });
  EXPECT_NE(e.find("init_normal: view `out` is empty"), std::string::npos) << e;
  e = testing::invalid_argument_of(
      [&] { init_normal(testing::backend_ctx(), {.out = testing::view_of(v, {8}), .begin = -1}); });
  EXPECT_NE(e.find("init_normal: bad range [-1, 7)"), std::string::npos) << e;
  // No elements: nothing to write, no memory needed.
  init_normal(testing::backend_ctx(), {.out = core::view<float>(nullptr, {0}), .begin = 5});
}

}  // namespace
}  // namespace trident::kernels
