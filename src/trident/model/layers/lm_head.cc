#include "trident/model/layers/lm_head.h"

#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void lm_head_forward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                     const LmHeadForwardArgs& args) {
  const LmHeadSaved& s = args.saved;
  norm_forward(lc, cfg.norm, p.norm, {.in = args.in, .rows = lc.local_rows(), .saved = s.norm});
  const float* x = lc.region.enter(s.norm.out, lc.ws.gathered);  // f (SP: all-gather)
  linear(lc, {.out = s.logits,
              .in = x,
              .weight = p.out_w,
              .bias = nullptr,
              .rows = lc.rows(),
              .in_features = cfg.hidden,
              .out_features = cfg.vocab_local});
}

TokenLoss lm_head_loss(const LayerContext& lc, const LmHeadConfig& cfg,
                       const LmHeadLossArgs& args) {
  const LmHeadSaved& s = args.saved;
  const std::int32_t* targets = args.targets;
  const bool with_grad = args.with_grad;
  const float d_scale = args.d_scale;
  const std::int64_t BT = lc.rows();
  const parallel::TpGroup& tp = lc.region.group();
  if (!tp.active()) {
    k::cross_entropy_forward_backward(lc.ctx, {.losses = s.losses,
                                               .d_logits = with_grad ? s.logits : nullptr,
                                               .logits = s.logits,
                                               .targets = targets,
                                               .d_scale = d_scale,
                                               .rows = BT,
                                               .vocab = cfg.vocab,
                                               .vocab_padded = cfg.vocab_local});
  } else {
    const k::VocabParallelShard shard{.vocab = cfg.vocab,
                                      .vocab_start = tp.rank() * cfg.vocab_local,
                                      .vocab_local = cfg.vocab_local};
    float* row_max = s.row_stats;
    float* sum_exp = s.row_stats + BT;  // sum of exp, then target logit: one reduction
    float* target_logit = sum_exp + BT;
    k::vocab_parallel_ce_max(lc.ctx,
                             {.row_max = row_max, .logits = s.logits, .rows = BT, .shard = shard});
    tp.all_reduce_max(row_max, BT);
    k::vocab_parallel_ce_sum_target(lc.ctx, {.sum_exp = sum_exp,
                                             .target_logit = target_logit,
                                             .logits = s.logits,
                                             .row_max = row_max,
                                             .targets = targets,
                                             .rows = BT,
                                             .shard = shard});
    tp.all_reduce_sum(sum_exp, 2 * BT);
    k::vocab_parallel_ce_loss(lc.ctx, {.losses = s.losses,
                                       .d_logits = with_grad ? s.logits : nullptr,
                                       .logits = s.logits,
                                       .row_max = row_max,
                                       .sum_exp = sum_exp,
                                       .target_logit = target_logit,
                                       .targets = targets,
                                       .d_scale = d_scale,
                                       .rows = BT,
                                       .shard = shard});
  }
  const k::TokenLossSum sum = k::sum_token_losses(lc.ctx, s.losses, targets, BT);
  return {.sum = sum.sum, .count = sum.count};
}

void lm_head_backward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                      const LmHeadBackwardArgs& args) {
  const LmHeadSaved& s = args.saved;
  float* d_in = args.d_in;
  // SP gathers the norm output again rather than keeping a full copy.
  const float* x = lc.region.enter(s.norm.out, lc.ws.gathered);
  linear_backward(lc, {.d_in = lc.ws.d_ln,
                       .d_weight = args.grads.out_w,
                       .d_bias = nullptr,
                       .d_out = s.logits,
                       .in = x,
                       .weight = p.out_w,
                       .rows = lc.rows(),
                       .in_features = cfg.hidden,
                       .out_features = cfg.vocab_local});
  const float* d_norm = lc.region.enter_backward(lc.ws.d_ln);  // each rank held a partial
  k::fill(lc.ctx, {.out = d_in, .value = 0.0f, .n = lc.local_rows() * cfg.hidden});
  norm_backward(lc, cfg.norm, p.norm,
                {.d_in = d_in,
                 .d_out = d_norm,
                 .in = args.in,
                 .rows = lc.local_rows(),
                 .saved = s.norm,
                 .grads = args.grads.norm});
}

}  // namespace trident::model::layers
