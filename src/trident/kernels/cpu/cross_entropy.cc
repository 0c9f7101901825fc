// CPU fused softmax cross-entropy and its gradient over a padded vocabulary; OpenMP over rows.
// See cross_entropy.h.
#include <algorithm>
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyArgs& args) {
  const std::int64_t rows = args.rows, V = args.vocab, Vp = args.vocab_padded;
  TRIDENT_CHECK(rows >= 0 && V > 0 && Vp >= V,
                "cross_entropy_forward_backward: need rows >= 0 and 0 < vocab <= vocab_padded, "
                "got rows=",
                rows, " vocab=", V, " vocab_padded=", Vp);
  if (rows == 0) return;
  TRIDENT_CHECK(args.losses && args.logits && args.targets,
                "cross_entropy_forward_backward: losses, logits and targets must be non-null");
  for (std::int64_t r = 0; r < rows; ++r) {
    TRIDENT_ASSERT(args.targets[r] < V, "cross_entropy_forward_backward: targets[", r,
                   "] = ", args.targets[r], " is outside the real vocabulary [0, ", V,
                   ") (a padding column or beyond)");
  }
  const float d_scale = args.d_scale;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = args.logits + r * Vp;
    float* dx = args.d_logits ? args.d_logits + r * Vp : nullptr;  // may alias x
    const std::int32_t target = args.targets[r];
    if (target < 0) {  // ignored position
      args.losses[r] = 0.0f;
      if (dx) std::fill(dx, dx + Vp, 0.0f);
      continue;
    }
    // Only the real columns [0, V) take part: padding is -inf.
    float row_max = x[0];
#pragma omp simd reduction(max : row_max)
    for (std::int64_t c = 0; c < V; ++c) row_max = std::max(row_max, x[c]);
    const float x_target = x[target];  // read before dx (which may alias x) is written
    double sum = 0.0;
    if (dx) {
      // Keep exp(x - max) in dx, then scale it into the gradient below.
#pragma omp simd reduction(+ : sum)
      for (std::int64_t c = 0; c < V; ++c) {
        const float e = detail::exp_approx(x[c] - row_max);
        dx[c] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t c = 0; c < V; ++c) sum += detail::exp_approx(x[c] - row_max);
    }
    // loss = logsumexp(x) - x[target] = max + log(sum) - x[target]
    args.losses[r] = static_cast<float>(static_cast<double>(row_max) + std::log(sum) - x_target);
    if (!dx) continue;
    // d_logits = d_scale * (softmax - onehot(target)) on real columns, 0 on padding.
    const float coef = static_cast<float>(d_scale / sum);
#pragma omp simd
    for (std::int64_t c = 0; c < V; ++c) dx[c] *= coef;
    dx[target] -= d_scale;
    std::fill(dx + V, dx + Vp, 0.0f);
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
