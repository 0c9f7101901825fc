// Softmax cross-entropy over a padded vocabulary, fused with its gradient.
// Columns [vocab, vocab_padded) are padding: they never take probability mass (treated as -inf),
// get zero gradient, and a target there is a bug (InternalError). A negative target means
// "ignored" (loss 0, gradient 0).
//
// Callers use the typed views (the Views struct at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

template <class T>
struct BasicCrossEntropyArgs {
  T* losses = nullptr;                    // (rows)   written (=): -log softmax(logits)[target]
  T* d_logits = nullptr;                  // (rows, vocab_padded) written (=):
                                          //   d_scale * (softmax - onehot(target)); may alias
                                          //   logits; null = forward only
  const T* logits = nullptr;              // (rows, vocab_padded)
  const std::int32_t* targets = nullptr;  // (rows)
  T d_scale = T(1);                       // dL/dloss_row, e.g. 1 / (tokens in the global batch)
  std::int64_t rows = 0, vocab = 0, vocab_padded = 0;
};
using CrossEntropyArgs = BasicCrossEntropyArgs<float>;

// cross_entropy_forward_backward over typed views; rows and vocab_padded from the logits.
struct CrossEntropyViews {
  core::TensorView losses{};    // (rows)               f32, written (=)
  core::TensorView d_logits{};  // (rows, vocab_padded) f32, written (=), may be `logits`; or empty
  core::TensorView logits{};    // (rows, vocab_padded) f32
  core::TensorView targets{};   // (rows)               i32
  float d_scale = 1.0f;
  std::int64_t vocab = 0;  // real columns; the rest of each row is padding
};
void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyViews& v);

namespace ref {
// The specification (ref/cross_entropy_ref.cc), over the element type T (docs/architecture.md, "How
// to add an op"). A negative target is ignored (loss 0, gradient row 0); one >= vocab throws
// core::InternalError, as the bodies do.
template <class T = float>
void cross_entropy_forward_backward(const BasicCrossEntropyArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
