// A GPT shard's weights: the layer configurations, the layers' weight declarations in forward
// order (the ParamTable's order), and the Params / Grads structs the layers take, bound to buffers
// laid out by that table. The declarations are in the layers (model/layers/, weights.h); this file
// only strings them together: embedding, blocks, head.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "trident/core/bf16.h"
#include "trident/model/config.h"
#include "trident/model/layers/block.h"
#include "trident/model/layers/embedding.h"
#include "trident/model/layers/lm_head.h"
#include "trident/model/param_table.h"

namespace trident::model {

// The layer configurations of the model (variants are configuration: see model/layers/), for a
// tensor-parallel size. The constant tables (ALiBi slopes, rotary frequencies) are not set here:
// the forward points them at its copies.
struct GptLayers {
  layers::EmbeddingConfig embedding;
  layers::BlockConfig block;
  layers::LmHeadConfig head;
};
GptLayers gpt_layers(const ModelConfig& cfg, const ModelShard& shard);
// The mixture-of-experts layer's configuration (num_experts 0: none), its experts split over
// ep_size expert-parallel ranks.
layers::MoeConfig moe_config(const ModelConfig& cfg, int ep_size = 1);

// The weights one rank's layers run with: views into buffers laid out by the shard's ParamTable.
// Shapes are the local (tensor-parallel) ones. The embedding on a first pipeline stage, the head
// on a last one (its output weight is the embedding's when tied); under --bf16 the matmul weights
// carry their BF16 copies (layers::Weight). Biases are null under --disable-bias-linear, norm
// biases with RMSNorm, and every view of a tensor that is not resident (ZeRO 2-3) is null.
struct GptParams {
  layers::EmbeddingParams embedding;
  std::vector<layers::BlockParams> layers;  // the shard's layers, in order
  layers::LmHeadParams head;
};
// The same shapes; every gradient ACCUMULATES (+=) across micro-batches.
struct GptGrads {
  layers::EmbeddingGrads embedding;
  std::vector<layers::BlockGrads> layers;
  layers::LmHeadGrads head;
};

// Walks the shard's weight declarations in forward order: the embedding ("embedding."), each
// layer ("layers.<global index>."), the head. p / g (either may be null) are the structs the
// declarations' slots point into (sized by the caller: one entry per layer).
void declare_gpt(const ModelConfig& cfg, const ModelShard& shard, layers::WeightVisitor& visitor,
                 GptParams* p, GptGrads* g);

// Where parameter `offset` (an offset in the table's flat layout) lives, or null: not resident.
template <class T>
using Locate = std::function<T*(std::int64_t offset)>;

// Views of a flat buffer laid out by `table` (and its BF16 copy, laid out the same, or null).
GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table, const float* flat,
                          const core::bf16* flat_bf16 = nullptr);
GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table, float* flat);
// Views of storage that is not one flat buffer (ZeRO 2-3 keep the non-layer tensors compact).
GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table,
                          const Locate<const float>& locate,
                          const Locate<const core::bf16>& locate_bf16 = {});
GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table,
                        const Locate<float>& locate);
// One transformer layer's views (local index `layer` of the shard), e.g. inside ZeRO-3's staging
// slots.
layers::BlockParams block_param_views(const ModelConfig& cfg, const ParamTable& table,
                                      std::int64_t layer, const Locate<const float>& locate,
                                      const Locate<const core::bf16>& locate_bf16 = {});
layers::BlockGrads block_grad_views(const ModelConfig& cfg, const ParamTable& table,
                                    std::int64_t layer, const Locate<float>& locate);

}  // namespace trident::model
