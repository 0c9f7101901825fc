// Causal multi-head self-attention core (after the QKV projection, before the output projection).
//
// Legend: B = batch, T = seq_len, NH = heads (local to this rank), HS = head_dim, C = NH * HS.
// QKV layout is Megatron's per-head interleaving: qkv(B, T, NH, 3, HS), i.e. for each head its q,
// k and v vectors sit next to each other, so a tensor-parallel rank's heads are one contiguous
// column block of the QKV projection. The output is out(B, T, NH, HS) = (B, T, C).
//
//   scores = q k^T / sqrt(HS), masked causally (key > query never attends) and, with document ids
//   (--reset-attention-mask), across documents (key c attends from query t only if doc[c] ==
//   doc[t]),
//   probs  = softmax(scores), out = probs v.
//
// Callers use the typed views (the Views structs at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

template <class T>
struct BasicAttentionForwardArgs {
  T* out = nullptr;        // (B, T, C)          written (=)
  T* probs = nullptr;      // (B, NH, T, T)      written (=), saved for backward; entries
                           //                    above the diagonal are written as 0
  const T* qkv = nullptr;  // (B, T, NH, 3, HS)
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  const std::int32_t* doc = nullptr;  // (B, T) document id of each token, or null: one document
};
using AttentionForwardArgs = BasicAttentionForwardArgs<float>;

// The backward needs no document ids: the masked probabilities are 0.
template <class T>
struct BasicAttentionBackwardArgs {
  T* d_qkv = nullptr;        // (B, T, NH, 3, HS)  written (=)
  T* d_probs = nullptr;      // (B, NH, T, T)      scratch, contents undefined after
  const T* d_out = nullptr;  // (B, T, C)
  const T* qkv = nullptr;    // (B, T, NH, 3, HS)
  const T* probs = nullptr;  // (B, NH, T, T)      from attention_forward
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
};
using AttentionBackwardArgs = BasicAttentionBackwardArgs<float>;

// attention_forward over typed views. B, T, NH and HS are read from qkv, a 4-D view whose last
// dimension holds each head's q, k and v (3 * HS).
struct AttentionViews {
  core::TensorView out{};    // (B, T, NH * HS)    f32, written (=)
  core::TensorView probs{};  // (B, NH, T, T)      f32, written (=), saved for the backward
  core::TensorView qkv{};    // (B, T, NH, 3 * HS) f32
  core::TensorView doc{};    // (B, T)             i32 document ids, or empty: one document
};
void attention(const core::ExecContext& ctx, const AttentionViews& v);

// attention_backward over typed views; sizes from qkv.
struct AttentionBackwardViews {
  core::TensorView d_qkv{};    // (B, T, NH, 3 * HS) f32, written (=)
  core::TensorView d_probs{};  // (B, NH, T, T)      f32, scratch
  core::TensorView d_out{};    // (B, T, NH * HS)    f32
  core::TensorView qkv{};      // (B, T, NH, 3 * HS) f32
  core::TensorView probs{};    // (B, NH, T, T)      f32, from the forward
};
void attention_backward(const core::ExecContext& ctx, const AttentionBackwardViews& v);

namespace ref {
// The specification (ref/attention_ref.cc), over the element type T (docs/architecture.md, "How to
// add an op").
template <class T = float>
void attention_forward(const BasicAttentionForwardArgs<T>& args);
template <class T = float>
void attention_backward(const BasicAttentionBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
