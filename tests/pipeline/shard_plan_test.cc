// ZeRO shard plans and gradient buckets: property tests over many sizes.
#include "trident/parallel/shard_plan.h"

#include <gtest/gtest.h>

#include <random>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

TEST(ShardPlan, DisjointCoveringAligned) {
  for (std::int64_t n : {0, 1, 7, 16, 17, 1000, 12345}) {
    for (int dp = 1; dp <= 8; ++dp) {
      for (std::int64_t align : {1, 16, 64}) {
        const ShardPlan p = build_shard_plan(n, dp, align);
        ASSERT_GE(p.numel_padded, n);
        ASSERT_LT(p.numel_padded - n, dp * align);
        std::int64_t covered = 0;
        for (int r = 0; r < dp; ++r) {
          const Range s = p.shard(r);
          EXPECT_EQ(s.begin, covered) << "shards must tile the buffer";
          EXPECT_EQ(s.begin % align, 0);
          covered = s.end;
        }
        EXPECT_EQ(covered, p.numel_padded);
      }
    }
  }
}

TEST(ShardPlan, EveryRangeReassemblesFromItsPieces) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 5000);
    const int dp = 1 + static_cast<int>(rng() % 7);
    const ShardPlan p = build_shard_plan(n, dp, 16);
    const std::int64_t a = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(n));
    const std::int64_t b =
        a + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(n - a + 1));
    const auto counts = p.split({a, b});
    std::int64_t pos = a, total = 0;
    for (int r = 0; r < dp; ++r) {
      const Range o = p.owned({a, b}, r);
      EXPECT_EQ(o.size(), counts[static_cast<std::size_t>(r)]);
      if (o.size() > 0) {
        EXPECT_EQ(o.begin, pos) << "pieces come in rank order without gaps";
        pos = o.end;
      }
      total += o.size();
    }
    EXPECT_EQ(total, b - a);
  }
}

TEST(Buckets, RespectCutsAndSizeInReverseOrder) {
  const std::vector<std::int64_t> cuts = {10, 20, 35, 100, 110};
  const auto buckets = build_buckets(cuts, 120, 30);
  // Backward order: the last bucket first; together they tile [0, 120).
  std::int64_t end = 120;
  for (const Range& b : buckets) {
    EXPECT_EQ(b.end, end);
    end = b.begin;
    EXPECT_TRUE(b.size() <= 30 || b.size() == 65) << b.begin << ".." << b.end;  // 35..100 alone
  }
  EXPECT_EQ(end, 0);
  EXPECT_THROW(build_buckets(cuts, 120, 0), core::InvalidArgument);
  EXPECT_THROW(build_shard_plan(10, 0, 16), core::InvalidArgument);
}

}  // namespace
}  // namespace trident::parallel
