#include "trident/model/layers/lm_head.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void declare_lm_head(const LmHeadConfig& cfg, const WeightScope& s, LmHeadParams* p,
                     LmHeadGrads* g) {
  declare_norm(cfg.norm, s.sub("final_layernorm."), field(p, &LmHeadParams::norm),
               field(g, &LmHeadGrads::norm));
  if (cfg.output == OutputWeight::kTied) return;
  // The tied copy is initialised as the embedding (the same name keys the same draws).
  s({.name = cfg.output == OutputWeight::kOwn ? "output_layer.weight"
                                              : "embedding.word_embeddings.weight",
     .shape = {cfg.vocab_local * s.tp_size(), cfg.hidden},
     .tp_split = 0,
     .shared = cfg.output == OutputWeight::kTiedCopy,
     .tied = cfg.output == OutputWeight::kTiedCopy},
    slot(field(p, &LmHeadParams::out_w), field(g, &LmHeadGrads::out_w)));
}

void lm_head_forward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                     const LmHeadForwardArgs& args) {
  const LmHeadSaved& s = args.saved;
  norm_forward(lc, cfg.norm, p.norm, {.in = args.in, .rows = lc.local_rows(), .saved = s.norm});
  if (cfg.chunk_rows > 0) return;  // the output layer runs chunk by chunk with the loss
  const float* x = lc.region.enter(s.norm.out, lc.ws.gathered);  // f (SP: all-gather)
  linear(lc, {.out = s.logits,
              .in = x,
              .weight = p.out_w,
              .bias = nullptr,
              .rows = lc.rows(),
              .in_features = cfg.hidden,
              .out_features = cfg.vocab_local});
}

namespace {

// Cross-entropy of `rows` rows of logits (this rank's Vp/tp columns) against their targets:
// losses (=), and with d_logits (may alias logits) d_scale * dloss/dlogits. Vocab-parallel across
// the tp group: local max, sum-of-exp and target-logit parts with two reductions between them.
struct RowsLoss {
  float* losses = nullptr;
  float* d_logits = nullptr;
  const float* logits = nullptr;
  const std::int32_t* targets = nullptr;
  float* row_stats = nullptr;  // (3, rows)
  float d_scale = 1.0f;
  std::int64_t rows = 0;
};
void rows_loss(const LayerContext& lc, const LmHeadConfig& cfg, const RowsLoss& a) {
  const parallel::TpGroup& tp = lc.region.group();
  const std::int64_t n = a.rows;
  const core::Shape rows{n}, logits{n, cfg.vocab_local};
  if (!tp.active()) {
    k::cross_entropy_forward_backward(lc.ctx, {.losses = view_of(lc, a.losses, rows),
                                               .d_logits = view_of(lc, a.d_logits, logits),
                                               .logits = view_of(lc, a.logits, logits),
                                               .targets = view_of(lc, a.targets, rows),
                                               .d_scale = a.d_scale,
                                               .vocab = cfg.vocab});
    return;
  }
  const std::int64_t vocab_start = tp.rank() * cfg.vocab_local;
  float* row_max = a.row_stats;
  float* sum_exp = a.row_stats + n;  // sum of exp, then target logit: one reduction
  float* target_logit = sum_exp + n;
  k::vocab_parallel_ce_max(lc.ctx, {.row_max = view_of(lc, row_max, rows),
                                    .logits = view_of(lc, a.logits, logits),
                                    .vocab = cfg.vocab,
                                    .vocab_start = vocab_start});
  tp.all_reduce_max(row_max, n);
  k::vocab_parallel_ce_sum_target(lc.ctx, {.sum_exp = view_of(lc, sum_exp, rows),
                                           .target_logit = view_of(lc, target_logit, rows),
                                           .logits = view_of(lc, a.logits, logits),
                                           .row_max = view_of(lc, row_max, rows),
                                           .targets = view_of(lc, a.targets, rows),
                                           .vocab = cfg.vocab,
                                           .vocab_start = vocab_start});
  tp.all_reduce_sum(sum_exp, 2 * n);
  k::vocab_parallel_ce_loss(lc.ctx, {.losses = view_of(lc, a.losses, rows),
                                     .d_logits = view_of(lc, a.d_logits, logits),
                                     .logits = view_of(lc, a.logits, logits),
                                     .row_max = view_of(lc, row_max, rows),
                                     .sum_exp = view_of(lc, sum_exp, rows),
                                     .target_logit = view_of(lc, target_logit, rows),
                                     .targets = view_of(lc, a.targets, rows),
                                     .d_scale = a.d_scale,
                                     .vocab = cfg.vocab,
                                     .vocab_start = vocab_start});
}

TokenLoss token_loss(const LayerContext& lc, const float* losses, const std::int32_t* targets,
                     k::TokenLossSum* device_sum) {
  const core::Shape rows{lc.rows()};
  const k::TokenLossViews v{.losses = view_of(lc, losses, rows),
                            .targets = view_of(lc, targets, rows)};
  if (device_sum != nullptr) {
    k::accumulate_token_losses(lc.ctx, v, device_sum);
    return {};
  }
  const k::TokenLossSum sum = k::sum_token_losses(lc.ctx, v);
  return {.sum = sum.sum, .count = sum.count};
}

}  // namespace

TokenLoss lm_head_loss(const LayerContext& lc, const LmHeadConfig& cfg,
                       const LmHeadLossArgs& args) {
  TRIDENT_ASSERT(cfg.chunk_rows == 0, "lm_head_loss on a chunked head: use lm_head_chunked_loss");
  const LmHeadSaved& s = args.saved;
  rows_loss(lc, cfg,
            {.losses = s.losses,
             .d_logits = args.with_grad ? s.logits : nullptr,
             .logits = s.logits,
             .targets = args.targets,
             .row_stats = s.row_stats,
             .d_scale = args.d_scale,
             .rows = lc.rows()});
  return token_loss(lc, s.losses, args.targets, args.device_sum);
}

TokenLoss lm_head_chunked_loss(const LayerContext& lc, const LmHeadConfig& cfg,
                               const LmHeadParams& p, const LmHeadChunkedLossArgs& args) {
  TRIDENT_ASSERT(cfg.chunk_rows > 0, "lm_head_chunked_loss on a materialised head");
  TRIDENT_ASSERT(!args.with_grad || args.d_out_w != nullptr,
                 "lm_head_chunked_loss with gradients needs the output weight's gradient");
  const LmHeadSaved& s = args.saved;
  const std::int64_t BT = lc.rows(), C = cfg.hidden;
  const float* x = lc.region.enter(s.norm.out, lc.ws.gathered);  // f (SP: all-gather)
  for (std::int64_t r0 = 0; r0 < BT; r0 += cfg.chunk_rows) {
    const std::int64_t n = std::min(cfg.chunk_rows, BT - r0);
    const float* xc = x + r0 * C;
    linear(lc, {.out = s.logits,
                .in = xc,
                .weight = p.out_w,
                .bias = nullptr,
                .rows = n,
                .in_features = C,
                .out_features = cfg.vocab_local});
    rows_loss(lc, cfg,
              {.losses = s.losses + r0,
               .d_logits = args.with_grad ? s.logits : nullptr,
               .logits = s.logits,
               .targets = args.targets + r0,
               .row_stats = s.row_stats,
               .d_scale = args.d_scale,
               .rows = n});
    if (!args.with_grad) continue;
    linear_backward(lc, {.d_in = s.d_norm + r0 * C,
                         .d_weight = args.d_out_w,
                         .d_bias = nullptr,
                         .d_out = s.logits,
                         .in = xc,
                         .weight = p.out_w,
                         .rows = n,
                         .in_features = C,
                         .out_features = cfg.vocab_local});
  }
  return token_loss(lc, s.losses, args.targets, args.device_sum);
}

void lm_head_backward(const LayerContext& lc, const LmHeadConfig& cfg, const LmHeadParams& p,
                      const LmHeadBackwardArgs& args) {
  const LmHeadSaved& s = args.saved;
  float* d_in = args.d_in;
  float* partial = s.d_norm;  // chunked: written by lm_head_chunked_loss
  if (cfg.chunk_rows == 0) {
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
    partial = lc.ws.d_ln;
  }
  const float* d_norm = lc.region.enter_backward(partial);  // each rank held a partial
  k::fill(lc.ctx, {.out = view_of(lc, d_in, {lc.local_rows(), cfg.hidden}), .value = 0.0f});
  norm_backward(lc, cfg.norm, p.norm,
                {.d_in = d_in,
                 .d_out = d_norm,
                 .in = args.in,
                 .rows = lc.local_rows(),
                 .saved = s.norm,
                 .grads = args.grads.norm});
}

}  // namespace trident::model::layers
