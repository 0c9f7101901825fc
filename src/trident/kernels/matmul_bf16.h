// BF16 matrix products for mixed precision ("autocast"): BF16 operands supplied by the caller, FP32
// accumulation, FP32 output. Runs oneDNN's matmul primitive (avx512_core_bf16 / AMX where the CPU
// has them); transposed operands are described by strides, never copied. On a CPU without a native
// BF16 matmul (AVX2 only, where oneDNN has none or only a reference loop) the operands are widened
// to FP32 tile by tile in the scratch and multiplied by sgemm: bf16 x bf16 products are exact in
// FP32, so the arithmetic is the same FP32 accumulation in another order. Row-major throughout.
//
// Dimension legend: rows = tokens in the batch (B*T), in = in_features, out = out_features.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/matmul.h"

namespace trident::kernels {

// C(M,N) = op(A) @ op(B) + bias + beta * C, row-major, op(X) = X or X^T, A and B in bf16, the
// products summed in FP32 (the sums may be blocked in any order, so results can differ from a
// sequential FP32 sum by FP32 rounding). A is (M,K) (or (K,M) when trans_a), B is (K,N) (or (N,K)
// when trans_b); lda/ldb/ldc are the row strides as stored (>= the row length). bias (N) is added
// to every row when non-null. beta == 0 overwrites C without reading it (C may hold garbage);
// beta != 0 accumulates (beta == 1 is `+=`). K == 0 gives C = beta * C + bias.
//
// scratch: oneDNN's working memory, at least gemm_bf16_scratch_bytes(ctx, args) bytes (for the
// same shapes, strides, beta, bias-or-not and ctx.num_threads); the kernel never allocates. Calls
// on different threads need different scratch. C must not overlap A, B, bias or scratch.
//
// The oneDNN primitive for each (shape, strides, transpositions, beta, bias-or-not, threads) is
// created on first use and kept in a small process-wide cache (thread-safe), so later calls with
// the same configuration cost only the product itself.
struct GemmBf16Args {
  Trans trans_a = Trans::kNo;
  Trans trans_b = Trans::kNo;
  std::int64_t m = 0, n = 0, k = 0;
  const core::bf16* a = nullptr;
  std::int64_t lda = 0;
  const core::bf16* b = nullptr;
  std::int64_t ldb = 0;
  const float* bias = nullptr;  // (n) or null
  float beta = 0.0f;
  float* c = nullptr;
  std::int64_t ldc = 0;
  std::span<std::byte> scratch{};
};
void gemm_bf16(const core::ExecContext& ctx, const GemmBf16Args& args);

// Scratch bytes gemm_bf16 needs for args (only the sizes, strides, transpositions, beta, whether
// bias is null and ctx.num_threads are read; the pointers may be null). Creates and caches the
// primitive. 0 when the product is empty.
[[nodiscard]] std::int64_t gemm_bf16_scratch_bytes(const core::ExecContext& ctx,
                                                   const GemmBf16Args& args);

// The oneDNN implementation gemm_bf16 runs for args, e.g. "brg:avx512_core_bf16" (for benchmarks
// and tests; an implementation starting with "ref" is a slow reference loop).
[[nodiscard]] std::string gemm_bf16_implementation(const core::ExecContext& ctx,
                                                   const GemmBf16Args& args);

// oneDNN primitives gemm_bf16 has created in this process: one per configuration on first sight,
// and again after the cache was full and emptied. A warm training step creates none (oneDNN
// allocates when it creates a primitive); tests/model/warm_step_test.cc checks it.
[[nodiscard]] std::int64_t gemm_bf16_primitives_created();

// Linear layer in PyTorch's weight layout with bf16 operands:
//   out(rows,out) = in(rows,in) @ weight(out,in)^T + bias,   FP32, overwritten (=).
// bias (FP32) may be null. scratch: at least linear_bf16_scratch_bytes(ctx, rows, in, out) bytes.
struct LinearForwardBf16Args {
  float* out = nullptr;                // (rows, out_features)  f32, written (=)
  const core::bf16* in = nullptr;      // (rows, in_features)
  const core::bf16* weight = nullptr;  // (out_features, in_features)
  const float* bias = nullptr;         // (out_features) f32, or null
  std::int64_t rows = 0, in_features = 0, out_features = 0;
  std::span<std::byte> scratch{};
};

// Backward of linear_forward_bf16. The caller supplies the upstream gradient twice: in bf16 for the
// products and in FP32 for the bias gradient (whose column sums need no bf16 rounding).
//   d_in      (=)  d_out_bf16 @ weight          f32 (skipped when null)
//   d_weight  (+=) d_out_bf16^T @ in            f32 (accumulates across micro-batches)
//   d_bias    (+=) column sums of d_out (f32)   (skipped when null; summed in double, independent
//                                                of the thread count)
// d_out may be null when d_bias is. scratch: as for linear_forward_bf16.
struct LinearBackwardBf16Args {
  float* d_in = nullptr;                   // (rows, in_features)  f32, written (=), may be null
  float* d_weight = nullptr;               // (out_features, in_features)  f32, accumulated (+=)
  float* d_bias = nullptr;                 // (out_features)  f32, accumulated (+=), may be null
  const float* d_out = nullptr;            // (rows, out_features)  f32, read only for d_bias
  const core::bf16* d_out_bf16 = nullptr;  // (rows, out_features)
  const core::bf16* in = nullptr;          // (rows, in_features)
  const core::bf16* weight = nullptr;      // (out_features, in_features)
  std::int64_t rows = 0, in_features = 0, out_features = 0;
  std::span<std::byte> scratch{};
};

// Scratch bytes that serve linear_forward_bf16 (with or without bias) and linear_backward_bf16 for
// these sizes and ctx.num_threads: the largest of the three products' needs.
[[nodiscard]] std::int64_t linear_bf16_scratch_bytes(const core::ExecContext& ctx,
                                                     std::int64_t rows, std::int64_t in_features,
                                                     std::int64_t out_features);

namespace ref {
// The specification (ref/matmul_bf16_ref.cc): the bf16 operands widened to FP32 (exact), then
// ref::linear_forward / ref::linear_backward (double sums). d_bias uses the FP32 d_out. The
// scratch fields are ignored.
void linear_forward_bf16(const LinearForwardBf16Args& args);
void linear_backward_bf16(const LinearBackwardBf16Args& args);
}  // namespace ref

}  // namespace trident::kernels
