// Token (+ position) embedding, vocab-parallel as Megatron's: each tp rank holds Vp/tp rows of the
// word embedding and embeds the tokens it holds; the partial rows leave the tp region through
// reduce_from_tp (sequence parallelism: reduce_scatter_to_sequence). Optional LayerNorm right after
// it (BLOOM's --embed-layernorm).
//
// Variants (EmbeddingConfig): learned absolute positions (wpe set) or none (ALiBi models, whose
// positions live in the attention core); room for rotary (no table here either).
#pragma once

#include "trident/model/layers/layer.h"
#include "trident/model/layers/norm.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

struct EmbeddingConfig {
  std::int64_t hidden = 0;         // C
  std::int64_t vocab_local = 0;    // Vp/tp rows held here
  std::int64_t max_positions = 0;  // rows of wpe
  bool learned_positions = true;   // a position embedding (wpe); ALiBi and rotary have none
  bool norm = false;               // LayerNorm after the embedding
  bool tied_output = false;        // the output layer reads wte (GPT-2, BLOOM)
  NormConfig norm_cfg;
};
struct EmbeddingParams {
  Weight wte;                  // (Vp/tp, C); its BF16 copy is the tied output layer's
  const float* wpe = nullptr;  // (max_positions, C) or null (no learned positions)
  NormParams norm;             // with cfg.norm
};
struct EmbeddingGrads {
  float* wte = nullptr;
  float* wpe = nullptr;
  NormGrads norm;
};
// "word_embeddings.weight" (Vp, C) vocab-parallel, "position_embeddings.weight" (max_positions,
// C) replicated, "word_embeddings_layernorm." (BLOOM).
void declare_embedding(const EmbeddingConfig& cfg, const WeightScope& s, EmbeddingParams* p,
                       EmbeddingGrads* g);
struct EmbeddingSaved {
  float* raw = nullptr;  // (local rows, C) before the LayerNorm (with cfg.norm)
  NormSaved norm;        // norm.out is the layer's output `out` (with cfg.norm)
};

// out (local rows, C) = embedding of tokens (B*T), their positions starting at `position`.
struct EmbeddingForwardArgs {
  float* out = nullptr;                  // (local rows, C) written
  const std::int32_t* tokens = nullptr;  // (B*T)
  std::int64_t position = 0;             // position of each sample's first token (generation)
  EmbeddingSaved saved;
};
void embedding_forward(const LayerContext& lc, const EmbeddingConfig& cfg, const EmbeddingParams& p,
                       const EmbeddingForwardArgs& args);
// grads += (each rank its own vocabulary rows).
struct EmbeddingBackwardArgs {
  const float* d_out = nullptr;  // (local rows, C) the gradient of out
  const std::int32_t* tokens = nullptr;
  EmbeddingSaved saved;
  EmbeddingGrads grads;
};
void embedding_backward(const LayerContext& lc, const EmbeddingConfig& cfg,
                        const EmbeddingParams& p, const EmbeddingBackwardArgs& args);

}  // namespace trident::model::layers
