// Fused causal self-attention that never materializes the (T x T) score matrix of a head:
// flash-style blocks of queries and keys with an online softmax (Dao et al., FlashAttention-2),
// the causal mask, the ALiBi bias and attention dropout applied inside. Backward recomputes the
// probabilities block by block from the saved per-row log-sum-exp.
//
// Legend: B = batch, T = seq_len, NH = heads on this rank, HS = head_dim, C = NH * HS. Layouts are
// those of attention.h: qkv (B, T, NH, 3, HS) interleaved per head, out (B, T, C).
//
//   s[q, k] = q . k / sqrt(HS) + slope[h] * k      (ALiBi: the key position; the row constant
//                                                    -slope * q cancels in the softmax)
//   p = softmax over k <= q of s;   out = (p * keep / (1 - dropout)) v
//   (with document ids, --reset-attention-mask: over k <= q with doc[k] == doc[q] only)
//
// Dropout masks are a pure function of (seed, stream, global index): element (q, k) of head h of
// sample `first_sample + b` has index ((sample * total_heads + head_offset + h) * T + q) * T + k,
// so any parallel layout that computes that element draws the same mask.
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct AttentionDropout {
  float p = 0.0f;  // drop probability; 0 disables
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;       // distinguishes layers and iterations
  std::int64_t first_sample = 0;  // global sample id of batch row 0
  std::int64_t head_offset = 0;   // global index of this rank's first head
  std::int64_t total_heads = 0;   // heads of the whole model (0: num_heads)
};

// True when element `index` of a dropout stream is kept (probability 1 - p): 32-bit word index % 4
// of the Philox4x32-10 block (core/rng.h) for counter (index / 4, stream) and key seed is at least
// floor(p 2^32). Four consecutive indices share one block (as curand_uniform4 draws them).
bool dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float p);

struct FlashAttentionForwardArgs {
  float* out = nullptr;          // (B, T, C)       written (=)
  float* lse = nullptr;          // (B, NH, T)      written (=): log-sum-exp of each score row
  const float* qkv = nullptr;    // (B, T, NH, 3, HS)
  const float* alibi = nullptr;  // (NH) slopes, or null for no bias
  AttentionDropout dropout;
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  const std::int32_t* doc = nullptr;  // (B, T) document id of each token, or null: one document
};

struct FlashAttentionBackwardArgs {
  float* d_qkv = nullptr;        // (B, T, NH, 3, HS)  written (=)
  const float* d_out = nullptr;  // (B, T, C)
  const float* qkv = nullptr;    // (B, T, NH, 3, HS)
  const float* out = nullptr;    // (B, T, C)  from the forward
  const float* lse = nullptr;    // (B, NH, T) from the forward
  const float* alibi = nullptr;  // (NH) or null
  AttentionDropout dropout;
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  const std::int32_t* doc = nullptr;  // (B, T) as in the forward
};

// flash_attention_forward over typed views. B, T, NH and HS are read from qkv, a 4-D view whose
// last dimension holds each head's q, k and v (3 * HS).
struct FlashAttentionViews {
  core::TensorView out{};    // (B, T, NH * HS)    f32, written (=)
  core::TensorView lse{};    // (B, NH, T)         f32, written (=)
  core::TensorView qkv{};    // (B, T, NH, 3 * HS) f32
  core::TensorView alibi{};  // (NH)               f32 slopes, or empty: no bias
  core::TensorView doc{};    // (B, T)             i32 document ids, or empty: one document
  AttentionDropout dropout;
};
void flash_attention(const core::ExecContext& ctx, const FlashAttentionViews& v);

// flash_attention_backward over typed views; sizes from qkv.
struct FlashAttentionBackwardViews {
  core::TensorView d_qkv{};  // (B, T, NH, 3 * HS) f32, written (=)
  core::TensorView d_out{};  // (B, T, NH * HS)    f32
  core::TensorView qkv{};    // (B, T, NH, 3 * HS) f32
  core::TensorView out{};    // (B, T, NH * HS)    f32, from the forward
  core::TensorView lse{};    // (B, NH, T)         f32, from the forward
  core::TensorView alibi{};  // (NH)               f32, or empty
  core::TensorView doc{};    // (B, T)             i32, or empty (as in the forward)
  AttentionDropout dropout;
};
void flash_attention_backward(const core::ExecContext& ctx, const FlashAttentionBackwardViews& v);

// ALiBi slopes for `num_heads` heads (Press et al.; the BLOOM / Megatron-DeepSpeed rule): for n a
// power of two, slope_i = 2^(-8 (i + 1) / n); otherwise the 2^floor(log2 n) power-of-two slopes
// followed by every other slope (0, 2, 4, ...) of the rule for twice that many heads.
void alibi_slopes(std::int64_t num_heads, float* slopes);

namespace ref {
// Reference: scores materialized per head in double, the same masks.
void flash_attention_forward(const FlashAttentionForwardArgs& args);
void flash_attention_backward(const FlashAttentionBackwardArgs& args);
}  // namespace ref

}  // namespace trident::kernels
