// Matrix products through oneDNN (dnnl_sgemm: AVX-512 JIT sgemm, the fastest FP32 GEMM measured on
// our machines, see docs/benchmarks-matmul.md). Row-major throughout. ctx.num_threads (0 = OpenMP's
// default) sets the threads oneDNN uses for the call.
//
// Dimension legend: rows = tokens in the batch (B*T), in = in_features, out = out_features.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"

namespace trident::kernels {

enum class Trans : std::uint8_t { kNo, kYes };

// C(M,N) = alpha * op(A) @ op(B) + beta * C, row-major, op(X) = X or X^T.
// A is (M,K) (or (K,M) when trans_a), B is (K,N) (or (N,K) when trans_b). lda/ldb/ldc are the row
// strides as stored (>= the row length). beta == 0 overwrites C without reading it (BLAS rule), so
// C may hold garbage then; K == 0 gives C = beta * C.
struct GemmArgs {
  Trans trans_a = Trans::kNo;
  Trans trans_b = Trans::kNo;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  std::int64_t ldc = 0;
};
void gemm(const core::ExecContext& ctx, const GemmArgs& args);

// Linear layer in PyTorch's weight layout: out(rows,out) = in(rows,in) @ weight(out,in)^T + bias.
// Overwrites out. bias may be null.
struct LinearForwardArgs {
  float* out = nullptr;           // (rows, out_features)  written (=)
  const float* in = nullptr;      // (rows, in_features)
  const float* weight = nullptr;  // (out_features, in_features)
  const float* bias = nullptr;    // (out_features) or null
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};

// Backward of linear_forward.
//   d_in      (=)  d_out @ weight          (skipped when null)
//   d_weight  (+=) d_out^T @ in            (accumulates across micro-batches)
//   d_bias    (+=) column sums of d_out    (skipped when null; summed in double, independent of
//                                           the thread count)
struct LinearBackwardArgs {
  float* d_in = nullptr;          // (rows, in_features)  written (=), may be null
  float* d_weight = nullptr;      // (out_features, in_features)  accumulated (+=)
  float* d_bias = nullptr;        // (out_features)  accumulated (+=), may be null
  const float* d_out = nullptr;   // (rows, out_features)
  const float* in = nullptr;      // (rows, in_features)
  const float* weight = nullptr;  // (out_features, in_features)
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};

}  // namespace trident::kernels
