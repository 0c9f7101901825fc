// CPU SwiGLU forward and backward: OpenMP over rows, SIMD over columns. See swiglu.h.
#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {
void check(const char* op, std::int64_t rows, std::int64_t cols, const void* a, const void* b) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
  TRIDENT_CHECK(rows == 0 || (a && b), op, ": pointers must be non-null");
}
}  // namespace

void swiglu_forward(const ExecContext& ctx, const SwiGluForwardArgs& args) {
  const std::int64_t rows = args.rows, F = args.cols;
  check("swiglu_forward", rows, F, args.out, args.in);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gate = args.in + r * 2 * F;
    const float* up = gate + F;
    float* y = args.out + r * F;
#pragma omp simd
    for (std::int64_t c = 0; c < F; ++c) {
      const float g = gate[c];
      y[c] = g / (1.0f + detail::exp_approx(-g)) * up[c];
    }
  }
}

void swiglu_backward(const ExecContext& ctx, const SwiGluBackwardArgs& args) {
  const std::int64_t rows = args.rows, F = args.cols;
  check("swiglu_backward", rows, F, args.d_in, args.in);
  TRIDENT_CHECK(rows == 0 || args.d_out, "swiglu_backward: d_out must be non-null");
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gate = args.in + r * 2 * F;
    const float* up = gate + F;
    const float* dy = args.d_out + r * F;
    float* d_gate = args.d_in + r * 2 * F;
    float* d_up = d_gate + F;
#pragma omp simd
    for (std::int64_t c = 0; c < F; ++c) {
      const float g = gate[c];
      const float s = 1.0f / (1.0f + detail::exp_approx(-g));  // sigmoid
      const float silu = g * s;
      d_gate[c] = dy[c] * up[c] * (s + silu * (1.0f - s));  // silu' = s (1 + g (1 - s))
      d_up[c] = dy[c] * silu;
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
