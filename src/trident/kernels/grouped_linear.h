// The grouped linear layer (Megatron-Core's GroupedMLP's grouped GEMM): G weights stacked as
// (G, out_features, in_features), and the rows of one buffer in G groups of uneven sizes; group g's
// rows go through weight g:
//   out[first_g + i] = in[first_g + i] @ weight[g]^T        for i < rows_g
// One op over every group, so that a mixture of experts' matmuls are one call whatever the
// routing: the experts' tokens are contiguous after the permutation (moe.h) and their counts are
// known on the host (Megatron's grouped_gemm takes them on the CPU too).
//
// Precision is a property of the views, as for linear (linear.h): FP32 weights run the FP32
// product, BF16 weights BF16 operands with FP32 accumulation and FP32 output. No bias (experts
// have none). The groups are host data: disjoint, in ascending order of first row, inside the
// buffers; rows outside every group are left as they are. A group of 0 rows is allowed (an expert
// no token chose): its weight's gradient is unchanged.
//
// How each backend runs it:
// - reference (ref/grouped_linear_ref.cc): the linear layer's reference per group, in double;
// - CPU FP32: one oneDNN sgemm per group (each threaded);
// - CPU BF16: each group's rows, rounded up to a multiple of 32, in blocks of 256, 128, 64 and 32
//   rows (largest first); the last block, partial by fewer than 32 rows, is copied into the
//   scratch with zero rows after it (a group of 250 rows is one block of 256). The oneDNN
//   primitives are then a fixed set per weight shape whatever the routing
//   (grouped_linear_bf16_scratch_bytes creates them all), so a warm step creates none and the
//   products stay large;
// - CUDA: one cuBLASLt product per group on the stream (no padding; the scratch is unused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// Rows [first, first + rows) of a grouped op's buffers.
struct RowGroup {
  std::int64_t first = 0, rows = 0;
};

// The largest and smallest row blocks of the CPU's BF16 body (see above).
inline constexpr std::int64_t kGroupedBf16MaxBlock = 256;
inline constexpr std::int64_t kGroupedBf16MinBlock = 32;

// The raw backend contract (T = float or core::bf16; the output and gradients are FP32):
//   out[g's rows]      (=)   in[g's rows] @ weight[g]^T
template <class T>
struct BasicGroupedLinearForwardArgs {
  float* out = nullptr;              // (R, out_features)
  const T* in = nullptr;             // (R, in_features)
  const T* weight = nullptr;         // (G, out_features, in_features)
  const RowGroup* groups = nullptr;  // (G), host
  std::int64_t num_groups = 0, in_features = 0, out_features = 0;
  std::span<std::byte> scratch{};  // BF16 on the CPU: grouped_linear_bf16_scratch_bytes
};
using GroupedLinearForwardArgs = BasicGroupedLinearForwardArgs<float>;
using GroupedLinearForwardBf16Args = BasicGroupedLinearForwardArgs<core::bf16>;

//   d_in[g's rows]     (=)   d_out[g's rows] @ weight[g]         (skipped when null)
//   d_weight[g]        (+=)  d_out[g's rows]^T @ in[g's rows]
// With BF16 weights d_out is the BF16 copy of the upstream gradient.
template <class T>
struct BasicGroupedLinearBackwardArgs {
  float* d_in = nullptr;             // (R, in_features), or null
  float* d_weight = nullptr;         // (G, out_features, in_features)
  const T* d_out = nullptr;          // (R, out_features)
  const T* in = nullptr;             // (R, in_features)
  const T* weight = nullptr;         // (G, out_features, in_features)
  const RowGroup* groups = nullptr;  // (G), host
  std::int64_t num_groups = 0, in_features = 0, out_features = 0;
  std::span<std::byte> scratch{};
};
using GroupedLinearBackwardArgs = BasicGroupedLinearBackwardArgs<float>;
using GroupedLinearBackwardBf16Args = BasicGroupedLinearBackwardArgs<core::bf16>;

// The typed views. R is in's first dimension, G the weight's; every view on ctx.device,
// contiguous; a mismatch (or a group outside the rows, overlapping or out of order, or a count of
// groups other than G) is a core::InvalidArgument naming it.
struct GroupedLinearViews {
  core::TensorView out{};              // (R, out_features) f32, the groups' rows written (=)
  core::TensorView in{};               // (R, in_features), the weight's dtype
  core::TensorView weight{};           // (G, out_features, in_features) f32 or bf16
  std::span<const RowGroup> groups{};  // (G), host
  std::span<std::byte> scratch{};      // BF16: grouped_linear_bf16_scratch_bytes bytes
};
void grouped_linear(const core::ExecContext& ctx, const GroupedLinearViews& v);

struct GroupedLinearBackwardViews {
  core::TensorView d_in{};             // (R, in_features) f32, the groups' rows (=), or empty
  core::TensorView d_weight{};         // (G, out_features, in_features) f32, accumulated (+=)
  core::TensorView d_out{};            // (R, out_features), the weight's dtype (BF16: the copy)
  core::TensorView in{};               // (R, in_features), the weight's dtype
  core::TensorView weight{};           // (G, out_features, in_features) f32 or bf16
  std::span<const RowGroup> groups{};  // (G), host
  std::span<std::byte> scratch{};
};
void grouped_linear_backward(const core::ExecContext& ctx, const GroupedLinearBackwardViews& v);

// Scratch bytes that serve grouped_linear and grouped_linear_backward with BF16 weights of these
// sizes at ctx.num_threads, any groups: oneDNN's workspace for every block size and the padded
// block's buffers. Creates (and caches) the blocks' primitives. 0 on CUDA.
[[nodiscard]] std::int64_t grouped_linear_bf16_scratch_bytes(const core::ExecContext& ctx,
                                                             std::int64_t in_features,
                                                             std::int64_t out_features);

namespace ref {
// The specification (ref/grouped_linear_ref.cc): ref::linear_forward / linear_backward (or their
// BF16 forms, operands widened exactly) on each group's rows and weight. The scratch is ignored.
template <class T = float>
void grouped_linear_forward(const BasicGroupedLinearForwardArgs<T>& args);
template <class T = float>
void grouped_linear_backward(const BasicGroupedLinearBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
