// Causal self-attention, tensor-parallel as Megatron's: column-parallel QKV (this rank's NH/tp
// heads), the attention core, row-parallel output projection. The input enters the tp region
// through copy_to_tp (sequence parallelism: gather_from_sequence) and the output leaves it through
// reduce_from_tp (reduce_scatter_to_sequence); the backward runs the conjugates.
//
// Variants (AttentionConfig): the fused flash-style core (keeps the row log-sum-exp) or the
// unfused one (keeps the (T x T) probabilities, or none under selective recomputation); ALiBi
// slopes or none; generation's KV cache; grouped-query heads (query_groups < heads: the QKV
// projection has a key and a value head per group) and rotary positions (inv_freq). With either,
// the projection's output (in Megatron's grouped layout) goes through kernels/rope.h, which
// rotates q and k and expands every group's key and value to its query heads, so the attention
// cores always see (NH/tp, 3, HS) rows. Biases are optional (--disable-bias-linear), the QKV one
// apart (--add-qkv-bias).
#pragma once

#include "trident/model/layers/layer.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

struct AttentionConfig {
  std::int64_t hidden = 0;          // C
  std::int64_t heads = 0;           // NH of the whole model; this rank runs heads / tp
  std::int64_t head_dim = 0;        // HS
  bool flash = true;                // fused core (ALiBi and attention dropout need it)
  const float* alibi = nullptr;     // this rank's slopes (heads / tp), or null
  std::int64_t query_groups = 0;    // G of the whole model (== heads: multi-head attention)
  bool expand_qkv = false;          // rotary or grouped-query: run kernels/rope.h
  const float* inv_freq = nullptr;  // rotary inverse frequencies (head_dim / 2), or null
  bool bias = true;                 // the projections' biases (--disable-bias-linear: none)
  bool qkv_bias = true;  // the QKV projection's bias (--add-qkv-bias keeps it without `bias`)
};
struct AttentionParams {
  // (Ql, C), rows per local query group (G/tp, NH/G + 2, HS); with fewer groups than ranks
  // (1, NH/tp + 2, HS): a slice of one group's query heads and its key/value heads (replicated).
  Weight qkv_w;
  const float* qkv_b = nullptr;   // (Ql) or null
  Weight proj_w;                  // (C, C/tp)
  const float* proj_b = nullptr;  // (C), added once (tp rank 0) before the reduction
};
struct AttentionGrads {
  float *qkv_w = nullptr, *qkv_b = nullptr, *proj_w = nullptr, *proj_b = nullptr;
};
// "query_key_value.weight" (Q, C) column-parallel (whole query groups per rank, or a slice of one
// group's query heads with its key/value heads replicated), "dense.weight" (C, C) row-parallel,
// and their biases.
void declare_attention(const AttentionConfig& cfg, const WeightScope& s, AttentionParams* p,
                       AttentionGrads* g);
struct AttentionSaved {
  float* qkv = nullptr;    // (B*T, 3C/tp) per head (NH/tp, 3, HS), rotated and expanded
  float* probs = nullptr;  // (B, NH/tp, T, T) unfused core; null: recomputed (selective)
  float* lse = nullptr;    // (B, NH/tp, T) fused core
  float* attn = nullptr;   // (B*T, C/tp) before the projection
  // DeepSpeed-Ulysses (context_parallel.h): qkv holds the whole sequence for this rank's heads,
  // attn_seq the core's output there (B*T x C/tp elements each, as qkv and attn).
  float* attn_seq = nullptr;
};
// Generation: keys and values of earlier positions (one sample, this layer).
struct KvCache {
  float* k = nullptr;  // (max_positions, C)
  float* v = nullptr;  // (max_positions, C)
  std::int64_t max_positions = 0;
  std::int64_t position = 0;   // position of the first new row
  std::span<float> scratch{};  // kernels/kv_cache_attention.h
};

// out (local rows, C) = attention(in) where `in` is the normalized residual stream (local rows).
// With a cache the rows are new tokens of one sample, appended to it.
struct AttentionForwardArgs {
  float* out = nullptr;       // (local rows, C) written
  const float* in = nullptr;  // (local rows, C)
  AttentionSaved saved;
  std::int64_t layer = 0;  // global layer index (dropout streams)
  const KvCache* cache = nullptr;
};
void attention_forward(const LayerContext& lc, const AttentionConfig& cfg, const AttentionParams& p,
                       const AttentionForwardArgs& args);
// Returns the gradient of `in` (local rows, in a workspace buffer, valid until the next layer
// call); grads +=.
struct AttentionBackwardArgs {
  const float* d_out = nullptr;  // (local rows, C) the gradient of out
  const float* in = nullptr;     // the forward's input
  AttentionSaved saved;
  std::int64_t layer = 0;
  AttentionGrads grads;
};
const float* attention_backward(const LayerContext& lc, const AttentionConfig& cfg,
                                const AttentionParams& p, const AttentionBackwardArgs& args);

}  // namespace trident::model::layers
