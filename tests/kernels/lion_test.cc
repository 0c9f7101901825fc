// Fused Lion against the double-precision reference over several steps and hyper-parameter sets
// (on every backend of the loop: each CPU variant and the GPU), plus closed forms: each weight
// moves by exactly lr * sign(c) after its decay, a zero gradient from a zero momentum only decays.
//
// Tolerances: m |x - ref| <= 1e-7 + 1e-6 |ref| (one FP32 multiply-add per step). param: the decay
// and the +-lr step round once each in FP32, so 1e-6 lr + 1e-6 |ref|. The sign is discontinuous:
// where the double-precision c = beta1 m + (1 - beta1) g is within FP32 rounding of zero
// (|c| <= 1e-6 (|beta1 m| + |(1 - beta1) g|)) the two may take opposite signs and differ by
// 2 lr for that step; those elements are checked against that bound instead (their count is
// printed; with random inputs it is almost always 0).
#include "trident/kernels/lion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;

core::ExecContext ctx() { return testing::backend_ctx(); }

struct State {
  std::vector<float> p, m;
  LionArgs args(const std::vector<float>& grad) {
    return {.param = testing::dev(p),
            .m = testing::dev(m),
            .grad = testing::dev(grad),
            .n = static_cast<std::int64_t>(p.size())};
  }
  LionViews views(const std::vector<float>& grad) {
    const core::Shape n{static_cast<std::int64_t>(p.size())};
    return {.param = testing::view_of(p, n),
            .m = testing::view_of(m, n),
            .grad = testing::view_of(grad, n)};
  }
};

TEST(Lion, MatchesReferenceOverSeveralSteps) {
  const LionHyper hypers[] = {
      {},  // lion-pytorch's defaults with lr 1e-4, no decay
      {.lr = 3e-4f, .beta1 = 0.95f, .beta2 = 0.98f, .weight_decay = 0.1f, .grad_scale = 0.5f},
      {.lr = 1e-2f, .beta1 = 0.5f, .beta2 = 0.9f, .weight_decay = 1.0f, .grad_scale = 1.0f},
  };
  std::uint64_t seed = 11;
  for (const LionHyper& hp : hypers) {
    for (std::int64_t n :
         {std::int64_t{1}, std::int64_t{17}, std::int64_t{1000}, std::int64_t{1000003}}) {
      State fast{randn(n, seed++, 0.02), randn(n, seed++, 1e-3)};
      State slow = fast;
      std::vector<int> ambiguous(static_cast<std::size_t>(n));  // steps with c near 0
      for (int k = 0; k < 5; ++k) {
        const auto grad = randn(n, seed++, 0.1);
        for (std::int64_t i = 0; i < n; ++i) {
          const double a = static_cast<double>(hp.beta1) * slow.m[i];
          const double b = (1.0 - hp.beta1) * grad[i] * hp.grad_scale;
          if (std::abs(a + b) <= 1e-6 * (std::abs(a) + std::abs(b))) ++ambiguous[i];
        }
        lion_update(ctx(), hp, fast.views(grad));
        ref::lion_update(hp,
                         {.param = slow.p.data(), .m = slow.m.data(), .grad = grad.data(), .n = n});
        const std::string tag = " n=" + std::to_string(n) + " step=" + std::to_string(k + 1) +
                                " lr=" + std::to_string(hp.lr);
        ASSERT_TRUE(all_close(("lion m" + tag).c_str(), fast.m, slow.m, {1e-7, 1e-6}));
        testing::fetch(fast.p);
        int bounded = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const double d = std::abs(static_cast<double>(fast.p[i]) - slow.p[i]);
          const double tol = 1e-6 * hp.lr + 1e-6 * std::abs(slow.p[i]);
          if (ambiguous[i] > 0) {
            ++bounded;
            ASSERT_LE(d, 2.0 * hp.lr * ambiguous[i] + tol) << "lion param" << tag << " i=" << i;
          } else {
            ASSERT_LE(d, tol) << "lion param" << tag << " i=" << i << " trident " << fast.p[i]
                              << " ref " << slow.p[i];
          }
        }
        if (bounded > 0) std::printf("lion%s: %d elements with c near 0\n", tag.c_str(), bounded);
      }
    }
  }
}

// The update is exactly p (1 - lr wd) - lr sign(c): every weight moves by lr (after its decay),
// a zero c leaves it where the decay put it, and m follows the gradient's average.
TEST(Lion, StepIsLearningRateTimesSign) {
  const std::int64_t n = 40;
  State s{randn(n, 1), randn(n, 2, 0.01)};
  for (std::int64_t i = 0; i < 4; ++i) s.m[i] = 0.0f;  // with a zero gradient: c = 0
  const State before = s;
  auto grad = randn(n, 3);
  for (std::int64_t i = 0; i < 4; ++i) grad[i] = 0.0f;
  const LionHyper hp{.lr = 0.25f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.5f};
  lion_update(ctx(), hp, s.args(grad));
  testing::fetch(s.p);
  testing::fetch(s.m);
  // The kernel's betas are floats: 0.9f and 0.99f, not the decimals.
  const double b1 = hp.beta1, b2 = hp.beta2;
  for (std::int64_t i = 0; i < n; ++i) {
    const double c = b1 * before.m[i] + (1.0 - b1) * grad[i];
    const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
    const double decayed = before.p[i] * (1.0 - 0.25 * 0.5);
    EXPECT_NEAR(s.p[i], decayed - 0.25 * sign, 1e-6) << "i=" << i;
    if (i < 4) {
      EXPECT_FLOAT_EQ(s.p[i], static_cast<float>(decayed)) << "zero c, i=" << i;
    }
    EXPECT_NEAR(s.m[i], b2 * before.m[i] + (1.0 - b2) * grad[i], 1e-8) << "i=" << i;
  }
}

TEST(Lion, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  State s{std::vector<float>(4), std::vector<float>(4)};
  const std::vector<float> grad(5);
  LionViews v = s.views(s.p);
  v.grad = testing::view_of(grad, {5});
  const std::string e = testing::invalid_argument_of([&] { lion_update(ctx(), {}, v); });
  EXPECT_NE(e.find("lion_update: view `grad` has shape (5), the op needs (4)"), std::string::npos)
      << e;
}

TEST(Lion, RejectsBadHyperParameters) {
  State s{std::vector<float>(4), std::vector<float>(4)};
  const std::vector<float> grad(4);
  EXPECT_THROW(lion_update(ctx(), {.beta1 = 1.5f}, s.args(grad)), core::InvalidArgument);
  EXPECT_THROW(lion_update(ctx(), {.lr = -1.0f}, s.args(grad)), core::InvalidArgument);
  EXPECT_THROW(lion_update(ctx(), {.weight_decay = -0.1f}, s.args(grad)), core::InvalidArgument);
  LionArgs bad = s.args(grad);
  bad.m = nullptr;
  EXPECT_THROW(lion_update(ctx(), {}, bad), core::InvalidArgument);
}

}  // namespace
}  // namespace trident::kernels
