#include "trident/model/layers/norm.h"

#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/rmsnorm.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void declare_norm(const NormConfig& cfg, const WeightScope& s, NormParams* p, NormGrads* g) {
  s({.name = "weight",
     .shape = {cfg.hidden},
     .init = InitRule::kOnes,
     .weight_decay = false,
     .norm = true},
    slot(field(p, &NormParams::weight), field(g, &NormGrads::weight)));
  if (cfg.kind == NormKind::kLayerNorm) {
    s({.name = "bias",
       .shape = {cfg.hidden},
       .init = InitRule::kZeros,
       .weight_decay = false,
       .norm = true},
      slot(field(p, &NormParams::bias), field(g, &NormGrads::bias)));
  }
}

void norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                  const NormForwardArgs& a) {
  const core::Shape rc{a.rows, cfg.hidden}, r{a.rows}, c{cfg.hidden};
  if (cfg.kind == NormKind::kRmsNorm) {
    return k::rmsnorm(lc.ctx, {.out = view_of(lc, a.saved.out, rc),
                               .rstd = view_of(lc, a.saved.rstd, r),
                               .in = view_of(lc, a.in, rc),
                               .weight = view_of(lc, p.weight, c),
                               .eps = cfg.eps});
  }
  k::layernorm(lc.ctx, {.out = view_of(lc, a.saved.out, rc),
                        .mean = view_of(lc, a.saved.mean, r),
                        .rstd = view_of(lc, a.saved.rstd, r),
                        .in = view_of(lc, a.in, rc),
                        .weight = view_of(lc, p.weight, c),
                        .bias = view_of(lc, p.bias, c),
                        .eps = cfg.eps});
}

void norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                   const NormBackwardArgs& a) {
  const core::Shape rc{a.rows, cfg.hidden}, r{a.rows}, c{cfg.hidden};
  if (cfg.kind == NormKind::kRmsNorm) {
    return k::rmsnorm_backward(lc.ctx, {.d_in = view_of(lc, a.d_in, rc),
                                        .d_weight = view_of(lc, a.grads.weight, c),
                                        .d_out = view_of(lc, a.d_out, rc),
                                        .in = view_of(lc, a.in, rc),
                                        .weight = view_of(lc, p.weight, c),
                                        .rstd = view_of(lc, a.saved.rstd, r)});
  }
  k::layernorm_backward(lc.ctx, {.d_in = view_of(lc, a.d_in, rc),
                                 .d_weight = view_of(lc, a.grads.weight, c),
                                 .d_bias = view_of(lc, a.grads.bias, c),
                                 .d_out = view_of(lc, a.d_out, rc),
                                 .in = view_of(lc, a.in, rc),
                                 .weight = view_of(lc, p.weight, c),
                                 .mean = view_of(lc, a.saved.mean, r),
                                 .rstd = view_of(lc, a.saved.rstd, r)});
}

void residual_norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                           const ResidualNormForwardArgs& a) {
  if (cfg.kind == NormKind::kRmsNorm) {  // the add, then the norm (no fused RMSNorm kernel)
    const core::Shape rc{a.rows, cfg.hidden};
    k::add(lc.ctx,
           {.out = view_of(lc, a.resid, rc), .a = view_of(lc, a.a, rc), .b = view_of(lc, a.b, rc)});
    norm_forward(lc, cfg, p, {.in = a.resid, .rows = a.rows, .saved = a.saved});
    if (a.out_bf16) {
      k::convert(lc.ctx, {.out = view_of(lc, a.out_bf16, rc), .in = view_of(lc, a.saved.out, rc)});
    }
    return;
  }
  const core::Shape rc{a.rows, cfg.hidden}, r{a.rows}, c{cfg.hidden};
  k::residual_layernorm(lc.ctx, {.resid_out = view_of(lc, a.resid, rc),
                                 .out = view_of(lc, a.saved.out, rc),
                                 .out_bf16 = view_of(lc, a.out_bf16, rc),
                                 .mean = view_of(lc, a.saved.mean, r),
                                 .rstd = view_of(lc, a.saved.rstd, r),
                                 .a = view_of(lc, a.a, rc),
                                 .b = view_of(lc, a.b, rc),
                                 .weight = view_of(lc, p.weight, c),
                                 .bias = view_of(lc, p.bias, c),
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
  const core::Shape rc{a.rows, cfg.hidden}, r{a.rows}, c{cfg.hidden};
  k::residual_layernorm_backward(lc.ctx, {.d_resid = view_of(lc, a.d_resid, rc),
                                          .d_weight = view_of(lc, a.grads.weight, c),
                                          .d_bias = view_of(lc, a.grads.bias, c),
                                          .d_out = view_of(lc, a.d_out, rc),
                                          .resid = view_of(lc, a.resid, rc),
                                          .weight = view_of(lc, p.weight, c),
                                          .mean = view_of(lc, a.saved.mean, r),
                                          .rstd = view_of(lc, a.saved.rstd, r),
                                          .scratch = lc.ws.norm_scratch});
}

}  // namespace trident::model::layers
