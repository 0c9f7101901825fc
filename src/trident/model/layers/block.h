// One pre-norm decoder block (GPT-2, BLOOM):
//   resid2 = x + drop(attention(norm1(x)))
//   out    = resid2 + drop(mlp(norm2(resid2)))
// The forward is that list; the backward is the same list reversed.
#pragma once

#include <vector>

#include "trident/model/layers/attention.h"
#include "trident/model/layers/layer.h"
#include "trident/model/layers/mlp.h"
#include "trident/model/layers/moe.h"
#include "trident/model/layers/norm.h"

namespace trident::model::layers {

struct BlockConfig {
  NormConfig norm;
  AttentionConfig attention;
  MlpConfig mlp;
  // Mixture of experts (moe.num_experts > 0): the MLP of every moe_layer_freq-th global layer
  // (0, freq, ...), or with a pattern (ModelConfig::moe_layer_pattern, one entry per layer) of
  // the layers it marks, is the MoE layer instead.
  MoeConfig moe;
  std::int64_t moe_layer_freq = 1;
  std::vector<bool> moe_layer_pattern;
  bool is_moe(std::int64_t layer) const {
    if (moe.num_experts <= 0) return false;
    if (moe_layer_pattern.empty()) return layer % moe_layer_freq == 0;
    return layer >= 0 && layer < static_cast<std::int64_t>(moe_layer_pattern.size()) &&
           moe_layer_pattern[static_cast<std::size_t>(layer)];
  }
};
struct BlockParams {
  NormParams norm1;
  AttentionParams attention;
  NormParams norm2;
  MlpParams mlp;
  MoeParams moe;  // a mixture-of-experts layer's, instead of mlp's
};
struct BlockGrads {
  NormGrads norm1;
  AttentionGrads attention;
  NormGrads norm2;
  MlpGrads mlp;
  MoeGrads moe;
};
// Saved activations of one block for one micro-batch (local rows of the residual stream).
// "input_layernorm.", "self_attention.", "post_attention_layernorm.", "mlp.": the sub-layers'
// (the MoE layer's under "mlp." too, in the layers cfg.is_moe picks by the scope's layer).
void declare_block(const BlockConfig& cfg, const WeightScope& s, BlockParams* p, BlockGrads* g);
struct BlockSaved {
  NormSaved norm1;
  AttentionSaved attention;
  float* resid2 = nullptr;  // (local rows, C) the residual stream after attention
  NormSaved norm2;
  MlpSaved mlp;
  MoeSaved moe;          // a mixture-of-experts layer's, instead of mlp's
  float* out = nullptr;  // (local rows, C) the block's output
};

struct BlockForwardArgs {
  const float* x = nullptr;        // (local rows, C) the block's input
  std::int64_t layer = 0;          // global layer index (dropout streams)
  BlockSaved saved;                // saved.out is the block's output
  const KvCache* cache = nullptr;  // generation's KV cache, or null
  MoeStats* moe_stats = nullptr;   // a mixture-of-experts layer's routing, filled when not null
};
void block_forward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                   const BlockForwardArgs& args);
struct BlockBackwardArgs {
  float* d_x = nullptr;  // on entry the gradient of out, on exit the gradient of x (local rows)
  const float* x = nullptr;
  std::int64_t layer = 0;
  BlockSaved saved;
  BlockGrads grads;  // +=
};
void block_backward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                    const BlockBackwardArgs& args);

}  // namespace trident::model::layers
