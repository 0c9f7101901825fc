#include "trident/model/layers/layer.h"

#include "trident/kernels/bf16.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::model::layers {

namespace k = trident::kernels;

std::uint64_t drop_stream(std::int64_t iteration, std::int64_t layer, DropSite site) {
  return (static_cast<std::uint64_t>(iteration) << 24) ^
         (static_cast<std::uint64_t>(layer + 1) << 4) ^ static_cast<std::uint64_t>(site);
}

// The one place a precision is picked: by the weight view. When kernels take typed views this
// becomes a single kernels::linear call.
void linear(const LayerContext& lc, const LinearArgs& a) {
  if (a.weight.bf16 == nullptr) {
    return k::linear_forward(lc.ctx, {.out = a.out,
                                      .in = a.in,
                                      .weight = a.weight.f32,
                                      .bias = a.bias,
                                      .rows = a.rows,
                                      .in_features = a.in_features,
                                      .out_features = a.out_features});
  }
  const core::bf16* in16 = a.in_bf16;
  if (in16 == nullptr) {
    k::convert_f32_to_bf16(lc.ctx, lc.ws.bf16_in, a.in, a.rows * a.in_features);
    in16 = lc.ws.bf16_in;
  }
  k::linear_forward_bf16(lc.ctx, {.out = a.out,
                                  .in = in16,
                                  .weight = a.weight.bf16,
                                  .bias = a.bias,
                                  .rows = a.rows,
                                  .in_features = a.in_features,
                                  .out_features = a.out_features,
                                  .scratch = lc.ws.gemm_scratch});
}

void linear_backward(const LayerContext& lc, const LinearBackwardArgs& a) {
  if (a.weight.bf16 == nullptr) {
    return k::linear_backward(lc.ctx, {.d_in = a.d_in,
                                       .d_weight = a.d_weight,
                                       .d_bias = a.d_bias,
                                       .d_out = a.d_out,
                                       .in = a.in,
                                       .weight = a.weight.f32,
                                       .rows = a.rows,
                                       .in_features = a.in_features,
                                       .out_features = a.out_features});
  }
  k::convert_f32_to_bf16(lc.ctx, lc.ws.bf16_in, a.in, a.rows * a.in_features);
  k::convert_f32_to_bf16(lc.ctx, lc.ws.bf16_dout, a.d_out, a.rows * a.out_features);
  k::linear_backward_bf16(lc.ctx, {.d_in = a.d_in,
                                   .d_weight = a.d_weight,
                                   .d_bias = a.d_bias,
                                   .d_out = a.d_out,
                                   .d_out_bf16 = lc.ws.bf16_dout,
                                   .in = lc.ws.bf16_in,
                                   .weight = a.weight.bf16,
                                   .rows = a.rows,
                                   .in_features = a.in_features,
                                   .out_features = a.out_features,
                                   .scratch = lc.ws.gemm_scratch});
}

namespace {
k::HiddenDropoutArgs dropout_args(const LayerContext& lc, float* out, const float* in,
                                  std::int64_t cols, std::int64_t layer, DropSite site) {
  return {.out = out,
          .in = in,
          .rows = lc.local_rows(),
          .cols = cols,
          .first_row = lc.dropout.first_sample * lc.seq_len + lc.region.first_row(),
          .p = lc.dropout.hidden_p,
          .seed = lc.dropout.seed,
          .stream = drop_stream(lc.dropout.iteration, layer, site)};
}
}  // namespace

void dropout_forward(const LayerContext& lc, float* x, std::int64_t cols, std::int64_t layer,
                     DropSite site) {
  if (lc.dropout.hidden_p <= 0.0f) return;
  k::hidden_dropout(lc.ctx, dropout_args(lc, x, x, cols, layer, site));
}

const float* dropout_backward(const LayerContext& lc, const float* d, std::int64_t cols,
                              std::int64_t layer, DropSite site) {
  if (lc.dropout.hidden_p <= 0.0f) return d;
  k::hidden_dropout(lc.ctx, dropout_args(lc, lc.ws.d_drop, d, cols, layer, site));
  return lc.ws.d_drop;
}

}  // namespace trident::model::layers
