#include "trident/model/layers/block.h"

#include "trident/kernels/elementwise.h"

namespace trident::model::layers {

void declare_block(const BlockConfig& cfg, const WeightScope& s, BlockParams* p, BlockGrads* g) {
  declare_norm(cfg.norm, s.sub("input_layernorm."), field(p, &BlockParams::norm1),
               field(g, &BlockGrads::norm1));
  declare_attention(cfg.attention, s.sub("self_attention."), field(p, &BlockParams::attention),
                    field(g, &BlockGrads::attention));
  declare_norm(cfg.norm, s.sub("post_attention_layernorm."), field(p, &BlockParams::norm2),
               field(g, &BlockGrads::norm2));
  if (cfg.is_moe(s.layer())) {
    declare_moe(cfg.moe, s.sub("mlp."), field(p, &BlockParams::moe), field(g, &BlockGrads::moe));
  } else {
    declare_mlp(cfg.mlp, s.sub("mlp."), field(p, &BlockParams::mlp), field(g, &BlockGrads::mlp));
  }
}

namespace k = trident::kernels;

void block_forward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                   const BlockForwardArgs& args) {
  const BlockSaved& s = args.saved;
  const std::int64_t R = lc.local_rows(), C = cfg.norm.hidden, layer = args.layer;
  // Under --bf16 the fused residual + norm also writes the MLP input's BF16 copy.
  const bool moe = cfg.is_moe(layer);
  core::bf16* norm2_bf16 = !moe && p.mlp.fc_w.bf16 && !lc.region.sp() ? lc.ws.bf16_in : nullptr;

  norm_forward(lc, cfg.norm, p.norm1, {.in = args.x, .rows = R, .saved = s.norm1});
  attention_forward(lc, cfg.attention, p.attention,
                    {.out = s.resid2,
                     .in = s.norm1.out,
                     .saved = s.attention,
                     .layer = layer,
                     .cache = args.cache});
  dropout_forward(lc, s.resid2, C, layer, DropSite::kAttentionOut);
  residual_norm_forward(  // resid2 = x + resid2, norm2 = norm(resid2)
      lc, cfg.norm, p.norm2,
      {.resid = s.resid2,
       .a = s.resid2,
       .b = args.x,
       .rows = R,
       .saved = s.norm2,
       .out_bf16 = norm2_bf16});
  if (moe) {
    moe_forward(lc, cfg.moe, p.moe,
                {.out = s.out, .in = s.norm2.out, .saved = s.moe, .stats = args.moe_stats});
  } else {
    mlp_forward(lc, cfg.mlp, p.mlp,
                {.out = s.out, .in = s.norm2.out, .in_bf16 = norm2_bf16, .saved = s.mlp});
  }
  dropout_forward(lc, s.out, C, layer, DropSite::kMlpOut);
  const core::Shape rc{R, C};
  k::add(lc.ctx, {.out = view_of(lc, s.out, rc),  // out = resid2 + out
                  .a = view_of(lc, s.out, rc),
                  .b = view_of(lc, s.resid2, rc)});
}

void block_backward(const LayerContext& lc, const BlockConfig& cfg, const BlockParams& p,
                    const BlockBackwardArgs& args) {
  const BlockSaved& s = args.saved;
  const BlockGrads& g = args.grads;
  const std::int64_t R = lc.local_rows(), C = cfg.norm.hidden, layer = args.layer;
  float* d_x = args.d_x;  // the residual adds pass it through; each branch adds into it

  const float* d = dropout_backward(lc, d_x, C, layer, DropSite::kMlpOut);
  if (cfg.is_moe(layer)) {
    const Workspace& ws = lc.ws;
    d = moe_backward(lc, cfg.moe, p.moe,
                     {.d_out = d,
                      .in = s.norm2.out,
                      .saved = s.moe,
                      .grads = g.moe,
                      .aux_grad_scale = lc.aux_loss_scale,
                      .d_weights = ws.moe_d_weights,
                      .d_logits = ws.moe_d_logits,
                      .d_perm = ws.moe_d_perm,
                      .d_fc = ws.moe_d_fc,
                      .d_act = ws.moe_d_act,
                      .d_aux = ws.moe_d_aux,
                      .d_shared_in = ws.moe_d_shared_in,
                      .d_shared_out = ws.moe_d_shared_out,
                      .d_shared_logits = ws.moe_d_shared_logits});
  } else {
    d = mlp_backward(lc, cfg.mlp, p.mlp,
                     {.d_out = d, .in = s.norm2.out, .saved = s.mlp, .grads = g.mlp});
  }
  residual_norm_backward(lc, cfg.norm, p.norm2,
                         {.d_resid = d_x,
                          .d_out = d,
                          .resid = s.resid2,
                          .rows = R,
                          .saved = s.norm2,
                          .grads = g.norm2});
  d = dropout_backward(lc, d_x, C, layer, DropSite::kAttentionOut);
  d = attention_backward(
      lc, cfg.attention, p.attention,
      {.d_out = d, .in = s.norm1.out, .saved = s.attention, .layer = layer, .grads = g.attention});
  norm_backward(
      lc, cfg.norm, p.norm1,
      {.d_in = d_x, .d_out = d, .in = args.x, .rows = R, .saved = s.norm1, .grads = g.norm1});
}

}  // namespace trident::model::layers
