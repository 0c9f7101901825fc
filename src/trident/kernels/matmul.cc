// CPU matrix products: gemm and the linear layer's forward and backward, all through oneDNN's
// dnnl_sgemm (row-major). See matmul.h for the contract.
#include "trident/kernels/matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif
#include "trident/kernels/cpu_util.h"

namespace trident::kernels {

namespace detail {

void sgemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // C = beta C; BLAS semantics: beta == 0 does not read C
    for (std::int64_t i = 0; i < g.m; ++i) {
      float* c = g.c + i * g.ldc;
      for (std::int64_t j = 0; j < g.n; ++j) c[j] = g.beta == 0.0f ? 0.0f : g.beta * c[j];
    }
    return;
  }
  const dnnl_status_t status =
      dnnl_sgemm(g.trans_a == Trans::kYes ? 'T' : 'N', g.trans_b == Trans::kYes ? 'T' : 'N', g.m,
                 g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, g.c, g.ldc);
  TRIDENT_ASSERT(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status),
                 " for m=", g.m, " n=", g.n, " k=", g.k, " lda=", g.lda, " ldb=", g.ldb,
                 " ldc=", g.ldc);
}

}  // namespace detail

namespace {

void check_gemm_args(const GemmArgs& g) {
  TRIDENT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: sizes must be >= 0, got m=", g.m,
                " n=", g.n, " k=", g.k);
  if (g.m == 0 || g.n == 0) return;
  TRIDENT_CHECK(g.c != nullptr, "gemm: c is null for a ", g.m, "x", g.n, " product");
  TRIDENT_CHECK(g.ldc >= g.n, "gemm: ldc (", g.ldc, ") must be >= n (", g.n, ")");
  if (g.k == 0) return;
  TRIDENT_CHECK(g.a != nullptr && g.b != nullptr, "gemm: a or b is null (m=", g.m, " n=", g.n,
                " k=", g.k, ")");
  const std::int64_t a_cols = g.trans_a == Trans::kYes ? g.m : g.k;
  const std::int64_t b_cols = g.trans_b == Trans::kYes ? g.k : g.n;
  TRIDENT_CHECK(g.lda >= a_cols, "gemm: lda (", g.lda, ") must be >= ", a_cols,
                " (the row length of A as stored)");
  TRIDENT_CHECK(g.ldb >= b_cols, "gemm: ldb (", g.ldb, ") must be >= ", b_cols,
                " (the row length of B as stored)");
}

void check_linear_sizes(const char* op, std::int64_t rows, std::int64_t in_features,
                        std::int64_t out_features) {
  TRIDENT_CHECK(rows >= 0 && in_features > 0 && out_features > 0, op,
                ": need rows >= 0 and in_features, out_features > 0, got rows=", rows,
                " in_features=", in_features, " out_features=", out_features);
}

}  // namespace

void gemm(const core::ExecContext& ctx, const GemmArgs& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::gemm(ctx, args);
#else
    no_cuda_backend("gemm");
#endif
  }
  check_gemm_args(args);
  detail::OmpThreadsScope threads(ctx.num_threads);
  detail::sgemm(args);
}

void linear_forward(const core::ExecContext& ctx, const LinearForwardArgs& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::linear_forward(ctx, args);
#else
    no_cuda_backend("linear_forward");
#endif
  }
  const std::int64_t rows = args.rows, in_f = args.in_features, out_f = args.out_features;
  check_linear_sizes("linear_forward", rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.in && args.weight,
                "linear_forward: out, in and weight must be non-null");
  float beta = 0.0f;
  if (args.bias != nullptr) {
    // Prefill every row of out with the bias and let the GEMM add to it (beta = 1): one write
    // pass instead of a read-modify-write pass after the product.
    const float* bias = args.bias;
    float* out = args.out;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      std::copy(bias, bias + out_f, out + r * out_f);
    }
    beta = 1.0f;
  }
  detail::OmpThreadsScope threads(ctx.num_threads);
  // out(rows,out) = in(rows,in) @ weight(out,in)^T
  detail::sgemm({.trans_b = Trans::kYes,
                 .m = rows,
                 .n = out_f,
                 .k = in_f,
                 .a = args.in,
                 .lda = in_f,
                 .b = args.weight,
                 .ldb = in_f,
                 .beta = beta,
                 .c = args.out,
                 .ldc = out_f});
}

void linear_backward(const core::ExecContext& ctx, const LinearBackwardArgs& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::linear_backward(ctx, args);
#else
    no_cuda_backend("linear_backward");
#endif
  }
  const std::int64_t rows = args.rows, in_f = args.in_features, out_f = args.out_features;
  check_linear_sizes("linear_backward", rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_weight && args.d_out && args.in && args.weight,
                "linear_backward: d_weight, d_out, in and weight must be non-null");
  {
    detail::OmpThreadsScope threads(ctx.num_threads);
    // d_in(rows,in) = d_out(rows,out) @ weight(out,in)
    if (args.d_in != nullptr) {
      detail::sgemm({.m = rows,
                     .n = in_f,
                     .k = out_f,
                     .a = args.d_out,
                     .lda = out_f,
                     .b = args.weight,
                     .ldb = in_f,
                     .beta = 0.0f,
                     .c = args.d_in,
                     .ldc = in_f});
    }
    // d_weight(out,in) += d_out(rows,out)^T @ in(rows,in)
    detail::sgemm({.trans_a = Trans::kYes,
                   .m = out_f,
                   .n = in_f,
                   .k = rows,
                   .a = args.d_out,
                   .lda = out_f,
                   .b = args.in,
                   .ldb = in_f,
                   .beta = 1.0f,
                   .c = args.d_weight,
                   .ldc = in_f});
  }
  if (args.d_bias == nullptr) return;
  // d_bias += column sums of d_out. Threads own blocks of columns and walk all rows in order, so
  // the result does not depend on the thread count; the sums are kept in double.
  constexpr std::int64_t kMaxBlock = 512;
  const int threads = detail::num_threads(ctx);
  const std::int64_t block = detail::column_block_width(out_f, threads, kMaxBlock);
  const std::int64_t num_blocks = (out_f + block - 1) / block;
  const float* d_out = args.d_out;
  float* d_bias = args.d_bias;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t blk = 0; blk < num_blocks; ++blk) {
    const std::int64_t c0 = blk * block;
    const std::int64_t width = std::min(block, out_f - c0);
    double acc[kMaxBlock];
    std::fill(acc, acc + width, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = d_out + r * out_f + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
    for (std::int64_t j = 0; j < width; ++j) {
      d_bias[c0 + j] = static_cast<float>(d_bias[c0 + j] + acc[j]);
    }
  }
}

}  // namespace trident::kernels
