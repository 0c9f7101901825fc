// CPU fused residual add + LayerNorm, forward and backward: OpenMP over rows, SIMD over columns,
// column blocks for the parameter gradients. See fused_residual_layernorm.h.
#include "trident/kernels/fused_residual_layernorm.h"

#include <algorithm>
#include <cmath>

#include "trident/kernels/cpu_util.h"

namespace trident::kernels {

namespace {

// Which optional outputs a call writes; loops are instantiated per combination so that the inner
// loops have no per-element branch on null pointers.
enum class Outputs : std::uint8_t { kF32, kBf16, kBoth };

Outputs outputs_of(const void* f32, const void* bf16) {
  if (f32 != nullptr && bf16 != nullptr) return Outputs::kBoth;
  return f32 != nullptr ? Outputs::kF32 : Outputs::kBf16;
}

void check_sizes(const char* op, std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
}

template <Outputs kOut>
void forward_rows(const core::ExecContext& ctx, const ResidualLayerNormForwardArgs& a) {
  const std::int64_t cols = a.cols;
  const float* w = a.weight;
  const float* bias = a.bias;
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const std::int64_t off = r * cols;
    const float* xa = a.a + off;
    const float* xb = a.b + off;
    float* s = a.resid_out + off;
    // Offsets are applied only to the outputs that exist (never to a null pointer).
    float* y = kOut != Outputs::kBf16 ? a.out + off : nullptr;
    core::bf16* y16 = kOut != Outputs::kF32 ? a.out_bf16 + off : nullptr;
    // Pass 1 reads a and b from memory and writes the sum; passes 2 and 3 re-read the sum from L1
    // (a row of GPT-2's 768 floats is 3 KiB). The centred second moment avoids the cancellation of
    // E[x^2] - E[x]^2. s may alias a or b: each element is read before it is written.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = xa[c] + xb[c];
      s[c] = v;
      sum += v;
    }
    const float mean = sum * inv_cols;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float d = s[c] - mean;
      sum_sq += d * d;
    }
    const float rstd = 1.0f / std::sqrt(sum_sq * inv_cols + a.eps);
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = (s[c] - mean) * rstd * w[c] + bias[c];
      if constexpr (kOut != Outputs::kBf16) y[c] = v;
      if constexpr (kOut != Outputs::kF32) y16[c] = core::bf16::from_float(v);
    }
    a.mean[r] = mean;
    a.rstd[r] = rstd;
  }
}

// d_resid += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = d_out * w, rows in parallel; the
// bf16 copy is written from the updated value while it is in a register.
template <bool kWithBf16>
void backward_rows(const core::ExecContext& ctx, const ResidualLayerNormBackwardArgs& a) {
  const std::int64_t cols = a.cols;
  const float* w = a.weight;
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const std::int64_t off = r * cols;
    const float* x = a.resid + off;
    const float* dy = a.d_out + off;
    float* dx = a.d_resid + off;
    core::bf16* dx16 = kWithBf16 ? a.d_resid_bf16 + off : nullptr;
    const float mean = a.mean[r];
    const float rstd = a.rstd[r];
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
      const float v = dx[c] + rstd * (dy[c] * w[c] - mean_g - xhat * mean_g_xhat);
      dx[c] = v;
      if constexpr (kWithBf16) dx16[c] = core::bf16::from_float(v);
    }
  }
}

// d_weight += sum_r d_out * xhat, d_bias += sum_r d_out: threads own column blocks and walk all
// rows in order, in double, so the result does not depend on the thread count.
void backward_params(const core::ExecContext& ctx, const ResidualLayerNormBackwardArgs& a) {
  constexpr std::int64_t kMaxBlock = 512;
  const std::int64_t cols = a.cols;
  const int threads = detail::num_threads(ctx);
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
    for (std::int64_t r = 0; r < a.rows; ++r) {
      const float* x = a.resid + r * cols + c0;
      const float* dy = a.d_out + r * cols + c0;
      const float mean = a.mean[r];
      const float rstd = a.rstd[r];
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) {
        acc_w[j] += dy[j] * ((x[j] - mean) * rstd);
        acc_b[j] += dy[j];
      }
    }
    for (std::int64_t j = 0; j < width; ++j) {
      a.d_weight[c0 + j] = static_cast<float>(a.d_weight[c0 + j] + acc_w[j]);
      a.d_bias[c0 + j] = static_cast<float>(a.d_bias[c0 + j] + acc_b[j]);
    }
  }
}

}  // namespace

void residual_layernorm_forward(const core::ExecContext& ctx,
                                const ResidualLayerNormForwardArgs& args) {
  core::require_cpu(ctx, "residual_layernorm_forward");
  check_sizes("residual_layernorm_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(
      args.resid_out && args.mean && args.rstd && args.a && args.b && args.weight && args.bias,
      "residual_layernorm_forward: resid_out, mean, rstd, a, b, weight and bias must be "
      "non-null");
  TRIDENT_CHECK(args.out || args.out_bf16,
                "residual_layernorm_forward: out and out_bf16 are both null; nothing to write");
  TRIDENT_CHECK(args.eps >= 0.0f, "residual_layernorm_forward: eps must be >= 0, got ", args.eps);
  switch (outputs_of(args.out, args.out_bf16)) {
    case Outputs::kF32:
      return forward_rows<Outputs::kF32>(ctx, args);
    case Outputs::kBf16:
      return forward_rows<Outputs::kBf16>(ctx, args);
    case Outputs::kBoth:
      return forward_rows<Outputs::kBoth>(ctx, args);
  }
}

void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardArgs& args) {
  core::require_cpu(ctx, "residual_layernorm_backward");
  check_sizes("residual_layernorm_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_resid && args.d_weight && args.d_bias && args.d_out && args.resid &&
                    args.weight && args.mean && args.rstd,
                "residual_layernorm_backward: every pointer but d_resid_bf16 must be non-null");
  if (args.d_resid_bf16 != nullptr) {
    backward_rows<true>(ctx, args);
  } else {
    backward_rows<false>(ctx, args);
  }
  backward_params(ctx, args);
}

}  // namespace trident::kernels
