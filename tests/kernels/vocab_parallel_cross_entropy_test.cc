// Vocab-parallel cross-entropy: each local kernel against its double-precision reference, and the
// three kernels with the tp reductions done here by hand (max, then sums over the shards) against
// the unsplit reference cross-entropy (cross_entropy.h), for 1, 2 and 4 shards of a padded
// vocabulary, with ignored targets, a target in the last real column and shards holding only
// padding. sum_token_losses against its reference (exactly: both add in row order in double).
// The ops run over typed views (the references over the backend contract); a view of the wrong
// shape or dtype is an error naming it.
//
// Tolerances as cross_entropy_test.cc: losses 1e-5 + 1e-5 |ref|, d_logits 1e-9 + 1e-5 |ref| (on
// cuda: the device expf's 2 ulp, sums in double). Exact on every backend: a row's max, and the
// token-loss sum (copied back and added in row order on the host).
#include "trident/kernels/vocab_parallel_cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernel_test_util.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;

constexpr testing::Tol kLossTol{1e-5, 1e-5};
constexpr testing::Tol kGradTol{1e-9, 1e-5};

struct Problem {
  std::int64_t rows, V, Vp;
  std::vector<float> logits;  // (rows, Vp)
  std::vector<std::int32_t> targets;
};

Problem make_problem(std::int64_t rows, std::int64_t V, std::int64_t Vp, std::uint64_t seed) {
  Problem p{rows, V, Vp, randn(rows * Vp, seed, 2.0), std::vector<std::int32_t>(rows)};
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  for (auto& t : p.targets) t = static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(V));
  p.targets[0] = static_cast<std::int32_t>(V - 1);
  for (std::int64_t r = 2; r < rows; r += 4) p.targets[r] = -100;
  return p;
}

// Shard s of n: columns [s * Vp / n, (s + 1) * Vp / n).
std::vector<float> shard_of(const Problem& p, int s, int n) {
  const std::int64_t Vl = p.Vp / n;
  std::vector<float> out(static_cast<std::size_t>(p.rows * Vl));
  for (std::int64_t r = 0; r < p.rows; ++r)
    std::copy_n(p.logits.begin() + r * p.Vp + s * Vl, Vl, out.begin() + r * Vl);
  return out;
}

TEST(VocabParallelCeKernels, ShardsWithReductionsMatchTheUnsplitReference) {
  // V = 70 of Vp = 128: with 4 shards, shard 2 holds 6 real columns and shard 3 only padding.
  // ... and GPT-2's vocabulary (50257 of 50304: with 4 shards the last holds 47 padding columns).
  for (const auto& [rows, V, Vp] :
       {std::tuple{9, 70, 128}, std::tuple{5, 1000, 1024}, std::tuple{3, 50257, 50304}}) {
    const Problem p = make_problem(rows, V, Vp, static_cast<std::uint64_t>(V));
    std::vector<float> losses_ref(rows), d_ref(p.logits.size());
    ref::cross_entropy_forward_backward({.losses = losses_ref.data(),
                                         .d_logits = d_ref.data(),
                                         .logits = p.logits.data(),
                                         .targets = p.targets.data(),
                                         .d_scale = 0.25f,
                                         .rows = rows,
                                         .vocab = V,
                                         .vocab_padded = Vp});
    for (int n : {1, 2, 4}) {
      const std::int64_t Vl = Vp / n;
      std::vector<std::vector<float>> logits(n), stats(n, std::vector<float>(3 * rows));
      for (int s = 0; s < n; ++s) logits[s] = shard_of(p, s, n);
      auto shard = [&](int s) {
        return VocabParallelShard{
            .vocab = p.V,
            .vocab_start = s * Vl,
            .vocab_local = Vl};  // p.V: clang 14 cannot capture a structured binding
      };
      const core::ExecContext ctx = testing::backend_ctx();
      std::vector<float> max(rows, -INFINITY);
      const core::Shape rs{rows}, rv{rows, Vl};
      for (int s = 0; s < n; ++s) {
        vocab_parallel_ce_max(ctx, {.row_max = testing::view_at(stats[s], 0, rs),
                                    .logits = testing::view_of(logits[s], rv),
                                    .vocab = p.V,
                                    .vocab_start = s * Vl});
        std::vector<float> want(rows);
        ref::vocab_parallel_ce_max(
            {.row_max = want.data(), .logits = logits[s].data(), .rows = rows, .shard = shard(s)});
        // Exact (a max is a max); -inf where the shard holds only padding.
        testing::fetch(stats[s]);
        EXPECT_TRUE(testing::all_equal(
            "row_max", std::vector<float>(stats[s].begin(), stats[s].begin() + rows), want));
        for (std::int64_t r = 0; r < rows; ++r) max[r] = std::max(max[r], stats[s][r]);
      }
      std::vector<float> sums(2 * rows, 0.0f);  // sum_exp, target_logit: the all-reduce sum
      for (int s = 0; s < n; ++s) {
        float* st = stats[s].data();
        const VocabParallelCeSumArgs a{.sum_exp = st + rows,
                                       .target_logit = st + 2 * rows,
                                       .logits = logits[s].data(),
                                       .row_max = max.data(),
                                       .targets = p.targets.data(),
                                       .rows = rows,
                                       .shard = shard(s)};
        vocab_parallel_ce_sum_target(ctx, {.sum_exp = testing::view_at(stats[s], rows, rs),
                                           .target_logit = testing::view_at(stats[s], 2 * rows, rs),
                                           .logits = testing::view_of(logits[s], rv),
                                           .row_max = testing::view_of(max, rs),
                                           .targets = testing::view_of(p.targets, rs),
                                           .vocab = p.V,
                                           .vocab_start = s * Vl});
        std::vector<float> want(2 * rows);
        VocabParallelCeSumArgs ra = a;
        ra.sum_exp = want.data();
        ra.target_logit = want.data() + rows;
        ref::vocab_parallel_ce_sum_target(ra);
        EXPECT_TRUE(all_close("sum_exp/target", st + rows, want.data(), 2 * rows, kLossTol));
        for (std::int64_t i = 0; i < 2 * rows; ++i) sums[i] += st[rows + i];
      }
      for (int s = 0; s < n; ++s) {
        std::vector<float> losses(rows), d(logits[s].size()), rlosses(rows), rd(d.size());
        VocabParallelCeLossArgs a{.losses = losses.data(),
                                  .d_logits = d.data(),
                                  .logits = logits[s].data(),
                                  .row_max = max.data(),
                                  .sum_exp = sums.data(),
                                  .target_logit = sums.data() + rows,
                                  .targets = p.targets.data(),
                                  .d_scale = 0.25f,
                                  .rows = rows,
                                  .shard = shard(s)};
        const VocabParallelCeLossViews v{.losses = testing::view_of(losses, rs),
                                         .d_logits = testing::view_of(d, rv),
                                         .logits = testing::view_of(logits[s], rv),
                                         .row_max = testing::view_of(max, rs),
                                         .sum_exp = testing::view_at(sums, 0, rs),
                                         .target_logit = testing::view_at(sums, rows, rs),
                                         .targets = testing::view_of(p.targets, rs),
                                         .d_scale = 0.25f,
                                         .vocab = p.V,
                                         .vocab_start = s * Vl};
        vocab_parallel_ce_loss(ctx, v);
        EXPECT_TRUE(all_close("losses vs unsplit", losses, losses_ref, kLossTol)) << n;
        const std::vector<float> d_want = [&] {
          Problem q = p;
          q.logits = d_ref;
          return shard_of(q, s, n);
        }();
        EXPECT_TRUE(all_close("d_logits vs unsplit", d, d_want, kGradTol)) << n << " " << s;
        a.losses = rlosses.data();
        a.d_logits = rd.data();
        ref::vocab_parallel_ce_loss(a);
        EXPECT_TRUE(all_close("losses vs ref", losses, rlosses, kLossTol));
        EXPECT_TRUE(all_close("d_logits vs ref", d, rd, kGradTol));
        // In place and loss-only give the same losses.
        std::vector<float> inplace = logits[s], l2(rows);
        VocabParallelCeLossViews w = v;
        w.losses = testing::view_of(l2, rs);
        w.d_logits = w.logits = testing::view_of(inplace, rv);
        vocab_parallel_ce_loss(ctx, w);
        EXPECT_TRUE(testing::all_equal("in place", inplace, d));
        w.d_logits = {};
        w.logits = testing::view_of(logits[s], rv);
        vocab_parallel_ce_loss(ctx, w);
        EXPECT_TRUE(testing::all_equal("loss only", l2, losses));
      }
    }
  }
}

TEST(VocabParallelCeKernels, TargetOutsideTheVocabularyIsABug) {
  const Problem p = make_problem(2, 10, 16, 1);
  std::vector<std::int32_t> bad = {3, 12};
  std::vector<float> stats(3 * 2, 1.0f), losses(2);
  // At the call on the CPU; on a device at the loss's read-back (sum_token_losses), the
  // micro-batch's one host sync.
  EXPECT_THROW(
      {
        vocab_parallel_ce_loss(testing::backend_ctx(),
                               {.losses = testing::dev(losses),
                                .logits = testing::dev(p.logits),
                                .row_max = testing::dev(stats),
                                .sum_exp = testing::dev(stats) + 2,
                                .target_logit = testing::dev(stats) + 4,
                                .targets = testing::dev(bad),
                                .rows = 2,
                                .shard = {.vocab = 10, .vocab_start = 0, .vocab_local = 16}});
        sum_token_losses(testing::backend_ctx(), testing::dev(losses), testing::dev(bad), 2);
      },
      core::InternalError);
}

TEST(SumTokenLosses, CountsOnlyNonNegativeTargets) {
  const std::vector<float> losses = randn(101, 5);
  std::vector<std::int32_t> targets(101);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = i % 3 == 0 ? -1 : 7;
  const TokenLossSum got = sum_token_losses(
      testing::backend_ctx(),
      {.losses = testing::view_of(losses, {101}), .targets = testing::view_of(targets, {101})});
  const TokenLossSum want = ref::sum_token_losses(losses.data(), targets.data(), 101);
  EXPECT_EQ(got.count, 67);
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.sum, want.sum);
  double by_hand = 0;
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets[i] >= 0) by_hand += losses[i];
  EXPECT_EQ(got.sum, by_hand);
}

// The pipeline's form: micro-batches' sums added on the device, read once, bitwise the host's
// running sum of sum_token_losses.
TEST(SumTokenLosses, AccumulatedOnTheDeviceEqualsTheRunningSum) {
  TokenLossSum want;
  std::vector<TokenLossSum> acc(1);
  std::vector<std::vector<float>> losses;
  std::vector<std::vector<std::int32_t>> targets;
  for (int m = 0; m < 3; ++m) {
    losses.push_back(randn(37 + m, 9 + m));
    targets.emplace_back(losses.back().size(), 4);
    targets.back()[static_cast<std::size_t>(m)] = -1;
  }
  for (int m = 0; m < 3; ++m) {
    const auto rows = static_cast<std::int64_t>(losses[m].size());
    const TokenLossViews v{.losses = testing::view_of(losses[m], {rows}),
                           .targets = testing::view_of(targets[m], {rows})};
    const TokenLossSum one = sum_token_losses(testing::backend_ctx(), v);
    want.sum += one.sum;
    want.count += one.count;
    accumulate_token_losses(testing::backend_ctx(), v, testing::dev(acc));
  }
  testing::fetch(acc);
  EXPECT_EQ(acc[0].count, 37 + 38 + 39 - 3);
  EXPECT_EQ(acc[0].count, want.count);
  EXPECT_EQ(acc[0].sum, want.sum);
}

// The shard's row stride comes from the logits view; every other view must match its rows.
TEST(VocabParallelCeKernels, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  const std::int64_t rows = 3, Vl = 8;
  std::vector<float> logits(rows * Vl), stats(3 * rows);
  const std::vector<std::int32_t> targets(rows, 1);
  const core::ExecContext ctx = testing::backend_ctx();
  std::string e = testing::invalid_argument_of([&] {
    vocab_parallel_ce_max(ctx, {.row_max = testing::view_at(stats, 0, {rows + 1}),
                                .logits = testing::view_of(logits, {rows, Vl}),
                                .vocab = Vl});
  });
  EXPECT_NE(e.find("vocab_parallel_ce_max: view `row_max` has shape (4), the op needs (3)"),
            std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    vocab_parallel_ce_sum_target(ctx, {.sum_exp = testing::view_at(stats, 0, {rows}),
                                       .target_logit = testing::view_at(stats, rows, {rows}),
                                       .logits = testing::view_of(logits, {rows, Vl}),
                                       .row_max = testing::view_at(stats, 0, {rows}),
                                       .targets = testing::view_at(stats, 0, {rows}),
                                       .vocab = Vl});
  });
  EXPECT_NE(e.find("view `targets` holds f32, the op needs i32"), std::string::npos) << e;
  e = testing::invalid_argument_of([&] {
    vocab_parallel_ce_loss(ctx, {.losses = testing::view_at(stats, 0, {rows}),
                                 .d_logits = testing::view_claiming(logits, {rows, Vl / 2}),
                                 .logits = testing::view_of(logits, {rows, Vl}),
                                 .row_max = testing::view_at(stats, 0, {rows}),
                                 .sum_exp = testing::view_at(stats, 0, {rows}),
                                 .target_logit = testing::view_at(stats, 0, {rows}),
                                 .targets = testing::view_of(targets, {rows}),
                                 .vocab = Vl});
  });
  EXPECT_NE(e.find("view `d_logits` has shape (3, 4), the op needs (3, 8)"), std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    (void)sum_token_losses(ctx, {.losses = testing::view_at(stats, 0, {rows}),
                                 .targets = testing::view_of(targets, {rows})});
  });
  EXPECT_EQ(e, "no error");
}

}  // namespace
}  // namespace trident::kernels
