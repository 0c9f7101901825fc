// The head: final norm, the output layer (vocab-parallel: each tp rank computes its Vp/tp logit
// columns for every row) and the softmax cross-entropy loss (vocab-parallel: three local kernels
// with two tp reductions between them; the full logits are never gathered).
//
// Variants (LmHeadConfig): the output weight tied to the word embedding (GPT-2, BLOOM: the caller
// passes wte) or untied (its own weight); the final norm's kind as norm.h.
#pragma once

#include "trident/model/layers/layer.h"
#include "trident/model/layers/norm.h"

namespace trident::model::layers {

struct LmHeadConfig {
  std::int64_t hidden = 0;
  std::int64_t vocab = 0;        // real tokens
  std::int64_t vocab_local = 0;  // Vp/tp columns held here
  NormConfig norm;
};
struct LmHeadParams {
  NormParams norm;
  Weight out_w;  // (Vp/tp, C): the word embedding when tied
};
struct LmHeadGrads {
  NormGrads norm;
  float* out_w = nullptr;
};
struct LmHeadSaved {
  NormSaved norm;              // (local rows, C)
  float* logits = nullptr;     // (B*T, Vp/tp); d_logits after lm_head_loss with gradients
  float* losses = nullptr;     // (B*T)
  float* row_stats = nullptr;  // (3, B*T): max, sum of exp, target logit
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
  LmHeadSaved saved;
};
TokenLoss lm_head_loss(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadLossArgs& args);
// From s.logits holding d_logits: d_in (local rows) = the input gradient (=); grads +=.
struct LmHeadBackwardArgs {
  float* d_in = nullptr;      // (local rows, C) written (=)
  const float* in = nullptr;  // the forward's input
  LmHeadSaved saved;
  LmHeadGrads grads;
};
void lm_head_backward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                      const LmHeadBackwardArgs& args);

}  // namespace trident::model::layers
