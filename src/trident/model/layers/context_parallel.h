// Context parallelism (docs/long-context.md, Megatron-Core's --context-parallel-size): the
// sequence of T tokens is cut into 2C chunks of Tc = T / 2C over the C ranks of the cp group, and
// cp rank i holds chunks i and 2C-1-i (the load-balanced causal split: every rank then has the
// same attention work). A rank's rows are "chunk-major": its first B*Tc rows are chunk i of every
// sample (b, t), the next B*Tc rows chunk 2C-1-i. Every layer but the attention core works on
// rows alone and does not care; the core runs as a ring (ring_attention_forward / _backward), and
// the embedding, rotary positions and dropout masks use each row's global position
// (cp_row_position), so every layout draws the same numbers as one process.
#pragma once

#include <cstdint>

#include "trident/kernels/flash_attention.h"
#include "trident/model/layers/layer.h"

namespace trident::model::layers {

// The sequence chunk (0 .. 2C-1) that cp rank `rank` of `size` holds as its half h (0 or 1).
inline std::int64_t cp_chunk(int size, int rank, int h) {
  return h == 0 ? rank : 2 * static_cast<std::int64_t>(size) - 1 - rank;
}
// Position in its sample of local row r of a cp rank's chunk-major rows (batch B, local sequence
// Tl = 2 Tc).
inline std::int64_t cp_row_position(int size, int rank, std::int64_t batch, std::int64_t local_len,
                                    std::int64_t r) {
  const std::int64_t tc = local_len / 2, half = r / (batch * tc);
  return cp_chunk(size, rank, static_cast<int>(half)) * tc + r % tc;
}
// The local row of the i-th of sample b's Tl positions (its chunk i / Tc, offset i % Tc).
inline std::int64_t cp_chunk_row(std::int64_t batch, std::int64_t local_len, std::int64_t b,
                                 std::int64_t i) {
  const std::int64_t tc = local_len / 2;
  return ((i / tc) * batch + b) * tc + i % tc;
}
// Sample (0 .. B-1) of local row r.
inline std::int64_t cp_row_sample(std::int64_t batch, std::int64_t local_len, std::int64_t r) {
  const std::int64_t tc = local_len / 2;
  return (r % (batch * tc)) / tc;
}

// DeepSpeed-Ulysses (--ds-sequence-parallel-size U) on the same rows: an all-to-all gives each
// rank of the group all 2U chunks of the sequence for NH/(tp U) of its heads, the core runs there
// (flash blocks over the chunk pairs a query chunk can see, merged by their log-sum-exp), and
// the reverse all-to-all brings the output back to the rows. The qkv all-to-all's result (the
// whole sequence, this rank's heads: U blocks of (B*Tl, NH/(tp U), 3 HS), block j from rank j)
// and the core's output in the same layout are saved for the backward.
struct UlyssesArgs {
  float* local_qkv = nullptr;                // (B*Tl, NH/tp, 3 HS): the projection's output (read)
  float* qkv = nullptr;                      // written: the whole sequence for this rank's heads
  float* out = nullptr;                      // written: the core's output, (U, B*Tl, NH/(tp U), HS)
  float* lse = nullptr;                      // written: (2U, B, NH/(tp U), Tc)
  float* attn = nullptr;                     // written: (B*Tl, C/tp), the rows' attention output
  const float* alibi = nullptr;              // (NH/tp) this tp rank's slopes, or null
  kernels::AttentionDropout dropout;         // head_offset: this tp rank's first head
  std::int64_t num_heads = 0, head_dim = 0;  // this tp rank's
};
void ulysses_attention_forward(const LayerContext& lc, const UlyssesArgs& args);
// Writes d_qkv (B*Tl, NH/tp, 3 HS) from d_attn (B*Tl, C/tp); reads the forward's qkv, out, lse.
struct UlyssesBackwardArgs {
  float* d_qkv = nullptr;
  const float* d_attn = nullptr;
  UlyssesArgs fwd;
};
void ulysses_attention_backward(const LayerContext& lc, const UlyssesBackwardArgs& args);

// The attention core of this rank's queries over the whole sequence: C steps, each running
// flash_attention_block on the local query chunks against the visiting key/value block (pairs a
// chunk cannot see are skipped), the partial results merged by their log-sum-exp; the next block
// travels (cp isend to the next rank, irecv from the previous) while the current one is computed.
// Blocks travel as keys and values only, (B*Tl, NH/tp, 2 HS), packed from the qkv rows.
// qkv (B*Tl, NH/tp, 3 HS) chunk-major; writes attn (B*Tl, C/tp) and lse (2, B, NH/tp, Tc).
struct RingAttentionArgs {
  float* attn = nullptr;
  float* lse = nullptr;
  const float* qkv = nullptr;
  const float* alibi = nullptr;  // (NH/tp) or null
  kernels::AttentionDropout dropout;
  std::int64_t num_heads = 0, head_dim = 0;  // this rank's
};
void ring_attention_forward(const LayerContext& lc, const RingAttentionArgs& args);
// The backward: the ring again, the key/value gradients of each block travelling with it and
// arriving at their owner after C hops. Writes d_qkv (B*Tl, NH/tp, 3 HS) from d_attn.
struct RingAttentionBackwardArgs {
  float* d_qkv = nullptr;
  const float* d_attn = nullptr;
  RingAttentionArgs fwd;  // the forward's operands and results (attn and lse read)
};
void ring_attention_backward(const LayerContext& lc, const RingAttentionBackwardArgs& args);

}  // namespace trident::model::layers
