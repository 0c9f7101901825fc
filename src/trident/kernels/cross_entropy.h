// Softmax cross-entropy over a padded vocabulary, fused with its gradient.
// Columns [vocab, vocab_padded) are padding: they never take probability mass (treated as -inf),
// get zero gradient, and a target there is a bug (InternalError). A negative target means
// "ignored" (loss 0, gradient 0).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

struct CrossEntropyArgs {
  float* losses = nullptr;                // (rows)   written (=): -log softmax(logits)[target]
  float* d_logits = nullptr;              // (rows, vocab_padded) written (=):
                                          //   d_scale * (softmax - onehot(target)); may alias
                                          //   logits; null = forward only
  const float* logits = nullptr;          // (rows, vocab_padded)
  const std::int32_t* targets = nullptr;  // (rows)
  float d_scale = 1.0f;                   // dL/dloss_row, e.g. 1 / (tokens in the global batch)
  std::int64_t rows = 0, vocab = 0, vocab_padded = 0;
};
void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyArgs& args);

}  // namespace trident::kernels
