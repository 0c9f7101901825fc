// Token + position embedding forward/backward against the reference, including vocab-parallel
// shards (tokens owned by another rank contribute 0), repeated tokens (scatter-add), no position
// table, a position offset, and thread-count independence.
//
// Tolerances: forward is one FP32 add per element, so |x - ref| <= 1e-7 + 1e-7 |ref|. Backward sums
// up to B*T = 256 gradients per wte row in FP32 (the reference in double): 1e-6 + 1e-5 |ref|.
// The CUDA kernels are the CPU's bits (docs/gpu.md): the same adds, the backward walking the rows
// in the CPU's order.
#include "trident/kernels/embedding.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/memory.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr Tol kForwardTol{1e-7, 1e-7};
constexpr Tol kBackwardTol{1e-6, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct Case {
  std::int64_t B, T, C, vocab_start, vocab_local, vocab_total, position_offset;
  bool has_wpe;
  std::string name(const char* tensor) const {
    return std::string(tensor) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
           " C=" + std::to_string(C) + " shard=[" + std::to_string(vocab_start) + "," +
           std::to_string(vocab_start + vocab_local) + ")" + (has_wpe ? "" : " no wpe");
  }
};
const Case kCases[] = {
    {1, 1, 1, 0, 1, 1, 0, true},
    {2, 3, 5, 0, 7, 7, 0, true},
    {3, 17, 33, 0, 50, 50, 2, true},           // position offset (generation)
    {2, 8, 64, 10, 20, 45, 0, true},           // vocab-parallel middle shard
    {2, 5, 16, 0, 30, 60, 0, false},           // first shard, no position table
    {4, 64, 768, 6288, 3144, 50304, 0, true},  // GPT-2 small, one shard of 16-way TP
    {2, 33, 96, 0, 50257, 50257, 3, false},    // BLOOM / Llama: no table; the offset is unused
    {1, 1, 7, 0, 3, 3, 9, true},               // one token at position 9 (generation)
};

// Tokens drawn from a small range of the full vocabulary so that rows repeat.
std::vector<std::int32_t> make_tokens(const Case& c, std::uint64_t seed) {
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  const std::uint32_t range = static_cast<std::uint32_t>(std::min<std::int64_t>(c.vocab_total, 97));
  std::vector<std::int32_t> tokens(c.B * c.T);
  for (auto& t : tokens) {
    t = static_cast<std::int32_t>(gen() % range);
    if (c.vocab_total > 97 && gen() % 2) t = static_cast<std::int32_t>(gen() % c.vocab_total);
  }
  return tokens;
}

TEST(Embedding, ForwardMatchesReference) {
  std::uint64_t seed = 1;
  for (const Case& c : kCases) {
    const auto tokens = make_tokens(c, seed++);
    const auto wte = randn(c.vocab_local * c.C, seed++);
    const auto wpe = randn((c.position_offset + c.T) * c.C, seed++);
    std::vector<float> out(c.B * c.T * c.C, kNaN), out_ref(c.B * c.T * c.C, kNaN);
    embedding(cpu_ctx(),
              {.out = view_of(out, {c.B, c.T, c.C}),
               .tokens = view_of(tokens, {c.B, c.T}),
               .wte = view_of(wte, {c.vocab_local, c.C}),
               .wpe = c.has_wpe ? view_of(wpe, {c.position_offset + c.T, c.C}) : core::TensorView{},
               .vocab_start = c.vocab_start,
               .position_offset = c.position_offset});
    ref::embedding_forward({.out = out_ref.data(),
                            .tokens = tokens.data(),
                            .wte = wte.data(),
                            .wpe = c.has_wpe ? wpe.data() : nullptr,
                            .batch = c.B,
                            .seq_len = c.T,
                            .hidden = c.C,
                            .vocab_start = c.vocab_start,
                            .vocab_local = c.vocab_local,
                            .position_offset = c.position_offset});
    EXPECT_TRUE(all_close(c.name("embedding out").c_str(), out, out_ref, kForwardTol));
  }
}

TEST(Embedding, BackwardMatchesReferenceAndAccumulates) {
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    const auto tokens = make_tokens(c, seed++);
    const auto d_out = randn(c.B * c.T * c.C, seed++);
    auto d_wte = randn(c.vocab_local * c.C, seed++);  // prefilled: += semantics
    auto d_wpe = randn(c.T * c.C, seed++);
    auto d_wte_ref = d_wte, d_wpe_ref = d_wpe;
    embedding_backward(cpu_ctx(),
                       {.d_wte = view_of(d_wte, {c.vocab_local, c.C}),
                        .d_wpe = c.has_wpe ? view_of(d_wpe, {c.T, c.C}) : core::TensorView{},
                        .d_out = view_of(d_out, {c.B, c.T, c.C}),
                        .tokens = view_of(tokens, {c.B, c.T}),
                        .vocab_start = c.vocab_start});
    ref::embedding_backward({.d_wte = d_wte_ref.data(),
                             .d_wpe = c.has_wpe ? d_wpe_ref.data() : nullptr,
                             .d_out = d_out.data(),
                             .tokens = tokens.data(),
                             .batch = c.B,
                             .seq_len = c.T,
                             .hidden = c.C,
                             .vocab_start = c.vocab_start,
                             .vocab_local = c.vocab_local});
    EXPECT_TRUE(all_close(c.name("embedding d_wte").c_str(), d_wte, d_wte_ref, kBackwardTol));
    EXPECT_TRUE(all_close(c.name("embedding d_wpe").c_str(), d_wpe, d_wpe_ref, kBackwardTol));
  }
}

// Closed form for a vocab-parallel shard: a token of another rank gives exactly the position row.
TEST(Embedding, TokensOfOtherShardsContributeZero) {
  const std::int64_t C = 4;
  const std::vector<std::int32_t> tokens = {3, 12, 15, 20};  // shard [10, 20): only 12, 15
  std::vector<float> wte(10 * C), wpe(4 * C), out(4 * C, kNaN);
  for (std::size_t i = 0; i < wte.size(); ++i) wte[i] = 100.0f + static_cast<float>(i);
  for (std::size_t i = 0; i < wpe.size(); ++i) wpe[i] = static_cast<float>(i);
  embedding_forward(cpu_ctx(), {.out = testing::dev(out),
                                .tokens = testing::dev(tokens),
                                .wte = testing::dev(wte),
                                .wpe = testing::dev(wpe),
                                .batch = 1,
                                .seq_len = 4,
                                .hidden = C,
                                .vocab_start = 10,
                                .vocab_local = 10});
  testing::fetch(out);
  for (std::int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(out[0 * C + c], wpe[0 * C + c]);
    EXPECT_EQ(out[1 * C + c], wte[2 * C + c] + wpe[1 * C + c]);
    EXPECT_EQ(out[2 * C + c], wte[5 * C + c] + wpe[2 * C + c]);
    EXPECT_EQ(out[3 * C + c], wpe[3 * C + c]);
  }
}

// On cuda (no thread count) the two runs check that a second call gives the same bits.
TEST(Embedding, BackwardIsIndependentOfThreadCount) {
  const Case c{3, 50, 200, 0, 100, 100, 0, true};
  const auto tokens = make_tokens(c, 5);
  const auto d_out = randn(c.B * c.T * c.C, 6);
  std::vector<float> d_wte[2], d_wpe[2];
  for (int t = 0; t < 2; ++t) {
    d_wte[t].assign(c.vocab_local * c.C, 0.5f);
    d_wpe[t].assign(c.T * c.C, -0.5f);
    embedding_backward(cpu_ctx(t + 1), {.d_wte = testing::dev(d_wte[t]),
                                        .d_wpe = testing::dev(d_wpe[t]),
                                        .d_out = testing::dev(d_out),
                                        .tokens = testing::dev(tokens),
                                        .batch = c.B,
                                        .seq_len = c.T,
                                        .hidden = c.C,
                                        .vocab_start = 0,
                                        .vocab_local = c.vocab_local});
  }
  EXPECT_TRUE(testing::all_equal("d_wte 1 vs 2 threads", d_wte[0], d_wte[1]));
  EXPECT_TRUE(testing::all_equal("d_wpe 1 vs 2 threads", d_wpe[0], d_wpe[1]));
}

TEST(Embedding, RejectsNegativeTokens) {
  const std::vector<std::int32_t> tokens = {1, -3};
  std::vector<float> wte(8), out(8);
  // The CPU throws at the call; a device at the stream's next read-back or synchronize()
  // (kernels/cuda/cuda_util.cuh), having skipped the bad row meanwhile.
  try {
    embedding_forward(cpu_ctx(), {.out = testing::dev(out),
                                  .tokens = testing::dev(tokens),
                                  .wte = testing::dev(wte),
                                  .batch = 1,
                                  .seq_len = 2,
                                  .hidden = 4,
                                  .vocab_local = 2});
    synchronize(cpu_ctx());
    ADD_FAILURE() << "negative token accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_forward: tokens[1] = -3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      {
        embedding_backward(cpu_ctx(), {.d_wte = testing::dev(wte),
                                       .d_out = testing::dev(out),
                                       .tokens = testing::dev(tokens),
                                       .batch = 1,
                                       .seq_len = 2,
                                       .hidden = 4,
                                       .vocab_local = 2});
        synchronize(cpu_ctx());
      },
      core::InvalidArgument);
  // Reported once: the next call and sync are clean.
  const std::vector<std::int32_t> good = {1, 0};
  embedding_forward(cpu_ctx(), {.out = testing::dev(out),
                                .tokens = testing::dev(good),
                                .wte = testing::dev(wte),
                                .batch = 1,
                                .seq_len = 2,
                                .hidden = 4,
                                .vocab_local = 2});
  EXPECT_NO_THROW(synchronize(cpu_ctx()));
}

// The views give the sizes (B, T from tokens; vocab_local, C from the word table) and are checked
// before a pointer is read: a position table too short for the sequence is refused, naming it.
TEST(Embedding, ViewsOfTheWrongDtypeOrShapeAreClearErrors) {
  const std::int64_t B = 2, T = 4, C = 3, V = 5;
  const std::vector<std::int32_t> tokens(B * T, 1);
  std::vector<float> out(B * T * C), wte(V * C), wpe(T * C);
  const EmbeddingViews ok{.out = view_of(out, {B, T, C}),
                          .tokens = view_of(tokens, {B, T}),
                          .wte = view_of(wte, {V, C}),
                          .wpe = view_of(wpe, {T, C})};
  auto error = [](const EmbeddingViews& v) {
    return testing::invalid_argument_of([&] { embedding(cpu_ctx(), v); });
  };
  EXPECT_EQ(error(ok), "no error");
  EmbeddingViews v = ok;
  v.position_offset = 1;  // positions 1..4 of a 4-row table
  EXPECT_NE(error(v).find("embedding: view `wpe` holds 4 positions, the op reads 5"),
            std::string::npos)
      << error(v);
  v = ok;
  v.tokens = view_of(out, {B, T * C});
  EXPECT_NE(error(v).find("view `tokens` holds f32, the op needs i32"), std::string::npos)
      << error(v);
  v = ok;
  v.wpe = testing::view_claiming(wpe, {T * C / 2, 2});
  EXPECT_NE(error(v).find("view `wpe` has shape (6, 2), the op needs (6, 3)"), std::string::npos)
      << error(v);
  v = ok;
  v.out = testing::view_claiming(out, {B * T, C});
  EXPECT_NE(error(v).find("view `out` has shape (8, 3), the op needs (2, 4, 3)"), std::string::npos)
      << error(v);
  const std::string bwd = testing::invalid_argument_of([&] {
    embedding_backward(cpu_ctx(), {.d_wte = view_of(wte, {V, C}),
                                   .d_out = view_of(out, {B, T, C}),
                                   .tokens = testing::view_claiming(tokens, {B * T})});
  });
  EXPECT_NE(bwd.find("embedding_backward: view `tokens` must be 2-D"), std::string::npos) << bwd;
}

}  // namespace
}  // namespace trident::kernels
