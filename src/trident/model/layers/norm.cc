#include "trident/model/layers/norm.h"

#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/rmsnorm.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                  const NormForwardArgs& a) {
  if (cfg.kind == NormKind::kRmsNorm) {
    return k::rmsnorm_forward(lc.ctx, {.out = a.saved.out,
                                       .rstd = a.saved.rstd,
                                       .in = a.in,
                                       .weight = p.weight,
                                       .rows = a.rows,
                                       .cols = cfg.hidden,
                                       .eps = cfg.eps});
  }
  k::layernorm_forward(lc.ctx, {.out = a.saved.out,
                                .mean = a.saved.mean,
                                .rstd = a.saved.rstd,
                                .in = a.in,
                                .weight = p.weight,
                                .bias = p.bias,
                                .rows = a.rows,
                                .cols = cfg.hidden,
                                .eps = cfg.eps});
}

void norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                   const NormBackwardArgs& a) {
  if (cfg.kind == NormKind::kRmsNorm) {
    return k::rmsnorm_backward(lc.ctx, {.d_in = a.d_in,
                                        .d_weight = a.grads.weight,
                                        .d_out = a.d_out,
                                        .in = a.in,
                                        .weight = p.weight,
                                        .rstd = a.saved.rstd,
                                        .rows = a.rows,
                                        .cols = cfg.hidden});
  }
  k::layernorm_backward(lc.ctx, {.d_in = a.d_in,
                                 .d_weight = a.grads.weight,
                                 .d_bias = a.grads.bias,
                                 .d_out = a.d_out,
                                 .in = a.in,
                                 .weight = p.weight,
                                 .mean = a.saved.mean,
                                 .rstd = a.saved.rstd,
                                 .rows = a.rows,
                                 .cols = cfg.hidden});
}

void residual_norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                           const ResidualNormForwardArgs& a) {
  if (cfg.kind == NormKind::kRmsNorm) {  // the add, then the norm (no fused RMSNorm kernel)
    k::add_forward(lc.ctx, a.resid, a.a, a.b, a.rows * cfg.hidden);
    norm_forward(lc, cfg, p, {.in = a.resid, .rows = a.rows, .saved = a.saved});
    if (a.out_bf16) k::convert_f32_to_bf16(lc.ctx, a.out_bf16, a.saved.out, a.rows * cfg.hidden);
    return;
  }
  k::residual_layernorm_forward(lc.ctx, {.resid_out = a.resid,
                                         .out = a.saved.out,
                                         .out_bf16 = a.out_bf16,
                                         .mean = a.saved.mean,
                                         .rstd = a.saved.rstd,
                                         .a = a.a,
                                         .b = a.b,
                                         .weight = p.weight,
                                         .bias = p.bias,
                                         .rows = a.rows,
                                         .cols = cfg.hidden,
                                         .eps = cfg.eps});
}

void residual_norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                            const ResidualNormBackwardArgs& a) {
  if (cfg.kind == NormKind::kRmsNorm) {
    return norm_backward(lc, cfg, p,
                         {.d_in = a.d_resid,
                          .d_out = a.d_out,
                          .in = a.resid,
                          .rows = a.rows,
                          .saved = a.saved,
                          .grads = a.grads});
  }
  k::residual_layernorm_backward(lc.ctx, {.d_resid = a.d_resid,
                                          .d_weight = a.grads.weight,
                                          .d_bias = a.grads.bias,
                                          .d_out = a.d_out,
                                          .resid = a.resid,
                                          .weight = p.weight,
                                          .mean = a.saved.mean,
                                          .rstd = a.saved.rstd,
                                          .rows = a.rows,
                                          .cols = cfg.hidden,
                                          .scratch = lc.ws.norm_scratch});
}

}  // namespace trident::model::layers
