#include "trident/model/layers/mlp.h"

#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/swiglu.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void declare_mlp(const MlpConfig& cfg, const WeightScope& s, MlpParams* p, MlpGrads* g) {
  const std::int64_t C = cfg.hidden, F = cfg.ffn;
  const bool swiglu = cfg.activation == Activation::kSwiGlu;
  // Column-parallel; SwiGLU's (gate, up) x F x C splits F.
  s({.name = "dense_h_to_4h.weight",
     .shape = swiglu ? std::vector<std::int64_t>{2, F, C} : std::vector<std::int64_t>{F, C},
     .tp_split = swiglu ? 1 : 0},
    slot(field(p, &MlpParams::fc_w), field(g, &MlpGrads::fc_w)));
  if (cfg.bias) {
    s({.name = "dense_h_to_4h.bias",
       .shape = swiglu ? std::vector<std::int64_t>{2, F} : std::vector<std::int64_t>{F},
       .tp_split = swiglu ? 1 : 0,
       .init = InitRule::kZeros,
       .weight_decay = false},
      slot(field(p, &MlpParams::fc_b), field(g, &MlpGrads::fc_b)));
  }
  // Row-parallel; its bias is added once, after the reduction.
  s({.name = "dense_4h_to_h.weight",
     .shape = {C, F},
     .tp_split = 1,
     .init = InitRule::kScaledNormal},
    slot(field(p, &MlpParams::fc2_w), field(g, &MlpGrads::fc2_w)));
  if (cfg.bias) {
    s({.name = "dense_4h_to_h.bias", .shape = {C}, .init = InitRule::kZeros, .weight_decay = false},
      slot(field(p, &MlpParams::fc2_b), field(g, &MlpGrads::fc2_b)));
  }
}

void mlp_forward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p,
                 const MlpForwardArgs& args) {
  const MlpSaved& s = args.saved;
  const std::int64_t BT = lc.rows(), C = cfg.hidden, F = cfg.ffn / lc.region.group().size();
  const float* x = lc.region.enter(args.in, lc.ws.gathered);  // f (SP: all-gather)
  if (cfg.activation == Activation::kSwiGlu) {
    linear(lc, {.out = s.fc,
                .in = x,
                .in_bf16 = lc.region.sp() ? nullptr : args.in_bf16,
                .weight = p.fc_w,
                .bias = p.fc_b,
                .rows = BT,
                .in_features = C,
                .out_features = 2 * F});
    k::swiglu(lc.ctx, {.out = view_of(lc, s.gelu, {BT, F}), .in = view_of(lc, s.fc, {BT, 2 * F})});
    float* partial = lc.region.partial_of(args.out, lc.ws.gathered);
    linear(lc, {.out = partial,
                .in = s.gelu,
                .weight = p.fc2_w,
                .bias = lc.tp_rank() == 0 ? p.fc2_b : nullptr,
                .rows = BT,
                .in_features = F,
                .out_features = C});
    return lc.region.leave(partial, args.out);  // g (SP: reduce-scatter)
  }
  // The up-projection without its bias: the fused bias-GeLU adds it.
  linear(lc, {.out = s.fc,
              .in = x,
              .in_bf16 = lc.region.sp() ? nullptr : args.in_bf16,
              .weight = p.fc_w,
              .bias = nullptr,
              .rows = BT,
              .in_features = C,
              .out_features = F});
  // Under --bf16 the fused kernel also writes the BF16 copy the down-projection reads.
  core::bf16* gelu16 = p.fc2_w.bf16 ? lc.ws.bf16_in : nullptr;
  k::bias_gelu(lc.ctx, {.out = view_of(lc, s.gelu, {BT, F}),
                        .out_bf16 = view_of(lc, gelu16, {BT, F}),
                        .in = view_of(lc, s.fc, {BT, F}),
                        .bias = view_of(lc, p.fc_b, {F})});
  float* partial = lc.region.partial_of(args.out, lc.ws.gathered);
  linear(lc, {.out = partial,
              .in = s.gelu,
              .in_bf16 = gelu16,
              .weight = p.fc2_w,
              .bias = lc.tp_rank() == 0 ? p.fc2_b : nullptr,  // once, before the reduction
              .rows = BT,
              .in_features = F,
              .out_features = C});
  lc.region.leave(partial, args.out);  // g (SP: reduce-scatter)
}

const float* mlp_backward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p,
                          const MlpBackwardArgs& args) {
  const MlpSaved& s = args.saved;
  const MlpGrads& g = args.grads;
  const std::int64_t BT = lc.rows(), C = cfg.hidden, F = cfg.ffn / lc.region.group().size();
  const Workspace& ws = lc.ws;
  const float* d = lc.region.leave_backward(args.d_out, ws.d_full);  // g backward (SP: all-gather)
  if (cfg.activation == Activation::kSwiGlu) {
    linear_backward(lc, {.d_in = ws.d_act,
                         .d_weight = g.fc2_w,
                         .d_bias = g.fc2_b,
                         .d_out = d,
                         .in = s.gelu,
                         .weight = p.fc2_w,
                         .rows = BT,
                         .in_features = F,
                         .out_features = C});
    k::swiglu_backward(lc.ctx, {.d_in = view_of(lc, ws.d_fc, {BT, 2 * F}),
                                .d_out = view_of(lc, ws.d_act, {BT, F}),
                                .in = view_of(lc, s.fc, {BT, 2 * F})});
    const float* x = lc.region.enter(args.in, ws.gathered);  // the input again (SP: gathered)
    linear_backward(lc, {.d_in = ws.d_ln,
                         .d_weight = g.fc_w,
                         .d_bias = g.fc_b,
                         .d_out = ws.d_fc,
                         .in = x,
                         .weight = p.fc_w,
                         .rows = BT,
                         .in_features = C,
                         .out_features = 2 * F});
    return lc.region.enter_backward(ws.d_ln);  // f backward (SP: reduce-scatter)
  }
  linear_backward(lc, {.d_in = ws.d_fc,
                       .d_weight = g.fc2_w,
                       .d_bias = g.fc2_b,
                       .d_out = d,
                       .in = s.gelu,
                       .weight = p.fc2_w,
                       .rows = BT,
                       .in_features = F,
                       .out_features = C});
  k::bias_gelu_backward(lc.ctx, {.d_in = view_of(lc, ws.d_fc, {BT, F}),
                                 .d_bias = view_of(lc, g.fc_b, {F}),
                                 .d_out = view_of(lc, ws.d_fc, {BT, F}),
                                 .in = view_of(lc, s.fc, {BT, F}),
                                 .bias = view_of(lc, p.fc_b, {F}),
                                 .scratch = ws.fused_scratch});
  const float* x = lc.region.enter(args.in, ws.gathered);  // the input again (SP: gathered again)
  linear_backward(lc, {.d_in = ws.d_ln,
                       .d_weight = g.fc_w,
                       .d_bias = nullptr,  // summed by bias_gelu_backward
                       .d_out = ws.d_fc,
                       .in = x,
                       .weight = p.fc_w,
                       .rows = BT,
                       .in_features = C,
                       .out_features = F});
  return lc.region.enter_backward(ws.d_ln);  // f backward (SP: reduce-scatter)
}

}  // namespace trident::model::layers
