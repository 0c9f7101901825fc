// The MLP, tensor-parallel as Megatron's: column-parallel up-projection (C -> F/tp), activation,
// row-parallel down-projection (F/tp -> C), with the same conjugates as attention.h.
//
// Variants (MlpConfig): the tanh GeLU with the up-projection's bias fused into it (Megatron's
// bias_gelu), or SwiGLU (Llama: the up-projection has gate and up halves, silu(gate) * up; its
// optional bias is added by the projection). Biases are optional with SwiGLU.
#pragma once

#include "trident/model/layers/layer.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

enum class Activation : std::uint8_t { kGelu, kSwiGlu };

struct MlpConfig {
  Activation activation = Activation::kGelu;
  std::int64_t hidden = 0;  // C
  std::int64_t ffn = 0;     // F of the whole model; this rank holds F/tp
  bool bias = true;         // the projections' biases (--disable-bias-linear: none)
};
struct MlpParams {
  Weight fc_w;                   // (F/tp, C); SwiGLU: (2, F/tp, C)
  const float* fc_b = nullptr;   // (F/tp); SwiGLU: (2, F/tp) or null
  Weight fc2_w;                  // (C, F/tp)
  const float* fc2_b = nullptr;  // (C), added once (tp rank 0) before the reduction
};
struct MlpGrads {
  float *fc_w = nullptr, *fc_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;
};
// "dense_h_to_4h.weight" (F, C) column-parallel (SwiGLU: (2, F, C) split along F, each rank's
// gate block then its up block), "dense_4h_to_h.weight" (C, F) row-parallel, and their biases.
void declare_mlp(const MlpConfig& cfg, const WeightScope& s, MlpParams* p, MlpGrads* g);
struct MlpSaved {
  float* fc = nullptr;    // (B*T, F/tp) the up-projection before its bias (bias-GeLU's input);
                          // SwiGLU: (B*T, 2F/tp) [gate | up], bias included
  float* gelu = nullptr;  // (B*T, F/tp) the activation's output
};

// out (local rows, C) = mlp(in), `in` the normalized residual stream (local rows).
struct MlpForwardArgs {
  float* out = nullptr;       // (local rows, C) written
  const float* in = nullptr;  // (local rows, C)
  // in's BF16 copy when its producer wrote one (BF16 weights; ignored with SP), or null.
  const core::bf16* in_bf16 = nullptr;
  MlpSaved saved;
};
void mlp_forward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p,
                 const MlpForwardArgs& args);
// Returns the gradient of `in` (local rows, in a workspace buffer); grads +=.
struct MlpBackwardArgs {
  const float* d_out = nullptr;  // (local rows, C) the gradient of out
  const float* in = nullptr;     // the forward's input
  MlpSaved saved;
  MlpGrads grads;
};
const float* mlp_backward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p,
                          const MlpBackwardArgs& args);

}  // namespace trident::model::layers
