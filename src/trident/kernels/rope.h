// Rotary position embeddings on a fused QKV, with grouped-query heads expanded.
//
// `in` is the QKV projection's output in Megatron's grouped layout: each row holds `groups` query
// groups, each [heads_per_group query heads | one key head | one value head] of head_dim values
// (multi-head attention is heads_per_group = 1: the (NH, 3, HS) layout of the attention kernels).
// `out` is that layout for every query head, (groups * heads_per_group, 3, head_dim): each query
// head with its group's key and value, the query and key rotated by the row's position:
//   for i < head_dim / 2, angle = pos * inv_freq[i]:
//     y[i]              = x[i] cos(angle) - x[i + head_dim/2] sin(angle)
//     y[i + head_dim/2] = x[i + head_dim/2] cos(angle) + x[i] sin(angle)
// (the "rotate half" form of GPT-NeoX, Llama and Megatron's default). Row r is token
// r % seq_len of its sample, at position position + r % seq_len, or positions[r] when given
// (--reset-position-ids). inv_freq null: no rotation (the expansion of grouped heads only).
//
// Callers use the typed views (RopeQkvViews, at the end): f32 activations, an f32 inv_freq and
// i32 positions on ctx.device, with the shapes given; a mismatch is a core::InvalidArgument naming
// the view. The raw-pointer Args structs are the backend contract the CPU body and the reference
// implement (no CUDA body yet: a CUDA context is a clear Unavailable error).
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct RopeQkvShape {
  std::int64_t rows = 0, seq_len = 0;
  std::int64_t position = 0;  // position of each sample's first row
  std::int64_t groups = 0, heads_per_group = 1, head_dim = 0;
  const float* inv_freq = nullptr;          // (head_dim / 2) or null
  const std::int32_t* positions = nullptr;  // (rows) position of each row, or null
  std::int64_t in_cols() const { return groups * (heads_per_group + 2) * head_dim; }
  std::int64_t out_cols() const { return groups * heads_per_group * 3 * head_dim; }
};

struct RopeQkvForwardArgs {
  float* out = nullptr;       // (rows, out_cols)  written (=)
  const float* in = nullptr;  // (rows, in_cols)
  RopeQkvShape shape;
};

// The transpose: d_in (=) rotates d_out's query and key back and sums each group's key and value
// gradients over its query heads.
struct RopeQkvBackwardArgs {
  float* d_in = nullptr;         // (rows, in_cols)   written (=)
  const float* d_out = nullptr;  // (rows, out_cols)
  RopeQkvShape shape;
};

// The head layout and positions of the views ops (rows come from the activation views).
struct RopeQkvGeometry {
  std::int64_t seq_len = 0;
  std::int64_t position = 0;  // position of each sample's first row
  std::int64_t groups = 0, heads_per_group = 1, head_dim = 0;
  std::int64_t in_cols() const { return groups * (heads_per_group + 2) * head_dim; }
  std::int64_t out_cols() const { return groups * heads_per_group * 3 * head_dim; }
};

// rope_qkv_forward over typed views.
struct RopeQkvViews {
  core::TensorView out{};        // (rows, out_cols) f32, written (=)
  core::TensorView in{};         // (rows, in_cols)  f32
  core::TensorView inv_freq{};   // (head_dim / 2)   f32, or empty: no rotation
  core::TensorView positions{};  // (rows)           i32, or empty: position + r % seq_len
  RopeQkvGeometry geometry;
};
void rope_qkv(const core::ExecContext& ctx, const RopeQkvViews& v);

// rope_qkv_backward over typed views.
struct RopeQkvBackwardViews {
  core::TensorView d_in{};       // (rows, in_cols)  f32, written (=)
  core::TensorView d_out{};      // (rows, out_cols) f32
  core::TensorView inv_freq{};   // (head_dim / 2)   f32, or empty
  core::TensorView positions{};  // (rows)           i32, or empty
  RopeQkvGeometry geometry;
};
void rope_qkv_backward(const core::ExecContext& ctx, const RopeQkvBackwardViews& v);

namespace ref {
// The specification (ref/rope_ref.cc): each head rotated in double, one thread.
void rope_qkv_forward(const RopeQkvForwardArgs& args);
void rope_qkv_backward(const RopeQkvBackwardArgs& args);
}  // namespace ref

}  // namespace trident::kernels
