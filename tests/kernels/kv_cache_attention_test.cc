// KV-cache attention against its double-precision reference, token by token and as a prefill of
// several rows, with and without ALiBi; and against the fused attention over the whole sequence
// (flash_attention.h), which it must reproduce for one sample.
//
// Tolerance |x - ref| <= 1e-6 + 1e-5 |ref|: FP32 dot products and softmax of at most 24 positions
// (on cuda through the device expf, 2 ulp, with FMAs: a few ulp). The caches are copies: exact.
#include "trident/kernels/kv_cache_attention.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;

constexpr testing::Tol kTol{1e-6, 1e-5};

class KvCacheAttention : public ::testing::TestWithParam<bool> {};

TEST_P(KvCacheAttention, MatchesReferenceAndTheFullSequence) {
  const std::int64_t T = 24, NH = 3, HS = 8, C = NH * HS, P = 32;
  const std::vector<float> qkv = randn(T * 3 * C, 11);
  std::vector<float> slopes(NH);
  alibi_slopes(NH, slopes.data());
  const float* alibi = GetParam() ? slopes.data() : nullptr;
  std::vector<float> kc(P * C), vc(P * C), rkc(P * C), rvc(P * C);
  std::vector<float> out(T * C, NAN), want(T * C);
  std::vector<float> scratch(static_cast<std::size_t>(kv_cache_attention_scratch_floats(P, NH)));
  // Prefill 5 rows, then one token at a time.
  for (std::int64_t pos = 0; pos < T; pos += pos == 0 ? 5 : 1) {
    const std::int64_t rows = pos == 0 ? 5 : 1;
    KvCacheAttentionArgs a{.out = out.data() + pos * C,
                           .k_cache = kc.data(),
                           .v_cache = vc.data(),
                           .qkv = qkv.data() + pos * 3 * C,
                           .alibi = alibi,
                           .rows = rows,
                           .position = pos,
                           .max_positions = P,
                           .num_heads = NH,
                           .head_dim = HS,
                           .scratch = scratch};
    const core::Shape cache{P, C};
    kv_cache_attention(
        testing::backend_ctx(),
        {.out = testing::view_at(out, pos * C, {rows, C}),
         .k_cache = testing::view_of(kc, cache),
         .v_cache = testing::view_of(vc, cache),
         .qkv = testing::view_at(qkv, pos * 3 * C, {rows, NH, 3 * HS}),
         .alibi = alibi != nullptr ? testing::view_of(slopes, {NH}) : core::TensorView{},
         .position = pos,
         .scratch = testing::dev_span(scratch)});
    a.out = want.data() + pos * C;
    a.k_cache = rkc.data();
    a.v_cache = rvc.data();
    ref::kv_cache_attention(a);
  }
  EXPECT_TRUE(all_close("out vs ref", out, want, kTol));
  EXPECT_TRUE(testing::all_equal("k cache", kc, rkc));
  std::vector<float> full(T * C, NAN), lse(NH * T);
  flash_attention_forward(testing::backend_ctx(),
                          {.out = testing::dev(full),
                           .lse = testing::dev(lse),
                           .qkv = testing::dev(qkv),
                           .alibi = GetParam() ? testing::dev(slopes) : nullptr,
                           .dropout = {},
                           .batch = 1,
                           .seq_len = T,
                           .num_heads = NH,
                           .head_dim = HS});
  EXPECT_TRUE(all_close("out vs flash attention", out, full, kTol));
}

INSTANTIATE_TEST_SUITE_P(Alibi, KvCacheAttention, ::testing::Bool());

TEST(KvCacheAttentionErrors, ViewsThatDisagreeAreClearErrors) {
  const std::int64_t NH = 2, HS = 4, C = NH * HS, P = 6;
  std::vector<float> qkv(3 * C), out(C), kc(P * C), vc((P - 1) * C);
  std::vector<float> scratch(static_cast<std::size_t>(kv_cache_attention_scratch_floats(P, NH)));
  const std::string e = testing::invalid_argument_of([&] {
    kv_cache_attention(testing::backend_ctx(), {.out = testing::view_of(out, {1, C}),
                                                .k_cache = testing::view_of(kc, {P, C}),
                                                .v_cache = testing::view_of(vc, {P - 1, C}),
                                                .qkv = testing::view_of(qkv, {1, NH, 3 * HS}),
                                                .scratch = testing::dev_span(scratch)});
  });
  EXPECT_NE(e.find("kv_cache_attention: view `v_cache` has shape (5, 8), the op needs (6, 8)"),
            std::string::npos)
      << e;
}

TEST(KvCacheAttentionErrors, PastTheCache) {
  std::vector<float> buf(64), scratch(8);
  float* const d = testing::dev(buf);
  EXPECT_THROW(kv_cache_attention(testing::backend_ctx(), {.out = d,
                                                           .k_cache = d,
                                                           .v_cache = d,
                                                           .qkv = d,
                                                           .rows = 1,
                                                           .position = 4,
                                                           .max_positions = 4,
                                                           .num_heads = 1,
                                                           .head_dim = 2,
                                                           .scratch = testing::dev_span(scratch)}),
               core::InvalidArgument);
}

}  // namespace
}  // namespace trident::kernels
