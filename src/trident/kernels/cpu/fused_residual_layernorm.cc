// CPU fused residual add + LayerNorm, forward and backward: OpenMP over rows, SIMD over columns;
// the backward sums the parameter gradients in the same pass by fixed row chunks (row_partials.h).
// See fused_residual_layernorm.h.
#include <algorithm>
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"
#include "trident/kernels/row_partials.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

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

// One pass, rows in parallel in fixed chunks (row_partials.h). Per row:
//   d_resid += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = d_out * w,
// and the chunk's partials of d_weight (d_out * xhat) and d_bias (d_out) grow by the row, while the
// row is in L1. partials: per chunk, cols doubles for d_weight then cols for d_bias.
template <bool kWithBf16>
void backward_chunks(const core::ExecContext& ctx, const ResidualLayerNormBackwardArgs& a,
                     double* partials) {
  const std::int64_t cols = a.cols;
  const std::int64_t chunks = detail::num_row_chunks(a.rows);
  const float* w = a.weight;
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp parallel num_threads(detail::num_threads(ctx))
  {
#pragma omp for schedule(static)
    for (std::int64_t k = 0; k < chunks; ++k) {
      double* acc_w = partials + k * 2 * cols;
      double* acc_b = acc_w + cols;
      std::fill(acc_w, acc_w + 2 * cols, 0.0);
      const std::int64_t r_end = std::min(a.rows, (k + 1) * detail::kRowChunk);
      for (std::int64_t r = k * detail::kRowChunk; r < r_end; ++r) {
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
          acc_w[c] += dy[c] * xhat;
          acc_b[c] += dy[c];
        }
      }
    }
    // The implicit barrier above: every partial is complete.
    detail::add_partials_in_parallel(a.d_weight, partials, chunks, 2 * cols, cols);
    detail::add_partials_in_parallel(a.d_bias, partials + cols, chunks, 2 * cols, cols);
  }
}

}  // namespace

void residual_layernorm_forward(const core::ExecContext& ctx,
                                const ResidualLayerNormForwardArgs& args) {
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
  check_sizes("residual_layernorm_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_resid && args.d_weight && args.d_bias && args.d_out && args.resid &&
                    args.weight && args.mean && args.rstd,
                "residual_layernorm_backward: every pointer but d_resid_bf16 must be non-null");
  double* partials =
      detail::partials_from_scratch("residual_layernorm_backward", args.scratch,
                                    detail::num_row_chunks(args.rows) * 2 * args.cols);
  if (args.d_resid_bf16 != nullptr) {
    backward_chunks<true>(ctx, args, partials);
  } else {
    backward_chunks<false>(ctx, args, partials);
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
