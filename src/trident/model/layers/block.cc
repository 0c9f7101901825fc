#include "trident/model/layers/block.h"

#include "trident/kernels/elementwise.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void block_forward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                   const float* x, std::int64_t layer, const BlockSaved& s, const KvCache* cache) {
  const std::int64_t R = lc.local_rows(), C = cfg.norm.hidden;
  norm_forward(lc, cfg.norm, p.norm1, x, R, s.norm1);
  attention_forward(lc, cfg.attention, p.attention, s.norm1.out, layer, s.attention, s.resid2,
                    cache);
  dropout_forward(lc, s.resid2, C, layer, DropSite::kAttentionOut);
  // resid2 = resid2 + x and its norm in one pass (and, under --bf16, the MLP input's BF16 copy).
  core::bf16* norm2_bf16 = p.mlp.fc_w.bf16 && !lc.region.sp() ? lc.ws.bf16_in : nullptr;
  residual_norm_forward(lc, cfg.norm, p.norm2, s.resid2, s.resid2, x, R, s.norm2, norm2_bf16);
  mlp_forward(lc, cfg.mlp, p.mlp, s.norm2.out, s.mlp, s.out, norm2_bf16);
  dropout_forward(lc, s.out, C, layer, DropSite::kMlpOut);
  k::add_forward(lc.ctx, s.out, s.out, s.resid2, R * C);
}

void block_backward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                    const BlockSaved& s, const float* x, std::int64_t layer, const BlockGrads& g,
                    float* d_x) {
  const std::int64_t R = lc.local_rows(), C = cfg.norm.hidden;
  // The residual adds pass d_x through; each branch adds its input gradient into it.
  const float* d = dropout_backward(lc, d_x, C, layer, DropSite::kMlpOut);
  d = mlp_backward(lc, cfg.mlp, p.mlp, s.mlp, s.norm2.out, d, g.mlp);
  residual_norm_backward(lc, cfg.norm, p.norm2, s.norm2, s.resid2, d, R, g.norm2, d_x);
  d = dropout_backward(lc, d_x, C, layer, DropSite::kAttentionOut);
  d = attention_backward(lc, cfg.attention, p.attention, s.attention, s.norm1.out, layer, d,
                         g.attention);
  norm_backward(lc, cfg.norm, p.norm1, s.norm1, x, d, R, g.norm1, d_x);
}

}  // namespace trident::model::layers
