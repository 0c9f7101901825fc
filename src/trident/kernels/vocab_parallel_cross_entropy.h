// Vocab-parallel softmax cross-entropy (Megatron's _VocabParallelCrossEntropy), as three local
// kernels with the tensor-parallel reductions between them, done by the caller:
//
//   vocab_parallel_ce_max         row_max      = max of this rank's real logit columns
//   -- all-reduce max over tp --
//   vocab_parallel_ce_sum_target  sum_exp      = sum_j exp(logit_j - row_max)  (this rank's part)
//                                 target_logit = the target's logit if this rank holds it, else 0
//   -- all-reduce sum over tp (sum_exp and target_logit, adjacent in one buffer) --
//   vocab_parallel_ce_loss        loss = log(sum_exp) + row_max - target_logit, and optionally
//                                 d_logits = d_scale * (softmax - onehot(target))
//
// This rank holds logit columns [vocab_start, vocab_start + vocab_local) of the padded vocabulary;
// columns at or beyond `vocab` (global) are padding: no probability mass, zero gradient. A
// negative target is ignored (loss 0, gradient 0). With one rank (vocab_start 0, vocab_local =
// padded vocabulary) the three kernels compute cross_entropy.h's result.
//
// sum_token_losses adds the per-token losses of the counted (non-negative target) tokens.
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct VocabParallelShard {
  std::int64_t vocab = 0;        // real vocabulary (global)
  std::int64_t vocab_start = 0;  // first global column held here
  std::int64_t vocab_local = 0;  // columns held here (row stride of the logits)
  // Real columns held here: clamp(vocab - vocab_start, 0, vocab_local).
  std::int64_t real() const {
    const std::int64_t r = vocab - vocab_start;
    return r < 0 ? 0 : (r > vocab_local ? vocab_local : r);
  }
};

struct VocabParallelCeMaxArgs {
  float* row_max = nullptr;       // (rows) written (=); -inf where the shard has no real column
  const float* logits = nullptr;  // (rows, vocab_local)
  std::int64_t rows = 0;
  VocabParallelShard shard;
};

struct VocabParallelCeSumArgs {
  float* sum_exp = nullptr;               // (rows) written (=), summed in double
  float* target_logit = nullptr;          // (rows) written (=)
  const float* logits = nullptr;          // (rows, vocab_local)
  const float* row_max = nullptr;         // (rows) the global max
  const std::int32_t* targets = nullptr;  // (rows) global token ids
  std::int64_t rows = 0;
  VocabParallelShard shard;
};

struct VocabParallelCeLossArgs {
  float* losses = nullptr;                // (rows) written (=)
  float* d_logits = nullptr;              // (rows, vocab_local) written (=), may alias logits;
                                          //   null = loss only
  const float* logits = nullptr;          // (rows, vocab_local)
  const float* row_max = nullptr;         // (rows) global
  const float* sum_exp = nullptr;         // (rows) global
  const float* target_logit = nullptr;    // (rows) global
  const std::int32_t* targets = nullptr;  // (rows); a target >= vocab is a bug (InternalError)
  float d_scale = 1.0f;                   // dL/dloss_row
  std::int64_t rows = 0;
  VocabParallelShard shard;
};

struct TokenLossSum {
  double sum = 0;          // sum of the counted tokens' losses, in row order, in double
  std::int64_t count = 0;  // tokens with a non-negative target
};

// The three steps and the sum over typed views. rows and the shard's vocab_local (the row stride)
// are read from the logits (rows, vocab_local); the shard's real vocabulary and first column are
// given beside them.
struct VocabParallelCeMaxViews {
  core::TensorView row_max{};  // (rows)              f32, written (=)
  core::TensorView logits{};   // (rows, vocab_local) f32
  std::int64_t vocab = 0, vocab_start = 0;
};
void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxViews& v);

struct VocabParallelCeSumViews {
  core::TensorView sum_exp{};       // (rows)              f32, written (=)
  core::TensorView target_logit{};  // (rows)              f32, written (=)
  core::TensorView logits{};        // (rows, vocab_local) f32
  core::TensorView row_max{};       // (rows)              f32, the global max
  core::TensorView targets{};       // (rows)              i32 global token ids
  std::int64_t vocab = 0, vocab_start = 0;
};
void vocab_parallel_ce_sum_target(const core::ExecContext& ctx, const VocabParallelCeSumViews& v);

struct VocabParallelCeLossViews {
  core::TensorView losses{};        // (rows)              f32, written (=)
  core::TensorView d_logits{};      // (rows, vocab_local) f32, written (=), or empty: loss only
  core::TensorView logits{};        // (rows, vocab_local) f32
  core::TensorView row_max{};       // (rows)              f32, global
  core::TensorView sum_exp{};       // (rows)              f32, global
  core::TensorView target_logit{};  // (rows)              f32, global
  core::TensorView targets{};       // (rows)              i32
  float d_scale = 1.0f;
  std::int64_t vocab = 0, vocab_start = 0;
};
void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossViews& v);

struct TokenLossViews {
  core::TensorView losses{};   // (rows) f32
  core::TensorView targets{};  // (rows) i32
};
TokenLossSum sum_token_losses(const core::ExecContext& ctx, const TokenLossViews& v);
// The same sum added to *acc, a TokenLossSum in ctx's device memory, without a host read: several
// micro-batches' losses stay on the device until one read (kernels/memory.h read_later). Bitwise
// the host's `acc.sum += sum_token_losses(...).sum` (each micro-batch summed, then added).
void accumulate_token_losses(const core::ExecContext& ctx, const TokenLossViews& v,
                             TokenLossSum* acc);

namespace ref {
// The specification, in double: the same three steps (the caller reduces between them).
void vocab_parallel_ce_max(const VocabParallelCeMaxArgs& args);
void vocab_parallel_ce_sum_target(const VocabParallelCeSumArgs& args);
void vocab_parallel_ce_loss(const VocabParallelCeLossArgs& args);
TokenLossSum sum_token_losses(const float* losses, const std::int32_t* targets, std::int64_t rows);
}  // namespace ref

}  // namespace trident::kernels
