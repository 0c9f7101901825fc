// The head: final norm, the output layer (vocab-parallel: each tp rank computes its Vp/tp logit
// columns for every row) and the softmax cross-entropy loss (vocab-parallel: three local kernels
// with two tp reductions between them; the full logits are never gathered).
//
// Variants (LmHeadConfig): the output weight tied to the word embedding (GPT-2, BLOOM: the caller
// passes wte) or untied (its own weight); the final norm's kind as norm.h.
//
// Two ways to run it (LmHeadConfig::chunk_rows):
// - materialised (chunk_rows 0): lm_head_forward writes the logits of every row, lm_head_loss
//   turns them into d_logits in place, lm_head_backward runs the output layer's backward from them.
//   Generation and the golden tests read the logits this way.
// - chunked (chunk_rows > 0, training and evaluation): lm_head_forward runs only the final norm;
//   lm_head_chunked_loss then takes chunk_rows rows at a time through the output layer, the
//   cross-entropy and, with gradients, the output layer's backward (d_out_w +=, the norm output's
//   gradient into saved.d_norm), so only one chunk of logits ever exists (a 1024-token GPT-2
//   micro-batch: 206 MB of logits become 51 MB). lm_head_backward then starts at the norm.
#pragma once

#include "trident/kernels/vocab_parallel_cross_entropy.h"
#include "trident/model/layers/layer.h"
#include "trident/model/layers/norm.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

// Where the output layer's weight comes from.
enum class OutputWeight : std::uint8_t {
  kOwn,   // its own "output_layer.weight" (Llama)
  kTied,  // the word embedding of the same shard (GPT-2, BLOOM): the model binds it there
  // Tied, on a last pipeline stage without the embedding: a copy of it under its name, summed
  // with the first stage's every step (Megatron's convention).
  kTiedCopy,
};
struct LmHeadConfig {
  std::int64_t hidden = 0;
  std::int64_t vocab = 0;        // real tokens
  std::int64_t vocab_local = 0;  // Vp/tp columns held here
  NormConfig norm;
  std::int64_t chunk_rows = 0;  // 0: materialised logits; else rows per chunk (see above)
  OutputWeight output = OutputWeight::kTied;
};
struct LmHeadParams {
  NormParams norm;
  Weight out_w;  // (Vp/tp, C): the word embedding when tied
};
struct LmHeadGrads {
  NormGrads norm;
  float* out_w = nullptr;
};
// "final_layernorm." and the output layer's weight (Vp, C) vocab-parallel (LmHeadConfig::output).
void declare_lm_head(const LmHeadConfig& cfg, const WeightScope& s, LmHeadParams* p,
                     LmHeadGrads* g);
struct LmHeadSaved {
  NormSaved norm;              // (local rows, C)
  float* logits = nullptr;     // (B*T, Vp/tp); d_logits after lm_head_loss with gradients.
                               // Chunked: (chunk_rows, Vp/tp), one chunk at a time
  float* losses = nullptr;     // (B*T)
  float* row_stats = nullptr;  // (3, B*T): max, sum of exp, target logit (chunked: chunk_rows)
  float* d_norm = nullptr;     // chunked: (B*T, C) this rank's partial gradient of the norm
                               // output, written by lm_head_chunked_loss with gradients
};

struct TokenLoss {
  double sum = 0;          // over counted tokens
  std::int64_t count = 0;  // tokens with a non-negative target
};

// s.logits = out_w @ norm(in) (in: local rows).
struct LmHeadForwardArgs {
  const float* in = nullptr;  // (local rows, C) the last block's output
  LmHeadSaved saved;
};
void lm_head_forward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                     const LmHeadForwardArgs& args);
// Cross-entropy of s.logits against targets (B*T; negative = ignored). With with_grad
// s.logits is overwritten with d_scale * dloss/dlogits.
struct LmHeadLossArgs {
  const std::int32_t* targets = nullptr;  // (B*T), negative = ignored
  bool with_grad = false;
  float d_scale = 1.0f;  // dL/dloss of each token
  // Set: the losses are added to this TokenLossSum in device memory (no host read; the function
  // returns {0, 0}); null: summed and read back.
  kernels::TokenLossSum* device_sum = nullptr;
  LmHeadSaved saved;
};
TokenLoss lm_head_loss(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadLossArgs& args);
// Chunked (cfg.chunk_rows > 0), after lm_head_forward: per chunk of rows, the output layer, the
// cross-entropy and with gradients its backward into grads.out_w (+=) and saved.d_norm (=).
// The same losses as lm_head_forward + lm_head_loss, to rounding.
struct LmHeadChunkedLossArgs {
  const std::int32_t* targets = nullptr;  // (B*T), negative = ignored
  bool with_grad = false;
  float d_scale = 1.0f;  // dL/dloss of each token
  // Set: the losses are added to this TokenLossSum in device memory (no host read; the function
  // returns {0, 0}); null: summed and read back.
  kernels::TokenLossSum* device_sum = nullptr;
  LmHeadSaved saved;
  float* d_out_w = nullptr;  // with gradients: the output weight's gradient (+=)
};
TokenLoss lm_head_chunked_loss(const LayerContext& lc, const LmHeadConfig& cfg,
                               const LmHeadParams& p, const LmHeadChunkedLossArgs& args);
// From s.logits holding d_logits (materialised), or s.d_norm (chunked): d_in (local rows) = the
// input gradient (=); grads += (chunked: the output weight's gradient is already in).
struct LmHeadBackwardArgs {
  float* d_in = nullptr;      // (local rows, C) written (=)
  const float* in = nullptr;  // the forward's input
  LmHeadSaved saved;
  LmHeadGrads grads;
};
void lm_head_backward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                      const LmHeadBackwardArgs& args);

}  // namespace trident::model::layers
