// CPU LayerNorm forward and backward: OpenMP over rows, SIMD over columns. See layernorm.h.
#include <algorithm>
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

void check_sizes(const char* op, std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
}

}  // namespace

void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args) {
  const std::int64_t rows = args.rows, cols = args.cols;
  check_sizes("layernorm_forward", rows, cols);
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.mean && args.rstd && args.in && args.weight && args.bias,
                "layernorm_forward: out, mean, rstd, in, weight and bias must be non-null");
  TRIDENT_CHECK(args.eps >= 0.0f, "layernorm_forward: eps must be >= 0, got ", args.eps);
  const float* w = args.weight;
  const float* b = args.bias;
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = args.in + r * cols;
    float* y = args.out + r * cols;
    // Two passes over the row (it stays in L1): the mean, then the centred second moment, which
    // avoids the cancellation of E[x^2] - E[x]^2.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < cols; ++c) sum += x[c];
    const float mean = sum * inv_cols;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float d = x[c] - mean;
      sum_sq += d * d;
    }
    const float rstd = 1.0f / std::sqrt(sum_sq * inv_cols + args.eps);
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
    args.mean[r] = mean;
    args.rstd[r] = rstd;
  }
}

void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardArgs& args) {
  const std::int64_t rows = args.rows, cols = args.cols;
  check_sizes("layernorm_backward", rows, cols);
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_in && args.d_weight && args.d_bias && args.d_out && args.in && args.weight &&
                    args.mean && args.rstd,
                "layernorm_backward: every pointer must be non-null");
  const int threads = detail::num_threads(ctx);
  const float* w = args.weight;
  const float inv_cols = 1.0f / static_cast<float>(cols);

  // Pass 1, rows in parallel: d_in += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = d_out*w.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = args.in + r * cols;
    const float* dy = args.d_out + r * cols;
    float* dx = args.d_in + r * cols;
    const float mean = args.mean[r];
    const float rstd = args.rstd[r];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float g = dy[c] * w[c];
      sum_g += g;
      sum_g_xhat += g * ((x[c] - mean) * rstd);
    }
    const float mean_g = sum_g * inv_cols;
    const float mean_g_xhat = sum_g_xhat * inv_cols;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] += rstd * (dy[c] * w[c] - mean_g - xhat * mean_g_xhat);
    }
  }

  // Pass 2, column blocks in parallel: d_weight += sum_r d_out * xhat, d_bias += sum_r d_out.
  // Each column's sum runs over the rows in order (in double), so the result does not depend on
  // the thread count and needs no per-thread scratch. Blocks are as wide as possible (one per
  // thread, at most kMaxBlock) so that every row contributes one long contiguous read.
  constexpr std::int64_t kMaxBlock = 512;
  const std::int64_t block = detail::column_block_width(cols, threads, kMaxBlock);
  const std::int64_t num_blocks = (cols + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t blk = 0; blk < num_blocks; ++blk) {
    const std::int64_t c0 = blk * block;
    const std::int64_t width = std::min(block, cols - c0);
    double acc_w[kMaxBlock];
    double acc_b[kMaxBlock];
    std::fill(acc_w, acc_w + width, 0.0);
    std::fill(acc_b, acc_b + width, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* x = args.in + r * cols + c0;
      const float* dy = args.d_out + r * cols + c0;
      const float mean = args.mean[r];
      const float rstd = args.rstd[r];
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) {
        acc_w[j] += dy[j] * ((x[j] - mean) * rstd);
        acc_b[j] += dy[j];
      }
    }
    for (std::int64_t j = 0; j < width; ++j) {
      args.d_weight[c0 + j] = static_cast<float>(args.d_weight[c0 + j] + acc_w[j]);
      args.d_bias[c0 + j] = static_cast<float>(args.d_bias[c0 + j] + acc_b[j]);
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
