// CUDA matrix products through cuBLASLt (matmul.h, matmul_bf16.h). Row-major products are run as
// their column-major transposes: C^T (N x M) = op(B)^T op(A)^T, so no operand is ever copied.
// FP32 uses CUBLAS_COMPUTE_32F (true FP32, no TF32); BF16 operands use FP32 accumulation and an
// FP32 output. The bias is folded into C before the product (C = beta C + bias, then beta = 1);
// the linear layers' bias gradients are the deterministic column sums of cuda_util.cuh.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"

namespace trident::kernels::cuda {

namespace {

#define TRIDENT_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                     \
    const cublasStatus_t st_ = (expr);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      throw core::InternalError(core::str("cuBLASLt call ", #expr, " failed with status ", \
                                          static_cast<int>(st_), " (",                     \
                                          cublasLtGetStatusString(st_), ")"));             \
    }                                                                                      \
  } while (0)

constexpr std::int64_t kWorkspaceBytes = 32ll << 20;  // cuBLASLt's recommendation for Hopper

cublasLtHandle_t lt_handle() {
  static std::mutex mu;
  static std::array<cublasLtHandle_t, 64> handles{};
  int dev = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&dev));
  TRIDENT_CHECK(dev >= 0 && dev < 64, "cuBLASLt: device index ", dev, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[static_cast<std::size_t>(dev)]) {
    TRIDENT_CUBLAS_CHECK(cublasLtCreate(&handles[static_cast<std::size_t>(dev)]));
  }
  return handles[static_cast<std::size_t>(dev)];
}

// Releases cuBLASLt descriptors on every path.
struct LtObjects {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtObjects() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (y) cublasLtMatrixLayoutDestroy(y);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// A row-major product in the terms of GemmArgs, operands of type `operand` (FP32 or BF16).
struct Product {
  Trans trans_a, trans_b;
  std::int64_t m, n, k;
  float alpha;
  const void* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
};

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preference).
std::uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t r = 256;
  while (r > 1 && a % r != 0) r >>= 1;
  return r;
}

void lt_matmul(cudaStream_t stream, cudaDataType_t operand, const Product& p) {
  LtObjects o;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&o.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // X = B as column-major, Y = A as column-major (see the file comment).
  const cublasOperation_t op_x = p.trans_b == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = p.trans_a == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  TRIDENT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
  TRIDENT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
  const std::uint64_t x_rows = op_x == CUBLAS_OP_N ? p.n : p.k,
                      x_cols = op_x == CUBLAS_OP_N ? p.k : p.n;
  const std::uint64_t y_rows = op_y == CUBLAS_OP_N ? p.k : p.m,
                      y_cols = op_y == CUBLAS_OP_N ? p.m : p.k;
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&o.x, operand, x_rows, x_cols, p.ldb));
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&o.y, operand, y_rows, y_cols, p.lda));
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&o.c, CUDA_R_32F, p.n, p.m, p.ldc));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&o.pref));
  const std::uint64_t ws = kWorkspaceBytes;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristic otherwise assumes 256-byte-aligned operands; row chunks, heads and weights in a
  // flat buffer are often less aligned, and an algorithm chosen for 256 may refuse them or fault.
  // cuBLASLt's A is our X (= B), its B our Y (= A), C and D are c.
  const std::uint32_t align_x = pointer_alignment(p.b), align_y = pointer_alignment(p.a),
                      align_c = pointer_alignment(p.c);
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_x, sizeof(align_x)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_y, sizeof(align_y)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  cublasLtHandle_t handle = lt_handle();
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, o.desc, o.x, o.y, o.c, o.c, o.pref, 1,
                                                      &result, &found));
  TRIDENT_CHECK(found > 0, "cuBLASLt has no algorithm for a ", p.m, "x", p.n, "x", p.k,
                " product (lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc,
                "); check the strides and 16-byte alignment of the operands");
  StreamScratch workspace(static_cast<std::int64_t>(result.workspaceSize), stream);
  TRIDENT_CUBLAS_CHECK(cublasLtMatmul(handle, o.desc, &p.alpha, p.b, o.x, p.a, o.y, &p.beta, p.c,
                                      o.c, p.c, o.c, &result.algo, workspace.as<void>(),
                                      result.workspaceSize, stream));
}

// c[r, j] = (beta == 0 ? 0 : beta c[r, j]) + (bias ? bias[j] : 0).
__global__ void prefill_kernel(float* c, std::int64_t ldc, const float* bias, float beta,
                               std::int64_t m, std::int64_t n) {
  const std::int64_t total = m * n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / n, j = i - r * n;
    float* cij = c + r * ldc + j;
    *cij = (beta == 0.0f ? 0.0f : beta * *cij) + (bias ? bias[j] : 0.0f);
  }
}

void prefill(cudaStream_t s, float* c, std::int64_t ldc, const float* bias, float beta,
             std::int64_t m, std::int64_t n) {
  prefill_kernel<<<grid_for(m * n, 256), 256, 0, s>>>(c, ldc, bias, beta, m, n);
  TRIDENT_CUDA_LAUNCH_CHECK("gemm prefill");
}

void check_product(const char* op, const Product& g) {
  TRIDENT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, op, ": sizes must be >= 0, got m=", g.m,
                " n=", g.n, " k=", g.k);
  if (g.m == 0 || g.n == 0) return;
  TRIDENT_CHECK(g.c != nullptr, op, ": c is null for a ", g.m, "x", g.n, " product");
  TRIDENT_CHECK(g.ldc >= g.n, op, ": ldc (", g.ldc, ") must be >= n (", g.n, ")");
  if (g.k == 0) return;
  TRIDENT_CHECK(g.a != nullptr && g.b != nullptr, op, ": a or b is null (m=", g.m, " n=", g.n,
                " k=", g.k, ")");
  const std::int64_t a_cols = g.trans_a == Trans::kYes ? g.m : g.k;
  const std::int64_t b_cols = g.trans_b == Trans::kYes ? g.k : g.n;
  TRIDENT_CHECK(g.lda >= a_cols, op, ": lda (", g.lda, ") must be >= ", a_cols,
                " (the row length of A as stored)");
  TRIDENT_CHECK(g.ldb >= b_cols, op, ": ldb (", g.ldb, ") must be >= ", b_cols,
                " (the row length of B as stored)");
}

// C = alpha op(A) op(B) + bias + beta C for either operand type.
void product(cudaStream_t s, cudaDataType_t operand, Product p, const float* bias) {
  if (p.m == 0 || p.n == 0) return;
  if (bias != nullptr || p.k == 0) {
    prefill(s, p.c, p.ldc, bias, p.beta, p.m, p.n);
    if (p.k == 0) return;
    p.beta = 1.0f;
  }
  lt_matmul(s, operand, p);
}

void check_linear_sizes(const char* op, std::int64_t rows, std::int64_t in_features,
                        std::int64_t out_features) {
  TRIDENT_CHECK(rows >= 0 && in_features > 0 && out_features > 0, op,
                ": need rows >= 0 and in_features, out_features > 0, got rows=", rows,
                " in_features=", in_features, " out_features=", out_features);
}

struct ColumnOf {
  const float* x;
  std::int64_t cols;
  __device__ float operator()(std::int64_t r, std::int64_t c, int) const { return x[r * cols + c]; }
};

template <class T>
void linear_forward_any(const ExecContext& ctx, cudaDataType_t operand, const char* op, float* out,
                        const T* in, const T* weight, const float* bias, std::int64_t rows,
                        std::int64_t in_f, std::int64_t out_f) {
  check_linear_sizes(op, rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(out && in && weight, op, ": out, in and weight must be non-null");
  // out(rows,out) = in(rows,in) @ weight(out,in)^T
  product(
      stream_of(ctx), operand,
      {Trans::kNo, Trans::kYes, rows, out_f, in_f, 1.0f, in, in_f, weight, in_f, 0.0f, out, out_f},
      bias);
}

template <class T>
void linear_backward_any(const ExecContext& ctx, cudaDataType_t operand, const char* op,
                         float* d_in, float* d_weight, float* d_bias, const float* d_out_f32,
                         const T* d_out, const T* in, const T* weight, std::int64_t rows,
                         std::int64_t in_f, std::int64_t out_f) {
  check_linear_sizes(op, rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(d_weight && d_out && in && weight, op,
                ": d_weight, d_out, in and weight must be non-null");
  TRIDENT_CHECK(d_bias == nullptr || d_out_f32 != nullptr, op, ": d_bias needs the FP32 d_out");
  cudaStream_t s = stream_of(ctx);
  if (d_in) {  // d_in(rows,in) = d_out(rows,out) @ weight(out,in)
    product(s, operand,
            {Trans::kNo, Trans::kNo, rows, in_f, out_f, 1.0f, d_out, out_f, weight, in_f, 0.0f,
             d_in, in_f},
            nullptr);
  }
  // d_weight(out,in) += d_out(rows,out)^T @ in(rows,in)
  product(s, operand,
          {Trans::kYes, Trans::kNo, out_f, in_f, rows, 1.0f, d_out, out_f, in, in_f, 1.0f, d_weight,
           in_f},
          nullptr);
  if (d_bias) column_sums<1>(s, d_bias, nullptr, ColumnOf{d_out_f32, out_f}, rows, out_f);
}

}  // namespace

void gemm(const ExecContext& ctx, const GemmArgs& g) {
  const Product p{g.trans_a, g.trans_b, g.m,   g.n,    g.k, g.alpha, g.a,
                  g.lda,     g.b,       g.ldb, g.beta, g.c, g.ldc};
  check_product("gemm", p);
  product(stream_of(ctx), CUDA_R_32F, p, nullptr);
}

void gemm_bf16(const ExecContext& ctx, const GemmBf16Args& g) {
  const Product p{g.trans_a, g.trans_b, g.m,   g.n,    g.k, 1.0f, g.a,
                  g.lda,     g.b,       g.ldb, g.beta, g.c, g.ldc};
  check_product("gemm_bf16", p);
  product(stream_of(ctx), CUDA_R_16BF, p, g.bias);
}

void linear_forward(const ExecContext& ctx, const LinearForwardArgs& a) {
  linear_forward_any(ctx, CUDA_R_32F, "linear_forward", a.out, a.in, a.weight, a.bias, a.rows,
                     a.in_features, a.out_features);
}

void linear_backward(const ExecContext& ctx, const LinearBackwardArgs& a) {
  linear_backward_any(ctx, CUDA_R_32F, "linear_backward", a.d_in, a.d_weight, a.d_bias, a.d_out,
                      a.d_out, a.in, a.weight, a.rows, a.in_features, a.out_features);
}

void linear_forward_bf16(const ExecContext& ctx, const LinearForwardBf16Args& a) {
  linear_forward_any(ctx, CUDA_R_16BF, "linear_forward_bf16", a.out, a.in, a.weight, a.bias, a.rows,
                     a.in_features, a.out_features);
}

void linear_backward_bf16(const ExecContext& ctx, const LinearBackwardBf16Args& a) {
  linear_backward_any(ctx, CUDA_R_16BF, "linear_backward_bf16", a.d_in, a.d_weight, a.d_bias,
                      a.d_out, a.d_out_bf16, a.in, a.weight, a.rows, a.in_features, a.out_features);
}

namespace {

template <class T>
void grouped_forward(const ExecContext& ctx, cudaDataType_t operand,
                     const BasicGroupedLinearForwardArgs<T>& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    linear_forward_any(ctx, operand, "grouped_linear_forward", a.out + r.first * out,
                       a.in + r.first * in, a.weight + g * out * in, nullptr, r.rows, in, out);
  }
}

template <class T>
void grouped_backward(const ExecContext& ctx, cudaDataType_t operand,
                      const BasicGroupedLinearBackwardArgs<T>& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    linear_backward_any(ctx, operand, "grouped_linear_backward",
                        a.d_in != nullptr ? a.d_in + r.first * in : nullptr,
                        a.d_weight + g * out * in, nullptr, nullptr, a.d_out + r.first * out,
                        a.in + r.first * in, a.weight + g * out * in, r.rows, in, out);
  }
}

}  // namespace

void grouped_linear_forward(const ExecContext& ctx, const GroupedLinearForwardArgs& a) {
  grouped_forward(ctx, CUDA_R_32F, a);
}
void grouped_linear_forward(const ExecContext& ctx, const GroupedLinearForwardBf16Args& a) {
  grouped_forward(ctx, CUDA_R_16BF, a);
}
void grouped_linear_backward(const ExecContext& ctx, const GroupedLinearBackwardArgs& a) {
  grouped_backward(ctx, CUDA_R_32F, a);
}
void grouped_linear_backward(const ExecContext& ctx, const GroupedLinearBackwardBf16Args& a) {
  grouped_backward(ctx, CUDA_R_16BF, a);
}

}  // namespace trident::kernels::cuda
