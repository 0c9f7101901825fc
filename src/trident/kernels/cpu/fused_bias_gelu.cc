// CPU fused bias + GeLU forward and backward: OpenMP over rows (the backward also sums d_bias, by
// fixed row chunks, row_partials.h), SIMD inside. See fused_bias_gelu.h.
#include <algorithm>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"
#include "trident/kernels/row_partials.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Which outputs a call writes; the loops are instantiated per combination so that the inner loops
// have no per-element branch on null pointers.
enum class Outputs : std::uint8_t { kF32, kBf16, kBoth };

Outputs outputs_of(const void* f32, const void* bf16) {
  if (f32 != nullptr && bf16 != nullptr) return Outputs::kBoth;
  return f32 != nullptr ? Outputs::kF32 : Outputs::kBf16;
}

// 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu(x) = x / (1 + e) with e = exp(-2u),
// u = sqrt(2/pi) (x + 0.044715 x^3); exp_approx saturates, so no overflow for large |x|.
inline float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + detail::exp_approx(-2.0f * u));
}

// gelu'(x) = s + 2 x s (1 - s) u'(x) with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3*0.044715 x^2).
// With e = exp(-2u): s = 1 / (1 + e) and s (1 - s) = (e s) s, which avoids the cancellation in
// 1 - s; e s <= 1 is formed first so that the product cannot overflow.
inline float gelu_grad(float x) {
  const float x2 = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x2 * x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
  const float e = detail::exp_approx(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  return s + 2.0f * x * du * ((e * s) * s);
}

template <Outputs kOut>
void forward_rows(const core::ExecContext& ctx, const BiasGeluForwardArgs& a) {
  const std::int64_t cols = a.cols;
  const float* bias = a.bias;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.in + r * cols;
    // Offsets are applied only to the outputs that exist (never to a null pointer).
    float* y = kOut != Outputs::kBf16 ? a.out + r * cols : nullptr;
    core::bf16* y16 = kOut != Outputs::kF32 ? a.out_bf16 + r * cols : nullptr;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = gelu(x[c] + bias[c]);
      if constexpr (kOut != Outputs::kBf16) y[c] = v;
      if constexpr (kOut != Outputs::kF32) y16[c] = core::bf16::from_float(v);
    }
  }
}

// Rows in parallel, in fixed chunks (row_partials.h): each chunk writes its rows of d_in and sums
// them per column into its partial (in a fixed order: groups of four rows, then the remaining
// rows one by one); then the partials are added to d_bias in chunk order.
template <Outputs kOut>
void backward_chunks(const core::ExecContext& ctx, const BiasGeluBackwardArgs& a,
                     double* partials) {
  const std::int64_t cols = a.cols;
  const std::int64_t chunks = detail::num_row_chunks(a.rows);
  const float* bias = a.bias;
#pragma omp parallel num_threads(detail::num_threads(ctx))
  {
#pragma omp for schedule(static)
    for (std::int64_t k = 0; k < chunks; ++k) {
      double* acc = partials + k * cols;
      std::fill(acc, acc + cols, 0.0);
      const std::int64_t r_end = std::min(a.rows, (k + 1) * detail::kRowChunk);
      std::int64_t r = k * detail::kRowChunk;
      // Four rows at a time: their four values of a column are added in FP32 (pairwise, error
      // about 1e-7 of their magnitudes) before one double addition into the partial. That cuts
      // the double conversions, additions and accumulator loads and stores, which made this loop
      // compute-bound, by four (measured 1.2x faster than one row at a time).
      for (; r + 4 <= r_end; r += 4) {
        const std::int64_t off = r * cols;
        const float* x = a.in + off;
        const float* dy = a.d_out + off;
        float* dx = kOut != Outputs::kBf16 ? a.d_in + off : nullptr;
        core::bf16* dx16 = kOut != Outputs::kF32 ? a.d_in_bf16 + off : nullptr;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) {
          const float b = bias[c];
          const float g0 = dy[c] * gelu_grad(x[c] + b);
          const float g1 = dy[c + cols] * gelu_grad(x[c + cols] + b);
          const float g2 = dy[c + 2 * cols] * gelu_grad(x[c + 2 * cols] + b);
          const float g3 = dy[c + 3 * cols] * gelu_grad(x[c + 3 * cols] + b);
          if constexpr (kOut != Outputs::kBf16) {
            dx[c] = g0;
            dx[c + cols] = g1;
            dx[c + 2 * cols] = g2;
            dx[c + 3 * cols] = g3;
          }
          if constexpr (kOut != Outputs::kF32) {
            dx16[c] = core::bf16::from_float(g0);
            dx16[c + cols] = core::bf16::from_float(g1);
            dx16[c + 2 * cols] = core::bf16::from_float(g2);
            dx16[c + 3 * cols] = core::bf16::from_float(g3);
          }
          acc[c] += static_cast<double>((g0 + g1) + (g2 + g3));
        }
      }
      for (; r < r_end; ++r) {
        const std::int64_t off = r * cols;
        const float* x = a.in + off;
        const float* dy = a.d_out + off;
        // Offsets are applied only to the outputs that exist (never to a null pointer).
        float* dx = kOut != Outputs::kBf16 ? a.d_in + off : nullptr;
        core::bf16* dx16 = kOut != Outputs::kF32 ? a.d_in_bf16 + off : nullptr;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) {
          const float g = dy[c] * gelu_grad(x[c] + bias[c]);
          if constexpr (kOut != Outputs::kBf16) dx[c] = g;
          if constexpr (kOut != Outputs::kF32) dx16[c] = core::bf16::from_float(g);
          acc[c] += g;
        }
      }
    }
    // The implicit barrier above: every partial is complete.
    detail::add_partials_in_parallel(a.d_bias, partials, chunks, cols, cols);
  }
}

void check_sizes(const char* op, std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
}

}  // namespace

void bias_gelu_forward(const core::ExecContext& ctx, const BiasGeluForwardArgs& args) {
  check_sizes("bias_gelu_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.in && args.bias, "bias_gelu_forward: in and bias must be non-null");
  TRIDENT_CHECK(args.out || args.out_bf16,
                "bias_gelu_forward: out and out_bf16 are both null; nothing to write");
  switch (outputs_of(args.out, args.out_bf16)) {
    case Outputs::kF32:
      return forward_rows<Outputs::kF32>(ctx, args);
    case Outputs::kBf16:
      return forward_rows<Outputs::kBf16>(ctx, args);
    case Outputs::kBoth:
      return forward_rows<Outputs::kBoth>(ctx, args);
  }
}

void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardArgs& args) {
  check_sizes("bias_gelu_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_bias && args.d_out && args.in && args.bias,
                "bias_gelu_backward: d_bias, d_out, in and bias must be non-null");
  TRIDENT_CHECK(args.d_in || args.d_in_bf16,
                "bias_gelu_backward: d_in and d_in_bf16 are both null; nothing to write");
  double* partials = detail::partials_from_scratch("bias_gelu_backward", args.scratch,
                                                   detail::num_row_chunks(args.rows) * args.cols);
  switch (outputs_of(args.d_in, args.d_in_bf16)) {
    case Outputs::kF32:
      return backward_chunks<Outputs::kF32>(ctx, args, partials);
    case Outputs::kBf16:
      return backward_chunks<Outputs::kBf16>(ctx, args, partials);
    case Outputs::kBoth:
      return backward_chunks<Outputs::kBoth>(ctx, args, partials);
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
