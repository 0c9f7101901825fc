// Flash attention by key/value blocks, for context parallelism's ring attention (issue 34): the
// sequence of T_total tokens is cut into 2C chunks over C ranks (rank i holds chunks i and
// 2C-1-i, the load-balanced causal split); each rank's queries attend to one visiting key/value
// block at a time, the partial results are merged by their log-sum-exp, and the backward runs
// the ring again from the final merged output. Three ops:
//
//   flash_attention_block           queries (B, Tq) x one key/value block (B, Tk) -> out, lse of
//                                   this block (normalised over its keys only)
//   flash_attention_merge           (out, lse) <- logaddexp-merge of (out, lse) and (out_blk,
//                                   lse_blk), in place
//   flash_attention_block_backward  the final (out, lse) and d_out -> dq += over this block's
//                                   keys, dk, dv of the block = (or +=: the ring's running sums)
//
// Legend: B = batch, Tq / Tk = query / key rows of the block, NH = heads on this rank, HS =
// head_dim, C = NH * HS, T_total = total_len, the global sequence length. The tokens are named by
// their global positions q_pos (Tq) and k_pos (Tk), the same for every batch row. For a query row
// of head h of sample b, over the block's keys k with k_pos[k] <= q_pos[q] (and, with document
// ids, q_doc[b, q] == k_doc[b, k]):
//
//   s[q, k]  = q . k / sqrt(HS) + slope[h] * k_pos[k]         (ALiBi: the key's global position)
//   lse[q]   = log sum_k exp(s[q, k])                          (-inf where no key is visible)
//   out[q]   = sum_k exp(s[q, k] - lse[q]) * keep[q, k] / (1 - p) * v[k]   (0 where none)
//   keep[q, k] = dropout_keep(seed, stream, ((sample * total_heads + head_offset + h) * T_total
//                + q_pos[q]) * T_total + k_pos[k], p)           (flash_attention.h's mask for
//                                                                 element (q_pos, k_pos))
//
// so that merging every block of the keys 0..T_total-1 gives flash_attention's out and lse on the
// whole sequence, bit patterns of the dropout mask included. The backward is FlashAttention-2's
// with D[q] = rowsum(d_out * out) of the FINAL out and p = exp(s - lse) with the FINAL lse:
//
//   dv[k] (+)= sum_q p keep/(1-p) d_out[q];   dp = keep/(1-p) (d_out[q] . v[k])
//   ds = p (dp - D[q]) / sqrt(HS);   dq[q] += sum_k ds k[k];   dk[k] (+)= sum_q ds q[q]
//
// Layouts without copies: q, k, v (and dq, dk, dv) are strided head rows (HeadRows: element d of
// head h of token t of batch row b at data[b * batch_stride + t * row_stride + h * head_stride +
// d]), so both trident's qkv buffer (B, T, NH, 3, HS) (qkv_rows: slots 0, 1, 2) and a received
// key/value buffer (B, Tk, NH, 2, HS) (kv_rows: slots 0, 1; k then v per head) are operands; dk
// and dv may point into a (B, Tk, NH, 2, HS) buffer that travels the ring with the block, or into
// the k, v slots of the local d_qkv (whose q slot dq accumulates: disjoint elements).
// The positions must lie in [0, total_len) (the caller's contract: they live in the backend's
// memory and are not read on the host).
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h
// says); the raw Args are the backend contract (docs/architecture.md, "The kernel seam"), over
// the element type T so that the reference's double instance is checked by finite differences.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {

// Strided head rows: element d of head h of token t of batch row b is
// data[b * batch_stride + t * row_stride + h * head_stride + d], d < head_dim.
template <class T>
struct BasicHeadRows {
  T* data = nullptr;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};
using HeadRows = BasicHeadRows<float>;
using ConstHeadRows = BasicHeadRows<const float>;

// Slot `slot` (0 q, 1 k, 2 v) of a qkv buffer (B, seq_len, NH, 3, HS).
template <class T>
BasicHeadRows<T> qkv_rows(T* qkv, std::int64_t seq_len, std::int64_t num_heads,
                          std::int64_t head_dim, int slot) {
  const std::int64_t ld = 3 * num_heads * head_dim;
  return {qkv + slot * head_dim, seq_len * ld, ld, 3 * head_dim};
}
// Slot `slot` (0 k, 1 v) of a key/value buffer (B, seq_len, NH, 2, HS).
template <class T>
BasicHeadRows<T> kv_rows(T* kv, std::int64_t seq_len, std::int64_t num_heads, std::int64_t head_dim,
                         int slot) {
  const std::int64_t ld = 2 * num_heads * head_dim;
  return {kv + slot * head_dim, seq_len * ld, ld, 2 * head_dim};
}

template <class T>
struct BasicFlashAttentionBlockArgs {
  T* out = nullptr;  // (B, Tq, C)   written (=): over this block's keys; 0 where none is visible
  T* lse = nullptr;  // (B, NH, Tq)  written (=): -inf where no key is visible
  BasicHeadRows<const T> q, k, v;       // (B, Tq) / (B, Tk) rows of NH heads of HS
  const std::int32_t* q_pos = nullptr;  // (Tq) global positions of the query rows
  const std::int32_t* k_pos = nullptr;  // (Tk) global positions of the key rows
  const T* alibi = nullptr;             // (NH) slopes, or null for no bias
  AttentionDropout dropout;             // indexed by the global positions (flash_attention.h)
  std::int64_t batch = 0, q_len = 0, k_len = 0, num_heads = 0, head_dim = 0;
  std::int64_t total_len = 0;           // T_total: the dropout index's sequence length
  const std::int32_t* q_doc = nullptr;  // (B, Tq) document ids, or null: one document
  const std::int32_t* k_doc = nullptr;  // (B, Tk) document ids (both or neither)
};
using FlashAttentionBlockArgs = BasicFlashAttentionBlockArgs<float>;

// In place, per row (b, h, t) and element d (-inf safe: a block with lse_blk = -inf leaves the
// row as it is, a running row with lse = -inf takes the block's):
//   lse' = logaddexp(lse, lse_blk)
//   out' = out * exp(lse - lse') + out_blk * exp(lse_blk - lse')
template <class T>
struct BasicFlashAttentionMergeArgs {
  T* out = nullptr;            // (B, T, C)   updated in place
  T* lse = nullptr;            // (B, NH, T)  updated in place
  const T* out_blk = nullptr;  // (B, T, C)   a block's out (flash_attention_block)
  const T* lse_blk = nullptr;  // (B, NH, T)  and its lse
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
};
using FlashAttentionMergeArgs = BasicFlashAttentionMergeArgs<float>;

template <class T>
struct BasicFlashAttentionBlockBackwardArgs {
  BasicHeadRows<T> d_q;         // (B, Tq) rows   accumulated (+=)
  BasicHeadRows<T> d_k, d_v;    // (B, Tk) rows   written (=), or accumulated (+=) with
  bool accumulate_dkv = false;  //                accumulate_dkv (the ring's running sums)
  const T* d_out = nullptr;     // (B, Tq, C)
  const T* out = nullptr;       // (B, Tq, C)   the FINAL merged out of the local queries
  const T* lse = nullptr;       // (B, NH, Tq)  the FINAL merged lse
  BasicHeadRows<const T> q, k, v;
  const std::int32_t* q_pos = nullptr;  // (Tq)
  const std::int32_t* k_pos = nullptr;  // (Tk)
  const T* alibi = nullptr;             // (NH) or null
  AttentionDropout dropout;
  std::int64_t batch = 0, q_len = 0, k_len = 0, num_heads = 0, head_dim = 0;
  std::int64_t total_len = 0;
  const std::int32_t* q_doc = nullptr;  // (B, Tq) or null, as in the forward
  const std::int32_t* k_doc = nullptr;  // (B, Tk) or null
};
using FlashAttentionBlockBackwardArgs = BasicFlashAttentionBlockBackwardArgs<float>;

// flash_attention_block over typed views. B, Tq, NH and HS are read from qkv (the local qkv
// buffer, whose q slot is read); Tk from kv, either a qkv buffer (B, Tk, NH, 3 * HS) (its k and v
// slots) or a key/value block (B, Tk, NH, 2 * HS) (k then v per head).
struct FlashAttentionBlockViews {
  core::TensorView out{};    // (B, Tq, NH * HS)      f32, written (=)
  core::TensorView lse{};    // (B, NH, Tq)           f32, written (=)
  core::TensorView qkv{};    // (B, Tq, NH, 3 * HS)   f32: the queries (slot 0)
  core::TensorView kv{};     // (B, Tk, NH, 2 or 3 * HS) f32: the key/value block
  core::TensorView q_pos{};  // (Tq)                  i32 global positions
  core::TensorView k_pos{};  // (Tk)                  i32 global positions
  core::TensorView alibi{};  // (NH)                  f32 slopes, or empty: no bias
  core::TensorView q_doc{};  // (B, Tq)               i32 document ids, or empty
  core::TensorView k_doc{};  // (B, Tk)               i32, given exactly when q_doc is
  AttentionDropout dropout;
  std::int64_t total_len = 0;  // the global sequence length (> every position)
};
void flash_attention_block(const core::ExecContext& ctx, const FlashAttentionBlockViews& v);

// flash_attention_merge over typed views; sizes from out (B, T, C) and lse (B, NH, T).
struct FlashAttentionMergeViews {
  core::TensorView out{};      // (B, T, NH * HS)  f32, updated in place
  core::TensorView lse{};      // (B, NH, T)       f32, updated in place
  core::TensorView out_blk{};  // (B, T, NH * HS)  f32
  core::TensorView lse_blk{};  // (B, NH, T)       f32
};
void flash_attention_merge(const core::ExecContext& ctx, const FlashAttentionMergeViews& v);

// flash_attention_block_backward over typed views; sizes from qkv and kv as in the forward.
// d_qkv's q slot is accumulated (+=), its k and v slots untouched; d_kv has kv's shape and its k
// and v slots are written (=), or accumulated with accumulate_dkv. d_kv may be d_qkv itself (the
// local block: kv is qkv), the slots being disjoint.
struct FlashAttentionBlockBackwardViews {
  core::TensorView d_qkv{};  // (B, Tq, NH, 3 * HS)      f32, q slot accumulated (+=)
  core::TensorView d_kv{};   // kv's shape               f32, k, v slots = (or +=)
  bool accumulate_dkv = false;
  core::TensorView d_out{};  // (B, Tq, NH * HS)         f32
  core::TensorView out{};    // (B, Tq, NH * HS)         f32, the final merged out
  core::TensorView lse{};    // (B, NH, Tq)              f32, the final merged lse
  core::TensorView qkv{};    // (B, Tq, NH, 3 * HS)      f32
  core::TensorView kv{};     // (B, Tk, NH, 2 or 3 * HS) f32
  core::TensorView q_pos{};  // (Tq)                     i32
  core::TensorView k_pos{};  // (Tk)                     i32
  core::TensorView alibi{};  // (NH)                     f32, or empty
  core::TensorView q_doc{};  // (B, Tq)                  i32, or empty
  core::TensorView k_doc{};  // (B, Tk)                  i32, given exactly when q_doc is
  AttentionDropout dropout;
  std::int64_t total_len = 0;
};
void flash_attention_block_backward(const core::ExecContext& ctx,
                                    const FlashAttentionBlockBackwardViews& v);

namespace ref {
// The specification (ref/flash_attention_block_ref.cc): plain loops in double, over the element
// type T (the float instance checks the bodies, the double one is checked by finite differences).
template <class T = float>
void flash_attention_block_forward(const BasicFlashAttentionBlockArgs<T>& args);
template <class T = float>
void flash_attention_merge(const BasicFlashAttentionMergeArgs<T>& args);
template <class T = float>
void flash_attention_block_backward(const BasicFlashAttentionBlockBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
