// Documents inside a sample (--reset-attention-mask, --reset-position-ids): the attention kernels
// with per-token document ids, the rotary expansion and the position embedding with per-row
// position ids, each against its double-precision reference; and, independently of any
// reference, each document's attention output and gradients equal those of the document run
// alone as its own sample. Every backend (the CUDA bodies on the emulated GPU in CI).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/rope.h"

namespace trident::kernels {
namespace {

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  testing::fetch(a);  // a kernel's output comes back first
  testing::fetch(b);
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    if (std::isnan(a[i])) diff = INFINITY;
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// Document ids of B samples of T tokens, documents starting at `starts` (sample b's own list).
std::vector<std::int32_t> doc_ids(std::int64_t T, const std::vector<std::vector<int>>& starts) {
  std::vector<std::int32_t> d;
  for (const auto& s : starts) {
    int doc = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      while (doc + 1 < static_cast<int>(s.size()) && t >= s[static_cast<std::size_t>(doc + 1)])
        ++doc;
      d.push_back(doc);
    }
  }
  return d;
}

struct Outputs {
  std::vector<float> out, d_qkv;
};

// Flash (with ALiBi when `alibi`) or unfused attention forward + backward: the ops over typed
// views, or (reference) the references over the backend contract.
Outputs run(bool flash, bool alibi, std::int64_t B, std::int64_t T, std::int64_t NH,
            std::int64_t HS, const std::vector<float>& qkv, const std::vector<float>& d_out,
            const std::vector<std::int32_t>* doc_ids, bool reference) {
  const std::int64_t C = NH * HS;
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<float> slopes(static_cast<std::size_t>(NH));
  alibi_slopes(NH, slopes.data());
  Outputs o{std::vector<float>(static_cast<std::size_t>(B * T * C), NAN),
            std::vector<float>(qkv.size(), NAN)};
  const core::Shape qkv_shape{B, T, NH, 3 * HS}, out_shape{B, T, C};
  const std::int32_t* doc = doc_ids ? doc_ids->data() : nullptr;
  // The ops' views: this backend's copies of the buffers (empty doc: one document).
  auto v = [&](const auto& vec, core::Shape shape) {
    return reference ? core::TensorView{} : testing::view_of(vec, std::move(shape));
  };
  const core::TensorView doc_view = doc_ids ? v(*doc_ids, {B, T}) : core::TensorView{};
  if (flash) {
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T), NAN);
    FlashAttentionForwardArgs f{.out = o.out.data(),
                                .lse = lse.data(),
                                .qkv = qkv.data(),
                                .alibi = alibi ? slopes.data() : nullptr,
                                .dropout = {},
                                .batch = B,
                                .seq_len = T,
                                .num_heads = NH,
                                .head_dim = HS,
                                .doc = doc};
    const core::TensorView alibi_view = alibi ? v(slopes, {NH}) : core::TensorView{};
    if (reference) {
      ref::flash_attention_forward(f);
    } else {
      flash_attention(ctx, {.out = v(o.out, out_shape),
                            .lse = v(lse, {B, NH, T}),
                            .qkv = v(qkv, qkv_shape),
                            .alibi = alibi_view,
                            .doc = doc_view,
                            .dropout = {}});
    }
    FlashAttentionBackwardArgs b{.d_qkv = o.d_qkv.data(),
                                 .d_out = d_out.data(),
                                 .qkv = qkv.data(),
                                 .out = o.out.data(),
                                 .lse = lse.data(),
                                 .alibi = alibi ? slopes.data() : nullptr,
                                 .dropout = {},
                                 .batch = B,
                                 .seq_len = T,
                                 .num_heads = NH,
                                 .head_dim = HS,
                                 .doc = doc};
    if (reference) {
      ref::flash_attention_backward(b);
    } else {
      flash_attention_backward(ctx, {.d_qkv = v(o.d_qkv, qkv_shape),
                                     .d_out = v(d_out, out_shape),
                                     .qkv = v(qkv, qkv_shape),
                                     .out = v(o.out, out_shape),
                                     .lse = v(lse, {B, NH, T}),
                                     .alibi = alibi_view,
                                     .doc = doc_view,
                                     .dropout = {}});
      testing::fetch(o.out);
      testing::fetch(o.d_qkv);
    }
    return o;
  }
  std::vector<float> probs(static_cast<std::size_t>(B * NH * T * T), NAN), d_probs(probs.size());
  const AttentionForwardArgs f{.out = o.out.data(),
                               .probs = probs.data(),
                               .qkv = qkv.data(),
                               .batch = B,
                               .seq_len = T,
                               .num_heads = NH,
                               .head_dim = HS,
                               .doc = doc};
  const core::Shape probs_shape{B, NH, T, T};
  if (reference) {
    ref::attention_forward(f);
  } else {
    attention(ctx, {.out = v(o.out, out_shape),
                    .probs = v(probs, probs_shape),
                    .qkv = v(qkv, qkv_shape),
                    .doc = doc_view});
  }
  const AttentionBackwardArgs b{.d_qkv = o.d_qkv.data(),
                                .d_probs = d_probs.data(),
                                .d_out = d_out.data(),
                                .qkv = qkv.data(),
                                .probs = probs.data(),
                                .batch = B,
                                .seq_len = T,
                                .num_heads = NH,
                                .head_dim = HS};
  if (reference) {
    ref::attention_backward(b);
  } else {
    attention_backward(ctx, {.d_qkv = v(o.d_qkv, qkv_shape),
                             .d_probs = v(d_probs, probs_shape),
                             .d_out = v(d_out, out_shape),
                             .qkv = v(qkv, qkv_shape),
                             .probs = v(probs, probs_shape)});
    testing::fetch(o.out);
    testing::fetch(o.d_qkv);
  }
  return o;
}

// T = 150 spans several query (32) and key (64) blocks of the flash kernel: the long last
// document of sample 0 starts past the first key block, so its queries see whole key blocks of
// other documents only (masked entirely); sample 1 has a one-token document and ends with an EOD.
constexpr std::int64_t kB = 2, kT = 150, kNH = 3, kHS = 8;
const std::vector<std::vector<int>> kStarts = {{0, 5, 40, 41, 97}, {0, 1, 2, 77, 149}};

TEST(DocumentAttention, MatchesTheReference) {
  const std::int64_t C = kNH * kHS;
  const auto qkv = normal(static_cast<std::size_t>(kB * kT * 3 * C), 1);
  const auto d_out = normal(static_cast<std::size_t>(kB * kT * C), 2);
  const auto doc = doc_ids(kT, kStarts);
  for (const bool flash : {true, false}) {
    for (const bool alibi : {false, true}) {
      if (!flash && alibi) continue;  // the unfused kernel has no ALiBi
      const std::string tag = std::string(flash ? "flash" : "unfused") + (alibi ? " alibi" : "");
      const Outputs got = run(flash, alibi, kB, kT, kNH, kHS, qkv, d_out, &doc, false);
      const Outputs want = run(flash, alibi, kB, kT, kNH, kHS, qkv, d_out, &doc, true);
      EXPECT_LE(rel(got.out, want.out), 2e-6) << tag << " out";
      EXPECT_LE(rel(got.d_qkv, want.d_qkv), 2e-5) << tag << " d_qkv";
      // The masks matter: without them the result differs.
      const Outputs causal = run(flash, alibi, kB, kT, kNH, kHS, qkv, d_out, nullptr, true);
      EXPECT_GT(rel(causal.out, want.out), 1e-2) << tag;
    }
  }
}

// Each document alone, as a sample of its own length: the same rows of out and d_qkv (ALiBi's
// bias depends only on key - query within a document, so it too is unchanged).
TEST(DocumentAttention, EachDocumentAsIfAlone) {
  const std::int64_t C = kNH * kHS;
  const auto qkv = normal(static_cast<std::size_t>(kB * kT * 3 * C), 3);
  const auto d_out = normal(static_cast<std::size_t>(kB * kT * C), 4);
  const auto doc = doc_ids(kT, kStarts);
  for (const bool flash : {true, false}) {
    const Outputs whole = run(flash, flash, kB, kT, kNH, kHS, qkv, d_out, &doc, false);
    for (std::int64_t b = 0; b < kB; ++b) {
      const auto& s = kStarts[static_cast<std::size_t>(b)];
      for (std::size_t d = 0; d < s.size(); ++d) {
        const std::int64_t t0 = s[d], t1 = d + 1 < s.size() ? s[d + 1] : kT, L = t1 - t0;
        const auto rows = [&](const std::vector<float>& v, std::int64_t width) {
          return std::vector<float>(v.begin() + (b * kT + t0) * width,
                                    v.begin() + (b * kT + t1) * width);
        };
        const Outputs alone =
            run(flash, flash, 1, L, kNH, kHS, rows(qkv, 3 * C), rows(d_out, C), nullptr, false);
        const std::string tag = std::string(flash ? "flash+alibi" : "unfused") + " sample " +
                                std::to_string(b) + " document " + std::to_string(d);
        EXPECT_LE(rel(rows(whole.out, C), alone.out), 2e-6) << tag;
        EXPECT_LE(rel(rows(whole.d_qkv, 3 * C), alone.d_qkv), 2e-5) << tag;
      }
    }
  }
}

// Per-row positions of 2 samples of 37 tokens: documents start at t = 0, 11 and 30.
std::vector<std::int32_t> document_positions(std::int64_t T, std::int64_t rows) {
  std::vector<std::int32_t> pos;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = r % T;
    pos.push_back(static_cast<std::int32_t>(t < 11 ? t : t < 30 ? t - 11 : t - 30));
  }
  return pos;
}

// Per-row positions: the rotary expansion against its reference, and against the same kernel on
// each document alone (positions from 0).
TEST(DocumentPositions, Rotary) {
  const std::int64_t T = 37, rows = 2 * T, HS = 8, G = 2, HPG = 2;
  const std::vector<std::int32_t> pos = document_positions(T, rows);
  std::vector<float> freq(HS / 2);
  for (std::int64_t i = 0; i < HS / 2; ++i)
    freq[static_cast<std::size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * i / HS));
  const RopeQkvShape s{.rows = rows,
                       .seq_len = T,
                       .groups = G,
                       .heads_per_group = HPG,
                       .head_dim = HS,
                       .inv_freq = freq.data(),
                       .positions = pos.data()};
  RopeQkvShape on_backend = s;  // the same shape with this backend's copies of the tables
  on_backend.inv_freq = testing::dev(freq);
  on_backend.positions = testing::dev(pos);
  const auto in = normal(static_cast<std::size_t>(rows * s.in_cols()), 5);
  std::vector<float> out(static_cast<std::size_t>(rows * s.out_cols()), NAN), out_r = out;
  rope_qkv_forward(testing::backend_ctx(),
                   {.out = testing::dev(out), .in = testing::dev(in), .shape = on_backend});
  testing::fetch(out);
  ref::rope_qkv_forward({.out = out_r.data(), .in = in.data(), .shape = s});
  EXPECT_LE(rel(out, out_r), 1e-6);
  const auto d_out = normal(out.size(), 6);
  std::vector<float> d_in(in.size(), NAN), d_in_r = d_in;
  rope_qkv_backward(
      testing::backend_ctx(),
      {.d_in = testing::dev(d_in), .d_out = testing::dev(d_out), .shape = on_backend});
  testing::fetch(d_in);
  ref::rope_qkv_backward({.d_in = d_in_r.data(), .d_out = d_out.data(), .shape = s});
  EXPECT_LE(rel(d_in, d_in_r), 1e-6);
  // The third document of sample 1 (t = 30..36) alone, positions 0..6: the same rows.
  RopeQkvShape alone = on_backend;
  alone.rows = 7;
  alone.seq_len = 7;
  alone.positions = nullptr;
  const std::vector<float> in7(in.begin() + (T + 30) * s.in_cols(),
                               in.begin() + (T + 37) * s.in_cols());
  std::vector<float> out7(static_cast<std::size_t>(7 * s.out_cols()));
  rope_qkv_forward(testing::backend_ctx(),
                   {.out = testing::dev(out7), .in = testing::dev(in7), .shape = alone});
  EXPECT_TRUE(testing::all_equal("document alone", out7,
                                 std::vector<float>(out.begin() + (T + 30) * s.out_cols(),
                                                    out.begin() + (T + 37) * s.out_cols())));
}

// Per-row positions in the position embedding, against its reference.
TEST(DocumentPositions, PositionEmbedding) {
  const std::int64_t T = 37, rows = 2 * T, C = 16, P = 64, V = 20;
  const std::vector<std::int32_t> pos = document_positions(T, rows);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) tokens[static_cast<std::size_t>(r)] = (r * 7) % V;
  const auto wte = normal(static_cast<std::size_t>(V * C), 7);
  const auto wpe = normal(static_cast<std::size_t>(P * C), 8);
  std::vector<float> e(static_cast<std::size_t>(rows * C), NAN), e_r = e;
  embedding(testing::backend_ctx(), {.out = testing::view_of(e, {2, T, C}),
                                     .tokens = testing::view_of(tokens, {2, T}),
                                     .wte = testing::view_of(wte, {V, C}),
                                     .wpe = testing::view_of(wpe, {P, C}),
                                     .positions = testing::view_of(pos, {2, T})});
  ref::embedding_forward({.out = e_r.data(),
                          .tokens = tokens.data(),
                          .wte = wte.data(),
                          .wpe = wpe.data(),
                          .batch = 2,
                          .seq_len = T,
                          .hidden = C,
                          .vocab_local = V,
                          .positions = pos.data()});
  EXPECT_EQ(testing::fetch(e), e_r);
  for (std::int64_t c = 0; c < C; ++c) {  // row T + 12 sits at position 1
    EXPECT_EQ(e[static_cast<std::size_t>((T + 12) * C + c)],
              wte[static_cast<std::size_t>(tokens[T + 12] * C + c)] +
                  wpe[static_cast<std::size_t>(1 * C + c)]);
  }
  const auto d_e = normal(e.size(), 9);
  std::vector<float> d_wte(wte.size(), 0.0f), d_wpe(wpe.size(), 0.0f), d_wte_r = d_wte,
                                                                       d_wpe_r = d_wpe;
  embedding_backward(testing::backend_ctx(), {.d_wte = testing::view_of(d_wte, {V, C}),
                                              .d_wpe = testing::view_of(d_wpe, {P, C}),
                                              .d_out = testing::view_of(d_e, {2, T, C}),
                                              .tokens = testing::view_of(tokens, {2, T}),
                                              .positions = testing::view_of(pos, {2, T})});
  ref::embedding_backward({.d_wte = d_wte_r.data(),
                           .d_wpe = d_wpe_r.data(),
                           .d_out = d_e.data(),
                           .tokens = tokens.data(),
                           .batch = 2,
                           .seq_len = T,
                           .hidden = C,
                           .vocab_local = V,
                           .positions = pos.data()});
  EXPECT_LE(rel(d_wpe, d_wpe_r), 1e-6);  // rel() fetches
  EXPECT_LE(rel(d_wte, d_wte_r), 1e-6);
  // Positions past the longest document (19) received nothing.
  for (std::int64_t i = 19 * C; i < P * C; ++i) ASSERT_EQ(d_wpe[static_cast<std::size_t>(i)], 0.0f);
}

}  // namespace
}  // namespace trident::kernels
