// Fused AdamW against the double-precision reference over several steps and hyper-parameter sets,
// plus closed forms: the first step moves each weight by lr * sign(g), and a zero gradient only
// applies the decoupled decay p *= 1 - lr * weight_decay.
//
// Tolerances: m and v |x - ref| <= 1e-7 + 1e-6 |ref| (one FP32 multiply-add per step; m can cancel
// to ~0, leaving an absolute error of an ulp of g ~ 1e-7). param 1e-5 lr + 1e-6 |ref|: the update
// lr * mhat / (sqrt(vhat) + eps) is O(lr) and carries a few FP32 roundings (~1e-7 lr each, over 5
// steps), still 1e5 times smaller than the update itself; the relative part covers the rounding
// of p (6e-8 per step). On cuda nvcc contracts the moment updates (b1 m + (1 - b1) g) and the
// step into FMAs, which round once where the CPU rounds twice: within the same half-ulp per
// operation, so the same tolerances hold.
#include "trident/kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernel_test_util.h"
#include "trident/core/bf16.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;

constexpr Tol kStateTol{1e-7, 1e-6};

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct State {
  std::vector<float> p, m, v;
  AdamWArgs args(const std::vector<float>& grad) {
    return {.param = testing::dev(p),
            .m = testing::dev(m),
            .v = testing::dev(v),
            .grad = testing::dev(grad),
            .n = static_cast<std::int64_t>(p.size())};
  }
  AdamWViews views(const std::vector<float>& grad) {
    const core::Shape n{static_cast<std::int64_t>(p.size())};
    return {.param = testing::view_of(p, n),
            .m = testing::view_of(m, n),
            .v = testing::view_of(v, n),
            .grad = testing::view_of(grad, n)};
  }
};

TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  const AdamWHyper hypers[] = {
      {},  // torch defaults with lr 1e-4, no decay
      {.lr = 6e-4f,
       .beta1 = 0.9f,
       .beta2 = 0.95f,
       .eps = 1e-8f,
       .weight_decay = 0.1f,
       .step = 1,
       .grad_scale = 0.5f},  // GPT-3 style, with a clipping coefficient
      {.lr = 1e-2f,
       .beta1 = 0.5f,
       .beta2 = 0.9f,
       .eps = 1e-3f,
       .weight_decay = 0.01f,
       .step = 1000,
       .grad_scale = 1.0f},  // late step: bias corrections ~1
  };
  std::uint64_t seed = 1;
  for (const AdamWHyper& hp0 : hypers) {
    for (std::int64_t n :
         {std::int64_t{1}, std::int64_t{17}, std::int64_t{1000}, std::int64_t{1000003}}) {
      State fast{randn(n, seed++, 0.02), randn(n, seed++, 1e-3), std::vector<float>(n)};
      for (float& x : fast.v) x = 1e-6f * static_cast<float>(seed % 7 + 1);
      if (hp0.step == 1) {  // a true first step starts from zero moments
        std::fill(fast.m.begin(), fast.m.end(), 0.0f);
        std::fill(fast.v.begin(), fast.v.end(), 0.0f);
      }
      State slow = fast;
      for (int k = 0; k < 5; ++k) {
        AdamWHyper hp = hp0;
        hp.step = hp0.step + k;
        const auto grad = randn(n, seed++, 0.1);
        adamw_update(cpu_ctx(), hp, fast.views(grad));
        ref::adamw_update(hp, {.param = slow.p.data(),
                               .m = slow.m.data(),
                               .v = slow.v.data(),
                               .grad = grad.data(),
                               .n = n});
        const std::string tag = " n=" + std::to_string(n) + " step=" + std::to_string(hp.step) +
                                " lr=" + std::to_string(hp.lr);
        ASSERT_TRUE(all_close(("adamw m" + tag).c_str(), fast.m, slow.m, kStateTol));
        ASSERT_TRUE(all_close(("adamw v" + tag).c_str(), fast.v, slow.v, kStateTol));
        const Tol param_tol{1e-5 * hp.lr, 1e-6};
        ASSERT_TRUE(all_close(("adamw param" + tag).c_str(), fast.p, slow.p, param_tol));
      }
    }
  }
}

// Step 1 from zero moments: mhat = g and vhat = g^2, so p -= lr * g / (|g| + eps).
TEST(AdamW, FirstStepMovesByLearningRateTimesSign) {
  const std::int64_t n = 33;
  State s{randn(n, 1), std::vector<float>(n), std::vector<float>(n)};
  const auto p0 = s.p;
  const auto grad = randn(n, 2);
  const AdamWHyper hp{.lr = 1e-3f, .eps = 1e-8f, .step = 1};
  adamw_update(cpu_ctx(), hp, s.args(grad));
  testing::fetch(s.p);
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    EXPECT_NEAR(s.p[i], p0[i] - 1e-3 * g / (std::abs(g) + 1e-8), 1e-7) << "i=" << i;
  }
}

// With a zero gradient and zero moments only the decoupled decay acts: p *= 1 - lr * wd.
TEST(AdamW, ZeroGradientOnlyDecays) {
  const std::int64_t n = 20;
  State s{randn(n, 3), std::vector<float>(n), std::vector<float>(n)};
  const auto p0 = s.p;
  const std::vector<float> grad(n, 0.0f);
  adamw_update(cpu_ctx(), {.lr = 0.1f, .weight_decay = 0.5f, .step = 3}, s.args(grad));
  testing::fetch(s.p);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(s.p[i], p0[i] * 0.95f) << "i=" << i;
}

TEST(AdamW, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  State s{std::vector<float>(4), std::vector<float>(4), std::vector<float>(4)};
  const std::vector<float> grad(5);
  const std::vector<core::bf16> m16(4);
  AdamWViews v = s.views(s.p);
  v.grad = testing::view_of(grad, {5});
  std::string e = testing::invalid_argument_of([&] { adamw_update(cpu_ctx(), {}, v); });
  EXPECT_NE(e.find("adamw_update: view `grad` has shape (5), the op needs (4)"), std::string::npos)
      << e;
  v = s.views(s.p);
  v.m = testing::view_of(m16, {4});
  e = testing::invalid_argument_of([&] { adamw_update(cpu_ctx(), {}, v); });
  EXPECT_NE(e.find("view `m` holds bf16, the op needs f32"), std::string::npos) << e;
}

TEST(AdamW, RejectsBadHyperParameters) {
  State s{std::vector<float>(4), std::vector<float>(4), std::vector<float>(4)};
  const std::vector<float> grad(4);
  EXPECT_THROW(adamw_update(cpu_ctx(), {.step = 0}, s.args(grad)), core::InvalidArgument);
  EXPECT_THROW(adamw_update(cpu_ctx(), {.beta1 = 1.0f}, s.args(grad)), core::InvalidArgument);
  EXPECT_THROW(adamw_update(cpu_ctx(), {.lr = -1.0f}, s.args(grad)), core::InvalidArgument);
  AdamWArgs bad = s.args(grad);
  bad.v = nullptr;
  EXPECT_THROW(adamw_update(cpu_ctx(), {}, bad), core::InvalidArgument);
}

}  // namespace
}  // namespace trident::kernels
