// Normalization layer over the hidden dimension of the residual stream (local rows): LayerNorm
// (GPT-2, BLOOM) or RMSNorm (Llama: no bias, Saved keeps rstd only).
#pragma once

#include "trident/model/layers/layer.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

enum class NormKind : std::uint8_t { kLayerNorm, kRmsNorm };

struct NormConfig {
  NormKind kind = NormKind::kLayerNorm;
  std::int64_t hidden = 0;
  float eps = 1e-5f;
};
struct NormParams {
  const float* weight = nullptr;  // (C)
  const float* bias = nullptr;    // (C), null with RMSNorm
};
struct NormGrads {
  float* weight = nullptr;  // (C) +=
  float* bias = nullptr;    // (C) +=, null with RMSNorm
};
// "weight" (ones) and, for LayerNorm, "bias" (zeros), both (C), no weight decay.
void declare_norm(const NormConfig& cfg, const WeightScope& s, NormParams* p, NormGrads* g);
struct NormSaved {
  float* out = nullptr;   // (rows, C)
  float* mean = nullptr;  // (rows), LayerNorm only
  float* rstd = nullptr;  // (rows)
};

// saved.out = norm(in) over `rows` rows.
struct NormForwardArgs {
  const float* in = nullptr;  // (rows, C)
  std::int64_t rows = 0;
  NormSaved saved;
};
void norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                  const NormForwardArgs& args);
// d_in += the input gradient (the residual stream's gradient accumulates here); grads +=.
struct NormBackwardArgs {
  float* d_in = nullptr;         // (rows, C) +=
  const float* d_out = nullptr;  // (rows, C)
  const float* in = nullptr;     // the forward's input
  std::int64_t rows = 0;
  NormSaved saved;
  NormGrads grads;
};
void norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                   const NormBackwardArgs& args);

// The residual add of a pre-norm block fused into the norm after it (one pass over each row):
// resid = a + b (written; may alias a or b), saved.out = norm(resid), and under --bf16 out_bf16
// (or null) gets the BF16 copy of saved.out for the next BF16 matmul.
struct ResidualNormForwardArgs {
  float* resid = nullptr;  // (rows, C) written
  const float* a = nullptr;
  const float* b = nullptr;
  std::int64_t rows = 0;
  NormSaved saved;
  core::bf16* out_bf16 = nullptr;
};
void residual_norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                           const ResidualNormForwardArgs& args);
// norm_backward on the fused add's output (one pass): d_resid += the input gradient; the same
// gradient reaches a and b.
struct ResidualNormBackwardArgs {
  float* d_resid = nullptr;      // (rows, C) +=
  const float* d_out = nullptr;  // (rows, C)
  const float* resid = nullptr;  // the forward's resid
  std::int64_t rows = 0;
  NormSaved saved;
  NormGrads grads;
};
void residual_norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                            const ResidualNormBackwardArgs& args);

}  // namespace trident::model::layers
