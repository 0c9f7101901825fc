// The ring attention's block ops: the checks every backend shares, the dispatch, and the typed
// views (flash_attention_block.h).
#include "trident/kernels/flash_attention_block.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

namespace {

template <class A>
void check_block_args(const char* op, const A& a) {
  TRIDENT_CHECK(
      a.batch >= 0 && a.q_len >= 0 && a.k_len >= 0 && a.num_heads > 0 && a.head_dim > 0, op,
      ": need batch, q_len, k_len >= 0 and num_heads, head_dim > 0, got batch=", a.batch,
      " q_len=", a.q_len, " k_len=", a.k_len, " num_heads=", a.num_heads, " head_dim=", a.head_dim);
  TRIDENT_CHECK(a.dropout.p >= 0.0f && a.dropout.p < 1.0f, op,
                ": dropout probability must be in [0, 1), got ", a.dropout.p);
  TRIDENT_CHECK(a.total_len >= 0 && (a.dropout.p == 0.0f || a.total_len > 0), op,
                ": total_len (the global sequence length, the dropout index's) must be positive "
                "with dropout, got ",
                a.total_len);
  TRIDENT_CHECK((a.q_doc == nullptr) == (a.k_doc == nullptr), op,
                ": document ids are given for both the queries and the keys or for neither");
  if (a.batch > 0 && a.q_len > 0 && a.k_len > 0) {
    TRIDENT_CHECK(a.q.data && a.k.data && a.v.data && a.q_pos && a.k_pos, op,
                  ": q, k, v, q_pos and k_pos must be non-null");
  }
}

// The sizes of the typed views: B, Tq, NH, HS from qkv (B, Tq, NH, 3 HS); Tk and the slot count
// (3: a qkv buffer, 2: a key/value block) from kv.
struct BlockSizes {
  std::int64_t batch = 0, q_len = 0, k_len = 0, num_heads = 0, head_dim = 0, kv_slots = 0;
};

BlockSizes block_sizes(const char* op, const core::TensorView& qkv, const core::TensorView& kv,
                       const core::ExecContext& ctx) {
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_rank(op, "qkv", qkv, 4);
  TRIDENT_CHECK(qkv.shape[3] % 3 == 0, op, ": view `qkv` has shape ", core::to_string(qkv.shape),
                "; its last dimension must be 3 * head_dim (each head's q, k and v)");
  detail::check_view(op, "qkv", qkv, f32, qkv.shape, ctx);
  BlockSizes s{qkv.shape[0], qkv.shape[1], 0, qkv.shape[2], qkv.shape[3] / 3, 0};
  detail::check_rank(op, "kv", kv, 4);
  TRIDENT_CHECK(kv.shape[3] == 2 * s.head_dim || kv.shape[3] == 3 * s.head_dim, op,
                ": view `kv` has shape ", core::to_string(kv.shape),
                "; its last dimension must be 2 * head_dim (a key/value block) or 3 * head_dim (a "
                "qkv buffer), head_dim ",
                s.head_dim, " from `qkv`");
  s.k_len = kv.shape[1];
  s.kv_slots = kv.shape[3] / s.head_dim;
  detail::check_view(op, "kv", kv, f32, {s.batch, s.k_len, s.num_heads, kv.shape[3]}, ctx);
  return s;
}

// The k (slot 0) or v (slot 1) rows of a kv view's buffer with `slots` slots per head.
template <class T>
BasicHeadRows<T> block_rows(T* data, const BlockSizes& s, int slot) {
  return s.kv_slots == 3 ? qkv_rows(data, s.k_len, s.num_heads, s.head_dim, slot + 1)
                         : kv_rows(data, s.k_len, s.num_heads, s.head_dim, slot);
}

template <class V>
void check_positions_and_docs(const char* op, const V& v, const BlockSizes& s,
                              const core::ExecContext& ctx) {
  constexpr core::DType i32 = core::DType::kI32;
  detail::check_view(op, "q_pos", v.q_pos, i32, {s.q_len}, ctx);
  detail::check_view(op, "k_pos", v.k_pos, i32, {s.k_len}, ctx);
  detail::check_optional_view(op, "alibi", v.alibi, core::DType::kF32, {s.num_heads}, ctx);
  detail::check_optional_view(op, "q_doc", v.q_doc, i32, {s.batch, s.q_len}, ctx);
  detail::check_optional_view(op, "k_doc", v.k_doc, i32, {s.batch, s.k_len}, ctx);
  TRIDENT_CHECK(v.q_doc.empty() == v.k_doc.empty(), op,
                ": views `q_doc` and `k_doc` are given together or not at all");
}

}  // namespace

void flash_attention_block_forward(const core::ExecContext& ctx,
                                   const FlashAttentionBlockArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kAttention, "flash_attention_block_forward");
  check_block_args("flash_attention_block_forward", args);
  if (args.batch > 0 && args.q_len > 0) {
    TRIDENT_CHECK(args.out && args.lse,
                  "flash_attention_block_forward: out and lse must be non-null");
  }
  TRIDENT_DISPATCH(flash_attention_block_forward, ctx, args);
}

void flash_attention_merge(const core::ExecContext& ctx, const FlashAttentionMergeArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kAttention, "flash_attention_merge");
  TRIDENT_CHECK(args.batch >= 0 && args.seq_len >= 0 && args.num_heads > 0 && args.head_dim > 0,
                "flash_attention_merge: need batch, seq_len >= 0 and num_heads, head_dim > 0, got "
                "batch=",
                args.batch, " seq_len=", args.seq_len, " num_heads=", args.num_heads,
                " head_dim=", args.head_dim);
  if (args.batch > 0 && args.seq_len > 0) {
    TRIDENT_CHECK(args.out && args.lse && args.out_blk && args.lse_blk,
                  "flash_attention_merge: out, lse, out_blk and lse_blk must be non-null");
  }
  TRIDENT_DISPATCH(flash_attention_merge, ctx, args);
}

void flash_attention_block_backward(const core::ExecContext& ctx,
                                    const FlashAttentionBlockBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kAttention,
                                  "flash_attention_block_backward");
  check_block_args("flash_attention_block_backward", args);
  if (args.batch > 0 && args.q_len > 0 && args.k_len > 0) {
    TRIDENT_CHECK(
        args.d_q.data && args.d_k.data && args.d_v.data && args.d_out && args.out && args.lse,
        "flash_attention_block_backward: d_q, d_k, d_v, d_out, out and lse must be "
        "non-null");
  }
  TRIDENT_DISPATCH(flash_attention_block_backward, ctx, args);
}

void flash_attention_block(const core::ExecContext& ctx, const FlashAttentionBlockViews& v) {
  constexpr const char* op = "flash_attention_block";
  const BlockSizes s = block_sizes(op, v.qkv, v.kv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "out", v.out, f32, {s.batch, s.q_len, s.num_heads * s.head_dim}, ctx);
  detail::check_view(op, "lse", v.lse, f32, {s.batch, s.num_heads, s.q_len}, ctx);
  check_positions_and_docs(op, v, s, ctx);
  const float* qkv = v.qkv.as<float>();
  const float* kv = v.kv.as<float>();
  flash_attention_block_forward(
      ctx, FlashAttentionBlockArgs{.out = v.out.as<float>(),
                                   .lse = v.lse.as<float>(),
                                   .q = qkv_rows(qkv, s.q_len, s.num_heads, s.head_dim, 0),
                                   .k = block_rows(kv, s, 0),
                                   .v = block_rows(kv, s, 1),
                                   .q_pos = detail::data_or_null<std::int32_t>(v.q_pos),
                                   .k_pos = detail::data_or_null<std::int32_t>(v.k_pos),
                                   .alibi = detail::data_or_null<float>(v.alibi),
                                   .dropout = v.dropout,
                                   .batch = s.batch,
                                   .q_len = s.q_len,
                                   .k_len = s.k_len,
                                   .num_heads = s.num_heads,
                                   .head_dim = s.head_dim,
                                   .total_len = v.total_len,
                                   .q_doc = detail::data_or_null<std::int32_t>(v.q_doc),
                                   .k_doc = detail::data_or_null<std::int32_t>(v.k_doc)});
}

void flash_attention_merge(const core::ExecContext& ctx, const FlashAttentionMergeViews& v) {
  constexpr const char* op = "flash_attention_merge";
  detail::check_rank(op, "out", v.out, 3);
  detail::check_rank(op, "lse", v.lse, 3);
  const std::int64_t B = v.out.shape[0], T = v.out.shape[1], NH = v.lse.shape[1];
  TRIDENT_CHECK(NH > 0 && v.out.shape[2] % NH == 0, op, ": view `out` has shape ",
                core::to_string(v.out.shape), " and `lse` ", core::to_string(v.lse.shape),
                "; out's last dimension must be a multiple of lse's heads");
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_views(op, ctx, f32, v.out.shape, {{"out", v.out}, {"out_blk", v.out_blk}});
  detail::check_views(op, ctx, f32, {B, NH, T}, {{"lse", v.lse}, {"lse_blk", v.lse_blk}});
  flash_attention_merge(ctx, FlashAttentionMergeArgs{.out = v.out.as<float>(),
                                                     .lse = v.lse.as<float>(),
                                                     .out_blk = v.out_blk.as<float>(),
                                                     .lse_blk = v.lse_blk.as<float>(),
                                                     .batch = B,
                                                     .seq_len = T,
                                                     .num_heads = NH,
                                                     .head_dim = v.out.shape[2] / NH});
}

void flash_attention_block_backward(const core::ExecContext& ctx,
                                    const FlashAttentionBlockBackwardViews& v) {
  constexpr const char* op = "flash_attention_block_backward";
  const BlockSizes s = block_sizes(op, v.qkv, v.kv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "d_qkv", v.d_qkv, f32, v.qkv.shape, ctx);
  detail::check_view(op, "d_kv", v.d_kv, f32, v.kv.shape, ctx);
  detail::check_views(op, ctx, f32, {s.batch, s.q_len, s.num_heads * s.head_dim},
                      {{"d_out", v.d_out}, {"out", v.out}});
  detail::check_view(op, "lse", v.lse, f32, {s.batch, s.num_heads, s.q_len}, ctx);
  check_positions_and_docs(op, v, s, ctx);
  const float* qkv = v.qkv.as<float>();
  const float* kv = v.kv.as<float>();
  float* d_kv = v.d_kv.as<float>();
  flash_attention_block_backward(
      ctx, FlashAttentionBlockBackwardArgs{
               .d_q = qkv_rows(v.d_qkv.as<float>(), s.q_len, s.num_heads, s.head_dim, 0),
               .d_k = block_rows(d_kv, s, 0),
               .d_v = block_rows(d_kv, s, 1),
               .accumulate_dkv = v.accumulate_dkv,
               .d_out = v.d_out.as<float>(),
               .out = v.out.as<float>(),
               .lse = v.lse.as<float>(),
               .q = qkv_rows(qkv, s.q_len, s.num_heads, s.head_dim, 0),
               .k = block_rows(kv, s, 0),
               .v = block_rows(kv, s, 1),
               .q_pos = detail::data_or_null<std::int32_t>(v.q_pos),
               .k_pos = detail::data_or_null<std::int32_t>(v.k_pos),
               .alibi = detail::data_or_null<float>(v.alibi),
               .dropout = v.dropout,
               .batch = s.batch,
               .q_len = s.q_len,
               .k_len = s.k_len,
               .num_heads = s.num_heads,
               .head_dim = s.head_dim,
               .total_len = v.total_len,
               .q_doc = detail::data_or_null<std::int32_t>(v.q_doc),
               .k_doc = detail::data_or_null<std::int32_t>(v.k_doc)});
}

}  // namespace trident::kernels
