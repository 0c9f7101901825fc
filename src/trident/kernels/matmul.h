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
template <class T>
struct BasicLinearForwardArgs {
  T* out = nullptr;           // (rows, out_features)  written (=)
  const T* in = nullptr;      // (rows, in_features)
  const T* weight = nullptr;  // (out_features, in_features)
  const T* bias = nullptr;    // (out_features) or null
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
using LinearForwardArgs = BasicLinearForwardArgs<float>;

// Backward of linear_forward.
//   d_in      (=)  d_out @ weight          (skipped when null)
//   d_weight  (+=) d_out^T @ in            (accumulates across micro-batches)
//   d_bias    (+=) column sums of d_out    (skipped when null; summed in double, independent of
//                                           the thread count)
template <class T>
struct BasicLinearBackwardArgs {
  T* d_in = nullptr;          // (rows, in_features)  written (=), may be null
  T* d_weight = nullptr;      // (out_features, in_features)  accumulated (+=)
  T* d_bias = nullptr;        // (out_features)  accumulated (+=), may be null
  const T* d_out = nullptr;   // (rows, out_features)
  const T* in = nullptr;      // (rows, in_features)
  const T* weight = nullptr;  // (out_features, in_features)
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
using LinearBackwardArgs = BasicLinearBackwardArgs<float>;

namespace ref {
// The specifications (ref/matmul_ref.cc); the linear layer's over the element type T
// (docs/architecture.md, "How to add an op").
void gemm(const GemmArgs& args);
template <class T = float>
void linear_forward(const BasicLinearForwardArgs<T>& args);
template <class T = float>
void linear_backward(const BasicLinearBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
