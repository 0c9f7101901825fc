#include "trident/model/layers/norm.h"

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

}  // namespace trident::model::layers
