// Token + learned absolute position embedding: out[b,t] = wte[tokens[b,t]] + wpe[t].
// For a vocab-parallel word embedding (tensor parallelism), a rank holds rows
// [vocab_start, vocab_start + vocab_local) of wte; tokens outside contribute 0 and the caller
// all-reduces. wpe may be null (ALiBi models have no position embedding).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

struct EmbeddingForwardArgs {
  float* out = nullptr;                  // (B*T, C)         written (=)
  const std::int32_t* tokens = nullptr;  // (B*T)
  const float* wte = nullptr;            // (vocab_local, C)
  const float* wpe = nullptr;            // (max_positions, C) or null
  std::int64_t batch = 0, seq_len = 0, hidden = 0;
  std::int64_t vocab_start = 0, vocab_local = 0;
  std::int64_t position_offset = 0;  // first position id (generation with a KV cache)
  // (B*T) position id of each row (--reset-position-ids: restarting after each end of document),
  // or null: position_offset + t.
  const std::int32_t* positions = nullptr;
};
void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args);

// Positions are 0..T-1 (training uses no position offset). Token rows are scatter-added in a fixed
// order: the result does not depend on the thread count. Negative token ids are rejected
// (InvalidArgument) by both passes.
struct EmbeddingBackwardArgs {
  float* d_wte = nullptr;                // (vocab_local, C)    accumulated (+=)
  float* d_wpe = nullptr;                // (max_positions, C)  accumulated (+=), may be null
  const float* d_out = nullptr;          // (B*T, C)
  const std::int32_t* tokens = nullptr;  // (B*T)
  std::int64_t batch = 0, seq_len = 0, hidden = 0;
  std::int64_t vocab_start = 0, vocab_local = 0;
  const std::int32_t* positions = nullptr;  // (B*T) as in the forward, or null: t
};
void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args);

}  // namespace trident::kernels
