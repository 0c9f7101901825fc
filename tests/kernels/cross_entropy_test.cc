// Fused softmax cross-entropy against the double-precision reference over a padded vocabulary:
// padding columns hold huge values (or NaN) and must never win, targets in the last real column,
// ignored targets, forward-only and in-place use, bad targets, and finite differences of the
// reference gradient.
//
// Tolerances: losses |x - ref| <= 1e-5 + 1e-5 |ref| (losses are ~log V <= 11; the kernel sums
// exp in double, so its error is a few FP32 ulp of the logits). d_logits |x - ref| <= 1e-9 +
// 1e-5 |ref|: softmax entries are as small as 1e-7 at V = 50257, so the absolute part must be far
// below them for the check to mean anything; each entry is exp (about 1 ulp) times one scale.
// On cuda the exp is the device expf (2 ulp) and the row's sum is in double as on the CPU: a few
// ulp, far inside 1e-5 relative (about 80 ulp).
#include "trident/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/memory.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;

constexpr Tol kLossTol{1e-5, 1e-5};
constexpr Tol kGradTol{1e-9, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct Case {
  std::int64_t rows, V, Vp;
  std::string name(const char* tensor) const {
    return std::string(tensor) + " rows=" + std::to_string(rows) + " V=" + std::to_string(V) +
           " Vp=" + std::to_string(Vp);
  }
};
// V = 1 (loss 0), no padding, odd sizes, and GPT-2's padded vocabulary.
const Case kCases[] = {{1, 1, 1},   {2, 1, 16},       {3, 7, 7},
                       {5, 33, 48}, {17, 1000, 1024}, {16, 50257, 50304}};

struct Inputs {
  std::vector<float> logits;
  std::vector<std::int32_t> targets;
};

// Logits ~ N(0, 2^2) on real columns and `pad` on padding columns. Targets are random, except:
// row 0 targets the last real column, row 1 column 0, and every 4th row from row 2 is ignored.
Inputs make_inputs(const Case& c, std::uint64_t seed, float pad) {
  Inputs in{randn(c.rows * c.Vp, seed, 2.0), std::vector<std::int32_t>(c.rows)};
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t j = c.V; j < c.Vp; ++j) in.logits[r * c.Vp + j] = pad;
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  for (std::int64_t r = 0; r < c.rows; ++r) {
    in.targets[r] = static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(c.V));
  }
  in.targets[0] = static_cast<std::int32_t>(c.V - 1);
  if (c.rows > 1) in.targets[1] = 0;
  for (std::int64_t r = 2; r < c.rows; r += 4) in.targets[r] = r % 8 == 2 ? -1 : -100;
  return in;
}

TEST(CrossEntropy, MatchesReferenceWithHugePadding) {
  std::uint64_t seed = 1;
  for (const Case& c : kCases) {
    for (float pad : {1e30f, kNaN}) {  // padding must be neither the max nor read at all
      const Inputs in = make_inputs(c, seed++, pad);
      for (float d_scale : {1.0f, 1.0f / 37.0f}) {
        std::vector<float> losses(c.rows, kNaN), d_logits(c.rows * c.Vp, kNaN);
        auto losses_ref = losses, d_logits_ref = d_logits;
        CrossEntropyArgs args{.losses = losses.data(),
                              .d_logits = d_logits.data(),
                              .logits = in.logits.data(),
                              .targets = in.targets.data(),
                              .d_scale = d_scale,
                              .rows = c.rows,
                              .vocab = c.V,
                              .vocab_padded = c.Vp};
        cross_entropy_forward_backward(cpu_ctx(),
                                       {.losses = testing::view_of(losses, {c.rows}),
                                        .d_logits = testing::view_of(d_logits, {c.rows, c.Vp}),
                                        .logits = testing::view_of(in.logits, {c.rows, c.Vp}),
                                        .targets = testing::view_of(in.targets, {c.rows}),
                                        .d_scale = d_scale,
                                        .vocab = c.V});
        args.losses = losses_ref.data();
        args.d_logits = d_logits_ref.data();
        ref::cross_entropy_forward_backward(args);
        EXPECT_TRUE(all_close(c.name("losses").c_str(), losses, losses_ref, kLossTol));
        EXPECT_TRUE(all_close(c.name("d_logits").c_str(), d_logits, d_logits_ref, kGradTol));
        for (std::int64_t r = 0; r < c.rows; ++r) {
          if (in.targets[r] < 0) {
            ASSERT_EQ(losses[r], 0.0f) << c.name("ignored loss") << " r=" << r;
          }
          for (std::int64_t j = c.V; j < c.Vp; ++j)
            ASSERT_EQ(d_logits[r * c.Vp + j], 0.0f) << c.name("padding grad") << " r=" << r;
        }
      }
    }
  }
}

TEST(CrossEntropy, ForwardOnlyAndInPlaceAgree) {
  const Case c{9, 1001, 1024};
  const Inputs in = make_inputs(c, 42, 1e30f);
  std::vector<float> losses(c.rows, kNaN), d_logits(c.rows * c.Vp, kNaN);
  CrossEntropyArgs args{.losses = testing::dev(losses),
                        .d_logits = testing::dev(d_logits),
                        .logits = testing::dev(in.logits),
                        .targets = testing::dev(in.targets),
                        .d_scale = 0.5f,
                        .rows = c.rows,
                        .vocab = c.V,
                        .vocab_padded = c.Vp};
  cross_entropy_forward_backward(cpu_ctx(), args);
  std::vector<float> losses_fwd(c.rows, kNaN);
  args.losses = testing::dev(losses_fwd);
  args.d_logits = nullptr;
  cross_entropy_forward_backward(cpu_ctx(), args);
  EXPECT_TRUE(testing::all_equal("losses forward-only vs fused", losses_fwd, losses));
  auto inplace = in.logits;
  std::vector<float> losses_inplace(c.rows, kNaN);
  args.losses = testing::dev(losses_inplace);
  args.logits = testing::dev(inplace);
  args.d_logits = testing::dev(inplace);  // gradient written over the logits
  cross_entropy_forward_backward(cpu_ctx(), args);
  EXPECT_TRUE(testing::all_equal("losses in place", losses_inplace, losses));
  EXPECT_TRUE(testing::all_equal("d_logits in place", inplace, d_logits));
}

// A uniform row has loss log V and gradient d_scale (1/V - onehot), in closed form.
TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const std::int64_t V = 50257, Vp = 50304;
  std::vector<float> logits(Vp, 3.0f), losses(1, kNaN), d_logits(Vp, kNaN);
  for (std::int64_t j = V; j < Vp; ++j) logits[j] = 1e30f;
  const std::vector<std::int32_t> target = {static_cast<std::int32_t>(V - 1)};
  cross_entropy_forward_backward(cpu_ctx(), {.losses = testing::dev(losses),
                                             .d_logits = testing::dev(d_logits),
                                             .logits = testing::dev(logits),
                                             .targets = testing::dev(target),
                                             .d_scale = 1.0f,
                                             .rows = 1,
                                             .vocab = V,
                                             .vocab_padded = Vp});
  testing::fetch(losses);
  testing::fetch(d_logits);
  EXPECT_NEAR(losses[0], std::log(static_cast<double>(V)), 1e-5);
  EXPECT_NEAR(d_logits[0], 1.0 / V, 1e-5 / V);
  EXPECT_NEAR(d_logits[V - 1], 1.0 / V - 1.0, 1e-6);
}

TEST(CrossEntropy, TargetOutsideRealVocabularyIsABug) {
  const Case c{2, 5, 8};
  Inputs in = make_inputs(c, 3, 0.0f);
  std::vector<float> losses(c.rows), d_logits(c.rows * c.Vp);
  for (std::int32_t bad : {5, 7, 100}) {  // first padding column, last one, far beyond
    in.targets[1] = bad;
    CrossEntropyArgs args{.losses = losses.data(),
                          .d_logits = d_logits.data(),
                          .logits = in.logits.data(),
                          .targets = in.targets.data(),
                          .rows = c.rows,
                          .vocab = c.V,
                          .vocab_padded = c.Vp};
    CrossEntropyArgs on_backend = args;
    on_backend.losses = testing::dev(losses);
    on_backend.d_logits = testing::dev(d_logits);
    on_backend.logits = testing::dev(in.logits);
    on_backend.targets = testing::dev(in.targets);
    // At the call on the CPU; at the next synchronize() on a device (the row is skipped).
    EXPECT_THROW(
        {
          cross_entropy_forward_backward(cpu_ctx(), on_backend);
          synchronize(cpu_ctx());
        },
        core::InternalError)
        << "target " << bad;
    testing::fetch(losses);  // a device ran the kernel (the bad row skipped) before reporting
    testing::fetch(d_logits);
    EXPECT_THROW(ref::cross_entropy_forward_backward(args), core::InternalError) << bad;
  }
}

TEST(CrossEntropy, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  std::vector<float> logits(2 * 8), losses(2);
  const std::vector<std::int32_t> t(2, 0);
  std::string e = testing::invalid_argument_of([&] {
    cross_entropy_forward_backward(cpu_ctx(), {.losses = testing::view_of(losses, {2}),
                                               .logits = testing::view_of(logits, {2, 8}),
                                               .targets = testing::view_of(losses, {2}),
                                               .vocab = 8});
  });
  EXPECT_NE(e.find("cross_entropy_forward_backward: view `targets` holds f32, the op needs i32"),
            std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    cross_entropy_forward_backward(cpu_ctx(), {.losses = testing::view_of(losses, {2}),
                                               .d_logits = testing::view_of(logits, {4, 4}),
                                               .logits = testing::view_of(logits, {2, 8}),
                                               .targets = testing::view_of(t, {2}),
                                               .vocab = 8});
  });
  EXPECT_NE(e.find("view `d_logits` has shape (4, 4), the op needs (2, 8)"), std::string::npos)
      << e;
}

TEST(CrossEntropy, RejectsBadArguments) {
  std::vector<float> buf(16);
  std::vector<std::int32_t> t(2, 0);
  CrossEntropyArgs args{.losses = testing::dev(buf),
                        .logits = testing::dev(buf),
                        .targets = testing::dev(t),
                        .rows = 2,
                        .vocab = 8,
                        .vocab_padded = 4};  // vocab > vocab_padded
  EXPECT_THROW(cross_entropy_forward_backward(cpu_ctx(), args), core::InvalidArgument);
  args.vocab_padded = 8;
  args.targets = nullptr;
  EXPECT_THROW(cross_entropy_forward_backward(cpu_ctx(), args), core::InvalidArgument);
}

// The reference gradient in double against central differences of d_scale * sum(losses), over
// every column (padding columns: 0 both ways) and with one ignored row.
TEST(CrossEntropyReferenceCpuOnly, GradientMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const std::int64_t rows = 3, V = 5, Vp = 7;
  auto logits = randn<double>(rows * Vp, 13, 2.0);
  const std::vector<std::int32_t> targets = {4, -1, 2};
  const double d_scale = 0.7;
  std::vector<double> losses(rows), d_logits(rows * Vp);
  auto loss = [&] {
    ref::cross_entropy_forward_backward<double>({.losses = losses.data(),
                                                 .logits = logits.data(),
                                                 .targets = targets.data(),
                                                 .rows = rows,
                                                 .vocab = V,
                                                 .vocab_padded = Vp});
    double s = 0.0;
    for (double l : losses) s += d_scale * l;
    return s;
  };
  ref::cross_entropy_forward_backward<double>({.losses = losses.data(),
                                               .d_logits = d_logits.data(),
                                               .logits = logits.data(),
                                               .targets = targets.data(),
                                               .d_scale = d_scale,
                                               .rows = rows,
                                               .vocab = V,
                                               .vocab_padded = Vp});
  EXPECT_TRUE(all_close("cross-entropy d_logits vs finite differences", d_logits,
                        testing::numeric_grad(logits, loss), testing::kFiniteDiffTol));
}

}  // namespace
}  // namespace trident::kernels
