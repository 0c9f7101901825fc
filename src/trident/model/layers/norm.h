// Normalization layer over the hidden dimension of the residual stream (local rows): LayerNorm
// (GPT-2, BLOOM); room for RMSNorm (a NormKind and its kernel; the Saved struct keeps rstd).
#pragma once

#include "trident/model/layers/layer.h"

namespace trident::model::layers {

enum class NormKind : std::uint8_t { kLayerNorm };

struct NormConfig {
  NormKind kind = NormKind::kLayerNorm;
  std::int64_t hidden = 0;
  float eps = 1e-5f;
};
struct NormParams {
  const float* weight = nullptr;  // (C)
  const float* bias = nullptr;    // (C)
};
struct NormGrads {
  float* weight = nullptr;  // (C) +=
  float* bias = nullptr;    // (C) +=
};
struct NormSaved {
  float* out = nullptr;   // (rows, C)
  float* mean = nullptr;  // (rows)
  float* rstd = nullptr;  // (rows)
};

// s.out = norm(in) over `rows` rows.
void norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                  const float* in, std::int64_t rows, const NormSaved& s);
// d_in += the input gradient (the residual stream's gradient accumulates here); grads +=.
void norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                   const NormSaved& s, const float* in, const float* d_out, std::int64_t rows,
                   const NormGrads& g, float* d_in);

// The residual add of a pre-norm block fused into the norm after it (one pass over each row):
// resid = a + b (written; may alias a or b), s.out = norm(resid), and under --bf16 out_bf16 (or
// null) gets the BF16 copy of s.out for the next BF16 matmul.
void residual_norm_forward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                           float* resid, const float* a, const float* b, std::int64_t rows,
                           const NormSaved& s, core::bf16* out_bf16);
// norm_backward on the fused add's output (one pass): d_resid += the input gradient; the same
// gradient reaches a and b.
void residual_norm_backward(const LayerContext& lc, const NormConfig& cfg, const NormParams& p,
                            const NormSaved& s, const float* resid, const float* d_out,
                            std::int64_t rows, const NormGrads& g, float* d_resid);

}  // namespace trident::model::layers
