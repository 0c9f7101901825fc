// Causal attention forward/backward against the double-precision reference, causality (a future
// token's q/k/v never changes earlier outputs), thread-count independence, and finite-difference
// checks of the reference backward.
//
// Tolerance: |x - ref| <= 1e-5 + 1e-5 |ref|. With qkv ~ N(0, 1) the scores are O(1), and every
// output is a sum of at most T = 1024 FP32 products of O(1) (or, in backward, O(1/T)) terms. The
// CUDA kernels sum the same terms in another order with FMAs and the device expf (2 ulp): the
// same FP32 error budget. Outputs of rows a change cannot reach are bitwise unchanged on every
// backend (each is computed from the same inputs by the same code).
#include "trident/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr Tol kTol{1e-5, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct Case {
  std::int64_t B, T, NH, HS;
  std::int64_t qkv_numel() const { return B * T * NH * 3 * HS; }
  std::int64_t out_numel() const { return B * T * NH * HS; }
  std::int64_t probs_numel() const { return B * NH * T * T; }
  // The typed views' shapes (attention.h).
  core::Shape qkv() const { return {B, T, NH, 3 * HS}; }
  core::Shape out() const { return {B, T, NH * HS}; }
  core::Shape probs() const { return {B, NH, T, T}; }
  std::string name(const char* tensor) const {
    return std::string(tensor) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
           " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS);
  }
};
// Single elements, odd sizes, T across the kernel's 64-row blocks, GPT-2 small heads (T=256), and
// GPT-2's context (T=1024) at two small heads.
const Case kCases[] = {{1, 1, 1, 1},   {1, 3, 1, 2},     {2, 7, 3, 5},   {1, 65, 2, 17},
                       {2, 130, 3, 8}, {1, 256, 12, 64}, {1, 1024, 2, 8}};

struct Forward {
  std::vector<float> out, probs;
};
Forward run_forward(const core::ExecContext& ctx, const Case& c, const std::vector<float>& qkv) {
  Forward f{std::vector<float>(c.out_numel(), kNaN), std::vector<float>(c.probs_numel(), kNaN)};
  attention(ctx, {.out = view_of(f.out, c.out()),
                  .probs = view_of(f.probs, c.probs()),
                  .qkv = view_of(qkv, c.qkv())});
  testing::fetch(f.out);  // the callers read them on the host
  testing::fetch(f.probs);
  return f;
}

TEST(Attention, ForwardMatchesReference) {
  std::uint64_t seed = 1;
  for (const Case& c : kCases) {
    const auto qkv = randn(c.qkv_numel(), seed++);
    const Forward f = run_forward(cpu_ctx(), c, qkv);
    Forward r{std::vector<float>(c.out_numel(), kNaN), std::vector<float>(c.probs_numel(), kNaN)};
    ref::attention_forward({.out = r.out.data(),
                            .probs = r.probs.data(),
                            .qkv = qkv.data(),
                            .batch = c.B,
                            .seq_len = c.T,
                            .num_heads = c.NH,
                            .head_dim = c.HS});
    EXPECT_TRUE(all_close(c.name("attention out").c_str(), f.out, r.out, kTol));
    EXPECT_TRUE(all_close(c.name("attention probs").c_str(), f.probs, r.probs, kTol));
    // Above the diagonal the contract says exactly 0.
    for (std::int64_t bh = 0; bh < c.B * c.NH; ++bh)
      for (std::int64_t t = 0; t < c.T; ++t)
        for (std::int64_t s = t + 1; s < c.T; ++s)
          ASSERT_EQ(f.probs[(bh * c.T + t) * c.T + s], 0.0f)
              << c.name("probs") << " not 0 above the diagonal at bh=" << bh << " t=" << t
              << " s=" << s;
  }
}

TEST(Attention, BackwardMatchesReference) {
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    const auto qkv = randn(c.qkv_numel(), seed++);
    const auto d_out = randn(c.out_numel(), seed++);
    std::vector<float> out(c.out_numel()), probs(c.probs_numel());
    ref::attention_forward({.out = out.data(),
                            .probs = probs.data(),
                            .qkv = qkv.data(),
                            .batch = c.B,
                            .seq_len = c.T,
                            .num_heads = c.NH,
                            .head_dim = c.HS});
    // d_qkv is overwritten and d_probs is scratch: NaN garbage must not leak into the result.
    std::vector<float> d_qkv(c.qkv_numel(), kNaN), d_probs(c.probs_numel(), kNaN);
    auto d_qkv_ref = d_qkv, d_probs_ref = d_probs;
    attention_backward(cpu_ctx(), {.d_qkv = view_of(d_qkv, c.qkv()),
                                   .d_probs = view_of(d_probs, c.probs()),
                                   .d_out = view_of(d_out, c.out()),
                                   .qkv = view_of(qkv, c.qkv()),
                                   .probs = view_of(probs, c.probs())});
    ref::attention_backward({.d_qkv = d_qkv_ref.data(),
                             .d_probs = d_probs_ref.data(),
                             .d_out = d_out.data(),
                             .qkv = qkv.data(),
                             .probs = probs.data(),
                             .batch = c.B,
                             .seq_len = c.T,
                             .num_heads = c.NH,
                             .head_dim = c.HS});
    EXPECT_TRUE(all_close(c.name("attention d_qkv").c_str(), d_qkv, d_qkv_ref, kTol));
  }
}

// Changing q, k and v of token j may change outputs at positions >= j only, and must leave the
// earlier outputs and probability rows bitwise unchanged.
TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  const Case c{2, 130, 2, 16};
  const auto qkv = randn(c.qkv_numel(), 7);
  const Forward base = run_forward(cpu_ctx(), c, qkv);
  for (std::int64_t j :
       {std::int64_t{1}, std::int64_t{5}, std::int64_t{64}, std::int64_t{100}, std::int64_t{129}}) {
    auto changed = qkv;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t i = 0; i < c.NH * 3 * c.HS; ++i)
        changed[(b * c.T + j) * c.NH * 3 * c.HS + i] += 10.0f;
    const Forward f = run_forward(cpu_ctx(), c, changed);
    const std::int64_t row = c.NH * c.HS;
    for (std::int64_t b = 0; b < c.B; ++b) {
      const std::vector<float> before(base.out.begin() + b * c.T * row,
                                      base.out.begin() + (b * c.T + j) * row);
      const std::vector<float> after(f.out.begin() + b * c.T * row,
                                     f.out.begin() + (b * c.T + j) * row);
      EXPECT_TRUE(testing::all_equal(("out before changed token " + std::to_string(j)).c_str(),
                                     after, before));
      // And the output at j itself must change (the test has teeth).
      EXPECT_NE(base.out[(b * c.T + j) * row], f.out[(b * c.T + j) * row]);
    }
    for (std::int64_t bh = 0; bh < c.B * c.NH; ++bh) {
      const std::vector<float> before(base.probs.begin() + bh * c.T * c.T,
                                      base.probs.begin() + (bh * c.T + j) * c.T);
      const std::vector<float> after(f.probs.begin() + bh * c.T * c.T,
                                     f.probs.begin() + (bh * c.T + j) * c.T);
      EXPECT_TRUE(testing::all_equal(("probs rows before token " + std::to_string(j)).c_str(),
                                     after, before));
    }
  }
}

// Tasks are (batch, head, row block) and each runs sequentially, so results must not depend on
// the number of threads. On cuda (which has no thread count) the two runs check that a second
// call gives the same bits.
TEST(Attention, IndependentOfThreadCount) {
  const Case c{2, 130, 3, 8};
  const auto qkv = randn(c.qkv_numel(), 8);
  const auto d_out = randn(c.out_numel(), 9);
  std::vector<float> d_qkv[2];
  Forward f[2];
  for (int t = 0; t < 2; ++t) {
    f[t] = run_forward(cpu_ctx(t + 1), c, qkv);
    d_qkv[t].assign(c.qkv_numel(), kNaN);
    std::vector<float> d_probs(c.probs_numel());
    attention_backward(cpu_ctx(t + 1), {.d_qkv = testing::dev(d_qkv[t]),
                                        .d_probs = testing::dev(d_probs),
                                        .d_out = testing::dev(d_out),
                                        .qkv = testing::dev(qkv),
                                        .probs = testing::dev(f[t].probs),
                                        .batch = c.B,
                                        .seq_len = c.T,
                                        .num_heads = c.NH,
                                        .head_dim = c.HS});
  }
  EXPECT_TRUE(testing::all_equal("attention out 1 vs 2 threads", f[0].out, f[1].out));
  EXPECT_TRUE(testing::all_equal("attention d_qkv 1 vs 2 threads", d_qkv[0], d_qkv[1]));
}

TEST(Attention, RejectsBadArguments) {
  std::vector<float> buf(64);
  AttentionForwardArgs args{.out = testing::dev(buf),
                            .probs = testing::dev(buf),
                            .qkv = nullptr,
                            .batch = 1,
                            .seq_len = 2,
                            .num_heads = 1,
                            .head_dim = 2};
  EXPECT_THROW(attention_forward(cpu_ctx(), args), core::InvalidArgument);
  args.qkv = testing::dev(buf);
  args.head_dim = 0;
  EXPECT_THROW(attention_forward(cpu_ctx(), args), core::InvalidArgument);
}

// The reference backward in double against central differences of the reference forward, with
// loss = sum(w_up * out): d_out = w_up. probs is recomputed by every forward.
// The views give the sizes (B, T, NH and HS from qkv) and are checked against each other: the
// error names the op and the view.
TEST(Attention, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  const Case c{2, 3, 2, 4};
  std::vector<float> qkv(c.qkv_numel()), out(c.out_numel()), probs(c.probs_numel());
  const AttentionViews ok{.out = view_of(out, c.out()),
                          .probs = view_of(probs, c.probs()),
                          .qkv = view_of(qkv, c.qkv())};
  auto error = [](const AttentionViews& v) {
    return testing::invalid_argument_of([&] { attention(cpu_ctx(), v); });
  };
  EXPECT_EQ(error(ok), "no error");
  AttentionViews v = ok;
  v.qkv = testing::view_claiming(qkv, {c.B * c.T, 3 * c.NH * c.HS});
  EXPECT_NE(error(v).find("attention: view `qkv` must be 4-D"), std::string::npos) << error(v);
  v = ok;
  v.qkv = testing::view_claiming(qkv, {c.B, c.T, c.NH, 3 * 2 * c.HS});  // twice the head size
  EXPECT_NE(error(v).find("view `out` has shape (2, 3, 8), the op needs (2, 3, 16)"),
            std::string::npos)
      << error(v);
  v = ok;
  v.doc = view_of(out, {c.B, c.T, c.NH * c.HS});
  EXPECT_NE(error(v).find("view `doc` holds f32, the op needs i32"), std::string::npos) << error(v);
  const std::string bwd = testing::invalid_argument_of([&] {
    attention_backward(cpu_ctx(), {.d_qkv = view_of(qkv, c.qkv()),
                                   .d_out = view_of(out, c.out()),
                                   .qkv = view_of(qkv, c.qkv()),
                                   .probs = view_of(probs, c.probs())});
  });
  EXPECT_NE(bwd.find("attention_backward: view `d_probs` is empty"), std::string::npos) << bwd;
}

TEST(AttentionReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  const Case c{2, 4, 2, 3};
  auto qkv = randn<double>(c.qkv_numel(), 11);
  const auto d_out = randn<double>(c.out_numel(), 12);
  std::vector<double> out(c.out_numel()), probs(c.probs_numel());
  auto forward = [&] {
    ref::attention_forward<double>({.out = out.data(),
                                    .probs = probs.data(),
                                    .qkv = qkv.data(),
                                    .batch = c.B,
                                    .seq_len = c.T,
                                    .num_heads = c.NH,
                                    .head_dim = c.HS});
  };
  auto loss = [&] {
    forward();
    return testing::dot(d_out, out);
  };
  forward();
  std::vector<double> d_qkv(c.qkv_numel()), d_probs(c.probs_numel());
  ref::attention_backward<double>({.d_qkv = d_qkv.data(),
                                   .d_probs = d_probs.data(),
                                   .d_out = d_out.data(),
                                   .qkv = qkv.data(),
                                   .probs = probs.data(),
                                   .batch = c.B,
                                   .seq_len = c.T,
                                   .num_heads = c.NH,
                                   .head_dim = c.HS});
  EXPECT_TRUE(all_close("attention d_qkv vs finite differences", d_qkv,
                        testing::numeric_grad(qkv, loss), testing::kFiniteDiffTol));
}

}  // namespace
}  // namespace trident::kernels
