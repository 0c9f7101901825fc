// Flash attention against its reference (scores materialized in double) and against the unfused
// attention kernel: forward output and every gradient, with and without ALiBi and dropout, plus
// causality and the ALiBi slopes of BLOOM.
//
// Tolerances are relative to the largest reference value: 2e-6 forward, 2e-5 gradients. On cuda
// the online softmax runs through the device expf (2 ulp) with FMA-contracted updates: the output
// is a weighted average whose weights carry ~3e-7 relative error, so 2e-6 still holds; the
// dropout masks are the CPU's bits (the same Philox stream).
#include "trident/kernels/flash_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

std::vector<float> randn(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// max |a - b| / max |b|; infinite when a and b differ in size or a NaN is in either. Reads both
// on the host (testing::fetch: a kernel's output comes back first).
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  testing::fetch(a);
  testing::fetch(b);
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

struct Case {
  std::int64_t B, T, NH, HS;
  bool alibi;
  float dropout;
};

// The test's name in CTest (gtest_discover_tests prints the parameter): without this, gtest prints
// the struct's bytes, padding included, and the names change from build to build.
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_NH" << c.NH << "_HS" << c.HS << (c.alibi ? "_alibi" : "")
      << "_p" << c.dropout;
}

class FlashAttention : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttention, MatchesReference) {
  const Case c = GetParam();
  const std::int64_t C = c.NH * c.HS;
  const auto qkv = randn(static_cast<std::size_t>(c.B * c.T * 3 * C), 1);
  const auto d_out = randn(static_cast<std::size_t>(c.B * c.T * C), 2);
  std::vector<float> slopes(static_cast<std::size_t>(c.NH));
  alibi_slopes(c.NH, slopes.data());
  AttentionDropout drop{.p = c.dropout,
                        .seed = 5,
                        .stream = 77,
                        .first_sample = 3,
                        .head_offset = 2,
                        .total_heads = c.NH + 4};
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<float> out(d_out.size(), NAN), lse(static_cast<std::size_t>(c.B * c.NH * c.T), NAN);
  std::vector<float> out_ref(out.size()), lse_ref(lse.size());
  // The op over typed views (B, T, NH, HS from qkv), the reference over the backend contract.
  const core::Shape qkv_shape{c.B, c.T, c.NH, 3 * c.HS}, out_shape{c.B, c.T, C};
  const core::Shape lse_shape{c.B, c.NH, c.T}, heads{c.NH};
  const core::TensorView alibi = c.alibi ? testing::view_of(slopes, heads) : core::TensorView{};
  flash_attention(ctx, {.out = testing::view_of(out, out_shape),
                        .lse = testing::view_of(lse, lse_shape),
                        .qkv = testing::view_of(qkv, qkv_shape),
                        .alibi = alibi,
                        .dropout = drop});
  FlashAttentionForwardArgs fa{.out = out_ref.data(),
                               .lse = lse_ref.data(),
                               .qkv = qkv.data(),
                               .alibi = c.alibi ? slopes.data() : nullptr,
                               .dropout = drop,
                               .batch = c.B,
                               .seq_len = c.T,
                               .num_heads = c.NH,
                               .head_dim = c.HS};
  ref::flash_attention_forward(fa);
  testing::fetch(out);  // the reference backward below reads them on the host
  testing::fetch(lse);
  EXPECT_LE(rel(out, out_ref), 2e-6) << "out";
  EXPECT_LE(rel(lse, lse_ref), 2e-6) << "lse";
  if (c.T <= 128) {  // a second call gives the same bits
    std::vector<float> again(out.size(), NAN), lse_again(lse.size(), NAN);
    flash_attention(ctx, {.out = testing::view_of(again, out_shape),
                          .lse = testing::view_of(lse_again, lse_shape),
                          .qkv = testing::view_of(qkv, qkv_shape),
                          .alibi = alibi,
                          .dropout = drop});
    EXPECT_TRUE(testing::all_equal("out, second call", again, out));
    EXPECT_TRUE(testing::all_equal("lse, second call", lse_again, lse));
  }

  std::vector<float> d_qkv(qkv.size(), NAN), d_qkv_ref(qkv.size());
  flash_attention_backward(ctx, {.d_qkv = testing::view_of(d_qkv, qkv_shape),
                                 .d_out = testing::view_of(d_out, out_shape),
                                 .qkv = testing::view_of(qkv, qkv_shape),
                                 .out = testing::view_of(out, out_shape),
                                 .lse = testing::view_of(lse, lse_shape),
                                 .alibi = alibi,
                                 .dropout = drop});
  ref::flash_attention_backward({.d_qkv = d_qkv_ref.data(),
                                 .d_out = d_out.data(),
                                 .qkv = qkv.data(),
                                 .out = out.data(),
                                 .lse = lse.data(),
                                 .alibi = c.alibi ? slopes.data() : nullptr,
                                 .dropout = drop,
                                 .batch = c.B,
                                 .seq_len = c.T,
                                 .num_heads = c.NH,
                                 .head_dim = c.HS});
  EXPECT_LE(rel(d_qkv, d_qkv_ref), 2e-5) << "d_qkv";
  for (float x : testing::fetch(d_qkv)) ASSERT_TRUE(std::isfinite(x));

  // Without ALiBi and dropout the unfused kernel computes the same function.
  if (!c.alibi && c.dropout == 0.0f) {
    std::vector<float> out2(out.size(), NAN),
        probs(static_cast<std::size_t>(c.B * c.NH * c.T * c.T), NAN);
    attention_forward(ctx, {.out = testing::dev(out2),
                            .probs = testing::dev(probs),
                            .qkv = testing::dev(qkv),
                            .batch = c.B,
                            .seq_len = c.T,
                            .num_heads = c.NH,
                            .head_dim = c.HS});
    EXPECT_LE(rel(out, out2), 2e-6);
    std::vector<float> d_qkv2(qkv.size(), NAN), d_probs(probs.size(), NAN);
    attention_backward(ctx, {.d_qkv = testing::dev(d_qkv2),
                             .d_probs = testing::dev(d_probs),
                             .d_out = testing::dev(d_out),
                             .qkv = testing::dev(qkv),
                             .probs = testing::dev(probs),
                             .batch = c.B,
                             .seq_len = c.T,
                             .num_heads = c.NH,
                             .head_dim = c.HS});
    EXPECT_LE(rel(d_qkv, d_qkv2), 2e-5);
  }
}

// Single elements, odd sizes, B * NH * T mostly not a multiple of the CUDA kernels' 4 warps per
// block (1, 42, 66, 195, 582, 38, 123, 39, 1027: tail warps that return at once), ALiBi and
// dropout, the head sizes of real models (64 GPT-2, 80 and 96, 128, 256 the CUDA kernels' limit: 8
// per lane), and a sequence past GPT-2's 1024 at one head (on the emulator about 20 s: every
// (query, key) pair is a few warp reductions).
INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttention,
    ::testing::Values(Case{1, 1, 1, 1, false, 0.0f}, Case{2, 7, 3, 5, false, 0.0f},
                      Case{1, 33, 2, 16, false, 0.0f}, Case{2, 70, 4, 8, true, 0.0f},
                      Case{1, 65, 3, 16, true, 0.0f}, Case{2, 40, 2, 8, false, 0.3f},
                      Case{1, 97, 6, 8, true, 0.1f}, Case{1, 19, 2, 256, true, 0.1f},
                      Case{1, 41, 3, 80, false, 0.0f}, Case{3, 13, 1, 96, true, 0.2f},
                      Case{2, 29, 2, 128, false, 0.0f}, Case{1, 21, 2, 64, true, 0.0f},
                      Case{1, 1027, 1, 8, true, 0.0f}));

TEST(FlashAttentionCausality, FutureTokensDoNotChangeThePast) {
  const std::int64_t B = 1, T = 20, NH = 2, HS = 4, C = NH * HS;
  auto qkv = randn(static_cast<std::size_t>(B * T * 3 * C), 3);
  std::vector<float> slopes(NH);
  alibi_slopes(NH, slopes.data());
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<float> a(static_cast<std::size_t>(B * T * C), NAN), b(a.size(), NAN),
      lse(static_cast<std::size_t>(B * NH * T));
  flash_attention_forward(ctx, {.out = testing::dev(a),
                                .lse = testing::dev(lse),
                                .qkv = testing::dev(qkv),
                                .alibi = testing::dev(slopes),
                                .dropout = {},
                                .batch = B,
                                .seq_len = T,
                                .num_heads = NH,
                                .head_dim = HS});
  for (std::int64_t j = 0; j < 3 * C; ++j)
    qkv[static_cast<std::size_t>((T - 1) * 3 * C + j)] += 1.0f;
  flash_attention_forward(ctx, {.out = testing::dev(b),
                                .lse = testing::dev(lse),
                                .qkv = testing::dev(qkv),
                                .alibi = testing::dev(slopes),
                                .dropout = {},
                                .batch = B,
                                .seq_len = T,
                                .num_heads = NH,
                                .head_dim = HS});
  testing::fetch(a);
  testing::fetch(b);
  for (std::int64_t i = 0; i < (T - 1) * C; ++i)
    ASSERT_EQ(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)]);
  EXPECT_NE(a[static_cast<std::size_t>((T - 1) * C)], b[static_cast<std::size_t>((T - 1) * C)])
      << "the changed token's own output must change";
}

// Flash attention's working rows come from the context's workspace: once a shape has been seen,
// further calls (that shape or smaller) allocate nothing, and the results do not depend on whose
// workspace was used.
TEST(FlashAttentionWorkspaceCpuOnly, NoAllocationOnceWarm) {
  TRIDENT_CPU_ONLY("the CPU bodies' workspace; the CUDA kernels keep rows in registers");
  const std::int64_t B = 2, NH = 2, HS = 8, C = NH * HS;
  core::Workspace ws;
  core::ExecContext ctx = testing::backend_ctx();
  ctx.workspace = &ws;
  auto run = [&](const core::ExecContext& on, std::int64_t T) {
    const auto qkv = randn(static_cast<std::size_t>(B * T * 3 * C), 4);
    const auto d_out = randn(static_cast<std::size_t>(B * T * C), 5);
    std::vector<float> out(d_out.size()), lse(static_cast<std::size_t>(B * NH * T)),
        d_qkv(qkv.size());
    const AttentionDropout drop{.p = 0.1f, .seed = 3, .stream = 1};
    flash_attention_forward(on, {.out = out.data(),
                                 .lse = lse.data(),
                                 .qkv = qkv.data(),
                                 .dropout = drop,
                                 .batch = B,
                                 .seq_len = T,
                                 .num_heads = NH,
                                 .head_dim = HS});
    flash_attention_backward(on, {.d_qkv = d_qkv.data(),
                                  .d_out = d_out.data(),
                                  .qkv = qkv.data(),
                                  .out = out.data(),
                                  .lse = lse.data(),
                                  .dropout = drop,
                                  .batch = B,
                                  .seq_len = T,
                                  .num_heads = NH,
                                  .head_dim = HS});
    out.insert(out.end(), d_qkv.begin(), d_qkv.end());
    return out;
  };
  const std::vector<float> first = run(ctx, 70);
  const std::int64_t warm = ws.allocations();
  EXPECT_GT(warm, 0);
  EXPECT_GT(ws.bytes(), 0);
  EXPECT_EQ(run(ctx, 70), first);
  run(ctx, 33);
  EXPECT_EQ(ws.allocations(), warm) << "a warm call allocated";
  core::ExecContext own = testing::backend_ctx();  // no workspace: the thread's own
  own.workspace = nullptr;
  EXPECT_EQ(run(own, 70), first);
}

TEST(AlibiCpuOnly, SlopesFollowTheBloomRule) {
  TRIDENT_CPU_ONLY("a host function, the same on every backend");
  std::vector<float> s(8);
  alibi_slopes(8, s.data());
  for (int i = 0; i < 8; ++i)
    EXPECT_FLOAT_EQ(s[static_cast<std::size_t>(i)], std::pow(2.0f, -(i + 1.0f)));
  // 112 heads (BLOOM-176B): 64 slopes 2^-(i+1)/8, then 48 slopes 2^-(2j+1)/16.
  std::vector<float> b(112);
  alibi_slopes(112, b.data());
  EXPECT_FLOAT_EQ(b[0], std::pow(2.0f, -1.0f / 8));
  EXPECT_FLOAT_EQ(b[63], std::pow(2.0f, -64.0f / 8));
  EXPECT_FLOAT_EQ(b[64], std::pow(2.0f, -1.0f / 16));
  EXPECT_FLOAT_EQ(b[65], std::pow(2.0f, -3.0f / 16));
  EXPECT_FLOAT_EQ(b[111], std::pow(2.0f, -95.0f / 16));
  // 6 heads: 4 power-of-two slopes, then slopes 0 and 2 of the 8-head rule.
  std::vector<float> six(6);
  alibi_slopes(6, six.data());
  EXPECT_FLOAT_EQ(six[4], std::pow(2.0f, -1.0f));
  EXPECT_FLOAT_EQ(six[5], std::pow(2.0f, -3.0f));
}

}  // namespace
}  // namespace trident::kernels
