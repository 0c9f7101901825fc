// The tensor-parallel conjugates on thread worlds of 1, 2 and 4 ranks: each forward op and its
// backward twin against the sums and blocks computed on one rank, and the traffic they count.
#include <gtest/gtest.h>

#include <vector>

#include "trident/comm/thread_communicator.h"
#include "trident/parallel/tp_ops.h"

namespace trident::parallel {
namespace {

constexpr std::int64_t kRows = 8, kCols = 3;

// Rank r's value at element i: distinct per rank, exact in FP32 and in sums of four.
float value(int r, std::int64_t i) { return static_cast<float>(r * 100 + i); }

class TpOps : public ::testing::TestWithParam<int> {};

TEST_P(TpOps, ConjugatesMatchOneRankAndAreCounted) {
  const int n = GetParam();
  comm::run_on_threads(
      n,
      [&](comm::Communicator& world) {
        const int r = world.rank();
        TpTraffic traffic;
        const TpGroup g(&world, &traffic);
        EXPECT_EQ(g.active(), n > 1);
        const std::int64_t N = kRows * kCols, block = N / n;
        std::vector<float> buf(N), full(N);
        for (std::int64_t i = 0; i < N; ++i) buf[i] = value(r, i);
        auto sum_over_ranks = [&](std::int64_t i) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, i);
          return s;
        };

        // f / f-backward: identity, then the all-reduce of the input gradient.
        EXPECT_EQ(g.copy_to_tp(buf.data()), buf.data());
        g.copy_to_tp_backward(buf.data(), kRows, kCols);
        for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(buf[i], sum_over_ranks(i));
        // g / g-backward.
        for (std::int64_t i = 0; i < N; ++i) buf[i] = value(r, i);
        g.reduce_from_tp(buf.data(), kRows, kCols);
        for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(buf[i], sum_over_ranks(i));
        EXPECT_EQ(g.reduce_from_tp_backward(buf.data()), buf.data());
        // Sequence parallelism: gather the local block, reduce-scatter the full partials.
        std::vector<float> local(block);
        for (std::int64_t i = 0; i < block; ++i) local[i] = value(r, i);
        const float* gathered = g.gather_from_sequence(local.data(), full.data(), kRows, kCols);
        for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(gathered[i], value(i / block, i % block));
        for (std::int64_t i = 0; i < N; ++i) buf[i] = value(r, i);
        const float* mine = g.gather_from_sequence_backward(buf.data(), kRows, kCols);
        for (std::int64_t i = 0; i < block; ++i) EXPECT_EQ(mine[i], sum_over_ranks(r * block + i));
        for (std::int64_t i = 0; i < N; ++i) buf[i] = value(r, i);
        g.reduce_scatter_to_sequence(buf.data(), local.data(), kRows, kCols);
        if (n > 1) {
          for (std::int64_t i = 0; i < block; ++i) {
            EXPECT_EQ(local[i], sum_over_ranks(r * block + i));
          }
        }
        const float* d_full =
            g.reduce_scatter_to_sequence_backward(local.data(), full.data(), kRows, kCols);
        if (n > 1) {
          for (std::int64_t i = 0; i < N; ++i) {
            EXPECT_EQ(d_full[i], sum_over_ranks(i));  // rank q's block of reduced sums
          }
        }
        // The loss's reductions.
        std::vector<float> row(kRows);
        for (std::int64_t i = 0; i < kRows; ++i) row[i] = value(r, i);
        g.all_reduce_max(row.data(), kRows);
        for (std::int64_t i = 0; i < kRows; ++i) EXPECT_EQ(row[i], value(n - 1, i));
        for (std::int64_t i = 0; i < kRows; ++i) row[i] = value(r, i);
        g.all_reduce_sum(row.data(), kRows);
        for (std::int64_t i = 0; i < kRows; ++i) EXPECT_EQ(row[i], sum_over_ranks(i));

        // Counted: 4 all-reduces of the buffer and 2 of a row vector, 2 all-gathers and 2
        // reduce-scatters of the buffer (none at all without tensor parallelism).
        const double t = n, ring = (t - 1) / t * 4.0;
        EXPECT_EQ(traffic.all_reduces, n > 1 ? 4 : 0);
        EXPECT_EQ(traffic.all_gathers, n > 1 ? 2 : 0);
        EXPECT_EQ(traffic.reduce_scatters, n > 1 ? 2 : 0);
        const double bytes = n > 1 ? ring * (2.0 * 2 * N + 2.0 * 2 * kRows + 2.0 * N + 2.0 * N) : 0;
        EXPECT_DOUBLE_EQ(traffic.bytes, bytes);
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, TpOps, ::testing::Values(1, 2, 4),
                         [](const auto& p) { return "tp" + std::to_string(p.param); });

TEST(TpRegion, PicksThePairForTheLayout) {
  comm::run_on_threads(
      2,
      [](comm::Communicator& world) {
        TpTraffic traffic;
        const TpGroup g(&world, &traffic);
        const TpRegion plain(g, false, kRows, kCols), sp(g, true, kRows, kCols);
        EXPECT_EQ(plain.local_rows(), kRows);
        EXPECT_EQ(sp.local_rows(), kRows / 2);
        EXPECT_EQ(sp.first_row(), world.rank() * kRows / 2);
        std::vector<float> a(kRows * kCols, 1.0f), full(kRows * kCols);
        EXPECT_EQ(plain.enter(a.data(), full.data()), a.data());  // identity, nothing counted
        EXPECT_EQ(traffic.all_reduces + traffic.all_gathers, 0);
        EXPECT_EQ(sp.enter(a.data(), full.data()), full.data());
        EXPECT_EQ(traffic.all_gathers, 1);
        plain.leave(a.data(), a.data());
        EXPECT_EQ(traffic.all_reduces, 1);
        EXPECT_EQ(a[0], 2.0f);
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

}  // namespace
}  // namespace trident::parallel
