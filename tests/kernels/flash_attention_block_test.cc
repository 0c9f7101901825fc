// The ring attention's block ops (flash_attention_block.h) on every backend of the loop: each op
// against its double reference (positions out of order, keys a query cannot see, rows with no
// visible key, ALiBi, dropout, documents, both key/value layouts, dq / dk / dv accumulation), the
// reference backward against finite differences, and the decisive test: a sequence cut into 2C
// chunks over C "ranks" (rank i holds chunks i and 2C-1-i), each rank running the ring of the C
// key/value blocks with merges, then the backward ring (the visiting block's dk, dv accumulated
// as they travel), equals flash_attention / flash_attention_backward on the whole sequence.
//
// Errors are max |x - ref| / max |ref| over a tensor (TRIDENT_PRINT_ERRORS=1 prints them):
// 2e-6 forward and 2e-5 gradients (flash_attention_test.cc's), against the reference and for the
// ring against the whole-sequence kernels (measured: at most 3e-7 on the CPU variants and the
// emulated GPU; each merge adds a few float roundings of the weights exp(lse - lse')).
#include "trident/kernels/flash_attention_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {
namespace {

using testing::view_of;

// max |a - b| / max |b| over the elements; -inf must meet -inf (lse of a row with no visible key),
// NaN or a one-sided infinity is an infinite error.
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  testing::fetch(a);
  testing::fetch(b);
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

::testing::AssertionResult close(const char* name, const std::vector<float>& got,
                                 const std::vector<float>& want, double tol) {
  const double e = rel(got, want);
  if (std::getenv("TRIDENT_PRINT_ERRORS") != nullptr)
    std::printf("  %-50s rel err %.3g  (tol %.3g)\n", name, e, tol);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": rel err " << e << " > " << tol;
}

// ---- one block against the reference ----------------------------------------------------------

struct Case {
  std::int64_t B, NH, HS, Tq, Tk;
  int kv_slots;  // 2: a received (B, Tk, NH, 2, HS) block; 3: a qkv buffer's k, v slots
  bool alibi;
  float dropout;
  bool docs;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_NH" << c.NH << "_HS" << c.HS << "_Tq" << c.Tq << "_Tk" << c.Tk << "_kv"
      << c.kv_slots << (c.alibi ? "_alibi" : "") << "_p" << c.dropout << (c.docs ? "_docs" : "");
}

struct BlockInputs {
  Case c;
  std::int64_t total = 0;
  std::vector<float> qkv, kv, slopes, d_out;
  std::vector<std::int32_t> q_pos, k_pos, q_doc, k_doc;
  AttentionDropout drop;
};

// Query positions: two runs (a rank's two chunks), the first starting below every key so that
// its leading rows see no key of the block; key positions out of order (a run, then another
// below it), several above the queries' last.
BlockInputs block_inputs(const Case& c) {
  BlockInputs in;
  in.c = c;
  const std::int64_t C = c.NH * c.HS;
  in.qkv = testing::randn(c.B * c.Tq * 3 * C, 1);
  in.kv = testing::randn(c.B * c.Tk * c.kv_slots * C, 2);
  in.d_out = testing::randn(c.B * c.Tq * C, 3);
  in.slopes.resize(static_cast<std::size_t>(c.NH));
  alibi_slopes(c.NH, in.slopes.data());
  for (std::int64_t i = 0; i < c.Tq; ++i)
    in.q_pos.push_back(static_cast<std::int32_t>(i < c.Tq / 2 ? 3 + i : 40 + 2 * c.Tk + i));
  const std::int64_t half = c.Tk / 2;
  for (std::int64_t j = 0; j < c.Tk; ++j)
    in.k_pos.push_back(static_cast<std::int32_t>(j < half ? 30 + c.Tk + j : 5 + (j - half)));
  in.total = 60 + 3 * c.Tk + c.Tq;
  // With more than one of the CPU's 64-key blocks, the first 64 keys come after every query (a
  // key block the CPU body skips whole), descending.
  if (c.Tk > 128) {
    for (std::int64_t j = 0; j < 64; ++j)
      in.k_pos[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(in.total - 1 - j);
  }
  if (c.docs) {
    for (std::int64_t b = 0; b < c.B; ++b) {
      for (std::int32_t p : in.q_pos) in.q_doc.push_back(static_cast<std::int32_t>(p / 11 + b));
      for (std::int32_t p : in.k_pos) in.k_doc.push_back(static_cast<std::int32_t>(p / 11 + b));
    }
  }
  in.drop = {.p = c.dropout,
             .seed = 9,
             .stream = 41,
             .first_sample = 2,
             .head_offset = 1,
             .total_heads = c.NH + 3};
  return in;
}

template <class T>
BasicHeadRows<const T> kv_slot(const std::vector<T>& kv, const Case& c, int slot) {
  return c.kv_slots == 3 ? qkv_rows(kv.data(), c.Tk, c.NH, c.HS, slot + 1)
                         : kv_rows(kv.data(), c.Tk, c.NH, c.HS, slot);
}

class FlashAttentionBlock : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionBlock, MatchesReference) {
  const Case c = GetParam();
  const BlockInputs in = block_inputs(c);
  const std::int64_t C = c.NH * c.HS;
  const core::ExecContext ctx = testing::backend_ctx();
  const core::Shape qkv_shape{c.B, c.Tq, c.NH, 3 * c.HS},
      kv_shape{c.B, c.Tk, c.NH, c.kv_slots * c.HS};
  const core::Shape out_shape{c.B, c.Tq, C}, lse_shape{c.B, c.NH, c.Tq};
  const core::TensorView alibi = c.alibi ? view_of(in.slopes, {c.NH}) : core::TensorView{};
  const core::TensorView q_doc = c.docs ? view_of(in.q_doc, {c.B, c.Tq}) : core::TensorView{};
  const core::TensorView k_doc = c.docs ? view_of(in.k_doc, {c.B, c.Tk}) : core::TensorView{};
  std::vector<float> out(static_cast<std::size_t>(c.B * c.Tq * C), NAN),
      lse(static_cast<std::size_t>(c.B * c.NH * c.Tq), NAN);
  flash_attention_block(ctx, {.out = view_of(out, out_shape),
                              .lse = view_of(lse, lse_shape),
                              .qkv = view_of(in.qkv, qkv_shape),
                              .kv = view_of(in.kv, kv_shape),
                              .q_pos = view_of(in.q_pos, {c.Tq}),
                              .k_pos = view_of(in.k_pos, {c.Tk}),
                              .alibi = alibi,
                              .q_doc = q_doc,
                              .k_doc = k_doc,
                              .dropout = in.drop,
                              .total_len = in.total});
  std::vector<float> out_ref(out.size()), lse_ref(lse.size());
  const FlashAttentionBlockArgs fa{.out = out_ref.data(),
                                   .lse = lse_ref.data(),
                                   .q = qkv_rows(in.qkv.data(), c.Tq, c.NH, c.HS, 0),
                                   .k = kv_slot(in.kv, c, 0),
                                   .v = kv_slot(in.kv, c, 1),
                                   .q_pos = in.q_pos.data(),
                                   .k_pos = in.k_pos.data(),
                                   .alibi = c.alibi ? in.slopes.data() : nullptr,
                                   .dropout = in.drop,
                                   .batch = c.B,
                                   .q_len = c.Tq,
                                   .k_len = c.Tk,
                                   .num_heads = c.NH,
                                   .head_dim = c.HS,
                                   .total_len = in.total,
                                   .q_doc = c.docs ? in.q_doc.data() : nullptr,
                                   .k_doc = c.docs ? in.k_doc.data() : nullptr};
  ref::flash_attention_block_forward(fa);
  EXPECT_TRUE(close("block out", out, out_ref, 2e-6));
  EXPECT_TRUE(close("block lse", lse, lse_ref, 2e-6));
  // The test must see both kinds of rows: some with no visible key (lse -inf, out 0), some with.
  const auto none = std::count(lse_ref.begin(), lse_ref.end(), -INFINITY);
  EXPECT_GT(none, 0);
  EXPECT_LT(none, static_cast<std::ptrdiff_t>(lse_ref.size()));
  for (std::size_t r = 0; r < lse_ref.size(); ++r) {
    if (lse_ref[r] != -INFINITY) continue;
    const std::int64_t q = static_cast<std::int64_t>(r) % c.Tq,
                       bh = static_cast<std::int64_t>(r) / c.Tq;
    const std::int64_t b = bh / c.NH, h = bh % c.NH;
    for (std::int64_t d = 0; d < c.HS; ++d)
      ASSERT_EQ(out[static_cast<std::size_t>((b * c.Tq + q) * C + h * c.HS + d)], 0.0f);
  }

  // Backward against the reference on the same block (out, lse as the final ones): dq
  // accumulates onto what d_qkv held (its k, v slots untouched), dk, dv written or accumulated.
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate_dkv" : "write dk, dv");
    std::vector<float> d_qkv = testing::randn(c.B * c.Tq * 3 * C, 4);
    std::vector<float> d_kv = testing::randn(c.B * c.Tk * c.kv_slots * C, 5);
    std::vector<float> d_qkv_ref = d_qkv, d_kv_ref = d_kv;
    if (!accumulate) std::fill(d_kv.begin(), d_kv.end(), NAN);  // must be written over
    flash_attention_block_backward(ctx, {.d_qkv = view_of(d_qkv, qkv_shape),
                                         .d_kv = view_of(d_kv, kv_shape),
                                         .accumulate_dkv = accumulate,
                                         .d_out = view_of(in.d_out, out_shape),
                                         .out = view_of(out, out_shape),
                                         .lse = view_of(lse, lse_shape),
                                         .qkv = view_of(in.qkv, qkv_shape),
                                         .kv = view_of(in.kv, kv_shape),
                                         .q_pos = view_of(in.q_pos, {c.Tq}),
                                         .k_pos = view_of(in.k_pos, {c.Tk}),
                                         .alibi = alibi,
                                         .q_doc = q_doc,
                                         .k_doc = k_doc,
                                         .dropout = in.drop,
                                         .total_len = in.total});
    testing::fetch(out);
    testing::fetch(lse);
    ref::flash_attention_block_backward<float>(
        {.d_q = qkv_rows(d_qkv_ref.data(), c.Tq, c.NH, c.HS, 0),
         .d_k = c.kv_slots == 3 ? qkv_rows(d_kv_ref.data(), c.Tk, c.NH, c.HS, 1)
                                : kv_rows(d_kv_ref.data(), c.Tk, c.NH, c.HS, 0),
         .d_v = c.kv_slots == 3 ? qkv_rows(d_kv_ref.data(), c.Tk, c.NH, c.HS, 2)
                                : kv_rows(d_kv_ref.data(), c.Tk, c.NH, c.HS, 1),
         .accumulate_dkv = accumulate,
         .d_out = in.d_out.data(),
         .out = out.data(),
         .lse = lse.data(),
         .q = fa.q,
         .k = fa.k,
         .v = fa.v,
         .q_pos = fa.q_pos,
         .k_pos = fa.k_pos,
         .alibi = fa.alibi,
         .dropout = in.drop,
         .batch = c.B,
         .q_len = c.Tq,
         .k_len = c.Tk,
         .num_heads = c.NH,
         .head_dim = c.HS,
         .total_len = in.total,
         .q_doc = fa.q_doc,
         .k_doc = fa.k_doc});
    testing::fetch(d_kv);
    if (c.kv_slots == 3 && !accumulate) {  // the untouched q slot: NaN in both; compare the rest
      for (std::size_t i = 0; i < d_kv.size(); i += static_cast<std::size_t>(3 * c.HS)) {
        for (std::int64_t d = 0; d < c.HS; ++d) {
          ASSERT_TRUE(std::isnan(d_kv[i + static_cast<std::size_t>(d)]))
              << "q slot of d_kv written";
          d_kv[i + static_cast<std::size_t>(d)] = d_kv_ref[i + static_cast<std::size_t>(d)] = 0.0f;
        }
      }
    }
    EXPECT_TRUE(close("block d_qkv (dq +=)", d_qkv, d_qkv_ref, 2e-5));
    EXPECT_TRUE(close("block d_kv", d_kv, d_kv_ref, 2e-5));
  }

  // A second call gives the same bits (no atomics, a fixed order of every sum).
  std::vector<float> out2(out.size(), NAN), lse2(lse.size(), NAN);
  flash_attention_block(ctx, {.out = view_of(out2, out_shape),
                              .lse = view_of(lse2, lse_shape),
                              .qkv = view_of(in.qkv, qkv_shape),
                              .kv = view_of(in.kv, kv_shape),
                              .q_pos = view_of(in.q_pos, {c.Tq}),
                              .k_pos = view_of(in.k_pos, {c.Tk}),
                              .alibi = alibi,
                              .q_doc = q_doc,
                              .k_doc = k_doc,
                              .dropout = in.drop,
                              .total_len = in.total});
  EXPECT_TRUE(testing::all_equal("out, second call", out2, out));
  EXPECT_TRUE(testing::all_equal("lse, second call", lse2, lse));
  std::vector<std::vector<float>> grads;
  for (int call = 0; call < 2; ++call) {
    std::vector<float> d_qkv(in.qkv.size(), 0.0f), d_kv(in.kv.size(), 0.0f);
    flash_attention_block_backward(ctx, {.d_qkv = view_of(d_qkv, qkv_shape),
                                         .d_kv = view_of(d_kv, kv_shape),
                                         .d_out = view_of(in.d_out, out_shape),
                                         .out = view_of(out, out_shape),
                                         .lse = view_of(lse, lse_shape),
                                         .qkv = view_of(in.qkv, qkv_shape),
                                         .kv = view_of(in.kv, kv_shape),
                                         .q_pos = view_of(in.q_pos, {c.Tq}),
                                         .k_pos = view_of(in.k_pos, {c.Tk}),
                                         .alibi = alibi,
                                         .q_doc = q_doc,
                                         .k_doc = k_doc,
                                         .dropout = in.drop,
                                         .total_len = in.total});
    testing::fetch(d_qkv);
    testing::fetch(d_kv);
    d_qkv.insert(d_qkv.end(), d_kv.begin(), d_kv.end());
    grads.push_back(d_qkv);
  }
  EXPECT_TRUE(testing::all_equal("d_qkv and d_kv, second call", grads[1], grads[0]));
}

// B * NH * Tq not a multiple of the CUDA kernels' 4 warps per block; head sizes up to the CUDA
// kernels' 256; key blocks longer than the CPU's 64-key inner block (non-consecutive positions
// across it: the dropout's per-element path).
INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionBlock,
                         ::testing::Values(Case{1, 1, 4, 6, 5, 2, false, 0.0f, false},
                                           Case{2, 3, 8, 10, 9, 3, true, 0.0f, false},
                                           Case{2, 2, 16, 13, 70, 2, true, 0.2f, false},
                                           Case{1, 3, 8, 40, 21, 3, false, 0.3f, true},
                                           Case{1, 2, 64, 9, 11, 2, true, 0.1f, true},
                                           Case{1, 1, 256, 7, 6, 3, true, 0.1f, false},
                                           Case{3, 2, 5, 35, 130, 2, false, 0.1f, false}));

TEST(FlashAttentionBlockOps, BackwardIntoTheLocalQkvGradient) {
  // The local block: kv is qkv itself and d_kv is d_qkv itself (q slot +=, k and v slots =); one
  // block of the whole causal sequence, with ALiBi and dropout, is flash attention itself.
  const std::int64_t B = 2, T = 12, NH = 2, HS = 8, C = NH * HS;
  const auto qkv = testing::randn(B * T * 3 * C, 7);
  const auto d_out = testing::randn(B * T * C, 8);
  std::vector<std::int32_t> pos(T);
  for (std::int64_t t = 0; t < T; ++t)
    pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
  std::vector<float> slopes(static_cast<std::size_t>(NH));
  alibi_slopes(NH, slopes.data());
  const AttentionDropout drop{.p = 0.2f, .seed = 17, .stream = 3, .first_sample = 1};
  const core::ExecContext ctx = testing::backend_ctx();
  const core::Shape qkv_shape{B, T, NH, 3 * HS}, out_shape{B, T, C}, lse_shape{B, NH, T};
  std::vector<float> out(static_cast<std::size_t>(B * T * C), NAN),
      lse(static_cast<std::size_t>(B * NH * T), NAN);
  flash_attention_block(ctx, {.out = view_of(out, out_shape),
                              .lse = view_of(lse, lse_shape),
                              .qkv = view_of(qkv, qkv_shape),
                              .kv = view_of(qkv, qkv_shape),
                              .q_pos = view_of(pos, {T}),
                              .k_pos = view_of(pos, {T}),
                              .alibi = view_of(slopes, {NH}),
                              .dropout = drop,
                              .total_len = T});
  std::vector<float> d_qkv(qkv.size(), 0.0f);
  flash_attention_block_backward(ctx, {.d_qkv = view_of(d_qkv, qkv_shape),
                                       .d_kv = view_of(d_qkv, qkv_shape),
                                       .d_out = view_of(d_out, out_shape),
                                       .out = view_of(out, out_shape),
                                       .lse = view_of(lse, lse_shape),
                                       .qkv = view_of(qkv, qkv_shape),
                                       .kv = view_of(qkv, qkv_shape),
                                       .q_pos = view_of(pos, {T}),
                                       .k_pos = view_of(pos, {T}),
                                       .alibi = view_of(slopes, {NH}),
                                       .dropout = drop,
                                       .total_len = T});
  std::vector<float> out_full(out.size(), NAN), lse_full(lse.size(), NAN), d_full(qkv.size(), NAN);
  flash_attention(ctx, {.out = view_of(out_full, out_shape),
                        .lse = view_of(lse_full, lse_shape),
                        .qkv = view_of(qkv, qkv_shape),
                        .alibi = view_of(slopes, {NH}),
                        .doc = {},
                        .dropout = drop});
  flash_attention_backward(ctx, {.d_qkv = view_of(d_full, qkv_shape),
                                 .d_out = view_of(d_out, out_shape),
                                 .qkv = view_of(qkv, qkv_shape),
                                 .out = view_of(out_full, out_shape),
                                 .lse = view_of(lse_full, lse_shape),
                                 .alibi = view_of(slopes, {NH}),
                                 .doc = {},
                                 .dropout = drop});
  EXPECT_TRUE(close("one-block out vs flash_attention", out, out_full, 2e-6));
  EXPECT_TRUE(close("one-block lse vs flash_attention", lse, lse_full, 2e-6));
  EXPECT_TRUE(close("one-block d_qkv vs flash_attention_backward", d_qkv, d_full, 2e-5));
}

TEST(FlashAttentionBlockOps, MergeMatchesReference) {
  const std::int64_t B = 2, T = 7, NH = 3, HS = 5, C = NH * HS;
  auto out = testing::randn(B * T * C, 1);
  auto lse = testing::randn(B * NH * T, 2, 3.0);
  const auto out_blk = testing::randn(B * T * C, 3);
  auto lse_blk = testing::randn(B * NH * T, 4, 3.0);
  // -inf on either side, and on both: the running row empty, the block empty, both empty.
  for (std::size_t r = 0; r < lse.size(); r += 5) lse[r] = -INFINITY;
  for (std::size_t r = 0; r < lse.size(); r += 3) lse_blk[r] = -INFINITY;
  for (std::size_t r = 0; r < lse.size(); ++r) {  // the running out of an empty row is 0
    if (lse[r] != -INFINITY) continue;
    const std::int64_t t = static_cast<std::int64_t>(r) % T,
                       h = (static_cast<std::int64_t>(r) / T) % NH,
                       b = static_cast<std::int64_t>(r) / (T * NH);
    std::fill_n(out.begin() + (b * T + t) * C + h * HS, HS, 0.0f);
  }
  lse[1] = 80.0f;  // far apart: the smaller weight underflows without a NaN
  lse_blk[1] = -20.0f;
  auto out_ref = out, lse_ref = lse;
  ref::flash_attention_merge<float>({.out = out_ref.data(),
                                     .lse = lse_ref.data(),
                                     .out_blk = out_blk.data(),
                                     .lse_blk = lse_blk.data(),
                                     .batch = B,
                                     .seq_len = T,
                                     .num_heads = NH,
                                     .head_dim = HS});
  const core::ExecContext ctx = testing::backend_ctx();
  flash_attention_merge(ctx, FlashAttentionMergeViews{.out = view_of(out, {B, T, C}),
                                                      .lse = view_of(lse, {B, NH, T}),
                                                      .out_blk = view_of(out_blk, {B, T, C}),
                                                      .lse_blk = view_of(lse_blk, {B, NH, T})});
  EXPECT_TRUE(close("merge out", out, out_ref, 2e-6));
  EXPECT_TRUE(close("merge lse", lse, lse_ref, 2e-6));
  EXPECT_TRUE(std::count(lse_ref.begin(), lse_ref.end(), -INFINITY) > 0);
  for (float x : testing::fetch(out)) ASSERT_FALSE(std::isnan(x));
}

// ---- the ring against the whole sequence ------------------------------------------------------

struct RingCase {
  int ranks;  // C
  std::int64_t B, NH, HS, chunk;
  bool alibi;
  float dropout;
  bool docs;
};

void PrintTo(const RingCase& c, std::ostream* os) {
  *os << "C" << c.ranks << "_B" << c.B << "_NH" << c.NH << "_HS" << c.HS << "_chunk" << c.chunk
      << (c.alibi ? "_alibi" : "") << "_p" << c.dropout << (c.docs ? "_docs" : "");
}

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, EqualsFlashAttentionOnTheWholeSequence) {
  const RingCase c = GetParam();
  const std::int64_t R = c.ranks, B = c.B, NH = c.NH, HS = c.HS, C = NH * HS;
  const std::int64_t T = 2 * R * c.chunk, TL = 2 * c.chunk;  // whole and local sequence
  const auto qkv = testing::randn(B * T * 3 * C, 21);
  const auto d_out = testing::randn(B * T * C, 22);
  std::vector<float> slopes(static_cast<std::size_t>(NH));
  alibi_slopes(NH, slopes.data());
  std::vector<std::int32_t> doc;  // documents of uneven lengths crossing the chunk boundaries
  if (c.docs) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        doc.push_back(static_cast<std::int32_t>((t + 3 * b) / (c.chunk + 3)));
  }
  // Heads 2.. of 7 and samples 4.. of the model: the dropout index's global parts.
  const AttentionDropout drop{.p = c.dropout,
                              .seed = 123,
                              .stream = 9,
                              .first_sample = 4,
                              .head_offset = 2,
                              .total_heads = NH + 5};
  const core::ExecContext ctx = testing::backend_ctx();
  const core::TensorView alibi = c.alibi ? view_of(slopes, {NH}) : core::TensorView{};

  // The whole sequence.
  const core::Shape full_qkv{B, T, NH, 3 * HS}, full_out{B, T, C}, full_lse{B, NH, T};
  std::vector<float> out_full(static_cast<std::size_t>(B * T * C), NAN),
      lse_full(static_cast<std::size_t>(B * NH * T), NAN), d_full(qkv.size(), NAN);
  const core::TensorView full_doc = c.docs ? view_of(doc, {B, T}) : core::TensorView{};
  flash_attention(ctx, {.out = view_of(out_full, full_out),
                        .lse = view_of(lse_full, full_lse),
                        .qkv = view_of(qkv, full_qkv),
                        .alibi = alibi,
                        .doc = full_doc,
                        .dropout = drop});
  flash_attention_backward(ctx, {.d_qkv = view_of(d_full, full_qkv),
                                 .d_out = view_of(d_out, full_out),
                                 .qkv = view_of(qkv, full_qkv),
                                 .out = view_of(out_full, full_out),
                                 .lse = view_of(lse_full, full_lse),
                                 .alibi = alibi,
                                 .doc = full_doc,
                                 .dropout = drop});

  // Each rank's share: chunks i and 2R-1-i, their global positions, qkv rows, d_out rows, docs.
  struct Rank {
    std::vector<std::int32_t> pos, doc;
    std::vector<float> qkv, d_out, out, lse, d_qkv;
    std::vector<float> d_kv;  // the (B, TL, NH, 2, HS) gradient of this rank's key/value block
  };
  std::vector<Rank> ranks(static_cast<std::size_t>(R));
  for (std::int64_t i = 0; i < R; ++i) {
    Rank& r = ranks[static_cast<std::size_t>(i)];
    for (const std::int64_t chunk : {i, 2 * R - 1 - i})
      for (std::int64_t t = 0; t < c.chunk; ++t)
        r.pos.push_back(static_cast<std::int32_t>(chunk * c.chunk + t));
    for (std::int64_t b = 0; b < B; ++b) {
      for (const std::int32_t p : r.pos) {
        const auto row = [&](const std::vector<float>& v, std::int64_t w) {
          return v.begin() + (b * T + p) * w;
        };
        r.qkv.insert(r.qkv.end(), row(qkv, 3 * C), row(qkv, 3 * C) + 3 * C);
        r.d_out.insert(r.d_out.end(), row(d_out, C), row(d_out, C) + C);
        if (c.docs) r.doc.push_back(doc[static_cast<std::size_t>(b * T + p)]);
      }
    }
    r.out.assign(static_cast<std::size_t>(B * TL * C), NAN);
    r.lse.assign(static_cast<std::size_t>(B * NH * TL), NAN);
    r.d_qkv.assign(r.qkv.size(), 0.0f);
    r.d_kv.assign(static_cast<std::size_t>(B * TL * 2 * C), NAN);
  }
  // What a rank sends: its key/value block as the (B, TL, NH, 2, HS) buffer the ring carries.
  const auto kv_of = [&](const Rank& r) {
    std::vector<float> kv;
    for (std::int64_t row = 0; row < B * TL; ++row)
      for (std::int64_t h = 0; h < NH; ++h) {
        const auto at = r.qkv.begin() + row * 3 * C + h * 3 * HS + HS;
        kv.insert(kv.end(), at, at + 2 * HS);
      }
    return kv;
  };
  std::vector<std::vector<float>> kv(static_cast<std::size_t>(R));
  for (std::int64_t i = 0; i < R; ++i)
    kv[static_cast<std::size_t>(i)] = kv_of(ranks[static_cast<std::size_t>(i)]);

  const core::Shape local_qkv{B, TL, NH, 3 * HS}, local_kv{B, TL, NH, 2 * HS};
  const core::Shape local_out{B, TL, C}, local_lse{B, NH, TL};
  // Forward ring: at step s rank i holds the block of rank (i - s) mod R (step 0: its own qkv).
  std::vector<float> out_blk(static_cast<std::size_t>(B * TL * C)),
      lse_blk(static_cast<std::size_t>(B * NH * TL));
  for (std::int64_t s = 0; s < R; ++s) {
    for (std::int64_t i = 0; i < R; ++i) {
      Rank& r = ranks[static_cast<std::size_t>(i)];
      const Rank& from = ranks[static_cast<std::size_t>((i - s + R) % R)];
      const bool local = s == 0;
      std::fill(out_blk.begin(), out_blk.end(), NAN);
      std::fill(lse_blk.begin(), lse_blk.end(), NAN);
      flash_attention_block(
          ctx, {.out = view_of(local ? r.out : out_blk, local_out),
                .lse = view_of(local ? r.lse : lse_blk, local_lse),
                .qkv = view_of(r.qkv, local_qkv),
                .kv = local ? view_of(r.qkv, local_qkv)
                            : view_of(kv[static_cast<std::size_t>((i - s + R) % R)], local_kv),
                .q_pos = view_of(r.pos, {TL}),
                .k_pos = view_of(from.pos, {TL}),
                .alibi = alibi,
                .q_doc = c.docs ? view_of(r.doc, {B, TL}) : core::TensorView{},
                .k_doc = c.docs ? view_of(from.doc, {B, TL}) : core::TensorView{},
                .dropout = drop,
                .total_len = T});
      if (!local) {
        flash_attention_merge(ctx,
                              FlashAttentionMergeViews{.out = view_of(r.out, local_out),
                                                       .lse = view_of(r.lse, local_lse),
                                                       .out_blk = view_of(out_blk, local_out),
                                                       .lse_blk = view_of(lse_blk, local_lse)});
      }
    }
  }
  // Backward ring: the visiting block's gradient travels with it; its first holder (step 0, its
  // own rank) writes it, the others accumulate; after the ring it is back home.
  for (std::int64_t s = 0; s < R; ++s) {
    for (std::int64_t i = 0; i < R; ++i) {
      Rank& r = ranks[static_cast<std::size_t>(i)];
      const std::int64_t j = (i - s + R) % R;
      Rank& from = ranks[static_cast<std::size_t>(j)];
      flash_attention_block_backward(
          ctx, {.d_qkv = view_of(r.d_qkv, local_qkv),
                .d_kv = view_of(from.d_kv, local_kv),
                .accumulate_dkv = s > 0,
                .d_out = view_of(r.d_out, local_out),
                .out = view_of(r.out, local_out),
                .lse = view_of(r.lse, local_lse),
                .qkv = view_of(r.qkv, local_qkv),
                .kv = view_of(kv[static_cast<std::size_t>(j)], local_kv),
                .q_pos = view_of(r.pos, {TL}),
                .k_pos = view_of(from.pos, {TL}),
                .alibi = alibi,
                .q_doc = c.docs ? view_of(r.doc, {B, TL}) : core::TensorView{},
                .k_doc = c.docs ? view_of(from.doc, {B, TL}) : core::TensorView{},
                .dropout = drop,
                .total_len = T});
    }
  }
  // Put the ranks' rows back in sequence order and compare.
  std::vector<float> out(out_full.size(), NAN), lse(lse_full.size(), NAN), d_qkv(qkv.size(), NAN);
  for (std::int64_t i = 0; i < R; ++i) {
    const Rank& r = ranks[static_cast<std::size_t>(i)];
    testing::fetch(r.out);
    testing::fetch(r.lse);
    testing::fetch(r.d_qkv);
    testing::fetch(r.d_kv);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t t = 0; t < TL; ++t) {
        const std::int64_t p = r.pos[static_cast<std::size_t>(t)], lr = b * TL + t, gr = b * T + p;
        std::copy_n(r.out.begin() + lr * C, C, out.begin() + gr * C);
        for (std::int64_t h = 0; h < NH; ++h) {
          lse[static_cast<std::size_t>((b * NH + h) * T + p)] =
              r.lse[static_cast<std::size_t>((b * NH + h) * TL + t)];
          const auto dq = r.d_qkv.begin() + lr * 3 * C + h * 3 * HS;
          const auto dkv = r.d_kv.begin() + lr * 2 * C + h * 2 * HS;
          const auto to = d_qkv.begin() + gr * 3 * C + h * 3 * HS;
          std::copy_n(dq, HS, to);
          std::copy_n(dkv, 2 * HS, to + HS);
        }
      }
    }
  }
  EXPECT_TRUE(close("ring out vs flash_attention", out, out_full, 2e-6));
  EXPECT_TRUE(close("ring lse vs flash_attention", lse, lse_full, 2e-6));
  EXPECT_TRUE(close("ring d_qkv vs flash_attention_backward", d_qkv, d_full, 2e-5));
  for (float x : d_qkv) ASSERT_TRUE(std::isfinite(x));
}

// C = 2 and 4; ALiBi with dropout (the masks of the whole sequence's elements), documents
// crossing the chunk boundaries, odd chunk lengths and head sizes.
INSTANTIATE_TEST_SUITE_P(Ranks, RingAttention,
                         ::testing::Values(RingCase{2, 1, 2, 8, 5, false, 0.0f, false},
                                           RingCase{2, 2, 2, 8, 7, true, 0.2f, false},
                                           RingCase{4, 1, 3, 16, 6, true, 0.1f, false},
                                           RingCase{4, 2, 2, 5, 3, true, 0.3f, true},
                                           RingCase{2, 1, 2, 64, 19, true, 0.1f, true}));

// ---- the reference against finite differences ------------------------------------------------

TEST(FlashAttentionBlockReferenceCpuOnly, BackwardMatchesFiniteDifferences) {
  TRIDENT_CPU_ONLY("the reference alone");
  // One block holding every key a query sees (so the block's lse is the final one), keys out of
  // order and some above a query's position, ALiBi and dropout (a fixed mask: differentiable).
  const std::int64_t B = 2, NH = 2, HS = 3, Tq = 4, Tk = 5, C = NH * HS, total = 9;
  auto qkv = testing::randn<double>(B * Tq * 3 * C, 31);
  auto kv = testing::randn<double>(B * Tk * 2 * C, 32);
  const auto w = testing::randn<double>(B * Tq * C, 33);
  const std::vector<std::int32_t> q_pos{2, 4, 6, 8}, k_pos{5, 0, 1, 2, 7};
  const std::vector<double> slopes{0.5, 0.25};
  const AttentionDropout drop{.p = 0.25f, .seed = 3, .stream = 4, .total_heads = 2};
  std::vector<double> out(static_cast<std::size_t>(B * Tq * C)),
      lse(static_cast<std::size_t>(B * NH * Tq));
  const auto args = [&] {
    return BasicFlashAttentionBlockArgs<double>{
        .out = out.data(),
        .lse = lse.data(),
        .q = qkv_rows<const double>(qkv.data(), Tq, NH, HS, 0),
        .k = kv_rows<const double>(kv.data(), Tk, NH, HS, 0),
        .v = kv_rows<const double>(kv.data(), Tk, NH, HS, 1),
        .q_pos = q_pos.data(),
        .k_pos = k_pos.data(),
        .alibi = slopes.data(),
        .dropout = drop,
        .batch = B,
        .q_len = Tq,
        .k_len = Tk,
        .num_heads = NH,
        .head_dim = HS,
        .total_len = total};
  };
  const auto loss = [&] {
    ref::flash_attention_block_forward<double>(args());
    return testing::dot(w, out);
  };
  loss();
  const auto a = args();
  std::vector<double> d_qkv(qkv.size(), 0.0), d_kv(kv.size(), 0.0);
  ref::flash_attention_block_backward<double>({.d_q = qkv_rows(d_qkv.data(), Tq, NH, HS, 0),
                                               .d_k = kv_rows(d_kv.data(), Tk, NH, HS, 0),
                                               .d_v = kv_rows(d_kv.data(), Tk, NH, HS, 1),
                                               .d_out = w.data(),
                                               .out = out.data(),
                                               .lse = lse.data(),
                                               .q = a.q,
                                               .k = a.k,
                                               .v = a.v,
                                               .q_pos = a.q_pos,
                                               .k_pos = a.k_pos,
                                               .alibi = a.alibi,
                                               .dropout = drop,
                                               .batch = B,
                                               .q_len = Tq,
                                               .k_len = Tk,
                                               .num_heads = NH,
                                               .head_dim = HS,
                                               .total_len = total});
  // Only the q slot of qkv is read: the finite differences of its k, v slots are 0, as d_qkv's.
  EXPECT_TRUE(testing::all_close("block d_qkv vs finite differences", d_qkv,
                                 testing::numeric_grad(qkv, loss), testing::kFiniteDiffTol));
  EXPECT_TRUE(testing::all_close("block d_kv vs finite differences", d_kv,
                                 testing::numeric_grad(kv, loss), testing::kFiniteDiffTol));
  // The test is not vacuous: dropout dropped some visible pairs and some gradients are large.
  double largest = 0;
  for (double x : d_kv) largest = std::max(largest, std::abs(x));
  EXPECT_GT(largest, 0.1);
}

// ---- view checks --------------------------------------------------------------------------------

TEST(FlashAttentionBlockOps, WrongViewsAreErrorsNamingThem) {
  const std::int64_t B = 1, T = 4, NH = 2, HS = 4, C = NH * HS;
  const auto qkv = testing::randn(B * T * 3 * C, 1);
  const auto bad_kv = testing::randn(B * T * NH * 4 * HS, 2);
  std::vector<float> out(static_cast<std::size_t>(B * T * C)),
      lse(static_cast<std::size_t>(B * NH * T));
  const std::vector<std::int32_t> pos{0, 1, 2, 3};
  const std::vector<std::int32_t> docs(static_cast<std::size_t>(B * T), 0);
  const core::ExecContext ctx = testing::backend_ctx();
  const auto call = [&](const core::TensorView& kv, const core::TensorView& q_doc,
                        const core::TensorView& k_pos) {
    return testing::invalid_argument_of([&] {
      flash_attention_block(ctx, {.out = view_of(out, {B, T, C}),
                                  .lse = view_of(lse, {B, NH, T}),
                                  .qkv = view_of(qkv, {B, T, NH, 3 * HS}),
                                  .kv = kv,
                                  .q_pos = view_of(pos, {T}),
                                  .k_pos = k_pos,
                                  .q_doc = q_doc,
                                  .dropout = {},
                                  .total_len = T});
    });
  };
  const core::TensorView good_kv = view_of(qkv, {B, T, NH, 3 * HS});
  EXPECT_NE(call(view_of(bad_kv, {B, T, NH, 4 * HS}), {}, view_of(pos, {T})).find("`kv`"),
            std::string::npos);
  EXPECT_NE(call(good_kv, view_of(docs, {B, T}), view_of(pos, {T})).find("q_doc"),
            std::string::npos);
  EXPECT_NE(call(good_kv, {}, testing::view_claiming(pos, {T + 1})).find("k_pos"),
            std::string::npos);
  EXPECT_EQ(call(good_kv, {}, view_of(pos, {T})), "no error");
}

}  // namespace
}  // namespace trident::kernels
