// CPU RMSNorm forward and backward: OpenMP over rows, SIMD over columns. See rmsnorm.h.
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void rmsnorm_forward(const ExecContext& ctx, const RmsNormForwardArgs& args) {
  const std::int64_t rows = args.rows, cols = args.cols;
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "rmsnorm_forward: need rows >= 0 and cols > 0, got rows=", rows, " cols=", cols);
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.rstd && args.in && args.weight,
                "rmsnorm_forward: out, rstd, in and weight must be non-null");
  TRIDENT_CHECK(args.eps >= 0.0f, "rmsnorm_forward: eps must be >= 0, got ", args.eps);
  const float* w = args.weight;
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = args.in + r * cols;
    float* y = args.out + r * cols;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (std::int64_t c = 0; c < cols; ++c) sum_sq += x[c] * x[c];
    const float rstd = 1.0f / std::sqrt(sum_sq * inv_cols + args.eps);
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) y[c] = x[c] * rstd * w[c];
    args.rstd[r] = rstd;
  }
}

void rmsnorm_backward(const ExecContext& ctx, const RmsNormBackwardArgs& args) {
  const std::int64_t rows = args.rows, cols = args.cols;
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "rmsnorm_backward: need rows >= 0 and cols > 0, got rows=", rows, " cols=", cols);
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_in && args.d_weight && args.d_out && args.in && args.weight && args.rstd,
                "rmsnorm_backward: every pointer must be non-null");
  const int threads = detail::num_threads(ctx);
  const float* w = args.weight;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  // Pass 1, rows in parallel: d_in += rstd * (g - xhat * mean(g * xhat)), g = d_out * w.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = args.in + r * cols;
    const float* dy = args.d_out + r * cols;
    float* dx = args.d_in + r * cols;
    const float rstd = args.rstd[r];
    float sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g_xhat)
    for (std::int64_t c = 0; c < cols; ++c) sum_g_xhat += dy[c] * w[c] * (x[c] * rstd);
    const float mean_g_xhat = sum_g_xhat * inv_cols;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) {
      dx[c] += rstd * (dy[c] * w[c] - (x[c] * rstd) * mean_g_xhat);
    }
  }
  // Pass 2, column blocks in parallel: d_weight += sum_r d_out * xhat, each column summed over
  // the rows in order in double (independent of the thread count), as layernorm_backward.
  constexpr std::int64_t kMaxBlock = 512;
  const std::int64_t block = detail::column_block_width(cols, threads, kMaxBlock);
  const std::int64_t num_blocks = (cols + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t blk = 0; blk < num_blocks; ++blk) {
    const std::int64_t c0 = blk * block;
    const std::int64_t width = std::min(block, cols - c0);
    double acc[kMaxBlock];
    std::fill(acc, acc + width, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* x = args.in + r * cols + c0;
      const float* dy = args.d_out + r * cols + c0;
      const float rstd = args.rstd[r];
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += dy[j] * (x[j] * rstd);
    }
    for (std::int64_t j = 0; j < width; ++j) {
      args.d_weight[c0 + j] = static_cast<float>(args.d_weight[c0 + j] + acc[j]);
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
