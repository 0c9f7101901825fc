#include "trident/model/layers/norm.h"

#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                  const float* in, std::int64_t rows, const NormSaved& s) {
  k::layernorm_forward(lc.ctx, {.out = s.out,
                                .mean = s.mean,
                                .rstd = s.rstd,
                                .in = in,
                                .weight = p.weight,
                                .bias = p.bias,
                                .rows = rows,
                                .cols = cfg.hidden,
                                .eps = cfg.eps});
}

void norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                   const NormSaved& s, const float* in, const float* d_out, std::int64_t rows,
                   const NormGrads& g, float* d_in) {
  k::layernorm_backward(lc.ctx, {.d_in = d_in,
                                 .d_weight = g.weight,
                                 .d_bias = g.bias,
                                 .d_out = d_out,
                                 .in = in,
                                 .weight = p.weight,
                                 .mean = s.mean,
                                 .rstd = s.rstd,
                                 .rows = rows,
                                 .cols = cfg.hidden});
}

void residual_norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                           float* resid, const float* a, const float* b, std::int64_t rows,
                           const NormSaved& s, core::bf16* out_bf16) {
  k::residual_layernorm_forward(lc.ctx, {.resid_out = resid,
                                         .out = s.out,
                                         .out_bf16 = out_bf16,
                                         .mean = s.mean,
                                         .rstd = s.rstd,
                                         .a = a,
                                         .b = b,
                                         .weight = p.weight,
                                         .bias = p.bias,
                                         .rows = rows,
                                         .cols = cfg.hidden,
                                         .eps = cfg.eps});
}

void residual_norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                            const NormSaved& s, const float* resid, const float* d_out,
                            std::int64_t rows, const NormGrads& g, float* d_resid) {
  k::residual_layernorm_backward(lc.ctx, {.d_resid = d_resid,
                                          .d_weight = g.weight,
                                          .d_bias = g.bias,
                                          .d_out = d_out,
                                          .resid = resid,
                                          .weight = p.weight,
                                          .mean = s.mean,
                                          .rstd = s.rstd,
                                          .rows = rows,
                                          .cols = cfg.hidden,
                                          .scratch = lc.ws.norm_scratch});
}

}  // namespace trident::model::layers
