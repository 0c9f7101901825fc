// Token + learned absolute position embedding: out[b,t] = wte[tokens[b,t]] + wpe[t].
// For a vocab-parallel word embedding (tensor parallelism), a rank holds rows
// [vocab_start, vocab_start + vocab_local) of wte; tokens outside contribute 0 and the caller
// all-reduces. wpe may be null (ALiBi models have no position embedding).
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

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

// embedding_forward over typed views. B and T are read from tokens, vocab_local and C from wte.
// Without per-row positions the position rows position_offset .. position_offset + T - 1 of wpe
// are read, and wpe must hold them.
struct EmbeddingViews {
  core::TensorView out{};        // (B, T, C)        f32, written (=)
  core::TensorView tokens{};     // (B, T)           i32
  core::TensorView wte{};        // (vocab_local, C) f32: rows vocab_start.. of the word table
  core::TensorView wpe{};        // (positions, C)   f32, or empty: no position embedding
  core::TensorView positions{};  // (B, T)           i32 position ids, or empty: offset + t
  std::int64_t vocab_start = 0;
  std::int64_t position_offset = 0;
};
void embedding(const core::ExecContext& ctx, const EmbeddingViews& v);

// embedding_backward over typed views (d_wte, d_wpe accumulate +=); sizes as the forward's.
struct EmbeddingBackwardViews {
  core::TensorView d_wte{};      // (vocab_local, C) f32, accumulated (+=)
  core::TensorView d_wpe{};      // (positions, C)   f32, accumulated (+=), or empty
  core::TensorView d_out{};      // (B, T, C)        f32
  core::TensorView tokens{};     // (B, T)           i32
  core::TensorView positions{};  // (B, T)           i32 as in the forward, or empty: t
  std::int64_t vocab_start = 0;
};
void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardViews& v);

namespace ref {
// The specification (ref/embedding_ref.cc): plain loops, one thread.
void embedding_forward(const EmbeddingForwardArgs& args);
void embedding_backward(const EmbeddingBackwardArgs& args);
}  // namespace ref

}  // namespace trident::kernels
