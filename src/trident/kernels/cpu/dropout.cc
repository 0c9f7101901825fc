// Hidden dropout, CPU: OpenMP over rows, four decisions per Philox block (vectorized, cpu_util.h).
#include <algorithm>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutArgs& a) {
  TRIDENT_CHECK(a.p >= 0.0f && a.p < 1.0f, "hidden_dropout: p must be in [0, 1), got ", a.p);
  const float scale = 1.0f / (1.0f - a.p);
  const std::uint64_t threshold = detail::dropout_threshold(a.p);
  const std::uint64_t seed = a.seed, stream = a.stream;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const auto base = static_cast<std::uint64_t>((a.first_row + r) * a.cols);
    const float* in = a.in + r * a.cols;
    float* out = a.out + r * a.cols;
    // The decisions of a piece of the row first (four per Philox block, vectorized), then the
    // scaling.
    constexpr std::int64_t kPiece = 1024;
    float keep[kPiece];
    for (std::int64_t c0 = 0; c0 < a.cols; c0 += kPiece) {
      const std::int64_t n = std::min(kPiece, a.cols - c0);
      detail::dropout_keep_run(seed, stream, base + static_cast<std::uint64_t>(c0), n, threshold,
                               keep);
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) {
        out[c0 + c] = keep[c] != 0.0f ? in[c0 + c] * scale : 0.0f;
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
