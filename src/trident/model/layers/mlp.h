// The MLP, tensor-parallel as Megatron's: column-parallel up-projection (C -> F/tp), activation,
// row-parallel down-projection (F/tp -> C), with the same conjugates as attention.h.
//
// Variants (MlpConfig): the tanh GeLU with the up-projection's bias fused into it (Megatron's
// bias_gelu); room for gated activations (SwiGLU: a second up-projection multiplied in).
#pragma once

#include "trident/model/layers/layer.h"

namespace trident::model::layers {

enum class Activation : std::uint8_t { kGelu };

struct MlpConfig {
  Activation activation = Activation::kGelu;
  std::int64_t hidden = 0;  // C
  std::int64_t ffn = 0;     // F of the whole model; this rank holds F/tp
};
struct MlpParams {
  Weight fc_w;                   // (F/tp, C)
  const float* fc_b = nullptr;   // (F/tp)
  Weight fc2_w;                  // (C, F/tp)
  const float* fc2_b = nullptr;  // (C), added once (tp rank 0) before the reduction
};
struct MlpGrads {
  float *fc_w = nullptr, *fc_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;
};
struct MlpSaved {
  float* fc = nullptr;    // (B*T, F/tp) the up-projection before its bias (bias-GeLU's input)
  float* gelu = nullptr;  // (B*T, F/tp)
};

// out (local rows, C) = mlp(in), `in` the normalized residual stream (local rows). in_bf16: its
// BF16 copy when the producer wrote one (BF16 weights, no sequence parallelism), or null.
void mlp_forward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p, const float* in,
                 const MlpSaved& s, float* out, const core::bf16* in_bf16 = nullptr);
// Returns the gradient of `in` (local rows, in a workspace buffer); grads +=.
const float* mlp_backward(const LayerContext& lc, const MlpConfig& cfg, const MlpParams& p,
                          const MlpSaved& s, const float* in, const float* d_out,
                          const MlpGrads& g);

}  // namespace trident::model::layers
